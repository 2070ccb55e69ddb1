#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
#if canImport(SafeOutput)  // fuzz/run.sh compiles its source into its one module
internal import SafeOutput
#endif
#if canImport(PlainText)
internal import PlainText
#endif

/// An open file descriptor, closed when the last reference goes away (immutable, so it may be
/// handed between threads).
public final class Descriptor: Sendable {
    /// The raw descriptor.
    public let fd: Int32
    private let owned: Bool
    /// Takes ownership of `fd` (closed on deinit), or borrows it (standard input) when not `owned`.
    init(_ fd: Int32, owned: Bool = true) {
        self.fd = fd
        self.owned = owned
    }
    deinit { if owned { close(fd) } }
}

/// A file's identity on this machine: its device and inode numbers.
struct FileIdentity: Hashable, Sendable {
    var device: UInt64
    var inode: UInt64
    init(_ info: stat) {
        device = UInt64(info.st_dev)
        inode = UInt64(info.st_ino)
    }
}

/// The directory files are received into, with every operation done relative to an open
/// descriptor through `openat`/`mkdirat`/`symlinkat`/`renameat` and `O_NOFOLLOW` on every
/// component: a symlink planted inside the directory (by a previous transfer or by another
/// user) cannot redirect a write outside it, and a path that traverses one fails with
/// ``TransferError/Code/unsafePath``.
///
/// The root itself is opened once, following symlinks (it is the user's own choice). Not
/// thread-safe: use one instance from one task.
public final class TargetDirectory {
    /// The path the directory was opened with (for messages).
    public let path: String
    /// The directory's descriptor.
    public let root: Descriptor

    /// Opens an existing directory.
    public init(path: String) throws(TransferError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw TransferError.posix("cannot open directory", path, errno: errno) }
        self.path = path
        self.root = Descriptor(fd)
    }

    /// Opens the directory that contains `path`, one component at a time with `O_NOFOLLOW`,
    /// creating missing directories (mode 0700 until their final mode is applied) if `create`.
    public func openParent(of path: SafePath, create: Bool) throws(TransferError) -> Descriptor {
        try openDirectory(path.parentComponents, create: create, shown: path.description)
    }

    /// Folders this instance opened lately, by their components: many files share few folders,
    /// and each walk costs an `openat` per component (over 100 µs each on a busy machine). A
    /// folder is kept once opened through the same checked walk, so using it again is what
    /// holding a file's parent open already is; bounded, each entry holding a descriptor.
    private var openedDirectories: [[String]: Descriptor] = [:]
    private static let openedDirectoryLimit = 64

    /// The folders and symlinks this instance made (one transfer's store): only these take a
    /// mode or time from the network. One offered over a folder the user had would loosen or
    /// re-date it (issue 66). Bounded by the offer, which names every one of them.
    private var made: Set<FileIdentity> = []
    /// Existing folders of ours that ``createDirectory(_:)`` gave their owner's bits, with the
    /// mode to put back when the folders are settled.
    private var loosened: [FileIdentity: mode_t] = [:]

    /// Remembers the entry `name` in `parent` as made here, if it is still there and ours.
    private func noteMade(_ name: String, in parent: Int32) {
        var info = stat()
        guard fstatat(parent, name, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_uid == geteuid() else { return }
        made.insert(FileIdentity(info))
    }

    func openDirectory(_ components: ArraySlice<String>, create: Bool, shown: String) throws(TransferError) -> Descriptor {
        guard let opened = try openDirectoryIfPresent(components, create: create, shown: shown) else {
            throw TransferError.posix("cannot open directory for", shown, errno: ENOENT)
        }
        return opened
    }

    /// ``openDirectory(_:create:shown:)``, but nil when a folder is missing (and `create` is
    /// false), with no error to build: planning an offer of many files into folders not made yet
    /// looks each one up.
    func openDirectoryIfPresent(_ components: ArraySlice<String>, create: Bool, shown: String) throws(TransferError) -> Descriptor? {
        guard !components.isEmpty else { return root }
        let key = Array(components)
        if let known = openedDirectories[key] { return known }
        guard let opened = try walk(components, create: create, shown: shown) else { return nil }
        if openedDirectories.count >= Self.openedDirectoryLimit { openedDirectories.removeAll() }
        openedDirectories[key] = opened
        return opened
    }

    /// Nil when a component is missing and not created.
    private func walk(_ components: ArraySlice<String>, create: Bool, shown: String) throws(TransferError) -> Descriptor? {
        var current = root
        for component in components {
            var fd = openat(current.fd, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            if fd < 0 && errno == ENOENT && create {
                if mkdirat(current.fd, component, 0o700) == 0 {
                    noteMade(component, in: current.fd)
                } else if errno != EEXIST {
                    throw TransferError.posix("cannot create directory for", shown, errno: errno)
                }
                fd = openat(current.fd, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            }
            guard fd >= 0 else {
                let err = errno
                if err == ENOENT && !create { return nil }
                if err == ELOOP || err == ENOTDIR {
                    throw TransferError(.unsafePath, "'\(shown)' passes through '\(component)', which is a symlink or not a directory")
                }
                throw TransferError.posix("cannot open directory for", shown, errno: err)
            }
            current = Descriptor(fd)
        }
        return current
    }

    /// Creates the directory `path` and any missing parents; an existing directory is fine,
    /// anything else at that name is ``TransferError/Code/exists``. An existing directory of
    /// ours that its owner may not read, write into or enter (a read-only folder, as an earlier
    /// transfer of the same tree left it) gets those bits until
    /// ``setDirectoryAttributes(_:mode:modificationTime:)`` puts its own mode back.
    public func createDirectory(_ path: SafePath) throws(TransferError) {
        let parent = try openParent(of: path, create: true)
        if mkdirat(parent.fd, path.name, 0o700) == 0 {
            noteMade(path.name, in: parent.fd)
        } else {
            let err = errno
            guard err == EEXIST else { throw TransferError.posix("cannot create directory", path.description, errno: err) }
            guard case .directory = try kind(of: path.name, in: parent) else {
                throw TransferError(.exists, "'\(path)' exists and is not a directory")
            }
            // O_PATH opens a folder its owner may not read; chmod through /proc/self/fd changes
            // exactly the folder opened, never what a symlink put at the name since points to.
            let fd = openDirectoryHandle(path.name, in: parent.fd)
            guard fd >= 0 else { return }
            defer { close(fd) }
            var info = stat()
            if fstat(fd, &info) == 0, info.st_uid == geteuid(), info.st_mode & S_IRWXU != S_IRWXU,
               chmod("/proc/self/fd/\(fd)", (info.st_mode & 0o7777) | S_IRWXU) == 0 {  // if refused, writing into it says why
                loosened[FileIdentity(info)] = info.st_mode & 0o7777
            }
        }
    }

    /// Opens a file `name` in `parent` without following a symlink.
    func openFile(_ name: String, in parent: Descriptor, flags: Int32, mode: mode_t = 0o600, shown: String) throws(TransferError) -> Descriptor {
        // O_NONBLOCK: opening a named pipe put at this name must not wait for a peer; it is
        // refused below like any other non-file (a partial or journal is only ever a file).
        let fd = openat(parent.fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode)
        guard fd >= 0 else {
            let err = errno
            if err == ELOOP { throw TransferError(.unsafePath, "'\(shown)' is a symlink; not following it") }
            throw TransferError.posix("cannot open", shown, errno: err)
        }
        let file = Descriptor(fd)
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw TransferError(.exists, "'\(shown)': '\(name)' is not a regular file; not writing into it")
        }
        return file
    }

    /// Creates the file `name` in `parent` for writing (mode 0600); nil when anything is at that
    /// name already (a symlink included: `O_EXCL` never follows one), to be opened with
    /// ``openOwnFile(_:in:flags:)`` or replaced with ``replaceFile(_:in:shown:)``.
    func createFile(_ name: String, in parent: Descriptor, shown: String) throws(TransferError) -> Descriptor? {
        let fd = openat(parent.fd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let err = errno
            if err == EEXIST { return nil }
            throw TransferError.posix("cannot create", shown, errno: err)
        }
        return Descriptor(fd)
    }

    /// Whether `info` is a file only this receiver can have made as a partial or journal: a
    /// regular file of its user, with one name and no bits beyond the owner's (as
    /// ``createFile(_:in:shown:)`` makes them). Another local user who can write into the
    /// folder can plant a hard link to a file of ours elsewhere (written through, it would
    /// change that file), or a file of their own open in their hands (they would read what
    /// arrives, and own the final file): neither passes.
    static func isOwnPrivateFile(_ info: stat) -> Bool {
        info.st_mode & S_IFMT == S_IFREG && info.st_uid == geteuid() && info.st_nlink == 1 && info.st_mode & 0o7077 == 0
    }

    /// Opens the file `name` in `parent` when it is one of ours (``isOwnPrivateFile(_:)``),
    /// never through a symlink; nil when absent, anything else, or not to be opened.
    static func openOwnFile(_ name: String, in parent: Descriptor, flags: Int32) -> Descriptor? {
        // Looked at before it is opened, so nothing else (a device) is ever opened; and after,
        // so what was opened is what was looked at.
        var before = stat(), after = stat()
        guard fstatat(parent.fd, name, &before, AT_SYMLINK_NOFOLLOW) == 0, isOwnPrivateFile(before) else { return nil }
        let fd = openat(parent.fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        let file = Descriptor(fd)
        guard fstat(fd, &after) == 0, isOwnPrivateFile(after), FileIdentity(after) == FileIdentity(before) else { return nil }
        return file
    }

    /// Creates the file `name` in `parent` afresh (as ``createFile(_:in:shown:)``), removing what
    /// is at that name first: never written through, never followed. Throws when it cannot be
    /// removed (a folder; another user's file in a sticky folder) or keeps coming back.
    func replaceFile(_ name: String, in parent: Descriptor, shown: String) throws(TransferError) -> Descriptor {
        for _ in 0..<4 {
            if let created = try createFile(name, in: parent, shown: shown) { return created }
            if unlinkat(parent.fd, name, 0) != 0 {
                let err = errno
                if err == ENOENT { continue }
                if err == EISDIR || err == EPERM {
                    throw TransferError(.exists, "'\(shown)': '\(name)' is in the way and cannot be removed; not writing into it")
                }
                throw TransferError.posix("cannot remove '\(name)' for", shown, errno: err)
            }
        }
        throw TransferError(.exists, "'\(shown)': something keeps reappearing at '\(name)'; not writing into it")
    }

    /// What the file system here does with the files written into this folder, asked of one
    /// empty probe file of a reserved name (removed at once); nothing is known, and `false` and
    /// nil are given, when the folder takes no new file.
    public struct FileSystemTraits: Sendable {
        /// Whether it takes names that differ only in case for one name (exFAT, FAT, NTFS, an
        /// ext4 folder with casefold): the probe's name, looked up in upper case, is found.
        public var foldsCase = false
        /// The largest file it holds, in bytes (FAT32: 4 GiB − 1; ext2 with 1 KiB blocks: about
        /// 16 GiB); nil for one that holds any size a file can have. The kernel refuses to move
        /// a file's offset past that size (EINVAL), so the probe finds it by bisection, in at
        /// most 63 seeks and nothing written. (A FUSE file system's own limit is its daemon's,
        /// which the kernel does not know.)
        public var largestFile: UInt64?
    }

    /// Probes the file system here (``FileSystemTraits``).
    public func fileSystemTraits() -> FileSystemTraits {
        let name = ".qxfer-probe-\(getpid())-\(UInt32.random(in: 0 ... .max)).qxfer-partial"
        let fd = openat(root.fd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return FileSystemTraits() }
        defer {
            close(fd)
            unlinkat(root.fd, name, 0)
        }
        var info = stat()
        var traits = FileSystemTraits(foldsCase: fstatat(root.fd, name.uppercased(), &info, AT_SYMLINK_NOFOLLOW) == 0)
        func reaches(_ offset: Int64) -> Bool { lseek(fd, off_t(offset), SEEK_SET) == off_t(offset) }
        guard !reaches(.max) else { return traits }
        var (low, high) = (Int64(0), Int64.max)  // reaches(low) and !reaches(high)
        while high - low > 1 {
            let middle = low + (high - low) / 2
            if reaches(middle) { low = middle } else { high = middle }
        }
        traits.largestFile = UInt64(low)
        return traits
    }

    /// Opens the file at `path` for reading, never through a symlink.
    public func openForReading(_ path: SafePath) throws(TransferError) -> Descriptor {
        let parent = try openParent(of: path, create: false)
        return try openFile(path.name, in: parent, flags: O_RDONLY, shown: path.description)
    }

    /// Creates the symlink `path -> target` after ``SafePath/validateLinkTarget(_:)``; an
    /// existing identical link is fine, anything else at that name is `exists`.
    public func createSymlink(_ path: SafePath, target: String) throws(TransferError) {
        try path.validateLinkTarget(target)
        let parent = try openParent(of: path, create: true)
        if symlinkat(target, parent.fd, path.name) == 0 {
            noteMade(path.name, in: parent.fd)
        } else {
            let err = errno
            guard err == EEXIST else { throw TransferError.posix("cannot create symlink", path.description, errno: err) }
            guard linkTarget(of: path.name, in: parent).map(ExactString.init) == ExactString(target) else { throw TransferError(.exists, "'\(path)' exists and is not the same symlink") }
        }
    }

    /// The target of the symlink at `path`, or nil if there is none (or it cannot be read).
    public func linkTarget(of path: SafePath) -> String? {
        guard let parent = try? openParent(of: path, create: false) else { return nil }
        return linkTarget(of: path.name, in: parent)
    }

    private func linkTarget(of name: String, in parent: Descriptor) -> String? {
        var buffer = [CChar](repeating: 0, count: ProtocolLimits.maximumLinkTargetLength + 2)
        let n = readlinkat(parent.fd, name, &buffer, buffer.count - 1)
        guard n >= 0 else { return nil }
        // A target that is not UTF-8 is no target an offer can name (decoded with repair, it
        // could have equalled one holding U+FFFD).
        return String(validating: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// What is at a name, without following symlinks.
    public enum EntryState: Equatable, Sendable {
        case absent
        case regularFile(size: UInt64)
        case directory
        case symlink
        case other
    }

    /// What is at `path` now (parents are traversed with `O_NOFOLLOW`; a missing parent means absent).
    public func state(of path: SafePath) throws(TransferError) -> EntryState {
        let parent: Descriptor?
        do {
            parent = try openDirectoryIfPresent(path.parentComponents, create: false, shown: path.description)
        } catch where error.code == .io {
            return .absent
        }
        guard let parent else { return .absent }
        return try kind(of: path.name, in: parent)
    }

    func kind(of name: String, in parent: Descriptor) throws(TransferError) -> EntryState {
        var info = stat()
        guard fstatat(parent.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
            let err = errno
            if err == ENOENT { return .absent }
            throw TransferError.posix("cannot stat", name, errno: err)
        }
        switch info.st_mode & S_IFMT {
        case S_IFREG: return .regularFile(size: UInt64(info.st_size))
        case S_IFDIR: return .directory
        case S_IFLNK: return .symlink
        default: return .other
        }
    }

    /// Applies permission bits (``permittedMode(_:)``) and the modification time to a directory
    /// this instance made, after its contents are written (writing into it would change its
    /// mtime again). A directory that was there before keeps its mode and time (one it made
    /// writable for its owner gets its own mode back): an offer does not change the user's
    /// folders.
    public func setDirectoryAttributes(_ path: SafePath, mode: UInt32, modificationTime: Int64) throws(TransferError) {
        let fd = try openDirectory(path.components[...], create: false, shown: path.description)
        var info = stat()
        guard fstat(fd.fd, &info) == 0 else { throw TransferError.posix("cannot stat", path.description, errno: errno) }
        let identity = FileIdentity(info)
        if made.contains(identity) {
            try applyAttributes(fd, mode: mode, modificationTime: modificationTime, shown: path.description)
        } else if let original = loosened.removeValue(forKey: identity), fchmod(fd.fd, original) != 0 {
            throw TransferError.posix("cannot restore the mode of", path.description, errno: errno)
        }
    }

    /// Sets the modification time of a symlink this instance made (its mode is meaningless on
    /// Linux); one that was there before keeps its own.
    public func setSymlinkTime(_ path: SafePath, modificationTime: Int64) throws(TransferError) {
        let parent = try openParent(of: path, create: false)
        var info = stat()
        guard fstatat(parent.fd, path.name, &info, AT_SYMLINK_NOFOLLOW) == 0, made.contains(FileIdentity(info)) else { return }
        var times = [timespec(nanoseconds: modificationTime), timespec(nanoseconds: modificationTime)]
        guard utimensat(parent.fd, path.name, &times, AT_SYMLINK_NOFOLLOW) == 0 else {
            throw TransferError.posix("cannot set the time of", path.description, errno: errno)
        }
    }

    /// Bits a mode from the network never keeps: group and other write, and whatever else the
    /// user's umask takes away, as a program creating the file here would have it.
    static let maskedBits: mode_t = 0o022 | (processUmask() ?? 0o022)

    /// The umask, read from `/proc/self/status` (umask(2) reads it only by setting it, which
    /// races other threads creating files); nil where the kernel does not say.
    private static func processUmask() -> mode_t? {
        let fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        for line in String(decoding: buffer[0..<n], as: UTF8.self).split(separator: "\n") where line.hasPrefix("Umask:") {
            return mode_t(line.dropFirst("Umask:".count).trimmingPrefix(while: \.isWhitespace), radix: 8)
        }
        return nil
    }

    /// The permission bits an offered `mode` gives what the receiver made: `mode & 0o777`
    /// (never setuid, setgid or sticky) less ``maskedBits``.
    static func permittedMode(_ mode: UInt32) -> mode_t { mode_t(mode & 0o777) & ~maskedBits }

    /// Applies ``permittedMode(_:)`` and the modification time to a file or folder the receiver made.
    func applyAttributes(_ file: Descriptor, mode: UInt32, modificationTime: Int64, shown: String) throws(TransferError) {
        guard fchmod(file.fd, Self.permittedMode(mode)) == 0 else { throw TransferError.posix("cannot set the mode of", shown, errno: errno) }
        var times = [timespec(nanoseconds: modificationTime), timespec(nanoseconds: modificationTime)]
        guard futimens(file.fd, &times) == 0 else { throw TransferError.posix("cannot set the time of", shown, errno: errno) }
    }

    /// Bytes available to an unprivileged user on the directory's file system (`statvfs`).
    public func availableSpace() throws(TransferError) -> UInt64 {
        var info = statvfs()
        guard fstatvfs(root.fd, &info) == 0 else { throw TransferError.posix("cannot statvfs", path, errno: errno) }
        let (product, overflow) = UInt64(info.f_bavail).multipliedReportingOverflow(by: UInt64(info.f_frsize))
        return overflow ? .max : product
    }

    /// Throws ``TransferError/Code/noSpace`` unless `bytes` fit in the free space.
    public func checkFreeSpace(for bytes: UInt64) throws(TransferError) {
        let available = try availableSpace()
        guard bytes <= available else {
            throw TransferError(.noSpace, "\(TextFormat.bytes(bytes)) offered but only \(TextFormat.bytes(available)) free in \(path)")
        }
    }
}

extension timespec {
    /// A timespec from nanoseconds since the epoch (floor division, so negative times work).
    init(nanoseconds: Int64) {
        var seconds = nanoseconds / 1_000_000_000
        var rest = nanoseconds % 1_000_000_000
        if rest < 0 {
            seconds -= 1
            rest += 1_000_000_000
        }
        self.init(tv_sec: Int(seconds), tv_nsec: Int(rest))
    }
}
