#!/usr/bin/env bash
# herd's allreduce across two simulated nodes of two ranks (tests/multinode/nodes.sh: a network,
# hostname and /dev/shm of their own per node, joined by veth pairs over a bridge), beside herd's
# flat ring and MPI_Allreduce (benchmarks/allreduce), with the link between the nodes measured in
# the same run as the limit (benchmarks/link_probe.py: plain TCP between the two nodes).
#
#   sudo benchmarks/multinode.sh                  # Open MPI and MPICH, 3 alternating rounds
#   ROUNDS=5 MPIS=openmpi benchmarks/multinode.sh
#
# Rounds alternate the MPIs and the link probe; the table gives medians over the rounds, the range
# in brackets. herd takes its hierarchical path here (shared memory on each node, a ring of the
# two leaders across). What the leaders must move: each sends and receives n bytes (a 2-rank ring
# of n bytes), so the link allows n / duplex seconds at best, duplex being what TCP carries each
# way while both directions send at once. A veth pair on one machine is not a network: the
# "link" is the kernel copying between namespaces on the same cores the ranks run on, and 4 ranks
# share this machine's cores, so this measures herd's overheads against a real socket path, not
# what a cluster's network would give.
#
# Environment: BUILD_DIR (default build; its benchmarks/allreduce is the MPICH build), ROUNDS (3),
# MPIS ("openmpi mpich"), MIN_BYTES (65536), MAX_BYTES (67108864), REPS (5); BASELINE, a git
# revision: the same benchmark built with that revision's headers too, run after this one in each
# round, and a table of the two herds side by side (before/after a change, on the same noise).
# Needs root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(realpath -m "${BUILD_DIR:-$root/build}")
rounds=${ROUNDS:-3}
mpis=${MPIS:-"openmpi mpich"}
args=(--min-bytes "${MIN_BYTES:-65536}" --max-bytes "${MAX_BYTES:-67108864}" --reps "${REPS:-5}" --async-max-bytes 0)
nodes="$root/tests/multinode/nodes.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

declare -A program
for mpi in $mpis; do
  case "$mpi" in
    mpich)
      program[mpich]="$build/benchmarks/allreduce"
      if [[ ! -x ${program[mpich]} ]]; then
        echo "multinode.sh: ${program[mpich]} not found: cmake --build $build --target allreduce" >&2
        exit 1
      fi
      ;;
    openmpi)
      program[openmpi]="$work/allreduce_openmpi"
      mpicxx.openmpi -std=c++20 -O2 -DNDEBUG -DOMPI_SKIP_MPICXX=1 -I"$root/include" "$root/benchmarks/allreduce.cpp" \
        -pthread -o "${program[openmpi]}"
      ;;
    *) echo "multinode.sh: MPIS holds openmpi and mpich, not $mpi" >&2; exit 2 ;;
  esac
done
runs=$mpis
if [[ -n "${BASELINE:-}" ]]; then
  mkdir -p "$work/baseline"
  git -C "$root" archive "$BASELINE" include | tar -x -C "$work/baseline"
  for mpi in $mpis; do
    program[$mpi@baseline]="$work/allreduce_${mpi}_baseline"
    "mpicxx.$mpi" -std=c++20 -O2 -DNDEBUG -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 -I"$work/baseline/include" \
      "$root/benchmarks/allreduce.cpp" -pthread -o "${program[$mpi@baseline]}"
    runs+=" $mpi@baseline"
  done
fi

echo "# $(date -u '+%F %T UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before; herd at $(git -C "$root" rev-parse --short HEAD)"
for ((round = 1; round <= rounds; ++round)); do
  # The link first, then each MPI; the probe needs no MPI library, Open MPI's launcher starts it.
  "$nodes" --mpi openmpi --layout 1,1 --timeout 120 -- /usr/bin/python3 "$here/link_probe.py" 2>/dev/null |
    grep '^link:' | sed "s/^/round $round /" | tee -a "$work/all.txt"
  for run in $runs; do
    mpi=${run%@*}
    # MPICH 4.0.2 over UCX's TCP may hang in MPI_Finalize (docs/clusters.md): the table is printed by
    # then, so a timeout after it costs nothing but the wait.
    "$nodes" --mpi "$mpi" --layout 2,2 --timeout 300 -- "${program[$run]}" "${args[@]}" 2>/dev/null |
      grep -E '^ +[0-9]+ \|' | sed "s/^/round $round $run /" >>"$work/all.txt" || true
    echo "round $round $run: $(grep -c "^round $round $run " "$work/all.txt") sizes"
  done
done

python3 - "$work/all.txt" "$runs" "${BASELINE:-}" <<'EOF'
import statistics, sys
lines = open(sys.argv[1]).read().splitlines()
mpis = sys.argv[2].split()
baseline = sys.argv[3]
links = [dict(kv.split("=") for kv in l.split()[3:]) for l in lines if l.split()[2] == "link:"]
duplex = [float(l["duplex_GBps"]) for l in links]
print(f"# link: rtt {statistics.median(float(l['rtt_us']) for l in links):.1f} us, one way "
      f"{statistics.median(float(l['one_way_GBps']) for l in links):.2f} GB/s, duplex {statistics.median(duplex):.2f} GB/s "
      f"each way (medians of {len(links)}: duplex {min(duplex):.2f}-{max(duplex):.2f})")
def med(v):
    return f"{statistics.median(v):9.1f} ({min(v):.0f}-{max(v):.0f})"
tables = {}
for mpi in mpis:
    rows = {}
    for l in lines:
        w = l.split()
        if len(w) > 3 and w[2] == mpi:
            cells = [c.strip() for c in " ".join(w[3:]).split("|")]
            size = int(cells[0])
            herd_us, ring_us = float(cells[1].split()[0]), float(cells[2].split()[0])
            mpi_us = float(cells[3].split()[0])
            rows.setdefault(size, []).append((herd_us, ring_us, mpi_us))
    if not rows:
        print(f"# {mpi}: no results")
        continue
    limit = statistics.median(duplex) * 1e9
    tables[mpi] = rows
    label = mpi.replace("@baseline", f" with the headers of {baseline}")
    print(f"# {label}, 2 nodes x 2 ranks, f32 sum in place; us per call, median (range) of {len(next(iter(rows.values())))} rounds")
    print(f"# {'bytes':>10} | {'herd hierarchical':>22} | {'herd ring':>22} | {'MPI_Allreduce':>22} | herd/MPI | link limit us | limit/herd")
    for size in sorted(rows):
        h = [r[0] for r in rows[size]]; g = [r[1] for r in rows[size]]; m = [r[2] for r in rows[size]]
        bound = size / limit * 1e6
        print(f"  {size:>10} | {med(h):>22} | {med(g):>22} | {med(m):>22} | "
              f"{statistics.median(m) / statistics.median(h):8.2f} | {bound:13.1f} | {bound / statistics.median(h):10.2f}")
# With a baseline: the two herds' hierarchical allreduce side by side, and the ratio per round
# (each round ran both, one after the other).
for mpi in [m for m in mpis if f"{m}@baseline" in tables]:
    now, before = tables[mpi], tables[f"{mpi}@baseline"]
    print(f"# {mpi}: herd hierarchical now vs with the headers of {baseline}; us, median (range); before/now per round")
    print(f"# {'bytes':>10} | {'now':>22} | {'before':>22} | before/now: median (range)")
    for size in sorted(now):
        if size not in before:
            continue
        h = [r[0] for r in now[size]]; b = [r[0] for r in before[size]]
        ratios = [y / x for x, y in zip(h, b)]
        print(f"  {size:>10} | {med(h):>22} | {med(b):>22} | {statistics.median(ratios):5.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
EOF
