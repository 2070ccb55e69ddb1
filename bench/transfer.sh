#!/usr/bin/env bash
# File transfer side by side in one run: `qxfer send` over QUIC and over TCP+TLS against scp and
# rsync over ssh, on loopback and over the emulated WAN (the project's link emulator between
# two network namespaces), same file, same machine, interleaved runs.
#
#     bench/transfer.sh                                   # 1 GiB, 3 runs, all conditions
#     BYTES=256MiB RUNS=1 CONDITIONS="loopback wan" bench/transfer.sh
#     QXFER=path/to/qxfer bench/transfer.sh               # use that binary, build nothing
#
# Conditions: loopback (both ends in one namespace, over lo); wan (25 ms one way, 500 Mbit/s,
# 50 ms queue); wan-loss (the same with 1 % random loss each way). Receivers run in namespace b,
# senders in namespace a (loopback: both in a).
#
# Contenders: qxfer --stack quic, qxfer --stack tls, scp, rsync -e ssh (whole file; the target
# is removed before each run), and, to choose how qxfer/1 uses TCP+TLS, four files of BYTES/4
# sent by one qxfer over one TLS connection against four qxfer processes, one file each.
# Each run records the sender's wall time (process start to exit, handshake included), CPU
# seconds of the sender and (for qxfer) the receiver, and peak RSS. Every received file is
# compared with the source. Writes bench/results/transfer-DATE.csv and prints Markdown tables
# with the median, the spread and the ratio to scp.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BYTES=${BYTES:-1GiB}
RUNS=${RUNS:-3}
CONDITIONS=${CONDITIONS:-loopback wan wan-loss}
SCRATCH=${SCRATCH:-.build-bench}
PREFIX=qbt$$
[ "$(id -u)" = 0 ] || { echo "bench/transfer.sh: run as root (namespaces, sshd)" >&2; exit 1; }

case ${BYTES,,} in
    *gib) bytes=$(( ${BYTES%???} << 30 )) ;;
    *mib) bytes=$(( ${BYTES%???} << 20 )) ;;
    *) bytes=$BYTES ;;
esac

need=()
for tool in scp:openssh-client sshd:openssh-server rsync:rsync jq:jq xxhsum:xxhash; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || need+=("${tool#*:}")
done
[ -x /usr/bin/time ] || need+=(time)
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ -z "${QXFER:-}" ]; then
    echo "building qxfer and qxfer-linkemu (release, --scratch-path $SCRATCH)" >&2
    swift build -c release --scratch-path "$SCRATCH" --product qxfer >&2
    swift build -c release --scratch-path "$SCRATCH" --product qxfer-linkemu >&2
    QXFER="$(swift build -c release --scratch-path "$SCRATCH" --show-bin-path)/qxfer"
fi
export LINKEMU_BIN=${LINKEMU_BIN:-$(dirname "$QXFER")/qxfer-linkemu}

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

mkdir -p "$WORK/src" "$WORK/dst" "$WORK/parts" bench/results
head -c "$bytes" /dev/urandom >"$WORK/src/file.bin"
split -n 4 -d "$WORK/src/file.bin" "$WORK/parts/part"
SUM=$(xxhsum -H2 "$WORK/src/file.bin" 2>/dev/null | cut -d' ' -f1)

# ssh: a host key and a client key of our own, sshd on port 2222 in namespace b.
ssh-keygen -q -t ed25519 -N '' -f "$WORK/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/client_key"
cat >"$WORK/sshd_config" <<EOF
Port 2222
HostKey $WORK/host_key
AuthorizedKeysFile $WORK/client_key.pub
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
UsePAM no
PidFile $WORK/sshd.pid
Subsystem sftp internal-sftp
EOF
# AES-128-GCM: the fastest cipher OpenSSH has on these CPUs (AES-NI), as DESIGN.md's scp figure.
SSH_OPTS=(-i "$WORK/client_key" -c aes128-gcm@openssh.com -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o Port=2222)
mkdir -p /run/sshd

CSV=bench/results/transfer-$(date +%Y%m%d-%H%M%S).csv
echo "condition,tool,run,bytes,seconds,mb_per_s,sender_cpu_s,receiver_cpu_s,sender_rss_kib,receiver_rss_kib" >"$CSV"

# The topology for one condition: namespaces a and b joined by the link emulator.
setup() {
    LE_QUIET=1 bench/netns/linkemu-down.sh --prefix "$PREFIX" >/dev/null 2>&1 || true
    case $1 in
        loopback) LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.77 --no-emu >/dev/null ;;
        wan) LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.77 -- --delay 25ms --rate 500mbit --queue 50ms >/dev/null ;;
        wan-loss) LE_QUIET=1 bench/netns/linkemu-up.sh --prefix "$PREFIX" --net 10.99.77 -- --delay 25ms --rate 500mbit --queue 50ms --loss 1% >/dev/null ;;
    esac
    if [ "$1" = loopback ]; then RECV_NS=${PREFIX}a; HOST=127.0.0.1; else RECV_NS=${PREFIX}b; HOST=10.99.77.2; fi
    SEND_NS=${PREFIX}a
    ip netns exec "$RECV_NS" ip link set lo up
    ip netns exec "$RECV_NS" /usr/sbin/sshd -f "$WORK/sshd_config" -E "$WORK/sshd.log"
    for _ in $(seq 1 50); do [ -s "$WORK/sshd.pid" ] && break; sleep 0.1; done
}
teardown() {
    [ -s "$WORK/sshd.pid" ] && kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
    rm -f "$WORK/sshd.pid"
}

# timed FILE -- command: runs it in the sender namespace under /usr/bin/time.
timed() {
    local out=$1; shift
    ip netns exec "$SEND_NS" /usr/bin/time -f "%e %U %S %M" -o "$out" "$@" >/dev/null 2>"$out.err" || { cat "$out.err" "$WORK/sshd.log" >&2 2>/dev/null; return 1; }
}

# A qxfer receiver for COUNT transfers, under /usr/bin/time; sets RECV_PID.
start_qxfer_recv() {
    rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
    ip netns exec "$RECV_NS" /usr/bin/time -f "%e %U %S %M" -o "$WORK/recv.time" \
        "$QXFER" recv --config-dir "$WORK/cfg-recv" --dir "$WORK/dst" --yes --port 7447 --no-advertise >/dev/null 2>"$WORK/recv.err" &
    RECV_PID=$!
    PIDS+=("$RECV_PID")
    sleep 0.5
}
stop_qxfer_recv() {
    # Signal qxfer itself (not /usr/bin/time, which ignores SIGINT while it waits).
    pkill -INT -f "qxfer recv --config-dir $WORK/cfg-recv" 2>/dev/null || true
    wait "$RECV_PID" 2>/dev/null || true
}

check() {
    local got
    got=$(cat "$@" | xxhsum -H2 - 2>/dev/null | cut -d' ' -f1)
    [ "$got" = "$SUM" ] || { echo "bench: received data differs for $TOOL" >&2; exit 1; }
}

record() {  # condition tool run sender-time-file [receiver-time-file]
    local s r=(0 0 0 0)
    read -r -a s <"$4"
    if [ -n "${5:-}" ] && [ -s "$5" ]; then read -r -a r < <(tail -1 "$5"); fi
    awk -v c="$1" -v t="$2" -v n="$3" -v b="$bytes" -v e="${s[0]}" -v su="${s[1]}" -v ss="${s[2]}" -v sm="${s[3]}" \
        -v ru="${r[1]}" -v rs="${r[2]}" -v rm="${r[3]}" \
        'BEGIN { printf "%s,%s,%d,%d,%.3f,%.1f,%.2f,%.2f,%d,%d\n", c, t, n, b, e, b / e / 1e6, su + ss, ru + rs, sm, rm }' >>"$CSV"
}

run_tool() {  # condition tool run
    TOOL=$2
    case $2 in
        qxfer-quic|qxfer-tls)
            start_qxfer_recv
            timed "$WORK/send.time" "$QXFER" send --config-dir "$WORK/cfg-send" "$WORK/src/file.bin" "$HOST:7447" --stack "${2#qxfer-}" --fingerprint "$FP"
            stop_qxfer_recv
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        qxfer-tls-4files-1conn)
            start_qxfer_recv
            timed "$WORK/send.time" "$QXFER" send --config-dir "$WORK/cfg-send" "$WORK"/parts/part0{0,1,2,3} "$HOST:7447" --stack tls --fingerprint "$FP"
            stop_qxfer_recv
            check "$WORK"/dst/part0{0,1,2,3}
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        qxfer-tls-4files-4conn)
            start_qxfer_recv
            local start end i senders=()
            start=$(date +%s.%N)
            for i in 0 1 2 3; do
                timed "$WORK/send$i.time" "$QXFER" send --config-dir "$WORK/cfg-send" "$WORK/parts/part0$i" "$HOST:7447" --stack tls --fingerprint "$FP" &
                senders+=($!)
            done
            for i in "${senders[@]}"; do wait "$i"; done
            end=$(date +%s.%N)
            stop_qxfer_recv
            check "$WORK"/dst/part0{0,1,2,3}
            # Wall time of the four together; CPU and RSS summed / maximal over the four senders.
            awk -v e="$(echo "$end - $start" | bc)" '{ u += $2; s += $3; if ($4 > m) m = $4 } END { print e, u, s, m }' "$WORK"/send?.time >"$WORK/send.time"
            record "$1" "$2" "$3" "$WORK/send.time" "$WORK/recv.time" ;;
        scp)
            rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
            timed "$WORK/send.time" scp -q "${SSH_OPTS[@]}" "$WORK/src/file.bin" "root@$HOST:$WORK/dst/file.bin"
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" ;;
        rsync)
            rm -rf "$WORK/dst"; mkdir -p "$WORK/dst"
            timed "$WORK/send.time" rsync -e "ssh ${SSH_OPTS[*]}" "$WORK/src/file.bin" "root@$HOST:$WORK/dst/file.bin"
            check "$WORK/dst/file.bin"
            record "$1" "$2" "$3" "$WORK/send.time" ;;
    esac
}

FP=$("$QXFER" id --config-dir "$WORK/cfg-recv")
"$QXFER" id --config-dir "$WORK/cfg-send" >/dev/null
TOOLS=(qxfer-quic qxfer-tls scp rsync qxfer-tls-4files-1conn qxfer-tls-4files-4conn)
for condition in $CONDITIONS; do
    echo "== $condition ($BYTES, $RUNS runs)" >&2
    setup "$condition"
    for run in $(seq 1 "$RUNS"); do
        for tool in "${TOOLS[@]}"; do
            run_tool "$condition" "$tool" "$run"
            tail -1 "$CSV" >&2
        done
    done
    teardown
done

# Markdown: per condition and tool, the median rate and its spread, CPU, RSS, ratio to scp.
echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $BYTES, $RUNS runs; $(date -u +%Y-%m-%d)"
echo
echo "| condition | tool | MB/s (median) | min–max | sender CPU s/GB | receiver CPU s/GB | receiver RSS MiB | × scp |"
echo "|---|---|---|---|---|---|---|---|"
tail -n +2 "$CSV" | sort -t, -k1,1 -k2,2 -k6,6n | awk -F, -v gb="$(echo "$bytes / 1000000000" | bc -l)" '
    { key = $1 "," $2; rates[key] = rates[key] " " $6; n[key]++; cpu_s[key] += $7; cpu_r[key] += $8; if ($10 > rss[key]) rss[key] = $10
      if (!(key in seen)) { order[++k] = key; seen[key] = 1 } }
    END {
        for (i = 1; i <= k; i++) { key = order[i]; split(substr(rates[key], 2), r, " "); m = n[key]
            med[key] = (m % 2) ? r[(m + 1) / 2] : (r[m / 2] + r[m / 2 + 1]) / 2; lo[key] = r[1]; hi[key] = r[m] }
        for (i = 1; i <= k; i++) { key = order[i]; split(key, p, ","); scp = med[p[1] ",scp"]
            printf "| %s | %s | %.1f | %.1f–%.1f | %.2f | %s | %s | %s |\n", p[1], p[2], med[key], lo[key], hi[key],
                cpu_s[key] / n[key] / gb, (cpu_r[key] > 0 ? sprintf("%.2f", cpu_r[key] / n[key] / gb) : "–"),
                (rss[key] > 0 ? sprintf("%.0f", rss[key] / 1024) : "–"), (scp > 0 ? sprintf("%.2f", med[key] / scp) : "–") } }'
echo
echo "CSV: $CSV"
