/// The path's decisions (docs/PROTOCOL.md §9.3, §9.5), free of sockets and clocks: binding the
/// relay, punching the peer's candidates, answering its punches, choosing the route, keeping a
/// direct path alive and leaving it. Every input takes `now` (a monotonic instant, any origin);
/// outputs are datagrams to send. The agent feeds it from its sockets and a 250 ms tick; tests
/// feed it a fake clock. `Address` is a socket address to the agent, anything to a test.
struct PathEngine<Address: Hashable> {
    /// Where datagrams for the peer go.
    enum Route: Equatable {
        case relayed
        case direct(Address)
    }

    /// What the relay said of this side's UDP socket.
    enum Binding: Equatable {
        case binding
        case bound(DatagramAddress)
        /// No `bound` within ``PathTiming/bindPatience``: UDP to the relay is blocked (binds go on).
        case blocked
    }

    /// Something to send.
    enum Action: Equatable {
        /// These bytes to the relay's UDP port.
        case toRelay([UInt8])
        /// These bytes to a peer's address.
        case send([UInt8], to: Address)
    }

    /// The most candidates of the peer punched: its list, then addresses its punches came from.
    static var maximumCandidates: Int { PeerSignal.maximumCandidates + 8 }
    /// Addresses remembered as the peer's (its punches came from them).
    static var maximumTrustedSources: Int { 16 }
    /// Nonces remembered: an answer to an older one is not taken.
    static var rememberedNonces: Int { 64 }

    /// The token this side's punches must carry.
    let token: [UInt8]
    /// This side's seat at the relay.
    let bindToken: [UInt8]
    let timing: PathTiming
    private(set) var punching: PunchingPolicy
    private(set) var route: Route = .relayed
    private(set) var binding: Binding = .binding
    /// The peer's token: what this side's punches carry. Nil until its candidates arrive.
    private(set) var peerToken: [UInt8]?
    private(set) var candidates: [Address] = []
    /// Addresses the peer sent a valid punch or answer from: datagrams from them are the peer's.
    private(set) var trustedSources: [Address] = []
    /// How often the route changed (either way).
    private(set) var routeChanges = 0

    private var started: Duration?
    private var lastBind: Duration?
    private var punchingUntil: Duration?
    private var lastPunchRound: Duration?
    private var nonces: [UInt64] = []
    private var nextNonceSlot = 0
    private var keepaliveNonce: UInt64?
    private var keepaliveAnswered = false
    private var nextKeepalive: Duration = .zero
    private var missedKeepalives = 0

    init(token: [UInt8], bindToken: [UInt8], punching: PunchingPolicy = .allowed, timing: PathTiming = PathTiming()) {
        self.token = token
        self.bindToken = bindToken
        self.punching = punching
        self.timing = timing
    }

    /// Whether the relay answered the binds or binding gave up.
    var bindingSettled: Bool { binding != .binding }

    /// Whether punches are being sent to the candidates now.
    var isPunching: Bool { punchingUntil != nil }

    /// Whether `source` is known to be the peer's: the direct path, or an address that proved it.
    func isTrusted(_ source: Address) -> Bool {
        if case .direct(let address) = route, address == source { return true }
        return trustedSources.contains(source)
    }

    // MARK: - Inputs

    /// Starts binding the relay.
    mutating func start(now: Duration) -> [Action] {
        started = now
        return [bind(now: now)]
    }

    /// The relay answered a bind.
    mutating func relayBound(_ address: DatagramAddress, now: Duration) {
        binding = .bound(address)
    }

    /// The peer's candidates arrived: punching starts (when allowed).
    mutating func peerKnown(token peerToken: [UInt8], candidates: [Address], now: Duration) -> [Action] {
        guard self.peerToken == nil, peerToken.count == RelayMessage.tokenSize else { return [] }
        self.peerToken = peerToken
        for candidate in candidates where !self.candidates.contains(candidate) && self.candidates.count < PeerSignal.maximumCandidates {
            self.candidates.append(candidate)
        }
        return punching == .allowed ? startPunching(now: now) : []
    }

    /// Lets a held side punch (tests: the direct path opens late).
    mutating func allowPunching(now: Duration) -> [Action] {
        guard punching == .held else { return [] }
        punching = .allowed
        return startPunching(now: now)
    }

    /// Stops punching and answering punches (tests: the direct path dies).
    mutating func stopPunching() {
        punching = .never
        punchingUntil = nil
    }

    /// A punch arrived from `source`: answered when it carries this side's token.
    mutating func receivedPunch(token punchToken: [UInt8], nonce: UInt64, from source: Address, now: Duration) -> [Action] {
        guard punching == .allowed, punchToken == token, let peerToken else { return [] }
        trust(source)
        var actions = [Action.send(PeerDatagram.punched(token: peerToken, nonce: nonce).encoded, to: source)]
        // The peer's NAT mapping toward this side (a peer-reflexive candidate, as ICE has them):
        // punching it too finds a path a symmetric NAT on the peer's side hides from its list.
        if !candidates.contains(source), candidates.count < Self.maximumCandidates, case .relayed = route {
            candidates.append(source)
            if punchingUntil == nil { punchingUntil = now + timing.punchWindow }
            if let (bytes, _) = punch() { actions.append(.send(bytes, to: source)) }
        }
        return actions
    }

    /// An answer to a punch arrived from `source`: with this side's token and a nonce it sent,
    /// `source` becomes the direct path (the first one that answers).
    mutating func receivedPunched(token answerToken: [UInt8], nonce: UInt64, from source: Address, now: Duration) -> [Action] {
        guard punching == .allowed, answerToken == token, nonces.contains(nonce) else { return [] }
        trust(source)
        switch route {
        case .direct(let address):
            if address == source {
                keepaliveAnswered = true
                missedKeepalives = 0
            }
        case .relayed:
            route = .direct(source)
            routeChanges += 1
            punchingUntil = nil
            keepaliveNonce = nil
            missedKeepalives = 0
            nextKeepalive = now + timing.keepaliveInterval
        }
        return []
    }

    /// Time passed: binds, punch rounds and keepalives that are due; the direct path left after
    /// too many unanswered keepalives.
    mutating func tick(now: Duration) -> [Action] {
        var actions: [Action] = []
        if let started, binding == .binding, now - started >= timing.bindPatience { binding = .blocked }
        if let lastBind, now - lastBind >= (binding == .binding ? timing.bindRetry : timing.bindRefresh) {
            actions.append(bind(now: now))
        }
        if let until = punchingUntil {
            if now >= until {
                punchingUntil = nil
            } else if let last = lastPunchRound, now - last >= timing.punchInterval {
                actions += punchRound(now: now)
            }
        }
        if case .direct(let address) = route, now >= nextKeepalive {
            if keepaliveNonce != nil, !keepaliveAnswered { missedKeepalives += 1 }
            if missedKeepalives >= timing.keepalivesMissedLimit {
                leaveDirectPath()
                // Perhaps the peer's NAT forgot the mapping: punch again for a while.
                actions += startPunching(now: now)
            } else if let (bytes, nonce) = punch() {
                keepaliveNonce = nonce
                keepaliveAnswered = false
                nextKeepalive = now + timing.keepaliveInterval
                actions.append(.send(bytes, to: address))
            }
        }
        return actions
    }

    /// A send to `address` failed on this host (no route, a firewall): it is not punched again,
    /// and datagrams go through the relay if it was the direct path.
    mutating func forget(_ address: Address) {
        candidates.removeAll { $0 == address }
        trustedSources.removeAll { $0 == address }
        if case .direct(let direct) = route, direct == address { leaveDirectPath() }
    }

    /// Sends on the direct path failed on this host: the relay carries datagrams, and punching
    /// starts again for a while.
    mutating func directPathFailed(now: Duration) -> [Action] {
        guard case .direct = route else { return [] }
        leaveDirectPath()
        return startPunching(now: now)
    }

    // MARK: - Inside

    private mutating func leaveDirectPath() {
        route = .relayed
        routeChanges += 1
        keepaliveNonce = nil
        missedKeepalives = 0
    }

    private mutating func bind(now: Duration) -> Action {
        lastBind = now
        return .toRelay(RelayDatagram.bind(token: bindToken).encoded)
    }

    private mutating func startPunching(now: Duration) -> [Action] {
        guard punching == .allowed, peerToken != nil, case .relayed = route else { return [] }
        punchingUntil = now + timing.punchWindow
        return punchRound(now: now)
    }

    private mutating func punchRound(now: Duration) -> [Action] {
        lastPunchRound = now
        guard !candidates.isEmpty, let (bytes, _) = punch() else { return [] }
        return candidates.map { .send(bytes, to: $0) }
    }

    /// A punch with a fresh nonce, remembered so that its answer is recognised.
    private mutating func punch() -> (bytes: [UInt8], nonce: UInt64)? {
        guard let peerToken else { return nil }
        let nonce = UInt64.random(in: .min ... .max)
        if nonces.count < Self.rememberedNonces {
            nonces.append(nonce)
        } else {
            nonces[nextNonceSlot] = nonce
            nextNonceSlot = (nextNonceSlot + 1) % Self.rememberedNonces
        }
        return (PeerDatagram.punch(token: peerToken, nonce: nonce).encoded, nonce)
    }

    private mutating func trust(_ source: Address) {
        guard !trustedSources.contains(source) else { return }
        if trustedSources.count >= Self.maximumTrustedSources { trustedSources.removeFirst() }
        trustedSources.append(source)
    }
}

/// The protocol's intervals.
struct PathTiming: Sendable, Equatable {
    /// Between two rounds of punches to every candidate.
    var punchInterval: Duration = .milliseconds(250)
    /// How long punching goes on without an answer.
    var punchWindow: Duration = .seconds(10)
    /// Between two keepalive punches on the direct path.
    var keepaliveInterval: Duration = .seconds(5)
    /// Keepalives unanswered in a row that send datagrams back through the relay.
    var keepalivesMissedLimit = 3
    /// Between two binds while the relay has not answered.
    var bindRetry: Duration = .seconds(1)
    /// How long binding waits for `bound` before UDP counts as blocked.
    var bindPatience: Duration = .seconds(5)
    /// Between two binds after that (the NAT mapping kept open).
    var bindRefresh: Duration = .seconds(20)

    init() {}
}

/// Whether this side punches and answers punches. Tests hold it back to force the relay,
/// or to open the direct path in the middle of a transfer.
enum PunchingPolicy: Sendable, Equatable {
    case allowed
    /// Not yet: ``PathEngine/allowPunching(now:)`` starts it.
    case held
    case never
}
