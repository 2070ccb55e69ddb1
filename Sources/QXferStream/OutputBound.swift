import FoundationEssentials

/// Where the receiver writes frames, in order; gaps are frames that did not come in time.
public protocol FrameSink {
    /// Writes the next frame in order.
    mutating func write(_ frame: Frame) throws
    /// Notes that frame `index` will not come.
    mutating func skip(_ index: UInt64) throws
    /// Whether ``skip(_:)`` writes a picture in place of the missing one (Y4M repeats the
    /// previous one); the receiver then fills only within the stream's ``OutputBound``.
    var fillsGaps: Bool { get }
    /// Notes that frame `index` will not come and must not be filled: the output is at its
    /// bound. A sink whose ``skip(_:)`` writes anything must implement this.
    mutating func leaveOut(_ index: UInt64) throws
    /// Finishes the output.
    mutating func close() throws
}

extension FrameSink {
    /// A sink that does not say otherwise writes nothing for a gap.
    public var fillsGaps: Bool { false }
    /// For a sink that writes nothing for a gap, leaving one out is skipping it.
    public mutating func leaveOut(_ index: UInt64) throws { try skip(index) }
}

/// How many pictures a stream's output may hold at a moment of the stream: its timeline at the
/// declared rate, plus a small slack.
///
/// A sender cannot legitimately have sent picture `n` before `n / rate` seconds of the stream:
/// it paces frames from its start, which follows the receiver's hello. So a gap the receiver
/// would fill beyond that timeline can only come from picture numbers that skip ahead (a broken
/// or hostile sender): 2 tiny frames numbered 0 and 65 536 must not become 65 535 repeated
/// pictures of 3 MiB each (issue 66 §3).
public struct OutputBound: Sendable, Hashable {
    /// The fastest rate the bound believes: `qxfer stream send --fps` goes up to 1000; a hello
    /// declaring more is bounded as 1000 a second.
    public static let maximumRate = FrameRate(numerator: 1000)
    /// Pictures allowed beyond the timeline: the rounding of the first ones.
    public static let slackPictures: UInt64 = 8
    /// A further allowance of timeline / `driftDivisor` (0.1 %): the sender paces on its own
    /// clock, which may run that much faster than the receiver's.
    public static let driftDivisor: UInt64 = 1000

    /// The rate the bound uses: the declared one, at most ``maximumRate``.
    public let rate: FrameRate

    /// - Parameter rate: the rate the sender declared in its hello.
    public init(rate: FrameRate) {
        // Compared as fractions in UInt64: each side is a product of two UInt32.
        let declared = UInt64(rate.numerator) * UInt64(Self.maximumRate.denominator)
        let limit = UInt64(Self.maximumRate.numerator) * UInt64(rate.denominator)
        self.rate = declared > limit ? Self.maximumRate : rate
    }

    /// Pictures the output may hold `elapsed` nanoseconds into the stream:
    /// ⌊elapsed × rate⌋ × 1.001 + 8, saturating at `UInt64.max` (never trapping, whatever the rate).
    public func allowance(elapsed: UInt64) -> UInt64 {
        // elapsed × numerator / (denominator × 10⁹) in 128 bits: exact, and an overflow of the
        // quotient is seen before dividing rather than trapped in it.
        let (divisor, divisorOverflow) = UInt64(rate.denominator).multipliedReportingOverflow(by: 1_000_000_000)
        guard !divisorOverflow else { return .max }
        let product = elapsed.multipliedFullWidth(by: UInt64(rate.numerator))
        guard product.high < divisor else { return .max }
        let timeline = divisor.dividingFullWidth(product).quotient
        let (withDrift, driftOverflow) = timeline.addingReportingOverflow(timeline / Self.driftDivisor)
        let (total, slackOverflow) = withDrift.addingReportingOverflow(Self.slackPictures)
        return driftOverflow || slackOverflow ? .max : total
    }
}

/// Carries the playout's items to a sink within the stream's ``OutputBound``, and counts what
/// the bound left out.
///
/// For a sink that fills gaps (Y4M repeats the previous picture), a missing picture is filled
/// only while both hold: the pictures written so far (received and repeated) stay within the
/// bound's allowance at that moment, and the repeated ones do not outnumber the received ones,
/// so the output is never more than twice the picture bytes the sender paid for. Anything else
/// is left out (``FrameSink/leaveOut(_:)``) and counted in ``picturesNotFilled``. Received
/// pictures are always written: each costs the sender its own bytes, and an IVF sender paces
/// by pts, which may run faster than the rate its header declares.
public struct BoundedOutput: Sendable {
    /// The bound in force.
    public let bound: OutputBound
    /// Pictures written: received ones and repeated ones.
    public private(set) var picturesWritten: UInt64 = 0
    /// Pictures repeated in place of missing ones.
    public private(set) var picturesFilled: UInt64 = 0
    /// Missing pictures left out instead of filled: past the bound, or in a run longer than
    /// ``PlayoutBuffer/longestGap`` that the playout skipped as one gap. Zero for sinks that
    /// do not fill.
    public private(set) var picturesNotFilled: UInt64 = 0
    /// The index after the last item carried: an item further on means the playout jumped.
    private var nextIndex: UInt64 = 0

    public init(bound: OutputBound) { self.bound = bound }

    /// Writes `items` to `sink`, `elapsed` nanoseconds into the stream.
    public mutating func write<Sink: FrameSink>(_ items: [PlayoutBuffer.Item], elapsed: UInt64, to sink: inout Sink) throws {
        let fills = sink.fillsGaps
        for item in items {
            let index: UInt64
            switch item {
            case .frame(let frame): index = frame.index
            case .gap(let gap): index = gap
            }
            // Items come in increasing order; one further on than the next index follows a run
            // the playout skipped without an item per picture.
            if fills, index > nextIndex { picturesNotFilled = Self.sum(picturesNotFilled, index - nextIndex) }
            switch item {
            case .frame(let frame):
                try sink.write(frame)
                picturesWritten = Self.sum(picturesWritten, 1)
            case .gap(let gap) where !fills:
                try sink.skip(gap)
            case .gap(let gap):
                let received = picturesWritten - picturesFilled
                if picturesFilled < received && picturesWritten < bound.allowance(elapsed: elapsed) {
                    try sink.skip(gap)
                    picturesWritten = Self.sum(picturesWritten, 1)
                    picturesFilled = Self.sum(picturesFilled, 1)
                } else {
                    try sink.leaveOut(gap)
                    picturesNotFilled = Self.sum(picturesNotFilled, 1)
                }
            }
            // Index 2^64 - 1 is the last: nothing follows it.
            let (after, overflow) = index.addingReportingOverflow(1)
            nextIndex = overflow ? .max : max(nextIndex, after)
        }
    }

    /// Counts what the playout passed over without an item at the end of the stream: every
    /// index below `end` (the playout's next index once it released everything).
    public mutating func finish<Sink: FrameSink>(through end: UInt64, sink: Sink) {
        if sink.fillsGaps, end > nextIndex { picturesNotFilled = Self.sum(picturesNotFilled, end - nextIndex) }
        nextIndex = max(nextIndex, end)
    }

    private static func sum(_ a: UInt64, _ b: UInt64) -> UInt64 {
        let (total, overflow) = a.addingReportingOverflow(b)
        return overflow ? .max : total
    }
}
