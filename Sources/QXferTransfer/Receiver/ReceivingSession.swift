/// The receiver's state after it accepted an offer, sans-IO: it takes the messages of the
/// control and data streams one at a time and returns the reply to send, writing the files
/// through its ``FileStore``. Every rule of docs/PROTOCOL.md §1 and §3.3–3.5 about which
/// message may come when is checked here; a breach is a `protocol-violation`. Every number a
/// message carries is checked before it is used as an index, an offset or a count.
struct ReceivingSession {
    private let offer: Offer
    private let paths: [SafePath]
    private let store: FileStore
    private let progress: TransferProgress

    /// Files still waiting for their FileDone, by entry.
    private var pending: PendingFiles
    /// QUIC: which entry each data stream carries, and which entries have a stream.
    private var streamEntries: [InboundFunnel.Source: UInt32] = [:]
    private var entriesWithStream: Set<UInt32> = []
    /// Directories and symlinks, done after the files.
    private var treeEntries: [Int] = []
    /// Verified files waiting for the committer (``takeCommitGroup()``), and the files it is
    /// committing now, with what their Verified reports.
    private var readyToCommit: [(entry: UInt32, writer: FileWriter)] = []
    private var committing: [UInt32: (size: UInt64, digest: [UInt8])] = [:]
    /// Whether the offer set the `batches` flag: Batch messages, several entries per data
    /// stream one after another, verdicts in batches (docs/PROTOCOL.md §3.6).
    let usesBatches: Bool

    private(set) var summary: TransferSummary
    private(set) var bytesToReceive: UInt64 = 0
    /// Bytes the sender hashes before the first message of a file (a resumed prefix, a
    /// present file), for files that have not had one yet.
    private var bytesToHashFirst: UInt64 = 0

    private enum PendingFile {
        case receive(FileTarget, ResumePoint, FileWriter?)
        case present(FileTarget, digest: [UInt8])
        /// An early file answered `skip`: its data comes anyway and is dropped (§3.7).
        case skipped
        /// A file whose partial could not be made (the file system refused its name, say): its
        /// data is checked and dropped, and its FileDone answered Failed; the others go on.
        case unwritable(TransferError)
    }
    /// ``PendingFile``s by entry number: a slot for each entry that can be pending (a file, or
    /// an entry flagged early), found through a table of 4 bytes an entry. A dictionary of
    /// them, grown while planning, took 240 bytes an entry at its peak (24 MB for 100 000
    /// files); an offer of folders gets no slots. Entry numbers from the network outside the
    /// offer, or of entries that cannot be pending, read as nil.
    private struct PendingFiles {
        /// For each entry, its slot plus one; 0 for none.
        private var slotOf: [UInt32]
        private var slots: [PendingFile?]
        private(set) var count = 0

        init(_ entries: [OfferEntry]) {
            var next: UInt32 = 0
            slotOf = entries.map { entry in
                guard entry.kind == .file || entry.flags.contains(.early) else { return 0 }
                next += 1  // at most the offer's entry limit
                return next
            }
            slots = Array(repeating: nil, count: Int(next))
        }

        var isEmpty: Bool { count == 0 }
        var values: some Sequence<PendingFile> { slots.lazy.compactMap { $0 } }

        private func slot(_ entry: UInt32) -> Int? {
            guard Int(entry) < slotOf.count, slotOf[Int(entry)] > 0 else { return nil }
            return Int(slotOf[Int(entry)] - 1)
        }

        subscript(entry: UInt32) -> PendingFile? {
            get { slot(entry).flatMap { slots[$0] } }
            set {
                // Only files and early entries of the offer are ever set (the plans' files, or
                // entries read as pending).
                guard let slot = slot(entry) else { return }
                count += (newValue == nil ? 0 : 1) - (slots[slot] == nil ? 0 : 1)
                slots[slot] = newValue
            }
        }

        mutating func removeValue(forKey entry: UInt32) -> PendingFile? {
            defer { self[entry] = nil }
            return self[entry]
        }

        mutating func removeAll() {
            (slotOf, slots, count) = ([], [], 0)
        }
    }
    /// Early files whose data is dropped (answered `present` or `skip`), and the offset their
    /// next FileData must start at.
    private var discarding: [UInt32: UInt64] = [:]

    init(offer: Offer, paths: [SafePath], store: FileStore, progress: TransferProgress) {
        self.offer = offer
        self.paths = paths
        self.store = store
        self.progress = progress
        self.usesBatches = offer.flags.contains(.batches)
        self.pending = PendingFiles(offer.entries)
        self.summary = TransferSummary(
            succeeded: 0, failures: [], transferredBytes: 0, resumedBytes: 0, algorithm: offer.algorithm,
            digests: VerifiedDigests(algorithm: offer.algorithm) { [paths] in paths[Int($0)].description })
    }

    /// The first data stream the network ended (the sender reset it, or the connection was
    /// lost): QUIC does not order a reset against the control stream, so the sender's Error, or
    /// its close, may still be on its way there (docs/PROTOCOL.md §3.5). The caller waits
    /// for that a little, then hands this back as the control stream's failure.
    private(set) var lostDataStream: (any Error)?

    private var unfinished: String { pending.count == 1 ? "1 file" : "\(pending.count) files" }

    /// What running the same send again does with the unfinished files: it resumes a file of
    /// known size, but standard input (or a kernel file: any file of unknown size) is read anew
    /// and sent from its start, and what arrived of it is not kept.
    private var whatResumes: String {
        let unknownSize = pending.values.count { if case .receive(let target, _, _) = $0 { target.size == nil } else { false } }
        if unknownSize == 0 { return "the same send resumes them" }
        let what = unknownSize == 1 ? "1 file of unknown size (such as standard input)" : "\(unknownSize) files of unknown size (such as standard input)"
        let rest = pending.count - unknownSize
        return (rest > 0 ? "the same send resumes \(rest == 1 ? "1" : "\(rest)") of them; " : "")
            + "\(what) cannot be resumed: what arrived of it is not kept, and a send starts it over"
    }

    /// Verified files that hold their partial open until the committer is done with them.
    var filesAwaitingCommit: Int { readyToCommit.count + committing.count }

    /// Whether every file has been answered.
    var isFinished: Bool { pending.isEmpty && readyToCommit.isEmpty && committing.isEmpty }

    /// The most files in one commit group: their verdicts fit one Batch (≤ 16 MiB) even when
    /// each is a Failed with a long message.
    static let maximumCommitGroup = 4096

    /// Hands over the verified files waiting to be committed (nil when there are none): the
    /// caller runs ``FileCommitter/commit(_:)`` on them and brings the outcomes back as a
    /// ``InboundFunnel/Event/committed(_:)`` event.
    mutating func takeCommitGroup() -> CommitGroup? {
        guard !readyToCommit.isEmpty else { return nil }
        let taken = readyToCommit.prefix(Self.maximumCommitGroup)
        readyToCommit.removeFirst(taken.count)
        return CommitGroup(files: Array(taken))
    }

    /// Bytes the receiver held already from earlier attempts (resume).
    var resumedBytes: UInt64 { summary.resumedBytes }

    /// How long the sender may stay silent on top of the idle timeout: the time to hash what
    /// it must hash before its next messages, at 16 MiB/s (docs/PROTOCOL.md §1, "Timeouts").
    var hashingAllowance: Duration { .seconds(min(bytesToHashFirst / (16 << 20), 86_400)) }

    /// Records an entry that cannot be taken.
    mutating func fail(_ entry: UInt32, _ error: TransferError) {
        summary.failures.append((paths[Int(entry)].description, error))
        progress.report(.failed(path: paths[Int(entry)].description, error: error))
    }

    /// Takes the accepted plans: which files to expect.
    mutating func expect(_ plans: [Plan]) {
        for (index, plan) in plans.enumerated() {
            let early = offer.entries[index].flags.contains(.early)
            switch plan {
            case .directory, .symlink:
                treeEntries.append(index)
            case .receive(let target, let resume):
                pending[UInt32(index)] = .receive(target, resume, nil)
                // The planner checked offset <= size and that the sizes add up within 64 bits.
                bytesToReceive = bytesToReceive.saturatingAdd((target.size ?? 0).saturatingSubtract(resume.offset))
                summary.resumedBytes = summary.resumedBytes.saturatingAdd(resume.offset)
                bytesToHashFirst = bytesToHashFirst.saturatingAdd(resume.offset)
            case .present(let target, let digest):
                pending[UInt32(index)] = .present(target, digest: digest)
                if early {
                    discarding[UInt32(index)] = 0
                } else {
                    bytesToHashFirst = bytesToHashFirst.saturatingAdd(target.size ?? 0)
                }
            case .skip(let error):
                fail(UInt32(index), error)
                if early {
                    pending[UInt32(index)] = .skipped
                    discarding[UInt32(index)] = 0
                }
            }
        }
    }

    /// Handles what a reader saw (or the committer did); returns the messages to send on the
    /// control stream, in order.
    mutating func handle(_ event: InboundFunnel.Event, from source: InboundFunnel.Source, usesStreams: Bool) throws -> [Message] {
        switch event {
        case .committed(let outcomes):
            return try committed(outcomes)
        case .failed(let error):
            // Our own verdicts (a message that does not decode, a timeout, a take-over) as they
            // are; anything else is the network: a data stream reset or a connection lost
            // mid-file, and the partials stay resumable.
            if error is TransferError || error is CancellationError { throw error }
            if case .data = source {
                // The sender's reason may still be on its way on the control stream.
                lostDataStream = lostDataStream ?? error
                return []
            }
            throw TransferError(.cancelled, "the sender stopped with \(unfinished) unfinished (\(error)); \(whatResumes)")
        case .ended:
            if source == .control {
                throw TransferError(.cancelled, "the sender stopped with \(unfinished) unfinished (it closed the connection); \(whatResumes)")
            }
            if let entry = streamEntries.removeValue(forKey: source), pending[entry] != nil {
                throw TransferError(.protocolViolation, "the data stream of '\(paths[Int(entry)])' ended before its FileDone")
            }
            return []
        case .message(let message):
            switch message {
            case .fileData(let data):
                try bind(data.entry, to: source, usesStreams: usesStreams)
                let written = try receive(entry: data.entry, offset: data.offset, count: UInt64(data.bytes.count)) { writer throws(TransferError) in
                    try writer.write(data.bytes, at: data.offset)
                }
                if written {
                    summary.transferredBytes = summary.transferredBytes.saturatingAdd(UInt64(data.bytes.count))
                    progress.add(transferred: data.bytes.count)
                }
                return []
            case .zeros(let zeros):
                guard offer.flags.contains(.zeros) else { throw TransferError(.malformed, "a Zeros message, but the offer did not set the zeros flag") }
                try bind(zeros.entry, to: source, usesStreams: usesStreams)
                let written = try receive(entry: zeros.entry, offset: zeros.offset, count: zeros.length) { writer throws(TransferError) in
                    try writer.appendZeros(zeros.length, at: zeros.offset)
                }
                if written {
                    summary.zeroBytes = summary.zeroBytes.saturatingAdd(zeros.length)
                    progress.add(zeros: zeros.length)
                }
                return []
            case .fileDone(let done):
                try bind(done.entry, to: source, usesStreams: usesStreams)
                // With batches the stream may carry the next entry now; without, never.
                if usesBatches { streamEntries[source] = nil }
                return try finish(done)
            case .failed(let failure):
                // The sender could not read this file to its end: it ends the entry as a
                // FileDone would (docs/PROTOCOL.md §3.5).
                try bind(failure.entry, to: source, usesStreams: usesStreams)
                if usesBatches { streamEntries[source] = nil }
                return giveUp(failure)
            case .batch(let messages):
                guard usesBatches else { throw TransferError(.malformed, "a Batch, but the offer did not set the batches flag") }
                var replies: [Message] = []
                for inner in messages {
                    switch inner {
                    case .fileData, .zeros, .fileDone, .failed: replies += try handle(.message(inner), from: source, usesStreams: usesStreams)
                    default: throw TransferError(.protocolViolation, "the sender sent \(inner.type) inside a Batch")
                    }
                }
                return replies
            case .error(let refusal):
                throw AlreadyCommunicated(error: TransferError(refusal.code, "the sender: \(refusal.message)"))
            default:
                throw TransferError(.protocolViolation, "the sender sent \(message.type) during the transfer")
            }
        }
    }

    /// On QUIC, data comes on data streams, one entry per stream, one stream per entry.
    private mutating func bind(_ entry: UInt32, to source: InboundFunnel.Source, usesStreams: Bool) throws(TransferError) {
        guard pending[entry] != nil else {
            throw TransferError(.protocolViolation, "data for entry \(entry), which is not expected (unknown, not a file, skipped or finished)")
        }
        guard usesStreams else { return }
        guard source != .control else { throw TransferError(.protocolViolation, "file data on the control stream") }
        if let bound = streamEntries[source] {
            guard bound == entry else { throw TransferError(.protocolViolation, "one data stream carries two entries (\(bound) and \(entry))") }
        } else {
            guard entriesWithStream.insert(entry).inserted else {
                throw TransferError(.protocolViolation, "entry \(entry) arrives on two data streams")
            }
            streamEntries[source] = entry
        }
    }

    /// Takes `count` bytes of `entry` at `offset` (a FileData, or a Zeros standing for them):
    /// `append` writes them once the offset is checked; false when they were an early file's,
    /// checked and dropped.
    private mutating func receive(entry: UInt32, offset: UInt64, count: UInt64, append: (FileWriter) throws(TransferError) -> Void) throws -> Bool {
        if let next = discarding[entry] {
            let (end, overflow) = offset.addingReportingOverflow(count)
            guard offset == next, !overflow, end <= offer.entries[Int(entry)].size else {
                throw TransferError(.protocolViolation, "data for '\(paths[Int(entry)])' at offset \(offset) does not follow its previous data or overruns its size")
            }
            discarding[entry] = end
            return false
        }
        guard case .receive(let target, let resume, var writer) = pending[entry] else {
            throw TransferError(.protocolViolation, "file data for '\(paths[Int(entry)])', which the receiver already has")
        }
        if writer == nil {
            do {
                writer = try open(target, resume, startingAt: offset)
            } catch let error as TransferError where error.concernsOneEntry {
                pending[entry] = .unwritable(error)
                discarding[entry] = offset
                return try receive(entry: entry, offset: offset, count: count, append: append)
            }
            // Recorded before the first write, which may refuse the data: the partial is then
            // removed with the others when the transfer stops (§6, "Leftovers").
            pending[entry] = .receive(target, resume, writer)
        }
        try append(writer!)
        return true
    }

    /// The first chunk starts where the receiver asked, or at 0 when the sender's data differs
    /// from the held prefix (then what was held is discarded, and no longer counts as resumed).
    private mutating func open(_ target: FileTarget, _ resume: ResumePoint, startingAt offset: UInt64) throws -> FileWriter {
        let writer: FileWriter
        bytesToHashFirst = bytesToHashFirst.saturatingSubtract(resume.offset)
        if offset == resume.offset {
            writer = try store.openWriter(for: target, resumingAt: resume)
        } else if offset == 0 {
            writer = try store.openWriter(for: target)
            summary.resumedBytes = summary.resumedBytes.saturatingSubtract(resume.offset)
            progress.unresume(resume.offset)
        } else {
            throw TransferError(.protocolViolation, "'\(target.path)' starts at offset \(offset); expected \(resume.offset) or 0")
        }
        progress.report(.started(path: target.path.description, size: target.size, offset: offset))
        return writer
    }

    private mutating func finish(_ done: FileDone) throws -> [Message] {
        guard done.algorithm == offer.algorithm else {
            throw TransferError(.protocolViolation, "FileDone with \(done.algorithm.name), the offer said \(offer.algorithm.name)")
        }
        let shown = paths[Int(done.entry)].description
        let outcome: Result<Void, TransferError>
        let sentEarly = discarding.removeValue(forKey: done.entry) != nil
        switch pending.removeValue(forKey: done.entry)! {
        case .skipped:
            return []
        case .unwritable(let error):
            outcome = .failure(error)
        case .present(let target, let digest):
            if !sentEarly {  // an early file was never counted: the sender hashed nothing first
                bytesToHashFirst = bytesToHashFirst.saturatingSubtract(target.size ?? 0)
            }
            outcome = done.digest == digest
                ? .success(())
                : .failure(TransferError(.exists, "'\(shown)' exists with the same size but other content; not overwriting it"))
        case .receive(let target, let resume, let writer):
            do {
                // A file with no FileData: empty, or already complete from an earlier attempt.
                let writer = try writer ?? open(target, resume, startingAt: done.size == resume.offset ? resume.offset : 0)
                // A size other than the offered one fails this file alone (its partial is
                // discarded): the other files go on.
                try writer.verify(size: done.size, digest: done.digest)
                // Verified when the committer has made it durable under its final name.
                readyToCommit.append((done.entry, writer))
                committing[done.entry] = (done.size, done.digest)
                return []
            } catch let error as TransferError where [.digestMismatch, .exists, .busy, .io].contains(error.code) {
                outcome = .failure(error)
            }
        }
        return [verdict(done.entry, size: done.size, digest: done.digest, outcome)]
    }

    /// A file the sender gave up: what was written of it is kept as after a lost connection
    /// (resumable with a journal, removed without), and it is answered Failed with the sender's reason.
    private mutating func giveUp(_ failure: EntryFailure) -> [Message] {
        let sentEarly = discarding.removeValue(forKey: failure.entry) != nil
        switch pending.removeValue(forKey: failure.entry)! {
        case .skipped:
            return []  // answered `skip` already, and counted failed then
        case .receive(let target, let resume, let writer):
            if let writer { writer.abandon() } else { bytesToHashFirst = bytesToHashFirst.saturatingSubtract(resume.offset) }
            // What had not arrived leaves the total (holes already left it as they came).
            progress.forgo(data: (target.size ?? 0).saturatingSubtract(writer?.offset ?? resume.offset), holes: 0)
        case .present(let target, _):
            if !sentEarly { bytesToHashFirst = bytesToHashFirst.saturatingSubtract(target.size ?? 0) }
        case .unwritable:
            break
        }
        return [verdict(failure.entry, size: 0, digest: [], .failure(TransferError(failure.code, "the sender: \(failure.message)")))]
    }

    /// Records what the committer did with a group; returns their verdicts.
    private mutating func committed(_ outcomes: [CommitOutcome]) throws(TransferError) -> [Message] {
        var replies: [Message] = []
        for outcome in outcomes {
            guard let (size, digest) = committing.removeValue(forKey: outcome.entry) else {
                throw TransferError(.internal, "a commit of entry \(outcome.entry), which was not handed over")
            }
            replies.append(verdict(outcome.entry, size: size, digest: digest, outcome.error.map { .failure($0) } ?? .success(())))
        }
        return replies
    }

    private mutating func verdict(_ entry: UInt32, size: UInt64, digest: [UInt8], _ outcome: Result<Void, TransferError>) -> Message {
        let shown = paths[Int(entry)].description
        switch outcome {
        case .success:
            summary.succeeded += 1
            summary.digests.append(entry, digest: digest)
            progress.report(.verified(path: shown, size: size, digest: hexString(digest)))
            return .verified(entry: entry)
        case .failure(let error):
            fail(entry, error)
            return .failed(EntryFailure(entry: entry, code: error.code, message: error.message))
        }
    }

    /// After the last file: symlinks, then the modes and times of directories, deepest first
    /// (writing inside a directory changes its time), then every rename made durable. Returns
    /// a Failed message for each folder or symlink that could not be made, then the Complete
    /// message, which the sender takes as "all of it is on disk". Complete counts every entry
    /// of the offer once: succeeded + failed = the offer's count.
    mutating func finishTree() throws(TransferError) -> [Message] {
        var replies: [Message] = []
        let (store, paths) = (store, paths)
        func settle(_ index: Int, _ work: () throws(TransferError) -> Void) {
            do {
                try work()
                summary.succeeded += 1
            } catch {
                fail(UInt32(index), error)
                replies.append(.failed(EntryFailure(entry: UInt32(index), code: error.code, message: error.message)))
            }
        }
        for index in treeEntries where offer.entries[index].kind == .symlink {
            let entry = offer.entries[index]
            settle(index) { () throws(TransferError) in
                try store.directory.createSymlink(paths[index], target: entry.linkTarget)
                try store.directory.setSymlinkTime(paths[index], modificationTime: entry.modificationTime)
            }
        }
        let directories = treeEntries.filter { offer.entries[$0].kind == .directory }
        for index in directories.sorted(by: { paths[$0].components.count > paths[$1].components.count }) {
            let entry = offer.entries[index]
            settle(index) { () throws(TransferError) in
                try store.directory.setDirectoryAttributes(paths[index], mode: entry.mode, modificationTime: entry.modificationTime)
            }
        }
        try store.syncDirectories()
        replies.append(.complete(Complete(succeeded: UInt32(clamping: summary.succeeded), failed: UInt32(clamping: summary.failures.count))))
        return replies
    }

    /// Keeps what was written of unfinished files, checkpointed, for a later resume.
    /// Files handed to the committer are its own: wait for it before calling this.
    mutating func abandonOpenFiles() {
        for case .receive(_, _, let writer?) in pending.values { writer.abandon() }
        for (_, writer) in readyToCommit { writer.abandon() }
        pending.removeAll()
        readyToCommit.removeAll()
        try? store.syncDirectories()  // what was already verified stays, durably
    }
}
