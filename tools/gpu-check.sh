#!/usr/bin/env bash
# herd's GPU check, in one call on a machine with an NVIDIA GPU: builds herd's CUDA code for it,
# runs the CUDA host tests, the GPU suite under mpiexec (1, 2 and 3 processes sharing the GPU),
# the kernel and collective benchmarks and the GPU examples; where the machine's python3 has
# PyTorch with CUDA, also herd's libtorch parts against it, compiled by the host compiler as
# libtorch programs are (the libtorch tests, CUDA gradients over NCCL at 1 and 2 processes,
# libtorch_mnist on the GPU, and benchmarks/vs_pytorch_ddp on the GPU against PyTorch DDP over
# nccl); and writes everything a reader needs into one folder, OUT_DIR (default: the build
# folder), as at most 8 files:
#   env.txt          OS, glibc, CMake, compilers, nvcc, driver, GPU, compute mode, PCIe link, NCCL,
#                    MPI, /dev/shm, the commit
#   build.txt        the configure and build logs, each line timestamped
#   tests.txt        CUDA host tests; GPU suite at 1, 2, 3 processes; libtorch tests (CUDA over NCCL
#                    at 1 and 2 processes, the CPU ones at 2); compute-sanitizer memcheck
#   kernels.txt      the kernel benchmark, run twice (the spread)
#   collectives.txt  the collective benchmark at 1 and 2 processes; the hand-over to the progress
#                    thread (benchmarks/handoff) at 1, 2 and 4
#   examples.txt     device_tensor at 2 processes, train_gpu at 1 and 2; libtorch_mnist on the GPU (DDP
#                    wrapper and distributed_optimizer) at 1 and 2; vs_pytorch_ddp on the GPU, and at
#                    1 rank on the CPU (the forward pass in C++ and Python on one libtorch)
#   summary.txt      one line per phase: passed, failed (exit status), or skipped and why
#   logs.tgz         every log in full
# Each run has its own timeout (RUN_SECONDS, default 150) and HERD_STALL_SHUTDOWN_TIME_SECONDS=60,
# so one hang costs one run. A run whose target CMake did not create (train_gpu needs cuBLAS and
# zlib) or that would overrun the whole budget (BUDGET_SECONDS, default 420) is skipped and said.
# Times measured on 16 cores and one H100 (2026-11-26; the whole check 158-190 s):
#   unpack the bundle, configure       10 s
#   build (6 targets, sm_90 only)      63-80 s
#   CUDA host tests                    3 s
#   GPU suite, 1 + 2 + 3 processes     24-27 s
#   kernel benchmark, twice            13-18 s
#   collective benchmark, 1 + 2 procs  14-15 s
#   device_tensor, train_gpu 1 + 2     4-5 s (2 epochs each)
#   compute-sanitizer memcheck, GPU suite at 1 process: 26-29 s, only if 120 s of the budget are left
# With PyTorch (one H200, 2026-11-27): the build of gpu_tests, torch_cuda_tests, torch_mpi_tests and
# libtorch_mnist 67 s; libtorch_mnist 4-5 s a run; vs_pytorch_ddp 20 s a GPU round at 1 rank, 24-32 s
# a CPU round. NCCL takes one GPU per rank: on a machine with one GPU, set VS_DDP_GPU_RANKS=1; the
# 2-process runs of torch_cuda_tests skip and those of libtorch_mnist stop with NCCL's message.
#
# Self-contained: where .gpu-bundle/ holds the Debian packages tools/gpu-bundle.sh fetched (MPICH,
# doctest, zlib's header, Fashion-MNIST), they are unpacked into the build folder (dpkg -x, or ar
# and tar where there is no dpkg) and used from there: the GPU machine needs no package manager
# and no network. Else, on a Debian machine, tools/install-deps.sh installs them. Needs the CUDA
# toolkit (/usr/local/cuda/bin is put on PATH), CMake, and NCCL (NCCL_HOME, the toolkit's, or the
# nvidia-nccl wheel of the machine's python3).
#   OUT_DIR=/some/folder tools/gpu-check.sh       # CUDA_ARCHITECTURES=90 (H100, H200) unless set
# Also read: BUILD_DIR (build-gpu), GPU_BUNDLE (.gpu-bundle), CMAKE_ARGS, BUDGET_SECONDS, RUN_SECONDS,
# TARGETS (a subset of the targets above, to rerun a part: TARGETS=train_gpu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
start=$SECONDS
budget=${BUDGET_SECONDS:-420}
run_seconds=${RUN_SECONDS:-150}
build=$(realpath -m "${BUILD_DIR:-build-gpu}")
out=$(realpath -m "${OUT_DIR:-$build}")
bundle=${GPU_BUNDLE:-.gpu-bundle}
logs="$build/gpu-check-logs"  # one file per run; packed into logs.tgz
rm -rf "$logs"
mkdir -p "$out" "$logs"
rm -f "$out"/{env,build,tests,kernels,collectives,examples,summary}.txt "$out/logs.tgz"
export PATH="/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer:$PATH"
export HYDRA_LAUNCHER=fork  # every process on this machine: no ssh
data=/usr/share/datasets/fashion-mnist
summary=()
note() { summary+=("$(printf '%-24s %s' "$1" "$2")"); }
stamp() { while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done; }
left() { echo $((budget - (SECONDS - start))); }

# MPICH's launcher resolves this machine's name; a container's often does not resolve.
if ! getent hosts "$(hostname)" >/dev/null 2>&1; then
  if echo "127.0.0.1 $(hostname)" >>/etc/hosts 2>/dev/null; then
    note "hostname" "$(hostname) did not resolve: added to /etc/hosts"
  else
    note "hostname" "$(hostname) does not resolve and /etc/hosts is not writable: mpiexec may fail"
  fi
fi

read -ra cmake_args <<<"${CMAKE_ARGS:-}"  # more configure arguments, if any
mpiexec=$(command -v mpiexec || echo mpiexec)
if compgen -G "$bundle/*.deb" >/dev/null; then
  prefix="$build/deps"
  rm -rf "$prefix" && mkdir -p "$prefix"
  unpacked=0
  unpack_with=${UNPACK_WITH:-$(command -v dpkg >/dev/null && echo dpkg || echo ar)}  # UNPACK_WITH=ar tries the fallback
  for f in "$bundle"/*.deb; do
    if [[ $unpack_with == dpkg ]]; then
      dpkg -x "$f" "$prefix" && unpacked=$((unpacked + 1))
    else  # a .deb is an ar archive whose data.tar.* holds the files
      member=$(ar t "$f" | grep '^data\.tar')
      case "$member" in
        *.xz) ar p "$f" "$member" | tar -xJ -C "$prefix" ;;
        *.zst) ar p "$f" "$member" | zstd -dc | tar -x -C "$prefix" ;;
        *.gz) ar p "$f" "$member" | tar -xz -C "$prefix" ;;
        *) ar p "$f" "$member" | tar -x -C "$prefix" ;;
      esac && unpacked=$((unpacked + 1))
    fi
  done
  # MPICH's compiler wrappers name the paths it was installed under; point them into the prefix.
  sed -i "s|/usr/|$prefix/usr/|g" "$prefix/usr/bin/mpicc.mpich" "$prefix/usr/bin/mpicxx.mpich"
  export PATH="$prefix/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DMPI_C_COMPILER="$prefix/usr/bin/mpicc.mpich"
               -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.mpich" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec.hydra"
               -DZLIB_INCLUDE_DIR="$prefix/usr/include")
  # zlib1g-dev's libz.so points at a library of zlib1g, which every image has already.
  zlib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  [[ -n "$zlib" ]] && cmake_args+=(-DZLIB_LIBRARY="$zlib")
  data="$prefix/usr/share/datasets/fashion-mnist"
  mpiexec="$prefix/usr/bin/mpiexec.hydra"
  note "packages" "$unpacked of $(ls "$bundle"/*.deb | wc -l) from $bundle unpacked (with $unpack_with)"
elif command -v apt-get >/dev/null; then
  tools/install-deps.sh >"$logs/install-deps.txt" 2>&1 && note "packages" "installed by tools/install-deps.sh" ||
    note "packages" "tools/install-deps.sh failed (see logs.tgz)"
  mpiexec=$(command -v mpiexec || echo mpiexec)
fi

# NCCL: NCCL_HOME, the toolkit's, or the nvidia-nccl wheel of python3 (PyTorch's).
if [[ -z "${NCCL_HOME:-}" ]] && ! compgen -G "/usr/local/cuda/include/nccl.h" >/dev/null; then
  wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  [[ -n "$wheel" && -e "$wheel/include/nccl.h" ]] && export NCCL_HOME="$wheel"
fi
if [[ -z "${NCCL_HOME:-}" ]] && ! compgen -G "/usr/local/cuda/include/nccl.h" >/dev/null; then
  # Another wheel layout (nvidia/cu13/...): look for the header in python3's site folders.
  sites=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
  # shellcheck disable=SC2086
  found=$(find $sites -name nccl.h -path '*include*' 2>/dev/null | head -1)
  [[ -n "$found" ]] && export NCCL_HOME="$(dirname "$(dirname "$found")")"
fi
[[ -n "${NCCL_HOME:-}" ]] && export LD_LIBRARY_PATH="$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}"

# PyTorch's libtorch (the wheel carries it) for herd's libtorch parts, when python3 has torch:
# CMake takes libtorch, and the parity checks their Python, from that environment.
if python3 -c 'import torch' >/dev/null 2>&1; then
  cmake_args+=(-DHERD_TORCH_PYTHON="$(command -v python3)")
fi
nccl_header=${NCCL_HOME:+$NCCL_HOME/include/nccl.h}
nccl_header=${nccl_header:-/usr/local/cuda/include/nccl.h}

gpu_present=0
gpu_line="none (nvidia-smi -L failed)"
if nvidia-smi -L >/dev/null 2>&1; then
  gpu_present=1
  gpu_line=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1 | head -1)
fi
{
  echo "date:        $(date -u '+%F %T UTC')"
  # The bundle's record first: a copy of the checkout may carry a .git older than its files.
  echo "commit:      $(cat "$bundle/commit.txt" 2>/dev/null || git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "host:        $(hostname), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "os:          $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), kernel $(uname -r)"
  echo "glibc:       $(getconf GNU_LIBC_VERSION 2>/dev/null)"
  echo "cmake:       $(cmake --version 2>/dev/null | head -1)"
  echo "ninja:       $(ninja --version 2>/dev/null || echo none)"
  echo "c++:         $(c++ --version 2>/dev/null | head -1)"
  echo "nvcc:        $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' || echo 'not found')"
  echo "nccl:        $nccl_header ($(awk '/define NCCL_(MAJOR|MINOR|PATCH) / {printf "%s%s", sep, $3; sep="."}' "$nccl_header" 2>/dev/null))"
  echo "mpi:         $mpiexec ($("$mpiexec" --version 2>/dev/null | grep -m1 -i version | tr -s ' \t' ' ' | sed 's/^ //'))"
  echo "python3:     $(python3 --version 2>&1)"
  echo "torch:       $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo none)"
  echo "/dev/shm:    $(df -h /dev/shm 2>/dev/null | awk 'NR == 2 {print $2 " total, " $4 " free"}')"
  echo "gpu:"
  if [[ $gpu_present == 1 ]]; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks.max.sm,clocks.max.mem,power.limit --format=csv 2>&1
    nvidia-smi topo -m 2>&1
  else
    echo "  none: nvidia-smi -L failed ($(nvidia-smi -L 2>&1 | head -1))"
  fi
} >"$out/env.txt" 2>&1

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
{
  echo "== configure"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DHERD_BUILD_TESTS=ON -DHERD_BUILD_BENCHMARKS=ON \
        -DHERD_BUILD_EXAMPLES=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" "${cmake_args[@]}" 2>&1
  echo "== configure exit status $?"
} | stamp >"$logs/configure.txt"
binary() {  # binary TARGET: its path, if it was built
  local found
  found=$(find "$build" -type f -name "$1" -perm -u+x 2>/dev/null | head -1)
  [[ -n "$found" ]] && echo "$found"
}
wanted=(cuda_host_tests gpu_tests cuda_kernels gpu_collectives device_tensor train_gpu torch_cuda_tests torch_mpi_tests
        libtorch_mnist)
[[ -n "${TARGETS:-}" ]] && read -ra wanted <<<"$TARGETS"  # a subset, to rerun a part; the rest is skipped and said
known=$(cmake --build "$build" --target help 2>"$logs/targets.txt")
targets=()
for t in "${wanted[@]}"; do
  # Where the generator could not list its targets, build what was asked and let the build say.
  if [[ -z "$known" ]] || grep -Eq "^(\.\.\. )?$t(:| |$)" <<<"$known"; then targets+=("$t"); else note "$t" "skipped: CMake did not create the target (see build.txt)"; fi
done
build_started=$SECONDS
for t in "${targets[@]}"; do rm -f "$(binary "$t")"; done  # a failed build leaves no stale binary to run
if [[ ${#targets[@]} -gt 0 ]]; then
  keep_going=(-- -k 0)
  [[ ${#generator[@]} -eq 0 ]] && keep_going=(-- -k)
  {
    echo "== build ${targets[*]}"
    cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" "${keep_going[@]}" 2>&1
    echo "== build exit status $?"
  } | stamp >"$logs/build.txt"
fi
cat "$logs/configure.txt" "$logs/build.txt" >"$out/build.txt" 2>/dev/null
note "build" "$(grep -q '^.\{9\}== build exit status 0' "$logs/build.txt" 2>/dev/null && echo passed || echo 'FAILED (see build.txt)') in $((SECONDS - build_started)) s (${#targets[@]} targets)"

status=0
# run GROUP NAME NEEDS_GPU TARGET COMMAND...: output in $logs/NAME.txt, appended to GROUP.txt.
# TARGET's binary stands for the word @ in COMMAND.
run() {
  local group=$1 name=$2 needs_gpu=$3 target=$4
  shift 4
  local path
  path=$(binary "$target")
  if [[ -z "$path" ]]; then
    note "$name" "skipped: $target was not built"
    return
  fi
  if [[ $needs_gpu == 1 && $gpu_present == 0 ]]; then
    note "$name" "skipped: no CUDA device (nvidia-smi -L failed)"
    return
  fi
  local limit=$run_seconds remaining
  remaining=$(($(left) - 10))
  ((remaining < limit)) && limit=$remaining
  if ((limit < 20)); then
    note "$name" "skipped: the time budget of ${budget} s is spent"
    return
  fi
  local cmd=("${@/#@/$path}")
  local t0=$SECONDS
  HERD_STALL_SHUTDOWN_TIME_SECONDS=60 timeout -k 5 "$limit" "${cmd[@]}" >"$logs/$name.txt" 2>&1
  local rc=$? took=$((SECONDS - t0))
  local result="passed"
  if [[ $rc == 77 ]]; then result="skipped (exit 77: no CUDA device, or fewer GPUs than ranks for NCCL)"
  elif [[ $rc == 124 || $rc == 137 ]]; then result="FAILED: timed out after ${limit} s"; status=1
  elif [[ $rc != 0 ]]; then result="FAILED: exit status $rc"; status=1
  fi
  local last
  last=$(grep -hE '^summary:|test cases:|Status:|final test accuracy|All tests passed|ERROR SUMMARY' "$logs/$name.txt" | tail -1)
  note "$name" "$result in ${took} s${last:+; $last}"
  {
    echo "=== $name: ${cmd[*]} ($result, ${took} s, timeout ${limit} s)"
    cat "$logs/$name.txt"
    echo
  } >>"$out/$group.txt"
}
run tests host 0 cuda_host_tests @
for n in 1 2 3; do run tests "gpu_np$n" 1 gpu_tests "$mpiexec" -n $n @; done
for k in 1 2; do run kernels "kernels_run$k" 1 cuda_kernels @ --max-mib 1024 --reps 20; done
for n in 1 2; do run collectives "collectives_np$n" 1 gpu_collectives "$mpiexec" -n $n @ --max-mib 1024 --reps 7; done
# What handing a bucket to the progress thread costs, with a core per thread (benchmarks/handoff.cpp).
for n in 1 2 4; do run collectives "handoff_np$n" 0 handoff "$mpiexec" -n $n @ --ops 2000 --reps 7; done
for n in 1 2; do run tests "torch_cuda_np$n" 1 torch_cuda_tests "$mpiexec" -n $n @; done
run tests torch_cpu_np2 0 torch_mpi_tests "$mpiexec" -n 2 @
run examples device_tensor 1 device_tensor "$mpiexec" -n 2 @
for n in 1 2; do run examples "train_gpu_np$n" 1 train_gpu "$mpiexec" -n $n @ --data "$data" --epochs 2; done
for n in 1 2; do
  for reduction in ddp optimizer; do
    run examples "libtorch_mnist_${reduction}_np$n" 1 libtorch_mnist "$mpiexec" -n $n @ --data "$data" --epochs 1 --reduction $reduction
  done
done
# Before the long benchmark rounds below, so that a budget they spend does not skip it.
if command -v compute-sanitizer >/dev/null; then
  if (($(left) >= 120)); then
    # API errors are not reported: NCCL's set-up probes for kernel images of other architectures
    # and each probe's error (cudaErrorNoKernelImageForDevice, handled by NCCL) would count as one.
    run tests memcheck 1 gpu_tests "$mpiexec" -n 1 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 @
  else
    note "memcheck" "skipped: $(left) s left of the budget, fewer than 120"
  fi
else
  note "memcheck" "skipped: compute-sanitizer not found"
fi

# herd against PyTorch DDP over nccl, same model, batch and GPU; VS_DDP_ROUNDS alternating rounds.
# Then the same on the CPU (GPU hidden), in rounds, on this machine's cores: by default at 1 rank,
# where no reduction runs (the C++ forward pass beside Python's on the same libtorch); with
# VS_DDP_CPU_RANKS="2 4 8" and VS_DDP_CPU_MODELS="cnn mlp", herd's overlapped and blocking
# reductions beside DDP's with a core per rank (the MLP for VS_DDP_MLP_STEPS steps, default 40).
for ((round = 1; round <= ${VS_DDP_ROUNDS:-2}; ++round)); do
  run examples "vs_ddp_gpu_round$round" 1 libtorch_mnist env DEVICE=cuda BUILD_DIR="$build" MPIEXEC="$mpiexec" PYTHON=python3 \
      DATA="$data" RANKS="${VS_DDP_GPU_RANKS:-1 2}" STEPS="${VS_DDP_STEPS:-400}" benchmarks/vs_pytorch_ddp/run.sh
done
for ((round = 1; round <= ${VS_DDP_CPU_ROUNDS:-3}; ++round)); do
  for model in ${VS_DDP_CPU_MODELS:-cnn}; do
    steps=${VS_DDP_STEPS:-400}
    [[ $model == mlp ]] && steps=${VS_DDP_MLP_STEPS:-40}
    run examples "vs_ddp_cpu_${model}_round$round" 0 libtorch_mnist env DEVICE=cpu BUILD_DIR="$build" MPIEXEC="$mpiexec" \
        PYTHON=python3 DATA="$data" MODEL="$model" RANKS="${VS_DDP_CPU_RANKS:-1}" STEPS="$steps" benchmarks/vs_pytorch_ddp/run.sh
  done
done
# A file that grew past what comes back keeps its head and tail; logs.tgz holds it whole.
for f in "$out"/{build,tests,kernels,collectives,examples}.txt; do
  [[ -f "$f" ]] || continue
  if (($(stat -c %s "$f") > 15 * 1024 * 1024)); then
    { head -c 7M "$f"; printf '\n[... trimmed: the whole log is in logs.tgz ...]\n'; tail -c 7M "$f"; } >"$f.trimmed"
    mv "$f.trimmed" "$f"
  fi
done
tar -czf "$out/logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")" 2>/dev/null
if (($(stat -c %s "$out/logs.tgz") > 15 * 1024 * 1024)); then  # keep the last MiB of each log
  for f in "$logs"/*.txt; do tail -c 1M "$f" >"$f.tail" && mv "$f.tail" "$f"; done
  tar -czf "$out/logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"
fi
{
  echo "herd GPU check, $(date -u '+%F %T UTC'), $((SECONDS - start)) s of a ${budget}-s budget"
  grep -E '^(commit|nvcc|nccl):' "$out/env.txt"
  echo "gpu:         $gpu_line"
  printf '%s\n' "${summary[@]}"
  echo "result:                  $([[ $status == 0 ]] && echo 'no failures' || echo 'FAILURES (see above)')"
} >"$out/summary.txt"
cat "$out/summary.txt"
exit $status
