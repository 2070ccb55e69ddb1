import Foundation
import Testing
@testable import qxfer
import PlainText

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
        #expect(formatDuration(3_725) == "1:02:05")
    }

    /// A sender's progress counts what its connection had acknowledged, never below zero.
    @Test func senderProgressCountsAcknowledgedBytes() {
        #expect(TransferReporter.bytesArrived(written: 10_000_000, unacknowledged: 4_000_000) == 6_000_000)
        #expect(TransferReporter.bytesArrived(written: 1_000, unacknowledged: 4_000_000) == 0)  // TLS records and headers count too
        #expect(TransferReporter.bytesArrived(written: 1_000, unacknowledged: nil) == 1_000)
        #expect(TransferReporter.bytesArrived(written: .max, unacknowledged: .max) == .max - UInt64(Int.max))
        #expect(TransferReporter.bytesArrived(written: 5, unacknowledged: -3) == 5)
    }

    /// Sizes, rates and times are printed without Foundation's formatter, as it would print them.
    @Test func fixedDecimalsMatchPrintf() {
        let values: [Double] = [0, 0.04, 0.96, 1, 9.99, 12.3456, 999.94, 999.96, 1_234.5678, 56.7, 1e9 + 0.3, -0.04, -3.21, 123_456_789.987]
        for value in values {
            for places in 0...3 {
                let reference = String(format: "%.\(places)f", value)
                // printf rounds the binary value exactly and ties to even; none of these is
                // near a tie, where the two may differ in the last digit.
                #expect(TextFormat.fixed(value, places: places) == reference, "\(value), \(places) places")
            }
        }
        #expect(TextFormat.fixed(.infinity, places: 1) == "inf")
        #expect(TextFormat.fixed(.nan, places: 1) == "nan")
        #expect(TextFormat.fixed(1e30, places: 1).hasPrefix("1e+30"))
        #expect(TextFormat.bytes(1_536) == "1.5 kB")
        #expect(TextFormat.bytes(999) == "999 B")
        #expect(formatRate(56_749_000) == "56.7 MB/s")
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

    /// The bar never reaches a terminal's last column (it would wrap and stay on screen), and
    /// gives up the least useful figures first; a file of unknown size shows no share of a total.
    @Test func barLineFitsTheTerminal() {
        func line(_ columns: Int?, total: UInt64? = 209_700_000) -> String {
            TransferReporter.barLine(done: 114_700_000, total: total, rate: "460.8 MB/s", eta: "0:01", rtt: "12.3 ms", columns: columns)
        }
        let full = line(nil)
        #expect(full == "[=============>          ]  54%  114.7 MB / 209.7 MB  460.8 MB/s  ETA 0:01  RTT 12.3 ms")
        #expect(line(full.count + 1) == full)
        #expect(line(full.count) == "[=============>          ]  54%  114.7 MB / 209.7 MB  460.8 MB/s  ETA 0:01")
        #expect(line(65) == "[=======>      ]  54%  114.7 MB / 209.7 MB  460.8 MB/s  ETA 0:01")
        #expect(line(61) == "[=====>    ]  54%  114.7 MB / 209.7 MB  460.8 MB/s  ETA 0:01")
        #expect(line(60) == "54%  114.7 MB / 209.7 MB  460.8 MB/s  ETA 0:01")
        #expect(line(40) == "54%  114.7 MB / 209.7 MB  ETA 0:01")
        #expect(line(30) == "54%  114.7 MB / 209.7 MB")
        #expect(line(12) == "54%  114.7 ")
        for columns in 1...120 {
            #expect(line(columns).count < max(2, columns), "\(columns) columns")
            #expect(line(columns, total: nil).count < max(2, columns), "\(columns) columns, size unknown")
        }
        #expect(line(nil, total: nil) == "114.7 MB  460.8 MB/s  RTT 12.3 ms")
        #expect(!line(nil, total: nil).contains("%"))
        #expect(line(nil, total: 0).hasPrefix("[>                       ]   0%  114.7 MB / 0 B"))
    }
}
