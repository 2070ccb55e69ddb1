/// What a relay allows each client and all of them together (docs/RELAY.md, "Limits"): every
/// table the relay keeps has a bound here, so a flood costs it a bounded amount of memory.
public struct RelayLimits: Sendable, Equatable {
    /// How long a room waits for its answer side (sent as `welcome`'s `expiresIn`).
    public var roomWait: Duration = .seconds(600)
    /// How long a paired room whose control connections both closed lives without relayed traffic.
    public var pairedIdle: Duration = .seconds(60)
    /// How long a new TCP connection has to send its first message (`hello` or `splice`).
    public var firstMessageWithin: Duration = .seconds(10)
    /// How long a splice waits for the peer seat's splice with the same id.
    public var spliceWait: Duration = .seconds(10)
    /// Rooms a client address may hold open at once (IPv4: the address; IPv6: its /64).
    public var maximumRoomsPerAddress = 8
    /// Rooms open at once on the whole relay.
    public var maximumRooms = 10_000
    /// Signals each side of a room may send.
    public var maximumSignalsPerSide = 64
    /// Splices a room may have waiting or running at once.
    public var maximumSplicesPerRoom = 16
    /// Connections a client address may hold that have not yet sent their first message.
    public var maximumPendingConnectionsPerAddress = 32
    /// Connections on the whole relay that have not yet sent their first message.
    public var maximumPendingConnections = 4096
    /// TCP connections a client address may hold open at once (control, splices, pending).
    public var maximumConnectionsPerAddress = 256
    /// TCP connections open at once on the whole relay (each is a file descriptor).
    public var maximumConnections = 32_768
    /// The bytes each client address may have relayed; nil relays without counting.
    public var allowance: RelayAllowance? = .default

    /// The limits above with their documented defaults.
    public static let `default` = RelayLimits()

    /// For a relay run beside one transfer on a local network (docs/PROTOCOL.md §9.7): the same
    /// bounds, but bytes are not metered, since the only clients are the two peers.
    public static var local: RelayLimits {
        var limits = RelayLimits()
        limits.allowance = nil
        return limits
    }

    public init() {}

    /// The limits with every count at least 1 and every figure inside what the relay's
    /// arithmetic takes, so a configuration cannot make it trap or refuse everything.
    public var sanitized: RelayLimits {
        var limits = self
        func clamp(_ value: Duration) -> Duration { min(max(value, .milliseconds(1)), .seconds(86_400 * 365)) }
        limits.roomWait = clamp(roomWait)
        limits.pairedIdle = clamp(pairedIdle)
        limits.firstMessageWithin = clamp(firstMessageWithin)
        limits.spliceWait = clamp(spliceWait)
        func count(_ value: Int) -> Int { min(max(value, 1), 1 << 30) }
        limits.maximumRoomsPerAddress = count(maximumRoomsPerAddress)
        limits.maximumRooms = count(maximumRooms)
        limits.maximumSignalsPerSide = count(maximumSignalsPerSide)
        limits.maximumSplicesPerRoom = min(count(maximumSplicesPerRoom), 0x10000)
        limits.maximumPendingConnectionsPerAddress = count(maximumPendingConnectionsPerAddress)
        limits.maximumPendingConnections = count(maximumPendingConnections)
        limits.maximumConnectionsPerAddress = count(maximumConnectionsPerAddress)
        limits.maximumConnections = count(maximumConnections)
        limits.allowance = allowance?.sanitized
        return limits
    }
}

/// A client address's byte allowance: a bucket of `burst` bytes refilled at `bytesPerSecond`.
/// Relayed bytes (datagrams and splices alike) are charged to the address they came from; a
/// datagram that finds the bucket empty is dropped, a splice that empties it stops being read
/// until the bucket has refilled enough.
public struct RelayAllowance: Sendable, Equatable {
    /// What an address may send at once, at any speed: 1 GiB, so a 256 MiB transfer and its
    /// overhead pass at full speed however fast the path (with room for three more).
    public var burst: Int
    /// The sustained rate once the burst is spent: 64 MiB/s (about 537 Mbit/s) per address.
    public var bytesPerSecond: Int

    /// 1 GiB at once, then 64 MiB/s.
    public static let `default` = RelayAllowance(burst: 1 << 30, bytesPerSecond: 64 << 20)

    public init(burst: Int, bytesPerSecond: Int) {
        self.burst = burst
        self.bytesPerSecond = bytesPerSecond
    }

    var sanitized: RelayAllowance {
        // 2^50 bytes (a pebibyte) is "unlimited" for any run and keeps the refill arithmetic
        // far from overflow.
        RelayAllowance(burst: min(max(burst, 65_536), 1 << 50), bytesPerSecond: min(max(bytesPerSecond, 1024), 1 << 50))
    }
}
