import Foundation
import Testing
@testable import QXferTransfer

@Suite struct FileStoreTests {
    func makeStore(_ path: String, interval: UInt64 = 64 << 10, overwrite: Bool = false) throws -> FileStore {
        FileStore(directory: try TargetDirectory(path: path), overwrite: overwrite, checkpointInterval: interval)
    }

    func target(_ path: String, _ data: [UInt8], _ algorithm: DigestAlgorithm = .xxh3_128) throws -> FileTarget {
        FileTarget(path: try SafePath(validating: path), size: UInt64(data.count), mode: 0o640, modificationTime: 1_600_000_000_987_654_321, algorithm: algorithm)
    }

    func write(_ writer: FileWriter, _ data: [UInt8], from start: Int, chunk: Int, checkFinalAbsent: String? = nil) throws {
        var i = start
        while i < data.count {
            let n = min(chunk, data.count - i)
            try writer.write(Array(data[i..<i + n]), at: UInt64(i))
            if let path = checkFinalAbsent { #expect(!exists(path)) }
            i += n
        }
    }

    @Test(arguments: DigestAlgorithm.allCases) func completeWrite(_ algorithm: DigestAlgorithm) throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path)
        let data = pattern(200_000, seed: 1)
        let file = try target("sub/dir/data.bin", data, algorithm)
        let resume = try store.resumeOffset(for: file)
        #expect(resume.offset == 0)
        // A file planned to start from nothing holds no hash state until it is opened: a
        // receiver plans every file of an offer at once.
        #expect(resume.hasher == nil)
        let writer = try store.openWriter(for: file, resumingAt: resume)
        try write(writer, data, from: 0, chunk: 7_000, checkFinalAbsent: temp.sub("sub/dir/data.bin"))
        #expect(exists(temp.sub("sub/dir/.data.bin.qxfer-partial")))
        #expect(exists(temp.sub("sub/dir/.data.bin.qxfer-journal")))
        try writer.finish(size: UInt64(data.count), digest: algorithm.digest(of: data))
        #expect(readFile(temp.sub("sub/dir/data.bin")) == data)
        #expect(try FileManager.default.contentsOfDirectory(atPath: temp.sub("sub/dir")) == ["data.bin"])
        var info = stat()
        #expect(stat(temp.sub("sub/dir/data.bin"), &info) == 0)
        #expect(info.st_mode & 0o7777 == 0o640)
        #expect(Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec) == 1_600_000_000_987_654_321)
    }

    /// A file no longer than the journal threshold gets no journal (many small files would each
    /// pay for creating, syncing and removing one); interrupted, it simply starts over.
    @Test func smallFilesHaveNoJournal() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path, interval: 16 << 20)
        let data = pattern(300_000, seed: 9)
        let file = try target("small.bin", data)
        let writer = try store.openWriter(for: file)
        try write(writer, Array(data[0..<100_000]), from: 0, chunk: 50_000)
        #expect(!exists(temp.sub(".small.bin.qxfer-journal")))
        writer.abandon()
        #expect(!exists(temp.sub(".small.bin.qxfer-journal")))
        #expect(try store.resumeOffset(for: file).offset == 0)
        let again = try store.openWriter(for: file)
        try write(again, data, from: 0, chunk: 100_000)
        try again.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        try store.syncDirectories()
        #expect(readFile(temp.sub("small.bin")) == data)
        #expect(try FileManager.default.contentsOfDirectory(atPath: temp.path) == ["small.bin"])
    }

    /// A receiver killed outright leaves a partial (§6, "Leftovers"), with the journal of a
    /// large file's attempt or without: the next transfer of the name, a small file, reuses the
    /// partial cut to the new data whatever it held, and removes the journal.
    @Test(arguments: [0, 10, 5_000]) func aLeftoverPartialIsCutToTheNewData(leftover: Int) throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path, interval: 16 << 20)
        try FileManager.default.createDirectory(atPath: temp.sub("sub"), withIntermediateDirectories: true)
        try Data(pattern(leftover, seed: 3)).write(to: URL(fileURLWithPath: temp.sub("sub/.left.bin.qxfer-partial")))
        if leftover > 0 { try Data("qxfer-journal 1\n".utf8).write(to: URL(fileURLWithPath: temp.sub("sub/.left.bin.qxfer-journal"))) }
        let data = pattern(100, seed: 4)
        let writer = try store.openWriter(for: try target("sub/left.bin", data))
        #expect(readFile(temp.sub("sub/.left.bin.qxfer-partial")) == [], "what the killed receiver wrote")
        #expect(!exists(temp.sub("sub/.left.bin.qxfer-journal")), "a journal that might vouch for the old bytes")
        try writer.write(data, at: 0)
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub("sub/left.bin")) == data)
    }

    /// A symlink at a partial's name is replaced by a partial of the receiver's own, never followed.
    @Test func aSymlinkAtAPartialsNameIsNotFollowed() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        try Data("outside".utf8).write(to: URL(fileURLWithPath: temp.sub("outside")))
        try FileManager.default.createDirectory(atPath: temp.sub("dst"), withIntermediateDirectories: true)
        #expect(symlink(temp.sub("outside"), temp.sub("dst/.f.qxfer-partial")) == 0)
        #expect(symlink(temp.sub("nowhere"), temp.sub("dst/.g.qxfer-partial")) == 0)
        let store = try makeStore(temp.sub("dst"))
        let data = pattern(10, seed: 1)
        for name in ["f", "g"] {
            let writer = try store.openWriter(for: target(name, data))
            try writer.write(data, at: 0)
            try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
            #expect(readFile(temp.sub("dst/\(name)")) == data)
        }
        #expect(readFile(temp.sub("outside")) == Array("outside".utf8))
        #expect(!exists(temp.sub("nowhere")), "a dangling link's target created")
    }

    @Test func aPathUnderAMissingFolderIsAbsent() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let directory = try TargetDirectory(path: temp.path)
        #expect(try directory.state(of: SafePath(validating: "no/such/folder/f")) == .absent)
        try Data("x".utf8).write(to: URL(fileURLWithPath: temp.sub("file")))
        #expect(throws: TransferError(.unsafePath, "")) { try directory.state(of: SafePath(validating: "file/f")) }
        #expect(throws: TransferError(.io, "")) { try directory.openForReading(SafePath(validating: "no/such/f")) }
    }

    /// Two transfers of the same name at once: the second is refused before it touches the
    /// first one's partial, which then completes intact.
    @Test func oneWriterPerPartial() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(100_000, seed: 4)
        let file = try target("same.bin", data)
        let first = try makeStore(temp.path).openWriter(for: file)
        try write(first, Array(data[0..<50_000]), from: 0, chunk: 10_000)
        #expect(throws: TransferError(.busy, "")) { try makeStore(temp.path).openWriter(for: file) }
        try write(first, data, from: 50_000, chunk: 10_000)
        try first.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub("same.bin")) == data)
    }

    /// Something other than a file at a partial's or a journal's name (a pipe, a device) is
    /// replaced by a file of the receiver's own, never opened (opening a pipe would wait for a
    /// peer); at the target's name it is refused and left as it is, never renamed over.
    @Test func aPipeOrDeviceAtATemporaryNameIsReplaced() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let small = try target("small.bin", pattern(1000))
        let large = try target("large.bin", pattern(3 << 20))
        #expect(mkfifo(temp.sub(FileStore.tempNames(for: "small.bin").partial), 0o600) == 0)
        #expect(mkfifo(temp.sub(FileStore.tempNames(for: "large.bin").journal), 0o600) == 0)
        var replaced = [FileStore.tempNames(for: "small.bin").partial, FileStore.tempNames(for: "large.bin").journal]
        if getuid() == 0 {  // a private /dev/null, when allowed to make one
            let device = FileStore.tempNames(for: "dev.bin").partial
            #expect(mknod(temp.sub(device), S_IFCHR | 0o666, dev_t((1 << 8) | 3)) == 0)
            _ = try makeStore(temp.path).openWriter(for: try target("dev.bin", [1]))
            replaced.append(device)
        }
        _ = try makeStore(temp.path).openWriter(for: small)
        _ = try makeStore(temp.path).openWriter(for: large)
        for name in replaced {
            var info = stat()
            #expect(lstat(temp.sub(name), &info) == 0 && info.st_mode & S_IFMT == S_IFREG && info.st_mode & 0o777 == 0o600, "\(name)")
        }
        #expect(!exists(temp.sub("small.bin")) && !exists(temp.sub("large.bin")))
        // A pipe at the target's own name is not replaced, even with --overwrite.
        #expect(mkfifo(temp.sub("pipe"), 0o600) == 0)
        #expect(throws: TransferError(.exists, "")) { try makeStore(temp.path, overwrite: true).openWriter(for: try target("pipe", [1])) }
        var info = stat()
        #expect(lstat(temp.sub("pipe"), &info) == 0 && info.st_mode & S_IFMT == S_IFIFO)
    }

    @Test func emptyFile() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path)
        let writer = try store.openWriter(for: try target("empty", []))
        try writer.finish(size: 0, digest: DigestAlgorithm.xxh3_128.digest(of: []))
        #expect(readFile(temp.sub("empty")) == [])
    }

    /// A crash mid-way: the writer is dropped without any cleanup. A new store instance finds
    /// the journal, re-hashes the prefix, resumes, and the final file is identical.
    @Test func resumeAfterCrash() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(300 * 1024, seed: 9)
        let file = try target("big", data)
        do {
            let store = try makeStore(temp.path)
            let writer = try store.openWriter(for: file)
            try write(writer, data[..<(215 * 1024)].map { $0 }, from: 0, chunk: 10 * 1024)
            #expect(writer.checkpointedOffset == 210 * 1024)
            // Crash: no abandon(), no finish(); bytes after the last checkpoint are not vouched for.
        }
        let store = try makeStore(temp.path)
        let resume = try store.resumeOffset(for: file)
        #expect(resume.offset == 210 * 1024)
        #expect(resume.prefixDigest == DigestAlgorithm.xxh3_128.digest(of: Array(data[..<(210 * 1024)])))
        // Another version of the file (different mtime) does not resume.
        var changed = file
        changed.modificationTime += 1
        #expect(try store.resumeOffset(for: changed).offset == 0)
        let writer = try store.openWriter(for: file, resumingAt: resume)
        #expect(throws: TransferError(.protocolViolation, "")) { try writer.write([1], at: 0) }
        try write(writer, data, from: Int(resume.offset), chunk: 33_333, checkFinalAbsent: temp.sub("big"))
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub("big")) == data)
        #expect(!exists(temp.sub(".big.qxfer-journal")) && !exists(temp.sub(".big.qxfer-partial")))
    }

    @Test func damagedPartialOrJournalResumesFromZero() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(200 * 1024, seed: 4)
        let file = try target("f", data)
        let store = try makeStore(temp.path)
        let writer = try store.openWriter(for: file)
        try write(writer, data[..<(150 * 1024)].map { $0 }, from: 0, chunk: 64 * 1024)
        writer.abandon()
        #expect(try store.resumeOffset(for: file).offset == 150 * 1024)

        // One flipped byte in the held prefix: the journal no longer vouches for it.
        let handle = try #require(FileHandle(forUpdatingAtPath: temp.sub(".f.qxfer-partial")))
        try handle.seek(toOffset: 1000)
        try handle.write(contentsOf: Data([0xFF]))
        try handle.close()
        #expect(try store.resumeOffset(for: file).offset == 0)

        // A torn journal (bad check line) is ignored too.
        var text = try #require(readFile(temp.sub(".f.qxfer-journal")))
        text[text.count - 3] ^= 1
        try Data(text).write(to: URL(fileURLWithPath: temp.sub(".f.qxfer-journal")))
        #expect(Journal.read(".f.qxfer-journal", in: store.directory.root) == nil)
        #expect(try store.resumeOffset(for: file).offset == 0)

        // Starting over from 0 replaces the stale partial and journal.
        let again = try store.openWriter(for: file)
        try write(again, data, from: 0, chunk: 50_000)
        try again.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub("f")) == data)
    }

    @Test func digestMismatchLeavesNoFinalFileAndOldTargetIntact() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(100_000)
        let store = try makeStore(temp.path, overwrite: true)
        let writer = try store.openWriter(for: try target("new", data))
        try write(writer, data, from: 0, chunk: 40_000)
        var wrong = DigestAlgorithm.xxh3_128.digest(of: data)
        wrong[0] ^= 1
        #expect(throws: TransferError(.digestMismatch, "")) { try writer.finish(size: UInt64(data.count), digest: wrong) }
        #expect(try FileManager.default.contentsOfDirectory(atPath: temp.path) == [])

        try Data("old".utf8).write(to: URL(fileURLWithPath: temp.sub("old")))
        let over = try store.openWriter(for: try target("old", data))
        try write(over, data, from: 0, chunk: 60_000)
        #expect(throws: TransferError(.digestMismatch, "")) { try over.finish(size: UInt64(data.count), digest: wrong) }
        #expect(readFile(temp.sub("old")) == Array("old".utf8))
        #expect(try FileManager.default.contentsOfDirectory(atPath: temp.path) == ["old"])

        // A size other than the offered one fails the file the same way (docs/PROTOCOL.md §6).
        let short = try store.openWriter(for: try target("short", data))
        try write(short, data, from: 0, chunk: 60_000)
        #expect(throws: TransferError(.digestMismatch, "")) { try short.finish(size: 5, digest: wrong) }
        #expect(!exists(temp.sub("short")))
    }

    @Test func existingTargetsAreNotReplacedWithoutOverwrite() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let data = pattern(1000)
        try Data(data).write(to: URL(fileURLWithPath: temp.sub("same")))
        let store = try makeStore(temp.path)
        let file = try target("same", data)
        #expect(throws: TransferError(.exists, "")) { try store.openWriter(for: file) }
        #expect(try store.digestOfExisting(file) == DigestAlgorithm.xxh3_128.digest(of: data))

        // The name appears while receiving: renameat2(RENAME_NOREPLACE) refuses to clobber it.
        let late = try target("late", data)
        let writer = try store.openWriter(for: late)
        try write(writer, data, from: 0, chunk: 500)
        try Data("mine".utf8).write(to: URL(fileURLWithPath: temp.sub("late")))
        #expect(throws: TransferError(.exists, "")) { try writer.finish(size: 1000, digest: DigestAlgorithm.xxh3_128.digest(of: data)) }
        #expect(readFile(temp.sub("late")) == Array("mine".utf8))
    }

    @Test func writesBeyondTheOfferedSizeRejected() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path)
        let writer = try store.openWriter(for: try target("x", pattern(10)))
        try writer.write(pattern(8), at: 0)
        #expect(throws: TransferError(.protocolViolation, "")) { try writer.write(pattern(3), at: 8) }
    }

    @Test func freeSpaceAndTempNames() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path)
        try store.checkFreeSpace(for: 1)
        #expect(throws: TransferError(.noSpace, "")) { try store.checkFreeSpace(for: .max) }
        #expect(FileStore.tempNames(for: "a.txt") == (".a.txt.qxfer-partial", ".a.txt.qxfer-journal"))
        let long = String(repeating: "n", count: 255)
        let names = FileStore.tempNames(for: long)
        #expect(names.partial.utf8.count <= 255 && names.journal.utf8.count <= 255)
        #expect(names.partial != FileStore.tempNames(for: String(repeating: "m", count: 255)).partial)
        // A 255-byte name can be received.
        let data = pattern(5)
        let writer = try store.openWriter(for: try target(long, data))
        try writer.write(data, at: 0)
        try writer.finish(size: 5, digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub(long)) == data)
    }

    /// Disk full on a 1 MiB tmpfs: a clear no-space error, a resumable partial; after the file
    /// system grows, the transfer resumes and completes. Needs root (mount); skipped otherwise.
    @Test(.enabled(if: getuid() == 0, "needs root to mount a tmpfs"))
    func diskFullGivesResumablePartial() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        guard let mountPoint = try mountTmpfs(in: temp, size: "1m") else { return }
        defer { _ = run("/bin/umount", [mountPoint]) }
        let data = pattern(2 << 20, seed: 21)
        let file = try target("video.raw", data)
        let store = try makeStore(mountPoint, interval: 128 << 10)
        #expect(throws: TransferError(.noSpace, "")) { try store.checkFreeSpace(for: UInt64(data.count)) }
        let writer = try store.openWriter(for: file)
        var failure: TransferError?
        do {
            try write(writer, data, from: 0, chunk: 64 << 10)
        } catch {
            failure = error as? TransferError
        }
        let error = try #require(failure)
        #expect(error.code == .noSpace)
        #expect(error.message.contains("kept for resuming"))
        #expect(!error.message.contains("\n"))
        #expect(!exists(mountPoint + "/video.raw"))

        let resume = try makeStore(mountPoint).resumeOffset(for: file)
        #expect(resume.offset > 0 && resume.offset < UInt64(data.count))
        #expect(resume.prefixDigest == DigestAlgorithm.xxh3_128.digest(of: Array(data[..<Int(resume.offset)])))

        #expect(run("/bin/mount", ["-o", "remount,size=4m", mountPoint]) != nil)
        let store2 = try makeStore(mountPoint)
        let resumed = try store2.openWriter(for: file, resumingAt: try store2.resumeOffset(for: file))
        try write(resumed, data, from: Int(resume.offset), chunk: 100_000)
        try resumed.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(mountPoint + "/video.raw") == data)
    }

    /// Disk full while writing a file too small for a journal: the partial is removed, and the
    /// error does not say it was kept.
    @Test(.enabled(if: getuid() == 0, "needs root to mount a tmpfs"))
    func diskFullWithoutJournalSaysNothingIsKept() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        guard let mountPoint = try mountTmpfs(in: temp, size: "256k") else { return }
        defer { _ = run("/bin/umount", [mountPoint]) }
        let data = pattern(1 << 20, seed: 22)
        let store = try makeStore(mountPoint, interval: 4 << 20)
        let writer = try store.openWriter(for: try target("small.raw", data))
        let error = #expect(throws: TransferError.self) { try write(writer, data, from: 0, chunk: 64 << 10) }
        #expect(error?.code == .noSpace)
        #expect(error.map { !$0.message.contains("kept") } ?? false, "\(error?.message ?? "")")
        #expect(try FileManager.default.contentsOfDirectory(atPath: mountPoint).isEmpty)
    }

    /// A tmpfs of `size` mounted in a new folder of `temp`; nil (with an issue recorded) if it
    /// cannot be mounted.
    func mountTmpfs(in temp: TempDir, size: String) throws -> String? {
        let mountPoint = temp.sub("small")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        guard run("/bin/mount", ["-t", "tmpfs", "-o", "size=\(size)", "tmpfs", mountPoint]) != nil else {
            Issue.record("cannot mount a tmpfs")
            return nil
        }
        return mountPoint
    }

    /// Writing goes on while a checkpoint's sync is under way; the next checkpoint, and
    /// verifying, wait for it; the journal vouches for the checkpoint once its sync returned.
    /// No timing: the sync is held until the test lets it go (or 20 s pass, which fails).
    @Test func checkpointsSyncWhileWritingGoesOn() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let gate = SyncGate()
        let store = FileStore(directory: try TargetDirectory(path: temp.path), checkpointInterval: 64 << 10, syncData: gate.sync)
        let data = pattern(300 << 10, seed: 31)
        let file = try target("held.bin", data)
        let writer = try store.openWriter(for: file)
        try write(writer, data[..<(100 << 10)].map { $0 }, from: 0, chunk: 10 << 10)  // a checkpoint at 70 KiB starts
        #expect(gate.waitUntilHeld(count: 1), "no checkpoint started")
        // Its sync is held: writing goes on up to the next checkpoint's offset.
        try write(writer, data[..<(130 << 10)].map { $0 }, from: 100 << 10, chunk: 10 << 10)
        #expect(!gate.timedOut, "a write waited for the sync")
        #expect(Journal.read(".held.bin.qxfer-journal", in: Descriptor(open(temp.path, O_RDONLY | O_DIRECTORY)))?.offset == 0,
                "the journal vouched for data before its sync returned")
        gate.release()
        #expect(writer.checkpointedOffset == 70 << 10)
        #expect(Journal.read(".held.bin.qxfer-journal", in: Descriptor(open(temp.path, O_RDONLY | O_DIRECTORY)))?.offset == 70 << 10)
        try write(writer, data, from: 130 << 10, chunk: 10 << 10)
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub("held.bin")) == data)
        #expect(!gate.timedOut)
    }

    /// A checkpoint whose sync failed in the background fails the file at the next checkpoint
    /// or at verification (the data may be lost), with the error a synchronous sync gave, and
    /// the journal never vouches for it.
    @Test(arguments: [false, true]) func failedBackgroundSyncIsReported(atVerify: Bool) throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = FileStore(directory: try TargetDirectory(path: temp.path), checkpointInterval: 64 << 10, syncData: { _ in
            errno = EIO
            return -1
        })
        let data = pattern(200 << 10, seed: 32)
        let file = try target("failing.bin", data)
        let writer = try store.openWriter(for: file)
        let end = atVerify ? 100 << 10 : 200 << 10  // one checkpoint started, or a second due after it
        let error = #expect(throws: TransferError.self) {
            try write(writer, data[..<end].map { $0 }, from: 0, chunk: 10 << 10)
            try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        }
        #expect(error?.code == .io && error?.message.contains("cannot sync") == true, "\(String(describing: error))")
        #expect(Journal.read(".failing.bin.qxfer-journal", in: Descriptor(open(temp.path, O_RDONLY | O_DIRECTORY)))?.offset ?? 0 == 0)
        #expect(!exists(temp.sub("failing.bin")))
    }

    /// What a checkpoint made durable leaves the page cache (the receiver never reads it again),
    /// and what is not yet durable stays: pages of the partial are counted with mincore(2) on a
    /// mapping of it. Before the change every page written stayed cached.
    @Test func durablePagesLeaveTheCache() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        // tmpfs keeps a file's pages whatever is advised: nothing to observe there.
        guard fileSystemType(holding: temp.path) != "tmpfs" else { return }
        let mebibyte = 1 << 20
        let store = try makeStore(temp.path, interval: UInt64(mebibyte))
        let data = pattern(6 * mebibyte + 100_000, seed: 21)
        let file = try target("big.bin", data)
        let writer = try store.openWriter(for: file)
        try write(writer, data, from: 0, chunk: 256 << 10)
        #expect(writer.checkpointedOffset == UInt64(6 * mebibyte))

        let fd = open(temp.sub(".big.bin.qxfer-partial"), O_RDONLY)
        #expect(fd >= 0)
        defer { close(fd) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let mapped = mmap(nil, data.count, PROT_READ, MAP_SHARED, fd, 0)
        #expect(mapped != MAP_FAILED)
        defer { munmap(mapped, data.count) }
        var resident = [UInt8](repeating: 0, count: (data.count + page - 1) / page)
        #expect(mincore(mapped, data.count, &resident) == 0)
        let durablePages = 6 * mebibyte / page
        let cachedDurable = resident[..<durablePages].count(where: { $0 & 1 == 1 })
        let cachedRest = resident[durablePages...].count(where: { $0 & 1 == 1 })
        #expect(cachedDurable == 0, "\(cachedDurable) of \(durablePages) durable pages still cached")
        #expect(cachedRest == resident.count - durablePages, "pages not yet durable: \(cachedRest) of \(resident.count - durablePages) cached")
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        #expect(readFile(temp.sub("big.bin")) == data)
    }

    /// Blocks of zeros are left unwritten (holes): the file reads back identical and takes
    /// about the space of its data, whatever the chunks' edges, and a trailing run of zeros
    /// still gives the file its full length.
    @Test(arguments: [7_000, 1 << 20]) func zerosBecomeHoles(chunk: Int) throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        let store = try makeStore(temp.path, interval: 1 << 20)
        var data = [UInt8](repeating: 0, count: 8 << 20)
        data.replaceSubrange(0..<100_001, with: pattern(100_001, seed: 3))
        data.replaceSubrange(3_000_003..<3_000_010, with: pattern(7, seed: 4))  // one block of data amid zeros
        let file = try target("image.raw", data)
        let writer = try store.openWriter(for: file)
        try write(writer, data, from: 0, chunk: chunk)
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        let identical = readFile(temp.sub("image.raw")) == data  // (not printed: 8 MiB)
        #expect(identical)
        var info = stat()
        #expect(stat(temp.sub("image.raw"), &info) == 0)
        #expect(info.st_size == off_t(data.count))
        #expect(info.st_mtim.tv_sec == 1_600_000_000)  // the length set before the time, not after
        // 100 001 + 7 bytes of data: 26 blocks of 4 KiB, and some slack for the file system's own.
        #expect(Int(info.st_blocks) * 512 <= 256 << 10, "\(info.st_blocks) blocks of 512 bytes allocated")
    }

    /// A checkpoint inside a run of zeros vouches for an offset beyond the partial's last
    /// written byte: the partial is extended to it first, so the resume hashes it whole.
    @Test func aCheckpointInsideZerosResumes() throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        var data = pattern(300 * 1024, seed: 5)
        data.replaceSubrange((100 * 1024)..., with: repeatElement(0, count: 200 * 1024))
        let file = try target("tail", data)
        do {
            let writer = try makeStore(temp.path).openWriter(for: file)
            try write(writer, Array(data[..<(215 * 1024)]), from: 0, chunk: 10 * 1024)
            #expect(writer.checkpointedOffset == 210 * 1024)
            // Crash: no abandon(), no finish().
        }
        let store = try makeStore(temp.path)
        let resume = try store.resumeOffset(for: file)
        #expect(resume.offset == 210 * 1024)
        let writer = try store.openWriter(for: file, resumingAt: resume)
        try write(writer, data, from: Int(resume.offset), chunk: 33_333)
        try writer.finish(size: UInt64(data.count), digest: DigestAlgorithm.xxh3_128.digest(of: data))
        let identical = readFile(temp.sub("tail")) == data
        #expect(identical)
    }

    /// Zeros messages (docs/PROTOCOL.md §3.8) write nothing, are hashed like the bytes they
    /// stand for, are checked like data, and a checkpoint inside them resumes.
    @Test(arguments: DigestAlgorithm.allCases) func zerosMessagesLeaveHoles(_ algorithm: DigestAlgorithm) throws {
        let temp = TempDir()
        defer { temp.cleanup() }
        var data = [UInt8](repeating: 0, count: 6 << 20)
        data.replaceSubrange(0..<100_000, with: pattern(100_000, seed: 8))
        data.replaceSubrange(5_000_000..<5_000_007, with: pattern(7, seed: 9))
        let file = try target("disk.img", data, algorithm)
        do {
            let writer = try makeStore(temp.path, interval: 1 << 20).openWriter(for: file)
            try writer.write(Array(data[..<100_000]), at: 0)
            #expect(throws: TransferError(.protocolViolation, "")) { try writer.appendZeros(10, at: 99_999) }
            try writer.appendZeros(3_000_000, at: 100_000)
            #expect(writer.checkpointedOffset == 3_100_000)
            // Crash inside the zeros: the partial must hash to the checkpoint all the same.
        }
        let store = try makeStore(temp.path, interval: 1 << 20)
        let resume = try store.resumeOffset(for: file)
        #expect(resume.offset == 3_100_000)
        let writer = try store.openWriter(for: file, resumingAt: resume)
        try writer.appendZeros(5_000_000 - 3_100_000, at: 3_100_000)
        try writer.write(Array(data[5_000_000..<5_000_007]), at: 5_000_000)
        #expect(throws: TransferError(.protocolViolation, "")) { try writer.appendZeros(UInt64(data.count), at: 5_000_007) }
        try writer.appendZeros(UInt64(data.count - 5_000_007), at: 5_000_007)
        try writer.finish(size: UInt64(data.count), digest: algorithm.digest(of: data))
        let identical = readFile(temp.sub("disk.img")) == data
        #expect(identical)
        var info = stat()
        #expect(stat(temp.sub("disk.img"), &info) == 0 && info.st_size == off_t(data.count))
        #expect(Int(info.st_blocks) * 512 <= 256 << 10, "\(info.st_blocks) blocks of 512 bytes allocated")
    }

    /// The ranges written cover every nonzero byte, leave out every aligned block of zeros
    /// and are as few as possible (adjacent blocks of data merged), for random layouts.
    @Test func dataRunsSkipOnlyZeros() {
        var random = SplitMix64(seed: 11)
        for _ in 0..<300 {
            let block = FileWriter.holeBlockSize
            var bytes = [UInt8](repeating: 0, count: Int.random(in: 0...(6 * block), using: &random))
            for _ in 0..<Int.random(in: 0...6, using: &random) where !bytes.isEmpty {
                bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 1...255, using: &random)
            }
            let position = UInt64.random(in: 0...UInt64(3 * block), using: &random)
            let runs = bytes.withUnsafeBytes { FileWriter.dataRuns(in: $0, at: position) }
            var covered = [Bool](repeating: false, count: bytes.count)
            for (index, run) in runs.enumerated() {
                #expect(!run.isEmpty)
                if index > 0 { #expect(runs[index - 1].upperBound < run.lowerBound) }  // merged when adjacent
                for i in run { covered[i] = true }
            }
            for i in bytes.indices where bytes[i] != 0 { #expect(covered[i]) }
            // A block (aligned on the file's offsets) is written only if it holds a nonzero byte.
            var start = 0
            while start < bytes.count {
                let end = min(bytes.count, start + block - Int((position + UInt64(start)) % UInt64(block)))
                #expect(covered[start] == bytes[start..<end].contains { $0 != 0 })
                #expect(covered[start..<end].allSatisfy { $0 == covered[start] })
                start = end
            }
        }
    }

    /// The type of the mounted file system holding `path` (the longest mount point that is a
    /// prefix of it in /proc/self/mounts), or nil.
    func fileSystemType(holding path: String) -> String? {
        guard let mounts = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8) else { return nil }
        var best: (point: String, type: String)?
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 2 else { continue }
            let point = String(fields[1])
            guard path == point || path.hasPrefix(point == "/" ? "/" : point + "/") else { continue }
            if point.count > best?.point.count ?? -1 { best = (point, String(fields[2])) }
        }
        return best?.type
    }
}

/// A data sync that blocks until released (at most 20 s, then it records a timeout), counting
/// the syncs that reached it.
final class SyncGate: @unchecked Sendable {
    // @unchecked: every field is touched with `lock` held.
    private let lock = NSCondition()
    private var held = 0
    private var released = false
    private(set) var timedOut = false

    var sync: @Sendable (Int32) -> Int32 {
        { [self] fd in
            lock.lock()
            held += 1
            lock.broadcast()
            let deadline = Date().addingTimeInterval(20)
            while !released {
                if !lock.wait(until: deadline) {
                    timedOut = true
                    break
                }
            }
            lock.unlock()
            return fdatasync(fd)
        }
    }

    /// Whether `count` syncs reached the gate within 20 s.
    func waitUntilHeld(count: Int) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        let deadline = Date().addingTimeInterval(20)
        while held < count {
            if !lock.wait(until: deadline) { return false }
        }
        return true
    }

    func release() {
        lock.lock()
        released = true
        lock.broadcast()
        lock.unlock()
    }
}
