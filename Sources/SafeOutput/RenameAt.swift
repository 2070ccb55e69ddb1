internal import CFileSystemLinux
import Glibc

/// Renames `name` in the directory `directory` to `newName` in `newDirectory` (both open
/// descriptors), atomically; unless `replacing`, fails with `EEXIST` instead of replacing an
/// entry already at the new name (`RENAME_NOREPLACE`), so a file that appeared meanwhile is
/// never lost. Returns 0, or the errno value of the failure.
///
/// A file system that cannot rename without replacing (many FUSE ones: exfat-fuse, ntfs-3g,
/// sshfs) refuses the flag with `EINVAL`; there the name is looked up first and the rename is
/// a plain one, so only a file created in the instant between the two can be replaced.
///
/// The corresponding Linux call is `renameat2(2)`.
public func renameAt(_ directory: Int32, _ name: String, to newDirectory: Int32, _ newName: String, replacing: Bool) -> Int32 {
    let noReplace: UInt32 = 1  // RENAME_NOREPLACE, checked against <linux/fs.h> in the shim
    if cfslinux_renameat2(directory, name, newDirectory, newName, replacing ? 0 : noReplace) == 0 { return 0 }
    let err = errno
    guard !replacing, err == EINVAL || err == ENOSYS else { return err }
    var info = stat()
    if fstatat(newDirectory, newName, &info, AT_SYMLINK_NOFOLLOW) == 0 { return EEXIST }
    guard errno == ENOENT else { return errno }
    return renameat(directory, name, newDirectory, newName) == 0 ? 0 : errno
}

/// Makes everything written to the file system that holds the open descriptor `file` durable at
/// once — data and inodes of every file on it, not only this one — with one flush of the
/// device, where an fsync of each of many small files writes and flushes each in turn.
/// Returns 0, or the errno value of a failure (a write-back error anywhere on the file system
/// since `file` was opened counts: the caller cannot tell which file it hit).
///
/// The corresponding Linux call is `syncfs(2)`.
public func syncFileSystem(holding file: Int32) -> Int32 {
    guard cfslinux_syncfs(file) == 0 else { return errno }
    return 0
}

/// Starts writing the dirty pages of `length` bytes at `offset` of the open file `file` to its
/// device, without waiting: an fsync later finds them written or on their way, so a writer
/// that kicks each piece as it goes overlaps the device's work with its own instead of paying
/// for it all at the sync. Advisory: a failure is not reported here (the fsync that follows
/// reports write-back errors); returns 0, or the errno value of a failure to start.
///
/// The corresponding Linux call is `sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`.
public func startWriteBack(of file: Int32, offset: Int64, length: Int64) -> Int32 {
    guard cfslinux_start_write_back(file, offset, length) == 0 else { return errno }
    return 0
}

/// Opens the folder `name` in the open folder `directory` as a handle only, never through a
/// symlink: its owner need not be allowed to read it, and `fstat` and `/proc/self/fd/N` work on
/// it. Returns the descriptor, or -1 with `errno` set.
///
/// The corresponding Linux call is `openat(2)` with `O_PATH | O_DIRECTORY | O_NOFOLLOW`.
public func openDirectoryHandle(_ name: String, in directory: Int32) -> Int32 {
    cfslinux_open_directory_handle(directory, name)
}

/// The type of the file system holding `path`: a magic number of `<linux/magic.h>` (ext4's
/// `0xef53`, procfs's `0x9fa0`), or nil with `errno` set.
///
/// The corresponding Linux call is `statfs(2)`, its `f_type`.
public func fileSystemType(of path: String) -> Int64? {
    var type: Int64 = 0
    return cfslinux_file_system_type(path, &type) == 0 ? type : nil
}
