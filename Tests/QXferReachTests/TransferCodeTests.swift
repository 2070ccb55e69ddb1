import Crypto
import Testing
@testable import QXferReach
@testable import QXferPairing

@Suite("Transfer codes")
struct TransferCodeTests {
    @Test("The word list holds 256 distinct lowercase words, sorted, each found at its index")
    func wordList() {
        #expect(WordList.words.count == 256)
        #expect(Set(WordList.words).count == 256)
        #expect(WordList.words == WordList.words.sorted())
        for (index, word) in WordList.words.enumerated() {
            #expect(word.allSatisfy { $0.isLowercase && $0.isASCII } && (3...7).contains(word.count), "\(word)")
            #expect(WordList.index(of: word) == index)
        }
        #expect(WordList.index(of: "zzz") == nil && WordList.index(of: "") == nil)
    }

    @Test("A random code parses back to itself, with any case and spaces for dashes")
    func roundTrip() throws {
        for limit in [2, 100, 1000, 10000, 1_000_000] {
            let code = TransferCode.random(nameplateLimit: limit)
            #expect(TransferCode.nameplates.contains(code.nameplate) && code.nameplate < max(limit, 2))
            #expect(TransferCode(parsing: code.description) == code)
            #expect(TransferCode(parsing: code.description.uppercased().replacing("-", with: " ")) == code)
        }
        // Separators doubled or around the code, as a person may paste it, are ignored.
        #expect(TransferCode(parsing: " 7--apple  river-stone- ")?.description == "7-apple-river-stone")
    }

    @Test("Codes that are not codes are refused", arguments: [
        "", "7", "7-apple-river", "7-apple-river-stone-extra", "0-apple-river-stone", "10000-apple-river-stone",
        "07x-apple-river-stone", "7-apple-river-stones", "7-apple-river-", "٣-apple-river-stone",
        "99999999999999999999-apple-river-stone",
    ])
    func refused(_ text: String) {
        #expect(TransferCode(parsing: text) == nil)
    }

    @Test("The room is SHA-256 of the label and the nameplate only: the words never reach the relay")
    func room() throws {
        let a = try #require(TransferCode(parsing: "42-apple-river-stone"))
        let b = try #require(TransferCode(parsing: "42-zebra-wolf-swan"))
        let c = try #require(TransferCode(parsing: "43-apple-river-stone"))
        #expect(a.room == b.room && a.room != c.room)
        #expect(a.room == Array(SHA256.hash(data: Array("qxfer room v1".utf8) + [0] + Array("42".utf8))))
        #expect(a.roomHex.count == 64 && a.roomHex.allSatisfy { $0.isHexDigit && !$0.isUppercase })
        #expect(a.password.scalar != b.password.scalar)
    }
}
