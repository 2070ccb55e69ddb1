# shellcheck shell=bash
# Two homes behind two NATs and a "public" internet between them, in network namespaces, for the
# reach tests and benchmark (Tests/e2e/reach.sh, bench/reach.sh). Sourced; needs root, ip,
# nft, python3 and /dev/net/tun. Only addresses inside these namespaces are used.
#
#   home A ${P}ha 10.1.0.2 ─veth─ 10.1.0.1 router A ${P}ra 198.51.100.10 ─TUN─┐
#                                                                            linkemu (delay)
#                    flood ${P}x 192.0.2.2 ─veth─ 192.0.2.1 ┐                  │
#                                      public ${P}pub: 198.51.100.1 and .2 (lo): the relay's host,
#                                      and the internet's router between the two WAN legs
#                                                                            linkemu (delay)
#   home B ${P}hb 192.168.2.2 ─veth─ 192.168.2.1 router B ${P}rb 198.51.100.20 ─TUN─┘
#
# Each WAN leg is a point-to-point TUN link carried by its own qxfer-linkemu (this kernel has no
# netem), NAT_LEG_DELAY one way (default 12.5ms: a home reaches the relay in 2 x 12.5 = 25 ms
# round trip and the other home in 50 ms; the relay sits on the path between them), NAT_LEG_RATE
# if set (e.g. 500mbit, with a 50 ms queue). The LAN legs and the flooder's leg are plain veth.
#
#   nat_up PREFIX                   creates all of it, both routers in mode "none" (below)
#   nat_mode ROUTER MODE [udp-blocked]
#                                   ROUTER a or b; MODE:
#                                     cone       nftables `masquerade`: the source port is kept
#                                                when it is free, so one local port maps to one
#                                                public port whatever the destination
#                                                (endpoint-independent mapping)
#                                     symmetric  `masquerade fully-random`: each new conntrack
#                                                entry (each destination) gets a random port
#                                     none       no NAT: the home's address is routed from the
#                                                public side ("given public addresses", the
#                                                baseline of a plain `qxfer send`)
#                                   With cone and symmetric the router also filters as a home
#                                   router does: nothing new enters from the WAN (forwarded or to
#                                   the router itself; dropped before conntrack confirms it, so an
#                                   early punch leaves no entry that would later clash with the
#                                   home's own mapping). udp-blocked drops every UDP datagram
#                                   from the home towards the WAN.
#   nat_check_mapping ROUTER MODE   proves what the mapping does (see the function)
#   nat_check_punch EXPECT          UDP hole punching between the homes without qxfer (both send
#                                   to the other's reflexive address at once): EXPECT open or
#                                   closed, for both directions
#   nat_check_delay                 ping round trips: home -> relay 2 legs, router -> router 4 legs
#   nat_down                        stops the emulators and everything still running in the
#                                   namespaces, deletes them; idempotent (call it from a trap)
#   nat_ns NAME                     the namespace's name: pub ra rb ha hb x
#   nat_link_drops                  packets dropped so far by the WAN legs' queues (NAT_LEG_RATE)
#
# After nat_up: NAT_RELAY=198.51.100.1 (also .2 on the same host, a second destination for the
# mapping checks), NAT_HOME_A=10.1.0.2, NAT_HOME_B=192.168.2.2, NAT_WAN_A=198.51.100.10,
# NAT_WAN_B=198.51.100.20, NAT_FLOOD=192.0.2.2.

NAT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$NAT_ROOT/bench/netns/lib.sh"

NAT_RELAY=198.51.100.1
NAT_RELAY2=198.51.100.2
NAT_WAN_A=198.51.100.10
NAT_WAN_B=198.51.100.20
NAT_HOME_A=10.1.0.2
NAT_ROUTER_LAN_A=10.1.0.1
NAT_HOME_B=192.168.2.2
NAT_ROUTER_LAN_B=192.168.2.1
NAT_FLOOD=192.0.2.2
NAT_PREFIX=
NAT_EMU_PIDS=()
NAT_STATE=

nat_ns() { echo "${NAT_PREFIX}$1"; }
nat_log() { [ -n "${NAT_QUIET:-}" ] || echo "nat: $*" >&2; }

nat_up() {
    NAT_PREFIX=$1
    [[ $NAT_PREFIX =~ ^[A-Za-z0-9_-]{1,10}$ ]] || { echo "nat: invalid prefix '$NAT_PREFIX'" >&2; return 1; }
    [ "$(id -u)" = 0 ] || { echo "nat: must run as root" >&2; return 1; }
    [ -c /dev/net/tun ] || { echo "nat: /dev/net/tun missing" >&2; return 1; }
    local emu n
    emu=$(le_bin) || return 1
    NAT_STATE=$(mktemp -d /tmp/qxfer-nat.XXXXXX)
    for n in pub ra rb ha hb x; do
        ip netns add "$(nat_ns $n)"
        ip -n "$(nat_ns $n)" link set lo up
    done
    local pub ra rb ha hb x
    pub=$(nat_ns pub) ra=$(nat_ns ra) rb=$(nat_ns rb) ha=$(nat_ns ha) hb=$(nat_ns hb) x=$(nat_ns x)

    # The public host: the relay's two addresses on lo, routes to each WAN over its TUN leg.
    ip -n "$pub" addr add "$NAT_RELAY/32" dev lo
    ip -n "$pub" addr add "$NAT_RELAY2/32" dev lo
    ip netns exec "$pub" sysctl -qw net.ipv4.ip_forward=1
    # The WAN legs: TUN devices (point to point, no ARP), one emulator each.
    local side wan router
    for side in a b; do
        router=$(nat_ns "r$side")
        wan=$NAT_WAN_A; [ $side = b ] && wan=$NAT_WAN_B
        ip -n "$pub" tuntap add dev "wan$side" mode tun
        ip -n "$pub" link set "wan$side" mtu 1500 txqueuelen 10000 up
        ip -n "$pub" route add "$wan/32" dev "wan$side" src "$NAT_RELAY"
        ip -n "$router" tuntap add dev wan0 mode tun
        ip -n "$router" link set wan0 mtu 1500 txqueuelen 10000 up
        ip -n "$router" addr add "$wan/32" dev wan0
        ip -n "$router" route add default dev wan0 src "$wan"
        ip netns exec "$router" sysctl -qw net.ipv4.ip_forward=1
    done
    # The LANs: veth between each router and its home.
    ip link add lan0 netns "$ra" type veth peer name lan0 netns "$ha"
    ip -n "$ra" addr add "$NAT_ROUTER_LAN_A/24" dev lan0
    ip -n "$ha" addr add "$NAT_HOME_A/24" dev lan0
    ip link add lan0 netns "$rb" type veth peer name lan0 netns "$hb"
    ip -n "$rb" addr add "$NAT_ROUTER_LAN_B/24" dev lan0
    ip -n "$hb" addr add "$NAT_HOME_B/24" dev lan0
    for n in "$ra" "$ha" "$rb" "$hb"; do ip -n "$n" link set lan0 up; done
    ip -n "$ha" route add default via "$NAT_ROUTER_LAN_A"
    ip -n "$hb" route add default via "$NAT_ROUTER_LAN_B"
    # The flooder: another host on the internet, one veth hop from the public host (no delay).
    ip link add out0 netns "$pub" type veth peer name out0 netns "$x"
    ip -n "$pub" addr add 192.0.2.1/24 dev out0
    ip -n "$x" addr add "$NAT_FLOOD/24" dev out0
    ip -n "$pub" link set out0 up
    ip -n "$x" link set out0 up
    ip -n "$x" route add default via 192.0.2.1
    # Buffers for a 50-100 ms path at a few hundred Mbit/s (as bench/netns/lib.sh sets them).
    for n in "$ha" "$hb" "$pub" "$x"; do
        ip netns exec "$n" sysctl -qw net.ipv4.tcp_rmem="4096 131072 67108864" \
            net.ipv4.tcp_wmem="4096 16384 67108864" >/dev/null
    done

    local link=(--delay "${NAT_LEG_DELAY:-12.5ms}")
    [ -z "${NAT_LEG_RATE:-}" ] || link+=(--rate "$NAT_LEG_RATE" --queue 50ms)
    for side in a b; do
        "$emu" --a-ns "$(nat_ns "r$side")" --a-dev wan0 --b-ns "$pub" --b-dev "wan$side" --quiet \
            --stats "$NAT_STATE/emu-$side.json" --stats-interval 200ms "${link[@]}" >/dev/null 2>"$NAT_STATE/emu-$side.err" </dev/null &
        NAT_EMU_PIDS+=($!)
    done
    # Ready when every TUN device has carrier (the emulator holds its fd).
    for _ in $(seq 100); do
        if ip -n "$pub" link show wana | grep -q NO-CARRIER || ip -n "$pub" link show wanb | grep -q NO-CARRIER \
            || ip -n "$ra" link show wan0 | grep -q NO-CARRIER || ip -n "$rb" link show wan0 | grep -q NO-CARRIER; then
            sleep 0.05
            continue
        fi
        break
    done
    for n in "${NAT_EMU_PIDS[@]}"; do
        kill -0 "$n" 2>/dev/null || { echo "nat: qxfer-linkemu did not start: $(cat "$NAT_STATE"/emu-*.err)" >&2; return 1; }
    done
    nat_mode a none
    nat_mode b none
    nat_log "up: $ha $NAT_HOME_A -> $ra $NAT_WAN_A, $hb $NAT_HOME_B -> $rb $NAT_WAN_B, relay host $pub $NAT_RELAY, legs ${link[*]}"
}

nat_mode() {
    local side=$1 mode=$2 udp=${3:-} router pub home lan
    router=$(nat_ns "r$side") pub=$(nat_ns pub)
    home=$NAT_HOME_A lan=10.1.0.0/24
    [ "$side" = b ] && home=$NAT_HOME_B lan=192.168.2.0/24
    ip netns exec "$router" nft delete table ip qxnat 2>/dev/null || true
    ip -n "$pub" route del "$lan" 2>/dev/null || true
    case $mode in
        none)
            ip -n "$pub" route add "$lan" dev "wan$side"
            ;;
        cone|symmetric)
            local masq=masquerade
            [ "$mode" = symmetric ] && masq="masquerade fully-random"
            ip netns exec "$router" nft -f - <<EOF
table ip qxnat {
    chain nat_out {
        type nat hook postrouting priority srcnat; policy accept;
        oifname "wan0" $masq
    }
    chain from_wan {
        type filter hook forward priority filter; policy accept;
        iifname "wan0" ct state new drop
        ${udp:+oifname "wan0" meta l4proto udp drop}
    }
    chain to_router {
        type filter hook input priority filter; policy accept;
        iifname "wan0" meta l4proto { tcp, udp } ct state new drop
    }
}
EOF
            ;;
        *) echo "nat: unknown mode '$mode'" >&2; return 1 ;;
    esac
    [ -z "$udp" ] || [ "$mode" != none ] || { echo "nat: udp-blocked needs a NAT mode" >&2; return 1; }
    # Mappings made under the old mode stay in the router's conntrack table until they time out
    # (nft cannot flush it; conntrack(8) is not installed). They do not matter: each case's
    # sockets are new, on new ephemeral ports, so their flows get new entries under the new rules.
}

# nat_udp_mapping NS SPORT DEST... : from namespace NS, one UDP socket bound to SPORT sends
# datagrams to each DEST (addr:port of the public host) and prints, per DEST, the source
# address:port that a listener there saw ("none" if nothing came). Helper for nat_check_mapping.
nat_udp_mapping() {
    local ns=$1 sport=$2; shift 2
    local pub
    pub=$(nat_ns pub)
    # Listeners on the public host: each prints the source of the first datagram it gets.
    local dest out=() pids=() i=0
    for dest in "$@"; do
        out+=("$NAT_STATE/listen-$i")
        ip netns exec "$pub" python3 -c '
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((host, int(port)))
s.settimeout(5)
try:
    data, src = s.recvfrom(2048)
    print(f"{src[0]}:{src[1]}")
except socket.timeout:
    print("none")
' "$dest" >"${out[$i]}" &
        pids+=($!)
        i=$((i + 1))
    done
    sleep 0.3
    ip netns exec "$ns" python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
for dest in sys.argv[2:]:
    host, port = dest.rsplit(":", 1)
    for _ in range(3):
        s.sendto(b"probe", (host, int(port)))
        time.sleep(0.02)
' "$sport" "$@"
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || true; cat "${out[$i]}"; done
}

# nat_check_mapping ROUTER MODE: what the NAT does with one home socket sending to two public
# destinations (two addresses and ports of the public host), checked from the public side:
#   cone       both destinations see the router's WAN address and the home socket's own port
#              (kept: endpoint-independent mapping, what hole punching needs)
#   symmetric  the two destinations see two different ports (fully random: a new mapping per
#              destination, so the port the relay reports is useless to the peer)
#   none       both see the home's own address and port
# Then, for cone and symmetric, filtering: a datagram from another public port to the mapped
# port does not reach the home (Linux conntrack filters by address and port, "port-restricted"),
# while one from the destination the home sent to does. Prints one line; returns 1 on a mismatch.
nat_check_mapping() {
    local side=$1 mode=$2 home wan sport mapped
    home=$(nat_ns "h$side")
    wan=$NAT_WAN_A; [ "$side" = b ] && wan=$NAT_WAN_B
    sport=$((41000 + RANDOM % 2000))
    mapfile -t mapped < <(nat_udp_mapping "$home" "$sport" "$NAT_RELAY:5001" "$NAT_RELAY2:5002")
    local want
    case $mode in
        cone)
            [ "${mapped[0]}" = "$wan:$sport" ] && [ "${mapped[1]}" = "$wan:$sport" ] || {
                echo "nat: router $side (cone): port $sport mapped to ${mapped[*]}, expected $wan:$sport twice" >&2; return 1; } ;;
        symmetric)
            [ "${mapped[0]%:*}" = "$wan" ] && [ "${mapped[1]%:*}" = "$wan" ] && [ "${mapped[0]}" != "${mapped[1]}" ] || {
                echo "nat: router $side (symmetric): port $sport mapped to ${mapped[*]}, expected two ports of $wan" >&2; return 1; } ;;
        none)
            want=$NAT_HOME_A; [ "$side" = b ] && want=$NAT_HOME_B
            [ "${mapped[0]}" = "$want:$sport" ] && [ "${mapped[1]}" = "$want:$sport" ] || {
                echo "nat: router $side (no NAT): $sport seen as ${mapped[*]}" >&2; return 1; } ;;
    esac
    local filtering=""
    if [ "$mode" != none ]; then
        # The home socket sends to the relay's 5003 and listens; the public host answers from
        # 5003 (the destination: must arrive) and from 5004 (another port: must not).
        local port=$((43000 + RANDOM % 2000)) got answerer
        # The public side learns the mapped source from the home's "open" datagram, then answers
        # from 5004 (another port) and 5003 (the one the home sent to).
        ip netns exec "$(nat_ns pub)" python3 -c '
import socket, sys
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind((sys.argv[1], 5003))
b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.bind((sys.argv[1], 5004))
a.settimeout(5)
data, src = a.recvfrom(100)
for _ in range(3):
    b.sendto(b"other", src)
    a.sendto(b"reply", src)
' "$NAT_RELAY" &
        answerer=$!
        sleep 0.3
        ip netns exec "$home" python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.sendto(b"open", (sys.argv[2], 5003))
s.settimeout(2)
seen = set()
end = time.time() + 2
while time.time() < end:
    try:
        data, src = s.recvfrom(100)
        seen.add(src[1])
    except socket.timeout:
        break
print(" ".join(str(p) for p in sorted(seen)) or "none")
' "$port" "$NAT_RELAY" >"$NAT_STATE/filter-$side"
        wait "$answerer" || true
        got=$(cat "$NAT_STATE/filter-$side")
        [ "$got" = 5003 ] || { echo "nat: router $side ($mode) filtering: the home received from ports '$got', expected only 5003" >&2; return 1; }
        filtering="; an answer from the destination gets in, one from another port does not"
    fi
    echo "nat: router $side ($mode): local port $sport seen as ${mapped[0]} and ${mapped[1]}$filtering"
}

# nat_check_punch EXPECT: each home learns its reflexive address from a reflector on the
# public host (as the relay's `bound` tells it), then both send to each other's at once for 3 s
# (Tests/e2e/reach_tools.py punch). Two cone NATs open (each side's first datagram makes its own
# NAT's entry, the peer's then matches it); with a symmetric NAT nothing gets through in either
# direction: its mapping towards the peer has another port than the one the reflector saw, and
# the cone side filters by address and port, so the datagrams from that unknown port are
# dropped. Prints one line; returns 1 unless both sides saw EXPECT.
nat_check_punch() {
    local want=$1 dir tools reflector a b
    tools=$NAT_ROOT/Tests/e2e/reach_tools.py
    dir=$(mktemp -d "$NAT_STATE/punch.XXXXXX")
    ip netns exec "$(nat_ns pub)" python3 "$tools" reflect "$NAT_RELAY" 5010 20 &
    reflector=$!
    sleep 0.3
    ip netns exec "$(nat_ns ha)" python3 "$tools" punch "$dir" a b "$NAT_RELAY:5010" >"$dir/a.out" &
    a=$!
    ip netns exec "$(nat_ns hb)" python3 "$tools" punch "$dir" b a "$NAT_RELAY:5010" >"$dir/b.out" || true
    wait "$a" || true
    kill "$reflector" 2>/dev/null || true
    wait "$reflector" 2>/dev/null || true
    local got_a got_b
    got_a=$(cat "$dir/a.out") got_b=$(cat "$dir/b.out")
    [ "$got_a" = "$want" ] && [ "$got_b" = "$want" ] \
        || { echo "nat: hole punching: home A $got_a, home B $got_b (reflexive $(cat "$dir/a" 2>/dev/null), $(cat "$dir/b" 2>/dev/null)), expected $want" >&2; return 1; }
    echo "nat: hole punching between $(cat "$dir/a") and $(cat "$dir/b"): $want both ways"
}

# nat_check_delay: the round trips (ping, minimum of 5) home A -> relay, home B -> relay and
# router A -> router B. Prints them; returns 1 unless each is at least the legs' delay (not an
# upper bound: a loaded machine may add to it).
nat_check_delay() {
    local leg_ms rtt name from to legs
    leg_ms=$(echo "${NAT_LEG_DELAY:-12.5ms}" | sed 's/ms$//')
    local line=""
    for spec in "home-a:ha:$NAT_RELAY:2" "home-b:hb:$NAT_RELAY:2" "router-a:ra:$NAT_WAN_B:4"; do
        IFS=: read -r name from to legs <<<"$spec"
        rtt=$(ip netns exec "$(nat_ns "$from")" ping -c 5 -i 0.2 -w 10 "$to" | sed -n 's|.*= \([0-9.]*\)/.*|\1|p')
        [ -n "$rtt" ] || { echo "nat: no ping answer $name -> $to" >&2; return 1; }
        awk -v r="$rtt" -v l="$leg_ms" -v n="$legs" 'BEGIN { exit !(r >= l * n * 0.98) }' \
            || { echo "nat: $name -> $to: round trip $rtt ms, below $legs legs of $leg_ms ms" >&2; return 1; }
        line+=" $name->$to ${rtt} ms ($legs legs);"
    done
    echo "nat: round trips (min of 5):${line%;}"
}

# nat_link_drops: packets the two WAN legs' queues have dropped so far (drop_queue, both
# directions of both emulators; their counters are written every 200 ms).
nat_link_drops() {
    python3 - "$NAT_STATE"/emu-a.json "$NAT_STATE"/emu-b.json <<'PY'
import json, sys
total = 0
for path in sys.argv[1:]:
    try:
        stats = json.load(open(path))
    except (OSError, ValueError):
        continue
    total += sum(stats.get(d, {}).get("drop_queue", 0) for d in ("ab", "ba"))
print(total)
PY
}

nat_down() {
    local pid n pids
    for pid in "${NAT_EMU_PIDS[@]}"; do
        if le_is_emu "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do le_is_emu "$pid" || break; sleep 0.05; done
            le_is_emu "$pid" && kill -KILL "$pid" 2>/dev/null
        fi
    done
    NAT_EMU_PIDS=()
    [ -n "$NAT_PREFIX" ] || return 0
    for n in ha hb x pub ra rb; do
        n=$(nat_ns $n)
        ip netns list | grep -qE "^$n( |\$)" || continue
        pids=$(ip netns pids "$n" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
            sleep 0.2
            pids=$(ip netns pids "$n" 2>/dev/null || true)
            # shellcheck disable=SC2086
            [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
        fi
        ip netns del "$n" 2>/dev/null || true
    done
    [ -z "$NAT_STATE" ] || rm -rf "$NAT_STATE"
    NAT_STATE=
    return 0
}
