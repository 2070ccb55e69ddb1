import Foundation
import QXfer
@testable import QXferTransfer
import Testing

/// Early files (issue 21, docs/PROTOCOL.md §3.7): small files sent right behind the Offer,
/// before Accept, so a transfer of small files ends a round trip sooner; the receiver answers
/// them as any file, and a hostile early mark gets a clear refusal.
@Suite("Early files: data before Accept")
struct EarlyFilesTests {
    static func file(_ path: [String], size: UInt64, early: Bool = true) -> OfferEntry {
        HostileNumbersTests.file(path, size: size, flags: early ? .early : [])
    }
    static func offer(_ entries: [OfferEntry], flags: Offer.Flags = [.batches, .early]) -> Message {
        .offer(Offer(algorithm: .xxh3_128, entries: entries, flags: flags))
    }
    /// One file whole, FileData (if any) and FileDone, as inner frames of a Batch.
    static func whole(_ entry: UInt32, _ content: [UInt8]) -> [Message] {
        (content.isEmpty ? [] : [.fileData(FileData(entry: entry, offset: 0, bytes: content))]) + [BatchTests.done(entry, content)]
    }

    // MARK: The codec

    @Test("An early mark is refused outside an offer of early files, on a folder, a stream or a file too large, and past 4 MiB in all")
    func earlyMarksThatDoNotFit() throws {
        let limit = ProtocolLimits.maximumEarlyFileSize
        let folder = OfferEntry(kind: .directory, flags: .early, path: ["d"], mode: 0o755, modificationTime: 0)
        let stream = OfferEntry(kind: .file, flags: [.early, .sizeUnknown], path: ["s"], mode: 0o644, modificationTime: 0)
        let cases: [(String, Message, TransferError.Code)] = [
            ("without the offer flag", Self.offer([Self.file(["a"], size: 1)], flags: .batches), .malformed),
            ("on a folder", Self.offer([folder]), .malformed),
            ("on a file of unknown size", Self.offer([stream]), .malformed),
            ("on a file above 256 KiB", Self.offer([Self.file(["a"], size: limit + 1)]), .malformed),
            ("past 4 MiB in all", Self.offer((0...16).map { Self.file(["f\($0)"], size: limit) }), .limitExceeded),
        ]
        for (name, message, code) in cases {
            let body = MessageCodec.encodeBody(message)
            #expect(throws: TransferError(code, ""), "\(name)") { try MessageCodec.decode(type: MessageType.offer.rawValue, body: body) }
        }
        let fits = Self.offer((0..<16).map { Self.file(["f\($0)"], size: limit) } + [Self.file(["late"], size: limit + 1, early: false)])
        #expect(try MessageCodec.decode(type: MessageType.offer.rawValue, body: MessageCodec.encodeBody(fits)) == fits)
    }

    @Test("A sender takes a resume offset for a file it sent early as a protocol violation")
    func earlyFileWithAResumeOffset() {
        let entry = Self.file(["a"], size: 100)
        let answer = EntryAnswer(disposition: .send, offset: 10, prefixDigest: DigestAlgorithm.xxh3_128.digest(of: pattern(10)))
        #expect(throws: TransferError(.protocolViolation, "")) { try SenderLedger(entries: [entry], algorithm: .xxh3_128, answers: [answer]) }
        var late = entry
        late.flags = []
        #expect((try? SenderLedger(entries: [late], algorithm: .xxh3_128, answers: [answer])) != nil)
    }

    // MARK: The receiver

    @Test("Early files sent before Accept: a new one is written, one present is compared, one skipped is dropped; a later file follows", arguments: StackKind.allCases)
    func receiverAnswersEarlyFiles(_ kind: StackKind) async throws {
        let (scratch, dst) = try HostileNumbersTests.emptyFolder()
        defer { scratch.cleanup() }
        let new = pattern(3000, seed: 1), same = pattern(2000, seed: 2), other = pattern(1000, seed: 3)
        let big = pattern(Int(ProtocolLimits.maximumEarlyFileSize) + 10, seed: 4)
        let otherThere = pattern(999, seed: 5)
        try Data(same).write(to: URL(fileURLWithPath: dst + "/same"))
        try Data(otherThere).write(to: URL(fileURLWithPath: dst + "/other"))
        let entries = [
            Self.file(["new"], size: 3000), Self.file(["same"], size: 2000), Self.file(["other"], size: 1000),
            Self.file(["big"], size: UInt64(big.count), early: false),
        ]
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: dst))
        }, send: { peer in
            try await peer.send(Self.offer(entries))
            // Before any answer: the three early files, whole, in one Batch.
            let early = try await peer.openDataStream()
            try await early.send(.batch(Self.whole(0, new) + Self.whole(1, same) + Self.whole(2, other)))
            if early.hasIndependentStreams { try await early.finish() }
            guard case .accept(let accept)? = try await peer.receiveMessage() else { throw TransferError(.protocolViolation, "no Accept") }
            let late = try await HostileNumbersTests.sendFile(peer, entry: 3, big)
            var replies: [Message] = [.accept(accept)]
            while let reply = try await peer.receiveMessage() {
                if case .batch(let inner) = reply { replies += inner } else { replies.append(reply) }
                if case .complete = reply { break }
                if case .error = reply { break }
            }
            withExtendedLifetime((early, late)) {}
            return replies
        })
        let replies = try client.get()
        guard case .accept(let accept)? = replies.first else { Issue.record("\(replies)"); return }
        #expect(accept.answers.map(\.disposition) == [.send, .present, .skip, .send])
        #expect(accept.answers[0].offset == 0 && accept.answers[2].code == TransferError.Code.exists.rawValue)
        for entry: UInt32 in [0, 1, 3] { #expect(replies.contains(.verified(entry: entry)), "\(entry): \(replies)") }
        #expect(!replies.contains { if case .failed = $0 { true } else { false } }, "\(replies)")
        #expect(replies.last == .complete(Complete(succeeded: 3, failed: 1)))
        #expect(try server.get().succeeded == 3)
        #expect(readFile(dst + "/new") == new && readFile(dst + "/same") == same && readFile(dst + "/big") == big)
        #expect(readFile(dst + "/other") == otherThere)
        let left = try FileManager.default.contentsOfDirectory(atPath: dst).filter { $0.hasPrefix(".") }
        #expect(left.isEmpty, "\(left)")
    }

    @Test("Dropped early data is still checked: a skipped file's data past its size, or a gap, is a protocol violation", arguments: StackKind.allCases)
    func droppedEarlyDataIsChecked(_ kind: StackKind) async throws {
        let attacks: [(String, [Message])] = [
            ("past its size", [.fileData(FileData(entry: 0, offset: 0, bytes: pattern(1001)))]),
            ("at a gap", [.fileData(FileData(entry: 0, offset: 0, bytes: pattern(10))), .fileData(FileData(entry: 0, offset: 20, bytes: pattern(10)))]),
            ("again after its FileDone", Self.whole(0, pattern(1000)) + [.fileData(FileData(entry: 0, offset: 0, bytes: pattern(10)))]),
        ]
        for (name, inner) in attacks {
            let (scratch, dst) = try HostileNumbersTests.emptyFolder()
            defer { scratch.cleanup() }
            let there = pattern(10, seed: 9)
            try Data(there).write(to: URL(fileURLWithPath: dst + "/target"))  // another size: skipped
            let (server, replies) = try await HostileNumbersTests.accepted(kind, [Self.file(["target"], size: 1000)], dst: dst, flags: [.batches, .early]) { peer, accept in
                #expect(accept.answers.first?.disposition == .skip, "\(name)")
                let data = try await peer.openDataStream()
                try await data.send(.batch(inner))
                return data
            }
            #expect(throws: TransferError(.protocolViolation, ""), "\(name)") { try server.get() }
            guard case .error(let refusal)? = replies.last else {
                Issue.record("\(name): expected an Error, got \(replies)")
                continue
            }
            #expect(refusal.code == .protocolViolation, "\(name): \(refusal.message)")
            #expect(readFile(dst + "/target") == there, "\(name)")
        }
    }

    // MARK: The sender

    @Test("The sender marks its small files early and sends them before Accept; the larger one waits for it", arguments: StackKind.allCases)
    func senderDoesNotWaitForAccept(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let small = pattern(5000, seed: 1), large = pattern(Int(ProtocolLimits.maximumEarlyFileSize) + 1, seed: 2)
        try FileManager.default.createDirectory(atPath: scratch.sub("src"), withIntermediateDirectories: true)
        try Data(small).write(to: URL(fileURLWithPath: scratch.sub("src/a-small")))
        try Data(large).write(to: URL(fileURLWithPath: scratch.sub("src/b-large")))
        let tree = try SourceTree.scan([scratch.sub("src")])
        let (server, client) = try await withConnectedPair(kind, receive: { peer -> [UInt8] in
            guard case .offer(let offer)? = try await peer.receiveMessage() else { throw TransferError(.protocolViolation, "no offer") }
            #expect(offer.flags == [.batches, .early])
            let marked = offer.entries.filter { $0.flags.contains(.early) }.map { $0.path.last! }
            #expect(marked == ["a-small"], "\(offer.entries)")
            let smallIndex = UInt32(offer.entries.firstIndex { $0.path.last == "a-small" }!)
            // No Accept yet: the small file must arrive all the same (a sender that waits for
            // Accept would wait forever: the test gives up after 20 s).
            let (data, first) = try await withThrowingTaskGroup(of: ((any TransferPeer), Message?).self) { group in
                group.addTask {
                    let data = try await peer.acceptDataStream()
                    return (data, try await data.receiveMessage())
                }
                group.addTask {
                    try await Task.sleep(for: .seconds(20))
                    throw TransferError(.cancelled, "nothing came before Accept")
                }
                defer { group.cancelAll() }
                return try await group.next()!
            }
            guard case .batch(let inner)? = first,
                  case .fileData(let chunk) = inner.first, chunk.entry == smallIndex, case .fileDone = inner.last else {
                throw TransferError(.protocolViolation, "no early Batch before Accept")
            }
            // Take nothing else: the folder and the small file are answered, the large one skipped.
            let answers = offer.entries.map { $0.path.last == "b-large" ? EntryAnswer(disposition: .skip, code: TransferError.Code.exists.rawValue) : EntryAnswer.sendAll }
            try await peer.send(.accept(Accept(answers: answers)))
            try await peer.send(.verified(entry: smallIndex))
            try await peer.send(.complete(Complete(succeeded: UInt32(offer.entries.count - 1), failed: 1)))
            _ = try? await peer.receiveMessage()  // the sender closes
            withExtendedLifetime(data) {}
            return [UInt8](chunk.bytes)
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(try server.get() == small)
        let summary = try client.get()
        #expect(summary.failures.count == 1 && summary.failures.first?.path.hasSuffix("b-large") == true, "\(summary.failures)")
        // The answer carries only a code: the sender says what it means.
        #expect(summary.failures.first?.error.message.hasPrefix("the receiver already has something else under that name") == true)
    }
}
