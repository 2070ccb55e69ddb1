import FoundationEssentials
import Glibc
import QXfer
internal import LinuxSystem

/// What the receiver does with what arrives.
public struct StreamReceiverOptions: Sendable {
    /// How often ``onInterval`` is called.
    public var reportInterval: Duration = .seconds(1)
    /// Called with each interval's figures and the seconds since the stream started.
    public var onInterval: @Sendable (IntervalReport, Double) -> Void = { _, _ in }
    /// Makes the sink for the announced stream; nil writes nothing.
    public var makeSink: @Sendable (StreamHello) throws -> (any FrameSink)? = { _ in nil }
    /// Clock probes before the first frame.
    public var initialProbes = 6
    /// How long a new connection may take to send its hello.
    public var helloTimeout: Duration = .seconds(10)
    /// How long the stream may go without a whole frame arriving, from the hello on: longer
    /// ends it (``StreamError/Code/timeout``, the sender told by a stop). Only frames count:
    /// answers to clock probes, parts of datagram frames or bytes of a message never finished
    /// do not, so a silent or dripping peer cannot hold the receiver past it.
    public var idleLimit: Duration = .seconds(StreamReceiverOptions.defaultIdleSeconds)
    /// The default ``idleLimit`` in seconds (`qxfer stream recv --idle-limit`).
    public static let defaultIdleSeconds = 10
    /// Called once the sender has announced its stream (before any frame).
    public var onHello: @Sendable (StreamHello) -> Void = { _ in }
    /// Called once, when the first whole frame has arrived: until then the sender has shown
    /// nothing but a hello (`qxfer stream recv` goes back to waiting when such a sender is cut
    /// off by the idle limit).
    public var onFirstFrame: @Sendable () -> Void = {}

    public init() {}
}

/// Receives one stream: estimates the clock offset, takes frames in whatever mode the sender
/// chose, measures each, writes them in order, and returns the totals (also sent to the sender).
public enum StreamReceiver {
    /// Serves one stream on an accepted connection until the sender's end, then returns the totals.
    ///
    /// - Parameters:
    ///   - connection: a connection from a ``StreamSender``.
    ///   - options: reports and output.
    /// - Returns: the totals, as also sent to the sender.
    public static func run<Stack: ByteStreamProtocol>(
        on connection: NetworkConnection<Stack>, options: StreamReceiverOptions
    ) async throws -> StreamTotals {
        // A peer that connects and says nothing must not hold the receiver: 10 s for the hello.
        let (hello, reader) = try await withThrowingTaskGroup(of: (StreamHello, MessageReader<Stack>)?.self) { race in
            race.addTask {
                var reader = MessageReader(connection)
                guard case .hello(let hello)? = try await reader.next() else {
                    throw StreamError(.malformed, "the sender did not start with a hello")
                }
                return (hello, reader)
            }
            race.addTask {
                try await Task.sleep(for: options.helloTimeout)
                return nil
            }
            defer { race.cancelAll() }
            guard let first = try await race.next(), let opened = first else {
                connection.cancel()
                throw StreamError(.timeout, "the peer sent no stream hello within \(options.helloTimeout)")
            }
            return opened
        }
        options.onHello(hello)
        let hasExtras = try await transportHasQUICExtras(connection)
        let carriage = Carriage.choose(mode: hello.mode, hasQUICExtras: hasExtras)
        let deadline = UInt64(hello.deadlineMilliseconds) * 1_000_000
        let core = Locked(ReceiverCore(hello: hello, carriage: carriage, startedAt: WallClock.now()))
        let intervals = Locked(IntervalClock(started: ContinuousClock.now))
        try core.withLock { try $0.openSink(options.makeSink) }
        let controlReader = reader  // the rest of the control stream, after the hello

        let totals: StreamTotals
        do {
            totals = try await withThrowingTaskGroup(of: Void.self) { group in
                // Waiting for datagrams or streams does not notice cancellation; closing the connection
                // ends those waits, so the group can finish however the body leaves (QUIC still
                // delivers what was sent before).
                defer { connection.cancel() }
                // The control stream: pongs, and frames when they travel on it.
                group.addTask {
                    var reader = controlReader
                    do {
                        while let message = try await reader.next() {
                            let now = WallClock.now()
                            switch message {
                            case .pong(_, let t1, let t2, let t3):
                                core.withLock { $0.clock.add(t1: t1, t2: t2, t3: t3, t4: now) }
                            case .frame(let frame): try core.withLock { try $0.arrived(frame, now: now) }
                            case .end(let sent): core.withLock { $0.framesSent = Int(clamping: sent) }
                            default: throw StreamError(.malformed, "the sender sent an unexpected message")
                            }
                        }
                    } catch {
                        core.withLock { $0.controlError = error }
                    }
                    core.withLock { $0.controlEnded = true }
                }
                // Clock probes: a burst before the first frame, then one a second.
                group.addTask {
                    var id: UInt32 = 0
                    while !Task.isCancelled {
                        let before = core.withLock { $0.clock.count }
                        id += 1
                        try await connection.send(ControlMessage.ping(id: id, t1: WallClock.now()).encoded())
                        if before < options.initialProbes {
                            try? await waitUntil(timeout: .seconds(1), "") { core.withLock { $0.clock.count > before } }
                            if core.withLock({ $0.clock.count }) >= options.initialProbes, !core.withLock({ $0.readySent }) {
                                core.withLock { $0.readySent = true }
                                try await connection.send(ControlMessage.ready.encoded())
                            }
                        } else {
                            try await Task.sleep(for: .seconds(1))
                        }
                        if core.withLock({ $0.framesSent != nil }) { return }
                    }
                }
                switch carriage {
                case .datagrams:
                    group.addTask {
                        for try await datagram in connection.datagrams {
                            let requests = try core.withLock { try $0.datagram(datagram, now: WallClock.now()) }
                            for request in requests { try await sendUnreliably(request, on: connection) }
                        }
                    }
                    group.addTask {
                        while !Task.isCancelled {
                            try await Task.sleep(for: .milliseconds(2))
                            let requests = try core.withLock { try $0.tick(now: WallClock.now()) }
                            for request in requests { try await sendUnreliably(request, on: connection) }
                        }
                    }
                case .streamPerFrame:
                    group.addTask {
                        try await withThrowingDiscardingTaskGroup { streams in
                            for try await stream in connection.incomingStreams {
                                streams.addTask {
                                    var frameReader = MessageReader(stream)
                                    guard case .frame(let frame)? = try? await frameReader.next() else { return }  // reset: lost
                                    try core.withLock { try $0.arrived(frame, now: WallClock.now()) }
                                    guard (try? await frameReader.next()) == nil else { return }  // one frame a stream
                                    try? await stream.finish()  // tells the sender the frame was taken
                                    // Dropping a stream resets it, which could overtake the FIN just
                                    // sent; keep it until the FIN has surely arrived.
                                    try? await Task.sleep(for: .seconds(1))
                                }
                            }
                        }
                    }
                    group.addTask {
                        while !Task.isCancelled {
                            try await Task.sleep(for: .milliseconds(10))
                            _ = try core.withLock { try $0.tick(now: WallClock.now()) }
                        }
                    }
                    // The sender's warm-up padding: read and dropped, so it does not sit in the
                    // transport's datagram queue for the rest of the stream.
                    group.addTask { for try await _ in connection.datagrams {} }
                case .ordered: break
                }
                group.addTask {
                    while !Task.isCancelled {
                        try await Task.sleep(for: options.reportInterval)
                        if !intervals.withLock({ $0.report(core, options.onInterval) }) { return }
                    }
                }

                var totals: StreamTotals
                // The idle limit, on the monotonic clock: reset only by a whole frame arriving.
                var idle = IdleWatch(limit: options.idleLimit, now: ContinuousClock.now)
                var firstFrameSeen = false
                do {
                    // Until the sender's end, then until every frame is in or can no longer be on time.
                    try await waitUntil(timeout: .seconds(365 * 86400), "") {
                        try core.withLock { state in
                            if let error = state.outputFailure ?? state.controlError { throw error }
                            if state.controlEnded && state.framesSent == nil {
                                throw QXferError(.connectionClosed, "the sender closed the connection before the end of the stream")
                            }
                            if state.framesArrived > 0 && !firstFrameSeen {
                                firstFrameSeen = true
                                options.onFirstFrame()
                            }
                            if idle.expired(framesArrived: state.framesArrived, now: ContinuousClock.now) {
                                state.idleFailure = StreamError(
                                    .timeout, "the sender sent no frame for \(idle.limitText) (the stream's idle limit); its stream ends here")
                                throw state.idleFailure!
                            }
                            return state.framesSent != nil
                        }
                    }
                    // The hello's deadline is the peer's number (up to 49 days): the idle limit
                    // bounds the drain too.
                    let drainLimit = ContinuousClock.now + .nanoseconds(Int64(deadline)) + .milliseconds(250)
                    try await waitUntil(timeout: .seconds(3600), "") {
                        try core.withLock { state in
                            if let error = state.outputFailure { throw error }
                            let now = ContinuousClock.now
                            return state.allResolved || now >= drainLimit || idle.expired(framesArrived: state.framesArrived, now: now)
                        }
                    }
                    totals = try core.withLock { try $0.finish() }
                    // The last interval, however short: its frames belong in a row too.
                    intervals.withLock { $0.finish(core, options.onInterval) }
                } catch {
                    if let failure = core.withLock({ $0.outputFailure ?? $0.idleFailure }) {
                        // The sender hears why and closes (it would otherwise report a connection
                        // closed mid-stream); until then its frames are read and dropped, since a
                        // TCP connection closed with unread data ends in a reset that can lose this.
                        // A sender gone quiet gets 1 s: it may be silent on purpose.
                        let idle = core.withLock { $0.outputFailure == nil }
                        try? await connection.send(ControlMessage.stop(reason: "\(failure)").encoded())
                        try? await waitUntil(timeout: .seconds(idle ? 1 : 3), "") { core.withLock { $0.controlEnded } }
                    }
                    throw error
                }
                totals.stack = hasExtras ? "quic" : "tls"
                totals.note = Carriage.note(mode: hello.mode, hasQUICExtras: hasExtras)
                try await connection.send(ControlMessage.report(Data(totals.json().utf8)).encoded())
                // The sender closes once it has the totals; closing first could lose them (a TCP reset).
                try? await waitUntil(timeout: .seconds(3), "") { core.withLock { $0.controlEnded } }
                group.cancelAll()
                return totals
            }
        } catch {
            await connection.close(within: .seconds(3))
            throw error
        }
        // A sender that ended has its totals: nothing is left to deliver to it. Either way the
        // close has left before the program may exit.
        await connection.close(within: core.withLock { $0.controlEnded } ? .zero : .seconds(3))
        return totals
    }
}

extension StreamReceiver {
    /// Turns a sender away before its stream starts: a stop message with `reason` (one line),
    /// then the connection closes. The sender reports ``StreamError/Code/refused``.
    public static func refuse<Stack: ByteStreamProtocol>(_ connection: NetworkConnection<Stack>, reason: String) async {
        try? await connection.send(ControlMessage.stop(reason: reason).encoded())
        // The sender's hello is still unread: closing over unread data resets a TCP connection,
        // which can overtake the stop. Read until the sender, told, closes (or 1 s).
        await withTaskGroup(of: Void.self) { group in
            group.addTask { while (try? await connection.receive(atLeast: 1, atMost: 1 << 16)) != nil {} }
            group.addTask { try? await Task.sleep(for: .seconds(1)) }
            await group.next()
            connection.cancel()  // ends the read if it still waits
            group.cancelAll()  // and the sleep
        }
    }
}

/// The receiver's state: clock estimate, statistics, reassembly, playout and the sink.
/// When the interval reports fall due: one each ``StreamReceiverOptions/reportInterval``, then
/// one last for what arrived since (a stream of 5 s gets rows for seconds 1 to 4 and for the
/// rest), after which there are no more. Reports are made and handed on under its lock, so
/// they leave in order.
struct IntervalClock {
    let started: ContinuousClock.Instant
    var last: ContinuousClock.Instant
    var finished = false

    init(started: ContinuousClock.Instant) {
        self.started = started
        last = started
    }

    /// The interval just past, to `deliver`, unless the stream finished; false once it has.
    mutating func report(_ core: Locked<ReceiverCore>, _ deliver: (IntervalReport, Double) -> Void) -> Bool {
        guard !finished else { return false }
        let now = ContinuousClock.now
        let (report, ended) = core.withLock { ($0.stats.takeInterval(seconds: seconds(last, now), clock: $0.clock), $0.framesSent != nil) }
        last = now
        // After the sender's end, an interval without frames is no figure at all.
        if !(ended && report.framesDelivered + report.framesLate + report.framesLost == 0) { deliver(report, seconds(started, now)) }
        return true
    }

    /// The last interval, with every frame the sender sent and that never came counted lost:
    /// delivered only if it holds a frame, once.
    mutating func finish(_ core: Locked<ReceiverCore>, _ deliver: (IntervalReport, Double) -> Void) {
        guard !finished else { return }
        finished = true
        let now = ContinuousClock.now
        let report = core.withLock { $0.stats.takeInterval(seconds: seconds(last, now), clock: $0.clock, framesSent: $0.framesSent) }
        if report.framesDelivered + report.framesLate + report.framesLost > 0 { deliver(report, seconds(started, now)) }
    }

    private func seconds(_ from: ContinuousClock.Instant, _ to: ContinuousClock.Instant) -> Double {
        let span = to - from
        return Double(span.components.seconds) + Double(span.components.attoseconds) / 1e18
    }
}

struct ReceiverCore {
    let hello: StreamHello
    let carriage: Carriage
    var clock = ClockOffsetEstimator()
    var stats = StreamStatistics()
    var assembler: FrameAssembler?
    var playout = PlayoutBuffer()
    var sink: (any FrameSink)?
    var framesSent: Int?
    var controlEnded = false
    var controlError: (any Error)?
    var readySent = false
    /// Why the output failed, once a write did: nothing more is written, and the stream ends
    /// with it (the sender told by a stop message). Frames are still read meanwhile, so the
    /// connection closes cleanly rather than with unread data.
    var outputFailure: (any Error)?
    /// Why the stream ended early when the sender went quiet past the idle limit.
    var idleFailure: StreamError?
    /// Whole frames arrived (on time or late): what the idle limit watches.
    var framesArrived: UInt64 = 0
    /// The receiver's clock when the hello came: the output bound counts from here.
    let startedAt: UInt64
    /// The sink's writes, within the stream's own clock and rate.
    var output: BoundedOutput

    init(hello: StreamHello, carriage: Carriage, startedAt: UInt64 = WallClock.now()) {
        self.hello = hello
        self.carriage = carriage
        self.startedAt = startedAt
        output = BoundedOutput(bound: OutputBound(rate: hello.frameRate))
        if carriage == .datagrams {
            assembler = FrameAssembler(configuration: FrameAssembler.Configuration(repair: hello.repair))
        }
    }

    mutating func openSink(_ make: (StreamHello) throws -> (any FrameSink)?) throws {
        sink = try make(hello)
    }

    /// The receiver's clock carried to the sender's.
    func senderTime(_ now: UInt64) -> UInt64 { UInt64(bitPattern: Int64(bitPattern: now) &+ clock.offset) }

    /// Realtime drops late frames from the output; the other modes write everything that comes.
    var dropsLateFrames: Bool { hello.mode == .realtime }

    mutating func arrived(_ frame: Frame, now: UInt64) throws {
        let senderNow = senderTime(now)
        let latency = Int64(bitPattern: senderNow &- frame.captureTime)
        let onTime = senderNow <= frame.expiry
        stats.record(latency: latency, bytes: frame.payload.count, onTime: onTime, arrival: now, index: frame.index)
        if framesArrived < .max { framesArrived += 1 }
        if onTime || !dropsLateFrames { playout.add(frame) }
        write(playout.release(now: senderNow), now: now)
    }

    mutating func datagram(_ datagram: Data, now: UInt64) throws -> [Data] {
        guard var assembler else { return [] }
        if let roundTrip = clock.roundTrip {
            // Ask again a little after an answer should have come.
            assembler.configuration.retryInterval = UInt64(roundTrip) + UInt64(roundTrip) / 4 + 5_000_000
        }
        let (events, requests) = assembler.receive(datagram, now: senderTime(now))
        self.assembler = assembler
        try handle(events, now: now)
        return requests
    }

    mutating func tick(now: UInt64) throws -> [Data] {
        var requests: [Data] = []
        if var assembler {
            let (events, tickRequests) = assembler.tick(now: senderTime(now))
            self.assembler = assembler
            try handle(events, now: now)
            requests = tickRequests
        }
        write(playout.release(now: senderTime(now)), now: now)
        return requests
    }

    private mutating func handle(_ events: [FrameAssembler.Event], now: UInt64) throws {
        for event in events {
            switch event {
            case .completed(let frame, _): try arrived(frame, now: now)
            case .expired(let index): playout.giveUp(index)
            }
        }
    }

    /// Writes what the playout released, `now` on the receiver's clock (the output bound's
    /// elapsed time; a clock set back counts as no time).
    private mutating func write(_ items: [PlayoutBuffer.Item], now: UInt64) {
        guard var current = sink, outputFailure == nil else { return }
        let elapsed = now >= startedAt ? now - startedAt : 0
        do {
            try output.write(items, elapsed: elapsed, to: &current)
        } catch {
            outputFailure = error
        }
        sink = current
    }

    /// Every frame the sender sent has arrived (on time or late).
    var allResolved: Bool {
        guard let framesSent else { return false }
        return stats.framesDelivered + stats.framesLate >= framesSent
    }

    /// Writes what is left, closes the sink and computes the totals.
    mutating func finish() throws -> StreamTotals {
        try finish(now: WallClock.now())
    }

    /// ``finish()`` at `now` on the receiver's clock.
    mutating func finish(now: UInt64) throws -> StreamTotals {
        let sent = framesSent ?? 0
        write(playout.release(now: senderTime(now), through: UInt64(sent)), now: now)
        if let outputFailure { throw outputFailure }
        if let sink { output.finish(through: playout.nextIndex, sink: sink) }
        do {
            try sink?.close()
        } catch {
            outputFailure = error
            throw error
        }
        sink = nil
        var totals = stats.totals(framesSent: sent, clock: clock)
        totals.mode = hello.mode.rawValue
        totals.repair = carriage == .datagrams ? hello.repair.rawValue : ""
        totals.picturesNotFilled = Int(clamping: output.picturesNotFilled)
        if let counters = assembler?.counters {
            totals.blocksRecovered = counters.blocksRecovered
            totals.shardsRequested = counters.shardsRequested
            totals.retransmissionsReceived = counters.retransmissionsReceived
        }
        return totals
    }
}

/// The stream's idle limit: expires when no whole frame has arrived for the limit, counted
/// from the hello and from each frame. Only a new frame count resets it.
struct IdleWatch {
    let limit: Duration
    private var seen: UInt64 = 0
    private var since: ContinuousClock.Instant

    init(limit: Duration, now: ContinuousClock.Instant) {
        self.limit = limit
        since = now
    }

    /// Whether the limit passed by `now`, given the frames arrived so far.
    mutating func expired(framesArrived: UInt64, now: ContinuousClock.Instant) -> Bool {
        if framesArrived != seen {
            seen = framesArrived
            since = now
        }
        return now - since >= limit
    }

    /// The limit as people read it: "10 s", "0.5 s".
    var limitText: String {
        let (seconds, attoseconds) = limit.components
        return attoseconds == 0 ? "\(seconds) s" : "\(Double(seconds) + Double(attoseconds) / 1e18) s"
    }
}
