#!/usr/bin/env bash
# herd's demo from a fresh clone: installs what is missing, builds the examples, runs one on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default -DHERD_BUILD_TESTS=OFF -DHERD_BUILD_BENCHMARKS=OFF
cmake --build --preset default -j "$(nproc)" --target quickstart
mpiexec -n 2 build/examples/quickstart
