#!/usr/bin/env bash
# Builds in the background on the CPU time the tests leave unused, and waits for that build
# later (`make check`: the fuzz targets and the AddressSanitizer and ThreadSanitizer trees build
# while the unsanitized suites and the end-to-end scripts run):
#
#   scripts/idle-build.sh start NAME OWNER_PID command [arguments…]   returns at once
#   scripts/idle-build.sh wait NAME                                   exits with the build's status
#
# The build runs under SCHED_IDLE (and the idle I/O class): the kernel gives it a core only
# when no test wants one, and a test's thread that wakes takes the core back at once, so the
# tests' own deadlines see the machine as if the build were not there. Most test steps leave
# a core or more unused (one test at a time, handshakes, sleeps, round trips over emulated
# links). Its output goes to .build-NAME.log; the build is killed if OWNER_PID (the make that
# started it) ends first, so a failed run leaves nothing behind.
set -uo pipefail
cd "$(dirname "$0")/.."

action=$1 name=$2
log=$PWD/.build-$name.log status=$PWD/.build-$name.status

case "$action" in
start)
    owner=$3
    shift 3
    rm -f "$status"
    (
        started=$SECONDS
        setsid chrt --idle 0 ionice -c 3 "$@" >"$log" 2>&1 </dev/null &
        build=$!
        while kill -0 "$build" 2>/dev/null; do
            if ! kill -0 "$owner" 2>/dev/null; then
                kill -TERM -- "-$build" 2>/dev/null
                sleep 2
                kill -KILL -- "-$build" 2>/dev/null
                exit 0
            fi
            sleep 1
        done
        wait "$build"
        code=$?
        echo "$code $((SECONDS - started))" >"$status"
    ) </dev/null >/dev/null 2>&1 &
    echo "== building $name in the background at idle priority: $*"
    ;;
wait)
    while [[ ! -s "$status" ]]; do
        pgrep -f "idle-build.sh start $name " >/dev/null || [[ -s "$status" ]] || {
            echo "== the background build $name is not running and left no status"
            exit 1
        }
        sleep 1
    done
    read -r code seconds <"$status"
    if [[ "$code" == 0 ]]; then
        echo "== the background build $name took ${seconds} s"
    else
        echo "== the background build $name failed (exit $code) after ${seconds} s; its last lines (all of it: $log):"
        grep -v 'Cannot export local symbol' "$log" | tail -40
    fi
    exit "$code"
    ;;
*)
    echo "usage: $0 start NAME OWNER_PID command… | wait NAME" >&2
    exit 2
    ;;
esac
