#!/usr/bin/env bash
# Installs the Debian packages the benchmarks (make bench, make bench-full) need besides the
# build's own (scripts/install-deps.sh): the peers qxfer is compared with and the plotting library.
set -euo pipefail

packages=(
  openssh-client openssh-server rsync    # scp and rsync over an sshd the bench starts itself
  iperf3                                 # the raw-TCP ceiling (cubic and bbr)
  ngtcp2-client ngtcp2-server            # the ngtcp2 0.12.1 example pair (gtlsclient / gtlsserver)
  srt-tools                              # srt-live-transmit, the streaming peer
  python3 python3-matplotlib             # bench/report.py's tables and plots
  iproute2 jq bc time procps xxhash openssl
  linux-perf                             # bench/profile.sh and bench/packet-budget.sh
  strace                                 # bench/sync-stalls.sh
)
missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# magic-wormhole, its mailbox server and transit relay (PyPI only): bench/reach.sh runs them beside
# qxfer's relay on the NAT topology.
if command -v python3 >/dev/null && ! { command -v wormhole && python3 -c 'import wormhole_mailbox_server, wormhole_transit_relay'; } >/dev/null 2>&1; then
  echo "installing: magic-wormhole magic-wormhole-mailbox-server magic-wormhole-transit-relay (pip)"
  wormhole_packages=(magic-wormhole magic-wormhole-mailbox-server magic-wormhole-transit-relay)
  python3 -m pip install -q "${wormhole_packages[@]}" 2>/dev/null || python3 -m pip install -q --break-system-packages "${wormhole_packages[@]}"
fi
