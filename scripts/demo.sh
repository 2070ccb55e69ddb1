#!/usr/bin/env bash
# The quick-start demo: `qxfer recv` and `qxfer send` on loopback, a 256 MiB file and a small
# folder over QUIC and then over TCP+TLS, each verified end to end; then the same file again,
# which the receiver already has (nothing moves). Everything lives in a temporary folder that
# is removed at the end; identities too (--config-dir), so ~/.config is not touched.
set -euo pipefail
QXFER=${QXFER:?set QXFER to the qxfer binary}
DEMO=$(mktemp -d /tmp/qxfer-demo.XXXXXX)
RECV_PID=
trap '[ -n "$RECV_PID" ] && kill "$RECV_PID" 2>/dev/null; rm -rf "$DEMO"' EXIT

mkdir -p "$DEMO/src/photos/2026" "$DEMO/received"
head -c $((256 << 20)) /dev/urandom >"$DEMO/src/video.bin"
echo "a note" >"$DEMO/src/photos/read me.txt"
head -c 100000 /dev/urandom >"$DEMO/src/photos/2026/ünïcode.jpg"

"$QXFER" recv --config-dir "$DEMO/receiver" --dir "$DEMO/received" --yes --port 0 --host 127.0.0.1 --no-advertise >"$DEMO/recv.log" 2>&1 &
RECV_PID=$!
for _ in $(seq 1 100); do grep -q "on port" "$DEMO/recv.log" && break; sleep 0.1; done
PORT=$(grep -o 'on port [0-9]*' "$DEMO/recv.log" | grep -o '[0-9]*$')
echo "== qxfer recv (receiver, port $PORT):"; sed 's/^/   /' "$DEMO/recv.log"

for stack in quic tls; do
    rm -rf "${DEMO:?}/received/"*
    echo "== qxfer send video.bin photos 127.0.0.1:$PORT --stack $stack"
    "$QXFER" send --config-dir "$DEMO/sender" "$DEMO/src/video.bin" "$DEMO/src/photos" "127.0.0.1:$PORT" --stack $stack
    cmp "$DEMO/src/video.bin" "$DEMO/received/video.bin"
    diff -r "$DEMO/src/photos" "$DEMO/received/photos"
    echo "   identical: checked with cmp and diff -r"
done
echo "== the same again: the receiver has it already, only digests are compared"
"$QXFER" send --config-dir "$DEMO/sender" "$DEMO/src/video.bin" "127.0.0.1:$PORT"
