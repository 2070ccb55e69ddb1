import Testing
@testable import QXferTransfer

let sampleMessages: [Message] = [
    .offer(Offer(algorithm: .xxh3_128, entries: [
        OfferEntry(kind: .directory, path: ["photos"], mode: 0o755, modificationTime: 1_700_000_000_123_456_789),
        OfferEntry(kind: .file, path: ["photos", "été 2024.jpg"], size: 123_456_789_012, mode: 0o644, modificationTime: -5),
        OfferEntry(kind: .file, path: ["photos", "empty"], size: 0, mode: 0o600, modificationTime: 0),
        OfferEntry(kind: .symlink, path: ["photos", "latest"], mode: 0o777, modificationTime: 42, linkTarget: "été 2024.jpg"),
        OfferEntry(kind: .file, flags: .sizeUnknown, path: ["stdin"], mode: 0o644, modificationTime: 7),
    ])),
    .offer(Offer(algorithm: .sha256, entries: [])),
    .accept(Accept(answers: [
        .sendAll,
        EntryAnswer(disposition: .send, offset: 4096, prefixDigest: Array(repeating: 0xab, count: 16)),
        EntryAnswer(disposition: .present, prefixDigest: Array(1...32)),
        EntryAnswer(disposition: .skip, code: TransferError.Code.exists.rawValue),
    ])),
    .decline(Refusal(code: .noSpace, message: "10 GB offered but only 2 GB free")),
    .fileData(FileData(entry: 3, offset: 1 << 40, bytes: pattern(1000))),
    .fileData(FileData(entry: 0, offset: 0, bytes: pattern(ProtocolLimits.maximumChunkSize))),
    .fileDone(FileDone(entry: 1, size: 99, algorithm: .xxh3_128, digest: Array(repeating: 7, count: 16))),
    .fileDone(FileDone(entry: 2, size: 0, algorithm: .sha256, digest: Array(repeating: 9, count: 32))),
    .verified(entry: 0xFFFF_FFFF),
    .failed(EntryFailure(entry: 5, code: .digestMismatch, message: "bad")),
    .complete(Complete(succeeded: 10, failed: 1)),
    .error(Refusal(code: .protocolViolation, message: "")),
    .offer(Offer(algorithm: .xxh3_128, entries: [], flags: .batches)),
    .offer(Offer(algorithm: .xxh3_128, entries: [], flags: [.batches, .early, .zeros])),
    .zeros(Zeros(entry: 2, offset: 1 << 40, length: ProtocolLimits.maximumZerosLength)),
    .batch([
        .fileData(FileData(entry: 0, offset: 0, bytes: pattern(100))),
        .zeros(Zeros(entry: 0, offset: 100, length: 1)),
        .fileDone(FileDone(entry: 0, size: 101, algorithm: .xxh3_128, digest: Array(repeating: 1, count: 16))),
        .fileDone(FileDone(entry: 1, size: 0, algorithm: .xxh3_128, digest: Array(repeating: 2, count: 16))),
    ]),
    .batch([.verified(entry: 3), .failed(EntryFailure(entry: 4, code: .io, message: "disk"))]),
]

@Suite struct CodecTests {
    @Test func everyMessageTypeIsSampled() {
        #expect(Set(sampleMessages.map(\.type)) == Set(MessageType.allCases))
    }

    @Test(arguments: sampleMessages.indices)
    func roundTrip(_ index: Int) throws {
        let message = sampleMessages[index]
        let body = MessageCodec.encodeBody(message)
        #expect(try MessageCodec.decode(type: message.type.rawValue, body: body) == message)
        var decoder = FrameDecoder()
        decoder.append(MessageCodec.encodeFrame(message))
        #expect(try decoder.next() == message)
        #expect(try decoder.next() == nil)
        #expect(decoder.bufferedByteCount == 0)
    }

    @Test func frameHeaderIsTypeAndLengthBigEndian() {
        let frame = MessageCodec.encodeFrame(.verified(entry: 0x0102_0304))
        #expect(frame == [0, 0, 0, 6, 0, 0, 0, 4, 1, 2, 3, 4])
        let complete = MessageCodec.encodeFrame(.complete(Complete(succeeded: 1, failed: 2)))
        #expect(complete == [0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 2])
    }

    @Test func manyFramesInOneBufferAndByteByByte() throws {
        let stream = sampleMessages.flatMap { MessageCodec.encodeFrame($0) }
        var whole = FrameDecoder()
        whole.append(stream)
        var all: [Message] = []
        while let m = try whole.next() { all.append(m) }
        #expect(all == sampleMessages)

        // Byte by byte up to the big chunk, to keep the test fast.
        let small = sampleMessages.filter { if case .fileData(let d) = $0 { d.bytes.count < 5000 } else { true } }
        var trickle = FrameDecoder()
        var got: [Message] = []
        for byte in small.flatMap({ MessageCodec.encodeFrame($0) }) {
            trickle.append([byte])
            while let m = try trickle.next() { got.append(m) }
        }
        #expect(got == small)
    }

    /// Every strict prefix of a body is rejected (FileData excepted: a shorter payload is a
    /// valid, different message, so it is cut only inside its header; and a Batch cut between
    /// two of its frames is a valid, shorter Batch); every strict prefix of a frame just asks
    /// for more bytes.
    @Test(arguments: sampleMessages.indices)
    func truncatedAtEveryPosition(_ index: Int) throws {
        let message = sampleMessages[index]
        let body = MessageCodec.encodeBody(message)
        let cuts: Range<Int> = if case .fileData = message { 0..<13 } else { 0..<body.count }
        var frameEnds: Set<Int> = []
        if case .batch(let inner) = message {
            var end = 0
            for frame in inner.map(MessageCodec.encodeFrame) {
                end += frame.count
                frameEnds.insert(end)
            }
        }
        for cut in cuts where !frameEnds.contains(cut) {
            #expect(throws: TransferError.self) { try MessageCodec.decode(type: message.type.rawValue, body: Array(body[..<cut])) }
        }
        let frame = MessageCodec.encodeFrame(message)
        let frameCuts = frame.count > 5000 ? Array(0..<64) + [frame.count - 1] : Array(0..<frame.count)
        for cut in frameCuts {
            var decoder = FrameDecoder()
            decoder.append(frame[..<cut])
            #expect(try decoder.next() == nil)
        }
    }

    @Test func trailingBytesRejected() {
        for message in sampleMessages {
            if case .fileData = message { continue }
            let body = MessageCodec.encodeBody(message) + [0]
            #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: message.type.rawValue, body: body) }
        }
    }

    @Test func hugeFrameLengthFailsBeforeBuffering() {
        var decoder = FrameDecoder()
        decoder.append([0, 0, 0, 4, 0xFF, 0xFF, 0xFF, 0xFF])
        #expect(throws: TransferError(.limitExceeded, "")) { try decoder.next() }
        var justOver = FrameDecoder()
        let over = UInt32(ProtocolLimits.maximumMessageSize + 1)
        justOver.append([0, 0, 0, 1] + [UInt8(over >> 24), UInt8((over >> 16) & 0xff), UInt8((over >> 8) & 0xff), UInt8(over & 0xff)])
        #expect(throws: TransferError(.limitExceeded, "")) { try justOver.next() }
        var unknown = FrameDecoder()
        unknown.append([0, 0, 0, 99, 0, 0, 0, 0])
        #expect(throws: TransferError(.malformed, "")) { try unknown.next() }
    }

    @Test func countsOverLimitsRejected() throws {
        // Offer claiming 2^32-1 entries, then 1_000_001, then plausible-but-absent entries.
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 1, body: [1, 0, 0xFF, 0xFF, 0xFF, 0xFF]) }
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 1, body: [1, 0, 0x00, 0x0F, 0x42, 0x41]) }
        #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: 1, body: [1, 0, 0x00, 0x0F, 0x42, 0x40] + [UInt8](repeating: 0, count: 100)) }
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 2, body: [0xFF, 0xFF, 0xFF, 0xFF]) }
        // An entry 65 components deep.
        var deep = ByteWriter()
        deep.u8(1); deep.u8(0); deep.u32(1); deep.u8(0); deep.u8(0); deep.u16(65)
        deep.bytes([UInt8](repeating: 0, count: 200))
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 1, body: deep.buffer) }
        // A component of 256 bytes and a link target of 4096.
        var long = ByteWriter()
        long.u8(1); long.u8(0); long.u32(1); long.u8(0); long.u8(0); long.u16(1); long.u16(256)
        long.bytes([UInt8](repeating: 0x61, count: 300))
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 1, body: long.buffer) }
        // FileData one byte over the chunk limit; an empty one.
        let big = MessageCodec.encodeBody(.fileData(FileData(entry: 0, offset: 0, bytes: [UInt8](repeating: 1, count: ProtocolLimits.maximumChunkSize + 1))))
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 4, body: big) }
        #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: 4, body: [UInt8](repeating: 0, count: 12)) }
        // Zeros one byte over its limit, of length 0, and running past 2^64.
        let zeros = { (offset: UInt64, length: UInt64) in MessageCodec.encodeBody(.zeros(Zeros(entry: 0, offset: offset, length: length))) }
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 11, body: zeros(0, ProtocolLimits.maximumZerosLength + 1)) }
        #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: 11, body: zeros(0, 0)) }
        #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: 11, body: zeros(.max - 10, 11)) }
        #expect(try MessageCodec.decode(type: 11, body: zeros(.max - 11, 11)) == .zeros(Zeros(entry: 0, offset: .max - 11, length: 11)))
        // Error text over 1024 bytes; unknown algorithm; wrong digest length.
        var text = ByteWriter()
        text.u16(1); text.string16(String(repeating: "x", count: 1025))
        #expect(throws: TransferError(.limitExceeded, "")) { try MessageCodec.decode(type: 9, body: text.buffer) }
        #expect(throws: TransferError(.unsupported, "")) { try MessageCodec.decode(type: 1, body: [3, 0, 0, 0, 0, 0]) }
        #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: 5, body: [0, 0, 0, 0] + [UInt8](repeating: 0, count: 8) + [1, 15] + [UInt8](repeating: 0, count: 15)) }
    }

    @Test func semanticChecksOfEntriesAndAnswers() {
        let bad: [Message] = [
            .offer(Offer(algorithm: .xxh3_128, entries: [OfferEntry(kind: .file, path: ["a"], mode: 0o100644, modificationTime: 0)])),
            .offer(Offer(algorithm: .xxh3_128, entries: [OfferEntry(kind: .symlink, path: ["a"], mode: 0o777, modificationTime: 0)])),
            .offer(Offer(algorithm: .xxh3_128, entries: [OfferEntry(kind: .file, path: ["a"], mode: 0, modificationTime: 0, linkTarget: "b")])),
            .offer(Offer(algorithm: .xxh3_128, entries: [OfferEntry(kind: .directory, path: ["a"], size: 5, mode: 0, modificationTime: 0)])),
            .offer(Offer(algorithm: .xxh3_128, entries: [OfferEntry(kind: .file, flags: .sizeUnknown, path: ["a"], size: 5, mode: 0, modificationTime: 0)])),
            .offer(Offer(algorithm: .xxh3_128, entries: [OfferEntry(kind: .file, path: [], mode: 0, modificationTime: 0)])),
            .accept(Accept(answers: [EntryAnswer(disposition: .send, offset: 5)])),
            .accept(Accept(answers: [EntryAnswer(disposition: .send, prefixDigest: [1])])),
            .accept(Accept(answers: [EntryAnswer(disposition: .present)])),
            .accept(Accept(answers: [EntryAnswer(disposition: .skip)])),
        ]
        for message in bad {
            #expect(throws: TransferError.self) { try MessageCodec.decode(type: message.type.rawValue, body: MessageCodec.encodeBody(message)) }
        }
        // Invalid UTF-8 in a component.
        var w = ByteWriter()
        w.u8(1); w.u8(0); w.u32(1); w.u8(0); w.u8(0); w.u16(1); w.u16(2); w.bytes([0xC0, 0xAF])
        w.u64(0); w.u32(0); w.u64(0); w.u16(0)
        #expect(throws: TransferError(.malformed, "")) { try MessageCodec.decode(type: 1, body: w.buffer) }
    }

    /// Seeded random bodies and bit-flipped valid frames: decoding either throws a
    /// TransferError or yields a message whose encoding is exactly the input (the encoding is
    /// canonical), and never traps.
    @Test func randomGarbage() throws {
        var rng = SplitMix64(seed: 0x5158_4645_52)
        var decodedCount = 0
        for i in 0..<4000 {
            let type = UInt32.random(in: 0...10, using: &rng)
            var body: [UInt8]
            if i % 2 == 0 {
                body = (0..<Int.random(in: 0...96, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            } else {
                let source = sampleMessages[Int.random(in: 0..<sampleMessages.count, using: &rng)]
                body = MessageCodec.encodeBody(source)
                if body.count > 4096 { body = Array(body[..<4096]) }
                for _ in 0..<Int.random(in: 1...4, using: &rng) where !body.isEmpty {
                    body[Int.random(in: 0..<body.count, using: &rng)] ^= UInt8(1) << UInt8.random(in: 0...7, using: &rng)
                }
            }
            do {
                let message = try MessageCodec.decode(type: type, body: body)
                #expect(message.type.rawValue == type)
                #expect(MessageCodec.encodeBody(message) == body)
                decodedCount += 1
            } catch {
                // Typed throws: every failure is a TransferError with a one-line message.
                #expect(!error.message.contains("\n"))
            }
            var frames = FrameDecoder()
            frames.append((0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
            _ = try? frames.next()
        }
        #expect(decodedCount > 0)
    }

    @Test func errorMessagesAreOneLine() {
        let error = TransferError(.refused, "evil\nsecond line\u{202E}txt.exe\u{2028}👩\u{200D}👩")
        // Controls escaped, an emoji sequence (a zero-width joiner) kept whole.
        #expect(error.message == "evil\\nsecond line\\u202etxt.exe\\u2028👩\u{200D}👩")
        #expect(TransferError.Code(rawValue: 7) == .digestMismatch)
        #expect(TransferError.Code(rawValue: 7).name == "digest-mismatch")
        #expect(TransferError.Code(rawValue: 999).name == "error-999")
    }
}

@Test func longMessageTextsAreClippedNotRejected() throws {
    let long = String(repeating: "é", count: 2000)
    let body = MessageCodec.encodeBody(.error(Refusal(code: .io, message: long)))
    guard case .error(let refusal) = try MessageCodec.decode(type: 9, body: body) else {
        Issue.record("not an error")
        return
    }
    #expect(refusal.message.utf8.count <= ProtocolLimits.maximumMessageTextLength)
    #expect(refusal.message.hasSuffix("…") && refusal.message.hasPrefix("éé"))
}
