/// One JSON object on one line, from the dictionaries the command-line tool and the stream
/// statistics report (`--json`): keys sorted, slashes and non-ASCII text as they are. Written
/// by hand because FoundationEssentials has no `JSONSerialization` (see ``TextFormat``).
public enum JSONText {
    /// JSON's null, as a value of a dictionary given to ``object(_:)``.
    public static let null = Null()

    /// The type of ``null``.
    public struct Null: Sendable, Hashable {}

    /// `object` as one line of JSON. Values: strings, booleans, integers, doubles (an integral
    /// double without a fraction, one that is not finite as null), arrays and dictionaries
    /// with string keys of those; anything else is written as its description, a string.
    public static func object(_ object: [String: Any]) -> String {
        var text = ""
        append(object, to: &text)
        return text
    }

    private static func append(_ value: Any, to text: inout String) {
        switch value {
        case let string as String:
            appendString(string, to: &text)
        case is Null:
            text += "null"
        case let bool as Bool:
            text += bool ? "true" : "false"
        case let integer as any BinaryInteger:
            text += "\(integer)"
        case let double as Double:
            text += double.isFinite ? TextFormat.shortest(double) : "null"
        case let float as Float:
            text += float.isFinite ? TextFormat.shortest(Double(float)) : "null"
        case let object as [String: Any]:
            text += "{"
            for (index, entry) in object.sorted(by: { $0.key < $1.key }).enumerated() {
                if index > 0 { text += "," }
                appendString(entry.key, to: &text)
                text += ":"
                append(entry.value, to: &text)
            }
            text += "}"
        case let array as [Any]:
            text += "["
            for (index, element) in array.enumerated() {
                if index > 0 { text += "," }
                append(element, to: &text)
            }
            text += "]"
        default:
            appendString(String(describing: value), to: &text)
        }
    }

    private static func appendString(_ string: String, to text: inout String) {
        text += "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": text += "\\\""
            case "\\": text += "\\\\"
            case "\n": text += "\\n"
            case "\r": text += "\\r"
            case "\t": text += "\\t"
            case _ where scalar.value < 0x20:
                text += "\\u00" + TextFormat.hex([UInt8(scalar.value)])
            default:
                text.unicodeScalars.append(scalar)
            }
        }
        text += "\""
    }
}
