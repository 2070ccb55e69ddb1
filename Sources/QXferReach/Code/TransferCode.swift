import Crypto
import FoundationEssentials
import PlainText
import QXferPairing

/// A transfer code, `N-word-word-word` (docs/PROTOCOL.md §9.1): a nameplate that names the
/// room at the relay, and three words that are the password.
///
/// The relay learns only SHA-256 of the nameplate; the words never leave the two machines. Three
/// words of 256 are 24 bits: an attacker who joins the room first gets one guess, right with
/// probability 1 in 16 777 216, and the code is spent either way.
public struct TransferCode: Sendable, Hashable, CustomStringConvertible {
    /// The nameplate, 1–9999.
    public let nameplate: Int
    /// The three words, lowercase, each in the word list.
    public let words: [String]

    public static let nameplates = 1...9999
    public static let wordCount = 3

    /// A fresh code: random words, and a random nameplate below `nameplateLimit` (short numbers
    /// first; a sender whose room is taken draws again with a larger limit).
    public static func random(nameplateLimit: Int = 100) -> TransferCode {
        var generator = SystemRandomNumberGenerator()
        let limit = min(max(nameplateLimit, 2), nameplates.upperBound + 1)
        let words = (0..<wordCount).map { _ in WordList.words[Int.random(in: 0..<WordList.words.count, using: &generator)] }
        return TransferCode(nameplate: Int.random(in: 1..<limit, using: &generator), words: words)
    }

    private init(nameplate: Int, words: [String]) {
        self.nameplate = nameplate
        self.words = words
    }

    /// A code as typed: the nameplate then three words, separated by dashes or spaces, any case.
    public init?(parsing text: String) {
        let parts = text.lowercased().split(whereSeparator: { $0 == "-" || $0 == " " }).map(String.init)
        guard parts.count == 1 + Self.wordCount, parts[0].utf8.count <= 4, parts[0].utf8.allSatisfy({ (0x30...0x39).contains($0) }),
              let nameplate = Int(parts[0]), Self.nameplates.contains(nameplate),
              parts.dropFirst().allSatisfy({ WordList.index(of: $0) != nil })
        else { return nil }
        self.init(nameplate: nameplate, words: Array(parts.dropFirst()))
    }

    /// "7-apple-river-stone".
    public var description: String { ([String(nameplate)] + words).joined(separator: "-") }

    /// The room at the relay: SHA-256("qxfer room v1" ‖ 0x00 ‖ the nameplate in decimal).
    public var room: [UInt8] {
        var hash = SHA256()
        hash.update(data: Array("qxfer room v1".utf8) + [0] + Array(String(nameplate).utf8))
        return Array(hash.finalize())
    }

    /// The room as the relay's `hello` carries it: 64 lowercase hex digits.
    public var roomHex: String { TextFormat.hex(room) }

    /// The password the pairing exchange proves knowledge of: the words joined by dashes.
    public var password: PairingPassword { PairingPassword(Array(words.joined(separator: "-").utf8), domain: "qxfer transfer code v1") }

    /// The helper text a mistyped code gets.
    public static let form = "a number and three words, such as 7-apple-river-stone"
}
