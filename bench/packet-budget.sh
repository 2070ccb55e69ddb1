#!/usr/bin/env bash
# The per-packet cost budget of a QUIC transfer at MTU 1500 (issue 19), beside TCP+TLS: one
# qxfer-bench connection memory to memory between two network namespaces joined by a plain veth
# pair (MTU 1500, nothing emulated), `perf record` on both ends, then each end's CPU time split by
# where it went (kernel, GnuTLS, ngtcp2, the Swift runtime, libc, qxfer's own code) in nanoseconds
# per full-size packet (1452 bytes of UDP payload; for TCP+TLS, per 1452 bytes moved).
#
#     sudo bench/packet-budget.sh                    # 1 GiB per stack, quic then tls
#     BYTES=512MiB STACKS=quic bench/packet-budget.sh
#     QXFER_BENCH=path/to/qxfer-bench bench/packet-budget.sh
#
# Memory to memory, so no file system work hides the transport's: what differs between the two
# stacks here is what QUIC does per packet in user space. CPU time is perf's sample count at FREQ
# samples per second and thread (default 2999); run it on a quiet machine, as both ends share the
# cores. Needs perf (linux-perf) and root. Everything it creates is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES=${BYTES:-1GiB}
STACKS=${STACKS:-quic tls}
FREQ=${FREQ:-2999}
BENCH=${QXFER_BENCH:-$(swift build -c release --scratch-path "${SCRATCH:-.build-bench}" --show-bin-path)/qxfer-bench}
[ -x "$BENCH" ] || { echo "bench/packet-budget.sh: $BENCH not built (swift build -c release --scratch-path .build-bench --product qxfer-bench)" >&2; exit 1; }
command -v perf >/dev/null || { echo "bench/packet-budget.sh: perf not installed (apt-get install linux-perf)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench/packet-budget.sh: must run as root (network namespaces)" >&2; exit 1; }

NS=qpb$$
work=$(mktemp -d /tmp/qxfer-budget.XXXXXX)
sink=
cleanup() {
    if [ -n "$sink" ]; then kill "$sink" 2>/dev/null || true; wait "$sink" 2>/dev/null || true; fi
    ip netns del "${NS}a" 2>/dev/null || true
    ip netns del "${NS}b" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "${NS}a"
ip netns add "${NS}b"
ip link add "${NS}va" netns "${NS}a" mtu 1500 type veth peer name "${NS}vb" netns "${NS}b" mtu 1500
ip -n "${NS}a" addr add 10.97.3.1/24 dev "${NS}va"
ip -n "${NS}b" addr add 10.97.3.2/24 dev "${NS}vb"
for n in a b; do ip -n "${NS}$n" link set lo up; ip -n "${NS}$n" link set "${NS}v$n" up; done

# Nanoseconds per packet by library, from one perf file: CPU seconds = samples / FREQ.
budget() {
    perf report -i "$1" --no-children --sort dso -g none -n -q 2>/dev/null | awk -v freq="$FREQ" -v packets="$2" '
        { n = $2; d = $3
          if (d ~ /kallsyms/) k = "kernel"
          else if (d ~ /gnutls|nettle|hogweed/) k = "GnuTLS"
          else if (d ~ /ngtcp2/) k = "ngtcp2"
          else if (d ~ /swiftCore|swift_Concurrency|Foundation|dispatch/) k = "Swift runtime"
          else if (d ~ /^libc|ld-linux|vdso/) k = "libc"
          else k = "qxfer (+ BoringSSL)"
          s[k] += n; total += n }
        END { order = "kernel,GnuTLS,ngtcp2,Swift runtime,libc,qxfer (+ BoringSSL)"; split(order, names, ",")
              for (i = 1; i <= 6; i++) printf " %.0f |", (s[names[i]] + 0) / freq / packets * 1e9
              printf " **%.0f** | %.2f |\n", total / freq / packets * 1e9, total / freq }'
}

echo "Per-packet cost, memory to memory over veth at MTU 1500 ($BYTES, qxfer-bench, perf at $FREQ Hz; $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)):"
echo
echo "| stack | end | MB/s | kernel | GnuTLS | ngtcp2 | Swift runtime | libc | qxfer (+ BoringSSL) | total ns/packet | CPU s |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
port=7520
for stack in $STACKS; do
    port=$((port + 1))
    ip netns exec "${NS}b" perf record -q -F "$FREQ" -g -o "$work/$stack-recv.data" -- \
        "$BENCH" sink --stack "$stack" --port "$port" >"$work/sink.out" 2>"$work/sink.err" &
    sink=$!
    for _ in $(seq 1 100); do grep -q listening "$work/sink.out" 2>/dev/null && break; sleep 0.1; done
    fingerprint=$(head -1 "$work/sink.out")
    ip netns exec "${NS}a" perf record -q -F "$FREQ" -g -o "$work/$stack-send.data" -- \
        "$BENCH" source --stack "$stack" 10.97.3.2 "$port" --bytes "$BYTES" --fingerprint "$fingerprint" \
        >"$work/$stack.json" 2>"$work/source.err"
    wait "$sink"; sink=
    rate=$(jq -r '.MBps | floor' "$work/$stack.json")
    bytes=$(jq -r '.bytes' "$work/$stack.json")
    # QUIC: packets on the wire (what the connection sent, headers included, / 1452); TCP+TLS: the
    # same count of 1452-byte units of payload, for comparison.
    sent=$(jq -r '.metrics.bytes_sent // empty' "$work/$stack.json")
    packets=$(( ${sent:-$bytes} / 1452 ))
    echo "| $stack | sender | $rate |$(budget "$work/$stack-send.data" "$packets")"
    echo "| $stack | receiver | |$(budget "$work/$stack-recv.data" "$packets")"
done
echo
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
