# shellcheck shell=bash
# What bench/small-files.sh and bench/sparse.sh share (sourced after `cd` to the project): qxfer
# send against rsync over ssh and scp, between two namespaces over the emulated 50 ms path or over
# loopback, each run the wall time of the sending process.
#
#   bench_file_peers_init NAME TAG   NAME the script, TAG a short prefix for its namespaces: root
#                                    and tools checked, qxfer and qxfer-linkemu built unless QXFER
#                                    is set (in SCRATCH), WORK made and removed on exit, sshd keys
#                                    (SSH_OPTS), identities (FP: the receiver's)
#   bench_path_up CONDITION NET      wan (25 ms each way, 500 Mbit/s, 50 ms queue), wan-loss (the
#                                    same, 1 % random loss each way), veth (a veth pair, MTU 1500,
#                                    nothing emulated) or loopback; sets RECV_NS, SEND_NS, HOST
#   bench_receivers_start DIR        sshd, qxfer recv into DIR on port 7447 (QXFER_BASELINE's on 7448)
#   bench_receivers_stop             both, and sshd
#   bench_send TOOL SOURCE DIR [rsync option...]
#                                    one run of TOOL (qxfer-quic, qxfer-tls, baseline-quic,
#                                    baseline-tls, rsync, scp) sending SOURCE into DIR, stopped
#                                    after CAP seconds; sets SECONDS_TAKEN, STATUS (124: stopped),
#                                    SEND_CPU (user + system seconds of the sending side's processes)
#                                    and SEND_RSS_KIB (the largest one's peak)
bench_file_peers_init() {
    BENCH_NAME=$1
    PREFIX=$2$$
    [ "$(id -u)" = 0 ] || { echo "$BENCH_NAME: run as root (namespaces, sshd)" >&2; exit 1; }
    local tool
    for tool in scp rsync xxhsum python3 /usr/bin/time; do
        command -v "$tool" >/dev/null || { echo "$BENCH_NAME: $tool missing (make bench-deps)" >&2; exit 1; }
    done
    [ -x /usr/sbin/sshd ] || { echo "$BENCH_NAME: sshd missing (make bench-deps)" >&2; exit 1; }
    . bench/build.sh
    bench_build_qxfer "$SCRATCH"
    WORK=$(mktemp -d "/tmp/qxfer-$(basename "$1" .sh).XXXXXX")
    RECV_PIDS=()
    trap bench_file_peers_cleanup EXIT
    trap 'exit 130' INT TERM
    . bench/sshd.sh
    bench_sshd_setup "$WORK"
    mkdir -p bench/results
    FP=$("$QXFER" id --config-dir "$WORK/cfg-recv")
    [ -z "${QXFER_BASELINE:-}" ] || "$QXFER_BASELINE" id --config-dir "$WORK/cfg-recv" >/dev/null  # same identity
    "$QXFER" id --config-dir "$WORK/cfg-send" >/dev/null
}

bench_file_peers_cleanup() {
    bench_receivers_stop
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}

bench_path_up() {
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    case $1 in
        wan|wan-loss)
            local loss=()
            [ "$1" = wan ] || loss=(--loss 1%)
            LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net "$2" -- --delay 25ms --rate 500mbit --queue 50ms "${loss[@]}" >/dev/null
            RECV_NS=${PREFIX}b; HOST=$2.2 ;;
        veth)
            # The namespaces with their TUN devices' addresses moved to a veth pair between them.
            LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net "$2" --no-emu >/dev/null
            ip -n "${PREFIX}a" addr flush dev tun0
            ip -n "${PREFIX}b" addr flush dev tun0
            ip link add "${PREFIX}va" netns "${PREFIX}a" mtu 1500 type veth peer name "${PREFIX}vb" netns "${PREFIX}b" mtu 1500
            ip -n "${PREFIX}a" addr add "$2.1/30" dev "${PREFIX}va"
            ip -n "${PREFIX}b" addr add "$2.2/30" dev "${PREFIX}vb"
            ip -n "${PREFIX}a" link set "${PREFIX}va" up
            ip -n "${PREFIX}b" link set "${PREFIX}vb" up
            RECV_NS=${PREFIX}b; HOST=$2.2 ;;
        loopback)
            LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net "$2" --no-emu >/dev/null
            RECV_NS=${PREFIX}a; HOST=127.0.0.1 ;;
        *) echo "$BENCH_NAME: unknown condition '$1' (wan, wan-loss, veth, loopback)" >&2; exit 2 ;;
    esac
    SEND_NS=${PREFIX}a
}

bench_receivers_start() {
    ip netns exec "$RECV_NS" /usr/sbin/sshd -f "$WORK/sshd_config" -E "$WORK/sshd.log"
    mkdir -p "$1"
    ip netns exec "$RECV_NS" "$QXFER" recv --config-dir "$WORK/cfg-recv" --dir "$1" --yes --port 7447 --no-advertise >/dev/null 2>"$WORK/recv.err" &
    RECV_PIDS+=($!)
    if [ -n "${QXFER_BASELINE:-}" ]; then
        ip netns exec "$RECV_NS" "$QXFER_BASELINE" recv --config-dir "$WORK/cfg-recv" --dir "$1" --yes --port 7448 --no-advertise >/dev/null 2>"$WORK/recv-baseline.err" &
        RECV_PIDS+=($!)
    fi
    sleep 0.5
}

bench_receivers_stop() {
    local pid
    for pid in "${RECV_PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    for pid in "${RECV_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    RECV_PIDS=()
    [ ! -s "$WORK/sshd.pid" ] || kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
    rm -f "$WORK/sshd.pid"
}

bench_send() {
    local tool=$1 source=$2 dir=$3 command
    shift 3
    case $tool in
        qxfer-quic|qxfer-tls) command=("$QXFER" send --config-dir "$WORK/cfg-send" "$source" "$HOST:7447" --stack "${tool#qxfer-}" --fingerprint "$FP") ;;
        baseline-quic|baseline-tls) command=("$QXFER_BASELINE" send --config-dir "$WORK/cfg-send" "$source" "$HOST:7448" --stack "${tool#baseline-}" --fingerprint "$FP") ;;
        rsync) command=(rsync "$@" -e "ssh ${SSH_OPTS[*]}" "$source" "root@$HOST:$dir/") ;;
        scp) command=(scp -q -r "${SSH_OPTS[@]}" "$source" "root@$HOST:$dir/") ;;
        *) echo "$BENCH_NAME: unknown tool '$tool'" >&2; exit 2 ;;
    esac
    sync  # each run starts without the previous one's dirty pages
    local start
    start=$(date +%s%N)
    STATUS=0
    ip netns exec "$SEND_NS" /usr/bin/time -f "%U %S %M" -o "$WORK/send.time" timeout -s INT "$CAP" "${command[@]}" >/dev/null 2>"$WORK/send.err" || STATUS=$?
    SECONDS_TAKEN=$(awk -v s="$start" -v e="$(date +%s%N)" 'BEGIN { printf "%.4f", (e - s) / 1e9 }')
    read -r user system SEND_RSS_KIB < <(tail -n 1 "$WORK/send.time")
    SEND_CPU=$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.2f", u + s }')
    if [ "$STATUS" != 0 ] && [ "$STATUS" != 124 ]; then
        cat "$WORK/send.err" "$WORK/recv.err" >&2
        exit 1
    fi
}
