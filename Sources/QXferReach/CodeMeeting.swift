import FoundationEssentials
import QXfer
import QXferPairing
import Synchronization

/// Where two peers meet: a relay on a public host, or — with none named — a relay the offer
/// side runs itself and advertises on the local network (docs/PROTOCOL.md §9.7).
public enum MeetingPlace: Sendable, Equatable, CustomStringConvertible {
    case relay(RelayAddress)
    case localNetwork

    /// The service type of a code's room advertised on the local network.
    public static let serviceType = "_qxfer-code._udp"
    /// How long the answer side looks for the room on the local network.
    public static let browseTime: Duration = .seconds(5)

    public var description: String {
        switch self {
        case .relay(let address): "the relay \(address)"
        case .localNetwork: "the local network"
        }
    }
}

/// Two peers that met by a transfer code, with the paths between them open (docs/PROTOCOL.md
/// §9): the offer side (the sender) first authenticates the peer over the pairing service,
/// then connects to the transfer service; the answer side serves both on local listeners.
///
/// ```swift
/// // The sender
/// try await CodeMeeting.offering(at: .relay(relay), announce: { print("code: \($0)") }) { meeting in
///     let receiver = try await meeting.authenticatePeer(over: QUIC().identity(identity), identity: identity, name: "laptop")
///     let connection = NetworkConnection(to: try await meeting.endpoint(for: .transfer), using: .parameters {
///         TLV { QUIC().identity(identity).peerTrust(.pinned(receiver.fingerprint)) }
///     })
///     …
/// }
/// ```
public final class CodeMeeting: Sendable {
    /// The code both sides hold.
    public let code: TransferCode
    /// Which side this is.
    public let side: RoomSide
    /// Where the peers met.
    public let place: MeetingPlace
    private let agent: PathAgent

    private init(code: TransferCode, side: RoomSide, place: MeetingPlace, agent: PathAgent) {
        self.code = code
        self.side = side
        self.place = place
        self.agent = agent
    }

    /// How many nameplates a sender draws before giving up on a crowded relay.
    static let draws = 6

    /// The offer side: draws a code, takes its room (drawing again while rooms are taken),
    /// calls `announce` with the code to show, waits up to `timeout` for the peer, and runs
    /// `body` with the meeting. Every socket is closed when `body` returns or throws.
    public static func offering<Result: Sendable>(
        at place: MeetingPlace, code fixed: TransferCode? = nil, timeout: Duration = .seconds(600),
        announce: (TransferCode) async throws -> Void,
        _ body: (CodeMeeting) async throws -> Result
    ) async throws -> Result {
        switch place {
        case .relay(let relay):
            return try await offering(via: relay, place: place, code: fixed, timeout: timeout, announce: announce, body)
        case .localNetwork:
            let server = RelayServer(host: nil, port: 0, limits: .local)  // a LAN: no byte allowance
            let (ports, started) = AsyncStream.makeStream(of: UInt16.self)
            return try await withThrowingTaskGroup(of: Result?.self) { group in
                group.addTask {
                    // A relay that cannot start ends the stream, so the wait below ends too.
                    defer { started.finish() }
                    try await server.run { port in started.yield(port) }
                    return nil
                }
                defer { group.cancelAll() }
                guard let port = await ports.first(where: { _ in true }) else {
                    while try await group.next() != nil {}  // the relay's own error, where it threw one
                    throw ReachError(.local, "the local relay did not start")
                }
                let local = RelayAddress(parsing: "127.0.0.1:\(port)")!
                return try await offering(via: local, place: place, code: fixed, timeout: timeout, announce: { code in
                    // Advertised once the room is taken: a receiver that finds it can join at once.
                    let service = DNSSDService(
                        name: "qxfer-" + String(code.roomHex.prefix(16)), type: MeetingPlace.serviceType, port: port,
                        txt: TXTRecord([.init(key: "txtvers", value: "1"), .init(key: "room", value: code.roomHex)]))
                    group.addTask {
                        try await NetworkAdvertiser(service).run()
                        return nil
                    }
                    try await announce(code)
                }, body)
            }
        }
    }

    private static func offering<Result: Sendable>(
        via relay: RelayAddress, place: MeetingPlace, code fixed: TransferCode?, timeout: Duration,
        announce: (TransferCode) async throws -> Void,
        _ body: (CodeMeeting) async throws -> Result
    ) async throws -> Result {
        var draw = 0
        while true {
            // Short nameplates first; a crowded relay gets longer ones.
            let code = fixed ?? TransferCode.random(nameplateLimit: draw < 3 ? 100 : draw < 5 ? 1000 : 10000)
            guard let agent = try await takeRoom(of: code, at: relay, mayDrawAgain: fixed == nil && draw + 1 < draws) else {
                draw += 1
                continue
            }
            let meeting = CodeMeeting(code: code, side: .offer, place: place, agent: agent)
            return try await meeting.closing {
                try await announce(code)
                try await agent.meetPeer(timeout: timeout)
                return try await body(meeting)
            }
        }
    }

    /// The offer side's seat in `code`'s room; nil when another sender holds the room and
    /// another code may be drawn.
    private static func takeRoom(of code: TransferCode, at relay: RelayAddress, mayDrawAgain: Bool) async throws(ReachError) -> PathAgent? {
        do {
            return try await PathAgent.connect(relay: relay, room: code.room, side: .offer)
        } catch {
            if error.kind == .roomTaken && mayDrawAgain { return nil }
            throw error
        }
    }

    /// The answer side: finds the room of `code` (at the relay, or on the local network),
    /// meets the peer, and runs `body` with the meeting.
    public static func answering<Result: Sendable>(
        _ code: TransferCode, at place: MeetingPlace, timeout: Duration = .seconds(30),
        _ body: (CodeMeeting) async throws -> Result
    ) async throws -> Result {
        let relay: RelayAddress
        switch place {
        case .relay(let address):
            relay = address
        case .localNetwork:
            relay = try await findOnLocalNetwork(code)
        }
        let agent = try await PathAgent.connect(relay: relay, room: code.room, side: .answer)
        let meeting = CodeMeeting(code: code, side: .answer, place: place, agent: agent)
        return try await meeting.closing {
            try await agent.meetPeer(timeout: timeout)
            return try await body(meeting)
        }
    }

    /// The relay a sender on this network advertises for `code`'s room.
    static func findOnLocalNetwork(_ code: TransferCode) async throws(ReachError) -> RelayAddress {
        let room = code.roomHex
        do {
            let endpoint = try await NetworkBrowser(for: .dnssd(type: MeetingPlace.serviceType))
                .resolve(named: "qxfer-" + String(room.prefix(16)), timeout: MeetingPlace.browseTime)
            guard endpoint.service?.txt["room"] == room else {
                throw ReachError(.noSuchCode, "a sender on this network answered for another code")
            }
            let host = endpoint.host.contains(":") ? "[\(endpoint.host)]" : endpoint.host
            guard let address = RelayAddress(parsing: "\(host):\(endpoint.port)") else {
                throw ReachError(.protocolViolation, "a sender on this network advertised an unusable address")
            }
            return address
        } catch let error as ReachError {
            throw error
        } catch {
            throw ReachError(
                .noSuchCode,
                "no sender with this code answered on the local network within \(MeetingPlace.browseTime.components.seconds) s; "
                    + "across the internet, both sides name a relay (--relay HOST or QXFER_RELAY)")
        }
    }

    private func closing<Result: Sendable>(_ body: () async throws -> Result) async throws -> Result {
        do {
            let result = try await body()
            await lingerThenClose()
            return result
        } catch {
            await lingerThenClose()
            throw error
        }
    }

    /// How long the agent outlives the meeting's last connection: a connection's close has
    /// left its QUIC socket when the program is told so, not yet the agent toward the peer, and
    /// a peer that never hears it waits for its idle timeout (a receiver exited 15 s late).
    static let linger: Duration = .milliseconds(200)

    private func lingerThenClose() async {
        try? await Task.sleep(for: Self.linger)
        await agent.close()
    }

    // MARK: Authentication (docs/PROTOCOL.md §9.6)

    /// The offer side: runs the pairing exchange with the code's password over the pairing
    /// service, on `transport` (any stack, or a race; QUIC ``QUIC/tunnelledThroughLoopback()``,
    /// as every connection to a meeting's endpoint). Returns the peer, authenticated: its
    /// fingerprint is the one to pin. Stored in `store` only when one is given.
    public func authenticatePeer<Transport: SecureTransport>(
        over transport: Transport, identity: HostIdentity, name: String, store: PairedDevices? = nil
    ) async throws -> PairedDevices.Device {
        let endpoint = try await endpoint(for: .pairing)
        let connection = NetworkConnection(to: endpoint, using: .parameters {
            Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) { transport.identity(identity).peerTrust(.anyCertificate) }
        })
        // Closed with its last message delivered (a refusal above all: the peer says "wrong
        // code" only if it hears one), within a second.
        do {
            let peer = try await Pairing.initiate(
                over: connection, password: code.password, context: agent.candidatesTranscript, name: name, address: nil,
                identity: identity, store: store)
            await connection.close(within: .seconds(1))
            return peer
        } catch {
            await connection.close(within: .seconds(1))
            if let error = error as? PairingError, error.kind == .wrongCode { throw wrongCode }
            throw error
        }
    }

    /// The answer side: serves the pairing service on both stacks until the first attempt ends,
    /// within `timeout`. Returns the peer, authenticated.
    public func awaitPeer(identity: HostIdentity, name: String, store: PairedDevices? = nil, timeout: Duration = .seconds(30)) async throws -> PairedDevices.Device {
        let password = code.password
        let context = agent.candidatesTranscript
        let (outcomes, report) = AsyncStream.makeStream(of: Result<PairedDevices.Device, any Error>.self)
        let attempt = Attempted()
        @Sendable func handle<Stack: CoderStack>(_ connection: NetworkConnection<Stack>) async throws where Stack.Message == PairingMessage {
            let hello = try await Pairing.firstMessage(of: connection)
            guard attempt.take() else {
                try? await connection.send(.refused(reason: "this code was already used"))
                return
            }
            do {
                report.yield(.success(try await Pairing.respond(
                    to: hello, over: connection, password: password, context: context, name: name, identity: identity, store: store)))
            } catch {
                report.yield(.failure(error))
            }
        }
        let tls = NetworkListener(on: 0, host: "127.0.0.1", using: .parameters {
            Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) {
                TLS().identity(identity).clientAuthentication(.optional)
            }
        })
        return try await withThrowingTaskGroup(of: PairedDevices.Device?.self) { group in
            defer { group.cancelAll() }
            group.addTask {
                try await tls.run { try await handle($0) }
                return nil
            }
            let port = try await tls.port
            let quic = NetworkListener(on: port, host: "127.0.0.1", using: .parameters {
                Coder(PairingMessage.self, using: .json, maximumMessageSize: Pairing.maximumMessageSize) {
                    QUIC().tunnelledThroughLoopback().identity(identity).clientAuthentication(.optional)
                }
            })
            group.addTask {
                try await quic.run { try await handle($0) }
                return nil
            }
            _ = try await quic.port
            agent.serve(.pairing, onLocalPort: port)
            group.addTask {
                try await Task.sleep(for: timeout)
                throw ReachError(.timedOut, "the sender did not authenticate within \(timeout.components.seconds) s")
            }
            group.addTask {
                for await outcome in outcomes { return try outcome.get() }
                return nil
            }
            do {
                while let outcome = try await group.next() {
                    if let device = outcome { return device }
                }
            } catch let error as PairingError where error.kind == .wrongCode {
                throw wrongCode
            }
            throw ReachError(.peerGone, "the pairing listeners stopped")
        }
    }

    /// What either side says when the code did not authenticate the peer.
    var wrongCode: ReachError {
        ReachError(
            .wrongCode,
            "the code did not match (mistyped, or someone tried to intercept it); nothing was \(side == .offer ? "sent" : "received"), and the code is spent")
    }

    // MARK: Paths

    /// The offer side: where its stacks connect to reach `service` on the peer.
    public func endpoint(for service: PeerService) async throws -> Endpoint {
        .hostPort(host: "127.0.0.1", port: try await agent.localPort(for: service))
    }

    /// The answer side: carries the peer's connections to `service` to a listener on
    /// 127.0.0.1:`port` (UDP and TCP).
    public func serve(_ service: PeerService, onLocalPort port: UInt16) {
        agent.serve(service, onLocalPort: port)
    }

    /// The path now, and the bytes that went each way.
    public var path: PathReport { agent.report }
}

/// The one pairing attempt an answer side allows.
private final class Attempted: Sendable {
    private let taken = Mutex(false)
    /// True for the first caller only.
    func take() -> Bool { taken.withLock { taken in defer { taken = true }; return !taken } }
}
