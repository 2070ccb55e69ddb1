import Crypto

/// The SHA-256 digest of a certificate's DER encoding: how qxfer names a host.
///
/// Printed as 64 lowercase hex digits. Parsing also accepts upper case, colons between
/// bytes (as `openssl x509 -fingerprint -sha256` prints them) and a `sha256:` prefix.
public struct Fingerprint: Hashable, Sendable, CustomStringConvertible, Codable {
    /// The 32 digest bytes.
    public let bytes: [UInt8]

    /// The fingerprint of a DER-encoded certificate.
    public init<Bytes: Sequence>(certificateDER: Bytes) where Bytes.Element == UInt8 {
        self.bytes = Array(SHA256.hash(data: Array(certificateDER)))
    }

    /// Parses a fingerprint typed by a person or read from a file; nil when it is not 32 hex bytes.
    public init?(parsing text: some StringProtocol) {
        var hex = text.lowercased()
        if hex.hasPrefix("sha256:") { hex.removeFirst("sha256:".count) }
        hex.removeAll { $0 == ":" }
        guard hex.count == 64, let bytes = Self.bytes(hex: hex[...]) else { return nil }
        self.bytes = bytes
    }

    /// The bytes a string of hex digit pairs spells; nil for an odd length or a non-hex digit.
    @_spi(Stacks) public static func bytes(hex: Substring) -> [UInt8]? {
        guard hex.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(hex.count / 2)
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return bytes
    }

    /// A fingerprint written in source code, such as `.sha256("3f9a…")`.
    ///
    /// Traps on malformed input, like a malformed literal would; use ``init(parsing:)`` for
    /// anything a user typed.
    public static func sha256(_ hex: String) -> Fingerprint {
        guard let fingerprint = Fingerprint(parsing: hex) else {
            preconditionFailure("not a SHA-256 fingerprint (64 hex digits): \(hex)")
        }
        return fingerprint
    }

    /// 64 lowercase hex digits.
    public var description: String { Self.hex(bytes) }

    /// `bytes` as lowercase hex digit pairs (the inverse of ``bytes(hex:)``).
    @_spi(Stacks) public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let parsed = Fingerprint(parsing: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a SHA-256 fingerprint"))
        }
        self = parsed
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}
