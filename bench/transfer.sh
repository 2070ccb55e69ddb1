#!/usr/bin/env bash
# File transfer side by side in one run: `qxfer send` over QUIC and over TCP+TLS against scp and
# rsync over ssh, iperf3 (the raw-TCP ceiling) and the ngtcp2 example pair (gtlsserver/gtlsclient,
# the same ngtcp2 0.12.1 + GnuTLS qxfer's QUIC wraps), on loopback and over the emulated WAN (the
# project's link emulator between two network namespaces), same file, same machine, interleaved.
#
#     bench/transfer.sh                                   # 1 GiB, 3 runs, all conditions, all tools
#     BYTES=256MiB RUNS=1 CONDITIONS="loopback wan" bench/transfer.sh
#     TOOLS="qxfer-quic iperf3-bbr" CAP=60 bench/transfer.sh
#     QXFER=path/to/qxfer bench/transfer.sh               # use that binary, build nothing
#     QXFER_BASELINE=path/to/older/qxfer bench/transfer.sh  # adds baseline-quic, baseline-tls
#
# Conditions: loopback (both ends in one namespace, over lo); veth (two namespaces joined by a
# veth pair, MTU 1500, nothing emulated); wan (25 ms one way, 500 Mbit/s, 50 ms queue); wan-loss
# (the same with 1 % random loss each way); wan-long (100 ms one way, 100 Mbit/s, 100 ms queue:
# an ocean away); wan-lossy (20 ms one way, 300 Mbit/s, 40 ms queue, 0.5 % random loss each
# way); wan-jitter (20 ms ± 10 ms one way, order kept, 200 Mbit/s, 30 ms queue: a path whose
# delay varies, as radio links' does); wan-reorder (wan with 5 % of the packets each way held
# 10 ms, overtaken by the ~400 sent meanwhile: reordering, not loss, as link aggregation and
# radio retries make), wan-thin (40 ms one way, 10 Mbit/s, a 10 ms queue of 8 full-size
# packets: a slow uplink behind a router with a shallow buffer), wan-far (50 ms one way,
# 500 Mbit/s, 100 ms queue: a fast link across a continent), wan-ocean (150 ms one way,
# 200 Mbit/s, 150 ms queue), wan-asym (15 ms one way, 200 Mbit/s toward the receiver and 1 Mbit/s
# back: a cable or ADSL line downloading, its acknowledgements on the thin uplink) and custom (the
# qxfer-linkemu flags in EMULATE, e.g. EMULATE="--delay 20ms --rate 50mbit --loss 5%") only when
# named in CONDITIONS (1 GiB over wan-ocean takes TCP minutes). The namespaces raise TCP's buffer
# limits to 64 MiB, so that TCP can fill every path; a condition named with -stock (wan-far-stock,
# wan-ocean-stock, any path) keeps Linux's own defaults instead (tcp_rmem up to 6 MiB, tcp_wmem up
# to 4 MiB: what an untuned host gives every TCP tool, a QUIC stack's windows being its own).
# Receivers run in namespace b, senders in namespace a (loopback: both in a). On the
# emulated paths each run records the packets the emulator's queue dropped, both directions
# (column link_drops; random losses are not counted).
#
# Contenders (TOOLS, default all): qxfer-quic, qxfer-tls (qxfer-auto: the default race, and qxfer-quic-known
# and qxfer-auto-known: a sender resuming its QUIC session to a receiver it sent to just before, over
# --stack quic or the default race, on request), scp, rsync (-e ssh, whole file; the
# target is removed before each run), iperf3-cubic and iperf3-bbr (`iperf3 -n BYTES -C CC`, memory
# to memory, no encryption), ngtcp2-cubic, ngtcp2-bbr and ngtcp2-bbr2 (gtlsclient fetches the file
# over HTTP/3 from gtlsserver --cc CC into a directory; bbr2 on request), and, to choose how qxfer/1 uses TCP+TLS, four files
# of BYTES/4 sent by one qxfer over one TLS connection (qxfer-tls-4files-1conn) against four qxfer
# processes, one file each (qxfer-tls-4files-4conn). With QXFER_BASELINE (another qxfer, e.g. the
# commit before a change), baseline-quic, baseline-tls (and baseline-auto, baseline-quic-known, baseline-auto-known) run
# that binary on both ends, interleaved with the others, and the report compares each qxfer-X
# with baseline-X (throughput, CPU per GB, peak RSS).
# Each run records the wall time of the process that finishes the transfer (the sender; for
# ngtcp2 the client, which receives; process start to exit, handshake included), CPU seconds
# (user+sys) and peak RSS of both sides where the tool has a process we start on each side (not
# for scp/rsync, whose receiving side sshd forks). Every received file is compared with the
# source. A run that is not done after CAP seconds (default 300) is stopped and counted with the
# bytes it moved by then (column complete=0): CUBIC over the lossy WAN moves under 1 MB/s.
# Writes bench/results/transfer-DATE.csv and prints Markdown tables (bench/report.py): median,
# spread, CPU per GB, RSS, and the ratio to scp and to the best peer in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BYTES=${BYTES:-1GiB}
RUNS=${RUNS:-3}
CONDITIONS=${CONDITIONS:-loopback veth wan wan-loss wan-long wan-lossy wan-jitter}
SCRATCH=${SCRATCH:-.build-bench}
CAP=${CAP:-300}
TOOLS=${TOOLS:-qxfer-quic qxfer-tls ${QXFER_BASELINE:+baseline-quic baseline-tls} scp rsync iperf3-cubic iperf3-bbr ngtcp2-cubic ngtcp2-bbr qxfer-tls-4files-1conn qxfer-tls-4files-4conn}
PREFIX=qbt$$
[ "$(id -u)" = 0 ] || { echo "bench/transfer.sh: run as root (namespaces, sshd)" >&2; exit 1; }

case ${BYTES,,} in
    *gib) bytes=$(( ${BYTES%???} << 30 )) ;;
    *mib) bytes=$(( ${BYTES%???} << 20 )) ;;
    *kib) bytes=$(( ${BYTES%???} << 10 )) ;;
    *) bytes=$BYTES ;;
esac

need=()
for tool in scp:openssh-client sshd:openssh-server rsync:rsync jq:jq xxhsum:xxhash iperf3:iperf3 gtlsclient:ngtcp2-client gtlsserver:ngtcp2-server openssl:openssl bc:bc; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || need+=("${tool#*:}")
done
[ -x /usr/bin/time ] || need+=(time)
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

. bench/build.sh
bench_build_qxfer "$SCRATCH"

WORK=$(mktemp -d /tmp/qxfer-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$WORK/src" "$WORK/dst" "$WORK/parts" "$WORK/bin" bench/results
# Both qxfer binaries copied afresh, so that the page cache holds them alike: peak RSS counts the
# text mapped at each fault, which differed with how each file had entered the cache
# (docs/benchmarks.md, "Peak RSS of two binaries").
cp "$QXFER" "$WORK/bin/qxfer"; QXFER=$WORK/bin/qxfer
if [ -n "${QXFER_BASELINE:-}" ]; then cp "$QXFER_BASELINE" "$WORK/bin/qxfer-baseline"; QXFER_BASELINE=$WORK/bin/qxfer-baseline; fi
head -c "$bytes" /dev/urandom >"$WORK/src/file.bin"
split -n 4 -d "$WORK/src/file.bin" "$WORK/parts/part"
SUM=$(xxhsum -H2 "$WORK/src/file.bin" 2>/dev/null | cut -d' ' -f1)

# ssh: a host key and a client key of our own, sshd on port 2222 in namespace b.
. bench/sshd.sh
bench_sshd_setup "$WORK"

CSV=bench/results/transfer-$(date +%Y%m%d-%H%M%S).csv
echo "condition,tool,run,bytes,seconds,mb_per_s,sender_cpu_s,receiver_cpu_s,sender_rss_kib,receiver_rss_kib,complete,load1,link_drops" >"$CSV"

# The ngtcp2 examples' document root (the same bytes) and a throwaway certificate.
mkdir -p "$WORK/www"
ln "$WORK/src/file.bin" "$WORK/www/file.bin"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench \
    -keyout "$WORK/tls_key.pem" -out "$WORK/tls_cert.pem" 2>/dev/null

# The topology for one condition: namespaces a and b joined by the link emulator.
setup() {
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    local emulate=(--delay 25ms --rate 500mbit --queue 50ms)
    local path=${1%-stock}
    case $path in
        loopback|veth) emulate=() ;;
        wan) ;;
        wan-loss) emulate+=(--loss 1%) ;;
        wan-long) emulate=(--delay 100ms --rate 100mbit --queue 100ms) ;;
        wan-lossy) emulate=(--delay 20ms --rate 300mbit --queue 40ms --loss 0.5%) ;;
        wan-far) emulate=(--delay 50ms --rate 500mbit --queue 100ms) ;;
        wan-ocean) emulate=(--delay 150ms --rate 200mbit --queue 150ms) ;;
        wan-jitter) emulate=(--delay 20ms --jitter 10ms --rate 200mbit --queue 30ms) ;;
        wan-reorder) emulate+=(--reorder 5% --reorder-delay 10ms) ;;
        wan-thin) emulate=(--delay 40ms --rate 10mbit --queue 10ms) ;;
        wan-asym) emulate=(--delay 15ms --rate-ab 200mbit --rate-ba 1mbit --queue 50ms) ;;
        custom) read -r -a emulate <<<"${EMULATE:?bench/transfer.sh: condition custom needs EMULATE (qxfer-linkemu flags)}" ;;
        *) echo "bench/transfer.sh: unknown condition '$1'" >&2; exit 2 ;;
    esac
    if [ "${#emulate[@]}" -eq 0 ]; then
        LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.77 --no-emu >/dev/null
    else
        LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.77 -- "${emulate[@]}" >/dev/null
    fi
    if [ "$path" != "$1" ]; then
        # Linux's own TCP buffer limits (net/ipv4/tcp.c, tcp_init) instead of lib.sh's 64 MiB.
        local ns
        for ns in "${PREFIX}a" "${PREFIX}b"; do
            ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 6291456" net.ipv4.tcp_wmem="4096 16384 4194304" >/dev/null
        done
    fi
    if [ "$path" = veth ]; then
        # Replace the unattached TUN devices' addresses with a veth pair between the namespaces.
        ip -n "${PREFIX}a" addr flush dev tun0
        ip -n "${PREFIX}b" addr flush dev tun0
        ip link add "${PREFIX}va" netns "${PREFIX}a" mtu 1500 type veth peer name "${PREFIX}vb" netns "${PREFIX}b" mtu 1500
        ip -n "${PREFIX}a" addr add 10.99.77.1/30 dev "${PREFIX}va"
        ip -n "${PREFIX}b" addr add 10.99.77.2/30 dev "${PREFIX}vb"
        ip -n "${PREFIX}a" link set "${PREFIX}va" up
        ip -n "${PREFIX}b" link set "${PREFIX}vb" up
    fi
    if [ "$path" = loopback ]; then RECV_NS=${PREFIX}a; HOST=127.0.0.1; SEND_HOST=127.0.0.1
    else RECV_NS=${PREFIX}b; HOST=10.99.77.2; SEND_HOST=10.99.77.1; fi
    SEND_NS=${PREFIX}a
    ip netns exec "$RECV_NS" ip link set lo up
    ip netns exec "$RECV_NS" /usr/sbin/sshd -f "$WORK/sshd_config" -E "$WORK/sshd.log"
    for _ in $(seq 1 50); do [ -s "$WORK/sshd.pid" ] && break; sleep 0.1; done
}
teardown() {
    [ -s "$WORK/sshd.pid" ] && kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
    rm -f "$WORK/sshd.pid"
}

# timed FILE -- command: runs it in the sender namespace under /usr/bin/time; FILE.wall gets the
# wall time in seconds to the microsecond (time's own %e has 10 ms steps, coarse for 1 KiB).
timed() {
    local out=$1; shift
    local start; start=$(date +%s%N)
    ip netns exec "$SEND_NS" /usr/bin/time -f "%e %U %S %M" -o "$out" "$@" >/dev/null 2>"$out.err" || { cat "$out.err" "$WORK/sshd.log" >&2 2>/dev/null; return 1; }
    since "$start" >"$out.wall"
}
since() { echo "scale=6; ($(date +%s%N) - $1) / 1000000000" | bc; }

# Ends what /usr/bin/time (started by us, pid $1) runs, with signal $2, so time reports; waits.
stop_timed() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do kill "-$2" "$child" 2>/dev/null || true; done
    wait "$1" 2>/dev/null || true
}

# A qxfer receiver for COUNT transfers, under /usr/bin/time; sets RECV_PID.
start_qxfer_recv() {
    rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
    ip netns exec "$RECV_NS" /usr/bin/time -f "%e %U %S %M" -o "$WORK/recv.time" \
        "$QX" recv --config-dir "$WORK/cfg-recv" --dir "$WORK/dst" --yes --port 7447 --no-advertise >/dev/null 2>"$WORK/recv.err" &
    RECV_PID=$!
    PIDS+=("$RECV_PID")
    sleep 0.5
}
stop_qxfer_recv() {
    # Signal qxfer itself (not /usr/bin/time, which ignores SIGINT while it waits).
    stop_timed "$RECV_PID" INT
}

# The receiving side of scp and rsync is what our sshd forks for the session; the listener reaps
# those children, so their CPU time accumulates in its cutime+cstime (/proc/PID/stat fields 16, 17).
sshd_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15 + $16 + $17) / hz }' "/proc/$(cat "$WORK/sshd.pid")/stat"; }
sshd_cpu_since() {  # prints a /usr/bin/time-like line "wall user sys rss": the CPU as "user", RSS unknown
    local now
    for _ in $(seq 20); do  # the session's processes exit just after the client
        now=$(sshd_cpu); sleep 0.1; [ "$now" = "$(sshd_cpu)" ] && break
    done
    echo "0 $(echo "$now - $1" | bc) 0 0"
}

check() {
    local got
    got=$(cat "$@" | xxhsum -H2 - 2>/dev/null | cut -d' ' -f1)
    [ "$got" = "$SUM" ] || { echo "bench: received data differs for $TOOL" >&2; exit 1; }
}

# Packets the emulator's queue has dropped so far, both directions (empty without an emulator).
link_drops() {
    local dir=/run/qxfer-linkemu/$PREFIX pid
    pid=$(cat "$dir/emu.pid" 2>/dev/null) || return 0
    kill -USR1 "$pid" 2>/dev/null || return 0
    sleep 0.2
    jq '.ab.drop_queue + .ba.drop_queue' "$dir/stats.json" 2>/dev/null || true
}

# condition tool run sender-time-file [receiver-time-file]; the wall time is the sender's unless
# WALL is set; MOVED (default BYTES) bytes arrived, COMPLETE=0 if the run was stopped at CAP.
record() {
    local s r=(0 0 0 0) drops=""
    read -r -a s < <(tail -1 "$4")
    if [ -n "$DROPS_BEFORE" ]; then drops=$(( $(link_drops) - DROPS_BEFORE )); fi
    if [ -n "${5:-}" ] && [ -s "$5" ]; then read -r -a r < <(tail -1 "$5"); fi
    [ -n "${WALL:-}" ] || [ ! -s "$4.wall" ] || WALL=$(cat "$4.wall")
    awk -v c="$1" -v t="$2" -v n="$3" -v b="${MOVED:-$bytes}" -v e="${WALL:-${s[0]}}" -v su="${s[1]}" -v ss="${s[2]}" -v sm="${s[3]}" \
        -v ru="${r[1]}" -v rs="${r[2]}" -v rm="${r[3]}" -v done="${COMPLETE:-1}" -v load="$(cut -d' ' -f1 /proc/loadavg)" -v drops="$drops" \
        'BEGIN { printf "%s,%s,%d,%d,%.4f,%.2f,%.2f,%.2f,%d,%d,%d,%s,%s\n", c, t, n, b, e, b / e / 1e6, su + ss, ru + rs, sm, rm, done, load, drops }' >>"$CSV"
    MOVED=; WALL=; COMPLETE=
}

# Waits (bounded) until something in namespace $1 listens on UDP or TCP ($2: u or t) port $3.
wait_listen() {
    for _ in $(seq 100); do
        ip netns exec "$1" ss -Hl"$2"n "sport = :$3" 2>/dev/null | grep -q . && return 0
        sleep 0.05
    done
    echo "bench: nothing listens on port $3 in $1" >&2
    return 1
}

run_tool() {  # condition tool run
    TOOL=$2
    # baseline-X is qxfer-X with the baseline binary on both ends.
    QX=$QXFER
    if [[ $2 == baseline-* ]]; then
        QX=${QXFER_BASELINE:?"bench: $2 needs QXFER_BASELINE"}
    fi
    case ${2/#baseline-/qxfer-} in
        qxfer-quic|qxfer-tls|qxfer-auto)
            start_qxfer_recv
            rm -f "$WORK/cfg-send/session-tickets"  # a new receiver: nothing to resume
            timed "$WORK/send.time" "$QX" send --config-dir "$WORK/cfg-send" "$WORK/src/file.bin" "$HOST:7447" --stack "${2#*-}" --fingerprint "$FP"
            stop_qxfer_recv
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        qxfer-quic-known|qxfer-auto-known)
            # A receiver seen before: an untimed send to the same receiver leaves a session
            # ticket in the sender's configuration folder; the timed send resumes with it
            # (over --stack quic, or the default race, which lets QUIC lead with early data).
            local stack=${2#*-}
            stack=${stack%-known}
            start_qxfer_recv
            rm -f "$WORK/cfg-send/session-tickets" "$WORK/cfg-send/stacks"
            head -c 1024 /dev/urandom >"$WORK/warm-up.bin"
            ip netns exec "$SEND_NS" "$QX" send --config-dir "$WORK/cfg-send" "$WORK/warm-up.bin" "$HOST:7447" --stack "$stack" --fingerprint "$FP" >/dev/null 2>"$WORK/warm-up.err" \
                || echo "bench: $2: the warm-up send failed: $(tail -1 "$WORK/warm-up.err")" >&2
            [ -s "$WORK/cfg-send/session-tickets" ] || echo "bench: $2: no session ticket after the warm-up send" >&2
            timed "$WORK/send.time" "$QX" send --config-dir "$WORK/cfg-send" "$WORK/src/file.bin" "$HOST:7447" --stack "$stack" --fingerprint "$FP"
            stop_qxfer_recv
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        qxfer-tls-4files-1conn)
            start_qxfer_recv
            timed "$WORK/send.time" "$QX" send --config-dir "$WORK/cfg-send" "$WORK"/parts/part0{0,1,2,3} "$HOST:7447" --stack tls --fingerprint "$FP"
            stop_qxfer_recv
            check "$WORK"/dst/part0{0,1,2,3}
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        qxfer-tls-4files-4conn)
            start_qxfer_recv
            local start end i senders=()
            start=$(date +%s.%N)
            for i in 0 1 2 3; do
                timed "$WORK/send$i.time" "$QX" send --config-dir "$WORK/cfg-send" "$WORK/parts/part0$i" "$HOST:7447" --stack tls --fingerprint "$FP" &
                senders+=($!)
            done
            for i in "${senders[@]}"; do wait "$i"; done
            end=$(date +%s.%N)
            stop_qxfer_recv
            check "$WORK"/dst/part0{0,1,2,3}
            # Wall time of the four together; CPU and RSS summed / maximal over the four senders.
            awk -v e="$(echo "$end - $start" | bc)" '{ u += $2; s += $3; if ($4 > m) m = $4 } END { print e, u, s, m }' "$WORK"/send?.time >"$WORK/send.time"
            WALL=$(echo "$end - $start" | bc)
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        iperf3-cubic|iperf3-bbr)
            # Memory to memory, no file, no encryption: the ceiling of one TCP connection.
            ip netns exec "$RECV_NS" /usr/bin/time -f "%e %U %S %M" -o "$WORK/recv.time" \
                iperf3 -s -1 -B "$HOST" -p 5201 >/dev/null 2>"$WORK/recv.err" &
            RECV_PID=$!; PIDS+=("$RECV_PID")
            wait_listen "$RECV_NS" t 5201
            local start; start=$(date +%s%N)
            ip netns exec "$SEND_NS" /usr/bin/time -f "%e %U %S %M" -o "$WORK/send.time" \
                timeout -s INT "$CAP" iperf3 -c "$HOST" -p 5201 -n "$bytes" -C "${2#iperf3-}" -J >"$WORK/iperf3.json" 2>"$WORK/send.err" || true
            WALL=$(since "$start")
            wait "$RECV_PID" 2>/dev/null || true
            # Done when iperf3 reports no error (its receiver-side count lags the last interval);
            # stopped at CAP, the bytes it had sent by then.
            MOVED=$bytes
            if [ -n "$(jq -r '.error // empty' "$WORK/iperf3.json")" ]; then
                COMPLETE=0; MOVED=$(jq '.end.sum_sent.bytes // 0' "$WORK/iperf3.json")
            fi
            [ "${MOVED:-0}" -gt 0 ] || { echo "bench: iperf3 failed: $(jq -r '.error // empty' "$WORK/iperf3.json") $(cat "$WORK/send.err")" >&2; exit 1; }
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        ngtcp2-cubic|ngtcp2-bbr|ngtcp2-bbr2)
            # HTTP/3 GET of the file: gtlsserver (the side that sends) in the sender's namespace,
            # gtlsclient writing it into a directory in the receiver's; the client's wall time.
            rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
            ip netns exec "$SEND_NS" /usr/bin/time -f "%e %U %S %M" -o "$WORK/server.time" \
                gtlsserver -q -d "$WORK/www" --cc "${2#ngtcp2-}" "$SEND_HOST" 4433 "$WORK/tls_key.pem" "$WORK/tls_cert.pem" >/dev/null 2>"$WORK/server.err" &
            local server=$!; PIDS+=("$server")
            wait_listen "$SEND_NS" u 4433
            local start; start=$(date +%s%N)
            ip netns exec "$RECV_NS" /usr/bin/time -f "%e %U %S %M" -o "$WORK/client.time" \
                timeout -s INT "$CAP" gtlsclient -q --no-quic-dump --no-http-dump --exit-on-all-streams-close --cc "${2#ngtcp2-}" \
                --download "$WORK/dst" "$SEND_HOST" 4433 "https://$SEND_HOST:4433/file.bin" >/dev/null 2>"$WORK/client.err" || true
            stop_timed "$server" INT
            MOVED=$(stat -c %s "$WORK/dst/file.bin" 2>/dev/null || echo 0)
            if [ "$MOVED" -lt "$bytes" ]; then COMPLETE=0; else check "$WORK/dst/file.bin"; fi
            [ "$MOVED" -gt 0 ] || { echo "bench: gtlsclient received nothing: $(tail -3 "$WORK/client.err")" >&2; exit 1; }
            WALL=$(since "$start")
            record "$1" "$2" "$3" "$WORK/server.time" "$WORK/client.time" ;;
        scp)
            rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
            local before; before=$(sshd_cpu)
            timed "$WORK/send.time" scp -q "${SSH_OPTS[@]}" "$WORK/src/file.bin" "root@$HOST:$WORK/dst/file.bin"
            sshd_cpu_since "$before" >"$WORK/recv.time"
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        rsync)
            rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
            local before; before=$(sshd_cpu)
            timed "$WORK/send.time" rsync -e "ssh ${SSH_OPTS[*]}" "$WORK/src/file.bin" "root@$HOST:$WORK/dst/file.bin"
            sshd_cpu_since "$before" >"$WORK/recv.time"
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
    esac
}

FP=$("$QXFER" id --config-dir "$WORK/cfg-recv")
"$QXFER" id --config-dir "$WORK/cfg-send" >/dev/null
[ -z "${QXFER_BASELINE:-}" ] || "$QXFER_BASELINE" id --config-dir "$WORK/cfg-recv" >/dev/null  # reads the same identity
for condition in $CONDITIONS; do
    echo "== $condition ($BYTES, $RUNS runs; load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    setup "$condition"
    for run in $(seq 1 "$RUNS"); do
        for tool in $TOOLS; do
            DROPS_BEFORE=$(link_drops)
            run_tool "$condition" "$tool" "$run"
            tail -1 "$CSV" >&2
        done
    done
    teardown
done

echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $BYTES, $RUNS runs, CAP $CAP s; $(date -u +%Y-%m-%dT%H:%MZ)"
echo
python3 bench/report.py transfer "$CSV"
echo
echo "CSV: $CSV"
