import FoundationEssentials
import Glibc
@_spi(Stacks) import QXferCore
import QXferIdentity

/// Which stack won the last race to each host, when the preferred one could not: a network
/// that drops UDP is remembered, so the next connection there starts TCP+TLS at once instead of
/// after the attempt delay. Only evidence counts — the preferred stack refused, or silent for
/// ``RaceStack/silenceProof`` — not a close race it lost while its peer answered. Entries
/// expire (an hour by default): a later network that lets UDP through gets QUIC back. A race
/// the preferred stack wins, or one where its peer answered, forgets the host.
///
/// Kept in `stacks` in the configuration folder beside `known_hosts`, one line per host:
/// `host:port stack expiry` (expiry in seconds since 1970), written atomically with mode 0600.
/// A file that cannot be read or parsed is ignored (the race then runs in its default order),
/// never trusted in part.
public struct StackMemory: Sendable, Hashable {
    /// The file's path.
    public let path: String
    /// How long an entry holds.
    public let lifetime: Duration
    /// The most hosts kept; the soonest to expire go first.
    static let capacity = 256
    /// A larger file is not read: it was not written by qxfer.
    static let maximumFileSize = 64 * 1024

    /// The memory in a configuration folder (`stacks` beside `known_hosts`).
    public init(in directory: ConfigDirectory = .standard, lifetime: Duration = .seconds(3600)) {
        self.init(path: directory.file("stacks"), lifetime: lifetime)
    }

    /// The memory in an explicit file.
    public init(path: String, lifetime: Duration = .seconds(3600)) {
        self.path = path
        self.lifetime = lifetime
    }

    /// One remembered winner.
    public struct Entry: Sendable, Hashable {
        /// `host:port`.
        public let host: String
        /// The winning stack's name ("TCP+TLS").
        public let stack: String
        /// When the entry stops counting, in seconds since 1970.
        public let expiry: Int64
    }

    /// The entry for `endpoint` that has not expired, if any.
    public func entry(for endpoint: Endpoint, now: Date = Date()) -> Entry? {
        let key = Self.key(endpoint)
        return load().first { $0.host == key && $0.expiry > Int64(now.timeIntervalSince1970) }
    }

    /// `candidates` with the remembered winner for `endpoint` moved to the front.
    func ordered(_ candidates: [any TransportStack], for endpoint: Endpoint) -> [any TransportStack] {
        guard let remembered = entry(for: endpoint)?.stack,
              let index = candidates.firstIndex(where: { $0.name == remembered }), index > 0 else { return candidates }
        var reordered = candidates
        reordered.insert(reordered.remove(at: index), at: 0)
        return reordered
    }

    /// Records the race's winner: remembered if it is not the preferred stack, forgotten if it
    /// is. The file is rewritten only when that changes something (expired entries count); a failure to write is
    /// ignored (the memory saves a delay, nothing depends on it).
    func record(winner: String, preferred: String, for endpoint: Endpoint, now: Date = Date()) {
        let key = Self.key(endpoint)
        let seconds = Int64(now.timeIntervalSince1970)
        MemoryFile.update(path, maximumSize: Self.maximumFileSize) { text in
            let before = Self.entries(in: text)
            var entries = before.filter { $0.expiry > seconds }  // expired entries go at the next write
            entries.removeAll { $0.host == key }
            if winner != preferred {
                let lifetime = max(lifetime.components.seconds, 1)
                entries.append(Entry(host: key, stack: winner, expiry: seconds.addingReportingOverflow(lifetime).overflow ? .max : seconds + lifetime))
            }
            guard entries != before else { return nil }
            entries.sort { $0.expiry > $1.expiry }
            return entries.prefix(Self.capacity).map { "\($0.host) \($0.stack) \($0.expiry)\n" }.joined()
        }
    }

    /// The file's entries; none if it is missing, too large, not a regular file, or malformed
    /// anywhere.
    public func load() -> [Entry] {
        Self.entries(in: MemoryFile.read(path, maximumSize: Self.maximumFileSize))
    }

    private static func entries(in text: String?) -> [Entry] {
        guard let text else { return [] }
        var entries: [Entry] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard fields.count == 3, let expiry = Int64(fields[2]), expiry > 0,
                  Self.isPrintable(fields[0]), Self.isPrintable(fields[1]) else { return [] }
            entries.append(Entry(host: String(fields[0]), stack: String(fields[1]), expiry: expiry))
        }
        return entries
    }

    static func key(_ endpoint: Endpoint) -> String { KnownHosts.key(host: endpoint.host, port: Int(endpoint.port)) }

    private static func isPrintable(_ field: Substring) -> Bool {
        !field.isEmpty && field.utf8.count <= 300 && field.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F }
    }
}
