import Foundation
import Subprocesses
import QXfer
import LinuxSystem
import Synchronization
import Testing
@testable import QXferStream

/// Whole streams over real sockets on loopback: every mode on both stacks, files arriving
/// intact, and ffmpeg reading what the receiver wrote.
@Suite(.serialized) struct LoopbackStreamTests {
    static let server = try! HostIdentity.ephemeral(commonName: "stream test server")
    static let client = try! HostIdentity.ephemeral(commonName: "stream test client")

    enum Stack: String, CaseIterable, Sendable { case quic, tls }

    struct Outcome {
        var sender: StreamSenderSummary
        var receiver: StreamTotals
        var intervals: [IntervalReport]
    }

    /// Runs one stream from `makeSource` to a receiver writing to `output` (if any).
    static func stream(
        stack: Stack, options: StreamSenderOptions, output: String? = nil,
        makeSource: @escaping @Sendable () throws -> any FrameSource
    ) async throws -> Outcome {
        switch stack {
        case .quic:
            let parameters = NetworkParameters.parameters { QUIC().identity(server) }
                .serviceClass(.interactiveVideo).performanceMode(.realtime)
            let clientParameters = NetworkParameters.parameters { QUIC().identity(client).peerFingerprint(server.fingerprint) }
                .serviceClass(.interactiveVideo).performanceMode(.realtime)
            return try await stream(listener: parameters, client: clientParameters, options: options, output: output, makeSource: makeSource)
        case .tls:
            let parameters = NetworkParameters.parameters { TLS().identity(server) }
                .serviceClass(.interactiveVideo).performanceMode(.realtime)
            let clientParameters = NetworkParameters.parameters { TLS().identity(client).peerFingerprint(server.fingerprint) }
                .serviceClass(.interactiveVideo).performanceMode(.realtime)
            return try await stream(listener: parameters, client: clientParameters, options: options, output: output, makeSource: makeSource)
        }
    }

    static func stream<S: ByteStreamProtocol>(
        listener parameters: NetworkParameters<S>, client: NetworkParameters<S>, options: StreamSenderOptions,
        output: String?, makeSource: @escaping @Sendable () throws -> any FrameSource
    ) async throws -> Outcome {
        let listener = NetworkListener(on: 0, host: "127.0.0.1", using: parameters)
        let received = Locked<(totals: StreamTotals?, error: String?, intervals: [IntervalReport])>((nil, nil, []))
        var receiverOptions = StreamReceiverOptions()
        receiverOptions.reportInterval = .milliseconds(250)
        receiverOptions.onInterval = { report, _ in received.withLock { $0.intervals.append(report) } }
        if let output {
            receiverOptions.makeSink = { hello in try makeSink(for: hello, output: ByteOutput(path: output)) }
        }
        let finalOptions = receiverOptions
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    do {
                        let totals = try await StreamReceiver.run(on: connection, options: finalOptions)
                        received.withLock { $0.totals = totals }
                    } catch {
                        received.withLock { $0.error = "\(error)" }
                    }
                }
            }
            let port = try await listener.port
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port), using: client)
            let summary = try await StreamSender.run(over: connection, source: try makeSource(), options: options)
            connection.cancel()
            // The receiver records its totals before the sender can have them; wait for the handler anyway.
            for _ in 0..<500 where received.withLock({ $0.totals == nil && $0.error == nil }) {
                try await Task.sleep(for: .milliseconds(10))
            }
            group.cancelAll()
            let (totals, error, intervals) = received.withLock { ($0.totals, $0.error, $0.intervals) }
            if let error { Issue.record("receiver failed: \(error)") }
            return Outcome(sender: summary, receiver: try #require(totals), intervals: intervals)
        }
    }

    /// Runs `body` with a listener of `stack` whose connections go to `handler`, and a client.
    static func withPair(
        stack: Stack,
        handler: @escaping @Sendable (StreamSession) async -> Void,
        _ body: @Sendable (StreamSession) async throws -> Void
    ) async throws {
        switch stack {
        case .quic:
            let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(server) }
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await listener.run { await handler(StreamSession($0)) } }
                let port = try await listener.port
                try await body(StreamSession(NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                    QUIC().identity(client).peerFingerprint(server.fingerprint)
                }))
                group.cancelAll()
            }
        case .tls:
            let listener = NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(server) }
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await listener.run { await handler(StreamSession($0)) } }
                let port = try await listener.port
                try await body(StreamSession(NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                    TLS().identity(client).peerFingerprint(server.fingerprint)
                }))
                group.cancelAll()
            }
        }
    }

    /// Either end of a stream over either stack.
    struct StreamSession: Sendable {
        let receive: @Sendable () async throws -> StreamTotals
        let send: @Sendable (StreamSenderOptions) async throws -> StreamSenderSummary

        init<S: ByteStreamProtocol>(_ connection: NetworkConnection<S>) {
            receive = { try await StreamReceiver.run(on: connection, options: StreamReceiverOptions()) }
            send = { options in
                try await StreamSender.run(
                    over: connection, source: SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 1_000_000),
                    options: options)
            }
        }
    }

    @Test(arguments: Stack.allCases, [StreamMode.realtime, .reliable])
    func aVanishingSenderEndsTheReceiverPromptly(stack: Stack, mode: StreamMode) async throws {
        let outcome = Locked<String?>(nil)
        try await Self.withPair(stack: stack, handler: { session in
            do {
                _ = try await session.receive()
                outcome.withLock { $0 = "finished" }
            } catch {
                outcome.withLock { $0 = "\(error)" }
            }
        }) { session in
            var options = Self.synthetic(frames: 100_000, mode: mode)
            options.maximumFrames = nil
            options.duration = .seconds(60)
            let sender = Task { try await session.send(options) }
            try await Task.sleep(for: .seconds(1))
            sender.cancel()  // the sender's task ends, and with it its connection
            _ = await sender.result
            let clock = ContinuousClock()
            let start = clock.now
            // A cancelled QUIC connection first tries to deliver what it was handed, for at most
            // 10 s (NetworkConnection.cancel); a receiver that stopped reading a stream makes
            // it wait that long, so allow a margin beyond it.
            while outcome.withLock({ $0 }) == nil && clock.now - start < .seconds(15) { try await Task.sleep(for: .milliseconds(20)) }
            let result = try #require(outcome.withLock { $0 }, "the receiver still waits 15 s after the sender vanished")
            #expect(result.contains("closed") || result.contains("cancel") || result.contains("reset"), "\(result)")
        }
    }

    @Test(arguments: Stack.allCases, [StreamMode.realtime, .reliable])
    func aVanishingReceiverEndsTheSenderPromptly(stack: Stack, mode: StreamMode) async throws {
        try await Self.withPair(stack: stack, handler: { session in
            let receiver = Task { try await session.receive() }
            try? await Task.sleep(for: .seconds(1))
            receiver.cancel()
            _ = await receiver.result
        }) { session in
            var options = Self.synthetic(frames: 100_000, mode: mode)
            options.maximumFrames = nil
            options.duration = .seconds(60)
            let clock = ContinuousClock()
            let start = clock.now
            await #expect(throws: (any Error).self) { _ = try await session.send(options) }
            #expect(clock.now - start < .seconds(15), "the sender kept streaming into a closed connection")
        }
    }

    @Test func aPeerThatNeverSaysHelloTimesOut() async throws {
        let listener = NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(Self.server) }
        let outcome = Locked<String?>(nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    var options = StreamReceiverOptions()
                    options.helloTimeout = .milliseconds(500)
                    do {
                        _ = try await StreamReceiver.run(on: connection, options: options)
                        outcome.withLock { $0 = "finished" }
                    } catch let error as StreamError {
                        outcome.withLock { $0 = error.code.name }
                    } catch {
                        outcome.withLock { $0 = "\(error)" }
                    }
                }
            }
            let port = try await listener.port
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(Self.client).peerFingerprint(Self.server.fingerprint)
            }
            try await connection.send(Data([1, 0, 0]))  // the start of a hello, never finished
            for _ in 0..<250 where outcome.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(20)) }
            #expect(outcome.withLock { $0 } == "timeout")
            connection.cancel()
            group.cancelAll()
        }
    }

    /// A sink whose writes fail from the `failingFrom`th frame on, as a pipe does once its
    /// reader has gone.
    struct FailingSink: FrameSink {
        let failingFrom: Int
        var written = 0
        mutating func write(_ frame: Frame) throws {
            written += 1
            if written >= failingFrom { throw StreamError(.output, "the reader of the test's output closed it") }
        }
        mutating func skip(_ index: UInt64) throws {}
        mutating func close() throws {}
    }

    @Test(
        "An output that fails mid-stream ends the stream on both sides at once, the sender told why",
        arguments: [(Stack.quic, StreamMode.realtime), (.quic, .streamPerFrame), (.quic, .reliable), (.tls, .reliable), (.tls, .realtime)])
    func failedOutputStopsTheStream(stack: Stack, mode: StreamMode) async throws {
        // 900 frames are 30 s at 30 frames a second: a sender that is not told plays them all and
        // succeeds, which fails the expectations below.
        var options = Self.synthetic(frames: 900, mode: mode)
        options.deadline = .milliseconds(500)
        let receiverError = Locked<String?>(nil)
        var receiverOptions = StreamReceiverOptions()
        receiverOptions.makeSink = { _ in FailingSink(failingFrom: 10) }
        let senderError = switch stack {
        case .quic:
            try await Self.stopped(
                listener: .parameters { QUIC().identity(Self.server) }.performanceMode(.realtime),
                client: .parameters { QUIC().identity(Self.client).peerFingerprint(Self.server.fingerprint) }.performanceMode(.realtime),
                receiverOptions: receiverOptions, options: options, receiverError: receiverError)
        case .tls:
            try await Self.stopped(
                listener: .parameters { TLS().identity(Self.server) }.performanceMode(.realtime),
                client: .parameters { TLS().identity(Self.client).peerFingerprint(Self.server.fingerprint) }.performanceMode(.realtime),
                receiverOptions: receiverOptions, options: options, receiverError: receiverError)
        }
        #expect(receiverError.withLock { $0 } == "the reader of the test's output closed it", "\(stack) \(mode)")
        #expect(senderError == "output: the receiver stopped the stream: the reader of the test's output closed it", "\(stack) \(mode)")
    }

    /// Runs a stream the receiver stops; returns the sender's error as "code: message" (nil if
    /// it succeeded), and puts the receiver's in `receiverError`.
    static func stopped<S: ByteStreamProtocol>(
        listener parameters: NetworkParameters<S>, client: NetworkParameters<S>, receiverOptions: StreamReceiverOptions,
        options: StreamSenderOptions, receiverError: Locked<String?>
    ) async throws -> String? {
        let listener = NetworkListener(on: 0, host: "127.0.0.1", using: parameters)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    do {
                        _ = try await StreamReceiver.run(on: connection, options: receiverOptions)
                    } catch {
                        receiverError.withLock { $0 = "\(error)" }
                    }
                }
            }
            let port = try await listener.port
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port), using: client)
            let source = SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 2_000_000)
            var senderError: String?
            do {
                _ = try await StreamSender.run(over: connection, source: source, options: options)
            } catch let error as StreamError {
                senderError = "\(error.code): \(error.message)"
            } catch {
                senderError = "\(error)"
            }
            connection.cancel()
            for _ in 0..<500 where receiverError.withLock({ $0 == nil }) { try await Task.sleep(for: .milliseconds(10)) }
            group.cancelAll()
            return senderError
        }
    }

    static func synthetic(frames: Int, mode: StreamMode, repair: RepairScheme = .default) -> StreamSenderOptions {
        var options = StreamSenderOptions()
        options.mode = mode
        options.repair = repair
        options.maximumFrames = frames
        // Generous: the test machine runs other tests at the same time; latency itself is
        // measured by the benchmark, this checks delivery and counting.
        options.deadline = .seconds(2)
        return options
    }

    @Test(arguments: Stack.allCases, StreamMode.allCases)
    func everyModeDeliversAndReports(stack: Stack, mode: StreamMode) async throws {
        let outcome = try await Self.stream(stack: stack, options: Self.synthetic(frames: 45, mode: mode)) {
            SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 2_000_000)
        }
        let totals = outcome.receiver
        #expect(outcome.sender.framesSent == 45)
        #expect(totals.framesSent == 45)
        #expect(totals.framesDelivered + totals.framesLate + totals.framesLost == 45)
        #expect(totals.framesDelivered == 45, "\(stack) \(mode): \(totals.json())")
        #expect(totals.latency.max > 0 && totals.latency.p50 <= totals.latency.p99 && totals.latency.p99 <= totals.latency.max)
        // One machine, one clock: the estimated offset is close to zero.
        #expect(abs(totals.clockOffsetMilliseconds) < 5, "offset \(totals.clockOffsetMilliseconds) ms")
        #expect(totals.negativeLatencies == 0)
        #expect(totals.stack == stack.rawValue)
        #expect(totals.bytesReceived > 45 * 5000)
        #expect(outcome.sender.receiverTotals?.framesDelivered == totals.framesDelivered)
        #expect(!outcome.intervals.isEmpty)
        if stack == .tls && mode != .reliable {
            #expect(totals.note.contains("one ordered byte stream"))
        } else {
            #expect(totals.note.isEmpty)
        }
        if stack == .quic && mode == .realtime {
            #expect(totals.repair == RepairScheme.default.rawValue)
        }
        // The latency modes on QUIC open the congestion window before the first frame (twice
        // that keyframe); reliable mode and TCP+TLS leave it to the transport.
        #expect((outcome.sender.warmUp != nil) == (stack == .quic && mode != .reliable), "\(stack) \(mode)")
        if let warmUp = outcome.sender.warmUp {
            #expect(warmUp.target > 2 * 5000, "twice the first keyframe")
            #expect(warmUp.windowAfter >= warmUp.target || warmUp.bytes > 0, "\(warmUp)")
        }
    }

    @Test(arguments: [RepairScheme.fec, .nack, .both, .none])
    func realtimeRepairSchemesRunOverQUIC(repair: RepairScheme) async throws {
        let outcome = try await Self.stream(stack: .quic, options: Self.synthetic(frames: 30, mode: .realtime, repair: repair)) {
            SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 2_000_000)
        }
        #expect(outcome.receiver.framesDelivered == 30)
        #expect(outcome.receiver.repair == repair.rawValue)
    }

    @Test(arguments: Stack.allCases)
    func anIVFFileInReliableModeArrivesByteIdentical(stack: Stack) async throws {
        let scratch = try TemporaryDirectory()
        let input = scratch.file("in.ivf"), output = scratch.file("out.ivf")
        try MediaFileTests.ivf(frames: (0..<40).map { $0 % 10 == 0 ? 30_000 : 3_000 + $0 * 17 }).write(to: URL(fileURLWithPath: input))
        var options = Self.synthetic(frames: 1000, mode: .reliable)
        options.maximumFrames = nil
        options.frameRate = FrameRate(numerator: 120)  // a quicker test; pts are kept
        let outcome = try await Self.stream(stack: stack, options: options, output: output) { try openSource(path: input) }
        #expect(outcome.receiver.framesDelivered == 40)
        #expect(try Data(contentsOf: URL(fileURLWithPath: output)) == Data(contentsOf: URL(fileURLWithPath: input)))
    }

    @Test func aY4MFileArrivesIntactInStreamPerFrameMode() async throws {
        let scratch = try TemporaryDirectory()
        let input = scratch.file("in.y4m"), output = scratch.file("out.y4m")
        try MediaFileTests.y4m(width: 64, height: 48, frames: 20).write(to: URL(fileURLWithPath: input))
        var options = Self.synthetic(frames: 1000, mode: .streamPerFrame)
        options.frameRate = FrameRate(numerator: 100)
        let outcome = try await Self.stream(stack: .quic, options: options, output: output) { try openSource(path: input) }
        #expect(outcome.receiver.framesDelivered == 20)
        #expect(try Data(contentsOf: URL(fileURLWithPath: output)) == Data(contentsOf: URL(fileURLWithPath: input)))
    }

    static var ffmpeg: String? {
        ["/usr/bin/ffmpeg", "/usr/local/bin/ffmpeg"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Runs a program to its end; returns its exit status and standard error.
    static func run(_ executable: String, _ arguments: [String]) throws -> (status: Int32, errors: String) {
        let result = try Subprocess.runBlocking(executable, arguments)
        return (result.timedOut ? -1 : result.status, result.stderr)
    }

    /// A real VP8 stream made by ffmpeg: 2 s of test pattern, a keyframe every 10 frames.
    static func realVP8(in scratch: TemporaryDirectory) throws -> String {
        let path = scratch.file("real.ivf")
        let made = try run(ffmpeg!, ["-v", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=30", "-t", "2",
                                     "-c:v", "libvpx", "-b:v", "400k", "-g", "10", "-y", path])
        try #require(made.status == 0, "ffmpeg could not make a VP8 file: \(made.errors)")
        return path
    }

    @Test(.enabled(if: ffmpeg != nil, "ffmpeg is not installed (scripts/install-deps.sh installs it)"))
    func ffmpegReadsWhatRealtimeModeWrote() async throws {
        let scratch = try TemporaryDirectory()
        let input = try Self.realVP8(in: scratch), output = scratch.file("out.ivf")
        var options = Self.synthetic(frames: 1000, mode: .realtime)
        options.frameRate = FrameRate(numerator: 120)
        let outcome = try await Self.stream(stack: .quic, options: options, output: output) { try openSource(path: input) }
        #expect(outcome.receiver.framesDelivered == 60)
        let check = try Self.run(Self.ffmpeg!, ["-v", "error", "-i", output, "-f", "null", "-"])
        #expect(check.status == 0 && check.errors.isEmpty, "ffmpeg: \(check.errors)")
    }

    @Test(.enabled(if: ffmpeg != nil, "ffmpeg is not installed (scripts/install-deps.sh installs it)"))
    func ffmpegReadsAnIVFWithDroppedFrames() throws {
        // What realtime mode writes when frames were lost: the gap, then nothing until a keyframe.
        let scratch = try TemporaryDirectory()
        let input = try Self.realVP8(in: scratch), output = scratch.file("dropped.ivf")
        var reader = try IVFReader(ByteInput(path: input))
        var writer = try IVFWriter(output: ByteOutput(path: output), header: reader.containerHeader)
        var index: UInt64 = 0
        var written = 0
        while let next = try reader.next() {
            if [3, 4, 17, 31].contains(index) {
                try writer.skip(index)
            } else {
                try writer.write(Frame(index: index, isKeyframe: next.isKeyframe, captureTime: 0, deadline: .zero, payload: next.payload, timestamp: next.timestamp))
                written += 1
            }
            index += 1
        }
        try writer.close()
        #expect(writer.skippedForKeyframe > 0)
        let check = try Self.run(Self.ffmpeg!, ["-v", "error", "-i", output, "-f", "null", "-"])
        #expect(check.status == 0 && check.errors.isEmpty, "ffmpeg: \(check.errors)")
    }
}
