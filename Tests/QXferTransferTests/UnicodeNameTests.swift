import Foundation
import Testing
@testable import QXferTransfer

/// Two names Unicode takes for one ("café" with U+00E9, and with "e" + U+0301) are two files on
/// Linux: everything that tells names apart compares their bytes.
@Suite struct UnicodeNameTests {
    static let composed = "caf\u{e9}"
    static let decomposed = "cafe\u{301}"

    @Test func theTwoFormsAreEqualStringsButNotEqualNames() throws {
        #expect(Self.composed == Self.decomposed)  // why ExactString exists
        #expect(ExactString(Self.composed) != ExactString(Self.decomposed))
        #expect(Set([ExactString(Self.composed), ExactString(Self.decomposed), ExactString("cafe\u{301}")]).count == 2)
        let a = try SafePath(validating: ["dir", Self.composed]), b = try SafePath(validating: ["dir", Self.decomposed])
        #expect(a != b && Set([a, b]).count == 2)
        #expect(a == (try SafePath(validating: "dir/caf\u{e9}")))
    }

    @Test func thePlannerAndTheClaimsKeepThemApart() throws {
        let entries = [Self.composed, Self.decomposed].map {
            OfferEntry(kind: .file, path: ["dir", $0], size: 1, mode: 0o644, modificationTime: 0)
        }
        let planner = OfferPlanner(maximumEntries: 10, overwrite: false)
        #expect(try planner.check(Offer(algorithm: .xxh3_128, entries: entries)).count == 2)
        // The same bytes twice are still refused.
        #expect(throws: TransferError(.unsafePath, "")) { try planner.check(Offer(algorithm: .xxh3_128, entries: [entries[0], entries[0]])) }

        var table = TargetClaimTable()
        #expect(table.claim(["d\u{0}" + Self.composed], for: 1, sender: nil) == .granted(contested: []))
        #expect(table.claim(["d\u{0}" + Self.decomposed], for: 2, sender: nil) == .granted(contested: []))
        #expect(table.holder(of: "d\u{0}" + Self.composed) == 1 && table.holder(of: "d\u{0}" + Self.decomposed) == 2)
    }

    @Test("A folder holding both forms arrives with both files; both may be named at the top", arguments: StackKind.allCases)
    func bothFormsArrive(_ kind: StackKind) async throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        try FileManager.default.createDirectory(atPath: scratch.sub("dir"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch.sub("other"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: scratch.sub("dst"), withIntermediateDirectories: true)
        try Data("composed\n".utf8).write(to: URL(fileURLWithPath: scratch.sub("dir/" + Self.composed)))
        try Data("decomposed\n".utf8).write(to: URL(fileURLWithPath: scratch.sub("dir/" + Self.decomposed)))
        try Data("top\n".utf8).write(to: URL(fileURLWithPath: scratch.sub("other/" + Self.decomposed)))
        // Top-level names: the folder's composed file beside another folder's decomposed one.
        let tree = try SourceTree.scan([scratch.sub("dir"), scratch.sub("dir/" + Self.composed), scratch.sub("other/" + Self.decomposed)])

        let (server, client) = try await withConnectedPair(kind, receive: { peer in
            try await peer.runReceiver(TransferReceiver(directory: scratch.sub("dst")))
        }, send: { peer in
            try await peer.runSender(TransferSender(tree: tree))
        })
        #expect(try client.get().isComplete && server.get().isComplete)
        let names = try FileManager.default.contentsOfDirectory(atPath: scratch.sub("dst/dir")).map { Array($0.utf8) }.sorted { $0.lexicographicallyPrecedes($1) }
        #expect(names == [Array(Self.decomposed.utf8), Array(Self.composed.utf8)])
        #expect(readFile(scratch.sub("dst/dir/" + Self.composed)) == Array("composed\n".utf8))
        #expect(readFile(scratch.sub("dst/dir/" + Self.decomposed)) == Array("decomposed\n".utf8))
        #expect(readFile(scratch.sub("dst/" + Self.composed)) == Array("composed\n".utf8))
        #expect(readFile(scratch.sub("dst/" + Self.decomposed)) == Array("top\n".utf8))
    }
}

/// On a file system that does not tell upper from lower case, names that differ only in case
/// land on one file: the later entries are skipped, never written into the earlier one's file.
@Suite struct CaseFoldingTests {
    @Test func laterEntriesOfTheSameNameInAnotherCaseAreNamed() throws {
        var same = SameInAnyCase()
        func earlier(_ path: String, _ kind: EntryKind = .file) throws -> String? {
            try same.earlier(than: SafePath(validating: path), kind: kind)?.description
        }
        #expect(try earlier("f", .directory) == nil)
        #expect(try earlier("f/Big.bin") == nil)
        #expect(try earlier("f/big.bin") == "f/Big.bin")
        #expect(try earlier("f/BIG.BIN") == "f/Big.bin")
        #expect(try earlier("f/Sub", .directory) == nil)
        #expect(try earlier("F/sub", .directory) == nil)  // one folder there, as cp makes it
        #expect(try earlier("f/Sub/x") == nil)
        #expect(try earlier("f/sub/X") == "f/Sub/x")
        #expect(try earlier("F/SUB", .symlink) == "f/Sub")  // a link where a folder is
        #expect(try earlier("f/\u{c9}t\u{e9}.txt") == nil)
        #expect(try earlier("f/\u{e9}T\u{c9}.TXT") == "f/\u{c9}t\u{e9}.txt")
        #expect(try earlier("f/other") == nil)
    }

    @Test("The sender says which entry took a name its receiver skipped for case, and keeps the generic reason otherwise")
    func senderNamesTheEntryThatTookTheName() throws {
        let entries = [
            HostileNumbersTests.file(["Big.bin"], size: 1), HostileNumbersTests.file(["big.bin"], size: 1),
            HostileNumbersTests.file(["other"], size: 1),
        ]
        let skipped = EntryAnswer(disposition: .skip, code: TransferError.Code.exists.rawValue)
        let ledger = try SenderLedger(entries: entries, algorithm: .xxh3_128, answers: [.sendAll, skipped, skipped])
        #expect(ledger.failures.map(\.path) == ["big.bin", "other"])
        #expect(ledger.failures[0].error.message.hasPrefix("its name and 'Big.bin' differ only in case"), "\(ledger.failures[0].error)")
        #expect(ledger.failures[1].error.message == SenderLedger.skipped(.exists))
    }

    @Test func aFileSystemThatTellsCaseApartIsSeenAsSuch() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let directory = try TargetDirectory(path: scratch.path)
        #expect(!directory.fileSystemTraits().foldsCase)
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path).isEmpty)  // the probe is gone
    }

    @Test("The largest file a folder's file system holds: the kernel seeks a file that far and not a byte further")
    func largestFileIsTheFileSystemsLimit() throws {
        let scratch = TempDir()
        defer { scratch.cleanup() }
        let largest = try TargetDirectory(path: scratch.path).fileSystemTraits().largestFile
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path).isEmpty)  // the probe is gone
        let fd = open(scratch.path + "/probe", O_RDWR | O_CREAT, 0o600)
        defer { close(fd) }
        try #require(fd >= 0)
        if let largest {
            // ext4 with 4 KiB blocks: 16 TiB less a block.
            #expect(largest >= 1 << 32 && lseek(fd, off_t(largest), SEEK_SET) == off_t(largest), "\(largest)")
            #expect(lseek(fd, off_t(largest + 1), SEEK_SET) < 0 && errno == EINVAL, "\(largest)")
        } else {
            #expect(lseek(fd, .max, SEEK_SET) == .max)  // tmpfs, btrfs: any size
        }
    }
}
