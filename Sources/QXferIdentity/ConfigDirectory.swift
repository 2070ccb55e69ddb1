import FoundationEssentials
import Glibc
@_spi(Stacks) import QXferCore
import SafeOutput

/// The folder that holds a host's identity, its known hosts and its paired devices.
///
/// `$XDG_CONFIG_HOME/qxfer`, or `~/.config/qxfer` when that variable is unset or empty.
/// Created with mode 0700; every file in it is written with mode 0600.
public struct ConfigDirectory: Sendable, Hashable {
    /// The folder's path.
    public let path: String

    /// A configuration folder at an explicit path (tests, several identities on one machine).
    public init(path: String) { self.path = path }

    /// The user's default configuration folder, from the environment.
    public static var standard: ConfigDirectory {
        let environment = ProcessInfo.processInfo.environment
        if let base = environment["XDG_CONFIG_HOME"], !base.isEmpty {
            return ConfigDirectory(path: base + "/qxfer")
        }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? Self.homeFromUserDatabase()
        return ConfigDirectory(path: home + "/.config/qxfer")
    }

    /// The home folder the user database gives, for a process without HOME; "/" if none.
    private static func homeFromUserDatabase() -> String {
        guard let entry = getpwuid(getuid()), let home = entry.pointee.pw_dir else { return "/" }
        return String(cString: home)
    }

    /// The path of a file inside the folder.
    public func file(_ name: String) -> String { path + "/" + name }

    /// Creates the folder (and its parents) when missing, owner-only.
    func create() throws {
        // Each missing folder from the root down, as `mkdir -p` makes them.
        var made = path.hasPrefix("/") ? "/" : ""
        for component in path.split(separator: "/") {
            made += (made.isEmpty || made.hasSuffix("/") ? "" : "/") + component
            if mkdir(made, 0o700) != 0 && errno != EEXIST {
                throw QXferError(.identity, "cannot create the configuration folder \(path): \(String(cString: strerror(errno)))")
            }
        }
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw QXferError(.identity, "cannot create the configuration folder \(path): it is not a folder")
        }
    }
}

extension ConfigDirectory {
    /// Runs `body` holding an exclusive lock on the folder, created first when missing, so that
    /// qxfer processes changing the same files take turns. The folder itself is the lock:
    /// nothing extra to leave behind.
    func whileLocked<T>(_ body: () throws -> T) throws -> T {
        try create()
        let lock = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard lock >= 0 else { throw SecureFile.posixError("cannot lock \(path)") }
        defer { close(lock) }  // closing releases the lock
        while flock(lock, LOCK_EX) != 0 {
            guard errno == EINTR else { throw SecureFile.posixError("cannot lock \(path)") }
        }
        return try body()
    }
}

/// The per-host memories a connection keeps beside the trust files (the race's `stacks`, QUIC's
/// `session-tickets`): small text files that save time and on which nothing depends, so a damaged
/// one is ignored and a failed write is not an error.
public enum MemoryFile {
    /// The file's text; nil if it is missing, not a regular file, larger than `maximumSize` or
    /// not UTF-8.
    public static func read(_ path: String, maximumSize: Int) -> String? {
        // lstat, not FileManager's attributes: those look up the owner's and group's names
        // (the user and group databases), a millisecond at the start of every `qxfer send`.
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_size <= maximumSize,
              let data = FileManager.default.contents(atPath: path), data.count <= maximumSize else { return nil }
        return String(data: data, encoding: .utf8)
    }

    /// Rewrites the file under its folder's lock: `change` gets the text as ``read(_:maximumSize:)``
    /// gives it and returns the new text, or nil to leave the file as it is. Processes saving at
    /// once (sends to several hosts from one script) so keep each other's entries; without the
    /// lock each wrote back what it had read, and one host's entry could vanish.
    ///
    /// The file is replaced atomically with mode 0600, in a folder created 0700 when missing; a
    /// failure is ignored. Not synced: a memory is a cache, and a program's last act is often
    /// to write one (a first send's new session ticket), where two fsyncs cost it about 2 ms
    /// before it can exit. After a crash the file may be old, empty or partial, which ``read``'s
    /// callers ignore whole.
    public static func update(_ path: String, maximumSize: Int, _ change: (String?) -> String?) {
        try? ConfigDirectory(path: OutputFile.folder(of: path)).whileLocked {
            guard let text = change(read(path, maximumSize: maximumSize)) else { return }
            try? OutputFile.replaceContents(of: path, with: Array(text.utf8), permissions: 0o600, allowsDirectWrites: false, durably: false)
        }
    }
}

/// Small file helpers with the permissions and atomicity the trust files need.
enum SecureFile {
    /// Writes `contents` to `path` with mode 0600: a temporary file, fsync, then rename,
    /// so a crash never leaves a half-written identity or trust file. A symlinked file is
    /// replaced where the link points; a device, pipe or folder at the path is refused, never
    /// replaced.
    static func writeAtomically(_ contents: [UInt8], to path: String) throws {
        do {
            try OutputFile.replaceContents(of: path, with: contents, permissions: 0o600, allowsDirectWrites: false)
        } catch {
            throw QXferError(.identity, error.message)
        }
    }

    /// Reads a whole file, refusing one that others can read or write.
    static func readPrivate(_ path: String) throws -> [UInt8] {
        var info = stat()
        guard stat(path, &info) == 0 else { throw posixError("cannot read \(path)") }
        // A pipe would block the read forever, a device is no place for trust records.
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw QXferError(.identity, "\(path) is not a regular file; qxfer keeps its configuration in regular files")
        }
        let mode = info.st_mode & 0o777
        if mode & 0o077 != 0 {
            throw QXferError(
                .identity,
                "\(path) is accessible by other users (mode \(String(mode, radix: 8))); run: chmod 600 \(path)")
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw posixError("cannot read \(path)")
        }
        return Array(data)
    }

    static func exists(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }

    static func posixError(_ what: String) -> QXferError {
        QXferError(.identity, "\(what): \(String(cString: strerror(errno)))")
    }
}
