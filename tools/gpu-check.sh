#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds herd's CUDA code for it, runs the GPU suite under
# mpiexec (1 process, then 2 and 3 sharing the GPU), the kernel and collective benchmarks and the
# GPU training example, and prints one summary last. Self-contained: where .gpu-bundle/ holds the
# Debian packages tools/gpu-bundle.sh fetched, they are unpacked into the build folder (dpkg -x)
# and used from there, so the GPU machine needs neither a package manager nor a network; else, on
# a Debian machine, tools/install-deps.sh installs them. Needs the CUDA toolkit, CMake and NCCL
# (the toolkit's, NCCL_HOME, or the nvidia-nccl wheel of the machine's python3).
#   tools/gpu-check.sh            # CUDA_ARCHITECTURES=90 (H100) unless set
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=$(realpath -m "${BUILD_DIR:-build-gpu}")
log=${LOG_DIR:-$build/gpu-check}
bundle=${GPU_BUNDLE:-.gpu-bundle}
mkdir -p "$log"
cmake_args=()
data=/usr/share/datasets/fashion-mnist

if compgen -G "$bundle/*.deb" >/dev/null; then
  prefix="$build/deps"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$bundle"/*.deb; do dpkg -x "$f" "$prefix" || { echo "herd: could not unpack $f" >&2; exit 1; }; done
  # MPICH's compiler wrappers name the paths it was installed under; point them into the prefix.
  sed -i "s|/usr/|$prefix/usr/|g" "$prefix/usr/bin/mpicc.mpich" "$prefix/usr/bin/mpicxx.mpich"
  export PATH="$prefix/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DMPI_C_COMPILER="$prefix/usr/bin/mpicc.mpich"
               -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.mpich" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec.hydra"
               -DZLIB_INCLUDE_DIR="$prefix/usr/include")
  # zlib1g-dev's libz.so points at a library of zlib1g, which every image has already.
  zlib=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  [[ -n "$zlib" ]] && cmake_args+=(-DZLIB_LIBRARY="$zlib")
  data="$prefix/usr/share/datasets/fashion-mnist"
  mpiexec="$prefix/usr/bin/mpiexec.hydra"
  echo "herd: using the $(ls "$bundle"/*.deb | wc -l) packages of $bundle, unpacked in $prefix"
else
  command -v apt-get >/dev/null && tools/install-deps.sh
  mpiexec=$(command -v mpiexec || echo mpiexec)
fi

# NCCL: NCCL_HOME, the toolkit's, or the nvidia-nccl wheel of python3 (PyTorch's).
if [[ -z "${NCCL_HOME:-}" ]] && ! compgen -G "/usr/local/cuda/include/nccl.h" >/dev/null; then
  wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  [[ -n "$wheel" && -e "$wheel/include/nccl.h" ]] && export NCCL_HOME="$wheel"
fi
[[ -n "${NCCL_HOME:-}" ]] && export LD_LIBRARY_PATH="$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$log/gpu.txt" 2>&1 ||
  echo "no GPU (nvidia-smi failed)" >"$log/gpu.txt"
{
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"
  echo "nccl: ${NCCL_HOME:-from the CUDA toolkit}"
  echo "mpi:  $("$mpiexec" --version 2>/dev/null | grep -m1 -i version)"
} >"$log/versions.txt"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHERD_BUILD_TESTS=ON -DHERD_BUILD_BENCHMARKS=ON \
      -DHERD_BUILD_EXAMPLES=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" "${cmake_args[@]}" \
      >"$log/configure.txt" 2>&1 || { tail -30 "$log/configure.txt"; exit 1; }
targets=(gpu_tests cuda_host_tests cuda_kernels gpu_collectives train_gpu device_tensor)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$log/build.txt" 2>&1 ||
  { tail -40 "$log/build.txt"; exit 1; }

status=0
run() {  # run NAME COMMAND...: output in $log/NAME.txt
  local name=$1
  shift
  HERD_STALL_SHUTDOWN_TIME_SECONDS=120 timeout 900 "$@" >"$log/$name.txt" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || { status=1; echo "(exit status $rc)" >>"$log/$name.txt"; }
}
run host "$build/tests/cuda/cuda_host_tests"
for n in 1 2 3; do run "gpu_np$n" "$mpiexec" -n $n "$build/tests/gpu/gpu_tests"; done
run kernels "$build/benchmarks/cuda_kernels"
run collectives_np1 "$mpiexec" -n 1 "$build/benchmarks/gpu_collectives"
run collectives_np2 "$mpiexec" -n 2 "$build/benchmarks/gpu_collectives"
run device_tensor "$mpiexec" -n 2 "$build/examples/cuda/device_tensor"
run train_gpu_np1 "$mpiexec" -n 1 "$build/examples/cuda/train_gpu" --data "$data"
run train_gpu_np2 "$mpiexec" -n 2 "$build/examples/cuda/train_gpu" --data "$data"

summary() { grep -h "$1" "$log/$2.txt" 2>/dev/null | tail -1; }
echo
echo "== herd GPU check =="
echo "gpu:         $(cat "$log/gpu.txt")"
sed 's/^/             /' "$log/versions.txt"
echo "host tests:  $(summary 'Status:' host)"
for n in 1 2 3; do echo "gpu np=$n:    $(summary 'test cases:' "gpu_np$n") $(summary '\[herd\]' "gpu_np$n")"; done
echo "kernels:     $(summary '^summary:' kernels)"
echo "collectives: np1 $(summary '^summary:' collectives_np1); np2 $(summary '^summary:' collectives_np2)"
echo "train_gpu:   np1 $(summary 'final test accuracy' train_gpu_np1); np2 $(summary 'final test accuracy' train_gpu_np2)"
echo "logs:        $log"
exit $status
