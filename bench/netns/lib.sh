# shellcheck shell=bash
# Shared functions for the qxfer link emulator topology (sourced by linkemu-up.sh,
# linkemu-down.sh, selftest.sh and bench/validate-linkemu.sh).
#
#   namespace ${PREFIX}a: tun0 10.99.N.1/30 ─┐                 ┌─ namespace ${PREFIX}b: tun0 10.99.N.2/30
#                                            └─ qxfer-linkemu ─┘  (in the root namespace, holds both TUN fds)
#
# Only addresses inside the two namespaces are used; nothing is routed outside them.

LE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

le_die() { echo "linkemu: error: $*" >&2; exit 1; }
le_log() { [ -n "${LE_QUIET:-}" ] || echo "linkemu: $*" >&2; }

# le_state_dir PREFIX -> directory holding the emulator's pid, log and stats for this prefix.
le_state_dir() {
    local p=$1
    [[ $p =~ ^[A-Za-z0-9_.-]{1,12}$ ]] || le_die "invalid prefix '$p' (1-12 of A-Z a-z 0-9 _ . -)"
    echo "/run/qxfer-linkemu/$p"
}

# le_bin -> path of the qxfer-linkemu binary: $LINKEMU_BIN, else release, else debug build.
le_bin() {
    if [ -n "${LINKEMU_BIN:-}" ]; then echo "$LINKEMU_BIN"; return; fi
    local b
    for b in "$LE_ROOT/.build-linkemu/release/qxfer-linkemu" "$LE_ROOT/.build-linkemu/debug/qxfer-linkemu"; do
        if [ -x "$b" ]; then echo "$b"; return; fi
    done
    le_die "qxfer-linkemu not built (swift build -c release --scratch-path .build-linkemu --product qxfer-linkemu) and LINKEMU_BIN unset"
}

# True if PID is alive and is a qxfer-linkemu process.
le_is_emu() {
    local pid=$1
    [ -n "$pid" ] && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q qxfer-linkemu
}

# le_up PREFIX MTU NET BIN START_EMU [emulator flags...]
le_up() {
    local p=$1 mtu=$2 net=$3 bin=$4 start=$5
    shift 5
    local a="${p}a" b="${p}b" st
    st=$(le_state_dir "$p")
    [[ $net =~ ^10\.99\.[0-9]{1,3}$ ]] || le_die "invalid --net '$net' (10.99.N)"
    [[ $mtu =~ ^[0-9]+$ ]] && [ "$mtu" -ge 576 ] && [ "$mtu" -le 65535 ] || le_die "invalid --mtu '$mtu' (576-65535)"
    [ "$(id -u)" = 0 ] || le_die "must run as root"
    [ -c /dev/net/tun ] || le_die "/dev/net/tun missing"
    command -v ip >/dev/null || le_die "ip (iproute2) not installed"
    if ip netns list | grep -qE "^(${a}|${b})( |\$)"; then
        le_die "namespace ${a} or ${b} already exists (run linkemu-down.sh --prefix ${p})"
    fi
    mkdir -p "$st"
    local ns i
    i=1
    for ns in "$a" "$b"; do
        ip netns add "$ns" || le_die "cannot create namespace $ns"
        ip -n "$ns" link set lo up
        # A persistent TUN device (IFF_TUN|IFF_NO_PI), created inside the namespace.
        ip -n "$ns" tuntap add dev tun0 mode tun || le_die "cannot create tun0 in $ns"
        ip -n "$ns" link set tun0 mtu "$mtu" txqueuelen 10000
        ip -n "$ns" addr add "${net}.${i}/30" dev tun0
        ip -n "$ns" link set tun0 up
        # Namespaced TCP buffer limits, large enough for 500 Mbit/s x 100 ms and more.
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 67108864" \
            net.ipv4.tcp_wmem="4096 16384 67108864" >/dev/null
        i=2
    done
    echo "$mtu" >"$st/mtu"
    [ "$start" = 1 ] || { le_log "namespaces $a, $b ready (no emulator started)"; return 0; }

    rm -f "$st/stats.json" "$st/emu.out" "$st/emu.err"
    "$bin" --a-ns "$a" --a-dev tun0 --b-ns "$b" --b-dev tun0 --stats "$st/stats.json" "$@" \
        >"$st/emu.out" 2>"$st/emu.err" </dev/null &
    local pid=$!
    echo "$pid" >"$st/emu.pid"
    # Ready when both TUN devices have carrier (an fd is attached).
    local n=0
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            cat "$st/emu.err" >&2
            return 1
        fi
        if ! ip -n "$a" link show tun0 | grep -q NO-CARRIER && ! ip -n "$b" link show tun0 | grep -q NO-CARRIER; then
            break
        fi
        n=$((n + 1))
        [ $n -lt 100 ] || { echo "linkemu: error: emulator did not attach within 5 s" >&2; return 1; }
        sleep 0.05
    done
    le_log "$a/tun0 ${net}.1 <-> $b/tun0 ${net}.2, mtu $mtu, emulator pid $pid"
}

# le_down PREFIX: stop the emulator, kill what still runs in the namespaces, delete devices
# and namespaces. Idempotent; prints the emulator's final counters (JSON) on stdout.
le_down() {
    local p=$1 st pid ns
    st=$(le_state_dir "$p")
    if [ -f "$st/emu.pid" ]; then
        pid=$(cat "$st/emu.pid")
        if le_is_emu "$pid"; then
            kill -TERM "$pid" 2>/dev/null
            local n=0
            while le_is_emu "$pid" && [ $n -lt 50 ]; do sleep 0.05; n=$((n + 1)); done
            le_is_emu "$pid" && kill -KILL "$pid" 2>/dev/null
        fi
        rm -f "$st/emu.pid"
        [ -s "$st/emu.out" ] && tail -n 1 "$st/emu.out"
    fi
    rm -rf "$st"
    for ns in "${p}a" "${p}b"; do
        ip netns list | grep -qE "^${ns}( |\$)" || continue
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [ -n "$pids" ]; then
            le_log "stopping processes left in $ns: $pids"
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null
            sleep 0.2
            pids=$(ip netns pids "$ns" 2>/dev/null)
            # shellcheck disable=SC2086
            [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
        fi
        ip -n "$ns" link del tun0 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    return 0
}
