#!/usr/bin/env bash
# Where qxfer's time goes on one transfer: `perf record` of `qxfer recv` and `qxfer send` over
# loopback, then the hottest symbols of each side (self time, share of its samples).
#
#     bench/profile.sh                          # --stack quic, 256 MiB
#     STACK=tls BYTES=512MiB bench/profile.sh
#     FREQ=4999 bench/profile.sh                # more samples (default 1999 per second)
#     QXFER=path/to/qxfer bench/profile.sh      # that binary (default: the release build in .build-bench)
#
# Needs perf (Debian's linux-perf) and root or kernel.perf_event_paranoid <= 1. Temporary files are
# removed on exit; the receiver is ended by its process id.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${STACK:-quic}
BYTES=${BYTES:-256MiB}
TOP=${TOP:-25}
FREQ=${FREQ:-1999}   # samples per second and thread
QXFER=${QXFER:-$(swift build -c release --scratch-path "${SCRATCH:-.build-bench}" --show-bin-path)/qxfer}
command -v perf >/dev/null || { echo "bench/profile.sh: perf not installed (apt-get install linux-perf)" >&2; exit 1; }
case ${BYTES,,} in
    *gib) bytes=$(( ${BYTES%???} << 30 )) ;;
    *mib) bytes=$(( ${BYTES%???} << 20 )) ;;
    *) bytes=$BYTES ;;
esac

work=$(mktemp -d /tmp/qxfer-profile.XXXXXX)
receiver=
cleanup() {
    if [ -n "$receiver" ]; then kill -INT "$receiver" 2>/dev/null || true; wait "$receiver" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

head -c "$bytes" /dev/urandom >"$work/file.bin"
fingerprint=$("$QXFER" id --config-dir "$work/recv")
"$QXFER" id --config-dir "$work/send" >/dev/null
mkdir -p "$work/dst"
perf record -q -F "$FREQ" -g -o "$work/recv.data" -- \
    "$QXFER" recv --config-dir "$work/recv" --dir "$work/dst" --yes --port 7449 --no-advertise >/dev/null 2>"$work/recv.err" &
receiver=$!
sleep 1
start=$(date +%s%N)
perf record -q -F "$FREQ" -g -o "$work/send.data" -- \
    "$QXFER" send --config-dir "$work/send" "$work/file.bin" 127.0.0.1:7449 --stack "$STACK" --fingerprint "$fingerprint" >/dev/null 2>"$work/send.err"
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
sleep 0.5
# perf forwards SIGINT to qxfer recv, which exits; perf then writes its data.
kill -INT "$receiver"; wait "$receiver" 2>/dev/null || true; receiver=
cmp -s "$work/file.bin" "$work/dst/file.bin" || { echo "bench/profile.sh: the received file differs" >&2; exit 1; }
echo "qxfer send --stack $STACK, $BYTES over loopback under perf: $elapsed ms ($(awk -v b="$bytes" -v ms="$elapsed" 'BEGIN { printf "%.0f", b / ms / 1000 }') MB/s, slowed by profiling)"
for side in send recv; do
    echo
    echo "== qxfer $side: share of samples by library"
    perf report -i "$work/$side.data" --no-children --sort dso --stdio -g none --percent-limit 1 2>&1 \
        | grep -v '^#' | grep -v '^$' | head -n 10
    echo
    echo "== qxfer $side: top $TOP symbols by self time"
    perf report -i "$work/$side.data" --no-children --sort dso,symbol --stdio -g none --percent-limit 0.5 2>&1 \
        | grep -v '^#' | grep -v '^$' | head -n "$TOP"
done
