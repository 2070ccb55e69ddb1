import FoundationEssentials
import Glibc
import QXfer
internal import LinuxSystem

/// The sending side of qxfer/1 (docs/PROTOCOL.md), over any `TLV { TLS() }` or
/// `TLV { QUIC() }` connection: offers a ``SourceTree``, sends what the receiver asks for,
/// each file from its resume offset with a digest computed while reading, and collects the
/// receiver's verdicts.
///
/// Nothing waits for one file before the next: small files (at most ``batchedFileLimit``
/// bytes) travel together in Batch messages, each larger file in messages of its own.
/// On QUIC the batches go on up to ``parallelFiles`` long-lived streams and every large file
/// on a stream of its own, several in parallel; on TCP+TLS, which has one ordered byte stream,
/// the same messages follow each other on the connection.
public struct TransferSender: Sendable {
    /// What to send.
    public var tree: SourceTree
    /// The end-to-end digest.
    public var algorithm: DigestAlgorithm
    /// Streams used at the same time over QUIC (Batches of small files, or one larger file each).
    public var parallelFiles: Int
    /// Counters and events for a progress display.
    public let progress: TransferProgress

    public init(tree: SourceTree, algorithm: DigestAlgorithm = .xxh3_128, parallelFiles: Int = 8, progress: TransferProgress = TransferProgress()) {
        self.tree = tree
        self.algorithm = algorithm
        self.parallelFiles = max(1, parallelFiles)
        self.progress = progress
    }

    /// Runs the whole transfer on `connection` (connecting it if needed) and returns how it
    /// ended. Throws ``TransferError`` when the receiver declines or either side fails, and
    /// the connection's `QXferError` when the network does.
    public func run<Stack: TLVStack>(over connection: NetworkConnection<Stack>) async throws -> TransferSummary {
        try await connection.endingOnError { try await exchange(over: connection) }
    }

    /// Files up to this size go in Batches (docs/PROTOCOL.md §3.6), and may be sent early,
    /// before Accept (§3.7); larger ones alone, after Accept.
    static let batchedFileLimit: UInt64 = ProtocolLimits.maximumEarlyFileSize
    /// A Batch is sent once it holds this much file data, or ``batchFileCount`` files. Small:
    /// the receiver takes a Batch only once all of it has arrived, and over a path still in
    /// slow start (with 8 streams sharing it on QUIC) a 1 MiB Batch arrived only after most of
    /// a 9 MB tree had, so the receiver's work waited for the network instead of overlapping it.
    static let batchBytes = 64 << 10
    static let batchFileCount = 256

    private func exchange<Stack: TLVStack>(over connection: NetworkConnection<Stack>) async throws -> TransferSummary {
        // Zeros only when a file may have holes: a receiver from before them still takes the rest.
        var offer = Offer(algorithm: algorithm, entries: markingEarlyFiles(tree.entries), flags: tree.mayHaveHoles ? [.batches, .early, .zeros] : [.batches, .early])
        // Parts only when needed: a receiver from before them still takes every smaller offer.
        if MessageCodec.mayNeedParts(offer) { offer.flags.insert(.long) }
        progress.report(.offered(entries: offer.entries.count, bytes: tree.totalSize, sizeUnknown: tree.entries.count(where: { $0.flags.contains(.sizeUnknown) })))
        try await connection.send(.offer(offer))

        let shared = SendingState()
        let usesStreams = try await connection.hasIndependentStreams
        // Only the units hold the early jobs (a tree of small files to a known receiver can be
        // all early files).
        let earlyUnits = Self.units(of: offer.entries.indices.filter { offer.entries[$0].flags.contains(.early) }.map {
            FileJob(index: UInt32($0), entry: offer.entries[$0], source: tree.sources[$0], answer: .sendAll)
        })
        // The rest of the files, once Accept has said what the receiver wants of them.
        let (accepted, acceptance) = AsyncStream.makeStream(of: [SendUnit].self)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            // Early files leave now, in the round trip Accept takes; the others follow them on
            // the same lanes (on TCP+TLS, one after the other on the connection).
            group.addTask {
                try await send(earlyUnits, over: connection, usesStreams: usesStreams, shared: shared)
                for await units in accepted {
                    try await send(units, over: connection, usesStreams: usesStreams, shared: shared)
                }
            }
            var summary: TransferSummary
            do {
                summary = try await receiveVerdicts(offer: offer, connection: connection, acceptance: acceptance, shared: shared)
                try await group.waitForAll()
            } catch {
                // The connection closed under the wait because a file of ours failed: that is the cause.
                if let failure = shared.localFailure.withLock({ $0 }) { throw AlreadyCommunicated(error: failure) }
                throw error
            }
            summary.transferredBytes = progress.transferredBytes
            summary.resumedBytes = progress.resumedBytes
            summary.zeroBytes = progress.zeroBytes
            // Done: the receiver waits for us to close. Complete says it has everything, so
            // nothing is left to deliver: the close goes at once, not a round trip later.
            try? await connection.finish()
            await connection.closeBeforeLeaving(grace: .zero)
            return summary
        }
    }

    /// Reads Accept, hands the sending task what the receiver wants, then takes the verdicts
    /// until Complete: the summary, less the byte counts (the sending task may still be ending).
    private func receiveVerdicts<Stack: TLVStack>(
        offer: Offer, connection: NetworkConnection<Stack>, acceptance: AsyncStream<[SendUnit]>.Continuation, shared: SendingState
    ) async throws -> TransferSummary {
        let answers = try await receiveAnswers(to: offer, from: connection)
        var ledger = try SenderLedger(entries: offer.entries, algorithm: algorithm, answers: answers)
        do {
            // Scoped: once in units, the jobs are the sending task's alone.
            let jobs = ledger.jobs.map { FileJob(index: $0.index, entry: offer.entries[Int($0.index)], source: tree.sources[Int($0.index)], answer: $0.answer) }
            let present = jobs.count(where: { $0.answer.disposition == .present })
            let holesByEntry = holeBytes(of: jobs)
            shared.holesAtAcceptance.withLock { $0 = holesByEntry }
            let holes = holesByEntry.values.reduce(UInt64(0)) { $0.saturatingAdd($1) }
            progress.report(.accepted(bytes: ledger.bytesToSend.saturatingSubtract(holes), resumed: ledger.resumedBytes,
                                      present: present, skipped: ledger.failures.count, holes: holes))
            for failure in ledger.failures { progress.report(.failed(path: failure.path, error: failure.error)) }
            // Early files start, and count as sent, once the receiver takes them: one answered
            // `present` or `skip` travelled and was dropped (docs/PROTOCOL.md §3.7), and is not
            // counted (what the sender reports as sent is what the receiver took).
            shared.earlyBytes.withLock { early in
                for (entry, count) in early.written.sorted(by: { $0.key < $1.key }) where answers[Int(entry)].disposition == .send {
                    startedEarly(offer.entries[Int(entry)], sent: count)
                }
                early.answers = answers.map { $0.disposition == .send }
                early.written = [:]
            }
            acceptance.yield(Self.units(of: jobs.filter { !$0.entry.flags.contains(.early) }))
            acceptance.finish()
        }

        // The verdicts come back on the control stream while data still flows.
        let entries = offer.entries
        var summary = TransferSummary(
            succeeded: 0, failures: [], transferredBytes: 0, resumedBytes: 0, algorithm: algorithm,
            digests: VerifiedDigests(algorithm: algorithm) { entries[Int($0)].path.joined(separator: "/") })
        while true {
            guard let message = try await connection.receiveMessage() else {
                // The receiver vanished (crashed, killed): a network failure, which a new
                // connection may resume from.
                throw QXferError(.connectionClosed, "the receiver closed the connection before reporting the result")
            }
            switch message {
            case .verified, .failed:
                try record(message, in: &ledger, summary: &summary, shared: shared)
            case .batch(let verdicts):
                for verdict in verdicts { try record(verdict, in: &ledger, summary: &summary, shared: shared) }
            case .complete(let complete):
                summary.succeeded = try ledger.complete(complete)
                summary.failures = ledger.failures
                // An older receiver counts a folder or symlink it could not make without a Failed.
                if complete.failed > summary.failures.count {
                    summary.failures.append(("", TransferError(.io, "the receiver reports \(complete.failed) failed entries")))
                }
                return summary
            case .error(let refusal):
                throw AlreadyCommunicated(error: TransferError(refusal.code, "the receiver: \(refusal.message)"))
            default:
                throw TransferError(.protocolViolation, "the receiver sent \(message.type) during the transfer")
            }
        }
    }

    /// Marks the files sent before Accept (docs/PROTOCOL.md §3.7): small files of known size, in
    /// offer order, while their sizes add up to at most ``ProtocolLimits/maximumEarlyBytes``.
    private func markingEarlyFiles(_ entries: [OfferEntry]) -> [OfferEntry] {
        var budget = ProtocolLimits.maximumEarlyBytes
        return zip(entries, tree.sources).map { entry, source in
            guard entry.kind == .file, !entry.flags.contains(.sizeUnknown), case .file = source,
                  entry.size <= ProtocolLimits.maximumEarlyFileSize, entry.size <= budget else { return entry }
            budget -= entry.size
            var early = entry
            early.flags.insert(.early)
            return early
        }
    }

    /// Sends `units`: on QUIC on parallel lanes, on TCP+TLS one after the other.
    private func send<Stack: TLVStack>(_ units: [SendUnit], over connection: NetworkConnection<Stack>, usesStreams: Bool, shared: SendingState) async throws {
        if usesStreams {
            try await sendInParallel(units, over: connection, shared: shared)
        } else {
            for unit in units { try await send(unit, on: connection, control: connection, shared: shared) }
        }
    }

    /// Records one Verified or Failed (alone or from a Batch); anything else is out of place.
    private func record(_ verdict: Message, in ledger: inout SenderLedger, summary: inout TransferSummary, shared: SendingState) throws {
        switch verdict {
        case .verified(let entry):
            let (path, size) = try ledger.verified(entry)
            // Kept from here on in the summary alone.
            let digest = shared.digests.withLock { $0.removeValue(forKey: entry) } ?? []
            summary.digests.append(entry, digest: digest)
            progress.report(.verified(path: path, size: size, digest: hexString(digest)))
        case .failed(let failure):
            // A file this sender gave up was reported when it did.
            let own = shared.givenUp.withLock { $0.removeValue(forKey: failure.entry) }
            shared.digests.withLock { _ = $0.removeValue(forKey: failure.entry) }
            let (path, error) = try ledger.failed(failure, own: own)
            if own == nil { progress.report(.failed(path: path, error: error)) }
        default:
            throw TransferError(.protocolViolation, "the receiver sent \(verdict.type) among the verdicts")
        }
    }

    /// The holes that will go as Zeros in the files the receiver wants, from where each resumes:
    /// so the "accepted" line, the progress total and its time left count only what travels
    /// from the start. A file that cannot be opened now counts none (its failure comes later).
    private func holeBytes(of jobs: [FileJob]) -> [UInt32: UInt64] {
        var holes: [UInt32: UInt64] = [:]
        for job in jobs where tree.entriesWithHoles.contains(Int(job.index)) && job.answer.disposition == .send {
            guard let file = try? job.open() else { continue }
            holes[job.index] = FileHoles.holeBytes(in: file, from: job.answer.offset, size: job.entry.size)
        }
        return holes
    }

    /// Reads Accept (or Decline).
    private func receiveAnswers<Stack: TLVStack>(to offer: Offer, from connection: NetworkConnection<Stack>) async throws -> [EntryAnswer] {
        let long = offer.flags.contains(.long)
        let count = offer.entries.count
        guard let message = try await connection.receiveMessageInParts() else {
            throw TransferError(.refused, "the receiver closed the connection without answering the offer")
        }
        switch message {
        case .accept(let accept):
            return accept.answers  // checked by SenderLedger
        case .decline(let refusal):
            // A reason that only says "declined" is not quoted: "the receiver declined: the offer was declined".
            let bare = ["", "declined", "the offer was declined"].contains(refusal.message.lowercased())
            throw AlreadyCommunicated(error: TransferError(refusal.code, bare ? "the receiver declined the offer" : "the receiver declined: \(refusal.message)"))
        case .error(let refusal) where long && (refusal.code == .malformed || refusal.code == .unsupported):
            // docs/PROTOCOL.md §3.9, version rule: an older receiver refuses the first part or the flag.
            throw AlreadyCommunicated(error: TransferError(.unsupported, "the receiver runs an older qxfer, which takes an offer of at most 16 MiB (about 135 000 items; this one has \(count)) (it said: \(refusal.message)); update it, or send fewer items at once"))
        case .error(let refusal) where refusal.code == .unsupported && refusal.message.contains("offer flags"):
            // docs/PROTOCOL.md §3.6-3.8, version rules: a receiver from before Batch, early files
            // or Zeros refuses the flags.
            throw AlreadyCommunicated(error: TransferError(.unsupported, "the receiver runs an older qxfer, without batched, early or sparse files (it said: \(refusal.message)); update it"))
        case .error(let refusal):
            throw AlreadyCommunicated(error: TransferError(refusal.code, "the receiver: \(refusal.message)"))
        default:
            throw TransferError(.protocolViolation, "the receiver answered the offer with \(message.type)")
        }
    }

    /// What is sent as one piece: a Batch of small files, or one file alone.
    private enum SendUnit: Sendable {
        case batch([FileJob])
        case single(FileJob)
    }

    /// Groups the small files, in offer order, into Batches of at most ``batchBytes`` bytes
    /// or ``batchFileCount`` files; every other file is a unit of its own.
    private static func units(of jobs: [FileJob]) -> [SendUnit] {
        var units: [SendUnit] = []
        var batch: [FileJob] = []
        var batchSize: UInt64 = 0
        for job in jobs {
            guard job.isSmall else {
                units.append(.single(job))
                continue
            }
            let size = job.answer.disposition == .present ? 0 : job.entry.size
            if !batch.isEmpty, batch.count == batchFileCount || batchSize + size > UInt64(batchBytes) {
                units.append(.batch(batch))
                (batch, batchSize) = ([], 0)
            }
            batch.append(job)
            batchSize += size  // each at most batchedFileLimit, and the sum at most batchBytes
        }
        if !batch.isEmpty { units.append(.batch(batch)) }
        return units
    }

    /// QUIC: up to ``parallelFiles`` senders side by side, each taking the next unit as soon as
    /// it is done with one: Batches on a stream the sender keeps for them, every large file on a
    /// stream of its own.
    private func sendInParallel<Stack: TLVStack>(_ units: [SendUnit], over connection: NetworkConnection<Stack>, shared: SendingState) async throws {
        let next = Locked(0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<min(parallelFiles, units.count) {
                group.addTask {
                    var lane: NetworkConnection<Stack>?
                    while true {
                        let index = next.withLock { value in
                            defer { value += 1 }
                            return value
                        }
                        guard index < units.count else { break }
                        switch units[index] {
                        case .batch:
                            if lane == nil { lane = try await connection.openStream() }
                            try await send(units[index], on: lane!, control: connection, shared: shared)
                        case .single:
                            let stream = try await connection.openStream()
                            try await send(units[index], on: stream, control: connection, shared: shared)
                            try await stream.finish()
                        }
                    }
                    try await lane?.finish()
                }
            }
            try await group.waitForAll()
        }
    }

    /// Sends one unit on `stream`. A file of ours that cannot be read to its end (removed, shrunk,
    /// a read error) fails alone: its Failed goes where its FileDone would (docs/PROTOCOL.md
    /// §3.5). Any other failure of ours ends the transfer: the receiver hears why on `control`
    /// while `stream` is still open (dropped, it is reset, and a receiver that saw the reset first
    /// would take it for a sender gone away).
    private func send<Stack: TLVStack>(_ unit: SendUnit, on stream: NetworkConnection<Stack>, control: NetworkConnection<Stack>, shared: SendingState) async throws {
        do {
            switch unit {
            case .single(let job): try await sendAlone(job, on: stream, shared: shared)
            case .batch(let jobs): try await sendBatch(jobs, on: stream, shared: shared)
            }
        } catch let failure as TransferError {
            shared.localFailure.withLock { $0 = $0 ?? failure }
            await control.sendFinalError(failure)
            throw AlreadyCommunicated(error: failure)
        }
    }

    /// Sends one large file on `stream`, or its Failed if it cannot be read to its end.
    private func sendAlone<Stack: TLVStack>(_ job: FileJob, on stream: NetworkConnection<Stack>, shared: SendingState) async throws {
        var reached = FileProgress(job)
        do {
            try await send(job, on: stream, digests: shared.digests, reached: &reached)
        } catch let failure as TransferError where failure.code == .io {
            try await stream.send(giveUp(job, failure, reached: reached, shared: shared))
        }
    }

    /// Sends small files whole (or, when `present`, only their digest) in one Batch: FileData
    /// and FileDone of each file, one after another; a file that cannot be read, its Failed.
    private func sendBatch<Stack: TLVStack>(_ jobs: [FileJob], on stream: NetworkConnection<Stack>, shared: SendingState) async throws {
        var batch = BatchBody()
        for job in jobs {
            var reached = FileProgress(job)
            do {
                try append(job, to: &batch, shared: shared, reached: &reached)
            } catch let failure as TransferError where failure.code == .io {
                batch.append(giveUp(job, failure, reached: reached, shared: shared))
            }
        }
        try await stream.send(batch)
    }

    /// Reports a file of ours that cannot be read to its end, and takes what of it will not
    /// travel out of the progress total; returns the Failed that ends it for the receiver, whose
    /// answer is then not reported again.
    private func giveUp(_ job: FileJob, _ failure: TransferError, reached: FileProgress, shared: SendingState) -> Message {
        shared.givenUp.withLock { $0[job.index] = failure }
        let unsent = job.entry.flags.contains(.sizeUnknown) ? 0 : job.entry.size.saturatingSubtract(reached.offset)
        let holes = min(unsent, (shared.holesAtAcceptance.withLock { $0[job.index] } ?? 0).saturatingSubtract(reached.zeros))
        progress.forgo(data: unsent - holes, holes: holes)
        progress.report(.failed(path: job.entry.path.joined(separator: "/"), error: failure))
        return .failed(EntryFailure(entry: job.index, code: failure.code, message: failure.message))
    }

    /// Appends one small file to `batch`: whole (or, when `present`, only its digest), FileData
    /// then FileDone. (Untyped `throws`: typed, Swift 6.3.1's AllocBoxToStack pass crashes on it.)
    private func append(_ job: FileJob, to batch: inout BatchBody, shared: SendingState, reached: inout FileProgress) throws {
        let digests = shared.digests
        let path = job.entry.path.joined(separator: "/")
        let file = try job.open()
        let hasher = algorithm.makeHasher()
        let size = job.entry.size
        if job.answer.disposition == .present {
            let hashed = try FileStore.hash(file, upTo: size, into: hasher, shown: path)
            guard hashed == size else { throw Self.changed(path, read: hashed, offered: size) }
        } else {
            let early = job.entry.flags.contains(.early)
            if !early { progress.report(.started(path: path, size: size, offset: 0)) }
            let count = size > 0 ? try batch.appendFileData(entry: job.index, from: file, shown: path, size: Int(size)) : 0  // size <= batchedFileLimit
            // In the Batch, even when a Failed follows.
            if early { countEarly(count, of: job, shared: shared) } else { progress.add(transferred: count) }
            reached.offset = UInt64(count)
            guard count == size else { throw Self.changed(path, read: UInt64(count), offered: size) }
            if size > 0 { batch.withLastPayload { hasher.update($0) } }
            noteIfChanged(file, job, path: path, sent: size)
        }
        let digest = hasher.digest()
        digests.withLock { $0[job.index] = digest }
        batch.append(.fileDone(FileDone(entry: job.index, size: size, algorithm: algorithm, digest: digest)))
    }

    /// An early file put in a Batch with `bytes` of data: started and counted as sent once
    /// Accept says the receiver takes it (at once if Accept came already).
    private func countEarly(_ bytes: Int, of job: FileJob, shared: SendingState) {
        let taken = shared.earlyBytes.withLock { early -> Bool? in
            guard let answers = early.answers else {
                early.written[job.index] = bytes
                return nil
            }
            return answers[Int(job.index)]
        }
        if taken == true { startedEarly(job.entry, sent: bytes) }
    }

    /// Reports an early file the receiver takes as started, its `sent` bytes as sent.
    private func startedEarly(_ entry: OfferEntry, sent: Int) {
        progress.report(.started(path: entry.path.joined(separator: "/"), size: entry.size, offset: 0))
        progress.add(transferred: sent)
    }

    /// Sends one file's FileData from the agreed offset and its FileDone, recording the digest
    /// first (the receiver's Verified can come back before this function returns).
    private func send<Stack: TLVStack>(
        _ job: FileJob, on stream: NetworkConnection<Stack>, digests: Locked<[UInt32: [UInt8]]>, reached: inout FileProgress
    ) async throws {
        let path = job.entry.path.joined(separator: "/")
        let file = try job.open()
        let hasher = algorithm.makeHasher()
        var offset: UInt64 = 0
        let size = job.entry.flags.contains(.sizeUnknown) ? nil : job.entry.size

        if job.answer.disposition == .present {
            // The receiver has a file of this size: send only the digest of ours.
            let hashed = try FileStore.hash(file, upTo: job.entry.size, into: hasher, shown: path)
            guard hashed == job.entry.size else { throw Self.changed(path, read: hashed, offered: job.entry.size) }
        } else {
            if job.answer.offset > 0 {
                // Resume only if our first bytes are the ones the receiver holds.
                let hashed = try FileStore.hash(file, upTo: job.answer.offset, into: hasher, shown: path)
                if hashed == job.answer.offset && hasher.digest() == job.answer.prefixDigest {
                    offset = job.answer.offset
                } else {
                    progress.unresume(job.answer.offset)
                    reached = FileProgress(job.restarted)
                    return try await send(job.restarted, on: stream, digests: digests, reached: &reached)
                }
            }
            progress.report(.started(path: path, size: size, offset: offset))
            // The end of the span being sent as data; a long hole before the next one goes as Zeros.
            var dataEnd = tree.mayHaveHoles && size != nil ? offset : (size ?? .max)
            while size.map({ offset < $0 }) ?? true {
                if let size, offset >= dataEnd {
                    let data = FileHoles.dataSpan(in: file, from: offset, size: size, length: UInt64(ProtocolLimits.maximumChunkSize))
                    while offset < data.lowerBound {
                        let length = min(data.lowerBound - offset, ProtocolLimits.maximumZerosLength)
                        hasher.updateWithZeros(length)
                        try await stream.send(.zeros(Zeros(entry: job.index, offset: offset, length: length)))
                        offset += length
                        progress.add(zeros: length)
                        (reached.offset, reached.zeros) = (offset, reached.zeros + length)
                    }
                    dataEnd = data.upperBound
                    continue
                }
                let want = Int(min(UInt64(ProtocolLimits.maximumChunkSize), min(size ?? .max, dataEnd) - offset))
                // A pipe may stay idle for long: waited on here, where Ctrl-C reaches, not in the read.
                if case .standardInput = job.source { try await ReadableWait.untilReadable(file.fd) }
                let count = try await stream.sendFileData(
                    entry: job.index, offset: offset, from: file, shown: path, capacity: want, sequential: size == nil
                ) { hasher.update($0) }
                if count == 0 {
                    guard let size else { break }
                    throw Self.changed(path, read: offset, offered: size)
                }
                offset += UInt64(count)
                reached.offset = offset
                progress.add(transferred: count)
            }
            noteIfChanged(file, job, path: path, sent: offset)
        }
        let digest = hasher.digest()
        digests.withLock { $0[job.index] = digest }
        try await stream.send(.fileDone(FileDone(entry: job.index, size: size ?? offset, algorithm: algorithm, digest: digest)))
    }
}

extension TransferSender {
    /// Reports a file whose size or modification time, once read, is no longer the scan's:
    /// something wrote to it during the send (a growing log, a download). What was read is
    /// consistent with its digest, so the send goes on; the user is told to send it again.
    private func noteIfChanged(_ file: Descriptor, _ job: FileJob, path: String, sent: UInt64) {
        guard case .file = job.source, !job.entry.flags.contains(.sizeUnknown) else { return }
        var info = stat()
        guard fstat(file.fd, &info) == 0 else { return }
        if UInt64(clamping: info.st_size) != job.entry.size || SourceTree.nanoseconds(info.st_mtim) != job.entry.modificationTime {
            progress.report(.changed(path: path, sent: sent))
        }
    }

    /// A file that ended before the size offered for it: it shrank (or was replaced) since the scan.
    static func changed(_ path: String, read: UInt64, offered: UInt64) -> TransferError {
        TransferError(.io, "'\(path)' shrank while it was being sent (it ended after \(read) of the \(offered) bytes offered); send it again once it no longer changes")
    }
}

/// What the sending lanes share with the task that reads the verdicts.
private struct SendingState: Sendable {
    /// Each file's digest by entry, recorded before its FileDone leaves (its Verified may come
    /// back at once).
    let digests = Locked<[UInt32: [UInt8]]>([:])
    /// The first file of ours that failed, recorded before the receiver is told.
    let localFailure = Locked<TransferError?>(nil)
    /// Files of ours given up (they could not be read to their end), and why, until the
    /// receiver's Failed for each comes back.
    let givenUp = Locked<[UInt32: TransferError]>([:])
    /// The holes counted at acceptance in each file that has some.
    let holesAtAcceptance = Locked<[UInt32: UInt64]>([:])
    /// Early files' bytes, counted as sent only once Accept says the receiver takes them.
    let earlyBytes = Locked(EarlyBytes())
}

/// The bytes of early files put in Batches before Accept, and Accept's answers once it came.
private struct EarlyBytes {
    /// Bytes by entry, sent before the answers were known.
    var written: [UInt32: Int] = [:]
    /// For each entry, whether the receiver takes its data (answered `send`); nil before Accept.
    var answers: [Bool]?
}

/// How far the sending of one file got, for the progress total should it be given up.
private struct FileProgress {
    /// Its bytes before this offset are out of the total: sent, held by the receiver, or
    /// (a file the receiver has) never in it.
    var offset: UInt64
    /// Zeros sent for it so far.
    var zeros: UInt64 = 0

    init(_ job: FileJob) {
        offset = job.answer.disposition == .send ? job.answer.offset : job.entry.size
    }
}

/// One file to send and the receiver's answer for it.
private struct FileJob: Sendable {
    var index: UInt32
    var entry: OfferEntry
    var source: SourceTree.Source
    var answer: EntryAnswer

    /// Whether it goes in a Batch: a file of known size up to the limit, sent whole or only
    /// compared (resumed files are larger than 1 MiB: they have a journal).
    var isSmall: Bool {
        guard entry.kind == .file, !entry.flags.contains(.sizeUnknown), entry.size <= TransferSender.batchedFileLimit, case .file = source else { return false }
        return answer.disposition == .present || (answer.disposition == .send && answer.offset == 0)
    }

    /// The same job from byte 0 (the receiver's resume prefix does not match our file).
    var restarted: FileJob {
        var job = self
        job.answer = .sendAll
        return job
    }

    func open() throws(TransferError) -> Descriptor {
        switch source {
        case .standardInput:
            return Descriptor(STDIN_FILENO, owned: false)
        case .file(let path):
            let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
            // Named as offered: the message may travel to the receiver, which has no business
            // with this machine's folders.
            guard fd >= 0 else { throw TransferError.posix("cannot open", "'\(entry.path.joined(separator: "/"))'", errno: errno) }
            return Descriptor(fd)
        case .none:
            throw TransferError(.internal, "no data source for '\(entry.path.joined(separator: "/"))'")
        }
    }
}
