#!/usr/bin/env bash
# Installs the Debian 12 packages dptrain needs to build, test and train.
# Skips apt entirely when everything is already there; uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  binutils  # objdump: tests/test_cpu_level.cpp reads the binary's instructions
  libopenblas-openmp-dev libdnnl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  openmpi-bin libopenmpi-dev
  iproute2 util-linux  # ip netns and unshare: two hosts on one machine (scripts/two_hosts.sh)
  dataset-fashion-mnist fortunes
  python3 python3-numpy python3-torch
  ninja-build xz-utils  # scripts/device/bundle.sh: the GPU machine's build (Ninja) and its archive
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
