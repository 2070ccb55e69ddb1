import Foundation
import Testing
@testable import QXferTransfer

/// Inputs found by the libFuzzer targets in fuzz/ (`make fuzz`), kept here so that the normal
/// suite fails if a fixed bug comes back, and a replay of the committed seed corpora.
@Suite struct FuzzRegressionTests {
    /// fuzz/harness/FuzzPaths.swift, crash inputs fuzz/corpus/paths/regress-link-*:
    /// `validateLinkTarget` split the target at '/' *Characters*. A '/' followed by a combining
    /// mark (U+0301) is one Character, so "../\u{301}x" looked like a single name to the check,
    /// while the kernel reads `..` then `\u{301}x`: a top-level link could point one level
    /// above the target directory.
    @Test func linkTargetWithACombiningMarkAfterASlashCannotClimbOut() throws {
        let top = try SafePath(validating: ["link"])
        let deep = try SafePath(validating: ["a", "link"])
        // The first is the input libFuzzer found on its own (fuzz/corpus/paths/regress-link-found-by-fuzzer,
        // U+0489 after the slash); the others are variants.
        for bad in ["../\u{489}/x/%", "../\u{301}x", "..//\u{301}", "./../\u{301}", "../\u{0740}etc/passwd"] {
            #expect(throws: TransferError(.unsafePath, "")) { try top.validateLinkTarget(bad) }
        }
        for bad in ["../../\u{301}x", "../../\u{65E}"] {
            #expect(throws: TransferError(.unsafePath, "")) { try deep.validateLinkTarget(bad) }
        }
        // Still ordinary names where they stay inside: one climb from depth 2 is allowed, and a
        // combining mark at the start of a name below the link is just a name.
        #expect(throws: Never.self) { try deep.validateLinkTarget("../\u{301}x") }
        #expect(throws: Never.self) { try top.validateLinkTarget("sub/\u{301}x") }
        // ".." after a hidden name is still ".." after a name.
        #expect(throws: TransferError(.unsafePath, "")) { try deep.validateLinkTarget("x/\u{301}/..") }
    }

    /// The same input on the file system: the receiver's `createSymlink` refuses it and creates
    /// nothing, inside the target or beside it.
    @Test func receiverRefusesTheClimbingLink() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let target = temp.sub("t")
        try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: true)
        let dir = try TargetDirectory(path: target)
        #expect(throws: TransferError(.unsafePath, "")) {
            try dir.createSymlink(SafePath(validating: ["link"]), target: "../\u{301}x")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: target).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: temp.path) == ["t"])
    }

    /// fuzz/corpus/paths/regress-string-combining-mark: `SafePath(validating: String)` split at
    /// '/' Characters too, so "a/\u{301}b" became one component holding a '/' and was refused,
    /// while the same path as components ["a", "\u{301}b"] is accepted. Both forms now agree.
    @Test func stringAndComponentFormsAgreeOnCombiningMarks() throws {
        for components in [["a", "\u{301}b"], ["x.qxfewrr-twrr-trial", "\u{65E}brial"], ["\u{301}"], ["d", "\u{20DD}", "e"]] {
            let fromArray = try SafePath(validating: components)
            let fromString = try SafePath(validating: components.joined(separator: "/"))
            #expect(fromString == fromArray)
            #expect(fromString.components == components)
        }
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: "a/\u{301}b/") }
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: "/\u{301}b") }
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: "a/../\u{301}b") }
    }

    /// The committed codec seeds (fuzz/corpus/codec: byte 0 is the type, the rest the body)
    /// decode and re-encode to the same bytes, so the fuzzer starts from valid messages and the
    /// encoder and decoder agree on every message type.
    @Test func codecSeedCorpusRoundTrips() throws {
        let corpus = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("fuzz/corpus/codec")
        let names = try FileManager.default.contentsOfDirectory(atPath: corpus.path).sorted()
        #expect(names.count >= 9)
        var types: Set<UInt32> = []
        for name in names {
            let input = try [UInt8](Data(contentsOf: corpus.appendingPathComponent(name)))
            let type = UInt32(input[0])
            let body = Array(input.dropFirst())
            let message = try MessageCodec.decode(type: type, body: body)
            #expect(message.type.rawValue == type, "\(name)")
            #expect(MessageCodec.encodeBody(message) == body, "\(name)")
            types.insert(type)
        }
        #expect(types == Set(1...9).union([MessageType.zeros.rawValue]), "every message type but Batch has a seed")
    }
}
