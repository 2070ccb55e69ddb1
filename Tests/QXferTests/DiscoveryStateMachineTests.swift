import NIOCore
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// Responders and queriers on a simulated link: virtual time, every message encoded and parsed
/// again, multicast delivered to every machine (the sender included, as IP_MULTICAST_LOOP does).
struct SimulatedLink {
    var now = NIODeadline.uptimeNanoseconds(1_000_000_000)
    var responders: [MDNSResponder] = []
    var queriers: [MDNSQuerier] = []
    /// Every message sent: when, by whom ("r0", "q0"), what.
    var log: [(time: NIODeadline, sender: String, message: DNSMessage)] = []
    var events: [Int: [MDNSResponder.Event]] = [:]

    static func interface(_ host: UInt8) -> MDNSInterface {
        MDNSInterface(index: 1, name: "sim0", ipv4: [[10, 0, 0, host]], ipv6: [])
    }

    static func service(_ name: String = "office", port: UInt16 = 4433) -> DNSSDService {
        DNSSDService(name: name, type: "_qxfer._udp", port: port, txt: ["fp": "3f9a", "txtvers": "1"])
    }

    mutating func addResponder(_ service: DNSSDService, host: UInt8, seed: UInt64, start: Bool = true) -> Int {
        var responder = MDNSResponder(service: service, hostLabel: "host\(host)", interfaces: [Self.interface(host)], random: MDNSRandom(seed: seed))
        if start { responder.start(now: now) }
        responders.append(responder)
        return responders.count - 1
    }

    mutating func addQuerier(host: UInt8) -> Int {
        var querier = MDNSQuerier(serviceType: "_qxfer._udp", interfaces: [Self.interface(host)])
        querier.start(now: now)
        queriers.append(querier)
        return queriers.count - 1
    }

    /// Delivers everything sent until the machines fall quiet at this instant.
    mutating func deliver() {
        while true {
            var sent: [(String, [UInt8], MDNSOutgoing)] = []
            for index in responders.indices {
                sent += responders[index].takeOutgoing().map { ("r\(index)", [10, 0, 0, UInt8(100 + index)], $0) }
                for event in responders[index].takeEvents() { events[index, default: []].append(event) }
            }
            for index in queriers.indices {
                sent += queriers[index].takeOutgoing().map { ("q\(index)", [10, 0, 0, UInt8(200 + index)], $0) }
            }
            if sent.isEmpty { return }
            for (sender, address, outgoing) in sent {
                let message = try! DNSMessage(parsing: outgoing.message.encoded)
                log.append((now, sender, message))
                let source = MDNSSource(interfaceIndex: 1, address: address, port: MDNS.port)
                for index in responders.indices { responders[index].receive(message, from: source, now: now) }
                for index in queriers.indices { queriers[index].receive(message, from: source, now: now) }
            }
        }
    }

    mutating func run(for duration: TimeAmount) {
        let end = now + duration
        while true {
            deliver()
            let next = (responders.compactMap(\.nextDeadline) + queriers.compactMap(\.nextDeadline)).min()
            guard let next, next <= end else {
                now = end
                return
            }
            now = max(now, next)
            for index in responders.indices where (responders[index].nextDeadline ?? end + .seconds(1)) <= now {
                responders[index].tick(now: now)
            }
            for index in queriers.indices where (queriers[index].nextDeadline ?? end + .seconds(1)) <= now {
                queriers[index].tick(now: now)
            }
        }
    }

    mutating func stopResponder(_ index: Int) {
        responders[index].stop(now: now)
        deliver()
    }
}

@Suite("Discovery: responder and querier state machines")
struct DiscoveryStateMachineTests {
    @Test("a responder probes three times 250 ms apart, then announces twice a second apart")
    func probesThenAnnounces() {
        var link = SimulatedLink()
        _ = link.addResponder(SimulatedLink.service(), host: 1, seed: 1)
        link.run(for: .seconds(3))
        let sent = link.log.filter { $0.sender == "r0" }
        #expect(sent.count == 5)
        let probes = sent.prefix(3)
        #expect(probes.allSatisfy { !$0.message.isResponse && !$0.message.authorities.isEmpty })
        #expect(probes.allSatisfy { $0.message.questions.contains { $0.name.firstLabel == "office" && $0.type == .any } })
        #expect(zip(probes.dropFirst(), probes).allSatisfy { $0.time - $1.time == .milliseconds(250) })
        let announcements = sent.suffix(2)
        #expect(announcements.allSatisfy { $0.message.isResponse })
        #expect(announcements.last!.time - announcements.first!.time == .seconds(1))
        let types = Set(announcements.first!.message.answers.map(\.type))
        #expect(types == [.ptr, .srv, .txt, .a])
        #expect(link.events[0] == [.registered(name: "office")])
    }

    @Test("a querier resolves the service; a goodbye removes it about a second later")
    func resolveAndGoodbye() throws {
        var link = SimulatedLink()
        let responder = link.addResponder(SimulatedLink.service(), host: 1, seed: 2)
        let querier = link.addQuerier(host: 2)
        link.run(for: .seconds(3))
        let service = try #require(link.queriers[querier].services.first)
        #expect(link.queriers[querier].services.count == 1)
        #expect(service.name == "office" && service.port == 4433 && service.addresses == ["10.0.0.1"])
        #expect(service.hostName == "host1.local" && service.txt["fp"] == "3f9a")

        link.stopResponder(responder)
        let goodbye = try #require(link.log.last)
        #expect(goodbye.message.isResponse && goodbye.message.answers.allSatisfy { $0.ttl == 0 })
        link.run(for: .milliseconds(500))
        #expect(link.queriers[querier].services.count == 1)  // RFC 6762 10.1: one more second
        link.run(for: .milliseconds(600))
        #expect(link.queriers[querier].services.isEmpty)
    }

    @Test("a query listing the answer as known gets no reply; one without it gets the PTR with SRV, TXT and A")
    func knownAnswerSuppression() throws {
        var link = SimulatedLink()
        _ = link.addResponder(SimulatedLink.service(), host: 1, seed: 3)
        link.run(for: .seconds(5))
        _ = link.responders[0].takeOutgoing()
        let type = DNSName("_qxfer._udp.local")
        let question = DNSQuestion(name: type, type: .ptr)
        let peer = MDNSSource(interfaceIndex: 1, address: [10, 0, 0, 9], port: MDNS.port)
        let ptr = DNSRecord(name: type, ttl: 4500, data: .ptr(type.prepending("office")))

        link.responders[0].receive(.query([question], knownAnswers: [ptr]), from: peer, now: link.now)
        link.responders[0].tick(now: link.now + .milliseconds(200))
        #expect(link.responders[0].takeOutgoing().isEmpty)

        link.now = link.now + .seconds(2)  // past the one-second multicast rate limit
        link.responders[0].receive(.query([question]), from: peer, now: link.now)
        #expect(link.responders[0].takeOutgoing().isEmpty)  // shared answers wait 20-120 ms
        link.responders[0].tick(now: link.now + .milliseconds(120))
        let reply = try #require(link.responders[0].takeOutgoing().first)
        #expect(reply.destination == .multicast)
        #expect(reply.message.answers.map(\.data) == [ptr.data])
        #expect(Set(reply.message.additionals.map(\.type)) == [.srv, .txt, .a])
    }

    @Test("a legacy unicast query (source port not 5353) gets a unicast reply with its id and TTLs of at most 10 s")
    func legacyUnicast() throws {
        var link = SimulatedLink()
        _ = link.addResponder(SimulatedLink.service(), host: 1, seed: 4)
        link.run(for: .seconds(5))
        var query = DNSMessage.query([DNSQuestion(name: DNSName("_qxfer._udp.local"), type: .ptr)])
        query.id = 0x1234
        link.responders[0].receive(query, from: MDNSSource(interfaceIndex: 1, address: [10, 0, 0, 9], port: 40000), now: link.now)
        let reply = try #require(link.responders[0].takeOutgoing().first)
        #expect(reply.destination == .unicast(address: [10, 0, 0, 9], port: 40000))
        #expect(reply.message.id == 0x1234 && reply.message.questions == query.questions)
        #expect((reply.message.answers + reply.message.additionals).allSatisfy { $0.ttl <= 10 && !$0.cacheFlush })
    }

    @Test("two responders starting together with one name end with distinct names", arguments: [(5, 6), (7, 8), (9, 10)])
    func simultaneousConflict(seeds: (UInt64, UInt64)) {
        var link = SimulatedLink()
        _ = link.addResponder(SimulatedLink.service(port: 1000), host: 1, seed: seeds.0)
        _ = link.addResponder(SimulatedLink.service(port: 2000), host: 2, seed: seeds.1)
        let querier = link.addQuerier(host: 3)
        link.run(for: .seconds(10))
        let names = Set(link.responders.map(\.instanceLabel))
        #expect(names == ["office", "office (2)"])
        let found = link.queriers[querier].services
        #expect(Set(found.map(\.name)) == names)
        #expect(Set(found.map(\.port)) == [1000, 2000])
    }

    @Test("a responder arriving after another holds the name renames itself")
    func lateArrivalRenames() {
        var link = SimulatedLink()
        _ = link.addResponder(SimulatedLink.service(port: 1000), host: 1, seed: 11)
        link.run(for: .seconds(5))
        let late = link.addResponder(SimulatedLink.service(port: 2000), host: 2, seed: 12)
        link.run(for: .seconds(5))
        #expect(link.responders[0].instanceLabel == "office")
        #expect(link.responders[late].instanceLabel == "office (2)")
        #expect(link.events[late] == [.renamed(from: "office", to: "office (2)"), .registered(name: "office (2)")])
        #expect(link.events[0] == [.registered(name: "office")])
    }

    @Test("probe tie-break orders record sets by class, type and data")
    func tieBreakOrder() {
        let name = DNSName("x._qxfer._udp.local")
        let host = DNSName("h.local")
        let low = [DNSRecord(name: name, ttl: 120, data: .srv(priority: 0, weight: 0, port: 1000, target: host))]
        let high = [DNSRecord(name: name, ttl: 120, data: .srv(priority: 0, weight: 0, port: 2000, target: host))]
        #expect(MDNSResponder.compare(low, high) < 0)
        #expect(MDNSResponder.compare(high, low) > 0)
        #expect(MDNSResponder.compare(low, low + low) == 0)  // duplicates count once
        #expect(MDNSResponder.compare(low, low + high) < 0)  // a prefix is earlier
    }

    @Test("a flood of answers cannot grow the querier's cache past its limit")
    func cacheBound() {
        var querier = MDNSQuerier(serviceType: "_qxfer._udp", interfaces: [SimulatedLink.interface(1)])
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        querier.start(now: now)
        let type = DNSName("_qxfer._udp.local")
        let source = MDNSSource(interfaceIndex: 1, address: [10, 0, 0, 66], port: MDNS.port)
        for batch in 0..<50 {
            let answers = (0..<100).map { DNSRecord(name: type, ttl: 4500, data: .ptr(type.prepending("spam \(batch)-\($0)"))) }
            querier.receive(.response(answers: answers), from: source, now: now)
        }
        _ = querier.takeOutgoing()
        // Nothing resolved (no SRV), and the cache stopped at its limit rather than 5000 entries.
        #expect(querier.services.isEmpty)
        querier.tick(now: now + .milliseconds(50))
        let queries = querier.takeOutgoing()
        let questions = queries.flatMap(\.message.questions)
        #expect(!questions.isEmpty && questions.count <= MDNSQuerier.pendingQuestionLimit + 1)
        #expect(queries.allSatisfy { $0.message.encoded.count < 1500 })
    }
}
