#!/usr/bin/env bash
# A sparse file side by side in one run: `qxfer send` of a disk image (SIZE apparent, DATA_MIB of
# data in 16 runs spread over it, holes elsewhere) over QUIC and over TCP+TLS against rsync
# --sparse over ssh and scp, interleaved, medians of RUNS (default 3):
#
#   wan       the emulated path (25 ms each way, 500 Mbit/s, 50 ms queue: bench/netns,
#             qxfer-linkemu between two namespaces)
#   loopback  both ends in one namespace over lo
#
#     bench/sparse.sh                                  # both conditions, 3 runs, 1 GiB
#     RUNS=5 SIZE=4G CONDITIONS=wan QXFER=path/to/qxfer bench/sparse.sh
#     QXFER_BASELINE=path/to/older/qxfer bench/sparse.sh   # adds baseline-quic, baseline-tls
#
# Each run is the wall time of the sending process (start to exit, handshake included), and the
# space the received image takes (`stat` blocks); every received image is compared with the
# source. qxfer sends a hole as one Zeros message (docs/PROTOCOL.md §3.8) and writes no block of
# zeros; rsync --sparse sends the zeros and seeks over them when writing; scp sends and writes
# them. A run still going after CAP seconds (default 120) is stopped and counted as such.
# Prints a table with the median time, the median space on the receiver, and the ratio to
# rsync's time in the same run; the CSV goes to bench/results/sparse-DATE.csv.
# Env: QXFER (a built qxfer; qxfer-linkemu from beside it), else a release build in SCRATCH
# (default .build-bench). Runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
CONDITIONS=${CONDITIONS:-wan loopback}
SIZE=${SIZE:-1G}
DATA_MIB=${DATA_MIB:-32}
TOOLS=${TOOLS:-qxfer-quic qxfer-tls ${QXFER_BASELINE:+baseline-quic baseline-tls} rsync scp}
CAP=${CAP:-120}
SCRATCH=${SCRATCH:-.build-bench}
PREFIX=qsp$$
[ "$(id -u)" = 0 ] || { echo "bench/sparse.sh: run as root (namespaces, sshd)" >&2; exit 1; }
for tool in scp rsync xxhsum python3; do
    command -v "$tool" >/dev/null || { echo "bench/sparse.sh: $tool missing (make bench-deps)" >&2; exit 1; }
done
[ -x /usr/sbin/sshd ] || { echo "bench/sparse.sh: sshd missing (make bench-deps)" >&2; exit 1; }

if [ -z "${QXFER:-}" ]; then
    echo "building qxfer and qxfer-linkemu (release, --scratch-path $SCRATCH)" >&2
    swift build -c release --static-swift-stdlib --scratch-path "$SCRATCH" --product qxfer >&2
    swift build -c release --static-swift-stdlib --scratch-path "$SCRATCH" --product qxfer-linkemu >&2
    QXFER="$(swift build -c release --scratch-path "$SCRATCH" --show-bin-path)/qxfer"
fi
export LINKEMU_BIN=${LINKEMU_BIN:-$(dirname "$QXFER")/qxfer-linkemu}

WORK=$(mktemp -d /tmp/qxfer-sparse.XXXXXX)
RECV_PIDS=()
stop_receivers() {
    local pid
    for pid in "${RECV_PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    for pid in "${RECV_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    RECV_PIDS=()
}
cleanup() {
    stop_receivers
    [ ! -s "$WORK/sshd.pid" ] || kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The image: SIZE bytes, DATA_MIB MiB of random data in 16 equal runs at even intervals.
mkdir -p "$WORK/src"
truncate -s "$SIZE" "$WORK/src/disk.img"
size=$(stat -c %s "$WORK/src/disk.img")
python3 - "$WORK/src/disk.img" "$size" "$DATA_MIB" <<'EOF'
import os, random, sys
path, size, data_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
run = data_mib * 1048576 // 16
with open(path, "r+b") as f:
    for i in range(16):
        f.seek(i * (size // 16))
        f.write(rng.randbytes(min(run, size // 16)))
EOF
sum=$(xxhsum -H2 "$WORK/src/disk.img" | cut -d' ' -f1)
source_blocks=$(( $(stat -c '%b * %B' "$WORK/src/disk.img") ))

. bench/sshd.sh
bench_sshd_setup "$WORK"
mkdir -p bench/results
FP=$("$QXFER" id --config-dir "$WORK/cfg-recv")
[ -z "${QXFER_BASELINE:-}" ] || "$QXFER_BASELINE" id --config-dir "$WORK/cfg-recv" >/dev/null  # same identity
"$QXFER" id --config-dir "$WORK/cfg-send" >/dev/null
CSV=bench/results/sparse-$(date +%Y%m%d-%H%M%S).csv
echo "condition,tool,run,size,source_allocated,seconds,allocated,load1,complete" >"$CSV"

for condition in $CONDITIONS; do
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    case $condition in
        wan)
            LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.79 -- --delay 25ms --rate 500mbit --queue 50ms >/dev/null
            RECV_NS=${PREFIX}b; HOST=10.99.79.2 ;;
        loopback)
            LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.79 --no-emu >/dev/null
            RECV_NS=${PREFIX}a; HOST=127.0.0.1 ;;
        *) echo "bench/sparse.sh: unknown condition '$condition' (wan, loopback)" >&2; exit 2 ;;
    esac
    SEND_NS=${PREFIX}a
    echo "== $condition: $size bytes, $source_blocks allocated, $RUNS runs (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    ip netns exec "$RECV_NS" /usr/sbin/sshd -f "$WORK/sshd_config" -E "$WORK/sshd.log"
    mkdir -p "$WORK/dst"
    ip netns exec "$RECV_NS" "$QXFER" recv --config-dir "$WORK/cfg-recv" --dir "$WORK/dst" --yes --port 7447 --no-advertise >/dev/null 2>"$WORK/recv.err" &
    RECV_PIDS+=($!)
    if [ -n "${QXFER_BASELINE:-}" ]; then
        ip netns exec "$RECV_NS" "$QXFER_BASELINE" recv --config-dir "$WORK/cfg-recv" --dir "$WORK/dst" --yes --port 7448 --no-advertise >/dev/null 2>"$WORK/recv-baseline.err" &
        RECV_PIDS+=($!)
    fi
    sleep 0.5
    for run in $(seq 1 "$RUNS"); do
        for tool in $TOOLS; do
            rm -f "$WORK/dst/disk.img"
            sync  # each run starts without the previous one's dirty pages
            case $tool in
                qxfer-quic|qxfer-tls) command=("$QXFER" send --config-dir "$WORK/cfg-send" "$WORK/src/disk.img" "$HOST:7447" --stack "${tool#qxfer-}" --fingerprint "$FP") ;;
                baseline-quic|baseline-tls) command=("$QXFER_BASELINE" send --config-dir "$WORK/cfg-send" "$WORK/src/disk.img" "$HOST:7448" --stack "${tool#baseline-}" --fingerprint "$FP") ;;
                rsync) command=(rsync --sparse -e "ssh ${SSH_OPTS[*]}" "$WORK/src/disk.img" "root@$HOST:$WORK/dst/") ;;
                scp) command=(scp -q "${SSH_OPTS[@]}" "$WORK/src/disk.img" "root@$HOST:$WORK/dst/") ;;
                *) echo "bench/sparse.sh: unknown tool '$tool'" >&2; exit 2 ;;
            esac
            start=$(date +%s%N)
            status=0
            ip netns exec "$SEND_NS" timeout -s INT "$CAP" "${command[@]}" >/dev/null 2>"$WORK/send.err" || status=$?
            seconds=$(awk -v s="$start" -v e="$(date +%s%N)" 'BEGIN { printf "%.4f", (e - s) / 1e9 }')
            complete=1
            if [ "$status" = 124 ]; then
                complete=0
            else
                [ "$status" = 0 ] || { cat "$WORK/send.err" "$WORK/recv.err" >&2; exit 1; }
                [ "$(xxhsum -H2 "$WORK/dst/disk.img" | cut -d' ' -f1)" = "$sum" ] || { echo "bench: $tool delivered a different image" >&2; exit 1; }
            fi
            allocated=$(( $(stat -c '%b * %B' "$WORK/dst/disk.img" 2>/dev/null || echo 0) ))
            echo "$condition,$tool,$run,$size,$source_blocks,$seconds,$allocated,$(cut -d' ' -f1 /proc/loadavg),$complete" | tee -a "$CSV" >&2
        done
    done
    stop_receivers
    kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true; rm -f "$WORK/sshd.pid"
done

echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); medians of $RUNS; $(date -u +%Y-%m-%dT%H:%MZ)"
echo
python3 - "$CSV" <<'EOF'
import csv, statistics, sys
runs = {}
for row in csv.DictReader(open(sys.argv[1])):
    key = (row["condition"], int(row["size"]), int(row["source_allocated"]))
    runs.setdefault(key, {}).setdefault(row["tool"], []).append((float(row["seconds"]), int(row["allocated"]), row["complete"] == "1"))
print("| condition | image (allocated) | tool | median s | on the receiver | time vs rsync --sparse |")
print("|---|---|---|---|---|---|")
for (condition, size, allocated), tools in runs.items():
    rsync = tools.get("rsync")
    for tool, results in tools.items():
        seconds = statistics.median(r[0] for r in results)
        space = statistics.median(r[1] for r in results)
        stopped = "" if all(r[2] for r in results) else " (stopped at CAP)"
        shown = f"> {seconds:.1f}" if stopped else f"{seconds:.3f}"
        vs = f"{seconds / statistics.median(r[0] for r in rsync):.3f}x" if rsync else "-"
        print(f"| {condition} | {size / 2**30:.1f} GiB ({allocated / 2**20:.0f} MiB) | {tool}{stopped} | {shown} | {space / 2**20:.1f} MiB | {vs} |")
EOF
echo
echo "CSV: $CSV"
