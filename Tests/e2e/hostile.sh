#!/usr/bin/env bash
# Hostile peers against the `qxfer recv` binary on loopback, over TCP+TLS and QUIC
# (Tests/e2e/hostile_peer.py): the path-traversal corpus declined with nothing written, hostile
# numbers (two files of 2^63 bytes, a frame over 16 MiB) refused with limit-exceeded, a TLS
# 1.2-only client and clients offering another ALPN refused, a sender's Error carrying terminal
# escapes shown harmless, and (not hostile) a sparse file whose hole travels as a Zeros message
# from this independent sender arrives verified and sparse; then a real `qxfer send` still goes
# through; and `recv --once` outlives connections that leave before an offer. No root needed;
# everything it creates is removed on exit.
#
#   Tests/e2e/hostile.sh        (QXFER=path picks the binary)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
[ -x "$QXFER" ] || { echo "hostile: $QXFER not built" >&2; exit 1; }
python3 -c 'import aioquic' 2>/dev/null || { echo "hostile: python3 with aioquic needed (scripts/install-deps.sh)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-hostile.XXXXXX)
RECV_PID=
cleanup() {
    [ -n "$RECV_PID" ] && kill -9 "$RECV_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "hostile: FAIL: $*" >&2; exit 1; }

# The target folder sits alone in its parent, so anything escaping it shows up there.
mkdir -p "$WORK/parent/target" "$WORK/src"
echo "still serving" >"$WORK/src/real.txt"
PORT=$((20000 + RANDOM % 20000))
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --yes --port "$PORT" --dir "$WORK/parent/target" \
    >"$WORK/recv.out" 2>"$WORK/recv.err" </dev/null &
RECV_PID=$!
for _ in $(seq 1 100); do
    grep -q "on port $PORT" "$WORK/recv.out" 2>/dev/null && break
    kill -0 "$RECV_PID" 2>/dev/null || fail "recv exited: $(cat "$WORK/recv.err")"
    sleep 0.1
done
grep -q "on port $PORT" "$WORK/recv.out" || fail "recv did not start"

for stack in tls quic; do
    python3 "$ROOT/Tests/e2e/hostile_peer.py" --stack "$stack" --port "$PORT" --target "$WORK/parent/target" \
        || fail "$stack: see above; recv said: $(tail -5 "$WORK/recv.err")"
done
kill -0 "$RECV_PID" 2>/dev/null || fail "recv died under the hostile peers: $(tail -5 "$WORK/recv.err")"
# The sender's words reached the receiver's report harmless: no escape, bell or override byte
# in its output, no line the sender forged, its words shown all the same.
for log in recv.out recv.err; do
    if LC_ALL=C grep -q $'[\x1b\x07]' "$WORK/$log" || grep -q $'\u202e' "$WORK/$log"; then
        fail "a sender's control characters reached the receiver's $log raw: $(grep -a evil "$WORK/$log" | od -c | head -5)"
    fi
    grep -q '^qxfer: forged line' "$WORK/$log" && fail "a sender forged a line of the receiver's $log"
done
grep -q 'evil.*pwned.*forged line' "$WORK/recv.err" || fail "the sender's Error is not shown: $(tail -3 "$WORK/recv.err")"
echo "hostile: ok: a sender's terminal escapes, line break and override shown harmless"

for stack in quic tls; do
    timeout 60 "$QXFER" send --config-dir "$WORK/cfg-send" --stack "$stack" "$WORK/src/real.txt" "127.0.0.1:$PORT" \
        >"$WORK/send.out" 2>&1 </dev/null || fail "a real send over $stack after the hostile peers: $(cat "$WORK/send.out")"
    cmp -s "$WORK/src/real.txt" "$WORK/parent/target/real.txt" || fail "the real file did not arrive over $stack"
    rm "$WORK/parent/target/real.txt"
done
echo "hostile: ok: a real send still goes through on both stacks"

# Connections that leave before an offer (a stack race's loser once both handshakes have
# completed, a port probe) are no transfer: `recv --once` keeps waiting for the real one, exits
# 0 with it, and reports no failure.
kill -9 "$RECV_PID" 2>/dev/null || true; wait "$RECV_PID" 2>/dev/null || true
mkdir -p "$WORK/once"
"$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --yes --once --port "$PORT" --dir "$WORK/once" \
    >"$WORK/once.out" 2>"$WORK/once.err" </dev/null &
RECV_PID=$!
for _ in $(seq 1 100); do grep -q "on port $PORT" "$WORK/once.out" 2>/dev/null && break; sleep 0.1; done
for stack in tls quic; do
    python3 "$ROOT/Tests/e2e/hostile_peer.py" --stack "$stack" --port "$PORT" --connect-only || fail "$stack: connecting only"
done
sleep 0.5
kill -0 "$RECV_PID" 2>/dev/null || fail "recv --once ended on connections that made no offer: $(cat "$WORK/once.err")"
timeout 60 "$QXFER" send --config-dir "$WORK/cfg-send" "$WORK/src/real.txt" "127.0.0.1:$PORT" >"$WORK/send.out" 2>&1 </dev/null \
    || fail "the real send after the connections without an offer: $(cat "$WORK/send.out")"
rc=0; wait "$RECV_PID" || rc=$?; RECV_PID=
[ "$rc" = 0 ] || fail "recv --once exited $rc after the real transfer: $(cat "$WORK/once.err")"
cmp -s "$WORK/src/real.txt" "$WORK/once/real.txt" || fail "recv --once: the real file did not arrive"
grep -q "failed" "$WORK/once.err" && fail "recv --once reported a failure: $(cat "$WORK/once.err")"
echo "hostile: ok: recv --once outlives three connections that made no offer and exits 0 with the real transfer"
[ "$(ls -A "$WORK/parent")" = "target" ] || fail "something appeared beside the target folder: $(ls -A "$WORK/parent")"
echo "hostile: all checks passed"
