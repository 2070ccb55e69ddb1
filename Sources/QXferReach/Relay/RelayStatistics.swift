/// What a relay has done since it started, and what it holds now.
public struct RelayStatistics: Sendable, Equatable {
    /// Rooms open now: waiting for their answer side, or paired.
    public var roomsOpen = 0
    /// Of ``roomsOpen``, those paired.
    public var roomsPaired = 0
    /// Rooms whose two sides met since the relay started.
    public var pairsServed = 0
    /// TCP connections open now (control connections, splices, connections yet to say which).
    public var connectionsOpen = 0
    /// Splices whose two connections met since the relay started.
    public var splicesServed = 0
    /// Bytes of datagrams forwarded between seats (type byte included).
    public var bytesRelayedOverUDP = 0
    /// Bytes copied between spliced connections, both ways.
    public var bytesRelayedOverTCP = 0
    /// Datagrams forwarded between seats.
    public var datagramsRelayed = 0
    /// Datagrams not forwarded: no bound seat, no bound peer, the sender's allowance spent,
    /// the socket's send queue full, or not a relay datagram at all.
    public var datagramsDropped = 0
    /// Connections refused, with a `refused` message or without (too many from one address).
    public var refusals = 0

    /// Bytes relayed either way.
    public var bytesRelayed: Int { bytesRelayedOverUDP &+ bytesRelayedOverTCP }

    public init() {}
}

/// The sentences a relay refuses with (`refused`'s `reason`, docs/PROTOCOL.md §9.2). Each
/// names its case in its first words, so a client can tell them apart by ``kind(of:)``.
public enum RelayRefusal {
    /// An `offer` hello for a room that exists.
    public static let roomTaken = "room taken: another sender holds this code's number; draw another code"
    /// An `answer` hello for a room with no offer side.
    public static let noSuchCode = "no sender is waiting with this code"
    /// An `answer` hello for a room already paired.
    public static let codeUsed = "this code was already used"
    /// A room whose answer side did not come in time.
    public static func expired(after wait: Duration) -> String {
        "nobody came with this code within \(wait.components.seconds) s"
    }
    /// A client address holding its most rooms.
    public static func tooManyRooms(_ limit: Int) -> String { "too many rooms open from this address (at most \(limit))" }
    /// The relay holding its most rooms.
    public static let full = "the relay is full: try again later"
    /// Too many connections from one address, or on the whole relay.
    public static let tooManyConnections = "too many connections to the relay from this address"
    /// A hello of another protocol version.
    public static func version(_ version: Int) -> String {
        "this relay speaks relay protocol version \(RelayMessage.version), not \(version)"
    }
    /// Nothing arrived in time on a new connection.
    public static func silent(_ wait: Duration) -> String { "no hello or splice within \(wait.components.seconds) s" }
    /// A message that breaks docs/PROTOCOL.md §9.2-9.4.
    public static func violation(_ what: String) -> String { "protocol violation: \(what)" }
    /// A splice naming a token no seat holds.
    public static let noSuchSeat = "no seat holds this bind token"
    /// A splice in a room whose answer side has not come.
    public static let notPaired = "the room is not paired yet"
    /// A splice whose id is already waiting on this side, or running.
    public static func spliceInUse(_ id: Int) -> String { "splice \(id) is already open" }
    /// A room holding its most splices.
    public static func tooManySplices(_ limit: Int) -> String { "too many splices in this room (at most \(limit))" }
    /// A splice whose peer did not open the same id in time.
    public static func spliceUnmatched(_ id: Int, _ wait: Duration) -> String {
        "the peer did not open splice \(id) within \(wait.components.seconds) s"
    }
    /// A side that sent more signals than a room carries.
    public static func tooManySignals(_ limit: Int) -> String { "too many signals (at most \(limit) per side)" }

    /// Which refusal a reason is, for a client to word its error: nil for one this
    /// version does not know (a newer relay's).
    public static func kind(of reason: String) -> ReachError.Kind? {
        if reason.hasPrefix("room taken") { return .roomTaken }
        if reason == noSuchCode { return .noSuchCode }
        if reason == codeUsed { return .codeUsed }
        if reason.hasPrefix("nobody came") { return .timedOut }
        if reason.hasPrefix("protocol violation") { return .protocolViolation }
        return nil
    }
}
