#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, configures, builds, runs ctest;
# then the MPI tests again against Open MPI when it is installed (the openmpi preset).
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
