import FoundationEssentials
import Glibc
import QUICEngine
@_spi(Stacks) import QXferCore
import QXferIdentity

/// The session tickets a QUIC client keeps per receiver, so that its next connection there
/// resumes the TLS session, and sends its first bytes as early data (0-RTT) when the ticket's
/// receiver is one the client trusts by pin, `known_hosts` or pairing.
///
/// Kept in `session-tickets` in the configuration folder beside `known_hosts`, one line per
/// host: `host:port expiry session parameters [fingerprint] [via=address]` (expiry in seconds
/// since 1970, session and parameters base64, the fingerprint of the receiver that issued the
/// ticket as verified then, the numeric address the ticket came over), written atomically with
/// mode 0600: a ticket lets its holder resume as this client.
/// Entries expire after six hours, as GnuTLS's servers stop accepting them. A file that cannot
/// be read or parsed is ignored whole (the next connection makes a full handshake), never
/// trusted in part. A ticket is no trust anchor: the receiver's certificate sealed in it is
/// checked against the pin or `known_hosts` again when the handshake completes.
public struct SessionTicketStore: Sendable, Hashable {
    /// Where the tickets live: `session-tickets` in the configuration folder.
    public let path: String
    /// How long after it arrived a ticket is still offered.
    public let lifetime: Duration
    /// Hosts kept at most; those closest to expiry are dropped first.
    static let capacity = 64
    /// qxfer never writes a larger file (64 entries of about 3 KiB), so none is read.
    static let maximumFileSize = 512 * 1024

    /// The tickets kept in `directory`.
    public init(in directory: ConfigDirectory = .standard, lifetime: Duration = .seconds(6 * 3600)) {
        path = directory.file("session-tickets")
        self.lifetime = lifetime
    }

    struct Entry: Hashable {
        let host: String
        let expiry: Int64
        let ticket: QUICSessionTicket
        /// The certificate fingerprint of the receiver that issued it, as verified then.
        var fingerprint: Fingerprint? = nil
        /// The numeric address the ticket came over: the next connection tries it first, as its
        /// early data goes to one address only.
        var address: String? = nil
    }

    /// The unexpired ticket for `endpoint`, if any.
    public func ticket(for endpoint: Endpoint, now: Date = Date()) -> QUICSessionTicket? {
        entry(for: endpoint, now: now)?.ticket
    }

    /// The unexpired entry for `endpoint`, with the fingerprint its ticket was issued under.
    func entry(for endpoint: Endpoint, now: Date = Date()) -> Entry? {
        let key = Self.key(endpoint)
        return load().first { $0.host == key && $0.expiry > Int64(now.timeIntervalSince1970) }
    }

    /// Keeps `ticket` for `endpoint` in place of the one before; nil forgets the host's ticket.
    /// `fingerprint` is the receiver's, as verified in the connection that brought the ticket:
    /// with it, the next connection may send its first bytes as early data
    /// (docs/SECURITY.md, "What early data may carry").
    /// A failure to write is ignored: a ticket saves a round trip, nothing depends on it.
    /// `address` is the numeric address the ticket came over, tried first next time.
    public func save(
        _ ticket: QUICSessionTicket?, for endpoint: Endpoint, fingerprint: Fingerprint? = nil, address: String? = nil, now: Date = Date()
    ) {
        let key = Self.key(endpoint)
        let seconds = Int64(now.timeIntervalSince1970)
        MemoryFile.update(path, maximumSize: Self.maximumFileSize) { text in
            let before = Self.entries(in: text)
            var entries = before.filter { $0.expiry > seconds && $0.host != key }
            if let ticket, Self.fits(ticket) {
                let lifetime = max(lifetime.components.seconds, 1)
                let expiry = seconds.addingReportingOverflow(lifetime).overflow ? .max : seconds + lifetime
                let address = address.flatMap { Self.isPrintable(Substring($0)) ? $0 : nil }
                entries.append(Entry(host: key, expiry: expiry, ticket: ticket, fingerprint: fingerprint, address: address))
            }
            guard entries != before else { return nil }
            entries.sort { $0.expiry > $1.expiry }
            return entries.prefix(Self.capacity).map {
                "\($0.host) \($0.expiry) \(Data($0.ticket.tlsSession).base64EncodedString()) \(Data($0.ticket.transportParameters).base64EncodedString())"
                    + ($0.fingerprint.map { " \($0)" } ?? "") + ($0.address.map { " via=\($0)" } ?? "") + "\n"
            }.joined()
        }
    }

    /// Saves `ticket` off the caller's thread (an event loop must not wait for a file write),
    /// remembered until written, so that ``finishPendingSaves()`` can wait for it.
    func saveSoon(_ ticket: QUICSessionTicket, for endpoint: Endpoint, fingerprint: Fingerprint?, address: String?) {
        Self.pending.withLock { pending in
            let id = pending.next
            pending.next += 1
            // Removes itself once written; it cannot before this lock is released.
            pending.tasks[id] = Task.detached {
                save(ticket, for: endpoint, fingerprint: fingerprint, address: address)
                _ = Self.pending.withLock { $0.tasks.removeValue(forKey: id) }
            }
        }
    }

    /// Waits until every ticket of this process's connections is written: a program about to
    /// exit calls it, or the ticket that arrived last (often just before the answer it waited
    /// for) may never reach the file, and the next connection resumes nothing.
    public static func finishPendingSaves() async {
        for task in pending.withLock({ Array($0.tasks.values) }) { await task.value }
    }

    private static let pending = Locked<(next: Int, tasks: [Int: Task<Void, Never>])>((0, [:]))

    /// The file's entries; none if it is missing, too large, not a regular file, or malformed anywhere.
    func load() -> [Entry] {
        Self.entries(in: MemoryFile.read(path, maximumSize: Self.maximumFileSize))
    }

    private static func entries(in text: String?) -> [Entry] {
        guard let text else { return [] }
        var entries: [Entry] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard (4...6).contains(fields.count), entries.count < Self.capacity, let expiry = Int64(fields[1]), expiry > 0,
                  Self.isPrintable(fields[0]),
                  let session = Data(base64Encoded: String(fields[2])), let parameters = Data(base64Encoded: String(fields[3])) else {
                return []
            }
            let ticket = QUICSessionTicket(tlsSession: Array(session), transportParameters: Array(parameters))
            guard Self.fits(ticket), !ticket.tlsSession.isEmpty else { return [] }
            // Then the fingerprint, the address, or both in that order.
            var fingerprint: Fingerprint?
            var address: String?
            for (index, field) in fields.dropFirst(4).enumerated() {
                if field.hasPrefix("via="), address == nil {
                    let value = field.dropFirst(4)
                    guard Self.isPrintable(value) else { return [] }
                    address = String(value)
                } else {
                    guard index == 0, let parsed = Fingerprint(parsing: field) else { return [] }
                    fingerprint = parsed
                }
            }
            entries.append(Entry(host: String(fields[0]), expiry: expiry, ticket: ticket, fingerprint: fingerprint, address: address))
        }
        return entries
    }

    static func key(_ endpoint: Endpoint) -> String { KnownHosts.key(host: endpoint.host, port: Int(endpoint.port)) }

    private static func fits(_ ticket: QUICSessionTicket) -> Bool {
        ticket.tlsSession.count <= QUICSessionTicket.maximumPartLength
            && ticket.transportParameters.count <= QUICSessionTicket.maximumPartLength
    }

    private static func isPrintable(_ field: Substring) -> Bool {
        !field.isEmpty && field.utf8.count <= 300 && field.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F }
    }
}

/// One connection's use of a ``SessionTicketStore``: the ticket it offers, and how it keeps the
/// next one or drops a ticket the engine cannot use.
struct Resumption: Sendable {
    let ticket: QUICSessionTicket?
    /// The receiver's fingerprint when `ticket` was issued, if the store knew it.
    let fingerprint: Fingerprint?
    /// The numeric address `ticket` came over, if the store knew it.
    let address: String?
    /// Keeps a new ticket with the fingerprint of the receiver that issued it and the numeric
    /// address it came over.
    let keep: @Sendable (QUICSessionTicket, Fingerprint?, String?) -> Void
    let forget: @Sendable () -> Void

    /// A client engine offering `configuration`'s ticket; one the engine refuses as damaged is
    /// forgotten and the engine made without it (a full handshake), never an error.
    static func makeEngine(_ configuration: QUICConfiguration, path: QUICPath, _ resumption: Resumption?) throws -> QUICConnection {
        if configuration.resumption != nil,
           let engine = try? QUICConnection(clientWith: configuration, path: path, now: QUICConnectionDriver.now) {
            return engine
        }
        if configuration.resumption != nil { resumption?.forget() }
        var fresh = configuration
        fresh.resumption = nil
        return try QUICConnection(clientWith: fresh, path: path, now: QUICConnectionDriver.now)
    }
}
