import FoundationEssentials
import Glibc
import Histogram
import PlainText

/// Estimates how far the sender's clock is ahead of the receiver's from NTP-style probes
/// over the connection (RFC 5905 section 8).
///
/// The receiver sends `t1`; the sender stamps arrival `t2` and departure `t3`; the receiver
/// notes arrival `t4`. offset θ = ((t2 − t1) + (t3 − t4)) / 2, round trip δ = (t4 − t1) − (t3 − t2).
/// Of the last 64 samples (a probe a second: about a minute) the one with the smallest δ wins,
/// as in NTP's clock filter: queueing inflates δ and skews θ, so the least-delayed probe is the
/// most honest one. The window is long because on one ordered stream (TCP+TLS) the answers
/// queue behind frames for as long as the stream is busy; clocks drift by parts per million,
/// so a minute-old sample is still good.
public struct ClockOffsetEstimator: Sendable, Hashable {
    /// One probe's result.
    public struct Sample: Sendable, Hashable {
        /// Sender's clock minus receiver's clock, ns.
        public var offset: Int64
        /// Round trip without the sender's turnaround, ns.
        public var roundTrip: Int64
    }

    private var samples: [Sample] = []
    /// Samples taken so far.
    public private(set) var count = 0

    public init() {}

    /// Adds one probe's four timestamps.
    public mutating func add(t1: UInt64, t2: UInt64, t3: UInt64, t4: UInt64) {
        let forward = Int64(bitPattern: t2 &- t1), backward = Int64(bitPattern: t3 &- t4)
        // t2 and t3 are the peer's: a turnaround that does not fit in 64 bits is no sample.
        let (roundTrip, overflow) = Int64(bitPattern: t4 &- t1).subtractingReportingOverflow(Int64(bitPattern: t3 &- t2))
        guard !overflow else { return }
        samples.append(Sample(offset: forward / 2 + backward / 2, roundTrip: max(0, roundTrip)))
        if samples.count > 64 { samples.removeFirst() }
        count += 1
    }

    /// The best sample: the least-delayed of the recent ones; nil before any.
    public var best: Sample? { samples.min { $0.roundTrip < $1.roundTrip } }
    /// Sender minus receiver clock, ns (0 before any sample).
    public var offset: Int64 { best?.offset ?? 0 }
    /// The smallest recent round trip, ns.
    public var roundTrip: Int64? { best?.roundTrip }
}

/// Per-frame latency, delivery and rate, as the receiver measures them.
///
/// Latency is one-way: arrival (receiver's clock plus the estimated offset) minus capture
/// (sender's clock), recorded in microseconds in an HdrHistogram for every frame that
/// arrives whole, late ones included (they are what p99 and max are about). Jitter is RFC 3550's
/// interarrival jitter: J += (|D| − J) / 16 with D the change in one-way transit between
/// consecutive arrivals.
public struct StreamStatistics: Sendable {
    private var total = Histogram<UInt64>(lowestDiscernibleValue: 1, highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .three)
    private var interval = Histogram<UInt64>(lowestDiscernibleValue: 1, highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: .three)
    /// Frames on time, late, and bytes received so far.
    public private(set) var framesDelivered = 0
    public private(set) var framesLate = 0
    public private(set) var bytesReceived = 0
    /// Frames whose computed latency was negative (clock estimate off by more than the delay).
    public private(set) var negativeLatencies = 0
    private var intervalDelivered = 0
    private var intervalLate = 0
    private var intervalBytes = 0
    private var jitter: Double = 0
    private var lastTransit: Int64?
    private var firstArrival: UInt64?
    private var lastArrival: UInt64?
    /// Frames counted so far: one past the highest index seen.
    private var framesSeen: UInt64 = 0
    /// Frames below `framesSeen` missing at the last interval, already reported lost.
    private var missingReported = 0

    public init() {}

    /// Records one frame that arrived whole.
    ///
    /// - Parameters:
    ///   - latency: one-way latency, ns (may be negative if the clock estimate is off).
    ///   - bytes: the frame's size.
    ///   - onTime: whether it arrived before its deadline.
    ///   - arrival: the receiver's clock at arrival, ns.
    ///   - index: the frame's index, if known: gaps below the highest index count as lost
    ///     frames in the interval report.
    public mutating func record(latency: Int64, bytes: Int, onTime: Bool, arrival: UInt64, index: UInt64? = nil) {
        if let index, index < UInt64(Int.max) { framesSeen = max(framesSeen, index + 1) }
        if latency < 0 { negativeLatencies += 1 }
        let micros = UInt64(max(0, latency) / 1000)
        _ = total.record(micros)
        _ = interval.record(micros)
        if onTime {
            framesDelivered += 1
            intervalDelivered += 1
        } else {
            framesLate += 1
            intervalLate += 1
        }
        bytesReceived += bytes
        intervalBytes += bytes
        // In Double: latencies come from the peer's timestamps, their difference may not fit in Int64.
        if let lastTransit { jitter += (abs(Double(latency) - Double(lastTransit)) - jitter) / 16 }
        lastTransit = latency
        if firstArrival == nil { firstArrival = arrival }
        lastArrival = arrival
    }

    /// The figures since the last call (and resets the interval).
    ///
    /// - Parameter framesSent: for the stream's last interval, the frames the sender said it
    ///   sent: those that never arrived, after the highest index seen too, are lost in it, so
    ///   the intervals together account for every frame sent.
    public mutating func takeInterval(seconds: Double, clock: ClockOffsetEstimator, framesSent: Int? = nil) -> IntervalReport {
        defer {
            interval.reset()
            intervalDelivered = 0
            intervalLate = 0
            intervalBytes = 0
        }
        // Frames below the highest index that have not arrived: lost, unless they still come.
        let missing = max(0, max(Int(framesSeen), framesSent ?? 0) - framesDelivered - framesLate)
        defer { missingReported = max(missingReported, missing) }
        return IntervalReport(
            framesDelivered: intervalDelivered, framesLate: intervalLate, framesLost: max(0, missing - missingReported),
            latency: LatencySummary(interval), jitterMilliseconds: jitter / 1e6,
            bitsPerSecond: seconds > 0 ? Double(intervalBytes * 8) / seconds : 0,
            clockOffsetMilliseconds: Double(clock.offset) / 1e6,
            roundTripMilliseconds: clock.roundTrip.map { Double($0) / 1e6 })
    }

    /// The totals once the sender said how many frames it sent.
    public func totals(framesSent: Int, clock: ClockOffsetEstimator) -> StreamTotals {
        let seconds = arrivalSpan(firstArrival ?? 0, lastArrival ?? 0)
        return StreamTotals(
            framesSent: framesSent, framesDelivered: framesDelivered, framesLate: framesLate,
            framesLost: max(0, framesSent - framesDelivered - framesLate),
            latency: LatencySummary(total), jitterMilliseconds: jitter / 1e6,
            bitsPerSecond: seconds > 0 ? Double(bytesReceived * 8) / seconds : 0, bytesReceived: bytesReceived,
            clockOffsetMilliseconds: Double(clock.offset) / 1e6,
            roundTripMilliseconds: clock.roundTrip.map { Double($0) / 1e6 }, negativeLatencies: negativeLatencies)
    }
}

private func arrivalSpan(_ first: UInt64, _ last: UInt64) -> Double { last > first ? Double(last - first) / 1e9 : 0 }

/// Latency percentiles in milliseconds.
public struct LatencySummary: Sendable, Hashable, Codable {
    /// Percentiles and maximum, ms.
    public var p50: Double
    public var p95: Double
    public var p99: Double
    public var max: Double

    public init(p50: Double, p95: Double, p99: Double, max: Double) {
        self.p50 = p50
        self.p95 = p95
        self.p99 = p99
        self.max = max
    }

    init(_ histogram: Histogram<UInt64>) {
        guard histogram.totalCount > 0 else {
            self.init(p50: 0, p95: 0, p99: 0, max: 0)
            return
        }
        func ms(_ micros: UInt64) -> Double { (Double(micros) / 1000 * 1000).rounded() / 1000 }
        self.init(
            p50: ms(histogram.valueAtPercentile(50)), p95: ms(histogram.valueAtPercentile(95)),
            p99: ms(histogram.valueAtPercentile(99)), max: ms(histogram.maxRecorded))
    }
}

/// One second of the stream, for the live report.
public struct IntervalReport: Sendable, Hashable {
    /// Frames on time and late in the interval, their latency, jitter (RFC 3550), bit rate, clock offset and RTT.
    public var framesDelivered: Int
    public var framesLate: Int
    /// Frames that went missing in the interval (gaps in the frame indices so far).
    public var framesLost = 0
    public var latency: LatencySummary
    public var jitterMilliseconds: Double
    public var bitsPerSecond: Double
    public var clockOffsetMilliseconds: Double
    public var roundTripMilliseconds: Double?

    /// One line for a terminal.
    public func text(elapsed: Double) -> String {
        typealias T = TextFormat
        return "\(T.fixed(elapsed, places: 1, width: 5))s  \(T.rightAligned(framesDelivered, width: 3)) frames  "
            + "\(T.rightAligned(framesLate, width: 3)) late  latency p50 \(T.fixed(latency.p50, places: 1, width: 6)) "
            + "p95 \(T.fixed(latency.p95, places: 1, width: 6)) p99 \(T.fixed(latency.p99, places: 1, width: 6)) "
            + "max \(T.fixed(latency.max, places: 1, width: 6)) ms  jitter \(T.fixed(jitterMilliseconds, places: 2, width: 5)) ms  "
            + "\(T.fixed(bitsPerSecond / 1e6, places: 2, width: 7)) Mbit/s  offset \(T.fixed(clockOffsetMilliseconds, places: 2, width: 0, signed: true)) ms"
    }

    /// One JSON line.
    public func json(elapsed: Double) -> String { JSONText.object(jsonFields(elapsed: elapsed)) }

    /// The fields of ``json(elapsed:)``, for a caller that adds its own.
    public func jsonFields(elapsed: Double) -> [String: Any] {
        var object: [String: Any] = [
            "t": rounded(elapsed), "frames_delivered": framesDelivered, "frames_late": framesLate, "frames_lost": framesLost,
            "latency_ms": latency.dictionary, "jitter_ms": rounded(jitterMilliseconds),
            "bitrate_bps": Int(bitsPerSecond), "clock_offset_ms": rounded(clockOffsetMilliseconds),
        ]
        if let roundTripMilliseconds { object["rtt_ms"] = rounded(roundTripMilliseconds) }
        return object
    }
}

/// Everything the receiver counted, once the stream ended.
public struct StreamTotals: Sendable, Hashable, Codable {
    /// Frames the sender offered.
    public var framesSent: Int
    /// Frames that arrived whole before their deadline.
    public var framesDelivered: Int
    /// Frames that arrived whole after their deadline (dropped from realtime output).
    public var framesLate: Int
    /// Frames that never arrived whole: sent − delivered − late.
    public var framesLost: Int
    /// One-way latency of every frame that arrived whole, jitter, payload bit rate and bytes, clock offset, RTT, and frames whose latency came out negative.
    public var latency: LatencySummary
    public var jitterMilliseconds: Double
    public var bitsPerSecond: Double
    public var bytesReceived: Int
    public var clockOffsetMilliseconds: Double
    public var roundTripMilliseconds: Double?
    public var negativeLatencies: Int
    /// The mode, stack and repair actually used, and how the mode degraded, if it did.
    public var mode: String = ""
    public var stack: String = ""
    public var repair: String = ""
    public var note: String = ""
    /// Realtime repair counters: blocks rebuilt from parity, shards requested, retransmissions received.
    public var blocksRecovered = 0
    public var shardsRequested = 0
    public var retransmissionsReceived = 0
    /// Missing pictures the output left out instead of repeating them (Y4M): the stream's
    /// picture numbers ran ahead of its own clock (``OutputBound``), or a run was longer than
    /// ``PlayoutBuffer/longestGap``. The output's timeline is that much shorter.
    public var picturesNotFilled = 0

    public init(
        framesSent: Int, framesDelivered: Int, framesLate: Int, framesLost: Int, latency: LatencySummary,
        jitterMilliseconds: Double, bitsPerSecond: Double, bytesReceived: Int, clockOffsetMilliseconds: Double,
        roundTripMilliseconds: Double?, negativeLatencies: Int
    ) {
        self.framesSent = framesSent
        self.framesDelivered = framesDelivered
        self.framesLate = framesLate
        self.framesLost = framesLost
        self.latency = latency
        self.jitterMilliseconds = jitterMilliseconds
        self.bitsPerSecond = bitsPerSecond
        self.bytesReceived = bytesReceived
        self.clockOffsetMilliseconds = clockOffsetMilliseconds
        self.roundTripMilliseconds = roundTripMilliseconds
        self.negativeLatencies = negativeLatencies
    }

    /// The share of sent frames delivered on time.
    public var deliveredRatio: Double { framesSent > 0 ? Double(framesDelivered) / Double(framesSent) : 0 }

    /// The final JSON line: `frames_sent`, `frames_delivered`, `frames_late`, `frames_lost`,
    /// `latency_ms` {p50, p95, p99, max}, `jitter_ms`, and the rest of the totals.
    public func json() -> String { JSONText.object(jsonFields()) }

    /// The fields of ``json()``, for a caller that adds its own.
    public func jsonFields() -> [String: Any] {
        func ratio(_ n: Int) -> Double { framesSent > 0 ? (Double(n) / Double(framesSent) * 1e6).rounded() / 1e6 : 0 }
        var object: [String: Any] = [
            "final": true, "frames_sent": framesSent, "frames_delivered": framesDelivered, "frames_late": framesLate,
            "frames_lost": framesLost, "delivered_ratio": ratio(framesDelivered), "late_ratio": ratio(framesLate),
            "lost_ratio": ratio(framesLost), "latency_ms": latency.dictionary, "jitter_ms": rounded(jitterMilliseconds),
            "bitrate_bps": Int(bitsPerSecond), "bytes_received": bytesReceived,
            "clock_offset_ms": rounded(clockOffsetMilliseconds), "negative_latencies": negativeLatencies,
            "mode": mode, "stack": stack, "repair": repair,
            "blocks_recovered": blocksRecovered, "shards_requested": shardsRequested,
            "retransmissions_received": retransmissionsReceived,
        ]
        if let roundTripMilliseconds { object["rtt_ms"] = rounded(roundTripMilliseconds) }
        if !note.isEmpty { object["note"] = note }
        if picturesNotFilled > 0 { object["pictures_not_filled"] = picturesNotFilled }
        return object
    }

    /// Reads back a final line printed by ``json()``; nil if it is not one.
    public static func parse(json line: Data) -> StreamTotals? {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        guard let final = try? decoder.decode(FinalLine.self, from: line), final.final else { return nil }
        let latency = final.latencyMs
        var totals = StreamTotals(
            framesSent: final.framesSent, framesDelivered: final.framesDelivered, framesLate: final.framesLate,
            framesLost: final.framesLost,
            latency: LatencySummary(p50: latency["p50"] ?? 0, p95: latency["p95"] ?? 0, p99: latency["p99"] ?? 0, max: latency["max"] ?? 0),
            jitterMilliseconds: final.jitterMs ?? 0, bitsPerSecond: Double(final.bitrateBps ?? 0),
            bytesReceived: final.bytesReceived ?? 0, clockOffsetMilliseconds: final.clockOffsetMs ?? 0,
            roundTripMilliseconds: final.rttMs, negativeLatencies: final.negativeLatencies ?? 0)
        totals.mode = final.mode ?? ""
        totals.stack = final.stack ?? ""
        totals.repair = final.repair ?? ""
        totals.note = final.note ?? ""
        totals.blocksRecovered = final.blocksRecovered ?? 0
        totals.shardsRequested = final.shardsRequested ?? 0
        totals.retransmissionsReceived = final.retransmissionsReceived ?? 0
        totals.picturesNotFilled = final.picturesNotFilled ?? 0
        return totals
    }

    /// The final line as ``json()`` writes it, its snake-case keys converted (the peer's line:
    /// every field is type-checked, a number beyond Int refuses the line).
    private struct FinalLine: Decodable {
        let final: Bool
        let framesSent, framesDelivered, framesLate, framesLost: Int
        let latencyMs: [String: Double]
        let jitterMs, clockOffsetMs, rttMs: Double?
        let bitrateBps, bytesReceived, negativeLatencies: Int?
        let mode, stack, repair, note: String?
        let blocksRecovered, shardsRequested, retransmissionsReceived, picturesNotFilled: Int?
    }

    /// A few lines for a terminal, none over ``StreamReportText/width`` columns: what ran
    /// (mode, stack, repair, clock offset), the frames, the latency and rate, then any note.
    /// The peer's words (mode, stack, repair, note) are shown escaped.
    public func text() -> String {
        typealias T = TextFormat
        func pct(_ n: Int) -> String { T.fixed(framesSent > 0 ? Double(n) * 100 / Double(framesSent) : 0, places: 2) + "%" }
        func said(_ text: String) -> String { TerminalText.escaped(text) }
        var lines = StreamReportText.lines([
            "\(said(mode)) over \(said(StreamReportText.stackName(stack)))\(repair.isEmpty ? "" : " (repair: \(said(repair)))")",
            "clock offset \(T.fixed(clockOffsetMilliseconds, places: 2, width: 0, signed: true)) ms"
                + (roundTripMilliseconds.map { " (rtt \(T.fixed($0, places: 1)) ms)" } ?? ""),
        ])
        lines += StreamReportText.lines([
            "\(framesSent) frames sent", "\(framesDelivered) on time (\(pct(framesDelivered)))",
            "\(framesLate) late (\(pct(framesLate)))", "\(framesLost) lost (\(pct(framesLost)))",
        ])
        lines += StreamReportText.lines([
            "latency p50 \(T.fixed(latency.p50, places: 1)) p95 \(T.fixed(latency.p95, places: 1)) "
                + "p99 \(T.fixed(latency.p99, places: 1)) max \(T.fixed(latency.max, places: 1)) ms",
            "jitter \(T.fixed(jitterMilliseconds, places: 2)) ms", "\(T.fixed(bitsPerSecond / 1e6, places: 2)) Mbit/s",
        ])
        if !note.isEmpty { lines += StreamReportText.wrapped("note: \(said(note))") }
        if picturesNotFilled > 0 {
            lines += StreamReportText.wrapped(
                "output: \(picturesNotFilled) missing pictures left out, not repeated (picture numbers ran ahead of the stream's clock and rate)")
        }
        return lines.joined(separator: "\n")
    }
}

extension LatencySummary {
    var dictionary: [String: Double] { ["p50": p50, "p95": p95, "p99": p99, "max": max] }
}

private func rounded(_ value: Double) -> Double { (value * 1000).rounded() / 1000 }

