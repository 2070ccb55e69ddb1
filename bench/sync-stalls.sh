#!/usr/bin/env bash
# How long a qxfer receiver is blocked making data durable: one BYTES file (default 1 GiB) over
# loopback (QUIC), the receiver under strace with a seccomp filter (only the traced calls stop,
# so the rest runs at full speed), summing the time spent in fdatasync/fsync/syncfs (the
# checkpoints and the commit) and in sync_file_range (the write-back started as data arrives).
# With QXFER_BASELINE, that binary's receiver too, alternating, RUNS (default 3) of each.
#
#     bench/sync-stalls.sh
#     QXFER=path/to/qxfer QXFER_BASELINE=path/to/older/qxfer RUNS=5 bench/sync-stalls.sh
#
# One line per run: wall time of the send, syncs and the time blocked in them, write-back calls
# and the time blocked in them. strace adds its own cost to those calls only.
set -euo pipefail
cd "$(dirname "$0")/.."
QXFER=${QXFER:-$(swift build -c release --scratch-path "${SCRATCH:-.build-bench}" --show-bin-path)/qxfer}
BYTES=${BYTES:-1GiB}
RUNS=${RUNS:-3}
command -v strace >/dev/null || { echo "sync-stalls: needs strace (scripts/install-bench-deps.sh)" >&2; exit 1; }
work=$(mktemp -d /tmp/qxfer-sync-stalls.XXXXXX)
trap 'pkill -INT -f "qxfer-sync-stalls.*recv" 2>/dev/null || true; rm -rf "$work"' EXIT
head -c "$(numfmt --from=iec-i "${BYTES%B}")" /dev/urandom >"$work/file.bin"
# The receiver's identity exists before any receiver starts, so the pinned fingerprint is its.
fingerprint=$("$QXFER" id --config-dir "$work/cfg-recv")

for run in $(seq "$RUNS"); do
    for which in qxfer ${QXFER_BASELINE:+baseline}; do
        qx=$QXFER; [ "$which" = baseline ] && qx=$QXFER_BASELINE
        rm -rf "$work/dst"; mkdir "$work/dst"
        strace --seccomp-bpf -f -T -e trace=fdatasync,fsync,syncfs,sync_file_range -o "$work/strace" \
            "$qx" recv --config-dir "$work/cfg-recv" --dir "$work/dst" --yes --port 7451 --no-advertise >/dev/null 2>"$work/recv.err" &
        receiver=$!
        for _ in $(seq 50); do ss -Hlun "sport = :7451" | grep -q . && break; sleep 0.1; done
        start=$(date +%s%N)
        "$qx" send --config-dir "$work/cfg-send" "$work/file.bin" 127.0.0.1:7451 --fingerprint "$fingerprint" >/dev/null 2>"$work/send.err" \
            || { echo "sync-stalls: the send failed: $(tail -1 "$work/send.err")" >&2; exit 1; }
        wall=$(( ($(date +%s%N) - start) / 1000000 ))
        pkill -INT -P "$receiver" 2>/dev/null || true  # qxfer itself: strace does not pass signals on
        wait "$receiver" 2>/dev/null || true
        cmp -s "$work/file.bin" "$work/dst/file.bin" || { echo "sync-stalls: received data differs" >&2; exit 1; }
        awk -v tag="$which $run" -v wall="$wall" -F'<' '
            / (fdatasync|fsync|syncfs)\(/ { t = $NF; sub(/>.*/, "", t); synced += t; syncs++ }
            / sync_file_range\(/ { t = $NF; sub(/>.*/, "", t); kicked += t; kicks++ }
            END { printf "%-12s send %5d ms; %4d syncs, blocked %5.0f ms; %5d write-back starts, blocked %5.0f ms\n", tag, wall, syncs, synced * 1000, kicks, kicked * 1000 }' "$work/strace"
    done
done
