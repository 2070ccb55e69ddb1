import Foundation
import QXfer
@testable import QXferReach
import LinuxSystem
import PlainText
import Testing

#if canImport(Glibc)
import Glibc
#endif

// MARK: - The decisions, on a fake clock

/// The path engine without sockets: addresses are strings, time is what the test says.
@Suite("Path engine (sans-IO)")
struct PathEngineTests {
    typealias Engine = PathEngine<String>

    static let tokenA = [UInt8](repeating: 0xA1, count: 16)
    static let tokenB = [UInt8](repeating: 0xB2, count: 16)
    static let seat = [UInt8](repeating: 0x5E, count: 16)

    /// Two engines that know each other: A lists "a1", "a2"; B lists "b1".
    static func pair(punching: PunchingPolicy = .allowed) -> (a: Engine, b: Engine, aPunches: [Engine.Action]) {
        var a = Engine(token: tokenA, bindToken: seat, punching: punching)
        var b = Engine(token: tokenB, bindToken: seat, punching: punching)
        _ = a.start(now: .zero)
        _ = b.start(now: .zero)
        let aPunches = a.peerKnown(token: tokenB, candidates: ["b1"], now: .zero)
        _ = b.peerKnown(token: tokenA, candidates: ["a1", "a2"], now: .zero)
        return (a, b, aPunches)
    }

    /// The datagrams of `actions` sent to `address`, decoded.
    static func sent(_ actions: [Engine.Action], to address: String) -> [PeerDatagram] {
        actions.compactMap {
            guard case .send(let bytes, let to) = $0, to == address else { return nil }
            return PeerDatagram(decoding: bytes[...])
        }
    }

    /// Delivers every punch of `actions` to `to` as if from `from`; returns its answers.
    static func deliver(_ actions: [Engine.Action], to engine: inout Engine, from: String, now: Duration) -> [Engine.Action] {
        var answers: [Engine.Action] = []
        for action in actions {
            guard case .send(let bytes, _) = action, let datagram = PeerDatagram(decoding: bytes[...]) else { continue }
            switch datagram {
            case .punch(let token, let nonce): answers += engine.receivedPunch(token: token, nonce: nonce, from: from, now: now)
            case .punched(let token, let nonce): answers += engine.receivedPunched(token: token, nonce: nonce, from: from, now: now)
            case .data: break
            }
        }
        return answers
    }

    @Test("A punch answered with this side's nonce makes its source the direct path")
    func punchThenDirect() throws {
        var (a, b, aPunches) = Self.pair()
        let toB = Self.sent(aPunches, to: "b1")
        #expect(toB.count == 1)
        guard case .punch(let token, _) = toB.first else { Issue.record("no punch to b1"); return }
        #expect(token == Self.tokenB)
        #expect(a.route == .relayed)

        // B answers to the punch's source, with A's token; A takes the answer's source.
        let answers = Self.deliver(aPunches, to: &b, from: "a-nat", now: .milliseconds(10))
        guard case .punched(let answerToken, _) = Self.sent(answers, to: "a-nat").first else { Issue.record("no answer"); return }
        #expect(answerToken == Self.tokenA)
        #expect(b.isTrusted("a-nat"))
        #expect(b.route == .relayed)

        _ = Self.deliver(answers.filter { if case .send(_, "a-nat") = $0 { true } else { false } }, to: &a, from: "b-nat", now: .milliseconds(20))
        #expect(a.route == .direct("b-nat"))
        #expect(a.isTrusted("b-nat"))
        #expect(!a.isPunching)
        #expect(a.routeChanges == 1)
    }

    @Test("Punches with another token, answers with an unknown nonce or another token change nothing")
    func hostilePunches() {
        var (a, b, aPunches) = Self.pair()
        do {
            let result = b.receivedPunch(token: Self.tokenA, nonce: 1, from: "x", now: .zero).isEmpty
            #expect(result)
        }
        #expect(!b.isTrusted("x"))
        do {
            let result = a.receivedPunched(token: Self.tokenA, nonce: 12345, from: "x", now: .zero).isEmpty
            #expect(result)
        }
        #expect(a.route == .relayed)
        guard case .punch(_, let nonce) = Self.sent(aPunches, to: "b1").first else { Issue.record("no punch"); return }
        _ = a.receivedPunched(token: Self.tokenB, nonce: nonce, from: "x", now: .zero)
        #expect(a.route == .relayed)
        #expect(!a.isTrusted("x"))
    }

    @Test("Punch rounds go every 250 ms to every candidate for 10 s, then stop")
    func punchWindow() {
        var (_, b, _) = Self.pair()
        var rounds = 1  // the one peerKnown sent
        var late = 0
        for step in 1...240 {
            let now = Duration.milliseconds(50 * step)
            let punches = b.tick(now: now).filter { if case .send = $0 { true } else { false } }
            if !punches.isEmpty {
                #expect(punches.count == 2)  // a1 and a2
                if now < .seconds(10) { rounds += 1 } else { late += 1 }
            }
        }
        #expect(rounds == 40)
        #expect(late == 0)
        #expect(!b.isPunching)
    }

    @Test("Three keepalives unanswered in a row send datagrams back through the relay, and punching starts again")
    func lostKeepalives() {
        var (a, b, aPunches) = Self.pair()
        let answers = Self.deliver(aPunches, to: &b, from: "a-nat", now: .zero)
        _ = Self.deliver(answers, to: &a, from: "b-nat", now: .zero)
        #expect(a.route == .direct("b-nat"))

        // One keepalive answered: still direct.
        var keepalive = a.tick(now: .seconds(5))
        #expect(Self.sent(keepalive, to: "b-nat").count == 1)
        _ = Self.deliver(Self.deliver(keepalive, to: &b, from: "a-nat", now: .seconds(5)), to: &a, from: "b-nat", now: .seconds(5))
        // Then silence.
        for second in [10, 15, 20] {
            keepalive = a.tick(now: .seconds(second))
            #expect(a.route == .direct("b-nat"))
            #expect(Self.sent(keepalive, to: "b-nat").count == 1)
        }
        let fallback = a.tick(now: .seconds(25))
        #expect(a.route == .relayed)
        #expect(a.routeChanges == 2)
        #expect(a.isPunching)
        #expect(Self.sent(fallback, to: "b1").count == 1)
        // Data from the old path is still the peer's (it takes data from either route).
        #expect(a.isTrusted("b-nat"))
    }

    @Test("Binds go every second until bound, UDP counts as blocked after 5 s, then a bind every 20 s")
    func binding() {
        var engine = Engine(token: Self.tokenA, bindToken: Self.seat)
        let first = engine.start(now: .zero)
        #expect(first == [.toRelay(RelayDatagram.bind(token: Self.seat).encoded)])
        var binds = 1
        for tenth in 1...50 {
            binds += engine.tick(now: .milliseconds(100 * tenth)).count
        }
        #expect(binds == 5)  // at 0, 1, 2, 3 and 4 s
        #expect(engine.binding == .blocked)
        #expect(engine.bindingSettled)
        do {
            let result = engine.tick(now: .seconds(20)).isEmpty
            #expect(result)
        }
        do {
            let result = engine.tick(now: .seconds(25)).count
            #expect(result == 1)
        }
        let address = DatagramAddress(address: [192, 0, 2, 1], port: 4000)!
        engine.relayBound(address, now: .seconds(26))
        #expect(engine.binding == .bound(address))
    }

    @Test("A held side neither punches nor answers until allowed")
    func heldPunching() {
        var (a, b, aPunches) = Self.pair(punching: .held)
        #expect(aPunches.isEmpty)
        var probe = Engine(token: Self.tokenA, bindToken: Self.seat)
        _ = probe.start(now: .zero)
        let punches = probe.peerKnown(token: Self.tokenB, candidates: ["b1"], now: .zero)
        #expect(Self.deliver(punches, to: &b, from: "a", now: .zero).isEmpty)
        let allowed = a.allowPunching(now: .seconds(1))
        #expect(Self.sent(allowed, to: "b1").count == 1)
        #expect(a.isPunching)
    }

    @Test("The source of a valid punch is punched too (a peer-reflexive candidate)")
    func peerReflexive() {
        var (_, b, aPunches) = Self.pair()
        let answers = Self.deliver(aPunches, to: &b, from: "a-symmetric", now: .zero)
        let toSource = Self.sent(answers, to: "a-symmetric")
        #expect(toSource.count == 2)
        #expect(toSource.contains { if case .punch = $0 { true } else { false } })
        #expect(b.candidates.contains("a-symmetric"))
    }

    @Test("A send the host refused forgets the candidate and leaves a direct path through it")
    func forgetting() {
        var (a, b, aPunches) = Self.pair()
        _ = Self.deliver(Self.deliver(aPunches, to: &b, from: "a1", now: .zero), to: &a, from: "b1", now: .zero)
        #expect(a.route == .direct("b1"))
        a.forget("b1")
        #expect(a.route == .relayed)
        #expect(!a.candidates.contains("b1"))
    }
}

// MARK: - Flow tables, addresses, words

@Suite("Path agent tables and words")
struct PathTablesTests {
    @Test("Offer flows: one number per source, numbers not reused at once, bounded, quiet ones forgotten")
    func offerFlows() {
        var flows = OfferFlows<String>(capacity: 3, idleTimeout: .seconds(60))
        do {
            let result = flows.flow(for: "a", now: .zero)
            #expect(result == 0)
        }
        do {
            let result = flows.flow(for: "b", now: .zero)
            #expect(result == 1)
        }
        do {
            let result = flows.flow(for: "a", now: .seconds(30))
            #expect(result == 0)
        }
        do {
            let result = flows.flow(for: "c", now: .seconds(30))
            #expect(result == 2)
        }
        do {
            let result = flows.flow(for: "d", now: .seconds(30))
            #expect(result == nil)
        }
        do {
            let result = flows.address(of: 1, now: .seconds(30))
            #expect(result == "b")
        }
        do {
            let result = flows.address(of: 7, now: .seconds(30))
            #expect(result == nil)
        }
        // "a" was used at 30 s, "b" too (address(of:) counts), "c" at 30 s: nothing is 60 s quiet.
        do {
            let result = flows.expire(now: .seconds(60)).isEmpty
            #expect(result)
        }
        _ = flows.flow(for: "a", now: .seconds(80))
        do {
            let result = flows.expire(now: .seconds(95))
            #expect(Set(result) == [1, 2])
        }
        #expect(flows.count == 1)
        do {
            let result = flows.flow(for: "b", now: .seconds(95))
            #expect(result == 3)
        }
    }

    @Test("Answer flows: bounded, a quiet flow expires, a used one stays")
    func answerFlows() {
        var table = FlowTable<String>(capacity: 2, idleTimeout: .seconds(60))
        let one = FlowKey(service: 1, flow: 0)
        let two = FlowKey(service: 1, flow: 1)
        let three = FlowKey(service: 0, flow: 0)
        do {
            let result = table.insert("one", for: one, now: .zero)
            #expect(result)
        }
        do {
            let result = table.insert("again", for: one, now: .zero)
            #expect(!result)
        }
        do {
            let result = table.insert("two", for: two, now: .zero)
            #expect(result)
        }
        do {
            let result = table.insert("three", for: three, now: .zero)
            #expect(!result)
        }
        table.touch(one, now: .seconds(50))
        do {
            let result = table.expire(now: .seconds(61))
            #expect(result == ["two"])
        }
        do {
            let result = table.value(for: one, now: .seconds(61))
            #expect(result == "one")
        }
        do {
            let result = table.insert("three", for: three, now: .seconds(61))
            #expect(result)
        }
        do {
            let result = table.remove(one)
            #expect(result == "one")
        }
        #expect(table.count == 1)
    }

    @Test("Relay addresses: host, host:port, [v6]:port, bare IPv6; junk refused")
    func relayAddresses() {
        #expect(RelayAddress(parsing: "relay.example")?.description == "relay.example:7450")
        #expect(RelayAddress(parsing: "relay.example:9000") == RelayAddress(host: "relay.example", port: 9000))
        #expect(RelayAddress(parsing: "[2001:db8::1]:443") == RelayAddress(host: "2001:db8::1", port: 443))
        #expect(RelayAddress(parsing: "[2001:db8::1]")?.port == 7450)
        #expect(RelayAddress(parsing: "::1")?.description == "[::1]:7450")
        #expect(RelayAddress(parsing: "192.0.2.1:1", defaultPort: 7) == RelayAddress(host: "192.0.2.1", port: 1))
        for junk in ["", ":80", "host:", "host:0", "host:65536", "host:8x", "[::1", "[::1]x", "[::1]:", "a b", "[host]:1", "host:+80"] {
            #expect(RelayAddress(parsing: junk) == nil, "\(junk)")
        }
    }

    @Test("Candidates parse only unicast addresses of the socket's family")
    func candidates() {
        #expect(AgentCore.candidate(parsing: "192.0.2.7:4000", family: .inet) != nil)
        #expect(AgentCore.candidate(parsing: "[2001:db8::7]:4000", family: .inet6) != nil)
        for junk in ["192.0.2.7:0", "0.0.0.0:1", "224.0.0.1:1", "255.255.255.255:1", "[2001:db8::7]:4000", "host:1", "192.0.2.7"] {
            #expect(AgentCore.candidate(parsing: junk, family: .inet) == nil, "\(junk)")
        }
        #expect(AgentCore.candidate(parsing: "[ff02::1]:1", family: .inet6) == nil)
    }

    @Test("The candidates transcript is SHA-256 over both signals with their little-endian lengths")
    func transcript() {
        let value = AgentCore.transcript(offer: Array(#"{"candidates":{}}"#.utf8), answer: Array("answer".utf8))
        #expect(TextFormat.hex(value) == "c4ceb5b2e24cfb6ef5a35d45a5ae1088913e314a581bb97c9b394bcd78cc768f")
    }

    @Test("Refusals map to their kinds; a hostile reason is made printable")
    func refusals() {
        #expect(RelayClient.refusal(RelayRefusal.roomTaken).kind == .roomTaken)
        #expect(RelayClient.refusal(RelayRefusal.noSuchCode).kind == .noSuchCode)
        #expect(RelayClient.refusal(RelayRefusal.codeUsed).kind == .codeUsed)
        #expect(RelayClient.refusal(RelayRefusal.expired(after: .seconds(600))).kind == .timedOut)
        let odd = RelayClient.refusal("go away\u{1B}[2J\n" + String(repeating: "x", count: 500))
        #expect(odd.kind == .refusedByRelay)
        #expect(!odd.description.contains("\u{1B}"))
        #expect(odd.description.count < 260)
    }
}

// MARK: - Two agents and a relay on loopback

/// Two path agents meeting through a real ``RelayServer`` on loopback, carrying UDP, TCP and
/// real qxfer connections (QUIC and TCP+TLS), relayed, direct, and switching in the middle.
@Suite("Path agent over loopback", .serialized)
struct PathAgentTests {
    static let server = try! HostIdentity.ephemeral(commonName: "reach test server")
    static let client = try! HostIdentity.ephemeral(commonName: "reach test client")

    /// Runs a relay on 127.0.0.1 while `body` runs.
    static func withRelay<T: Sendable>(_ body: @Sendable (RelayAddress) async throws -> T) async throws -> T {
        let relay = RelayServer(host: "127.0.0.1", port: 0)
        let port = AsyncStream<UInt16>.makeStream()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await relay.run { port.continuation.yield($0) } }
            var ports = port.stream.makeAsyncIterator()
            guard let number = await ports.next() else { throw ReachError(.local, "the relay did not start") }
            do {
                let result = try await body(RelayAddress(host: "127.0.0.1", port: number)!)
                group.cancelAll()
                try await group.waitForAll()
                return result
            } catch {
                group.cancelAll()
                throw error
            }
        }
    }

    /// An offer and an answer agent that met through `relay`.
    static func meet(_ relay: RelayAddress, punching: PunchingPolicy, timing: PathTiming = PathTiming()) async throws -> (offer: PathAgent, answer: PathAgent) {
        let room = (0..<32).map { _ in UInt8.random(in: 0...255) }
        var options = PathOptions()
        options.punching = punching
        options.timing = timing
        let offer = try await PathAgent.connect(relay: relay, room: room, side: .offer, timeout: .seconds(10), options: options)
        let answer = try await PathAgent.connect(relay: relay, room: room, side: .answer, timeout: .seconds(10), options: options)
        async let offerMet: Void = offer.meetPeer(timeout: .seconds(20))
        try await answer.meetPeer(timeout: .seconds(20))
        try await offerMet
        #expect(offer.candidatesTranscript.count == 32)
        #expect(offer.candidatesTranscript == answer.candidatesTranscript)
        return (offer, answer)
    }

    @Test("A room taken, a code with no sender and a used code are refused with their kinds")
    func refusals() async throws {
        try await Self.withRelay { relay in
            let room = [UInt8](repeating: 7, count: 32)
            let missing = await #expect(throws: ReachError.self) {
                _ = try await PathAgent.connect(relay: relay, room: room, side: .answer)
            }
            #expect(missing?.kind == .noSuchCode)
            let offer = try await PathAgent.connect(relay: relay, room: room, side: .offer)
            let taken = await #expect(throws: ReachError.self) {
                _ = try await PathAgent.connect(relay: relay, room: room, side: .offer)
            }
            #expect(taken?.kind == .roomTaken)
            let answer = try await PathAgent.connect(relay: relay, room: room, side: .answer)
            let used = await #expect(throws: ReachError.self) {
                _ = try await PathAgent.connect(relay: relay, room: room, side: .answer)
            }
            #expect(used?.kind == .codeUsed)
            await offer.close()
            await answer.close()
        }
        let unreachable = await #expect(throws: ReachError.self) {
            _ = try await PathAgent.connect(relay: RelayAddress(host: "127.0.0.1", port: 1)!, room: [UInt8](repeating: 1, count: 32), side: .offer)
        }
        #expect(unreachable?.kind == .relayUnreachable)
    }

    @Test("A peer that does not come times the meeting out; one that leaves is peerGone")
    func noPeer() async throws {
        try await Self.withRelay { relay in
            let room = (0..<32).map { _ in UInt8.random(in: 0...255) }
            let offer = try await PathAgent.connect(relay: relay, room: room, side: .offer)
            let lonely = await #expect(throws: ReachError.self) { try await offer.meetPeer(timeout: .milliseconds(300)) }
            #expect(lonely?.kind == .timedOut)
            await offer.close()

            let room2 = (0..<32).map { _ in UInt8.random(in: 0...255) }
            let offer2 = try await PathAgent.connect(relay: relay, room: room2, side: .offer)
            let meeting = Task { try await offer2.meetPeer(timeout: .seconds(20)) }
            let answer = try await PathAgent.connect(relay: relay, room: room2, side: .answer)
            await answer.close()
            let gone = await #expect(throws: ReachError.self) { try await meeting.value }
            #expect(gone?.kind == .peerGone || gone?.kind == .protocolViolation)
            await offer2.close()
        }
    }

    @Test("UDP datagrams reach an echo service behind the answer side over the direct path")
    func udpDirect() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .allowed)
            let echo = try EchoServer()
            answer.serve(.transfer, onLocalPort: echo.port)
            let port = try await offer.localPort(for: .transfer)
            let report = await offer.waitForRoute(direct: true, timeout: .seconds(10))
            guard case .direct = report.route else { Issue.record("no direct path: \(report)"); return }
            _ = await answer.waitForRoute(direct: true, timeout: .seconds(10))
            let replies = try await blocking { try udpExchange(port: port, count: 50) }
            #expect(replies == 50)
            let offerReport = offer.report
            #expect(offerReport.directBytes > 0)
            #expect(offerReport.relayedBytes == 0)
            await offer.close()
            await answer.close()
            echo.stop()
        }
    }

    @Test("UDP datagrams reach an echo service through the relay when punching is off")
    func udpRelayed() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .never)
            let echo = try EchoServer()
            answer.serve(.transfer, onLocalPort: echo.port)
            let port = try await offer.localPort(for: .transfer)
            let replies = try await blocking { try udpExchange(port: port, count: 50) }
            #expect(replies >= 45)
            let report = offer.report
            #expect(report.route == .relayed)
            #expect(report.relayedBytes > 0)
            #expect(report.directBytes == 0)
            await offer.close()
            await answer.close()
            echo.stop()
        }
    }

    @Test("Hostile datagrams at the agents' UDP sockets change nothing: junk, short headers, forged punches, data from strangers")
    func hostileDatagrams() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .allowed)
            let echo = try EchoServer()
            answer.serve(.transfer, onLocalPort: echo.port)
            let port = try await offer.localPort(for: .transfer)
            _ = await offer.waitForRoute(direct: true, timeout: .seconds(10))
            let before = answer.report
            let targets = [UInt16(await offer.widePort()), UInt16(await answer.widePort())]
            try await blocking {
                var random = SystemRandomNumberGenerator()
                let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
                defer { close(fd) }
                var junk: [[UInt8]] = [[], [0x03], [0x03, 1], [0x03, 1, 0], [0x02, 4, 1, 2, 3, 4, 0, 1], [0x10], [0x11]]
                junk.append([0x10] + [UInt8](repeating: 0, count: 24))
                junk.append([0x11] + [UInt8](repeating: 0xFF, count: 24))
                for _ in 0..<500 {
                    junk.append((0..<Int.random(in: 0...1500, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) })
                }
                // Data for a new flow of each service from a stranger: must not reach the service.
                for service in 0...3 { junk.append([0x03, UInt8(service), 0, 9] + Array("stranger".utf8)) }
                for target in targets {
                    var address = sockaddr_in()
                    address.sin_family = sa_family_t(AF_INET)
                    address.sin_addr.s_addr = inet_addr("127.0.0.1")
                    address.sin_port = target.bigEndian
                    for datagram in junk {
                        _ = withUnsafePointer(to: &address) { pointer in
                            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, datagram, datagram.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                        }
                    }
                }
            }
            let replies = try await blocking { try udpExchange(port: port, count: 20) }
            #expect(replies == 20)
            #expect(echo.strangers == 0)
            #expect(answer.report.directBytes - before.directBytes < 100_000)
            await offer.close()
            await answer.close()
            echo.stop()
        }
    }

    @Test("A relay that breaks the protocol is a protocol violation, never a trap")
    func hostileRelay() async throws {
        let answers: [[UInt8]] = [
            Self.frame(#"{"paired":{}}"#),  // before welcome
            [0xFF, 0xFF, 0xFF, 0xFF],  // a length over the limit
            Self.frame("not json"),
            Self.frame(#"{"welcome":{"observed":"x","bindToken":"AAAA","expiresIn":1}}"#),  // a short token
            Self.frame(#"{"surprise":{}}"#),
        ]
        for answer in answers {
            let fake = try FakeRelay(answer: answer)
            let error = await #expect(throws: ReachError.self) {
                _ = try await PathAgent.connect(relay: RelayAddress(host: "127.0.0.1", port: fake.port)!, room: [UInt8](repeating: 3, count: 32), side: .offer, timeout: .seconds(5))
            }
            #expect(error?.kind == .protocolViolation, "\(answer.prefix(40))")
            fake.stop()
        }
    }

    static func frame(_ text: String) -> [UInt8] {
        let body = Array(text.utf8)
        return withUnsafeBytes(of: UInt32(body.count).bigEndian) { Array($0) } + body
    }

    @Test("A TCP connection to the local port reaches the echo service through a splice")
    func tcpSplice() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .never)
            let echo = try EchoServer()
            answer.serve(.transfer, onLocalPort: echo.port)
            let port = try await offer.localPort(for: .transfer)
            let size = 4 << 20
            let echoed = try await blocking { try tcpExchange(port: port, bytes: size) }
            #expect(echoed)
            #expect(offer.report.spliceBytes >= UInt64(2 * size))
            #expect(answer.report.spliceBytes >= UInt64(2 * size))
            await offer.close()
            await answer.close()
            echo.stop()
        }
    }

    @Test("A TCP+TLS qxfer connection runs through a splice")
    func tlsThroughSplice() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .never)
            try await Self.echoThroughAgents(offer, answer, stack: { TLS().identity(Self.server) }, client: {
                TLS().identity(Self.client).peerFingerprint(Self.server.fingerprint)
            }, bytes: 4 << 20)
            #expect(offer.report.spliceBytes > 8 << 20)
            await offer.close()
            await answer.close()
        }
    }

    @Test("A QUIC qxfer connection runs through the relay")
    func quicRelayed() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .never)
            try await Self.echoQUIC(offer, answer, bytes: 16 << 20)
            let report = offer.report
            #expect(report.route == .relayed)
            #expect(report.relayedBytes > 32 << 20)
            #expect(report.directBytes == 0)
            await offer.close()
            await answer.close()
        }
    }

    @Test("A QUIC qxfer connection runs over the direct path")
    func quicDirect() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .allowed)
            _ = await offer.waitForRoute(direct: true, timeout: .seconds(10))
            _ = await answer.waitForRoute(direct: true, timeout: .seconds(10))
            try await Self.echoQUIC(offer, answer, bytes: 16 << 20)
            let report = offer.report
            guard case .direct = report.route else { Issue.record("not direct: \(report)"); return }
            #expect(report.directBytes > 32 << 20)
            await offer.close()
            await answer.close()
        }
    }

    @Test("A QUIC connection that starts relayed moves to the direct path in the middle, without noticing")
    func quicSwitches() async throws {
        try await Self.withRelay { relay in
            let (offer, answer) = try await Self.meet(relay, punching: .held)
            try await Self.echoQUIC(offer, answer, bytes: 32 << 20) { received in
                // A quarter through: the direct path opens.
                if received >= 8 << 20, offer.report.directBytes == 0 {
                    offer.allowPunching()
                    answer.allowPunching()
                    // The rest of the transfer waits for the switch (however slow the machine).
                    _ = await offer.waitForRoute(direct: true, timeout: .seconds(20))
                }
            }
            let report = offer.report
            guard case .direct = report.route else { Issue.record("not direct: \(report)"); return }
            #expect(report.relayedBytes > 1 << 20)
            #expect(report.directBytes > 1 << 20)
            await offer.close()
            await answer.close()
        }
    }

    @Test("Throughput through the agents: plain QUIC, relayed and direct (QXFER_PATH_BENCH=MiB)",
          .enabled(if: ProcessInfo.processInfo.environment["QXFER_PATH_BENCH"] != nil))
    func throughput() async throws {
        let mebibytes = Int(ProcessInfo.processInfo.environment["QXFER_PATH_BENCH"] ?? "") ?? 256
        let bytes = mebibytes << 20
        // Without the agents, QUIC probes loopback's 65 507-byte datagrams; through them it
        // cannot (the 4-byte header), so the fair baseline is without the probe.
        let plain = try await Self.oneWay(bytes: bytes, port: nil, probe: false)
        print("plain QUIC (datagrams of a network path's size): \(plain)")
        for punching in [PunchingPolicy.never, .allowed] {
            try await Self.withRelay { relay in
                let (offer, answer) = try await Self.meet(relay, punching: punching)
                if punching == .allowed {
                    _ = await offer.waitForRoute(direct: true, timeout: .seconds(10))
                    _ = await answer.waitForRoute(direct: true, timeout: .seconds(10))
                }
                let result = try await Self.oneWay(bytes: bytes, port: (offer, answer))
                print("\(punching == .never ? "relayed" : "direct"): \(result); \(offer.report)")
                await offer.close()
                await answer.close()
            }
        }
    }

    /// Sends `bytes` one way over QUIC (through the agents when given) and reports the rate and
    /// the process's CPU time per second.
    static func oneWay(bytes: Int, port agents: (PathAgent, PathAgent)?, probe: Bool = true) async throws -> String {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(server).tunnelledThroughLoopback() }
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    var received = 0
                    while received < bytes {
                        received += try await connection.receive(atLeast: 1, atMost: 4 << 20).content.count
                    }
                    try await connection.send(Data([1]))
                }
            }
            var port = try await listener.port
            if let (offer, answer) = agents {
                answer.serve(.transfer, onLocalPort: port)
                port = try await offer.localPort(for: .transfer)
            }
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(client).peerFingerprint(server.fingerprint).tunnelledThroughLoopback().pathMTUProbe(probe)
            }
            let chunk = Data(repeating: 0x5A, count: 1 << 20)
            try await connection.send(chunk[0..<1])
            let cpuBefore = cpuSeconds()
            let started = ContinuousClock.now
            var sent = 1
            while sent < bytes {
                let piece = min(chunk.count, bytes - sent)
                try await connection.send(chunk[0..<piece])
                sent += piece
            }
            _ = try await connection.receive(exactly: 1)
            let elapsed = ContinuousClock.now - started
            let cpu = cpuSeconds() - cpuBefore
            let metrics = await connection.metrics
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            connection.cancel()
            group.cancelAll()
            let rate = Double(bytes) / seconds / 1e6
            return "\(Int(rate)) MB/s (\(Int(rate * 8)) Mbit/s), \(Int(cpu / seconds * 100)) % CPU of the process; \(metrics)"
        }
    }

    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }

    @Test("A direct path whose keepalives go unanswered is left for the relay under a running QUIC connection")
    func quicFallsBack() async throws {
        var timing = PathTiming()
        timing.keepaliveInterval = .milliseconds(250)
        timing.punchWindow = .seconds(1)
        try await Self.withRelay { [timing] relay in
            let (offer, answer) = try await Self.meet(relay, punching: .allowed, timing: timing)
            _ = await offer.waitForRoute(direct: true, timeout: .seconds(10))
            try await Self.echoQUIC(offer, answer, bytes: 24 << 20) { received in
                // A third through, the answer side stops answering; the rest waits for the fallback.
                if received >= 8 << 20, case .direct = offer.report.route {
                    answer.stopPunching()
                    _ = await offer.waitForRoute(direct: false, timeout: .seconds(20))
                }
            }
            let report = offer.report
            #expect(report.route == .relayed)
            #expect(report.directBytes > 1 << 20)
            #expect(report.relayedBytes > 1 << 20)
            await offer.close()
            await answer.close()
        }
    }

    // MARK: - Helpers

    /// A QUIC echo listener behind the answer side; a connection through the offer side's port
    /// sends `bytes` and reads them back; `progress` hears how many came back so far.
    static func echoQUIC(_ offer: PathAgent, _ answer: PathAgent, bytes: Int, progress: @escaping @Sendable (Int) async -> Void = { _ in }) async throws {
        try await echoThroughAgents(offer, answer, stack: { QUIC().identity(server).tunnelledThroughLoopback() }, client: {
            QUIC().identity(client).peerFingerprint(server.fingerprint).tunnelledThroughLoopback()
        }, bytes: bytes, progress: progress)
    }

    static func echoThroughAgents<Stack: ByteStreamProtocol>(
        _ offer: PathAgent, _ answer: PathAgent, stack: @escaping @Sendable () -> Stack, client: @escaping @Sendable () -> Stack,
        bytes: Int, progress: @escaping @Sendable (Int) async -> Void = { _ in }
    ) async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { stack() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    while true {
                        let chunk: Data
                        do { chunk = try await connection.receive(atLeast: 1, atMost: 1 << 20).content } catch let error as QXferError where error.code == .endOfStream {
                            return
                        }
                        try await connection.send(chunk)
                    }
                }
            }
            let listenerPort = try await listener.port
            answer.serve(.transfer, onLocalPort: listenerPort)
            let port = try await offer.localPort(for: .transfer)
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) { client() }
            let payload = (0..<bytes).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 13) }
            async let sent: Void = {
                for offset in stride(from: 0, to: payload.count, by: 256 << 10) {
                    try await connection.send(payload[offset..<min(offset + (256 << 10), payload.count)])
                }
            }()
            var received = 0
            var matches = true
            while received < payload.count {
                let chunk = try await connection.receive(atLeast: 1, atMost: 1 << 20).content
                matches = matches && Array(chunk) == Array(payload[received..<received + chunk.count])
                received += chunk.count
                await progress(received)
            }
            try await sent
            #expect(matches)
            #expect(received == payload.count)
            connection.cancel()
            group.cancelAll()
        }
    }
}

// MARK: - Plain sockets for the echo services

/// UDP and TCP echo on one port number of 127.0.0.1, on threads of its own.
final class EchoServer: @unchecked Sendable {
    // The descriptors are set once in init; stop() shuts them down from any thread.
    let port: UInt16
    private let udp: Int32
    private let tcp: Int32
    private let strangerCount = Locked(0)
    /// Datagrams that arrived saying "stranger" (a test's forged flows).
    var strangers: Int { strangerCount.withLock { $0 } }

    init() throws {
        let strangerCount = self.strangerCount
        let udpSocket = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        guard bindSocket(udpSocket, &address) else { throw ReachError(.local, "udp bind") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(udpSocket, $0, &length) } }
        let tcpSocket = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(tcpSocket, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bindSocket(tcpSocket, &address), listen(tcpSocket, 16) == 0 else { throw ReachError(.local, "tcp bind") }
        udp = udpSocket
        tcp = tcpSocket
        port = UInt16(bigEndian: address.sin_port)
        Thread {
            var buffer = [UInt8](repeating: 0, count: 65536)
            var peer = sockaddr_storage()
            while true {
                var peerLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
                let count = withUnsafeMutablePointer(to: &peer) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { recvfrom(udpSocket, &buffer, buffer.count, 0, $0, &peerLength) }
                }
                guard count > 0 else { return }
                if buffer[0..<count].starts(with: Array("stranger".utf8)) { strangerCount.withLock { $0 += 1 } }
                _ = withUnsafePointer(to: &peer) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(udpSocket, buffer, count, 0, $0, peerLength) }
                }
            }
        }.start()
        Thread {
            while true {
                let connection = accept(tcpSocket, nil, nil)
                guard connection >= 0 else { return }
                Thread {
                    var buffer = [UInt8](repeating: 0, count: 65536)
                    while true {
                        let count = read(connection, &buffer, buffer.count)
                        guard count > 0 else { break }
                        guard writeAll(connection, buffer[0..<count]) else { break }
                    }
                    close(connection)
                }.start()
            }
        }.start()
    }

    func stop() {
        shutdown(udp, Int32(SHUT_RDWR))
        shutdown(tcp, Int32(SHUT_RDWR))
    }

    deinit {
        close(udp)
        close(tcp)
    }
}

/// A TCP server on 127.0.0.1 that reads a hello, answers `answer`, and waits for the close.
final class FakeRelay: @unchecked Sendable {
    // The descriptor is set once in init; stop() shuts it down from any thread.
    let port: UInt16
    private let listener: Int32

    init(answer: [UInt8]) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        guard bindSocket(fd, &address), listen(fd, 4) == 0 else { throw ReachError(.local, "bind") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        listener = fd
        port = UInt16(bigEndian: address.sin_port)
        Thread {
            let connection = accept(fd, nil, nil)
            guard connection >= 0 else { return }
            var buffer = [UInt8](repeating: 0, count: 4096)
            _ = read(connection, &buffer, buffer.count)
            _ = writeAll(connection, answer[...])
            while read(connection, &buffer, buffer.count) > 0 {}
            close(connection)
        }.start()
    }

    func stop() { shutdown(listener, Int32(SHUT_RDWR)) }
    deinit { close(listener) }
}

private func bindSocket(_ fd: Int32, _ address: inout sockaddr_in) -> Bool {
    withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } } == 0
}

private func writeAll(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
    var offset = bytes.startIndex
    while offset < bytes.endIndex {
        let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard written > 0 else { return false }
        offset += written
    }
    return true
}

private func connectedSocket(_ type: Int32, port: UInt16) throws -> Int32 {
    let fd = socket(AF_INET, type, 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = port.bigEndian
    let result = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard result == 0 else {
        close(fd)
        throw ReachError(.local, "connect: \(errno)")
    }
    var timeout = timeval(tv_sec: 2, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    return fd
}

/// Sends `count` datagrams one at a time, each waiting for its echo (2 s); returns the echoes.
private func udpExchange(port: UInt16, count: Int) throws -> Int {
    let fd = try connectedSocket(Int32(SOCK_DGRAM.rawValue), port: port)
    defer { close(fd) }
    var replies = 0
    var buffer = [UInt8](repeating: 0, count: 2048)
    for index in 0..<count {
        let message = Array("datagram \(index) ".utf8) + [UInt8](repeating: UInt8(index & 0xFF), count: 1000)
        _ = message.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        while true {
            let received = recv(fd, &buffer, buffer.count, 0)
            if received < 0 { break }
            if Array(buffer[0..<received]) == message {
                replies += 1
                break
            }
        }
    }
    return replies
}

/// Writes `bytes` in 64 KiB pieces over TCP, reading each back; true if all came back intact.
private func tcpExchange(port: UInt16, bytes: Int) throws -> Bool {
    let fd = try connectedSocket(Int32(SOCK_STREAM.rawValue), port: port)
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 65536)
    var sent = 0
    while sent < bytes {
        let piece = (0..<min(65536, bytes - sent)).map { UInt8(truncatingIfNeeded: (sent + $0) &* 31) }
        guard writeAll(fd, piece[...]) else { return false }
        var back: [UInt8] = []
        while back.count < piece.count {
            let count = read(fd, &buffer, piece.count - back.count)
            guard count > 0 else { return false }
            back += buffer[0..<count]
        }
        guard back == piece else { return false }
        sent += piece.count
    }
    return true
}

/// Runs blocking socket work on a thread of its own, off the cooperative pool.
private func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}
