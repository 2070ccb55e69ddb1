import Foundation
import QXfer
import LinuxSystem
import Subprocesses
import Testing
@testable import QXferStream

/// Issue 66 §3 and §4: a stream whose picture numbers run ahead of its own clock must not fill
/// the disk, and a sender that says hello and then nothing must not hold `stream recv`.
@Suite struct HostileStreamPeerTests {
    // MARK: - §3: the output is bounded by the stream's own clock

    /// A Y4M hello: 16×16 monochrome pictures (256 bytes each) at `rate`.
    static func y4mHello(rate: FrameRate = FrameRate(numerator: 30), mode: StreamMode = .reliable) -> StreamHello {
        StreamHello(
            mode: mode, repair: .none, frameRate: rate, deadlineMilliseconds: 100, container: .y4m,
            containerHeader: Data("YUV4MPEG2 W16 H16 F30:1 Cmono\n".utf8))
    }

    static let pictureBytes = 6 + 256  // "FRAME\n" and the picture
    static let headerBytes = "YUV4MPEG2 W16 H16 F30:1 Cmono\n".utf8.count

    static func picture(_ index: UInt64, capturedAt capture: UInt64) -> Frame {
        Frame(index: index, isKeyframe: true, captureTime: capture, deadline: .milliseconds(100), payload: Data(repeating: UInt8(truncatingIfNeeded: index), count: 256))
    }

    /// A receiver core writing Y4M to `path`, its stream started at `start` (receiver's clock).
    static func core(_ hello: StreamHello, path: String, start: UInt64) throws -> ReceiverCore {
        var core = ReceiverCore(hello: hello, carriage: .ordered(dropsExpired: false), startedAt: start)
        try core.openSink { hello in try makeSink(for: hello, output: ByteOutput(path: path)) }
        return core
    }

    static func size(_ path: String) throws -> Int {
        try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
    }

    @Test("Pictures 0 and 65 536 captured 10 s ago: the gap is filled only as far as the stream's clock allows, and counted")
    func aGapAheadOfTheClockIsNotFilled() throws {
        let scratch = try TemporaryDirectory()
        let path = scratch.file("out.y4m")
        let start = WallClock.now()
        var core = try Self.core(Self.y4mHello(), path: path, start: start)
        // A legitimate second first: 30 pictures at 30 a second, picture 10 lost and filled.
        for index in UInt64(0)..<30 where index != 10 {
            let at = start + index * 33_333_334
            try core.arrived(Self.picture(index, capturedAt: at), now: at + 5_000_000)
        }
        #expect(core.output.picturesFilled == 1 && core.output.picturesNotFilled == 0, "a legitimate stream's gap is filled")
        // The attack: the next picture numbered 65 536, captured 10 s before the stream began.
        let attackAt = start + 1_000_000_000
        try core.arrived(Self.picture(65_536, capturedAt: start - 10_000_000_000), now: attackAt)
        core.framesSent = 65_537
        let totals = try core.finish(now: attackAt)
        // 1 s at 30 a second: 30 + 8 pictures at most (the last one received is always written).
        let allowance = Int(OutputBound(rate: FrameRate(numerator: 30)).allowance(elapsed: 1_000_000_000))
        #expect(allowance == 38)
        let written = (try Self.size(path) - Self.headerBytes) / Self.pictureBytes
        #expect(written <= allowance + 1, "\(written) pictures written 1 s into a 30-a-second stream")
        #expect(written >= 31, "the received pictures and the legitimate fill are written")
        // Every picture number up to 65 536 is either in the file or counted as left out.
        #expect(totals.picturesNotFilled + written == 65_537, "\(totals.picturesNotFilled) left out, \(written) written")
        #expect(totals.jsonFields()["pictures_not_filled"] as? Int == totals.picturesNotFilled)
        #expect(totals.text().contains("\(totals.picturesNotFilled) missing pictures left out"))
    }

    @Test("A hello declaring 4·10⁹ frames a second still repeats no more pictures than it sent")
    func aHostileRateDoesNotOpenTheBound() throws {
        let scratch = try TemporaryDirectory()
        let path = scratch.file("out.y4m")
        let start = WallClock.now()
        var core = try Self.core(Self.y4mHello(rate: FrameRate(numerator: 4_000_000_000)), path: path, start: start)
        // Four pictures 65 536 apart, each captured 10 s in the past, over 4 s of the stream.
        for pair in UInt64(0)..<4 {
            let now = start + pair * 1_000_000_000
            try core.arrived(Self.picture(pair * 65_536, capturedAt: start - 10_000_000_000), now: now)
        }
        core.framesSent = 3 * 65_536 + 1
        _ = try core.finish(now: start + 4_000_000_000)
        let written = (try Self.size(path) - Self.headerBytes) / Self.pictureBytes
        // 4 received, at most as many repeated: the output is at most twice what was sent.
        #expect(written <= 8, "\(written) pictures written for 4 received")
    }

    @Test("Every sum on a hostile capture time or rate saturates instead of wrapping or trapping")
    func arithmeticOnHostileNumbersSaturates() {
        // A capture time at the end of time is never late, rather than long expired.
        #expect(Self.picture(0, capturedAt: .max - 1).expiry == .max)
        #expect(Frame(index: 0, isKeyframe: true, captureTime: .max, deadline: .seconds(Int64.max), payload: Data()).expiry == .max)
        let fast = OutputBound(rate: FrameRate(numerator: .max, denominator: 1))
        #expect(fast.rate == OutputBound.maximumRate)
        #expect(fast.allowance(elapsed: 0) == OutputBound.slackPictures)
        #expect(fast.allowance(elapsed: .max) > 0)  // no trap at 2^64 ns
        let slow = OutputBound(rate: FrameRate(numerator: 1, denominator: .max))
        #expect(slow.allowance(elapsed: .max) == OutputBound.slackPictures + 4)  // 584 years at 1 / 4.3·10⁹ s
        // Picture numbers at the end of the range: one gap, no trap, nothing counted twice.
        var output = BoundedOutput(bound: fast)
        var sink = CountingSink()
        try? output.write([.frame(Self.picture(0, capturedAt: 0)), .gap(1), .frame(Self.picture(.max, capturedAt: 0))], elapsed: 0, to: &sink)
        #expect(sink.written == 2 && sink.filled == 1 && output.picturesNotFilled == UInt64.max - 2)
        output.finish(through: .max, sink: sink)
        #expect(output.picturesNotFilled == UInt64.max - 2)
    }

    /// A sink that fills gaps and counts.
    struct CountingSink: FrameSink {
        var written = 0, filled = 0, leftOut = 0
        var fillsGaps: Bool { true }
        mutating func write(_ frame: Frame) throws { written += 1 }
        mutating func skip(_ index: UInt64) throws { filled += 1 }
        mutating func leaveOut(_ index: UInt64) throws { leftOut += 1 }
        mutating func close() throws {}
    }

    // MARK: - §4: a silent or dripping sender does not hold the receiver

    static let server = try! HostIdentity.ephemeral(commonName: "hostile stream test server")
    static let client = try! HostIdentity.ephemeral(commonName: "hostile stream test client")

    /// Runs a receiver with `idleLimit` on `stack`, and a raw client that sends a hello then
    /// calls `afterHello`; returns the receiver's error and how long it took to end.
    static func silentSender(
        stack: LoopbackStreamTests.Stack, idleLimit: Duration,
        afterHello: @escaping @Sendable (_ send: @Sendable (Data) async throws -> Void) async throws -> Void
    ) async throws -> (error: String?, code: StreamError.Code?, took: Duration) {
        switch stack {
        case .quic:
            return try await silentSender(
                listener: NetworkListener(on: 0, host: "127.0.0.1") { QUIC().identity(server) },
                connect: { NetworkConnection(to: .hostPort(host: "127.0.0.1", port: $0)) { QUIC().identity(client).peerFingerprint(server.fingerprint) } },
                idleLimit: idleLimit, afterHello: afterHello)
        case .tls:
            return try await silentSender(
                listener: NetworkListener(on: 0, host: "127.0.0.1") { TLS().identity(server) },
                connect: { NetworkConnection(to: .hostPort(host: "127.0.0.1", port: $0)) { TLS().identity(client).peerFingerprint(server.fingerprint) } },
                idleLimit: idleLimit, afterHello: afterHello)
        }
    }

    static func silentSender<S: ByteStreamProtocol>(
        listener: NetworkListener<S>, connect: (UInt16) -> NetworkConnection<S>, idleLimit: Duration,
        afterHello: @escaping @Sendable (_ send: @Sendable (Data) async throws -> Void) async throws -> Void
    ) async throws -> (error: String?, code: StreamError.Code?, took: Duration) {
        let outcome = Locked<(error: String?, code: StreamError.Code?, took: Duration)?>(nil)
        let clock = ContinuousClock()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    var options = StreamReceiverOptions()
                    options.idleLimit = idleLimit
                    let start = clock.now
                    do {
                        _ = try await StreamReceiver.run(on: connection, options: options)
                        outcome.withLock { $0 = (nil, nil, clock.now - start) }
                    } catch let error as StreamError {
                        outcome.withLock { $0 = (error.message, error.code, clock.now - start) }
                    } catch {
                        outcome.withLock { $0 = ("\(error)", nil, clock.now - start) }
                    }
                }
            }
            let connection = connect(try await listener.port)
            let hello = ControlMessage.hello(y4mHello(mode: .realtime)).encoded()
            try await connection.send(hello)
            let peer = Task { try? await afterHello { try await connection.send($0) } }
            // Without a limit the receiver waits 365 days: give up on it at the limit + 5 s.
            let giveUp = clock.now + idleLimit + .seconds(5)
            while outcome.withLock({ $0 }) == nil && clock.now < giveUp { try await Task.sleep(for: .milliseconds(20)) }
            peer.cancel()
            connection.cancel()
            group.cancelAll()
            return outcome.withLock { $0 } ?? ("still waiting \(idleLimit + .seconds(5)) after the hello", nil, idleLimit + .seconds(5))
        }
    }

    @Test("Hello, then silence: the stream ends at the idle limit with one line", arguments: LoopbackStreamTests.Stack.allCases)
    func aSilentSenderEndsAtTheIdleLimit(stack: LoopbackStreamTests.Stack) async throws {
        let result = try await Self.silentSender(stack: stack, idleLimit: .milliseconds(700)) { _ in
            try await Task.sleep(for: .seconds(60))
        }
        #expect(result.code == .timeout, "\(result.error ?? "finished")")
        #expect(result.error.map { $0.contains("no frame for 0.7 s") && !$0.contains("\n") } == true, "\(result.error ?? "")")
        #expect(result.took < .seconds(3), "ended after \(result.took)")
    }

    @Test("A drip that never completes a frame does not reset the idle limit", arguments: LoopbackStreamTests.Stack.allCases)
    func aDripDoesNotResetTheIdleLimit(stack: LoopbackStreamTests.Stack) async throws {
        let result = try await Self.silentSender(stack: stack, idleLimit: .milliseconds(700)) { send in
            // A frame message announcing 1 MiB, then one byte of it every 100 ms.
            var header = Data([5])
            withUnsafeBytes(of: UInt32(1 << 20).bigEndian) { header.append(contentsOf: $0) }
            try await send(header)
            while true {
                try await Task.sleep(for: .milliseconds(100))
                try await send(Data([0]))
            }
        }
        #expect(result.code == .timeout, "\(result.error ?? "finished")")
        #expect(result.took < .seconds(3), "ended after \(result.took)")
    }

    @Test("The idle watch counts only new frames, on the clock it is given")
    func theIdleWatchCountsFramesOnly() {
        let start = ContinuousClock.now
        var watch = IdleWatch(limit: .seconds(10), now: start)
        let steps = [
            watch.expired(framesArrived: 0, now: start + .seconds(9)),
            watch.expired(framesArrived: 1, now: start + .seconds(9)),  // a frame: counted from here
            watch.expired(framesArrived: 1, now: start + .seconds(18)),
            watch.expired(framesArrived: 1, now: start + .seconds(19)),
        ]
        #expect(steps == [false, false, false, true])
        #expect(IdleWatch(limit: .milliseconds(500), now: start).limitText == "0.5 s")
    }

    // MARK: - §4 end to end: `qxfer stream recv` is not locked to a silent sender

    static let qxfer = NamespaceStreamTests.buildFolder + "/qxfer"
    static var built: Bool { FileManager.default.isExecutableFile(atPath: qxfer) }

    @Test(.enabled(if: built, "qxfer is not built"), arguments: ["quic", "tls"])
    func aLegitimateSenderIsServedBehindASilentOne(stack: String) async throws {
        let scratch = try TemporaryDirectory()
        let identity = try await Subprocess.run(Self.qxfer, ["id", "--config-dir", scratch.file("recv")], timeout: .seconds(30))
        let fingerprint = try #require(Fingerprint(parsing: identity.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        let port = UInt16(40000 + Int(getpid() % 10000) * 2 + (stack == "tls" ? 1 : 0))
        async let receiver = Subprocess.run(
            Self.qxfer, ["stream", "recv", "--port", "\(port)", "--json", "--idle-limit", "1", "--config-dir", scratch.file("recv")],
            timeout: .seconds(40))
        try await Task.sleep(for: .milliseconds(700))
        // The silent sender: a hello, then nothing, holding its connection open.
        let hello = ControlMessage.hello(Self.y4mHello(mode: .realtime)).encoded()
        let silent: @Sendable () async throws -> Void
        switch stack {
        case "quic":
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                QUIC().identity(Self.client).peerFingerprint(fingerprint)
            }
            try await connection.send(hello)
            silent = { try await Task.sleep(for: .seconds(30)); connection.cancel() }
        default:
            let connection = NetworkConnection(to: .hostPort(host: "127.0.0.1", port: port)) {
                TLS().identity(Self.client).peerFingerprint(fingerprint)
            }
            try await connection.send(hello)
            silent = { try await Task.sleep(for: .seconds(30)); connection.cancel() }
        }
        let holder = Task { try? await silent() }
        defer { holder.cancel() }
        try await Task.sleep(for: .milliseconds(200))
        let clock = ContinuousClock()
        let start = clock.now
        let sender = try await Subprocess.run(Self.qxfer, [
            "stream", "send", "127.0.0.1:\(port)", "--stack", stack, "--mode", "reliable", "--duration", "1",
            "--fingerprint", fingerprint.description, "--config-dir", scratch.file("send"), "--json",
        ], timeout: .seconds(30))
        let took = clock.now - start
        let received = try await receiver
        #expect(sender.status == 0, "sender: \(sender.stderr)")
        #expect(received.status == 0, "receiver: \(received.stderr)")
        // With --json the warning is an event on standard output.
        #expect(received.stdout.contains("ended a stream that sent no frame"), "\(received.stdout)")
        #expect(received.stdout.contains("\"final\":true"), "\(received.stdout)")
        // The idle limit (1 s), then a 1 s stream and its setup.
        #expect(took < .seconds(8), "the legitimate sender took \(took)")
    }
}
