import Foundation
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

/// The `time` of every `--json` event, formatted without ICU: the same text Foundation's
/// ISO 8601 formatter writes (UTC, to the nearest millisecond).
@Suite("JSON event times")
struct EventTimeTests {
    @Test func timestampsMatchFoundationsISO8601() {
        let reference = ISO8601DateFormatter()
        reference.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let seconds: [Double] = [0, 0.999, 1_795_000_000.123, 1_795_000_000.9999, 951_782_400.5 /* 2000-02-29 */, 4_102_444_799.001, 86_399.25]
        for value in seconds {
            let date = Date(timeIntervalSince1970: value)
            #expect(Console.timestamp(date) == reference.string(from: date), "\(value)")
        }
        #expect(Console.timestamp(Date(timeIntervalSince1970: 1_795_000_000.5)) == "2026-11-18T11:06:40.500Z")
    }
}
