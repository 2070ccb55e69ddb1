import FoundationEssentials
import Glibc
import QXfer
internal import LinuxSystem

/// An offer as the receiver's user sees it before accepting: who sends what.
public struct IncomingOffer: Sendable {
    /// The sender's certificate fingerprint (nil if it presented none).
    public var sender: Fingerprint?
    /// The entries, all paths already checked.
    public var entries: [OfferEntry]
    /// The digest the sender will use.
    public var algorithm: DigestAlgorithm

    /// The bytes of all files of known size (UInt64.max when they add up to more: such an
    /// offer is declined).
    public var totalSize: UInt64 { OfferPlanner.totalSize(of: entries) ?? .max }
    /// How many files are of unknown size (standard input, kernel files), read to their end.
    public var filesOfUnknownSize: Int { entries.count(where: { $0.flags.contains(.sizeUnknown) }) }
    /// How many files.
    public var fileCount: Int { entries.count(where: { $0.kind == .file }) }
}

/// The receiving side of qxfer/1 (docs/PROTOCOL.md) over any `TLV { TLS() }` or
/// `TLV { QUIC() }` connection: checks every name of the offer, asks whether to accept,
/// answers with resume offsets, writes each file to a partial beside its target while hashing
/// it, and gives it its final name only once the sender's digest matches.
public struct TransferReceiver: Sendable {
    /// The folder files are received into.
    public var directory: String
    /// Whether a verified file may replace an existing one of another size.
    public var overwrite: Bool
    /// The most entries accepted in one offer.
    public var maximumEntries: Int
    /// How long the sender has to make its offer after connecting, and the longest silence
    /// between the parts of an Offer in parts; the whole Offer must also be in by this plus 1 s
    /// per ``minimumRate`` bytes of it, however its parts are spaced (docs/PROTOCOL.md §1,
    /// "Timeouts").
    public var offerTimeout: Duration
    /// How long a message the receiver sends on the control stream (Accept, Decline, verdicts,
    /// Complete) may take to leave, plus 1 s per ``minimumRate`` bytes of it: a sender that
    /// reads it slower is cut off and what it claimed is let go (docs/PROTOCOL.md §1).
    public var sendTimeout: Duration = .seconds(10)
    /// The slowest average rate, in bytes per second, at which a sender may deliver its Offer
    /// or take what the receiver sends, beyond ``offerTimeout`` and ``sendTimeout`` (128 KiB/s,
    /// 1 Mbit/s).
    public var minimumRate: Int = 128 << 10
    /// How long an accepted transfer waits for the sender's next message before it ends with
    /// an error and lets go of its partial files (docs/PROTOCOL.md §1, "Timeouts"). Only the
    /// time the receiver waits for the sender counts, not time it holds the sender's messages.
    /// From the Accept on, the sender must also deliver ``minimumDataRate`` bytes a second of
    /// that time on average beyond ``sendTimeout`` (and the time to hash what it resumes), until
    /// the files' bytes are in; a sender that falls behind by more than a second's worth may be
    /// cut off at once to make room for another sender's offer (docs/PROTOCOL.md §4).
    public var idleTimeout: Duration
    /// The slowest average rate, in bytes per second, at which an accepted sender may deliver
    /// its files' bytes (16 KiB/s, 128 kbit/s): far below any link a transfer is worth making
    /// on, far above a drip. A transfer with a file of unknown size (standard input, paced by
    /// whatever feeds it) is held to it only when another sender's offer needs its memory.
    public var minimumDataRate: Int = 16 << 10
    /// Counters and events for a progress display.
    public var progress: TransferProgress
    /// Decides whether to accept an offer (asks the user, or applies a policy): true accepts,
    /// false declines, and a thrown ``TransferError`` declines with its code and message, which
    /// the sender is shown ("the receiver declined: …").
    public var confirm: @Sendable (IncomingOffer) async throws -> Bool
    /// Waits for a failure of the receiver's own that ends an accepted transfer although its
    /// file writes go well (`recv --stdout` once its reader went away), and returns it; nil
    /// for none (the default, at once). Waited for from the acceptance on, and cancelled when
    /// the transfer ends first. The sender is told with an Error (docs/PROTOCOL.md §3.5) and
    /// the partials are kept, as after a failed write.
    public var localFailure: @Sendable () async -> TransferError? = { nil }
    /// Waits, once every file is answered and durable and before Complete goes, for what must
    /// also be done before the sender may count the transfer a success (`recv --stdout`: the
    /// file written to the pipe in full). Returns nil to go on, or the failure that ends the
    /// transfer instead: the sender gets an Error with it, as for ``localFailure``. Nothing
    /// bounds the wait: the sender waits as long (its connection kept alive).
    public var beforeComplete: @Sendable () async -> TransferError? = { nil }
    /// The targets being received right now, shared by every copy of this receiver (one per
    /// connection), so a sender that reconnects can take over from its stalled connection.
    let registry = ReceptionRegistry()
    /// The memory the offers of all connections may take at once, shared by every copy of
    /// this receiver as the registry is.
    var offerMemory = OfferMemory()

    public init(
        directory: String, overwrite: Bool = false, maximumEntries: Int = ProtocolLimits.maximumEntries,
        offerTimeout: Duration = .seconds(30), idleTimeout: Duration = .seconds(60), progress: TransferProgress = TransferProgress(),
        confirm: @escaping @Sendable (IncomingOffer) async throws -> Bool = { _ in true }
    ) {
        self.directory = directory
        self.overwrite = overwrite
        self.maximumEntries = min(maximumEntries, ProtocolLimits.maximumEntries)
        self.offerTimeout = offerTimeout
        self.idleTimeout = idleTimeout
        self.progress = progress
        self.confirm = confirm
    }

    /// Receives one transfer on `connection` and returns how it ended. Throws
    /// ``TransferError`` when the offer is refused or either side fails (the partials of
    /// unfinished files are kept for a later resume), and the connection's `QXferError` when
    /// the network does.
    public func run<Stack: TLVStack>(over connection: NetworkConnection<Stack>) async throws -> TransferSummary {
        try await connection.endingOnError { try await exchange(over: connection) }
    }

    /// How long a data stream's reset waits for the sender's reason on the control stream
    /// (the sender gives its Error up to 2 s to leave before it closes).
    static let reasonGrace: Duration = .seconds(3)

    private func exchange<Stack: TLVStack>(over connection: NetworkConnection<Stack>) async throws -> TransferSummary {
        let store = FileStore(directory: try TargetDirectory(path: directory), overwrite: overwrite)
        // Held until this transfer ends: what the offer became is held as long.
        let reservation = offerMemory.reservation()
        defer { reservation.release() }
        let offer: Offer
        do {
            offer = try await receiveOffer(from: connection, reservation: reservation)
        } catch let error as OfferNotHeld {
            try await decline(error.reason, on: connection)
        }
        let incoming = IncomingOffer(sender: connection.peer?.fingerprint, entries: offer.entries, algorithm: offer.algorithm)
        progress.report(.offered(entries: offer.entries.count, bytes: incoming.totalSize, sizeUnknown: incoming.filesOfUnknownSize))

        // Claimed before planning: the resume offsets are read once an older, superseded
        // transfer of the same files has checkpointed and let go of them.
        let registration = registry.register(sender: connection.peer?.fingerprint)
        defer { registry.leave(registration) }
        let paths: [SafePath]
        var plans: [Plan]
        do {
            let planner = OfferPlanner(maximumEntries: maximumEntries, overwrite: overwrite)
            paths = try planner.check(offer)
            let files = offer.entries.indices.filter { offer.entries[$0].kind == .file }
            let targets = files.map { directory + "\u{0}" + paths[$0].description }
            // Another sender's transfer holds these now: answered busy, so nothing of them is
            // sent only to be refused by the partial's lock (docs/PROTOCOL.md §6).
            let contested = Set(await registry.claim(targets, for: registration).map(ExactString.init))
            let heldElsewhere = Set(zip(files, targets).filter { contested.contains(ExactString($0.1)) }.map(\.0))
            plans = try planner.plan(offer, paths: paths, store: store, heldElsewhere: heldElsewhere)
            try OfferPlanner.checkAnswersFit(plans.lazy.map(\.answer), to: offer)
        } catch {
            try await decline(error, on: connection)
        }
        let accepted: Bool
        do { accepted = try await confirm(incoming) } catch { try await decline(error, on: connection) }
        guard accepted else {
            try await decline(TransferError(.refused, "the offer was declined"), on: connection)
        }

        // Directories exist before anything goes into them; their modes and times come last.
        var session = ReceivingSession(offer: offer, paths: paths, store: store, progress: progress)
        for (index, plan) in plans.enumerated() {
            guard case .directory = plan else { continue }
            do {
                try store.directory.createDirectory(paths[index])
            } catch {
                plans[index] = .skip(error)
            }
        }
        session.expect(plans)
        // Bounded: a sender reading a large Accept slowly would hold the claims taken above.
        try await connection.send(.accept(Accept(answers: plans.map(\.answer))), within: sendPace)
        progress.report(.accepted(
            bytes: session.bytesToReceive, resumed: session.resumedBytes,
            present: plans.count(where: { if case .present = $0 { true } else { false } }),
            skipped: plans.count(where: { if case .skip = $0 { true } else { false } }), holes: 0))
        plans = []  // the session holds what is left to do; a large offer's plans were ~100 bytes an entry

        let usesStreams = try await connection.hasIndependentStreams
        let funnel = InboundFunnel()
        var inbound = funnel.makeIterator()
        let superseded = Locked(false)
        let clock = SenderClock(
            idle: idleTimeout, pace: PeerPace(allowance: sendTimeout, bytesPerSecond: minimumDataRate), framePace: sendPace,
            expected: incoming.filesOfUnknownSize > 0 ? nil : session.bytesToReceive,
            hashingAllowance: session.hashingAllowance)
        let (evictions, evict) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        reservation.yieldable(shortfall: { [sendTimeout] in clock.shortfall(grace: .seconds(1) - sendTimeout) }) {
            evict.yield()
        }
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await funnel.pump(.control, handled: clock.handedBack) { try await connection.receiveMessage(arrived: clock.arrived) } }
            group.addTask { [minimumDataRate] in
                let unfinished = "with files unfinished; their partials are kept for resuming"
                switch await clock.waitForExpiry(transportBytes: { await connection.metrics.bytesReceived }) {
                case nil: return
                case .silent(let silence)?:
                    await funnel.interrupt(with: TransferError(.cancelled, "the sender sent nothing for \(silence.components.seconds) s \(unfinished)"))
                case .tooSlow(let bytes, let waited)?:
                    await funnel.interrupt(with: TransferError(
                        .cancelled,
                        "the sender delivered \(bytes) bytes in \(waited.shownInSeconds) since the Accept, slower than \(clock.pace.rateDescription) (\(minimumDataRate) B/s beyond \(clock.pace.allowance.shownInSeconds)), \(unfinished)"))
                }
            }
            group.addTask {
                for await _ in evictions {
                    let (bytes, waited) = clock.standing
                    await funnel.interrupt(with: TransferError(
                        .cancelled,
                        "cut off to make room for another sender's offer: this sender delivered \(bytes) bytes in \(waited.shownInSeconds), slower than \(clock.pace.rateDescription); its partials are kept for resuming"))
                    return
                }
            }
            group.addTask { [localFailure] in
                guard let failure = await localFailure() else { return }
                await funnel.interrupt(with: failure)
            }
            group.addTask {
                for await _ in registration.superseded {
                    superseded.withLock { $0 = true }
                    await stop(funnel, connection: connection)
                    return
                }
            }
            if usesStreams {
                group.addTask {
                    await withDiscardingTaskGroup { streams in
                        var number = 0
                        do {
                            for try await stream in connection.incomingStreams {
                                number += 1
                                let source = InboundFunnel.Source.data(number)
                                streams.addTask { await funnel.pump(source, handled: clock.handedBack) { try await stream.receiveMessage(arrived: clock.arrived) } }
                            }
                        } catch {
                            // The connection ended; the control stream's reader reports why.
                        }
                    }
                }
            }
            // Verified files are committed (fsync, rename) beside this loop, one group at a time,
            // while it goes on reading; their outcomes come back through the funnel. Each holds
            // a descriptor until then: past the budget, what the streams bring is held back (so
            // they stop reading, and the sender slows down) until a commit has let files go.
            var commit: Task<[CommitOutcome], Never>?
            var heldBack: [InboundFunnel.Delivery] = []
            let committingBudget = Self.committingBudget()
            var waitsForReason = false
            do {
                while !session.isFinished {
                    let mustWait = commit != nil && session.filesAwaitingCommit >= committingBudget
                    let delivery: InboundFunnel.Delivery
                    if !mustWait, !heldBack.isEmpty {
                        delivery = heldBack.removeFirst()
                    } else {
                        guard let next = await inbound.next() else { break }
                        if mustWait, next.source != .committer {
                            heldBack.append(next)
                            continue
                        }
                        delivery = next
                    }
                    defer { delivery.handled.resume() }
                    if case .committed = delivery.event { commit = nil }
                    try await send(session.handle(delivery.event, from: delivery.source, usesStreams: usesStreams), on: connection, batching: session.usesBatches)
                    if !waitsForReason, let lost = session.lostDataStream {
                        // A data stream reset: the control stream says why within the grace, or
                        // the reset is the reason.
                        waitsForReason = true
                        group.addTask {
                            guard (try? await Task.sleep(for: Self.reasonGrace)) != nil else { return }
                            await funnel.interrupt(with: lost)
                        }
                    }
                    if commit == nil, let files = session.takeCommitGroup() {
                        let task = Task { await FileCommitter.commitInBackground(files) }
                        commit = task
                        group.addTask { await funnel.post(committed: await task.value) }
                    }
                    // Time spent committing is the receiver's, not the sender's silence.
                    clock.update(committing: commit != nil, zeros: session.summary.zeroBytes, hashingAllowance: session.hashingAllowance)
                    // A Batch is up to 4096 messages of work: other connections' turn now.
                    if case .message(.batch) = delivery.event { await Task.yield() }
                }
                clock.stop()
                release(&heldBack)
                if let failure = await beforeComplete() { throw failure }
                let replies = try session.finishTree()
                do {
                    for reply in replies { try await connection.send(reply, within: sendPace) }
                } catch is QXferError {
                    // Every file is verified and durable and the tree is done: a sender gone
                    // before it heard Complete (interrupted while beforeComplete held it back)
                    // takes nothing from this side, as over TCP, whose kernel takes the last
                    // send without a word. Its next send finds every file present.
                    var summary = session.summary
                    summary.senderLeftBeforeComplete = true
                    await close(funnel, &inbound, group: &group, connection: connection, session: &session, registration: registration, grace: .zero)
                    return summary
                }
                let senderClosed = await waitForSenderToClose(&inbound, connection: connection)
                // A sender that closed had Complete: nothing more needs delivering to it.
                await close(
                    funnel, &inbound, group: &group, connection: connection, session: &session, registration: registration,
                    grace: senderClosed ? .zero : .seconds(3))
                return session.summary
            } catch {
                // Partials checkpointed and closed first: a newer transfer may be waiting for them.
                // The files being committed are the committer's until it is done with them.
                _ = await commit?.value
                release(&heldBack)
                session.abandonOpenFiles()
                registry.release(registration)
                if let error = error as? TransferError {
                    await connection.sendFinalError(error)
                    await close(funnel, &inbound, group: &group, connection: connection, session: &session, registration: registration)
                    if superseded.withLock({ $0 }) { throw TransferSuperseded(message: error.message) }
                    throw AlreadyCommunicated(error: error)
                }
                await close(funnel, &inbound, group: &group, connection: connection, session: &session, registration: registration)
                if superseded.withLock({ $0 }) { throw TransferSuperseded(message: "\(error)") }
                throw error
            }
        }
    }

    /// The bound on each message sent on the control stream.
    var sendPace: PeerPace { PeerPace(allowance: sendTimeout, bytesPerSecond: minimumRate) }

    /// The most verified files that wait for the committer, holding their partials open: half
    /// of the descriptors this process may open beyond those its streams' files (up to 128 at
    /// once), the folders it keeps open and the network take; at least 16.
    static func committingBudget() -> Int { max(16, (Int(clamping: OpenFileLimit.current) - 256) / 2) }

    /// Lets the streams whose messages were held back go on (their messages unread: the
    /// transfer ended, or they come after its end).
    private func release(_ heldBack: inout [InboundFunnel.Delivery]) {
        for delivery in heldBack { delivery.handled.resume() }
        heldBack.removeAll()
    }

    /// Sends the verdicts of one step: in Batches when the offer allows them, else one by one.
    private func send<Stack: TLVStack>(_ replies: [Message], on connection: NetworkConnection<Stack>, batching: Bool) async throws {
        guard batching, replies.count > 1 else {
            for reply in replies { try await connection.send(reply, within: sendPace) }
            return
        }
        // A Batch of at most a commit group's verdicts stays far below the 16 MiB frame limit.
        var start = 0
        while start < replies.count {
            let end = min(start + ReceivingSession.maximumCommitGroup, replies.count)
            try await connection.send(.batch(Array(replies[start..<end])), within: sendPace)
            start = end
        }
    }

    /// Superseded: the transfer loop learns it like a lost connection (it tells the peer,
    /// which therefore does not reconnect in turn, and keeps the partials). If the loop cannot
    /// take it within a few seconds (blocked sending on a stalled connection), the connection
    /// is cancelled, which unblocks it.
    private func stop<Stack: TLVStack>(_ funnel: InboundFunnel, connection: NetworkConnection<Stack>) async {
        let takenOver = TransferError(.cancelled, "a new connection from the same sender took over this transfer")
        await withTaskGroup(of: Bool.self) { race in
            race.addTask { await funnel.interrupt(with: takenOver); return true }
            race.addTask {
                try? await Task.sleep(for: .seconds(3))
                return false
            }
            if await race.next() == false { connection.cancel() }
            race.cancelAll()
        }
    }

    private func close<Stack: TLVStack>(
        _ funnel: InboundFunnel, _ inbound: inout AsyncStream<InboundFunnel.Delivery>.AsyncIterator,
        group: inout ThrowingTaskGroup<Void, any Error>, connection: NetworkConnection<Stack>, session: inout ReceivingSession,
        registration: ReceptionRegistry.Registration, grace: Duration = .seconds(3)
    ) async {
        session.abandonOpenFiles()
        registry.release(registration)
        group.cancelAll()
        await connection.closeBeforeLeaving(grace: grace)
        await funnel.close(draining: &inbound)
    }

    /// After Complete the sender closes; anything else it sends now is ignored. A sender that
    /// does not close within a few seconds is cut off. Returns whether the sender closed.
    private func waitForSenderToClose<Stack: TLVStack>(
        _ inbound: inout AsyncStream<InboundFunnel.Delivery>.AsyncIterator, connection: NetworkConnection<Stack>
    ) async -> Bool {
        let cutOff = Task {
            try await Task.sleep(for: .seconds(5))
            connection.cancel()
        }
        defer { cutOff.cancel() }
        while let delivery = await inbound.next() {
            delivery.handled.resume()
            switch (delivery.source, delivery.event) {
            case (.control, .ended), (.control, .failed):
                cutOff.cancel()
                return (try? await cutOff.value) == nil
            default: continue
            }
        }
        return false
    }

    private func receiveOffer<Stack: TLVStack>(
        from connection: NetworkConnection<Stack>, reservation: OfferMemory.Reservation
    ) async throws -> Offer {
        let timeout = offerTimeout
        // The silence is counted again from each part of an Offer in parts, which may take long
        // on a slow path; the whole Offer's deadline is not, so a drip of parts cannot hold the
        // connection.
        let deadline = ArrivalDeadline(silence: timeout, pace: PeerPace(allowance: timeout, bytesPerSecond: minimumRate))
        let message = try await withThrowingTaskGroup(of: Message?.self) { group in
            group.addTask {
                defer { deadline.stop() }
                return try await connection.receiveMessageInParts(arrived: deadline.arrived) { bytes in
                    do throws(TransferError) { try reservation.add(offerBytes: bytes) } catch { throw OfferNotHeld(reason: error) }
                }
            }
            group.addTask {
                switch await deadline.waitForExpiry() {
                case nil: throw CancellationError()
                case .silent(_, bytes: 0)?:
                    throw TransferError(.protocolViolation, "the sender made no offer within \(timeout.shownInSeconds)")
                case .silent(let silence, _)?:
                    throw TransferError(.protocolViolation, "the sender made no offer: it was silent for \(silence.shownInSeconds) between its parts")
                case .tooSlow(let bytes, let elapsed)?:
                    throw TransferError(.protocolViolation, "the sender made no offer within \(elapsed.shownInSeconds): \(bytes) bytes of one arrived, slower than \(deadline.pace.rateDescription)")
                }
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
        switch message {
        case .offer(let offer): return offer
        case .error(let refusal): throw AlreadyCommunicated(error: TransferError(refusal.code, "the sender: \(refusal.message)"))
        case nil: throw TransferError(.cancelled, "the sender closed the connection without an offer")
        case let other?: throw TransferError(.protocolViolation, "the sender began with \(other.type) instead of an offer")
        }
    }

    private func decline<Stack: TLVStack>(_ error: any Error, on connection: NetworkConnection<Stack>) async throws -> Never {
        let error = error as? TransferError ?? TransferError(.internal, "\(error)")
        try? await connection.send(.decline(Refusal(error)), within: sendPace)
        try? await connection.finish()
        throw AlreadyCommunicated(error: error)
    }
}

/// An offer this receiver has no memory to hold: declined with `reason` once it has arrived.
private struct OfferNotHeld: Error {
    let reason: TransferError
}

/// A transfer that stopped because a newer connection of the same sender took over its files
/// (docs/PROTOCOL.md §6): not a failure of the transfer, which goes on in the new connection.
public struct TransferSuperseded: Error, CustomStringConvertible, Sendable {
    /// One line for a person.
    public let message: String
    public var description: String { message }
}
