#!/usr/bin/env bash
# Data-parallel scaling of the fashion_mnist example: the same per-rank batch at 1 and 2 ranks
# (weak scaling: the global batch doubles), 2 epochs each, one run at a time. Prints a table from
# the runs' `summary:` lines.
#
#   benchmarks/fashion_mnist.sh                      # build/examples/fashion_mnist, 2 epochs, ranks 1 2
#   RANKS="1 2 4" EPOCHS=3 benchmarks/fashion_mnist.sh --batch-size 128
#
# Environment: BUILD_DIR (default build), RANKS (default "1 2"), EPOCHS (default 2), MPIEXEC
# (default mpiexec). Further arguments go to every run (--train-samples N, --batch-size N, ...).
#
# Columns: seconds per epoch is the slowest rank's time in the training steps (evaluation and
# checkpoints excluded), averaged over the epochs; samples/s is the epoch's samples over all ranks
# divided by it; speed-up is relative to the first rank count; reduce is the fraction of step time
# spent in distributed_optimizer's gradient reduction (waiting for the slower rank included).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
ranks_list=${RANKS:-"1 2"}
epochs=${EPOCHS:-2}
mpiexec=${MPIEXEC:-mpiexec}
program="$build_dir/examples/fashion_mnist"

if [[ ! -x "$program" ]]; then
  echo "fashion_mnist.sh: $program not found; build it first:" >&2
  echo "  cmake --preset default && cmake --build build -j2 --target fashion_mnist" >&2
  exit 1
fi

# Training samples per epoch over all ranks: the sampler pads the set to a multiple of the ranks.
train_samples=60000
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --train-samples) train_samples=${args[i + 1]} ;;
    --train-samples=*) train_samples=${args[i]#*=} ;;
  esac
done
train_samples=$((train_samples < 60000 ? train_samples : 60000))

rows=()
for n in $ranks_list; do
  echo "== mpiexec -n $n $program --epochs $epochs $*" >&2
  log=$("$mpiexec" -n "$n" "$program" --epochs "$epochs" "$@" | tee /dev/stderr)
  summary=$(grep '^summary:' <<<"$log" | tail -n 1)
  [[ -n "$summary" ]] || { echo "fashion_mnist.sh: no summary line from the $n-rank run" >&2; exit 1; }
  rows+=("$summary")
done

echo
echo "# fashion_mnist, $epochs epochs, per-rank batch as given (default 64); $(nproc) cores on $(hostname)"
awk -v samples="$train_samples" '
  {
    for (i = 2; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
    n = v["ranks"]; s = v["seconds_per_epoch"]
    total = int((samples + n - 1) / n) * n
    rate = (s > 0) ? total / s : 0
    if (NR == 1) base = rate
    speedup = (base > 0) ? rate / base : 0   # parenthesized: a bare > in print arguments is a redirection
    printf "%5d  %9.2f  %11.0f  %8.2fx  %7.1f%%  %8.4f\n", n, s, rate, speedup, 100 * v["reduce_fraction"], v["test_accuracy"]
  }
  BEGIN { printf "%5s  %9s  %11s  %9s  %8s  %8s\n", "ranks", "s/epoch", "samples/s", "speed-up", "reduce", "accuracy" }
' <<<"$(printf '%s\n' "${rows[@]}")"
