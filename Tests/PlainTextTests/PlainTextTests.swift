import Foundation
import PlainText
import Testing

/// The hand-written formatters against Foundation's, which qxfer no longer links: the same
/// text for the same values, and JSON that Foundation's parser reads back as written.
@Suite("Numbers and JSON as text")
struct PlainTextTests {
    static let values: [Double] = [0, 0.04, 0.05, 0.96, 1, 9.99, 12.345, 99.94, 100, 1234.5678, 65_432.1, 1e9 + 0.3]

    @Test func widthsAndSignsMatchPrintf() {
        for value in Self.values + Self.values.map { -$0 } {
            #expect(TextFormat.fixed(value, places: 1, width: 6) == String(format: "%6.1f", value), "\(value)")
            #expect(TextFormat.fixed(value, places: 2, width: 11) == String(format: "%11.2f", value), "\(value)")
            #expect(TextFormat.fixed(value, places: 2, width: 0, signed: true) == String(format: "%+.2f", value), "\(value)")
        }
        for count in [0, 7, 42, 999, 12_345, -3] {
            #expect(TextFormat.rightAligned(count, width: 3) == String(format: "%3ld", count))
            #expect(TextFormat.rightAligned(count, width: 8) == String(format: "%8ld", count))
        }
        #expect(TextFormat.zeroPadded(UInt32(42), width: 6) == String(format: "%06u", 42))
        #expect(TextFormat.zeroPadded(1_234_567, width: 6) == "1234567")
    }

    @Test func hexTrimAndShortest() {
        #expect(TextFormat.hex([0x00, 0x0F, 0xA5, 0xFF]) == "000fa5ff")
        #expect(TextFormat.hex([UInt8]()) == "")
        #expect(TextFormat.trimmed("  a b\t\r\n") == "a b")
        #expect(TextFormat.trimmed(" \t ") == "")
        #expect(TextFormat.shortest(3) == "3")
        #expect(TextFormat.shortest(-0.5) == "-0.5")
        #expect(TextFormat.shortest(0.1) == "0.1")
        #expect(TextFormat.shortest(1e20) == "1e+20")
    }

    @Test func jsonReadsBackAsWritten() throws {
        let object: [String: Any] = [
            "name": "a \"quoted\" \\ name\nwith\u{01}control/slash ünï",
            "count": 42, "big": UInt64.max, "negative": -7, "ratio": 0.125, "whole": 3.0, "infinite": Double.infinity,
            "flag": true, "none": JSONText.null, "list": [1, 2, 3], "nested": ["b": 1, "a": [String: Any]()],
        ]
        let line = JSONText.object(object)
        #expect(!line.contains("\n"))
        #expect(line.hasSuffix("\"whole\":3}") && line.contains("control/slash"))
        // Keys sorted at every level.
        #expect(line.hasPrefix("{\"big\":18446744073709551615,\"count\":42,\"flag\":true,\"infinite\":null,\"list\":[1,2,3],\"name\":"))
        #expect(line.contains("\"nested\":{\"a\":{},\"b\":1}"))
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(parsed["name"] as? String == object["name"] as? String)
        #expect(parsed["count"] as? Int == 42)
        #expect(parsed["negative"] as? Int == -7)
        #expect(parsed["ratio"] as? Double == 0.125)
        #expect(parsed["flag"] as? Bool == true)
        #expect(parsed["none"] is NSNull)
        #expect(parsed["infinite"] is NSNull)
    }

    @Test("Terminal text: control characters, line separators and bidirectional controls escaped, the rest untouched")
    func terminalTextEscapes() throws {
        #expect(TerminalText.escaped("plain name, ünïcode, 日本, 👩‍👩‍👧 and a \\ backslash") == "plain name, ünïcode, 日本, 👩‍👩‍👧 and a \\ backslash")
        #expect(TerminalText.escaped("esc\u{1B}[31mred") == "esc\\u001b[31mred")
        #expect(TerminalText.escaped("new\nline\rback\ttab") == "new\\nline\\rback\\ttab")
        #expect(TerminalText.escaped("two\nlines\u{7}", keepingNewlines: true) == "two\nlines\\u0007")
        #expect(TerminalText.escaped("\u{7F}\u{9B}2J\u{0}") == "\\u007f\\u009b2J\\u0000")
        #expect(TerminalText.escaped("evil\u{202E}txt.exe") == "evil\\u202etxt.exe")
        #expect(TerminalText.escaped("\u{2066}a\u{2069}\u{200F}\u{61C}") == "\\u2066a\\u2069\\u200f\\u061c")
        #expect(TerminalText.escaped("line\u{2028}paragraph\u{2029}") == "line\\u2028paragraph\\u2029")
        // The escapes are JSON's: a JSON string holding one reads back as the character.
        let line = "{\"name\":\"" + TerminalText.escaped("a\u{202E}b") + "\"}"
        let parsed = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String]
        #expect(parsed?["name"] == "a\u{202E}b")
    }

    @Test("Bytes that should be UTF-8: what decodes shown as text (controls escaped), each byte that does not as \\xHH")
    func bytesThatAreNotUTF8() {
        #expect(TerminalText.escaped(bytes: Array("café ✓".utf8)) == "café ✓")
        #expect(TerminalText.escaped(bytes: [0x63, 0x61, 0x66, 0xE9, 0x2E, 0x74]) == "caf\\xe9.t")  // Latin-1 é
        #expect(TerminalText.escaped(bytes: [0xFF, 0x0A, 0xC3]) == "\\xff\\n\\xc3")  // a newline, a truncated sequence
        #expect(TerminalText.escaped(bytes: [0xE2, 0x9C, 0x41]) == "\\xe2\\x9cA")  // a sequence cut by an ASCII byte
        #expect(TerminalText.escaped(bytes: [0xC0, 0xAF]) == "\\xc0\\xaf")  // an overlong '/'
        #expect(TerminalText.escaped(bytes: [UInt8]()) == "")
    }
}
