#!/usr/bin/env bash
# What each end of one `qxfer send` costs the machine beyond CPU seconds: page faults, context
# switches and peak RSS, over a veth pair at MTU 1500 (two network namespaces, nothing
# emulated), runs of this binary and of a baseline interleaved.
#
#     sudo bench/process-costs.sh                                   # 1 GiB, QUIC, 3 runs
#     QXFER_BASELINE=path/to/older/qxfer RUNS=5 STACK=tls bench/process-costs.sh
#
# Prints one line per run and end (`/usr/bin/time`'s user and system seconds, voluntary and
# involuntary context switches, minor page faults, peak RSS) and the means. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
QXFER=${QXFER:-$(swift build -c release --scratch-path "${SCRATCH:-.build-bench}" --show-bin-path)/qxfer}
RUNS=${RUNS:-3}
MIB=${MIB:-1024}
STACK=${STACK:-quic}
[ -x "$QXFER" ] || { echo "bench/process-costs.sh: $QXFER not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench/process-costs.sh: must run as root (network namespaces)" >&2; exit 1; }

NS=qpc$$
WORK=$(mktemp -d /tmp/qxfer-costs.XXXXXX)
cleanup() {
    pkill -INT -f "qxfer recv --config-dir $WORK/" 2>/dev/null || true
    ip netns del "${NS}a" 2>/dev/null || true
    ip netns del "${NS}b" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "${NS}a"
ip netns add "${NS}b"
ip link add "${NS}va" netns "${NS}a" mtu 1500 type veth peer name "${NS}vb" netns "${NS}b" mtu 1500
ip -n "${NS}a" addr add 10.97.6.1/24 dev "${NS}va"
ip -n "${NS}b" addr add 10.97.6.2/24 dev "${NS}vb"
for n in a b; do ip -n "${NS}$n" link set lo up; ip -n "${NS}$n" link set "${NS}v$n" up; done
head -c "${MIB}M" /dev/urandom >"$WORK/file.bin"
FP=$("$QXFER" id --config-dir "$WORK/cfg-recv" 2>/dev/null)
"$QXFER" id --config-dir "$WORK/cfg-send" >/dev/null 2>&1
FORMAT="%U %S %w %c %R %M"

one() {  # label binary
    rm -rf "$WORK/dst" && mkdir -p "$WORK/dst"
    ip netns exec "${NS}b" /usr/bin/time -f "$FORMAT" -o "$WORK/recv.time" \
        "$2" recv --config-dir "$WORK/cfg-recv" --dir "$WORK/dst" --yes --port 7447 --no-advertise >/dev/null 2>"$WORK/recv.err" &
    local receiver=$!
    for _ in $(seq 1 50); do ip netns exec "${NS}b" ss -uln | grep -q ':7447 ' && break; sleep 0.1; done
    local start end
    start=$(date +%s.%N)
    ip netns exec "${NS}a" /usr/bin/time -f "$FORMAT" -o "$WORK/send.time" \
        "$2" send --config-dir "$WORK/cfg-send" "$WORK/file.bin" 10.97.6.2:7447 --stack "$STACK" --fingerprint "$FP" >/dev/null 2>"$WORK/send.err" \
        || { echo "bench/process-costs.sh: $1: send failed: $(tail -1 "$WORK/send.err")" >&2; exit 1; }
    end=$(date +%s.%N)
    pkill -INT -f "qxfer recv --config-dir $WORK/" 2>/dev/null || pkill -INT -f "recv --config-dir $WORK/cfg-recv" || true
    wait "$receiver" 2>/dev/null || true
    local rate
    rate=$(python3 -c "print('%.1f' % ($MIB * 1048576 / ($end - $start) / 1e6))")
    echo "$1 rate $rate"
    echo "$1 send $(tail -1 "$WORK/send.time")"
    echo "$1 recv $(tail -1 "$WORK/recv.time")"
}

echo "One $STACK transfer of $MIB MiB over veth (MTU 1500), $RUNS runs each, interleaved; $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
{
    for _ in $(seq 1 "$RUNS"); do
        one this "$QXFER"
        [ -z "${QXFER_BASELINE:-}" ] || one baseline "$QXFER_BASELINE"
    done
} | tee "$WORK/lines"
python3 - "$WORK/lines" "$MIB" <<'EOF'
import sys, collections
gb = int(sys.argv[2]) * 1048576 / 1e9
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, end, *values = line.split()
    rows[(label, end)].append([float(v) for v in values])
print()
print("| binary | end | MB/s | CPU s/GB | voluntary switches | involuntary | minor faults | peak RSS MiB |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for label in ("this", "baseline"):
    if (label, "rate") not in rows: continue
    rate = sum(r[0] for r in rows[(label, "rate")]) / len(rows[(label, "rate")])
    for end in ("send", "recv"):
        r = rows[(label, end)]; n = len(r)
        mean = lambda i: sum(x[i] for x in r) / n
        print(f"| {label} | {end} | {rate:.1f} | {(mean(0) + mean(1)) / gb:.2f} | {mean(2):.0f} | {mean(3):.0f} | {mean(4):.0f} | {mean(5) / 1024:.0f} |")
EOF
