import NIOCore
import Testing
import QXfer
@_spi(Stacks) @testable import QXferCore
@_spi(Stacks) @testable import QXferDiscovery
@_spi(Stacks) @testable import QXferIdentity
@_spi(Stacks) @testable import QXferQUIC
@_spi(Stacks) @testable import QXferSockets
@_spi(Stacks) @testable import QXferTLS

/// The DNS message codec: round trips, and hostile packets rejected without harm.
@Suite("Discovery: DNS codec")
struct DiscoveryCodecTests {
    static let serviceType = DNSName("_qxfer._udp.local")
    static let instance = serviceType.prepending("Office PC. 2nd floor")
    static let host = DNSName("office-pc.local")

    static var sampleResponse: DNSMessage {
        .response(
            answers: [DNSRecord(name: serviceType, ttl: 4500, data: .ptr(instance))],
            additionals: [
                DNSRecord(name: instance, cacheFlush: true, ttl: 120, data: .srv(priority: 0, weight: 0, port: 4433, target: host)),
                DNSRecord(name: instance, cacheFlush: true, ttl: 4500, data: .txt([Array("fp=3f9a".utf8), Array("txtvers=1".utf8)])),
                DNSRecord(name: host, cacheFlush: true, ttl: 120, data: .a([10, 0, 0, 7])),
                DNSRecord(name: host, cacheFlush: true, ttl: 120, data: .aaaa([0xfe, 0x80] + Array(repeating: 0, count: 13) + [1])),
            ])
    }

    @Test("a response round-trips, names compressed, labels with dots and spaces intact")
    func roundTrip() throws {
        let message = Self.sampleResponse
        let bytes = message.encoded
        let parsed = try DNSMessage(parsing: bytes)
        #expect(parsed == message)
        #expect(parsed.answers[0].data == .ptr(Self.instance))
        #expect(Self.instance.firstLabel == "Office PC. 2nd floor")
        // Without compression the names alone would take more than the whole message does.
        let uncompressedNames = (1 + 4) * Self.instance.wireLength + 3 * Self.host.wireLength
        #expect(bytes.count < uncompressedNames)
    }

    @Test("names compare without ASCII case")
    func caseInsensitiveNames() {
        #expect(DNSName("_QXFER._UDP.Local") == Self.serviceType)
        #expect(Set([DNSName("A.local"), DNSName("a.LOCAL")]).count == 1)
        #expect(DNSName("a.local") != DNSName("b.local"))
    }

    @Test("every truncation of a valid message is rejected")
    func truncated() {
        let bytes = Self.sampleResponse.encoded
        for length in 0..<bytes.count {
            #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Array(bytes.prefix(length))) }
        }
    }

    /// A header, then `body`.
    static func packet(questions: UInt16 = 0, answers: UInt16 = 0, _ body: [UInt8]) -> [UInt8] {
        [0, 0, 0x84, 0, UInt8(questions >> 8), UInt8(questions & 0xFF), UInt8(answers >> 8), UInt8(answers & 0xFF), 0, 0, 0, 0] + body
    }

    @Test("compression loops are rejected: a pointer to itself, a forward pointer, two pointers in a cycle")
    func compressionLoops() {
        // Offset 12: a pointer to offset 12 (itself).
        let selfLoop = Self.packet(questions: 1, [0xC0, 12, 0, 12, 0, 1])
        // Offset 12: label "a", then a pointer to offset 12 (back to its own start).
        let labelLoop = Self.packet(questions: 1, [1, 0x61, 0xC0, 12, 0, 12, 0, 1])
        // Offset 12: a pointer forward to offset 14, which points back to 12.
        let cycle = Self.packet(questions: 1, [0xC0, 14, 0xC0, 12, 0, 12, 0, 1])
        for packet in [selfLoop, labelLoop, cycle] {
            #expect(throws: DNSParseError.self) { try DNSMessage(parsing: packet) }
        }
        // A legitimate backward pointer is fine: question 2 points at question 1's name.
        let fine = Self.packet(questions: 2, [1, 0x61, 0, 0, 1, 0, 1, 0xC0, 12, 0, 1, 0, 1])
        #expect((try? DNSMessage(parsing: fine))?.questions.count == 2)
    }

    @Test("counts the packet cannot hold are rejected before any work")
    func hugeCounts() {
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(answers: 0xFFFF, [0, 0, 1, 0, 1])) }
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(questions: 0xFFFF, [])) }
        // Within the entry limit but more records than bytes.
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(answers: 200, Array(repeating: 0, count: 100))) }
    }

    @Test("overlong names, reserved label types and inconsistent record lengths are rejected")
    func malformedFields() {
        // 130 one-byte labels: 261 bytes on the wire, over the 255 limit.
        let longName: [UInt8] = Array([[UInt8]](repeating: [1, 0x61], count: 130).joined()) + [0]
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(questions: 1, longName + [0, 1, 0, 1])) }
        // Label type 0x40 (extended), then 0x80 (reserved).
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(questions: 1, [0x41, 0, 0, 1, 0, 1])) }
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(questions: 1, [0x81, 0, 0, 1, 0, 1])) }
        // An A record whose length says 5.
        #expect(throws: DNSParseError.self) {
            try DNSMessage(parsing: Self.packet(answers: 1, [0, 0, 1, 0, 1, 0, 0, 0, 10, 0, 5, 1, 2, 3, 4, 5]))
        }
        // A TXT string running past its record.
        #expect(throws: DNSParseError.self) {
            try DNSMessage(parsing: Self.packet(answers: 1, [0, 0, 16, 0, 1, 0, 0, 0, 10, 0, 3, 5, 0x61, 0x62, 0, 0, 0]))
        }
        // Longer than 9000 bytes.
        #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Self.packet(Array(repeating: 0, count: 9000))) }
    }

    @Test("random corruption of valid messages never crashes the parser, and what parses re-encodes")
    func mutations() async {
        let original = Self.sampleResponse.encoded
        let parsedCount = await offThePool { Self.parsedMutations(of: original, count: 20_000) }
        #expect(parsedCount > 0)  // the mutations do not all break the header
    }

    /// How many of `count` random corruptions of `original` still parse (each re-encoded).
    static func parsedMutations(of original: [UInt8], count: Int) -> Int {
        var random = MDNSRandom(seed: 7)
        var parsedCount = 0
        for _ in 0..<count {
            var bytes = original
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let index = Int.random(in: 0..<bytes.count, using: &random)
                bytes[index] = UInt8.random(in: 0...255, using: &random)
            }
            if Bool.random(using: &random) { bytes = Array(bytes.prefix(Int.random(in: 0...bytes.count, using: &random))) }
            if let message = try? DNSMessage(parsing: bytes) {
                parsedCount += 1
                _ = message.encoded
            }
        }
        return parsedCount
    }

    @Test("TXT: key=value, boolean keys, first occurrence wins, case-insensitive lookup")
    func txtRecords() {
        let txt = TXTRecord(strings: [Array("fp=abc".utf8), Array("FP=zzz".utf8), Array("flag".utf8), [], Array("=novalue".utf8), Array("empty=".utf8)])
        #expect(txt["fp"] == "abc")
        #expect(txt["Fp"] == "abc")
        #expect(txt.contains("flag") && txt["flag"] == nil)
        #expect(txt["empty"] == "")
        #expect(txt.entries.count == 3)
        let built: TXTRecord = ["txtvers": "1", "fp": "abc"]
        #expect(TXTRecord(strings: built.strings) == built)
    }
}
