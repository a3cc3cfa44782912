#!/usr/bin/env bash
# Starts benchmarks/gloo_allreduce.py on N local ranks (torch.distributed, gloo) and waits for them;
# rank 0 prints the table on stdout. Further arguments go to every rank.
#
#   benchmarks/gloo_allreduce.sh 2                                  # 8 B .. 256 MiB, 9 repetitions
#   benchmarks/gloo_allreduce.sh 4 --max-bytes 67108864 --reps 5
#
# Environment: PYTHON (default /usr/bin/python3, the Debian python3-torch).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-/usr/bin/python3}

if [[ $# -lt 1 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 RANKS [--min-bytes B] [--max-bytes B] [--reps R]" >&2
  exit 2
fi
ranks=$1
shift

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
# A rank that fails or an interrupted script would leave the others waiting in gloo: stop them all.
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_all EXIT

for ((r = 0; r < ranks; ++r)); do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$ranks "$python" "$here/gloo_allreduce.py" "$@" &
  pids+=($!)
done
status=0
for ((r = 0; r < ranks; ++r)); do
  if ! wait -n; then
    status=1
    stop_all
  fi
done
pids=()
if [[ $status != 0 ]]; then
  echo "gloo_allreduce.sh: a rank of the $ranks-rank run failed" >&2
fi
exit $status
