import FoundationEssentials
import Glibc
import LinuxSystem
import QXferTransfer
import Synchronization

/// `recv --stdout`: the one file of a transfer goes to standard output as it arrives.
///
/// The receiver writes it as usual (partial file, digest, rename) into a private temporary
/// folder; a thread follows the partial file, copies each new byte to standard output and
/// punches the copied range out of the file, so the folder never holds much more than what
/// standard output has not taken yet. The digest is checked at the end, as for any file, but
/// what went down the pipe cannot be taken back: a mismatch fails the command with a message
/// saying so. Nothing is resumed (each run gets a new folder).
final class StandardOutputRelay: Sendable {
    /// The private folder the receiver writes into; removed by ``remove()``.
    let directory: String
    private struct State {
        /// The file's name once it started; its size once verified; whether the transfer failed.
        var name: String?
        var finalSize: UInt64?
        var abandoned = false
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
            return "--stdout takes one file; this offer has \(offer.entries.count) entries (\(offer.fileCount) files)"
        }
        return nil
    }

    /// Follows the transfer's events: which file to copy, and its final size once verified.
    func note(_ event: TransferEvent) {
        switch event {
        case .started(let path, _, _): state.withLock { $0.name = path }
        case .verified(_, let size, _): state.withLock { $0.finalSize = size }
        default: break
        }
    }

    /// Runs `receive` while a thread copies the file to standard output; returns once every
    /// verified byte is out. If `receive` fails, the copy stops and its error is thrown, with a
    /// word about what already went out.
    func relaying<T: Sendable>(_ receive: () async throws -> T) async throws -> T {
        let copier = Task.detached { [self] in try await onThread { try self.copy() } }
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

    /// Removes the temporary folder and what is in it.
    func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The copy loop, on its own thread: blocking reads and writes, paced by the pipe's reader.
    private func copy() throws {
        var file: Int32 = -1
        defer { if file >= 0 { close(file) } }
        var offset: UInt64 = 0
        var punched: UInt64 = 0
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let now = state.withLock { $0 }
            if now.abandoned { return }
            if file < 0, let name = now.name {
                // The partial, or the final name if it was renamed before we looked.
                file = open(directory + "/" + FileStore.tempNames(for: name).partial, O_RDONLY)
                if file < 0 { file = open(directory + "/" + name, O_RDONLY) }
            }
            if file >= 0 {
                let count = buffer.withUnsafeMutableBytes { pread(file, $0.baseAddress, $0.count, off_t(offset)) }
                if count > 0 {
                    try writeAll(buffer, count: count)
                    offset += UInt64(count)
                    // Give the copied whole mebibytes back to the file system (the rest stays).
                    let done = offset & ~((1 << 20) - 1)
                    if done > punched, punchHole(file, from: punched, to: done) { punched = done }
                    continue
                }
            }
            if let size = now.finalSize, offset >= size { return }
            usleep(10_000)
        }
    }

    private func writeAll(_ buffer: [UInt8], count: Int) throws {
        var written = 0
        while written < count {
            let n = buffer.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress! + written, count - written) }
            if n < 0 {
                if errno == EINTR { continue }
                throw TransferError(.io, "cannot write to standard output: \(String(cString: strerror(errno)))")
            }
            written += n
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
