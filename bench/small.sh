#!/usr/bin/env bash
# A 1 KiB file over the emulated 50 ms RTT link (25 ms each way, 500 Mbit/s, 50 ms queue), cold
# start to exit: the wall time of the process that finishes the transfer (qxfer send on each
# stack, scp, rsync over ssh; for the ngtcp2 example pair the client, which downloads), handshake
# and process start included, median of RUNS (default 7) interleaved runs, and the same in RTTs.
# Each qxfer send, scp and rsync is a new process with a new connection; no connection is reused
# (ssh no ControlMaster; gtlsclient no --session-file). qxfer-quic is a sender that never met the
# receiver (no session ticket); qxfer-quic-known one that sent to the same receiver just before,
# untimed, and resumes its TLS session with the ticket it kept (the known-receiver target);
# qxfer-auto-known the same with the default --stack auto (QUIC leads alone with early data).
#
#     bench/small.sh                    # 7 runs of each
#     RUNS=11 QXFER=path/to/qxfer bench/small.sh
#     QXFER_BASELINE=path/to/older/qxfer bench/small.sh   # adds its baseline-quic, -quic-known, -tls
#
# The runs are bench/transfer.sh's (BYTES=1KiB CONDITIONS=wan); the CSV goes to
# bench/results/transfer-DATE.csv and the table is bench/report.py small's.
set -euo pipefail
cd "$(dirname "$0")/.."
export BYTES=1KiB CONDITIONS=wan RUNS=${RUNS:-7} CAP=${CAP:-30}
export TOOLS=${TOOLS:-qxfer-quic qxfer-quic-known qxfer-auto-known qxfer-tls ${QXFER_BASELINE:+baseline-quic baseline-quic-known baseline-auto-known baseline-tls} scp rsync ngtcp2-cubic}
log=$(mktemp /tmp/qxfer-small.XXXXXX)
trap 'rm -f "$log"' EXIT
bench/transfer.sh | tee "$log" >/dev/null
csv=$(sed -n 's/^CSV: //p' "$log")
echo "1 KiB over 50 ms RTT, cold start to exit ($RUNS runs; load at the end $(cut -d' ' -f1-3 /proc/loadavg)):"
echo
python3 bench/report.py small --rtt-ms 50 "$csv"
echo
# What process start alone costs: `qxfer id` on an existing identity (no network).
qxfer=${QXFER:-$(swift build -c release --scratch-path "${SCRATCH:-.build-bench}" --show-bin-path)/qxfer}
tmp=$(mktemp -d /tmp/qxfer-small-id.XXXXXX)
trap 'rm -f "$log"; rm -rf "$tmp"' EXIT
"$qxfer" id --config-dir "$tmp" >/dev/null
for _ in $(seq "$RUNS"); do
    start=$(date +%s%N); "$qxfer" id --config-dir "$tmp" >/dev/null; echo $(( $(date +%s%N) - start ))
done | sort -n | awk '{ v[NR] = $1 } END { printf "Process start alone (qxfer id, existing identity, no network): median %.0f ms over %d runs.\n", v[int((NR + 1) / 2)] / 1e6, NR }'
echo "CSV: $csv"
