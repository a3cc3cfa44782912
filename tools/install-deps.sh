#!/usr/bin/env bash
# Installs the Debian packages herd's builds need, if any are missing.
#   tools/install-deps.sh                the packages for herd, its tests, examples and benchmarks
#   tools/install-deps.sh --with-torch   also libtorch-dev (the libtorch adapter, example and tests) and
#                                        python3-torch (PyTorch DDP, the peer in benchmarks/vs_pytorch_ddp);
#                                        best effort: without them the libtorch parts are skipped
#   tools/install-deps.sh --with-openmpi also Open MPI beside MPICH, for the openmpi preset (MPICH stays the
#                                        default mpicxx/mpiexec); best effort
# The flags combine.
set -euo pipefail

required=(g++ cmake make python3 mpich libmpich-dev doctest-dev libeigen3-dev libxtensor-dev libarmadillo-dev
          zlib1g-dev dataset-fashion-mnist)
optional=()
for flag in "$@"; do
  case "$flag" in
    --with-torch) optional+=(libtorch-dev python3-torch) ;;
    --with-openmpi) optional+=(libopenmpi-dev openmpi-bin) ;;
    *) echo "herd: unknown flag $flag" >&2; exit 2 ;;
  esac
done

missing() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
need=($(missing "${required[@]}"))
want=($(missing "${optional[@]}"))
[[ ${#need[@]} -eq 0 && ${#want[@]} -eq 0 ]] && exit 0

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "herd: run as root, or install sudo, to install: ${need[*]} ${want[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [[ ${#need[@]} -gt 0 ]]; then
  echo "herd: installing ${need[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [[ ${#want[@]} -gt 0 ]]; then
  echo "herd: installing ${want[*]} (optional)"
  $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" ||
    echo "herd: could not install ${want[*]}; the parts that need them will be skipped" >&2
fi
# Installing Open MPI makes it Debian's default MPI (its alternatives rank higher); herd's default
# build is MPICH's, so when this script brought Open MPI in, MPICH stays the default.
if [[ " ${want[*]} " == *" openmpi-bin "* ]] && [[ -x /usr/bin/mpicc.mpich ]]; then
  $sudo update-alternatives --quiet --set mpi /usr/bin/mpicc.mpich
  $sudo update-alternatives --quiet --set mpirun /usr/bin/mpirun.mpich
  $sudo update-alternatives --quiet --set mpi-x86_64-linux-gnu /usr/include/x86_64-linux-gnu/mpich
fi
