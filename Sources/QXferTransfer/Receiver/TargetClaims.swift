import QXfer
internal import LinuxSystem

/// Which transfer is receiving which target, and the rule for a new transfer that wants a
/// target another one holds (docs/PROTOCOL.md §6, "A sender that reconnects").
///
/// Sans-IO: it only decides. ``ReceptionRegistry`` carries the decisions out (tells the
/// superseded transfers to stop, waits until they have released their targets).
///
/// The rule: a target is held by at most one transfer. A new transfer from the **same sender
/// identity** (certificate fingerprint) supersedes the holder: that sender has evidently given
/// up on the old connection (it reconnected after a network failure while the old connection,
/// stalled, still looks alive here). A transfer from another sender, or from a sender that
/// presented no certificate, supersedes nobody: its claim on that target is not granted, and
/// the partial's lock refuses it with `exists` as before.
struct TargetClaimTable {
    /// A transfer, numbered by the registry.
    typealias Holder = Int

    /// What a claim leads to.
    enum Decision: Equatable {
        /// The claimant holds every target it asked for except `contested` (held by
        /// transfers of other senders, which it may not take over).
        case granted(contested: [String])
        /// Earlier transfers of the same sender hold some of the targets: they must stop and
        /// release everything before the claimant asks again.
        case supersede([Holder])
    }

    /// By target, byte for byte (two names Unicode takes for one are two files). The sender
    /// is kept per holder, not per target: a target costs a name and a number.
    private var owners: [ExactString: Holder] = [:]
    private var held: [Holder: [String]] = [:]
    private var senders: [Holder: Fingerprint] = [:]
    /// Transfers told to stop: they never hold anything again.
    private var superseded: Set<Holder> = []

    /// The holder of `target`, if any.
    func holder(of target: String) -> Holder? { owners[ExactString(target)] }

    /// `holder` (a transfer from `sender`) asks for `targets`.
    mutating func claim(_ targets: [String], for holder: Holder, sender: Fingerprint?) -> Decision {
        guard !superseded.contains(holder) else { return .granted(contested: targets) }
        var toSupersede: [Holder] = []
        for target in targets {
            guard let owner = owners[ExactString(target)], owner != holder else { continue }
            if let sender, senders[owner] == sender, !toSupersede.contains(owner) {
                toSupersede.append(owner)
            }
        }
        if !toSupersede.isEmpty {
            superseded.formUnion(toSupersede)
            return .supersede(toSupersede.sorted())
        }
        var contested: [String] = []
        // Grown once, not doubled while a large offer's targets go in (both tables alive then).
        owners.reserveCapacity(owners.count + targets.count)
        if let sender { senders[holder] = sender }
        for target in targets {
            if let owner = owners[ExactString(target)] {
                if owner != holder { contested.append(target) }
                continue
            }
            owners[ExactString(target)] = holder
            held[holder, default: []].append(target)
        }
        return .granted(contested: contested)
    }

    /// `holder` ended (or stopped writing): its targets are free.
    mutating func release(_ holder: Holder) {
        for target in held.removeValue(forKey: holder) ?? [] where owners[ExactString(target)] == holder {
            owners[ExactString(target)] = nil
        }
        senders[holder] = nil
    }

    /// Whether `holder` still holds a target.
    func isHolding(_ holder: Holder) -> Bool { held[holder] != nil }
}

/// The targets being received by the transfers of one receiver (every connection, both
/// stacks), shared by the copies of a ``TransferReceiver``. Applies ``TargetClaimTable``'s
/// decisions: a superseded transfer is told through its ``Registration/superseded`` signal,
/// and the claimant waits until it has checkpointed and closed its partials.
final class ReceptionRegistry: Sendable {
    private struct State {
        var table = TargetClaimTable()
        var nextHolder = 0
        var signals: [TargetClaimTable.Holder: AsyncStream<Void>.Continuation] = [:]
        var releaseWaiters: [TargetClaimTable.Holder: [CheckedContinuation<Void, Never>]] = [:]
        var active: Set<TargetClaimTable.Holder> = []
    }

    /// One transfer's place in the registry.
    struct Registration: Sendable {
        let holder: TargetClaimTable.Holder
        let sender: Fingerprint?
        /// Yields once if a newer transfer of the same sender takes over.
        let superseded: AsyncStream<Void>
    }

    private let state = Locked(State())

    /// Enters a new transfer from `sender`.
    func register(sender: Fingerprint?) -> Registration {
        let (signal, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let holder = state.withLock { state in
            state.nextHolder += 1
            state.signals[state.nextHolder] = continuation
            state.active.insert(state.nextHolder)
            return state.nextHolder
        }
        return Registration(holder: holder, sender: sender, superseded: signal)
    }

    /// Claims `targets` for `registration`, first stopping the transfers of the same sender
    /// that hold any of them and waiting until they have released them. Returns the targets
    /// held by other senders' transfers (not taken over).
    @discardableResult
    func claim(_ targets: [String], for registration: Registration) async -> [String] {
        while true {
            let decision = state.withLock { $0.table.claim(targets, for: registration.holder, sender: registration.sender) }
            switch decision {
            case .granted(let contested):
                return contested
            case .supersede(let holders):
                for holder in holders {
                    _ = state.withLock { $0.signals[holder] }?.yield()
                }
                for holder in holders { await released(holder) }
            }
        }
    }

    /// Waits until `holder` has released its targets (or ended).
    private func released(_ holder: TargetClaimTable.Holder) async {
        await withCheckedContinuation { waiter in
            let done = state.withLock { state -> Bool in
                guard state.active.contains(holder), state.table.isHolding(holder) else { return true }
                state.releaseWaiters[holder, default: []].append(waiter)
                return false
            }
            if done { waiter.resume() }
        }
    }

    /// The transfer's files are closed (checkpointed) or it ended: its targets are free.
    /// Idempotent.
    func release(_ registration: Registration) {
        let waiters = state.withLock { state in
            state.table.release(registration.holder)
            return state.releaseWaiters.removeValue(forKey: registration.holder) ?? []
        }
        for waiter in waiters { waiter.resume() }
    }

    /// The transfer is over: releases its targets and forgets it.
    func leave(_ registration: Registration) {
        release(registration)
        let signal = state.withLock { state in
            state.active.remove(registration.holder)
            return state.signals.removeValue(forKey: registration.holder)
        }
        signal?.finish()
    }
}
