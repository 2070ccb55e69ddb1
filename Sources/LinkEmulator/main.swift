// qxfer-linkemu: a userspace link emulator between two TUN devices in two network namespaces.
// See Options.swift for the flags and docs/benchmarks.md ("Link emulator") for the design.
import Glibc
import SafeOutput

func fail(_ message: String, code: Int32) -> Never {
    Sys.put(2, "qxfer-linkemu: error: \(message)\n")
    exit(code)
}

let options: Options
do {
    options = try Options.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    fail(error.description, code: 2)
}

switch options.action {
case .help:
    print(helpText)
    exit(0)
case .selfTest:
    exit(SelfTest.run())
case .run:
    break
}

let signalFD: Int32
let sideA: (fd: Int32, mtu: Int)
let sideB: (fd: Int32, mtu: Int)
do {
    // Block the signals before anything else so they are only ever seen through the signalfd.
    signalFD = try Sys.signalFD([SIGINT, SIGTERM, SIGHUP, SIGUSR1])
    sideA = try Sys.openTun(ns: options.aNS, dev: options.aDev, vnetHeader: options.offload != .none)
    sideB = try Sys.openTun(ns: options.bNS, dev: options.bDev, vnetHeader: options.offload != .none)
} catch {
    fail(error.description, code: 1)
}

// Offloads. What device A hands us is the a->b traffic, so A's offload flags decide whether a->b
// sees GSO super-packets. Only an unshaped direction may: rate, loss, jitter and reorder act per
// wire packet, so a shaped direction always gets MTU-sized packets from the kernel's own GSO.
func unshaped(_ p: DirectionParams) -> Bool {
    p.rateBps == 0 && p.loss == 0 && p.jitterNs == 0 && p.reorder == 0
}
let gsoAB = options.offload == .auto && unshaped(options.ab)
let gsoBA = options.offload == .auto && unshaped(options.ba)
let header = options.offload == .none ? 0 : Sys.vnetHeaderSize
var offloadAB = "none"
var offloadBA = "none"
if header != 0 {
    let gsoFlags = Sys.TUN_F_TSO4 | Sys.TUN_F_TSO6 | Sys.TUN_F_TSO_ECN | Sys.TUN_F_USO4 | Sys.TUN_F_USO6
    do {
        let fa = try Sys.setOffload(sideA.fd, Sys.TUN_F_CSUM | (gsoAB ? gsoFlags : 0))
        let fb = try Sys.setOffload(sideB.fd, Sys.TUN_F_CSUM | (gsoBA ? gsoFlags : 0))
        offloadAB = fa & Sys.TUN_F_TSO4 != 0 ? (fa & Sys.TUN_F_USO4 != 0 ? "gso" : "gso-tcp") : "csum"
        offloadBA = fb & Sys.TUN_F_TSO4 != 0 ? (fb & Sys.TUN_F_USO4 != 0 ? "gso" : "gso-tcp") : "csum"
    } catch {
        fail(error.description, code: 1)
    }
}

// One slot holds the largest packet either device can hand us; a read that fills the slot
// completely was truncated (MTU raised after start) and is dropped as oversize.
let maxPacket = max(sideA.mtu, sideB.mtu, 576, gsoAB || gsoBA ? 65535 : 0)
let slotSize = (maxPacket + header + 1 + 63) / 64 * 64
// Random seeds stay below 2^53 so they survive any JSON parser (jq, JavaScript) exactly.
let seed = options.seed ?? UInt64.random(in: 0...(1 << 53) - 1)
Sys.tightenTimerSlack()
if options.rtPriority > 0 {
    var param = sched_param(sched_priority: Int32(options.rtPriority))
    if sched_setscheduler(0, SCHED_FIFO, &param) != 0 {
        Sys.put(2, "qxfer-linkemu: warning: SCHED_FIFO not permitted (\(Sys.errorText())); normal scheduling\n")
    }
}

let emulator = Emulator(fdA: sideA.fd, fdB: sideB.fd, ab: options.ab, ba: options.ba, seed: seed,
                        poolSlots: options.pool ?? (gsoAB || gsoBA ? 8192 : 65536), slotSize: slotSize,
                        batch: options.batch, header: header, offloadAB: offloadAB, offloadBA: offloadBA)
emulator.watchSignals(signalFD)
emulator.tickNs = options.tickNs

func describe(_ p: DirectionParams, offload: String) -> String {
    var s = "offload \(offload), delay \(Units.formatDuration(p.delayNs))"
    if p.jitterNs > 0 { s += "±\(Units.formatDuration(p.jitterNs))" }
    s += ", rate \(Units.formatRate(p.rateBps))"
    if p.rateBps != 0 { s += ", queue \(Units.formatDuration(p.queueNs)) (\(p.queueLimitBytes) B)" }
    s += ", loss \(fmt(p.loss * 100, 3))%"
    if p.reorder > 0 { s += ", reorder \(fmt(p.reorder * 100, 3))% +\(Units.formatDuration(p.reorderDelayNs))" }
    return s
}

@MainActor func writeStats(fatal: Bool) {
    guard let file = options.statsFile else { return }
    do {
        // A regular file is replaced atomically; /dev/stdout or a pipe is written, never replaced.
        try OutputFile.replaceContents(of: file, with: Array((emulator.statsJSON() + "\n").utf8))
    } catch {
        if fatal { fail(error.description, code: 1) }
        Sys.put(2, "qxfer-linkemu: warning: \(error.description)\n")
    }
}

writeStats(fatal: true)
if !options.quiet {
    Sys.put(2, "qxfer-linkemu: ready: A=\(options.aNS)/\(options.aDev) mtu \(sideA.mtu), B=\(options.bNS)/\(options.bDev) mtu \(sideB.mtu), seed \(seed)\n")
    Sys.put(2, "qxfer-linkemu:   a->b: \(describe(options.ab, offload: offloadAB))\n")
    Sys.put(2, "qxfer-linkemu:   b->a: \(describe(options.ba, offload: offloadBA))\n")
}

let interval = options.statsIntervalNs
var nextStats: Int64? = interval > 0 ? Sys.monotonicNs() + interval : nil
loop: while true {
    let event = emulator.step(until: nextStats)
    if let failure = emulator.failure {
        writeStats(fatal: false)
        if !options.quiet { Sys.put(1, emulator.statsJSON() + "\n") }
        fail(failure, code: 1)
    }
    if case let .signal(sig) = event {
        if sig == SIGUSR1 {
            if !options.quiet { Sys.put(1, emulator.statsJSON() + "\n") }
            writeStats(fatal: false)
        } else {
            break loop
        }
    }
    if let due = nextStats {
        let now = Sys.monotonicNs()
        if now >= due {
            writeStats(fatal: false)
            var next = due + interval
            if next <= now { next = now + interval }
            nextStats = next
        }
    }
}

if !options.quiet {
    Sys.put(1, emulator.statsJSON() + "\n")
}
writeStats(fatal: false)
close(sideA.fd)
close(sideB.fd)
exit(0)
