import NIOCore
@_spi(Stacks) import QXferCore

/// The browsing side of multicast DNS for one DNS-SD service type, as a sans-IO state machine
/// (RFC 6762 section 5, RFC 6763).
///
/// It asks for the type's PTR records with exponential backoff (1 s, 2 s, 4 s … one hour),
/// listing the answers it already holds (known-answer suppression); asks for the SRV, TXT and
/// addresses of instances it cannot resolve yet; keeps a bounded cache with TTLs, honouring
/// cache-flush bits and goodbyes (TTL 0 expires a record one second later); and refreshes
/// records at 80 % and 90 % of their lifetime so live services never expire.
struct MDNSQuerier: MDNSStateMachine {
    let serviceType: DNSName
    let interfaces: [MDNSInterface]

    /// At most this many records are cached: a flood of answers cannot grow memory.
    static let cacheLimit = 2048
    /// At most this many questions wait for the next query; more instances than this to
    /// resolve at once are asked about in later rounds.
    static let pendingQuestionLimit = 64
    /// Questions and known answers per packet, so each stays well under a 1500-byte MTU.
    static let questionsPerPacket = 24
    static let knownAnswersPerPacket = 24

    private struct CachedRecord: Sendable {
        var record: DNSRecord
        var interfaceIndex: Int
        var received: NIODeadline
        var expires: NIODeadline
        /// Refresh queries sent for this record so far (at 80 % and 90 % of its TTL).
        var refreshes: Int
        var lifetime: TimeAmount { .seconds(Int64(record.ttl)) }
        var nextRefresh: NIODeadline? {
            guard record.ttl > 0, refreshes < 2 else { return nil }
            let fraction: Int64 = refreshes == 0 ? 80 : 90
            return received + .nanoseconds(lifetime.nanoseconds / 100 * fraction)
        }
    }

    private struct CacheKey: Hashable, Sendable {
        var interfaceIndex: Int
        var record: RecordIdentity
    }

    private var cache: [CacheKey: CachedRecord] = [:]
    private var nextBrowse: NIODeadline?
    private var browseInterval = TimeAmount.seconds(1)
    private var pendingQuestions: [DNSQuestion] = []
    private var questionsDue: NIODeadline?
    private var lastAsked: [DNSQuestion: NIODeadline] = [:]
    private var outgoing: [MDNSOutgoing] = []
    private var started = false

    /// The resolved instances, sorted by name; recomputed when the cache changes.
    private(set) var services: [DiscoveredService] = []

    init(serviceType: String, domain: String = "local", interfaces: [MDNSInterface]) {
        self.serviceType = DNSName(serviceType + "." + domain)
        self.interfaces = interfaces
    }

    mutating func start(now: NIODeadline) {
        guard !started else { return }
        started = true
        nextBrowse = now
        tick(now: now)
    }

    mutating func stop(now: NIODeadline) {
        nextBrowse = nil
        questionsDue = nil
        pendingQuestions.removeAll()
    }

    mutating func takeOutgoing() -> [MDNSOutgoing] {
        defer { outgoing.removeAll() }
        return outgoing
    }

    var nextDeadline: NIODeadline? {
        var candidates = [nextBrowse, questionsDue].compactMap { $0 }
        if let expiry = cache.values.map(\.expires).min() { candidates.append(expiry) }
        if let refresh = cache.values.compactMap(\.nextRefresh).min() { candidates.append(refresh) }
        return candidates.min()
    }

    // MARK: Inputs

    mutating func receive(_ message: DNSMessage, from source: MDNSSource, now: NIODeadline) {
        guard started, message.isResponse, message.opcode == 0, message.responseCode == 0 else { return }
        let records = (message.answers + message.additionals).filter { $0.recordClass == dnsClassIN }
        // Instance records first, so addresses arriving in the same packet find their SRV.
        let instanceRecords = records.filter { isRelevantInstanceRecord($0) }
        var targets = hostTargets
        for record in instanceRecords {
            if case .srv(_, _, _, let target) = record.data { targets.insert(target) }
        }
        let accepted = instanceRecords + records.filter { ($0.type == .a || $0.type == .aaaa) && targets.contains($0.name) }
        flushSets(named: accepted, from: source, now: now)
        for record in accepted { store(record, from: source, now: now) }
        update(now: now)
    }

    mutating func tick(now: NIODeadline) {
        guard started else { return }
        cache = cache.filter { $0.value.expires > now }
        // Refresh records nearing the end of their life (section 5.2).
        for (key, entry) in cache {
            guard let refresh = entry.nextRefresh, refresh <= now else { continue }
            cache[key]?.refreshes += 1
            enqueue(DNSQuestion(name: entry.record.name, type: entry.record.type), now: now, force: true)
        }
        if let browse = nextBrowse, browse <= now {
            enqueue(DNSQuestion(name: serviceType, type: .ptr), now: now, force: true)
            nextBrowse = now + browseInterval
            browseInterval = min(browseInterval * 2, .hours(1))
        }
        update(now: now)
        if let due = questionsDue, due <= now { sendQuestions(now: now) }
    }

    // MARK: Cache

    private func isRelevantInstanceRecord(_ record: DNSRecord) -> Bool {
        switch record.type {
        case .ptr: record.name == serviceType
        case .srv, .txt: record.name.labels.count == serviceType.labels.count + 1 && record.name.parent == serviceType
        default: false
        }
    }

    private var hostTargets: Set<DNSName> {
        Set(cache.values.compactMap { entry -> DNSName? in
            if case .srv(_, _, _, let target) = entry.record.data { return target }
            return nil
        })
    }

    /// Section 10.2: a record with the cache-flush bit is the whole set of its name and type;
    /// older records of the set (received more than a second ago) go away in one second.
    /// One pass over the cache per packet, however many records the packet holds.
    private mutating func flushSets(named records: [DNSRecord], from source: MDNSSource, now: NIODeadline) {
        struct SetKey: Hashable { var name: DNSName; var type: DNSRecordType }
        var fresh: [SetKey: Set<DNSRecordData>] = [:]
        for record in records where record.cacheFlush && record.ttl > 0 {
            fresh[SetKey(name: record.name, type: record.type), default: []].insert(record.data)
        }
        guard !fresh.isEmpty else { return }
        for (key, entry) in cache where key.interfaceIndex == source.interfaceIndex && now - entry.received > .seconds(1) {
            guard let kept = fresh[SetKey(name: entry.record.name, type: entry.record.type)], !kept.contains(entry.record.data) else { continue }
            cache[key]?.expires = min(entry.expires, now + .seconds(1))
        }
    }

    private mutating func store(_ record: DNSRecord, from source: MDNSSource, now: NIODeadline) {
        let key = CacheKey(interfaceIndex: source.interfaceIndex, record: record.identity)
        if record.ttl == 0 {
            // A goodbye: keep the record one more second (section 10.1) so a late answer
            // from the same host does not make it flicker.
            if let existing = cache[key] { cache[key]?.expires = min(existing.expires, now + .seconds(1)) }
            return
        }
        guard cache[key] != nil || cache.count < Self.cacheLimit else { return }
        cache[key] = CachedRecord(record: record, interfaceIndex: source.interfaceIndex, received: now,
                                  expires: now + .seconds(Int64(record.ttl)), refreshes: 0)
    }

    // MARK: Questions

    /// Adds a question to the next query; questions asked less than a second ago wait unless forced.
    private mutating func enqueue(_ question: DNSQuestion, now: NIODeadline, force: Bool = false) {
        if !force, pendingQuestions.count >= Self.pendingQuestionLimit { return }
        if !force, let asked = lastAsked[question], now - asked < .seconds(1) { return }
        if pendingQuestions.contains(question) { return }
        pendingQuestions.append(question)
        // A short wait gathers the questions one packet raises into one query.
        let due = now + .milliseconds(20)
        questionsDue = min(questionsDue ?? due, due)
    }

    private mutating func sendQuestions(now: NIODeadline) {
        questionsDue = nil
        guard !pendingQuestions.isEmpty else { return }
        let questions = pendingQuestions
        pendingQuestions.removeAll()
        for question in questions { lastAsked[question] = now }
        lastAsked = lastAsked.filter { now - $0.value < .seconds(60) }
        for interface in interfaces {
            for start in stride(from: 0, to: questions.count, by: Self.questionsPerPacket) {
                let batch = Array(questions[start..<min(start + Self.questionsPerPacket, questions.count)])
                // Known answers (section 7.1): records still good for more than half their TTL.
                let known = cache.values.filter { entry in
                    entry.interfaceIndex == interface.index && entry.expires - now > .nanoseconds(entry.lifetime.nanoseconds / 2)
                        && batch.contains { $0.isAnswered(by: entry.record) }
                }.prefix(Self.knownAnswersPerPacket).map { entry in
                    var record = entry.record
                    record.ttl = UInt32(max(0, (entry.expires - now).nanoseconds / 1_000_000_000))
                    return record
                }
                outgoing.append(MDNSOutgoing(interfaceIndex: interface.index, destination: .multicast,
                                             message: .query(batch, knownAnswers: Array(known))))
            }
        }
    }

    /// Recomputes the resolved services and asks for what is missing.
    private mutating func update(now: NIODeadline) {
        var resolved: [DiscoveredService] = []
        var seen = Set<DNSName>()
        let byName = Dictionary(grouping: cache.values, by: \.record.name)
        let instances = (byName[serviceType] ?? []).sorted { $0.received < $1.received }.compactMap { entry -> DNSName? in
            if case .ptr(let instance) = entry.record.data { return instance }
            return nil
        }
        for instance in instances where !seen.contains(instance) {
            seen.insert(instance)
            guard instance.labels.count == serviceType.labels.count + 1, instance.parent == serviceType else { continue }
            let records = byName[instance] ?? []
            let srv = records.filter { $0.record.type == .srv }.max { $0.received < $1.received }
            guard let srv, case .srv(_, _, let port, let target) = srv.record.data else {
                enqueue(DNSQuestion(name: instance, type: .srv), now: now)
                enqueue(DNSQuestion(name: instance, type: .txt), now: now)
                continue
            }
            let txt = records.filter { $0.record.type == .txt }.max { $0.received < $1.received }
            var ipv4: [String] = []
            var ipv6: [String] = []
            for entry in byName[target] ?? [] {
                switch entry.record.data {
                case .a(let bytes):
                    let text = Self.format(bytes, scope: nil)
                    if !ipv4.contains(text) { ipv4.append(text) }
                case .aaaa(let bytes):
                    let linkLocal = bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80
                    let scope = linkLocal ? interfaces.first { $0.index == entry.interfaceIndex }?.name : nil
                    let text = Self.format(bytes, scope: scope)
                    if !ipv6.contains(text) { ipv6.append(text) }
                default:
                    break
                }
            }
            guard !(ipv4.isEmpty && ipv6.isEmpty) else {
                enqueue(DNSQuestion(name: target, type: .a), now: now)
                enqueue(DNSQuestion(name: target, type: .aaaa), now: now)
                continue
            }
            let txtRecord: TXTRecord
            if let txt, case .txt(let strings) = txt.record.data { txtRecord = TXTRecord(strings: strings) } else { txtRecord = TXTRecord() }
            // Global IPv6 before link-local: they need no interface to be reachable.
            ipv6.sort { !$0.contains("%") && $1.contains("%") }
            resolved.append(DiscoveredService(
                name: instance.firstLabel,
                type: serviceType.labels.dropLast().map { String(decoding: $0, as: UTF8.self) }.joined(separator: "."),
                domain: serviceType.labels.last.map { String(decoding: $0, as: UTF8.self) } ?? "local",
                hostName: String(target.description.dropLast()), port: port, addresses: ipv4.sorted() + ipv6, txt: txtRecord))
        }
        resolved.sort { $0.name.lowercased() < $1.name.lowercased() }
        services = resolved
    }

    /// An address as text; link-local IPv6 with its interface (`fe80::1%eth0`).
    static func format(_ bytes: [UInt8], scope: String?) -> String {
        if bytes.count == 4 { return bytes.map(String.init).joined(separator: ".") }
        guard let address = try? SocketAddress(packedIPAddress: ByteBuffer(bytes: bytes), port: 0), let text = address.ipAddress else {
            return ""
        }
        return scope.map { "\(text)%\($0)" } ?? text
    }
}
