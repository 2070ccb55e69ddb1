// Parsing and formatting of the command-line quantities: durations, rates, percentages.
// Pure functions, exercised by `qxfer-linkemu --self-test`.

struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ message: String) { description = message }
}

enum Units {
    /// Parses a non-negative decimal number ("25", "0.5", ".5"). No sign, exponent, inf or nan.
    static func number(_ text: Substring) -> Double? {
        guard !text.isEmpty, text.contains(where: { $0 != "." }),
              text.allSatisfy({ $0 == "." || ($0.isASCII && $0.isNumber) }),
              let value = Double(text), value.isFinite
        else { return nil }
        return value
    }

    /// Splits "25ms" into ("25", "ms").
    private static func split(_ text: String) -> (Substring, Substring) {
        let end = text.firstIndex(where: { !($0 == "." || ($0.isASCII && $0.isNumber)) }) ?? text.endIndex
        return (text[text.startIndex..<end], text[end...])
    }

    /// Duration in nanoseconds: "25ms", "500us", "1.5s", "800ns", or "0".
    static func duration(_ text: String) throws(UsageError) -> Int64 {
        let (num, unit) = split(text)
        guard let value = number(num) else { throw UsageError("invalid duration '\(text)' (use e.g. 25ms, 500us, 1s)") }
        let scale: Double
        switch unit.lowercased() {
        case "ns": scale = 1
        case "us", "µs": scale = 1e3
        case "ms": scale = 1e6
        case "s": scale = 1e9
        case "" where value == 0: scale = 0
        default: throw UsageError("invalid duration '\(text)' (use e.g. 25ms, 500us, 1s)")
        }
        let ns = (value * scale).rounded()
        guard ns <= 3600e9 else { throw UsageError("duration '\(text)' is longer than one hour") }
        return Int64(ns)
    }

    /// Rate in bits per second; 0 means unlimited. "500mbit", "1gbit", "64kbit", "unlimited", "0".
    static func rate(_ text: String) throws(UsageError) -> UInt64 {
        let lower = text.lowercased()
        if lower == "unlimited" || lower == "0" || lower == "none" { return 0 }
        let (num, unit) = split(lower)
        guard let value = number(num) else { throw UsageError("invalid rate '\(text)' (use e.g. 500mbit, 1gbit, 64kbit, unlimited)") }
        let scale: Double
        switch unit {
        case "bit": scale = 1
        case "kbit": scale = 1e3
        case "mbit": scale = 1e6
        case "gbit": scale = 1e9
        case "tbit": scale = 1e12
        default: throw UsageError("invalid rate '\(text)' (units: bit, kbit, mbit, gbit, tbit; powers of 1000)")
        }
        let bps = (value * scale).rounded()
        guard bps >= 8000 else { throw UsageError("rate '\(text)' is below 8kbit") }
        guard bps <= 1e13 else { throw UsageError("rate '\(text)' is above 10tbit") }
        return UInt64(bps)
    }

    /// Probability from a percentage: "1%", "0.5%", "1" (the % sign is optional). Returns 0...1.
    static func percent(_ text: String) throws(UsageError) -> Double {
        var body = Substring(text)
        if body.hasSuffix("%") { body = body.dropLast() }
        guard let value = number(body), value <= 100 else {
            throw UsageError("invalid percentage '\(text)' (use e.g. 1%, 0.5%; 0 to 100)")
        }
        return value / 100
    }

    static func count(_ text: String, name: String, range: ClosedRange<Int>) throws(UsageError) -> Int {
        guard let v = Int(text), range.contains(v) else {
            throw UsageError("invalid value '\(text)' for \(name) (an integer in \(range.lowerBound)...\(range.upperBound))")
        }
        return v
    }

    /// Maps a probability to a threshold on a uniform 64-bit draw: event iff draw < threshold.
    static func threshold(_ p: Double) -> UInt64 {
        if p <= 0 { return 0 }
        if p >= 1 { return UInt64.max }
        return UInt64(p * 18446744073709551616.0)
    }

    static func formatDuration(_ ns: Int64) -> String {
        if ns == 0 { return "0" }
        if ns % 1_000_000_000 == 0 { return "\(ns / 1_000_000_000)s" }
        if ns % 1_000_000 == 0 { return "\(ns / 1_000_000)ms" }
        if ns % 1_000 == 0 { return "\(ns / 1_000)us" }
        return "\(ns)ns"
    }

    static func formatRate(_ bps: UInt64) -> String {
        if bps == 0 { return "unlimited" }
        if bps % 1_000_000_000 == 0 { return "\(bps / 1_000_000_000)gbit" }
        if bps % 1_000_000 == 0 { return "\(bps / 1_000_000)mbit" }
        if bps % 1_000 == 0 { return "\(bps / 1_000)kbit" }
        return "\(bps)bit"
    }
}
