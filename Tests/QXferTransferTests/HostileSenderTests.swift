import Foundation
import QXfer
@testable import QXferTransfer
import Testing

/// A sender that speaks qxfer/1 by hand and tries every trick: the receiver must refuse each
/// with the right code, tell the sender, and write nothing outside (or inside) its folder.
@Suite("A hostile sender is refused")
struct HostileSenderTests {
    static func file(_ path: [String], size: UInt64 = 1) -> OfferEntry {
        OfferEntry(kind: .file, path: path, size: size, mode: 0o644, modificationTime: 0)
    }

    static let hostileOffers: [(String, [OfferEntry], TransferError.Code)] = [
        ("dot-dot", [file(["..", "escaped"])], .unsafePath),
        ("dot", [file([".", "x"])], .unsafePath),
        ("slash inside a name", [file(["a/../../etc/passwd"])], .unsafePath),
        ("absolute path as a name", [file(["/etc/passwd"])], .unsafePath),
        ("NUL", [file(["a\u{0}b"])], .unsafePath),
        ("empty component", [file(["a", "", "b"])], .unsafePath),
        ("control character", [file(["bell\u{7}"])], .unsafePath),
        ("reserved suffix", [file(["x.qxfer-partial"])], .unsafePath),
        ("name longer than NAME_MAX", [file([String(repeating: "n", count: 256)])], .limitExceeded),
        ("path deeper than 64", [file(Array(repeating: "d", count: 65))], .limitExceeded),
        ("symlink out of the folder", [OfferEntry(kind: .symlink, path: ["link"], mode: 0o777, modificationTime: 0, linkTarget: "../outside")], .unsafePath),
        ("absolute symlink", [OfferEntry(kind: .symlink, path: ["link"], mode: 0o777, modificationTime: 0, linkTarget: "/etc")], .unsafePath),
        ("duplicate path", [file(["twice"]), file(["twice"])], .unsafePath),
        ("file inside a file", [file(["plain"]), file(["plain", "inner"])], .unsafePath),
        ("file inside a symlink", [OfferEntry(kind: .symlink, path: ["l"], mode: 0o777, modificationTime: 0, linkTarget: "d"), file(["l", "x"])], .unsafePath),
        // 8 TiB: beyond any test machine's free space, within what ext4 holds in one file (16
        // TiB; a file above that is skipped too-large, not declined).
        ("larger than the free space", [file(["huge"], size: 1 << 43)], .noSpace),
        ("more entries than allowed", (0..<11).map { file(["f\($0)"]) }, .limitExceeded),
    ]

    @Test("Each bad offer is refused with its code and nothing is written", arguments: StackKind.allCases)
    func hostileOffersAreRefused(_ kind: StackKind) async throws {
        for (name, entries, code) in Self.hostileOffers {
            let scratch = TempDir()
            defer { scratch.cleanup() }
            let dst = scratch.sub("dst")
            try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
            let (server, client) = try await withConnectedPair(kind, receive: { peer in
                try await peer.runReceiver(TransferReceiver(directory: dst, maximumEntries: 10))
            }, send: { peer in
                try await peer.send(.offer(Offer(algorithm: .xxh3_128, entries: entries)))
                return try await peer.receiveMessage()
            })
            #expect(throws: TransferError(code, ""), "\(name)") { try server.get() }
            switch try client.get() {
            case .decline(let refusal)?, .error(let refusal)?:
                #expect(refusal.code == code, "\(name): \(refusal.message)")
                #expect(!refusal.message.contains("\n"))
            case let other:
                Issue.record("\(name): the receiver answered \(String(describing: other))")
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: dst).isEmpty, "\(name) wrote something")
            #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path) == ["dst"], "\(name) wrote outside")
        }
    }

    /// Accepts a one-file offer, then lets `attack` send data; returns what came back after Accept.
    static func acceptedThen(
        _ kind: StackKind, content: [UInt8], dst: String,
        _ attack: @escaping @Sendable (any TransferPeer) async throws -> (any TransferPeer)?
    ) async throws -> (server: Result<TransferSummary, any Error>, replies: [Message]) {
        let (server, replies) = try await HostileNumbersTests.accepted(kind, [file(["target"], size: UInt64(content.count))], dst: dst) { peer, _ in
            try await attack(peer)
        }
        return (server, Array(replies.dropFirst()))
    }

    @Test("A wrong digest fails the file and the data never gets the final name", arguments: StackKind.allCases)
    func wrongDigest(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let dst = scratch.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let content = pattern(1000)
        let (server, replies) = try await Self.acceptedThen(kind, content: content, dst: dst) { peer in
            let data = try await peer.openDataStream()
            try await data.send(.fileData(FileData(entry: 0, offset: 0, bytes: content)))
            try await data.send(.fileDone(FileDone(entry: 0, size: 1000, algorithm: .xxh3_128, digest: [UInt8](repeating: 0, count: 16))))
            if data.hasIndependentStreams { try await data.finish() }
            return data
        }
        guard case .failed(let failure)? = replies.first else {
            Issue.record("expected Failed, got \(replies)")
            return
        }
        #expect(failure.code == .digestMismatch)
        #expect(replies.last == .complete(Complete(succeeded: 0, failed: 1)))
        #expect(try server.get().failures.first?.error.code == .digestMismatch)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dst).isEmpty)
    }

    static let violations: [(String, @Sendable (any TransferPeer) async throws -> (any TransferPeer)?)] = [
        ("data past the offered size", { peer in
            let data = try await peer.openDataStream()
            try await data.send(.fileData(FileData(entry: 0, offset: 0, bytes: pattern(1001))))
            return data
        }),
        ("a gap", { peer in
            let data = try await peer.openDataStream()
            try await data.send(.fileData(FileData(entry: 0, offset: 10, bytes: pattern(10))))
            return data
        }),
        ("an entry that was not offered", { peer in
            let data = try await peer.openDataStream()
            try await data.send(.fileData(FileData(entry: 7, offset: 0, bytes: pattern(10))))
            return data
        }),
        ("the sender's Failed for an entry that was not offered", { peer in
            let data = try await peer.openDataStream()
            try await data.send(.failed(EntryFailure(entry: 7, code: .io, message: "cannot read")))
            return data
        }),
        ("a message only the receiver sends", { peer in
            try await peer.send(.complete(Complete(succeeded: 1, failed: 0)))
            return nil
        }),
    ]

    @Test("Protocol violations end the transfer with an error and leave no file", arguments: StackKind.allCases)
    func violationsEndTheTransfer(_ kind: StackKind) async throws {
        for (name, attack) in Self.violations {
            let scratch = TempDir()
            defer { scratch.cleanup() }
            let dst = scratch.sub("dst")
            try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
            let (server, replies) = try await Self.acceptedThen(kind, content: pattern(1000), dst: dst, attack)
            #expect(throws: TransferError(.protocolViolation, ""), "\(name)") { try server.get() }
            if case .error(let refusal)? = replies.last {
                #expect(refusal.code == .protocolViolation, "\(name)")
            } else {
                Issue.record("\(name): expected an Error message, got \(replies)")
            }
            #expect(!exists(dst + "/target"), "\(name)")
        }
    }
}
