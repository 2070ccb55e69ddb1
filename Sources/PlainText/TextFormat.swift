/// Numbers as text for people to read (sizes, rates, times, codes), printed as printf would
/// print them but without Foundation's `String(format:)`: qxfer links FoundationEssentials
/// only, as every type a program links adds to the records the Swift runtime scans on each
/// first conformance check at start (docs/benchmarks.md, "Process start without Foundation").
public enum TextFormat {
    /// `value` with `places` decimals (0 ... 9) as printf's "%.Nf" prints it, but for exact
    /// ties, which it rounds away from zero.
    public static func fixed(_ value: Double, places: Int) -> String {
        guard value.isFinite else { return value.isNaN ? "nan" : value < 0 ? "-inf" : "inf" }
        let places = min(max(places, 0), 9)
        var scale: UInt64 = 1
        for _ in 0..<places { scale *= 10 }
        let scaled = (value.magnitude * Double(scale)).rounded()
        guard scaled < 9e18 else { return "\(value.rounded())" }  // beyond any size, rate or time shown
        let whole = UInt64(scaled)
        let sign = value.sign == .minus ? "-" : ""
        guard places > 0 else { return sign + String(whole) }
        return sign + String(whole / scale) + "." + zeroPadded(whole % scale, width: places)
    }

    /// A size in decimal units, like the rates shown beside sizes: 1 MB = 10⁶ bytes.
    public static func bytes(_ bytes: UInt64) -> String {
        let units = ["B", "kB", "MB", "GB", "TB", "PB"]
        var value = Double(bytes)
        var unit = 0
        while value >= 1000 && unit < units.count - 1 {
            value /= 1000
            unit += 1
        }
        return unit == 0 ? "\(bytes) B" : "\(fixed(value, places: 1)) \(units[unit])"
    }

    /// `value` in the fewest digits that read back the same: "3" (not "3.0"), "0.1", "1e-05".
    public static func shortest(_ value: Double) -> String {
        // Below 2^53 an integral double is exact as an integer.
        if value == value.rounded(), value.magnitude < 9_007_199_254_740_992 { return String(Int64(value)) }
        return "\(value)"
    }

    /// `value` with `places` decimals right-aligned in `width` characters ("%W.Nf"); with
    /// `signed`, a positive value gets a plus sign ("%+W.Nf").
    public static func fixed(_ value: Double, places: Int, width: Int, signed: Bool = false) -> String {
        let plus = signed && value.isFinite && value.sign == .plus ? "+" : ""
        return rightAligned(plus + fixed(value, places: places), width: width)
    }

    /// `value` in decimal with leading zeros up to `width` digits ("%0Wu").
    public static func zeroPadded(_ value: some BinaryInteger, width: Int) -> String {
        let text = String(value)
        return String(repeating: "0", count: max(0, width - text.count)) + text
    }

    /// `value` in decimal right-aligned in `width` characters ("%Wd").
    public static func rightAligned(_ value: some BinaryInteger, width: Int) -> String {
        rightAligned(String(value), width: width)
    }

    /// `text` with spaces in front up to `width` characters.
    public static func rightAligned(_ text: String, width: Int) -> String {
        String(repeating: " ", count: max(0, width - text.count)) + text
    }

    /// `text` without the white space (spaces, tabs, line ends) at either end.
    public static func trimmed(_ text: some StringProtocol) -> String {
        guard let first = text.firstIndex(where: { !$0.isWhitespace }),
              let last = text.lastIndex(where: { !$0.isWhitespace }) else { return "" }
        return String(text[first...last])
    }

    /// `bytes` as lowercase hexadecimal, two digits each.
    public static func hex(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(bytes.underestimatedCount * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}
