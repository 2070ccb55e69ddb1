import Foundation
import QXfer
@testable import QXferTransfer
import Testing

/// Another local user who can write into the receiving folder (issue 66, items 1 and 2): what
/// they plant at a partial's or journal's name is never written through, never resumed and
/// never followed; and an offer never changes the mode or time of what the user had.
@Suite("Another local user who can write into the receiving folder")
struct LocalUserTests {
    /// The user a planted file belongs to when the tests run as root (nobody).
    static let otherUser: uid_t = 65534
    static let mtime: Int64 = 1_600_000_000_000_000_000

    func makeStore(_ path: String) throws -> FileStore {
        FileStore(directory: try TargetDirectory(path: path), checkpointInterval: 64 << 10)
    }

    func target(_ name: String, _ data: [UInt8], mode: UInt32 = 0o644) throws -> FileTarget {
        FileTarget(path: try SafePath(validating: name), size: UInt64(data.count), mode: mode, modificationTime: Self.mtime, algorithm: .xxh3_128)
    }

    /// Receives `data` as `target` through `store`, from wherever it says to resume.
    func receive(_ store: FileStore, _ target: FileTarget, _ data: [UInt8]) throws {
        let resume = try store.resumeOffset(for: target)
        let writer = try store.openWriter(for: target, resumingAt: resume)
        var at = Int(resume.offset)
        while at < data.count {
            let n = min(32 << 10, data.count - at)
            try writer.write(Array(data[at..<at + n]), at: UInt64(at))
            at += n
        }
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        try store.syncDirectories()
    }

    func status(_ path: String) -> stat? {
        var info = stat()
        return lstat(path, &info) == 0 ? info : nil
    }

    /// Gives `path` to the other user where the tests may (as root); otherwise it stays ours.
    func giveAway(_ path: String) {
        if geteuid() == 0 { _ = lchown(path, Self.otherUser, Self.otherUser) }
    }

    @Test("A partial and journal planted as hard links to files of the receiver's user elsewhere are replaced; those files are untouched", arguments: [100, 300 << 10])
    func hardLinkedPartialIsNotWrittenThrough(size: Int) throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let (dst, outside) = (temp.sub("dst"), temp.sub("outside"))
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: outside, withIntermediateDirectories: true)
        let secrets = (partial: Array("the user's own partial-named file\n".utf8), journal: Array("the user's own journal-named file\n".utf8))
        for (name, content) in [("partial", secrets.partial), ("journal", secrets.journal)] {
            try Data(content).write(to: URL(fileURLWithPath: "\(outside)/\(name)"))
            #expect(chmod("\(outside)/\(name)", 0o600) == 0)
            #expect(link("\(outside)/\(name)", "\(dst)/.f.qxfer-\(name)") == 0)
        }
        let data = pattern(size, seed: 6)
        try receive(try makeStore(dst), try target("f", data), data)

        #expect(readFile(dst + "/f") == data)
        #expect(readFile(outside + "/partial") == secrets.partial, "written through the planted partial")
        #expect(readFile(outside + "/journal") == secrets.journal, "written through the planted journal")
        #expect(status(outside + "/partial")?.st_nlink == 1 && status(outside + "/journal")?.st_nlink == 1)
        #expect(status(dst + "/f")?.st_ino != status(outside + "/partial")?.st_ino)
    }

    @Test("A planted journal and partial that vouch for each other are not resumed: the partial's file is untouched")
    func plantedJournalIsNotResumed() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let (dst, outside) = (temp.sub("dst"), temp.sub("outside"))
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: outside, withIntermediateDirectories: true)
        let victim = pattern(200 << 10, seed: 9)
        try Data(victim).write(to: URL(fileURLWithPath: outside + "/victim"))
        #expect(chmod(outside + "/victim", 0o600) == 0)
        #expect(link(outside + "/victim", dst + "/.f.qxfer-partial") == 0)
        let data = pattern(300 << 10, seed: 10)
        let file = try target("f", data)
        // A journal that would vouch for the victim's first 128 KiB, complete with its inode
        // (docs/PROTOCOL.md §6).
        let held = 128 << 10
        let body = """
            qxfer-journal 1
            algorithm xxh3-128
            size \(data.count)
            mtime \(Self.mtime)
            offset \(held)
            prefix \(hexString(DigestAlgorithm.xxh3_128.digest(of: Array(victim[..<held]))))
            inode \(try #require(status(outside + "/victim")).st_ino)

            """
        try Data((body + "check \(Journal.check(body))\n").utf8).write(to: URL(fileURLWithPath: dst + "/.f.qxfer-journal"))
        #expect(chmod(dst + "/.f.qxfer-journal", geteuid() == 0 ? 0o600 : 0o644) == 0)
        giveAway(dst + "/.f.qxfer-journal")

        let store = try makeStore(dst)
        #expect(try store.resumeOffset(for: file).offset == 0, "resumed from a planted journal")
        try receive(store, file, data)
        #expect(readFile(dst + "/f") == data)
        #expect(readFile(outside + "/victim") == victim)
    }

    @Test("A partial another user planted as their own open 0666 file is replaced: their descriptor sees nothing received, and the final file is the receiver's, not group or other writable")
    func plantedOpenFileReadsNothing() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let dst = temp.sub("dst")
        try FileManager.default.createDirectory(atPath: dst, withIntermediateDirectories: true)
        let planted = open(dst + "/.f.qxfer-partial", O_RDWR | O_CREAT | O_CLOEXEC, 0o666)
        try #require(planted >= 0)
        defer { close(planted) }
        #expect(fchmod(planted, 0o666) == 0)
        giveAway(dst + "/.f.qxfer-partial")

        let data = pattern(50_000, seed: 11)
        try receive(try makeStore(dst), try target("f", data, mode: 0o666), data)

        var seen = [UInt8](repeating: 0, count: 4096)
        #expect(seen.withUnsafeMutableBytes { pread(planted, $0.baseAddress, $0.count, 0) } == 0, "the planted descriptor reads what arrived")
        var plantedInfo = stat()
        #expect(fstat(planted, &plantedInfo) == 0)
        let final = try #require(status(dst + "/f"))
        #expect(final.st_ino != plantedInfo.st_ino)
        #expect(final.st_uid == geteuid())
        #expect(final.st_mode & 0o722 == 0o600, "mode \(String(final.st_mode & 0o7777, radix: 8))")
        #expect(readFile(dst + "/f") == data)
    }

    @Test("An offer listing existing folders and a symlink changes neither their mode nor their time; what the receiver makes gets the offered time and no group or other write", arguments: StackKind.allCases)
    func existingFoldersKeepModeAndTime(_ kind: StackKind) async throws {
        let (scratch, dst) = try HostileNumbersTests.emptyFolder()
        defer { scratch.cleanup() }
        let old = timespec(tv_sec: 1_500_000_000, tv_nsec: 0)
        for (name, mode) in [("private", mode_t(0o700)), ("shared", 0o755), ("locked", 0o755)] {
            #expect(mkdir("\(dst)/\(name)", mode) == 0 && chmod("\(dst)/\(name)", mode) == 0)
        }
        #expect(symlink("private", dst + "/same") == 0)
        defer { for name in ["private", "shared", "locked", "new"] { _ = chmod("\(dst)/\(name)", 0o755) } }
        for name in ["private", "shared", "same"] {
            var times = [old, old]
            #expect(utimensat(AT_FDCWD, "\(dst)/\(name)", &times, AT_SYMLINK_NOFOLLOW) == 0)
        }
        #expect(chmod(dst + "/locked", 0o555) == 0)  // read-only: the receiver opens it for its file, then closes it again

        let (x, f) = (pattern(10, seed: 1), pattern(20, seed: 2))
        let entries = [
            OfferEntry(kind: .directory, path: ["private"], mode: 0o777, modificationTime: 0),
            OfferEntry(kind: .directory, path: ["shared"], mode: 0o000, modificationTime: 0),
            OfferEntry(kind: .directory, path: ["locked"], mode: 0o777, modificationTime: 0),
            OfferEntry(kind: .file, path: ["locked", "x"], size: 10, mode: 0o644, modificationTime: 0),
            OfferEntry(kind: .directory, path: ["new"], mode: 0o777, modificationTime: 0),
            OfferEntry(kind: .file, path: ["new", "f"], size: 20, mode: 0o666, modificationTime: 0),
            OfferEntry(kind: .symlink, path: ["same"], mode: 0o777, modificationTime: 0, linkTarget: "private"),
            OfferEntry(kind: .symlink, path: ["made"], mode: 0o777, modificationTime: 12_345, linkTarget: "new"),
        ]
        let (server, replies) = try await HostileNumbersTests.accepted(kind, entries, dst: dst) { peer, _ in
            let a = try await HostileNumbersTests.sendFile(peer, entry: 3, x)
            let b = try await HostileNumbersTests.sendFile(peer, entry: 5, f)
            withExtendedLifetime(a) {}
            return b
        }
        #expect(replies.last == .complete(Complete(succeeded: 8, failed: 0)), "\(replies)")
        _ = try server.get()
        #expect(readFile(dst + "/locked/x") == x && readFile(dst + "/new/f") == f)

        func mode(_ name: String) -> mode_t { (status("\(dst)/\(name)")?.st_mode ?? 0) & 0o7777 }
        func seconds(_ name: String) -> Int { status("\(dst)/\(name)")?.st_mtim.tv_sec ?? -1 }
        #expect(mode("private") == 0o700 && seconds("private") == old.tv_sec)
        #expect(mode("shared") == 0o755 && seconds("shared") == old.tv_sec)
        #expect(mode("locked") == 0o555, "a read-only folder the receiver opened for its file gets its own mode back")
        #expect(seconds("same") == old.tv_sec)
        // Made by the receiver: the offered time, the offered mode less group and other write.
        #expect(mode("new") & 0o722 == 0o700 && seconds("new") == 0, "mode \(String(mode("new"), radix: 8))")
        #expect(mode("new/f") & 0o722 == 0o600 && seconds("new/f") == 0, "mode \(String(mode("new/f"), radix: 8))")
        #expect(status(dst + "/made")?.st_mtim.tv_nsec == 12_345)
    }
}
