import FoundationEssentials
import Glibc
import QXferReach
import Testing

/// A real ``RelayServer`` on loopback, spoken to with plain blocking sockets: pairing and the
/// observed address, signals, UDP bind and forwarding, a splice both ways, and a flood.
@Suite("Relay server over loopback sockets")
struct RelayServerTests {
    static let room = String(repeating: "5", count: 64)

    /// Runs `body` with a relay listening on an ephemeral port, then stops it (and checks it
    /// stopped cleanly).
    static func withRelay(host: String? = "127.0.0.1", limits: RelayLimits = .default,
                          _ body: @Sendable (UInt16, RelayServer) async throws -> Void) async throws {
        let server = RelayServer(host: host, port: 0, limits: limits)
        let (ports, continuation) = AsyncStream.makeStream(of: UInt16.self)
        let task = Task {
            defer { continuation.finish() }
            try await server.run { port in continuation.yield(port) }
        }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else {
            try await task.value
            throw RelayTestSocketError("the relay ended before it listened")
        }
        do {
            try await body(port, server)
        } catch {
            task.cancel()
            _ = try? await task.value
            throw error
        }
        task.cancel()
        try await task.value
    }

    /// Polls `condition` until it holds or a deadline generous for a loaded machine passes.
    static func eventually(_ condition: () -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
        return condition()
    }

    /// Two control connections paired in `room`, with their welcomes' tokens.
    struct Pair: Sendable {
        let offer: RelayTestSocket
        let answer: RelayTestSocket
        let offerToken: Data
        let answerToken: Data
        let offerObserved: String
        let answerObserved: String

        static func open(port: UInt16, room: String = RelayServerTests.room, from source: String = "127.0.0.1") throws -> Pair {
            let offer = try RelayTestSocket.tcp(to: port, from: source)
            try offer.send(.hello(version: 1, room: room, side: .offer))
            guard case .welcome(let offerObserved, let offerToken, let expiresIn) = try offer.message(), expiresIn == 600 else {
                throw RelayTestSocketError("the offer side got no welcome")
            }
            let answer = try RelayTestSocket.tcp(to: port, from: source)
            try answer.send(.hello(version: 1, room: room, side: .answer))
            guard case .welcome(let answerObserved, let answerToken, _) = try answer.message() else {
                throw RelayTestSocketError("the answer side got no welcome")
            }
            guard try answer.message() == .paired, try offer.message() == .paired else { throw RelayTestSocketError("not paired") }
            return Pair(offer: offer, answer: answer, offerToken: offerToken, answerToken: answerToken,
                        offerObserved: offerObserved, answerObserved: answerObserved)
        }
    }

    @Test("Two clients pair; each welcome carries the address the relay saw (IPv4 on a dual-stack socket as IPv4)")
    func pairing() async throws {
        try await Self.withRelay(host: nil) { port, server in
            let (pair, offerPort, answerPort) = try await onOwnThread {
                let pair = try Pair.open(port: port)
                return (pair, pair.offer.port, pair.answer.port)
            }
            #expect(pair.offerObserved == "127.0.0.1:\(offerPort)" && pair.answerObserved == "127.0.0.1:\(answerPort)")
            #expect(pair.offerToken.count == 16 && pair.offerToken != pair.answerToken)
            #expect(try await Self.eventually { server.statistics.pairsServed == 1 && server.statistics.roomsPaired == 1 })
        }
    }

    @Test("Signals arrive in order both ways; a side leaving is peerGone to the other")
    func signals() async throws {
        try await Self.withRelay { port, _ in
            let received = try await onOwnThread {
                let pair = try Pair.open(port: port)
                for index in 0..<40 { try pair.offer.send(.signal(data: Data("offer \(index)".utf8))) }
                for index in 0..<40 { try pair.answer.send(.signal(data: Data("answer \(index)".utf8))) }
                var received: [String] = []
                for _ in 0..<40 {
                    guard case .signal(let data) = try pair.answer.message() else { throw RelayTestSocketError("not a signal") }
                    received.append(String(decoding: data, as: UTF8.self))
                }
                for _ in 0..<40 {
                    guard case .signal(let data) = try pair.offer.message() else { throw RelayTestSocketError("not a signal") }
                    received.append(String(decoding: data, as: UTF8.self))
                }
                pair.answer.shutdownWriting()
                guard try pair.offer.message() == .peerGone else { throw RelayTestSocketError("no peerGone") }
                return received
            }
            #expect(received == (0..<40).map { "offer \($0)" } + (0..<40).map { "answer \($0)" })
        }
    }

    @Test("Refusals on the wire: no such code, code used, an oversized message; each then closed")
    func refusals() async throws {
        try await Self.withRelay { port, server in
            let (unknown, used, oversized) = try await onOwnThread {
                let stranger = try RelayTestSocket.tcp(to: port)
                try stranger.send(.hello(version: 1, room: String(repeating: "e", count: 64), side: .answer))
                let unknown = try stranger.message()
                let closed = stranger.closedByPeer()
                _ = try Pair.open(port: port)
                let late = try RelayTestSocket.tcp(to: port)
                try late.send(.hello(version: 1, room: Self.room, side: .answer))
                let used = try late.message()
                let huge = try RelayTestSocket.tcp(to: port)
                try huge.write([0, 1, 0, 0])
                let oversized = try huge.message()
                guard closed, late.closedByPeer(), huge.closedByPeer() else { throw RelayTestSocketError("a refused connection stayed open") }
                return (unknown, used, oversized)
            }
            #expect(unknown == .refused(reason: RelayRefusal.noSuchCode))
            #expect(used == .refused(reason: RelayRefusal.codeUsed))
            guard case .refused(let reason) = oversized else {
                Issue.record("\(oversized)")
                return
            }
            #expect(reason.hasPrefix("protocol violation"))
            #expect(server.statistics.refusals >= 3)
        }
    }

    @Test("UDP: bind is answered with the address seen; data goes between bound seats, and is dropped from anyone else")
    func datagrams() async throws {
        try await Self.withRelay { port, server in
            let outcome = try await onOwnThread {
                let pair = try Pair.open(port: port)
                let offerUDP = try RelayTestSocket.udp()
                let answerUDP = try RelayTestSocket.udp()
                let stranger = try RelayTestSocket.udp()
                // Data before the peer is bound goes nowhere.
                offerUDP.send(datagram: [RelayDatagram.bindType] + pair.offerToken, to: port)
                let offerBound = offerUDP.datagram(within: .seconds(20))
                offerUDP.send(datagram: [RelayDatagram.dataType, 0xEE], to: port)
                answerUDP.send(datagram: [RelayDatagram.bindType] + pair.answerToken, to: port)
                let answerBound = answerUDP.datagram(within: .seconds(20))
                let early = answerUDP.datagram(within: .milliseconds(200))
                let payload: [UInt8] = [RelayDatagram.dataType] + (0..<1200).map { UInt8(truncatingIfNeeded: $0) }
                offerUDP.send(datagram: payload, to: port)
                let forwarded = answerUDP.datagram(within: .seconds(20))
                answerUDP.send(datagram: [RelayDatagram.dataType, 1, 2, 3], to: port)
                let back = offerUDP.datagram(within: .seconds(20))
                stranger.send(datagram: [RelayDatagram.dataType, 9], to: port)
                stranger.send(datagram: [RelayDatagram.bindType] + Array(repeating: 0, count: 16), to: port)
                let strangerGot = stranger.datagram(within: .milliseconds(200))
                let leaked = answerUDP.datagram(within: .milliseconds(200)) ?? offerUDP.datagram(within: .milliseconds(1))
                return (offerBound, answerBound, offerUDP.port, answerUDP.port, early, forwarded, payload, back, strangerGot, leaked)
            }
            let (offerBound, answerBound, offerPort, answerPort, early, forwarded, payload, back, strangerGot, leaked) = outcome
            let loopback: [UInt8] = [127, 0, 0, 1]
            #expect(offerBound == RelayDatagram.bound(DatagramAddress(address: loopback, port: offerPort)!).encoded)
            #expect(answerBound == RelayDatagram.bound(DatagramAddress(address: loopback, port: answerPort)!).encoded)
            #expect(early == nil && forwarded == payload && back == [RelayDatagram.dataType, 1, 2, 3])
            #expect(strangerGot == nil && leaked == nil)
            #expect(try await Self.eventually {
                let statistics = server.statistics
                return statistics.datagramsRelayed == 2 && statistics.bytesRelayedOverUDP == payload.count + 4 && statistics.datagramsDropped >= 3
            }, "\(server.statistics)")
        }
    }

    @Test("A burst of datagrams of mixed sizes arrives whole and in order (the relay gathers runs of one size into GSO sends)")
    func datagramBurst() async throws {
        try await Self.withRelay { port, server in
            let (sent, received) = try await onOwnThread {
                let pair = try Pair.open(port: port)
                let offerUDP = try RelayTestSocket.udp()
                let answerUDP = try RelayTestSocket.udp()
                for (socket, token) in [(offerUDP, pair.offerToken), (answerUDP, pair.answerToken)] {
                    socket.send(datagram: [RelayDatagram.bindType] + token, to: port)
                    guard socket.datagram(within: .seconds(20))?.first == RelayDatagram.boundType else { throw RelayTestSocketError("no bound") }
                }
                // Runs of equal sizes, a shorter one after a run (a batch's allowed end), a
                // longer one after a shorter (which must start a new batch), single bytes.
                let sizes = [1200, 1200, 1200, 600, 1200, 1200, 1, 1, 1500, 1400, 1400] + Array(repeating: 1300, count: 70) + [8000, 8000, 20, 65_000]
                var sent: [[UInt8]] = []
                for (index, size) in sizes.enumerated() {
                    var datagram = [RelayDatagram.dataType] + [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: size - 1)
                    if size >= 3 { datagram[1] = UInt8(index >> 8); datagram[2] = UInt8(truncatingIfNeeded: index) }
                    sent.append(datagram)
                    offerUDP.send(datagram: datagram, to: port)
                }
                var received: [[UInt8]] = []
                while received.count < sent.count, let datagram = answerUDP.datagram(within: .seconds(5)) { received.append(datagram) }
                return (sent, received)
            }
            #expect(received.map(\.count) == sent.map(\.count))
            #expect(received == sent)
            #expect(server.statistics.datagramsRelayed == sent.count)
        }
    }

    @Test("A splice copies 1 MiB each way, bytes sent right after the splice message included, and passes each side's end on")
    func splice() async throws {
        try await Self.withRelay { port, server in
            let pair = try await onOwnThread { try Pair.open(port: port) }
            let fromOffer = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let fromAnswer = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
            let (offerSplice, answerSplice) = try await onOwnThread {
                let offerSplice = try RelayTestSocket.tcp(to: port)
                // The offer side does not wait for `spliced` before its first bytes.
                try offerSplice.write(try RelayMessage.splice(bindToken: pair.offerToken, id: 3).framed() + fromOffer.prefix(1000))
                let answerSplice = try RelayTestSocket.tcp(to: port)
                try answerSplice.send(.splice(bindToken: pair.answerToken, id: 3))
                guard try offerSplice.message() == .spliced, try answerSplice.message() == .spliced else {
                    throw RelayTestSocketError("not spliced")
                }
                return (offerSplice, answerSplice)
            }
            async let offerWrites: Void = onOwnThread {
                try offerSplice.write(Array(fromOffer.dropFirst(1000)))
                offerSplice.shutdownWriting()
            }
            async let answerWrites: Void = onOwnThread {
                try answerSplice.write(fromAnswer)
                answerSplice.shutdownWriting()
            }
            async let atAnswer = onOwnThread { try Self.readToEnd(answerSplice) }
            async let atOffer = onOwnThread { try Self.readToEnd(offerSplice) }
            try await offerWrites
            try await answerWrites
            let (receivedByAnswer, receivedByOffer) = try await (atAnswer, atOffer)
            #expect(receivedByAnswer.count == fromOffer.count && receivedByAnswer == fromOffer)
            #expect(receivedByOffer.count == fromAnswer.count && receivedByOffer == fromAnswer)
            #expect(try await Self.eventually {
                server.statistics.bytesRelayedOverTCP == 2 << 20 && server.statistics.splicesServed == 1
            }, "\(server.statistics)")
            _ = pair
        }
    }

    @Test("A splice whose reader stops holds its writer back: the relay buffers a bounded amount, not what the writer has")
    func spliceBackpressure() async throws {
        try await Self.withRelay { port, _ in
            let (accepted, delivered) = try await onOwnThread {
                let pair = try Pair.open(port: port)
                let writer = try RelayTestSocket.tcp(to: port)
                try writer.send(.splice(bindToken: pair.offerToken, id: 0))
                let reader = try RelayTestSocket.tcp(to: port)
                try reader.send(.splice(bindToken: pair.answerToken, id: 0))
                guard try writer.message() == .spliced, try reader.message() == .spliced else { throw RelayTestSocketError("not spliced") }
                // Write until the socket has taken nothing for three rounds in a row (the
                // relay stopped reading), or 256 MiB, which an unbounded relay would swallow.
                let chunk = [UInt8](repeating: 0x5A, count: 65536)
                var accepted = 0
                var fullRounds = 0
                while fullRounds < 3 && accepted < 256 << 20 {
                    let written = try writer.writeWithoutWaiting(chunk)
                    accepted += written
                    if written == 0 {
                        fullRounds += 1
                        usleep(200_000)
                    } else {
                        fullRounds = 0
                    }
                }
                writer.shutdownWriting()
                return (accepted, try Self.readToEnd(reader).count)
            }
            // Loopback's socket buffers on both sides (a few MiB each) plus the relay's 512 KiB.
            #expect(accepted < 64 << 20, "\(accepted) bytes taken by a splice nobody reads")
            #expect(delivered == accepted)
        }
    }

    static func readToEnd(_ socket: RelayTestSocket) throws -> [UInt8] {
        var received: [UInt8] = []
        while true {
            let chunk = try socket.read(within: .seconds(30))
            if chunk.isEmpty { return received }
            received += chunk
        }
    }

    @Test("A flood of bogus hellos, silent connections and datagrams from one address leaves a real pair working")
    func flood() async throws {
        try await Self.withRelay(host: nil) { port, server in
            async let hellos = onOwnThread {
                var held: [RelayTestSocket] = []
                var welcomed = 0
                for index in 0..<120 {
                    let socket = try RelayTestSocket.tcp(to: port, from: "127.0.0.2")
                    let room = String(repeating: "f", count: 60) + String(1000 + index)
                    try socket.send(.hello(version: 1, room: room, side: .offer))
                    if case .welcome = try socket.message() { welcomed += 1 }
                    held.append(socket)
                }
                // Connections that never speak: at most 32 at a time are let in.
                for _ in 0..<64 { held.append(try RelayTestSocket.tcp(to: port, from: "127.0.0.2")) }
                return (welcomed, held)
            }
            async let bogusDatagrams: Void = onOwnThread {
                let socket = try RelayTestSocket.udp(from: "127.0.0.2")
                var generator = SplitMix(seed: 1)
                for index in 0..<20_000 {
                    var bytes = [index % 2 == 0 ? RelayDatagram.dataType : RelayDatagram.bindType]
                    for _ in 0..<16 { bytes.append(UInt8(truncatingIfNeeded: generator.next())) }
                    socket.send(datagram: bytes, to: port)
                }
            }
            let delivered = try await onOwnThread {
                let pair = try Pair.open(port: port, room: String(repeating: "1", count: 64))
                let offerUDP = try RelayTestSocket.udp()
                let answerUDP = try RelayTestSocket.udp()
                for (socket, token) in [(offerUDP, pair.offerToken), (answerUDP, pair.answerToken)] {
                    var bound = false
                    for _ in 0..<50 where !bound {
                        socket.send(datagram: [RelayDatagram.bindType] + token, to: port)
                        bound = socket.datagram(within: .milliseconds(500))?.first == RelayDatagram.boundType
                    }
                    guard bound else { throw RelayTestSocketError("no bound") }
                }
                // Each datagram sent again until it arrives: the flood may overflow the
                // relay's socket buffer, as it would a router's, but must not stop it.
                var delivered = 0
                for index in 0..<20 {
                    let payload: [UInt8] = [RelayDatagram.dataType, UInt8(index)]
                    for _ in 0..<50 {
                        offerUDP.send(datagram: payload, to: port)
                        if answerUDP.datagram(within: .milliseconds(500)) == payload {
                            delivered += 1
                            break
                        }
                    }
                }
                try pair.offer.send(.signal(data: Data("still here".utf8)))
                guard try pair.answer.message() == .signal(data: Data("still here".utf8)) else { throw RelayTestSocketError("no signal") }
                return delivered
            }
            let (welcomed, held) = try await hellos
            try await bogusDatagrams
            #expect(delivered == 20)
            #expect(welcomed == 8)
            #expect(try await Self.eventually {
                let statistics = server.statistics
                return statistics.refusals >= 112 + 32 && statistics.datagramsDropped >= 1000 && statistics.roomsOpen == 9
            }, "\(server.statistics)")
            _ = held
        }
    }
}
