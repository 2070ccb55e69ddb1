import CQUICPacketProtection
import QUICEngine
import Testing

/// The BoringSSL packet-protection backend (CQUICPacketProtection, what QXferQUIC uses)
/// against ngtcp2_crypto_gnutls's own: packets are the same on the wire, so each end may use
/// either. GnuTLS's side is the reference: a key derived, sealed, opened or masked wrongly by
/// the other makes its packets undecryptable, and the connection stalls or closes.
@Suite struct PacketProtectionTests {
    enum Backend: String, CaseIterable, CustomStringConvertible {
        case gnutls, boringssl
        var protection: QUICPacketProtection {
            self == .gnutls ? .gnutls : QUICPacketProtection(backend: cquic_packet_protection_boringssl())
        }
        var description: String { rawValue }
    }

    static let pairs: [(Backend, Backend)] = [(.boringssl, .gnutls), (.gnutls, .boringssl), (.boringssl, .boringssl)]

    static func configurations(client: Backend, server: Backend) -> (QUICConfiguration, QUICConfiguration) {
        var clientConfiguration = QUICConfiguration.test(.client, expectPeer: .server)
        clientConfiguration.packetProtection = client.protection
        var serverConfiguration = QUICConfiguration.test(.server, expectPeer: nil)
        serverConfiguration.packetProtection = server.protection
        return (clientConfiguration, serverConfiguration)
    }

    /// Moves `payload` from client to server; `midway` runs once, after about half has arrived.
    static func transfer(_ sim: Simulation, _ payload: [UInt8], midway: @escaping () throws -> Void = {}) throws -> [UInt8] {
        let stream = try #require(try sim.client.openStream())
        var written = 0
        var received: [UInt8] = []
        var didMidway = false
        var midwayError: (any Error)?
        sim.onStep = {
            if written < payload.count {
                written += (try? payload[written...].withUnsafeBytes {
                    try sim.client.write(stream: stream, bytes: $0, finish: written + $0.count == payload.count)
                }) ?? 0
            }
            if let read = try? sim.server?.read(stream: stream) { received += read.bytes }
            if !didMidway && received.count >= payload.count / 2 {
                didMidway = true
                do { try midway() } catch { midwayError = error }
            }
        }
        sim.run(for: 30_000 * ms) { received.count == payload.count || sim.client.isClosed }
        if let midwayError { throw midwayError }
        return received
    }

    /// Handshake, 4 MB under 1 % loss each way (retransmissions, acknowledgements, reordering),
    /// and a key update halfway, started by the client and then by the server.
    @Test(arguments: pairs.map { [$0.0, $0.1] })
    func backendsInteroperate(_ backends: [Backend]) throws {
        let (client, server) = Self.configurations(client: backends[0], server: backends[1])
        for (seed, updater) in [(41, Side.client), (42, Side.server)] as [(UInt64, Side)] {
            let sim = try Simulation(seed: seed, client: client, server: server)
            sim.up.loss = 0.01
            sim.down.loss = 0.01
            sim.up.rate = 200_000_000
            sim.down.rate = 200_000_000
            #expect(sim.runHandshake(), "\(backends) seed \(seed)")
            let payload = (0..<4_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed)) }
            let received = try Self.transfer(sim, payload) {
                try #require(sim.connection(updater)).initiateKeyUpdate(now: sim.nowTime)
            }
            #expect(received == payload, "\(backends), key update by the \(updater): \(received.count) of \(payload.count) bytes")
            #expect(sim.serverErrors.isEmpty, "\(backends): \(sim.serverErrors)")
            #expect(!sim.client.isClosed)
        }
    }

    /// A Retry (its integrity tag checked with the fixed Retry key) and the new Initial keys
    /// that follow it.
    @Test(arguments: pairs.map { [$0.0, $0.1] })
    func retryAcrossBackends(_ backends: [Backend]) throws {
        let (client, server) = Self.configurations(client: backends[0], server: backends[1])
        let sim = try Simulation(seed: 133, client: client, server: server)
        sim.requireRetry = true
        #expect(sim.runHandshake(), "\(backends)")
        #expect(sim.retriesSent == 1 && sim.acceptedAfterRetry, "\(backends)")
        let payload = Array(repeating: UInt8(7), count: 100_000)
        #expect(try Self.transfer(sim, payload) == payload, "\(backends)")
    }

    /// 0-RTT: the early keys on both ends come from the resumed session's secret.
    @Test(arguments: pairs.map { [$0.0, $0.1] })
    func earlyDataAcrossBackends(_ backends: [Backend]) throws {
        let issuer = try QUICSessionTicketIssuer()
        let box = ResumptionTests.TicketBox()
        func configurations(ticket: QUICSessionTicket?) -> (QUICConfiguration, QUICConfiguration) {
            var client = ResumptionTests.client(ticket: ticket, box: box)
            client.packetProtection = backends[0].protection
            var server = ResumptionTests.server(issuer)
            server.packetProtection = backends[1].protection
            return (client, server)
        }
        let first = configurations(ticket: nil)
        _ = try ResumptionTests.connect(first.0, first.1, seed: 171)
        let ticket = try #require(box.latest, "\(backends): the server issued no ticket")
        let second = configurations(ticket: ticket)
        let outcome = try ResumptionTests.connect(second.0, second.1, seed: 172)
        #expect(outcome.received == ResumptionTests.request, "\(backends)")
        #expect(outcome.sim.server?.earlyData == .accepted && outcome.streamBeforeHandshake, "\(backends)")
    }
}
