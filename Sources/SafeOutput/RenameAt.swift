internal import CFileSystemLinux
import Glibc

/// Renames `name` in the directory `directory` to `newName` in `newDirectory` (both open
/// descriptors), atomically; unless `replacing`, fails with `EEXIST` instead of replacing an
/// entry already at the new name (`RENAME_NOREPLACE`), so a file that appeared meanwhile is
/// never lost. Returns 0, or the errno value of the failure.
///
/// The corresponding Linux call is `renameat2(2)`.
public func renameAt(_ directory: Int32, _ name: String, to newDirectory: Int32, _ newName: String, replacing: Bool) -> Int32 {
    let noReplace: UInt32 = 1  // RENAME_NOREPLACE, checked against <linux/fs.h> in the shim
    guard cfslinux_renameat2(directory, name, newDirectory, newName, replacing ? 0 : noReplace) == 0 else { return errno }
    return 0
}
