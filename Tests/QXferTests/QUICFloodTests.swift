import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS
import QUICEngine

/// What a flood may cost a QUIC listener, checked without sockets or a clock: the kernel filter's
/// verdicts (run here by a small interpreter of the instructions it uses) and the per-source
/// budgets at fixed instants. The listener under real datagrams is QUICHostileTests; the rate
/// under a flood, beside an unflooded one, is Tests/e2e/faults.sh §5.
@Suite("QUIC listener under a flood: kernel filter and per-source budgets")
struct QUICFloodTests {
    static let prefix: [UInt8] = [0x5a, 0xc3]
    static let program = QUICSocketFilter.program(
        connectionIDLength: 16, prefix: prefix, versions: QUICVersionNegotiation.supportedVersions)

    /// Whether the program keeps a datagram with this UDP payload.
    static func keeps(_ payload: [UInt8]) -> Bool {
        ClassicBPF.run(program, on: [UInt8](repeating: 0, count: 8) + payload) != 0
    }

    /// The verdict the filter's documentation promises, written out directly.
    static func shouldKeep(_ payload: [UInt8]) -> Bool {
        guard let first = payload.first else { return false }
        if first & 0x80 == 0 { return payload.count >= 17 && payload[1...].starts(with: prefix) }
        guard payload.count >= 5 else { return false }
        let version = payload[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        return QUICVersionNegotiation.supportedVersions.contains(version) || payload.count >= 1200
    }

    @Test("The filter keeps Initials, Version Negotiation candidates and short headers to this listener's IDs")
    func filterKeepsWhatTheListenerAnswers() {
        var random = SplitMix64(seed: 17)
        let initial = QUICHostileTests.longHeader(version: 1, dcid: random.bytes(8), scid: random.bytes(8), totalLength: 1200, &random)
        #expect(Self.keeps(initial))
        #expect(Self.keeps(Array(initial.prefix(60))), "a Handshake-sized packet of v1: routed by the handler")
        let unknownVersion = QUICHostileTests.longHeader(version: 0xbaba_baba, dcid: [1], scid: [2], totalLength: 1200, &random)
        #expect(Self.keeps(unknownVersion), "answered with Version Negotiation")
        #expect(!Self.keeps(Array(unknownVersion.prefix(1199))), "too small for Version Negotiation")
        let ours: [UInt8] = [0x41] + Self.prefix + random.bytes(40)
        #expect(Self.keeps(ours))
        #expect(Self.keeps([0x01] + Self.prefix + random.bytes(40)), "fixed bit clear: peers grease it (RFC 9287)")
        #expect(!Self.keeps([0x41, 0x5a, 0xc4] + random.bytes(40)), "another prefix")
        #expect(!Self.keeps(Array(ours.prefix(16))), "shorter than a connection ID")
        #expect(!Self.keeps([]))
    }

    @Test("The filter drops 9 in 10 random datagrams, and agrees with its specification on every one")
    func filterOnRandomDatagrams() async {
        let (kept, disagreements) = await offThePool {
            var random = SplitMix64(seed: 0xf100d)
            var kept = 0
            var disagreements: [[UInt8]] = []
            for _ in 0..<20_000 {
                let datagram = random.bytes(1 + Int(random.next() % 1400))  // faults.sh §5's flood
                let verdict = Self.keeps(datagram)
                if verdict != Self.shouldKeep(datagram) { disagreements.append(Array(datagram.prefix(24))) }
                if verdict { kept += 1 }
            }
            return (kept, disagreements)
        }
        #expect(disagreements.isEmpty, "the filter and its specification disagree on \(disagreements.count), first: \(disagreements.prefix(3))")
        // Long headers of unknown versions of at least 1200 bytes (about 7 %) may be answered.
        #expect(kept < 2_000, "kept \(kept) of 20 000")
    }

    @Test("A listener's connection-ID prefix is two bytes fixed by its reset secret")
    func prefixFollowsTheSecret() {
        let secret = [UInt8](repeating: 7, count: 32)
        let prefix = QUICStackConfiguration.connectionIDPrefix(resetSecret: secret)
        #expect(prefix.count == 2)
        #expect(prefix == QUICStackConfiguration.connectionIDPrefix(resetSecret: secret), "a restarted receiver keeps it")
        let others = (0..<8).map { QUICStackConfiguration.connectionIDPrefix(resetSecret: [UInt8](repeating: UInt8($0), count: 32)) }
        #expect(Set(others.map { $0.description }).count > 1)
    }

    static func address(_ text: String, port: UInt16 = 4433) -> QUICSocketAddress { QUICSocketAddress(ipAddress: text, port: port)! }
    static let instant = QUICTime(nanoseconds: 5_000_000_000)

    @Test("One source gets its burst and then its rate; another source keeps its own budget")
    func perSourceBudget() {
        var budgets = SourceBudgets(perSecond: 100, burst: 20)
        let flooder = Self.address("192.0.2.7"), other = Self.address("198.51.100.9")
        let granted = (0..<10_000).filter { budgets.spend(Self.address("192.0.2.7", port: UInt16($0 % 60_000)), now: Self.instant) }
        #expect(granted.count == 20, "any port of one address is one source")
        let tooEarly = budgets.spend(flooder, now: Self.instant.advanced(by: .milliseconds(9)))
        let refilled = budgets.spend(flooder, now: Self.instant.advanced(by: .milliseconds(10)))
        let spentAgain = budgets.spend(flooder, now: Self.instant.advanced(by: .milliseconds(10)))
        #expect(!tooEarly && refilled && !spentAgain, "one token per 1/100 s")
        let otherGranted = (0..<20).filter { _ in budgets.spend(other, now: Self.instant) }.count
        #expect(otherGranted == 20, "the flood spent nothing of another source's budget")
        let afterAnHour = Self.instant.advanced(by: .seconds(3600))
        let afterIdle = (0..<30).filter { _ in budgets.spend(flooder, now: afterAnHour) }.count
        #expect(afterIdle == 20, "idle credit stops at the burst")
    }

    @Test("IPv4 and its IPv6-mapped form are one source, and so is an IPv6 /64")
    func sourceKeys() {
        #expect(SourceBudgets.Source(Self.address("203.0.113.5")) == SourceBudgets.Source(Self.address("::ffff:203.0.113.5")))
        #expect(SourceBudgets.Source(Self.address("203.0.113.5")) != SourceBudgets.Source(Self.address("203.0.113.6")))
        #expect(SourceBudgets.Source(Self.address("2001:db8:1:2::1")) == SourceBudgets.Source(Self.address("2001:db8:1:2:ffff::9")))
        #expect(SourceBudgets.Source(Self.address("2001:db8:1:2::1")) != SourceBudgets.Source(Self.address("2001:db8:1:3::1")))
        #expect(SourceBudgets.Source(Self.address("::ffff:0:1")) != SourceBudgets.Source(Self.address("::1")))
    }

    @Test("A source that lands in a flooder's slot takes it over: a collision never locks it out")
    func collisionTakesOver() {
        var budgets = SourceBudgets(perSecond: 1, burst: 3, slotCount: 1)
        let flooder = Self.address("192.0.2.7"), newcomer = Self.address("2001:db8::1")
        let flooderGranted = (0..<100).filter { _ in budgets.spend(flooder, now: Self.instant) }.count
        let newcomerGranted = (0..<2).filter { _ in budgets.spend(newcomer, now: Self.instant) }.count
        #expect(flooderGranted == 3 && newcomerGranted == 2)
    }

    @Test("The listener-wide budget's look-ahead spends nothing")
    func answerBudgetLookAhead() {
        var budget = QUICSocketHandler.AnswerBudget(perSecond: 2)
        let looks = (0..<10).filter { _ in budget.hasRoom(now: Self.instant) }.count
        let spent = (0..<10).filter { _ in budget.spend(now: Self.instant) }.count
        let roomLeft = budget.hasRoom(now: Self.instant)
        #expect(looks == 10 && spent == 2 && !roomLeft)
    }
}

/// The classic BPF instructions QUICSocketFilter uses, run as the kernel runs them on a UDP
/// socket's datagram (UDP header first): loads past the end return 0, i.e. drop.
enum ClassicBPF {
    static func run(_ program: [QUICSocketFilter.Instruction], on packet: [UInt8]) -> UInt32 {
        var accumulator: UInt32 = 0
        var pc = 0
        while pc < program.count {
            let instruction = program[pc]
            pc += 1
            func jump(_ condition: Bool) { pc += Int(condition ? instruction.jumpIfTrue : instruction.jumpIfFalse) }
            switch instruction.code {
            case QUICSocketFilter.loadByte:
                guard Int(instruction.k) < packet.count else { return 0 }
                accumulator = UInt32(packet[Int(instruction.k)])
            case QUICSocketFilter.loadWord:
                guard Int(instruction.k) + 4 <= packet.count else { return 0 }
                accumulator = packet[Int(instruction.k)..<Int(instruction.k + 4)].reduce(0) { $0 << 8 | UInt32($1) }
            case QUICSocketFilter.loadLength: accumulator = UInt32(packet.count)
            case QUICSocketFilter.jumpIfEqual: jump(accumulator == instruction.k)
            case QUICSocketFilter.jumpIfAtLeast: jump(accumulator >= instruction.k)
            case QUICSocketFilter.jumpIfAnyBit: jump(accumulator & instruction.k != 0)
            case QUICSocketFilter.returnValue: return instruction.k
            default:
                Issue.record("an instruction the interpreter does not know: \(instruction)")
                return 0
            }
        }
        Issue.record("the program ran off its end")
        return 0
    }
}
