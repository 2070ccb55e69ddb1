import NIOCore

/// A network interface multicast DNS runs on, with the addresses published for it.
struct MDNSInterface: Hashable, Sendable {
    /// The kernel's interface index.
    var index: Int
    /// The interface name ("eth0"), used as the scope of link-local addresses.
    var name: String
    /// IPv4 addresses, 4 bytes each.
    var ipv4: [[UInt8]]
    /// IPv6 addresses, 16 bytes each.
    var ipv6: [[UInt8]]
}

/// Where a received packet came from.
struct MDNSSource: Hashable, Sendable {
    var interfaceIndex: Int
    /// 4 or 16 bytes.
    var address: [UInt8]
    var port: UInt16
}

/// A message the I/O layer should send.
struct MDNSOutgoing: Hashable, Sendable {
    enum Destination: Hashable, Sendable {
        /// 224.0.0.251 and ff02::fb, port 5353, on the interface.
        case multicast
        /// One peer (legacy unicast queries, "QU" questions).
        case unicast(address: [UInt8], port: UInt16)
    }
    var interfaceIndex: Int
    var destination: Destination
    var message: DNSMessage
}

/// What the I/O driver needs from a multicast DNS state machine: packets and "now" in;
/// messages to send and the next time to be woken out. No sockets, no clock.
protocol MDNSStateMachine: Sendable {
    mutating func start(now: NIODeadline)
    mutating func receive(_ message: DNSMessage, from source: MDNSSource, now: NIODeadline)
    mutating func tick(now: NIODeadline)
    /// Called once when the machine's owner stops it: anything last to say (goodbyes).
    mutating func stop(now: NIODeadline)
    /// The messages produced since the last call, in order.
    mutating func takeOutgoing() -> [MDNSOutgoing]
    /// When ``tick(now:)`` next has something to do; nil when only a packet can wake it.
    var nextDeadline: NIODeadline? { get }
}

/// RFC 6762 section 5.1 and 10: the port, groups and TTLs.
enum MDNS {
    static let port: UInt16 = 5353
    static let ipv4Group: [UInt8] = [224, 0, 0, 251]
    static let ipv6Group: [UInt8] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xfb]
    /// Records naming a host (SRV, A, AAAA): two minutes.
    static let hostRecordTTL: UInt32 = 120
    /// Other records (PTR, TXT): 75 minutes.
    static let otherRecordTTL: UInt32 = 4500
    /// Legacy unicast replies carry TTLs of at most 10 s (RFC 6762 section 6.7).
    static let legacyTTL: UInt32 = 10
    /// The name DNS-SD service types are enumerated under (RFC 6763 section 9).
    static func enumerationName(domain: DNSName) -> DNSName {
        DNSName(labels: [Array("_services".utf8), Array("_dns-sd".utf8), Array("_udp".utf8)] + domain.labels)
    }
}

/// A small seeded generator: deterministic in tests, seeded from the system otherwise.
struct MDNSRandom: RandomNumberGenerator, Sendable {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    init() {
        var system = SystemRandomNumberGenerator()
        state = system.next()
    }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A random duration in `range` milliseconds.
    mutating func milliseconds(_ range: ClosedRange<Int64>) -> TimeAmount {
        .milliseconds(Int64.random(in: range, using: &self))
    }
}

extension DNSRecord {
    /// The key of a record's identity on the wire, for rate limits and duplicate checks.
    var identity: RecordIdentity { RecordIdentity(name: name, type: type, data: data) }
}

/// A record without its TTL and cache-flush bit.
struct RecordIdentity: Hashable, Sendable {
    var name: DNSName
    var type: DNSRecordType
    var data: DNSRecordData
}
