// Command-line options of qxfer-linkemu.

let helpText = """
qxfer-linkemu — userspace link emulator between two TUN devices (Linux, root)

Forwards IP packets between TUN device A and TUN device B, each living in its own network
namespace, and applies per direction: random loss, a rate limit with a drop-tail queue,
one-way delay, jitter and reordering. The devices must exist (see bench/netns/linkemu-up.sh,
which creates both namespaces, devices and addresses and starts this program).

USAGE
  qxfer-linkemu [options]
  qxfer-linkemu --self-test
  qxfer-linkemu --help

ENDPOINTS
  --a-ns NS            network namespace of side A: a name under /run/netns, a path
                       (e.g. /proc/PID/ns/net), or - for the current one   [qx-a]
  --a-dev DEV          TUN device of side A inside that namespace          [tun0]
  --b-ns NS            network namespace of side B                         [qx-b]
  --b-dev DEV          TUN device of side B                                [tun0]

LINK (both directions; append -ab or -ba to set one direction only, e.g. --delay-ab 10ms,
--loss-ba 1%; a direction-specific flag wins over the plain one whatever their order)
  --delay D            one-way delay added after the bottleneck              [0]
  --jitter D           uniform jitter: each packet's delay is delay ± D (never below 0);
                       packet order is kept, so closely spaced packets tend toward
                       delay + D                                             [0]
  --rate R             bottleneck rate in bits/s over IP packet bytes, or 'unlimited'
                                                                             [unlimited]
  --queue D            drop-tail queue limit as time at the rate (bytes = rate × D / 8);
                       an idle link always takes one packet; unused without --rate [50ms]
  --loss P             random loss on arrival, before the queue (e.g. 1%)    [0%]
  --reorder P          share of packets held back by --reorder-delay (on top of delay
                       and jitter) so that later packets overtake them       [0%]
  --reorder-delay D    extra delay of a reordered packet                     [1ms]
  --overhead BYTES     bytes added to each packet when charging the rate
                       (e.g. 38 for Ethernet framing)                        [0]

  Durations: ns, us, ms, s (e.g. 25ms, 0.5ms, 1s; 0 needs no unit).
  Rates: bit, kbit, mbit, gbit, tbit per second, powers of 1000 (e.g. 500mbit).
  Percentages: 0 to 100, '%' optional.

RUN
  --seed N             seed of the random generators (loss, jitter, reorder); the same
                       seed and the same arrivals give the same decisions  [random]
  --stats FILE         write the counters as JSON to FILE at exit (a file atomically,
                       a pipe or device directly)
  --stats-interval D   also write FILE every D (needs --stats)
  --offload MODE       auto: checksum offload on both devices, and in a direction with no
                         rate, loss, jitter or reorder the sending kernel's GSO super-packets
                         (TSO/USO, up to 64 KB) pass whole, like GRO on a real NIC;
                         shaped directions always see MTU-sized packets;
                       csum: checksum offload only, every packet MTU-sized;
                       none: plain IP packets, checksums computed and verified in software
                                                                            [auto]
  --pool N             packet buffers shared by both directions; a packet arriving when
                       all are in use is dropped and counted as drop_pool
                                                      [65536; 8192 with GSO passthrough]
  --batch N            packets read from one device per wake-up             [64]
  --tick D             interrupt coalescing: while traffic flows, wake at most once per D
                       and handle every arrival and release of that tick together; an
                       arrival after an idle spell is handled at once. Costs up to D of
                       extra delay per packet (mean about D/2), saves CPU   [50us]
  --rt-priority N      run under SCHED_FIFO with priority N (1-99) so that wake-ups stay
                       punctual while other processes load the CPUs; 0 = normal
                       scheduling. If not permitted, a warning and normal scheduling.
                       The kernel's RT throttling keeps 5 % of each CPU for others  [10]
  --quiet              no start-up line and no statistics on stdout at exit
  --self-test          run the built-in unit tests (no devices, no root) and exit
  -h, --help           show this help and exit

COUNTERS
  On SIGINT, SIGTERM or SIGHUP the emulator prints one JSON line of counters to stdout
  (unless --quiet), writes --stats FILE if given, and exits 0; SIGUSR1 prints and writes
  them without exiting. Top level: uptime_s, seed, tick_us, wakeups. Per direction ("ab" =
  A to B, "ba" = B to A): rx_packets, rx_bytes (IP bytes read), tx_packets, tx_bytes
  (written), drop_loss, drop_queue, drop_pool, drop_oversize, write_errors, reordered,
  gso_packets (super-packets passed whole; each counts once in the packet counters),
  queued (held now), max_queue_bytes and max_queue_ms (largest queueing + serialization
  delay seen), loss_measured_pct (drop_loss / rx_packets) and the configuration.

EXIT STATUS
  0 after a signal, 1 on a runtime error (one line on stderr), 2 on a usage error.

EXAMPLE
  qxfer-linkemu --a-ns qx-a --a-dev tun0 --b-ns qx-b --b-dev tun0 \\
      --delay 25ms --rate 500mbit --queue 50ms --loss 1% --seed 7 --stats /tmp/linkemu.json
"""

struct Options {
    enum Action { case run, help, selfTest }
    var action: Action = .run
    var aNS = "qx-a"
    var aDev = "tun0"
    var bNS = "qx-b"
    var bDev = "tun0"
    var ab = DirectionParams()
    var ba = DirectionParams()
    var seed: UInt64?
    var statsFile: String?
    var statsIntervalNs: Int64 = 0
    enum Offload: String { case auto, csum, none }
    var offload = Offload.auto
    var pool: Int?
    var batch = 64
    var rtPriority = 10
    var tickNs: Int64 = 50_000
    var quiet = false

    private static let linkKeys: Set<String> = [
        "delay", "jitter", "rate", "queue", "loss", "reorder", "reorder-delay", "overhead",
    ]
    private static let valueKeys: Set<String> = [
        "a-ns", "a-dev", "b-ns", "b-dev", "offload", "seed", "stats", "stats-interval", "pool", "batch", "tick", "rt-priority",
    ]

    private static func apply(_ key: String, _ value: String, to p: inout DirectionParams) throws(UsageError) {
        switch key {
        case "delay": p.delayNs = try Units.duration(value)
        case "jitter": p.jitterNs = try Units.duration(value)
        case "rate": p.rateBps = try Units.rate(value)
        case "queue": p.queueNs = try Units.duration(value)
        case "loss": p.loss = try Units.percent(value)
        case "reorder": p.reorder = try Units.percent(value)
        case "reorder-delay": p.reorderDelayNs = try Units.duration(value)
        case "overhead": p.overheadBytes = try Units.count(value, name: "--overhead", range: 0...1000)
        default: throw UsageError("unknown option '--\(key)'")
        }
    }

    static func parse(_ args: [String]) throws(UsageError) -> Options {
        var o = Options()
        var both: [(String, String)] = []
        var onlyAB: [(String, String)] = []
        var onlyBA: [(String, String)] = []
        var i = 0
        while i < args.count {
            let arg = args[i]
            i += 1
            if arg == "-h" || arg == "--help" { o.action = .help; return o }
            guard arg.hasPrefix("--"), arg.count > 2 else {
                throw UsageError("unexpected argument '\(arg)' (see --help)")
            }
            var key = String(arg.dropFirst(2))
            var inlineValue: String?
            if let eq = key.firstIndex(of: "=") {
                inlineValue = String(key[key.index(after: eq)...])
                key = String(key[..<eq])
            }
            switch key {
            case "self-test", "quiet":
                guard inlineValue == nil else { throw UsageError("option '--\(key)' takes no value") }
                if key == "quiet" { o.quiet = true } else { o.action = .selfTest }
                continue
            default: break
            }
            var base = key
            var dir = ""
            if key.hasSuffix("-ab") || key.hasSuffix("-ba") {
                base = String(key.dropLast(3))
                dir = String(key.suffix(2))
            }
            let isLink = linkKeys.contains(base)
            guard isLink || (dir.isEmpty && valueKeys.contains(key)) else {
                throw UsageError("unknown option '\(arg)' (see --help)")
            }
            let value: String
            if let inlineValue {
                value = inlineValue
            } else {
                guard i < args.count else { throw UsageError("option '--\(key)' needs a value") }
                value = args[i]
                i += 1
            }
            if isLink {
                // Validate now so the error names the flag as typed.
                var scratch = DirectionParams()
                do { try apply(base, value, to: &scratch) } catch { throw UsageError("--\(key): \(error.description)") }
                switch dir {
                case "ab": onlyAB.append((base, value))
                case "ba": onlyBA.append((base, value))
                default: both.append((base, value))
                }
                continue
            }
            switch key {
            case "a-ns": o.aNS = value
            case "a-dev": o.aDev = value
            case "b-ns": o.bNS = value
            case "b-dev": o.bDev = value
            case "seed":
                guard let s = UInt64(value) else { throw UsageError("--seed: invalid value '\(value)' (an integer 0...\(UInt64.max))") }
                o.seed = s
            case "stats":
                guard !value.isEmpty else { throw UsageError("--stats: empty file name") }
                o.statsFile = value
            case "stats-interval":
                do { o.statsIntervalNs = try Units.duration(value) } catch { throw UsageError("--stats-interval: \(error.description)") }
            case "offload":
                guard let m = Offload(rawValue: value) else { throw UsageError("--offload: invalid mode '\(value)' (auto, csum, none)") }
                o.offload = m
            case "tick":
                do { o.tickNs = try Units.duration(value) } catch { throw UsageError("--tick: \(error.description)") }
                guard o.tickNs <= 10_000_000 else { throw UsageError("--tick: at most 10ms") }
            case "rt-priority": o.rtPriority = try Units.count(value, name: "--rt-priority", range: 0...99)
            case "pool": o.pool = try Units.count(value, name: "--pool", range: 16...4_000_000)
            case "batch": o.batch = try Units.count(value, name: "--batch", range: 1...4096)
            default: throw UsageError("unknown option '\(arg)' (see --help)")
            }
        }
        for (k, v) in both { try apply(k, v, to: &o.ab); try apply(k, v, to: &o.ba) }
        for (k, v) in onlyAB { try apply(k, v, to: &o.ab) }
        for (k, v) in onlyBA { try apply(k, v, to: &o.ba) }
        if o.statsIntervalNs > 0 && o.statsFile == nil {
            throw UsageError("--stats-interval needs --stats FILE")
        }
        if o.statsIntervalNs > 0 && o.statsIntervalNs < 10_000_000 {
            throw UsageError("--stats-interval must be at least 10ms")
        }
        if o.aNS == o.bNS && o.aDev == o.bDev {
            throw UsageError("side A and side B name the same device (\(o.aDev) in \(o.aNS))")
        }
        return o
    }
}
