#!/usr/bin/env bash
# Realtime streaming over the emulated WAN: every mode on both stacks, and realtime mode's two
# loss repairs (FEC, NACK) side by side, at 50 ms RTT with 0 % and 1 % loss each way; with the
# config "srt:live:-", srt-live-transmit (Debian's srt-tools, default 120 ms latency) carries the
# same synthetic frames, sent and timed by a small UDP source and sink on each side; with
# "tcp:plain:bbr" or "tcp:plain:cubic", the same source writes the frames into one plain TCP
# connection (TCP_NODELAY, that congestion control) and the sink reads them from it.
#
#   bench/stream.sh [--duration S] [--loss "0 1"] [--configs "quic:realtime:fec quic:realtime:nack ..."]
#                   [--bitrate 4M] [--fps 30] [--deadline MS] [--seed N] [--prefix qxst-] [--results FILE]
#
# Needs root, /dev/net/tun, the link emulator (bench/netns) and a built qxfer:
#   swift build -c release --scratch-path .build-stream --product qxfer
#   swift build -c release --scratch-path .build-linkemu --product qxfer-linkemu
# Env: QXFER_BIN, LINKEMU_BIN override the binaries. Results: one JSON line per run (the
# receiver's final totals plus the scenario) in bench/results/stream-<time>.jsonl (or
# --results FILE), and a table
# on standard output. Namespaces, emulator, processes and temporary files are removed on exit,
# also on Ctrl-C.
set -u
cd "$(dirname "$0")/.."
. bench/netns/lib.sh

duration=20
losses="0 1"
configs="quic:realtime:fec quic:realtime:nack quic:realtime:both quic:stream-per-frame:- quic:reliable:- tls:reliable:- tls:realtime:-"
bitrate=4M
fps=30
deadline=150
seed=7
prefix=qxst-
results=
while [ $# -gt 0 ]; do
    case $1 in
        --duration) duration=$2; shift 2 ;;
        --loss) losses=$2; shift 2 ;;
        --configs) configs=$2; shift 2 ;;
        --bitrate) bitrate=$2; shift 2 ;;
        --fps) fps=$2; shift 2 ;;
        --deadline) deadline=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        --results) results=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) le_die "unknown argument '$1' (see --help)" ;;
    esac
done

qxfer=${QXFER_BIN:-}
if [ -z "$qxfer" ]; then
    for candidate in .build-stream/release/qxfer .build-stream/debug/qxfer; do
        [ -x "$candidate" ] && { qxfer=$PWD/$candidate; break; }
    done
fi
[ -n "$qxfer" ] && [ -x "$qxfer" ] || le_die "qxfer not built (swift build -c release --scratch-path .build-stream --product qxfer) and QXFER_BIN unset"
emu=$(le_bin) || exit 1
[ "$(id -u)" = 0 ] || le_die "must run as root (network namespaces)"
command -v jq >/dev/null || le_die "jq not installed"

failures=0

# run_srt OUT: one srt-live-transmit run (SRT's default 120 ms latency) with the same frames.
run_srt() {
    command -v srt-live-transmit >/dev/null || { echo "srt-live-transmit not installed (apt-get install srt-tools)" >&2; return 1; }
    ip netns exec "${prefix}b" python3 "$scratch/srtpeer.py" recv 127.0.0.1 7461 "$duration" "$fps" "$(bitrate_bps)" "$deadline" 30 >"$1" 2>"$scratch/recv.err" &
    local sink=$!
    ip netns exec "${prefix}b" srt-live-transmit -q "srt://:7460" "udp://127.0.0.1:7461" 2>"$scratch/srt-b.err" &
    srt_pids+=($!)
    ip netns exec "${prefix}a" srt-live-transmit -q "udp://127.0.0.1:7462" "srt://10.99.0.2:7460" 2>"$scratch/srt-a.err" &
    srt_pids+=($!)
    sleep 1
    ip netns exec "${prefix}a" python3 "$scratch/srtpeer.py" send 127.0.0.1 7462 "$duration" "$fps" "$(bitrate_bps)" "$deadline" 2>"$scratch/send.err"
    wait "$sink"
    local status=$?
    for pid in "${srt_pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    srt_pids=()
    return $status
}
# run_tcp OUT CC: the same frames over one plain TCP connection with congestion control CC.
run_tcp() {
    ip netns exec "${prefix}b" python3 "$scratch/srtpeer.py" tcprecv 10.99.0.2 7463 "$duration" "$fps" "$(bitrate_bps)" "$deadline" 30 "$2" >"$1" 2>"$scratch/recv.err" &
    local sink=$!
    srt_pids+=("$sink")
    for _ in $(seq 100); do
        ip netns exec "${prefix}b" ss -Hltn "sport = :7463" | grep -q . && break
        sleep 0.05
    done
    ip netns exec "${prefix}a" python3 "$scratch/srtpeer.py" tcpsend 10.99.0.2 7463 "$duration" "$fps" "$(bitrate_bps)" "$deadline" "$2" 2>"$scratch/send.err"
    local sent=$?
    wait "$sink"
    local status=$?
    srt_pids=()
    [ $sent = 0 ] || return $sent
    return $status
}
bitrate_bps() {
    case $bitrate in
        *[kK]) echo $(( ${bitrate%[kK]} * 1000 )) ;;
        *[mM]) echo $(( ${bitrate%[mM]} * 1000000 )) ;;
        *) echo "$bitrate" ;;
    esac
}
scratch=$(mktemp -d /tmp/qxfer-stream-bench.XXXXXX)
receiver_pid=
srt_pids=()
cleanup() {
    if [ -n "$receiver_pid" ]; then kill "$receiver_pid" 2>/dev/null; wait "$receiver_pid" 2>/dev/null; fi
    for pid in "${srt_pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    srt_pids=()
    receiver_pid=
    LE_QUIET=1 le_down "$prefix" >/dev/null 2>&1
    rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$qxfer" id --config-dir "$scratch/recv" >"$scratch/fingerprint" 2>/dev/null || le_die "qxfer id failed"
fingerprint=$(cat "$scratch/fingerprint")
if [ -z "$results" ]; then
    mkdir -p bench/results
    results=bench/results/stream-$(date -u +%Y%m%dT%H%M%SZ).jsonl
fi
port=7448

# The SRT comparison's source and sink: the synthetic source's frame sizes (keyframe every 30
# frames, 6x the others, +-10 %), cut into 1316-byte UDP packets (SRT's live payload) carrying
# frame index, packet index and count, and the capture time (CLOCK_REALTIME ns: both
# namespaces share the kernel's clock). The sink prints the same final JSON line as qxfer.
cat >"$scratch/srtpeer.py" <<'EOF'
import json, socket, struct, sys, time, random
role, address, port, duration, fps, bitrate, deadline_ms = sys.argv[1:8]
port, duration, fps, bitrate, deadline = int(port), float(duration), float(fps), float(bitrate), int(deadline_ms) * 1_000_000
frames = int(duration * fps)
header = struct.Struct("!IHHQ")
def sizes():
    per_frame = bitrate / 8 / fps
    delta = int(per_frame * 30 / (6 + 30 - 1))
    rng = random.Random(1)
    for i in range(frames):
        yield delta * 6 if i % 30 == 0 else delta * rng.randint(90, 110) // 100
if role in ("send", "tcpsend"):
    if role == "send":
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        emit = lambda packet: out.sendto(packet, (address, port))
    else:  # one TCP connection; a full send buffer blocks, and the frames behind wait (as they would)
        out = socket.create_connection((address, port))
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, sys.argv[8].encode())
        emit = out.sendall
    start = time.clock_gettime_ns(time.CLOCK_REALTIME) + 5_000_000
    for i, size in enumerate(sizes()):
        capture = start + i * 1_000_000_000 // int(fps)
        wait = (capture - time.clock_gettime_ns(time.CLOCK_REALTIME)) / 1e9
        if wait > 0: time.sleep(wait)
        count = max(1, -(-size // (1316 - header.size)))
        for k in range(count):
            emit(header.pack(i, k, count, capture).ljust(1316, b"\0"))
    out.close()
else:
    if role == "recv":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.bind((address, port))
        sock.settimeout(float(sys.argv[8]))  # first packet
    else:  # tcprecv: the packets arrive back to back in one byte stream, 1316 bytes each
        listener = socket.create_server((address, port))
        listener.settimeout(float(sys.argv[8]))
        conn, _ = listener.accept()
        conn.settimeout(None)
        pending = bytearray()
        class Stream:
            def settimeout(self, _): pass
            def recv(self, _):
                while len(pending) < 1316:
                    chunk = conn.recv(1 << 16)
                    if not chunk: raise socket.timeout  # the sender closed: end of the run
                    pending.extend(chunk)
                packet = bytes(pending[:1316]); del pending[:1316]
                return packet
        sock = Stream()
    seen, done, latencies, late, received = {}, set(), [], 0, 0
    jitter, last = 0.0, None
    first = last_arrival = None
    while True:
        try:
            data = sock.recv(2048)
        except socket.timeout:
            break
        sock.settimeout(3.0)
        now = time.clock_gettime_ns(time.CLOCK_REALTIME)
        first = first or now; last_arrival = now
        index, k, count, capture = header.unpack_from(data)
        received += len(data)
        if index in done: continue
        seen.setdefault(index, set()).add(k)
        if len(seen[index]) == count:
            done.add(index); del seen[index]
            latency = now - capture
            latencies.append(latency)
            if latency > deadline: late += 1
            if last is not None: jitter += (abs(latency - last) - jitter) / 16
            last = latency
    latencies.sort()
    def pct(p): return round(latencies[min(len(latencies) - 1, int(len(latencies) * p / 100))] / 1e6, 3) if latencies else 0
    delivered = len(latencies) - late
    span = (last_arrival - first) / 1e9 if first and last_arrival and last_arrival > first else 0
    print(json.dumps({"final": True, "frames_sent": frames, "frames_delivered": delivered, "frames_late": late,
        "frames_lost": frames - len(latencies), "delivered_ratio": round(delivered / frames, 6),
        "latency_ms": {"p50": pct(50), "p95": pct(95), "p99": pct(99), "max": round(latencies[-1] / 1e6, 3) if latencies else 0},
        "jitter_ms": round(jitter / 1e6, 3), "bitrate_bps": int(received * 8 / span) if span else 0,
        "mode": "srt-live" if role == "recv" else "tcp", "stack": "srt" if role == "recv" else "tcp",
        "repair": "arq" if role == "recv" else sys.argv[9], "clock_offset_ms": 0}, sort_keys=True, separators=(",", ":")))
EOF

printf '%-6s %-5s %-17s %-5s %9s %8s %8s %8s %8s %8s %8s %9s\n' \
    loss stack mode fix on-time late lost p50 p95 p99 max "Mbit/s"
for loss in $losses; do
    LE_QUIET=1 le_down "$prefix" >/dev/null 2>&1
    LE_QUIET=1 le_up "$prefix" 1500 10.99.0 "$emu" 1 --delay 25ms --rate 500mbit --queue 50ms --loss "${loss}%" --seed "$seed" \
        || le_die "link emulator did not start"
    for config in $configs; do
        IFS=: read -r stack mode repair <<<"$config"
        repair_flag=()
        [ "$repair" != "-" ] && repair_flag=(--repair "$repair")
        out=$scratch/recv.out
        rm -f "$scratch/send.out"
        if [ "$stack" = srt ]; then
            run_srt "$out"
            status=$?
        elif [ "$stack" = tcp ]; then
            run_tcp "$out" "$repair"
            status=$?
        else
        ip netns exec "${prefix}b" "$qxfer" stream recv --port "$port" --json --config-dir "$scratch/recv" >"$out" 2>"$scratch/recv.err" &
        receiver_pid=$!
        for _ in $(seq 100); do
            ip netns exec "${prefix}b" ss -ltn | grep -q ":$port " && break
            sleep 0.05
        done
        ip netns exec "${prefix}a" "$qxfer" stream send "10.99.0.2:$port" --stack "$stack" --mode "$mode" "${repair_flag[@]}" \
            --duration "$duration" --bitrate "$bitrate" --fps "$fps" --deadline "$deadline" \
            --fingerprint "$fingerprint" --config-dir "$scratch/send" --json >"$scratch/send.out" 2>"$scratch/send.err"
        status=$?
        wait "$receiver_pid" 2>/dev/null
        receiver_pid=
        fi
        final=$(grep '"final":true' "$out" | tail -n 1)
        if [ $status != 0 ] || [ -z "$final" ]; then
            echo "run failed: loss $loss $config (sender exit $status): $(tail -n 1 "$scratch/send.err") $(tail -n 1 "$scratch/recv.err")" >&2
            failures=$((failures + 1))
            continue
        fi
        # The sender's warm-up before the first frame (QUIC realtime and stream-per-frame).
        warm_up=$(grep -hs '"warm_up"' "$scratch/send.out" | tail -n 1)
        [ -n "$warm_up" ] || warm_up='{}'
        echo "$final" | jq -c --argjson warm "$warm_up" --arg loss "$loss" --arg bitrate "$bitrate" --argjson fps "$fps" --argjson deadline "$deadline" \
            --argjson duration "$duration" --arg requested_mode "$mode" \
            '. + {loss_percent: ($loss|tonumber), rtt_ms_link: 50, bitrate: $bitrate, fps: $fps, deadline_ms: $deadline,
                  duration_s: $duration, requested_mode: $requested_mode} + $warm' >>"$results"
        echo "$final" | jq -r --arg loss "$loss%" --arg stack "$stack" --arg mode "$mode" --arg repair "$repair" \
            '[$loss, $stack, $mode, $repair,
              "\(.delivered_ratio * 100 | . * 100 | round / 100)%", .frames_late, .frames_lost,
              .latency_ms.p50, .latency_ms.p95, .latency_ms.p99, .latency_ms.max, (.bitrate_bps / 1e6 | . * 100 | round / 100)]
             | @tsv' | awk -F'\t' '{ printf "%-6s %-5s %-17s %-5s %9s %8s %8s %8s %8s %8s %8s %9s\n", $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12 }'
    done
    stats=$(LE_QUIET=1 le_down "$prefix" | tail -n 1)
    echo "link (loss $loss %): $(echo "$stats" | jq -c '{ab_lost: .ab.drop_loss, ab_queue_drops: .ab.drop_queue, ba_lost: .ba.drop_loss}' 2>/dev/null)" >&2
done
echo "results: $results" >&2
[ "$failures" = 0 ] || { echo "$failures runs failed" >&2; exit 1; }
