#!/usr/bin/env bash
# herd's demo from a fresh clone: installs what is missing (Eigen, zlib and the Fashion-MNIST data
# included), builds the examples, runs the README's quickstart and trains the fashion_mnist MLP on
# 2 MPI ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default
cmake --build --preset default -j "$(nproc)" --target quickstart fashion_mnist
mpiexec -n 2 build/examples/quickstart
mpiexec -n 2 build/examples/fashion_mnist
