#!/usr/bin/env bash
# Runs the benchmarks behind benchmarks/plots/ one after another, saves each raw output in
# benchmarks/results/ (a few '#' lines naming the machine, commit and command, then the output), and
# draws the figures with plot.py. Timings need an otherwise idle machine: run nothing else meanwhile.
#
#   cmake --preset default && cmake --build build -j2 --target allreduce fashion_mnist libtorch_mnist
#   benchmarks/make_plots.sh                        # every step below, then the figures
#   benchmarks/make_plots.sh gloo plots             # only these steps; figures from the results there are
#
# Steps, in this order:
#   allreduce      mpiexec -n 2 allreduce --reps 9 --async-max-bytes 0                  (8 B .. 256 MiB)
#                  mpiexec -n 4 allreduce --reps 5 --max-bytes 67108864 --async-max-bytes 0
#   gloo           gloo_allreduce.sh 2 --reps 9; gloo_allreduce.sh 4 --reps 5 --max-bytes 67108864
#   fashion_mnist  EPOCHS=3 fashion_mnist.sh                                            (1 and 2 ranks)
#   ddp            vs_pytorch_ddp/run.sh; MODEL=mlp STEPS=60 vs_pytorch_ddp/run.sh      (1 and 2 ranks)
#   plots          plot.py: plots/allreduce_np<N>.png per rank count, plots/training.png
#
# Environment: BUILD_DIR (default build), RESULTS_DIR (default benchmarks/results), PLOTS_DIR (default
# benchmarks/plots), MPIEXEC (default mpiexec), PYTHON (default /usr/bin/python3), QUICK=1 (small sizes
# and few steps: checks that every step runs and draws; its figures mean nothing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

build_dir=${BUILD_DIR:-$root/build}
results=${RESULTS_DIR:-$here/results}
plots=${PLOTS_DIR:-$here/plots}
mpiexec=${MPIEXEC:-mpiexec}
python=${PYTHON:-/usr/bin/python3}
quick=${QUICK:-0}
export BUILD_DIR=$build_dir MPIEXEC=$mpiexec PYTHON=$python

all_steps=(allreduce gloo fashion_mnist ddp plots)
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=("${all_steps[@]}")
for s in "${steps[@]}"; do
  if [[ " ${all_steps[*]} " != *" $s "* ]]; then
    echo "make_plots.sh: unknown step '$s'; the steps are: ${all_steps[*]}" >&2
    exit 2
  fi
done
wants() { [[ " ${steps[*]} " == *" $1 "* ]]; }

# Every program the chosen steps need, checked before the first measurement starts.
missing=()
wants allreduce && [[ ! -x $build_dir/benchmarks/allreduce ]] && missing+=(allreduce)
wants fashion_mnist && [[ ! -x $build_dir/examples/fashion_mnist ]] && missing+=(fashion_mnist)
wants ddp && [[ ! -x $build_dir/examples/libtorch_mnist ]] && missing+=(libtorch_mnist)
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "make_plots.sh: ${missing[*]} not found in $build_dir; build first:" >&2
  echo "  cmake --preset default -B $build_dir && cmake --build $build_dir -j2 --target ${missing[*]}" >&2
  exit 1
fi

mkdir -p "$results" "$plots"
mpi_version=$("$mpiexec" --version 2>&1 | awk '/HYDRA/ {hydra = 1} hydra && /Version:/ {print "MPICH " $2; exit}
                                                /Open MPI|OpenRTE/ {print; exit}' || true)
machine="$(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -n 1)),\
 $(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GiB, $(uname -sr)${mpi_version:+; $mpi_version}"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit+=" with uncommitted changes"

# measure NAME COMMAND...: runs the command, its stdout into results/NAME.txt behind the '#' lines;
# the file is replaced only when the command succeeds.
measure() {
  local name=$1 start
  shift
  start=$SECONDS
  echo "== $name: $*" >&2
  if ! {
    echo "# machine: $machine"
    echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit," \
      "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# command: $*"
    "$@"
  } >"$results/$name.txt.partial"; then
    rm -f "$results/$name.txt.partial"
    echo "make_plots.sh: $name failed (its output is above); $results/$name.txt is left as it was" >&2
    exit 1
  fi
  mv "$results/$name.txt.partial" "$results/$name.txt"
  echo "== $name: $((SECONDS - start)) s, saved in $results/$name.txt" >&2
}

if [[ $quick == 1 ]]; then
  np2=(--max-bytes 1048576 --reps 3)
  np4=(--max-bytes 65536 --reps 3)
  fashion=(env EPOCHS=1 "$here/fashion_mnist.sh" --train-samples 4096)
  cnn=(env STEPS=20 "$here/vs_pytorch_ddp/run.sh")
  mlp=(env MODEL=mlp STEPS=3 "$here/vs_pytorch_ddp/run.sh")
else
  np2=(--reps 9)
  np4=(--reps 5 --max-bytes 67108864)
  fashion=(env EPOCHS=3 "$here/fashion_mnist.sh")
  cnn=("$here/vs_pytorch_ddp/run.sh")
  mlp=(env MODEL=mlp STEPS=60 "$here/vs_pytorch_ddp/run.sh")
fi

if wants allreduce; then
  measure allreduce_np2 "$mpiexec" -n 2 "$build_dir/benchmarks/allreduce" "${np2[@]}" --async-max-bytes 0
  measure allreduce_np4 "$mpiexec" -n 4 "$build_dir/benchmarks/allreduce" "${np4[@]}" --async-max-bytes 0
fi
if wants gloo; then
  measure gloo_np2 "$here/gloo_allreduce.sh" 2 "${np2[@]}"
  measure gloo_np4 "$here/gloo_allreduce.sh" 4 "${np4[@]}"
fi
if wants fashion_mnist; then
  measure fashion_mnist "${fashion[@]}"
fi
if wants ddp; then
  measure vs_pytorch_ddp_cnn "${cnn[@]}"
  measure vs_pytorch_ddp_mlp "${mlp[@]}"
fi

if wants plots; then
  drawn=0
  for herd in "$results"/allreduce_np*.txt; do
    [[ -e $herd ]] || continue
    name=$(basename "$herd" .txt)
    gloo="$results/gloo_${name#allreduce_}.txt"
    peers=()
    [[ -e $gloo ]] && peers=(--gloo "$gloo")
    "$python" "$here/plot.py" allreduce --herd "$herd" "${peers[@]}" -o "$plots/$name.png"
    drawn=$((drawn + 1))
  done
  training=()
  [[ -e $results/fashion_mnist.txt ]] && training+=(--fashion-mnist "$results/fashion_mnist.txt")
  for model in cnn mlp; do
    [[ -e $results/vs_pytorch_ddp_$model.txt ]] && training+=(--ddp "$results/vs_pytorch_ddp_$model.txt")
  done
  if [[ ${#training[@]} -gt 0 ]]; then
    "$python" "$here/plot.py" training "${training[@]}" -o "$plots/training.png"
    drawn=$((drawn + 1))
  fi
  if [[ $drawn == 0 ]]; then
    echo "make_plots.sh: no results in $results to draw; run the measuring steps first" >&2
    exit 1
  fi
fi
