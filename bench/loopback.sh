#!/usr/bin/env bash
# Loopback bulk throughput, side by side in one run: qxfer over QUIC, qxfer over TCP+TLS, and the
# ngtcp2 example pair from Debian (gtlsserver / gtlsclient, the same ngtcp2 0.12.1 + GnuTLS that
# qxfer's QUIC engine wraps).
#
#     bench/loopback.sh                 # 1 GiB, 3 runs of each
#     BYTES=256MiB RUNS=5 bench/loopback.sh
#     QXFER_BENCH=path/to/qxfer-bench bench/loopback.sh   # use that binary, build nothing
#
# For every configuration and run it measures the client process's wall time (process start to
# exit: handshake included, the same for every contender), both sides' CPU seconds (user+sys,
# from /usr/bin/time) and peak RSS. Runs are interleaved (run 1 of every configuration, then run
# 2, ...) so drift on a shared machine spreads evenly. qxfer's sink counts the bytes it received
# and the source checks the count; the ngtcp2 client discards what it downloads (exit status
# checked). Writes bench/results/loopback-DATE.csv and prints a Markdown table.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
BYTES=${BYTES:-1GiB}
RUNS=${RUNS:-3}
SCRATCH=${SCRATCH:-.build-bench}
TIMEOUT=${TIMEOUT:-600}   # seconds, for any one transfer

to_bytes() {
  local text=${1,,}
  case $text in
    *gib) echo $(( ${text%gib} << 30 )) ;;
    *mib) echo $(( ${text%mib} << 20 )) ;;
    *kib) echo $(( ${text%kib} << 10 )) ;;
    *g)   echo $(( ${text%g} << 30 )) ;;
    *m)   echo $(( ${text%m} << 20 )) ;;
    *k)   echo $(( ${text%k} << 10 )) ;;
    *)    echo $(( text )) ;;
  esac
}
bytes=$(to_bytes "$BYTES")
[ "$bytes" -gt 0 ] || { echo "BYTES must be positive" >&2; exit 2; }

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
need=()
command -v gtlsclient >/dev/null 2>&1 || need+=(ngtcp2-client)
[ -x /usr/sbin/gtlsserver ] || command -v gtlsserver >/dev/null 2>&1 || need+=(ngtcp2-server)
[ -x /usr/bin/time ] || need+=(time)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
GTLSSERVER=$(command -v gtlsserver || echo /usr/sbin/gtlsserver)
GTLSCLIENT=$(command -v gtlsclient)

if [ -n "${QXFER_BENCH:-}" ]; then
  BENCH=$QXFER_BENCH   # a qxfer-bench binary built elsewhere (skips the build)
else
  echo "building qxfer-bench (release, --scratch-path $SCRATCH)" >&2
  swift build -c release --scratch-path "$SCRATCH" --product qxfer-bench >&2
  BENCH="$(swift build -c release --scratch-path "$SCRATCH" --show-bin-path)/qxfer-bench"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/qxfer-loopback.XXXXXX")
started_pids=()

# Ends a process this script started (and, when it is /usr/bin/time, the program it runs).
stop_pid() {
  local pid=$1 child
  kill -0 "$pid" 2>/dev/null || return 0
  local children
  children=$(pgrep -P "$pid" 2>/dev/null || true)
  if [ -n "$children" ]; then
    # /usr/bin/time: end the program it runs, so that time itself reports and exits.
    for child in $children; do kill -TERM "$child" 2>/dev/null || true; done
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    for child in $(pgrep -P "$pid" 2>/dev/null); do kill -KILL "$child" 2>/dev/null || true; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local pid
  for pid in "${started_pids[@]}"; do stop_pid "$pid"; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

# Waits (bounded) until FILE has at least N lines.
wait_lines() {
  local file=$1 lines=$2 pid=$3
  for _ in $(seq 300); do
    [ "$(wc -l <"$file" 2>/dev/null || echo 0)" -ge "$lines" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# Waits (bounded) until something listens on UDP PORT.
wait_udp() {
  local port=$1 pid=$2
  for _ in $(seq 300); do
    ss -Hlun "sport = :$port" 2>/dev/null | grep -q . && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

free_udp_port() {
  local port
  while :; do
    port=$(( 20000 + RANDOM % 30000 ))
    ss -Hlun "sport = :$port" 2>/dev/null | grep -q . || { echo "$port"; return; }
  done
}

# "wall user sys maxrss_kb" from a /usr/bin/time -o file (its last line).
time_fields() { local line; line=$(tail -n 1 "$1" 2>/dev/null); echo "${line:-0 0 0 0}"; }

TIMEFMT='%e %U %S %M'
csv_rows=()

record() {  # config run wall client_time_file server_time_file extra_seconds
  local config=$1 run=$2 client=$3 server=$4 inner=${5:-}
  local cw cu cs cm sw su ss sm
  read -r cw cu cs cm < <(time_fields "$client")
  read -r sw su ss sm < <(time_fields "$server")
  local mbps
  mbps=$(awk -v b="$bytes" -v s="$cw" 'BEGIN { printf "%.1f", b / s / 1e6 }')
  csv_rows+=("$config,$run,$bytes,$cw,${inner:-},$mbps,$(awk -v a="$cu" -v b="$cs" 'BEGIN{printf "%.2f", a+b}'),$(awk -v a="$su" -v b="$ss" 'BEGIN{printf "%.2f", a+b}'),$cm,$sm")
  printf '  %-18s run %d: %8.1f MB/s  (%ss; client %ss CPU, server %ss CPU)\n' "$config" "$run" "$mbps" "$cw" \
    "$(awk -v a="$cu" -v b="$cs" 'BEGIN{print a+b}')" "$(awk -v a="$su" -v b="$ss" 'BEGIN{print a+b}')" >&2
}

run_qxfer() {  # stack cc run
  local stack=$1 cc=$2 run=$3 config
  config="qxfer-$stack${cc:+-$cc}"
  local out="$WORK/$config-$run"
  local ccargs=()
  [ -n "$cc" ] && ccargs=(--cc "$cc")
  /usr/bin/time -f "$TIMEFMT" -o "$out.sink.time" \
    "$BENCH" sink --stack "$stack" --host 127.0.0.1 --port 0 "${ccargs[@]}" >"$out.sink.out" 2>"$out.sink.err" &
  local sink=$!
  started_pids+=("$sink")
  wait_lines "$out.sink.out" 2 "$sink" || { echo "$config: the sink did not start: $(cat "$out.sink.err")" >&2; return 1; }
  local fingerprint port
  fingerprint=$(sed -n 1p "$out.sink.out")
  port=$(sed -n 2p "$out.sink.out" | sed 's/.*://')
  if ! /usr/bin/time -f "$TIMEFMT" -o "$out.source.time" timeout "$TIMEOUT" \
      "$BENCH" source --stack "$stack" 127.0.0.1 "$port" --bytes "$bytes" --fingerprint "$fingerprint" "${ccargs[@]}" \
      >"$out.source.out" 2>"$out.source.err"; then
    echo "$config run $run failed: $(cat "$out.source.err")" >&2
    stop_pid "$sink"
    return 1
  fi
  # The sink exits by itself after its one connection.
  for _ in $(seq 150); do kill -0 "$sink" 2>/dev/null || break; sleep 0.1; done
  stop_pid "$sink"
  local inner
  inner=$(sed -n 's/.*"seconds":\([0-9.eE+-]*\).*/\1/p' "$out.source.out" | head -n 1)
  record "$config" "$run" "$out.source.time" "$out.sink.time" "$inner"
  grep -h '"role"' "$out.source.out" "$out.sink.out" >>"$WORK/qxfer-json.log" || true
}

# The ngtcp2 examples' document root and certificate.
mkdir -p "$WORK/www"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=test \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
head -c "$bytes" /dev/urandom >"$WORK/www/blob"

run_ngtcp2() {  # cc run
  local cc=$1 run=$2 config="ngtcp2-$1"
  local out="$WORK/$config-$run" port
  port=$(free_udp_port)
  /usr/bin/time -f "$TIMEFMT" -o "$out.server.time" \
    "$GTLSSERVER" -q -d "$WORK/www" --cc "$cc" 127.0.0.1 "$port" "$WORK/key.pem" "$WORK/cert.pem" \
    >/dev/null 2>"$out.server.err" &
  local server=$!
  started_pids+=("$server")
  wait_udp "$port" "$server" || { echo "$config: gtlsserver did not start: $(cat "$out.server.err")" >&2; return 1; }
  if ! /usr/bin/time -f "$TIMEFMT" -o "$out.client.time" timeout "$TIMEOUT" \
      "$GTLSCLIENT" -q --no-quic-dump --no-http-dump --exit-on-all-streams-close --cc "$cc" \
      127.0.0.1 "$port" "https://127.0.0.1:$port/blob" >/dev/null 2>"$out.client.err"; then
    echo "$config run $run failed: $(tail -n 3 "$out.client.err")" >&2
    stop_pid "$server"
    return 1
  fi
  stop_pid "$server"  # /usr/bin/time then writes the server's figures
  record "$config" "$run" "$out.client.time" "$out.server.time"
}

configs=(qxfer-quic qxfer-quic-cubic qxfer-tls ngtcp2-cubic ngtcp2-bbr)
echo "loopback: $bytes bytes, $RUNS runs of each of: ${configs[*]}" >&2
for run in $(seq "$RUNS"); do
  run_qxfer quic "" "$run"
  run_qxfer quic cubic "$run"
  run_qxfer tls "" "$run"
  run_ngtcp2 cubic "$run"
  run_ngtcp2 bbr "$run"
done

date_tag=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p bench/results
csv="bench/results/loopback-$date_tag.csv"
{
  echo "config,run,bytes,client_wall_s,qxfer_connection_s,MBps,client_cpu_s,server_cpu_s,client_peak_rss_kb,server_peak_rss_kb"
  printf '%s\n' "${csv_rows[@]}"
} >"$csv"
echo "wrote $csv" >&2
if [ -s "$WORK/qxfer-json.log" ]; then
  cp "$WORK/qxfer-json.log" "bench/results/loopback-$date_tag.jsonl"   # qxfer-bench's lines, with connection metrics
  echo "wrote bench/results/loopback-$date_tag.jsonl" >&2
fi

# The table: medians over the runs of each configuration.
awk -F, -v bytes="$bytes" -v runs="$RUNS" '
  function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  NR > 1 {
    if (!($1 in seen)) { seen[$1] = 1; order[++count] = $1 }
    mbps[$1] = mbps[$1] " " $6; all[$1] = all[$1] (all[$1] == "" ? "" : ", ") sprintf("%.0f", $6)
    ccpu[$1] = ccpu[$1] " " $7 / (bytes / 1e9); scpu[$1] = scpu[$1] " " $8 / (bytes / 1e9)
    if ($9 > crss[$1]) crss[$1] = $9; if ($10 > srss[$1]) srss[$1] = $10
  }
  END {
    printf "| configuration | median MB/s | runs (MB/s) | client CPU s/GB | server CPU s/GB | peak RSS client / server (MiB) |\n"
    printf "|---|---:|---|---:|---:|---:|\n"
    for (i = 1; i <= count; i++) {
      c = order[i]; med[c] = median(mbps[c])
      printf "| %s | %.0f | %s | %.2f | %.2f | %.0f / %.0f |\n", c, med[c], all[c], median(ccpu[c]), median(scpu[c]), crss[c] / 1024, srss[c] / 1024
    }
    best = (med["ngtcp2-cubic"] > med["ngtcp2-bbr"]) ? "ngtcp2-cubic" : "ngtcp2-bbr"
    printf "\n"
    if (med[best] > 0) {
      printf "- qxfer-quic / ngtcp2 (its faster congestion controller, %s): **%.2f×** (target ≥ 2×); qxfer-quic-cubic / ngtcp2-cubic: %.2f×\n", best, med["qxfer-quic"] / med[best], med["qxfer-quic-cubic"] / med["ngtcp2-cubic"]
    }
    if (med["qxfer-quic"] > 0) printf "- qxfer-tls / qxfer-quic: **%.2f×**\n", med["qxfer-tls"] / med["qxfer-quic"]
  }' "$csv"
