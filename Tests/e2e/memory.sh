#!/usr/bin/env bash
# `qxfer recv` in a control group limited to 1 GiB (as a container or a systemd unit with
# MemoryMax= would run it), flooded over TCP+TLS by 450 connections (TLS_CONNECTIONS) that each
# announce a 16 MiB message, send 15 MiB of it and hold still. A receiver that buffered each
# message whole until it ended was killed by 48 of them; one whose connections each read 1 MiB
# ahead of a message waiting for the allowance, and held that twice, by about 430. The receiver
# sizes its allowance for messages in progress from the group's limit (an eighth: 128 MiB), and
# its connections share a read-ahead budget (a sixteenth: 64 MiB), 64 KiB each past it; the
# rest wait unread. Checks that it lives, that the group's peak stays under half the limit, and
# that a real send goes through after.
# Then a fresh receiver in a group limited to 256 MiB, flooded over QUIC by 40 connections that
# each send 8 MiB on two streams it never reads: a bulk listener's windows would let each hold
# 8 MiB (32 MiB from a remote peer), which killed the build before; a listener's connections
# now share one budget of windows (an eighth of memory, at least 64 MiB), 256 KiB each past it.
# Needs root and the cgroup memory controller (v1 or v2); says why it skips otherwise.
#
#   Tests/e2e/memory.sh        (QXFER=path picks the binary)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QXFER=${QXFER:-$ROOT/.build/debug/qxfer}
[ -x "$QXFER" ] || { echo "memory: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "memory: skipped: needs root (a control group of its own)"; exit 0; }

WORK=$(mktemp -d /tmp/qxfer-memory.XXXXXX)
GROUP=
RECV_PID=
cleanup() {
    [ -n "$RECV_PID" ] && kill -9 "$RECV_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "$GROUP" ] && rmdir "$GROUP" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "memory: FAIL: $*" >&2; exit 1; }

# make_group NAME LIMIT: a memory control group ($GROUP) and the file holding its peak ($PEAK_FILE).
make_group() {
    if [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then  # v1
        GROUP=/sys/fs/cgroup/memory/$1
        mkdir "$GROUP"
        echo "$2" >"$GROUP/memory.limit_in_bytes"
        PEAK_FILE=memory.max_usage_in_bytes
    elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then  # v2
        grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control
        GROUP=/sys/fs/cgroup/$1
        mkdir "$GROUP"
        echo "$2" >"$GROUP/memory.max"
        PEAK_FILE=memory.peak
    else
        echo "memory: skipped: no cgroup memory controller here"
        exit 0
    fi
}

# start_recv: `qxfer recv` on a new $PORT, charged to $GROUP (the shell joins it, then becomes
# the receiver), into $WORK/target.
start_recv() {
    PORT=$((20000 + RANDOM % 20000))
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$GROUP" \
        "$QXFER" recv --config-dir "$WORK/cfg-recv" --no-advertise --yes --port "$PORT" --host 127.0.0.1 --dir "$WORK/target" \
        >"$WORK/recv.out" 2>"$WORK/recv.err" </dev/null &
    RECV_PID=$!
    for _ in $(seq 1 100); do
        grep -q "on port $PORT" "$WORK/recv.out" 2>/dev/null && break
        kill -0 "$RECV_PID" 2>/dev/null || fail "recv exited: $(cat "$WORK/recv.err")"
        sleep 0.1
    done
    grep -q "on port $PORT" "$WORK/recv.out" || fail "recv did not start"
}

# stop_recv: ends the receiver and removes its group.
stop_recv() {
    kill -9 "$RECV_PID" 2>/dev/null || true
    wait "$RECV_PID" 2>/dev/null || true
    RECV_PID=
    for _ in $(seq 1 50); do rmdir "$GROUP" 2>/dev/null && break; sleep 0.1; done
    GROUP=
}

# check_survived FLOOD LIMIT: the receiver lived through FLOOD, its group's peak under half LIMIT.
check_survived() {
    kill -0 "$RECV_PID" 2>/dev/null || fail "recv died under $1 in a $(($2 >> 20)) MiB group (killed for memory?): $(tail -3 "$WORK/recv.err")"
    local peak
    peak=$(cat "$GROUP/$PEAK_FILE")
    echo "memory: the receiver's group peaked at $((peak >> 20)) MiB of its $(($2 >> 20)) MiB"
    [ "$peak" -lt $(($2 / 2)) ] || fail "the receiver's group peaked at $((peak >> 20)) MiB under $1: its memory was not bounded"
}

# check_send STACK: a real send after the flood.
check_send() {
    echo "still serving over $1" >"$WORK/real-$1.txt"
    timeout 60 "$QXFER" send --config-dir "$WORK/cfg-send" --stack "$1" "$WORK/real-$1.txt" "127.0.0.1:$PORT" >"$WORK/send.out" 2>&1 </dev/null \
        || fail "a real send over $1 after the flood: $(cat "$WORK/send.out")"
    cmp -s "$WORK/real-$1.txt" "$WORK/target/real-$1.txt" || fail "the real file did not arrive over $1 after the flood"
}

LIMIT=$((1 << 30))
TLS_CONNECTIONS=${TLS_CONNECTIONS:-450}
make_group "qxfer-memory-$$" "$LIMIT"
mkdir -p "$WORK/target"
start_recv

python3 - "$PORT" "$TLS_CONNECTIONS" <<'EOF' || fail "the flooding client failed"
import socket, ssl, struct, sys, threading, time
port, connections = int(sys.argv[1]), int(sys.argv[2])
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
context.set_alpn_protocols(["qxfer/1"])
held, lock, chunk = [], threading.Lock(), b"\0" * (1 << 20)
def flood():
    s = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="receiver")
    with lock: held.append(s)
    s.settimeout(3)
    s.sendall(struct.pack(">II", 1, 16 << 20))  # a TLV header: type 1, a 16 MiB body
    try:
        for _ in range(15): s.sendall(chunk)
    except (socket.timeout, OSError):
        pass  # held back: the receiver does not read a message it has no room for
threads = [threading.Thread(target=flood) for _ in range(connections)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(2)
print(f"memory: {len(held)} connections each sent up to 15 MiB of a 16 MiB message")
for s in held: s.close()
EOF
check_survived "$TLS_CONNECTIONS long messages" "$LIMIT"

check_send tls
stop_recv

# QUIC: many connections, each filling its receive window with data the receiver never reads.
QUIC_LIMIT=$((256 << 20))
make_group "qxfer-memory-quic-$$" "$QUIC_LIMIT"
start_recv
python3 - "$PORT" <<'EOF' || fail "the flooding QUIC client failed"
import asyncio, os, ssl, sys
from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
port = int(sys.argv[1])
async def flood(clients):
    configuration = QuicConfiguration(is_client=True, alpn_protocols=["qxfer/1"], verify_mode=ssl.CERT_NONE)
    context = connect("127.0.0.1", port, configuration=configuration, wait_connected=True)
    client = await context.__aenter__()
    clients.append((context, client))  # the context too: collected, it would close the connection
    quic = client._quic
    for _ in range(2):  # unidirectional streams, which the receiver never reads: 8 MiB in all,
        stream = quic.get_next_available_stream_id(is_unidirectional=True)  # a loopback peer's whole window before
        quic.send_stream_data(stream, b"\0" * (4 << 20))
async def main():
    clients = []
    await asyncio.gather(*(flood(clients) for _ in range(40)))
    # aioquic sends what its congestion window allows when asked: ask again and again, for 8 s.
    for _ in range(400):
        for _, client in clients: client.transmit()
        await asyncio.sleep(0.02)
    print(f"memory: {len(clients)} QUIC connections each sent up to 8 MiB on streams nobody reads", flush=True)
    os._exit(0)  # no graceful close of 40 connections: they end at the receiver's idle timeout
asyncio.run(main())
EOF
check_survived "40 QUIC connections filling their windows" "$QUIC_LIMIT"
check_send quic
echo "memory: all checks passed"
