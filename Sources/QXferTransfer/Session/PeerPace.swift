internal import LinuxSystem

/// The slowest a peer may be while a whole message crosses between it and the receiver: a
/// fixed allowance plus one second per `bytesPerSecond` bytes of the message. A peer that
/// drips a message in tiny parts, or reads one a few bytes at a time, moves the connection on
/// at every step, so neither a silence limit nor the kernel's TCP_USER_TIMEOUT ever fires; a
/// bound on the whole message, scaled to its size, does.
public struct PeerPace: Sendable, Hashable {
    /// Time given regardless of size (a round trip, a slow start).
    public var allowance: Duration
    /// The slowest average rate accepted beyond the allowance, in bytes per second (≥ 1).
    public var bytesPerSecond: Int

    public init(allowance: Duration, bytesPerSecond: Int) {
        self.allowance = allowance
        self.bytesPerSecond = max(1, bytesPerSecond)
    }

    /// How long `bytes` may take in all.
    public func limit(for bytes: Int) -> Duration {
        let bytes = max(0, bytes)
        let rate = max(1, bytesPerSecond)
        // Split so that no product overflows, whatever the size.
        let whole = bytes / rate
        let rest = Int64(bytes % rate) * 1_000_000_000 / Int64(rate)
        return allowance + .seconds(whole) + .nanoseconds(rest)
    }

    /// The rate for a person: "128 KiB/s".
    var rateDescription: String {
        bytesPerSecond >= 1 << 20 && bytesPerSecond % (1 << 20) == 0 ? "\(bytesPerSecond >> 20) MiB/s"
            : bytesPerSecond >= 1 << 10 && bytesPerSecond % (1 << 10) == 0 ? "\(bytesPerSecond >> 10) KiB/s"
            : "\(bytesPerSecond) B/s"
    }
}

/// The receiver's clock for a message that arrives in parts (an Offer in Continuations,
/// docs/PROTOCOL.md §3.9): it expires when the peer stays silent for `silence`, or when the
/// message is not whole by `pace.limit(for:)` the bytes that came so far, counted from the
/// start. Each part resets the first count but not the second, so a drip of parts holds the
/// connection no longer than the same bytes sent at the pace's rate.
final class ArrivalDeadline: Sendable {
    /// Why the clock expired.
    enum Expiry: Sendable, Equatable {
        /// Nothing arrived for the silence limit, after `bytes` of the message.
        case silent(Duration, bytes: Int)
        /// Parts kept coming, but too slowly: `bytes` in `elapsed`.
        case tooSlow(bytes: Int, elapsed: Duration)
    }

    private struct State {
        var lastArrival: ContinuousClock.Instant
        var bytes = 0
        var stopped = false
    }
    private let state: Locked<State>
    private let start: ContinuousClock.Instant
    private let silence: Duration
    let pace: PeerPace

    init(silence: Duration, pace: PeerPace) {
        let now = ContinuousClock.now
        self.start = now
        self.silence = silence
        self.pace = pace
        self.state = Locked(State(lastArrival: now))
    }

    /// A part of `bytes` arrived.
    func arrived(_ bytes: Int) {
        state.withLock {
            $0.lastArrival = .now
            let (sum, overflow) = $0.bytes.addingReportingOverflow(max(0, bytes))
            $0.bytes = overflow ? .max : sum
        }
    }

    /// The message is whole: the clock no longer runs.
    func stop() {
        state.withLock { $0.stopped = true }
    }

    /// Returns why the clock expired, or nil when stopped or cancelled first.
    func waitForExpiry() async -> Expiry? {
        while !Task.isCancelled {
            let (wake, expiry): (ContinuousClock.Instant?, Expiry?) = state.withLock {
                if $0.stopped { return (nil, nil) }
                let now = ContinuousClock.now
                let quiet = $0.lastArrival + silence
                let whole = start + pace.limit(for: $0.bytes)
                if now >= quiet { return (nil, .silent(now - $0.lastArrival, bytes: $0.bytes)) }
                if now >= whole { return (nil, .tooSlow(bytes: $0.bytes, elapsed: now - start)) }
                return (min(quiet, whole), nil)
            }
            if let expiry { return expiry }
            guard let wake else { return nil }
            do { try await Task.sleep(until: wake) } catch { return nil }
        }
        return nil
    }
}

extension Duration {
    /// Seconds with one decimal, for a message: "30.0 s".
    var shownInSeconds: String {
        let (seconds, attoseconds) = components
        let tenths = (seconds * 10 + attoseconds / 100_000_000_000_000_000)
        return "\(tenths / 10).\(tenths % 10) s"
    }
}
