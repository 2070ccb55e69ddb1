/// A point on the driver's monotonic clock, in nanoseconds.
///
/// The engine never reads a clock: every input carries a `QUICTime` the driver
/// took from its own monotonic clock (or a test's virtual clock). ngtcp2 calls
/// this an `ngtcp2_tstamp`; the value is passed through unchanged.
public struct QUICTime: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Nanoseconds since an arbitrary, fixed origin chosen by the driver.
    public var nanoseconds: UInt64

    /// Creates a time from nanoseconds since the driver's origin.
    public init(nanoseconds: UInt64) {
        self.nanoseconds = nanoseconds
    }

    /// A time later than every other: "no deadline" (ngtcp2's `UINT64_MAX`).
    public static let distantFuture = QUICTime(nanoseconds: .max)

    /// Returns this time moved forward by `duration`, saturating at ``distantFuture``.
    public func advanced(by duration: Duration) -> QUICTime {
        let (sum, overflow) = nanoseconds.addingReportingOverflow(duration.quicNanoseconds)
        return QUICTime(nanoseconds: overflow ? .max : sum)
    }

    /// The duration from `earlier` to this time (zero if `earlier` is later).
    public func duration(since earlier: QUICTime) -> Duration {
        guard nanoseconds > earlier.nanoseconds else { return .zero }
        return .nanoseconds(Int64(clamping: nanoseconds - earlier.nanoseconds))
    }

    public static func < (lhs: QUICTime, rhs: QUICTime) -> Bool {
        lhs.nanoseconds < rhs.nanoseconds
    }

    public var description: String {
        self == .distantFuture ? "never" : "\(nanoseconds)ns"
    }
}

extension Duration {
    /// This duration in whole nanoseconds, clamped to `0...UInt64.max`
    /// (ngtcp2's `ngtcp2_duration`).
    public var quicNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        let (whole, overflow) = UInt64(seconds).multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return .max }
        let (sum, overflow2) = whole.addingReportingOverflow(UInt64(attoseconds / 1_000_000_000))
        return overflow2 ? .max : sum
    }
}
