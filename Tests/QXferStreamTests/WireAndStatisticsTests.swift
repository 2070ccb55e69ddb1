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
        .stop(reason: "the reader of standard output closed it ✓"),
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

    @Test("A stop reason: cut to 1024 bytes at a character boundary when sent; longer, or not UTF-8, refused when read")
    func stopReasonsAreBounded() throws {
        let long = String(repeating: "é", count: 600)  // 1200 bytes
        var decoder = MessageDecoder()
        decoder.append(ControlMessage.stop(reason: long).encoded())
        #expect(try decoder.next() == .stop(reason: String(repeating: "é", count: 512)))
        for body in [Data(repeating: 0x61, count: 1025), Data([0x61, 0xFF])] {
            var hostile = MessageDecoder()
            hostile.append(Data([8, 0, 0, UInt8(body.count >> 8), UInt8(body.count & 0xFF)]) + body)
            #expect(throws: StreamError.self) { try hostile.next() }
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
        #expect(parsed.jitterMilliseconds == (totals.jitterMilliseconds * 1000).rounded() / 1000)
        #expect(parsed.bitsPerSecond == Double(Int(totals.bitsPerSecond)))
    }

    /// The final report is the peer's: a line that is not one, or whose numbers do not fit, is
    /// refused whole (nil), never trapped on or half-read.
    @Test func aHostileFinalReportIsRefused() {
        let valid = #"{"final":true,"frames_sent":3,"frames_delivered":2,"frames_late":1,"frames_lost":0,"latency_ms":{"p50":1,"max":2.5},"rtt_ms":12}"#
        let parsed = StreamTotals.parse(json: Data(valid.utf8))
        #expect(parsed?.framesDelivered == 2 && parsed?.latency.max == 2.5 && parsed?.roundTripMilliseconds == 12)
        for line in [
            valid.replacingOccurrences(of: #""frames_sent":3"#, with: #""frames_sent":1e30"#),
            valid.replacingOccurrences(of: #""frames_sent":3"#, with: #""frames_sent":"3""#),
            valid.replacingOccurrences(of: #""final":true"#, with: #""final":false"#),
            valid.replacingOccurrences(of: #""latency_ms":{"p50":1,"max":2.5}"#, with: #""latency_ms":[1]"#),
            String(valid.dropLast(9)), "", "[]", String(repeating: "[", count: 100_000),
        ] {
            #expect(StreamTotals.parse(json: Data(line.utf8)) == nil, "\(line.prefix(80))")
        }
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

/// Numbers from a hostile or broken sender (issue 17 §1): frame indices, frame counts and
/// timestamps at the extremes must not trap the receiver nor make it write without end.
@Suite struct HostileStreamNumberTests {
    static func frame(_ index: UInt64, captureTime: UInt64 = 0) -> Frame {
        Frame(index: index, isKeyframe: true, captureTime: captureTime, deadline: .milliseconds(100), payload: Data([1]))
    }

    @Test func aFrameAtIndexTwoToTheSixtyFourIsWrittenWithoutTrapping() {
        var playout = PlayoutBuffer()
        let added = [playout.add(Self.frame(0)), playout.add(Self.frame(.max))]
        #expect(added == [true, true])
        // Overdue at once (capture time 0): the run of missing frames is skipped as one gap.
        let items = playout.release(now: .max)
        #expect(items == [.frame(Self.frame(0)), .gap(1), .frame(Self.frame(.max))])
        #expect(playout.nextIndex == .max)
        #expect(playout.release(now: .max).isEmpty)
    }

    @Test func anEndAnnouncingTwoToTheSixtyThreeFramesGivesOneGapNotTwoToTheSixtyThree() {
        var playout = PlayoutBuffer()
        playout.add(Self.frame(0, captureTime: .max - 1))
        playout.add(Self.frame(3, captureTime: .max - 1))
        let items = playout.release(now: 0, through: 1 << 63)
        #expect(items == [.frame(Self.frame(0, captureTime: .max - 1)), .gap(1), .gap(2), .frame(Self.frame(3, captureTime: .max - 1)), .gap(4)])
        #expect(playout.nextIndex == 1 << 63)
    }

    @Test func shortGapsAreStillOneItemPerFrame() {
        var playout = PlayoutBuffer()
        playout.add(Self.frame(PlayoutBuffer.longestGap))
        let items = playout.release(now: .max)
        #expect(items.count == Int(PlayoutBuffer.longestGap) + 1)
    }

    @Test func extremeProbeTimestampsAreNoSampleInsteadOfATrap() {
        var estimator = ClockOffsetEstimator()
        // A round trip of -2^63 minus a turnaround of 1 ns does not fit in 64 bits.
        estimator.add(t1: 0, t2: 0, t3: 1, t4: 1 << 63)
        #expect(estimator.best == nil)
        estimator.add(t1: 100, t2: 150, t3: 160, t4: 200)
        #expect(estimator.roundTrip == 90)
    }

    @Test func latenciesFarApartDoNotTrapTheJitter() {
        var stats = StreamStatistics()
        stats.record(latency: .max, bytes: 1, onTime: true, arrival: 1)
        stats.record(latency: .min, bytes: 1, onTime: false, arrival: 2)
        stats.record(latency: .max, bytes: 1, onTime: true, arrival: 3)
        let totals = stats.totals(framesSent: .max, clock: ClockOffsetEstimator())
        #expect(totals.framesLost == Int.max - 3)
        #expect(totals.jitterMilliseconds.isFinite)
    }
}
