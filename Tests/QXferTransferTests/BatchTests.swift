import Foundation
import QXfer
@testable import QXferTransfer
import Testing

/// Many small files (issue 21): Batch messages and the `batches` offer flag
/// (docs/PROTOCOL.md §3.6), several entries per QUIC data stream, the receiver's committer —
/// and that a hostile sender gets exactly the refusals it got before batching.
@Suite("Batches of small files")
struct BatchTests {
    static func file(_ path: [String], size: UInt64) -> OfferEntry { HostileNumbersTests.file(path, size: size) }
    static func done(_ entry: UInt32, _ content: [UInt8], size: UInt64? = nil) -> Message {
        .fileDone(FileDone(entry: entry, size: size ?? UInt64(content.count), algorithm: .xxh3_128, digest: DigestAlgorithm.xxh3_128.digest(of: content)))
    }
    static func frame(_ type: UInt32, _ body: [UInt8]) -> [UInt8] {
        var w = ByteWriter()
        w.u32(type)
        w.u32(UInt32(body.count))
        w.bytes(body)
        return w.buffer
    }

    // MARK: The codec

    @Test("A Batch that is empty, overruns, nests, or holds a malformed frame is refused with its code")
    func malformedBatches() {
        let verified = Self.frame(MessageType.verified.rawValue, [0, 0, 0, 1])
        let cases: [(String, [UInt8], TransferError.Code)] = [
            ("empty", [], .malformed),
            ("an inner length past the end", Array(Self.frame(MessageType.verified.rawValue, [0, 0, 0, 1, 9]).dropLast()), .malformed),
            ("half a header at the end", verified + [0, 0, 0], .malformed),
            ("a Batch inside", Self.frame(MessageType.batch.rawValue, verified), .protocolViolation),
            ("an inner frame with trailing bytes", Self.frame(MessageType.verified.rawValue, [0, 0, 0, 1, 0]), .malformed),
            ("an unknown inner type", Self.frame(99, []), .malformed),
            ("an inner length of 2^32 - 1", [0, 0, 0, 6, 0xFF, 0xFF, 0xFF, 0xFF], .malformed),
        ]
        for (name, body, code) in cases {
            #expect(throws: TransferError(code, ""), "\(name)") { try MessageCodec.decode(type: MessageType.batch.rawValue, body: body) }
        }
        let two = try? MessageCodec.decode(type: MessageType.batch.rawValue, body: verified + verified)
        #expect(two == .batch([.verified(entry: 1), .verified(entry: 1)]))
    }

    @Test("Offer flags other than batches, early files, zeros and long are unsupported, as an older receiver refuses them")
    func unknownOfferFlags() {
        var body = MessageCodec.encodeBody(.offer(Offer(algorithm: .xxh3_128, entries: [])))
        for flags: UInt8 in [16, 32, 64, 128, 0x1f] {
            body[1] = flags
            #expect(throws: TransferError(.unsupported, "")) { try MessageCodec.decode(type: MessageType.offer.rawValue, body: body) }
        }
        body[1] = 15
        #expect((try? MessageCodec.decode(type: MessageType.offer.rawValue, body: body)) == .offer(Offer(algorithm: .xxh3_128, entries: [], flags: [.batches, .early, .zeros, .long])))
    }

    // MARK: Whole transfers

    @Test("Hundreds of small files in folders and two large ones arrive identical, all verified", arguments: StackKind.allCases)
    func manySmallFiles(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        var random = SplitMix64(seed: 21)
        var expected: [String: [UInt8]] = [:]
        for index in 0..<600 {
            let path = "tree/dir\(index % 12)/file\(index)"
            expected[path] = pattern(Int(random.next() % 9000), seed: index)
        }
        expected["tree/large/a"] = pattern(3 << 20, seed: 1)
        expected["tree/large/b"] = pattern(Int(TransferSender.batchedFileLimit) + 1, seed: 2)
        for (path, content) in expected {
            let full = scratch.sub("src/" + path)
            try FileManager.default.createDirectory(atPath: (full as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Data(content).write(to: URL(fileURLWithPath: full))
        }
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        let tree = try SourceTree.scan([scratch.sub("src/tree")])
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let sent = try client.get(), received = try server.get()
        #expect(sent.isComplete && received.isComplete)
        #expect(sent.succeeded == tree.entries.count && received.succeeded == tree.entries.count)
        #expect(sent.digests.count == expected.count)
        // Both sides name each file by its path with the digest of its content, as xxhsum -H2 prints it.
        let digests = Dictionary(uniqueKeysWithValues: expected.map { ($0.key, hexString(DigestAlgorithm.xxh3_128.digest(of: $0.value))) })
        for summary in [sent, received] {
            #expect(Dictionary(summary.digests.map { ($0.path, $0.digest) }) { first, _ in first } == digests)
        }
        for (path, content) in expected {
            #expect(readFile(scratch.sub("dst/" + path)) == content, "\(path)")
        }
        let leftovers = FileManager.default.enumerator(atPath: scratch.sub("dst"))?.compactMap { $0 as? String }.filter { $0.contains(".qxfer-") } ?? []
        #expect(leftovers.isEmpty, "\(leftovers)")
    }

    @Test("A sender meeting a receiver from before batches gets a clear error at once", arguments: StackKind.allCases)
    func olderReceiver(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try Data(pattern(10)).write(to: URL(fileURLWithPath: scratch.sub("small")))
        let tree = try SourceTree.scan([scratch.sub("small")])
        let (_, client) = try await withConnectedPair(kind, receive: { peer in
            // What qxfer before §3.6 does with the flag: its decoder refuses it.
            guard case .offer(let offer)? = try await peer.receiveMessage(), offer.flags.contains(.batches) else { return }
            try await peer.send(.error(Refusal(code: .unsupported, message: "unknown offer flags \(offer.flags.rawValue)")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(throws: TransferError(.unsupported, "")) { try client.get() }
        if case .failure(let error as TransferError) = client {
            #expect(error.message.contains("older qxfer"), "\(error.message)")
        }
    }

    // MARK: Hostile batches: the refusals of one message alone

    @Test("Inside a Batch, data past the offered size, a second copy of a file, a Batch without the flag and a receiver's message are refused as alone", arguments: StackKind.allCases)
    func hostileBatches(_ kind: StackKind) async throws {
        let content = pattern(1000)
        let attacks: [(String, Offer.Flags, [Message], TransferError.Code)] = [
            ("data past the offered size", .batches, [.fileData(FileData(entry: 0, offset: 0, bytes: pattern(1001)))], .protocolViolation),
            ("data at a gap", .batches, [.fileData(FileData(entry: 0, offset: 10, bytes: pattern(10)))], .protocolViolation),
            ("the same file again after its FileDone", .batches, [.fileData(FileData(entry: 0, offset: 0, bytes: content)), Self.done(0, content), .fileData(FileData(entry: 0, offset: 0, bytes: content))], .protocolViolation),
            ("an entry not offered", .batches, [.fileData(FileData(entry: 7, offset: 0, bytes: content))], .protocolViolation),
            ("a Batch without the flag", [], [.fileData(FileData(entry: 0, offset: 0, bytes: content))], .malformed),
            ("a Complete inside", .batches, [.complete(Complete(succeeded: 1, failed: 0))], .protocolViolation),
        ]
        for (name, flags, inner, code) in attacks {
            let (scratch, dst) = try HostileNumbersTests.emptyFolder()
            defer { scratch.cleanup() }
            try await HostileNumbersTests.expectRefused(kind, name, [Self.file(["target"], size: 1000)], dst: dst, flags: flags, sending: [.batch(inner)], code: code)
            let left = try FileManager.default.contentsOfDirectory(atPath: dst)
            #expect(left.isEmpty, "\(name) left \(left)")
        }
    }

    @Test("A size that lies in one file's FileDone inside a Batch fails that file alone; the others arrive", arguments: StackKind.allCases)
    func lyingSizeInBatch(_ kind: StackKind) async throws {
        let (scratch, dst) = try HostileNumbersTests.emptyFolder()
        defer { scratch.cleanup() }
        let files = (0..<3).map { pattern(100 + $0, seed: $0) }
        let entries = files.indices.map { Self.file(["f\($0)"], size: UInt64(files[$0].count)) }
        let (server, replies) = try await HostileNumbersTests.accepted(kind, entries, dst: dst, flags: .batches) { peer, _ in
            let data = try await peer.openDataStream()
            var inner: [Message] = []
            for (index, content) in files.enumerated() {
                inner.append(.fileData(FileData(entry: UInt32(index), offset: 0, bytes: content)))
                inner.append(Self.done(UInt32(index), content, size: index == 1 ? 99 : nil))
            }
            try await data.send(.batch(inner))
            if data.hasIndependentStreams { try await data.finish() }
            return data
        }
        let verdicts = replies.flatMap { reply -> [Message] in
            if case .batch(let inner) = reply { return inner }
            return [reply]
        }
        #expect(verdicts.contains(.verified(entry: 0)) && verdicts.contains(.verified(entry: 2)), "\(verdicts)")
        #expect(verdicts.contains { if case .failed(let f) = $0 { f.entry == 1 && f.code == .digestMismatch } else { false } }, "\(verdicts)")
        #expect(replies.last == .complete(Complete(succeeded: 2, failed: 1)))
        #expect(try server.get().failures.count == 1)
        #expect(readFile(dst + "/f0") == files[0] && readFile(dst + "/f2") == files[2])
        #expect(!exists(dst + "/f1"))
    }

    @Test("Batched offers meet the same limits: too many entries, duplicate names", arguments: StackKind.allCases)
    func batchedOffersMeetTheLimits(_ kind: StackKind) async throws {
        let offers: [(String, [OfferEntry], TransferError.Code)] = [
            ("more entries than allowed", (0..<11).map { Self.file(["f\($0)"], size: 1) }, .limitExceeded),
            ("the same name twice", [Self.file(["twice"], size: 1), Self.file(["twice"], size: 2)], .unsafePath),
        ]
        for (name, entries, code) in offers {
            let (scratch, dst) = try HostileNumbersTests.emptyFolder()
            defer { scratch.cleanup() }
            let (server, client) = try await withConnectedPair(kind, receive: { peer in
                try await peer.runReceiver(TransferReceiver(directory: dst, maximumEntries: 10))
            }, send: { peer in
                try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: entries, flags: .batches)))
                return try await peer.receiveMessage()
            })
            #expect(throws: TransferError(code, ""), "\(name)") { try server.get() }
            guard case .decline(let refusal)? = try client.get() else {
                Issue.record("\(name): expected a Decline, got \(String(describing: try? client.get()))")
                continue
            }
            #expect(refusal.code == code, "\(name)")
        }
    }

    // MARK: The committer

    /// A store in an empty folder with `count` files written and verified, not yet committed.
    private func verifiedFiles(_ count: Int) throws -> (scratch: TempDir, dst: String, store: FileStore, files: [(entry: UInt32, writer: FileWriter)]) {
        let (scratch, dst) = try HostileNumbersTests.emptyFolder()
        let store = FileStore(directory: try TargetDirectory(path: dst))
        var files: [(entry: UInt32, writer: FileWriter)] = []
        for index in 0..<count {
            let content = pattern(index + 1, seed: index)
            let target = FileTarget(path: try SafePath(validating: ["f\(index)"]), size: UInt64(content.count), mode: 0o640, modificationTime: 0, algorithm: .xxh3_128)
            let writer = try store.openWriter(for: target)
            try writer.write(content, at: 0)
            try writer.verify(size: UInt64(content.count), digest: DigestAlgorithm.xxh3_128.digest(of: content))
            files.append((UInt32(index), writer))
        }
        return (scratch, dst, store, files)
    }

    @Test("The committer renames every verified file of a group and fails only the one whose name appeared meanwhile",
          arguments: [FileCommitter.fileSystemSyncMinimum - 1, 100])  // fsync of each; one syncfs
    func committerGroup(count: Int) throws {
        let (scratch, dst, store, files) = try verifiedFiles(count)
        defer { scratch.cleanup() }
        #expect(!exists(dst + "/f0"), "a final name before the commit")
        try Data("already here".utf8).write(to: URL(fileURLWithPath: dst + "/f7"))
        let outcomes = FileCommitter.commit(CommitGroup(files: files))
        try store.syncDirectories()
        #expect(outcomes.count == count)
        #expect(Set(outcomes.map(\.entry)) == Set(0..<UInt32(count)))
        #expect(outcomes.filter { $0.error != nil }.map(\.entry) == [7])
        #expect(outcomes.first { $0.entry == 7 }?.error?.code == .exists)
        #expect(readFile(dst + "/f7") == Array("already here".utf8))
        for index in 0..<count where index != 7 {
            #expect(readFile(dst + "/f\(index)") == pattern(index + 1, seed: index))
        }
    }

    @Test("A group synced at once gets no final name before its file system sync, and each file's own fsync when that sync fails",
          arguments: [0, EIO])
    func committerSyncsBeforeRenaming(syncError: Int32) throws {
        let count = FileCommitter.fileSystemSyncMinimum * 2
        let (scratch, dst, store, files) = try verifiedFiles(count)
        defer { scratch.cleanup() }
        var syncs = 0
        let outcomes = FileCommitter.commit(CommitGroup(files: files)) { descriptor in
            syncs += 1
            // Crash safety (docs/PROTOCOL.md §6): data durable before any name appears.
            #expect((0..<count).allSatisfy { !exists(dst + "/f\($0)") }, "a final name before the sync")
            #expect(fcntl(descriptor, F_GETFD) >= 0, "syncs through an open partial")
            return syncError
        }
        try store.syncDirectories()
        #expect(syncs == 1, "one sync for one file system")
        #expect(outcomes.count == count)
        #expect(outcomes.allSatisfy { $0.error == nil }, "\(outcomes.compactMap(\.error))")
        for index in 0..<count {
            #expect(readFile(dst + "/f\(index)") == pattern(index + 1, seed: index))
        }
    }

    @Test("A file of a group that was not verified fails alone; the others are committed")
    func committerUnverifiedFile() throws {
        let count = FileCommitter.fileSystemSyncMinimum
        let (scratch, dst, store, files) = try verifiedFiles(count)
        defer { scratch.cleanup() }
        let target = FileTarget(path: try SafePath(validating: ["unverified"]), size: 3, mode: 0o640, modificationTime: 0, algorithm: .xxh3_128)
        let unverified = try store.openWriter(for: target)
        try unverified.write([1, 2, 3], at: 0)
        let outcomes = FileCommitter.commit(CommitGroup(files: files + [(UInt32(count), unverified)]))
        #expect(outcomes.count == count + 1)
        #expect(outcomes.filter { $0.error != nil }.map(\.entry) == [UInt32(count)])
        #expect(outcomes.first { $0.entry == UInt32(count) }?.error?.code == .internal)
        #expect(!exists(dst + "/unverified"), "a final name for data never verified")
        for index in 0..<count { #expect(exists(dst + "/f\(index)")) }
    }
}
