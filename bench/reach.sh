#!/usr/bin/env bash
# Across NATs, side by side in one run (issue 61): `qxfer send --code` / `qxfer recv CODE` with
# `qxfer relay` against magic-wormhole with its own mailbox server and transit relay, both run on
# the same public host, on the NAT topology of Tests/e2e/reach.sh (bench/netns/nat.sh): two
# homes behind NAT routers, each WAN leg 12.5 ms one way and RATE (default 500mbit, 50 ms queue)
# through qxfer-linkemu, so the homes are 50 ms apart (round trip) and 25 ms from the relays.
#
#   small    a 1 MiB file, both NATs cone: seconds from the receiver's command to its exit
#            (median of RUNS, default 3)
#   direct   a BIG file (default 256 MiB), both NATs cone: its rate, from the receiver's command
#            to its exit; beside them `plain`, a `qxfer send FILE HOST` between the same two
#            homes given public addresses (no NAT) on the same emulated path, timed from the
#            sender's command to its exit (the rate the issue's targets compare with)
#   relayed  the same file with home A behind a symmetric NAT (no punch can pass; see
#            Tests/e2e/reach.sh): qxfer through its relay, wormhole through its transit relay
#
# magic-wormhole cannot punch through NATs: its direct hints are the homes' private addresses,
# which the other home cannot reach, so it goes through its transit relay in both rows (its
# path column says what its receiver printed). Each side's relay CPU (user + system seconds of
# the relay process, /proc/PID/stat, before and after) is given per GB of file relayed, and for
# qxfer the time from `qxfer recv CODE` to the first data, in round trips to the relay (25 ms),
# when its --json events carry times. Before each receiver starts, its sender has printed its
# code and waited 1 s more (both senders are waiting in the mailbox / relay room).
# Every received file is compared with the source.
#
#     bench/reach.sh                        # both tools, 3 runs of 1 MiB, 1 run of 256 MiB per row
#     TOOLS=wormhole BIG=64MiB bench/reach.sh
#     RUNS=5 RATE=unlimited QXFER=path/to/qxfer bench/reach.sh
#
# Needs root, nft, and magic-wormhole, magic-wormhole-mailbox-server and
# magic-wormhole-transit-relay (scripts/install-bench-deps.sh). Writes
# bench/results/reach-DATE.csv and prints a Markdown table with the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${RUNS:-3}
BIG=${BIG:-256MiB}
RATE=${RATE:-500mbit}
TOOLS=${TOOLS:-qxfer wormhole}
ROWS=${ROWS:-small direct relayed}
SCRATCH=${SCRATCH:-.build-bench}
CAP=${CAP:-300}
[ "$(id -u)" = 0 ] || { echo "bench/reach.sh: run as root (network namespaces)" >&2; exit 1; }
command -v nft >/dev/null || { echo "bench/reach.sh: nft missing (scripts/install-deps.sh)" >&2; exit 1; }
has_tool() { [[ " $TOOLS " == *" $1 "* ]]; }
if has_tool wormhole; then
    for tool in wormhole twist; do
        command -v $tool >/dev/null || { echo "bench/reach.sh: $tool missing (make bench-deps)" >&2; exit 1; }
    done
fi
if has_tool qxfer; then
    . bench/build.sh
    bench_build_qxfer "$SCRATCH"
    "$QXFER" relay --help >/dev/null 2>&1 || { echo "bench/reach.sh: $QXFER has no relay command (TOOLS=wormhole measures wormhole alone)" >&2; exit 1; }
fi
export LINKEMU_BIN=${LINKEMU_BIN:-$(dirname "${QXFER:-$ROOT/.build-bench/release/qxfer}")/qxfer-linkemu}
[ -x "$LINKEMU_BIN" ] || { echo "bench/reach.sh: $LINKEMU_BIN missing (set LINKEMU_BIN or QXFER)" >&2; exit 1; }
big_bytes=$(numfmt --from=iec-i "${BIG%B}")

export NAT_LEG_DELAY=12.5ms
[ "$RATE" = unlimited ] || export NAT_LEG_RATE=$RATE
. bench/netns/nat.sh
TOOLS_PY=$ROOT/Tests/e2e/reach_tools.py
WORK=$(mktemp -d /tmp/qxfer-bench-reach.XXXXXX)
PIDS=()
cleanup() {
    local pid
    set +e  # every step runs, whatever the one before returned
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    NAT_QUIET=1 nat_down
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] && echo "bench/reach.sh: kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NAT_QUIET=1 nat_up qbr$$
PUB=$(nat_ns pub) HA=$(nat_ns ha) HB=$(nat_ns hb)
nat_check_delay >&2

# UDP datagrams the kernels dropped for full socket buffers (RcvbufErrors + SndbufErrors of
# /proc/net/snmp) in the homes and on the public host, summed: a QUIC path's losses that no
# link caused.
udp_drops() {
    local ns total=0 n
    for ns in "$PUB" "$HA" "$HB"; do
        n=$(ip netns exec "$ns" awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) col[$i] = i; h = 1 } else print $col["RcvbufErrors"] + $col["SndbufErrors"] }' /proc/net/snmp)
        total=$((total + n))
    done
    echo "$total"
}
# CPU seconds (user + system) of a process so far; the fields after the command's ")".
cpu_of() { sed 's/.*) //' "/proc/$1/stat" | awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($12 + $13) / hz }'; }
now() { date +%s.%N; }

# Relays on the public host: qxfer's on 7450, wormhole's mailbox on 4000 and transit on 4001.
wait_listening() {  # PORT: TCP port listening in the public namespace
    for _ in $(seq 200); do
        ip netns exec "$PUB" ss -Htln "sport = :$1" | grep -q . && return 0
        sleep 0.05
    done
    echo "bench/reach.sh: nothing listens on $1 in the public namespace" >&2
    return 1
}
if has_tool qxfer; then
    ip netns exec "$PUB" "$QXFER" relay --port 7450 --json >"$WORK/relay.out" 2>"$WORK/relay.err" </dev/null &
    QXFER_RELAY_PID=$!; PIDS+=("$QXFER_RELAY_PID")
    wait_listening 7450
    "$QXFER" id --config-dir "$WORK/cfg-b" >/dev/null
    FP=$("$QXFER" id --config-dir "$WORK/cfg-b")
fi
if has_tool wormhole; then
    (cd "$WORK" && exec ip netns exec "$PUB" twist wormhole-mailbox --port="tcp:4000:interface=$NAT_RELAY" \
        --channel-db="$WORK/mailbox.sqlite" >"$WORK/mailbox.log" 2>&1 </dev/null) &
    PIDS+=($!)
    (cd "$WORK" && exec ip netns exec "$PUB" twist transitrelay --port="tcp:4001:interface=$NAT_RELAY" \
        >"$WORK/transit.log" 2>&1 </dev/null) &
    TRANSIT_PID=$!; PIDS+=("$TRANSIT_PID")
    wait_listening 4000
    wait_listening 4001
    WORMHOLE=(wormhole --relay-url "ws://$NAT_RELAY:4000/v1" --transit-helper "tcp:$NAT_RELAY:4001")
fi

head -c $((1 << 20)) /dev/urandom >"$WORK/small.bin"
head -c "$big_bytes" /dev/urandom >"$WORK/big.bin"
mkdir -p bench/results
CSV=bench/results/reach-$(date +%Y%m%d-%H%M%S).csv
echo "row,tool,run,bytes,seconds,mb_per_s,path,relay_cpu_s,first_data_ms,udp_buffer_drops,link_drops,load1" >"$CSV"

# Each run sets SECONDS_TAKEN, PATH_TAKEN, RELAY_CPU (seconds of the relay that carried it, or
# empty) and FIRST_DATA_MS (or empty); a received file that differs stops the benchmark.
check_received() {
    cmp -s "$1" "$2" || { echo "bench/reach.sh: $3 delivered a different file ($2)" >&2; exit 1; }
}

run_qxfer() {  # FILE
    local file=$1 dst=$WORK/dst-$RANDOM cpu0 t0 t1 rc=0
    mkdir -p "$dst"
    timeout "$CAP" ip netns exec "$HA" "$QXFER" send "$file" --code --relay "$NAT_RELAY:7450" --json --config-dir "$WORK/cfg-a" \
        >"$WORK/send.out" 2>"$WORK/send.err" </dev/null &
    local sender=$!
    local code
    code=$(python3 "$TOOLS_PY" code "$WORK/send.out" 60) || { echo "bench/reach.sh: qxfer send printed no code: $(tail -2 "$WORK/send.err")" >&2; exit 1; }
    sleep 1
    cpu0=$(cpu_of "$QXFER_RELAY_PID")
    t0=$(now)
    timeout "$CAP" ip netns exec "$HB" "$QXFER" recv "$code" --relay "$NAT_RELAY:7450" --dir "$dst" --yes --json --config-dir "$WORK/cfg-b" \
        >"$WORK/recv.out" 2>"$WORK/recv.err" </dev/null || rc=$?
    t1=$(now)
    wait "$sender" || rc=$?
    [ "$rc" = 0 ] || { echo "bench/reach.sh: qxfer failed ($rc): $(tail -2 "$WORK/recv.err") / $(tail -2 "$WORK/send.err")" >&2; exit 1; }
    SECONDS_TAKEN=$(echo "$t1 - $t0" | bc)
    RELAY_CPU=$(echo "$(cpu_of "$QXFER_RELAY_PID") - $cpu0" | bc)
    PATH_TAKEN=$(python3 "$TOOLS_PY" summary "$WORK/recv.out" | jq -r .path)
    FIRST_DATA_MS=$(python3 "$TOOLS_PY" first-data "$WORK/recv.out" "$t0" 2>/dev/null || true)
    check_received "$file" "$dst/$(basename "$file")" qxfer
    rm -rf "$dst"
    [ -z "${KEEP:-}" ] || for f in send.out send.err recv.out recv.err; do cp "$WORK/$f" "$WORK/run-$(date +%s%N)-$f"; done
}

PLAIN_PID=
run_plain() {  # FILE: qxfer recv already listening in home B (routers without NAT)
    local file=$1 t0 t1
    t0=$(now)
    timeout "$CAP" ip netns exec "$HA" "$QXFER" send "$file" "$NAT_HOME_B:7447" --fingerprint "$FP" --config-dir "$WORK/cfg-a" \
        >"$WORK/plain.out" 2>"$WORK/plain.err" </dev/null \
        || { echo "bench/reach.sh: plain qxfer send failed: $(tail -2 "$WORK/plain.err")" >&2; exit 1; }
    t1=$(now)
    SECONDS_TAKEN=$(echo "$t1 - $t0" | bc)
    PATH_TAKEN=direct RELAY_CPU= FIRST_DATA_MS=
    check_received "$file" "$WORK/plain-dst/$(basename "$file")" "plain qxfer"
    rm -f "$WORK/plain-dst/$(basename "$file")"
}

CODE_SERIAL=0
run_wormhole() {  # FILE
    local file=$1 dst=$WORK/dst-$RANDOM cpu0 t0 t1 rc=0 code
    CODE_SERIAL=$((CODE_SERIAL + 1))
    code="$CODE_SERIAL-purple-sausages"
    mkdir -p "$dst"
    (cd "$WORK" && exec timeout "$CAP" ip netns exec "$HA" "${WORMHOLE[@]}" send --code "$code" --hide-progress --no-qr "$file" \
        >"$WORK/wsend.out" 2>"$WORK/wsend.err" </dev/null) &
    local sender=$!
    for _ in $(seq 600); do grep -q "Wormhole code is" "$WORK/wsend.err" "$WORK/wsend.out" 2>/dev/null && break; sleep 0.05; done
    grep -q "Wormhole code is" "$WORK/wsend.err" "$WORK/wsend.out" || { echo "bench/reach.sh: wormhole send printed no code: $(tail -2 "$WORK/wsend.err")" >&2; exit 1; }
    sleep 1
    cpu0=$(cpu_of "$TRANSIT_PID")
    t0=$(now)
    (cd "$dst" && timeout "$CAP" ip netns exec "$HB" "${WORMHOLE[@]}" receive --accept-file --hide-progress -o "$dst" "$code" \
        >"$WORK/wrecv.out" 2>"$WORK/wrecv.err" </dev/null) || rc=$?
    t1=$(now)
    wait "$sender" || rc=$?
    [ "$rc" = 0 ] || { echo "bench/reach.sh: wormhole failed ($rc): $(tail -2 "$WORK/wrecv.err") / $(tail -2 "$WORK/wsend.err")" >&2; exit 1; }
    SECONDS_TAKEN=$(echo "$t1 - $t0" | bc)
    RELAY_CPU=$(echo "$(cpu_of "$TRANSIT_PID") - $cpu0" | bc)
    PATH_TAKEN=direct
    grep -q "relay" "$WORK/wrecv.err" "$WORK/wrecv.out" && PATH_TAKEN=relayed
    FIRST_DATA_MS=
    check_received "$file" "$dst/$(basename "$file")" wormhole
    rm -rf "$dst"
}

record() {  # ROW TOOL RUN BYTES
    local rate
    rate=$(echo "scale=3; $4 / 1000000 / $SECONDS_TAKEN" | bc)
    echo "$1,$2,$3,$4,$SECONDS_TAKEN,$rate,$PATH_TAKEN,$RELAY_CPU,$FIRST_DATA_MS,$(( $(udp_drops) - DROPS0 )),$(( $(sleep 0.3; nat_link_drops) - LINK_DROPS0 )),$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$CSV" >&2
}

for row in $ROWS; do
    case $row in
        small) file=$WORK/small.bin runs=$RUNS; nat_mode a cone; nat_mode b cone ;;
        direct) file=$WORK/big.bin runs=1; nat_mode a cone; nat_mode b cone ;;
        relayed) file=$WORK/big.bin runs=1; nat_mode a symmetric; nat_mode b cone ;;
        *) echo "bench/reach.sh: unknown row '$row' (small, direct, relayed)" >&2; exit 2 ;;
    esac
    bytes=$(stat -c %s "$file")
    echo "== $row: $bytes bytes, $runs runs (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    for run in $(seq "$runs"); do
        for tool in $TOOLS; do
            DROPS0=$(udp_drops) LINK_DROPS0=$(nat_link_drops)
            "run_$tool" "$file"
            record "$row" "$tool" "$run" "$bytes"
        done
        if [ "$row" = direct ] && has_tool qxfer; then
            # The same two homes given public addresses: routed, no NAT, same legs.
            nat_mode a none; nat_mode b none
            mkdir -p "$WORK/plain-dst"
            ip netns exec "$HB" "$QXFER" recv --config-dir "$WORK/cfg-b" --no-advertise --dir "$WORK/plain-dst" --yes --port 7447 \
                >"$WORK/plain-recv.out" 2>"$WORK/plain-recv.err" </dev/null &
            PLAIN_PID=$!; PIDS+=("$PLAIN_PID")
            for _ in $(seq 100); do ip netns exec "$HB" ss -Htln 'sport = :7447' | grep -q . && break; sleep 0.05; done
            DROPS0=$(udp_drops) LINK_DROPS0=$(nat_link_drops)
            run_plain "$file"
            record "$row" plain "$run" "$bytes"
            kill "$PLAIN_PID" 2>/dev/null || true
            wait "$PLAIN_PID" 2>/dev/null || true
            nat_mode a cone; nat_mode b cone
        fi
    done
done

echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); legs 12.5 ms one way, ${RATE}; $(date -u +%Y-%m-%dT%H:%MZ)"
echo
python3 - "$CSV" <<'EOF'
import csv, statistics, sys
rows = {}
for r in csv.DictReader(open(sys.argv[1])):
    rows.setdefault(r["row"], {}).setdefault(r["tool"], []).append(r)
titles = {"small": "1 MiB, two cone NATs", "direct": "big file, two cone NATs", "relayed": "big file, one symmetric NAT"}
print("| row | tool | path | median s | MB/s | vs wormhole | vs plain qxfer send | relay CPU s/GB | recv to first data |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
def med(runs, key):
    values = [float(r[key]) for r in runs if r[key] not in ("", None)]
    return statistics.median(values) if values else None
for row, tools in rows.items():
    worm = tools.get("wormhole")
    plain = tools.get("plain") or rows.get("direct", {}).get("plain")
    for tool, runs in tools.items():
        seconds, rate = med(runs, "seconds"), med(runs, "mb_per_s")
        gb = int(runs[0]["bytes"]) / 1e9
        cpu = med(runs, "relay_cpu_s")
        # Per GB of a 1 MiB file, the clock's 10 ms ticks would be the figure: big files only.
        cpu_text = f"{cpu / gb:.1f}" if cpu is not None and tool != "plain" and row != "small" else "–"
        if row == "small":
            # Time: a ratio under 1 is faster.
            vs_worm = f"{seconds / med(worm, 'seconds'):.2f}× the time" if worm and tool != "wormhole" else "–"
        else:
            vs_worm = f"{rate / med(worm, 'mb_per_s'):.2f}× the rate" if worm and tool != "wormhole" else "–"
        vs_plain = f"{rate / med(plain, 'mb_per_s'):.2f}×" if plain and row != "small" and tool != "plain" else "–"
        first = med(runs, "first_data_ms")
        first_text = f"{first:.0f} ms = {first / 25:.1f} relay RTTs" if first is not None else "–"
        paths = "/".join(sorted({r["path"] for r in runs}))
        print(f"| {titles.get(row, row)} | {tool} | {paths} | {seconds:.3f} | {rate:.1f} | {vs_worm} | {vs_plain} | {cpu_text} | {first_text} |")
EOF
echo
echo "CSV: $CSV"
