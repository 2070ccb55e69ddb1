#!/usr/bin/env bash
# A sparse file side by side in one run: `qxfer send` of a disk image (SIZE apparent, DATA_MIB of
# data in 16 runs spread over it, holes elsewhere) over QUIC and over TCP+TLS against rsync
# --sparse over ssh and scp, interleaved, medians of RUNS (default 3):
#
#   wan       the emulated path (25 ms each way, 500 Mbit/s, 50 ms queue: bench/netns,
#             qxfer-linkemu between two namespaces)
#   loopback  both ends in one namespace over lo
#   (by name in CONDITIONS also veth, a veth pair at MTU 1500, and wan-loss, wan with 1 % loss)
#
#     bench/sparse.sh                                  # both conditions, 3 runs, 1 GiB
#     RUNS=5 SIZE=4G CONDITIONS=wan QXFER=path/to/qxfer bench/sparse.sh
#     QXFER_BASELINE=path/to/older/qxfer bench/sparse.sh   # adds baseline-quic, baseline-tls
#
# Each run is the wall time of the sending process (start to exit, handshake included), its CPU
# time and peak RSS (ssh's included for rsync and scp), and the space the received image takes
# (`stat` blocks); every received image is compared with the
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
. bench/file-peers.sh
bench_file_peers_init bench/sparse.sh qsp

# The image: SIZE bytes, DATA_MIB MiB of random data in 16 equal runs at even intervals.
mkdir -p "$WORK/src"
truncate -s "$SIZE" "$WORK/src/disk.img"
size=$(stat -c %s "$WORK/src/disk.img")
python3 - "$WORK/src/disk.img" "$size" "$DATA_MIB" <<'EOF'
import random, sys
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

CSV=bench/results/sparse-$(date +%Y%m%d-%H%M%S).csv
echo "condition,tool,run,size,source_allocated,seconds,allocated,sender_cpu_s,sender_rss_kib,load1,complete" >"$CSV"

for condition in $CONDITIONS; do
    bench_path_up "$condition" 10.99.79
    echo "== $condition: $size bytes, $source_blocks allocated, $RUNS runs (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    bench_receivers_start "$WORK/dst"
    for run in $(seq 1 "$RUNS"); do
        for tool in $TOOLS; do
            rm -f "$WORK/dst/disk.img"
            bench_send "$tool" "$WORK/src/disk.img" "$WORK/dst" --sparse
            complete=1
            if [ "$STATUS" = 124 ]; then
                complete=0
            else
                [ "$(xxhsum -H2 "$WORK/dst/disk.img" | cut -d' ' -f1)" = "$sum" ] || { echo "bench: $tool delivered a different image" >&2; exit 1; }
            fi
            allocated=$(( $(stat -c '%b * %B' "$WORK/dst/disk.img" 2>/dev/null || echo 0) ))
            echo "$condition,$tool,$run,$size,$source_blocks,$SECONDS_TAKEN,$allocated,$SEND_CPU,$SEND_RSS_KIB,$(cut -d' ' -f1 /proc/loadavg),$complete" | tee -a "$CSV" >&2
        done
    done
    bench_receivers_stop
done

echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); medians of $RUNS; $(date -u +%Y-%m-%dT%H:%MZ)"
echo
python3 - "$CSV" <<'EOF'
import csv, statistics, sys
runs = {}
for row in csv.DictReader(open(sys.argv[1])):
    key = (row["condition"], int(row["size"]), int(row["source_allocated"]))
    runs.setdefault(key, {}).setdefault(row["tool"], []).append(
        (float(row["seconds"]), int(row["allocated"]), row["complete"] == "1", float(row["sender_cpu_s"]), int(row["sender_rss_kib"])))
print("| condition | image (allocated) | tool | median s | on the receiver | sender CPU s | sender peak RSS MiB | time vs rsync --sparse |")
print("|---|---|---|---|---|---|---|---|")
for (condition, size, allocated), tools in runs.items():
    rsync = tools.get("rsync")
    for tool, results in tools.items():
        seconds = statistics.median(r[0] for r in results)
        space = statistics.median(r[1] for r in results)
        stopped = "" if all(r[2] for r in results) else " (stopped at CAP)"
        shown = f"> {seconds:.1f}" if stopped else f"{seconds:.3f}"
        vs = f"{seconds / statistics.median(r[0] for r in rsync):.3f}x" if rsync else "-"
        cpu = statistics.median(r[3] for r in results)
        rss = max(r[4] for r in results) / 1024
        print(f"| {condition} | {size / 2**30:.1f} GiB ({allocated / 2**20:.0f} MiB) | {tool}{stopped} | {shown} | {space / 2**20:.1f} MiB | {cpu:.2f} | {rss:.0f} | {vs} |")
EOF
echo
echo "CSV: $CSV"
