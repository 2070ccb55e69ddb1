import FoundationEssentials
import QXferReach
import Testing

/// The relay's room table without sockets, on a clock of the test's own: pairing, the
/// refusals, expiry, the limits, datagrams and splices (docs/PROTOCOL.md §9.2-9.4).
@Suite("Relay room table (sans-IO)")
struct RelayRoomsTests {
    static let start = ContinuousClock.now
    static let roomA = String(repeating: "a", count: 64)
    static let roomB = String(repeating: "b", count: 64)

    /// A room table and the connections a test opened on it, checked after every step.
    struct Table {
        var rooms: RelayRooms
        var now = RelayRoomsTests.start

        init(limits: RelayLimits = .default) {
            rooms = RelayRooms(limits: limits, seed: 7)
        }

        mutating func open(_ address: ClientAddress) throws -> RelayConnectionID {
            guard case .admitted(let id) = rooms.connectionOpened(from: address, now: now) else {
                throw RelayWireError("refused")
            }
            try check()
            return id
        }

        mutating func receive(_ message: RelayMessage, on id: RelayConnectionID) throws -> [RelayAction] {
            let actions = rooms.received(message, on: id, now: now)
            try check()
            return actions
        }

        mutating func close(_ id: RelayConnectionID) throws -> [RelayAction] {
            let actions = rooms.connectionClosed(id, now: now)
            try check()
            return actions
        }

        mutating func advance(_ duration: Duration) throws -> [RelayAction] {
            now += duration
            let actions = rooms.tick(now: now)
            try check()
            return actions
        }

        /// An offer and an answer paired in `room`: their connections and seat tokens.
        mutating func pair(_ room: String = RelayRoomsTests.roomA, offerFrom: ClientAddress = .client(1), answerFrom: ClientAddress = .client(2))
            throws -> (offer: RelayConnectionID, answer: RelayConnectionID, offerToken: Data, answerToken: Data) {
            let offer = try open(offerFrom)
            let offerToken = try #require(RelayRoomsTests.token(in: try receive(.hello(version: 1, room: room, side: .offer), on: offer)))
            let answer = try open(answerFrom)
            let answerToken = try #require(RelayRoomsTests.token(in: try receive(.hello(version: 1, room: room, side: .answer), on: answer)))
            return (offer, answer, offerToken, answerToken)
        }

        func check() throws {
            if let problem = rooms.inconsistency() { throw RelayWireError("inconsistent: \(problem)") }
        }
    }

    static func token(in actions: [RelayAction]) -> Data? {
        for case .send(.welcome(_, let token, _), _) in actions { return token }
        return nil
    }

    static func refusal(in actions: [RelayAction], to id: RelayConnectionID) -> String? {
        for case .send(.refused(let reason), let target) in actions where target == id {
            #expect(actions.contains(.close(id)), "a refusal without a close: \(actions)")
            return reason
        }
        return nil
    }

    @Test("An offer is welcomed with its address and a token; an answer pairs the room, both told")
    func pairing() throws {
        var table = Table()
        let offer = try table.open(.client(1, port: 40_000))
        let welcome = try table.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: offer)
        guard case .send(.welcome(let observed, let token, let expiresIn), offer) = try #require(welcome.first) else {
            Issue.record("no welcome: \(welcome)")
            return
        }
        #expect(observed == "10.0.0.1:40000" && token.count == 16 && expiresIn == 600 && welcome.count == 1)
        let answer = try table.open(.client(2, port: 50_000))
        let actions = try table.receive(.hello(version: 1, room: Self.roomA, side: .answer), on: answer)
        #expect(actions.count == 3)
        guard case .send(.welcome(let answerObserved, let answerToken, 0), answer) = actions[0] else {
            Issue.record("no welcome first: \(actions)")
            return
        }
        #expect(answerObserved == "10.0.0.2:50000" && answerToken != token)
        #expect(actions[1] == .send(.paired, to: answer) && actions[2] == .send(.paired, to: offer))
        #expect(table.rooms.statistics.pairsServed == 1 && table.rooms.statistics.roomsPaired == 1)
    }

    @Test("Refusals: room taken, no such code, code used, another version, a first message that is not hello or splice")
    func refusals() throws {
        var table = Table()
        let (offer, _, _, _) = try table.pair()
        let taker = try table.open(.client(3))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: taker), to: taker) == RelayRefusal.roomTaken)
        let guesser = try table.open(.client(3))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomB, side: .answer), on: guesser), to: guesser) == RelayRefusal.noSuchCode)
        let late = try table.open(.client(4))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomA, side: .answer), on: late), to: late) == RelayRefusal.codeUsed)
        let future = try table.open(.client(4))
        #expect(Self.refusal(in: try table.receive(.hello(version: 2, room: Self.roomB, side: .offer), on: future), to: future) == RelayRefusal.version(2))
        let confused = try table.open(.client(4))
        #expect(Self.refusal(in: try table.receive(.paired, on: confused), to: confused)?.hasPrefix("protocol violation") == true)
        // A second hello on a control connection is a violation too.
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomB, side: .offer), on: offer), to: offer)?.hasPrefix("protocol violation") == true)
        #expect(RelayRefusal.kind(of: RelayRefusal.roomTaken) == .roomTaken && RelayRefusal.kind(of: RelayRefusal.codeUsed) == .codeUsed)
        #expect(table.rooms.statistics.refusals == 6)
        // Refused connections hold nothing once closed.
        for id in [taker, guesser, late, future, confused] { _ = try table.close(id) }
        #expect(table.rooms.statistics.roomsOpen == 1 && table.rooms.statistics.connectionsOpen == 2)
    }

    @Test("An offer that leaves before its answer frees the number; a paired side leaving tells the peer")
    func leaving() throws {
        var table = Table()
        let offer = try table.open(.client(1))
        _ = try table.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: offer)
        #expect(try table.close(offer).isEmpty)
        #expect(table.rooms.statistics.roomsOpen == 0)
        let (again, answer, _, _) = try table.pair()
        #expect(try table.close(answer) == [.send(.peerGone, to: again)])
        #expect(table.rooms.statistics.roomsOpen == 1)
        // The code stays used while the room lives.
        let retry = try table.open(.client(2))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomA, side: .answer), on: retry), to: retry) == RelayRefusal.codeUsed)
    }

    @Test("Signals go to the peer in order, only once paired, at most 64 per side")
    func signals() throws {
        var table = Table()
        let offer = try table.open(.client(1))
        _ = try table.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: offer)
        #expect(Self.refusal(in: try table.receive(.signal(data: Data([1])), on: offer), to: offer)?.hasPrefix("protocol violation") == true)

        var paired = Table()
        let (first, second, _, _) = try paired.pair()
        for index in 0..<64 {
            let data = Data([UInt8(index)])
            #expect(try paired.receive(.signal(data: data), on: first) == [.send(.signal(data: data), to: second)])
        }
        #expect(Self.refusal(in: try paired.receive(.signal(data: Data()), on: first), to: first) == RelayRefusal.tooManySignals(64))
        // The other side still has its own 64.
        #expect(try paired.receive(.signal(data: Data([9])), on: second) == [.send(.signal(data: Data([9])), to: first)])
    }

    @Test("Expiry on a fake clock: an unpaired room at 600 s, a silent connection at 10 s, a paired room 60 s after its last traffic with no control connection")
    func expiry() throws {
        var table = Table()
        let offer = try table.open(.client(1))
        _ = try table.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: offer)
        let silent = try table.open(.client(5))
        #expect(try table.advance(.seconds(9)).isEmpty)
        #expect(Self.refusal(in: try table.advance(.seconds(1)), to: silent) == RelayRefusal.silent(.seconds(10)))
        _ = try table.close(silent)
        #expect(try table.advance(.seconds(589)).isEmpty)
        #expect(Self.refusal(in: try table.advance(.seconds(1)), to: offer) == RelayRefusal.expired(after: .seconds(600)))
        _ = try table.close(offer)
        #expect(table.rooms.statistics.roomsOpen == 0)

        // Paired: lives while a control connection is open, however long.
        let (first, second, firstToken, secondToken) = try table.pair(Self.roomB)
        #expect(try table.advance(.seconds(3600)).isEmpty)
        _ = try table.close(first)
        _ = try table.close(second)
        // Then as long as datagrams flow.
        let firstBound = table.rooms.bind(token: Array(firstToken), from: .client(1, port: 9), now: table.now)
        let secondBound = table.rooms.bind(token: Array(secondToken), from: .client(2, port: 9), now: table.now)
        #expect(firstBound && secondBound)
        for _ in 0..<3 {
            #expect(try table.advance(.seconds(50)).isEmpty)
            #expect(table.rooms.forwardingTarget(from: .client(1, port: 9), byteCount: 100, now: table.now) == .client(2, port: 9))
        }
        #expect(try table.advance(.seconds(59)).isEmpty && table.rooms.statistics.roomsOpen == 1)
        _ = try table.advance(.seconds(1))
        #expect(table.rooms.statistics.roomsOpen == 0)
        #expect(table.rooms.forwardingTarget(from: .client(1, port: 9), byteCount: 100, now: table.now) == nil)
    }

    @Test("Limits: 8 rooms per address (an IPv6 /64 counts as one), a global room cap, pending connections per address")
    func limits() throws {
        var table = Table()
        for index in 0..<8 {
            let id = try table.open(.client(1))
            let room = String(repeating: "0", count: 63) + String(index)
            #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: room, side: .offer), on: id), to: id) == nil)
        }
        let ninth = try table.open(.client(1))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: ninth), to: ninth) == RelayRefusal.tooManyRooms(8))
        // An answer from that address to someone else's room is refused too; the address's own
        // rooms it may still answer (both sides behind one NAT count the room once).
        let other = try table.open(.client(2))
        _ = try table.receive(.hello(version: 1, room: Self.roomB, side: .offer), on: other)
        let answer = try table.open(.client(1))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: Self.roomB, side: .answer), on: answer), to: answer) == RelayRefusal.tooManyRooms(8))
        let own = try table.open(.client(1))
        #expect(Self.refusal(in: try table.receive(.hello(version: 1, room: String(repeating: "0", count: 64), side: .answer), on: own), to: own) == nil)

        var sixes = Table()
        for index in 0..<8 {
            let id = try sixes.open(.ipv6(low: UInt64(index)))
            _ = try sixes.receive(.hello(version: 1, room: String(repeating: "0", count: 63) + String(index), side: .offer), on: id)
        }
        let sameNetwork = try sixes.open(.ipv6(low: 99))
        #expect(Self.refusal(in: try sixes.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: sameNetwork), to: sameNetwork) == RelayRefusal.tooManyRooms(8))

        var small = RelayLimits()
        small.maximumRooms = 2
        small.maximumPendingConnectionsPerAddress = 3
        var full = Table(limits: small)
        for index in 0..<2 {
            let id = try full.open(.client(UInt32(10 + index)))
            _ = try full.receive(.hello(version: 1, room: String(repeating: "0", count: 63) + String(index), side: .offer), on: id)
        }
        let third = try full.open(.client(20))
        #expect(Self.refusal(in: try full.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: third), to: third) == RelayRefusal.full)
        for _ in 0..<3 { _ = try full.open(.client(30)) }
        #expect(full.rooms.connectionOpened(from: .client(30), now: full.now) == .refused(reason: RelayRefusal.tooManyConnections))
        #expect(full.rooms.connectionOpened(from: .client(31), now: full.now) != .refused(reason: RelayRefusal.tooManyConnections))
    }

    @Test("Datagrams: bind answers bound, data goes from a bound seat to its bound peer only, a new bind moves the seat")
    func datagrams() throws {
        var table = Table()
        let (_, _, offerToken, answerToken) = try table.pair()
        let offerUDP = ClientAddress.client(1, port: 7000)
        let answerUDP = ClientAddress.client(2, port: 8000)
        let data: ArraySlice<UInt8> = [RelayDatagram.dataType, 1, 2, 3]
        #expect(table.rooms.datagram([RelayDatagram.bindType] + Array(repeating: 0, count: 16), from: offerUDP, now: table.now) == .drop)
        #expect(table.rooms.datagram(data, from: offerUDP, now: table.now) == .drop)
        let bound = table.rooms.datagram([RelayDatagram.bindType] + Array(offerToken)[...], from: offerUDP, now: table.now)
        #expect(bound == .reply(RelayDatagram.bound(offerUDP.datagramAddress).encoded))
        // The peer is not bound yet.
        #expect(table.rooms.datagram(data, from: offerUDP, now: table.now) == .drop)
        _ = table.rooms.datagram([RelayDatagram.bindType] + Array(answerToken)[...], from: answerUDP, now: table.now)
        #expect(table.rooms.datagram(data, from: offerUDP, now: table.now) == .forward(to: answerUDP))
        #expect(table.rooms.datagram(data, from: answerUDP, now: table.now) == .forward(to: offerUDP))
        #expect(table.rooms.datagram(data, from: .client(9), now: table.now) == .drop)
        // The offer's NAT gave it a new port: the old one no longer speaks for the seat.
        let moved = ClientAddress.client(1, port: 7001)
        _ = table.rooms.datagram([RelayDatagram.bindType] + Array(offerToken)[...], from: moved, now: table.now)
        #expect(table.rooms.datagram(data, from: offerUDP, now: table.now) == .drop)
        #expect(table.rooms.datagram(data, from: answerUDP, now: table.now) == .forward(to: moved))
        try table.check()
        let statistics = table.rooms.statistics
        #expect(statistics.datagramsRelayed == 3 && statistics.bytesRelayedOverUDP == 12 && statistics.datagramsDropped == 5)
    }

    @Test("Splices: matched by (room, id); a duplicate, a 17th, an unknown token, an unpaired room refused; an unmatched one ends after 10 s")
    func splices() throws {
        var table = Table()
        let (_, _, offerToken, answerToken) = try table.pair()
        let first = try table.open(.client(1))
        #expect(try table.receive(.splice(bindToken: offerToken, id: 5), on: first).isEmpty)
        let duplicate = try table.open(.client(1))
        #expect(Self.refusal(in: try table.receive(.splice(bindToken: offerToken, id: 5), on: duplicate), to: duplicate) == RelayRefusal.spliceInUse(5))
        let second = try table.open(.client(2))
        #expect(try table.receive(.splice(bindToken: answerToken, id: 5), on: second)
            == [.send(.spliced, to: first), .send(.spliced, to: second), .splice(first, second)])
        #expect(table.rooms.spliceRelayed(1000, on: first, now: table.now) == nil)
        #expect(table.rooms.statistics.bytesRelayedOverTCP == 1000 && table.rooms.statistics.splicesServed == 1)
        let third = try table.open(.client(2))
        #expect(Self.refusal(in: try table.receive(.splice(bindToken: answerToken, id: 5), on: third), to: third) == RelayRefusal.spliceInUse(5))
        for id in 6..<21 {
            let connection = try table.open(.client(1))
            #expect(try table.receive(.splice(bindToken: offerToken, id: id), on: connection).isEmpty)
        }
        let seventeenth = try table.open(.client(1))
        #expect(Self.refusal(in: try table.receive(.splice(bindToken: offerToken, id: 99), on: seventeenth), to: seventeenth) == RelayRefusal.tooManySplices(16))
        let stranger = try table.open(.client(7))
        #expect(Self.refusal(in: try table.receive(.splice(bindToken: Data(count: 16), id: 1), on: stranger), to: stranger) == RelayRefusal.noSuchSeat)
        let unmatched = try table.advance(.seconds(10))
        #expect(unmatched.filter { if case .close = $0 { true } else { false } }.count == 15)
        #expect(unmatched.contains(.send(.refused(reason: RelayRefusal.spliceUnmatched(6, .seconds(10))), to: RelayConnectionID(first.value + 4))))

        var waiting = Table()
        let offer = try waiting.open(.client(1))
        let token = try #require(Self.token(in: try waiting.receive(.hello(version: 1, room: Self.roomA, side: .offer), on: offer)))
        let early = try waiting.open(.client(1))
        #expect(Self.refusal(in: try waiting.receive(.splice(bindToken: token, id: 1), on: early), to: early) == RelayRefusal.notPaired)
    }

    @Test("The byte allowance: datagrams over it are dropped, a splice is told to wait, both refill with time")
    func allowance() throws {
        var limits = RelayLimits()
        limits.allowance = RelayAllowance(burst: 100_000, bytesPerSecond: 10_000)
        var table = Table(limits: limits.sanitized)
        let (offer, answer, offerToken, answerToken) = try table.pair()
        let offerUDP = ClientAddress.client(1, port: 7000)
        let offerBound = table.rooms.bind(token: Array(offerToken), from: offerUDP, now: table.now)
        let answerBound = table.rooms.bind(token: Array(answerToken), from: .client(2, port: 8000), now: table.now)
        #expect(offerBound && answerBound)
        var forwarded = 0
        for _ in 0..<200 where table.rooms.forwardingTarget(from: offerUDP, byteCount: 1000, now: table.now) != nil { forwarded += 1 }
        #expect(forwarded == 100)
        _ = try table.advance(.seconds(1))
        forwarded = 0
        for _ in 0..<200 where table.rooms.forwardingTarget(from: offerUDP, byteCount: 1000, now: table.now) != nil { forwarded += 1 }
        #expect(forwarded == 10)
        // The other address has its own allowance.
        #expect(table.rooms.forwardingTarget(from: .client(2, port: 8000), byteCount: 1000, now: table.now) == offerUDP)

        let first = try table.open(.client(3))
        _ = try table.receive(.splice(bindToken: answerToken, id: 1), on: first)
        let second = try table.open(.client(1))
        _ = try table.receive(.splice(bindToken: offerToken, id: 1), on: second)
        #expect(table.rooms.spliceRelayed(60_000, on: first, now: table.now) == nil)
        let overdrawn = table.rooms.spliceRelayed(60_000, on: first, now: table.now)
        let wait = try #require(overdrawn)
        // 20 000 bytes overdrawn at 10 000 a second.
        #expect(wait >= .seconds(2) && wait < .seconds(2.1))
        _ = (offer, answer)
    }

    @Test("Decoded garbage and stray messages never break the tables")
    func hostileSequences() throws {
        var table = Table()
        var generator = SplitMix(seed: 42)
        var open: [RelayConnectionID] = []
        for _ in 0..<5000 {
            let choice = generator.next() % 10
            let address = ClientAddress.client(UInt32(generator.next() % 4), port: UInt16(truncatingIfNeeded: generator.next() % 3))
            switch choice {
            case 0:
                if case .admitted(let id) = table.rooms.connectionOpened(from: address, now: table.now) { open.append(id) }
            case 1 where !open.isEmpty:
                let id = open.remove(at: Int(generator.next() % UInt64(open.count)))
                _ = try table.close(id)
            case 2:
                _ = try table.advance(.seconds(Double(generator.next() % 700)))
            case 3:
                var bytes: [UInt8] = [UInt8(generator.next() % 4)]
                for _ in 0..<(generator.next() % 20) { bytes.append(UInt8(truncatingIfNeeded: generator.next())) }
                _ = table.rooms.datagram(bytes[...], from: address, now: table.now)
                try table.check()
            default:
                guard !open.isEmpty else { continue }
                let id = open[Int(generator.next() % UInt64(open.count))]
                let room = [Self.roomA, Self.roomB][Int(generator.next() % 2)]
                let messages: [RelayMessage] = [
                    .hello(version: 1, room: room, side: generator.next() % 2 == 0 ? .offer : .answer),
                    .signal(data: Data([1, 2])), .splice(bindToken: Data(count: 16), id: Int(generator.next() % 3)),
                    .paired, .spliced, .peerGone,
                ]
                _ = try table.receive(messages[Int(generator.next() % UInt64(messages.count))], on: id)
            }
        }
    }
}

extension ClientAddress {
    /// 10.0.0.n.
    static func client(_ host: UInt32, port: UInt16 = 1000) -> ClientAddress {
        ClientAddress(ipv4: 0x0A00_0000 | host, port: port)
    }

    /// 2001:db8::n, all in one /64.
    static func ipv6(low: UInt64, port: UInt16 = 1000) -> ClientAddress {
        ClientAddress(ipv6High: 0x2001_0DB8_0000_0000, low: low, port: port)
    }
}

/// A small seeded generator, so a failing sequence repeats.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE5_E4B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
