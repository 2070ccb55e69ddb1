import FoundationEssentials
import Glibc
import Logging
@_spi(Stacks) import QXferCore

/// The stack behind ``FirstOf``: races its candidates' `connect` (RFC 8305's staggered
/// attempts, applied to stacks) and binds them all on one port number.
struct RaceStack: TransportStack {
    let candidates: [any TransportStack]
    let attemptDelay: Duration
    /// Once every stack that answered refused, how long the silent ones still get: from the
    /// race's start, and at least `refusalGraceAfterAnswer` after the refusal. A peer that
    /// answered TCP at once would answer a QUIC handshake within this too if anything listened.
    let refusalGrace: Duration
    let memory: StackMemory?
    /// The first stack as declared (early data allowed) and how long it may lead alone
    /// (``FirstOf/sendingEarly(answerWithin:)``); nil always races.
    var earlyLeader: (stack: any TransportStack, deadline: Duration)? = nil
    static let refusalGraceAfterAnswer = Duration.milliseconds(250)
    /// Endpoints whose early attempt went unanswered: this process races to them from then on.
    static let unansweredEarly = Locked<Set<Endpoint>>([])
    /// How long an attempt whose peer has answered (QUIC's first datagram back, TCP's connection)
    /// holds the next stack back, from its start: its handshake needs about one more round trip,
    /// the next stack's at least as many, so starting that one would only race the preference.
    static let answeredAttemptPatience = Duration.seconds(1)
    /// How long, from its start, the first stack must stay silent (or be refused) before a race
    /// it lost counts as "its protocol is blocked" for the memory. Past the race its attempt is
    /// watched that long: a loaded machine answers a QUIC handshake late, and a lost close race
    /// is no evidence about the network (it once forced TCP+TLS on loopback for an hour).
    var silenceProof: Duration = .seconds(3)
    private static var logger: Logger { Logger(label: "qxfer.race") }

    var name: String { candidates.map(\.name).joined(separator: " or ") }
    /// True only if every candidate has them: before the race, the winner is unknown.
    var hasIndependentStreams: Bool { !candidates.isEmpty && candidates.allSatisfy(\.hasIndependentStreams) }

    func connect<Stack>(
        to endpoint: Endpoint, parameters: NetworkParameters<Stack>, timeout: Duration, peerAnswered: @escaping @Sendable () -> Void
    ) async throws -> any ByteStreamTransport {
        guard !candidates.isEmpty else { throw QXferError(.invalidUse, "FirstOf needs at least one stack") }
        let order = memory?.ordered(candidates, for: endpoint) ?? candidates
        if let (leader, deadline) = earlyLeader, order.first?.name == leader.name,
           !Self.unansweredEarly.withLock({ $0.contains(endpoint) }), leader.sendsEarly(to: endpoint, parameters: parameters) {
            Self.logger.info("\(leader.name) leads alone with early data to \(endpoint); a race follows if nothing answers within \(deadline)")
            do {
                let transport = try await leader.connect(to: endpoint, parameters: parameters, timeout: min(timeout, deadline), peerAnswered: peerAnswered)
                return RacedTransport(transport, stack: leader, earlyTo: endpoint)
            } catch let error as QXferError where error.code == .connectFailed {
                // Silent before it could send anything early: race now.
                Self.unansweredEarly.withLock { _ = $0.insert(endpoint) }
                Self.logger.info("\(leader.name) alone got no answer (\(error.message)); racing")
            }
        }
        let preferred = candidates[0].name
        var race = Race(order: order, endpoint: endpoint, attemptDelay: attemptDelay, refusalGrace: refusalGrace)
        race.preferred = preferred
        race.silenceProof = silenceProof
        let memory = self.memory
        let (winner, stack) = try await race.run(timeout: timeout, peerAnswered: peerAnswered, evidence: { evidence, winner in
            switch evidence {
            case .won, .answered:
                // It reaches the host: a memory of the other stack is dropped.
                memory?.record(winner: preferred, preferred: preferred, for: endpoint)
            case .blocked:
                Self.logger.info("\(preferred) got no answer from \(endpoint) (refused, or silent for \(silenceProof)): \(winner) first there for a while")
                memory?.record(winner: winner, preferred: preferred, for: endpoint)
            case .untried:
                break  // the remembered stack won before the other started: nothing learnt
            }
        }) { stack, remaining, answered in
            try await stack.connect(to: endpoint, parameters: parameters, timeout: remaining, peerAnswered: answered)
        }
        Self.logger.info("\(stack.name) won the race to \(endpoint)")
        return RacedTransport(winner, stack: stack)
    }

    func bind<Stack>(_ request: ListenRequest<Stack>) async throws -> any BoundTransportListener {
        // Port 0: the first stack's free port may be taken on another stack's protocol (a UDP
        // socket of some other program on the TCP listener's number); then another free one.
        var attempt = 1
        while true {
            do {
                return try await bindAll(request)
            } catch let error as QXferError where error.code == .bindFailed && request.port == 0 && attempt < 8 {
                attempt += 1
            }
        }
    }

    /// Binds every candidate on one port number, or none.
    private func bindAll<Stack>(_ request: ListenRequest<Stack>) async throws -> any BoundTransportListener {
        var bound: [(any BoundTransportListener, any TransportStack)] = []
        var request = request
        do {
            for stack in candidates {
                // The first stack picks the port (0: a free one); the others take the same number.
                let listener = try await stack.bind(request)
                request.port = listener.port
                bound.append((listener, stack))
            }
        } catch {
            // Half a listener would leave senders on the other stack waiting for their timeout.
            for (listener, _) in bound { await Self.close(listener) }
            throw error
        }
        return RaceListener(listeners: bound)
    }

    /// Closes a bound listener that will not serve: `run` in a cancelled task closes its sockets.
    private static func close(_ listener: any BoundTransportListener) async {
        let task = Task { try? await listener.run { transport, _ in transport.close() } }
        task.cancel()
        await task.value
    }

    /// The connection asks the winner (``RacedTransport``) to word its errors; what reaches here
    /// came before any stack won, and attempts throw their own stack's words already.
    func describe(_ error: any Error, during what: String) -> QXferError {
        candidates.first?.describe(error, during: what) ?? QXferError(.connectionClosed, "\(what) was lost: \(error)")
    }
}

/// Every candidate's listener, side by side; each accepted connection knows which stack took it.
struct RaceListener: BoundTransportListener {
    let listeners: [(any BoundTransportListener, any TransportStack)]

    var port: UInt16 { listeners.first?.0.port ?? 0 }

    func run(serving serve: @escaping @Sendable (any ByteStreamTransport, Endpoint?) async -> Void) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (listener, stack) in listeners {
                group.addTask {
                    try await listener.run { transport, remote in
                        await serve(RacedTransport(transport, stack: stack), remote)
                    }
                }
            }
            // One stack's listener failing ends the others: a half-listening receiver would
            // leave senders on that stack waiting for their timeout.
            defer { group.cancelAll() }
            try await group.next()
        }
    }
}

/// One race: attempts started in order, staggered, the first established wins.
///
/// Attempts run in tasks of their own, not in a task group: a loser whose connect does not
/// notice cancellation at once (a TCP SYN into a network that drops it) must not hold the
/// winner back; it closes what it established itself, once it ends.
struct Race: Sendable {
    let order: [any TransportStack]
    let endpoint: Endpoint
    let attemptDelay: Duration
    let refusalGrace: Duration
    /// The stack whose reachability the race reports (``Evidence``); nil reports nothing.
    var preferred: String? = nil
    /// See ``RaceStack/silenceProof``.
    var silenceProof: Duration = .seconds(3)

    /// What a won race says about the preferred stack's path to the peer.
    enum Evidence: Sendable, Equatable {
        /// It won.
        case won
        /// Its peer answered (or its attempt ended with an answer): it lost a close race only.
        case answered
        /// Refused (ICMP unreachable, its connect failed) or silent for ``silenceProof`` from its start.
        case blocked
        /// It had not started when another stack won.
        case untried
    }

    private enum Event: Sendable {
        case connected(Int, any ByteStreamTransport)
        case failed(Int, QXferError)
        /// Attempt `n`'s peer answered: something there speaks its stack.
        case answered(Int)
        /// The attempt delay ran out with attempt `n` not yet started.
        case delayOver(Int)
        /// An answered attempt held attempt `n` back as long as it may.
        case patienceOver(Int)
        case refusalGraceOver
    }

    /// Runs `attempt` for each stack in order until one returns a transport within `timeout`;
    /// `attempt` gets the time left and what to call when its peer answers. `peerAnswered` is
    /// called once, when the first attempt's peer answers.
    /// `evidence` hears, once and only after a win, what the race learnt of ``preferred`` (and
    /// the winner's name); for a preferred stack still silent when another won, that is after
    /// its attempt answered, failed or stayed silent for ``silenceProof``, which may be after
    /// this returns: the attempt goes on alone until then, and is closed.
    func run(
        timeout: Duration, peerAnswered: @escaping @Sendable () -> Void = {},
        evidence: @escaping @Sendable (Evidence, String) -> Void = { _, _ in },
        _ attempt: @escaping @Sendable (any TransportStack, Duration, @escaping @Sendable () -> Void) async throws -> any ByteStreamTransport
    ) async throws -> (any ByteStreamTransport, any TransportStack) {
        let clock = ContinuousClock()
        let start = clock.now
        let deadline = start + timeout
        let (events, continuation) = AsyncStream.makeStream(of: Event.self)
        let tasks = Locked<[Task<Void, Never>]>([])
        // What each attempt learnt of its peer, also after the race: the preferred one's, if
        // still silent at the win, decides the evidence.
        let (signals, signal) = AsyncStream.makeStream(of: (Int, Evidence).self)
        // The attempt watched past the race (not cancelled by its end), and its task.
        let watched = Locked<(index: Int?, task: Task<Void, Never>?)>((nil, nil))
        @discardableResult
        func spawn(_ body: @escaping @Sendable () async -> Event?) -> Task<Void, Never> {
            let task = Task {
                guard let event = await body() else { return }
                if case .terminated = continuation.yield(event), case .connected(_, let late) = event { late.close() }
            }
            tasks.withLock { $0.append(task) }
            return task
        }
        @Sendable func end(keepingWatched: Bool = false) {
            continuation.finish()
            let keep = keepingWatched ? watched.withLock { $0.task } : nil
            for task in tasks.withLock({ $0 }) where task != keep { task.cancel() }
            if keep == nil { signal.finish() }
        }

        var started = 0
        var running = 0
        var startTimes: [ContinuousClock.Instant] = []
        var failures: [(name: String, error: QXferError)] = []
        var answered: Set<Int> = []
        var graceArmed = false
        let reportedAnswer = Locked(false)
        func startNext() {
            guard started < order.count else { return }
            let index = started
            let stack = order[index]
            started += 1
            running += 1
            startTimes.append(clock.now)
            @Sendable func answer() {
                signal.yield((index, .answered))
                continuation.yield(.answered(index))
                if !reportedAnswer.withLock({ reported in defer { reported = true }; return reported }) { peerAnswered() }
            }
            let attemptTask = spawn {
                do {
                    let transport = try await attempt(stack, deadline - clock.now, answer)
                    signal.yield((index, .answered))
                    return .connected(index, transport)
                } catch {
                    let failure = (error as? QXferError) ?? stack.describe(error, during: "the connection")
                    // Cancelled (it lost, or the race ended) is no word on its path.
                    if failure.code != .cancelled && !Task.isCancelled {
                        signal.yield((index, failure.code == .connectFailed ? .blocked : .answered))
                    }
                    return .failed(index, failure)
                }
            }
            if stack.name == preferred { watched.withLock { $0.task = attemptTask } }
            if started < order.count {
                let next = started
                spawn {
                    try? await Task.sleep(for: attemptDelay)
                    return Task.isCancelled ? nil : .delayOver(next)
                }
            }
        }

        // What the win says of the preferred stack: at once where the race knows, else once its
        // attempt, left running, answers, fails or stays silent long enough.
        func judge(winner: Int) {
            let winnerName = order[winner].name
            guard let index = order.firstIndex(where: { $0.name == preferred }) else { return }
            if index == winner { return evidence(.won, winnerName) }
            if index >= started { return evidence(.untried, winnerName) }
            if let failure = failures.first(where: { $0.name == order[index].name }) {
                return evidence(failure.error.code == .connectFailed ? .blocked : .answered, winnerName)
            }
            if answered.contains(index) { return evidence(.answered, winnerName) }
            watched.withLock { $0.index = index }
            let proofEnds = startTimes[index] + silenceProof
            let watchedTask = watched.withLock { $0.task }
            Task {
                let verdict = await withTaskGroup(of: Evidence?.self) { group in
                    group.addTask {
                        for await (from, said) in signals where from == index { return said }
                        return nil
                    }
                    group.addTask {
                        try? await Task.sleep(until: proofEnds, clock: .continuous)
                        return Task.isCancelled ? nil : .blocked
                    }
                    defer { group.cancelAll() }
                    return await group.next() ?? nil
                }
                watchedTask?.cancel()
                signal.finish()
                if let verdict { evidence(verdict, winnerName) }
            }
        }

        var iterator = events.makeAsyncIterator()
        func decide() async throws -> (any ByteStreamTransport, any TransportStack) {
            startNext()
            while let event = await iterator.next() {
                switch event {
                case .connected(let index, let transport):
                    judge(winner: index)
                    return (transport, order[index])
                case .answered(let index):
                    answered.insert(index)
                case .delayOver(let next):
                    guard next == started else { break }
                    let previous = next - 1
                    if answered.contains(previous), !failures.contains(where: { $0.name == order[previous].name }) {
                        let wait = startTimes[previous] + RaceStack.answeredAttemptPatience - clock.now
                        spawn {
                            try? await Task.sleep(for: wait)
                            return Task.isCancelled ? nil : .patienceOver(next)
                        }
                    } else {
                        startNext()
                    }
                case .patienceOver(let next):
                    if next == started { startNext() }
                case .failed(let index, let error):
                    running -= 1
                    failures.append((order[index].name, error))
                    // The peer answered with something other than "no" (trust, protocol, a
                    // handshake failure): another stack reaches the same peer; its answer stands.
                    if error.code != .connectFailed { throw error }
                    startNext()
                    if running == 0 { throw combined(failures) }
                    if !graceArmed, failures.allSatisfy({ Self.isRefusal($0.error) }) {
                        graceArmed = true
                        let wait = max(start + refusalGrace, clock.now + RaceStack.refusalGraceAfterAnswer) - clock.now
                        spawn {
                            try? await Task.sleep(for: wait)
                            return Task.isCancelled ? nil : .refusalGraceOver
                        }
                    }
                case .refusalGraceOver:
                    // A stack whose peer answered is not silent: its handshake decides.
                    let answeredAndRunning = answered.contains { index in !failures.contains { $0.name == order[index].name } }
                    if !answeredAndRunning, failures.allSatisfy({ Self.isRefusal($0.error) }) { throw nothingListens(failures) }
                }
            }
            throw QXferError(.cancelled, "the connection was cancelled")
        }
        let outcome: Result<(any ByteStreamTransport, any TransportStack), any Error>
        do {
            outcome = .success(try await withTaskCancellationHandler(operation: decide, onCancel: { end() }))
        } catch {
            outcome = .failure(error)
        }
        end(keepingWatched: (try? outcome.get()) != nil && watched.withLock { $0.index } != nil)
        // Established after the winner but before the end: closed, never leaked.
        while let event = await iterator.next() {
            if case .connected(_, let late) = event { late.close() }
        }
        return try outcome.get()
    }

    /// A refused TCP connection: the host is there and nothing listens on the port.
    static func isRefusal(_ error: QXferError) -> Bool {
        error.code == .connectFailed && error.message.hasSuffix(String(cString: strerror(ECONNREFUSED)))
    }

    /// "nothing listens on host:7447, neither TCP nor UDP".
    private func nothingListens(_ failures: [(name: String, error: QXferError)]) -> QXferError {
        let carriers = order.map { Self.carrier(of: $0.name) }.sorted()  // "neither TCP nor UDP", whichever went first
        let neither = carriers.count == 2 ? "neither \(carriers[0]) nor \(carriers[1])" : "not on " + carriers.joined(separator: ", ")
        let silent = order.map(\.name).filter { name in !failures.contains { $0.name == name } }
        let detail = silent.isEmpty ? "every stack refused" : failures.map(\.name).joined(separator: " and ") + " refused, no "
            + silent.joined(separator: " or ") + " answer"
        return QXferError(
            .connectFailed, "nothing listens on \(endpoint), \(neither) (\(detail))",
            underlying: NothingListens(endpoint: endpoint, stacks: order.map(\.name)))
    }

    /// Every attempt failed in a way that may pass: each stack's reason, in order.
    private func combined(_ failures: [(name: String, error: QXferError)]) -> QXferError {
        if failures.count == 1 { return failures[0].error }
        if failures.allSatisfy({ Self.isRefusal($0.error) }) { return nothingListens(failures) }
        // One name for every stack: the first stack's words for it (QUIC's carry the resolver's).
        if failures.allSatisfy({ $0.error.underlying is NameDoesNotResolve }) { return failures[0].error }
        let reasons = failures.map { "\($0.name): \($0.error.message)" }.joined(separator: "; ")
        return QXferError(.connectFailed, "cannot reach \(endpoint) over any stack (\(reasons))", underlying: failures.last?.error)
    }

    /// What a user calls the layer under a stack: TCP under TLS, UDP under QUIC.
    static func carrier(of stack: String) -> String {
        switch stack {
        case "TCP+TLS": "TCP"
        case "QUIC": "UDP"
        default: stack
        }
    }
}
