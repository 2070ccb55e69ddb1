import Foundation
import QXfer

/// An offer as the receiver's user sees it before accepting: who sends what.
public struct IncomingOffer: Sendable {
    /// The sender's certificate fingerprint (nil if it presented none).
    public var sender: Fingerprint?
    /// The entries, all paths already checked.
    public var entries: [OfferEntry]
    /// The digest the sender will use.
    public var algorithm: DigestAlgorithm

    /// The bytes of all files of known size.
    public var totalSize: UInt64 { entries.reduce(0) { $0 + $1.size } }
    /// Whether a file of unknown size (a stream) is included.
    public var hasSizeUnknown: Bool { entries.contains { $0.flags.contains(.sizeUnknown) } }
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
    /// How long the sender has to make its offer after connecting.
    public var offerTimeout: Duration
    /// Counters and events for a progress display.
    public var progress: TransferProgress
    /// Decides whether to accept an offer (asks the user, or applies a policy).
    public var confirm: @Sendable (IncomingOffer) async -> Bool
    /// The targets being received right now, shared by every copy of this receiver (one per
    /// connection), so a sender that reconnects can take over from its stalled connection.
    let registry = ReceptionRegistry()

    public init(
        directory: String, overwrite: Bool = false, maximumEntries: Int = ProtocolLimits.maximumEntries,
        offerTimeout: Duration = .seconds(30), progress: TransferProgress = TransferProgress(),
        confirm: @escaping @Sendable (IncomingOffer) async -> Bool = { _ in true }
    ) {
        self.directory = directory
        self.overwrite = overwrite
        self.maximumEntries = min(maximumEntries, ProtocolLimits.maximumEntries)
        self.offerTimeout = offerTimeout
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

    private func exchange<Stack: TLVStack>(over connection: NetworkConnection<Stack>) async throws -> TransferSummary {
        let store = FileStore(directory: try TargetDirectory(path: directory), overwrite: overwrite)
        let offer = try await receiveOffer(from: connection)
        let incoming = IncomingOffer(sender: connection.peer?.fingerprint, entries: offer.entries, algorithm: offer.algorithm)
        progress.report(.offered(entries: offer.entries.count, bytes: incoming.totalSize, sizeUnknown: incoming.hasSizeUnknown))

        // Claimed before planning: the resume offsets are read once an older, superseded
        // transfer of the same files has checkpointed and let go of them.
        let registration = registry.register(sender: connection.peer?.fingerprint)
        defer { registry.leave(registration) }
        let paths: [SafePath]
        var plans: [Plan]
        do {
            paths = try check(offer)
            let files = zip(offer.entries, paths).filter { $0.0.kind == .file }.map { directory + "\u{0}" + $0.1.description }
            await registry.claim(files, for: registration)
            plans = try plan(offer, paths: paths, store: store)
        } catch {
            try await decline(error, on: connection)
        }
        guard await confirm(incoming) else {
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
        let answers = plans.map(\.answer)
        session.expect(plans)
        try await connection.send(.accept(Accept(answers: answers)))
        progress.report(.accepted(
            bytes: session.bytesToReceive, resumed: session.resumedBytes,
            present: plans.count(where: { if case .present = $0 { true } else { false } }),
            skipped: plans.count(where: { if case .skip = $0 { true } else { false } })))

        let usesStreams = connection.parameters.stack.transport.hasIndependentStreams
        let funnel = InboundFunnel()
        var inbound = funnel.makeIterator()
        let superseded = Locked(false)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await funnel.pump(.control) { try await connection.receiveMessage() } }
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
                                streams.addTask { await funnel.pump(source) { try await stream.receiveMessage() } }
                            }
                        } catch {
                            // The connection ended; the control stream's reader reports why.
                        }
                    }
                }
            }
            do {
                while !session.isFinished {
                    guard let delivery = await inbound.next() else { break }
                    defer { delivery.handled.resume() }
                    if let reply = try session.handle(delivery.event, from: delivery.source, usesStreams: usesStreams) {
                        try await connection.send(reply)
                    }
                }
                let complete = try session.finishTree()
                try await connection.send(.complete(complete))
                await waitForSenderToClose(&inbound, connection: connection)
                await close(funnel, &inbound, group: &group, connection: connection, session: &session, registration: registration)
                return session.summary
            } catch {
                // Partials checkpointed and closed first: a newer transfer may be waiting for them.
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
        registration: ReceptionRegistry.Registration
    ) async {
        session.abandonOpenFiles()
        registry.release(registration)
        group.cancelAll()
        connection.cancel()
        await funnel.close(draining: &inbound)
    }

    /// After Complete the sender closes; anything else it sends now is ignored. A sender that
    /// does not close within a few seconds is cut off.
    private func waitForSenderToClose<Stack: TLVStack>(
        _ inbound: inout AsyncStream<InboundFunnel.Delivery>.AsyncIterator, connection: NetworkConnection<Stack>
    ) async {
        let cutOff = Task {
            try await Task.sleep(for: .seconds(5))
            connection.cancel()
        }
        defer { cutOff.cancel() }
        while let delivery = await inbound.next() {
            delivery.handled.resume()
            switch (delivery.source, delivery.event) {
            case (.control, .ended), (.control, .failed): return
            default: continue
            }
        }
    }

    private func receiveOffer<Stack: TLVStack>(from connection: NetworkConnection<Stack>) async throws -> Offer {
        let timeout = offerTimeout
        let message = try await withThrowingTaskGroup(of: Message?.self) { group in
            group.addTask { try await connection.receiveMessage() }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw TransferError(.protocolViolation, "the sender made no offer within \(timeout)")
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
        try? await connection.send(.decline(Refusal(error)))
        try? await connection.finish()
        throw AlreadyCommunicated(error: error)
    }

    /// Every path safe, no duplicates, nothing under a non-directory of the same offer,
    /// fields consistent with the kind. One bad entry refuses the whole offer.
    private func check(_ offer: Offer) throws(TransferError) -> [SafePath] {
        guard offer.entries.count <= maximumEntries else {
            throw TransferError(.limitExceeded, "\(offer.entries.count) entries offered; this receiver accepts at most \(maximumEntries)")
        }
        var kinds: [SafePath: EntryKind] = [:]
        var paths: [SafePath] = []
        paths.reserveCapacity(offer.entries.count)
        for entry in offer.entries {
            let path = try SafePath(validating: entry.path)
            guard kinds[path] == nil else { throw TransferError(.unsafePath, "'\(path)' is offered twice") }
            for depth in 1..<path.components.count {
                if let kind = kinds[try SafePath(validating: Array(path.components[0..<depth]))], kind != .directory {
                    throw TransferError(.unsafePath, "'\(path)' is offered inside '\(path.components[0..<depth].joined(separator: "/"))', which is not a directory")
                }
            }
            switch entry.kind {
            case .symlink:
                try path.validateLinkTarget(entry.linkTarget)
            case .directory, .file:
                guard entry.linkTarget.isEmpty else { throw TransferError(.malformed, "'\(path)' is not a symlink but has a link target") }
            }
            guard entry.kind == .file || entry.size == 0, !entry.flags.contains(.sizeUnknown) || (entry.kind == .file && entry.size == 0) else {
                throw TransferError(.malformed, "'\(path)' has a size that does not fit its kind")
            }
            kinds[path] = entry.kind
            paths.append(path)
        }
        return paths
    }

    /// What to do with each entry given what is on disk; checks the free space.
    private func plan(_ offer: Offer, paths: [SafePath], store: FileStore) throws(TransferError) -> [Plan] {
        var plans: [Plan] = []
        var needed: UInt64 = 0
        for (entry, path) in zip(offer.entries, paths) {
            let state = try store.directory.state(of: path)
            switch entry.kind {
            case .directory:
                plans.append(state == .absent || state == .directory ? .directory : .skip(TransferError(.exists, "'\(path)' exists and is not a directory")))
            case .symlink:
                plans.append(state == .absent || state == .symlink ? .symlink : .skip(TransferError(.exists, "'\(path)' exists and is not a symlink")))
            case .file:
                let size: UInt64? = entry.flags.contains(.sizeUnknown) ? nil : entry.size
                let target = FileTarget(path: path, size: size, mode: entry.mode, modificationTime: entry.modificationTime, algorithm: offer.algorithm)
                let replaceable = if case .regularFile = state { overwrite } else { false }
                switch state {
                case .regularFile(let existing) where size == existing && !overwrite:
                    plans.append(.present(target, digest: try store.digestOfExisting(target)))
                case _ where state == .absent || replaceable:
                    let resume = try store.resumeOffset(for: target)
                    needed += (size ?? 0) - resume.offset
                    plans.append(.receive(target, resume))
                case .regularFile:
                    plans.append(.skip(TransferError(.exists, "'\(path)' exists with another size; not overwriting it")))
                default:
                    plans.append(.skip(TransferError(.exists, "'\(path)' exists and is not a regular file")))
                }
            }
        }
        try store.checkFreeSpace(for: needed)
        return plans
    }
}

/// A transfer that stopped because a newer connection of the same sender took over its files
/// (docs/PROTOCOL.md §6): not a failure of the transfer, which goes on in the new connection.
public struct TransferSuperseded: Error, CustomStringConvertible, Sendable {
    /// One line for a person.
    public let message: String
    public var description: String { message }
}

/// What the receiver does with one entry.
enum Plan {
    case directory
    case symlink
    case receive(FileTarget, ResumePoint)
    case present(FileTarget, digest: [UInt8])
    case skip(TransferError)

    var answer: EntryAnswer {
        switch self {
        case .directory, .symlink: .sendAll
        case .receive(_, let resume): EntryAnswer(disposition: .send, offset: resume.offset, prefixDigest: resume.prefixDigest)
        case .present(_, let digest): EntryAnswer(disposition: .present, prefixDigest: digest)
        case .skip(let error): EntryAnswer(disposition: .skip, code: error.code.rawValue)
        }
    }
}
