import Glibc

/// An output a program writes from start to end, opened the way its kind requires.
///
/// - A regular file (or a path where nothing exists yet) is written to a temporary file beside
///   it, which ``finish()`` makes durable and renames over it: the path holds the old file or
///   the whole new one, never a torn one. Symlinks are followed: the file they point to is
///   replaced and the link stays a link.
/// - A character device (a terminal, /dev/null), a named pipe or a Unix-domain socket is
///   written directly and never replaced; a pipe's reader gets the bytes as they are written
///   (opening a pipe waits for its reader, as `cat > fifo` does).
/// - `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` and `/proc/self/fd/N` write to the open
///   descriptor itself, wherever the shell pointed it.
/// - A folder or a block device is refused.
///
/// Not thread-safe: one owner writes, then finishes.
public final class OutputFile {
    /// The path as given.
    public let path: String
    /// What the path named when it was opened.
    public let kind: OutputKind
    private var descriptor: Int32
    private let closesDescriptor: Bool
    /// For regular files: the temporary file and the name it takes on ``finish()``.
    private var pending: (temporary: String, final: String)?
    private var finished = false

    /// Whether ``patch(_:at:)`` can rewrite earlier bytes (only a file written through a
    /// temporary file can seek).
    public var isSeekable: Bool { pending != nil }

    /// Opens `path` for writing, as its kind requires (see the type's documentation).
    ///
    /// - Parameters:
    ///   - path: where to write; `-` is standard output.
    ///   - permissions: the mode of a regular file written anew; nil keeps the mode of the file
    ///     it replaces, or 0666 less the umask for a new one.
    ///   - allowsDirectWrites: false refuses devices, pipes and sockets (for files that must be
    ///     read back later, such as configuration).
    /// - Throws: ``OutputError`` with a sentence naming the path.
    public init(path: String, permissions: mode_t? = nil, allowsDirectWrites: Bool = true) throws(OutputError) {
        self.path = path
        if let inherited = OutputFile.inheritedDescriptor(path) {
            guard allowsDirectWrites else { throw OutputError("\(path) is not a regular file") }
            var info = stat()
            guard fstat(inherited, &info) == 0 else { throw OutputError("cannot write to \(path)", errno: errno) }
            kind = OutputKind(mode: info.st_mode)
            descriptor = inherited
            closesDescriptor = false
            return
        }
        let target = try OutputFile.resolveSymlinks(path)
        kind = try OutputKind(path: target)
        closesDescriptor = true
        try OutputFile.refuse(kind, at: path, allowsDirectWrites: allowsDirectWrites)
        if kind.isWrittenDirectly {
            descriptor = kind == .socket ? try OutputFile.connect(to: target) : try OutputFile.openDirect(target)
        } else {
            (descriptor, pending) = try OutputFile.createTemporary(beside: target, permissions: permissions)
        }
    }

    /// The path as messages name it: `-` is "standard output".
    private var shownPath: String { path == "-" ? "standard output" : path }

    /// Writes all of `bytes` after what was written before.
    public func write(_ bytes: UnsafeRawBufferPointer) throws(OutputError) {
        switch OutputFile.writeAll(bytes, to: descriptor) {
        case 0: return
        case EPIPE: throw OutputError("the reader of \(shownPath) closed it")
        case let err: throw OutputError("cannot write to \(shownPath)", errno: err)
        }
    }

    /// Writes all of `bytes` to `descriptor`, retrying when interrupted and waiting while a
    /// non-blocking descriptor is full; 0, or the errno that stopped it.
    public static func writeAll(_ bytes: UnsafeRawBufferPointer, to descriptor: Int32) -> Int32 {
        guard let base = bytes.baseAddress else { return 0 }
        var done = 0
        while done < bytes.count {
            let n = Glibc.write(descriptor, base + done, bytes.count - done)
            if n >= 0 { done += n; continue }
            switch errno {
            case EINTR: continue
            case EAGAIN:
                var request = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
                _ = poll(&request, 1, -1)
            case let err: return err
            }
        }
        return 0
    }

    /// Writes all of `bytes` after what was written before.
    public func write(_ bytes: [UInt8]) throws(OutputError) {
        // withUnsafeBytes rethrows untyped; the copy of the pointer is valid only inside.
        var failure: OutputError?
        bytes.withUnsafeBytes { raw in
            do throws(OutputError) { try write(raw) } catch { failure = error }
        }
        if let failure { throw failure }
    }

    /// Rewrites bytes at `offset` (a header completed at the end), if the output can seek;
    /// does nothing otherwise. Returns whether it wrote.
    @discardableResult
    public func patch(_ bytes: [UInt8], at offset: Int64) throws(OutputError) -> Bool {
        guard isSeekable else { return false }
        let n = bytes.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, off_t(offset)) }
        guard n == bytes.count else { throw OutputError("cannot write to \(path)", errno: n < 0 ? errno : EIO) }
        return true
    }

    /// Ends the output: a regular file is synced and renamed into place (then its folder
    /// synced); anything else is closed (standard output stays open). Idempotent.
    ///
    /// `durably: false` renames without either sync, for a cache that nothing depends on: the
    /// path still holds the old file or the whole new one while the system runs, but after a
    /// crash it may hold the old one, or an empty or partial file its reader must ignore.
    public func finish(durably: Bool = true) throws(OutputError) {
        guard !finished else { return }
        finished = true
        defer { if closesDescriptor { close(descriptor) } }
        guard let (temporary, final) = pending else { return }
        pending = nil
        guard !durably || fsync(descriptor) == 0 else {
            let err = errno
            unlink(temporary)
            throw OutputError("cannot save \(path)", errno: err)
        }
        guard rename(temporary, final) == 0 else {
            let err = errno
            unlink(temporary)
            throw OutputError("cannot save \(path)", errno: err)
        }
        if durably { OutputFile.syncFolder(of: final) }
    }

    /// Ends the output without keeping it: a regular file's temporary is removed and the path
    /// keeps what it held before; anything else is closed.
    public func discard() {
        guard !finished else { return }
        finished = true
        if let (temporary, _) = pending { unlink(temporary) }
        pending = nil
        if closesDescriptor { close(descriptor) }
    }

    /// An output dropped without ``finish()`` or ``discard()`` keeps what was written: for a
    /// recording cut short by an error, the frames up to it are worth more than nothing.
    deinit { try? finish() }

    // MARK: - Opening

    /// The descriptor a path names when it is one of this process's own
    /// (`-`, `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`).
    static func inheritedDescriptor(_ path: String) -> Int32? {
        switch path {
        case "-", "/dev/stdout": return STDOUT_FILENO
        case "/dev/stderr": return STDERR_FILENO
        default:
            for prefix in ["/dev/fd/", "/proc/self/fd/"] where path.hasPrefix(prefix) {
                let number = path.dropFirst(prefix.count)
                guard !number.isEmpty, number.count <= 9, number.allSatisfy(\.isASCII), let fd = Int32(number),
                      fcntl(fd, F_GETFD) >= 0 else { return nil }
                return fd
            }
            return nil
        }
    }

    /// Follows symlinks to the path a write would reach, even when it does not exist yet
    /// (a dangling link names the file to create).
    static func resolveSymlinks(_ path: String) throws(OutputError) -> String {
        var current = path
        for _ in 0..<40 {
            var info = stat()
            guard lstat(current, &info) == 0 else {
                let err = errno
                if err == ENOENT { return current }
                throw OutputError("cannot examine \(path)", errno: err)
            }
            guard info.st_mode & S_IFMT == S_IFLNK else { return current }
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let n = readlink(current, &buffer, buffer.count - 1)
            guard n > 0 else { throw OutputError("cannot read the symlink \(current)", errno: errno) }
            // Decoded with repair, its target would name another file, which would be created.
            guard let target = String(validating: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) else {
                throw OutputError("cannot write \(path): the symlink \(current) points to a name that is not valid UTF-8")
            }
            current = target.hasPrefix("/") ? target : folder(of: current) + "/" + target
        }
        throw OutputError("cannot write \(path): too many levels of symlinks")
    }

    /// The folder holding `path`: "." for a bare name, "/" for a name at the root; a trailing
    /// slash names the same path ("a/b/" is in "a").
    public static func folder(of path: String) -> String {
        var path = Substring(path)
        while path.count > 1, path.hasSuffix("/") { path.removeLast() }
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    private static func createTemporary(beside final: String, permissions: mode_t?) throws(OutputError) -> (Int32, (String, String)) {
        var existing = stat()
        let keptMode: mode_t? = stat(final, &existing) == 0 ? existing.st_mode & 0o7777 : nil
        let name = final.split(separator: "/").last.map(String.init) ?? final
        let stem = "." + String(decoding: name.utf8.prefix(200), as: UTF8.self)
        for attempt in 0..<100 {
            let temporary = folder(of: final) + "/" + stem + ".qxfer-tmp-\(getpid())-\(attempt)"
            let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, permissions ?? 0o666)
            if fd < 0 {
                if errno == EEXIST { continue }
                throw OutputError("cannot create a file beside \(final)", errno: errno)
            }
            // An explicit mode is exact (the umask does not widen or narrow it); otherwise the
            // replaced file's mode carries over.
            if let mode = permissions ?? keptMode { fchmod(fd, mode) }
            return (fd, (temporary, final))
        }
        throw OutputError("cannot create a file beside \(final): too many leftover temporary files")
    }

    private static func openDirect(_ path: String) throws(OutputError) -> Int32 {
        while true {
            let fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC)
            if fd >= 0 { return fd }
            if errno == EINTR { continue }
            throw OutputError("cannot open \(path)", errno: errno)
        }
    }

    private static func connect(to path: String) throws(OutputError) -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else { throw OutputError("the socket path \(path) is too long") }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw OutputError("cannot create a socket", errno: errno) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let err = errno
            close(fd)
            throw OutputError("cannot connect to the socket \(path)", errno: err)
        }
        return fd
    }

    private static func syncFolder(of path: String) {
        let fd = open(folder(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }
}

extension OutputFile {
    /// Checks, without opening or creating anything, that `path` can be an output: refuses a
    /// folder, a block device, a path that cannot be examined, a file whose folder is missing
    /// or not writable (the file is written beside its name first), or (without direct writes)
    /// a device, pipe or socket. For a command to fail at once rather than when data arrives.
    public static func check(_ path: String, allowsDirectWrites: Bool = true) throws(OutputError) {
        if inheritedDescriptor(path) != nil { return }
        let resolved = try resolveSymlinks(path)
        let kind = try OutputKind(path: resolved)
        try refuse(kind, at: path, allowsDirectWrites: allowsDirectWrites)
        if kind == .absent || kind == .regularFile { try checkWritableFolder(of: resolved, for: path) }
    }

    private static func checkWritableFolder(of resolved: String, for path: String) throws(OutputError) {
        let folder = folder(of: resolved)
        var info = stat()
        guard stat(folder, &info) == 0 else {
            let err = errno
            if err == ENOENT { throw OutputError("cannot write \(path): the folder \(folder) does not exist") }
            throw OutputError("cannot write \(path): cannot examine \(folder)", errno: err)
        }
        guard info.st_mode & S_IFMT == S_IFDIR else { throw OutputError("cannot write \(path): \(folder) is not a folder") }
        guard access(folder, W_OK) == 0 else { throw OutputError("cannot write \(path): cannot create files in \(folder)", errno: errno) }
    }

    private static func refuse(_ kind: OutputKind, at path: String, allowsDirectWrites: Bool) throws(OutputError) {
        switch kind {
        case .absent, .regularFile:
            return
        case .characterDevice, .fifo, .socket:
            if allowsDirectWrites { return }
            throw OutputError("\(path) is \(kind), not a regular file; refusing to replace it")
        case .directory, .blockDevice:
            throw OutputError("\(path) is \(kind); give the path of a file to write")
        }
    }

    /// Whether writing to `path` writes this process's standard output (`-`, `/dev/stdout`,
    /// `/dev/fd/1`), so that reports must go elsewhere.
    public static func isStandardOutput(_ path: String) -> Bool {
        inheritedDescriptor(path) == STDOUT_FILENO
    }

    /// Replaces the whole content of `path` with `bytes` (see ``init(path:permissions:allowsDirectWrites:)``
    /// for what each kind of path gets); `durably: false` skips the syncs (``finish(durably:)``).
    public static func replaceContents(
        of path: String, with bytes: [UInt8], permissions: mode_t? = nil, allowsDirectWrites: Bool = true, durably: Bool = true
    ) throws(OutputError) {
        let output = try OutputFile(path: path, permissions: permissions, allowsDirectWrites: allowsDirectWrites)
        do {
            try output.write(bytes)
            try output.finish(durably: durably)
        } catch {
            output.discard()
            throw error
        }
    }
}
