import FoundationEssentials
import Glibc
import Dispatch
#if canImport(SafeOutput)  // fuzz/run.sh compiles syncFileSystem's source into its one module
internal import SafeOutput
#endif
#if canImport(LinuxSystem)  // fuzz/run.sh compiles Locked's source into its one module
internal import LinuxSystem
#endif

/// Verified files handed over to be committed (``FileWriter/commit()``). Whoever makes a
/// group gives its writers up: from then on only ``FileCommitter`` touches them, on its own
/// threads, and nothing of them comes back but ``CommitOutcome`` values — hence unchecked.
struct CommitGroup: @unchecked Sendable {
    let files: [(entry: UInt32, writer: FileWriter)]
}

/// What committing one file came to: nil error when it is in place under its final name.
struct CommitOutcome: Sendable, Hashable {
    var entry: UInt32
    var error: TransferError?
}

/// Makes verified files durable and gives them their final names off the task that reads the
/// connection, many at once, while reading goes on. A group of many files is made durable with
/// one `syncfs(2)` of their file system, then renamed: one write-back and one device flush for
/// all of them, where an fsync of each writes its inode and flushes the device in turn (about
/// 0.01–0.05 ms a small file here instead of 0.07–0.13 with 32 fsyncs in parallel, and no
/// thread per file; docs/PROTOCOL.md §6). A small group, or one whose syncfs fails, is fsynced
/// file by file on up to ``width`` threads (concurrent fsyncs share a journal's commits), which
/// also tells which file a failure belongs to. Each file keeps the order of its own steps
/// (durable, then renamed).
enum FileCommitter {
    /// Most files committed at once file by file (threads blocked in fsync use no CPU).
    static let width = 32
    /// Groups of at least this many files are synced with one syncfs: below it, the fsyncs of
    /// each cost less than writing back whatever else the file system holds unsaved.
    static let fileSystemSyncMinimum = 16

    /// Commits every file of `group`; blocks the caller. `fileSystemSync` is syncfs(2) as
    /// ``syncFileSystem(holding:)`` gives it (0 or an errno value); tests pass their own.
    static func commit(_ group: CommitGroup, fileSystemSync: (Int32) -> Int32 = { syncFileSystem(holding: $0) }) -> [CommitOutcome] {
        guard group.files.count >= fileSystemSyncMinimum else { return commitEach(group) }
        // One syncfs per file system the files are on (a folder of the target may be a mount).
        var filesByDevice: [UInt64: [(entry: UInt32, writer: FileWriter)]] = [:]
        var unsynced: [(entry: UInt32, writer: FileWriter)] = []
        for file in group.files {
            var info = stat()
            if let partial = file.writer.verifiedPartial, fstat(partial.fd, &info) == 0 {
                filesByDevice[UInt64(info.st_dev), default: []].append(file)
            } else {
                unsynced.append(file)  // commitEach reports why
            }
        }
        var outcomes: [CommitOutcome] = []
        for files in filesByDevice.values {
            guard let partial = files[0].writer.verifiedPartial, fileSystemSync(partial.fd) == 0 else {
                unsynced += files
                continue
            }
            for (entry, writer) in files {
                var outcome = CommitOutcome(entry: entry, error: nil)
                do throws(TransferError) { try writer.commit(durable: true) } catch { outcome.error = error }
                outcomes.append(outcome)
            }
        }
        return outcomes + commitEach(CommitGroup(files: unsynced))
    }

    /// Commits each file with an fsync of its own, on up to ``width`` threads.
    private static func commitEach(_ group: CommitGroup) -> [CommitOutcome] {
        let count = group.files.count
        guard count > 0 else { return [] }
        let outcomes = Locked<[CommitOutcome]>([])
        let next = Locked(0)
        let work: @Sendable () -> Void = {
            while true {
                let index = next.withLock { value in
                    defer { value += 1 }
                    return value
                }
                guard index < count else { return }
                let (entry, writer) = group.files[index]
                var outcome = CommitOutcome(entry: entry, error: nil)
                do throws(TransferError) { try writer.commit() } catch { outcome.error = error }
                outcomes.withLock { $0.append(outcome) }
            }
        }
        let threads = min(width, count)
        let finished = DispatchSemaphore(value: 0)
        for _ in 1..<threads {
            DetachedThread.run {
                work()
                finished.signal()
            }
        }
        work()  // the caller's thread is one of them
        for _ in 1..<threads { finished.wait() }
        return outcomes.withLock { $0 }
    }

    /// ``commit(_:)`` on a thread of its own, so the blocking calls stay off Swift's
    /// cooperative pool (two threads on two cores: one blocked in fsync would halve it).
    static func commitInBackground(_ group: CommitGroup) async -> [CommitOutcome] {
        await withCheckedContinuation { done in
            DetachedThread.run { done.resume(returning: commit(group)) }
        }
    }
}
