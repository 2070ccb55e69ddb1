internal import LinuxSystem

/// The receiver's clock for a sender once its offer is accepted (docs/PROTOCOL.md §1,
/// "Timeouts"). It measures the sender, not the receiver: it runs only while the receiver
/// waits for it — not while a message of the connection is in the receiver's hands (decoded,
/// handled, held back for the committer), nor while files are being committed — so a receiver
/// busy with other senders never counts its own backlog as this one's silence or slowness.
///
/// Two limits, both on that time:
/// - **silence**: no whole frame arrived for `idle` plus the hashing allowance. Bytes arriving
///   at the transport (a frame in progress) count as an arrival too, but no longer than the
///   largest frame takes at the pace: a frame that never ends is silence.
/// - **rate**: since the Accept, fewer bytes arrived than `pace` asks of the time waited —
///   `pace.bytesPerSecond` per second beyond `pace.allowance` — while fewer than `expected`
///   (the file bytes the transfer needs) did. A Zeros counts for the bytes it stands for.
///   A drip that keeps the silence limit from firing is cut off by this one. A transfer of
///   unknown size is paced by its source, not its sender: the rate only tells how far behind
///   it is when another sender needs room (``shortfall(grace:)``).
final class SenderClock: Sendable {
    /// Why the clock expired.
    enum Expiry: Sendable, Equatable {
        /// Nothing arrived for this long of the receiver's waiting.
        case silent(Duration)
        /// Bytes kept coming, but slower than the pace: `bytes` in `waited`.
        case tooSlow(bytes: UInt64, waited: Duration)
    }

    private struct State {
        /// The sender's time before `since`.
        var waited: Duration = .zero
        var since: ContinuousClock.Instant
        /// Frames taken from the connection and not yet handed back by the receiver.
        var inHand = 0
        /// The receiver is committing files.
        var committing = false
        /// The sender's time at the last whole frame, and at the last bytes seen at the transport.
        var lastFrame: Duration = .zero
        var lastTransport: Duration = .zero
        /// Bytes of whole frames, bytes the transport received since the Accept, and zero
        /// bytes Zeros stood for.
        var bytes: UInt64 = 0
        var transport: UInt64 = 0
        var zeros: UInt64 = 0
        var hashingAllowance: Duration
        var stopped = false

        var running: Bool { inHand == 0 && !committing && !stopped }

        func senderTime(_ now: ContinuousClock.Instant) -> Duration { running ? waited + (now - since) : waited }

        /// Folds the running interval in before `running` may change.
        mutating func fold(_ now: ContinuousClock.Instant) {
            waited = senderTime(now)
            since = now
        }

        var credited: UInt64 { max(bytes, transport).saturatingAdd(zeros) }
    }

    private let state: Locked<State>
    private let idle: Duration
    /// How long bytes at the transport may stand for a frame in progress.
    private let frameAllowance: Duration
    let pace: PeerPace
    private let expected: UInt64?

    /// `expected` is nil when the transfer has files of unknown size (the rate then only
    /// counts for ``shortfall(grace:)``); `hashingAllowance` is added to both limits (the sender
    /// hashes a resumed prefix or a `present` file before it sends it); `framePace` bounds how
    /// long bytes at the transport may stand for one frame in progress.
    init(idle: Duration, pace: PeerPace, framePace: PeerPace, expected: UInt64?, hashingAllowance: Duration) {
        self.idle = idle
        self.pace = PeerPace(allowance: pace.allowance + hashingAllowance, bytesPerSecond: pace.bytesPerSecond)
        self.frameAllowance = PeerPace(allowance: .zero, bytesPerSecond: framePace.bytesPerSecond).limit(for: ProtocolLimits.maximumMessageSize)
        self.expected = expected
        self.state = Locked(State(since: .now, hashingAllowance: hashingAllowance))
    }

    /// A frame of `bytes` arrived from the framer: it is in the receiver's hands until
    /// ``handedBack()``.
    func arrived(_ bytes: Int) {
        state.withLock {
            $0.fold(.now)
            $0.inHand += 1
            $0.lastFrame = $0.waited
            $0.lastTransport = $0.waited
            $0.bytes = $0.bytes.saturatingAdd(UInt64(max(0, bytes)))
        }
    }

    /// The receiver is done with a frame ``arrived(_:)`` reported.
    func handedBack() {
        state.withLock {
            $0.fold(.now)
            $0.inHand = max(0, $0.inHand - 1)
        }
    }

    /// Whether the receiver is committing files (its time, not the sender's), and the zero
    /// bytes and hashing allowance the transfer stands at.
    func update(committing: Bool, zeros: UInt64, hashingAllowance: Duration) {
        state.withLock {
            $0.fold(.now)
            $0.committing = committing
            $0.zeros = zeros
            $0.hashingAllowance = hashingAllowance
        }
    }

    /// The sender no longer owes anything: the clock stops.
    func stop() {
        state.withLock {
            $0.fold(.now)
            $0.stopped = true
        }
    }

    /// The bytes the pace asks for after `waited` with `grace` more allowance, capped at what
    /// the transfer needs.
    private func required(after waited: Duration, grace: Duration = .zero) -> UInt64 {
        let beyond = waited - pace.allowance - grace
        guard beyond > .zero else { return 0 }
        let (seconds, attoseconds) = beyond.components
        let rate = UInt64(pace.bytesPerSecond)
        let whole = UInt64(seconds).multipliedReportingOverflow(by: rate)
        let part = UInt64(attoseconds / 1_000_000_000) * rate / 1_000_000_000
        let asked = whole.overflow ? .max : whole.partialValue.saturatingAdd(part)
        return min(asked, expected ?? .max)
    }

    /// Why the clock has expired at `waited`, or nil.
    private func expiry(_ state: State, waited: Duration) -> Expiry? {
        let quiet = idle + state.hashingAllowance
        let lastSign = max(state.lastFrame, state.lastTransport)
        if waited - lastSign >= quiet || waited - state.lastFrame >= quiet + frameAllowance {
            return .silent(waited - lastSign)
        }
        if expected != nil, state.credited < required(after: waited) { return .tooSlow(bytes: state.credited, waited: waited) }
        return nil
    }

    /// How many bytes the sender is behind the pace with `grace` more allowance, or nil when
    /// it is not (or the clock stopped): a transfer that can be cut off to make room for
    /// another sender (``OfferMemory``).
    func shortfall(grace: Duration) -> UInt64? {
        state.withLock {
            guard !$0.stopped else { return nil }
            let needed = required(after: $0.senderTime(.now), grace: grace)
            return $0.credited < needed ? needed - $0.credited : nil
        }
    }

    /// What the sender delivered, and in how long a wait: for a message.
    var standing: (bytes: UInt64, waited: Duration) {
        state.withLock { ($0.credited, $0.senderTime(.now)) }
    }

    /// Returns why the clock expired, or nil when stopped or cancelled first. Before it
    /// expires, `transportBytes` (the payload bytes the connection has received, nil when the
    /// transport does not tell) is asked whether bytes arrived that no whole frame brought
    /// yet: a frame on its way, which counts as an arrival and as bytes delivered.
    func waitForExpiry(transportBytes: @Sendable () async -> Int?) async -> Expiry? {
        let atStart = await transportBytes()
        var lastSeen = atStart
        while !Task.isCancelled {
            let now = ContinuousClock.now
            let (wake, expired): (ContinuousClock.Instant?, Bool) = state.withLock {
                guard !$0.stopped else { return (nil, false) }
                let waited = $0.senderTime(now)
                if expiry($0, waited: waited) != nil { return (now, true) }
                // Checked often enough for the pace; the silence limit may be near.
                let quiet = max(.zero, max($0.lastFrame, $0.lastTransport) + idle + $0.hashingAllowance - waited)
                return (now + max(.milliseconds(10), min(quiet, .milliseconds(250))), false)
            }
            guard let wake else { return nil }
            guard expired else {
                do { try await Task.sleep(until: wake) } catch { return nil }
                continue
            }
            let seen = await transportBytes()
            let moved = seen.map { $0 > (lastSeen ?? .max) } ?? false
            lastSeen = seen ?? lastSeen
            let verdict: Expiry? = state.withLock {
                guard !$0.stopped else { return nil }
                $0.fold(.now)
                if let seen, let atStart { $0.transport = max($0.transport, UInt64(max(0, seen - atStart))) }
                if moved { $0.lastTransport = $0.waited }
                return expiry($0, waited: $0.waited)
            }
            if let verdict { return verdict }
        }
        return nil
    }
}
