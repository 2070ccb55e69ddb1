/// Text made safe to show on a terminal. Names from a folder and words from a peer can hold
/// control characters: an escape sequence recolours, moves or retitles the terminal, a carriage
/// return or newline forges a line, a bidirectional override shows a name reversed. Each such
/// character is written as its `\uXXXX` escape (the form JSON uses, so a JSON line stays valid);
/// newline, carriage return and tab as `\n`, `\r` and `\t`.
public enum TerminalText {
    /// `text` with every control character (C0, DEL, C1), line or paragraph separator and
    /// bidirectional control escaped; newlines are kept when `keepingNewlines` (text of several lines).
    public static func escaped(_ text: String, keepingNewlines: Bool = false) -> String {
        let escapes = { (scalar: Unicode.Scalar) in needsEscape(scalar) && !(keepingNewlines && scalar == "\n") }
        guard text.unicodeScalars.contains(where: escapes) else { return text }
        var result = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            guard escapes(scalar) else {
                result.append(scalar)
                continue
            }
            let escape: String = switch scalar {
            case "\n": "\\n"
            case "\r": "\\r"
            case "\t": "\\t"
            default: "\\u" + TextFormat.hex([UInt8(scalar.value >> 8), UInt8(scalar.value & 0xFF)])
            }
            result.append(contentsOf: escape.unicodeScalars)
        }
        return String(result)
    }

    /// Bytes meant as UTF-8 (a name read from a folder, a command-line argument) as text safe to
    /// show: what decodes is escaped as ``escaped(_:keepingNewlines:)`` does, and each byte that
    /// does not decode is written `\xHH`, so `caf\xe9` shows which name it was (as `ls -b` does).
    public static func escaped(bytes: some Collection<UInt8>) -> String {
        let bytes = Array(bytes)
        var text = String.UnicodeScalarView()
        var start = 0
        while start < bytes.count {
            var parser = Unicode.UTF8.ForwardParser()
            var input = bytes[start...].makeIterator()
            switch parser.parseScalar(from: &input) {
            case .valid(let encoded):
                text.append(Unicode.UTF8.decode(encoded))
                start += encoded.count
            case .error(let length):
                for byte in bytes[start..<start + length] { text.append(contentsOf: ("\\x" + TextFormat.hex([byte])).unicodeScalars) }
                start += length
            case .emptyInput:
                start = bytes.count
            }
        }
        return escaped(String(text))
    }

    /// Control characters, the line and paragraph separators, and the bidirectional marks,
    /// embeddings, overrides and isolates.
    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00..<0x20, 0x7F..<0xA0: true
        case 0x061C, 0x200E, 0x200F, 0x2028...0x202E, 0x2066...0x2069: true
        default: false
        }
    }
}
