#!/usr/bin/env bash
# Installs the Debian packages herd's builds need, if any are missing.
#   tools/install-deps.sh                the packages for herd, its tests, examples and benchmarks
#   tools/install-deps.sh --with-torch   also libtorch-dev (the libtorch adapter, example and tests) and
#                                        python3-torch (PyTorch DDP, the peer in benchmarks/vs_pytorch_ddp),
#                                        Debian's PyTorch 1.13; and, once, a Python environment with
#                                        PyTorch 2.x from PyPI for the torch2 preset (below);
#                                        best effort: without them the libtorch parts are skipped
#   tools/install-deps.sh --with-openmpi also Open MPI beside MPICH, for the openmpi preset (MPICH stays the
#                                        default mpicxx/mpiexec); best effort
# The flags combine.
#
# The PyTorch 2.x environment: tools/torch2-requirements.txt (pinned) installed with pip into a
# virtual environment outside the checkout, at $HERD_TORCH2_VENV (default ~/.cache/herd/torch2-venv;
# HERD_TORCH2_VENV=off skips it). Made once and reused; made again when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/.."

required=(g++ cmake make python3 mpich libmpich-dev doctest-dev libeigen3-dev libxtensor-dev libarmadillo-dev
          zlib1g-dev dataset-fashion-mnist)
optional=()
with_torch=0
for flag in "$@"; do
  case "$flag" in
    --with-torch) optional+=(libtorch-dev python3-torch python3-venv); with_torch=1 ;;
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

install_packages() {
  local sudo=""
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
}

# PyTorch 2.x from PyPI: its wheel carries libtorch (headers, libraries, CMake package) beside the
# Python module, so one environment serves both sides of the parity checks. Only the wheel's CUDA
# packages that /usr/local/cuda lacks are installed (see the requirements file); the environment
# is checked (import torch, gloo) before it is marked ready.
torch2_environment() {
  local venv="${HERD_TORCH2_VENV:-$HOME/.cache/herd/torch2-venv}"
  local requirements=tools/torch2-requirements.txt
  [[ "$venv" == off ]] && return 0
  cmp -s "$requirements" "$venv/herd-requirements.txt" && [[ -x "$venv/bin/python" ]] && return 0
  if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" ]]; then
    echo "herd: $venv exists and is not a Python environment; set HERD_TORCH2_VENV elsewhere (the torch2 run is skipped)" >&2
    return 0
  fi
  local python=/usr/bin/python3
  [[ -x $python ]] || python=python3
  local start=$SECONDS
  echo "herd: making $venv (PyTorch 2.x from PyPI, $(grep -m1 '^torch==' "$requirements"))"
  rm -rf "$venv"
  if "$python" -m venv "$venv" &&
     "$venv/bin/python" -m pip install --quiet --no-deps --no-cache-dir --only-binary=:all: --disable-pip-version-check \
       -r "$requirements" &&
     "$venv/bin/python" -c 'import numpy, safetensors, torch, torch.distributed as d; assert d.is_gloo_available()'; then
    cp "$requirements" "$venv/herd-requirements.txt"
    echo "herd: $venv is ready ($(du -sh "$venv" | cut -f1), $((SECONDS - start)) s)"
  else
    echo "herd: could not make $venv; the torch2 run will be skipped" >&2
    rm -rf "$venv"
  fi
}

if [[ ${#need[@]} -gt 0 || ${#want[@]} -gt 0 ]]; then
  install_packages
fi
if [[ $with_torch -eq 1 ]]; then
  torch2_environment
fi
