#!/usr/bin/env bash
# End-to-end tests of `qxfer send` / `qxfer recv` as a user runs them: two processes, on
# loopback and across two network namespaces joined by veth, over QUIC and TCP+TLS.
#
#   sudo Tests/e2e/transfer.sh            (root: namespaces; QXFER=path picks the binary)
#
# Proves: a 1 GiB file, a sparse disk image (its zeros kept as holes) and a tree with odd names
# arrive identical (contents, modes, times, links); kill -9 of either side at random instants
# never leaves a partial under the final name and the next run resumes (moving less than the
# whole file); trust on first use, a
# changed fingerprint, --fingerprint pinning and --allow refusals; an offer declined when
# there is no terminal to ask on; `send --to NAME` found over multicast DNS; a sender who may
# not read everything in a folder delivers the rest and exits 74; a read-only folder sent again;
# thousands of files to a receiver under `ulimit -n 200`; a receive onto exFAT (FUSE), whose
# names and links it cannot hold fail alone, and where two names differ only in case the later
# is skipped; a file above the receiving file system's (or process's) file size limit skipped
# at once. Everything it
# creates (processes, namespaces, files) is removed on exit, also when interrupted.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
KILLS=${E2E_KILLS:-4}          # kill -9 rounds per side (the hardening suite runs 20)
BIG_MIB=${E2E_BIG_MIB:-1024}
[ -x "$QXFER" ] || { echo "e2e: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "e2e: must run as root (network namespaces)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-e2e.XXXXXX)
NS=qxe$$
PIDS=()
STICK= LOOPDEV= SMALLFS= SMALLFS_LOOP=
cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -n "$STICK" ]; then umount "$STICK" 2>/dev/null || true; fi
    if [ -n "$LOOPDEV" ]; then losetup -d "$LOOPDEV" 2>/dev/null || true; fi
    if [ -n "$SMALLFS" ]; then umount "$SMALLFS" 2>/dev/null || true; fi
    if [ -n "$SMALLFS_LOOP" ]; then losetup -d "$SMALLFS_LOOP" 2>/dev/null || true; fi
    ip netns del "${NS}a" 2>/dev/null || true
    ip netns del "${NS}b" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "e2e: FAIL: $*" >&2; exit 1; }
ok() { echo "e2e: ok: $*"; }

# --- Fixtures ---------------------------------------------------------------------------
SRC=$WORK/src
mkdir -p "$SRC"
head -c $((BIG_MIB << 20)) /dev/urandom >"$SRC/big.bin"
TREE="$SRC/odd tree"
mkdir -p "$TREE/empty folder" "$TREE/deep"
d="$TREE/deep"; for i in $(seq 1 30); do d="$d/level $i"; done; mkdir -p "$d"; echo bottom >"$d/bottom.txt"
: >"$TREE/empty file"
echo unicode >"$TREE/ünïcödé ✓ 日本語.txt"
echo space >"$TREE/ends with space "
echo dots >"$TREE/..."
echo rtl >"$TREE/$(printf 'rtl\u202etxt.exe')"
head -c 300000 /dev/urandom >"$TREE/deep/some.bin"
ln -s "level 1/level 2" "$TREE/deep/inside link"
ln -s ../../../etc/passwd "$TREE/escaping link"
chmod 640 "$TREE/deep/some.bin"; chmod 750 "$TREE/empty folder"
touch -h -d '2001-09-09 01:46:40.123456789' "$TREE/empty file" "$TREE/deep/inside link"
# A disk image: 64 MiB of which 200 KiB are data, the rest holes (sent as Zeros) and a written
# run of zeros (sent as data, not written).
truncate -s 64M "$SRC/disk.img"
head -c 100000 /dev/urandom | dd of="$SRC/disk.img" bs=1 seek=5000000 conv=notrunc status=none
head -c 1000000 /dev/zero | dd of="$SRC/disk.img" bs=1 seek=6000000 conv=notrunc status=none
head -c 100000 /dev/urandom | dd of="$SRC/disk.img" bs=1 seek=$((64 * 1048576 - 100000)) conv=notrunc status=none

# A tree's shape: type, mode, size, mtime, link target and content digest of every entry.
shape() {
    (cd "$1" && find . -mindepth 1 ! -name 'escaping link' -printf '%y %m %s %T@ %P -> %l\n' | sort) >"$2.list"
    (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r xxhsum -H2 2>/dev/null | sort) >"$2.sums"
}
same_tree() {
    shape "$1" "$WORK/a"; shape "$2" "$WORK/b"
    diff "$WORK/a.list" "$WORK/b.list" >&2 || fail "$3: tree entries differ"
    diff "$WORK/a.sums" "$WORK/b.sums" >&2 || fail "$3: file contents differ"
}

# --- Running the two sides ----------------------------------------------------------------
# recv_start NAME [netns] -- args: starts a receiver; sets RECV_PID, RECV_PORT (from its banner).
recv_start() {
    local name=$1 ns=$2; shift 2
    local run=()
    [ -n "$ns" ] && run=(ip netns exec "$ns")
    : >"$WORK/$name.out"
    "${run[@]}" "$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
    recv_started "$name"
}

# recv_started NAME: after a receiver was started in the background with its output in
# $WORK/NAME.out and .err; sets RECV_PID, RECV_PORT (from its banner).
recv_started() {
    local name=$1
    RECV_PID=$!; PIDS+=("$RECV_PID")
    for _ in $(seq 1 100); do
        RECV_PORT=$(grep -o 'on port [0-9]*' "$WORK/$name.out" 2>/dev/null | grep -o '[0-9]*$' || true)
        [ -n "$RECV_PORT" ] && return 0
        kill -0 "$RECV_PID" 2>/dev/null || fail "$name: recv exited: $(cat "$WORK/$name.err")"
        sleep 0.1
    done
    fail "$name: recv did not start"
}

# send_run NAME [netns] -- args: runs a sender to completion; sets SEND_RC.
send_run() {
    local name=$1 ns=$2; shift 2
    local run=()
    [ -n "$ns" ] && run=(ip netns exec "$ns")
    set +e
    timeout 600 "${run[@]}" "$QXFER" send --config-dir "$WORK/cfg-send" "$@" >"$WORK/$name.sout" 2>"$WORK/$name.serr" </dev/null
    SEND_RC=$?
    set -e
}

# wait_recv: waits for the receiver started last; sets RECV_RC.
wait_recv() {
    RECV_RC=0
    wait "$RECV_PID" || RECV_RC=$?
}

# --- 1. Loopback and two namespaces, both stacks: 1 GiB and the odd tree ----------------
ip netns add "${NS}a"; ip netns add "${NS}b"
ip link add "${NS}va" type veth peer name "${NS}vb"
ip link set "${NS}va" netns "${NS}a"; ip link set "${NS}vb" netns "${NS}b"
ip -n "${NS}a" addr add 10.98.7.1/24 dev "${NS}va"; ip -n "${NS}b" addr add 10.98.7.2/24 dev "${NS}vb"
for n in a b; do
    ip -n "${NS}$n" link set lo up; ip -n "${NS}$n" link set "${NS}v$n" up
    ip -n "${NS}$n" route add 224.0.0.0/4 dev "${NS}v$n"
done

for where in loopback namespaces; do
    for stack in quic tls; do
        dst=$WORK/dst-$where-$stack; mkdir -p "$dst"
        if [ $where = loopback ]; then
            recv_start "r-$where-$stack" "" --dir "$dst" --yes --once --port 0 --host 127.0.0.1
            send_run "s-$where-$stack" "" "$SRC/big.bin" "$SRC/disk.img" "$TREE" "127.0.0.1:$RECV_PORT" --stack $stack
        else
            recv_start "r-$where-$stack" "${NS}b" --dir "$dst" --yes --once --port 7447
            send_run "s-$where-$stack" "${NS}a" "$SRC/big.bin" "$SRC/disk.img" "$TREE" 10.98.7.2 --stack $stack
        fi
        [ "$SEND_RC" = 0 ] || fail "$where $stack: send exit $SEND_RC: $(cat "$WORK/s-$where-$stack.serr")"
        wait_recv; [ "$RECV_RC" = 0 ] || fail "$where $stack: recv failed: $(cat "$WORK/r-$where-$stack.err")"
        grep -q "escaping link.*leaves the tree" "$WORK/s-$where-$stack.serr" || fail "$where $stack: the escaping link was not reported"
        cmp "$SRC/big.bin" "$dst/big.bin" || fail "$where $stack: big.bin differs"
        cmp "$SRC/disk.img" "$dst/disk.img" || fail "$where $stack: disk.img differs"
        # Its zeros stay holes: about the 200 KiB of data on disk (1 MiB allowed), not 64 MiB.
        allocated=$(( $(stat -c '%b * %B' "$dst/disk.img") ))
        [ "$allocated" -le 1048576 ] || fail "$where $stack: disk.img takes $allocated bytes on disk, its zeros written out"
        grep -q "plus [0-9.]* MB of holes" "$WORK/s-$where-$stack.sout" || fail "$where $stack: the image's holes did not travel as holes: $(tail -1 "$WORK/s-$where-$stack.sout")"
        same_tree "$TREE" "$dst/odd tree" "$where $stack"
        [ -z "$(find "$dst" -name '*.qxfer-*')" ] || fail "$where $stack: partial or journal left behind"
        carrier=$([ $stack = quic ] && echo QUIC || echo TCP+TLS)
        grep -q "^received .* over $carrier" "$WORK/r-$where-$stack.out" || fail "$where $stack: the receiver's summary does not say 'over $carrier': $(cat "$WORK/r-$where-$stack.out")"
        ok "$where $stack: ${BIG_MIB} MiB, a sparse disk image ($allocated bytes on disk) and the odd tree arrived identical ($(tail -1 "$WORK/s-$where-$stack.sout"))"
        rm -rf "$dst"
    done
done

# --- 1b. A known receiver over QUIC: the second send's offer and file travel as early data --
dst=$WORK/dst-early; mkdir -p "$dst"
head -c 2048 /dev/urandom >"$WORK/early1.bin"; head -c 4096 /dev/urandom >"$WORK/early2.bin"
recv_start "r-early" "${NS}b" --dir "$dst" --yes --port 7447
rm -f "$WORK/cfg-send/session-tickets"  # tickets of the receivers above: this one never issued them
send_run "s-early1" "${NS}a" "$WORK/early1.bin" 10.98.7.2 --stack quic -v
[ "$SEND_RC" = 0 ] || fail "early: first send exit $SEND_RC: $(cat "$WORK/s-early1.serr")"
! grep -q "as early data" "$WORK/s-early1.serr" || fail "early: a sender without a ticket claimed early data"
send_run "s-early2" "${NS}a" "$WORK/early2.bin" 10.98.7.2 --stack quic -v
[ "$SEND_RC" = 0 ] || fail "early: second send exit $SEND_RC: $(cat "$WORK/s-early2.serr")"
grep -q "QUIC sends its first bytes as early data" "$WORK/s-early2.serr" \
    || fail "early: the known receiver's send was not early: $(cat "$WORK/s-early2.serr"); the ticket file's fields: $(awk '{ print NF }' "$WORK/cfg-send/session-tickets" 2>&1); the first send: $(cat "$WORK/s-early1.serr")"
kill -INT "$RECV_PID"; wait_recv
cmp "$WORK/early1.bin" "$dst/early1.bin" && cmp "$WORK/early2.bin" "$dst/early2.bin" || fail "early: a file differs"
entries=$(find "$WORK/cfg-recv/early-data" -type f | wc -l)
[ "$entries" = 1 ] || fail "early: the receiver recorded $entries early ClientHellos, not 1"
ok "a known receiver over QUIC took the second send's offer and file as early data, recorded once"
rm -rf "$dst"

# --- 2. Discovery across the namespaces: send --to NAME ----------------------------------
dst=$WORK/dst-mdns; mkdir -p "$dst"
ip netns exec "${NS}b" "$QXFER" recv --config-dir "$WORK/cfg-recv" --dir "$dst" --yes --once --port 7447 --name "e2e box" >"$WORK/mdns.out" 2>"$WORK/mdns.err" </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID")
sleep 2
send_run mdns "${NS}a" "$TREE" --to "e2e box"
[ "$SEND_RC" = 0 ] || fail "send --to: exit $SEND_RC: $(cat "$WORK/mdns.serr")"
wait_recv; [ "$RECV_RC" = 0 ] || fail "send --to: recv failed"
same_tree "$TREE" "$dst/odd tree" "send --to"
ok "send --to 'e2e box' found the receiver over multicast DNS and delivered the tree"

# --- 3. kill -9 at random instants, then resume ------------------------------------------
dst=$WORK/dst-kill; mkdir -p "$dst"
killed=0
for side in receiver sender; do
    for round in $(seq 1 "$KILLS"); do
        stack=$([ $((round % 2)) = 0 ] && echo tls || echo quic)
        # Less than a quarter left: start over, or a round could finish between two polls.
        partial=$dst/.big.bin.qxfer-partial
        start=$( [ -e "$partial" ] && stat -c %s "$partial" || echo 0)
        if [ "$start" -gt $(((BIG_MIB << 20) * 3 / 4)) ]; then
            rm -f "$partial" "$dst/.big.bin.qxfer-journal"; start=0
        fi
        recv_start "kill-r" "${NS}b" --dir "$dst" --yes --once --port 7447
        ip netns exec "${NS}a" "$QXFER" send --config-dir "$WORK/cfg-send" "$SRC/big.bin" 10.98.7.2 --stack $stack >/dev/null 2>&1 </dev/null &
        SEND_PID=$!; PIDS+=("$SEND_PID")
        # A random instant while the data flows, chosen by progress rather than by time, so a
        # faster machine cannot finish first: kill when the partial (which grows as data
        # lands) has covered 10 to 90 % of what this round still had to move.
        target=$(awk -v s="$start" -v t=$((BIG_MIB << 20)) -v r=$RANDOM 'BEGIN { printf "%d", s + (t - s) * (0.1 + (r % 81) / 100) }')
        for _ in $(seq 1 6000); do
            size=$( [ -e "$partial" ] && stat -c %s "$partial" 2>/dev/null || echo 0)
            [ "$size" -ge "$target" ] && break
            [ -e "$dst/big.bin" ] && break
            kill -0 "$SEND_PID" 2>/dev/null || break
            sleep 0.005
        done
        if [ $side = receiver ]; then kill -9 "$RECV_PID" 2>/dev/null || true; else kill -9 "$SEND_PID" 2>/dev/null || true; fi
        kill -9 "$RECV_PID" "$SEND_PID" 2>/dev/null || true
        wait "$RECV_PID" "$SEND_PID" 2>/dev/null || true
        if [ -e "$dst/big.bin" ]; then
            cmp -s "$SRC/big.bin" "$dst/big.bin" || fail "kill -9 of the $side (round $round): a file other than the source has the final name"
            rm "$dst/big.bin"   # finished before the kill: start over so the next round interrupts
        fi
        killed=$((killed + 1))
    done
done
[ -e "$dst/.big.bin.qxfer-partial" ] || fail "every kill round finished before its kill (E2E_BIG_MIB=$BIG_MIB is too small to interrupt)"
recv_start "resume-r" "${NS}b" --dir "$dst" --yes --once --port 7447
send_run resume "${NS}a" "$SRC/big.bin" 10.98.7.2 --json
[ "$SEND_RC" = 0 ] || fail "resume: exit $SEND_RC: $(cat "$WORK/resume.serr")"
wait_recv; [ "$RECV_RC" = 0 ] || fail "resume: recv failed"
cmp "$SRC/big.bin" "$dst/big.bin" || fail "resume: big.bin differs"
resumed=$(grep '"event":"summary"' "$WORK/resume.sout" | jq .resumed_bytes)
moved=$(grep '"event":"summary"' "$WORK/resume.sout" | jq .bytes)
[ "$resumed" -gt 0 ] && [ "$moved" -lt $((BIG_MIB << 20)) ] || fail "resume moved $moved bytes, resumed $resumed"
[ -z "$(find "$dst" -name '*.qxfer-*')" ] || fail "resume: partial or journal left behind"
ok "$killed kill -9 rounds: never a partial under the final name; the last run resumed $resumed bytes and moved $moved"

# --- 3b. Ctrl-C of the sender: the receiver learns at once, over QUIC too --------------------
for stack in quic tls; do
    dst=$WORK/dst-int-$stack; mkdir -p "$dst"
    recv_start "int-r-$stack" "${NS}b" --dir "$dst" --yes --once --port 7447
    ip netns exec "${NS}a" "$QXFER" send --config-dir "$WORK/cfg-send" "$SRC/big.bin" 10.98.7.2 --stack $stack >/dev/null 2>"$WORK/int-s.err" </dev/null &
    SEND_PID=$!; PIDS+=("$SEND_PID")
    # Interrupt as soon as data is being written, so the transfer is surely mid-way.
    for _ in $(seq 1 400); do [ -e "$dst/.big.bin.qxfer-partial" ] && break; sleep 0.01; done
    kill -INT "$SEND_PID" 2>/dev/null || true
    interrupted=$(date +%s%N)
    rc=0; wait "$SEND_PID" || rc=$?
    [ "$rc" = 130 ] || fail "Ctrl-C of the sender over $stack: exit $rc, expected 130"
    wait_recv
    waited_ms=$(( ($(date +%s%N) - interrupted) / 1000000 ))
    [ "$RECV_RC" = 69 ] || fail "the receiver after Ctrl-C over $stack: exit $RECV_RC, expected 69: $(cat "$WORK/int-r-$stack.err")"
    [ "$waited_ms" -lt 5000 ] || fail "the receiver took $waited_ms ms to notice the interrupted sender over $stack"
    grep -q "the same send resumes" "$WORK/int-r-$stack.err" || fail "the receiver's message over $stack: $(cat "$WORK/int-r-$stack.err")"
    [ ! -e "$dst/big.bin" ] || fail "an interrupted transfer left a file under the final name"
    [ -e "$dst/.big.bin.qxfer-partial" ] && [ -e "$dst/.big.bin.qxfer-journal" ] || fail "no resumable partial after Ctrl-C over $stack"
    ok "Ctrl-C of the sender over $stack: exit 130, the receiver stopped within $waited_ms ms keeping the partial"
done

# --- 4. Trust ----------------------------------------------------------------------------
dst=$WORK/dst-trust; mkdir -p "$dst"; echo small >"$WORK/small.txt"
recv_fp=$("$QXFER" id --config-dir "$WORK/cfg-recv")
send_fp=$("$QXFER" id --config-dir "$WORK/cfg-send")
rm -f "$WORK/cfg-send/known_hosts"
recv_start trust1 "" --dir "$dst" --yes --once --port 0 --host 127.0.0.1
send_run trust1 "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT"
[ "$SEND_RC" = 0 ] && grep -q "first contact.*$recv_fp" "$WORK/trust1.serr" || fail "first contact was not announced: $(cat "$WORK/trust1.serr")"
wait_recv
port=$RECV_PORT
ok "first contact trusted and announced"

# The same host:port with another identity: refused, loudly, with both fingerprints.
"$QXFER" recv --config-dir "$WORK/cfg-other" --no-advertise --dir "$dst" --yes --once --port "$port" --host 127.0.0.1 >"$WORK/other.out" 2>&1 </dev/null &
RECV_PID=$!; PIDS+=("$RECV_PID"); sleep 1
other_fp=$("$QXFER" id --config-dir "$WORK/cfg-other")
for stack in quic tls; do
    send_run changed "" "$WORK/small.txt" "127.0.0.1:$port" --stack $stack
    [ "$SEND_RC" = 77 ] || fail "changed fingerprint over $stack: exit $SEND_RC, expected 77"
    grep -q "$recv_fp" "$WORK/changed.serr" && grep -q "$other_fp" "$WORK/changed.serr" || fail "the refusal does not show both fingerprints: $(cat "$WORK/changed.serr")"
done
kill -9 "$RECV_PID" 2>/dev/null || true; wait "$RECV_PID" 2>/dev/null || true
ok "a changed fingerprint is refused on both stacks (exit 77) showing both fingerprints"

# --fingerprint pins; a wrong pin is refused.
recv_start pin "" --dir "$dst" --yes --port 0 --host 127.0.0.1
send_run pin-wrong "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT" --fingerprint "$send_fp"
[ "$SEND_RC" = 77 ] || fail "a wrong --fingerprint: exit $SEND_RC, expected 77"
! grep -q "^127.0.0.1:$RECV_PORT " "$WORK/cfg-send/known_hosts" || fail "a refused pin was recorded in known_hosts"
rm -f "$dst/small.txt"
send_run pin-right "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT" --fingerprint "$recv_fp" --stack tls
[ "$SEND_RC" = 0 ] || fail "the right --fingerprint: exit $SEND_RC: $(cat "$WORK/pin-right.serr")"
# A verified pin is remembered for a receiver with no entry: the next send needs no
# --fingerprint, is no first contact, and resumes with early data like any known receiver.
grep -q "recorded 127.0.0.1:$RECV_PORT's pinned fingerprint" "$WORK/pin-right.serr" || fail "no notice of the recorded pin: $(cat "$WORK/pin-right.serr")"
[ "$(grep -c "^127.0.0.1:$RECV_PORT $recv_fp\$" "$WORK/cfg-send/known_hosts")" = 1 ] || fail "the verified pin is not in known_hosts once"
for later in pin-later pin-later2; do
    rm -f "$dst/small.txt"
    send_run $later "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT" --stack quic -v
    [ "$SEND_RC" = 0 ] || fail "a send after the pin: exit $SEND_RC: $(cat "$WORK/$later.serr")"
done
grep -q "trusted as known host" "$WORK/pin-later.serr" && ! grep -q "first contact" "$WORK/pin-later.serr" \
    || fail "the send after the pin was not verified against known_hosts: $(cat "$WORK/pin-later.serr")"
grep -q "the receiver took the early data" "$WORK/pin-later2.serr" || fail "no early data to the pinned receiver: $(cat "$WORK/pin-later2.serr")"
kill -9 "$RECV_PID" 2>/dev/null || true; wait "$RECV_PID" 2>/dev/null || true
ok "--fingerprint pins the receiver and is remembered: the next send is verified by known_hosts, with early data"

# --allow admits only listed senders (mutual TLS), on both stacks.
recv_start allow "" --dir "$dst" --yes --port 0 --host 127.0.0.1 --allow "$other_fp"
for stack in quic tls; do
    send_run allow "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT" --stack $stack --fingerprint "$recv_fp"
    [ "$SEND_RC" != 0 ] || fail "--allow admitted an unlisted sender over $stack"
    grep -qiE "refus|not allowed|untrusted|certificate" "$WORK/allow.serr" || fail "--allow refusal over $stack is unclear: $(cat "$WORK/allow.serr")"
done
kill -9 "$RECV_PID" 2>/dev/null || true; wait "$RECV_PID" 2>/dev/null || true
recv_start allow2 "" --dir "$dst" --yes --once --port 0 --host 127.0.0.1 --allow "$send_fp"
rm -f "$dst/small.txt"
send_run allow2 "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT" --fingerprint "$recv_fp"
[ "$SEND_RC" = 0 ] || fail "--allow refused a listed sender: $(cat "$WORK/allow2.serr")"
wait_recv
ok "--allow refuses an unlisted sender on both stacks ($(tail -1 "$WORK/allow.serr")) and admits a listed one"

# --- 5. No terminal to ask on: the offer is declined ---------------------------------------
recv_start ask "" --dir "$dst" --once --port 0 --host 127.0.0.1
send_run ask "" "$WORK/small.txt" "127.0.0.1:$RECV_PORT" --fingerprint "$recv_fp"
[ "$SEND_RC" = 77 ] || fail "a declined offer: exit $SEND_RC, expected 77"
grep -q "the receiver declined: it has no terminal to ask on and runs without --yes" "$WORK/ask.serr" || fail "the sender was not told why: $(cat "$WORK/ask.serr")"
wait_recv
[ "$RECV_RC" = 77 ] || fail "a declined offer: recv exit $RECV_RC, expected 77"
# The receiver says why once, in its own words; its last line is not the sender's wording.
grep -q "declined: no terminal to ask on; run 'qxfer recv --yes'" "$WORK/ask.err" && [ "$(tail -1 "$WORK/ask.err")" = "qxfer: the offer was declined" ] \
    || fail "a declined offer: the receiver said $(cat "$WORK/ask.err")"
ok "an offer nobody can confirm is declined (exit 77: $(tail -1 "$WORK/ask.serr"))"

# --- 6. A user who may not read everything in a folder: the rest arrives, then exit 74 -----
# The sender runs as nobody (root reads everything); its files, binary and folders are its own.
SOLO=$WORK/unprivileged; mkdir -p "$SOLO/cfg" "$SOLO/home/tree/open" "$SOLO/home/tree/locked" "$SOLO/home/tree/unsearchable"
cp "$QXFER" "$SOLO/qxfer"; chmod 755 "$WORK"
echo readable >"$SOLO/home/tree/open/a.txt"; echo secret >"$SOLO/home/tree/locked/b.txt"
echo hidden >"$SOLO/home/tree/unsearchable/c.txt"; echo private >"$SOLO/home/tree/private.txt"
chown -R nobody "$SOLO"
# Owned by root with no access for others: nobody may not read these.
chown root "$SOLO/home/tree/private.txt" "$SOLO/home/tree/locked" "$SOLO/home/tree/unsearchable"
chmod 600 "$SOLO/home/tree/private.txt"; chmod 700 "$SOLO/home/tree/locked"; chmod 744 "$SOLO/home/tree/unsearchable"
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$SOLO/qxfer" send --config-dir "$SOLO/cfg" "$@"; }
dst=$WORK/dst-unreadable; mkdir -p "$dst"
recv_start unreadable "" --dir "$dst" --yes --once --port 0 --host 127.0.0.1
set +e; as_nobody "$SOLO/home/tree" "127.0.0.1:$RECV_PORT" >"$WORK/unreadable.sout" 2>"$WORK/unreadable.serr"; rc=$?; set -e
[ "$rc" = 74 ] || fail "a folder holding unreadable items: send exit $rc, expected 74: $(cat "$WORK/unreadable.serr")"
grep -q "accepted:" "$WORK/unreadable.serr" || fail "the sender gave up before sending anything: $(cat "$WORK/unreadable.serr")"
wait_recv; [ "$RECV_RC" = 0 ] || fail "a folder holding unreadable items: recv exit $RECV_RC: $(cat "$WORK/unreadable.err")"
cmp "$SOLO/home/tree/open/a.txt" "$dst/tree/open/a.txt" || fail "the readable file did not arrive"
for gone in locked unsearchable private.txt; do
    [ ! -e "$dst/tree/$gone" ] || fail "'$gone', unreadable to the sender, was created on the receiver"
    grep -q "tree/$gone': cannot .*: Permission denied; not sent" "$WORK/unreadable.serr" || fail "'$gone' was not reported: $(cat "$WORK/unreadable.serr")"
done
grep -q "3 items named above were not transferred; everything else arrived" "$WORK/unreadable.serr" \
    || fail "no closing line for the unread items: $(cat "$WORK/unreadable.serr")"
set +e; as_nobody "$SOLO/home/tree/private.txt" 127.0.0.1:9 >/dev/null 2>"$WORK/unreadable1.serr"; rc=$?; set -e
[ "$rc" = 74 ] && grep -q "cannot read '.*private.txt': Permission denied" "$WORK/unreadable1.serr" \
    || fail "an unreadable file named on the command line: exit $rc: $(cat "$WORK/unreadable1.serr")"
ok "unreadable items inside a folder are reported and skipped, the rest arrives, exit 74; an unreadable path named is refused before connecting"

# A read-only folder, sent again once it holds a new file: the receiver (nobody too) writes into
# its own read-only copy and leaves it read-only again.
mkdir -p "$SOLO/home/ro/sub" "$SOLO/inbox"; echo one >"$SOLO/home/ro/sub/one"; chown -R nobody "$SOLO/home/ro" "$SOLO/inbox"
chmod 555 "$SOLO/home/ro/sub" "$SOLO/home/ro"
for round in first second; do
    [ $round = second ] && { chmod 755 "$SOLO/home/ro/sub"; echo two >"$SOLO/home/ro/sub/two"; chmod 555 "$SOLO/home/ro/sub"; }
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$SOLO/qxfer" recv --config-dir "$SOLO/cfg-recv" --no-advertise \
        --dir "$SOLO/inbox" --yes --once --port 0 --host 127.0.0.1 >"$WORK/ro-$round.out" 2>"$WORK/ro-$round.err" </dev/null &
    recv_started "ro-$round"
    set +e; as_nobody "$SOLO/home/ro" "127.0.0.1:$RECV_PORT" >"$WORK/ro-$round.sout" 2>"$WORK/ro-$round.serr"; rc=$?; set -e
    [ "$rc" = 0 ] || fail "a read-only folder, $round send: exit $rc: $(cat "$WORK/ro-$round.serr")"
    wait_recv; [ "$RECV_RC" = 0 ] || fail "a read-only folder, $round send: recv exit $RECV_RC: $(cat "$WORK/ro-$round.err")"
done
# The folders were there for the second send: they keep their own mode and time (docs/PROTOCOL.md
# §4), so their times are left out of the comparison.
shape "$SOLO/home/ro" "$WORK/a"; shape "$SOLO/inbox/ro" "$WORK/b"
diff <(awk '$1 == "d" { $4 = "" } 1' "$WORK/a.list") <(awk '$1 == "d" { $4 = "" } 1' "$WORK/b.list") >&2 \
    || fail "a read-only folder sent again: tree entries differ"
diff "$WORK/a.sums" "$WORK/b.sums" >&2 || fail "a read-only folder sent again: file contents differ"
[ "$(stat -c %a "$SOLO/inbox/ro/sub")" = 555 ] || fail "the read-only folder was left $(stat -c %a "$SOLO/inbox/ro/sub")"
ok "a read-only folder sent again with a new file in it: the receiver's read-only copy takes it and stays read-only"

# --- 7. Thousands of small files to a receiver allowed few open files --------------------
# Verified files hold their partials open until committed; the receiver keeps them within its
# limit (ulimit -n 200, soft and hard) by reading more slowly, on both stacks.
MANY=$WORK/many
python3 - "$MANY" <<'PY'
import os, random, sys
random.seed(7)
for d in range(12):
    os.makedirs(f"{sys.argv[1]}/d{d}", exist_ok=True)
    for f in range(250):
        with open(f"{sys.argv[1]}/d{d}/f{f}", "wb") as out: out.write(random.randbytes(random.randint(1, 6000)))
PY
for stack in quic tls; do
    dst=$WORK/dst-many-$stack; mkdir -p "$dst"
    (ulimit -n 200; exec "$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --dir "$dst" --yes --once --port 0 --host 127.0.0.1 \
        >"$WORK/many-$stack.out" 2>"$WORK/many-$stack.err" </dev/null) &
    recv_started "many-$stack"
    send_run "many-$stack" "" "$MANY" "127.0.0.1:$RECV_PORT" --stack $stack
    [ "$SEND_RC" = 0 ] || fail "3000 files to a receiver allowed 200 open files, $stack: send exit $SEND_RC: $(tail -2 "$WORK/many-$stack.serr")"
    wait_recv; [ "$RECV_RC" = 0 ] || fail "3000 files, $stack: recv exit $RECV_RC: $(tail -2 "$WORK/many-$stack.err")"
    same_tree "$MANY" "$dst/many" "3000 files, $stack"
    rm -rf "$dst"
done
ok "3000 small files to a receiver allowed 200 open files arrived whole on both stacks"

# --- 8. Onto a USB stick's file system: exFAT through FUSE ---------------------------------
# It holds no ':' in a name and no symlink, and cannot rename without replacing (RENAME_NOREPLACE
# is refused with EINVAL): those two entries fail alone, everything else arrives, exit 74.
truncate -s 64M "$WORK/stick.img"; mkfs.exfat "$WORK/stick.img" >/dev/null
LOOPDEV=$(losetup -f --show "$WORK/stick.img"); STICK=$WORK/stick; mkdir -p "$STICK"
mount.exfat-fuse "$LOOPDEV" "$STICK" >/dev/null 2>&1 || fail "cannot mount an exFAT file system through FUSE"
USB=$WORK/for-the-stick; mkdir -p "$USB/photos"
head -c 3000000 /dev/urandom >"$USB/photos/big.jpg"; echo notes >"$USB/notes.txt"; echo when >"$USB/meeting 10:30.txt"
ln -s notes.txt "$USB/link to notes"
# onto_stick NAME SOURCE STACK EXIT: sends SOURCE over loopback into $STICK/NAME, expecting EXIT.
onto_stick() {
    mkdir -p "$STICK/$1"
    recv_start "$1" "" --dir "$STICK/$1" --yes --once --port 0 --host 127.0.0.1
    send_run "$1" "" "$2" "127.0.0.1:$RECV_PORT" --stack "$3"
    [ "$SEND_RC" = "$4" ] || fail "onto exFAT, $1: send exit $SEND_RC, expected $4: $(cat "$WORK/$1.serr")"
    wait_recv
}
for stack in quic tls; do
    onto_stick "stick-$stack" "$USB" $stack 74
    cmp "$USB/photos/big.jpg" "$STICK/stick-$stack/for-the-stick/photos/big.jpg" || fail "onto exFAT, $stack: big.jpg did not arrive"
    cmp "$USB/notes.txt" "$STICK/stick-$stack/for-the-stick/notes.txt" || fail "onto exFAT, $stack: notes.txt did not arrive"
    for refused in "meeting 10:30.txt" "link to notes"; do
        grep -q "'for-the-stick/$refused' not transferred: the receiver: cannot create" "$WORK/stick-$stack.serr" \
            || fail "onto exFAT, $stack: '$refused' was not reported: $(cat "$WORK/stick-$stack.serr")"
    done
    # Each was named on its own line: the last one counts them, not repeat the first.
    [ "$(tail -1 "$WORK/stick-$stack.serr")" = "qxfer: 2 items named above were not transferred; everything else arrived" ] \
        || fail "onto exFAT, $stack: the last line: $(tail -1 "$WORK/stick-$stack.serr")"
    [ -z "$(find "$STICK/stick-$stack" -name '*.qxfer-*')" ] || fail "onto exFAT, $stack: a partial or journal was left behind"
done
ok "onto exFAT (FUSE): the names it cannot hold fail alone, the rest arrives (exit 74), renamed without RENAME_NOREPLACE"

# exFAT does not tell upper from lower case: "Big.bin" and "big.bin" are one file there. Both
# were written into it at once (and the FUSE driver died: "Transport endpoint is not connected");
# the later name is now skipped and named, exit 73, the earlier arrives whole.
CASES=$WORK/cases; mkdir -p "$CASES/Sub" "$CASES/sub"
head -c 3000000 /dev/urandom >"$CASES/Big.bin"; head -c 3000000 /dev/urandom >"$CASES/big.bin"
echo upper >"$CASES/A.txt"; echo lower >"$CASES/a.txt"; echo one >"$CASES/Sub/x"; echo two >"$CASES/sub/y"
for stack in quic tls; do
    onto_stick "case-$stack" "$CASES" $stack 73
    got=$STICK/case-$stack/cases
    cmp "$CASES/Big.bin" "$got/Big.bin" && cmp "$CASES/A.txt" "$got/A.txt" && cmp "$CASES/Sub/x" "$got/Sub/x" && cmp "$CASES/sub/y" "$got/Sub/y" \
        || fail "case on exFAT, $stack: the first of each name (and both folders' files) did not arrive: $(ls -laR "$got" 2>&1)"
    for later in "big.bin' and 'cases/Big.bin" "a.txt' and 'cases/A.txt"; do
        grep -q "'cases/$later' are one name on the receiving file system" "$WORK/case-$stack.err" \
            || fail "case on exFAT, $stack: '$later' was not named: $(cat "$WORK/case-$stack.err")"
    done
    # The sender says why too, naming the entry that took the name.
    grep -qF "'cases/big.bin' not transferred: its name and 'cases/Big.bin' differ only in case, which the receiving file system does not tell apart" "$WORK/case-$stack.serr" \
        || fail "case on exFAT, $stack: the sender's reason: $(cat "$WORK/case-$stack.serr")"
    [ -z "$(find "$STICK/case-$stack" -name '.*')" ] || fail "case on exFAT, $stack: a partial, journal or probe was left behind"
done
ok "onto exFAT (FUSE): of two names that differ only in case the first arrives, the later is named (exit 73); folders merge"

# --- 9. Kernel files: their size says 0 (procfs) or 4096 (sysfs), their content is what a read gives --
mkdir -p "$WORK/kernel"
recv_start kernel "" --dir "$WORK/kernel" --yes --once --port 0 --host 127.0.0.1
send_run kernel "" /proc/version /sys/class/net/lo/mtu "127.0.0.1:$RECV_PORT"
[ "$SEND_RC" = 0 ] || fail "kernel files: send exit $SEND_RC: $(cat "$WORK/kernel.serr")"
wait_recv
grep -q "offered 2 items (size unknown)" "$WORK/kernel.serr" || fail "kernel files: the offered line: $(cat "$WORK/kernel.serr")"
grep -q "accepted: sending, size unknown" "$WORK/kernel.serr" || fail "kernel files: the accepted line (not '0 B to send'): $(cat "$WORK/kernel.serr")"
cmp /proc/version "$WORK/kernel/version" && cmp /sys/class/net/lo/mtu "$WORK/kernel/mtu" \
    || fail "kernel files did not arrive whole: $(wc -c "$WORK/kernel/version" "$WORK/kernel/mtu")"
ok "kernel files (/proc, /sys) arrive read to their end, not as 0 bytes or a 'shrank' failure"

# --- 10. A file larger than the receiver can write as one file --------------------------------
# A file system with a file size limit (ext2 with 1 KiB blocks: about 16 GiB, as FAT32's is
# 4 GiB) and a receiver under `ulimit -f`: the file above the limit is skipped `too-large`
# before a byte of it moves, the rest arrives, exit 73 on both sides. Before, the whole transfer
# failed once the receiver reached the limit ("File too large"), the rest not received.
truncate -s 64M "$WORK/small-fs.img"; mkfs.ext2 -q -b 1024 "$WORK/small-fs.img"
SMALLFS_LOOP=$(losetup -f --show "$WORK/small-fs.img"); SMALLFS=$WORK/small-fs; mkdir -p "$SMALLFS"
mount "$SMALLFS_LOOP" "$SMALLFS" || fail "cannot mount an ext2 file system"
LARGE=$WORK/large; mkdir -p "$LARGE"
truncate -s 17G "$LARGE/disk.img"; echo notes >"$LARGE/notes.txt"
for stack in quic tls; do
    recv_start "large-$stack" "" --dir "$SMALLFS/$stack" --yes --once --port 0 --host 127.0.0.1
    send_run "large-$stack" "" "$LARGE" "127.0.0.1:$RECV_PORT" --stack $stack
    wait_recv
    [ "$SEND_RC" = 73 ] && [ "$RECV_RC" = 73 ] || fail "too large, $stack: exit $SEND_RC / $RECV_RC, expected 73: $(cat "$WORK/large-$stack.serr" "$WORK/large-$stack.err")"
    grep -q "'large/disk.img' is 18.3 GB; the file system here holds files of at most 17.2 GB ([0-9]* bytes)" "$WORK/large-$stack.err" \
        || fail "too large, $stack: the receiver's reason: $(cat "$WORK/large-$stack.err")"
    grep -q "'large/disk.img' not transferred: it is larger than the receiving file system" "$WORK/large-$stack.serr" \
        || fail "too large, $stack: the sender's reason: $(cat "$WORK/large-$stack.serr")"
    cmp "$LARGE/notes.txt" "$SMALLFS/$stack/large/notes.txt" || fail "too large, $stack: the rest did not arrive"
    [ -z "$(find "$SMALLFS/$stack" -name '.*qxfer*')" ] || fail "too large, $stack: a partial, journal or probe was left behind"
done
head -c 300000 /dev/urandom >"$WORK/over-ulimit.bin"
mkdir -p "$WORK/ulimit"
(ulimit -f 100; exec "$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --dir "$WORK/ulimit" --yes --once --port 0 --host 127.0.0.1 \
    >"$WORK/ulimit.out" 2>"$WORK/ulimit.err" </dev/null) &
recv_started ulimit
send_run ulimit "" "$WORK/over-ulimit.bin" "$LARGE/notes.txt" "127.0.0.1:$RECV_PORT"
wait_recv
[ "$SEND_RC" = 73 ] && [ "$RECV_RC" = 73 ] || fail "ulimit -f: exit $SEND_RC / $RECV_RC, expected 73: $(cat "$WORK/ulimit.serr" "$WORK/ulimit.err")"
grep -qF "'over-ulimit.bin' is 300.0 kB; this receiver may write files of at most 102.4 kB (102400 bytes): its file size limit, ulimit -f" "$WORK/ulimit.err" \
    || fail "ulimit -f: the receiver's reason: $(cat "$WORK/ulimit.err")"
cmp "$LARGE/notes.txt" "$WORK/ulimit/notes.txt" && [ ! -e "$WORK/ulimit/over-ulimit.bin" ] || fail "ulimit -f: what arrived: $(ls -la "$WORK/ulimit")"
ok "a file above the receiving file system's limit (ext2, 1 KiB blocks) or the receiver's ulimit -f: skipped too-large at once, the rest arrives, exit 73"

echo "e2e: all transfer tests passed"
