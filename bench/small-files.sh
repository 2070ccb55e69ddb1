#!/usr/bin/env bash
# Many small files side by side in one run (issue 21): `qxfer send` of a folder tree over QUIC and
# over TCP+TLS against rsync over ssh and scp -r, interleaved, medians of RUNS (default 3):
#
#   wan       2000 files of 1-8 KiB in 40 folders over the emulated path (25 ms each way,
#             500 Mbit/s, 50 ms queue: bench/netns, qxfer-linkemu between two namespaces)
#   loopback  10 000 files of 4 KiB in 100 folders, both ends in one namespace over lo
#   many      200 000 files of 1-64 bytes in 2 000 folders over lo: a tree whose offer is
#             longer than one qxfer/1 frame (25 MB; docs/PROTOCOL.md §3.9). Not in the
#             default CONDITIONS (each run keeps 200 000 files: RUNS=1 is plenty)
#
#     bench/small-files.sh                         # both conditions, 3 runs
#     RUNS=5 CONDITIONS=wan QXFER=path/to/qxfer bench/small-files.sh
#     TOOLS="qxfer-quic rsync" bench/small-files.sh
#     QXFER_BASELINE=path/to/older/qxfer bench/small-files.sh   # adds baseline-quic, baseline-tls
#
# Each run is the wall time of the sending process (start to exit, handshake included); the
# receiver (qxfer recv, or the sshd session) runs before and after. A run still going after CAP
# seconds (default 30) is stopped and counted with the files that had arrived (scp pays a round
# trip or more per file: about 5 files/s over the 50 ms path, 7 minutes for 2000 files). qxfer's receiver makes every
# file and folder durable (fsync, or one syncfs for many files) before it reports Complete; rsync and scp sync nothing (the comparison is as a
# user meets it). The target is removed before each run and every received tree is compared with
# the source. Each run receives into an empty folder and nothing received is deleted before the
# end: ext4 makes creating files slow for a minute or more after many deletions (its inode
# allocator skips recently freed inodes; perf showed 65 % of qxfer's receiver in
# ext4_create -> recently_deleted), which would charge one contender's leftovers to the next.
# Prints a table with the median time, files per second and the ratio to rsync's time
# and files per second in the same run; the CSV goes to bench/results/small-files-DATE.csv.
# The issue's targets: wan, both stacks <= 0.5x rsync's time; loopback, >= 3x rsync's files/s.
# Env: QXFER (a built qxfer; qxfer-linkemu from beside it), else a release build in SCRATCH
# (default .build-bench); QXFER_BASELINE, another qxfer (e.g. before a change) run in the same
# run as baseline-quic and baseline-tls against a receiver of its own. Runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
CONDITIONS=${CONDITIONS:-wan loopback}
TOOLS=${TOOLS:-qxfer-quic qxfer-tls ${QXFER_BASELINE:+baseline-quic baseline-tls} rsync scp}
CAP=${CAP:-30}
SCRATCH=${SCRATCH:-.build-bench}
. bench/file-peers.sh
bench_file_peers_init bench/small-files.sh qsf

# make_tree DIR FILES FOLDERS MIN MAX: FILES files of MIN..MAX bytes (random sizes and bytes,
# fixed seed) spread over FOLDERS folders.
make_tree() {
    python3 - "$@" <<'EOF'
import os, random, sys
root, files, folders, low, high = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(21)
for i in range(files):
    folder = os.path.join(root, f"dir{i % folders:03d}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"file{i:05d}.bin"), "wb") as f:
        f.write(rng.randbytes(rng.randint(low, high)))
EOF
}
# One digest of a tree: every file's relative path and bytes, in name order.
# (xxhsum prints each file's digest beside its name; one process per few thousand files.)
tree_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r xxhsum -H2) | xxhsum -H2 - | cut -d' ' -f1; }

CSV=bench/results/small-files-$(date +%Y%m%d-%H%M%S).csv
echo "condition,tool,run,files,bytes,seconds,load1,complete,arrived" >"$CSV"

for condition in $CONDITIONS; do
    rm -rf "$WORK/tree"
    case $condition in
        wan) make_tree "$WORK/tree" 2000 40 1024 8192 ;;
        loopback) make_tree "$WORK/tree" 10000 100 4096 4096 ;;
        many) make_tree "$WORK/tree" 200000 2000 1 64 ;;
        *) echo "small-files: unknown condition '$condition' (wan, loopback, many)" >&2; exit 2 ;;
    esac
    bench_path_up "$([ "$condition" = many ] && echo loopback || echo "$condition")" 10.99.78
    files=$(find "$WORK/tree" -type f | wc -l)
    bytes=$(find "$WORK/tree" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
    sum=$(tree_sum "$WORK/tree")
    echo "== $condition: $files files, $bytes bytes, $RUNS runs (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    bench_receivers_start "$WORK/dst"
    for run in $(seq 1 "$RUNS"); do
        for tool in $TOOLS; do
            bench_send "$tool" "$WORK/tree" "$WORK/dst" -a
            complete=1
            if [ "$STATUS" = 124 ]; then
                complete=0
                sleep 0.5  # the receiving side's last writes
            else
                [ "$(tree_sum "$WORK/dst/tree")" = "$sum" ] || { echo "bench: $tool delivered a different tree" >&2; exit 1; }
            fi
            arrived=$(find "$WORK/dst/tree" -type f ! -name '.*' 2>/dev/null | wc -l)
            echo "$condition,$tool,$run,$files,$bytes,$SECONDS_TAKEN,$(cut -d' ' -f1 /proc/loadavg),$complete,$arrived" | tee -a "$CSV" >&2
            mkdir -p "$WORK/kept"
            mv "$WORK/dst/tree" "$WORK/kept/$condition-$tool-$run" 2>/dev/null || true  # removed at the end
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
    # files/s: of a stopped run, the files that had arrived by then.
    rate = int(row["arrived"]) / float(row["seconds"])
    runs.setdefault((row["condition"], int(row["files"]), int(row["bytes"])), {}).setdefault(row["tool"], []).append(
        (float(row["seconds"]), rate, row["complete"] == "1"))
print("| condition | files | tool | median s | files/s | time vs rsync | files/s vs rsync |")
print("|---|---|---|---|---|---|---|")
for (condition, files, size), tools in runs.items():
    rsync = tools.get("rsync")
    for tool, results in tools.items():
        seconds = statistics.median(r[0] for r in results)
        rate = statistics.median(r[1] for r in results)
        stopped = "" if all(r[2] for r in results) else " (stopped at CAP)"
        shown = f"> {seconds:.1f}" if stopped else f"{seconds:.3f}"
        vs = f"{seconds / statistics.median(r[0] for r in rsync):.2f}x" if rsync else "-"
        fs = f"{rate / statistics.median(r[1] for r in rsync):.2f}x" if rsync else "-"
        print(f"| {condition} | {files} ({size / 1e6:.1f} MB) | {tool}{stopped} | {shown} | {rate:.0f} | {vs} | {fs} |")
EOF
echo
echo "CSV: $CSV"
