// Built-in unit tests (`qxfer-linkemu --self-test`): units, options, the link model, and the
// forwarding engine end to end over SOCK_SEQPACKET socket pairs (packet boundaries like a TUN fd).
// Needs no root and no devices. Ends with the line "N passed, N failed".
import Glibc

enum SelfTest {
    final class Tally {
        var passed = 0
        var failed = 0
        func check(_ ok: Bool, _ name: String, _ detail: @autoclosure () -> String = "") {
            if ok {
                passed += 1
            } else {
                failed += 1
                print("FAIL \(name)\(detail().isEmpty ? "" : ": " + detail())")
            }
        }
    }

    static func run() -> Int32 {
        let t = Tally()
        units(t)
        options(t)
        shaperRateQueue(t)
        shaperStatistics(t)
        engine(t)
        print("\(t.passed) passed, \(t.failed) failed")
        return t.failed == 0 ? 0 : 1
    }

    static func throwsUsage(_ body: () throws -> Void) -> Bool {
        do { try body(); return false } catch { return true }
    }

    static func units(_ t: Tally) {
        t.check((try? Units.duration("25ms")) == 25_000_000, "duration 25ms")
        t.check((try? Units.duration("0.5ms")) == 500_000, "duration 0.5ms")
        t.check((try? Units.duration("1s")) == 1_000_000_000, "duration 1s")
        t.check((try? Units.duration("250us")) == 250_000, "duration 250us")
        t.check((try? Units.duration("0")) == 0, "duration 0")
        for bad in ["25", "ms", "-1ms", "1e3ms", "1.2.3ms", "5h", ""] {
            t.check(throwsUsage { _ = try Units.duration(bad) }, "duration rejects '\(bad)'")
        }
        t.check((try? Units.rate("500mbit")) == 500_000_000, "rate 500mbit")
        t.check((try? Units.rate("1.5Gbit")) == 1_500_000_000, "rate 1.5Gbit")
        t.check((try? Units.rate("unlimited")) == 0, "rate unlimited")
        for bad in ["500mb", "500", "mbit", "1kbit"] {
            t.check(throwsUsage { _ = try Units.rate(bad) }, "rate rejects '\(bad)'")
        }
        t.check((try? Units.percent("1%")) == 0.01, "percent 1%")
        t.check((try? Units.percent("100")) == 1, "percent 100")
        t.check((try? Units.percent("0.5%")) == 0.005, "percent 0.5%")
        for bad in ["101%", "x", "-1%", "%"] {
            t.check(throwsUsage { _ = try Units.percent(bad) }, "percent rejects '\(bad)'")
        }
        t.check(Units.threshold(0) == 0 && Units.threshold(1) == UInt64.max, "threshold bounds")
        t.check(Units.formatDuration(25_000_000) == "25ms" && Units.formatRate(500_000_000) == "500mbit", "format")
        t.check(fmt(1.5, 3) == "1.500" && fmt(-0.25, 2) == "-0.25" && fmt(0.0004, 3) == "0.000" && fmt(7, 0) == "7", "fmt")
    }

    static func options(_ t: Tally) {
        do {
            let o = try Options.parse(["--delay-ab", "10ms", "--delay", "25ms", "--rate=500mbit", "--loss-ba", "1%",
                                       "--queue", "40ms", "--seed", "9", "--a-ns", "x-a", "--b-dev", "t1"])
            t.check(o.ab.delayNs == 10_000_000 && o.ba.delayNs == 25_000_000, "per-direction override wins")
            t.check(o.ab.rateBps == 500_000_000 && o.ba.rateBps == 500_000_000, "--rate= sets both")
            t.check(o.ab.loss == 0 && o.ba.loss == 0.01, "--loss-ba only b->a")
            t.check(o.ab.queueNs == 40_000_000 && o.ab.queueLimitBytes == 2_500_000, "queue bytes = rate × time")
            t.check(o.seed == 9 && o.aNS == "x-a" && o.bDev == "t1" && o.bNS == "qx-b", "endpoints and seed")
        } catch {
            t.check(false, "options parse", error.description)
        }
        t.check((try? Options.parse(["--help"]))?.action == .help, "--help")
        t.check((try? Options.parse(["--self-test"]))?.action == .selfTest, "--self-test")
        for bad in [["--bogus"], ["--delay"], ["--delay", "5"], ["--seed", "-1"], ["stray"], ["--delay-xy", "1ms"],
                    ["--stats-interval", "1s"], ["--pool", "1"], ["--a-ns", "n", "--b-ns", "n"], ["--quiet=1"],
                    ["--seed-ab", "1"], ["--offload", "tso"]] {
            t.check(throwsUsage { _ = try Options.parse(bad) }, "options reject \(bad)")
        }
    }

    static func shaperRateQueue(_ t: Tally) {
        // 12 Mbit/s: a 1500-byte packet takes exactly 1 ms. Queue 5 ms, delay 10 ms.
        var p = DirectionParams()
        p.rateBps = 12_000_000
        p.queueNs = 5_000_000
        p.delayNs = 10_000_000
        var s = LinkShaper(params: p, seed: 1)
        var verdicts: [Verdict] = []
        for _ in 0..<10 { verdicts.append(s.admit(now: 0, bytes: 1500)) }
        let expected: [Verdict] = (1...5).map { .deliver(releaseNs: Int64(10 + $0) * 1_000_000, reordered: false) }
            + Array(repeating: .dropQueue, count: 5)
        t.check(verdicts == expected, "burst into a 5 ms queue: 5 pass at 1 ms spacing, 5 drop", "\(verdicts)")
        t.check(s.maxQueueNs == 5_000_000, "max queue 5 ms")
        t.check(s.admit(now: 5_000_000, bytes: 1500) == .deliver(releaseNs: 16_000_000, reordered: false), "idle link again")
        t.check(s.admit(now: 5_000_000, bytes: 1500) == .deliver(releaseNs: 17_000_000, reordered: false), "then queued")

        // Long-run serialization is exact (fractional nanoseconds carried).
        p.rateBps = 7_000_000
        p.queueNs = 3_600_000_000_000
        p.delayNs = 0
        s = LinkShaper(params: p, seed: 1)
        for _ in 0..<1000 { _ = s.admit(now: 0, bytes: 1234) }
        let exact = 1000.0 * 1234 * 8 / 7e6 * 1e9
        t.check(abs(Double(s.busyUntil) - exact) <= 1, "rate exact over 1000 packets", "\(s.busyUntil) vs \(exact)")

        // Overhead is charged: 1462 + 38 bytes at 12 Mbit/s = 1 ms.
        p = DirectionParams()
        p.rateBps = 12_000_000
        p.overheadBytes = 38
        s = LinkShaper(params: p, seed: 1)
        t.check(s.admit(now: 0, bytes: 1462) == .deliver(releaseNs: 1_000_000, reordered: false), "overhead charged")

        // Unlimited rate: release = arrival + delay.
        p = DirectionParams()
        p.delayNs = 25_000_000
        s = LinkShaper(params: p, seed: 1)
        t.check(s.admit(now: 7, bytes: 60) == .deliver(releaseNs: 25_000_007, reordered: false), "pure delay")
    }

    static func shaperStatistics(_ t: Tally) {
        var p = DirectionParams()
        p.loss = 0.01
        var s = LinkShaper(params: p, seed: 42)
        var lost = 0
        let n = 1_000_000
        for i in 0..<n where s.admit(now: Int64(i), bytes: 100) == .dropLoss { lost += 1 }
        let rate = Double(lost) / Double(n)
        t.check(rate > 0.0097 && rate < 0.0103, "1% loss over 1e6 packets", "\(rate)")

        var a = LinkShaper(params: p, seed: 5)
        var b = LinkShaper(params: p, seed: 5)
        var c = LinkShaper(params: p, seed: 6)
        var same = true
        var differs = false
        for i in 0..<10_000 {
            let va = a.admit(now: Int64(i), bytes: 100)
            same = same && va == b.admit(now: Int64(i), bytes: 100)
            differs = differs || va != c.admit(now: Int64(i), bytes: 100)
        }
        t.check(same, "same seed, same decisions")
        t.check(differs, "other seed, other decisions")

        // Jitter on widely spaced packets: delay ± jitter, mean ≈ delay.
        p = DirectionParams()
        p.delayNs = 10_000_000
        p.jitterNs = 2_000_000
        s = LinkShaper(params: p, seed: 3)
        var inRange = true
        var sum = 0.0
        for i in 0..<10_000 {
            let now = Int64(i) * 100_000_000
            if case let .deliver(r, _) = s.admit(now: now, bytes: 100) {
                let d = r - now
                inRange = inRange && d >= 8_000_000 && d <= 12_000_000
                sum += Double(d)
            } else { inRange = false }
        }
        t.check(inRange, "jitter within delay ± jitter")
        t.check(abs(sum / 10_000 - 10e6) < 0.05e6, "jitter mean ≈ delay", "\(sum / 10_000)")
        // Closely spaced packets keep their order.
        s = LinkShaper(params: p, seed: 3)
        var last = Int64.min
        var ordered = true
        for i in 0..<10_000 {
            if case let .deliver(r, _) = s.admit(now: Int64(i) * 1000, bytes: 100) {
                ordered = ordered && r >= last
                last = r
            }
        }
        t.check(ordered, "jitter keeps FIFO order")

        p = DirectionParams()
        p.delayNs = 5_000_000
        p.reorder = 0.1
        p.reorderDelayNs = 1_000_000
        s = LinkShaper(params: p, seed: 8)
        var reordered = 0
        var exact = true
        for i in 0..<100_000 {
            if case let .deliver(r, re) = s.admit(now: Int64(i), bytes: 100) {
                if re { reordered += 1 }
                exact = exact && r == Int64(i) + 5_000_000 + (re ? 1_000_000 : 0)
            }
        }
        t.check(reordered > 9_700 && reordered < 10_300, "10% reordered", "\(reordered)")
        t.check(exact, "reordered packets held by reorder-delay")
    }

    // MARK: - Engine over socket pairs

    static func seqpacketPair() -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        let r = socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds)
        precondition(r == 0, "socketpair: \(Sys.errorText())")
        return (fds[0], fds[1])
    }

    static func send(_ fd: Int32, seq: UInt32, size: Int) {
        var b = [UInt8](repeating: UInt8(truncatingIfNeeded: seq), count: size)
        b.withUnsafeMutableBytes { $0.storeBytes(of: seq.bigEndian, toByteOffset: 0, as: UInt32.self) }
        let n = b.withUnsafeBytes { write(fd, $0.baseAddress!, size) }
        precondition(n == size, "test write: \(Sys.errorText())")
    }

    /// Receives everything available; returns (seq, size, arrival ns) per packet.
    static func drain(_ fd: Int32, into out: inout [(UInt32, Int, Int64)]) {
        var b = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = b.withUnsafeMutableBytes { read(fd, $0.baseAddress!, 4096) }
            if n <= 0 { return }
            let seq = b.withUnsafeBytes { UInt32(bigEndian: $0.loadUnaligned(as: UInt32.self)) }
            let intact = b[4..<n].allSatisfy { $0 == UInt8(truncatingIfNeeded: seq) }
            out.append((seq, intact ? n : -1, Sys.monotonicNs()))
        }
    }

    static func engine(_ t: Tally) {
        let (appA, emuA) = seqpacketPair()
        let (emuB, appB) = seqpacketPair()
        defer { close(appA); close(emuA); close(emuB); close(appB) }
        var ab = DirectionParams()
        ab.delayNs = 20_000_000
        var ba = DirectionParams()
        ba.reorder = 0.3
        ba.reorderDelayNs = 5_000_000
        let emu = Emulator(fdA: emuA, fdB: emuB, ab: ab, ba: ba, seed: 11, poolSlots: 256, slotSize: 2048, batch: 8)

        let t0 = Sys.monotonicNs()
        for i in 0..<50 { send(appA, seq: UInt32(i), size: 100 + i) }
        for i in 0..<60 { send(appB, seq: UInt32(i), size: 64) }
        var gotB: [(UInt32, Int, Int64)] = []
        var gotA: [(UInt32, Int, Int64)] = []
        while Sys.monotonicNs() - t0 < 2_000_000_000 && (gotB.count < 50 || gotA.count < 60) {
            _ = emu.step(until: Sys.monotonicNs() + 1_000_000)
            drain(appB, into: &gotB)
            drain(appA, into: &gotA)
        }
        t.check(gotB.count == 50, "a->b: all 50 delivered", "\(gotB.count)")
        t.check(gotB.map(\.0) == (0..<50).map(UInt32.init), "a->b: in order")
        t.check(gotB.allSatisfy { $0.1 == 100 + Int($0.0) }, "a->b: sizes and bytes intact")
        let early = gotB.filter { $0.2 - t0 < 20_000_000 }.count
        t.check(early == 0, "a->b: nothing before the 20 ms delay")
        let late = gotB.filter { $0.2 - t0 > 60_000_000 }.count
        t.check(late == 0, "a->b: delivered promptly after the delay")
        t.check(gotA.count == 60, "b->a: all 60 delivered", "\(gotA.count)")
        let outOfOrder = zip(gotA, gotA.dropFirst()).filter { $0.0.0 > $0.1.0 }.count
        t.check(emu.ba.stats.reordered > 5 && outOfOrder > 0, "b->a: reordered packets overtaken",
                "reordered \(emu.ba.stats.reordered), inversions \(outOfOrder)")
        t.check(emu.ab.stats.txPackets == 50 && emu.ab.stats.rxBytes == emu.ab.stats.txBytes, "a->b counters")
        t.check(emu.ba.stats.txPackets == 60 && emu.ab.queued == 0 && emu.ba.queued == 0, "b->a counters, queues empty")
        let json = emu.statsJSON()
        t.check(json.hasPrefix("{\"uptime_s\":") && json.contains("\"seed\":11") && json.contains("\"tx_packets\":60"), "stats JSON", json)

        // Pool exhaustion: 16 slots, 40 packets held by a 50 ms delay.
        let (pA, eA) = seqpacketPair()
        let (eB, pB) = seqpacketPair()
        defer { close(pA); close(eA); close(eB); close(pB) }
        var slow = DirectionParams()
        slow.delayNs = 50_000_000
        let small = Emulator(fdA: eA, fdB: eB, ab: slow, ba: slow, seed: 1, poolSlots: 16, slotSize: 2048, batch: 64)
        for i in 0..<40 { send(pA, seq: UInt32(i), size: 200) }
        var got: [(UInt32, Int, Int64)] = []
        let t1 = Sys.monotonicNs()
        while Sys.monotonicNs() - t1 < 300_000_000 {
            _ = small.step(until: Sys.monotonicNs() + 5_000_000)
            drain(pB, into: &got)
        }
        t.check(got.count == 16 && small.ab.stats.dropPool == 24, "pool exhaustion counted",
                "delivered \(got.count), drop_pool \(small.ab.stats.dropPool)")
        // Oversize: a packet that fills the whole slot is dropped.
        send(pA, seq: 99, size: 2048)
        let t2 = Sys.monotonicNs()
        while Sys.monotonicNs() - t2 < 100_000_000 { _ = small.step(until: Sys.monotonicNs() + 5_000_000) }
        t.check(small.ab.stats.dropOversize == 1, "oversize dropped")
    }
}
