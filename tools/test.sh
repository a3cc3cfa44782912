#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing, configures, builds, runs ctest.
# Extra arguments go to ctest (e.g. -R mpi).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh --with-torch
cmake --preset default
cmake --build --preset default -j "$(nproc)"
ctest --test-dir build --output-on-failure --no-tests=error "$@"
