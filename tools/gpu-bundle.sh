#!/usr/bin/env bash
# Fetches what tools/gpu-check.sh needs on a GPU machine that has no package manager and no
# network: Debian's packages of MPICH (with the libraries it loads), doctest, zlib's header and
# Fashion-MNIST, as .deb files in .gpu-bundle/ (ignored by git). Run it on a Debian 12 machine
# that reaches the package registry, then copy the checkout with that folder to the GPU machine;
# gpu-check.sh unpacks the packages into a prefix of its build folder (dpkg -x, or ar and tar),
# never into /. What it fetches stays under the 64 MiB a device call can carry.
#   tools/gpu-bundle.sh [folder]      # default .gpu-bundle
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu-bundle}
# MPICH's runtime closure beyond what any glibc-based image has (libc, libstdc++, libgcc).
packages=(mpich libmpich12 libmpich-dev libhwloc15 libucx0 libnuma1 libslurm38 libgfortran5 libquadmath0
          libibverbs1 librdmacm1 libudev1 doctest-dev zlib1g-dev dataset-fashion-mnist)
mkdir -p "$out"
cd "$out"
if ! apt-get download "${packages[@]}" 2>/dev/null; then
  echo "herd: apt-get download failed; refreshing the package lists and trying again" >&2
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  apt-get download "${packages[@]}"
fi
# The commit the bundle was made at, for the check's env.txt (run this again after a commit).
git -C .. rev-parse HEAD >commit.txt 2>/dev/null || true
echo "herd: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $(pwd)"
