import Foundation
import Testing
@testable import QXferTransfer

@Suite struct PathSafetyTests {
    static let accepted: [String] = [
        "a", "a/b/c", "file with spaces.txt", "été/日本語/файл", "\u{200F}rtl\u{202E}gpj.exe", "back\\slash",
        "...", "..a", "a..", ".hidden", "-rf", "~", "a/.../b", "名" + String(repeating: "x", count: 252),
        String(repeating: "a", count: 255), Array(repeating: "d", count: 64).joined(separator: "/"),
        "emoji 🧪", "semi;colon", "star*?", "x.qxfer-partial.txt",
    ]
    static let rejected: [String] = [
        "", "/", "/etc/passwd", "..", ".", "a/..", "../a", "a/../../b", "a/./b", "a//b", "a/", "trailing/",
        "nul\u{0}byte", "new\nline", "tab\there", "del\u{7F}", "esc\u{1B}[31m", String(repeating: "a", count: 256),
        "é" + String(repeating: "a", count: 254), Array(repeating: "d", count: 65).joined(separator: "/"),
        Array(repeating: String(repeating: "p", count: 200), count: 21).joined(separator: "/"),
        "x.qxfer-partial", "dir/.y.qxfer-journal",
    ]

    @Test(arguments: accepted) func accepts(_ path: String) throws {
        let safe = try SafePath(validating: path)
        #expect(safe.description == path)
    }

    @Test(arguments: rejected) func rejects(_ path: String) {
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: path) }
    }

    @Test func slashOrNulInsideAComponentRejected() {
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: ["a/b"]) }
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: ["a\u{0}"]) }
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: [String]()) }
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: ["ok", ""]) }
    }

    @Test func pathLengthLimitCountsSeparators() throws {
        // 16 components of 255 bytes + 15 separators = 4095: the limit exactly.
        let atLimit = Array(repeating: String(repeating: "b", count: 255), count: 16)
        _ = try SafePath(validating: atLimit)
        var over = atLimit
        over[0] += "b"
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: over) }
        let overByOne = Array(atLimit.dropLast()) + [String(repeating: "b", count: 254), "c"]
        #expect(throws: TransferError(.unsafePath, "")) { try SafePath(validating: overByOne) }
    }

    @Test func linkTargets() throws {
        let top = try SafePath(validating: "link")
        let deep = try SafePath(validating: "a/b/link")
        for ok in ["target", "sub/dir/file", "./x", "x/./y", ".", "a//b", "..." ] {
            #expect(throws: Never.self) { try top.validateLinkTarget(ok) }
        }
        for ok in ["../x", "../../x", "../..", "../../a/b/c"] {
            #expect(throws: Never.self) { try deep.validateLinkTarget(ok) }
        }
        for bad in ["/etc/passwd", "/", "..", "../x", "", "x/../..", "a/../b", "d/..", "nul\u{0}", "line\nbreak"] {
            #expect(throws: TransferError(.unsafePath, "")) { try top.validateLinkTarget(bad) }
        }
        for bad in ["../../../x", "../../..", "./../../../", "x/../../../.."] {
            #expect(throws: TransferError(.unsafePath, "")) { try deep.validateLinkTarget(bad) }
        }
        #expect(throws: TransferError(.unsafePath, "")) { try top.validateLinkTarget(String(repeating: "a", count: 256)) }
    }

    /// Symlinks planted in the target directory cannot redirect anything outside it.
    @Test func plantedSymlinksDoNotRedirect() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let target = temp.sub("target"), outside = temp.sub("outside")
        try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: outside, withIntermediateDirectories: true)
        try Data("secret".utf8).write(to: URL(fileURLWithPath: outside + "/victim"))
        #expect(symlink(outside, target + "/evil") == 0)
        #expect(symlink(outside + "/victim", target + "/file") == 0)
        #expect(symlink(outside + "/victim", target + "/.plain.qxfer-partial") == 0)

        let dir = try TargetDirectory(path: target)
        #expect(throws: TransferError(.unsafePath, "")) { try dir.createDirectory(SafePath(validating: "evil/x")) }
        #expect(throws: TransferError(.unsafePath, "")) { try dir.openParent(of: SafePath(validating: "evil/sub/f"), create: true) }
        #expect(throws: TransferError(.unsafePath, "")) { try dir.openForReading(SafePath(validating: "file")) }
        #expect(throws: TransferError(.unsafePath, "")) { try dir.createSymlink(SafePath(validating: "evil/l"), target: "x") }
        #expect(throws: TransferError(.exists, "")) { try dir.createDirectory(SafePath(validating: "file")) }
        #expect(try dir.state(of: SafePath(validating: "evil")) == .symlink)

        let store = FileStore(directory: dir)
        let redirected = FileTarget(path: try SafePath(validating: "evil/new"), size: 3, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        #expect(throws: TransferError(.unsafePath, "")) { try store.openWriter(for: redirected) }
        let overLink = FileTarget(path: try SafePath(validating: "file"), size: 3, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        #expect(throws: TransferError(.exists, "")) { try store.openWriter(for: overLink) }
        // A link in place of the partial is replaced by a partial of the receiver's own.
        let viaPartial = FileTarget(path: try SafePath(validating: "plain"), size: 3, mode: 0o644, modificationTime: 0, algorithm: .xxh3_128)
        try store.openWriter(for: viaPartial).write(Array("new".utf8), at: 0)
        var partial = stat()
        #expect(lstat(target + "/.plain.qxfer-partial", &partial) == 0 && partial.st_mode & S_IFMT == S_IFREG)

        // Nothing changed outside.
        #expect(try FileManager.default.contentsOfDirectory(atPath: outside) == ["victim"])
        #expect(readFile(outside + "/victim") == Array("secret".utf8))
    }

    /// A read-only folder an earlier transfer of the same tree left takes new files: its owner
    /// gets read, write and search until the folders are settled, when its own mode is put back
    /// (never the offered one: it was there before); a folder of another owner, or one a symlink
    /// stands in for, is left as it is.
    @Test func readOnlyFolderOfOursTakesNewFiles() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let target = temp.sub("t")
        try FileManager.default.createDirectory(atPath: target + "/ours", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: target + "/theirs", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: temp.sub("elsewhere"), withIntermediateDirectories: true)
        #expect(symlink(temp.sub("elsewhere"), target + "/pointer") == 0)
        #expect(chmod(target + "/ours", 0o555) == 0 && chmod(target + "/theirs", 0o555) == 0 && chmod(temp.sub("elsewhere"), 0o555) == 0)
        #expect(chown(target + "/theirs", geteuid() &+ 1, getegid()) == 0 || geteuid() != 0)
        func mode(_ path: String) -> mode_t {
            var info = stat()
            return lstat(path, &info) == 0 ? info.st_mode & 0o7777 : 0
        }
        let dir = try TargetDirectory(path: target)
        try dir.createDirectory(SafePath(validating: "ours"))
        #expect(mode(target + "/ours") == 0o755)
        #expect(throws: TransferError(.exists, "")) { try dir.createDirectory(SafePath(validating: "pointer")) }
        #expect(mode(temp.sub("elsewhere")) == 0o555)
        if geteuid() == 0 {  // only root can give a folder to someone else
            try dir.createDirectory(SafePath(validating: "theirs"))
            #expect(mode(target + "/theirs") == 0o555)
        }
        try dir.setDirectoryAttributes(SafePath(validating: "ours"), mode: 0o700, modificationTime: 0)
        #expect(mode(target + "/ours") == 0o555)
        _ = chmod(target + "/ours", 0o755); _ = chmod(target + "/theirs", 0o755); _ = chmod(temp.sub("elsewhere"), 0o755)
    }

    /// Every accepted path of the corpus is created inside the target and nothing else appears
    /// outside it; every rejected one never reaches the file system.
    @Test func corpusCreatesOnlyInsideTarget() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let target = temp.sub("t")
        try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: true)
        let dir = try TargetDirectory(path: target)
        for (i, raw) in Self.accepted.enumerated() {
            let path = try SafePath(validating: ["case\(i)"] + (try SafePath(validating: raw)).components.prefix(63))
            try dir.createDirectory(path)
            #expect(try dir.state(of: path) == .directory)
        }
        for raw in Self.rejected {
            #expect(throws: TransferError.self) { try dir.createDirectory(SafePath(validating: raw)) }
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: temp.path) == ["t"])
        let link = try SafePath(validating: "case0/link")
        try dir.createSymlink(link, target: "../case1")
        try dir.createSymlink(link, target: "../case1")  // the same link again is fine
        #expect(throws: TransferError(.exists, "")) { try dir.createSymlink(link, target: "other") }
        #expect(throws: TransferError(.unsafePath, "")) { try dir.createSymlink(SafePath(validating: "up"), target: "../t") }
        #expect(!exists(target + "/up"))
    }
}
