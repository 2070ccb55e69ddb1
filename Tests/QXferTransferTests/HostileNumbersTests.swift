import Foundation
import QXfer
import LinuxSystem
@testable import QXferTransfer
import Testing

/// Numbers from a hostile peer (issue 17 §1) and the behaviours docs/PROTOCOL.md now specifies
/// (§3): each case here was a trap, a silent failure or a disagreement with the spec.
@Suite("Hostile numbers and the rules of the spec")
struct HostileNumbersTests {
    static func file(_ path: [String], size: UInt64, flags: OfferEntry.Flags = []) -> OfferEntry {
        OfferEntry(kind: .file, flags: flags, path: path, size: size, mode: 0o644, modificationTime: 0)
    }
    static let folder = OfferEntry(kind: .directory, path: ["d"], mode: 0o755, modificationTime: 0)
    static let link = OfferEntry(kind: .symlink, path: ["l"], mode: 0o777, modificationTime: 0, linkTarget: "d")

    static func emptyFolder() throws -> (TempDir, String) {
        let scratch = TempDir()
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        return (scratch, dst)
    }

    // MARK: The receiver

    @Test("Sizes that add up past 2^64 saturate in the offer's total instead of trapping")
    func totalSizeSaturates() {
        let entries = [Self.file(["a"], size: 1 << 63), Self.file(["b"], size: 1 << 63)]
        #expect(IncomingOffer(sender: nil, entries: entries, algorithm: .xxh3_128).totalSize == .max)
        #expect(OfferPlanner.totalSize(of: entries) == nil)
        #expect(OfferPlanner.totalSize(of: [Self.file(["a"], size: .max), Self.file(["b"], size: 0)]) == .max)
        #expect(throws: TransferError(.limitExceeded, "")) { try OfferPlanner(maximumEntries: 10, overwrite: false).check(Offer(algorithm: .xxh3_128, entries: entries)) }
    }

    @Test("An offer of two files of 2^63 bytes is declined with limit-exceeded, before anyone is asked", arguments: StackKind.allCases)
    func twoHugeFiles(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let asked = Locked(false)
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: dst, confirm: { _ in asked.withLock { $0 = true }; return true }))
        }, send: { peer in
            try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: [Self.file(["a"], size: 1 << 63), Self.file(["b"], size: 1 << 63)])))
            return try await peer.receiveMessage()
        })
        #expect(throws: TransferError(.limitExceeded, "")) { try server.get() }
        guard case .decline(let refusal)? = try client.get() else {
            Issue.record("expected a Decline, got \(String(describing: try? client.get()))")
            return
        }
        #expect(refusal.code == .limitExceeded)
        #expect(!asked.withLock { $0 })
        #expect(try FileManager.default.contentsOfDirectory(atPath: dst).isEmpty)
    }

    @Test("A frame longer than 16 MiB gets Error(limit-exceeded), not a silent close", arguments: StackKind.allCases)
    func oversizedFrame(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let (server, client) = try await withConnectedPair(kind, clientMessageLimit: 32 << 20, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: dst))
        }, send: { peer in
            // Sent beside the read: the receiver stops reading after the header, so the send may
            // never finish.
            async let sending: Void = peer.sendFrame(type: MessageType.offer.rawValue, body: [UInt8](repeating: 0, count: ProtocolLimits.maximumMessageSize + 1))
            let reply = try await peer.receiveMessage()
            _ = try? await sending
            return reply
        })
        #expect(throws: TransferError(.limitExceeded, "")) { try server.get() }
        guard case .error(let refusal)? = try? client.get() else {
            Issue.record("expected Error(limit-exceeded), got \(client)")
            return
        }
        #expect(refusal.code == .limitExceeded)
    }

    @Test("A resume offset past what a file can hold is refused, not converted with a trap")
    func resumeOffsetPastInt64() throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let store = FileStore(directory: try TargetDirectory(path: dst))
        let target = FileTarget(path: try SafePath(validating: ["huge"]), size: .max, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        let resume = ResumePoint(offset: (1 << 63) + 1, prefixDigest: [UInt8](repeating: 0, count: 16), algorithm: .xxh3_128, hasher: XXH3Hasher())
        #expect(throws: TransferError(.limitExceeded, "")) { try store.openWriter(for: target, resumingAt: resume) }
    }

    /// Offers `entries`; once accepted lets `attack` talk, then collects the receiver's replies up
    /// to Complete or Error. Returns the receiver's result and its replies, Accept first.
    static func accepted(
        _ kind: StackKind, _ entries: [OfferEntry], dst: String, receiver: TransferReceiver? = nil, flags: Offer.Flags = [],
        _ attack: @escaping @Sendable (any TransferPeer, Accept) async throws -> (any TransferPeer)?
    ) async throws -> (server: Result<TransferSummary, any Error>, replies: [Message]) {
        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(receiver ?? TransferReceiver(directory: dst))
        }, send: { peer in
            try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: entries, flags: flags)))
            guard case .accept(let accept)? = try await peer.receiveMessage() else { return [Message]() }
            // The data stream stays open until the replies are in: dropping it would reset it,
            // and a reset stream loses its unread data.
            let stream = try await attack(peer, accept)
            var replies: [Message] = [.accept(accept)]
            while let reply = try? await peer.receiveMessage() {
                replies.append(reply)
                if case .complete = reply { break }
                if case .error = reply { break }
            }
            withExtendedLifetime(stream) {}
            return replies
        })
        return (server, try client.get())
    }

    /// Sends `messages` on a data stream once the receiver has accepted `entries`, and expects
    /// the receiver to fail with `code` and to tell the sender with an Error of that code.
    static func expectRefused(
        _ kind: StackKind, _ name: String, _ entries: [OfferEntry], dst: String, flags: Offer.Flags, sending messages: [Message], code: TransferError.Code
    ) async throws {
        let (server, replies) = try await accepted(kind, entries, dst: dst, flags: flags) { peer, _ in
            let data = try await peer.openDataStream()
            for message in messages { try await data.send(message) }
            return data
        }
        #expect(throws: TransferError(code, ""), "\(name)") { try server.get() }
        guard case .error(let refusal)? = replies.last else {
            Issue.record("\(name): expected an Error, got \(replies)")
            return
        }
        #expect(refusal.code == code, "\(name): \(refusal.message)")
    }

    /// Sends one whole file on its own data stream (QUIC) or the connection (TLS).
    static func sendFile(_ peer: any TransferPeer, entry: UInt32, _ content: [UInt8], announcing size: UInt64? = nil) async throws -> any TransferPeer {
        let data = try await peer.openDataStream()
        if !content.isEmpty { try await data.send(.fileData(FileData(entry: entry, offset: 0, bytes: content))) }
        try await data.send(.fileDone(FileDone(entry: entry, size: size ?? UInt64(content.count), algorithm: .xxh3_128, digest: DigestAlgorithm.xxh3_128.digest(of: content))))
        if data.hasIndependentStreams { try await data.finish() }
        return data
    }

    @Test("A FileDone whose size differs from the offer fails that file alone; the others arrive", arguments: StackKind.allCases)
    func fileDoneSizeMismatch(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let first = pattern(100), second = pattern(200, seed: 3)
        let entries = [Self.file(["first"], size: 100), Self.file(["second"], size: 200)]
        let (server, replies) = try await Self.accepted(kind, entries, dst: dst) { peer, _ in
            let a = try await Self.sendFile(peer, entry: 0, first, announcing: 101)
            let b = try await Self.sendFile(peer, entry: 1, second)
            withExtendedLifetime(a) {}
            return b
        }
        #expect(replies.contains { if case .failed(let f) = $0 { f.entry == 0 && f.code == .digestMismatch } else { false } }, "\(replies)")
        #expect(replies.contains(.verified(entry: 1)), "\(replies)")
        #expect(replies.last == .complete(Complete(succeeded: 1, failed: 1)))
        #expect(try server.get().failures.map(\.error.code) == [.digestMismatch])
        #expect(readFile(dst + "/second") == second)
        #expect(!exists(dst + "/first") && !exists(dst + "/.first.qxfer-partial"))
    }

    @Test("A file whose partial cannot be made fails alone: its data checked and dropped, the others arrive", arguments: StackKind.allCases)
    func unwritableFileFailsAlone(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let first = pattern(3000), second = pattern(200, seed: 3)
        let entries = [Self.file(["first"], size: 3000), Self.file(["second"], size: 200)]
        let (server, replies) = try await Self.accepted(kind, entries, dst: dst) { peer, _ in
            // Accepted as absent; by the time its data comes, a folder holds the name.
            try FileManager.default.createDirectory(atPath: dst + "/first", withIntermediateDirectories: false)
            let a = try await peer.openDataStream()
            try await a.send(.fileData(FileData(entry: 0, offset: 0, bytes: Array(first[..<1000]))))
            try await a.send(.fileData(FileData(entry: 0, offset: 1000, bytes: Array(first[1000...]))))
            try await a.send(.fileDone(FileDone(entry: 0, size: 3000, algorithm: .xxh3_128, digest: DigestAlgorithm.xxh3_128.digest(of: first))))
            if a.hasIndependentStreams { try await a.finish() }
            let b = try await Self.sendFile(peer, entry: 1, second)
            withExtendedLifetime(a) {}
            return b
        }
        #expect(replies.contains { if case .failed(let f) = $0 { f.entry == 0 && f.code == .exists } else { false } }, "\(replies)")
        #expect(replies.contains(.verified(entry: 1)), "\(replies)")
        #expect(replies.last == .complete(Complete(succeeded: 1, failed: 1)))
        #expect(try server.get().failures.map(\.error.code) == [.exists])
        #expect(readFile(dst + "/second") == second)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dst + "/first").isEmpty)

        // Its data is still held to the rules: past its size is a protocol violation.
        let (scratch2, dst2) = try Self.emptyFolder()
        defer { scratch2.cleanup() }
        let (server2, _) = try await Self.accepted(kind, [Self.file(["first"], size: 3000)], dst: dst2) { peer, _ in
            try FileManager.default.createDirectory(atPath: dst2 + "/first", withIntermediateDirectories: false)
            let a = try await peer.openDataStream()
            try await a.send(.fileData(FileData(entry: 0, offset: 0, bytes: first)))
            try await a.send(.fileData(FileData(entry: 0, offset: 3000, bytes: [1])))
            return a
        }
        #expect(throws: TransferError(.protocolViolation, "")) { try server2.get() }
    }

    @Test("Complete counts every entry once: folders and links included, succeeded + failed = count", arguments: StackKind.allCases)
    func completeCounts(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let content = pattern(10)
        let entries = [Self.folder, Self.file(["d", "f"], size: 10), Self.link, Self.file(["g"], size: 10)]
        try FileManager.default.createDirectory(atPath: dst + "/g", withIntermediateDirectories: false)  // g: skipped, exists
        let (_, replies) = try await Self.accepted(kind, entries, dst: dst) { peer, _ in
            try await Self.sendFile(peer, entry: 1, content)
        }
        #expect(replies.last == .complete(Complete(succeeded: 3, failed: 1)), "\(replies)")
    }

    @Test("An empty Offer is accepted and completed at once; a file whose folders are not offered gets them created", arguments: StackKind.allCases)
    func emptyOfferAndUnofferedParents(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let (_, empty) = try await Self.accepted(kind, [], dst: dst) { _, _ in nil }
        #expect(empty == [.accept(Accept(answers: [])), .complete(Complete(succeeded: 0, failed: 0))])

        let content = pattern(7)
        let (_, replies) = try await Self.accepted(kind, [Self.file(["a", "b", "f"], size: 7)], dst: dst) { peer, _ in
            try await Self.sendFile(peer, entry: 0, content)
        }
        #expect(replies.last == .complete(Complete(succeeded: 1, failed: 0)), "\(replies)")
        #expect(readFile(dst + "/a/b/f") == content)
        let mode = try FileManager.default.attributesOfItem(atPath: dst + "/a")[.posixPermissions] as? Int
        #expect(mode == 0o700)
    }

    @Test("A symlink whose name exists as another symlink is answered skip/exists up front; the same link is fine", arguments: StackKind.allCases)
    func existingSymlink(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        try FileManager.default.createSymbolicLink(atPath: dst + "/l", withDestinationPath: "elsewhere")
        try FileManager.default.createSymbolicLink(atPath: dst + "/same", withDestinationPath: "d")
        let same = OfferEntry(kind: .symlink, path: ["same"], mode: 0o777, modificationTime: 0, linkTarget: "d")
        let (_, replies) = try await Self.accepted(kind, [Self.link, same], dst: dst) { _, _ in nil }
        guard case .accept(let accept)? = replies.first else {
            Issue.record("no Accept: \(replies)")
            return
        }
        #expect(accept.answers.map(\.disposition) == [.skip, .send])
        #expect(accept.answers[0].code == TransferError.Code.exists.rawValue)
        #expect(replies.last == .complete(Complete(succeeded: 1, failed: 1)), "\(replies)")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: dst + "/l") == "elsewhere")
    }

    @Test("A symlink that cannot be made after the files is reported with Failed before Complete", arguments: StackKind.allCases)
    func symlinkFailureIsReported(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        // Something takes the link's name between the plan and the end of the transfer.
        let receiver = TransferReceiver(directory: dst, confirm: { _ in
            FileManager.default.createFile(atPath: dst + "/l", contents: Data("squatter".utf8))
        })
        let (server, replies) = try await Self.accepted(kind, [Self.link], dst: dst, receiver: receiver) { _, _ in nil }
        guard case .failed(let failure)? = replies.dropFirst().first else {
            Issue.record("expected Failed, got \(replies)")
            return
        }
        #expect(failure.entry == 0 && failure.code == .exists)
        #expect(replies.last == .complete(Complete(succeeded: 0, failed: 1)))
        #expect(try server.get().failures.count == 1)
    }

    @Test("The reference sender takes a symlink's Failed as that entry's failure, not a violation", arguments: StackKind.allCases)
    func senderAcceptsTreeFailures(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("src"), withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: scratch.sub("src/f"), contents: Data(pattern(10)))
        try FileManager.default.createSymbolicLink(atPath: scratch.sub("src/l"), withDestinationPath: "f")
        let tree = try SourceTree.scan([scratch.sub("src")])
        let receiver = TransferReceiver(directory: dst, confirm: { _ in
            try? FileManager.default.createDirectory(atPath: dst + "/src", withIntermediateDirectories: true)
            return FileManager.default.createFile(atPath: dst + "/src/l", contents: Data("squatter".utf8))
        })
        let (_, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(receiver)
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        let summary = try client.get()
        #expect(summary.succeeded == 2)
        #expect(summary.failures.map(\.path) == ["src/l"] && summary.failures.map(\.error.code) == [.exists])
        #expect(readFile(dst + "/src/f") == pattern(10))
    }

    @Test("An accepted transfer whose sender goes silent ends with an error and removes its small partial", arguments: StackKind.allCases)
    func silentSender(_ kind: StackKind) async throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let receiver = TransferReceiver(directory: dst, idleTimeout: .milliseconds(300))
        let (server, replies) = try await Self.accepted(kind, [Self.file(["slow"], size: 1000)], dst: dst, receiver: receiver) { peer, _ in
            // On a loaded machine the receiver's 300 ms may pass before this runs, and its Error
            // close the connection first: the outcome tested, so not a failure of the test.
            guard let data = try? await peer.openDataStream() else { return nil }
            try? await data.send(.fileData(FileData(entry: 0, offset: 0, bytes: pattern(10))))
            return data  // and nothing more
        }
        #expect(throws: TransferError(.cancelled, "")) { try server.get() }
        if case .error(let refusal)? = replies.last {
            #expect(refusal.code == .cancelled && refusal.message.contains("sent nothing"), "\(refusal.message)")
        } else {
            Issue.record("expected an Error, got \(replies)")
        }
        // Not resumable (no journal under 1 MiB), so not left behind; the name is free again.
        #expect(try FileManager.default.contentsOfDirectory(atPath: dst).isEmpty)
    }

    @Test("An abandoned partial without a journal is removed; one with a journal is kept")
    func abandonedPartials() throws {
        let (scratch, dst) = try Self.emptyFolder()
        defer { scratch.cleanup() }
        let store = FileStore(directory: try TargetDirectory(path: dst), checkpointInterval: 1 << 20)
        let small = FileTarget(path: try SafePath(validating: ["small"]), size: 100, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        let large = FileTarget(path: try SafePath(validating: ["large"]), size: 3 << 20, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        let stream = FileTarget(path: try SafePath(validating: ["stream"]), size: nil, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        for target in [small, large, stream] {
            let writer = try store.openWriter(for: target)
            try writer.write(pattern(50), at: 0)
            writer.abandon()
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: dst).sorted() == [".large.qxfer-journal", ".large.qxfer-partial"])
        #expect(try store.resumeOffset(for: large).offset == 50)
    }

    // MARK: The sender, against a hostile receiver

    static let offered = [folder, file(["d", "f"], size: 10), link, file(["s"], size: 0, flags: .sizeUnknown), file(["g"], size: 20)]

    static func ledger(_ answers: [EntryAnswer]) throws(TransferError) -> SenderLedger {
        try SenderLedger(entries: offered, algorithm: .xxh3_128, answers: answers)
    }

    static let allSend = [EntryAnswer](repeating: .sendAll, count: offered.count)

    @Test("Answers that do not fit the offer are protocol violations")
    func hostileAccept() throws {
        func with(_ index: Int, _ answer: EntryAnswer) -> [EntryAnswer] {
            var answers = Self.allSend
            answers[index] = answer
            return answers
        }
        let digest = [UInt8](repeating: 1, count: 16)
        let hostile: [(String, [EntryAnswer])] = [
            ("too few answers", Array(Self.allSend.dropLast())),
            ("too many answers", Self.allSend + [.sendAll]),
            ("offset past the file", with(1, EntryAnswer(disposition: .send, offset: 11, prefixDigest: digest))),
            ("offset 2^64 - 1", with(4, EntryAnswer(disposition: .send, offset: .max, prefixDigest: digest))),
            ("offset on a folder", with(0, EntryAnswer(disposition: .send, offset: 1, prefixDigest: digest))),
            ("offset on a stream", with(3, EntryAnswer(disposition: .send, offset: 1, prefixDigest: digest))),
            ("present for a folder", with(0, EntryAnswer(disposition: .present, prefixDigest: digest))),
            ("present for a stream", with(3, EntryAnswer(disposition: .present, prefixDigest: digest))),
            ("a digest of another length", with(1, EntryAnswer(disposition: .send, offset: 5, prefixDigest: [1, 2, 3]))),
        ]
        for (name, answers) in hostile {
            #expect(throws: TransferError(.protocolViolation, ""), "\(name)") { try Self.ledger(answers) }
        }
        let resumed = try Self.ledger(with(4, EntryAnswer(disposition: .send, offset: 20, prefixDigest: digest)))
        #expect(resumed.resumedBytes == 20 && resumed.bytesToSend == 10)
    }

    @Test("Verdicts for unknown, unsent or already answered entries are protocol violations, never an index out of range")
    func hostileVerdicts() throws {
        var ledger = try Self.ledger(Self.allSend)
        for entry: UInt32 in [UInt32.max, 5, 0, 2] {
            #expect(throws: TransferError(.protocolViolation, ""), "Verified(\(entry))") { _ = try ledger.verified(entry) }
        }
        #expect(throws: TransferError(.protocolViolation, "")) { _ = try ledger.failed(EntryFailure(entry: .max, code: .io, message: "")) }
        _ = try ledger.verified(1)
        #expect(throws: TransferError(.protocolViolation, "")) { _ = try ledger.verified(1) }
        // A folder or link may fail once (the receiver could not make it), never twice.
        _ = try ledger.failed(EntryFailure(entry: 0, code: .io, message: "no"))
        #expect(throws: TransferError(.protocolViolation, "")) { _ = try ledger.failed(EntryFailure(entry: 0, code: .io, message: "no")) }
    }

    @Test("Complete must follow every file's verdict and count every entry once")
    func hostileComplete() throws {
        var ledger = try Self.ledger(Self.allSend)
        #expect(throws: TransferError(.protocolViolation, "")) { _ = try ledger.complete(Complete(succeeded: 5, failed: 0)) }
        for entry: UInt32 in [1, 3, 4] { _ = try ledger.verified(entry) }
        for (succeeded, failed): (UInt32, UInt32) in [(.max, .max), (.max, 6), (4, 0), (6, 0), (0, 0)] {
            #expect(throws: TransferError(.protocolViolation, ""), "\(succeeded)/\(failed)") {
                _ = try ledger.complete(Complete(succeeded: succeeded, failed: failed))
            }
        }
        #expect(try ledger.complete(Complete(succeeded: 5, failed: 0)) == 5)
        // An older receiver counts a folder it could not make without sending Failed: accepted.
        #expect(try ledger.complete(Complete(succeeded: 4, failed: 1)) == 4)
    }
}

/// Numbers from the sender's own files (issue 17 §1): times and sizes outside what the
/// arithmetic expects.
@Suite("Numbers from the sender's files")
struct SourceNumbersTests {
    @Test("A file time past the year 2262 is clamped, not multiplied into a trap")
    func farFutureMtime() throws {
        #expect(SourceTree.nanoseconds(timespec(tv_sec: 99_999_999_999, tv_nsec: 0)) == .max)
        #expect(SourceTree.nanoseconds(timespec(tv_sec: -99_999_999_999, tv_nsec: 0)) == .min)
        #expect(SourceTree.nanoseconds(timespec(tv_sec: 9_223_372_036, tv_nsec: 999_999_999)) == .max)
        #expect(SourceTree.nanoseconds(timespec(tv_sec: -2, tv_nsec: 5)) == -1_999_999_995)
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let path = scratch.sub("future")
        _ = FileManager.default.createFile(atPath: path, contents: Data("x".utf8))
        var times = [timespec(tv_sec: 15_000_000_000, tv_nsec: 0), timespec(tv_sec: 15_000_000_000, tv_nsec: 0)]
        guard utimensat(AT_FDCWD, path, &times, 0) == 0 else { return }  // a file system that cannot hold it
        var info = stat()
        guard stat(path, &info) == 0, info.st_mtim.tv_sec == 15_000_000_000 else { return }
        #expect(try SourceTree.scan([path]).entries.first?.modificationTime == .max)
    }
}
