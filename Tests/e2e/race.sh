#!/usr/bin/env bash
# The default stack (`--stack auto`: QUIC raced against TCP+TLS) between two network namespaces
# joined by veth, with nftables rules in the receiver's namespace dropping UDP or TCP:
#
#   sudo Tests/e2e/race.sh        (root: namespaces; QXFER=path picks the binary)
#
#  1. UDP dropped: the default `qxfer send` of 5 MiB goes over TCP+TLS, well inside the 10 s
#     QUIC handshake timeout it used to wait for; not remembered from a 0.3 s send, remembered (`stacks`, 0600) once QUIC was silent 3 s; with
#     the memory gone, 24 MiB (QUIC probes the path's datagram size first) go over TCP+TLS too;
#     a realtime `stream send` falls back too, saying that its datagrams degrade there.
#  2. both open, the memory fresh: TCP+TLS starts at once and wins; expired: QUIC again, and
#     the entry is gone.
#  3. TCP dropped: QUIC. Both open: QUIC. A receiver seen before: QUIC alone with early data;
#     UDP dropped since: the early attempt unanswered, then the race, TCP+TLS within 3 s.
# 3e. a name with an IPv6 address whose UDP is dropped and an IPv4 one that works
#     (/etc/netns/NS/hosts): over --stack quic the ticket keeps the IPv4 address it came over,
#     and the next send's early data goes there first; a ticket whose address went silent costs
#     a second, then a full handshake over the address race, not a failure; a `stream send`
#     from standard input the same, starting again from its first frame.
#  4. nothing listening (TCP refused, UDP port unreachable): "nothing listens on host:port,
#     neither TCP nor UDP", exit 69, within about a second.
#  5. both dropped: a clear error naming both stacks within the 10 s connect timeout, exit 69.
# Everything it creates (processes, namespaces and their nftables rules, files) is removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
[ -x "$QXFER" ] || { echo "race: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "race: must run as root (network namespaces)" >&2; exit 1; }
command -v nft >/dev/null || { echo "race: nft (nftables) is needed; run scripts/install-deps.sh" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-race.XXXXXX)
NS=qxr$$
A=${NS}a B=${NS}b
ADDR=10.98.10.2
PORT=7447
STREAM_PORT=7448
RECV_PID=
SRECV_PID=
cleanup() {
    for pid in $RECV_PID $SRECV_PID; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    ip netns exec "$B" nft delete table inet qxrace 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "/etc/netns/$A"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "race: FAIL: $*" >&2; exit 1; }
ok() { echo "race: ok: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

ip netns add "$A"; ip netns add "$B"
ip link add "${NS}va" type veth peer name "${NS}vb"
ip link set "${NS}va" netns "$A"; ip link set "${NS}vb" netns "$B"
ip -n "$A" addr add 10.98.10.1/24 dev "${NS}va"; ip -n "$B" addr add "$ADDR/24" dev "${NS}vb"
ip -n "$A" addr add fd98:10::1/64 dev "${NS}va" nodad; ip -n "$B" addr add fd98:10::2/64 dev "${NS}vb" nodad
for n in a b; do ip -n "${NS}$n" link set lo up; ip -n "${NS}$n" link set "${NS}v$n" up; done
# A name for the receiver with both families, seen by processes in A (ip netns exec's /etc/netns).
mkdir -p "/etc/netns/$A"
printf '127.0.0.1 localhost\n::1 localhost\nfd98:10::2 receiver.qxrace\n%s receiver.qxrace\n' "$ADDR" >"/etc/netns/$A/hosts"

# drop PROTOCOLS...: the receiver's namespace silently drops those packets to both ports (no ICMP,
# no RST: as a firewall does); `drop` alone opens both again.
drop() {
    ip netns exec "$B" nft delete table inet qxrace 2>/dev/null || true
    [ "$#" -gt 0 ] || return 0
    ip netns exec "$B" nft add table inet qxrace
    ip netns exec "$B" nft add chain inet qxrace input '{ type filter hook input priority 0; policy accept; }'
    for protocol in "$@"; do
        ip netns exec "$B" nft add rule inet qxrace input "$protocol" dport "{ $PORT, $STREAM_PORT }" drop
    done
}

RECV_CFG=$WORK/cfg-recv SEND_CFG=$WORK/cfg-send
RECV_FP=$("$QXFER" id --config-dir "$RECV_CFG")
mkdir -p "$WORK/in"
head -c $((5 << 20)) /dev/urandom >"$WORK/five.bin"
head -c $((24 << 20)) /dev/urandom >"$WORK/big.bin"  # large enough for QUIC's path probe

recv_start() {
    ip netns exec "$B" "$QXFER" recv --config-dir "$RECV_CFG" --no-advertise --dir "$WORK/in" --yes --overwrite --port "$PORT" \
        >"$WORK/recv.out" 2>"$WORK/recv.err" </dev/null &
    RECV_PID=$!
    for _ in $(seq 1 100); do
        grep -q 'on port' "$WORK/recv.out" 2>/dev/null && return 0
        kill -0 "$RECV_PID" 2>/dev/null || fail "recv exited: $(cat "$WORK/recv.err")"
        sleep 0.1
    done
    fail "recv did not start"
}
recv_stop() { kill -9 "$RECV_PID" 2>/dev/null || true; wait "$RECV_PID" 2>/dev/null || true; RECV_PID=; }

# send NAME [FILE]: the default `qxfer send` (no --stack) of FILE (the 5 MiB file), with
# $SEND_FLAGS if set; sets RC, SECONDS_TAKEN, STACK.
send() {
    local started file=${2:-$WORK/five.bin}
    started=$(now)
    RC=0
    ip netns exec "$A" "$QXFER" send --config-dir "$SEND_CFG" "$file" "$ADDR:$PORT" --fingerprint "$RECV_FP" --json ${SEND_FLAGS:-} \
        >"$WORK/$1.out" 2>"$WORK/$1.err" </dev/null || RC=$?
    SECONDS_TAKEN=$(since "$started")
    STACK=$( (grep '"event":"summary"' "$WORK/$1.out" || true) | tail -1 | jq -r '.stack // empty')
}
memory_line() { grep -F "$ADDR:$PORT " "$SEND_CFG/stacks" 2>/dev/null || true; }

recv_start

# 1. UDP dropped.
drop udp
send udp-dropped
[ "$RC" = 0 ] || fail "UDP dropped: exit $RC: $(cat "$WORK/udp-dropped.err")"
[ "$STACK" = "TCP+TLS" ] || fail "UDP dropped: carried by '$STACK', expected TCP+TLS"
cmp -s "$WORK/five.bin" "$WORK/in/five.bin" || fail "UDP dropped: the received file differs"
below "$SECONDS_TAKEN" 6 || fail "UDP dropped: took $SECONDS_TAKEN s (QUIC's handshake timeout is 10 s)"
ok "UDP dropped: 5 MiB over TCP+TLS in $SECONDS_TAKEN s"
# A send over before QUIC has been silent for 3 s proves nothing about UDP (a loaded machine's
# QUIC may only be late): nothing is remembered. One that lasts longer (standard input held
# open 4 s) sees the silence through, and the host is remembered.
[ -z "$(memory_line)" ] || fail "a 0.3 s send remembered UDP as blocked: $(memory_line)"
RC=0
(cat "$WORK/five.bin"; sleep 4) | ip netns exec "$A" "$QXFER" send - --name five-stdin.bin --config-dir "$SEND_CFG" "$ADDR:$PORT" \
    --fingerprint "$RECV_FP" --json >"$WORK/udp-dropped-long.out" 2>"$WORK/udp-dropped-long.err" || RC=$?
[ "$RC" = 0 ] || fail "UDP dropped, a 4 s send: exit $RC: $(cat "$WORK/udp-dropped-long.err")"
cmp -s "$WORK/five.bin" "$WORK/in/five-stdin.bin" || fail "UDP dropped, a 4 s send: the received file differs"
memory_line | grep -q ' TCP+TLS ' || fail "the winner was not remembered after QUIC's 3 s of silence: $(cat "$SEND_CFG/stacks" 2>/dev/null)"
[ "$(stat -c %a "$SEND_CFG/stacks")" = 600 ] || fail "the stacks file is not 0600"
ok "remembered: $(memory_line)"

# 1a. UDP dropped, forgotten, a file for which QUIC first probes the path's datagram size: the
#     probe gets no answer and is cancelled when TCP+TLS wins, which still wins as quickly.
mv "$SEND_CFG/stacks" "$WORK/stacks.kept"  # put back after: §2 needs the entry §1 proved
send udp-dropped-probing "$WORK/big.bin"
[ "$RC" = 0 ] || fail "UDP dropped, probing: exit $RC: $(cat "$WORK/udp-dropped-probing.err")"
[ "$STACK" = "TCP+TLS" ] || fail "UDP dropped, probing: carried by '$STACK', expected TCP+TLS"
cmp -s "$WORK/big.bin" "$WORK/in/big.bin" || fail "UDP dropped, probing: the received file differs"
below "$SECONDS_TAKEN" 8 || fail "UDP dropped, probing: took $SECONDS_TAKEN s"
ok "UDP dropped, probing: 24 MiB over TCP+TLS in $SECONDS_TAKEN s"
mv "$WORK/stacks.kept" "$SEND_CFG/stacks"

# 1b. UDP dropped, a realtime stream: over TCP+TLS, saying that its datagrams degrade there.
ip netns exec "$B" "$QXFER" stream recv --config-dir "$RECV_CFG" --port "$STREAM_PORT" >"$WORK/srecv.out" 2>"$WORK/srecv.err" </dev/null &
SRECV_PID=$!
sleep 1
ip netns exec "$A" "$QXFER" stream send --config-dir "$SEND_CFG" "$ADDR:$STREAM_PORT" --fingerprint "$RECV_FP" --duration 1 \
    >"$WORK/ssend.out" 2>"$WORK/ssend.err" </dev/null || fail "stream send with UDP dropped: $(cat "$WORK/ssend.err")"
grep -q "the stream goes over TCP+TLS" "$WORK/ssend.err" || fail "stream send: no note that it fell back: $(cat "$WORK/ssend.err")"
ok "UDP dropped, realtime stream: $(grep -o 'UDP did not get through.*' "$WORK/ssend.err" | head -1)"
kill -9 "$SRECV_PID" 2>/dev/null || true; wait "$SRECV_PID" 2>/dev/null || true; SRECV_PID=

# 2. The memory: TCP+TLS first while fresh, even with UDP open; QUIC again once expired.
drop
send remembered
[ "$RC" = 0 ] && [ "$STACK" = "TCP+TLS" ] || fail "remembered: exit $RC over '$STACK', expected TCP+TLS first: $(cat "$WORK/remembered.err")"
ok "remembered host: TCP+TLS at once"
sed -i "s/^\($ADDR:$PORT TCP+TLS\) [0-9]*$/\1 1/" "$SEND_CFG/stacks"
send expired
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "expired: exit $RC over '$STACK', expected QUIC: $(cat "$WORK/expired.err")"
[ -z "$(memory_line)" ] || fail "expired: the entry is still there: $(memory_line)"
ok "expired memory: QUIC again, entry removed"
printf 'garbage\x01 line\n' >"$SEND_CFG/stacks"
send hostile-memory
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "a damaged stacks file: exit $RC over '$STACK': $(cat "$WORK/hostile-memory.err")"
ok "a damaged stacks file is ignored"

# 3. TCP dropped, then both open.
drop tcp
send tcp-dropped
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "TCP dropped: exit $RC over '$STACK': $(cat "$WORK/tcp-dropped.err")"
ok "TCP dropped: QUIC in $SECONDS_TAKEN s"
drop
send open
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "both open: exit $RC over '$STACK': $(cat "$WORK/open.err")"
ok "both open: QUIC in $SECONDS_TAKEN s"

# 3a. A receiver seen before (its session ticket kept, its fingerprint pinned): QUIC leads alone
#     and the offer and file go as early data, which the receiver takes.
head -c 1024 /dev/urandom >"$WORK/small.bin"
SEND_FLAGS=-v send known "$WORK/small.bin"
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "known receiver: exit $RC over '$STACK': $(cat "$WORK/known.err")"
grep -q "QUIC leads alone with early data" "$WORK/known.err" && grep -q "the receiver took the early data" "$WORK/known.err" \
    || fail "known receiver: no early data under --stack auto: $(grep qxfer.quic "$WORK/known.err")"
ok "known receiver: QUIC alone, early data taken, in $SECONDS_TAKEN s"
# 3b. UDP dropped since: the early attempt hears nothing for a second, the race follows, and
#     TCP+TLS delivers the small file within the 3 s the design allows a blocked network.
drop udp
SEND_FLAGS=-v send known-udp-dropped "$WORK/small.bin"
[ "$RC" = 0 ] && [ "$STACK" = "TCP+TLS" ] || fail "known receiver, UDP dropped: exit $RC over '$STACK': $(cat "$WORK/known-udp-dropped.err")"
grep -q "QUIC with early data could not reach" "$WORK/known-udp-dropped.err" || fail "known receiver, UDP dropped: $(cat "$WORK/known-udp-dropped.err")"
cmp -s "$WORK/small.bin" "$WORK/in/small.bin" || fail "known receiver, UDP dropped: the received file differs"
[ "$(grep -c '"event":"offered"' "$WORK/known-udp-dropped.out")" = 1 ] || fail "known receiver, UDP dropped: the offer was not reported once: $(cat "$WORK/known-udp-dropped.out")"
below "$SECONDS_TAKEN" 3 || fail "known receiver, UDP dropped: took $SECONDS_TAKEN s"
ok "known receiver, UDP dropped: early attempt unanswered, then TCP+TLS, in $SECONDS_TAKEN s"
drop
rm -f "$SEND_CFG/stacks"
# 3c. UDP blocked one way only (the receiver's answers lost): the receiver took the early offer,
#     and hears the sender give up its handshake, so the race's TCP+TLS finds the file free.
send known-again "$WORK/small.bin"  # a new ticket
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "known receiver again: exit $RC over '$STACK': $(cat "$WORK/known-again.err")"
ip netns exec "$A" nft add table inet qxrace
ip netns exec "$A" nft add chain inet qxrace input '{ type filter hook input priority 0; policy accept; }'
ip netns exec "$A" nft add rule inet qxrace input udp sport "$PORT" drop
head -c 2048 /dev/urandom >"$WORK/small.bin"
SEND_FLAGS=-v send known-one-way "$WORK/small.bin"
[ "$RC" = 0 ] && [ "$STACK" = "TCP+TLS" ] || fail "known receiver, answers over UDP lost: exit $RC over '$STACK': $(cat "$WORK/known-one-way.err")"
cmp -s "$WORK/small.bin" "$WORK/in/small.bin" || fail "known receiver, answers over UDP lost: the received file differs"
below "$SECONDS_TAKEN" 3 || fail "known receiver, answers over UDP lost: took $SECONDS_TAKEN s"
ok "known receiver, its UDP answers lost: early attempt given up and said so, then TCP+TLS, in $SECONDS_TAKEN s"
ip netns exec "$A" nft delete table inet qxrace
rm -f "$SEND_CFG/stacks"
# 3d. The receiver's own UDP sends refused for a while (a local firewall, a full connection
#     tracking table: sendmsg fails with EPERM, and NIO closes the socket): the receiver binds
#     its QUIC port again, and QUIC serves the next sender.
ip netns exec "$B" nft add table inet qxrace
ip netns exec "$B" nft add chain inet qxrace output '{ type filter hook output priority 0; policy accept; }'
ip netns exec "$B" nft add rule inet qxrace output udp sport "$PORT" drop
send refused-sends "$WORK/small.bin"
[ "$RC" = 0 ] && [ "$STACK" = "TCP+TLS" ] || fail "the receiver's UDP sends refused: exit $RC over '$STACK': $(cat "$WORK/refused-sends.err")"
# QUIC alone keeps knocking for its handshake timeout: every Initial that reaches the receiver
# closes its new socket again.
SEND_FLAGS="--stack quic" send refused-quic "$WORK/small.bin"
[ "$RC" = 69 ] || fail "QUIC alone while the receiver's UDP sends are refused: exit $RC: $(cat "$WORK/refused-quic.err")"
drop
rm -f "$SEND_CFG/stacks"
SEND_FLAGS="--stack quic" send after-refused "$WORK/small.bin"
[ "$RC" = 0 ] && [ "$STACK" = "QUIC" ] || fail "after the receiver's UDP sends were refused: exit $RC over '$STACK': $(cat "$WORK/after-refused.err")"
grep -q "was closed under the listener; listening again" "$WORK/recv.err" || fail "the receiver did not say it listened again: $(tail -3 "$WORK/recv.err")"
# Each packet refused during the block closes the new socket again: said once, then only at
# 2, 4, 8… closes in a row.
first_warnings=$(grep -c "was closed under the listener" "$WORK/recv.err" || true)
[ "$first_warnings" = 1 ] || fail "the receiver repeated its warning for every socket the block closed: $first_warnings times"
ok "the receiver's UDP sends refused for a while: TCP+TLS then, and QUIC again after ($(grep -c "listening again" "$WORK/recv.err") warnings)"

# 3e. A dual-stack name whose IPv6 UDP is dropped.
ip netns exec "$B" nft add table inet qxrace
ip netns exec "$B" nft add chain inet qxrace input '{ type filter hook input priority 0; policy accept; }'
ip netns exec "$B" nft add rule inet qxrace input meta nfproto ipv6 udp dport "{ $PORT, $STREAM_PORT }" drop
# name-send NAME: --stack quic -v to receiver.qxrace; sets RC and SECONDS_TAKEN.
name_send() {
    local started
    started=$(now)
    RC=0
    ip netns exec "$A" "$QXFER" send --config-dir "$SEND_CFG" "$WORK/small.bin" "receiver.qxrace:$PORT" --fingerprint "$RECV_FP" --stack quic -v \
        >"$WORK/$1.out" 2>"$WORK/$1.err" </dev/null || RC=$?
    SECONDS_TAKEN=$(since "$started")
}
ticket_address() { awk -v key="receiver.qxrace:$PORT" '$1 == key { for (i = 5; i <= NF; i++) if ($i ~ /^via=/) print substr($i, 5) }' "$SEND_CFG/session-tickets"; }
name_send name-first
[ "$RC" = 0 ] || fail "dual-stack name, first send: exit $RC: $(cat "$WORK/name-first.err")"
[ "$(ticket_address)" = "$ADDR" ] || fail "dual-stack name: the ticket did not keep the address it came over: '$(ticket_address)'"
name_send name-known
[ "$RC" = 0 ] || fail "dual-stack name, known receiver: exit $RC: $(cat "$WORK/name-known.err")"
grep -m1 "QUIC handshake with receiver.qxrace" "$WORK/name-known.err" | grep -qF "$ADDR" && grep -q "the receiver took the early data" "$WORK/name-known.err" \
    || fail "dual-stack name, known receiver: early data did not go to the ticket's address first: $(grep qxfer.quic "$WORK/name-known.err")"
cmp -s "$WORK/small.bin" "$WORK/in/small.bin" || fail "dual-stack name, known receiver: the received file differs"
ok "dual-stack name, IPv6 UDP dropped: early data to the ticket's IPv4 address, taken, in $SECONDS_TAKEN s"
# The ticket's address silent since (as if it had come over IPv6).
sed -i "s/via=$ADDR\$/via=fd98:10::2/" "$SEND_CFG/session-tickets"
[ "$(ticket_address)" = fd98:10::2 ] || fail "dual-stack name: could not point the ticket at IPv6: $(cat "$SEND_CFG/session-tickets")"
head -c 3000 /dev/urandom >"$WORK/small.bin"
name_send name-silent
[ "$RC" = 0 ] || fail "dual-stack name, the ticket's address silent: exit $RC: $(cat "$WORK/name-silent.err")"
grep -q "QUIC with early data could not reach receiver.qxrace:$PORT (no answer from .* within 1.0 seconds to early data); connecting again without early data" "$WORK/name-silent.err" \
    || fail "dual-stack name, the ticket's address silent: $(cat "$WORK/name-silent.err")"
cmp -s "$WORK/small.bin" "$WORK/in/small.bin" || fail "dual-stack name, the ticket's address silent: the received file differs"
below "$SECONDS_TAKEN" 4 || fail "dual-stack name, the ticket's address silent: took $SECONDS_TAKEN s"
ok "dual-stack name, the ticket's address silent: early data unanswered for 1 s, then the address race, in $SECONDS_TAKEN s"
# The same for a stream: its hello and first frame go early, and an unanswered attempt starts
# the stream again from that first frame (an IVF file read from standard input, which cannot be
# read twice).
# srecv-start: `stream recv` serves one sender, then exits.
srecv_start() {
    ip netns exec "$B" "$QXFER" stream recv --config-dir "$RECV_CFG" --port "$STREAM_PORT" --output "$WORK/in/stream.ivf" \
        >"$WORK/srecv.out" 2>"$WORK/srecv.err" </dev/null &
    SRECV_PID=$!
    sleep 1
}
stream_ticket_address() { awk -v key="receiver.qxrace:$STREAM_PORT" '$1 == key { for (i = 5; i <= NF; i++) if ($i ~ /^via=/) print substr($i, 5) }' "$SEND_CFG/session-tickets"; }
# stream-name-send NAME: --stack quic, 30 frames of an IVF file on standard input; sets RC and SECONDS_TAKEN.
stream_name_send() {
    local started
    started=$(now)
    RC=0
    ip netns exec "$A" "$QXFER" stream send --config-dir "$SEND_CFG" "receiver.qxrace:$STREAM_PORT" --fingerprint "$RECV_FP" --stack quic \
        --mode reliable --input - -v <"$WORK/frames.ivf" >"$WORK/$1.out" 2>"$WORK/$1.err" || RC=$?
    SECONDS_TAKEN=$(since "$started")
}
python3 - "$WORK/frames.ivf" <<'PY'
import os, struct, sys
frames = [os.urandom(2000 + 97 * i) for i in range(30)]
with open(sys.argv[1], "wb") as out:
    out.write(b"DKIF" + struct.pack("<HH4sHHIIII", 0, 32, b"VP80", 64, 48, 30, 1, len(frames), 0))
    for i, frame in enumerate(frames):
        out.write(struct.pack("<IQ", len(frame), i) + frame)
PY
srecv_start
stream_name_send stream-first
[ "$RC" = 0 ] || fail "dual-stack name, first stream: exit $RC: $(cat "$WORK/stream-first.err")"
[ "$(stream_ticket_address)" = "$ADDR" ] || fail "dual-stack name, stream: the ticket did not keep the address it came over: '$(stream_ticket_address)'"
sed -i "/^receiver.qxrace:$STREAM_PORT /s/via=$ADDR\$/via=fd98:10::2/" "$SEND_CFG/session-tickets"
wait "$SRECV_PID" 2>/dev/null || true
srecv_start
stream_name_send stream-silent
[ "$RC" = 0 ] || fail "dual-stack name, stream, the ticket's address silent: exit $RC: $(cat "$WORK/stream-silent.err")"
grep -q "QUIC with early data could not reach receiver.qxrace:$STREAM_PORT (no answer from .* within 1.0 seconds to early data); connecting again without early data" "$WORK/stream-silent.err" \
    || fail "dual-stack name, stream, the ticket's address silent: $(cat "$WORK/stream-silent.err")"
grep -q "30 frames sent, 30 on time" "$WORK/stream-silent.out" || fail "dual-stack name, stream: not every frame arrived: $(cat "$WORK/stream-silent.out")"
cmp -s "$WORK/frames.ivf" "$WORK/in/stream.ivf" || fail "dual-stack name, stream: the received IVF differs from the one sent"
below "$SECONDS_TAKEN" 5 || fail "dual-stack name, stream, the ticket's address silent: took $SECONDS_TAKEN s"
ok "dual-stack name, the ticket's address silent: the stream started again without early data, all 30 frames, in $SECONDS_TAKEN s"
kill -9 "$SRECV_PID" 2>/dev/null || true; wait "$SRECV_PID" 2>/dev/null || true; SRECV_PID=
drop

# 4. Nothing listening.
recv_stop
send closed
[ "$RC" = 69 ] || fail "closed port: exit $RC, expected 69: $(cat "$WORK/closed.err")"
grep -q "nothing listens on $ADDR:$PORT, neither TCP nor UDP" "$WORK/closed.err" || fail "closed port: $(cat "$WORK/closed.err")"
below "$SECONDS_TAKEN" 3 || fail "closed port: the error took $SECONDS_TAKEN s"
ok "closed port: '$(tail -1 "$WORK/closed.err")' in $SECONDS_TAKEN s"

# 5. Both dropped.
recv_start
drop udp tcp
send dropped
[ "$RC" = 69 ] || fail "both dropped: exit $RC, expected 69: $(cat "$WORK/dropped.err")"
grep -q "QUIC" "$WORK/dropped.err" && grep -q "TCP+TLS" "$WORK/dropped.err" || fail "both dropped: the error names both stacks: $(cat "$WORK/dropped.err")"
below "$SECONDS_TAKEN" 14 || fail "both dropped: the error took $SECONDS_TAKEN s (connect timeout 10 s)"
ok "both dropped: '$(tail -1 "$WORK/dropped.err")' in $SECONDS_TAKEN s"
echo "race: all passed"
