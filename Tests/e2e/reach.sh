#!/usr/bin/env bash
# End-to-end tests of transfer codes across NATs (issue 61; docs/PROTOCOL.md §9): two homes
# behind two NAT routers, a "public" host with `qxfer relay` between them, in network namespaces
# this script builds and removes (bench/netns/nat.sh draws the topology):
#
#   home A 10.1.0.2 ── router A (NAT) 198.51.100.10 ══ public 198.51.100.1 ══ 198.51.100.20 router B (NAT) ── home B 192.168.2.2
#                                     (══ qxfer-linkemu: 12.5 ms each way per leg, REACH_RATE)   relay :7450
#
# First the topology itself, without qxfer: each NAT's mapping (cone: `masquerade` keeps the
# home socket's port towards two destinations; symmetric: `masquerade fully-random` gives each
# destination its own port), its filtering (an answer from another public port never gets in),
# what plain UDP hole punching achieves (open between two cone NATs, closed with a symmetric
# one), and the legs' delay. Then, `qxfer send FILE --code` in home A and `qxfer recv CODE` in
# home B, each case checking the received file (cmp), both sides' --json "path", and what the
# public host's counters saw (bytes forwarded between the WANs = direct; bytes to the relay's
# port = relayed):
#   a  two cone NATs: the file arrives over the direct path
#   b  the sender behind a symmetric NAT: it arrives through the relay (no punch can pass:
#      nat_check_punch above shows why)
#   c  UDP to the WAN dropped at router A: it arrives over TCP+TLS through the relay's splice;
#      the relay given by QXFER_RELAY instead of --relay
#   d  a wrong code: both sides refuse with a clear message, exit non-zero, nothing is written;
#      the code is spent (the right code afterwards is refused too)
#   e  the relay killed (SIGKILL) once the direct path has carried a quarter of a 32 MiB file:
#      the transfer goes on and completes
#   f  the relay flooded from another host (bogus datagrams and bogus hellos, Tests/e2e/
#      reach_tools.py flood) while a pair behind a symmetric NAT transfers through it: completes
#   g  a LAN with no relay: two namespaces on one veth; send --code and recv CODE find each
#      other over multicast DNS, direct
#
#   sudo Tests/e2e/reach.sh            (QXFER=path picks the binary, qxfer-linkemu beside it or
#                                       LINKEMU_BIN; REACH_CASES="a b" runs some cases;
#                                       REACH_TOPOLOGY_ONLY=1 checks only the topology)
#
# Skips (exit 0, "skipped: ...") only when not root or without nft. No assertion bounds a time:
# the timeouts below only stop a hung process. Everything it creates is removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ]; then echo "reach: skipped: not root (network namespaces need root)"; exit 0; fi
if ! command -v nft >/dev/null; then echo "reach: skipped: nft (nftables) is missing; scripts/install-deps.sh installs it"; exit 0; fi

QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
export LINKEMU_BIN=${LINKEMU_BIN:-$(dirname "$QXFER")/qxfer-linkemu}
TOPOLOGY_ONLY=${REACH_TOPOLOGY_ONLY:-}
CASES=${REACH_CASES:-a b c d e f g}
export NAT_LEG_DELAY=${REACH_DELAY:-12.5ms} NAT_LEG_RATE=${REACH_RATE:-200mbit}
TOOLS=$ROOT/Tests/e2e/reach_tools.py
[ -x "$LINKEMU_BIN" ] || { echo "reach: FAIL: $LINKEMU_BIN not built" >&2; exit 1; }
[ -n "$TOPOLOGY_ONLY" ] || [ -x "$QXFER" ] || { echo "reach: FAIL: $QXFER not built" >&2; exit 1; }
for tool in ip python3 ping ss; do command -v $tool >/dev/null || { echo "reach: FAIL: $tool missing (scripts/install-deps.sh)" >&2; exit 1; }; done

. "$ROOT/bench/netns/nat.sh"
WORK=$(mktemp -d /tmp/qxfer-e2e-reach.XXXXXX)
P=qxr$$
PIDS=()
cleanup() {
    local pid
    set +e  # every step runs, whatever the one before returned
    for pid in "${PIDS[@]}"; do { kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true; done
    NAT_QUIET=1 nat_down
    wait 2>/dev/null || true
    for n in la lb; do ip netns del "$P$n" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "reach: FAIL: $*" >&2; exit 1; }
ok() { echo "reach: ok: $*"; }

# --- the topology ------------------------------------------------------------------------
nat_up "$P"
PUB=$(nat_ns pub) HA=$(nat_ns ha) HB=$(nat_ns hb)
nat_check_delay || fail "the legs' delay"
nat_check_mapping a none || fail "routing without NAT"
nat_mode a cone; nat_mode b symmetric
nat_check_mapping a cone || fail "the cone NAT's mapping"
nat_check_mapping b symmetric || fail "the symmetric NAT's mapping"
nat_check_punch closed || fail "punching through a symmetric NAT"
nat_mode b cone
nat_check_mapping b cone || fail "the cone NAT's mapping"
nat_check_punch open || fail "punching between two cone NATs"
ok "topology: two NATs (cone: port kept whatever the destination; symmetric: a port per destination), filtering by address and port, punching open only between cones, $NAT_LEG_DELAY per leg"
if [ -n "$TOPOLOGY_ONLY" ]; then echo "reach: topology only (REACH_TOPOLOGY_ONLY): the qxfer cases were not run"; exit 0; fi

# Counters on the public host: bytes forwarded from one WAN leg to the other (a direct path)
# and bytes arriving at the relay's port (a relayed path; TCP and UDP).
ip netns exec "$PUB" nft -f - <<EOF
table inet qxcount {
    counter direct { }
    counter relayed { }
    counter relayed_udp { }
    chain forward_count {
        type filter hook forward priority filter; policy accept;
        iifname { "wana", "wanb" } oifname { "wana", "wanb" } counter name "direct"
    }
    chain input_count {
        type filter hook input priority filter; policy accept;
        ip daddr $NAT_RELAY th dport 7450 counter name "relayed"
        ip daddr $NAT_RELAY udp dport 7450 counter name "relayed_udp"
    }
}
EOF
counter() { ip netns exec "$PUB" nft list counter inet qxcount "$1" | sed -n 's/.*bytes \([0-9]*\).*/\1/p'; }

RELAY_PID=
start_relay() {
    ip netns exec "$PUB" "$QXFER" relay --port 7450 --json >>"$WORK/relay.out" 2>>"$WORK/relay.err" </dev/null &
    RELAY_PID=$!
    PIDS+=("$RELAY_PID")
    local _
    for _ in $(seq 200); do
        if ip netns exec "$PUB" ss -Htln 'sport = :7450' | grep -q . && ip netns exec "$PUB" ss -Huln 'sport = :7450' | grep -q .; then
            return 0
        fi
        kill -0 "$RELAY_PID" 2>/dev/null || fail "qxfer relay exited: $(tail -3 "$WORK/relay.err")"
        sleep 0.05
    done
    fail "qxfer relay is not listening on TCP and UDP 7450: $(tail -3 "$WORK/relay.err")"
}

make_file() { head -c "$2" /dev/urandom >"$WORK/$1"; }
make_file small.bin $((4 << 20))
make_file mid.bin $((8 << 20))
make_file big.bin $((32 << 20))

# start_sender NAME FILE [send options...]: qxfer send --code in home A, in the background;
# sets SEND_PID and CODE (read from its --json output).
start_sender() {
    local name=$1 file=$2
    shift 2
    timeout 300 ip netns exec "$HA" "$QXFER" send "$file" --code --json --config-dir "$WORK/cfg-a" "$@" \
        >"$WORK/$name.send.out" 2>"$WORK/$name.send.err" </dev/null &
    SEND_PID=$!
    PIDS+=("$SEND_PID")
    CODE=$(python3 "$TOOLS" code "$WORK/$name.send.out" 60) \
        || fail "$name: the sender printed no code: $(tail -3 "$WORK/$name.send.err")"
}

# receive NAME CODE [recv options...]: qxfer recv CODE in home B into $WORK/NAME.dst; sets RECV_RC.
receive() {
    local name=$1 code=$2
    shift 2
    mkdir -p "$WORK/$name.dst"
    RECV_RC=0
    timeout 300 ip netns exec "$HB" "$QXFER" recv "$code" --dir "$WORK/$name.dst" --yes --json --config-dir "$WORK/cfg-b" "$@" \
        >"$WORK/$name.recv.out" 2>"$WORK/$name.recv.err" </dev/null || RECV_RC=$?
}

# finish NAME FILE PATH: both sides exited 0, the file arrived whole, both summaries name PATH.
finish() {
    local name=$1 file=$2 want=$3 send_rc=0 side summary
    wait "$SEND_PID" || send_rc=$?
    [ "$RECV_RC" = 0 ] || fail "$name: recv exited $RECV_RC: $(tail -3 "$WORK/$name.recv.err")"
    [ "$send_rc" = 0 ] || fail "$name: send exited $send_rc: $(tail -3 "$WORK/$name.send.err")"
    cmp -s "$file" "$WORK/$name.dst/$(basename "$file")" || fail "$name: the received file differs from the sent one"
    for side in send recv; do
        summary=$(python3 "$TOOLS" summary "$WORK/$name.$side.out") || fail "$name: the ${side}er's --json names no path: $(tail -2 "$WORK/$name.$side.out")"
        [ "$(jq -r .path <<<"$summary")" = "$want" ] || fail "$name: the ${side}er says the path was $(jq -r .path <<<"$summary"), expected $want: $summary"
        # The bytes each way (path_direct_bytes, path_relayed_bytes) carry at least the file on
        # the path named.
        [ "$(jq -r ".path_${want}_bytes // 0" <<<"$summary")" -ge "$(stat -c %s "$file")" ] \
            || fail "$name: the ${side}er counts fewer bytes $want than the file's: $summary"
        SUMMARY[$side]=$summary
    done
}
declare -A SUMMARY

# counted NAME SIZE WANT: the public host's counters since mark_counters agree with WANT
# (direct: at least SIZE bytes forwarded between the WANs; relayed: at least SIZE to the relay).
mark_counters() { DIRECT0=$(counter direct); RELAYED0=$(counter relayed); RELAYED_UDP0=$(counter relayed_udp); }
counted() {
    local name=$1 size=$2 want=$3 direct relayed
    direct=$(( $(counter direct) - DIRECT0 )) relayed=$(( $(counter relayed) - RELAYED0 ))
    RELAYED_UDP=$(( $(counter relayed_udp) - RELAYED_UDP0 ))
    case $want in
        direct) [ "$direct" -ge "$size" ] || fail "$name: only $direct bytes crossed between the WANs directly (relay: $relayed) for $size" ;;
        relayed) [ "$relayed" -ge "$size" ] || fail "$name: only $relayed bytes reached the relay (direct: $direct) for $size" ;;
    esac
    COUNTED="public host: $direct bytes direct, $relayed to the relay"
}

has_case() { [[ " $CASES " == *" $1 "* ]]; }
start_relay
RELAY="$NAT_RELAY:7450"

if has_case a; then
    nat_mode a cone; nat_mode b cone
    mark_counters
    start_sender a "$WORK/mid.bin" --relay "$RELAY"
    receive a "$CODE" --relay "$RELAY"
    finish a "$WORK/mid.bin" direct
    counted a $((8 << 20)) direct
    ok "a: two cone NATs: 8 MiB arrived whole over the direct path ($COUNTED)"
fi

if has_case b; then
    # The sender's NAT gives the peer a port nobody announced, and the receiver's NAT drops
    # what comes from it (nat_check_punch closed): only the relay carries the transfer.
    nat_mode a symmetric; nat_mode b cone
    mark_counters
    start_sender b "$WORK/mid.bin" --relay "$RELAY"
    receive b "$CODE" --relay "$RELAY"
    finish b "$WORK/mid.bin" relayed
    counted b $((8 << 20)) relayed
    ok "b: the sender behind a symmetric NAT: 8 MiB arrived whole through the relay ($COUNTED)"
fi

if has_case c; then
    nat_mode a cone udp-blocked; nat_mode b cone
    mark_counters
    QXFER_RELAY=$RELAY start_sender c "$WORK/small.bin"
    QXFER_RELAY=$RELAY receive c "$CODE"
    finish c "$WORK/small.bin" relayed
    counted c $((4 << 20)) relayed
    [ "$RELAYED_UDP" -lt $((1 << 20)) ] || fail "c: $RELAYED_UDP bytes of UDP reached the relay with UDP blocked at router A"
    stack=$(jq -r '.stack // empty' <<<"${SUMMARY[recv]}")
    [[ ${stack,,} == *tls* ]] || fail "c: UDP blocked, yet the receiver names the stack '$stack'"
    ok "c: UDP dropped at router A: 4 MiB arrived whole over TCP+TLS through the relay (QXFER_RELAY; $COUNTED)"
fi

if has_case d; then
    nat_mode a cone; nat_mode b cone
    start_sender d "$WORK/small.bin" --relay "$RELAY"
    wrong=$(python3 "$TOOLS" wrong-code "$CODE")
    receive d "$wrong" --relay "$RELAY"
    send_rc=0; wait "$SEND_PID" || send_rc=$?
    [ "$RECV_RC" != 0 ] && [ "$send_rc" != 0 ] || fail "d: a wrong code: recv exited $RECV_RC, send $send_rc (both must fail)"
    [ "$RECV_RC" != 124 ] && [ "$send_rc" != 124 ] || fail "d: a wrong code left a side waiting until the timeout"
    for side in send recv; do
        grep -qiE "code did not match|wrong code" "$WORK/d.$side.err" "$WORK/d.$side.out" || fail "d: the ${side}er does not say the code was wrong: $(tail -2 "$WORK/d.$side.err")"
    done
    [ -z "$(find "$WORK/d.dst" -mindepth 1 | head -1)" ] || fail "d: a wrong code wrote into the target: $(find "$WORK/d.dst" -mindepth 1 | head -3)"
    wrong_rc=$RECV_RC
    # One try per code: the right code, now, is refused too.
    receive d-again "$CODE" --relay "$RELAY"
    [ "$RECV_RC" != 0 ] && [ "$RECV_RC" != 124 ] || fail "d: the right code after a wrong one: recv exited $RECV_RC (the code must be spent)"
    [ -z "$(find "$WORK/d-again.dst" -mindepth 1 | head -1)" ] || fail "d: the spent code wrote into the target"
    ok "d: a wrong code: both sides refused (exit $send_rc / $wrong_rc: $(tail -1 "$WORK/d.recv.err")), the right code then too (exit $RECV_RC), nothing written, the code spent"
fi

if has_case e; then
    nat_mode a cone; nat_mode b cone
    mark_counters
    size=$((32 << 20))
    start_sender e "$WORK/big.bin" --relay "$RELAY"
    ( receive e "$CODE" --relay "$RELAY"; echo "$RECV_RC" >"$WORK/e.recv.rc" ) &
    receiver=$!
    PIDS+=("$receiver")
    # A quarter of the file forwarded between the WANs directly: the direct path is up.
    for _ in $(seq 6000); do
        [ $(( $(counter direct) - DIRECT0 )) -ge $((size / 4)) ] && break
        kill -0 "$receiver" 2>/dev/null || break
        sleep 0.05
    done
    moved=$(( $(counter direct) - DIRECT0 ))
    kill -0 "$receiver" 2>/dev/null || fail "e: the receiver ended before the relay could be killed mid-transfer ($moved bytes direct): $(tail -2 "$WORK/e.recv.err")"
    [ "$moved" -ge $((size / 4)) ] || fail "e: the direct path carried only $moved bytes"
    kill -9 "$RELAY_PID"
    wait "$RELAY_PID" 2>/dev/null || true
    [ "$moved" -lt "$size" ] || fail "e: the relay was killed only after the whole file had crossed"
    wait "$receiver" || true
    RECV_RC=$(cat "$WORK/e.recv.rc" 2>/dev/null || echo lost)
    finish e "$WORK/big.bin" direct
    ok "e: the relay killed after $((moved >> 20)) MiB of 32 had crossed directly: the transfer went on and completed"
    start_relay
fi

if has_case f; then
    nat_mode a symmetric; nat_mode b cone
    ip netns exec "$(nat_ns x)" python3 "$TOOLS" flood "$NAT_RELAY" 7450 300 >"$WORK/flood.out" 2>"$WORK/flood.err" &
    flooder=$!
    PIDS+=("$flooder")
    sleep 2  # the flood under way before the pair arrives
    mark_counters
    start_sender f "$WORK/mid.bin" --relay "$RELAY"
    receive f "$CODE" --relay "$RELAY"
    finish f "$WORK/mid.bin" relayed
    counted f $((8 << 20)) relayed
    kill -0 "$flooder" 2>/dev/null || fail "f: the flood ended before the transfer did: $(cat "$WORK/flood.err")"
    kill "$flooder" 2>/dev/null || true
    wait "$flooder" 2>/dev/null || true
    kill -0 "$RELAY_PID" 2>/dev/null || fail "f: the relay died under the flood: $(tail -3 "$WORK/relay.err")"
    ok "f: the relay flooded from another host (bogus datagrams and hellos): 8 MiB arrived whole through it ($COUNTED)"
fi

if has_case g; then
    # A LAN: two namespaces on one veth, multicast routed on it, no relay named anywhere.
    ip netns add "${P}la"; ip netns add "${P}lb"
    ip link add lan0 netns "${P}la" type veth peer name lan0 netns "${P}lb"
    ip -n "${P}la" addr add 10.77.0.1/24 dev lan0; ip -n "${P}lb" addr add 10.77.0.2/24 dev lan0
    for n in la lb; do
        ip -n "$P$n" link set lo up; ip -n "$P$n" link set lan0 up
        ip -n "$P$n" route add 224.0.0.0/4 dev lan0
    done
    ip netns exec "${P}la" ping -c 1 -i 0.2 -w 10 10.77.0.2 >/dev/null || fail "g: no route across the LAN"
    HA=${P}la HB=${P}lb
    unset QXFER_RELAY
    start_sender g "$WORK/small.bin"
    receive g "$CODE"
    finish g "$WORK/small.bin" direct
    ok "g: a LAN with no relay: the code alone found the sender over multicast DNS, 4 MiB arrived directly"
fi

echo "reach: all passed ($CASES)"
