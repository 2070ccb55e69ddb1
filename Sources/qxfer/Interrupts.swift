import FoundationEssentials
import Glibc
import Dispatch
import Synchronization

/// Runs `body` in a task that SIGINT and SIGTERM cancel instead of killing the process, so
/// what it holds is released properly (an advertisement says goodbye). After a signal it
/// throws `CancellationError` even if `body` returned quietly, so the exit status is 130.
func cancellingOnInterrupt<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    // An unstructured task because a signal handler cannot reach a task group; it is
    // awaited here and cancelled with the caller, so it never outlives this call.
    let task = Task { try await body() }
    let signalled = Mutex(false)
    let sources = [SIGINT, SIGTERM].map { number -> any DispatchSourceSignal in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler {
            InterruptNote.signalled()
            signalled.withLock { $0 = true }
            task.cancel()
        }
        source.resume()
        return source
    }
    defer {
        for source in sources { source.cancel() }
        signal(SIGINT, SIG_DFL)
        signal(SIGTERM, SIG_DFL)
    }
    let value = try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() }
    if signalled.withLock({ $0 }) { throw CancellationError() }
    return value
}

/// What the message for an interrupt says after "interrupted": that running the same command
/// again resumes something, only when something resumable was under way when the signal came.
/// A receiver waiting for senders, `browse` or `pair` holds nothing to resume.
enum InterruptNote {
    private struct State {
        var sendingFiles = false
        /// Standard input is sent beside files: read anew by the next send, it is not resumed.
        var sendingStandardInput = false
        var receptions = 0
        /// Of `receptions`, those whose offer holds a file of unknown size (standard input).
        var receptionsOfUnknownSize = 0
        /// `receptions` when the first signal arrived: the cancelled transfers end after it.
        var receptionsWhenSignalled: (all: Int, ofUnknownSize: Int)?
    }
    private static let state = Mutex(State())

    /// A send of files began: the same command resumes them (standard input alone starts over).
    static func sendingFiles(withStandardInput: Bool = false) {
        state.withLock {
            $0.sendingFiles = true
            $0.sendingStandardInput = withStandardInput
        }
    }

    /// A receiver accepted a transfer into its folder: its unfinished files are kept for resuming.
    /// `ofUnknownSize`: its offer holds a file of unknown size (standard input), which is not
    /// kept when it stops short: the next send reads it anew.
    static func receptionStarted(ofUnknownSize: Bool) {
        state.withLock {
            $0.receptions += 1
            if ofUnknownSize { $0.receptionsOfUnknownSize += 1 }
        }
    }
    static func receptionEnded(ofUnknownSize: Bool) {
        state.withLock {
            $0.receptions -= 1
            if ofUnknownSize { $0.receptionsOfUnknownSize -= 1 }
        }
    }

    /// SIGINT or SIGTERM arrived: what is under way now is what the message speaks of.
    static func signalled() {
        state.withLock { if $0.receptionsWhenSignalled == nil { $0.receptionsWhenSignalled = ($0.receptions, $0.receptionsOfUnknownSize) } }
    }

    static var message: String {
        let (sendingFiles, withStandardInput, receptions) = state.withLock {
            ($0.sendingFiles, $0.sendingStandardInput, $0.receptionsWhenSignalled ?? ($0.receptions, $0.receptionsOfUnknownSize))
        }
        if sendingFiles && withStandardInput { return "interrupted; the same command resumes the files left, and sends standard input from its start" }
        if sendingFiles { return "interrupted; the same command resumes what was left" }
        if receptions.all > 0 && receptions.ofUnknownSize == receptions.all {
            return "interrupted; what arrived of standard input (a file of unknown size) is not kept: it cannot be resumed, a send starts it over"
        }
        if receptions.ofUnknownSize > 0 {
            return "interrupted; unfinished files are kept and the same send resumes them, except one of unknown size (standard input), which starts over"
        }
        if receptions.all > 0 { return "interrupted; unfinished files are kept, and the same send resumes them" }
        return "interrupted"
    }
}
