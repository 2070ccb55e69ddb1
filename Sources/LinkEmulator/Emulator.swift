// The forwarding engine: one thread, ppoll over both packet fds (+ a signalfd), batched
// non-blocking reads into a preallocated slot pool, per direction a FIFO ring ordered by
// release time plus a small min-heap for reordered packets, writes when packets are due.
// No allocation, no Foundation, no locks on the per-packet path.
import Glibc

/// Counters for one direction. Bytes are IP packet bytes as read from / written to the TUN.
struct DirectionStats {
    var rxPackets: UInt64 = 0
    var rxBytes: UInt64 = 0
    var txPackets: UInt64 = 0
    var txBytes: UInt64 = 0
    var dropLoss: UInt64 = 0
    var dropQueue: UInt64 = 0
    /// No free packet slot (raise --pool).
    var dropPool: UInt64 = 0
    /// Larger than the slot size (device MTU raised after start).
    var dropOversize: UInt64 = 0
    var writeErrors: UInt64 = 0
    var reordered: UInt64 = 0
    /// GSO super-packets forwarded whole (offload passthrough; each counted once in rx/tx_packets).
    var gsoPackets: UInt64 = 0
}

/// Fixed-size packet buffers, handed out LIFO so hot slots stay in cache.
final class SlotPool {
    let count: Int
    let slotSize: Int
    let base: UnsafeMutableRawPointer
    let length: UnsafeMutablePointer<Int32>
    let release: UnsafeMutablePointer<Int64>
    private let free: UnsafeMutablePointer<Int32>
    private(set) var freeCount: Int
    /// Landing buffer for packets read while the pool is empty (they are counted and dropped).
    let scratch: UnsafeMutableRawPointer

    init(count: Int, slotSize: Int) {
        self.count = count
        self.slotSize = slotSize
        // Anonymous memory is committed lazily, so a large pool costs only what is touched.
        base = UnsafeMutableRawPointer.allocate(byteCount: count * slotSize, alignment: 64)
        length = .allocate(capacity: count)
        release = .allocate(capacity: count)
        free = .allocate(capacity: count)
        for i in 0..<count { free[i] = Int32(count - 1 - i) }
        freeCount = count
        scratch = UnsafeMutableRawPointer.allocate(byteCount: slotSize, alignment: 64)
    }

    deinit {
        base.deallocate(); length.deallocate(); release.deallocate(); free.deallocate(); scratch.deallocate()
    }

    @inline(__always) func alloc() -> Int32 {
        if freeCount == 0 { return -1 }
        freeCount -= 1
        return free[freeCount]
    }

    @inline(__always) func recycle(_ slot: Int32) {
        free[freeCount] = slot
        freeCount += 1
    }

    @inline(__always) func buffer(_ slot: Int32) -> UnsafeMutableRawPointer {
        base + Int(slot) &* slotSize
    }
}

/// One direction: reads from `src`, shapes, writes to `dst`.
final class Direction {
    let name: String
    /// Bytes of virtio_net_hdr in front of each packet (0 or 10); passed through untouched.
    let header: Int
    /// "gso" (super-packets pass whole), "csum" (checksum offload only) or "none".
    let offload: String
    let src: Int32
    let dst: Int32
    var shaper: LinkShaper
    var stats = DirectionStats()
    let pool: SlotPool
    // FIFO ring of slots whose release times are non-decreasing.
    private let ring: UnsafeMutablePointer<Int32>
    private let ringMask: Int
    private var head = 0
    private var tail = 0
    // Min-heap (by release time) of reordered slots.
    private let heap: UnsafeMutablePointer<Int32>
    private var heapCount = 0
    /// Set when the source fd reported an unrecoverable error (device gone).
    private(set) var failure: String?

    init(name: String, src: Int32, dst: Int32, params: DirectionParams, seed: UInt64, pool: SlotPool,
         header: Int, offload: String) {
        self.name = name
        self.header = header
        self.offload = offload
        self.src = src
        self.dst = dst
        shaper = LinkShaper(params: params, seed: seed)
        self.pool = pool
        var cap = 1
        while cap < pool.count { cap <<= 1 }
        ring = .allocate(capacity: cap)
        ringMask = cap - 1
        heap = .allocate(capacity: pool.count)
    }

    deinit { ring.deallocate(); heap.deallocate() }

    var queued: Int { (tail - head) + heapCount }

    /// Earliest release time among queued packets, or nil.
    @inline(__always) var nextRelease: Int64? {
        var t: Int64? = nil
        if tail != head { t = pool.release[Int(ring[head & ringMask])] }
        if heapCount > 0 {
            let h = pool.release[Int(heap[0])]
            if t == nil || h < t! { t = h }
        }
        return t
    }

    /// Reads up to `batch` packets. Returns true if the batch was used up (more may be waiting).
    @inline(__always)
    func pump(batch: Int) -> Bool {
        let rel = pool.release
        let hdr = header
        for _ in 0..<batch {
            let slot = pool.alloc()
            let buf = slot >= 0 ? pool.buffer(slot) : pool.scratch
            let n = read(src, buf, pool.slotSize)
            if n <= 0 {
                if slot >= 0 { pool.recycle(slot) }
                if n < 0 {
                    let e = errno
                    if e == EAGAIN || e == EINTR { return false }
                    failure = "read from \(name) source failed: \(Sys.errorText(e))"
                } else {
                    failure = "\(name) source closed"
                }
                return false
            }
            let now = Sys.monotonicNs()
            let bytes = n - hdr
            stats.rxPackets &+= 1
            stats.rxBytes &+= UInt64(bytes > 0 ? bytes : 0)
            if slot < 0 { stats.dropPool &+= 1; continue }
            if n >= pool.slotSize || bytes <= 0 { stats.dropOversize &+= 1; pool.recycle(slot); continue }
            if hdr != 0 && buf.load(fromByteOffset: 1, as: UInt8.self) != 0 { stats.gsoPackets &+= 1 }
            switch shaper.admit(now: now, bytes: bytes) {
            case .dropLoss:
                stats.dropLoss &+= 1
                pool.recycle(slot)
            case .dropQueue:
                stats.dropQueue &+= 1
                pool.recycle(slot)
            case let .deliver(releaseNs, reordered):
                rel[Int(slot)] = releaseNs
                pool.length[Int(slot)] = Int32(n)
                if reordered {
                    stats.reordered &+= 1
                    heapPush(slot)
                } else {
                    ring[tail & ringMask] = slot
                    tail &+= 1
                }
            }
        }
        return true
    }

    /// Writes every packet whose release time is at or before `now`, in release order.
    @inline(__always)
    func flush(now: Int64) {
        let rel = pool.release
        while true {
            var slot: Int32
            if tail != head, rel[Int(ring[head & ringMask])] <= now {
                slot = ring[head & ringMask]
                if heapCount > 0 && rel[Int(heap[0])] < rel[Int(slot)] {
                    slot = heapPop()
                } else {
                    head &+= 1
                }
            } else if heapCount > 0 && rel[Int(heap[0])] <= now {
                slot = heapPop()
            } else {
                return
            }
            let len = Int(pool.length[Int(slot)])
            var w = write(dst, pool.buffer(slot), len)
            if w < 0 && errno == EINTR { w = write(dst, pool.buffer(slot), len) }
            if w == len {
                stats.txPackets &+= 1
                stats.txBytes &+= UInt64(len - header)
            } else {
                stats.writeErrors &+= 1
            }
            pool.recycle(slot)
        }
    }

    @inline(__always) private func heapPush(_ slot: Int32) {
        let rel = pool.release
        let key = rel[Int(slot)]
        var i = heapCount
        heapCount += 1
        while i > 0 {
            let parent = (i - 1) >> 1
            if rel[Int(heap[parent])] <= key { break }
            heap[i] = heap[parent]
            i = parent
        }
        heap[i] = slot
    }

    @inline(__always) private func heapPop() -> Int32 {
        let rel = pool.release
        let top = heap[0]
        heapCount -= 1
        if heapCount == 0 { return top }
        let last = heap[heapCount]
        let key = rel[Int(last)]
        var i = 0
        while true {
            var child = 2 * i + 1
            if child >= heapCount { break }
            if child + 1 < heapCount && rel[Int(heap[child + 1])] < rel[Int(heap[child])] { child += 1 }
            if rel[Int(heap[child])] >= key { break }
            heap[i] = heap[child]
            i = child
        }
        heap[i] = last
        return top
    }
}

final class Emulator {
    let ab: Direction
    let ba: Direction
    let fdA: Int32
    let fdB: Int32
    let batch: Int
    let seed: UInt64
    let startNs: Int64
    private var pfds: UnsafeMutablePointer<pollfd>
    private var signalFD: Int32 = -1
    private var busy = false

    /// `fdA` carries A's packets (read: A→B traffic; write: B→A traffic), `fdB` likewise.
    init(fdA: Int32, fdB: Int32, ab: DirectionParams, ba: DirectionParams, seed: UInt64,
         poolSlots: Int, slotSize: Int, batch: Int,
         header: Int = 0, offloadAB: String = "none", offloadBA: String = "none") {
        self.fdA = fdA
        self.fdB = fdB
        self.batch = batch
        self.seed = seed
        let pool = SlotPool(count: poolSlots, slotSize: slotSize)
        // Independent streams per direction, so one direction's traffic does not perturb the other's draws.
        self.ab = Direction(name: "a->b", src: fdA, dst: fdB, params: ab, seed: seed ^ 0x6162_0000_0000_0001, pool: pool,
                            header: header, offload: offloadAB)
        self.ba = Direction(name: "b->a", src: fdB, dst: fdA, params: ba, seed: seed ^ 0x6261_0000_0000_0002, pool: pool,
                            header: header, offload: offloadBA)
        pfds = .allocate(capacity: 3)
        startNs = Sys.monotonicNs()
    }

    deinit { pfds.deallocate() }

    func watchSignals(_ fd: Int32) { signalFD = fd }

    var failure: String? { ab.failure ?? ba.failure }

    enum Event { case none, signal(Int32) }

    /// Minimum time between two wake-ups while traffic flows (interrupt coalescing); 0 = none.
    var tickNs: Int64 = 0
    private var lastWake: Int64 = .min
    /// Returns from ppoll, i.e. wake-ups of the loop.
    private(set) var wakeups: UInt64 = 0

    /// One turn of the loop: release due packets, wait (at most until `deadline` if given, and
    /// never past the next release), then read what arrived. Returns a received signal, if any.
    /// With `tickNs` > 0, a turn that comes less than `tickNs` after the previous wake-up first
    /// sleeps out the rest of the tick (watching only for signals), so each wake-up handles
    /// every arrival and release of up to one tick at once; after an idle spell it wakes at once.
    func step(until deadline: Int64?) -> Event {
        var now = Sys.monotonicNs()
        if !busy && tickNs > 0 && lastWake != .min && now < lastWake &+ tickNs {
            let wait = lastWake &+ tickNs &- now
            var ts = timespec(tv_sec: 0, tv_nsec: Int(wait))
            pfds[0] = pollfd(fd: signalFD, events: Int16(POLLIN), revents: 0)
            if Sys.ppoll(pfds, signalFD >= 0 ? 1 : 0, &ts, nil) > 0, let sig = readSignal() { return .signal(sig) }
            now = Sys.monotonicNs()
        }
        ab.flush(now: now)
        ba.flush(now: now)

        var wake = deadline
        if let t = ab.nextRelease, wake == nil || t < wake! { wake = t }
        if let t = ba.nextRelease, wake == nil || t < wake! { wake = t }

        pfds[0] = pollfd(fd: fdA, events: Int16(POLLIN), revents: 0)
        pfds[1] = pollfd(fd: fdB, events: Int16(POLLIN), revents: 0)
        pfds[2] = pollfd(fd: signalFD, events: Int16(POLLIN), revents: 0)
        let nfds: nfds_t = signalFD >= 0 ? 3 : 2
        var r: Int32
        if busy {
            var ts = timespec(tv_sec: 0, tv_nsec: 0)
            r = Sys.ppoll(pfds, nfds, &ts, nil)
        } else if let wake {
            now = Sys.monotonicNs()
            let wait = max(0, wake - now)
            var ts = timespec(tv_sec: Int(wait / 1_000_000_000), tv_nsec: Int(wait % 1_000_000_000))
            r = Sys.ppoll(pfds, nfds, &ts, nil)
        } else {
            r = Sys.ppoll(pfds, nfds, nil, nil)
        }
        if !busy { wakeups &+= 1 }
        busy = false
        lastWake = Sys.monotonicNs()
        if r <= 0 {
            ab.flush(now: lastWake)
            ba.flush(now: lastWake)
            return .none
        }

        if pfds[0].revents != 0 { busy = ab.pump(batch: batch) || busy }
        if pfds[1].revents != 0 { busy = ba.pump(batch: batch) || busy }
        // Release what became due while reading (e.g. zero delay) before the next wait.
        now = Sys.monotonicNs()
        ab.flush(now: now)
        ba.flush(now: now)

        if signalFD >= 0 && pfds[2].revents != 0, let sig = readSignal() { return .signal(sig) }
        return .none
    }

    private func readSignal() -> Int32? {
        var info = (UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0),
                    UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        // struct signalfd_siginfo is 128 bytes; ssi_signo is its first field.
        let n = withUnsafeMutableBytes(of: &info) { read(signalFD, $0.baseAddress!, 128) }
        guard n == 128 else { return nil }
        return Int32(truncatingIfNeeded: info.0 & 0xFFFF_FFFF)
    }

    // MARK: - Statistics

    func statsJSON() -> String {
        let up = Double(Sys.monotonicNs() - startNs) / 1e9
        return "{\"uptime_s\":\(fmt(up, 3)),\"seed\":\(seed),\"tick_us\":\(fmt(Double(tickNs) / 1e3, 3)),\"wakeups\":\(wakeups),\"ab\":\(dirJSON(ab)),\"ba\":\(dirJSON(ba))}"
    }

    private func dirJSON(_ d: Direction) -> String {
        let s = d.stats
        let p = d.shaper.params
        let maxQ = d.shaper.maxQueueNs
        let maxQBytes = p.rateBps == 0 ? 0 : Int64((Double(maxQ) * Double(p.rateBps) / 8e9).rounded())
        let lossPct = s.rxPackets == 0 ? 0 : Double(s.dropLoss) / Double(s.rxPackets) * 100
        return "{\"rx_packets\":\(s.rxPackets),\"rx_bytes\":\(s.rxBytes)"
            + ",\"tx_packets\":\(s.txPackets),\"tx_bytes\":\(s.txBytes)"
            + ",\"drop_loss\":\(s.dropLoss),\"drop_queue\":\(s.dropQueue)"
            + ",\"drop_pool\":\(s.dropPool),\"drop_oversize\":\(s.dropOversize)"
            + ",\"write_errors\":\(s.writeErrors),\"reordered\":\(s.reordered),\"gso_packets\":\(s.gsoPackets)"
            + ",\"queued\":\(d.queued),\"max_queue_bytes\":\(maxQBytes),\"max_queue_ms\":\(fmt(Double(maxQ) / 1e6, 3))"
            + ",\"loss_measured_pct\":\(fmt(lossPct, 4))"
            + ",\"config\":{\"offload\":\"\(d.offload)\",\"delay_ms\":\(fmt(Double(p.delayNs) / 1e6, 3)),\"jitter_ms\":\(fmt(Double(p.jitterNs) / 1e6, 3))"
            + ",\"rate_bps\":\(p.rateBps),\"queue_ms\":\(fmt(Double(p.queueNs) / 1e6, 3)),\"queue_bytes\":\(p.queueLimitBytes)"
            + ",\"loss_pct\":\(fmt(p.loss * 100, 4)),\"reorder_pct\":\(fmt(p.reorder * 100, 4))"
            + ",\"reorder_delay_ms\":\(fmt(Double(p.reorderDelayNs) / 1e6, 3)),\"overhead_bytes\":\(p.overheadBytes)}}"
    }
}

/// Fixed-point decimal rendering (valid JSON, no exponent).
func fmt(_ v: Double, _ digits: Int) -> String {
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let r = (v * scale).rounded()
    guard r.magnitude < 9e18 else { return "0" }
    let i = Int64(r)
    let neg = i < 0
    let a = i.magnitude
    let whole = a / UInt64(scale)
    var frac = String(a % UInt64(scale))
    while frac.count < digits { frac = "0" + frac }
    return (neg ? "-" : "") + "\(whole)" + (digits > 0 ? "." + frac : "")
}
