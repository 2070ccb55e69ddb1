#!/usr/bin/env bash
# qxfer as a person meets it in a real terminal: tmux panes of 120x40 running the real binary,
# keys typed with send-keys, what is on screen read back with capture-pane.
#
#   sudo Tests/e2e/terminal.sh            (root: one network namespace; QXFER=path picks the binary)
#
# Proves: recv's question stays on screen until answered (no progress line over it, other
# lines go above it); keys typed before it are not its answer; a question whose sender went
# away is withdrawn and the next offer gets its own answer; two senders at once are asked one
# after the other; the waiting sender says it waits for the receiver; "1 file"; summaries and
# progress count only the time data moves (not the wait for the answer); recv exits 130 on
# Ctrl-C (an interrupted send says the same command resumes it, an idle recv does not); stream
# rows fit in 100 columns with no empty rows after the end, stream send reports progress and
# first contact; --json is one parseable event per line (time, event; errors and
# warnings included, no escaped slashes); errors a user meets are immediate and clear; names
# holding escape sequences or line breaks are shown escaped, not played on the terminal; a sparse
# file's sender says what travels and the holes apart from the start; recv --stdout pipes a
# file or a tar stream and fails a digest mismatch; in a 40-column terminal the progress line
# fits and leaves nothing behind; recv --json > file still shows the offer (who, what, how big)
# above its question; the progress line names the file in flight and counts "N/M files"; -q
# prints nothing for a complete transfer. Everything it creates is removed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
[ -x "$QXFER" ] || { echo "terminal: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "terminal: must run as root (network namespace)" >&2; exit 1; }
command -v tmux >/dev/null || { echo "terminal: tmux missing (make deps)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-terminal.XXXXXX)
SOCKET=$WORK/tmux.socket  # a tmux server of our own
NS=qxt$$
PIDS=()
cleanup() {
    tmux -S "$SOCKET" kill-server 2>/dev/null || true
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
    umount "$WORK/readonly" 2>/dev/null || true
    rm -rf "$WORK" 2>/dev/null || { sleep 1; rm -rf "$WORK"; }  # the panes' processes may still be ending
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "terminal: FAIL: $*" >&2; exit 1; }
ok() { echo "terminal: ok: $*"; }
now() { date +%s.%N; }
# le A B: A <= B for decimal numbers.
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

T() { tmux -S "$SOCKET" "$@"; }
# pane NAME: a 120x40 terminal running a plain shell.
pane() { T new-session -d -s "$1" -x 120 -y 40 "env -i PATH=$PATH HOME=$WORK TERM=xterm-256color bash --norc --noprofile"; }
# run NAME COMMAND: types COMMAND in the pane, then the exit status as "EXIT=n".
run() { T send-keys -t "$1" "$2; echo EXIT=\$?" Enter; }
# screen NAME: what the pane shows (wrapped lines joined).
screen() { T capture-pane -p -J -t "$1" -S -200; }
# count NAME REGEX: how many lines on screen match.
count() { screen "$1" | grep -cE "$2" || true; }
# last_words NAME: the line before the last "EXIT=130", without the ^C the terminal echoed.
last_words() { screen "$1" | grep -B1 '^EXIT=130$' | tail -n 2 | head -n 1 | sed 's/^^C//'; }
# wait_for NAME REGEX [N] [SECONDS]: until at least N lines match.
wait_for() {
    local name=$1 regex=$2 want=${3:-1} limit=${4:-60}
    local deadline=$(($(date +%s) + limit))
    while [ "$(count "$name" "$regex")" -lt "$want" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || { screen "$name" >&2; fail "$name: '$regex' ($want) not on screen after $limit s"; }
        sleep 0.1
    done
}
last_line() { screen "$1" | grep -v '^$' | tail -n 1; }

PORT=$((20000 + RANDOM % 20000))
mkdir -p "$WORK/src" "$WORK/dst"
head -c 40000000 /dev/urandom >"$WORK/src/one.bin"
head -c 30000000 /dev/urandom >"$WORK/src/two.bin"
head -c 20000000 /dev/urandom >"$WORK/src/three.bin"
head -c 10000000 /dev/urandom >"$WORK/src/four.bin"
SEND="$QXFER send --config-dir $WORK/cfg-send"

# --- 1. The question: visible until answered, typed-ahead keys not taken -----------------
pane recv; pane send
run recv "$QXFER recv --config-dir $WORK/cfg-recv --no-advertise --host 127.0.0.1 --port $PORT --dir $WORK/dst"
wait_for recv '^fingerprint '
T send-keys -t recv "yes" Enter  # typed ahead, before any offer
sleep 0.3
run send "$SEND $WORK/src/one.bin 127.0.0.1:$PORT"
wait_for recv 'Accept\? \[y/N\]'
asked=$(now)
wait_for send 'waiting for the receiver to accept'
sleep 2.5  # ten redraws of a progress bar, had one been drawn
last_line recv | grep -q 'Accept? \[y/N\] *$' || { screen recv >&2; fail "the question is not on screen 2.5 s after it was asked"; }
screen recv | grep -qE 'offer from .*: 1 file, 40\.0 MB: one\.bin' || { screen recv >&2; fail "the offer line"; }
[ ! -e "$WORK/dst/one.bin" ] && [ "$(count send '^sent ')" = 0 ] || fail "the typed-ahead 'yes' was taken as the answer"
ok "the question stays on screen until answered; keys typed before it are discarded; the sender says it waits"
answered=$(now)
T send-keys -t recv "y" Enter
wait_for send '^EXIT='
finished=$(now)
wait_for recv '^received '
[ "$(count send '^EXIT=0$')" = 1 ] || { screen send >&2; fail "send failed"; }
cmp -s "$WORK/src/one.bin" "$WORK/dst/one.bin" || fail "one.bin differs"
sent_s=$(screen send | sed -nE 's/^sent .* in ([0-9.]+) s .*/\1/p')
received_s=$(screen recv | sed -nE 's/^received .* in ([0-9.]+) s .*/\1/p')
waited=$(awk -v a="$asked" -v b="$answered" 'BEGIN { print b - a }')
moving=$(awk -v a="$answered" -v b="$finished" 'BEGIN { print b - a + 0.3 }')
le "$sent_s" "$moving" && le "$received_s" "$moving" \
    || fail "the summaries count the wait: sent in $sent_s s, received in $received_s s, but only $moving s passed after the answer (the question was open $waited s)"
screen send | grep -q '1 file verified' && screen recv | grep -q '1 file verified' || fail "'1 file verified'"
ok "summaries count the time data moved (sent in $sent_s s, received in $received_s s; the question was open $waited s)"

# --- 2. A question whose sender went away is withdrawn; the next offer gets its own answer --
for stack in quic tls; do
    asked_before=$(count recv 'Accept\? \[y/N\]')
    withdrawn_before=$(count recv 'the question is withdrawn')
    interrupted_before=$(count send '^EXIT=130$')
    run send "$SEND $WORK/src/two.bin 127.0.0.1:$PORT --stack $stack"
    wait_for recv 'Accept\? \[y/N\]' $((asked_before + 1))
    T send-keys -t send C-c
    wait_for send '^EXIT=130$' $((interrupted_before + 1))
    wait_for recv 'the question is withdrawn' $((withdrawn_before + 1)) 20
done
[ ! -e "$WORK/dst/two.bin" ] || fail "a withdrawn offer was received"
# A send of files that Ctrl-C stops says the same command resumes it.
[ "$(last_words send)" = "qxfer: interrupted; the same command resumes what was left" ] \
    || { screen send >&2; fail "the interrupted send does not say the same command resumes it"; }
# Two senders at once: one question at a time, each answer to its own offer.
pane send2
asked_before=$(count recv 'Accept\? \[y/N\]')
run send "$SEND $WORK/src/two.bin 127.0.0.1:$PORT --stack tls"
run send2 "$QXFER send --config-dir $WORK/cfg-send2 $WORK/src/four.bin 127.0.0.1:$PORT"
wait_for send 'waiting for the receiver to accept' 3
wait_for send2 'waiting for the receiver to accept'
wait_for recv 'Accept\? \[y/N\]' $((asked_before + 1))
sleep 1
[ "$(count recv 'Accept\? \[y/N\]')" = $((asked_before + 1)) ] || { screen recv >&2; fail "two questions at once"; }
T send-keys -t recv "n" Enter
wait_for recv 'Accept\? \[y/N\]' $((asked_before + 2))
sleep 1  # the first offer's "declined" line comes meanwhile: above the question, not over it
last_line recv | grep -q 'Accept? \[y/N\] *$' || { screen recv >&2; fail "the second question is not on the last line"; }
T send-keys -t recv "y" Enter
wait_for send2 '^EXIT='
wait_for send "^EXIT=" 4
declined=$( (screen send; screen send2) | grep -c '^EXIT=77$' || true)
accepted=$( (screen send; screen send2) | grep -c '^EXIT=0$' || true)
arrived=$(cd "$WORK/dst" && ls two.bin four.bin 2>/dev/null || true)
[ "$declined" = 1 ] && [ "$accepted" = 2 ] && [ "$(echo "$arrived" | grep -c .)" = 1 ] && cmp -s "$WORK/src/$arrived" "$WORK/dst/$arrived" \
    || { screen send >&2; screen send2 >&2; fail "two offers at once: $declined declined, $accepted succeeded (with the first run)"; }
asked_before=$(count recv 'Accept\? \[y/N\]')
exits_before=$(count send '^EXIT=')
# The next offer, answered after a wait: its JSON events show the wait excluded too.
run send "$SEND $WORK/src/three.bin 127.0.0.1:$PORT --json >$WORK/three.json"
wait_for recv 'Accept\? \[y/N\]' $((asked_before + 1))
sleep 2
T send-keys -t recv "y" Enter
wait_for send '^EXIT=' $((exits_before + 1))
[ "$(screen send | grep '^EXIT=' | tail -n 1)" = "EXIT=0" ] || { screen send >&2; fail "the offer after the withdrawn ones failed"; }
cmp -s "$WORK/src/three.bin" "$WORK/dst/three.bin" || fail "three.bin differs"
ok "questions withdrawn when their sender left (QUIC and TLS); two offers at once asked one after the other; the next offer took its own answer"

python3 - "$WORK/three.json" <<'EOF' || fail "the sender's JSON timing"
import json, sys
from datetime import datetime
def at(event): return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()
events = [json.loads(line) for line in open(sys.argv[1])]
first = {}
for event in events: first.setdefault(event["event"], event)
offered, accepted, summary = first["offered"], first["accepted"], first["summary"]
assert at(accepted) - at(offered) >= 1.5, "the answer came at once?"
assert summary["seconds"] <= at(summary) - at(accepted) + 0.3, f"summary {summary['seconds']} s includes the wait"
for progress in (e for e in events if e["event"] == "progress"):
    assert progress["seconds"] <= at(progress) - at(accepted) + 0.3, f"progress {progress} includes the wait"
print(f"terminal: ok: JSON: accepted {at(accepted) - at(offered):.1f} s after the offer; summary {summary['seconds']:.2f} s, within the time after acceptance")
EOF

# --- 3. Ctrl-C on recv: exit 130 -----------------------------------------------------------
T send-keys -t recv C-c
wait_for recv '^EXIT='
[ "$(screen recv | grep '^EXIT=' | tail -n 1)" = "EXIT=130" ] || { screen recv >&2; fail "recv after Ctrl-C"; }
# Nothing was under way: nothing to resume, and it does not claim otherwise.
[ "$(last_words recv)" = "qxfer: interrupted" ] \
    || { screen recv >&2; fail "an idle recv stopped with Ctrl-C should say only 'interrupted'"; }
ok "recv exits 130 on Ctrl-C, saying only 'interrupted' when idle"

# --- 4. Streaming in the terminal ------------------------------------------------------------
SPORT=$((PORT + 1))
pane srecv; pane ssend
run srecv "$QXFER stream recv --config-dir $WORK/cfg-recv --port $SPORT"
wait_for srecv 'waiting for a stream'
run ssend "$QXFER stream send 127.0.0.1:$SPORT --config-dir $WORK/cfg-stream --duration 3"
wait_for ssend '^EXIT=' 1 60
wait_for srecv '^EXIT=' 1 30
[ "$(count ssend '^EXIT=0$')" = 1 ] && [ "$(count srecv '^EXIT=0$')" = 1 ] || { screen ssend >&2; screen srecv >&2; fail "the stream failed"; }
rows=$(screen srecv | awk '/^ *time +frames +late +lost/ { on = 1; next } on && /^ *[0-9]+\.[0-9] +[0-9]+ +[0-9]+ +[0-9]+ / { print }')
long=$( (echo "$rows"; screen srecv | grep -E '^ *time +frames'; screen ssend | grep '^qxfer: sending: ') | awk 'length > 100' | head -n 1)
[ -z "$long" ] || fail "a per-second line wider than 100 columns: $long"
[ "$(echo "$rows" | grep -c .)" -ge 2 ] || { screen srecv >&2; fail "no per-second rows under the header"; }
empty=$(echo "$rows" | awk '$2 == 0 && $3 == 0 && $4 == 0')
[ -z "$empty" ] || fail "rows without frames: $empty"
screen ssend | grep -q 'first contact with 127.0.0.1' || fail "stream send: no first-contact notice"
[ "$(count ssend '^qxfer: sending: ')" -ge 2 ] || { screen ssend >&2; fail "stream send printed no progress"; }
ok "stream: $(echo "$rows" | grep -c .) rows within 100 columns, none empty; stream send shows progress and first contact"

# --- 5. --json: one event per line, errors and warnings included ----------------------------
# check_json FILE EVENT...: every line an object with event and an ISO-8601 UTC time, no '\/';
# the events named are there.
check_json() {
    python3 - "$@" <<'EOF'
import json, re, sys
path, wanted = sys.argv[1], sys.argv[2:]
seen = []
for number, line in enumerate(open(path), 1):
    assert "\\/" not in line, f"{path}:{number}: escaped slash: {line}"
    event = json.loads(line)
    assert isinstance(event, dict) and isinstance(event.get("event"), str), f"{path}:{number}: no event: {line}"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event.get("time", "")), f"{path}:{number}: time: {line}"
    seen.append(event["event"])
missing = [name for name in wanted if name not in seen]
assert not missing, f"{path}: missing events {missing} (saw {seen})"
EOF
}
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --host 127.0.0.1 --port "$PORT" --dir "$WORK/dst-json" --yes --once --json \
    >"$WORK/recv.json" 2>"$WORK/recv.json.err" </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '"listening"' "$WORK/recv.json" 2>/dev/null && break; sleep 0.1; done
$SEND "$WORK/src" "127.0.0.1:$PORT" --json >"$WORK/send.json" 2>"$WORK/send.json.err" </dev/null || fail "send --json: $(cat "$WORK/send.json.err")"
wait "$RECV_PID" || fail "recv --json: $(cat "$WORK/recv.json.err")"
check_json "$WORK/send.json" offered accepted started verified summary || fail "send --json output"
check_json "$WORK/recv.json" listening offer accepted verified summary || fail "recv --json output"
grep -q '"path":"src/one.bin"' "$WORK/send.json" || fail "paths with slashes"

# A warning, then Ctrl-C: both events.
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --port 0 --dir "$WORK/dst" --paired-only --json >"$WORK/warn.json" 2>/dev/null </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '"listening"' "$WORK/warn.json" 2>/dev/null && break; sleep 0.1; done
kill -INT "$RECV_PID"; set +e; wait "$RECV_PID"; status=$?; set -e
check_json "$WORK/warn.json" warning listening error && [ $status = 130 ] && grep -q '"code":"interrupted"' "$WORK/warn.json" \
    || fail "recv --json warning and interruption (exit $status): $(cat "$WORK/warn.json")"

started=$(now)
set +e
$SEND "$WORK/src/one.bin" "127.0.0.1:$PORT" --stack tls --json >"$WORK/refused.json" 2>/dev/null </dev/null; status=$?
set -e
elapsed=$(awk -v a="$started" -v b="$(now)" 'BEGIN { print b - a }')
check_json "$WORK/refused.json" error || fail "a refused connection is not a JSON error"
[ $status = 69 ] && grep -q '"code":"connect-failed"' "$WORK/refused.json" && grep -q 'Connection refused' "$WORK/refused.json" \
    || fail "refused: exit $status, $(cat "$WORK/refused.json")"
le "$elapsed" 5 || fail "connection refused took $elapsed s (retried until the connect timeout?)"
# The same for a stream: it ended at the 10 s connect timeout, saying "interrupted" (exit 130).
started=$(now)
set +e
"$QXFER" stream send "127.0.0.1:$PORT" --config-dir "$WORK/cfg-stream" --duration 30 --json >"$WORK/srefused.json" 2>/dev/null </dev/null; status=$?
set -e
elapsed=$(awk -v a="$started" -v b="$(now)" 'BEGIN { print b - a }')
[ $status = 69 ] && grep -q '"code":"connect-failed"' "$WORK/srefused.json" && grep -q 'nothing listens' "$WORK/srefused.json" \
    || fail "stream send, refused: exit $status, $(cat "$WORK/srefused.json")"
le "$elapsed" 5 || fail "stream send, refused: it took $elapsed s (retried until the connect timeout?)"
set +e
"$QXFER" send --json >"$WORK/usage.json" 2>/dev/null </dev/null; status=$?
set -e
check_json "$WORK/usage.json" error && [ $status = 64 ] || fail "a usage error is not a JSON error (exit $status)"
"$QXFER" stream recv --config-dir "$WORK/cfg-recv" --port "$SPORT" --json >"$WORK/srecv.json" 2>/dev/null </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '"listening"' "$WORK/srecv.json" 2>/dev/null && break; sleep 0.1; done
"$QXFER" stream send "127.0.0.1:$SPORT" --config-dir "$WORK/cfg-stream" --duration 2 --json >"$WORK/ssend.json" 2>/dev/null </dev/null \
    || fail "stream send --json"
wait "$RECV_PID" || fail "stream recv --json"
check_json "$WORK/srecv.json" listening interval totals || fail "stream recv --json output"
check_json "$WORK/ssend.json" progress totals || fail "stream send --json output"
ok "--json: every line of send, recv, stream send and stream recv parses, with time and event; errors too (refused in $elapsed s)"

# --- 6. Errors a user meets -------------------------------------------------------------------
: >"$WORK/b.bin"
set +e
(cd "$WORK" && "$QXFER" send src/one.bin b.bin) >/dev/null 2>"$WORK/e1" </dev/null; s1=$?
"$QXFER" recv --dir "$WORK/missing/sub" >/dev/null 2>"$WORK/e2" </dev/null; s2=$?
set -e
[ $s1 = 64 ] && grep -q "'b.bin' is a local file, not a host" "$WORK/e1" || fail "send FILE FILE: exit $s1: $(cat "$WORK/e1")"
[ $s2 = 64 ] && grep -q "neither does its parent" "$WORK/e2" || fail "recv --dir missing/sub: exit $s2: $(cat "$WORK/e2")"
# A configuration folder that cannot be made (a file where a folder must go: as root, a read-only
# home would not stop the test) names the way out.
set +e
"$QXFER" send --config-dir "$WORK/b.bin/cfg" "$WORK/src/one.bin" "127.0.0.1:$PORT" >/dev/null 2>"$WORK/e2" </dev/null; s2=$?
set -e
[ $s2 = 78 ] && grep -q "cannot create the configuration folder $WORK/b.bin/cfg: Not a directory; choose a folder you can write with --config-dir" "$WORK/e2" \
    || fail "send with a configuration folder that cannot be made: exit $s2: $(cat "$WORK/e2")"
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --port 0 --dir "$WORK/created" >"$WORK/c.out" 2>"$WORK/c.err" </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '^fingerprint' "$WORK/c.out" 2>/dev/null && break; sleep 0.1; done
kill -INT "$RECV_PID"; set +e; wait "$RECV_PID"; s3=$?; set -e
[ -d "$WORK/created" ] && grep -q "created the folder" "$WORK/c.err" && [ $s3 = 130 ] || fail "recv --dir NEW: exit $s3, $(cat "$WORK/c.err")"
# A receiver that cannot listen (its port taken by another) leaves no new empty folder behind.
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --host 127.0.0.1 --port "$PORT" >"$WORK/c.out" 2>"$WORK/c.err" </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '^fingerprint' "$WORK/c.out" 2>/dev/null && break; sleep 0.1; done
set +e
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --host 127.0.0.1 --port "$PORT" --dir "$WORK/not-made" >/dev/null 2>"$WORK/e3" </dev/null; s3=$?
set -e
kill -INT "$RECV_PID"; wait "$RECV_PID" || true
[ $s3 = 69 ] && grep -q "cannot listen on 127.0.0.1 port $PORT" "$WORK/e3" && [ ! -e "$WORK/not-made" ] \
    || fail "recv --dir NEW on a port in use: exit $s3, folder $(ls -d "$WORK/not-made" 2>&1): $(cat "$WORK/e3")"
# Discovery with nobody answering: a namespace with one link and no receiver.
ip netns add "$NS"
ip -n "$NS" link add "${NS}x" type veth peer name "${NS}y"
ip -n "$NS" link set lo up; ip -n "$NS" link set "${NS}x" up; ip -n "$NS" link set "${NS}y" up
ip -n "$NS" route add 224.0.0.0/4 dev "${NS}x"
set +e
ip netns exec "$NS" "$QXFER" send --config-dir "$WORK/cfg-send" "$WORK/src/one.bin" >/dev/null 2>"$WORK/e4" </dev/null; s4=$?
set -e
[ $s4 = 69 ] && grep -q "no qxfer receiver found on the local network" "$WORK/e4" || fail "discovery without receivers: exit $s4: $(cat "$WORK/e4")"
# No route to the host (the namespace routes only multicast): said at once, on both stacks.
for stack in quic tls; do
    started=$(now)
    set +e
    ip netns exec "$NS" $SEND "$WORK/src/one.bin" 192.0.2.77 --stack $stack >/dev/null 2>"$WORK/e5" </dev/null; s5=$?
    set -e
    elapsed=$(awk -v a="$started" -v b="$(now)" 'BEGIN { print b - a }')
    [ $s5 = 69 ] && grep -q "192.0.2.77:7447: Network is unreachable" "$WORK/e5" && le "$elapsed" 5 \
        || fail "no route over $stack: exit $s5 after $elapsed s: $(cat "$WORK/e5")"
done
# A name that does not resolve: said at once, as ssh does (it waited for the 10 s connect timeout).
started=$(now)
set +e
$SEND "$WORK/src/one.bin" no-such-host.invalid >/dev/null 2>"$WORK/e7" </dev/null; s7=$?
set -e
elapsed=$(awk -v a="$started" -v b="$(now)" 'BEGIN { print b - a }')
[ $s7 = 69 ] && grep -q "cannot resolve no-such-host.invalid: " "$WORK/e7" && le "$elapsed" 5 \
    || fail "a name that does not resolve: exit $s7 after $elapsed s: $(cat "$WORK/e7")"
# A folder that cannot be written is refused at start (root writes anywhere but on a read-only mount).
mkdir -p "$WORK/readonly"; mount -t tmpfs -o ro tmpfs "$WORK/readonly"
set +e
"$QXFER" recv --dir "$WORK/readonly" >/dev/null 2>"$WORK/e6" </dev/null; s6=$?
set -e
umount "$WORK/readonly"
[ $s6 = 64 ] && grep -q "cannot receive into .*Read-only file system" "$WORK/e6" || fail "recv --dir READ-ONLY: exit $s6: $(cat "$WORK/e6")"
ok "errors: a file where the host goes, a missing parent, a configuration folder that cannot be made, a created --dir (none on a port in use), a read-only --dir, no route, a name that does not resolve, no receiver on the network: $(cat "$WORK/e4")"

# send_in_pane NAME PORT DST PATH [RECV-FLAG...]: a receiver answering yes on PORT into DST in
# the background (its pid in BG_RECV, its output in $WORK/NAME.out and .err), and in a new pane
# NAME `qxfer send PATH` to it, until the send exits.
send_in_pane() {
    local name=$1 port=$2 dst=$3 path=$4; shift 4
    "$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --yes "$@" --host 127.0.0.1 --port "$port" --dir "$dst" \
        >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
    BG_RECV=$!; PIDS+=("$BG_RECV")
    for _ in $(seq 100); do grep -q '^fingerprint' "$WORK/$name.out" 2>/dev/null && break; sleep 0.1; done
    pane "$name"
    run "$name" "clear; $SEND $path 127.0.0.1:$port"
    wait_for "$name" '^EXIT='
}

# --- 6b. Names that would drive the terminal ------------------------------------------------
# A folder holding names qxfer/1 does not carry (an escape sequence that paints the screen red,
# a line break, a byte that is not UTF-8, a link to such a name): the sender skips them with a
# warning that shows each name escaped, in the terminal as written, not interpreted; the rest
# is sent and the command exits 77.
mkdir -p "$WORK/names"
echo kept >"$WORK/names/plain.txt"
echo red >"$WORK/names/paint"$'\e[41m'"red"
echo two >"$WORK/names/two"$'\n'"lines"
echo latin1 >"$WORK/names/caf"$'\351'      # Latin-1 é: not UTF-8, which qxfer/1 names are
ln -s "caf"$'\351' "$WORK/names/to-caf"     # a link whose target is not UTF-8
send_in_pane names $((PORT + 1)) "$WORK/dst-names" "$WORK/names"
screen names | grep -qF "names/paint\u001b[41mred': the name is not allowed" \
    && screen names | grep -qF "names/two\nlines': the name is not allowed" \
    || { screen names >&2; fail "names with control characters are not shown escaped"; }
screen names | grep -qF "names/caf\\xe9': the name is not valid UTF-8" \
    && screen names | grep -qF "names/to-caf': symlink to 'caf\\xe9', a target that is not valid UTF-8" \
    || { screen names >&2; fail "a name and a link target that are not UTF-8 are not named, their byte shown as \\xe9"; }
! screen names | grep -q "^lines'" || { screen names >&2; fail "a name's line break started a line of its own"; }
T capture-pane -p -e -t names | grep -qF $'\e[41m' && { screen names >&2; fail "a name's escape sequence reached the terminal"; }
[ -f "$WORK/dst-names/names/plain.txt" ] || fail "the plain file beside the skipped names did not arrive"
# Files left out for their names make the send incomplete: a script must not take it for done.
screen names | grep -q '^EXIT=77$' \
    && screen names | grep -qF "4 items named above were not transferred; everything else arrived" \
    || { screen names >&2; fail "a send that left files out for their names did not exit 77 saying so"; }
kill -INT "$BG_RECV"; wait "$BG_RECV" 2>/dev/null || true
ok "names with an escape sequence, a line break or a byte that is not UTF-8, and a link to such a name: skipped, shown escaped ($(screen names | grep -c 'not allowed') warnings), exit 77"

# --- 6c. A sparse file: the sender counts its data from the start ----------------------------
# A 2 GiB disk image holding 4 MiB of data: "accepted" says what will travel and, apart, the
# holes (before, it said 2.1 GB to send, and the progress total shrank as holes were found).
mkdir -p "$WORK/sparse"
truncate -s 2G "$WORK/sparse/disk.img"
head -c 4194304 /dev/urandom | dd of="$WORK/sparse/disk.img" conv=notrunc status=none
# shows_done NAME ACCEPTED SUMMARY-REGEX: the pane shows "qxfer: accepted: ACCEPTED", a summary
# that matches, and exit 0.
shows_done() {
    screen "$1" | grep -qxF "qxfer: accepted: $2" && screen "$1" | grep -qE "$3" && screen "$1" | grep -q '^EXIT=0$'
}
send_in_pane sparse $((PORT + 2)) "$WORK/dst-sparse" "$WORK/sparse/disk.img" --once
shows_done sparse "4.2 MB to send (plus 2.1 GB of holes)" '^sent 4\.2 MB in .*, plus 2\.1 GB of holes; 1 file verified' \
    || { screen sparse >&2; fail "a sparse file's accepted line or summary"; }
wait "$BG_RECV" || fail "recv of the sparse file: $(cat "$WORK/sparse.err")"
cmp -s "$WORK/sparse/disk.img" "$WORK/dst-sparse/disk.img" || fail "the sparse file differs"
ok "a sparse file: 'accepted: 4.2 MB to send (plus 2.1 GB of holes)', the summary the same"

# --- 6d. Everything already there ------------------------------------------------------------
# The same file sent again: its digest is compared and nothing travels, which the accepted line
# says (before, "accepted: 0 B to send", as if the file had been forgotten).
head -c 300000 /dev/urandom >"$WORK/again.bin"
send_in_pane again1 $((PORT + 3)) "$WORK/dst-again" "$WORK/again.bin" --once
wait "$BG_RECV" || fail "recv of the first copy: $(cat "$WORK/again1.err")"
send_in_pane again2 $((PORT + 3)) "$WORK/dst-again" "$WORK/again.bin" --once
shows_done again2 "nothing to send, 1 file of the same size already there, to compare by digest" '^sent 0 B in (under 1 ms|[0-9.]+ m?s) over [A-Z+]*; 1 file verified with [^ ]+ [0-9a-f]+, already there in full$' \
    || { screen again2 >&2; fail "a file already there: the accepted line or summary"; }
wait "$BG_RECV" || fail "recv of the second copy: $(cat "$WORK/again2.err")"
ok "a file already there: 'accepted: nothing to send, 1 file of the same size already there', a summary without a rate saying it was there in full, exit 0"

# --- 7. recv --stdout --------------------------------------------------------------------------
stdout_recv() {  # stdout_recv OUTPUT-COMMAND: a receiver whose data goes through OUTPUT-COMMAND
    : >"$WORK/so.err"  # the last receiver's banner must not pass for this one's
    bash -o pipefail -c "\"$QXFER\" recv --config-dir \"$WORK/cfg-recv\" --no-advertise --host 127.0.0.1 --port $PORT --yes --stdout 2>\"$WORK/so.err\" | $1" </dev/null &
    RECV_PID=$!; PIDS+=("$RECV_PID")
    for _ in $(seq 100); do grep -q '^fingerprint' "$WORK/so.err" 2>/dev/null && return; sleep 0.1; done
    fail "recv --stdout did not start: $(cat "$WORK/so.err")"
}
stdout_recv "cat >\"$WORK/piped.bin\""
$SEND "$WORK/src/one.bin" "127.0.0.1:$PORT" >/dev/null 2>&1 </dev/null || fail "send to recv --stdout"
wait "$RECV_PID" || fail "recv --stdout: $(cat "$WORK/so.err")"
cmp -s "$WORK/src/one.bin" "$WORK/piped.bin" || fail "recv --stdout: the data differs"
grep -q '^received ' "$WORK/so.err" || fail "recv --stdout: the report is not on standard error"
mkdir -p "$WORK/untarred"
stdout_recv "tar x -C \"$WORK/untarred\""
tar c -C "$WORK" src | $SEND - --name src.tar "127.0.0.1:$PORT" --stack tls >/dev/null 2>&1 || fail "tar | send - to recv --stdout"
wait "$RECV_PID" || fail "recv --stdout | tar x: $(cat "$WORK/so.err")"
diff -r "$WORK/src" "$WORK/untarred/src" >/dev/null || fail "recv --stdout | tar x: the tree differs"
stdout_recv "cat >/dev/null"
set +e
$SEND "$WORK/src" "127.0.0.1:$PORT" >/dev/null 2>"$WORK/so.serr" </dev/null; s5=$?
wait "$RECV_PID"; s6=$?
set -e
[ $s5 = 77 ] && [ $s6 = 77 ] && grep -q -- "--stdout takes one file" "$WORK/so.err" || fail "a folder offered to recv --stdout: send $s5, recv $s6: $(cat "$WORK/so.err")"
# The sender is told why, not only that it was declined.
grep -qE -- "the receiver declined: --stdout takes one file; this offer has [0-9]+ entries \([0-9]+ files\)$" "$WORK/so.serr" || fail "a folder offered to recv --stdout: the sender said $(cat "$WORK/so.serr")"
# A sender whose digest does not match what it sent (qxfer/1 over TLS, docs/PROTOCOL.md §3): the
# data went out already; recv says to discard it and exits 65.
stdout_recv "cat >\"$WORK/bad.out\""
python3 - "$PORT" <<'PEER' || fail "the lying sender"
import socket, ssl, struct, sys
def frame(kind, body): return struct.pack(">II", kind, len(body)) + body
received = b""
def read_frame(sock):
    global received
    while len(received) < 8 or len(received) < 8 + struct.unpack(">I", received[4:8])[0]:
        chunk = sock.recv(65536)
        if not chunk: raise SystemExit("the receiver closed the connection")
        received += chunk
    kind, length = struct.unpack(">II", received[:8])
    received = received[8 + length:]
    return kind
payload = b"x" * 100000
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
context.minimum_version = ssl.TLSVersion.TLSv1_3
context.set_alpn_protocols(["qxfer/1"])
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20) as raw, context.wrap_socket(raw) as sock:
    entry = struct.pack(">BBH", 0, 0, 1) + struct.pack(">H", 7) + b"bad.bin" + struct.pack(">QIqH", len(payload), 0o644, 0, 0)
    sock.sendall(frame(1, struct.pack(">BBI", 1, 0, 1) + entry))
    assert read_frame(sock) == 2, "no Accept"
    sock.sendall(frame(4, struct.pack(">IQ", 0, 0) + payload) + frame(5, struct.pack(">IQBB", 0, len(payload), 1, 16) + bytes(16)))
    assert read_frame(sock) == 7, "no Failed"
    assert read_frame(sock) == 8, "no Complete"
PEER
set +e; wait "$RECV_PID"; s7=$?; set -e
# (What went out before the digest arrived, all or nothing of it, depends on timing.)
[ $s7 = 65 ] && grep -q "standard output did not verify: discard it" "$WORK/so.err" && [ "$(stat -c %s "$WORK/bad.out")" -le 100000 ] \
    || fail "a digest mismatch with --stdout: exit $s7, $(stat -c %s "$WORK/bad.out") bytes out: $(cat "$WORK/so.err")"
# The pipe's reader leaves after a kilobyte while the sender's input is still open: the receiver
# stops the transfer and tells the sender, which fails with its reason instead of sending the
# rest into a temporary file nobody reads and saying "verified".
stdout_recv "head -c 1000 >/dev/null"
set +e
(head -c 3000000 /dev/urandom; sleep 3; head -c 1000 /dev/urandom) | $SEND - --name slow.bin "127.0.0.1:$PORT" >/dev/null 2>"$WORK/so.send"; s8=$?
wait "$RECV_PID"; s9=$?
set -e
[ $s8 = 74 ] && [ $s9 = 74 ] && grep -q "the receiver: the reader of standard output closed it; the transfer stopped" "$WORK/so.send" \
    && [ "$(grep -c "the reader of standard output closed it" "$WORK/so.err")" = 1 ] && ! grep -q '^received ' "$WORK/so.err" \
    || fail "recv --stdout whose reader left (its reason said once): send $s8, recv $s9: $(cat "$WORK/so.send" "$WORK/so.err")"
# A reader that leaves after the whole file has arrived, while the pipe still holds it back:
# the sender hears Complete only once the pipe took every byte, so it fails with the reason
# instead of exiting 0 for a file nobody got.
head -c 3000000 /dev/urandom >"$WORK/late.bin"
stdout_recv "(sleep 2; head -c 1000 >/dev/null)"
set +e
$SEND "$WORK/late.bin" "127.0.0.1:$PORT" >/dev/null 2>"$WORK/so.send" </dev/null; s12=$?
wait "$RECV_PID"; s13=$?
set -e
[ $s12 = 74 ] && [ $s13 = 74 ] && grep -q "the receiver: the reader of standard output closed it; the transfer stopped" "$WORK/so.send" \
    || fail "recv --stdout whose reader left after the file arrived: send $s12, recv $s13: $(cat "$WORK/so.send" "$WORK/so.err")"
# The same for a stream: stream recv stops and stream send ends with its reason, before its 30 s.
for mode in realtime reliable; do
    : >"$WORK/sso.err"
    bash -o pipefail -c "\"$QXFER\" stream recv --config-dir \"$WORK/cfg-recv\" --port $SPORT --output - 2>\"$WORK/sso.err\" | head -c 1000 >/dev/null" </dev/null &
    RECV_PID=$!; PIDS+=("$RECV_PID")
    for _ in $(seq 100); do grep -q 'fingerprint' "$WORK/sso.err" 2>/dev/null && break; sleep 0.1; done
    set +e
    "$QXFER" stream send "127.0.0.1:$SPORT" --config-dir "$WORK/cfg-stream" --mode $mode --duration 30 >/dev/null 2>"$WORK/sso.send" </dev/null; s10=$?
    wait "$RECV_PID"; s11=$?
    set -e
    [ $s10 = 74 ] && [ $s11 = 74 ] && grep -q "the receiver stopped the stream: the reader of standard output closed it" "$WORK/sso.send" \
        && grep -q "the reader of standard output closed it" "$WORK/sso.err" \
        || fail "stream recv --output - whose reader left ($mode): stream send $s10, stream recv $s11: $(cat "$WORK/sso.send" "$WORK/sso.err")"
done
[ -z "$(ls /tmp | grep '^qxfer-stdout-' || true)" ] || fail "recv --stdout left its temporary folder"
ok "recv --stdout: a file, and send - | recv --stdout | tar x, arrive identical; a folder is declined; a digest mismatch exits 65 saying to discard what came out; a reader that leaves (also after the file arrived) stops send and stream send with the reason"

# --- 8. A narrow terminal: the progress line fits, and nothing of it stays behind -------------
# Standard input (its size unknown) paused for 3 s in a 40-column pane: the line shows no share
# of a total it does not know, never reaches the last column (a wrapped line cannot be wiped,
# and its first half stayed above the summary), and is gone once the send ends.
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --yes --once --host 127.0.0.1 --port "$PORT" --dir "$WORK/dst-narrow" \
    >"$WORK/narrow.out" 2>&1 </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '^fingerprint' "$WORK/narrow.out" 2>/dev/null && break; sleep 0.1; done
T new-session -d -s narrow -x 40 -y 30 "env -i PATH=$PATH HOME=$WORK TERM=xterm-256color bash --norc --noprofile"
run narrow "(head -c 3000000 /dev/urandom; sleep 3; head -c 1000000 /dev/urandom) | $SEND - 127.0.0.1:$PORT --name piped.bin"
wait_for narrow 'accepted: sending, size unknown' 1 30
sleep 1.5  # six redraws of the progress line, in the pause
rows=$(T capture-pane -p -t narrow)  # rows as drawn, not joined
progress=$(echo "$rows" | grep -E 'MB/s|kB/s' | tail -n 1)
[ -n "$progress" ] && [ "${#progress}" -lt 40 ] && ! echo "$progress" | grep -qE '%|/ 0 B' \
    || fail "the progress line in a 40-column terminal: '$progress' (${#progress} columns); the pane: $rows"
wait_for narrow '^EXIT=' 1 30
[ "$(count narrow '^EXIT=0$')" = 1 ] && screen narrow | grep -q '1 file verified' || { screen narrow >&2; fail "the piped send in a narrow terminal"; }
left=$(T capture-pane -p -t narrow | grep -E '^\[|MB/s  |kB/s  ' || true)
[ -z "$left" ] || fail "the progress line stayed on screen after the send: $left"
wait "$RECV_PID" || fail "recv --once of the piped send: exit $?"
ok "a 40-column terminal: the progress line fits ('$progress') and is gone after the summary"
# --- 9. Who sends, per-file progress, -q (issue 62 §5) ----------------------------------------
# recv --json > events on a terminal: the question shows who offers what (address, short
# fingerprint, files, size) before "Accept? [y/N]", not a bare prompt.
pane who; pane who-send
run who "$QXFER recv --config-dir $WORK/cfg-recv --no-advertise --host 127.0.0.1 --port $PORT --dir $WORK/dst-who --json >$WORK/who.json"
for _ in $(seq 100); do grep -q '"listening"' "$WORK/who.json" 2>/dev/null && break; sleep 0.1; done
run who-send "$SEND $WORK/src/four.bin 127.0.0.1:$PORT"
wait_for who 'Accept\? \[y/N\]'
screen who | grep -B1 'Accept? \[y/N\]' | head -n 1 \
    | grep -qE '^qxfer: offer from 127\.0\.0\.1:[0-9]+, fingerprint [0-9a-f]{16}.*: 1 file, 10\.0 MB: four\.bin$' \
    || { screen who >&2; fail "recv --json > file: the offer is not shown above the question"; }
T send-keys -t who "y" Enter
wait_for who-send '^EXIT='
[ "$(count who-send '^EXIT=0$')" = 1 ] || { screen who-send >&2; fail "the send to recv --json"; }
python3 - "$WORK/who.json" <<'EOF2' || fail "recv --json: the offer event's peer fields"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
offer = next(e for e in events if e["event"] == "offer")
assert offer["peer_address"].startswith("127.0.0.1:") and len(offer["fingerprint"]) == 64, offer
EOF2
T send-keys -t who C-c
wait_for who '^EXIT=130$'
ok "recv --json > file: the terminal shows who offers what above 'Accept? [y/N]'"

# Per-file progress: a folder of two files, then standard input paused for 3 s: the bar names
# the file in flight (piped.bin) and counts the files done (2/3 files).
mkdir -p "$WORK/multi"
head -c 1500000 /dev/urandom >"$WORK/multi/a.bin"
head -c 1500000 /dev/urandom >"$WORK/multi/b.bin"
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --yes --once --host 127.0.0.1 --port "$PORT" --dir "$WORK/dst-multi" \
    >"$WORK/multi.out" 2>&1 </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
for _ in $(seq 100); do grep -q '^fingerprint' "$WORK/multi.out" 2>/dev/null && break; sleep 0.1; done
run who-send "clear; (head -c 2000000 /dev/urandom; sleep 3; head -c 100000 /dev/urandom) | $SEND $WORK/multi - 127.0.0.1:$PORT --name piped.bin"
wait_for who-send 'accepted: ' 1 30
sleep 1.5  # six redraws, in the pause
bar=$(T capture-pane -p -t who-send | grep -E 'MB/s|kB/s' | tail -n 1)
echo "$bar" | grep -qE '  2/3 files  piped\.bin *$' || { screen who-send >&2; fail "the progress line does not show the file and N/M files: '$bar'"; }
wait_for who-send '^EXIT=' 1 30
[ "$(count who-send '^EXIT=0$')" = 1 ] || { screen who-send >&2; fail "the send of a folder and standard input"; }
wait "$RECV_PID" || fail "recv --once of the folder and standard input: exit $?"
ok "per-file progress: '$bar'"

# -q: a send that transfers everything prints nothing at all; recv -q no banner and no summary.
"$QXFER" recv -q --config-dir "$WORK/cfg-recv" --no-advertise --yes --once --host 127.0.0.1 --port "$PORT" --dir "$WORK/dst-quiet" \
    >"$WORK/quiet.out" 2>&1 </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
sleep 1
pane quiet
run quiet "$SEND -q $WORK/src/four.bin 127.0.0.1:$PORT"
wait_for quiet '^EXIT=' 1 30
said=$(screen quiet | grep -v '^$' | grep -vF -- ' -q ' | grep -v '^EXIT=0$' | grep -vE '^bash-[0-9.]+# *$' || true)
[ "$(count quiet '^EXIT=0$')" = 1 ] && [ -z "$said" ] || { screen quiet >&2; fail "send -q printed: '$said'"; }
wait "$RECV_PID" || fail "recv -q --once: exit $?"
said=$(grep -v 'created the folder' "$WORK/quiet.out" || true)
[ -z "$said" ] && cmp -s "$WORK/src/four.bin" "$WORK/dst-quiet/four.bin" || fail "recv -q printed: '$said'"
ok "-q: a complete send and its receiver print nothing"
echo "terminal: all passed"
