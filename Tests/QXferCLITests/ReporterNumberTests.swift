import Testing
@testable import qxfer

/// Rates and times the progress display computes from sizes a peer announced (issue 17 §1):
/// beyond Int, or not finite, they are clamped instead of trapping in `Int(_:)`.
@Suite("Progress figures from hostile sizes")
struct ReporterNumberTests {
    @Test func hugeRatesAndTimesAreClamped() {
        #expect(wholeNumber(1.8e22) == .max)
        #expect(wholeNumber(.infinity) == .max)
        #expect(wholeNumber(.nan) == 0)
        #expect(wholeNumber(-1e300) == .min)
        #expect(wholeNumber(2.5) == 3)
        #expect(formatDuration(Double(UInt64.max)).hasPrefix(String(Int.max / 3600)))
        #expect(formatDuration(75) == "1:15")
    }
}
