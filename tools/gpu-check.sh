#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds herd's CUDA code for this GPU, runs the GPU suite under
# mpiexec (1 process, then 2 sharing the GPU), the kernel bandwidth benchmark, and prints a short
# summary last. Needs what tools/install-deps.sh installs (MPICH, doctest) and the CUDA toolkit.
#   tools/gpu-check.sh            # CUDA_ARCHITECTURES=90 (H100) unless set
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
log=${LOG_DIR:-$build/gpu-check}
command -v apt-get >/dev/null && tools/install-deps.sh
mkdir -p "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log/gpu.txt"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHERD_BUILD_TESTS=ON -DHERD_BUILD_BENCHMARKS=ON \
      -DHERD_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" >"$log/configure.txt" 2>&1 ||
  { tail -20 "$log/configure.txt"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target gpu_tests cuda_host_tests cuda_kernels >"$log/build.txt" 2>&1 ||
  { tail -30 "$log/build.txt"; exit 1; }

status=0
"$build/tests/cuda/cuda_host_tests" >"$log/host.txt" 2>&1 || status=1
for n in 1 2; do
  HERD_STALL_SHUTDOWN_TIME_SECONDS=60 mpiexec -n $n "$build/tests/gpu/gpu_tests" >"$log/gpu_np$n.txt" 2>&1 || status=1
done
"$build/benchmarks/cuda_kernels" | tee "$log/kernels.txt" || status=1

echo
echo "== herd GPU check =="
echo "gpu:        $(cat "$log/gpu.txt")"
echo "host tests: $(grep -h 'Status:' "$log/host.txt" | tail -1)"
for n in 1 2; do echo "gpu np=$n:   $(grep -h '\[herd\]' "$log/gpu_np$n.txt" | tail -1)"; done
echo "kernels:    $(grep -h '^summary:' "$log/kernels.txt")"
echo "logs:       $log"
exit $status
