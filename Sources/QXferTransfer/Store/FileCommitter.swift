import Foundation

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
/// connection, many at once: concurrent fsyncs share the file system's journal commits (about
/// 0.2 ms a small file instead of 0.7 ms one after another, docs/PROTOCOL.md §6), and reading
/// goes on meanwhile. Each file keeps the order of its own steps (fsync, then rename).
enum FileCommitter {
    /// Most files committed at once (threads blocked in fsync use no CPU).
    static let width = 32

    /// Commits every file of `group` on up to ``width`` threads of its own; blocks the caller.
    static func commit(_ group: CommitGroup) -> [CommitOutcome] {
        let count = group.files.count
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
        for _ in 1..<max(threads, 1) {
            Thread {
                work()
                finished.signal()
            }.start()
        }
        work()  // the caller's thread is one of them
        for _ in 1..<max(threads, 1) { finished.wait() }
        return outcomes.withLock { $0 }
    }

    /// ``commit(_:)`` on a thread of its own, so the blocking calls stay off Swift's
    /// cooperative pool (two threads on two cores: one blocked in fsync would halve it).
    static func commitInBackground(_ group: CommitGroup) async -> [CommitOutcome] {
        await withCheckedContinuation { done in
            Thread { done.resume(returning: commit(group)) }.start()
        }
    }
}
