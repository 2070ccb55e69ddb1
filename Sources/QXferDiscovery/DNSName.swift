/// A domain name as a list of labels, compared without regard to ASCII case (RFC 1035 section
/// 2.3.3; RFC 6762 section 16).
///
/// Labels are raw bytes: a DNS-SD instance name is one label that may hold spaces, dots and any
/// UTF-8 (RFC 6763 section 4.3), so names are never split on dots after they are built.
struct DNSName: Hashable, Sendable, CustomStringConvertible {
    /// The labels, most specific first, without the empty root label.
    private(set) var labels: [[UInt8]]

    /// The longest label the wire format allows.
    static let maximumLabelLength = 63
    /// The longest name on the wire, length bytes and the root label included.
    static let maximumWireLength = 255

    init(labels: [[UInt8]]) {
        self.labels = labels
    }

    /// A name from dotted text such as `_qxfer._udp.local`; a trailing dot is ignored. Only for
    /// names whose labels hold no dots (service types, domains, host names).
    init(_ dotted: String) {
        labels = dotted.split(separator: ".", omittingEmptySubsequences: true).map { Array($0.utf8) }
    }

    /// This name with `label` in front: an instance label before a service type, say.
    func prepending(_ label: String) -> DNSName {
        DNSName(labels: [Array(label.utf8)] + labels)
    }

    /// The name without its first label.
    var parent: DNSName { DNSName(labels: Array(labels.dropFirst())) }

    /// The first label as text (invalid UTF-8 repaired), or "" for the root.
    var firstLabel: String { labels.first.map { String(decoding: $0, as: UTF8.self) } ?? "" }

    /// The bytes this name takes on the wire without compression.
    var wireLength: Int { labels.reduce(1) { $0 + 1 + $1.count } }

    /// Whether every label fits the wire format.
    var isEncodable: Bool {
        labels.allSatisfy { !$0.isEmpty && $0.count <= Self.maximumLabelLength } && wireLength <= Self.maximumWireLength
    }

    /// Dotted text, with dots and backslashes inside labels escaped (RFC 4343 presentation form).
    var description: String {
        labels.map { label in
            var text = ""
            for scalar in String(decoding: label, as: UTF8.self).unicodeScalars {
                if scalar == "." || scalar == "\\" { text.append("\\") }
                text.unicodeScalars.append(scalar)
            }
            return text
        }.joined(separator: ".") + "."
    }

    static func == (lhs: DNSName, rhs: DNSName) -> Bool {
        guard lhs.labels.count == rhs.labels.count else { return false }
        for (left, right) in zip(lhs.labels, rhs.labels) where !Self.equalIgnoringASCIICase(left, right) {
            return false
        }
        return true
    }

    func hash(into hasher: inout Hasher) {
        for label in labels {
            hasher.combine(label.count)
            for byte in label { hasher.combine(Self.lowercased(byte)) }
        }
    }

    /// Whether this name ends with `suffix` (labels compared without case).
    func hasSuffix(_ suffix: DNSName) -> Bool {
        guard labels.count >= suffix.labels.count else { return false }
        return DNSName(labels: Array(labels.suffix(suffix.labels.count))) == suffix
    }

    /// The labels in lower case: the key name compression matches on.
    var lowercasedLabels: [[UInt8]] { labels.map { $0.map(Self.lowercased) } }

    static func lowercased(_ byte: UInt8) -> UInt8 {
        (0x41...0x5A).contains(byte) ? byte + 0x20 : byte
    }

    private static func equalIgnoringASCIICase(_ left: [UInt8], _ right: [UInt8]) -> Bool {
        left.count == right.count && zip(left, right).allSatisfy { lowercased($0) == lowercased($1) }
    }
}
