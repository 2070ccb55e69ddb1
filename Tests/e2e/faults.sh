#!/usr/bin/env bash
# Fault injection for `qxfer send` / `qxfer recv`, two processes across two network namespaces
# joined by veth, over QUIC and TCP+TLS, with figures:
#
#   sudo Tests/e2e/faults.sh        (root: namespaces; QXFER=path picks the binary)
#
#  1. kill -9 of either side at random instants (stacks alternate): never a partial under the
#     final name, every resumed file identical; bytes resumed against bytes re-sent.
#  2. the link cut for some seconds mid-transfer: QUIC carries on; TCP+TLS carries on, and
#     when its connection is also reset during the cut the sender reconnects and resumes by
#     itself while the receiver hands the stalled connection's partial to the new one.
#  3. a slow reader (the receiver stopped and continued in bursts): the sender slows down and
#     both sides' resident memory stays flat.
#  4. many concurrent senders to one receiver: each completes or is refused clearly; the
#     receiver's descriptors return to their idle count.
#  5. a UDP flood at the QUIC port and half-open TCP connections at the TLS port during a real
#     transfer: it completes; its rate beside an unflooded run.
#  6. the disk filling up during a transfer: exit 74, partial kept, resumed once space is freed.
#
# Sizes (environment): FAULTS_BIG_MIB (1024), FAULTS_KILLS per side (20), FAULTS_CUT_SECONDS (5),
# FAULTS_SLOW_MIB (256), FAULTS_SENDERS (200), FAULTS_FLOOD_MIB (128), FAULTS_RSS_LIMIT_MIB (64).
# Everything it creates (processes, namespaces, mounts, files) is removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
BIG_MIB=${FAULTS_BIG_MIB:-1024}
KILLS=${FAULTS_KILLS:-20}
CUT_SECONDS=${FAULTS_CUT_SECONDS:-5}
SLOW_MIB=${FAULTS_SLOW_MIB:-256}
SENDERS=${FAULTS_SENDERS:-200}
FLOOD_MIB=${FAULTS_FLOOD_MIB:-128}
RSS_LIMIT_MIB=${FAULTS_RSS_LIMIT_MIB:-64}
[ -x "$QXFER" ] || { echo "faults: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "faults: must run as root (network namespaces)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "faults: python3 is needed for the floods" >&2; exit 1; }

WORK=$(mktemp -d /tmp/qxfer-faults.XXXXXX)
NS=qxf$$
A=${NS}a B=${NS}b
ADDR=10.98.9.2
PORT=7447
PIDS=()
MOUNTS=()
STARTED=$(date +%s)
cleanup() {
    for pid in "${PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for mount in "${MOUNTS[@]}"; do umount "$mount" 2>/dev/null || true; done
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    [ -n "${FAULTS_KEEP:-}" ] && echo "faults: kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "faults: FAIL: $*" >&2; exit 1; }
# FAULTS_ONLY="2 5" runs only those sections (the baseline always runs).
want() { [ -z "${FAULTS_ONLY:-}" ] || [[ " $FAULTS_ONLY " == *" $1 "* ]]; }
ok() { echo "faults: ok: $*"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.1f MB/s", (s > 0 ? b / s / 1e6 : 0) }'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
# Resident memory without the pages of qxfer's own executable: `make test` runs the debug
# build, whose touched code (19 MiB for a QUIC receiver) is not memory a transfer holds and is
# larger than a release build's; bench/transfer.sh holds the release build's whole RSS to the
# brief's 64 MiB.
rss_without_code_kib() {
    local exe; exe=$(readlink "/proc/$1/exe" 2>/dev/null) || { echo 0; return; }
    awk -v exe="$exe" '/^[0-9a-f]+-[0-9a-f]+ / { code = ($6 == exe) } /^Rss:/ { all += $2; if (code) mine += $2 }
        END { print all - mine }' "/proc/$1/smaps" 2>/dev/null || echo 0
}
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
fd_list() { for fd in /proc/$1/fd/*; do readlink "$fd"; done 2>/dev/null | sed 's/[0-9]\{3,\}/N/g' | sort; }
hash_of() { xxhsum -H2 "$1" | cut -d' ' -f1; }
summary_of() { grep '"event":"summary"' "$1" | tail -1 | jq -r ".$2"; }

# --- Namespaces and fixtures ----------------------------------------------------------------
ip netns add "$A"; ip netns add "$B"
ip link add "${NS}va" type veth peer name "${NS}vb"
ip link set "${NS}va" netns "$A"; ip link set "${NS}vb" netns "$B"
ip -n "$A" addr add 10.98.9.1/24 dev "${NS}va"; ip -n "$B" addr add "$ADDR/24" dev "${NS}vb"
for n in a b; do ip -n "${NS}$n" link set lo up; ip -n "${NS}$n" link set "${NS}v$n" up; done

SRC=$WORK/src
mkdir -p "$SRC"
head -c $((BIG_MIB << 20)) /dev/urandom >"$SRC/big.bin"
BIG_HASH=$(hash_of "$SRC/big.bin")
head -c $((SLOW_MIB << 20)) /dev/urandom >"$WORK/slow.bin"   # for the slow reader and the full disk
RECV_CFG=$WORK/cfg-recv SEND_CFG=$WORK/cfg-send
RECV_FP=$("$QXFER" id --config-dir "$RECV_CFG")

# recv_start NAME DIR [args]: a receiver in namespace B on $PORT; sets RECV_PID.
recv_start() {
    local name=$1 dir=$2; shift 2
    mkdir -p "$dir"
    : >"$WORK/$name.out"  # an earlier run's banner must not pass for this one's (the job truncates it late)
    ip netns exec "$B" "$QXFER" recv --config-dir "$RECV_CFG" --no-advertise --dir "$dir" --yes --port "$PORT" "$@" \
        >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null &
    RECV_PID=$!; PIDS+=("$RECV_PID")
    for _ in $(seq 1 100); do
        grep -q 'on port' "$WORK/$name.out" 2>/dev/null && return 0
        kill -0 "$RECV_PID" 2>/dev/null || fail "$name: recv exited: $(cat "$WORK/$name.err")"
        sleep 0.1
    done
    fail "$name: recv did not start"
}
recv_stop() { kill -9 "$RECV_PID" 2>/dev/null || true; wait "$RECV_PID" 2>/dev/null || true; }

# send_start NAME STACK FILE [args]: a sender in namespace A, in the background; sets SEND_PID.
send_start() {
    local name=$1 stack=$2 file=$3; shift 3
    ip netns exec "$A" "$QXFER" send --config-dir "$SEND_CFG" "$file" "$ADDR:$PORT" --stack "$stack" \
        --fingerprint "$RECV_FP" --json "$@" >"$WORK/$name.sout" 2>"$WORK/$name.serr" </dev/null &
    SEND_PID=$!; PIDS+=("$SEND_PID")
}
send_wait() { SEND_RC=0; wait "$SEND_PID" 2>/dev/null || SEND_RC=$?; }

wait_for_file() { for _ in $(seq 1 1000); do [ -e "$1" ] && return 0; sleep 0.01; done; fail "$1 never appeared"; }
size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }
# The partial's size once the receiver has written what was still in flight (it keeps running
# when the sender is killed).
settled_size() {
    local previous=-1 current
    for _ in $(seq 1 50); do
        current=$(size_of "$1")
        [ "$current" = "$previous" ] && break
        previous=$current; sleep 0.2
    done
    echo "$current"
}

# --- 0. Baseline: one undisturbed transfer per stack --------------------------------------------
declare -A BASE_SECONDS
for stack in quic tls; do
    dst=$WORK/dst-base-$stack
    recv_start "base-r-$stack" "$dst" --once
    t0=$(now); send_start "base-$stack" $stack "$SRC/big.bin"; send_wait
    BASE_SECONDS[$stack]=$(since "$t0")
    [ "$SEND_RC" = 0 ] || fail "baseline $stack: exit $SEND_RC: $(cat "$WORK/base-$stack.serr")"
    recv_stop
    [ "$(hash_of "$dst/big.bin")" = "$BIG_HASH" ] || fail "baseline $stack: the file differs"
    ok "baseline $stack: $BIG_MIB MiB in ${BASE_SECONDS[$stack]} s ($(rate $((BIG_MIB << 20)) "${BASE_SECONDS[$stack]}"))"
    rm -rf "$dst"
done

# A random instant inside a transfer of the given stack (10 % to 90 % of its baseline).
random_instant() { awk -v r=$RANDOM -v t="${BASE_SECONDS[$1]}" 'BEGIN { printf "%.2f", t * (0.1 + 0.8 * (r % 1000) / 1000) }'; }

# --- 1. kill -9 at random instants, each side, stacks alternating -----------------------------
if want 1; then
    # Receiver killed: it is restarted on the same port and the *same* sender reconnects and
    # resumes by itself. Sender killed: a new sender resumes; the receiver keeps running, so over
    # QUIC the dead sender's connection still looks alive to it and the new one takes it over.
    dst=$WORK/dst-kill
    declare -A RESUMED RESENT COMPLETED_BEFORE
    for side in receiver sender; do
        RESUMED[$side]=0; RESENT[$side]=0; COMPLETED_BEFORE[$side]=0
        [ $side = sender ] && recv_start kill-r "$dst"
        for round in $(seq 1 "$KILLS"); do
            stack=$([ $((round % 2)) = 0 ] && echo tls || echo quic)
            [ $side = receiver ] && recv_start kill-r "$dst"
            send_start "kill-s" $stack "$SRC/big.bin"
            wait_for_file "$dst/.big.bin.qxfer-partial"
            sleep "$(random_instant $stack)"
            if [ $side = receiver ]; then recv_stop; else kill -9 "$SEND_PID" 2>/dev/null || true; send_wait; fi
            if [ -e "$dst/big.bin" ]; then
                # Finished before the kill: the final name must hold the whole, verified file.
                [ "$(hash_of "$dst/big.bin")" = "$BIG_HASH" ] || fail "kill -9 of the $side (round $round, $stack): the final name holds a different file"
                COMPLETED_BEFORE[$side]=$((COMPLETED_BEFORE[$side] + 1))
                [ $side = receiver ] && { send_wait; }
                rm -f "$dst/big.bin"
                continue
            fi
            written=$(settled_size "$dst/.big.bin.qxfer-partial")
            if [ $side = receiver ]; then
                recv_start kill-r "$dst" --once   # the running sender finds it again
                send_wait
                recv_stop
                resume=kill-s
            else
                send_start "kill-resume" $stack "$SRC/big.bin"; send_wait
                resume=kill-resume
            fi
            [ "$SEND_RC" = 0 ] || fail "resume after kill -9 of the $side (round $round, $stack): exit $SEND_RC: $(cat "$WORK/$resume.serr")"
            [ "$(hash_of "$dst/big.bin")" = "$BIG_HASH" ] || fail "resume after kill -9 of the $side (round $round, $stack): the file differs"
            resumed=$(summary_of "$WORK/$resume.sout" resumed_bytes)
            [ "$resumed" -le "$written" ] || fail "round $round: resumed $resumed bytes of only $written written"
            RESUMED[$side]=$((RESUMED[$side] + resumed))
            RESENT[$side]=$((RESENT[$side] + written - resumed))
            [ -z "$(find "$dst" -name '*.qxfer-*')" ] || fail "round $round: partial or journal left after completion"
            rm -f "$dst/big.bin"
        done
        [ $side = sender ] && recv_stop
        ok "$KILLS kill -9 of the $side (QUIC and TLS alternating): never a partial under the final name, every resumed file identical;" \
            "$(mib ${RESUMED[$side]}) resumed, $(mib ${RESENT[$side]}) written before the kill but re-sent (past the last checkpoint)," \
            "${COMPLETED_BEFORE[$side]} rounds had finished before their kill"
    done
fi

# --- 2. The link cut mid-transfer ----------------------------------------------------------
if want 2; then
    # cut_link SECONDS [reset]: takes the veth down (both ends lose carrier; packets are dropped
    # and the route is gone), optionally resets the sender's TCP connection meanwhile (what a NAT
    # or firewall that dropped the flow, or the sender's own stack giving up, does), then up.
    cut_link() {
        ip -n "$A" link set "${NS}va" down
        [ "${2:-}" = reset ] && { sleep 0.5; ip netns exec "$A" ss -K dst "$ADDR" dport = "$PORT" >/dev/null 2>&1 || true; }
        sleep "$1"
        ip -n "$A" link set "${NS}va" up
    }
    for mode in quic tls tls-reset; do
        stack=${mode%-reset}
        dst=$WORK/dst-cut-$mode
        recv_start "cut-r-$mode" "$dst" --once
        t0=$(now); send_start "cut-$mode" $stack "$SRC/big.bin"
        wait_for_file "$dst/.big.bin.qxfer-partial"
        sleep "$(awk -v t="${BASE_SECONDS[$stack]}" 'BEGIN { printf "%.2f", t * 0.3 }')"
        [ -e "$dst/big.bin" ] && fail "cut $mode: the transfer finished before the cut (too small a file)"
        cut_link "$CUT_SECONDS" "$([ "$mode" = tls-reset ] && echo reset || true)"
        send_wait
        elapsed=$(since "$t0")
        [ "$SEND_RC" = 0 ] || fail "cut $mode: exit $SEND_RC: $(cat "$WORK/cut-$mode.serr")"
        RECV_RC=0; wait "$RECV_PID" || RECV_RC=$?
        [ "$RECV_RC" = 0 ] || fail "cut $mode: the receiver failed: $(cat "$WORK/cut-r-$mode.err")"
        [ "$(hash_of "$dst/big.bin")" = "$BIG_HASH" ] || fail "cut $mode: the file differs"
        reconnects=$(summary_of "$WORK/cut-$mode.sout" reconnects)
        resumed=$(summary_of "$WORK/cut-$mode.sout" resumed_bytes)
        if [ "$mode" = tls-reset ]; then
            [ "$reconnects" -ge 1 ] && [ "$resumed" -gt 0 ] || fail "cut $mode: reconnects $reconnects, resumed $resumed"
            grep -q "continues on a new connection" "$WORK/cut-r-$mode.err" || fail "cut $mode: the stalled connection was not taken over: $(cat "$WORK/cut-r-$mode.err")"
            ok "link cut ${CUT_SECONDS} s with the TCP connection reset, TLS: the sender reconnected $reconnects time(s) by itself," \
                "the new connection took over the stalled one on the receiver and resumed $(mib "$resumed"); identical, ${elapsed} s (baseline ${BASE_SECONDS[$stack]} s)"
        else
            [ "$reconnects" = 0 ] || fail "cut $mode: the connection did not survive ($reconnects reconnects: $(grep reconnecting "$WORK/cut-$mode.sout" | jq -r .reason | sort | uniq -c | tr '\n' ' '))"
            ok "link cut ${CUT_SECONDS} s, $stack: the same connection carried on when the link returned; identical, ${elapsed} s (baseline ${BASE_SECONDS[$stack]} s)"
        fi
        rm -rf "$dst"
    done
fi

# --- 3. A slow reader: the receiver stopped and continued in bursts ----------------------------
if want 3; then
    # (No cgroup io.max here, so not a slow disk but the honest equivalent for the connection: a
    # receiver that consumes at 1/5 of its speed. SIGSTOP 200 ms, SIGCONT 50 ms.)
    for stack in quic tls; do
        dst=$WORK/dst-slow-$stack
        recv_start "slow-r-$stack" "$dst" --once
        t0=$(now); send_start "slow-$stack" $stack "$WORK/slow.bin"
        : >"$WORK/rss-$stack"
        while kill -0 "$SEND_PID" 2>/dev/null; do
            kill -STOP "$RECV_PID" 2>/dev/null || true
            sleep 0.2
            echo "$(rss_without_code_kib "$SEND_PID") $(rss_without_code_kib "$RECV_PID") $(rss_kib "$SEND_PID") $(rss_kib "$RECV_PID")" >>"$WORK/rss-$stack"
            kill -CONT "$RECV_PID" 2>/dev/null || true
            sleep 0.05
        done
        send_wait
        elapsed=$(since "$t0")
        [ "$SEND_RC" = 0 ] || fail "slow reader $stack: exit $SEND_RC: $(cat "$WORK/slow-$stack.serr")"
        RECV_RC=0; wait "$RECV_PID" || RECV_RC=$?
        cmp -s "$WORK/slow.bin" "$dst/slow.bin" || fail "slow reader $stack: the file differs"
        read -r smin smax rmin rmax samples stotal rtotal < <(awk 'NF == 4 && $1 > 0 && $2 > 0 { if (!n++) { a = b = $1; c = d = $2 } if ($1 < a) a = $1; if ($1 > b) b = $1; if ($2 < c) c = $2; if ($2 > d) d = $2
                if ($3 > e) e = $3; if ($4 > f) f = $4 }
            END { printf "%d %d %d %d %d %d %d\n", a / 1024, b / 1024, c / 1024, d / 1024, n, e / 1024, f / 1024 }' "$WORK/rss-$stack")
        slow_rate=$(rate $((SLOW_MIB << 20)) "$elapsed")
        full_rate=$(rate $((BIG_MIB << 20)) "${BASE_SECONDS[$stack]}")
        ok "slow reader, $stack: $SLOW_MIB MiB at $slow_rate (unthrottled $full_rate); resident memory without qxfer's own code over $samples samples:" \
            "sender $smin-$smax MiB, receiver $rmin-$rmax MiB (with it, peaks $stotal and $rtotal MiB)"
        [ "$smax" -lt "$RSS_LIMIT_MIB" ] && [ "$rmax" -lt "$RSS_LIMIT_MIB" ] || fail "slow reader $stack: resident memory (without qxfer's own code) above $RSS_LIMIT_MIB MiB"
        rm -rf "$dst"
    done
fi

# --- 4. Many concurrent senders to one receiver -------------------------------------------------
if want 4; then
    dst=$WORK/dst-many
    recv_start many-r "$dst"
    # One transfer per stack first, so what the runtime sets up once (libdispatch's timer
    # descriptor on the first Task.sleep, thread pools) counts in the idle level.
    head -c 1000 /dev/urandom >"$WORK/warm-up.bin"
    for stack in quic tls; do
        send_start "warm-up-$stack" $stack "$WORK/warm-up.bin"; send_wait
        [ "$SEND_RC" = 0 ] || fail "warm-up $stack: exit $SEND_RC: $(cat "$WORK/warm-up-$stack.serr")"
        rm -f "$dst/warm-up.bin"
    done
    sleep 6   # past the receiver's 5 s wait for the sender to close
    idle_fds=$(fd_count "$RECV_PID"); fd_list "$RECV_PID" >"$WORK/fds-idle"
    idle_rss=$(rss_kib "$RECV_PID")
    mkdir -p "$WORK/many"
    SENDER_PIDS=()
    for i in $(seq 1 "$SENDERS"); do
        head -c $((1000 + i * 37)) /dev/urandom >"$WORK/many/file-$i.bin"
        stack=$([ $((i % 2)) = 0 ] && echo tls || echo quic)
        ip netns exec "$A" "$QXFER" send --config-dir "$SEND_CFG" "$WORK/many/file-$i.bin" "$ADDR:$PORT" --stack $stack \
            --fingerprint "$RECV_FP" >"$WORK/many/$i.out" 2>"$WORK/many/$i.err" </dev/null &
        SENDER_PIDS+=("$!"); PIDS+=("$!")
    done
    peak_fds=0 peak_rss=0
    while :; do
        running=0
        for pid in "${SENDER_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && running=$((running + 1)); done
        fds=$(fd_count "$RECV_PID"); kib=$(rss_kib "$RECV_PID")
        [ "$fds" -gt "$peak_fds" ] && peak_fds=$fds
        [ "${kib:-0}" -gt "$peak_rss" ] && peak_rss=$kib
        [ "$running" = 0 ] && break
        sleep 0.2
    done
    completed=0 refused=0
    declare -A REFUSALS
    for i in $(seq 1 "$SENDERS"); do
        rc=0; wait "${SENDER_PIDS[$((i - 1))]}" || rc=$?
        if [ "$rc" = 0 ]; then
            cmp -s "$WORK/many/file-$i.bin" "$dst/file-$i.bin" || fail "sender $i reported success but the file differs"
            completed=$((completed + 1))
        else
            lines=$(wc -l <"$WORK/many/$i.err")
            last=$(tail -1 "$WORK/many/$i.err")
            [ "$lines" -ge 1 ] && [[ $last == qxfer:* ]] || fail "sender $i: exit $rc without a one-line message: $(cat "$WORK/many/$i.err")"
            refused=$((refused + 1))
            REFUSALS["$rc: ${last:0:100}"]=1
        fi
    done
    # 200 QUIC handshakes at once overflow the receiver's socket buffer (hundreds of datagrams
    # dropped on this VM), and a sender's CONNECTION_CLOSE that is lost is never sent again: that
    # connection waits out the receiver's 5 s for the close, then its closing period, stretched
    # by the load's round trips (finished exchanges seen held 10-25 s after the senders exited,
    # with the build before too). Bounded by QUIC's 30 s idle timeout; a leak stays for good.
    settled=0
    for _ in $(seq 1 300); do [ "$(fd_count "$RECV_PID")" -le "$idle_fds" ] && break; sleep 0.2; settled=$((settled + 1)); done
    after_fds=$(fd_count "$RECV_PID")
    after_rss=$(rss_kib "$RECV_PID")
    kill -0 "$RECV_PID" 2>/dev/null || fail "the receiver died under $SENDERS senders: $(tail -3 "$WORK/many-r.err")"
    [ "$after_fds" -le "$idle_fds" ] || fail "the receiver holds $after_fds descriptors after the senders, $idle_fds when idle: $(fd_list "$RECV_PID" | diff "$WORK/fds-idle" - | tr '\n' ' ')"
    recv_stop
    ok "$SENDERS concurrent senders (QUIC and TLS alternating): $completed completed identical, $refused refused with an exit code and one line;" \
        "receiver descriptors idle $idle_fds, peak $peak_fds, after $after_fds (back to idle $((settled / 5)) s after the last sender); resident memory idle $((idle_rss / 1024)) MiB," \
        "peak $((peak_rss / 1024)) MiB, after $((after_rss / 1024)) MiB"
    for refusal in "${!REFUSALS[@]}"; do echo "faults:   refusal seen: exit $refusal"; done
fi

# udp_flood SECONDS: random datagrams of random sizes at the QUIC port, as fast as one process
# can, until SIGTERM or SECONDS; prints how many it sent and for how long.
udp_flood() {
    exec ip netns exec "$A" python3 - "$ADDR" "$PORT" "$1" <<'EOF'
import os, random, signal, socket, sys, time
address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = os.urandom(65536)
sent, began = 0, time.monotonic()
end = began + seconds
def report(*_):
    print(sent, "%.1f" % (time.monotonic() - began), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
while time.monotonic() < end:
    for _ in range(256):
        size = random.randint(1, 1400)
        start = random.randint(0, len(payload) - size)
        try:
            sock.sendto(payload[start:start + size], (address, port))
            sent += 1
        except OSError:
            pass
report()
EOF
}
# half_open COUNT SECONDS: COUNT TCP connections to the TLS port that never send a byte; prints
# how many connected and how many the receiver closed before the end.
half_open() {
    exec ip netns exec "$A" python3 - "$ADDR" "$PORT" "$1" "$2" <<'EOF'
import select, socket, sys, time
address, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((address, port))
        socks.append(s)
    except OSError:
        s.close()
end = time.monotonic() + seconds
closed = set()
while time.monotonic() < end and len(closed) < len(socks):
    readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.5)
    for s in readable:
        try:
            if not s.recv(1):
                closed.add(s)
        except OSError:
            closed.add(s)
print(len(socks), len(closed))
EOF
}

# --- 5. Floods during a real transfer ----------------------------------------------------------
if want 5; then
    head -c $((FLOOD_MIB << 20)) "$SRC/big.bin" >"$WORK/flood.bin"
    for stack in quic tls; do
        dst=$WORK/dst-flood-$stack
        recv_start "flood-r-$stack" "$dst"
        t0=$(now); send_start "quiet-$stack" $stack "$WORK/flood.bin"; send_wait
        quiet=$(since "$t0")
        [ "$SEND_RC" = 0 ] || fail "unflooded $stack: exit $SEND_RC: $(cat "$WORK/quiet-$stack.serr")"
        rm -f "$dst/flood.bin"
        # The datagrams last as long as the flooded transfer (at most 10 minutes); the half-open
        # connections 15 s, past the receiver's 10 s handshake timeout.
        udp_flood 600 >"$WORK/udp-$stack.count" & FLOOD_PID=$!; PIDS+=("$FLOOD_PID")
        half_open 300 15 >"$WORK/half-$stack.count" & HALF_PID=$!; PIDS+=("$HALF_PID")
        sleep 1
        t0=$(now); send_start "flooded-$stack" $stack "$WORK/flood.bin"; send_wait
        flooded=$(since "$t0")
        kill -TERM "$FLOOD_PID" 2>/dev/null || true
        wait "$FLOOD_PID" "$HALF_PID" || true
        [ "$SEND_RC" = 0 ] || fail "flooded $stack: exit $SEND_RC: $(cat "$WORK/flooded-$stack.serr")"
        cmp -s "$WORK/flood.bin" "$dst/flood.bin" || fail "flooded $stack: the file differs"
        kill -0 "$RECV_PID" 2>/dev/null || fail "the receiver died under the flood"
        read -r datagrams flood_seconds <"$WORK/udp-$stack.count"
        read -r opened dropped <"$WORK/half-$stack.count"
        [ "$dropped" = "$opened" ] || fail "floods, $stack: the receiver kept $((opened - dropped)) of $opened half-open connections past its handshake timeout"
        ok "floods, $stack: $FLOOD_MIB MiB at $(rate $((FLOOD_MIB << 20)) "$flooded") while flooded" \
            "(unflooded $(rate $((FLOOD_MIB << 20)) "$quiet")); $datagrams random datagrams at the QUIC port in $flood_seconds s" \
            "($(awk -v n="$datagrams" -v s="$flood_seconds" 'BEGIN { printf "%d", (s > 0 ? n / s : 0) }') per second)," \
            "$opened half-open TCP connections, all closed by the receiver within 15 s"
        recv_stop
        rm -rf "$dst"
    done
fi

# --- 6. The disk fills up mid-transfer ---------------------------------------------------------
if want 6; then
    disk=$WORK/disk; mkdir -p "$disk"
    mount -t tmpfs -o size=$((SLOW_MIB + 64))m tmpfs "$disk"; MOUNTS+=("$disk")
    recv_start full-r "$disk" --once
    send_start full-s tls "$WORK/slow.bin"
    wait_for_file "$disk/.slow.bin.qxfer-partial"
    for _ in $(seq 1 500); do [ "$(size_of "$disk/.slow.bin.qxfer-partial")" -gt $((SLOW_MIB << 18)) ] && break; sleep 0.01; done
    fallocate -l $((SLOW_MIB + 64))m "$disk/filler" 2>/dev/null || head -c $(((SLOW_MIB + 64) << 20)) /dev/zero >"$disk/filler" 2>/dev/null || true
    send_wait
    RECV_RC=0; wait "$RECV_PID" || RECV_RC=$?
    [ "$RECV_RC" = 74 ] || fail "disk full: the receiver exited $RECV_RC, expected 74: $(cat "$WORK/full-r.err")"
    [ "$SEND_RC" = 74 ] || fail "disk full: the sender exited $SEND_RC, expected 74: $(cat "$WORK/full-s.serr")"
    [ ! -e "$disk/slow.bin" ] && [ -e "$disk/.slow.bin.qxfer-partial" ] || fail "disk full: no resumable partial, or a final name"
    kept=$(size_of "$disk/.slow.bin.qxfer-partial")
    rm -f "$disk/filler"
    recv_start full-r2 "$disk" --once
    send_start full-s2 tls "$WORK/slow.bin"; send_wait
    [ "$SEND_RC" = 0 ] || fail "disk full, resume: exit $SEND_RC: $(cat "$WORK/full-s2.serr")"
    cmp -s "$WORK/slow.bin" "$disk/slow.bin" || fail "disk full, resume: the file differs"
    ok "disk full mid-transfer: both sides exit 74 ($(tail -1 "$WORK/full-s.serr")), partial of $(mib "$kept") kept;" \
        "after freeing space the same send resumed $(mib "$(summary_of "$WORK/full-s2.sout" resumed_bytes)") and finished identical"
fi

echo "faults: all fault-injection tests passed in $(( $(date +%s) - STARTED )) s"
