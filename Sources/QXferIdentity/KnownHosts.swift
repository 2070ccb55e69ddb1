import FoundationEssentials
import Glibc
import PlainText
import SafeOutput
@_spi(Stacks) import QXferCore

/// The hosts this machine has connected to and the fingerprints they presented:
/// trust on first use, like SSH's known_hosts.
///
/// One line per host, `HOST:PORT FINGERPRINT` (IPv6 hosts in brackets), `#` starts a comment.
/// A malformed line is an error rather than a skipped entry, so a damaged file never turns
/// into silent re-trusting.
public struct KnownHosts: Sendable, Hashable {
    /// The file's path.
    public let path: String

    /// The known-hosts file at an explicit path.
    public init(path: String) { self.path = path }

    /// `known_hosts` in a configuration folder.
    public init(in directory: ConfigDirectory = .standard) {
        self.path = directory.file("known_hosts")
    }

    /// An entry found in the file.
    public struct Entry: Sendable, Hashable {
        /// The key the entry is filed under (`host:port`).
        public let host: String
        /// The fingerprint recorded for it.
        public let fingerprint: Fingerprint
        /// The 1-based line number, for messages that tell a person what to edit.
        public let line: Int
    }

    /// The key under which an endpoint is recorded: `host:port`, lowercased, IPv6 in brackets.
    public static func key(host: String, port: Int) -> String {
        let lowered = host.lowercased()
        return lowered.contains(":") ? "[\(lowered)]:\(port)" : "\(lowered):\(port)"
    }

    /// The entry for `key`, if any.
    public func lookup(_ key: String) throws -> Entry? {
        try entries().first { $0.host == key }
    }

    /// Every entry, in file order.
    public func entries() throws -> [Entry] {
        guard SecureFile.exists(path) else { return [] }
        let text = String(decoding: try SecureFile.readPrivate(path), as: UTF8.self)
        var result: [Entry] = []
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = TextFormat.trimmed(rawLine)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count == 2, let fingerprint = Fingerprint(parsing: fields[1]) else {
                throw QXferError(.identity, "\(path) line \(index + 1) is malformed; expected 'HOST:PORT FINGERPRINT'")
            }
            result.append(Entry(host: String(fields[0]), fingerprint: fingerprint, line: index + 1))
        }
        return result
    }

    /// Records a first contact. Appends one line with a single write, so concurrent
    /// processes never interleave partial lines.
    public func add(_ key: String, _ fingerprint: Fingerprint) throws {
        try ConfigDirectory(path: OutputFile.folder(of: path)).create()
        // O_NONBLOCK: a pipe put at this path must not hang the connection; it is refused below.
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SecureFile.posixError("cannot open \(path)") }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw QXferError(.identity, "\(path) is not a regular file; qxfer keeps its configuration in regular files")
        }
        let line = Array("\(key) \(fingerprint)\n".utf8)
        let written = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard written == line.count, fsync(fd) == 0 else { throw SecureFile.posixError("cannot write \(path)") }
    }
}
