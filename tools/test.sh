#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, configures, builds, runs ctest
# (libtorch and PyTorch: Debian's 1.13); then the MPI tests again against Open MPI when it is
# installed (the openmpi preset); then every libtorch test, example and parity check again against
# PyTorch 2.x from the environment tools/install-deps.sh makes (the torch2 preset).
# Extra arguments go to the first ctest (e.g. -R mpi).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh --with-torch --with-openmpi
# Every build below on every core (the workflow preset's build too, which takes no -j).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
cmake --preset default
cmake --build --preset default
# -j: compile checks and one-process tests run two at a time; tests of several ranks (PROCESSORS)
# run alone.
ctest --test-dir build --output-on-failure --no-tests=error -j "$(nproc)" "$@"
if command -v mpicxx.openmpi >/dev/null && command -v mpiexec.openmpi >/dev/null; then
  cmake --workflow --preset openmpi
else
  echo "herd: Open MPI is not installed; its run of the MPI tests is skipped"
fi
torch2_venv="${HERD_TORCH2_VENV:-$HOME/.cache/herd/torch2-venv}"
if [[ -f "$torch2_venv/herd-requirements.txt" ]]; then
  cmake --preset torch2 -DHERD_TORCH_PYTHON="$torch2_venv/bin/python"
  cmake --build --preset torch2
  ctest --preset torch2 -j "$(nproc)"
else
  echo "herd: no PyTorch 2.x environment at $torch2_venv (tools/install-deps.sh --with-torch makes it);" \
       "the libtorch tests against PyTorch 2.x are skipped"
fi
