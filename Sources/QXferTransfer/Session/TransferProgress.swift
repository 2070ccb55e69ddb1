#if canImport(LinuxSystem)  // fuzz/run.sh compiles Locked's source into its one module
internal import LinuxSystem
#endif

/// Something that happened in a transfer, for a progress display or a JSON log.
public enum TransferEvent: Sendable {
    /// The offer was sent (sender) or received (receiver): `bytes` in its files of known size,
    /// and `sizeUnknown` files read to their end (standard input, kernel files).
    case offered(entries: Int, bytes: UInt64, sizeUnknown: Int)
    /// The receiver accepted: `bytes` will travel; `resumed` bytes were already there and
    /// checked; `present` files exist identically and only their digests are compared.
    /// `holes`: on the sender, the holes of sparse files that will go as Zeros instead (not in
    /// `bytes`), as the file system reports them now; 0 on the receiver, which learns of holes
    /// only as they arrive (they leave ``TransferProgress/totalBytes`` as they go).
    case accepted(bytes: UInt64, resumed: UInt64, present: Int, skipped: Int, holes: UInt64)
    /// A file starts at `offset` (non-zero when resuming).
    case started(path: String, size: UInt64?, offset: UInt64)
    /// A file arrived and its digest matched.
    case verified(path: String, size: UInt64, digest: String)
    /// An entry could not be completed; the others carry on.
    case failed(path: String, error: TransferError)
    /// A file was written to while it was being sent (sender): its size or modification time
    /// is no longer the scan's. The receiver gets the `sent` bytes read, verified as read,
    /// which may not be the file as it is now.
    case changed(path: String, sent: UInt64)
}

/// Byte counters shared between the tasks of a transfer and whoever draws its progress.
public final class TransferProgress: Sendable {
    private struct Counters {
        var totalBytes: UInt64 = 0
        var transferredBytes: UInt64 = 0
        var resumedBytes: UInt64 = 0
        var zeroBytes: UInt64 = 0
        /// Holes counted at acceptance (sender) that have not yet gone as Zeros.
        var expectedZeroBytes: UInt64 = 0
        /// Whether the receiver has accepted: before, ``totalBytes`` is not set yet.
        var accepted = false
        /// Bytes of files given up before acceptance (an early file, sender): out of the total
        /// once it is set.
        var forgoneEarly: UInt64 = 0
    }
    private let counters = Locked(Counters())
    private let onEvent: @Sendable (TransferEvent) -> Void

    /// `onEvent` is called for every ``TransferEvent``, from whichever task produced it.
    public init(onEvent: @escaping @Sendable (TransferEvent) -> Void = { _ in }) {
        self.onEvent = onEvent
    }

    /// Bytes that will cross the network (known sizes), once the receiver has accepted.
    public var totalBytes: UInt64 { counters.withLock { $0.totalBytes } }
    /// File bytes sent or received so far in this run.
    public var transferredBytes: UInt64 { counters.withLock { $0.transferredBytes } }
    /// Bytes the receiver already held from an earlier attempt.
    public var resumedBytes: UInt64 { counters.withLock { $0.resumedBytes } }
    /// Bytes of holes that travelled as Zeros messages: part of the files, not of the bytes
    /// that cross the network (they leave ``totalBytes`` as they go).
    public var zeroBytes: UInt64 { counters.withLock { $0.zeroBytes } }

    func report(_ event: TransferEvent) {
        if case .accepted(let bytes, let resumed, _, _, let holes) = event {
            counters.withLock {
                $0.totalBytes = bytes.saturatingSubtract($0.forgoneEarly)
                $0.resumedBytes = resumed
                $0.expectedZeroBytes = holes
                $0.accepted = true
            }
        }
        onEvent(event)
    }

    func add(transferred bytes: Int) {
        counters.withLock { $0.transferredBytes = $0.transferredBytes.saturatingAdd(UInt64(clamping: bytes)) }
    }

    /// `bytes` of a hole went as a Zeros message instead of data: they no longer have to cross
    /// the network. Holes counted at acceptance were never in ``totalBytes``; others (a file
    /// that changed, a resume that started over) leave it now.
    func add(zeros bytes: UInt64) {
        counters.withLock {
            $0.zeroBytes = $0.zeroBytes.saturatingAdd(bytes)
            let expected = min(bytes, $0.expectedZeroBytes)
            $0.expectedZeroBytes -= expected
            $0.totalBytes = $0.totalBytes.saturatingSubtract(bytes - expected)
        }
    }

    /// A file was given up (its sender could not read it to its end): `data` bytes of it and
    /// `holes` counted at acceptance will not travel after all.
    func forgo(data: UInt64, holes: UInt64) {
        counters.withLock {
            guard $0.accepted else {
                $0.forgoneEarly = $0.forgoneEarly.saturatingAdd(data)  // early files have no holes
                return
            }
            $0.totalBytes = $0.totalBytes.saturatingSubtract(data)
            $0.expectedZeroBytes = $0.expectedZeroBytes.saturatingSubtract(holes)
        }
    }

    /// A file announced as resumed from `bytes` starts again from 0 (the sender's data differs
    /// from what the receiver held): those bytes travel after all.
    func unresume(_ bytes: UInt64) {
        counters.withLock {
            $0.resumedBytes = $0.resumedBytes.saturatingSubtract(bytes)
            $0.totalBytes = $0.totalBytes.saturatingAdd(bytes)
        }
    }
}

/// How a transfer ended, for the summary line and the exit code.
public struct TransferSummary: Sendable {
    /// Entries verified (files) or created (directories, symlinks).
    public var succeeded: Int
    /// Entries skipped or failed, with why.
    public var failures: [(path: String, error: TransferError)]
    /// File bytes that crossed the network in this run.
    public var transferredBytes: UInt64
    /// Bytes not sent again because the receiver held them from an earlier attempt.
    public var resumedBytes: UInt64
    /// Bytes of holes that travelled as Zeros messages (docs/PROTOCOL.md §3.8), not as data.
    public var zeroBytes: UInt64 = 0
    /// The digest algorithm used.
    public var algorithm: DigestAlgorithm
    /// The digest of each verified file, by path, in the order they were verified.
    public var digests: VerifiedDigests
    /// A receiver's: the sender went away once every entry was done here, before it heard
    /// Complete. Nothing is missing on this side; the sender reports its transfer unfinished.
    public var senderLeftBeforeComplete = false

    /// Whether every entry arrived.
    public var isComplete: Bool { failures.isEmpty }
}

/// The digests of a transfer's verified files, each with its path (hexadecimal, as
/// `xxhsum -H2` or `sha256sum` print it). Kept as an entry number and the digest's bytes, and
/// turned into text when read: a transfer of a million files holds 20-36 bytes a file here, not
/// two strings. The offer's paths stay referenced for that.
public struct VerifiedDigests: RandomAccessCollection, Sendable {
    private var entries: [UInt32] = []
    private var bytes: [UInt8] = []
    private let length: Int
    private let pathOf: @Sendable (UInt32) -> String

    /// An empty list for `algorithm`'s digests, whose entries `pathOf` names.
    init(algorithm: DigestAlgorithm, pathOf: @escaping @Sendable (UInt32) -> String) {
        length = algorithm.digestLength
        self.pathOf = pathOf
    }

    /// Adds verified `entry`, whose digest is `digest` (of the algorithm's length: a digest
    /// this side computed or compared).
    mutating func append(_ entry: UInt32, digest: [UInt8]) {
        entries.append(entry)
        bytes.append(contentsOf: digest.prefix(length))
        if digest.count < length { bytes.append(contentsOf: repeatElement(0, count: length - digest.count)) }
    }

    public var startIndex: Int { 0 }
    public var endIndex: Int { entries.count }

    /// The path and the digest of the `position`th file verified.
    public subscript(position: Int) -> (path: String, digest: String) {
        let start = position * length
        return (pathOf(entries[position]), hexString(Array(bytes[start..<start + length])))
    }
}
