#!/usr/bin/env bash
# herd's allreduce latency at an earlier commit beside the working tree's, in one run:
#
#   benchmarks/compare_commits.sh REF [ROUNDS] [RANKS] [MAX_BYTES]
#
# Builds benchmarks/allreduce at REF (in a temporary git worktree) and in the working tree, both
# in build folders of their own with the same settings (RelWithDebInfo, no CUDA), so that only the
# commits differ, then runs the two one after the other ROUNDS times
# (default 5) at RANKS ranks (default 2), sizes 8 B to MAX_BYTES (default 16384), and prints per size
# the median over the rounds of each build's time (each itself a median of 41 repetitions) and
# their ratio. Alternating the builds spreads the machine's slow moments over both.
# AFTER_ENV="VAR=value ..." runs the working tree's build with those variables set (for example
# HERD_TIMELINE=/tmp/t.json, to time the timeline on against a build without it).
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: benchmarks/compare_commits.sh REF [ROUNDS] [RANKS] [MAX_BYTES]}
rounds=${2:-5}
ranks=${3:-2}
max_bytes=${4:-16384}
old_tree=$(mktemp -d)
git worktree add --detach --force "$old_tree" "$ref" >/dev/null
new_build=$(mktemp -d)
trap 'git worktree remove --force "$old_tree" >/dev/null 2>&1 || rm -rf "$old_tree"; rm -rf "$new_build"' EXIT
for tree in "$old_tree:$old_tree/build" ".:$new_build"; do
  cmake -S "${tree%%:*}" -B "${tree#*:}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHERD_BUILD_TESTS=OFF \
    -DHERD_BUILD_EXAMPLES=OFF -DHERD_WITH_CUDA=OFF >/dev/null
  cmake --build "${tree#*:}" --target allreduce -j "$(nproc)" >/dev/null
done

# herd's time per size, one "bytes us" line each, from one run of a build's benchmark.
run() {
  local extra=()
  local help
  help=$("$1" --help 2>&1 || true)
  if [[ $help == *--async-max-bytes* ]]; then extra=(--async-max-bytes 0); fi
  env ${2:-} mpiexec -n "$ranks" "$1" --min-bytes 8 --max-bytes "$max_bytes" --reps 41 "${extra[@]}" |
    awk -F'|' '!/^#/ && NF {split($2, herd, " "); print $1 + 0, herd[1]}'  # bytes, herd's time
}
results=$(mktemp)
for ((i = 0; i < rounds; ++i)); do
  run "$old_tree/build/benchmarks/allreduce" | sed 's/^/before /' >>"$results"
  run "$new_build/benchmarks/allreduce" "${AFTER_ENV:-}" | sed 's/^/after /' >>"$results"
done
echo "# herd allreduce at $ranks ranks, f32 sum: $(git rev-parse --short "$ref") (before) vs the working tree (after${AFTER_ENV:+, with $AFTER_ENV})"
echo "# median over $rounds alternating runs of each run's median time per call"
python3 - "$results" <<'EOF'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    build, size, us = line.split()
    times.setdefault(int(size), {}).setdefault(build, []).append(float(us))
print(f"# {'bytes':>10} | {'before us':>10} | {'after us':>10} | {'after/before':>12}")
for size in sorted(times):
    b, a = statistics.median(times[size]["before"]), statistics.median(times[size]["after"])
    print(f"  {size:>10} | {b:>10.2f} | {a:>10.2f} | {a / b:>12.2f}")
EOF
rm -f "$results"
