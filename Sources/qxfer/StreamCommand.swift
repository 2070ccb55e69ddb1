import ArgumentParser
import FoundationEssentials
import Glibc
import Logging
import QXfer
import QXferStream
import SafeOutput
import Synchronization
import PlainText

/// The port `qxfer stream recv` listens on by default, TCP and UDP alike: next to file
/// transfer's, so one firewall rule pair covers both.
let defaultStreamPort: UInt16 = 7448

struct StreamCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stream",
        abstract: "Stream live frames to another host and measure per-frame latency.",
        discussion: """
            EXAMPLES:
              qxfer stream recv --output out.ivf   # port \(defaultStreamPort), one stream, then exit
              qxfer stream send otherhost          # 10 s of synthetic 4 Mbit/s frames
              qxfer stream send otherhost --input clip.ivf --mode stream-per-frame

            docs/COMMANDS.md and docs/STREAMING.md explain the modes and the figures.
            """,
        subcommands: [StreamSendCommand.self, StreamRecvCommand.self]
    )
}

extension StreamMode: ExpressibleByArgument {}
extension RepairScheme: ExpressibleByArgument {}

struct StreamSendCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Send live frames to a host running 'qxfer stream recv'.",
        usage: "qxfer stream send <host>[:<port>] [--stack auto|quic|tls] [--mode realtime|stream-per-frame|reliable] [--input <file>|-]",
        discussion: """
            EXAMPLES:
              qxfer stream send otherhost --duration 30 --fps 60 --bitrate 8M
              qxfer stream send otherhost --input clip.ivf        # realtime, repaired
              qxfer stream send otherhost --input clip.y4m --mode reliable --stack tls
              ffmpeg -i in.mp4 -f yuv4mpegpipe - | qxfer stream send otherhost --input -
              qxfer stream send otherhost --json > events.jsonl   # JSON event lines

            docs/COMMANDS.md tells the source, the modes over each stack and the progress \
            line; docs/STREAMING.md the figures.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The receiving host.", valueName: "host[:port]"))
    var destination: String

    @Option(help: StackChoice.help)
    var stack: StackChoice = .auto

    @Option(help: "How frames travel: realtime, stream-per-frame or reliable.")
    var mode: StreamMode = .realtime

    @Option(help: "Realtime loss repair: fec, nack, both or none (default: \(RepairScheme.default.rawValue), chosen by measurement).")
    var repair: RepairScheme = .default

    @Option(help: ArgumentHelp("An IVF or Y4M file to send, or '-' for standard input; default: the synthetic source.", valueName: "file"))
    var input: String?

    @Option(help: "Frames per second (synthetic source; for files, overrides the file's rate).")
    var fps: Double?

    @Option(help: ArgumentHelp("Synthetic source bit rate, e.g. 4M, 800k, 2500000.", valueName: "bits/s"))
    var bitrate: String = "4M"

    @Option(help: "Synthetic source: a keyframe every N frames.")
    var keyframeInterval = 30

    @Option(help: ArgumentHelp("Seconds to send (default: 10 for the synthetic source, the whole file otherwise).", valueName: "seconds"))
    var duration: Double?

    @Option(help: ArgumentHelp("How long after capture a frame is still useful.", valueName: "ms"))
    var deadline = 150

    @Option(help: ArgumentHelp("Require the receiver's certificate to have this SHA-256 fingerprint.", valueName: "sha256"))
    var fingerprint: String?

    @Flag(help: "Print JSON event lines on standard output: progress every second, then the receiver's totals.")
    var json = false

    func validate() throws {
        _ = try parseDestination(destination, defaultPort: defaultStreamPort)
        if let fps, !(fps > 0 && fps <= 1000) { throw ValidationError("--fps must be more than 0 and at most 1000 frames per second") }
        guard let bits = BitRate.parse(bitrate), bits >= 8000, bits <= 10_000_000_000 else {
            throw ValidationError("--bitrate '\(bitrate)' is not a rate between 8k and 10G bits per second (e.g. 4M)")
        }
        _ = bits
        if let duration, !(duration > 0) { throw ValidationError("--duration must be positive") }
        guard deadline > 0 && deadline <= 60_000 else { throw ValidationError("--deadline must be between 1 and 60000 ms") }
        guard keyframeInterval > 0 else { throw ValidationError("--keyframe-interval must be positive") }
        if let fingerprint, Fingerprint(parsing: fingerprint) == nil {
            throw ValidationError("'\(fingerprint)' is not a SHA-256 fingerprint (64 hex digits, colons allowed)")
        }
    }

    func run() async throws {
        global.bootstrapLogging()
        do {
            try await send()
        } catch let error as StreamError {
            failStream(error)
        }
    }

    private func send() async throws {
        let endpoint = try parseDestination(destination, defaultPort: defaultStreamPort)
        let identity = try global.identity()
        let receiverTrust = try ReceiverTrust(
            fingerprint: fingerprint, endpoint: endpoint, discoveredName: nil, identity: identity, config: global.config)
        let summary = try await stack.run(
            Streaming(command: self, endpoint: endpoint, trust: receiverTrust), identity: identity, trust: receiverTrust.trust,
            config: global.config)
        guard let totals = summary.receiverTotals else {
            throw StreamError(.malformed, "the receiver's totals could not be read")
        }
        if json {
            if let warmUp = summary.warmUp {
                Console.emit("warm_up", ["warm_up": [
                    "bytes": warmUp.bytes, "ms": milliseconds(warmUp.duration), "window_before": warmUp.windowBefore,
                    "window_after": warmUp.windowAfter, "target": warmUp.target,
                ]])
            }
            Console.emit("totals", totals.jsonFields())
        } else {
            StandardStream.output.write(totals.text() + "\n")
            var extras: [String] = []
            if let warmUp = summary.warmUp, warmUp.bytes > 0 {
                extras.append("congestion window opened from \(warmUp.windowBefore / 1000) to \(warmUp.windowAfter / 1000) kB "
                    + "in \(milliseconds(warmUp.duration)) ms before the first frame (\(warmUp.bytes / 1000) kB of padding)")
            }
            if summary.framesDroppedAtSender > 0 { extras.append("\(summary.framesDroppedAtSender) frames dropped at the sender (past their deadline)") }
            if summary.streamsReset > 0 { extras.append("\(summary.streamsReset) frame streams reset at their deadline") }
            if summary.shardsRetransmitted > 0 { extras.append("\(summary.shardsRetransmitted) shards retransmitted on request") }
            if !extras.isEmpty { StandardStream.output.write(StreamReportText.lines(["sender: " + extras[0]] + extras.dropFirst()).joined(separator: "\n") + "\n") }
        }
    }

    /// The frames to send (`--input`, or synthetic ones) and the options they go with.
    private func makeSource() throws -> (any FrameSource, StreamSenderOptions) {
        let source: any FrameSource
        var options = StreamSenderOptions()
        options.mode = mode
        options.repair = repair
        options.deadline = .milliseconds(deadline)
        let rate = fps.map { FrameRate(numerator: UInt32(($0 * 1000).rounded()), denominator: 1000) }
        if let input {
            source = try openSource(path: input)
            options.frameRate = rate
            options.duration = duration.map { .milliseconds(Int64($0 * 1000)) }
        } else {
            source = SyntheticSource(
                frameRate: rate ?? FrameRate(numerator: 30), bitsPerSecond: BitRate.parse(bitrate)!, keyframeInterval: keyframeInterval)
            options.duration = .milliseconds(Int64((duration ?? 10) * 1000))
        }
        return (source, options)
    }

    /// The stream, over whichever stack `--stack` chose.
    private struct Streaming: OverChosenStack {
        let command: StreamSendCommand
        let endpoint: Endpoint
        let trust: ReceiverTrust

        func run<Transport: SecureTransport>(over transport: Transport) async throws -> StreamSenderSummary {
            let (frames, options) = try command.makeSource()
            let source = RestartableSource(frames)
            let parameters = NetworkParameters.parameters { transport }.serviceClass(.interactiveVideo).performanceMode(.realtime)
            do {
                return try await command.run(to: endpoint, using: parameters, source: source, options: options, trust: trust)
            } catch where !Task.isCancelled {
                // Early data unanswered leaves nothing received: the stream starts again, from
                // its first frame, without early data (standard input cannot be read twice).
                guard let note = earlyDataRetryNote(error, to: endpoint, racing: command.stack == .auto), source.restart() else { throw error }
                Logger(label: "qxfer.stream").info("\(note)")
                return try await command.run(to: endpoint, using: parameters, source: source, options: options, trust: trust)
            }
        }
    }

    /// A source that can start again from its first frame, as long as no more than that frame
    /// was taken: the sender reads one frame, then waits for the receiver before the next.
    private final class RestartableSource: FrameSource, Sendable {
        private struct State {
            var frames: any FrameSource
            var first: SourceFrame?
            var taken = 0
            var replaysFirst = false
        }
        private let state: Mutex<State>
        let container: ContainerKind
        let containerHeader: Data
        let frameRate: FrameRate

        init(_ frames: sending any FrameSource) {
            container = frames.container
            containerHeader = frames.containerHeader
            frameRate = frames.frameRate
            state = Mutex(State(frames: frames))
        }

        func next() throws -> SourceFrame? {
            try state.withLock { state in
                if state.replaysFirst {
                    state.replaysFirst = false
                    return state.first
                }
                let frame = try state.frames.next()
                state.taken += 1
                if state.taken == 1 { state.first = frame } else { state.first = nil }
                return frame
            }
        }

        /// Whether the next frame is the first again.
        func restart() -> Bool {
            state.withLock { state in
                guard state.taken <= 1 else { return false }
                state.replaysFirst = state.taken == 1
                return true
            }
        }
    }

    /// Runs the stream on a connection to `endpoint`, beside a watcher that fails a refused
    /// connection at once, says so on first contact with a receiver, and reports progress every second.
    private func run<Stack: ByteStreamProtocol>(
        to endpoint: Endpoint, using parameters: NetworkParameters<Stack>, source: sending any FrameSource, options: StreamSenderOptions,
        trust: ReceiverTrust
    ) async throws -> StreamSenderSummary {
        let connection = NetworkConnection(to: endpoint, using: parameters)
        defer { connection.cancel() }
        let refusal = Refusal()
        // Cancelled, and awaited, when this function returns.
        // Only a race can end on TCP+TLS unasked; --stack tls said so itself.
        let fallbackNote = stack == .auto && mode != .reliable
            ? "UDP did not get through to \(endpoint): the stream goes over TCP+TLS, where \(mode.rawValue) frames share one "
                + "ordered stream (datagrams and per-frame streams degrade; the sender drops frames past their deadline)"
            : nil
        async let _ = Self.watch(connection, endpoint: endpoint, trust: trust, json: json, refusal: refusal, fallbackNote: fallbackNote)
        do {
            let summary = try await StreamSender.run(over: connection, source: source, options: options)
            trust.connected(to: connection.peer)
            return summary
        } catch {
            throw refusal.error.withLock { $0 } ?? error
        }
    }

    /// Where the watcher leaves the refusal it saw (it cancelled the connection then).
    private final class Refusal: Sendable {
        let error = Mutex<(any Error)?>(nil)
    }

    /// Fails a refused connection at once, prints the first-contact notice once connected, then
    /// reports progress until cancelled.
    private static func watch<Stack>(
        _ connection: NetworkConnection<Stack>, endpoint: Endpoint, trust: ReceiverTrust, json: Bool, refusal: Refusal,
        fallbackNote: String?
    ) async {
        // The sender connects only once its input has given a first frame.
        while connection.currentState == nil {
            try? await Task.sleep(for: .milliseconds(20))
            if Task.isCancelled { return }
        }
        do {
            try await startFailingFast(connection) { refused in refusal.error.withLock { $0 = refused } }
        } catch {
            refusal.error.withLock { $0 = $0 ?? error }
            return
        }
        if let notice = trust.notice(endpoint, connection.peer) { Console.warn(notice) }
        if let fallbackNote, await (try? connection.hasIndependentStreams) == false { Console.warn(fallbackNote) }
        await reportProgress(of: connection, json: json)
    }

    /// A line (or `progress` event) a second until cancelled: time, bytes sent, rate, RTT.
    private static func reportProgress<Stack>(of connection: NetworkConnection<Stack>, json: Bool) async {
        let started = ContinuousClock.now
        var previous = 0
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(1))
            if Task.isCancelled { return }
            let metrics = await connection.metrics
            let seconds = (ContinuousClock.now - started).seconds
            let sent = metrics.bytesSent ?? 0
            let rate = Double(max(0, sent - previous)) * 8
            previous = sent
            let rtt = metrics.smoothedRTT.map { $0.seconds * 1000 }
            if json {
                var fields: [String: Any] = ["t": (seconds * 1000).rounded() / 1000, "bytes_sent": sent, "bitrate_bps": wholeNumber(rate)]
                if let rtt { fields["rtt_ms"] = (rtt * 1000).rounded() / 1000 }
                if let stack = metrics.stack { fields["stack"] = stack }
                Console.emit("progress", fields)
            } else {
                let line = StreamReportText.senderProgress(
                    seconds: seconds, bytesSent: UInt64(max(0, sent)), bitsPerSecond: rate, roundTripMilliseconds: rtt, stack: metrics.stack)
                StandardStream.error.write("qxfer: \(line)\n")
            }
        }
    }
}

struct StreamRecvCommand: AsyncParsableCommand, JSONOutput {
    static let configuration = CommandConfiguration(
        commandName: "recv",
        abstract: "Receive one stream, report latency every second, and write the frames.",
        discussion: """
            EXAMPLES:
              qxfer stream recv                        # report only, frames dropped
              qxfer stream recv --output out.ivf       # and write the frames
              qxfer stream recv --output - | ffplay -  # play them as they come
              qxfer stream recv --idle-limit 3 --json  # JSON event lines

            docs/COMMANDS.md tells what is written, when a stream ends and a second sender; \
            docs/STREAMING.md the report's figures.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Option(help: "The port to listen on (TCP and UDP).")
    var port: UInt16 = defaultStreamPort

    @Option(help: ArgumentHelp(
        "Write the frames here ('-' for standard output).",
        discussion: """
            A file gets its name when the stream ends (written beside it until then); a \
            terminal, a device such as /dev/null, a named pipe (read live, e.g. by ffplay) or \
            a socket is written directly and never replaced; a folder is refused. A write \
            that fails (the pipe's reader closed it, the disk is full) stops the stream at \
            once, the sender told why (exit 74).
            """,
        valueName: "file"))
    var output: String?

    @Flag(help: "Report as JSON lines, ending with one line of totals.")
    var json = false

    @Option(help: ArgumentHelp(
        "End a stream that sends no frame for this long (default \(StreamReceiverOptions.defaultIdleSeconds)).",
        valueName: "seconds"))
    var idleLimit: Double = Double(StreamReceiverOptions.defaultIdleSeconds)

    /// How long a second sender's connection waits for the stream in progress to end without
    /// having sent a frame, before it is refused: below the 20 s a sender waits for ready.
    static let slotWait: Duration = .seconds(15)

    func validate() throws {
        guard idleLimit >= 0.1 && idleLimit <= 86_400 else { throw ValidationError("--idle-limit must be between 0.1 and 86400 seconds") }
    }

    func run() async throws {
        global.bootstrapLogging()
        do {
            try await receive()
        } catch let error as StreamError {
            failStream(error)
        }
    }

    private func receive() async throws {
        let identity = try global.identity()
        // Refused at once (a folder, a block device), not when the first frame arrives.
        if let output {
            do { try OutputFile.check(output) } catch { throw StreamError(.output, error.message) }
        }
        let reportToStandardError = output.map(OutputFile.isStandardOutput) ?? false
        let json = self.json
        let say: @Sendable (String) -> Void = { line in
            if reportToStandardError {
                StandardStream.error.write(line + "\n")
            } else {
                StandardStream.output.write(line + "\n")  // unbuffered: a pipe sees each second at once
            }
        }
        Console.dataOnStandardOutput = reportToStandardError

        var options = StreamReceiverOptions()
        options.idleLimit = .milliseconds(Int64((idleLimit * 1000).rounded()))
        let header = Mutex(false)
        options.onInterval = { report, elapsed in
            if json {
                say(Console.jsonLine("interval", report.jsonFields(elapsed: elapsed)))
                return
            }
            let first = header.withLock { shown in
                defer { shown = true }
                return !shown
            }
            if first { say(StreamReportText.rowHeader) }
            say(StreamReportText.row(report, elapsed: elapsed))
        }
        if let output {
            options.makeSink = { hello in try makeSink(for: hello, output: ByteOutput(path: output)) }
        }
        let configured = options
        let session = Mutex(StreamSession())
        let serve: @Sendable (
            (StreamReceiverOptions) async throws -> StreamTotals, @Sendable (String) async -> Void
        ) async -> Void = { run, refuse in
            // One stream at a time. A second sender waits for the slot: one that holds it
            // without a frame is cut by the idle limit (below the wait), so a legitimate sender
            // queued behind a silent one is served; past the wait, or once a stream has run to
            // its end (the receiver then exits), it is refused with a reason.
            let clock = ContinuousClock()
            let until = clock.now + Self.slotWait
            while !session.withLock({ state in
                guard !state.busy, state.result == nil else { return false }
                state.busy = true
                return true
            }) {
                if session.withLock({ $0.result != nil }) || clock.now >= until || Task.isCancelled {
                    await refuse("busy: this receiver is serving another stream")
                    return
                }
                try? await Task.sleep(for: .milliseconds(50))
            }
            var sessionOptions = configured
            let started = Mutex(false), sentFrames = Mutex(false)
            sessionOptions.onHello = { _ in started.withLock { $0 = true } }
            sessionOptions.onFirstFrame = { sentFrames.withLock { $0 = true } }
            do {
                let totals = try await run(sessionOptions)
                session.withLock { $0.result = .success(totals) }
            } catch {
                // A connection that never announced a stream (a probe, a stray client), or that
                // announced one and never sent a frame, does not end the wait for the real sender.
                if !started.withLock({ $0 }) {
                    Console.warn("ignored a connection that sent no stream: \(error)")
                    session.withLock { $0.busy = false }
                } else if !sentFrames.withLock({ $0 }), let stream = error as? StreamError, stream.code == .timeout {
                    Console.warn("ended a stream that sent no frame: \(stream.message)")
                    session.withLock { $0.busy = false }
                } else {
                    session.withLock { $0.result = .failure(error) }
                }
            }
        }
        let quic = NetworkListener(on: port, using: .parameters { QUIC().identity(identity) }
            .serviceClass(.interactiveVideo).performanceMode(.realtime))
        let tls = NetworkListener(on: port, using: .parameters { TLS().identity(identity) }
            .serviceClass(.interactiveVideo).performanceMode(.realtime))
        let result: Result<StreamTotals, any Error> = try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await quic.run { connection in
                    await serve({ try await StreamReceiver.run(on: connection, options: $0) }) {
                        await StreamReceiver.refuse(connection, reason: $0)
                    }
                }
            }
            group.addTask {
                try await tls.run { connection in
                    await serve({ try await StreamReceiver.run(on: connection, options: $0) }) {
                        await StreamReceiver.refuse(connection, reason: $0)
                    }
                }
            }
            // Said once both listen: a sender started on seeing it is not refused.
            _ = try await (quic.port, tls.port)
            if json {
                say(Console.jsonLine("listening", ["port": port, "fingerprint": identity.fingerprint.description]))
            } else {
                StandardStream.error.write("qxfer: waiting for a stream on port \(port) (TCP and UDP)\nqxfer: fingerprint \(identity.fingerprint)\n")
            }
            while true {
                if let result = session.withLock({ $0.result }) {
                    group.cancelAll()
                    return result
                }
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        let totals = try result.get()
        say(json ? Console.jsonLine("totals", totals.jsonFields()) : totals.text())
    }
}

struct StreamSession: Sendable {
    var busy = false
    var result: Result<StreamTotals, any Error>?
}

/// Prints a stream error as one line and exits with a code scripts can tell apart.
private func failStream(_ error: StreamError) -> Never {
    let code: Int32 = switch error.code {
    case .badInput: 65  // EX_DATAERR: the input file is not what it claims
    case .malformed: 76  // EX_PROTOCOL
    case .output: 74  // EX_IOERR
    case .timeout, .refused: 69  // EX_UNAVAILABLE
    case .invalidConfiguration: 64  // EX_USAGE
    default: 1
    }
    Console.fatal(error.message, code: "\(error.code)", exitStatus: code)
    exit(code)
}

/// Bit rates as people write them: 4M, 800k, 2.5M, 2500000 (bits per second).
enum BitRate {
    static func parse(_ text: String) -> Int? {
        var number = text.lowercased()
        for suffix in ["bit/s", "bps", "bit", "b"] where number.hasSuffix(suffix) && number.count > suffix.count {
            number.removeLast(suffix.count)
            break
        }
        var scale = 1.0
        switch number.last {
        case "k": scale = 1e3
        case "m": scale = 1e6
        case "g": scale = 1e9
        default: break
        }
        if scale != 1 { number.removeLast() }
        guard let value = Double(number), value > 0, value.isFinite else { return nil }
        return Int(value * scale)
    }
}

/// A duration in whole milliseconds, for reports.
private func milliseconds(_ duration: Duration) -> Int64 {
    duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
}
