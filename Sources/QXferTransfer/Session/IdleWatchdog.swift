internal import LinuxSystem

/// Notices a peer that has gone silent in the middle of a transfer: it reports once no message
/// was handled for `limit` (plus an allowance for work the peer must do before it can send,
/// such as hashing a large file), never while a message is being handled, and never once
/// stopped. The receiver then ends the transfer with an error and lets go of its partials.
final class IdleWatchdog: Sendable {
    private struct State {
        var lastActivity: ContinuousClock.Instant
        var allowance: Duration = .zero
        var busy = false
        var stopped = false
    }
    private let state: Locked<State>
    private let limit: Duration

    init(limit: Duration) {
        self.limit = limit
        self.state = Locked(State(lastActivity: .now))
    }

    /// A message arrived and is being handled.
    func busy() {
        state.withLock { $0.busy = true }
    }

    /// Handling is done; the silence is counted from now, with `allowance` on top of the limit.
    func idle(allowance: Duration = .zero) {
        state.withLock {
            $0.busy = false
            $0.lastActivity = .now
            $0.allowance = allowance
        }
    }

    /// The transfer no longer waits for the peer.
    func stop() {
        state.withLock { $0.stopped = true }
    }

    /// Returns how long the peer has been silent once that exceeds the limit, or nil when
    /// stopped or cancelled first.
    func waitForSilence() async -> Duration? {
        while !Task.isCancelled {
            let (wake, silence): (ContinuousClock.Instant?, Duration?) = state.withLock {
                if $0.stopped { return (nil, nil) }
                let deadline = $0.lastActivity + limit + $0.allowance
                if !$0.busy && ContinuousClock.now >= deadline { return (nil, ContinuousClock.now - $0.lastActivity) }
                return ($0.busy ? ContinuousClock.now + limit : deadline, nil)
            }
            if let silence { return silence }
            guard let wake else { return nil }
            do { try await Task.sleep(until: wake) } catch { return nil }
        }
        return nil
    }
}
