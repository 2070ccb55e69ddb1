import FoundationEssentials
import Dispatch
#if canImport(SafeOutput)  // fuzz/run.sh compiles renameAt's source into its one module
internal import SafeOutput
#endif
#if canImport(LinuxSystem)  // fuzz/run.sh compiles Locked's source into its one module
internal import LinuxSystem
#endif
#if canImport(PlainText)
internal import PlainText
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A file the receiver is to write: its checked path and what the offer says about it.
public struct FileTarget: Sendable, Hashable {
    public var path: SafePath
    /// The offered size; nil for a stream of unknown size (not resumable).
    public var size: UInt64?
    public var mode: UInt32
    public var modificationTime: Int64
    public var algorithm: DigestAlgorithm

    public init(path: SafePath, size: UInt64?, mode: UInt32, modificationTime: Int64, algorithm: DigestAlgorithm) {
        self.path = path
        self.size = size
        self.mode = mode
        self.modificationTime = modificationTime
        self.algorithm = algorithm
    }
}

/// Where writing of a file can start: an offset the receiver vouches for, the digest of the
/// bytes before it (sent in Accept for the sender to check) and the hash state at that point.
public struct ResumePoint {
    /// Bytes already held and checked.
    public let offset: UInt64
    /// The digest of bytes `[0, offset)`; empty when `offset == 0`.
    public let prefixDigest: [UInt8]
    let algorithm: DigestAlgorithm
    /// The hash state at `offset`; nil at 0, where the writer starts a fresh one. A receiver
    /// plans every file of an offer when it accepts it, and a state made then for each (640
    /// bytes for XXH3) was held until the file was written: 6.4 MiB of the peak for 10 000 files.
    let hasher: (any StreamingHasher)?
    /// The partial that was hashed (nil at 0): the writer resumes only that file.
    let partial: FileIdentity?

    init(offset: UInt64, prefixDigest: [UInt8], algorithm: DigestAlgorithm, hasher: (any StreamingHasher)?, partial: FileIdentity? = nil) {
        self.offset = offset
        self.prefixDigest = prefixDigest
        self.algorithm = algorithm
        self.hasher = hasher
        self.partial = partial
    }

    /// Start from nothing.
    public static func start(_ algorithm: DigestAlgorithm) -> ResumePoint {
        ResumePoint(offset: 0, prefixDigest: [], algorithm: algorithm, hasher: nil, partial: nil)
    }
}

/// The receiving side's file store: partial data in a temp file beside the target, a resume
/// journal, verification, then fsync and an atomic rename.
///
/// For a target `dir/NAME` the partial is `dir/.NAME.qxfer-partial` and the journal
/// `dir/.NAME.qxfer-journal` (for names too long to take the affixes, `NAME` is replaced by
/// `qxfer-` and 16 hex digits of its XXH3-64). The final name appears only after the digest
/// matches, the data is fsynced, and never replaces an existing entry unless `overwrite`.
/// Not thread-safe: use one instance from one task — except that verified writers may be
/// committed (``FileWriter/commit()``) on other threads (see ``FileCommitter``).
public final class FileStore {
    /// The directory files go into.
    public let directory: TargetDirectory
    /// Whether a verified file may replace an existing regular file (atomically).
    public let overwrite: Bool
    /// Bytes written between journal checkpoints (fdatasync of the data, then the journal).
    public var checkpointInterval: UInt64

    /// How a checkpoint makes a partial's data durable: fdatasync(2), 0 or -1 with errno (tests
    /// hold it or fail it).
    let syncData: @Sendable (Int32) -> Int32

    public convenience init(directory: TargetDirectory, overwrite: Bool = false, checkpointInterval: UInt64 = 16 << 20) {
        self.init(directory: directory, overwrite: overwrite, checkpointInterval: checkpointInterval, syncData: { fdatasync($0) })
    }

    init(directory: TargetDirectory, overwrite: Bool = false, checkpointInterval: UInt64 = 16 << 20, syncData: @escaping @Sendable (Int32) -> Int32) {
        self.directory = directory
        self.overwrite = overwrite
        self.checkpointInterval = max(1, checkpointInterval)
        self.syncData = syncData
    }

    /// Directories that received a file whose rename is not yet durable, by (device, inode);
    /// locked because commits run on the committer's threads.
    private let unsyncedDirectories = Locked<[DirectoryKey: Descriptor]>([:])
    private struct DirectoryKey: Hashable {
        var device: UInt64
        var inode: UInt64
    }

    /// Remembers that `directory` holds a new name to make durable with ``syncDirectories()``.
    fileprivate func renamed(in directory: Descriptor) {
        var info = stat()
        guard fstat(directory.fd, &info) == 0 else { return }
        unsyncedDirectories.withLock { $0[DirectoryKey(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))] = directory }
    }

    /// Makes every rename done so far durable: one fsync per directory that received files,
    /// however many it received (fsyncing the directory after each file cost ~5 ms a file).
    public func syncDirectories() throws(TransferError) {
        let directories = unsyncedDirectories.withLock { pending in
            defer { pending.removeAll() }
            return Array(pending.values)
        }
        for directory in directories where fsync(directory.fd) != 0 {
            throw TransferError.posix("cannot sync the folders received into", self.directory.path, errno: errno)
        }
    }

    /// The partial and journal names for a final name.
    public static func tempNames(for name: String) -> (partial: String, journal: String) {
        let suffixLength = ".qxfer-partial".utf8.count
        let base: String
        if 1 + name.utf8.count + suffixLength <= ProtocolLimits.maximumNameLength {
            base = "." + name
        } else {
            let hash = XXH3Hasher.hash64(Array(name.utf8))
            let hex = hexString((0..<8).map { UInt8(truncatingIfNeeded: hash >> (56 - 8 * UInt64($0))) })
            base = ".qxfer-" + hex
        }
        return (base + ".qxfer-partial", base + ".qxfer-journal")
    }

    /// Checks that `bytes` more fit on the target file system (`statvfs`).
    public func checkFreeSpace(for bytes: UInt64) throws(TransferError) {
        try directory.checkFreeSpace(for: bytes)
    }

    /// The digest of an existing regular file at the target's path (for the `present` answer).
    public func digestOfExisting(_ target: FileTarget) throws(TransferError) -> [UInt8] {
        let fd = try directory.openForReading(target.path)
        let hasher = target.algorithm.makeHasher()
        _ = try FileStore.hash(fd, upTo: .max, into: hasher, shown: target.path.description)
        return hasher.digest()
    }

    /// Reads the journal, re-hashes the prefix of the partial file it covers and returns the
    /// offset it vouches for, or offset 0 when there is no journal, when it is damaged or
    /// describes another version of the file (size, mtime, algorithm), when the journal or the
    /// partial is not one this receiver made (``TargetDirectory/isOwnPrivateFile(_:)``) or the
    /// partial is not the one the journal was written beside, or when the partial does not hash
    /// to what the journal recorded.
    public func resumeOffset(for target: FileTarget) throws(TransferError) -> ResumePoint {
        // A file too small for a journal has none to resume from: no lookup for each of many.
        guard let size = target.size, keepsJournal(size: size) else { return .start(target.algorithm) }
        let names = FileStore.tempNames(for: target.path.name)
        let parent: Descriptor
        do {
            parent = try directory.openDirectory(target.path.parentComponents, create: false, shown: target.path.description)
        } catch where error.code == .io {
            return .start(target.algorithm)
        }
        guard let journal = Journal.read(names.journal, in: parent), journal.matches(target), journal.offset > 0 else {
            return .start(target.algorithm)
        }
        var info = stat()
        guard let partial = TargetDirectory.openOwnFile(names.partial, in: parent, flags: O_RDONLY),
              fstat(partial.fd, &info) == 0, UInt64(info.st_ino) == journal.partialInode
        else { return .start(target.algorithm) }
        let hasher = target.algorithm.makeHasher()
        let hashed = try FileStore.hash(partial, upTo: journal.offset, into: hasher, shown: target.path.description)
        guard hashed == journal.offset else { return .start(target.algorithm) }
        let digest = hasher.digest()
        guard digest == journal.prefixDigest else { return .start(target.algorithm) }
        return ResumePoint(offset: journal.offset, prefixDigest: digest, algorithm: target.algorithm, hasher: hasher, partial: FileIdentity(info))
    }

    /// Opens the partial file for writing from `resume` (truncating anything after it), or
    /// from 0 when `resume` is nil. Creates missing parent directories.
    public func openWriter(for target: FileTarget, resumingAt resume: ResumePoint? = nil) throws(TransferError) -> FileWriter {
        let start = resume ?? .start(target.algorithm)
        guard start.algorithm == target.algorithm else {
            throw TransferError(.internal, "resume point for another algorithm")
        }
        if let size = target.size, start.offset > size {
            throw TransferError(.internal, "resume offset beyond the file size")
        }
        guard let startOffset = off_t(exactly: start.offset) else {
            throw TransferError(.limitExceeded, "'\(target.path)' resumes at \(start.offset) bytes, beyond what a file can hold")
        }
        // The parent is walked once (creating what is missing, as writing needs it anyway) and
        // the name looked at from there: a few system calls fewer for each of many small files.
        let parent = try directory.openParent(of: target.path, create: true)
        switch try directory.kind(of: target.path.name, in: parent) {
        case .absent: break
        case .regularFile where overwrite: break
        case .regularFile: throw TransferError(.exists, "'\(target.path)' already exists; not overwriting it")
        default: throw TransferError(.exists, "'\(target.path)' exists and is not a regular file")
        }
        let names = FileStore.tempNames(for: target.path.name)
        let shown = target.path.description
        // Never O_TRUNC before holding the lock: the partial may be another transfer's. A
        // partial this call creates is empty and has no journal of its own beside it. One that
        // is there is used only if this receiver made it; anything else at the name (another
        // user's file, a hard link, a symlink) is removed and the partial made afresh.
        let created = start.offset == 0 ? try directory.createFile(names.partial, in: parent, shown: shown) : nil
        var replaced = false
        let file: Descriptor
        if let created {
            file = created
        } else if let own = TargetDirectory.openOwnFile(names.partial, in: parent, flags: O_RDWR) {
            file = own
        } else if start.offset == 0 {
            file = try directory.replaceFile(names.partial, in: parent, shown: shown)
            replaced = true
        } else {
            throw TransferError(.io, "'\(shown)': its partial is gone or no longer this receiver's; not resuming into it")
        }
        var info = stat()
        guard fstat(file.fd, &info) == 0 else { throw TransferError.posix("cannot stat the partial of", shown, errno: errno) }
        if start.offset > 0, start.partial != FileIdentity(info) {
            throw TransferError(.io, "'\(shown)': its partial was replaced since its resume offset was read; not resuming into it")
        }
        // One writer per partial: a second transfer of the same name (another sender, or the
        // same one again while the first connection lingers) must not write into a file the
        // first is about to give its final name.
        guard flock(file.fd, LOCK_EX | LOCK_NB) == 0 else {
            throw TransferError(.busy, "'\(target.path)' is being received by another transfer right now")
        }
        // A new partial is empty already: no truncation (an inode update) for each small file.
        let fresh = created != nil || replaced
        guard fresh || info.st_size == startOffset || ftruncate(file.fd, startOffset) == 0 else {
            throw TransferError.posix("cannot truncate the partial of", shown, errno: errno)
        }
        let partialInode = UInt64(info.st_ino)
        // Only a file longer than 1 MiB (or one checkpoint interval, if shorter) gets a journal:
        // re-sending a smaller one whole after an interruption costs less than creating,
        // syncing and removing a journal for each of many small files (~2 ms each).
        var journalFile: Descriptor?
        if let size = target.size, keepsJournal(size: size) || start.offset > 0 {
            // The journal is written to as the partial is: only one this receiver made.
            let journal: Descriptor
            if let own = TargetDirectory.openOwnFile(names.journal, in: parent, flags: O_RDWR) {
                journal = own
            } else if start.offset == 0 {
                journal = try directory.replaceFile(names.journal, in: parent, shown: shown)
            } else {
                throw TransferError(.io, "'\(shown)': its journal is gone or no longer this receiver's; not resuming from it")
            }
            if start.offset == 0 {
                // Replaces any journal of an older attempt (it must not vouch for the new data)
                // and allocates its block now, so a disk that fills up later can still take
                // the checkpoint that makes the partial resumable. Not synced: until the first
                // checkpoint an older journal that survived a crash vouches only for bytes the
                // partial hashes to, and the sync held the first data up to 0.26 s on a busy disk.
                try Journal(target: target, offset: 0, prefixDigest: [], partialInode: partialInode).write(to: journal, shown: shown, durable: false)
            }
            journalFile = journal
        } else if created == nil {
            // An older attempt's must not vouch for new data. Beside a partial just created
            // there is none to look for (a directory scan saved for each of many small files):
            // only a receiver killed between two unlinks leaves a journal alone, and a journal
            // vouches for nothing its partial's bytes do not hash to.
            unlinkat(parent.fd, names.journal, 0)
        }
        return FileWriter(store: self, target: target, parent: parent, names: names, file: file, partialInode: partialInode, journal: journalFile, start: start)
    }

    /// Whether a file of `size` bytes is written with a journal: longer than 1 MiB (or one
    /// checkpoint interval, if shorter).
    func keepsJournal(size: UInt64) -> Bool { size > min(1 << 20, checkpointInterval) }

    /// Removes the partial and journal of a target, if any.
    public func discardPartial(for target: FileTarget) {
        let names = FileStore.tempNames(for: target.path.name)
        guard let parent = try? directory.openDirectory(target.path.parentComponents, create: false, shown: target.path.description) else { return }
        unlinkat(parent.fd, names.partial, 0)
        unlinkat(parent.fd, names.journal, 0)
    }

    /// Hashes up to `limit` bytes of a file from its start; returns how many were read.
    static func hash(_ file: Descriptor, upTo limit: UInt64, into hasher: any StreamingHasher, shown: String) throws(TransferError) -> UInt64 {
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var done: UInt64 = 0
        while done < limit {
            let want = Int(min(UInt64(buffer.count), limit - done))
            let n = buffer.withUnsafeMutableBytes { pread(file.fd, $0.baseAddress, want, off_t(done)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw TransferError.posix("cannot read", shown, errno: errno)
            }
            if n == 0 { break }
            buffer.withUnsafeBytes { hasher.update(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            done += UInt64(n)
        }
        return done
    }
}

/// Writes one file's data sequentially into its partial, checkpointing the journal, then
/// verifies and commits it. Create with ``FileStore/openWriter(for:resumingAt:)``.
public final class FileWriter {
    /// The file being written.
    public let target: FileTarget
    /// Bytes written so far (the next expected offset).
    public private(set) var offset: UInt64
    /// The last offset the journal vouches for (once a checkpoint under way is durable: this waits for it).
    public var checkpointedOffset: UInt64 {
        guard let inFlight = checkpointInFlight, inFlight.wait() == nil else { return vouchedOffset }
        return inFlight.offset
    }
    /// The offset of the last checkpoint known to be durable.
    private var vouchedOffset: UInt64
    /// The end of what the partial holds: below ``offset`` when its last bytes were zeros left
    /// unwritten (see ``write(_:at:)``).
    private var writtenEnd: UInt64
    /// Where the bytes begin whose write-back has not been started (see ``startWriteBack``).
    private var writeBackOffset: UInt64
    private let store: FileStore
    private let parent: Descriptor
    private let names: (partial: String, journal: String)
    private var file: Descriptor?
    /// Nil for a file no longer than a checkpoint interval (see ``FileStore/openWriter(for:resumingAt:)``).
    private let journal: Descriptor?
    /// The partial's inode, recorded in each journal record.
    private let partialInode: UInt64
    /// The checkpoint being made durable on a thread of its own while writing goes on.
    private var checkpointInFlight: CheckpointInFlight?
    private let hasher: any StreamingHasher
    /// Whether ``verify(size:digest:)`` succeeded: the next step is ``commit()``.
    private var verified = false

    init(
        store: FileStore, target: FileTarget, parent: Descriptor, names: (partial: String, journal: String), file: Descriptor,
        partialInode: UInt64, journal: Descriptor?, start: ResumePoint
    ) {
        self.store = store
        self.partialInode = partialInode
        self.target = target
        self.parent = parent
        self.names = names
        self.file = file
        self.journal = journal
        self.hasher = start.hasher ?? start.algorithm.makeHasher()
        self.offset = start.offset
        self.vouchedOffset = start.offset
        self.writeBackOffset = start.offset
        self.writtenEnd = start.offset  // the partial is cut to the resume point when opened
    }

    deinit {
        _ = checkpointInFlight?.wait()  // no journal write of this writer after it is gone
    }

    /// Bytes written before their write-back to the device is started. The checkpoints' and
    /// the commit's syncs then wait only for the last of them, instead of stopping the reader
    /// while the device writes a whole checkpoint interval (docs/benchmarks.md, "The 1 GiB
    /// runs: a receiver's page cache").
    static let writeBackInterval: UInt64 = 2 << 20

    /// Appends `bytes`, which must start at ``offset`` and not run past the offered size. On a
    /// write error (disk full: ``TransferError/Code/noSpace``) the data written so far is
    /// checkpointed so the transfer can resume later (a file too small for a journal is removed
    /// instead, and the error says nothing is kept), and the writer is closed.
    public func write(_ bytes: some ContiguousBytes & Collection<UInt8>, at position: UInt64) throws(TransferError) {
        let file = try checkAppend(UInt64(bytes.count), at: position)
        let failure: Int32? = bytes.withUnsafeBytes { bytes in
            // Blocks of zeros are not written: the partial reads as zeros there anyway (nothing
            // lies beyond the offset written so far), and they stay holes, so a disk image takes
            // only the space of its data. The length is set before anything relies on it.
            for run in Self.dataRuns(in: bytes, at: offset) {
                let start = off_t(offset) + off_t(run.lowerBound)  // fits: checkAppend
                if let err = Self.writeAll(UnsafeRawBufferPointer(rebasing: bytes[run]), to: file.fd, at: start) {
                    return err
                }
                writtenEnd = max(writtenEnd, offset + UInt64(run.upperBound))
            }
            return nil
        }
        if let err = failure {
            abandon()  // checkpointed, or removed where no journal could resume it
            let error = TransferError.posix("cannot write", "'\(target.path)'", errno: err)
            guard journal != nil else { throw error }
            throw TransferError(error.code, "\(error.message) after \(TextFormat.bytes(checkpointedOffset)); the partial file is kept for resuming")
        }
        bytes.withUnsafeBytes { hasher.update($0) }
        try advance(by: UInt64(bytes.count), in: file)
    }

    /// Appends `count` zeros (a Zeros message), which must start at ``offset`` and not run past
    /// the offered size: nothing is written, the partial gets its length before a checkpoint
    /// or the verification needs it.
    public func appendZeros(_ count: UInt64, at position: UInt64) throws(TransferError) {
        let file = try checkAppend(count, at: position)
        hasher.updateWithZeros(count)
        try advance(by: count, in: file)
    }

    /// Checks that `count` bytes may be appended at `position`; the open partial.
    private func checkAppend(_ count: UInt64, at position: UInt64) throws(TransferError) -> Descriptor {
        guard let file else { throw TransferError(.internal, "write after the file was closed") }
        guard position == offset else {
            throw TransferError(.protocolViolation, "data for '\(target.path)' at offset \(position), expected \(offset)")
        }
        if let size = target.size, count > size - offset {
            throw TransferError(.protocolViolation, "more data for '\(target.path)' than its offered \(size) bytes")
        }
        // A file may hold at most Int64.max bytes: a size-unknown stream that claims to go past
        // that is refused, not converted with a trap.
        guard off_t(exactly: offset.saturatingAdd(count)) != nil else {
            throw TransferError(.limitExceeded, "'\(target.path)' would grow past \(Int64.max) bytes")
        }
        return file
    }

    /// Moves the offset past `count` bytes just appended; starts their write-back and a
    /// checkpoint when one is due.
    private func advance(by count: UInt64, in file: Descriptor) throws(TransferError) {
        offset += count  // fits: checkAppend
        if offset - writeBackOffset >= Self.writeBackInterval {
            // Both fit in off_t: checkAppend.
            _ = startWriteBack(of: file.fd, offset: Int64(writeBackOffset), length: Int64(offset - writeBackOffset))
            writeBackOffset = offset
        }
        if target.size != nil, offset - (checkpointInFlight?.offset ?? vouchedOffset) >= store.checkpointInterval {
            try finishCheckpointInFlight()  // at once unless the device is slower than the link
            try startCheckpoint()
        }
    }

    /// The block size within which zeros are looked for: a file system's usual block.
    static let holeBlockSize = 4096

    /// The ranges of `bytes` (which start at file offset `position`) to write: everything but
    /// the blocks, aligned on the file's offsets, that hold only zeros (at the edges, the part
    /// of such a block). Adjacent blocks with data make one range, so a chunk without zeros
    /// is one write. Checking a block of data costs its first nonzero word.
    static func dataRuns(in bytes: UnsafeRawBufferPointer, at position: UInt64) -> [Range<Int>] {
        var runs: [Range<Int>] = []
        var start = 0
        while start < bytes.count {
            let end = min(bytes.count, start + holeBlockSize - Int((position % UInt64(holeBlockSize) + UInt64(start)) % UInt64(holeBlockSize)))
            if !isZero(UnsafeRawBufferPointer(rebasing: bytes[start..<end])) {
                if let last = runs.last, last.upperBound == start {
                    runs[runs.count - 1] = last.lowerBound..<end
                } else {
                    runs.append(start..<end)
                }
            }
            start = end
        }
        return runs
    }

    static func isZero(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        var bits: UInt64 = 0
        while index + 8 <= bytes.count {
            bits |= bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            if bits != 0 { return false }
            index += 8
        }
        while index < bytes.count {
            bits |= UInt64(bytes[index])
            index += 1
        }
        return bits == 0
    }

    /// pwrite(2) of all of `bytes` at `position`; the errno of a failure.
    private static func writeAll(_ bytes: UnsafeRawBufferPointer, to fd: Int32, at position: off_t) -> Int32? {
        var written = 0
        while written < bytes.count {
            let n = pwrite(fd, bytes.baseAddress! + written, bytes.count - written, position + off_t(written))
            if n < 0 {
                if errno == EINTR { continue }
                return errno
            }
            written += n
        }
        return nil
    }

    /// Extends the partial to the offset written so far when that ends in zeros left unwritten:
    /// before a checkpoint vouches for the offset (a resume hashes the partial up to it) and
    /// before the file is verified.
    private func extendOverTrailingHole(_ file: Descriptor) throws(TransferError) {
        guard writtenEnd < offset else { return }
        guard let length = off_t(exactly: offset), ftruncate(file.fd, length) == 0 else {
            throw TransferError.posix("cannot set the length of", "'\(target.path)'", errno: errno)
        }
        writtenEnd = offset
    }

    /// Makes the data written so far durable and records it in the journal: fdatasync of the
    /// partial, then the journal (offset and prefix digest), then fdatasync of the journal.
    /// The pages made durable then leave the page cache (`releaseDurablePages`). Waits for a
    /// checkpoint under way first; a failure of that one is thrown.
    public func checkpoint() throws(TransferError) {
        try finishCheckpointInFlight()
        guard target.size != nil else { return }
        try startCheckpoint(on: { $0() })  // on this thread
        try finishCheckpointInFlight()
    }

    /// Starts the checkpoint of what is written so far on a thread of its own: writing goes on
    /// meanwhile instead of waiting for the device (an fdatasync of 16 MiB took 20-25 ms on the
    /// benchmark machine: a quarter of the reader's time at 200 MB/s, with the connection's
    /// window filling up behind it). The record is taken now, so it vouches only for bytes
    /// written before the sync began: fdatasync of the partial, the record written and synced,
    /// then the durable pages dropped from the page cache. `run` runs the steps (``checkpoint()``
    /// runs them on its own thread).
    private func startCheckpoint(on run: (@escaping @Sendable () -> Void) -> Void = DetachedThread.run) throws(TransferError) {
        guard let file, let journal else { return }
        try extendOverTrailingHole(file)
        let record = Journal(target: target, offset: offset, prefixDigest: hasher.digest(), partialInode: partialInode)
        let inFlight = CheckpointInFlight(offset: offset)
        let (start, shown, sync) = (vouchedOffset, target.path.description, store.syncData)
        checkpointInFlight = inFlight
        // The thread lets go of the partial (and so of its lock, once the writer is gone too)
        // before it reports the checkpoint finished: a writer dropped when its connection was
        // cut waits for its checkpoint, and the resume that follows must find the partial free.
        let files = Locked<(partial: Descriptor, journal: Descriptor)?>((file, journal))
        run {
            var outcome: TransferError?
            do {  // the descriptors' scope, ended before the finish
                let (file, journal) = files.withLock { held in
                    defer { held = nil }
                    return held!
                }
                if sync(file.fd) != 0 {
                    outcome = TransferError.posix("cannot sync", "'\(shown)'", errno: errno)
                } else {
                    do throws(TransferError) {
                        try record.write(to: journal, shown: shown)
                        Self.releaseDurablePages(of: file, from: start, upTo: record.offset)
                    } catch {
                        outcome = error
                    }
                }
            }
            inFlight.finish(outcome)
        }
    }

    /// Waits for the checkpoint under way, if any, and takes its outcome: its offset is
    /// vouched for, or its failure is thrown (a sync that failed may have lost data).
    private func finishCheckpointInFlight() throws(TransferError) {
        guard let inFlight = checkpointInFlight else { return }
        checkpointInFlight = nil
        if let error = inFlight.wait() { throw error }
        vouchedOffset = inFlight.offset
    }

    /// Drops the cached pages of `[start, end)`, which a sync has just made durable
    /// (`posix_fadvise(POSIX_FADV_DONTNEED)`): the receiver never reads them again (the digest
    /// is computed as data arrives), so a large file no longer pushes the machine's other cached
    /// data out of memory, and the next pages written reuse the memory just freed. Where free
    /// memory goes back to a virtual machine's host, writing into memory the host took back
    /// cost this receiver 1.3-2 CPU-seconds per GiB (docs/benchmarks.md, "The 1 GiB runs: a
    /// receiver's page cache"). Advisory: a failure changes nothing but memory use.
    private static let pageSize = UInt64(max(sysconf(Int32(_SC_PAGESIZE)), 4096))

    private static func releaseDurablePages(of file: Descriptor, from start: UInt64, upTo end: UInt64) {
        let pageStart = start - start % Self.pageSize  // the page the last checkpoint ended in is complete now
        guard end > pageStart, let offset = off_t(exactly: pageStart), let length = off_t(exactly: end - pageStart) else { return }
        _ = posix_fadvise(file.fd, offset, length, POSIX_FADV_DONTNEED)
    }

    /// Verifies the size and digest the sender announced against what was written, then
    /// commits the file (``verify(size:digest:)`` then ``commit()``).
    public func finish(size: UInt64, digest: [UInt8]) throws(TransferError) {
        try verify(size: size, digest: digest)
        try commit()
    }

    /// Verifies the size and digest the sender announced against what was written and, on a
    /// match, applies mode and mtime; the file is then ready for ``commit()`` (its partial
    /// stays open and locked). On a mismatch removes the partial and journal, leaves any
    /// existing target untouched and throws ``TransferError/Code/digestMismatch``.
    public func verify(size: UInt64, digest: [UInt8]) throws(TransferError) {
        guard let file, !verified else { throw TransferError(.internal, "verify after the file was closed") }
        try finishCheckpointInFlight()
        let shown = target.path.description
        // A size other than the one offered or received is, like a wrong digest, a file that
        // did not arrive as announced: it fails alone (docs/PROTOCOL.md §6).
        if let offered = target.size, offered != size {
            close(discarding: true)
            throw TransferError(.digestMismatch, "'\(shown)' was offered with \(offered) bytes but finished with \(size); nothing written")
        }
        guard size == offset else {
            close(discarding: true)
            throw TransferError(.digestMismatch, "'\(shown)' finished at \(size) bytes but \(offset) were received; nothing written")
        }
        guard digest == hasher.digest() else {
            close(discarding: true)
            throw TransferError(.digestMismatch, "'\(shown)': \(target.algorithm.name) mismatch (sent \(hexString(digest)), received \(hexString(hasher.digest()))); nothing written")
        }
        do {
            try extendOverTrailingHole(file)  // before the modification time is set
            try store.directory.applyAttributes(file, mode: target.mode, modificationTime: target.modificationTime, shown: shown)
        } catch {
            close(discarding: true)
            throw error
        }
        verified = true
    }

    /// Makes a verified file durable and gives it its final name: fsync, then rename (never
    /// replacing an existing entry unless the store allows overwriting), then removes the
    /// journal. The rename is atomic at once and durable after ``FileStore/syncDirectories()``.
    /// Touches only this writer and the store's locked set of directories, so writers of
    /// different files may be committed on different threads.
    public func commit() throws(TransferError) {
        try commit(durable: false)
    }

    /// ``commit()``; `durable` when the caller has made this file's data and inode durable
    /// already (a ``syncFileSystem(holding:)`` after it was verified), so it is not fsynced again.
    func commit(durable: Bool) throws(TransferError) {
        guard let file, verified else { throw TransferError(.internal, "commit of a file not verified") }
        defer { self.file = nil }
        let shown = target.path.description
        guard durable || fsync(file.fd) == 0 else {
            let err = errno
            close(discarding: true)
            throw TransferError.posix("cannot sync", "'\(shown)'", errno: err)
        }
        let err = renameAt(parent.fd, names.partial, to: parent.fd, target.path.name, replacing: store.overwrite)
        if err != 0 {
            if err == EEXIST { throw TransferError(.exists, "'\(shown)' appeared while receiving; not overwriting it (data kept in \(names.partial))") }
            close(discarding: true)
            throw TransferError.posix("cannot rename into place", "'\(shown)'", errno: err)
        }
        store.renamed(in: parent)
        if journal != nil { unlinkat(parent.fd, names.journal, 0) }
    }

    /// The open partial of a verified file not yet committed (for ``FileCommitter`` to find its
    /// file system and sync it with others); nil otherwise.
    var verifiedPartial: Descriptor? { verified ? file : nil }

    /// Stops writing and keeps the partial for a later resume (checkpointing what is written).
    /// A partial without a journal (a file of at most 1 MiB, or of unknown size) can never be
    /// resumed, so it is removed now, while this writer still holds its lock: nothing else
    /// can be using it (docs/PROTOCOL.md §6, "Leftovers").
    public func abandon() {
        guard file != nil else { return }
        if journal == nil {
            unlinkat(parent.fd, names.partial, 0)
        } else {
            try? checkpoint()
        }
        file = nil
    }

    /// Closes the partial, removing it and the journal when `discarding`.
    private func close(discarding: Bool) {
        try? finishCheckpointInFlight()  // its journal write lands before the journal goes
        file = nil
        guard discarding else { return }
        unlinkat(parent.fd, names.partial, 0)
        unlinkat(parent.fd, names.journal, 0)
    }
}

/// A checkpoint made durable on a thread of its own (``FileWriter``): the writer waits for it
/// before the next checkpoint and before anything that needs the journal or the partial settled.
/// Its outcome behind `Locked`'s pthread mutex, which ThreadSanitizer sees, as
/// ``FileCommitter``'s threads hand theirs over.
private final class CheckpointInFlight: Sendable {
    /// The offset the checkpoint vouches for once durable.
    let offset: UInt64
    private let failure = Locked<TransferError?>(nil)
    private let finished = DispatchSemaphore(value: 0)

    init(offset: UInt64) { self.offset = offset }

    /// Called once by the thread that made it durable, with its failure if any.
    func finish(_ error: TransferError?) {
        failure.withLock { $0 = error }
        finished.signal()
    }

    /// Waits until it finished (any number of times); its failure, if any.
    func wait() -> TransferError? {
        finished.wait()
        finished.signal()  // for the next wait
        return failure.withLock { $0 }
    }
}
