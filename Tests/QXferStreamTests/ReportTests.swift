import Foundation
import LinuxSystem
import QXfer
import Testing
@testable import QXferStream

/// The stream report as a person reads it (issue 62 §8): every frame in some row, no line over
/// 100 columns, the sender's columns fixed, stacks named as everywhere else.
@Suite(.serialized) struct ReportTests {
    /// A stream of `frames` at 30 fps over TCP+TLS on loopback, rows a second as the command
    /// prints them; returns the rows (with their elapsed seconds) and the receiver's totals.
    static func stream(frames: Int) async throws -> (rows: [(IntervalReport, Double)], totals: StreamTotals) {
        let server = LoopbackStreamTests.server, client = LoopbackStreamTests.client
        let listener = NetworkListener(on: 0, host: "127.0.0.1", using: .parameters { TLS().identity(server) })
        let received = Locked<(totals: StreamTotals?, error: String?, rows: [(IntervalReport, Double)])>((nil, nil, []))
        var receiverOptions = StreamReceiverOptions()
        receiverOptions.onInterval = { report, elapsed in received.withLock { $0.rows.append((report, elapsed)) } }
        let options = receiverOptions
        var senderOptions = StreamSenderOptions()
        senderOptions.mode = .reliable
        senderOptions.maximumFrames = frames
        senderOptions.deadline = .seconds(2)
        let sending = senderOptions
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await listener.run { connection in
                    do {
                        let totals = try await StreamReceiver.run(on: connection, options: options)
                        received.withLock { $0.totals = totals }
                    } catch {
                        received.withLock { $0.error = "\(error)" }
                    }
                }
            }
            let port = try await listener.port
            let connection = NetworkConnection(
                to: .hostPort(host: "127.0.0.1", port: port),
                using: .parameters { TLS().identity(client).peerFingerprint(server.fingerprint) })
            _ = try await StreamSender.run(
                over: connection, source: SyntheticSource(frameRate: FrameRate(numerator: 30), bitsPerSecond: 1_000_000), options: sending)
            connection.cancel()
            for _ in 0..<500 where received.withLock({ $0.totals == nil && $0.error == nil }) {
                try await Task.sleep(for: .milliseconds(10))
            }
            group.cancelAll()
            let (totals, error, rows) = received.withLock { ($0.totals, $0.error, $0.rows) }
            if let error { Issue.record("receiver failed: \(error)") }
            return (rows, try #require(totals))
        }
    }

    @Test func aFiveSecondStreamHasARowForItsLastPartialSecondAndTheRowsCountEveryFrame() async throws {
        let (rows, totals) = try await Self.stream(frames: 150)
        #expect(totals.framesSent == 150)
        let counted = rows.reduce(0) { $0 + $1.0.framesDelivered + $1.0.framesLate + $1.0.framesLost }
        let text = rows.map { StreamReportText.row($0.0, elapsed: $0.1) }.joined(separator: "\n")
        #expect(counted == totals.framesSent, "the rows count \(counted) of \(totals.framesSent) frames:\n\(text)")
        #expect(rows.reduce(0) { $0 + $1.0.framesDelivered } == totals.framesDelivered, "\(text)")
        // Frames span 4.97 s from the first: the last row comes after the fourth second.
        #expect((rows.last?.1 ?? 0) > 4.5, "\(text)")
        #expect(rows.map(\.1) == rows.map(\.1).sorted(), "rows out of order:\n\(text)")
    }

    @Test func theLastIntervalCountsFramesThatNeverCameAfterTheHighestSeen() {
        var statistics = StreamStatistics()
        for index in 0..<20 { statistics.record(latency: 1_000_000, bytes: 100, onTime: true, arrival: UInt64(index) * 33_000_000, index: UInt64(index)) }
        let first = statistics.takeInterval(seconds: 1, clock: ClockOffsetEstimator())
        #expect(first.framesDelivered == 20 && first.framesLost == 0)
        // Frames 20 to 29 never arrive: only the sender's count says they existed.
        let last = statistics.takeInterval(seconds: 0.5, clock: ClockOffsetEstimator(), framesSent: 30)
        #expect(last.framesDelivered == 0 && last.framesLost == 10)
        #expect(statistics.totals(framesSent: 30, clock: ClockOffsetEstimator()).framesLost == 10)
    }

    /// The totals of the run the issue quotes, and of one with every figure at its widest.
    static let examples: [StreamTotals] = {
        var typical = StreamTotals(
            framesSent: 150, framesDelivered: 150, framesLate: 0, framesLost: 0,
            latency: LatencySummary(p50: 26.671, p95: 44.063, p99: 47.359, max: 181.346), jitterMilliseconds: 4.829,
            bitsPerSecond: 4_062_614, bytesReceived: 10_081_927, clockOffsetMilliseconds: 0.213, roundTripMilliseconds: 50.868,
            negativeLatencies: 0)
        typical.mode = "realtime"
        typical.stack = "quic"
        typical.repair = "fec"
        var widest = StreamTotals(
            framesSent: 999_999_999_999, framesDelivered: 999_999_999_998, framesLate: 999_999_999_997, framesLost: 999_999_999_996,
            latency: LatencySummary(p50: 3_599_999.999, p95: 3_599_999.999, p99: 3_599_999.999, max: 3_599_999.999),
            jitterMilliseconds: 3_599_999.999, bitsPerSecond: 99e9, bytesReceived: Int.max, clockOffsetMilliseconds: -3_599_999.999,
            roundTripMilliseconds: 3_599_999.999, negativeLatencies: 5)
        widest.mode = "stream-per-frame"
        widest.stack = "tls"
        widest.repair = "both"
        widest.note = Carriage.note(mode: .realtime, hasQUICExtras: false) + "; " + String(repeating: "x", count: 250)
        widest.picturesNotFilled = 999_999_999
        return [typical, widest]
    }()

    @Test func noLineOfTheReportIsWiderThan100Columns() {
        for totals in Self.examples {
            for line in totals.text().split(separator: "\n", omittingEmptySubsequences: false) {
                #expect(line.count <= 100, "\(line.count) columns: \(line)")
            }
        }
        let wide = IntervalReport(
            framesDelivered: 99_999, framesLate: 9_999, framesLost: 9_999,
            latency: LatencySummary(p50: 999_999.9, p95: 999_999.9, p99: 999_999.9, max: 999_999.9), jitterMilliseconds: 99_999.99,
            bitsPerSecond: 99_999e6, clockOffsetMilliseconds: 0, roundTripMilliseconds: nil)
        for line in [StreamReportText.rowHeader, StreamReportText.row(wide, elapsed: 99_999.9)] {
            #expect(line.count <= 100, "\(line.count) columns: \(line)")
        }
        let progress = "qxfer: " + StreamReportText.senderProgress(
            seconds: 9_999.9, bytesSent: 999_000_000_000_000, bitsPerSecond: 99_999e6, roundTripMilliseconds: 99_999.9, stack: "TCP+TLS")
        #expect(progress.count <= 100, "\(progress.count) columns: \(progress)")
    }

    @Test func theTotalsKeepTheirFiguresAndTheTextThatScriptsLookFor() throws {
        let text = Self.examples[0].text()
        // Tests/e2e/race.sh greps "N frames sent, N on time".
        #expect(text.contains("150 frames sent, 150 on time (100.00%), 0 late (0.00%), 0 lost (0.00%)"), "\(text)")
        for figure in ["p50 26.7", "p95 44.1", "p99 47.4", "max 181.3 ms", "jitter 4.83 ms", "4.06 Mbit/s", "clock offset +0.21 ms", "rtt 50.9 ms"] {
            #expect(text.contains(figure), "\(figure) missing: \(text)")
        }
        let widest = Self.examples[1].text()
        // The long note wraps, indented, and loses nothing.
        let joined = widest.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " ")
        #expect(joined.contains(Carriage.note(mode: .realtime, hasQUICExtras: false)), "\(widest)")
        #expect(joined.contains("999999999 missing pictures left out"), "\(widest)")
    }

    @Test func theReportNamesTheStackAsEverythingElseDoes() {
        var totals = Self.examples[0]
        let quic = totals.text()
        #expect(quic.hasPrefix("realtime over QUIC (repair: fec)"), "\(quic)")
        #expect(!quic.contains("quic"), "\(quic)")
        totals.stack = "tls"
        totals.repair = ""
        #expect(totals.text().hasPrefix("realtime over TCP+TLS,"), "\(totals.text())")
        // The JSON keeps --stack's values, which scripts and the peer read.
        #expect(totals.json().contains("\"stack\":\"tls\""))
        #expect(StreamReportText.senderProgress(seconds: 1, bytesSent: 1, bitsPerSecond: 1, roundTripMilliseconds: 1, stack: "quic").hasSuffix("  QUIC"))
    }

    @Test func theSendersColumnsStayPutWhateverTheFigures() {
        let lines = [
            StreamReportText.senderProgress(seconds: 1.0, bytesSent: 999, bitsPerSecond: 7992, roundTripMilliseconds: nil, stack: nil),
            StreamReportText.senderProgress(seconds: 2.0, bytesSent: 512_300, bitsPerSecond: 4.1e6, roundTripMilliseconds: 0.4, stack: "QUIC"),
            StreamReportText.senderProgress(seconds: 10.0, bytesSent: 12_345_678, bitsPerSecond: 40.2e6, roundTripMilliseconds: 12.3, stack: "TCP+TLS"),
            StreamReportText.senderProgress(seconds: 125.0, bytesSent: 999_900_000_000, bitsPerSecond: 950.5e6, roundTripMilliseconds: 250.1, stack: "QUIC"),
        ]
        for marker in ["s  ", " sent", " Mbit/s", "RTT ", " ms"] {
            let offsets = lines.map { line in line.range(of: marker).map { line.distance(from: line.startIndex, to: $0.lowerBound) } }
            #expect(Set(offsets).count == 1 && offsets[0] != nil, "'\(marker)' at \(offsets):\n\(lines.joined(separator: "\n"))")
        }
    }
}
