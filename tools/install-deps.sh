#!/usr/bin/env bash
# Installs the Debian packages herd's builds need, if any are missing.
#   tools/install-deps.sh            the packages for herd, its tests, examples and benchmarks
#   tools/install-deps.sh --with-torch   also libtorch-dev and python3-torch (the libtorch adapter and its peers)
set -euo pipefail

packages=(g++ cmake make python3 mpich libmpich-dev doctest-dev libeigen3-dev zlib1g-dev dataset-fashion-mnist)
if [[ "${1:-}" == "--with-torch" ]]; then
  packages+=(libtorch-dev python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "herd: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "herd: run as root or install sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
