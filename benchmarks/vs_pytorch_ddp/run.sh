#!/usr/bin/env bash
# herd + libtorch (C++) against PyTorch DDP (Python, gloo) on the same training: Horovod's MNIST
# net (or, MODEL=mlp, an MLP 784-2048-2048-10 with 23 MB of gradients) on Fashion-MNIST, batch 64 (BATCH)
# per rank, SGD lr 0.01 x ranks with momentum 0.5, one intra-op thread per rank, the same number
# of steps. herd runs twice: overlapped (herd::torch::DistributedDataParallel, buckets reduced
# during backward) and blocking (herd::distributed_optimizer after backward). One configuration at
# a time, then a table.
#
#   benchmarks/vs_pytorch_ddp/run.sh                 # one epoch each, at 1 and 2 ranks
#   STEPS=200 RANKS="1 2" benchmarks/vs_pytorch_ddp/run.sh
#   MODEL=mlp STEPS=60 benchmarks/vs_pytorch_ddp/run.sh
#
# DEVICE=cuda runs both on the GPU (rank modulo the GPU count): herd over NCCL (libtorch_mnist built
# with herd::nccl), DDP with the nccl backend; DEVICE=cpu (default) hides any GPU from both sides.
#
# Environment: DEVICE (cpu or cuda), MODEL (cnn or mlp; default cnn), BATCH (samples per rank and step; default 64),
# BUILD_DIR (default build), RANKS (default "1 2"), EPOCHS (default 1), STEPS (at most this many
# steps per epoch; default 0, the whole epoch), DATA (Fashion-MNIST's folder; default the Debian package's), MPIEXEC (default mpiexec),
# PYTHON (default /usr/bin/python3, the Debian python3-torch). Build the C++ side first:
#   cmake --preset default && cmake --build build -j2 --target libtorch_mnist
#
# samples/s: the samples of all ranks over the wall time of the step loop on the slowest rank
# (batch indexing, forward, backward, gradient reduction, optimizer; no data loading, no
# evaluation), measured alike on both sides. Scaling efficiency: samples/s at W ranks over
# W x samples/s at 1 rank, per implementation. herd/DDP: the ratio of the two throughputs.
# Per step, measured on both sides (not inferred): the reduction's own time (`communication`:
# the buckets' allreduces from start to end, or herd's blocking reduction), the part of it the
# rank waited for after its backward pass (`waited`), and the rest, hidden behind backward.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

build_dir=${BUILD_DIR:-$root/build}
ranks_list=${RANKS:-"1 2"}
epochs=${EPOCHS:-1}
steps=${STEPS:-0}
model=${MODEL:-cnn}
batch=${BATCH:-64}
mpiexec=${MPIEXEC:-mpiexec}
python=${PYTHON:-/usr/bin/python3}
device=${DEVICE:-cpu}
case "$device" in
  cpu) export CUDA_VISIBLE_DEVICES="" ;;
  cuda) ;;
  *) echo "run.sh: DEVICE is cpu or cuda, not $device" >&2; exit 2 ;;
esac
backend=$([[ $device == cuda ]] && echo nccl || echo gloo)
program="$build_dir/examples/libtorch_mnist"

if [[ ! -x "$program" ]]; then
  echo "run.sh: $program not found; build it first:" >&2
  echo "  cmake --preset default && cmake --build build -j2 --target libtorch_mnist" >&2
  exit 1
fi

common=(--epochs "$epochs" --threads 1 --batch-size "$batch" --lr 0.01 --model "$model")
if [[ "$steps" != 0 ]]; then common+=(--steps "$steps"); fi
if [[ -n "${DATA:-}" ]]; then common+=(--data "$DATA"); fi

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
logs=$(mktemp -d)
ddp_pids=()
# Leaves no rank of ours behind if the script is interrupted or a rank fails.
cleanup() {
  for p in "${ddp_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap cleanup EXIT

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Prints the summary line of a run's rank-0 log, or fails naming the log.
summary_of() {
  local line
  line=$(grep '^summary:' "$1" | tail -n 1 || true)
  if [[ -z "$line" ]]; then
    echo "run.sh: no summary line in $1" >&2
    return 1
  fi
  echo "$line"
}

# run_herd N ddp|optimizer
run_herd() {
  local n=$1 log="$logs/herd_$2_$1.log"
  echo "== herd + libtorch ($2), $n rank(s): $mpiexec -n $n $program ${common[*]} --reduction $2" >&2
  "$mpiexec" -n "$n" "$program" "${common[@]}" --reduction "$2" | grep -v '  batch ' | tee "$log" >&2
}

run_ddp() {
  local n=$1 port r status=0
  port=$(free_port)
  echo "== PyTorch DDP ($backend), $n rank(s): RANK=r WORLD_SIZE=$n MASTER_PORT=$port $python ddp_mnist.py ${common[*]} --device $device" >&2
  ddp_pids=()
  for ((r = 0; r < n; ++r)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$n \
      "$python" "$here/ddp_mnist.py" "${common[@]}" --device "$device" >"$logs/ddp_${n}_$r.log" 2>&1 &
    ddp_pids+=($!)
  done
  # A rank that fails would leave the others waiting in gloo: stop them all.
  for p in "${ddp_pids[@]}"; do
    if ! wait "$p"; then
      status=1
      for q in "${ddp_pids[@]}"; do kill "$q" 2>/dev/null || true; done
    fi
  done
  ddp_pids=()
  cat "$logs/ddp_${n}_0.log" >&2
  if [[ $status != 0 ]]; then
    for ((r = 1; r < n; ++r)); do cat "$logs/ddp_${n}_$r.log" >&2; done
    echo "run.sh: the $n-rank DDP run failed" >&2
    exit 1
  fi
  cp "$logs/ddp_${n}_0.log" "$logs/ddp_$n.log"
}

for n in $ranks_list; do
  run_herd "$n" ddp
  run_herd "$n" optimizer
  run_ddp "$n"
done

rows=()
for n in $ranks_list; do
  for side in herd_ddp herd_optimizer ddp; do
    rows+=("$side $(summary_of "$logs/${side}_$n.log") $(grep '^phases:' "$logs/${side}_$n.log" | cut -d' ' -f3-) $(grep '^overlap:' "$logs/${side}_$n.log" | cut -d' ' -f3-)")
  done
done

echo
echo "# herd + libtorch vs PyTorch DDP: $([[ $model == mlp ]] && echo 'MLP 784-2048-2048-10 (23 MB of f32 gradients)' || echo "Horovod's MNIST net") on Fashion-MNIST, batch $batch per rank,"
echo "# epochs $epochs, steps per epoch $([[ $steps == 0 ]] && echo 'all' || echo "at most $steps"), 1 intra-op thread per rank;"
echo "# on the $([[ $device == cuda ]] && echo "GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)), herd over NCCL, DDP over nccl" || echo 'CPU, DDP over gloo');"
echo "# $(nproc) cores on $(hostname), load average before the runs: $load_before"
printf '%s\n' "${rows[@]}" | awk -v backend="$backend" '
  {
    side = $1
    delete v
    for (i = 3; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
    n = v["ranks"]; key = side SUBSEP n; order[++count] = key
    rate[key] = v["samples_per_second"]; acc[key] = v["test_accuracy"]; sec[key] = v["seconds_per_epoch"]
    back[key] = ("backward" in v) ? v["backward"] : v["backward+allreduce"]
    comm[key] = v["communication"]; waited[key] = v["waited"]; hidden[key] = v["hidden"]
  }
  END {
    printf "%-28s %9s %11s %9s %9s %9s | %9s %9s %9s %9s\n", "configuration", "s/epoch", "samples/s", "scaling",
           "accuracy", "vs DDP", "backward", "reduction", "waited", "hidden"
    printf "%-28s %9s %11s %9s %9s %9s | %9s %9s %9s %9s\n", "", "", "", "", "", "", "ms/step", "ms/step", "ms/step", "%"
    for (k = 1; k <= count; ++k) {
      split(order[k], parts, SUBSEP); side = parts[1]; n = parts[2]; me = order[k]
      base = rate[side, 1]
      eff = (base > 0) ? sprintf("%8.1f%%", 100 * rate[me] / (n * base)) : "        -"
      name = (side == "herd_ddp") ? "herd overlapped" : (side == "herd_optimizer") ? "herd blocking" : "PyTorch DDP (" backend ")"
      ratio = (side != "ddp" && rate["ddp", n] > 0) ? sprintf("%8.2fx", rate[me] / rate["ddp", n]) : "         "
      share = (comm[me] > 0) ? sprintf("%8.0f%%", 100 * hidden[me] / comm[me]) : "        -"
      printf "%-28s %9.2f %11.0f %9s %9.4f %9s | %9.1f %9.1f %9.1f %9s\n", name " " n " rank" (n > 1 ? "s" : ""),
             sec[me], rate[me], eff, acc[me], ratio, back[me], comm[me], waited[me], share
    }
  }'
echo
echo "# backward: herd's without the reduction's time on the caller's thread; DDP's with its waiting."
echo "# reduction: the allreduces' own time (buckets: start to end on the communicator's thread)."
