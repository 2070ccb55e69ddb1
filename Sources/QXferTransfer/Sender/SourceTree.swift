#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
internal import PlainText
internal import SafeOutput

/// What a sender offers: the entries of an ``Offer`` and, for each file, where its bytes come
/// from. Built by walking the paths given on the command line with `lstat`.
public struct SourceTree: Sendable {
    /// Where an entry's bytes are read from.
    public enum Source: Sendable, Hashable {
        /// A regular file on disk (opened when its turn comes).
        case file(path: String)
        /// Standard input, read to its end (size unknown in advance).
        case standardInput
        /// A directory or symlink: no bytes.
        case none
    }

    /// The entries in offer order: every directory before what it contains.
    public private(set) var entries: [OfferEntry] = []
    /// `sources[i]` feeds `entries[i]`.
    public private(set) var sources: [Source] = []
    /// Things found but not sent, one line each (sockets, devices, links leaving the tree…).
    public private(set) var skipped: [String] = []
    /// The entries among ``skipped`` (all but those removed while their folder was read), each by
    /// its path as the receiver would have named it and why it is not sent: with the entries the
    /// receiver did not take, what the send did not transfer (issue 62 §1).
    public private(set) var notSent: [(path: String, error: TransferError)] = []
    /// The lines of ``skipped`` that name no entry: things removed while their folder was read.
    public private(set) var vanished: [String] = []
    /// How many of the skipped items are files, folders or links left out because qxfer/1
    /// cannot carry their names or link targets (or paths: deeper than 64 levels or longer than
    /// 4095 bytes, counted once with what they hold; or beyond what the system opens from the
    /// folder named): what the user asked to send that does not arrive, so the send is incomplete.
    /// (Sockets, devices and links leaving the tree hold no data qxfer carries.)
    public private(set) var unsentForTheirNames = 0
    /// How many of the skipped items are files or folders inside a folder that this process may
    /// not read (or list): the rest is sent, and the send then fails, as `scp -r` and rsync do.
    public private(set) var unreadable = 0
    /// How many entries `--exclude` left out (a folder counts once, with what it holds): not
    /// offered, not counted as failures.
    public private(set) var excluded = 0
    /// What to leave out; set for the scan.
    private var exclusions = ExclusionRules.none
    /// The entries (by index) of files too large to be batched that occupy fewer blocks than
    /// their size: they have holes (or are compressed), so the offer lets Zeros stand for them
    /// (docs/PROTOCOL.md §3.8), and the sender counts their holes once the receiver has answered.
    public private(set) var entriesWithHoles: Set<Int> = []
    /// Whether any file may have holes.
    public var mayHaveHoles: Bool { !entriesWithHoles.isEmpty }
    /// For each device seen, whether its file system reports the size of a file's content
    /// (see ``reportsContentSizes(_:)``): one `statfs` per file system, not per file.
    private var contentSizesByDevice: [UInt64: Bool] = [:]

    /// The bytes of all files of known size.
    public var totalSize: UInt64 { entries.reduce(0) { $0.saturatingAdd($1.size) } }  // sparse files may add up past 2^64

    public init() {}

    /// Walks `paths`: a file becomes one top-level entry, a directory a top-level directory
    /// with everything inside it (recursively; symlinks inside are sent as links when their
    /// target stays inside the tree, never followed), `-` standard input named `standardInputName`.
    /// A path named on the command line is followed if it is a symlink: the user chose it.
    /// Entries that `exclusions` match are left out (``excluded``), a folder with what it holds;
    /// standard input never is.
    public static func scan(
        _ paths: [String], standardInputName: String = "stdin", excluding exclusions: ExclusionRules = .none
    ) throws(TransferError) -> SourceTree {
        var tree = SourceTree()
        tree.exclusions = exclusions
        var topLevel = Set<ExactString>()
        for path in paths {
            let name: String
            if path == "-" {
                name = standardInputName
            } else {
                name = try topLevelName(of: path)
            }
            guard topLevel.insert(ExactString(name)).inserted else {
                throw TransferError(.unsafePath, "two of the paths to send are named '\(name)'; send them separately")
            }
            do {
                _ = try SafePath(validating: [name])
            } catch {
                throw TransferError(.unsafePath, "cannot send '\(path)': \(error.message)")
            }
            if path == "-" {
                tree.append(
                    OfferEntry(kind: .file, flags: .sizeUnknown, path: [name], mode: 0o644, modificationTime: currentTime()),
                    .standardInput)
                continue
            }
            var info = stat()
            guard stat(path, &info) == 0 else { throw TransferError.posix("cannot read", "'\(path)'", errno: errno) }
            if exclusions.excludes([name], isFolder: info.st_mode & S_IFMT == S_IFDIR) {
                tree.excluded += 1
                continue
            }
            if let kind = specialKind(info) {
                // Named by the user, so not skipped in silence: `qxfer send <(tar c dir) HOST`
                // would otherwise offer nothing and succeed.
                throw TransferError(
                    .io, "cannot send '\(path)': it is \(kind), not a file or folder (to send what a program writes, pipe it: … | qxfer send - HOST --name NAME)")
            }
            // Named by the user: refused before anything is offered, not skipped.
            guard isReadable(path, info) else { throw TransferError.posix("cannot read", "'\(path)'", errno: errno) }
            try tree.add(path: path, components: [name], info: info)
        }
        guard tree.entries.count <= ProtocolLimits.maximumEntries else {
            throw TransferError(.limitExceeded, "\(tree.entries.count) entries to send; qxfer/1 allows \(ProtocolLimits.maximumEntries) per transfer")
        }
        return tree
    }

    /// A path for a message, at most about 200 characters: the start and the end of a longer one.
    static func shortened(_ path: String) -> String {
        let scalars = path.unicodeScalars
        guard scalars.count > 200 else { return path }
        return String(String.UnicodeScalarView(scalars.prefix(96))) + "…" + String(String.UnicodeScalarView(scalars.suffix(96)))
    }

    private mutating func append(_ entry: OfferEntry, _ source: Source) {
        entries.append(entry)
        sources.append(source)
    }

    /// Leaves out the entry at `path` (local, shown), `components` as the offer would carry it:
    /// its line says `reason`, and it counts as not transferred with `code`.
    private mutating func leaveOut(_ path: String, _ components: [String], _ reason: String, _ code: TransferError.Code) {
        skipped.append("'\(path)': \(reason); not sent")
        notSent.append((components.joined(separator: "/"), TransferError(code, reason)))
    }

    /// A file time in nanoseconds since the epoch, clamped to what Int64 holds (about the years
    /// 1678 to 2262): a file can carry a time far outside (`touch -d @99999999999`).
    static func nanoseconds(_ time: timespec) -> Int64 {
        let (scaled, overflow) = Int64(time.tv_sec).multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return time.tv_sec < 0 ? .min : .max }
        return scaled.addingReportingOverflow(Int64(time.tv_nsec)).overflow ? .max : scaled + Int64(time.tv_nsec)
    }

    private mutating func add(path: String, components: [String], info: stat) throws(TransferError) {
        guard components.count <= ProtocolLimits.maximumDepth else {
            // qxfer/1 carries paths of at most 64 components: this one and what it holds stay
            // behind, named, and the send fails once the rest has arrived, as for a name it
            // cannot carry (a path named on the command line is one component).
            leaveOut(path, components, "nested deeper than \(ProtocolLimits.maximumDepth) levels, which qxfer/1 cannot carry", .unsafePath)
            unsentForTheirNames += 1
            return
        }
        let mode = UInt32(info.st_mode) & 0o7777
        let mtime = Self.nanoseconds(info.st_mtim)
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            guard reportsContentSize(path, device: UInt64(info.st_dev)) else {
                // A kernel file (`/proc/cpuinfo` is 0 bytes to stat, a sysfs attribute 4096):
                // sent as standard input is, read to its end, rather than as 0 bytes or a failure.
                if let error = Self.firstReadFails(path) {
                    // Named by the user: refused before anything is offered, not skipped.
                    if components.count == 1 { throw TransferError.posix("cannot read", "'\(path)'", errno: error) }
                    leaveOut(path, components, "cannot read: \(String(cString: strerror(error)))", .io)
                    unreadable += 1
                    return
                }
                append(
                    OfferEntry(kind: .file, flags: .sizeUnknown, path: components, mode: mode, modificationTime: mtime),
                    .file(path: path))
                return
            }
            let size = UInt64(clamping: info.st_size)
            if size > TransferSender.batchedFileLimit, info.st_blocks < info.st_size / 512 { entriesWithHoles.insert(entries.count) }
            append(OfferEntry(kind: .file, path: components, size: size, mode: mode, modificationTime: mtime), .file(path: path))
        case S_IFDIR:
            let (children, undecodable) = try SourceTree.list(path)
            append(OfferEntry(kind: .directory, path: components, mode: mode, modificationTime: mtime), .none)
            for name in undecodable {
                leaveOut("\(path)/\(name)", components + [name], "the name is not valid UTF-8, as qxfer/1 names must be", .unsafePath)
                unsentForTheirNames += 1
            }
            // The relative path of each child, as the offer carries it: a `/` after each folder.
            let folderLength = components.reduce(0) { $0 + $1.utf8.count + 1 }
            for name in children {
                let childPath = path + "/" + name
                // Excluded before anything is said of it: a name qxfer/1 cannot carry, left out on purpose, is no failure.
                if exclusions.excludes(components + [name], isFolder: nil) {
                    excluded += 1
                    continue
                }
                guard (try? SafePath(validating: [name])) != nil else {
                    leaveOut(childPath, components + [name], "the name is not allowed in qxfer/1 (control characters or a reserved suffix)", .unsafePath)
                    unsentForTheirNames += 1
                    continue
                }
                // Left behind with what it holds, named, as for a tree nested too deep.
                let length = folderLength + name.utf8.count
                guard length <= ProtocolLimits.maximumPathLength else {
                    leaveOut(Self.shortened(childPath), components + [name], "a path of \(length) bytes, longer than the \(ProtocolLimits.maximumPathLength) qxfer/1 carries", .unsafePath)
                    unsentForTheirNames += 1
                    continue
                }
                var childInfo = stat()
                guard lstat(childPath, &childInfo) == 0 else {
                    let error = errno
                    // Gone since the listing: nothing of it can be sent, nothing is lost.
                    if error == ENOENT {
                        skipped.append("'\(childPath)': removed while the folder was read; not sent")
                        vanished.append(skipped.last!)
                        continue
                    }
                    // Its relative path fits qxfer/1, but the folder named on the command line
                    // adds more than this system opens at once (PATH_MAX).
                    if error == ENAMETOOLONG {
                        leaveOut(Self.shortened(childPath), components + [name], "the full path is longer than this system opens (PATH_MAX); send it from a folder nearer to it", .unsafePath)
                        unsentForTheirNames += 1
                        continue
                    }
                    throw TransferError.posix("cannot read", "'\(childPath)'", errno: error)
                }
                let kind = childInfo.st_mode & S_IFMT
                if kind == S_IFDIR, exclusions.excludes(components + [name], isFolder: true) {
                    excluded += 1
                    continue
                }
                if kind == S_IFREG || kind == S_IFDIR, !Self.isReadable(childPath, childInfo) {
                    let reason = String(cString: strerror(errno))
                    leaveOut(childPath, components + [name], "\(kind == S_IFDIR ? "cannot list" : "cannot read"): \(reason)", .io)
                    unreadable += 1
                    continue
                }
                try add(path: childPath, components: components + [name], info: childInfo)
            }
        case S_IFLNK:
            let bytes = try SourceTree.readLink(path)
            // Decoded with repair, `caf\xe9` would arrive as a link to another name.
            guard let target = String(validating: bytes, as: UTF8.self) else {
                leaveOut(path, components, "symlink to '\(TerminalText.escaped(bytes: bytes))', a target that is not valid UTF-8, which qxfer/1 cannot carry", .unsafePath)
                unsentForTheirNames += 1
                return
            }
            do {
                try SafePath(validating: components).validateLinkTarget(target)
            } catch {
                leaveOut(path, components, "symlink to '\(target)' leaves the tree", .unsafePath)
                return
            }
            append(OfferEntry(kind: .symlink, path: components, mode: mode, modificationTime: mtime, linkTarget: target), .none)
        default:
            leaveOut(path, components, "\(Self.specialKind(info) ?? "not a regular file"), not a file, folder or symlink", .unsupported)
        }
    }

    /// Whether the file system of `path` (on `device`) reports the size of a file's content.
    private mutating func reportsContentSize(_ path: String, device: UInt64) -> Bool {
        if let known = contentSizesByDevice[device] { return known }
        // Gone since it was listed, say: taken as an ordinary file, which then fails alone.
        guard let type = fileSystemType(of: path) else { return true }
        let reports = Self.reportsContentSizes(type)
        contentSizesByDevice[device] = reports
        return reports
    }

    /// Reads the first byte of a kernel file, whose reads can fail however readable its
    /// permissions say it is (a sysfs attribute its device lacks: `EINVAL`, `EOPNOTSUPP`, `EIO`),
    /// or wait for an event (`trace_pipe`: `EAGAIN` here, without blocking): found out now, it is
    /// skipped and named, where in the middle of the transfer it would end it. Returns the
    /// `errno` of the failure, or nil.
    static func firstReadFails(_ path: String) -> Int32? {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        var byte: UInt8 = 0
        var n: Int
        repeat { n = read(fd, &byte, 1) } while n < 0 && errno == EINTR
        return n < 0 ? errno : nil
    }

    /// Whether files on a file system of this type (`statfs`'s `f_type`) have the size of their
    /// content. The kernel's own file systems make a file's content when it is read: procfs and
    /// cgroup files have size 0, sysfs, configfs and securityfs ones the page size, debugfs and
    /// tracefs ones either.
    static func reportsContentSizes(_ fileSystemType: Int64) -> Bool {
        switch fileSystemType {
        case 0x9fa0,  // procfs
             0x6265_6572,  // sysfs
             0x6462_6720,  // debugfs
             0x7472_6163,  // tracefs
             0x7363_6673,  // securityfs
             0x6265_6570,  // configfs
             0x0027_e0eb,  // cgroup
             0x6367_7270:  // cgroup2
            false
        default:
            true
        }
    }

    /// Whether this process may read the file, or list and enter the folder, at `path`. The
    /// permission bits settle the usual cases (own or everyone's) without a system call; the
    /// kernel decides the rest (groups, ACLs, root's override), and sets `errno` when it says no.
    /// A file may still become unreadable before its turn; the send then fails with an I/O
    /// error (docs/PROTOCOL.md §3.5).
    static func isReadable(_ path: String, _ info: stat) -> Bool {
        let folder = info.st_mode & S_IFMT == S_IFDIR
        let needed: mode_t = folder ? 0o5 : 0o4  // read, and search for a folder
        let owner = (info.st_mode >> 6) & needed == needed
        let groupAndOthers = (info.st_mode >> 3) & needed == needed && info.st_mode & needed == needed
        if info.st_uid == geteuid() ? owner : groupAndOthers { return true }
        return faccessat(AT_FDCWD, path, folder ? R_OK | X_OK : R_OK, AT_EACCESS) == 0
    }

    /// What a path that is neither file, folder nor symlink is, in words; nil for those three.
    static func specialKind(_ info: stat) -> String? {
        switch info.st_mode & S_IFMT {
        case S_IFREG, S_IFDIR, S_IFLNK: nil
        case S_IFIFO: "a pipe (FIFO)"
        case S_IFSOCK: "a socket"
        case S_IFCHR, S_IFBLK: "a device"
        default: "not a regular file"
        }
    }

    /// The name the receiver sees for a path given on the command line: its last component
    /// (`.` and `dir/` resolve to the directory's own name).
    static func topLevelName(of path: String) throws(TransferError) -> String {
        guard let resolved = realpath(path, nil) else { throw TransferError.posix("cannot read", "'\(path)'", errno: errno) }
        defer { free(resolved) }
        let full = UnsafeRawBufferPointer(start: resolved, count: strlen(resolved))
        // Split at '/' bytes as the kernel does ('/' and a combining mark are one Character).
        guard let last = full.split(separator: UInt8(ascii: "/")).last else {
            throw TransferError(.unsafePath, "cannot send the root directory itself; name what is inside it")
        }
        guard let name = String(validating: last, as: UTF8.self) else {
            throw TransferError(.unsafePath, "cannot send '\(path)': its name '\(TerminalText.escaped(bytes: last))' is not valid UTF-8, as qxfer/1 names must be")
        }
        return name
    }

    /// Where a directory entry's name starts in its record.
    private static let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!

    /// The names in a directory, sorted by bytes, without `.` and `..`, and the names left out
    /// because they are not valid UTF-8 (qxfer/1 names are UTF-8), escaped to be shown.
    static func list(_ path: String) throws(TransferError) -> (names: [String], undecodable: [String]) {
        guard let directory = opendir(path) else { throw TransferError.posix("cannot list", "'\(path)'", errno: errno) }
        defer { closedir(directory) }
        var names: [String] = []
        var undecodable: [String] = []
        while let entry = readdir(directory) {
            // Read in place up to its NUL: a record is only as long as its name needs, so
            // copying the 256-byte `d_name` out read past the end of the kernel's buffer
            // (AddressSanitizer, on a 250-byte name that ended the buffer).
            let start = UnsafeRawPointer(entry).advanced(by: Self.nameOffset).assumingMemoryBound(to: CChar.self)
            let bytes = UnsafeRawBufferPointer(start: start, count: strlen(start))
            guard let name = String(validating: bytes, as: UTF8.self) else {
                undecodable.append(TerminalText.escaped(bytes: bytes))
                continue
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return (names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }, undecodable.sorted())
    }

    /// The bytes of the symlink's target.
    static func readLink(_ path: String) throws(TransferError) -> [UInt8] {
        var buffer = [CChar](repeating: 0, count: ProtocolLimits.maximumLinkTargetLength + 2)
        let n = readlink(path, &buffer, buffer.count - 1)
        guard n >= 0 else { throw TransferError.posix("cannot read the symlink", "'\(path)'", errno: errno) }
        return buffer[0..<n].map { UInt8(bitPattern: $0) }
    }

    static func currentTime() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    }
}
