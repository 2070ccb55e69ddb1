/// One datagram that asks a QUIC server whether datagrams of its size reach it, before any
/// connection: a long-header packet of a reserved version (RFC 9000 §15, `0x?a?a?a?a`), padded
/// to ``size``. Every QUIC server answers such a packet of at least 1 200 bytes with Version
/// Negotiation (§6.1), so an answer proves the path carried ``size`` bytes of UDP payload
/// (when sent with Don't Fragment: the caller's job).
///
/// Why: ngtcp2 0.12's path-MTU discovery tries a compiled-in list that ends at 1 444 bytes,
/// 28 short of what an Ethernet path carries (docs/benchmarks.md, "Datagrams as large as the
/// path carries"). Sans-IO: the caller sends ``datagram`` and offers what comes back to
/// ``isAnswered(by:)``.
public struct QUICPathProbe: Sendable, Hashable {
    /// The smallest datagram a server must answer (RFC 9000 §14.1).
    public static let minimumSize = 1200
    /// The largest UDP payload (65 535 less the UDP header).
    public static let maximumSize = 65_527
    /// The largest datagram ngtcp2 0.12's own path-MTU discovery tries (1 492 − 48, for IPv6
    /// behind PPPoE): probing pays only above it.
    public static let reachedByEngine = 1444
    private static let connectionIDLength = 8

    /// The UDP payload size this probe tests.
    public let size: Int
    /// The datagram to send: `size` bytes.
    public let datagram: [UInt8]
    private let destinationConnectionID: [UInt8]
    private let sourceConnectionID: [UInt8]

    /// A probe of `size` bytes (clamped to ``minimumSize``...``maximumSize``) with fresh random
    /// connection IDs, so only a server that saw it can answer it.
    public init(size: Int) {
        self.size = min(max(size, Self.minimumSize), Self.maximumSize)
        destinationConnectionID = QUICRandom.bytes(Self.connectionIDLength)
        sourceConnectionID = QUICRandom.bytes(Self.connectionIDLength)
        var random = QUICRandom.bytes(5)
        // A reserved version: every nibble pair ends in 0xa.
        let version = [random[1] & 0xf0 | 0x0a, random[2] & 0xf0 | 0x0a, random[3] & 0xf0 | 0x0a, random[4] & 0xf0 | 0x0a]
        random[0] = 0xc0 | random[0] & 0x3f  // long header, fixed bit
        var datagram = [random[0]] + version
        datagram.append(UInt8(Self.connectionIDLength))
        datagram += destinationConnectionID
        datagram.append(UInt8(Self.connectionIDLength))
        datagram += sourceConnectionID
        datagram += [UInt8](repeating: 0, count: self.size - datagram.count)
        self.datagram = datagram
    }

    /// Whether `reply` is the Version Negotiation packet answering this probe: a long header of
    /// version 0 whose connection IDs are this probe's, swapped, and a list of whole versions.
    public func isAnswered(by reply: UnsafeRawBufferPointer) -> Bool {
        // first byte, version (4), DCID length and DCID, SCID length and SCID, versions.
        guard reply.count >= 7, reply[0] & 0x80 != 0, reply[1] == 0, reply[2] == 0, reply[3] == 0, reply[4] == 0 else { return false }
        var offset = 5
        func connectionID() -> UnsafeRawBufferPointer? {
            guard offset < reply.count else { return nil }
            let length = Int(reply[offset])
            guard reply.count - offset - 1 >= length else { return nil }
            defer { offset += 1 + length }
            return UnsafeRawBufferPointer(rebasing: reply[(offset + 1)..<(offset + 1 + length)])
        }
        guard let destination = connectionID(), destination.elementsEqual(sourceConnectionID),
              let source = connectionID(), source.elementsEqual(destinationConnectionID) else { return false }
        let versions = reply.count - offset
        return versions > 0 && versions % 4 == 0
    }

    /// ``isAnswered(by:)`` for an array.
    public func isAnswered(by reply: [UInt8]) -> Bool {
        reply.withUnsafeBytes { isAnswered(by: $0) }
    }
}
