import PlainText

/// The stream report as a terminal shows it: every line within ``width`` columns, numbers in
/// fixed columns, stacks named as the rest of qxfer names them.
public enum StreamReportText {
    /// The widest line the report prints: rows, totals and notes alike.
    public static let width = 100

    /// The stack as qxfer names it everywhere else: "QUIC", "TCP+TLS". The totals' JSON keeps
    /// `--stack`'s own values (`quic`, `tls`), which it takes as given.
    public static func stackName(_ stack: String) -> String {
        switch stack {
        case "quic": "QUIC"
        case "tls": "TCP+TLS"
        default: stack
        }
    }

    /// The header over ``row(_:elapsed:)``: 82 columns.
    public static let rowHeader = "  time  frames  late  lost   p50 ms   p95 ms   p99 ms   max ms  jitter ms   Mbit/s"

    /// The receiver's line for one interval, in the columns of ``rowHeader`` (wider only for
    /// latencies past 10⁶ ms); an interval without frames shows no latencies rather than zeros.
    public static func row(_ report: IntervalReport, elapsed: Double) -> String {
        let latency = report.framesDelivered + report.framesLate == 0
            ? String(repeating: "        -", count: 4)
            : [report.latency.p50, report.latency.p95, report.latency.p99, report.latency.max]
                .map { TextFormat.fixed($0, places: 1, width: 9) }.joined()
        return TextFormat.fixed(elapsed, places: 1, width: 6) + TextFormat.rightAligned(report.framesDelivered, width: 8)
            + TextFormat.rightAligned(report.framesLate, width: 6) + TextFormat.rightAligned(report.framesLost, width: 6) + latency
            + TextFormat.fixed(report.jitterMilliseconds, places: 2, width: 11) + TextFormat.fixed(report.bitsPerSecond / 1e6, places: 2, width: 9)
    }

    /// The sender's line a second, every field in a fixed column whatever its value (up to
    /// 9999.9 s, 999.9 TB, 99 999 Mbit/s, 99 999 ms): `sending:    3.0s    1.5 MB sent     4.02 Mbit/s  RTT    0.4 ms  QUIC`.
    /// A round trip not yet measured shows `-`.
    public static func senderProgress(
        seconds: Double, bytesSent: UInt64, bitsPerSecond: Double, roundTripMilliseconds: Double?, stack: String?
    ) -> String {
        "sending: \(TextFormat.fixed(seconds, places: 1, width: 6))s  "
            + "\(TextFormat.rightAligned(TextFormat.bytes(bytesSent), width: 8)) sent  "
            + "\(TextFormat.fixed(bitsPerSecond / 1e6, places: 2, width: 8)) Mbit/s  "
            + "RTT \(roundTripMilliseconds.map { TextFormat.fixed($0, places: 1, width: 7) } ?? TextFormat.rightAligned("-", width: 7)) ms"
            + (stack.map { "  \(stackName($0))" } ?? "")
    }

    /// `clauses` joined by ", " into lines of at most ``width`` columns, the lines after the
    /// first indented by `indent` spaces; a clause wider than a line is broken at its spaces.
    public static func lines(_ clauses: [String], indent: Int = 2) -> [String] {
        var groups: [String] = []
        for (index, clause) in clauses.enumerated() {
            let piece = index < clauses.count - 1 ? clause + "," : clause
            let limit = groups.count <= 1 ? width : width - indent
            if let last = groups.last, last.count + 1 + piece.count <= limit {
                groups[groups.count - 1] += " " + piece
            } else {
                groups.append(piece)
            }
        }
        return wrapped(groups.joined(separator: "\n"), indent: indent)
    }

    /// `text` in lines of at most ``width`` columns, broken at spaces and at its own line
    /// breaks (a word wider than a line is cut), the lines after the first indented by
    /// `indent` spaces.
    public static func wrapped(_ text: String, indent: Int = 2) -> [String] {
        var lines: [String] = []
        let pad = String(repeating: " ", count: indent)
        for paragraph in text.split(separator: "\n", omittingEmptySubsequences: false) {
            var current = ""
            func limit() -> Int { lines.isEmpty ? width : width - indent }
            func flush() {
                lines.append(lines.isEmpty ? current : pad + current)
                current = ""
            }
            for var word in paragraph.split(separator: " ") {
                if !current.isEmpty && current.count + 1 + word.count <= limit() {
                    current += " " + word
                    continue
                }
                if !current.isEmpty { flush() }
                while word.count > limit() {
                    current = String(word.prefix(limit()))
                    word = word.dropFirst(limit())
                    flush()
                }
                current = String(word)
            }
            if !current.isEmpty || paragraph.isEmpty { flush() }
        }
        return lines
    }
}
