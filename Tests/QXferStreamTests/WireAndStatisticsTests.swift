import Foundation
import Testing
@testable import QXferStream

/// The control messages as pure values, the clock-offset estimate and the statistics.
@Suite struct WireAndStatisticsTests {
    static let messages: [ControlMessage] = [
        .hello(StreamHello(
            mode: .streamPerFrame, repair: .nack, frameRate: FrameRate(numerator: 30000, denominator: 1001),
            deadlineMilliseconds: 150, container: .ivf, containerHeader: Data(repeating: 7, count: 32))),
        .ready,
        .ping(id: 9, t1: 123_456_789),
        .pong(id: 9, t1: 1, t2: 2, t3: .max),
        .frame(Frame(index: 41, isKeyframe: true, captureTime: 99, deadline: .milliseconds(120), payload: Data([1, 2, 3]), timestamp: 4000)),
        .frame(Frame(index: 0, isKeyframe: false, captureTime: 0, deadline: .zero, payload: Data())),
        .end(framesSent: 300),
        .report(Data("{\"final\":true}".utf8)),
    ]

    @Test func messagesSurviveAnyChunking() throws {
        let bytes = Self.messages.map { $0.encoded() }.reduce(Data(), +)
        for chunkSize in [1, 2, 5, 7, 64, bytes.count] {
            var decoder = MessageDecoder()
            var decoded: [ControlMessage] = []
            for start in stride(from: 0, to: bytes.count, by: chunkSize) {
                decoder.append(bytes[start..<min(start + chunkSize, bytes.count)])
                while let message = try decoder.next() { decoded.append(message) }
            }
            #expect(decoded == Self.messages, "chunk size \(chunkSize)")
            #expect(decoder.pendingBytes == 0)
        }
    }

    @Test func hostileMessagesAreRefusedBeforeAllocating() {
        var oversized = MessageDecoder(limit: 1000)
        oversized.append(Data([5, 0xFF, 0xFF, 0xFF, 0xFF]))
        #expect(throws: StreamError.self) { try oversized.next() }
        for bad in [Data([99, 0, 0, 0, 0]), Data([3, 0, 0, 0, 2, 1, 2]), Data([6, 0, 0, 0, 9] + [UInt8](repeating: 0, count: 9))] {
            var decoder = MessageDecoder()
            decoder.append(bad)
            #expect(throws: StreamError.self) { try decoder.next() }
        }
    }

    @Test func clockOffsetPicksTheLeastDelayedProbe() {
        var estimator = ClockOffsetEstimator()
        // Sender's clock 5 ms ahead; path 10 ms each way; one probe queued 30 ms on the way back.
        let offset: UInt64 = 5_000_000
        for (t1, extraBack) in [(UInt64(1_000_000_000), UInt64(30_000_000)), (2_000_000_000, 0), (3_000_000_000, 4_000_000)] {
            let t2 = t1 + 10_000_000 + offset
            let t3 = t2 + 100_000
            let t4 = t3 - offset + 10_000_000 + extraBack
            estimator.add(t1: t1, t2: t2, t3: t3, t4: t4)
        }
        #expect(estimator.offset == 5_000_000)
        #expect(estimator.roundTrip == 20_000_000)
    }

    @Test func statisticsPercentilesJitterAndTotals() throws {
        var stats = StreamStatistics()
        // 100 frames at 10..109 ms, 10 kB each, one per 33 ms; the last five late.
        for index in 0..<100 {
            let latency = Int64(10 + index) * 1_000_000
            stats.record(latency: latency, bytes: 10_000, onTime: index < 95, arrival: UInt64(index) * 33_000_000)
        }
        let totals = stats.totals(framesSent: 110, clock: ClockOffsetEstimator())
        #expect(totals.framesDelivered == 95 && totals.framesLate == 5 && totals.framesLost == 10)
        #expect(abs(totals.latency.p50 - 59) <= 1)
        #expect(abs(totals.latency.p99 - 108) <= 1)
        #expect(abs(totals.latency.max - 109) < 0.2)
        // Transit changes by exactly 1 ms each frame: RFC 3550 jitter converges towards 1 ms.
        #expect(totals.jitterMilliseconds > 0.9 && totals.jitterMilliseconds <= 1.0)
        #expect(abs(totals.bitsPerSecond - 100 * 80_000 / (99 * 0.033)) < 1000)

        let line = totals.json()
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        for key in ["frames_sent", "frames_delivered", "frames_late", "frames_lost", "latency_ms", "jitter_ms"] {
            #expect(object[key] != nil, "missing \(key)")
        }
        let latency = try #require(object["latency_ms"] as? [String: Any])
        #expect(Set(latency.keys) == ["p50", "p95", "p99", "max"])
        let parsed = try #require(StreamTotals.parse(json: Data(line.utf8)))
        #expect(parsed.framesLost == 10 && parsed.latency == totals.latency)
    }

    @Test func intervalsResetButTotalsDoNot() {
        var stats = StreamStatistics()
        stats.record(latency: 5_000_000, bytes: 1000, onTime: true, arrival: 0)
        let first = stats.takeInterval(seconds: 1, clock: ClockOffsetEstimator())
        #expect(first.framesDelivered == 1 && first.bitsPerSecond == 8000)
        let second = stats.takeInterval(seconds: 1, clock: ClockOffsetEstimator())
        #expect(second.framesDelivered == 0 && second.latency.max == 0)
        #expect(stats.framesDelivered == 1)
        #expect(first.text(elapsed: 1).contains("p99"))
        #expect(first.json(elapsed: 1).contains("\"frames_delivered\":1"))
    }

    @Test func carriageDegradesHonestlyOnTLS() {
        #expect(Carriage.choose(mode: .realtime, hasQUICExtras: true) == .datagrams)
        #expect(Carriage.choose(mode: .streamPerFrame, hasQUICExtras: true) == .streamPerFrame)
        #expect(Carriage.choose(mode: .realtime, hasQUICExtras: false) == .ordered(dropsExpired: true))
        #expect(Carriage.choose(mode: .streamPerFrame, hasQUICExtras: false) == .ordered(dropsExpired: false))
        #expect(Carriage.note(mode: .realtime, hasQUICExtras: false).contains("one ordered byte stream"))
        #expect(Carriage.note(mode: .reliable, hasQUICExtras: false).isEmpty)
        #expect(Carriage.note(mode: .realtime, hasQUICExtras: true).isEmpty)
    }
}
