#!/usr/bin/env bash
# End-to-end tests of QUIC's packet size on paths of different MTUs: a sender in namespace a, a
# router in r, a receiver in b (a --veth-- r --veth-- b), each link's MTU set per case.
#
#   sudo Tests/e2e/paths.sh            (root: namespaces; QXFER=path picks the binary)
#
# Proves, with `qxfer send --stack quic` of a 24 MiB file (enough for the sender to probe, see
# SendCommand.pathProbeThreshold), over IPv4 and IPv6:
#  - a path narrower than the sender's link (1 500 then 1 400; the router answers big packets
#    with ICMP "too big") delivers the file whole: QUIC ignores the MTU the kernel learns from
#    the ICMP (before, every GSO batch above it failed and the transfer stalled), the pre-handshake
#    probe finds nothing above what ngtcp2 reaches, and the connection uses ngtcp2's sizes;
#  - an Ethernet path: the probe finds 1 472-byte datagrams (1 452 over IPv6);
#  - jumbo frames end to end: 8 972; jumbo at the sender, Ethernet further on: 1 472;
#  - a tunnel-sized sender link (1 420): no probe, and ngtcp2's own larger probes do no harm;
#  - a small file (under the threshold) is sent without a probe;
#  - a far link whose MTU drops to 1 280 mid-transfer: the sender falls back to 1 200-byte
#    packets (a path-MTU black hole, PacketSizeFallback) and the file arrives whole;
#  - a sender behind a NAT whose public address changes mid-transfer: the connection carries on.
# The packet size is read from the sender's log (-v) and checked against the router's counters:
# the bytes per packet it forwarded to b. Everything it creates is removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
[ -x "$QXFER" ] || { echo "e2e: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "e2e: must run as root (network namespaces)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-e2e-paths.XXXXXX)
NS=qxp$$
RECV_PID=
cleanup() {
    [ -n "$RECV_PID" ] && kill -9 "$RECV_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    for n in a r b; do ip netns del "$NS$n" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "e2e: FAIL: $*" >&2; exit 1; }
ok() { echo "e2e: ok: $*"; }

head -c $((24 << 20)) /dev/urandom >"$WORK/big.bin"
head -c $((64 << 10)) /dev/urandom >"$WORK/small.bin"
"$QXFER" id --config-dir "$WORK/cfg-recv" >/dev/null 2>&1
FP=$("$QXFER" id --config-dir "$WORK/cfg-recv")

# topology SENDER_MTU FAR_MTU: a --(SENDER_MTU)-- r --(FAR_MTU)-- b, IPv4 and IPv6, forwarding on.
topology() {
    for n in a r b; do ip netns del "$NS$n" 2>/dev/null || true; ip netns add "$NS$n"; ip -n "$NS$n" link set lo up; done
    ip link add "${NS}a0" netns "${NS}a" mtu "$1" type veth peer name "${NS}r0" netns "${NS}r" mtu "$1"
    ip link add "${NS}r1" netns "${NS}r" mtu "$2" type veth peer name "${NS}b0" netns "${NS}b" mtu "$2"
    ip -n "${NS}a" addr add 10.66.1.1/24 dev "${NS}a0"; ip -n "${NS}r" addr add 10.66.1.2/24 dev "${NS}r0"
    ip -n "${NS}r" addr add 10.66.2.1/24 dev "${NS}r1"; ip -n "${NS}b" addr add 10.66.2.2/24 dev "${NS}b0"
    ip -n "${NS}a" addr add fd66:1::1/64 dev "${NS}a0" nodad; ip -n "${NS}r" addr add fd66:1::2/64 dev "${NS}r0" nodad
    ip -n "${NS}r" addr add fd66:2::1/64 dev "${NS}r1" nodad; ip -n "${NS}b" addr add fd66:2::2/64 dev "${NS}b0" nodad
    ip -n "${NS}a" link set "${NS}a0" up; ip -n "${NS}r" link set "${NS}r0" up
    ip -n "${NS}r" link set "${NS}r1" up; ip -n "${NS}b" link set "${NS}b0" up
    ip -n "${NS}a" route add default via 10.66.1.2; ip -n "${NS}b" route add default via 10.66.2.1
    ip -n "${NS}a" -6 route add default via fd66:1::2; ip -n "${NS}b" -6 route add default via fd66:2::1
    ip netns exec "${NS}r" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
    # Neighbour discovery on a fresh IPv6 path takes about a second here: done before the probe,
    # whose patience for a first answer is one second. Pinged until the first answer (-w), not
    # once: one echo request lost while the fresh links settle failed a CI run.
    ip netns exec "${NS}a" ping -c 1 -i 0.2 -w 10 10.66.2.2 >/dev/null || fail "topology $1/$2: no IPv4 route to b"
    ip netns exec "${NS}a" ping -6 -c 1 -i 0.2 -w 10 fd66:2::2 >/dev/null || fail "topology $1/$2: no IPv6 route to b"
}

# transfer NAME FILE HOST [DURING]: one QUIC send a -> b, the file checked; sets PROBED (the size
# the sender's probe found, empty if none) and FORWARDED (bytes per packet the router sent to b).
# DURING, if given, is a command run beside the send.
transfer() {
    local name=$1 file=$2 host=$3 during=${4:-} dst=$WORK/dst-$1 during_pid=
    mkdir -p "$dst"
    ip netns exec "${NS}b" "$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --dir "$dst" --yes --once --port 7447 \
        >"$WORK/$name.recv.out" 2>"$WORK/$name.recv.err" </dev/null &
    RECV_PID=$!
    local stats=/sys/class/net/${NS}r1/statistics packets bytes
    packets=$(ip netns exec "${NS}r" cat "$stats/tx_packets"); bytes=$(ip netns exec "${NS}r" cat "$stats/tx_bytes")
    for _ in $(seq 100); do grep -q "receiving into" "$WORK/$name.recv.out" 2>/dev/null && break; sleep 0.1; done
    grep -q "receiving into" "$WORK/$name.recv.out" || fail "$name: recv did not start: $(cat "$WORK/$name.recv.err")"
    if [ -n "$during" ]; then $during & during_pid=$!; fi
    timeout 90 ip netns exec "${NS}a" "$QXFER" send -v --config-dir "$WORK/cfg-send" "$file" "$host:7447" --stack quic \
        --fingerprint "$FP" >"$WORK/$name.send.out" 2>"$WORK/$name.send.err" </dev/null \
        || fail "$name: send failed or stalled (exit $?): $(tail -3 "$WORK/$name.send.err")"
    if [ -n "$during_pid" ]; then wait "$during_pid" || fail "$name: $during failed"; fi
    wait "$RECV_PID" || fail "$name: recv exited with $?: $(tail -3 "$WORK/$name.recv.err")"
    RECV_PID=
    cmp -s "$file" "$dst/$(basename "$file")" || fail "$name: the received file differs"
    packets=$(( $(ip netns exec "${NS}r" cat "$stats/tx_packets") - packets ))
    bytes=$(( $(ip netns exec "${NS}r" cat "$stats/tx_bytes") - bytes ))
    # veth forwards GSO batches whole: bytes per segment are what the sender's log says;
    # the router's counters prove the batches got through at all.
    FORWARDED=$(( bytes / (packets > 0 ? packets : 1) ))
    PROBED=$(sed -n 's/.*QUIC datagrams of \([0-9]*\) bytes reach.*/\1/p' "$WORK/$name.send.err" | head -1)
}

# expect NAME WANT: PROBED equals WANT ("" for no size found).
expect() {
    [ "$PROBED" = "$2" ] || fail "$1: probe found '${PROBED}', expected '$2' ($(grep -i datagram "$WORK/$1.send.err" | head -2))"
    ok "$1: ${2:-no larger} datagrams, file whole (router forwarded $FORWARDED bytes per packet)"
}

topology 1500 1400
transfer narrow-v4 "$WORK/big.bin" 10.66.2.2; expect narrow-v4 ""
transfer narrow-v6 "$WORK/big.bin" "[fd66:2::2]"; expect narrow-v6 ""
# A second run on the same path: the kernel now remembers an MTU of 1 400 for b.
ip -n "${NS}a" route get 10.66.2.2 | grep -q "mtu 1400" || fail "narrow: the kernel did not learn the path's MTU from ICMP"
transfer narrow-again "$WORK/big.bin" 10.66.2.2; expect narrow-again ""

# A tunnel-sized link at the sender (WireGuard's 1 420): nothing worth probing, and ngtcp2's own
# probes above the interface's MTU fail at the socket (EMSGSIZE) without harm.
topology 1420 1420
transfer tunnel "$WORK/big.bin" 10.66.2.2; expect tunnel ""

topology 1500 1500
transfer ethernet-v4 "$WORK/big.bin" 10.66.2.2; expect ethernet-v4 1472
transfer ethernet-v6 "$WORK/big.bin" "[fd66:2::2]"; expect ethernet-v6 1452
transfer small-file "$WORK/small.bin" 10.66.2.2; expect small-file ""

# Returns once the router has forwarded 16 MiB more towards b (at most 30 s): mid-transfer.
wait_for_16_mib_forwarded() {
    local stats=/sys/class/net/${NS}r1/statistics/tx_bytes start
    start=$(ip netns exec "${NS}r" cat "$stats")
    for _ in $(seq 3000); do
        [ $(( $(ip netns exec "${NS}r" cat "$stats") - start )) -ge $((16 << 20)) ] && break
        sleep 0.01
    done
}

# The far link's MTU drops to 1 280 (IPv6's minimum) once 16 MiB have crossed it, as when a
# route moves into a tunnel: the full-size packets of the established connection vanish. The
# sender must fall back to 1 200-byte packets and finish, as TCP does from the router's ICMP;
# before, it sent full-size packets into the hole until the receiver gave up after 60 s.
drop_far_mtu_midway() {
    wait_for_16_mib_forwarded
    ip -n "${NS}r" link set "${NS}r1" mtu 1280 && ip -n "${NS}b" link set "${NS}b0" mtu 1280
}
head -c $((128 << 20)) /dev/urandom >"$WORK/bigger.bin"
for family in v4 v6; do
    topology 1500 1500
    host=10.66.2.2; [ $family = v6 ] && host="[fd66:2::2]"
    transfer "mtu-drop-$family" "$WORK/bigger.bin" "$host" drop_far_mtu_midway
    grep -q "stopped getting through to .*: sending packets of 1200 bytes" "$WORK/mtu-drop-$family.send.err" \
        || fail "mtu-drop-$family: no fallback in the sender's log: $(grep -i "qxfer.quic" "$WORK/mtu-drop-$family.send.err" | tail -3)"
    [ "$(ip -n "${NS}b" link show "${NS}b0" | grep -o 'mtu [0-9]*')" = "mtu 1280" ] || fail "mtu-drop-$family: the MTU was not lowered"
    ok "mtu-drop-$family: the far link's MTU fell to 1280 mid-transfer; the sender fell back to 1200-byte packets and the file arrived whole"
done

# The sender behind a NAT (the router masquerades) whose public address changes once 16 MiB
# have crossed, as a carrier-grade NAT's can: the receiver sees the connection's packets come
# from a new address. QUIC must carry on there (the receiver validates the new path) without the
# sender reconnecting; TCP's connection would be reset.
change_public_address_midway() {
    wait_for_16_mib_forwarded
    ip -n "${NS}r" addr add 10.66.2.3/24 dev "${NS}r1" && ip -n "${NS}r" addr del 10.66.2.1/24 dev "${NS}r1"
}
topology 1500 1500
ip netns exec "${NS}r" sysctl -qw net.ipv4.conf.all.promote_secondaries=1 "net.ipv4.conf.${NS}r1.promote_secondaries=1"
ip netns exec "${NS}r" nft add table ip qxnat
ip netns exec "${NS}r" nft add chain ip qxnat post '{ type nat hook postrouting priority 100; }'
ip netns exec "${NS}r" nft add rule ip qxnat post oifname "${NS}r1" masquerade
transfer nat-rebinding "$WORK/bigger.bin" 10.66.2.2 change_public_address_midway
# Read whole, not piped into grep -q: with pipefail, ip's write after grep quit (SIGPIPE) failed the check.
addresses=$(ip -n "${NS}r" addr show dev "${NS}r1")
[[ $addresses == *"10.66.2.3/"* ]] || fail "nat-rebinding: the public address did not change"
! grep -qi "reconnect" "$WORK/nat-rebinding.send.err" "$WORK/nat-rebinding.send.out" \
    || fail "nat-rebinding: the sender reconnected instead of carrying on: $(grep -i reconnect "$WORK/nat-rebinding.send.err" | head -1)"
ok "nat-rebinding: the sender's public address changed mid-transfer; the connection carried on and the file arrived whole"

topology 9000 9000
transfer jumbo "$WORK/big.bin" 10.66.2.2; expect jumbo 8972

topology 9000 1500
transfer jumbo-then-ethernet "$WORK/big.bin" 10.66.2.2; expect jumbo-then-ethernet 1472

echo "e2e: paths: all passed"
