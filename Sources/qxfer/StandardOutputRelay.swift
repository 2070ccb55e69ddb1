import FoundationEssentials
import Glibc
import LinuxSystem
import QXferTransfer
import SafeOutput
import Synchronization

/// `recv --stdout`: the one file of a transfer goes to standard output as it arrives.
///
/// The receiver writes it as usual (partial file, digest, rename) into a private temporary
/// folder; a thread follows the partial file, copies each new byte to standard output and
/// punches the copied range out of the file, so the folder never holds much more than what
/// standard output has not taken yet. The digest is checked at the end, as for any file, but
/// what went down the pipe cannot be taken back: a mismatch fails the command with a message
/// saying so. Nothing is resumed (each run gets a new folder). A write to standard output that
/// fails (its reader went away) stops the transfer at once, telling the sender
/// (``copyFailure()``): nothing more would reach anyone. The sender hears Complete only once
/// the whole file is written to standard output (``delivered()``), so its success means the
/// pipe took every byte.
final class StandardOutputRelay: Sendable {
    /// The private folder the receiver writes into; removed by ``remove()``.
    let directory: String
    private struct State {
        /// The file's name once it started; its size once verified; whether the transfer failed.
        var name: String?
        var finalSize: UInt64?
        var abandoned = false
        /// Why copying stopped, once it failed; whether it wrote every verified byte; and the
        /// tasks waiting to hear it (those waiting for the end hear a success too).
        var copyFailure: TransferError?
        var copied = false
        var waiters: [Int: (waiter: CheckedContinuation<TransferError?, Never>, forEnd: Bool)] = [:]
        var nextWaiter = 0
    }
    private let state = Mutex(State())

    init() throws {
        let template = FileManager.default.temporaryDirectory.appendingPathComponent("qxfer-stdout-XXXXXX").path
        var bytes = Array(template.utf8CString)
        guard let made = bytes.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw TransferError(.io, "cannot create a temporary folder for --stdout: \(String(cString: strerror(errno)))")
        }
        directory = String(cString: made)
    }

    /// Why `offer` cannot go to standard output (nil: it can): one file, no folders.
    func refusal(for offer: IncomingOffer) -> String? {
        guard offer.entries.count == 1, offer.fileCount == 1 else {
            return "--stdout takes one file; this offer has \(count(offer.entries.count, "entry", "entries")) (\(count(offer.fileCount, "file", "files")))"
        }
        return nil
    }

    /// Follows the transfer's events: which file to copy, its final size once verified, and
    /// whether it failed (copying then stops: nothing more of it is delivered).
    func note(_ event: TransferEvent) {
        switch event {
        case .started(let path, _, _): state.withLock { $0.name = path }
        case .verified(_, let size, _): state.withLock { $0.finalSize = size }
        case .failed: state.withLock { $0.abandoned = true }
        default: break
        }
    }

    /// Runs `receive` while a thread copies the file to standard output; returns once every
    /// verified byte is out. If `receive` fails, the copy stops and its error is thrown, with a
    /// word about what already went out.
    func relaying<T: Sendable>(_ receive: () async throws -> T) async throws -> T {
        let copier = Task.detached { [self] in
            do {
                try await onThread { try self.copy() }
                copied()
            } catch {
                failed(error as? TransferError ?? TransferError(.io, "\(error)"))
                throw error
            }
        }
        do {
            let value = try await receive()
            try await copier.value
            return value
        } catch {
            state.withLock { $0.abandoned = true }
            _ = try? await copier.value
            if let error = error as? TransferError, error.code == .digestMismatch {
                throw TransferError(.digestMismatch, "\(error.message); the data already written to standard output did not verify: discard it")
            }
            throw error
        }
    }

    /// Waits until copying to standard output fails and returns why (the receiver's
    /// `localFailure`: the transfer stops and its sender is told); nil once the waiting task is
    /// cancelled, as it is when the transfer ends first.
    func copyFailure() async -> TransferError? {
        await wait(forEnd: false)
    }

    /// Waits until the file is written to standard output in full (nil) or copying failed (why):
    /// the receiver's `beforeComplete`, so the sender's success means the pipe took it all.
    func delivered() async -> TransferError? {
        await wait(forEnd: true)
    }

    private func wait(forEnd: Bool) async -> TransferError? {
        let id = state.withLock { state in
            defer { state.nextWaiter += 1 }
            return state.nextWaiter
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { waiter in
                let now = state.withLock { state -> TransferError?? in
                    if let failure = state.copyFailure { return .some(failure) }
                    if (forEnd && state.copied) || Task.isCancelled { return .some(nil) }
                    state.waiters[id] = (waiter, forEnd)
                    return nil
                }
                if let now { waiter.resume(returning: now) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.waiter.resume(returning: nil)
        }
    }

    private func failed(_ failure: TransferError) {
        let waiters = state.withLock { state in
            defer { state.waiters = [:] }
            state.copyFailure = failure
            return state.waiters.values
        }
        for (waiter, _) in waiters { waiter.resume(returning: failure) }
    }

    private func copied() {
        let waiters = state.withLock { state in
            state.copied = true
            let ending = state.waiters.filter(\.value.forEnd)
            for id in ending.keys { state.waiters.removeValue(forKey: id) }
            return ending.values
        }
        for (waiter, _) in waiters { waiter.resume(returning: nil) }
    }

    /// Removes the temporary folder and what is in it.
    func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The copy loop, on its own thread: blocking reads and writes, paced by the pipe's reader.
    private func copy() throws {
        let output: OutputFile
        do { output = try OutputFile(path: "-") } catch { throw TransferError(.io, error.message) }
        var file: Int32 = -1
        defer { if file >= 0 { close(file) } }
        var offset: UInt64 = 0
        var punched: UInt64 = 0
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let (abandoned, name, finalSize) = state.withLock { ($0.abandoned, $0.name, $0.finalSize) }
            if abandoned { return }
            if file < 0, let name {
                // The partial, or the final name if it was renamed before we looked.
                file = open(directory + "/" + FileStore.tempNames(for: name).partial, O_RDONLY)
                if file < 0 { file = open(directory + "/" + name, O_RDONLY) }
            }
            if file >= 0 {
                let count = buffer.withUnsafeMutableBytes { pread(file, $0.baseAddress, $0.count, off_t(offset)) }
                if count > 0 {
                    var failure: OutputError?
                    buffer.withUnsafeBytes { raw in
                        do throws(OutputError) { try output.write(UnsafeRawBufferPointer(rebasing: raw[..<count])) } catch { failure = error }
                    }
                    if let failure { throw TransferError(.io, "\(failure.message); the transfer stopped") }
                    offset += UInt64(count)
                    // Give the copied whole mebibytes back to the file system (the rest stays).
                    let done = offset & ~((1 << 20) - 1)
                    if done > punched, punchHole(file, from: punched, to: done) { punched = done }
                    continue
                }
            }
            if let finalSize, offset >= finalSize { return }
            usleep(10_000)
        }
    }

    /// Frees the blocks of `[from, to)` without changing the file's size; false where the file
    /// system cannot.
    private func punchHole(_ file: Int32, from: UInt64, to: UInt64) -> Bool {
        FileSpace.punchHole(descriptor: file, offset: Int64(from), length: Int64(to - from))
    }
}

/// Runs blocking `work` on a thread of its own, so it holds none of Swift's cooperative threads.
private func onThread(_ work: @escaping @Sendable () throws -> Void) async throws {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        DetachedThread.run { continuation.resume(with: Result { try work() }) }
    }
}
