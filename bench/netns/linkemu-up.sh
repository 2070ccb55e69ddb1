#!/usr/bin/env bash
# Create two network namespaces ${PREFIX}a and ${PREFIX}b, each with a TUN device tun0
# (10.99.N.1/30 and 10.99.N.2/30), and start qxfer-linkemu between them in the background.
#
#   bench/netns/linkemu-up.sh [--prefix qx-] [--mtu 1500] [--net 10.99.0] [--no-emu] [--] [emulator flags]
#
# Emulator flags are passed on, e.g.:  linkemu-up.sh -- --delay 25ms --rate 500mbit --queue 50ms --loss 1%
# Then:  ip netns exec qx-a ping 10.99.0.2     (A side)   ip netns exec qx-b ...   (B side)
# Counters: /run/qxfer-linkemu/PREFIX/stats.json (plus kill -USR1 $(cat /run/qxfer-linkemu/PREFIX/emu.pid)).
# Tear down with bench/netns/linkemu-down.sh --prefix PREFIX. If this script fails halfway it
# removes what it created.
set -u
. "$(dirname "$0")/lib.sh"

prefix=${LINKEMU_PREFIX:-qx-}
mtu=1500
net=10.99.0
start=1
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
        --mtu) mtu=${2:?--mtu needs a value}; shift 2 ;;
        --net) net=${2:?--net needs a value}; shift 2 ;;
        --no-emu) start=0; shift ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
le_state_dir "$prefix" >/dev/null
bin=$( [ "$start" = 1 ] && le_bin || echo none ) || exit 1

trap 'LE_QUIET=1 le_down "$prefix" >/dev/null; exit 130' INT TERM
if ! le_up "$prefix" "$mtu" "$net" "$bin" "$start" "$@"; then
    LE_QUIET=1 le_down "$prefix" >/dev/null
    exit 1
fi
trap - INT TERM
