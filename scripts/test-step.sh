#!/usr/bin/env bash
# One step of `make test`, bounded in time and readable in a log's tail:
#
#   scripts/test-step.sh LIMIT_SECONDS command [arguments…]
#
# - Prints the step, then its duration and exit status, so a CI log shows where the time went.
# - Leaves out the lines that are noise in a test log: the library's own `info`/`notice` log
#   lines (every loopback handshake of every test: a test that fails says why in its own
#   issue) and the gold linker's "Cannot export local symbol" warnings of sanitized builds.
#   The whole output stays in a file (its path is printed when the step fails).
# - With STEP_TIMES set, appends the step's time, status and command to that file, so that
#   `scripts/step-table.sh` can print every step of a run and its time at the end (and the
#   steps so far when one fails).
# - A step that overruns LIMIT_SECONDS is a failure with its cause, not a silent wait until
#   CI's own limit: the processes it left (with what each waits in), and the tests that
#   started but never finished, are printed before the step's processes are killed.
set -uo pipefail

limit=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/qxfer-step.XXXXXX")
noise='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}[+-][0-9]{4} (info|notice) qxfer\.|/ld\.gold: warning: Cannot export local symbol'

echo "== $* (at most ${limit} s)"
command=("$@")
# swift-testing's event stream is written as events happen, while the log's lines wait in
# stdio's buffer: it says which tests were still running if the step overruns.
events="$log.events"
if [[ "${1##*/}" == swift && "${2:-}" == test ]]; then
    command+=(--event-stream-output-path "$events" --event-stream-version 0)
fi
start=$SECONDS
# Its own session, so everything it starts can be listed and killed together.
setsid --wait "${command[@]}" >"$log" 2>&1 </dev/null &
step=$!
tail -n +1 -F --pid="$step" "$log" 2>/dev/null | grep --line-buffered -avE "$noise" &
printer=$!

overran=0
while kill -0 "$step" 2>/dev/null; do
    if (( SECONDS - start > limit )); then
        overran=1
        break
    fi
    sleep 1
done

if (( overran )); then
    echo "== the step overran its ${limit} s limit"
    if [[ -s "$events" ]]; then
        echo "== tests started and not finished:"
        python3 - "$events" <<'PYTHON'
import json, sys
running = {}
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    try:
        payload = json.loads(line)["payload"]
    except (ValueError, KeyError, TypeError):
        continue
    kind, test = payload.get("kind"), payload.get("testID")
    case = (payload.get("_testCase") or {}).get("displayName", "")
    text = (payload.get("messages") or [{}])[0].get("text", "")
    if kind in ("testStarted", "testCaseStarted"):
        running[(test, case)] = text
    elif kind in ("testEnded", "testCaseEnded", "testSkipped"):
        running.pop((test, case), None)
for text in running.values():
    print("   " + text)
PYTHON
    fi
    echo "== what it left running:"
    ps -s "$step" -o pid,ppid,etimes,stat,wchan:28,args --forest 2>/dev/null | cut -c1-220
    kill -TERM -- "-$step" 2>/dev/null
    sleep 5
    kill -KILL -- "-$step" 2>/dev/null
    wait "$step" 2>/dev/null
    status=124
else
    wait "$step"
    status=$?
fi
wait "$printer" 2>/dev/null
elapsed=$((SECONDS - start))
if [[ -n "${STEP_TIMES:-}" ]]; then
    printf '%s\t%s\t%s\n' "$elapsed" "$status" "$*" >>"$STEP_TIMES"
fi
# The slowest tests of a swift test step (suites left out), where a step's time goes.
if [[ -s "$events" ]]; then
    python3 - "$events" <<'PYTHON'
import json, sys
started, took = {}, []
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    try:
        payload = json.loads(line)["payload"]
        kind, test, at = payload["kind"], payload.get("testID"), payload["instant"]["absolute"]
    except (ValueError, KeyError, TypeError):
        continue
    if kind == "testStarted" and "/" in (test or ""):
        started[test] = at
    elif kind == "testEnded" and test in started:
        took.append((at - started.pop(test), test))
took.sort(reverse=True)
if took:
    print("== slowest of %d tests: " % len(took) + "; ".join(
        "%s %.1f s" % (test.split("/")[0].rsplit(".", 1)[-1] + "." + test.split("/")[1].split("(")[0], seconds)
        for seconds, test in took[:5]))
PYTHON
fi
if (( status == 0 )); then
    echo "== done in ${elapsed} s"
    rm -f "$log" "$events"
else
    echo "== failed (exit ${status}) after ${elapsed} s; the whole output: ${log}"
    [[ -n "${STEP_TIMES:-}" ]] && "$(dirname "$0")/step-table.sh" "$STEP_TIMES"
fi
exit "$status"
