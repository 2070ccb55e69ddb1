#!/usr/bin/env bash
# Stop the emulator started by linkemu-up.sh, stop processes left in its namespaces, and delete
# the TUN devices and namespaces. Idempotent. Prints the emulator's final counters (JSON) on stdout.
#
#   bench/netns/linkemu-down.sh [--prefix qx-]
set -u
. "$(dirname "$0")/lib.sh"

prefix=${LINKEMU_PREFIX:-qx-}
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
        -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) le_die "unknown argument '$1'" ;;
    esac
done
le_state_dir "$prefix" >/dev/null
le_down "$prefix"
