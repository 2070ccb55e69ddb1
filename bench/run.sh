#!/usr/bin/env bash
# The benchmarks side by side in one go: file transfer (bench/transfer.sh), 1 KiB cold start
# (bench/small.sh), many small files (bench/small-files.sh: 2000 files over the emulated 50 ms
# path, 10 000 over loopback, medians of 3), a sparse disk image (bench/sparse.sh: 1 GiB
# holding 32 MiB, beside rsync --sparse and scp), how long a receiver stays after its sender
# (bench/endings.sh), across NATs beside magic-wormhole (bench/reach.sh) and streaming
# (bench/stream.sh), then the tables
# (bench/report.py) in bench/results/report-DATE.md and the plots beside it.
#
#     bench/run.sh quick     # make bench: 256 MiB x 1 run, 30 s cap, 3 small runs, 10 s streams with 1 % loss
#     bench/run.sh full      # make bench-full: 1 GiB x 3 runs, every tool, 60 s cap, 9 small runs, 2 x 20 s streams at 0 and 1 % loss
#     PUBLISH=1 bench/run.sh full   # also copy the plots to docs/ (bench-throughput.png, bench-stream-latency.png)
#
# Env: SCRATCH (swift build --scratch-path for the release build, default .build-bench), QXFER
# (a built qxfer; then qxfer-linkemu is taken from beside it and nothing is built), QXFER_BASELINE
# (another qxfer, e.g. the commit before a change: every benchmark runs it too, in the same run,
# and the report sets it beside this one). Runs as root.
#
#     QXFER_BASELINE=../before/.build-bench/release/qxfer make bench
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-quick}
case $mode in
    quick)
        transfer_env=(BYTES=256MiB RUNS=1 CAP=30 "TOOLS=qxfer-quic qxfer-tls ${QXFER_BASELINE:+baseline-quic baseline-tls} scp rsync iperf3-cubic iperf3-bbr ngtcp2-cubic ngtcp2-bbr")
        small_runs=3
        stream_args=(--duration 10 --loss 1 --configs "quic:realtime:both quic:reliable:- tls:reliable:- srt:live:- tcp:plain:bbr")
        stream_repeats=1 ;;
    full)
        transfer_env=(BYTES=1GiB RUNS=3 CAP=60)
        small_runs=9
        stream_args=(--duration 20 --loss "0 1" --configs "quic:realtime:both quic:realtime:fec quic:realtime:nack quic:stream-per-frame:- quic:reliable:- tls:reliable:- srt:live:- tcp:plain:bbr tcp:plain:cubic")
        stream_repeats=2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/run.sh: unknown mode '$mode' (quick or full)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "bench/run.sh: run as root (network namespaces, sshd)" >&2; exit 1; }

. bench/build.sh
bench_build_qxfer "${SCRATCH:-.build-bench}"
export QXFER QXFER_BIN=$QXFER

stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p bench/results
report=bench/results/report-$stamp.md
stream_results=bench/results/stream-$stamp.jsonl
describe() {
    echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ { print $2 }') GiB, Linux $(uname -r); load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%dT%H:%MZ)"
}

echo "== file transfer (${transfer_env[*]})" >&2
transfer_out=$(mktemp /tmp/qxfer-run.XXXXXX)
trap 'rm -f "$transfer_out"' EXIT
env "${transfer_env[@]}" bench/transfer.sh | tee "$transfer_out"
transfer_csv=$(sed -n 's/^CSV: //p' "$transfer_out")

echo "== 1 KiB over 50 ms RTT ($small_runs runs)" >&2
small_out=$(RUNS=$small_runs bench/small.sh)
echo "$small_out"

echo "== many small files (3 runs)" >&2
small_files_out=$(RUNS=3 bench/small-files.sh)
echo "$small_files_out"

echo "== a sparse disk image (3 runs)" >&2
sparse_out=$(RUNS=3 bench/sparse.sh)
echo "$sparse_out"

echo "== a receiver after its sender ($small_runs runs)" >&2
endings_out=$(RUNS=$small_runs bench/endings.sh)
echo "$endings_out"

echo "== across NATs, beside magic-wormhole ($small_runs runs of 1 MiB, 256 MiB direct and relayed)" >&2
reach_out=$(RUNS=$small_runs BIG=256MiB bench/reach.sh)
echo "$reach_out"

echo "== streaming (${stream_args[*]}, $stream_repeats times)" >&2
stream_baseline_results=bench/results/stream-baseline-$stamp.jsonl
for _ in $(seq "$stream_repeats"); do
    bench/stream.sh "${stream_args[@]}" --results "$stream_results" >&2
    if [ -n "${QXFER_BASELINE:-}" ]; then  # the same streams from the baseline binary, alternating
        QXFER_BIN=$QXFER_BASELINE bench/stream.sh "${stream_args[@]}" --results "$stream_baseline_results" >&2
    fi
done

{
    echo "# Benchmark run $stamp ($mode)"
    echo
    describe
    echo
    echo "## File transfer: \`env ${transfer_env[*]} bench/transfer.sh\`"
    echo
    python3 bench/report.py transfer "$transfer_csv"
    echo
    echo "## 1 KiB over 50 ms RTT: \`RUNS=$small_runs bench/small.sh\`"
    echo
    echo "$small_out" | sed -n '/^|/p;/^Process start/p'
    echo
    echo "## Many small files: \`RUNS=3 bench/small-files.sh\`"
    echo
    echo "$small_files_out" | sed -n '/^|/p'
    echo
    echo "## A sparse disk image: \`RUNS=3 bench/sparse.sh\`"
    echo
    echo "$sparse_out" | sed -n '/^|/p'
    echo
    echo "## A receiver after its sender: \`RUNS=$small_runs bench/endings.sh\`"
    echo
    echo "$endings_out" | sed -n '/^|/p'
    echo
    echo "## Across NATs, beside magic-wormhole: \`RUNS=$small_runs BIG=256MiB bench/reach.sh\`"
    echo
    echo "$reach_out" | sed -n '/^|/p'
    echo
    echo "## Streaming: \`bench/stream.sh ${stream_args[*]}\` ($stream_repeats times)"
    echo
    python3 bench/report.py stream "$stream_results"
    echo
    if [ -n "${QXFER_BASELINE:-}" ]; then
        echo "The same streams from the baseline ($QXFER_BASELINE):"
        echo
        python3 bench/report.py stream "$stream_baseline_results"
        echo
    fi
    echo "Results: $transfer_csv, $(echo "$small_out" | sed -n 's/^CSV: //p'), $(echo "$small_files_out" | sed -n 's/^CSV: //p'), $(echo "$sparse_out" | sed -n 's/^CSV: //p'), $(echo "$reach_out" | sed -n 's/^CSV: //p'), $stream_results${QXFER_BASELINE:+, $stream_baseline_results}"
} >"$report"
# Debian's python3-matplotlib lives in /usr/bin/python3's path; another python3 may come first.
plotter=python3
python3 -c 'import matplotlib' 2>/dev/null || plotter=/usr/bin/python3
"$plotter" bench/report.py plot --transfer "$transfer_csv" --stream "$stream_results" --out bench/results >&2
for png in bench-throughput bench-stream-latency; do mv "bench/results/$png.png" "bench/results/$png-$stamp.png"; done
if [ -n "${PUBLISH:-}" ]; then
    cp "bench/results/bench-throughput-$stamp.png" docs/bench-throughput.png
    cp "bench/results/bench-stream-latency-$stamp.png" docs/bench-stream-latency.png
fi
echo
cat "$report"
echo
echo "report: $report (plots: bench/results/bench-*-$stamp.png)"
