import LinuxSystem
import QUICEngine
import Testing

/// Session tickets, resumption and 0-RTT between two engines on the simulated link.
@Suite struct ResumptionTests {
    /// Collects the tickets a client receives.
    final class TicketBox: Sendable {
        let tickets = Locked<[QUICSessionTicket]>([])
        var latest: QUICSessionTicket? { tickets.withLock { $0.last } }
    }

    static let request = Array("offer: one small file, please".utf8)

    static func client(ticket: QUICSessionTicket?, box: TicketBox) -> QUICConfiguration {
        var configuration = QUICConfiguration.test(.client, expectPeer: .server)
        configuration.resumption = ticket
        configuration.sessionTicketReceiver = { ticket in box.tickets.withLock { $0.append(ticket) } }
        return configuration
    }

    static func server(_ issuer: QUICSessionTicketIssuer, allowClient: Bool = true) -> QUICConfiguration {
        let client = TestIdentity.client.leafDER
        var configuration = QUICConfiguration(
            certificateChainPEM: TestIdentity.server.certificatePEM, privateKeyPEM: TestIdentity.server.privateKeyPEM,
            verifyPeer: { allowClient && $0 == client })
        configuration.initialRTT = .milliseconds(50)
        configuration.clientAuthentication = .required
        configuration.sessionTickets = issuer
        return configuration
    }

    /// What one connection showed: the request as the server read it, and in which order the
    /// server saw the request's stream open and the handshake complete.
    struct Outcome {
        var received: [UInt8] = []
        var streamBeforeHandshake = false
        var sim: Simulation
    }

    /// Opens a stream and writes the request at once (before the handshake, as 0-RTT when a
    /// ticket allows), then runs until the server has read it all or a side closed.
    static func connect(_ client: QUICConfiguration, _ server: QUICConfiguration, seed: UInt64) throws -> Outcome {
        let sim = try Simulation(seed: seed, client: client, server: server)
        sim.up.delay = 25 * ms
        sim.down.delay = 25 * ms
        if sim.client.earlyData == .attempted {
            let id = try #require(try sim.client.openStream())
            #expect(try sim.client.write(stream: id, bytes: request, finish: true) == request.count)
        }
        var outcome = Outcome(sim: sim)
        var finished = false
        var opened = false
        sim.onStep = {
            if sim.client.isHandshakeComplete && !opened && sim.client.earlyData == .notAttempted {
                opened = true
                if let id = try? sim.client.openStream() { _ = try? sim.client.write(stream: id, bytes: request, finish: true) }
            }
            guard let server = sim.server, server.isHandshakeComplete,
                  let read = try? server.read(stream: QUICStreamID(rawValue: 0)) else { return }
            outcome.received += read.bytes
            finished = finished || read.isFinished
        }
        sim.run(for: 5_000 * ms) { finished || sim.client.isClosed || (sim.server?.isClosed ?? false) }
        // The server's ticket follows its handshake; give it time to arrive.
        sim.run(for: 200 * ms) { sim.client.isClosed }
        let order = sim.serverEvents.compactMap { event -> Int? in
            switch event {
            case .streamOpened(QUICStreamID(rawValue: 0)): 0
            case .handshakeCompleted: 1
            default: nil
            }
        }
        outcome.streamBeforeHandshake = order.first == 0
        return outcome
    }

    @Test func secondConnectionResumesWithEarlyData() throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = TicketBox()
        let first = try Self.connect(Self.client(ticket: nil, box: box), Self.server(issuer), seed: 71)
        #expect(first.received == Self.request)
        #expect(!first.sim.client.isResumed && first.sim.client.earlyData == .notAttempted)
        let ticket = try #require(box.latest, "the server issued no ticket")

        let second = try Self.connect(Self.client(ticket: ticket, box: box), Self.server(issuer), seed: 72)
        #expect(second.received == Self.request)
        #expect(second.sim.client.isResumed && second.sim.server?.isResumed == true)
        #expect(second.sim.client.earlyData == .accepted && second.sim.server?.earlyData == .accepted)
        #expect(second.streamBeforeHandshake, "the request did not travel as 0-RTT")
        // The resumed client is still known by its certificate, sealed in the ticket.
        #expect(second.sim.server?.peerCertificate == TestIdentity.client.leafDER)
        #expect(second.sim.client.peerCertificate == TestIdentity.server.leafDER)
        // One ticket per connection reaches the application, though GnuTLS servers send two.
        #expect(box.tickets.withLock { $0.count } == 2)
    }

    /// A server that cannot open the ticket (another key: a new receiver, a rotated secret)
    /// makes a full handshake; the request written as 0-RTT arrives once, as 1-RTT.
    @Test func refusedTicketFallsBackToAFullHandshake() throws {
        let box = TicketBox()
        _ = try Self.connect(Self.client(ticket: nil, box: box), Self.server(try QUICSessionTicketIssuer()), seed: 73)
        let ticket = try #require(box.latest)
        let other = try QUICSessionTicketIssuer(secret: Array(repeating: 7, count: 32))
        let second = try Self.connect(Self.client(ticket: ticket, box: box), Self.server(other), seed: 74)
        #expect(second.received == Self.request)
        #expect(second.sim.client.earlyData == .rejected)
        #expect(!second.sim.client.isResumed && second.sim.server?.isResumed == false)
        #expect(second.sim.server?.earlyData == .notAttempted)
        #expect(second.sim.server?.peerCertificate == TestIdentity.client.leafDER)
    }

    /// A ticket does not outlive the allow list: the resumed client's certificate goes through
    /// the server's verifier again, and a refused one gets no connection, early data unread.
    @Test func resumedClientNotAllowedAnyMoreIsRefused() throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = TicketBox()
        _ = try Self.connect(Self.client(ticket: nil, box: box), Self.server(issuer), seed: 75)
        let ticket = try #require(box.latest)
        let second = try Self.connect(Self.client(ticket: ticket, box: box), Self.server(issuer, allowClient: false), seed: 76)
        #expect(second.received.isEmpty)
        #expect(second.sim.server?.isHandshakeComplete == false)
        #expect(second.sim.serverEvents.contains { if case .handshakeCompleted = $0 { true } else { false } } == false)
        #expect(second.sim.closeReason(.client)?.code == 0x100 + 42, "\(String(describing: second.sim.closeReason(.client)))")
    }

    /// The client checks the server's stored certificate again too (a pin changed since).
    @Test func resumedServerNoLongerPinnedIsRefused() throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = TicketBox()
        _ = try Self.connect(Self.client(ticket: nil, box: box), Self.server(issuer), seed: 77)
        let ticket: QUICSessionTicket = try #require(box.latest)
        var client = Self.client(ticket: ticket, box: box)
        client.verifyPeer = { _ in false }
        let second = try Self.connect(client, Self.server(issuer), seed: 78)
        #expect(!second.sim.client.isHandshakeComplete)
        #expect(second.sim.closeReason(.client)?.code == 0x100 + 42)
    }

    /// Stored tickets are hostile input: damaged session data is refused when the connection is
    /// made (the caller connects without it); damaged transport parameters resume without 0-RTT.
    @Test func damagedTicketsAreRefusedOrIgnored() throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = TicketBox()
        _ = try Self.connect(Self.client(ticket: nil, box: box), Self.server(issuer), seed: 79)
        let ticket = try #require(box.latest)
        var rng = TestRNG(seed: 80)
        for length in [0, 1, 17, ticket.tlsSession.count] {
            var damaged = ticket
            damaged.tlsSession = rng.bytes(length)
            let path = QUICPath(local: QUICSocketAddress(ipAddress: "10.0.0.2", port: 1)!, remote: QUICSocketAddress(ipAddress: "10.0.0.1", port: 2)!)
            #expect(throws: QUICEngineError.self) {
                _ = try QUICConnection(clientWith: Self.client(ticket: damaged, box: box), path: path, now: QUICTime(nanoseconds: 1))
            }
        }
        var noParameters = ticket
        noParameters.transportParameters = rng.bytes(40)
        let resumed = try Self.connect(Self.client(ticket: noParameters, box: box), Self.server(issuer), seed: 81)
        #expect(resumed.received == Self.request)
        #expect(resumed.sim.client.isResumed && resumed.sim.client.earlyData == .notAttempted)
    }

    /// Tickets from one issuer open with another derived from the same secret (a restarted
    /// receiver), but its replay memory starts empty, so it refuses their early data
    /// (GnuTLS's anti-replay window starts with the issuer): resumed, the request sent again as 1-RTT.
    @Test func ticketKeysFollowTheirSecret() throws {
        #expect(throws: QUICEngineError.self) { _ = try QUICSessionTicketIssuer(secret: [1, 2, 3]) }
        let secret = Array(repeating: UInt8(9), count: 32)
        let box = TicketBox()
        _ = try Self.connect(Self.client(ticket: nil, box: box), Self.server(try QUICSessionTicketIssuer(secret: secret)), seed: 82)
        let ticket: QUICSessionTicket = try #require(box.latest)
        let second = try Self.connect(Self.client(ticket: ticket, box: box),
                                      Self.server(try QUICSessionTicketIssuer(secret: secret)), seed: 83)
        #expect(second.received == Self.request)
        #expect(second.sim.client.isResumed && second.sim.client.earlyData == .rejected)
    }
}

extension ResumptionTests {
    /// Remembered limits larger than the server now grants: RFC 9000 §7.4.1 makes accepted
    /// early data under them a protocol error, so the connection fails (and qxfer's connector
    /// forgets such a ticket); with early data refused, the same ticket resumes.
    /// Early data beyond the server's bound (``QUICConfiguration/maxEarlyStreamData``) closes
    /// the connection with FLOW_CONTROL_ERROR; nothing of it reaches the application. Within
    /// the bound the same request is read (``secondConnectionResumesWithEarlyData()``).
    @Test func earlyDataBeyondTheServersBoundClosesTheConnection() throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = TicketBox()
        _ = try Self.connect(Self.client(ticket: nil, box: box), Self.server(issuer), seed: 86)
        let ticket = try #require(box.latest)
        var bounded = Self.server(issuer)
        bounded.maxEarlyStreamData = UInt64(Self.request.count - 1)
        let refused = try Self.connect(Self.client(ticket: ticket, box: box), bounded, seed: 87)
        #expect(refused.received.isEmpty)
        #expect(refused.sim.client.isClosed)
        let reason = refused.sim.clientEvents.compactMap { event -> QUICCloseReason? in
            if case .connectionClosed(let reason) = event { reason } else { nil }
        }.first
        #expect(reason?.kind == .transport && reason?.code == 0x3 && reason?.initiatedByPeer == true, "\(String(describing: reason))")
    }

    @Test func rememberedLimitsAboveTheServersFailTheConnection() throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = TicketBox()
        var generous = Self.server(issuer)
        generous.applyBulkTransferLimits()
        _ = try Self.connect(Self.client(ticket: nil, box: box), generous, seed: 84)
        let ticket = try #require(box.latest)
        let stingy = try Self.connect(Self.client(ticket: ticket, box: box), Self.server(issuer), seed: 85)
        #expect(stingy.received.isEmpty)
        #expect(stingy.sim.client.isClosed)
    }
}
