#!/usr/bin/env bash
# Installs the Debian packages qxfer builds against and its tests use, if any is missing.
set -euo pipefail

packages=(
  libngtcp2-dev libngtcp2-crypto-gnutls-dev libgnutls28-dev  # the QUIC stack
  libxxhash-dev xxhash                                       # end-to-end checksums (xxhsum checks the tests)
  pkg-config
  gnutls-bin openssl                                         # interop peers in the tests
  iproute2 iputils-ping iperf3 jq bc                         # namespaces and the link emulator's self-test
)
if [ "$#" -gt 0 ]; then packages+=("$@"); fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
