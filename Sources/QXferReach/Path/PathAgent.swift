import FoundationEssentials
import LinuxSystem
import NIOCore
import NIOPosix
import Synchronization

/// The path between two peers, as their connections see it (docs/PROTOCOL.md §9.5).
public struct PathReport: Sendable, Equatable, CustomStringConvertible {
    /// Where datagrams for the peer go now.
    public enum Route: Sendable, Equatable, CustomStringConvertible {
        /// Through the relay.
        case relayed
        /// Straight to the peer at this address ("A:P"), a hole punched through the NATs.
        case direct(peer: String)

        /// "relayed" or "direct to A:P".
        public var description: String {
            switch self {
            case .relayed: "relayed"
            case .direct(let peer): "direct to \(peer)"
            }
        }
    }

    /// The route now.
    public var route: Route
    /// Datagram payload bytes (QUIC's datagrams) that went over the direct path, both directions.
    public var directBytes: UInt64
    /// Datagram payload bytes that went through the relay's UDP port, both directions.
    public var relayedBytes: UInt64
    /// Bytes of TCP connections carried by relay splices, both directions.
    public var spliceBytes: UInt64

    public init(route: Route = .relayed, directBytes: UInt64 = 0, relayedBytes: UInt64 = 0, spliceBytes: UInt64 = 0) {
        self.route = route
        self.directBytes = directBytes
        self.relayedBytes = relayedBytes
        self.spliceBytes = spliceBytes
    }

    /// The route and the bytes, on one line.
    public var description: String {
        "\(route); \(directBytes) bytes direct, \(relayedBytes) relayed, \(spliceBytes) spliced"
    }
}

/// A local "magic socket" between this host's qxfer stacks and a peer met through a relay by a
/// transfer code (docs/PROTOCOL.md §9): QUIC's datagrams go over a hole-punched direct UDP path
/// whenever one answers, through the relay otherwise, and the route changes under running
/// connections without their noticing; TCP connections go through relay splices. The agent
/// never looks inside what it carries: QUIC and TLS are end to end.
///
/// The offer side (the sender) dials ``localPort(for:)`` on 127.0.0.1 with its ordinary stacks;
/// the answer side (the receiver) has the agent carry each flow and splice to its local
/// listener (``serve(_:onLocalPort:)``), so that each remote QUIC socket looks like one client.
///
/// All of its sockets live on one event loop; its methods may be called from anywhere.
public final class PathAgent: Sendable {
    /// Which seat of the room this agent took.
    public let side: RoomSide
    /// This host's address and port as the relay saw its control connection.
    public let observedAddress: String
    /// The relay it went through.
    public let relay: RelayAddress

    private let eventLoop: any EventLoop
    private let core: NIOLoopBound<AgentCore>
    private let stats: AgentStats

    private init(side: RoomSide, relay: RelayAddress, observed: String, eventLoop: any EventLoop, core: NIOLoopBound<AgentCore>, stats: AgentStats) {
        self.side = side
        self.relay = relay
        self.observedAddress = observed
        self.eventLoop = eventLoop
        self.core = core
        self.stats = stats
    }

    deinit {
        // An agent dropped without ``close()`` still lets its sockets go.
        let core = self.core
        eventLoop.execute { _ = core.value.close() }
    }

    /// Connects to the relay and says hello for `room` as `side`; returns after `welcome` (the
    /// offer side prints its code then).
    /// - Parameters:
    ///   - relay: the relay's address.
    ///   - room: the code's room (32 bytes, docs/PROTOCOL.md §9.1).
    ///   - side: `.offer` for the side that made the code, `.answer` for the one that typed it.
    ///   - timeout: how long the relay may take to answer.
    /// - Throws: ``ReachError``: `.relayUnreachable`, `.timedOut`, `.roomTaken`, `.noSuchCode`,
    ///   `.codeUsed`, `.refusedByRelay`, `.protocolViolation`, `.local`.
    public static func connect(relay: RelayAddress, room: [UInt8], side: RoomSide, timeout: Duration = .seconds(10)) async throws(ReachError) -> PathAgent {
        try await connect(relay: relay, room: room, side: side, timeout: timeout, options: PathOptions())
    }

    /// ``connect(relay:room:side:timeout:)`` with options tests use (punching held back, timing).
    static func connect(relay: RelayAddress, room: [UInt8], side: RoomSide, timeout: Duration = .seconds(10), options: PathOptions) async throws(ReachError) -> PathAgent {
        let eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        let stats = AgentStats()
        let started = eventLoop.flatSubmit { () -> EventLoopFuture<Started> in
            let promise = eventLoop.makePromise(of: Started.self)
            RelayClient.connect(to: relay, room: room, side: side, on: eventLoop, timeout: timeout).assumeIsolated().whenComplete { result in
                switch result {
                case .failure(let error):
                    promise.fail(error)
                case .success(let client):
                    let core: AgentCore
                    do { core = try AgentCore(client: client, side: side, options: options, stats: stats) } catch {
                        client.close()
                        return promise.fail(error)
                    }
                    core.start().assumeIsolated().whenComplete { result in
                        switch result {
                        case .success:
                            promise.succeed(Started(core: NIOLoopBound(core, eventLoop: eventLoop), observed: RelayClient.printable(client.welcome?.observed ?? "")))
                        case .failure(let error):
                            _ = core.close()
                            promise.fail(error)
                        }
                    }
                }
            }
            return promise.futureResult
        }
        let result = try await reach(started)
        return PathAgent(side: side, relay: relay, observed: result.observed, eventLoop: eventLoop, core: result.core, stats: stats)
    }

    private struct Started: Sendable {
        var core: NIOLoopBound<AgentCore>
        var observed: String
    }

    /// Waits for the peer (`paired`), for the relay's answer to this side's UDP binds (UDP
    /// blocked after 5 s is not an error: datagrams cannot go, splices can), exchanges the
    /// candidates signals and starts punching. Returns when both sides' candidates are known.
    /// - Throws: ``ReachError``: `.timedOut` when the peer did not come or answer within
    ///   `timeout`, `.peerGone`, `.relayUnreachable`, `.protocolViolation`.
    public func meetPeer(timeout: Duration) async throws(ReachError) {
        let core = self.core
        try await Self.reach(eventLoop.flatSubmit { core.value.meet(timeout: timeout) })
    }

    /// docs/PROTOCOL.md §9.6's C: SHA-256(len ‖ offer's candidates signal ‖ len ‖ answer's), the
    /// signals' bytes as sent, the lengths 8-byte little-endian. Empty before ``meetPeer(timeout:)``
    /// returned.
    public var candidatesTranscript: [UInt8] { stats.transcript }

    /// Offer side: the port on 127.0.0.1, for UDP and TCP alike, that this side's stacks dial
    /// to reach `service` on the peer. Opened on first use.
    /// - Throws: ``ReachError`` `.local` when no such pair of sockets can be opened, or on the
    ///   answer side.
    public func localPort(for service: PeerService) async throws(ReachError) -> UInt16 {
        let core = self.core
        return try await Self.reach(eventLoop.flatSubmit { core.value.localPort(for: service) })
    }

    /// Answer side: carries the peer's flows and splices of `service` to 127.0.0.1:`port`
    /// (UDP and TCP), each flow from a UDP socket of its own.
    public func serve(_ service: PeerService, onLocalPort port: UInt16) {
        let core = self.core
        eventLoop.execute { core.value.serve(service, onLocalPort: port) }
    }

    /// The route now and what went each way.
    public var report: PathReport { stats.report }

    /// Closes every socket: the control connection, the UDP sockets, the local ports, the splices.
    public func close() async {
        let core = self.core
        try? await eventLoop.flatSubmit { core.value.close() }.get()
    }

    /// Tests: lets a side created with punching held back start punching now.
    func allowPunching() {
        let core = self.core
        eventLoop.execute { core.value.allowPunching() }
    }

    /// Tests: stops punching and answering punches, as if the direct path had died.
    func stopPunching() {
        let core = self.core
        eventLoop.execute { core.value.stopPunching() }
    }

    /// Tests: the port of the agent's UDP socket toward the relay and the peer.
    func widePort() async -> Int {
        let core = self.core
        return (try? await eventLoop.submit { core.value.widePortNumber }.get()) ?? 0
    }

    /// Tests: waits until the route is `route`'s kind, or `timeout` passes; returns the report.
    func waitForRoute(direct: Bool, timeout: Duration) async -> PathReport {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let report = self.report
            if case .direct = report.route, direct { return report }
            if report.route == .relayed, !direct { return report }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return report
    }

    private static func reach<T: Sendable>(_ future: EventLoopFuture<T>) async throws(ReachError) -> T {
        do { return try await future.get() } catch let error as ReachError { throw error } catch {
            throw ReachError(.local, RelayClient.describe(error))
        }
    }
}

/// What tests change in an agent.
struct PathOptions: Sendable {
    /// Whether the agent punches (and answers punches): held or never forces the relay.
    var punching: PunchingPolicy = .allowed
    var timing = PathTiming()
    /// Answer side: the most flows at once (each a socket with 256 KiB to read into), and how
    /// long a quiet one lives.
    var flowCapacity = 64
    var flowIdleTimeout: Duration = .seconds(60)
}

/// The counters and the route, read from any thread: atomics the event loop adds to, a lock
/// only for what changes rarely.
final class AgentStats: Sendable {
    let direct = Atomic<UInt64>(0)
    let relayed = Atomic<UInt64>(0)
    let spliced = Atomic<UInt64>(0)
    private let state = Locked<(route: PathReport.Route, transcript: [UInt8])>((.relayed, []))

    var report: PathReport {
        PathReport(
            route: state.withLock { $0.route }, directBytes: direct.load(ordering: .relaxed),
            relayedBytes: relayed.load(ordering: .relaxed), spliceBytes: spliced.load(ordering: .relaxed))
    }

    var transcript: [UInt8] { state.withLock { $0.transcript } }

    func count(_ bytes: UInt64, direct isDirect: Bool) {
        if isDirect { direct.add(bytes, ordering: .relaxed) } else { relayed.add(bytes, ordering: .relaxed) }
    }

    func set(route: PathReport.Route) { state.withLock { $0.route = route } }
    func set(transcript: [UInt8]) { state.withLock { $0.transcript = transcript } }
}
