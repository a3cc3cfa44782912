#!/usr/bin/env bash
# herd + libtorch at two builds (two commits), side by side on the same machine and data:
#
#   benchmarks/vs_pytorch_ddp/compare_builds.sh BUILD_A BUILD_B [ROUNDS]
#
# Each BUILD is a build folder holding examples/libtorch_mnist (cmake --build DIR --target
# libtorch_mnist). Runs Horovod's MNIST net for one epoch and the MLP (MODEL=mlp) for STEPS steps
# (default 30), at RANKS ranks (default 2), MODELS (default "cnn mlp"), with both reductions (ddp: buckets during backward;
# optimizer: one fused allreduce after it), alternating the builds ROUNDS times (default 3) so
# that the machine's slow moments fall on both; prints each configuration's median samples/s per
# build and their ratio B/A. The training and its options are run.sh's.
set -euo pipefail
a=${1:?usage: compare_builds.sh BUILD_A BUILD_B [ROUNDS]}
b=${2:?usage: compare_builds.sh BUILD_A BUILD_B [ROUNDS]}
rounds=${3:-3}
ranks=${RANKS:-2}
steps=${STEPS:-30}
models=${MODELS:-cnn mlp}
mpiexec=${MPIEXEC:-mpiexec}
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# One run: prints its samples/s (the summary line's samples_per_second).
rate() {
  local build=$1 model=$2 reduction=$3 extra=()
  [[ $model == mlp ]] && extra=(--steps "$steps")
  "$mpiexec" -n "$ranks" "$build/examples/libtorch_mnist" --epochs 1 --threads 1 --batch-size 64 --lr 0.01 \
    --model "$model" --reduction "$reduction" "${extra[@]}" | grep '^summary:' | tail -n 1 |
    tr ' ' '\n' | sed -n 's/^samples_per_second=//p'
}

for ((r = 1; r <= rounds; ++r)); do
  for model in $models; do
    for reduction in ddp optimizer; do
      for side in A B; do
        build=$a
        [[ $side == B ]] && build=$b
        echo "$model $reduction $side $(rate "$build" "$model" "$reduction")" | tee -a "$results" >&2
      done
    done
  done
done

echo "# samples/s, median of $rounds alternating runs at $ranks ranks; A = $a, B = $b; load before the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    model, reduction, side, value = line.split()
    rows.setdefault((model, reduction), {}).setdefault(side, []).append(float(value))
print(f"{'model':6} {'reduction':10} {'A':>10} {'B':>10} {'B/A':>7}   runs A | runs B")
for (model, reduction), sides in rows.items():
    ma, mb = statistics.median(sides["A"]), statistics.median(sides["B"])
    runs = lambda s: " ".join(f"{v:.0f}" for v in sides[s])
    print(f"{model:6} {reduction:10} {ma:10.1f} {mb:10.1f} {mb / ma:7.3f}   {runs('A')} | {runs('B')}")
PY
