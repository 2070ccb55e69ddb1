#!/usr/bin/env bash
# How long a receiver stays after its sender has finished: a script running `qxfer recv --once`
# or `qxfer stream recv` waits for that. Each run starts the receiver, then one `qxfer send` of a
# 200 kB file (or one `qxfer stream send --duration 1`), and records the seconds from the
# sender's exit to the receiver's exit. Over TCP the kernel delivers a close after the process
# exits; a QUIC close is sent by the process itself, and one that exits first leaves the peer to
# a cut-off or an idle timeout. A receiver still there after 120 s is stopped (counted as 120 s).
#
#     bench/endings.sh                                     # 10 runs of each, wan and wan-loss
#     RUNS=20 CONDITIONS="loopback wan" bench/endings.sh
#     QXFER_BASELINE=path/to/older/qxfer bench/endings.sh  # the same runs with that binary on both ends
#
# Conditions: loopback (both ends in one namespace), wan (25 ms one way, 500 Mbit/s, 50 ms queue),
# wan-loss (the same with 1 % random loss each way). Cases (CASES): file-quic, file-tls,
# stream-reliable, stream-realtime (QUIC). Prints, per binary, condition and case, the median and
# the largest wait, how many runs waited more than 1 s, and how many sends failed (not timed).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
CONDITIONS=${CONDITIONS:-wan wan-loss}
CASES=${CASES:-file-quic file-tls stream-reliable stream-realtime}
SCRATCH=${SCRATCH:-.build-bench}
PREFIX=qbe$$
[ "$(id -u)" = 0 ] || { echo "bench/endings.sh: run as root (namespaces)" >&2; exit 1; }
command -v bc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc >/dev/null; }

. bench/build.sh
bench_build_qxfer "$SCRATCH"
binaries=("$QXFER")
[ -n "${QXFER_BASELINE:-}" ] && binaries+=("$QXFER_BASELINE")

WORK=$(mktemp -d /tmp/qxfer-endings.XXXXXX)
cleanup() {
    wait 2>/dev/null || true
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
head -c 200000 /dev/urandom >"$WORK/file"

# One run: the receiver's wait after the sender's exit, in seconds.
run_once() {
    local bin=$1 case=$2 host=$3 port=$4 fingerprint=$5 cfg=$WORK/cfg-$6
    rm -rf "$WORK/out"; mkdir "$WORK/out"
    case $case in
        file-*)
            ip netns exec "$RECV_NS" timeout 120 "$bin" recv --config-dir "$cfg/recv" --no-advertise --dir "$WORK/out" --yes --once \
                --port "$port" --host "$host" >/dev/null 2>"$WORK/recv.err" &
            ;;
        stream-*)
            ip netns exec "$RECV_NS" timeout 120 "$bin" stream recv --config-dir "$cfg/recv" --port "$port" --output /dev/null \
                >/dev/null 2>"$WORK/recv.err" </dev/null &
            ;;
    esac
    local receiver=$!
    for _ in $(seq 50); do grep -q "port $port" "$WORK/recv.err" 2>/dev/null && break; sleep 0.1; done
    local status=0
    case $case in
        file-*)
            ip netns exec "${PREFIX}a" "$bin" send --config-dir "$cfg/send" --stack "${case#file-}" --fingerprint "$fingerprint" \
                "$WORK/file" "$host:$port" >/dev/null 2>"$WORK/send.err" || status=$?
            ;;
        stream-*)
            ip netns exec "${PREFIX}a" "$bin" stream send --config-dir "$cfg/send" --stack quic --mode "${case#stream-}" \
                --fingerprint "$fingerprint" "$host:$port" --duration 1 >/dev/null 2>"$WORK/send.err" </dev/null || status=$?
            ;;
    esac
    local sent
    sent=$(date +%s.%N)
    wait "$receiver" || true
    # A failed send is counted, not fatal: the other runs still say how long receivers stay.
    [ "$status" = 0 ] || { echo "bench/endings.sh: $case failed: $(tail -1 "$WORK/send.err")" >&2; echo failed; return; }
    echo "$(date +%s.%N) - $sent" | bc
}

echo "| binary | condition | case | median s | largest s | runs over 1 s | failed sends |"
echo "|---|---|---|---:|---:|---:|---:|"
for condition in $CONDITIONS; do
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    case $condition in
        loopback) LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.78 --no-emu >/dev/null ;;
        wan) LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.78 -- --delay 25ms --rate 500mbit --queue 50ms >/dev/null ;;
        wan-loss) LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.78 -- --delay 25ms --rate 500mbit --queue 50ms --loss 1% >/dev/null ;;
        *) echo "bench/endings.sh: unknown condition '$condition'" >&2; exit 2 ;;
    esac
    # loopback: both ends in namespace a, over its lo.
    host=10.99.78.2 RECV_NS=${PREFIX}b
    if [ "$condition" = loopback ]; then host=127.0.0.1 RECV_NS=${PREFIX}a; fi
    for case in $CASES; do
        for index in "${!binaries[@]}"; do
            bin=${binaries[$index]}
            fingerprint=$("$bin" id --config-dir "$WORK/cfg-$index/recv" 2>/dev/null | grep -o '[0-9a-f]\{64\}' | head -1)
            waits=()
            for _ in $(seq "$RUNS"); do
                waits+=("$(run_once "$bin" "$case" "$host" 47300 "$fingerprint" "$index")")
            done
            printf '%s\n' "${waits[@]}" | sort -n | awk -v bin="$(basename "$bin")" -v c="$condition" -v k="$case" '
                $1 == "failed" { failed++; next }
                { v[++n] = $1; if ($1 > 1) over++ }
                END {
                    if (n == 0) { printf "| %s | %s | %s | – | – | – | %d |\n", bin, c, k, failed; exit }
                    printf "| %s | %s | %s | %.2f | %.2f | %d of %d | %d |\n", bin, c, k, v[int((n + 1) / 2)], v[n], over, n, failed
                }'
        done
    done
done
