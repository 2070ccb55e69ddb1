#!/usr/bin/env bash
# Installs the Debian packages qxfer builds against and its tests use, if any is missing.
set -euo pipefail

packages=(
  libngtcp2-dev libngtcp2-crypto-gnutls-dev libgnutls28-dev  # the QUIC stack
  libxxhash-dev xxhash                                       # end-to-end checksums (xxhsum checks the tests)
  libssl-dev                                                 # P-256 arithmetic for pairing (SPAKE2) from libcrypto
  pkg-config
  gnutls-bin openssl                                         # interop peers in the tests
  iproute2 iputils-ping iperf3 jq bc procps time             # namespaces, the link emulator's self-test, bench
  nftables                                                   # Tests/e2e/race.sh drops UDP or TCP between namespaces
  tmux                                                       # Tests/e2e/terminal.sh drives qxfer in a real terminal
  exfat-fuse exfatprogs                                      # Tests/e2e/transfer.sh receives onto a USB stick's exFAT (FUSE)
  e2fsprogs                                                  # Tests/e2e/transfer.sh receives onto ext2 with a 16 GiB file size limit
  ffmpeg                                                     # qxfer stream: the tests check that ffmpeg reads its IVF output
  python3-zeroconf                                           # an independent mDNS/DNS-SD peer for the discovery tests
)
if [ "$#" -gt 0 ]; then packages+=("$@"); fi

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

# aioquic, an independent QUIC implementation the interop tests talk to (PyPI only).
if command -v python3 >/dev/null && ! python3 -c 'import aioquic' 2>/dev/null; then
  echo "installing: aioquic (pip)"
  python3 -m pip install -q aioquic 2>/dev/null || python3 -m pip install -q --break-system-packages aioquic
fi
