import FoundationEssentials
import Glibc
import PlainText
import QXfer
internal import LinuxSystem

/// Reads ``ControlMessage``s from a connection's byte stream.
struct MessageReader<Stack: ByteStreamProtocol> {
    let connection: NetworkConnection<Stack>
    private var decoder = MessageDecoder()

    init(_ connection: NetworkConnection<Stack>) { self.connection = connection }

    /// The next message; nil when the peer finished cleanly between messages.
    mutating func next() async throws -> ControlMessage? {
        while true {
            if let message = try decoder.next() { return message }
            do {
                decoder.append(try await connection.receive(atLeast: 1, atMost: 1 << 20).content)
            } catch let error as QXferError where error.code == .endOfStream {
                guard decoder.pendingBytes == 0 else { throw StreamError(.malformed, "the peer ended the stream inside a message") }
                return nil
            }
        }
    }
}

/// How a stream actually travels on the connection it got.
enum Carriage: Sendable, Equatable {
    /// Frames as messages on the connection's own stream; realtime drops expired frames first.
    case ordered(dropsExpired: Bool)
    /// One QUIC stream per frame.
    case streamPerFrame
    /// QUIC datagrams.
    case datagrams

    /// Decides from the mode and whether the transport has QUIC's extras.
    static func choose(mode: StreamMode, hasQUICExtras: Bool) -> Carriage {
        switch (mode, hasQUICExtras) {
        case (.reliable, _): .ordered(dropsExpired: false)
        case (.streamPerFrame, true): .streamPerFrame
        case (.realtime, true): .datagrams
        case (.streamPerFrame, false): .ordered(dropsExpired: false)
        case (.realtime, false): .ordered(dropsExpired: true)
        }
    }

    /// What the report says when the mode could not be honored as such.
    static func note(mode: StreamMode, hasQUICExtras: Bool) -> String {
        guard !hasQUICExtras, mode != .reliable else { return "" }
        let common = "TCP+TLS has one ordered byte stream: \(mode.rawValue) frames were framed on it, with head-of-line blocking as in reliable mode"
        return mode == .realtime ? common + "; the sender dropped frames already past their deadline" : common
    }
}

/// Whether the connection's transport offers QUIC's independent streams and unreliable
/// datagrams. TCP+TLS answers the same calls with child connections, whose datagrams are
/// reliable and ordered: realtime repair and per-frame streams would gain nothing there, so
/// frames stay on the ordered stream, where the sender drops expired ones itself.
/// Starts the connection if needed: a stack racing several knows only once connected.
func transportHasQUICExtras<Stack: ByteStreamProtocol>(_ connection: NetworkConnection<Stack>) async throws -> Bool {
    try await connection.hasIndependentStreams
}

/// What the sender is asked to do.
public struct StreamSenderOptions: Sendable {
    /// How frames travel.
    public var mode: StreamMode = .realtime
    /// How realtime mode repairs losses.
    public var repair: RepairScheme = .default
    /// How long after capture a frame is still useful.
    public var deadline: Duration = .milliseconds(150)
    /// Stop after this much source time; nil runs the source to its end.
    public var duration: Duration?
    /// Stop after this many frames; nil runs the source to its end.
    public var maximumFrames: Int?
    /// Replaces the source's frame rate for pacing.
    public var frameRate: FrameRate?

    public init() {}
}

/// What the sender saw, beside the receiver's totals.
public struct StreamSenderSummary: Sendable {
    /// Frames offered to the transport.
    public var framesSent: Int
    /// Frames (or their tails) dropped at the sender because their deadline passed before the
    /// transport could take them: realtime over TCP+TLS, or a congested QUIC datagram queue.
    public var framesDroppedAtSender: Int
    /// Stream-per-frame: streams reset because their frame missed its deadline.
    public var streamsReset: Int
    /// Realtime: shards resent on request.
    public var shardsRetransmitted: Int
    /// What opening the congestion window before the first frame took; nil when there was
    /// none (reliable mode, TCP+TLS, or a transport without datagrams).
    public var warmUp: WarmUp?
    /// The receiver's final totals; nil if it did not send them.
    public var receiverTotals: StreamTotals?
}

/// Sends frames from a source, paced at its frame rate, in one of the three modes.
public enum StreamSender {
    /// Runs a whole stream on `connection`: hello, clock probes answered, frames paced at the
    /// source's rate, end, then waits for the receiver's totals and closes the connection.
    ///
    /// - Parameters:
    ///   - connection: a connection to a `qxfer stream recv` (not yet started, or ready).
    ///   - source: where frames come from.
    ///   - options: mode, repair, deadline, length.
    /// - Returns: the sender's counters and the receiver's totals.
    public static func run<Stack: ByteStreamProtocol>(
        over connection: NetworkConnection<Stack>, source: sending any FrameSource, options: StreamSenderOptions
    ) async throws -> StreamSenderSummary {
        var source = source
        // The first frame is read before connecting: a bad input fails before anything is sent.
        var firstFrame = try source.next()
        let hasExtras = try await transportHasQUICExtras(connection)
        let carriage = Carriage.choose(mode: options.mode, hasQUICExtras: hasExtras)
        let frameRate = options.frameRate ?? source.frameRate
        let deadlineNanoseconds = UInt64(options.deadline.components.seconds) * 1_000_000_000
            + UInt64(options.deadline.components.attoseconds / 1_000_000_000)
        let hello = StreamHello(
            mode: options.mode, repair: options.repair, frameRate: frameRate,
            deadlineMilliseconds: UInt32(deadlineNanoseconds / 1_000_000), container: source.container,
            containerHeader: source.containerHeader)
        try await connection.send(ControlMessage.hello(hello).encoded())

        let shared = Locked(SenderShared(realtime: RealtimeSender(repair: options.repair)))
        let summary: StreamSenderSummary
        do {
            summary = try await withThrowingTaskGroup(of: Void.self) { group in
                // Waiting for datagrams or streams does not notice cancellation; closing the connection
                // ends those waits, so the group can finish however the body leaves (QUIC still
                // delivers what was sent before).
                defer { connection.cancel() }
                // Answers clock probes at once and collects the receiver's ready and report.
                group.addTask {
                    // However the control stream ends, the pacing loop and the waits must hear of it.
                    defer { shared.withLock { $0.controlEnded = true } }
                    var reader = MessageReader(connection)
                    while true {
                        let message: ControlMessage
                        do {
                            guard let next = try await reader.next() else { return }
                            message = next
                        } catch {
                            shared.withLock { $0.controlFailure = error }
                            throw error
                        }
                        switch message {
                        case .ping(let id, let t1):
                            let t2 = WallClock.now()
                            try await connection.send(ControlMessage.pong(id: id, t1: t1, t2: t2, t3: WallClock.now()).encoded())
                        case .ready: shared.withLock { $0.ready = true }
                        case .report(let json):
                            shared.withLock { $0.report = json }
                            return
                        case .stop(let reason):
                            shared.withLock { $0.stopReason = reason }
                            return
                        default: throw StreamError(.malformed, "the receiver sent an unexpected message")
                        }
                    }
                }
                if carriage == .datagrams && options.repair.sendsNacks {
                    group.addTask {
                        for try await datagram in connection.datagrams {
                            guard case .nack(let frame, let missing)? = try? RealtimeDatagram.decode(datagram) else { continue }
                            // Retransmissions must not overflow the transport's datagram queue
                            // either (it would drop newer frames): skip the request when it is
                            // full; the receiver asks again after a round trip.
                            let sent = await connection.metrics.bytesSent ?? 0
                            guard shared.withLock({ $0.gate.hasRoom(transportBytesSent: sent) }) else { continue }
                            let resend = shared.withLock { $0.realtime.handle(nackFor: frame, missing: missing, now: WallClock.now()) }
                            try await handOver(resend, on: connection, shared: shared)
                        }
                    }
                }

                try await waitUntil(timeout: .seconds(20), "the receiver did not get ready within 20 s") {
                    try shared.withLock { state in
                        if state.controlEnded { throw state.endedEarly("the receiver closed the connection before the stream started") }
                        return state.ready
                    }
                }

                // Realtime and per-frame streams are about latency: open the congestion window
                // before the first frame (a keyframe, the biggest burst) rather than during it.
                var warmUp: WarmUp?
                if carriage == .datagrams || carriage == .streamPerFrame, let first = firstFrame {
                    warmUp = try await openCongestionWindow(
                        on: connection, toHold: min(2 * first.payload.count, WarmUp.largestTarget), shared: shared)
                }

                var framesSent = 0
                try await withThrowingDiscardingTaskGroup { frameTasks in
                    let start = WallClock.now() + 5_000_000
                    var firstDue: UInt64?
                    while options.maximumFrames.map({ framesSent < $0 }) ?? true {
                        let upcoming = try firstFrame ?? source.next()
                        firstFrame = nil
                        guard let next = upcoming else { break }
                        let due: UInt64
                        if let override = options.frameRate {
                            due = override.dueTime(ofFrame: UInt64(framesSent))
                        } else {
                            if firstDue == nil { firstDue = next.dueTime }
                            due = next.dueTime &- (firstDue ?? 0)
                        }
                        if let duration = options.duration, Duration.nanoseconds(Int64(clamping: due)) >= duration { break }
                        // A live source captures on schedule whatever the transport does, so a
                        // stalled send shows up as latency instead of being hidden by a later capture.
                        let capture = start + due
                        let now = WallClock.now()
                        if capture > now { try await Task.sleep(for: .nanoseconds(Int64(capture - now))) }
                        let frame = Frame(
                            index: UInt64(framesSent), isKeyframe: next.isKeyframe, captureTime: capture,
                            deadline: options.deadline, payload: next.payload, timestamp: next.timestamp ?? UInt64(framesSent))
                        framesSent += 1
                        // A receiver that went away shows first on the control stream.
                        if let ended = shared.withLock({ $0.controlEnded ? $0.endedEarly("the receiver closed the connection in the middle of the stream") : nil }) {
                            throw ended
                        }
                        switch carriage {
                        case .ordered(let dropsExpired):
                            if dropsExpired && WallClock.now() >= frame.expiry {
                                shared.withLock { $0.droppedAtSender += 1 }
                                continue
                            }
                            try await connection.send(ControlMessage.frame(frame).encoded())
                        case .streamPerFrame:
                            frameTasks.addTask {
                                if await !deliverOnOwnStream(frame, connection: connection) {
                                    shared.withLock { $0.streamsReset += 1 }
                                }
                            }
                        case .datagrams:
                            guard let limit = try await connection.maximumDatagramSize else {
                                throw QXferError(.unsupported, "the receiver does not accept QUIC datagrams")
                            }
                            guard limit >= RealtimeDatagram.shardHeaderSize + ShardHeader.minimumShardSize else {
                                throw QXferError(.unsupported, "the path carries datagrams of only \(limit) bytes, too small for realtime mode; use --mode stream-per-frame")
                            }
                            let datagrams = shared.withLock { $0.realtime.datagrams(for: frame, maximumDatagramSize: limit, now: WallClock.now()) }
                            var next = datagrams.startIndex
                            while next < datagrams.endIndex {
                                // The transport drops the oldest queued datagram when its queue is
                                // full (64 in the QUIC engine) while congestion control holds them
                                // back, and a keyframe is ~90 datagrams: hand over a few at a time.
                                let sent = await connection.metrics.bytesSent ?? 0
                                if !shared.withLock({ $0.gate.hasRoom(transportBytesSent: sent) }) {
                                    if WallClock.now() >= frame.expiry {
                                        shared.withLock { $0.framesExpiredInQueue += 1 }
                                        break  // the rest would only arrive late: drop it here
                                    }
                                    try await Task.sleep(for: .microseconds(500))
                                    continue
                                }
                                let end = min(next + DatagramGate.burst, datagrams.endIndex)
                                try await handOver(datagrams[next..<end], on: connection, shared: shared)
                                next = end
                            }
                        }
                    }
                }
                try await connection.send(ControlMessage.end(framesSent: UInt64(framesSent)).encoded())
                try await waitUntil(timeout: options.deadline + .seconds(15), "the receiver sent no totals within 15 s of the end") {
                    try shared.withLock { state in
                        if state.report == nil && state.controlEnded {
                            throw state.endedEarly("the receiver closed the connection without sending its totals")
                        }
                        return state.report != nil
                    }
                }
                group.cancelAll()
                return shared.withLock { state in
                    StreamSenderSummary(
                        framesSent: framesSent, framesDroppedAtSender: state.droppedAtSender + state.framesExpiredInQueue,
                        streamsReset: state.streamsReset,
                        shardsRetransmitted: state.realtime.retransmitted, warmUp: warmUp,
                        receiverTotals: state.report.flatMap { StreamTotals.parse(json: $0) })
                }
            }
        } catch {
            // What was sent may still be on its way: the close waits for it, briefly.
            await connection.close(within: .seconds(3))
            throw error
        }
        // The receiver sent its totals: nothing is left to deliver, so the close goes at once
        // (and has left before the program may exit).
        await connection.close(within: .zero)
        return summary
    }

    /// Sends one frame on a stream of its own and waits for the receiver to take it (it
    /// finishes its side once the frame is whole); past the frame's deadline the stream is reset.
    /// True if the frame was taken in time.
    private static func deliverOnOwnStream<Stack: ByteStreamProtocol>(_ frame: Frame, connection: NetworkConnection<Stack>) async -> Bool {
        let message = ControlMessage.frame(frame).encoded()
        let stream: NetworkConnection<Stack>
        do { stream = try await connection.openStream() } catch { return false }
        let taken = await withTaskGroup(of: Bool.self) { race in
            race.addTask {
                do {
                    try await stream.send(message)
                    try await stream.finish()
                    _ = try await stream.receive(atLeast: 1, atMost: 1)
                    return true
                } catch let error as QXferError where error.code == .endOfStream {
                    return true
                } catch {
                    return false
                }
            }
            race.addTask {
                let now = WallClock.now()
                if frame.expiry > now { try? await Task.sleep(for: .nanoseconds(Int64(frame.expiry - now))) }
                return false
            }
            let first = await race.next() ?? false
            race.cancelAll()
            return first
        }
        // Past the deadline the frame is worthless: stop QUIC from retransmitting it.
        if !taken { stream.reset(errorCode: StreamErrorCodes.frameExpired) } else { stream.cancel() }
        return taken
    }
}

/// What the sender did to open the congestion window before the first frame.
public struct WarmUp: Sendable, Hashable {
    /// Padding bytes sent.
    public var bytes: Int
    /// From the first padding datagram to the window holding the target (or the time running out).
    public var duration: Duration
    /// The congestion window before and after, in bytes.
    public var windowBefore: Int
    public var windowAfter: Int
    /// The window the warm-up aimed for: twice the first frame.
    public var target: Int

    /// Targets are capped here (a raw Y4M frame can be megabytes); time bounds the rest.
    static let largestTarget = 4 << 20
}

extension StreamSender {
    /// Grows the congestion window until it holds `target` bytes, with padding datagrams sent as
    /// fast as congestion control lets them leave, for at most ten round trips (1 s at most).
    ///
    /// A new QUIC connection may have ~10 packets in flight and doubles that each round trip,
    /// while a keyframe at 4 Mbit/s is ~90 datagrams: sent cold it takes three round trips and
    /// misses a 150 ms deadline at 50 ms RTT, with every frame queued behind it. Growing the
    /// window first costs those round trips once, before the stream starts. The padding goes
    /// through the same gate as frames, so it never overflows the transport's datagram queue.
    static func openCongestionWindow<Stack: ByteStreamProtocol>(
        on connection: NetworkConnection<Stack>, toHold target: Int, shared: Locked<SenderShared>
    ) async throws -> WarmUp? {
        let start = await connection.metrics
        guard let limit = try await connection.maximumDatagramSize, let before = start.congestionWindow else { return nil }
        let roundTrip = start.smoothedRTT ?? .milliseconds(100)
        let budget = min(max(roundTrip * 10, .milliseconds(50)), .seconds(1))
        let padding = RealtimeDatagram.padding(byteCount: limit).encoded()
        let clock = ContinuousClock()
        let began = clock.now
        var window = before, bytes = 0
        while window < target, clock.now - began < budget {
            let metrics = await connection.metrics
            window = metrics.congestionWindow ?? window
            if !shared.withLock({ $0.gate.hasRoom(transportBytesSent: metrics.bytesSent ?? 0) }) {
                try await Task.sleep(for: .microseconds(500))
                continue
            }
            try await handOver(repeatElement(padding, count: DatagramGate.burst), on: connection, shared: shared)
            bytes += DatagramGate.burst * padding.count
        }
        return WarmUp(bytes: bytes, duration: clock.now - began, windowBefore: before, windowAfter: window, target: target)
    }
}

/// Sends a datagram; a datagram the transport refuses (the path's limit shrank) is a loss like
/// any other, but a closed connection ends the stream.
func sendUnreliably<Stack: ByteStreamProtocol>(_ datagram: Data, on connection: NetworkConnection<Stack>) async throws {
    do {
        try await connection.sendDatagram(datagram)
    } catch let error as QXferError where error.code == .invalidUse {
        return
    }
}

/// Hands datagrams to the transport, counting them in the sender's ``DatagramGate``.
func handOver<Stack: ByteStreamProtocol>(
    _ datagrams: some Sequence<Data>, on connection: NetworkConnection<Stack>, shared: Locked<SenderShared>
) async throws {
    for datagram in datagrams {
        try await sendUnreliably(datagram, on: connection)
        shared.withLock { $0.gate.handed(datagram.count) }
    }
}

/// Application error codes on QUIC streams.
enum StreamErrorCodes {
    /// RESET_STREAM for a frame past its deadline.
    static let frameExpired: UInt64 = 0x51
}

/// Estimates how many datagram bytes wait inside the transport, not yet on the wire: what was
/// handed to it minus what it has written since (its byte counter includes packet overhead and
/// other packets, so the estimate is clamped at zero, which also re-anchors it).
struct DatagramGate: Sendable {
    /// At most this many bytes queued in the transport before handing over more (~32 datagrams,
    /// half the QUIC engine's queue).
    static let maximumQueued = 32 * 1200
    /// Datagrams handed over between two looks at the transport's counters.
    static let burst = 8
    private var handedBytes = 0
    private var baseline: Int?

    /// Payload only: packet overhead makes the transport's counter run ahead, which the clamp
    /// absorbs; counting more than the payload would let the estimate creep up and stall.
    mutating func handed(_ count: Int) { handedBytes += count }

    /// Whether the transport's queue can take more: at most ``maximumQueued`` bytes wait in it.
    mutating func hasRoom(transportBytesSent sent: Int) -> Bool { queued(transportBytesSent: sent) <= Self.maximumQueued }

    private mutating func queued(transportBytesSent sent: Int) -> Int {
        if baseline == nil { baseline = sent }
        let written = sent - baseline!
        if handedBytes < written { handedBytes = written }
        return handedBytes - written
    }
}

struct SenderShared: Sendable {
    var gate = DatagramGate()
    var framesExpiredInQueue = 0
    var realtime: RealtimeSender
    var ready = false
    var controlEnded = false
    var report: Data?
    /// The receiver's reason, once it stopped the stream (its output failed).
    var stopReason: String?
    /// Why reading the control stream failed (the connection's error), if it did.
    var controlFailure: (any Error)?
    var droppedAtSender = 0
    var streamsReset = 0

    /// Why the stream ends once the control stream has ended before its time: the receiver's
    /// stop, else the connection's failure (a timeout, early data unanswered), else `otherwise`.
    func endedEarly(_ otherwise: String) -> any Error {
        // A stop before ready is a refusal (the receiver serves another stream), not a failed output.
        if let stopReason, !ready { return StreamError(.refused, "the receiver refused the stream: \(TerminalText.escaped(stopReason))") }
        if let stopReason { return StreamError(.output, "the receiver stopped the stream: \(TerminalText.escaped(stopReason))") }
        return controlFailure ?? QXferError(.connectionClosed, otherwise)
    }
}

/// Polls `condition` every 2 ms until it holds; throws a timeout after `timeout`.
func waitUntil(timeout: Duration, _ message: String, _ condition: () throws -> Bool) async throws {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    while try !condition() {
        guard clock.now < deadline else { throw StreamError(.timeout, message) }
        try await Task.sleep(for: .milliseconds(2))
    }
}
