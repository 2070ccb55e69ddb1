#!/usr/bin/env bash
# Self-test of qxfer-linkemu for CI: the built-in unit tests, then (as root, with /dev/net/tun,
# ip, ping, iperf3, jq and bc) a short live check through real namespaces. About 10 seconds (plus a debug build).
#
#   bench/netns/selftest.sh          -> ends with "N passed, N failed"; exit 0 iff none failed
#
# Env: LINKEMU_BIN (else builds .build-linkemu debug), LINKEMU_PREFIX (default qxs-).
set -u
cd "$(dirname "$0")/../.."
. bench/netns/lib.sh

if [ -z "${LINKEMU_BIN:-}" ]; then
    swift build --scratch-path .build-linkemu --product qxfer-linkemu >/dev/null 2>&1 \
        || le_die "build failed: swift build --scratch-path .build-linkemu --product qxfer-linkemu"
    export LINKEMU_BIN=$PWD/.build-linkemu/debug/qxfer-linkemu
fi
BIN=$LINKEMU_BIN
P=${LINKEMU_PREFIX:-qxs-}
A=${P}a
B=${P}b
PASS=0
FAIL=0
check() { # name condition-exit-status
    if [ "$2" = 0 ]; then PASS=$((PASS + 1)); else FAIL=$((FAIL + 1)); echo "FAIL $1" >&2; fi
}
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
    SERVER_PID=
    LE_QUIET=1 le_down "$P" >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Unit tests built into the binary.
UNIT=$("$BIN" --self-test)
echo "$UNIT" | grep '^FAIL' >&2
read -r UP UF < <(echo "$UNIT" | awk '/ passed, / {print $1, $3}')
PASS=$((PASS + ${UP:-0}))
FAIL=$((FAIL + ${UF:-1}))

# Usage errors: exit 2, one line.
"$BIN" --bogus >/dev/null 2>/tmp/linkemu-selftest.err; rc=$?
check "unknown flag exits 2 with one line" $([ $rc = 2 ] && [ "$(wc -l </tmp/linkemu-selftest.err)" = 1 ]; echo $?)
"$BIN" --delay 5 >/dev/null 2>/tmp/linkemu-selftest.err; rc=$?
check "duration without unit exits 2" $([ $rc = 2 ] && grep -q "invalid duration" /tmp/linkemu-selftest.err; echo $?)
"$BIN" --help | grep -q -- "--reorder-delay"; check "--help lists flags" $?

if [ "$(id -u)" != 0 ] || [ ! -c /dev/net/tun ] || ! command -v iperf3 >/dev/null || ! command -v jq >/dev/null \
    || ! command -v ping >/dev/null || ! command -v bc >/dev/null; then
    echo "selftest: live checks skipped (need root, /dev/net/tun, ping, iperf3, jq, bc;" \
        "apt-get install -y iperf3 iputils-ping jq iproute2 bc)" >&2
else
    # Runtime error: exit 1, one line.
    "$BIN" --a-ns "${P}missing" >/dev/null 2>/tmp/linkemu-selftest.err; rc=$?
    check "missing namespace exits 1 with one line" $([ $rc = 1 ] && [ "$(wc -l </tmp/linkemu-selftest.err)" = 1 ]; echo $?)

    LE_QUIET=1 le_up "$P" 1500 10.99.0 "$BIN" 1 --delay 10ms --rate 20mbit --queue 20ms --seed 3 --stats-interval 100ms
    check "linkemu up" $?
    ST=$(le_state_dir "$P")
    PID=$(cat "$ST/emu.pid" 2>/dev/null)

    # RTT = 2 x 10 ms within 1 ms. The minimum, not the mean: the emulator never
    # delivers early, while a busy machine's scheduler can only add to single samples
    # (CI once measured a 21.001 ms mean).
    MIN=$(ip netns exec "$A" ping -c 10 -i 0.05 -q 10.99.0.2 | awk -F'[=/ ]+' '/^rtt/ {print $6}')
    check "ping RTT 20 ± 1 ms, fastest of 10 (got ${MIN:-none})" $(echo "${MIN:-0} >= 19 && ${MIN:-0} <= 21" | bc | grep -q 1; echo $?)

    # A second emulator on the same devices is refused.
    "$BIN" --a-ns "$A" --b-ns "$B" >/dev/null 2>/tmp/linkemu-selftest.err; rc=$?
    check "busy device refused" $([ $rc = 1 ] && grep -q "busy\|another process" /tmp/linkemu-selftest.err; echo $?)

    # Rate: 50 Mbit/s of UDP into a 20 Mbit/s link arrives at ~20 Mbit/s (payload share 1400/1428).
    ip netns exec "$B" iperf3 -s -1 -B 10.99.0.2 >/dev/null 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 50); do ip netns exec "$B" ss -ltn | grep -q ":5201 " && break; sleep 0.05; done
    RECV=$(ip netns exec "$A" iperf3 -c 10.99.0.2 -u -b 50M -l 1400 -t 3 -J 2>/dev/null | jq '.end.sum.bits_per_second * (100 - .end.sum.lost_percent) / 100')
    wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
    check "UDP through 20mbit ≈ 19.6 Mbit/s (got ${RECV:-none})" \
        $(echo "${RECV:-0} >= 18500000 && ${RECV:-0} <= 20500000" | bc | grep -q 1; echo $?)

    # Periodic stats file and SIGUSR1.
    jq -e '.ab.drop_queue > 0 and .ab.config.rate_bps == 20000000' "$ST/stats.json" >/dev/null
    check "stats file updated, queue drops counted" $?
    kill -USR1 "$PID"; sleep 0.2
    grep -q '"wakeups"' "$ST/emu.out"; check "SIGUSR1 prints counters" $?

    STATS=$(LE_QUIET=1 le_down "$P" | tail -n 1)
    echo "$STATS" | jq -e '.ba.tx_packets > 0' >/dev/null; check "final counters on stop" $?
    ! ip netns list | grep -q "^${P}"; check "namespaces removed" $?
    ! kill -0 "$PID" 2>/dev/null; check "emulator stopped" $?
    [ ! -e "$ST" ]; check "state removed" $?
fi
rm -f /tmp/linkemu-selftest.err
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
