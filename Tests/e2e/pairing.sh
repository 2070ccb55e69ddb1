#!/usr/bin/env bash
# End-to-end tests of `qxfer pair`, `qxfer devices`, `qxfer unpair` and `recv --paired-only`,
# as a user runs them: two machines (two network namespaces joined by veth, each with its own
# configuration folder, hence its own identity), and a third, unpaired one.
#
#   sudo Tests/e2e/pairing.sh            (root: namespaces; QXFER=path picks the binary)
#
# Proves, on QUIC and on TCP+TLS: the right code pairs both sides, each listing the other's
# fingerprint exactly as the other's `qxfer id` prints it; a wrong code pairs neither and both
# say so; `recv --paired-only` admits the paired sender and refuses an unpaired one with a
# clear message; sending to a paired receiver needs no --fingerprint and writes no known host;
# a paired receiver with another identity is refused, never trusted on first use; `unpair`
# removes the trust; a tampered paired-devices file is an error, not silent trust; the waiting
# side takes one attempt per code; without OpenSSL's libcrypto `pair` fails at once, clearly, and
# the other commands work. Removes everything it creates, also when interrupted.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
[ -x "$QXFER" ] || { echo "pairing: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "pairing: must run as root (network namespaces)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-pairing.XXXXXX)
NS=qxp$$
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "${NS}a" 2>/dev/null || true
    ip netns del "${NS}b" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "pairing: FAIL: $*" >&2; exit 1; }
ok() { echo "pairing: ok: $*"; }

ip netns add "${NS}a"; ip netns add "${NS}b"
ip link add "${NS}va" type veth peer name "${NS}vb"
ip link set "${NS}va" netns "${NS}a"; ip link set "${NS}vb" netns "${NS}b"
ip -n "${NS}a" addr add 10.98.9.1/24 dev "${NS}va"; ip -n "${NS}b" addr add 10.98.9.2/24 dev "${NS}vb"
for n in a b; do ip -n "${NS}$n" link set lo up; ip -n "${NS}$n" link set "${NS}v$n" up; done
B=10.98.9.2

# Machine alice lives in namespace a, bob in b; carol (unpaired) in a with her own folder.
q_sub() { local ns=$1 who=$2 sub=$3; shift 3; ip netns exec "${NS}$ns" "$QXFER" "$sub" --config-dir "$WORK/$who" "$@"; }
# The same for a background process: exec, so that $! is qxfer itself and kill reaches it.
q_bg() { local ns=$1 who=$2 sub=$3; shift 3; exec ip netns exec "${NS}$ns" "$QXFER" "$sub" --config-dir "$WORK/$who" "$@"; }
fp_of() { "$QXFER" id --config-dir "$WORK/$1"; }
devices_json() { "$QXFER" devices --config-dir "$WORK/$1" --json; }

# pair_round TAG STACK CODE_WAITING CODE_TYPED: bob waits in b, alice connects from a.
# Sets WAIT_RC, JOIN_RC; output in $WORK/TAG.wait / TAG.join.
pair_round() {
    local tag=$1 stack=$2 waiting=$3 typed=$4
    q_bg b bob pair --port 7449 --code "$waiting" --name bob --timeout 60 >"$WORK/$tag.wait" 2>&1 </dev/null &
    local pid=$!; PIDS+=("$pid")
    for _ in $(seq 1 100); do grep -q "waiting up to" "$WORK/$tag.wait" && break; sleep 0.1; done
    set +e
    timeout 90 ip netns exec "${NS}a" "$QXFER" pair "$B:7449" --config-dir "$WORK/alice" --code "$typed" --name alice --stack "$stack" >"$WORK/$tag.join" 2>&1 </dev/null
    JOIN_RC=$?
    wait "$pid"; WAIT_RC=$?
    set -e
}

for who in alice bob carol; do "$QXFER" id --config-dir "$WORK/$who" >/dev/null; done

# --- 1. A wrong code pairs neither side, on both stacks ---------------------------------
for stack in quic tls; do
    pair_round wrong-$stack $stack 111111 111112
    [ "$JOIN_RC" = 77 ] && [ "$WAIT_RC" = 77 ] || fail "wrong code over $stack: exit codes $JOIN_RC / $WAIT_RC (want 77 / 77)"
    grep -q "codes do not match" "$WORK/wrong-$stack.join" && grep -q "codes do not match" "$WORK/wrong-$stack.wait" \
        || fail "wrong code over $stack is not reported clearly: $(cat "$WORK/wrong-$stack.join" "$WORK/wrong-$stack.wait")"
    [ "$(devices_json alice | jq length)" = 0 ] && [ "$(devices_json bob | jq length)" = 0 ] || fail "a wrong code stored a device"
done
ok "a wrong code pairs neither side on QUIC and TCP+TLS, both exit 77: $(tail -1 "$WORK/wrong-quic.join")"

# --- 2. The right code pairs both sides; each lists the other's `qxfer id` --------------
for stack in tls quic; do
    pair_round right-$stack $stack 482913 "482 913"
    [ "$JOIN_RC" = 0 ] && [ "$WAIT_RC" = 0 ] || fail "right code over $stack: exit codes $JOIN_RC / $WAIT_RC: $(cat "$WORK/right-$stack.join" "$WORK/right-$stack.wait")"
    [ "$(devices_json alice | jq -r '.[] | select(.name == "bob") | .fingerprint')" = "$(fp_of bob)" ] || fail "alice does not list bob's fingerprint after pairing over $stack"
    [ "$(devices_json bob | jq -r '.[] | select(.name == "alice") | .fingerprint')" = "$(fp_of alice)" ] || fail "bob does not list alice's fingerprint after pairing over $stack"
    [ "$(devices_json alice | jq length)" = 1 ] || fail "pairing again over $stack duplicated the entry"
done
[ "$(stat -c %a "$WORK/alice/paired-devices.json")" = 600 ] || fail "paired-devices.json is not 0600"
ok "the right code pairs both sides on TCP+TLS and QUIC; each lists the other's fingerprint as its qxfer id prints it"

# --- 3. One attempt per code ---------------------------------------------------------------
q_bg b bob pair --port 7449 --code 222222 --name bob --timeout 60 >"$WORK/once.wait" 2>&1 </dev/null &
pid=$!; PIDS+=("$pid")
for _ in $(seq 1 100); do grep -q "waiting up to" "$WORK/once.wait" && break; sleep 0.1; done
set +e
timeout 60 ip netns exec "${NS}a" "$QXFER" pair "$B:7449" --config-dir "$WORK/carol" --code 000000 --name carol >/dev/null 2>&1 </dev/null
timeout 10 ip netns exec "${NS}a" "$QXFER" pair "$B:7449" --config-dir "$WORK/carol" --code 222222 --name carol >"$WORK/once.second" 2>&1 </dev/null
second=$?
wait "$pid"; first_wait=$?
set -e
[ "$first_wait" = 77 ] || fail "the waiting side did not end after one wrong attempt (exit $first_wait)"
[ "$second" != 0 ] || fail "a second attempt on the same code was accepted"
[ "$(devices_json carol | jq length)" = 0 ] || fail "carol got paired"
# With the waiting side gone, a pair to its port says so at once, as send does (it waited for
# the 10 s connect timeout).
set +e
timeout 10 ip netns exec "${NS}a" "$QXFER" pair "$B:7449" --config-dir "$WORK/carol" --code 222222 --name carol >"$WORK/once.closed" 2>&1 </dev/null
closed=$?
set -e
[ "$closed" = 69 ] && grep -q "nothing listens on $B:7449" "$WORK/once.closed" \
    || fail "pair to a port where nothing listens: exit $closed: $(cat "$WORK/once.closed")"
ok "a waiting qxfer pair takes one attempt and exits; the right code afterwards finds nobody, and says so at once"

# --- 4. recv --paired-only: the paired sender in, an unpaired one out ---------------------
echo "paired hello" >"$WORK/hello.txt"
mkdir -p "$WORK/inbox"
q_bg b bob recv --port 7447 --dir "$WORK/inbox" --yes --paired-only --no-advertise >"$WORK/recv.out" 2>"$WORK/recv.err" </dev/null &
RECV=$!; PIDS+=("$RECV")
for _ in $(seq 1 100); do grep -q "on port" "$WORK/recv.out" 2>/dev/null && break; sleep 0.1; done
for stack in quic tls; do
    rm -f "$WORK/inbox/hello.txt"
    q_sub a alice send "$WORK/hello.txt" "$B" --stack $stack >"$WORK/paired-$stack.out" 2>&1 </dev/null \
        || fail "recv --paired-only refused the paired sender over $stack: $(cat "$WORK/paired-$stack.out")"
    cmp -s "$WORK/hello.txt" "$WORK/inbox/hello.txt" || fail "the paired sender's file did not arrive over $stack"
    set +e
    q_sub a carol send "$WORK/hello.txt" "$B" --stack $stack >"$WORK/unpaired-$stack.out" 2>&1 </dev/null
    rc=$?
    set -e
    [ "$rc" = 77 ] || fail "recv --paired-only admitted or mis-reported an unpaired sender over $stack (exit $rc)"
    grep -q "paired" "$WORK/unpaired-$stack.out" || fail "the unpaired sender's refusal is unclear: $(cat "$WORK/unpaired-$stack.out")"
done
cat "$WORK/recv.out" "$WORK/recv.err" | grep -q "offer from 'alice' (paired" || fail "the receiver does not name the paired sender: $(cat "$WORK/recv.out" "$WORK/recv.err")"
[ ! -e "$WORK/alice/known_hosts" ] || fail "sending to a paired receiver wrote a known host (trust on first use)"
[ "$(devices_json alice | jq -r '.[0].last_seen')" != null ] || fail "alice did not record when she last saw bob"
[ "$(devices_json bob | jq -r '.[0].last_seen')" != null ] || fail "bob did not record when he last saw alice"
ok "recv --paired-only admits the paired sender without --fingerprint or known hosts, refuses an unpaired one (exit 77: $(tail -1 "$WORK/unpaired-quic.out"))"

# stream send to the paired receiver: no --fingerprint, no known host either.
ip netns exec "${NS}b" "$QXFER" stream recv --config-dir "$WORK/bob" --port 7448 >"$WORK/srecv.out" 2>"$WORK/srecv.err" </dev/null &
SRECV=$!; PIDS+=("$SRECV")
for _ in $(seq 1 100); do grep -q "waiting for a stream" "$WORK/srecv.err" 2>/dev/null && break; sleep 0.1; done
ip netns exec "${NS}a" "$QXFER" stream send --config-dir "$WORK/alice" "$B" --duration 1 >"$WORK/ssend.out" 2>&1 </dev/null \
    || fail "stream send to the paired receiver failed: $(cat "$WORK/ssend.out")"
wait "$SRECV" 2>/dev/null || true
[ ! -e "$WORK/alice/known_hosts" ] || fail "stream send to a paired receiver wrote a known host"
ok "stream send to the paired receiver needs no --fingerprint and writes no known host"

# --- 5. A paired receiver that comes back with another identity is refused ----------------
kill "$RECV"; wait "$RECV" 2>/dev/null || true
cp -a "$WORK/bob" "$WORK/bob-saved"
rm "$WORK/bob/host-key.pem" "$WORK/bob/host-cert.pem" "$WORK/bob/paired-devices.json"
q_bg b bob recv --port 7447 --dir "$WORK/inbox" --yes --no-advertise >"$WORK/imp.out" 2>"$WORK/imp.err" </dev/null &
RECV=$!; PIDS+=("$RECV")
for _ in $(seq 1 100); do grep -q "on port" "$WORK/imp.out" 2>/dev/null && break; sleep 0.1; done
set +e
q_sub a alice send "$WORK/hello.txt" "$B" >"$WORK/imp-send.out" 2>&1 </dev/null
rc=$?
set -e
[ "$rc" = 77 ] || fail "a paired receiver with a new identity was not refused (exit $rc)"
grep -q "paired as 'bob'" "$WORK/imp-send.out" || fail "the refusal does not name the pairing: $(cat "$WORK/imp-send.out")"
[ ! -e "$WORK/alice/known_hosts" ] || fail "the impostor was recorded by trust on first use"
kill "$RECV"; wait "$RECV" 2>/dev/null || true
rm -rf "$WORK/bob"; mv "$WORK/bob-saved" "$WORK/bob"
ok "a paired receiver presenting another certificate is refused, not trusted on first use: $(tail -1 "$WORK/imp-send.out")"

# --- 6. unpair removes the trust -----------------------------------------------------------
q_sub b bob unpair alice 2>"$WORK/unpair.err" || fail "unpair failed: $(cat "$WORK/unpair.err")"
[ "$(devices_json bob | jq length)" = 0 ] || fail "unpair left alice listed"
q_bg b bob recv --port 7447 --dir "$WORK/inbox" --yes --paired-only --no-advertise >"$WORK/recv2.out" 2>"$WORK/recv2.err" </dev/null &
RECV=$!; PIDS+=("$RECV")
for _ in $(seq 1 100); do grep -q "on port" "$WORK/recv2.out" 2>/dev/null && break; sleep 0.1; done
set +e
q_sub a alice send "$WORK/hello.txt" "$B" >"$WORK/after-unpair.out" 2>&1 </dev/null
rc=$?
set -e
[ "$rc" = 77 ] || fail "an unpaired-again sender was admitted (exit $rc)"
kill "$RECV"; wait "$RECV" 2>/dev/null || true
set +e; q_sub b bob unpair nobody 2>/dev/null; rc=$?; set -e
[ "$rc" = 64 ] || fail "unpair of an unknown device: exit $rc, want 64"
ok "unpair removes the trust: the sender is refused afterwards"

# --- 7. A tampered paired-devices file is an error, not silent trust -----------------------
carol_fp=$(fp_of carol)
bob_fp=$(fp_of bob)
sed -i "s/$bob_fp/$carol_fp/" "$WORK/alice/paired-devices.json"
set +e
"$QXFER" devices --config-dir "$WORK/alice" >/dev/null 2>"$WORK/tamper.err"; rc=$?
q_sub a alice send "$WORK/hello.txt" "$B" >"$WORK/tamper-send.out" 2>&1 </dev/null; send_rc=$?
set -e
[ "$rc" = 78 ] && [ "$send_rc" = 78 ] || fail "a tampered list gave exit $rc / $send_rc, want 78 / 78"
grep -q "changed outside qxfer" "$WORK/tamper.err" || fail "the tampering message is unclear: $(cat "$WORK/tamper.err")"
ok "a tampered paired-devices file is refused (exit 78): $(cat "$WORK/tamper.err")"

# 8. A machine without OpenSSL's libcrypto (which pairing loads only when it pairs): `qxfer pair`
# says so and exits 69 before it opens a socket, and the other commands work as before. Hidden
# in a private mount namespace by an empty file bound over the library.
# awk reads to the end: exiting at the match could leave ldconfig writing into a closed pipe,
# and pipefail would end this script with its SIGPIPE (exit 141; seen once under CI's load).
LIBCRYPTO=$(ldconfig -p | awk '/libcrypto\.so\.3 .*x86-64/ && !found {print $NF; found = 1}')
if [ -n "$LIBCRYPTO" ] && command -v unshare >/dev/null; then
    : >"$WORK/empty-library"
    set +e
    unshare -m bash -c "mount --bind '$WORK/empty-library' '$(readlink -f "$LIBCRYPTO")' && \
        '$QXFER' pair --config-dir '$WORK/alice' --port 7450 --code 123456 --timeout 5 </dev/null >'$WORK/nolib.pair' 2>&1; \
        echo \$? >'$WORK/nolib.rc'; '$QXFER' id --config-dir '$WORK/alice' >'$WORK/nolib.id' 2>&1"
    set -e
    [ "$(cat "$WORK/nolib.rc")" = 69 ] || fail "pair without libcrypto exited $(cat "$WORK/nolib.rc"), want 69: $(cat "$WORK/nolib.pair")"
    grep -q "cannot pair: OpenSSL's libcrypto" "$WORK/nolib.pair" || fail "pair without libcrypto said: $(cat "$WORK/nolib.pair")"
    grep -q "$(fp_of alice)" "$WORK/nolib.id" || fail "qxfer id without libcrypto failed: $(cat "$WORK/nolib.id")"
    ok "without libcrypto, pair exits 69 at once and the rest works: $(cat "$WORK/nolib.pair")"
fi

echo "pairing: all passed"
