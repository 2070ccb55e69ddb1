import NIOCore
@_spi(Stacks) import QXferCore

/// The advertising side of multicast DNS for one DNS-SD service, as a sans-IO state machine
/// (RFC 6762 sections 6-10, RFC 6763).
///
/// It probes its unique names three times 250 ms apart (after a random 0-250 ms wait), renames
/// on a conflict ("name (2)", host "host-2"), defers for a second when it loses a simultaneous
/// probe tie-break, announces twice one second apart, then answers queries: unique records at
/// once, shared ones after 20-120 ms, suppressing answers the asker already knows and records
/// multicast on the link less than a second ago. ``stop(now:)`` says goodbye (TTL 0).
struct MDNSResponder: MDNSStateMachine {
    enum Phase: Hashable, Sendable {
        case idle
        /// `sent` probes are out; the next step is at ``nextStep``.
        case probing(sent: Int)
        case announcing(sent: Int)
        case established
        case stopped
    }

    /// Something the owner may want to hear.
    enum Event: Hashable, Sendable {
        /// The service is established under this instance name (after any renaming).
        case registered(name: String)
        /// A conflict moved the service to a new instance name or host name.
        case renamed(from: String, to: String)
    }

    private(set) var phase = Phase.idle
    private(set) var instanceLabel: String
    private(set) var hostLabel: String
    private let baseInstanceLabel: String
    private let baseHostLabel: String
    private var instanceSuffix = 1
    private var hostSuffix = 1
    let service: DNSSDService
    let interfaces: [MDNSInterface]
    private let domain: DNSName
    private let serviceType: DNSName

    private var nextStep: NIODeadline?
    private var pending: [PendingResponse] = []
    private var lastMulticast: [Int: [RecordIdentity: NIODeadline]] = [:]
    /// What was announced on each interface and must be withdrawn by a goodbye.
    private var announced: [Int: [DNSRecord]] = [:]
    private var recentConflicts: [NIODeadline] = []
    private var outgoing: [MDNSOutgoing] = []
    private var events: [Event] = []
    private var random: MDNSRandom

    private struct PendingResponse: Sendable {
        var interfaceIndex: Int
        var deadline: NIODeadline
        var answers: [DNSRecord]
    }

    init(service: DNSSDService, hostLabel: String, interfaces: [MDNSInterface], random: MDNSRandom = MDNSRandom()) {
        self.service = service
        baseInstanceLabel = String(decoding: Array(service.name.utf8.prefix(DNSName.maximumLabelLength)), as: UTF8.self)
        instanceLabel = baseInstanceLabel
        baseHostLabel = hostLabel
        self.hostLabel = hostLabel
        self.interfaces = interfaces
        domain = DNSName(service.domain)
        serviceType = DNSName(service.type + "." + service.domain)
        self.random = random
    }

    // MARK: Names and records

    var instanceName: DNSName { serviceType.prepending(instanceLabel) }
    var hostName: DNSName { domain.prepending(hostLabel) }

    /// Every record published on `interface`: shared PTRs, then the unique SRV, TXT and addresses.
    func records(on interface: MDNSInterface) -> [DNSRecord] {
        [
            DNSRecord(name: serviceType, ttl: MDNS.otherRecordTTL, data: .ptr(instanceName)),
            DNSRecord(name: MDNS.enumerationName(domain: domain), ttl: MDNS.otherRecordTTL, data: .ptr(serviceType)),
        ] + uniqueRecords(on: interface)
    }

    /// The records only this responder may hold: the ones it probes for.
    func uniqueRecords(on interface: MDNSInterface) -> [DNSRecord] {
        let strings = service.txt.strings
        var records = [
            DNSRecord(name: instanceName, cacheFlush: true, ttl: MDNS.hostRecordTTL,
                      data: .srv(priority: 0, weight: 0, port: service.port, target: hostName)),
            DNSRecord(name: instanceName, cacheFlush: true, ttl: MDNS.otherRecordTTL, data: .txt(strings.isEmpty ? [[]] : strings)),
        ]
        records += interface.ipv4.map { DNSRecord(name: hostName, cacheFlush: true, ttl: MDNS.hostRecordTTL, data: .a($0)) }
        records += interface.ipv6.map { DNSRecord(name: hostName, cacheFlush: true, ttl: MDNS.hostRecordTTL, data: .aaaa($0)) }
        return records
    }

    private func interface(_ index: Int) -> MDNSInterface? { interfaces.first { $0.index == index } }

    // MARK: Inputs

    mutating func start(now: NIODeadline) {
        guard phase == .idle else { return }
        phase = .probing(sent: 0)
        // RFC 6762 section 8.1: a random 0-250 ms wait keeps hosts that boot together apart.
        nextStep = now + random.milliseconds(0...250)
    }

    mutating func tick(now: NIODeadline) {
        if let step = nextStep, step <= now { advance(now: now) }
        flushPending(now: now)
    }

    mutating func stop(now: NIODeadline) {
        guard phase != .stopped else { return }
        sayGoodbye()
        phase = .stopped
        nextStep = nil
        pending.removeAll()
    }

    mutating func receive(_ message: DNSMessage, from source: MDNSSource, now: NIODeadline) {
        guard phase != .stopped, phase != .idle, message.opcode == 0, message.responseCode == 0 else { return }
        if message.isResponse {
            detectConflicts(in: message.answers + message.additionals, now: now)
        } else {
            if !message.authorities.isEmpty { resolveSimultaneousProbe(message, now: now) }
            answer(message, from: source, now: now)
        }
    }

    mutating func takeOutgoing() -> [MDNSOutgoing] {
        defer { outgoing.removeAll() }
        return outgoing
    }

    /// The events since the last call, in order.
    mutating func takeEvents() -> [Event] {
        defer { events.removeAll() }
        return events
    }

    var nextDeadline: NIODeadline? {
        let pendingDeadline = pending.map(\.deadline).min()
        switch (nextStep, pendingDeadline) {
        case (let step?, let response?): return min(step, response)
        case (let step?, nil): return step
        case (nil, let response): return response
        }
    }

    // MARK: Probing and announcing

    private mutating func advance(now: NIODeadline) {
        switch phase {
        case .probing(let sent) where sent < 3:
            for interface in interfaces { sendProbe(on: interface) }
            phase = .probing(sent: sent + 1)
            nextStep = now + .milliseconds(250)
        case .probing:
            // Three probes and 250 ms without an objection: the names are ours.
            phase = .announcing(sent: 0)
            advance(now: now)
        case .announcing(let sent):
            for interface in interfaces {
                let records = records(on: interface)
                send(.response(answers: records), on: interface.index)
                announced[interface.index] = records
                noteMulticast(records, on: interface.index, now: now)
            }
            if sent == 0 { events.append(.registered(name: instanceLabel)) }
            if sent + 1 < 2 {
                phase = .announcing(sent: sent + 1)
                nextStep = now + .seconds(1)
            } else {
                phase = .established
                nextStep = nil
            }
        case .idle, .established, .stopped:
            nextStep = nil
        }
    }

    private mutating func sendProbe(on interface: MDNSInterface) {
        let questions = [instanceName, hostName].map { DNSQuestion(name: $0, type: .any) }
        send(.query(questions, authorities: uniqueRecords(on: interface)), on: interface.index)
    }

    private mutating func sayGoodbye() {
        for (index, records) in announced.sorted(by: { $0.key < $1.key }) where !records.isEmpty {
            send(.response(answers: records.map { var record = $0; record.ttl = 0; return record }), on: index)
        }
        announced.removeAll()
    }

    private mutating func send(_ message: DNSMessage, on interfaceIndex: Int, to destination: MDNSOutgoing.Destination = .multicast) {
        outgoing.append(MDNSOutgoing(interfaceIndex: interfaceIndex, destination: destination, message: message))
    }

    // MARK: Conflicts

    /// RFC 6762 section 9: a response holding a record with one of our unique names and types
    /// but data we do not have means someone else uses the name.
    private mutating func detectConflicts(in records: [DNSRecord], now: NIODeadline) {
        var instanceConflict = false
        var hostConflict = false
        let ours = interfaces.flatMap { uniqueRecords(on: $0) }
        for record in records where record.ttl > 0 && record.recordClass == dnsClassIN {
            let isInstance = record.name == instanceName && (record.type == .srv || record.type == .txt)
            let isHost = record.name == hostName && (record.type == .a || record.type == .aaaa)
            guard isInstance || isHost else { continue }
            let consistent = ours.contains { $0.name == record.name && $0.data == record.data }
            if consistent { continue }
            if isInstance { instanceConflict = true } else { hostConflict = true }
        }
        guard instanceConflict || hostConflict else { return }
        if phase == .established {
            // Section 9: an established name is probed again first; if the other host still
            // answers, that probe finds the conflict and renames.
            restartProbing(after: .zero, now: now)
            return
        }
        rename(instance: instanceConflict, host: hostConflict, now: now)
    }

    private mutating func rename(instance: Bool, host: Bool, now: NIODeadline) {
        let oldName = instanceLabel
        if instance {
            instanceSuffix += 1
            let suffix = " (\(instanceSuffix))"
            // Keep the label within 63 bytes, cutting the base on a character boundary.
            var base = baseInstanceLabel
            while base.utf8.count + suffix.utf8.count > DNSName.maximumLabelLength { base.removeLast() }
            instanceLabel = base + suffix
        }
        if host {
            hostSuffix += 1
            hostLabel = "\(baseHostLabel)-\(hostSuffix)"
        }
        sayGoodbye()
        if instance { events.append(.renamed(from: oldName, to: instanceLabel)) }
        // Section 8.1: after fifteen conflicts in ten seconds, wait five seconds between attempts.
        recentConflicts = recentConflicts.filter { now - $0 < .seconds(10) } + [now]
        restartProbing(after: recentConflicts.count > 15 ? .seconds(5) : .zero, now: now)
    }

    private mutating func restartProbing(after delay: TimeAmount, now: NIODeadline) {
        phase = .probing(sent: 0)
        nextStep = now + delay
        pending.removeAll()
    }

    /// RFC 6762 section 8.2: two hosts probing for the same name at once compare their
    /// records; the lexicographically earlier set waits a second and probes again.
    private mutating func resolveSimultaneousProbe(_ message: DNSMessage, now: NIODeadline) {
        guard case .probing = phase else { return }
        let probedNames = Set(message.questions.map(\.name))
        for name in [instanceName, hostName] where probedNames.contains(name) {
            let theirs = message.authorities.filter { $0.name == name }
            guard !theirs.isEmpty else { continue }
            let ours = interfaces.flatMap { uniqueRecords(on: $0) }.filter { $0.name == name }
            let ordering = Self.compare(ours, theirs)
            if ordering < 0 {
                restartProbing(after: .seconds(1), now: now)
                return
            }
        }
    }

    /// Compares record sets as section 8.2 orders them: class, then type, then rdata bytes,
    /// records sorted; a set that is a prefix of the other is earlier. Duplicates (a set
    /// listed once per interface) count once.
    static func compare(_ left: [DNSRecord], _ right: [DNSRecord]) -> Int {
        func key(_ record: DNSRecord) -> [UInt8] {
            [UInt8(record.recordClass >> 8), UInt8(record.recordClass & 0xFF),
             UInt8(record.type.rawValue >> 8), UInt8(record.type.rawValue & 0xFF)] + record.data.canonicalBytes
        }
        let leftKeys = Array(Set(left.map(key))).sorted { $0.lexicographicallyPrecedes($1) }
        let rightKeys = Array(Set(right.map(key))).sorted { $0.lexicographicallyPrecedes($1) }
        for (l, r) in zip(leftKeys, rightKeys) where l != r {
            return l.lexicographicallyPrecedes(r) ? -1 : 1
        }
        return leftKeys.count == rightKeys.count ? 0 : (leftKeys.count < rightKeys.count ? -1 : 1)
    }

    // MARK: Answering

    private mutating func answer(_ query: DNSMessage, from source: MDNSSource, now: NIODeadline) {
        // Records are only ours to give once probing has succeeded.
        switch phase {
        case .announcing, .established: break
        default: return
        }
        guard let interface = interface(source.interfaceIndex) else { return }
        let published = records(on: interface)
        let isProbe = !query.authorities.isEmpty
        let isLegacy = source.port != MDNS.port
        var answers: [DNSRecord] = []
        var unicastOnly = true
        for question in query.questions {
            let matching = published.filter { question.isAnswered(by: $0) }
            guard !matching.isEmpty else { continue }
            if !question.unicastResponse { unicastOnly = false }
            for record in matching where !answers.contains(record) {
                // Known-answer suppression (section 7.1): the asker holds it with at least half its TTL.
                let known = query.answers.contains { $0.isSameRecord(as: record) && $0.ttl >= record.ttl / 2 }
                if !known { answers.append(record) }
            }
        }
        guard !answers.isEmpty else { return }

        if isLegacy {
            // Section 6.7: reply to the asker's port, echo the id and questions, short TTLs,
            // no cache-flush bits (a plain DNS resolver would not understand them).
            var reply = DNSMessage.response(id: query.id, answers: (answers + additionals(for: answers, in: published, excluding: query.answers)).map {
                var record = $0
                record.ttl = min(record.ttl, MDNS.legacyTTL)
                record.cacheFlush = false
                return record
            })
            reply.questions = query.questions
            send(reply, on: interface.index, to: .unicast(address: source.address, port: source.port))
            return
        }
        if unicastOnly && !isProbe {
            send(.response(answers: answers, additionals: additionals(for: answers, in: published, excluding: query.answers)),
                 on: interface.index, to: .unicast(address: source.address, port: source.port))
            return
        }
        let sharedIncluded = answers.contains { !$0.cacheFlush }
        let delay: TimeAmount
        if isProbe || !sharedIncluded {
            delay = .zero  // unique records are answered at once (section 6)
        } else if query.isTruncated {
            delay = random.milliseconds(400...500)  // more known answers follow (section 7.2)
        } else {
            delay = random.milliseconds(20...120)  // spreads the replies of many responders
        }
        if isProbe {
            // Defending a name ignores the one-second rate limit (section 6: 250 ms).
            send(.response(answers: answers), on: interface.index)
            noteMulticast(answers, on: interface.index, now: now)
            return
        }
        if let index = pending.firstIndex(where: { $0.interfaceIndex == interface.index }) {
            for record in answers where !pending[index].answers.contains(record) { pending[index].answers.append(record) }
            pending[index].deadline = min(pending[index].deadline, now + delay)
        } else {
            pending.append(PendingResponse(interfaceIndex: interface.index, deadline: now + delay, answers: answers))
        }
        if delay == .zero { flushPending(now: now) }
    }

    /// Section 12 of RFC 6763: a PTR answer brings the SRV, TXT and addresses along, an SRV
    /// answer its addresses.
    private func additionals(for answers: [DNSRecord], in published: [DNSRecord], excluding known: [DNSRecord]) -> [DNSRecord] {
        var wanted: [DNSRecord] = []
        for answer in answers {
            switch answer.data {
            case .ptr(let target) where target == instanceName:
                wanted += published.filter { $0.name == instanceName || $0.name == hostName }
            case .srv:
                wanted += published.filter { $0.name == hostName }
            default:
                break
            }
        }
        var result: [DNSRecord] = []
        for record in wanted where !answers.contains(record) && !result.contains(record) {
            if !known.contains(where: { $0.isSameRecord(as: record) && $0.ttl >= record.ttl / 2 }) { result.append(record) }
        }
        return result
    }

    private mutating func flushPending(now: NIODeadline) {
        let due = pending.filter { $0.deadline <= now }
        pending.removeAll { $0.deadline <= now }
        for response in due {
            guard let interface = interface(response.interfaceIndex) else { continue }
            // Section 6: a record multicast on this link less than a second ago is not repeated.
            let recent = lastMulticast[response.interfaceIndex] ?? [:]
            let answers = response.answers.filter { record in
                recent[record.identity].map { now - $0 >= .seconds(1) } ?? true
            }
            guard !answers.isEmpty else { continue }
            let extra = additionals(for: answers, in: records(on: interface), excluding: [])
            send(.response(answers: answers, additionals: extra), on: interface.index)
            noteMulticast(answers + extra, on: interface.index, now: now)
        }
    }

    private mutating func noteMulticast(_ records: [DNSRecord], on interfaceIndex: Int, now: NIODeadline) {
        var recent = lastMulticast[interfaceIndex] ?? [:]
        recent = recent.filter { now - $0.value < .seconds(1) }
        for record in records { recent[record.identity] = now }
        lastMulticast[interfaceIndex] = recent
    }
}
