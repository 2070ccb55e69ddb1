// The per-direction link model: random loss, a rate-limited drop-tail FIFO, one-way delay,
// jitter and reordering. Pure: time comes in as an argument, so it is tested deterministically.

/// xoshiro256** seeded through splitmix64. Fast, small, reproducible for a given seed.
struct Xoshiro256: Sendable {
    private var s0: UInt64, s1: UInt64, s2: UInt64, s3: UInt64

    init(seed: UInt64) {
        var x = seed
        func splitmix(_ x: inout UInt64) -> UInt64 {
            x &+= 0x9E37_79B9_7F4A_7C15
            var z = x
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        s0 = splitmix(&x); s1 = splitmix(&x); s2 = splitmix(&x); s3 = splitmix(&x)
    }

    @inline(__always)
    mutating func next() -> UInt64 {
        let result = ((s1 &* 5) << 7 | (s1 &* 5) >> 57) &* 9
        let t = s1 << 17
        s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3
        s2 ^= t
        s3 = (s3 << 45) | (s3 >> 19)
        return result
    }
}

/// What one direction of the link does to packets.
struct DirectionParams: Equatable, Sendable {
    /// One-way propagation delay added after serialization.
    var delayNs: Int64 = 0
    /// Uniform jitter: each packet's delay is delay ± jitter (never below 0); order is preserved.
    var jitterNs: Int64 = 0
    /// Bottleneck rate in bits per second over whole IP packets (+ overhead); 0 = unlimited.
    var rateBps: UInt64 = 0
    /// Drop-tail queue limit expressed as time at `rateBps` (bytes = rate × queue / 8).
    var queueNs: Int64 = 50_000_000
    /// Random loss probability, 0...1, applied on arrival (before the queue).
    var loss: Double = 0
    /// Probability that a packet is held back by `reorderDelayNs` so later packets overtake it.
    var reorder: Double = 0
    var reorderDelayNs: Int64 = 1_000_000
    /// Bytes added to every packet for rate accounting (e.g. 38 for Ethernet framing); default 0.
    var overheadBytes: Int = 0

    var queueLimitBytes: Int64 {
        rateBps == 0 ? 0 : Int64((Double(rateBps) * Double(queueNs) / 8e9).rounded())
    }
}

enum Verdict: Equatable {
    case dropLoss
    case dropQueue
    /// Deliver at `releaseNs`; `reordered` packets bypass the FIFO order.
    case deliver(releaseNs: Int64, reordered: Bool)
}

struct LinkShaper {
    let params: DirectionParams
    private let lossThreshold: UInt64
    private let reorderThreshold: UInt64
    private let jitterSpan: UInt64
    private var rng: Xoshiro256
    /// Time at which the bottleneck finishes serializing everything admitted so far.
    private(set) var busyUntil: Int64 = .min
    /// Sub-nanosecond remainder of serialization time, in units of 1/rate ns (keeps long-run rate exact).
    private var carry: UInt64 = 0
    private var lastFifoRelease: Int64 = .min
    /// Largest queueing + serialization delay any admitted packet saw.
    private(set) var maxQueueNs: Int64 = 0

    init(params: DirectionParams, seed: UInt64) {
        self.params = params
        lossThreshold = Units.threshold(params.loss)
        reorderThreshold = Units.threshold(params.reorder)
        jitterSpan = params.jitterNs > 0 ? UInt64(2 * params.jitterNs + 1) : 0
        rng = Xoshiro256(seed: seed)
    }

    /// Decides the fate of a packet of `bytes` bytes arriving at `now`.
    @inline(__always)
    mutating func admit(now: Int64, bytes: Int) -> Verdict {
        if lossThreshold != 0 && rng.next() < lossThreshold { return .dropLoss }
        var depart = now
        let rate = params.rateBps
        if rate != 0 {
            let backlog = busyUntil > now ? busyUntil - now : 0
            let bitNs = UInt64(bytes + params.overheadBytes) &* 8_000_000_000 &+ (backlog == 0 ? 0 : carry)
            let tx = Int64(bitNs / rate)
            // Drop-tail: admit while the bytes already waiting plus this packet fit the queue.
            // An idle link always admits one packet, however small the queue.
            if backlog != 0 && backlog + tx > params.queueNs { return .dropQueue }
            carry = bitNs % rate
            depart = now + backlog + tx
            busyUntil = depart
            if backlog + tx > maxQueueNs { maxQueueNs = backlog + tx }
        }
        var release = depart + params.delayNs
        if jitterSpan != 0 {
            release += Int64(rng.next() % jitterSpan) - params.jitterNs
            if release < depart { release = depart }
        }
        if reorderThreshold != 0 && rng.next() < reorderThreshold {
            return .deliver(releaseNs: release + params.reorderDelayNs, reordered: true)
        }
        if release < lastFifoRelease { release = lastFifoRelease }
        lastFifoRelease = release
        return .deliver(releaseNs: release, reordered: false)
    }
}
