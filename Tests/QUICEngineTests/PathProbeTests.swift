import QUICEngine
import Testing

/// The datagrams a client sends before a connection to learn the path's datagram size
/// (``QUICPathProbe``): what they look like to a server, and which answers count.
@Suite struct PathProbeTests {
    /// The Version Negotiation a listener writes for `datagram`, as `QUICSocketHandler` does.
    static func answer(to datagram: [UInt8]) throws -> [UInt8] {
        guard case .unsupportedVersion(let header) = QUICPacketHeader.decode(datagram: datagram, shortHeaderConnectionIDLength: 10) else {
            Issue.record("a probe must read as a long header of an unsupported version")
            throw CancellationError()
        }
        return try #require(QUICVersionNegotiation.write(for: header))
    }

    @Test func aProbeIsALongHeaderOfAReservedVersionPaddedToItsSize() throws {
        for size in [1200, 1472, 8972] {
            let probe = QUICPathProbe(size: size)
            #expect(probe.size == size)
            #expect(probe.datagram.count == size)
            #expect(probe.datagram[0] & 0xc0 == 0xc0)  // long header, fixed bit
            let version = probe.datagram[1...4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            #expect(version & 0x0f0f_0f0f == 0x0a0a_0a0a)  // RFC 9000 §15: reserved, forces Version Negotiation
            #expect(probe.isAnswered(by: try Self.answer(to: probe.datagram)))
        }
        #expect(QUICPathProbe(size: 100).datagram.count == QUICPathProbe.minimumSize)
        #expect(QUICPathProbe(size: 1 << 20).datagram.count == QUICPathProbe.maximumSize)
    }

    @Test func onlyTheAnswerToThisProbeCounts() throws {
        let probe = QUICPathProbe(size: 1472)
        let other = QUICPathProbe(size: 1472)
        #expect(!probe.isAnswered(by: try Self.answer(to: other.datagram)))
        #expect(!probe.isAnswered(by: probe.datagram))  // its own echo is no answer

        let answer = try Self.answer(to: probe.datagram)
        #expect(!probe.isAnswered(by: Array(answer.dropLast())))  // versions cut short
        #expect(!probe.isAnswered(by: Array(answer.prefix(20))))
        #expect(!probe.isAnswered(by: answer + [0, 0]))
        for index in 0..<(5 + 1 + 8 + 1 + 8) {  // header, version, both IDs and their lengths
            var changed = answer
            changed[index] ^= index == 0 ? 0x80 : 0x01
            #expect(!probe.isAnswered(by: changed), "byte \(index) changed")
        }
    }

    @Test(arguments: [7, 8, 9] as [UInt64])
    func hostileAnswersAreRefusedWithoutATrap(seed: UInt64) throws {
        var rng = TestRNG(seed: seed)
        let probe = QUICPathProbe(size: 1200)
        let answer = try Self.answer(to: probe.datagram)
        for round in 0..<3000 {
            var datagram = round % 2 == 0 ? rng.bytes(Int(rng.below(300))) : FuzzTests.mutate(answer, rng: &rng)
            if round % 7 == 0, datagram.count > 5 { datagram[5] = 0xff }  // an ID length past the end
            // The oracle, spelled out: the answer's header and IDs (23 bytes), then whole versions.
            let expected = datagram.count > 23 && (datagram.count - 23) % 4 == 0 && datagram[0] & 0x80 != 0
                && datagram[1..<23] == answer[1..<23]
            #expect(probe.isAnswered(by: datagram) == expected)
        }
    }
}
