#!/usr/bin/env bash
# Validate qxfer-linkemu against its settings and print a Markdown table.
#
#   bench/validate-linkemu.sh            (root; ~2.5 minutes; exit 0 if every check passes)
#
# Env: LINKEMU_BIN (skip the build), LINKEMU_PREFIX (namespace prefix, default qxv-),
#      LINKEMU_OUT (raw outputs, default /tmp/qxfer-linkemu-validate), TCP_SECONDS (default 20).
# Checks: idle ping RTT = 2 x delay (+-1 ms); TCP cubic and bbr through 500 Mbit/s, 25 ms each
# way, 50 ms queue reach >= 90 % of the rate; random loss 1 % measured with iperf3 UDP, the
# emulator's counters and ping -f; unlimited link >= 2 Gbit/s TCP. Everything it creates
# (namespaces, devices, emulator, iperf3) is removed on exit, also on Ctrl-C.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
. bench/netns/lib.sh

[ "$(id -u)" = 0 ] || le_die "must run as root"
if ! command -v iperf3 >/dev/null || ! command -v ping >/dev/null || ! command -v jq >/dev/null || ! command -v ip >/dev/null || ! command -v bc >/dev/null; then
    apt-get update -qq && apt-get install -y iperf3 iputils-ping jq iproute2 bc >/dev/null || le_die "apt-get install failed"
fi
if [ -z "${LINKEMU_BIN:-}" ]; then
    swift build -c release --scratch-path .build-linkemu --product qxfer-linkemu >/dev/null 2>&1 \
        || le_die "build failed: swift build -c release --scratch-path .build-linkemu --product qxfer-linkemu"
    export LINKEMU_BIN=$ROOT/.build-linkemu/release/qxfer-linkemu
fi
BIN=$LINKEMU_BIN
P=${LINKEMU_PREFIX:-qxv-}
OUT=${LINKEMU_OUT:-/tmp/qxfer-linkemu-validate}
TCP_SECONDS=${TCP_SECONDS:-20}
A=${P}a
B=${P}b
ADDR_B=10.99.0.2
mkdir -p "$OUT"
ST=$(le_state_dir "$P")

SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
    SERVER_PID=
    LE_QUIET=1 le_down "$P" >/dev/null 2>&1
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

ROWS=()
CMDS=()
FAILED=0
row() { # name flags target measured pass(1/0)
    local verdict=PASS
    [ "$5" = 1 ] || { verdict=FAIL; FAILED=$((FAILED + 1)); }
    ROWS+=("| $1 | \`$2\` | $3 | $4 | $verdict |")
}

# up FLAGS... : fresh namespaces + emulator with FLAGS (MTU from $MTU, default 1500)
up() {
    cleanup
    LE_QUIET=1 le_up "$P" "${MTU:-1500}" 10.99.0 "$BIN" 1 --seed 1 "$@" || le_die "linkemu-up failed"
    EMU_PID=$(cat "$ST/emu.pid")
    CPU0=$(awk '{print $14 + $15}' "/proc/$EMU_PID/stat")
    T0=$(date +%s.%N)
}
# down -> final counters JSON in $STATS, emulator CPU (% of one core) in $CPU
down() {
    local c1 t1
    c1=$(awk '{print $14 + $15}' "/proc/$EMU_PID/stat")
    t1=$(date +%s.%N)
    CPU=$(echo "scale=0; ($c1 - $CPU0) * 100 / $(getconf CLK_TCK) / ($t1 - $T0)" | bc)
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=; fi
    STATS=$(LE_QUIET=1 le_down "$P" 2>/dev/null | tail -n 1)
}
server() { # start a one-shot iperf3 server in B
    ip netns exec "$B" iperf3 -s -1 -B "$ADDR_B" >/dev/null 2>&1 &
    SERVER_PID=$!
    local n=0
    until ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":5201 "; do
        sleep 0.05; n=$((n + 1)); [ $n -lt 100 ] || le_die "iperf3 server did not start"
    done
}
tundrops() { ip -n "$1" -s -j link show tun0 | jq '.[0].stats64.tx.dropped'; }
mbit() { echo "scale=1; $1 / 1000000" | bc; }

# 1. Idle RTT ----------------------------------------------------------------------------
FLAGS="--delay 25ms --rate 500mbit --queue 50ms"
up $FLAGS
# ping under SCHED_FIFO too: it stamps the send time in user space, so a ping process
# preempted by other load between stamping and sending would inflate its own RTT.
ip netns exec "$A" chrt -f 20 ping -c 200 -i 0.02 "$ADDR_B" >"$OUT/ping-rtt.txt" 2>&1
down
read -r RMIN RAVG RMAX RMDEV < <(awk -F'[=/ ]+' '/^rtt/ {print $6, $7, $8, $9}' "$OUT/ping-rtt.txt")
# Median, 99th percentile and the share of pings outside 50 +- 1 ms.
read -r RN RMED RP99 ROUT < <(awk -F'time=' '/time=/ {split($2, t, " "); print t[1]}' "$OUT/ping-rtt.txt" | sort -n |
    awk '{v[NR] = $1; if ($1 < 49 || $1 > 51) out++} END {printf "%d %s %s %d\n", NR, v[int((NR + 1) / 2)], v[int(NR * 0.99 + 0.999)], out}')
ok=$(echo "${RN:-0} >= 190 && $RAVG >= 49 && $RAVG <= 51 && $RMED >= 49 && $RMED <= 51 && $RP99 <= 51" | bc)
row "idle ping RTT" "$FLAGS" "50 ± 1 ms (2 × delay): mean, median and 99th percentile" \
    "mean $RAVG, median $RMED, p99 $RP99, min $RMIN, max $RMAX, mdev $RMDEV ms; $ROUT of $RN pings outside 49–51 ms" "$ok"
CMDS+=("ip netns exec $A chrt -f 20 ping -c 200 -i 0.02 $ADDR_B")

# 2. TCP through 500 Mbit/s, 50 ms RTT, 50 ms queue ---------------------------------------
for cc in cubic bbr; do
    up $FLAGS
    server
    ip netns exec "$A" iperf3 -c "$ADDR_B" -t "$TCP_SECONDS" -C "$cc" -J >"$OUT/tcp-$cc.json" 2>&1
    DROPS=$(tundrops "$A")
    down
    BPS=$(jq '.end.sum_received.bits_per_second' "$OUT/tcp-$cc.json")
    RETR=$(jq '.end.sum_sent.retransmits' "$OUT/tcp-$cc.json")
    DQ=$(echo "$STATS" | jq '.ab.drop_queue')
    MQ=$(echo "$STATS" | jq '.ab.max_queue_ms')
    ok=$(echo "$BPS >= 450000000" | bc)
    row "TCP $cc, 500 Mbit/s, RTT 50 ms" "$FLAGS" "≥ 450 Mbit/s (90 %)" \
        "$(mbit "$BPS") Mbit/s over ${TCP_SECONDS} s ($(echo "scale=1; $BPS / 5000000" | bc) %); retransmits $RETR, queue drops $DQ, max queue $MQ ms, drops before emulator $DROPS, emulator CPU ${CPU} %" "$ok"
    CMDS+=("ip netns exec $B iperf3 -s -1 -B $ADDR_B & ip netns exec $A iperf3 -c $ADDR_B -t $TCP_SECONDS -C $cc -J")
done

# 3. Random loss 1 % ----------------------------------------------------------------------
FLAGS="--loss 1%"
up $FLAGS
server
ip netns exec "$A" iperf3 -c "$ADDR_B" -u -b 100M -l 1400 -t 10 -J >"$OUT/udp-loss.json" 2>&1
down
LOST=$(jq '.end.sum.lost_packets' "$OUT/udp-loss.json")
PKTS=$(jq '.end.sum.packets' "$OUT/udp-loss.json")
UPCT=$(echo "scale=3; 100 * $LOST / $PKTS" | bc)
ERX=$(echo "$STATS" | jq '.ab.rx_packets')
ELOSS=$(echo "$STATS" | jq '.ab.drop_loss')
EPCT=$(echo "scale=3; 100 * $ELOSS / $ERX" | bc)
# 95 % interval of a binomial share of 1 % over PKTS packets.
HALF=$(echo "scale=12; h = 1.96 * sqrt(0.01 * 0.99 / $PKTS) * 100; scale=3; h / 1" | bc)
ok=$(echo "$UPCT >= 1 - $HALF && $UPCT <= 1 + $HALF" | bc)
row "loss, iperf3 UDP A→B" "$FLAGS" "1 % one way" "$UPCT % ($LOST of $PKTS datagrams; 95 % interval ±$HALF); emulator counted $EPCT % ($ELOSS of $ERX)" "$ok"
CMDS+=("ip netns exec $B iperf3 -s -1 -B $ADDR_B & ip netns exec $A iperf3 -c $ADDR_B -u -b 100M -l 1400 -t 10 -J")

up $FLAGS
ip netns exec "$A" ping -f -c 20000 -q "$ADDR_B" >"$OUT/ping-flood.txt" 2>&1
down
read -r TX RX < <(awk '/packets transmitted/ {print $1, $4}' "$OUT/ping-flood.txt")
PPCT=$(echo "scale=3; 100 * ($TX - $RX) / $TX" | bc)
HALF=$(echo "scale=12; h = 1.96 * sqrt(0.0199 * 0.9801 / $TX) * 100; scale=3; h / 1" | bc)
ok=$(echo "$PPCT >= 1.99 - $HALF && $PPCT <= 1.99 + $HALF" | bc)
row "loss, ping -f round trip" "$FLAGS" "1.99 % (1 − 0.99²)" "$PPCT % ($((TX - RX)) of $TX; 95 % interval ±$HALF)" "$ok"
CMDS+=("ip netns exec $A ping -f -c 20000 -q $ADDR_B")

# 4. Unlimited ------------------------------------------------------------------------------
unlimited() { # label mtu target_bps flags...
    local label=$1 mtu=$2 target=$3
    shift 3
    MTU=$mtu up "$@"
    server
    ip netns exec "$A" iperf3 -c "$ADDR_B" -t 10 -J >"$OUT/unlimited-$label.json" 2>&1
    DROPS=$(tundrops "$A")
    down
    BPS=$(jq '.end.sum_received.bits_per_second' "$OUT/unlimited-$label.json")
    RETR=$(jq '.end.sum_sent.retransmits' "$OUT/unlimited-$label.json")
    local ok=1 tgt="(for information)"
    if [ "$target" != 0 ]; then ok=$(echo "$BPS >= $target" | bc); tgt="≥ $(mbit "$target") Mbit/s"; fi
    row "unlimited TCP, MTU $mtu, $label" "${*:-(no flags)}" "$tgt" \
        "$(mbit "$BPS") Mbit/s; retransmits $RETR, drops before emulator $DROPS, emulator CPU ${CPU} %" "$ok"
    CMDS+=("[MTU $mtu] ip netns exec $A iperf3 -c $ADDR_B -t 10 -J")
}
unlimited "GSO passthrough (default)" 1500 2000000000
unlimited "per packet" 1500 0 --offload csum
unlimited "per packet" 9000 0 --offload csum

echo "| Check | Emulator flags | Target | Measured | Result |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${ROWS[@]}"
echo
echo "Commands (namespaces $A / $B made by bench/netns/linkemu-up.sh --prefix $P -- --seed 1 FLAGS; raw output in $OUT):"
printf '    %s\n' "${CMDS[@]}"
echo
echo "$(( ${#ROWS[@]} - FAILED )) passed, $FAILED failed"
[ "$FAILED" = 0 ]
