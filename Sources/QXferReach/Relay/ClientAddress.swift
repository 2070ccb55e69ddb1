/// A client's IP address and port as the relay sees it: compact and hashable without an
/// allocation, since every datagram the relay reads is looked up by one. An IPv4 address mapped
/// into IPv6 (`::ffff:a.b.c.d`, what a dual-stack socket reports for an IPv4 client) is the
/// IPv4 address.
public struct ClientAddress: Hashable, Sendable, CustomStringConvertible {
    /// The 16 bytes of the IPv6 form (IPv4 as `::ffff:a.b.c.d`), as two big-endian halves.
    let high: UInt64
    let low: UInt64
    /// The port.
    public let port: UInt16

    /// An address from its 4 (IPv4) or 16 (IPv6) bytes in network order; nil for another length.
    public init?(bytes: some Collection<UInt8>, port: UInt16) {
        let bytes = Array(bytes)
        switch bytes.count {
        case 4:
            self.init(ipv4: bytes.reduce(0) { $0 << 8 | UInt32($1) }, port: port)
        case 16:
            self.init(
                ipv6High: bytes[0..<8].reduce(0) { $0 << 8 | UInt64($1) },
                low: bytes[8..<16].reduce(0) { $0 << 8 | UInt64($1) },
                port: port)
        default:
            return nil
        }
    }

    /// An IPv4 address, `address` in host order (192.0.2.1 is 0xC000_0201).
    public init(ipv4 address: UInt32, port: UInt16) {
        high = 0
        low = Self.mappedPrefix | UInt64(address)
        self.port = port
    }

    /// An IPv6 address given as its two big-endian halves.
    public init(ipv6High high: UInt64, low: UInt64, port: UInt16) {
        self.high = high
        self.low = low
        self.port = port
    }

    /// `::ffff:0:0/96`, where IPv4 addresses live in IPv6's space.
    private static let mappedPrefix: UInt64 = 0x0000_FFFF_0000_0000

    /// Whether it is an IPv4 address (or one mapped into IPv6).
    public var isIPv4: Bool { high == 0 && low & 0xFFFF_FFFF_0000_0000 == Self.mappedPrefix }

    /// The IPv4 address in host order, if it is one.
    public var ipv4: UInt32? { isIPv4 ? UInt32(truncatingIfNeeded: low) : nil }

    /// 4 bytes for IPv4, 16 for IPv6, network order.
    public var bytes: [UInt8] {
        if let ipv4 { return withUnsafeBytes(of: ipv4.bigEndian) { Array($0) } }
        return withUnsafeBytes(of: high.bigEndian) { Array($0) } + withUnsafeBytes(of: low.bigEndian) { Array($0) }
    }

    /// The address as `bound` reports it.
    public var datagramAddress: DatagramAddress {
        // 4 or 16 bytes: the initializer cannot fail.
        DatagramAddress(address: bytes, port: port)!
    }

    /// "192.0.2.1:7450" or "[2001:db8:0:0:0:0:0:1]:7450" (`welcome`'s `observed`).
    public var description: String { datagramAddress.description }

    /// Whose limits this address counts against: an IPv4 address, or an IPv6 address's /64,
    /// since one IPv6 host commonly holds a whole /64 and could spread a flood over it.
    var client: ClientKey {
        isIPv4 ? ClientKey(high: high, low: low) : ClientKey(high: high, low: 0)
    }
}

/// A client as the relay's limits count it (``ClientAddress/client``).
struct ClientKey: Hashable, Sendable {
    let high: UInt64
    let low: UInt64
}
