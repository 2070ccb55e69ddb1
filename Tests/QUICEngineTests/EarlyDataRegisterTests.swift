import LinuxSystem
import QUICEngine
import Testing

/// A server whose ticket issuer has an early-data register takes a resumed client's early data
/// once, across every server of the same secret, and reads it at once (0.5-RTT).
@Suite struct EarlyDataRegisterTests {
    /// A register in memory, shared by the issuers of one test as a file would be by processes.
    final class SharedRegister: QUICEarlyDataRegister {
        let keys = Locked<Set<[UInt8]>>([])
        func record(_ key: [UInt8], until expiry: Int64) -> Bool {
            keys.withLock { $0.insert(key).inserted }
        }
    }

    static let answer = Array("accepted, written, complete".utf8)

    /// When (virtual ns after the client's first packet) the client has read the server's whole
    /// answer to its request, written early; the server answers once it has read the request.
    static func answerDelay(_ client: QUICConfiguration, _ server: QUICConfiguration, seed: UInt64) throws -> UInt64? {
        let sim = try Simulation(seed: seed, client: client, server: server)
        sim.up.delay = 25 * ms
        sim.down.delay = 25 * ms
        let start = sim.now
        let stream = QUICStreamID(rawValue: 0)
        #expect(sim.client.earlyData == .attempted)
        #expect(try sim.client.openStream() == stream)
        _ = try sim.client.write(stream: stream, bytes: ResumptionTests.request, finish: true)
        var request: [UInt8] = []
        var answered = false
        var received: [UInt8] = []
        var doneAt: UInt64?
        sim.onStep = {
            if let server = sim.server, server.isHandshakeComplete, !answered, let read = try? server.read(stream: stream) {
                request += read.bytes
                if read.isFinished {
                    #expect(request == ResumptionTests.request)
                    answered = true
                    _ = try? server.write(stream: stream, bytes: answer, finish: true)
                }
            }
            if sim.client.isHandshakeComplete, doneAt == nil, let read = try? sim.client.read(stream: stream) {
                received += read.bytes
                if read.isFinished { doneAt = sim.now - start }
            }
        }
        sim.run(for: 2_000 * ms) { doneAt != nil || sim.client.isClosed }
        #expect(received == answer)
        return doneAt
    }

    /// A ticket from a first, full handshake with `issuer`.
    static func ticket(from issuer: QUICSessionTicketIssuer, seed: UInt64) throws -> QUICSessionTicket {
        let box = ResumptionTests.TicketBox()
        _ = try ResumptionTests.connect(ResumptionTests.client(ticket: nil, box: box), ResumptionTests.server(issuer), seed: seed)
        return try #require(box.latest)
    }

    /// With a register the answer reaches the client one round trip (50 ms) after its first
    /// packet: the server read the early request before the client's Finished. Without, the
    /// server reads it only then, and the answer comes a round trip later.
    @Test func registeredEarlyDataIsAnsweredWithinOneRoundTrip() throws {
        let register = SharedRegister()
        let registered = try QUICSessionTicketIssuer(register: register)
        let ticket = try Self.ticket(from: registered, seed: 90)
        let fast = try #require(try Self.answerDelay(
            ResumptionTests.client(ticket: ticket, box: ResumptionTests.TicketBox()), ResumptionTests.server(registered), seed: 91))
        #expect(fast < 65 * ms, "answer after \(fast / ms) ms")
        #expect(register.keys.withLock { $0.count } == 1)

        let plain = try QUICSessionTicketIssuer()
        let plainTicket = try Self.ticket(from: plain, seed: 92)
        let slow = try #require(try Self.answerDelay(
            ResumptionTests.client(ticket: plainTicket, box: ResumptionTests.TicketBox()), ResumptionTests.server(plain), seed: 93))
        #expect(slow >= 100 * ms, "answer after \(slow / ms) ms")
    }

    /// A resumed client the server no longer allows gets nothing read, early or not.
    @Test func refusedClientIsNotReadEarly() throws {
        let registered = try QUICSessionTicketIssuer(register: SharedRegister())
        let ticket = try Self.ticket(from: registered, seed: 94)
        let box = ResumptionTests.TicketBox()
        let refused = try ResumptionTests.connect(
            ResumptionTests.client(ticket: ticket, box: box), ResumptionTests.server(registered, allowClient: false), seed: 95)
        #expect(refused.received.isEmpty)
        #expect(refused.sim.server?.isHandshakeComplete == false)
        #expect(refused.sim.closeReason(.client)?.code == 0x100 + 42)
    }

    /// The client's first flight, replayed to a second server of the same secret (another
    /// process of the same receiver, started before the ticket was issued): with the register
    /// shared, its early data is refused and nothing is reported; with registers apart (memory
    /// only), the replay would be taken and handed to the application.
    @Test func replayedFirstFlightIsTakenOnce() throws {
        let secret = Array(repeating: UInt8(5), count: 32)
        for shared in [true, false] {
            let register = SharedRegister()
            let first = try QUICSessionTicketIssuer(secret: secret, register: register)
            let second = try QUICSessionTicketIssuer(secret: secret, register: shared ? register : SharedRegister())
            let ticket = try Self.ticket(from: first, seed: 96)

            let sim = try Simulation(seed: 97, client: ResumptionTests.client(ticket: ticket, box: ResumptionTests.TicketBox()),
                                     server: ResumptionTests.server(first))
            sim.up.delay = 25 * ms
            sim.down.delay = 25 * ms
            var flight: [[UInt8]] = []
            sim.onTransmit = { side, transmit in
                guard side == .client, flight.count < 8 else { return }
                let size = max(transmit.segmentSize, 1)
                flight += stride(from: 0, to: transmit.data.count, by: size).map {
                    Array(transmit.data[$0..<min($0 + size, transmit.data.count)])
                }
            }
            let stream = try #require(try sim.client.openStream())
            _ = try sim.client.write(stream: stream, bytes: ResumptionTests.request, finish: true)
            sim.run(for: 30 * ms) { sim.server?.isHandshakeComplete == true }
            #expect(sim.server?.isHandshakeComplete == true, "the original was not taken early")
            #expect(flight.count >= 2, "no early flight captured")

            let initial = try #require(QUICInitialPacket.accept(datagram: flight[0]))
            let path = QUICPath(local: QUICSocketAddress(ipAddress: "10.0.0.9", port: 4433)!,
                                remote: QUICSocketAddress(ipAddress: "10.0.0.1", port: 50_000)!)
            let replay = try QUICConnection(serverWith: ResumptionTests.server(second), initialPacket: initial, path: path,
                                            now: QUICTime(nanoseconds: 2_000_000_000), retriedFrom: nil)
            for datagram in flight {
                try? replay.handle(datagram: datagram, path: path, now: QUICTime(nanoseconds: 2_000_000_000))
            }
            if shared {
                #expect(!replay.isHandshakeComplete, "a replayed ClientHello's early data was handed over")
                #expect(replay.earlyData != .accepted)
                #expect((try? replay.read(stream: stream)) == nil || (try? replay.read(stream: stream))?.bytes.isEmpty == true)
            } else {
                #expect(replay.isHandshakeComplete, "the control case: a register apart takes the replay")
            }
        }
    }
}
