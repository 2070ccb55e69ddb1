import Foundation

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
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return ConfigDirectory(path: home + "/.config/qxfer")
    }

    /// The path of a file inside the folder.
    public func file(_ name: String) -> String { path + "/" + name }

    /// Creates the folder (and its parents) when missing, owner-only.
    func create() throws {
        do {
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw QXferError(.identity, "cannot create the configuration folder \(path): \(error.localizedDescription)")
        }
    }
}

/// Small file helpers with the permissions and atomicity the trust files need.
enum SecureFile {
    /// Writes `contents` to `path` with mode 0600: a temporary file, fsync, then rename,
    /// so a crash never leaves a half-written identity or trust file.
    static func writeAtomically(_ contents: [UInt8], to path: String) throws {
        let temporary = path + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw posixError("cannot create \(temporary)") }
        defer { close(fd) }
        var written = 0
        while written < contents.count {
            let n = contents.withUnsafeBytes { write(fd, $0.baseAddress! + written, $0.count - written) }
            if n < 0 {
                if errno == EINTR { continue }
                let error = posixError("cannot write \(temporary)")
                unlink(temporary)
                throw error
            }
            written += n
        }
        guard fsync(fd) == 0, rename(temporary, path) == 0 else {
            let error = posixError("cannot save \(path)")
            unlink(temporary)
            throw error
        }
    }

    /// Reads a whole file, refusing one that others can read or write.
    static func readPrivate(_ path: String) throws -> [UInt8] {
        var info = stat()
        guard stat(path, &info) == 0 else { throw posixError("cannot read \(path)") }
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
