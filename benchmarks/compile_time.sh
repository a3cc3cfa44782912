#!/usr/bin/env bash
# How long a translation unit that uses herd takes to compile, beside the headers users already
# pay for: wall time of `-std=c++20 -O2 -c` (median of RUNS, default 3) for each case, and its
# ratio to <Eigen/Dense>. Cases whose compiler or library is missing are skipped and said.
#
#   benchmarks/compile_time.sh                 # from the repository root, after tools/install-deps.sh
#   RUNS=5 INCLUDE=single_include benchmarks/compile_time.sh
#   BASELINE=<rev> benchmarks/compile_time.sh  # each herd case also with <rev>'s headers, alternated
#   CASES='quickstart|one allreduce' benchmarks/compile_time.sh  # only the cases whose names match
#                                              # (an extended regex; <Eigen/Dense> always runs)
#   KEEP=1 benchmarks/compile_time.sh          # leave the generated sources in the folder it names
#
# Targets (2-core machine): herd include-only <= 1.5x Eigen/Dense; the README quickstart <= 2.5x
# with HERD_SEPARATE_COMPILATION and <= 4x header-only; the training loop <= 4x with
# HERD_SEPARATE_COMPILATION (examples/fashion_mnist/main.cpp; its model is a file of its own, mlp.cpp,
# timed as a case of its own); nvcc include-only <= 2x g++'s include-only. The cases "the system
# headers herd includes, without herd" are the floor of the include-only cases under each compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runs=${RUNS:-3}
include=${INCLUDE:-include}
cxx=${CXX:-g++}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
work=$(mktemp -d)
trap '[[ -n "${KEEP:-}" ]] && echo "kept $work" >&2 || rm -rf "$work"' EXIT

mpi_flags=$(mpicxx -compile-info 2>/dev/null | tr ' ' '\n' | grep -E '^-I' | tr '\n' ' ' || true)
[[ -n "$mpi_flags" ]] || mpi_flags=$(mpicxx --showme:compile 2>/dev/null || true)
eigen_flags=-I/usr/include/eigen3
torch_flags="-I/usr/include -I/usr/include/torch/csrc/api/include"

cat >"$work/vector.cpp" <<'EOF'
#include <vector>
int main() { std::vector<float> v(3); return static_cast<int>(v.size()); }
EOF
cat >"$work/eigen.cpp" <<'EOF'
#include <Eigen/Dense>
int main() { Eigen::MatrixXf m = Eigen::MatrixXf::Ones(3, 3); return static_cast<int>(m.sum()); }
EOF
cat >"$work/torch.cpp" <<'EOF'
#include <torch/torch.h>
int main() { return static_cast<int>(torch::ones({3}).sum().item<float>()); }
EOF
cat >"$work/herd_include.cpp" <<'EOF'
#include <herd/herd.hpp>
int main() {}
EOF
cat >"$work/one_allreduce.cpp" <<'EOF'
#include <herd/herd.hpp>
#include <vector>
int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  std::vector<float> v(1000, 1.0f);
  herd::allreduce(v, comm);
}
EOF
cp "$work/herd_include.cpp" "$work/herd_include.cu"
printf '#define HERD_IMPLEMENTATION\n#include <herd/herd.hpp>\n' >"$work/implementation.cpp"
# The README's quickstart, as printed there.
python3 -c '
import re, sys
text = open("README.md").read()
block = re.search(r"## Quickstart[^\n]*\n\n```cpp\n(.*?)```", text, re.S).group(1)
open(sys.argv[1], "w").write(block)' "$work/quickstart.cpp"
cp "$work/quickstart.cpp" "$work/quickstart.cu"
# The same files including only the headers they use instead of the umbrella (a file pays for what
# it includes: the headers per feature under include/herd/).
printf '#include <herd/comm/mpi.hpp>\n#include <herd/collectives/allreduce.hpp>\n' >"$work/feature_headers.hpp"
{ cat "$work/feature_headers.hpp"; echo 'int main() {}'; } >"$work/herd_feature_include.cpp"
python3 -c '
import sys
text, headers = open(sys.argv[1]).read(), open(sys.argv[2]).read().rstrip("\n")
assert "#include <herd/herd.hpp>" in text
open(sys.argv[3], "w").write(text.replace("#include <herd/herd.hpp>", headers, 1))' \
  "$work/quickstart.cpp" "$work/feature_headers.hpp" "$work/quickstart_features.cpp"

# The limit of the include-only cases: the system headers that herd's own headers include (the
# standard library, mpi.h, and under nvcc CUDA's), included directly, without herd. Read from the
# compiler's include tree (-H), so it follows what each compiler's pass actually reaches.
system_headers_of() {  # compiler flags source output
  local tree
  # shellcheck disable=SC2086
  if [[ "$1" == "$nvcc" ]]; then
    tree=$("$1" -std=c++20 $2 -E -Xcompiler -H "$3" -o /dev/null 2>&1) || return 0
  else
    tree=$("$1" -std=c++20 $2 -E -H "$3" -o /dev/null 2>&1) || return 0
  fi
  python3 -c '
import re, sys
parents, seen, out = {}, set(), []
for line in sys.stdin:
    m = re.match(r"(\.+) (\S+)$", line.rstrip("\n"))
    if not m:
        continue
    depth, path = len(m.group(1)), m.group(2)
    parents[depth] = path
    parent = parents.get(depth - 1, "")
    if "/herd/" in parent and "/herd/" not in path and path not in seen:
        seen.add(path)
        out.append(path)
# herd includes mpi.h without the MPI C++ bindings (comm/detail/mpi_header.hpp), and so does this file.
skip = "#define MPICH_SKIP_MPICXX 1\n#define OMPI_SKIP_MPICXX 1\n"
sys.stdout.write(skip + "".join(f"#include \"{h}\"\n" for h in out) + "int main() {}\n")' <<<"$tree" >"$4"
}
system_headers_of "$cxx" "-I$include $mpi_flags" "$work/herd_include.cpp" "$work/herd_system_headers.cpp"
[[ -x "$nvcc" ]] && system_headers_of "$nvcc" "-I$include $mpi_flags" "$work/herd_include.cu" "$work/herd_system_headers.cu"

# name | compiler | flags | source | needs (a file that must exist)
cases=(
  "<vector>|$cxx||$work/vector.cpp|"
  "<Eigen/Dense>|$cxx|$eigen_flags|$work/eigen.cpp|/usr/include/eigen3/Eigen/Dense"
  "<torch/torch.h>|$cxx|$torch_flags|$work/torch.cpp|/usr/include/torch/csrc/api/include/torch/torch.h"
  "herd include-only|$cxx|-I$include $mpi_flags|$work/herd_include.cpp|"
  "herd include-only, HERD_SEPARATE_COMPILATION|$cxx|-I$include $mpi_flags -DHERD_SEPARATE_COMPILATION|$work/herd_include.cpp|"
  "the system headers herd includes, without herd|$cxx|$mpi_flags|$work/herd_system_headers.cpp|$work/herd_system_headers.cpp"
  "herd include-only, the quickstart's two headers|$cxx|-I$include $mpi_flags|$work/herd_feature_include.cpp|$include/herd/comm/mpi.hpp"
  "one allreduce|$cxx|-I$include $mpi_flags|$work/one_allreduce.cpp|"
  "one allreduce, HERD_SEPARATE_COMPILATION|$cxx|-I$include $mpi_flags -DHERD_SEPARATE_COMPILATION|$work/one_allreduce.cpp|"
  "its implementation file (once per program)|$cxx|-I$include $mpi_flags|$work/implementation.cpp|"
  "README quickstart|$cxx|-I$include $mpi_flags|$work/quickstart.cpp|"
  "README quickstart, its two headers instead of herd.hpp|$cxx|-I$include $mpi_flags|$work/quickstart_features.cpp|$include/herd/comm/mpi.hpp"
  "README quickstart, HERD_SEPARATE_COMPILATION|$cxx|-I$include $mpi_flags -DHERD_SEPARATE_COMPILATION|$work/quickstart.cpp|"
  "fashion_mnist training loop|$cxx|-I$include $mpi_flags $eigen_flags|$root/examples/fashion_mnist/main.cpp|/usr/include/eigen3/Eigen/Dense"
  "fashion_mnist model, its own file (mlp.cpp: Eigen, no herd collective)|$cxx|-I$include $eigen_flags|$root/examples/fashion_mnist/mlp.cpp|/usr/include/eigen3/Eigen/Dense"
  "fashion_mnist training loop, HERD_SEPARATE_COMPILATION|$cxx|-I$include $mpi_flags $eigen_flags -DHERD_SEPARATE_COMPILATION|$root/examples/fashion_mnist/main.cpp|/usr/include/eigen3/Eigen/Dense"
  "nvcc: herd include-only|$nvcc|-I$include $mpi_flags|$work/herd_include.cu|$nvcc"
  "nvcc: the system headers herd includes, without herd|$nvcc|$mpi_flags|$work/herd_system_headers.cu|$work/herd_system_headers.cu"
  "nvcc: README quickstart|$nvcc|-I$include $mpi_flags|$work/quickstart.cu|$nvcc"
)

# BASELINE: the cases that include herd are timed with that revision's headers too, one compile
# of each after the other in every run, so that the machine's drift falls on both alike.
baseline_include=""
if [[ -n "${BASELINE:-}" ]]; then
  mkdir -p "$work/baseline"
  git -C "$root" archive "$BASELINE" "$include" | tar -x -C "$work/baseline"
  baseline_include="$work/baseline/$include"
fi

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
spread() { sort -g | awk 'NR == 1 {low = $1} {high = $1} END {print low "-" high}'; }  # min-max
time_one() {  # compiler flags source -> seconds
  local start end
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$1" -std=c++20 -O2 $2 -c "$3" -o "$work/out.o" >"$work/log" 2>&1 || { cat "$work/log" >&2; return 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}

printf 'herd compile times: %s, %s, %s run(s) each, -std=c++20 -O2 -c, include folder %s, %s\n' \
  "$($cxx --version | head -1)" "$(nproc) cores" "$runs" "$include" "$(date -u +%Y-%m-%d)"
names=()
medians=()
ranges=()            # with BASELINE, per case: min-max of its runs,
baseline_medians=()  # the median of the runs with the baseline's headers,
baseline_ranges=()   # and their min-max
for spec in "${cases[@]}"; do
  IFS='|' read -r name compiler flags source needs <<<"$spec"
  [[ -z "${CASES:-}" || "$name" == "<Eigen/Dense>" || "$name" =~ $CASES ]] || continue
  names+=("$name")
  if [[ -n "$needs" && ! -e "$needs" ]]; then
    medians+=("skipped ($needs not found)") ranges+=("") baseline_medians+=("") baseline_ranges+=("")
    continue
  fi
  samples=() before=()
  for ((i = 0; i < runs; i++)); do
    if [[ -n "$baseline_include" && "$flags" == *"-I$include "* ]]; then
      before+=("$(time_one "$compiler" "${flags/-I$include /-I$baseline_include }" "$source")")
    fi
    samples+=("$(time_one "$compiler" "$flags" "$source")")
  done
  medians+=("$(printf '%s\n' "${samples[@]}" | median)")
  if ((${#before[@]})); then
    ranges+=("$(printf '%s\n' "${samples[@]}" | spread)")
    baseline_medians+=("$(printf '%s\n' "${before[@]}" | median)")
    baseline_ranges+=("$(printf '%s\n' "${before[@]}" | spread)")
  else
    ranges+=("") baseline_medians+=("") baseline_ranges+=("")
  fi
done
value_of() { for i in "${!names[@]}"; do [[ "${names[$i]}" == "$1" ]] && echo "${medians[$i]}"; done; return 0; }
eigen=$(value_of "<Eigen/Dense>")
herd_gxx=$(value_of "herd include-only")
system_gxx=$(value_of "the system headers herd includes, without herd")
if [[ -n "$baseline_include" ]]; then
  printf '| case | median s (range) | / <Eigen/Dense> | with %s'"'"'s headers: median s (range) | now / %s |\n' "$BASELINE" "$BASELINE"
  printf '|---|---:|---:|---:|---:|\n'
else
  printf '| case | median s | / <Eigen/Dense> |\n|---|---:|---:|\n'
fi
for i in "${!names[@]}"; do
  name=${names[$i]} m=${medians[$i]}
  if [[ "$m" == skipped* ]]; then printf '| %s | %s | |\n' "$name" "$m"; continue; fi
  ratio=$(awk -v a="$m" -v b="$eigen" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b }')
  [[ "$name" == "nvcc: herd include-only" && -n "$herd_gxx" ]] &&
    ratio="$ratio ($(awk -v a="$m" -v b="$herd_gxx" 'BEGIN { printf "%.2f", a / b }')x g++'s include-only)"
  [[ "$name" == "nvcc: the system headers herd includes, without herd" && -n "$system_gxx" ]] &&
    ratio="$ratio ($(awk -v a="$m" -v b="$system_gxx" 'BEGIN { printf "%.2f", a / b }')x g++'s)"
  if [[ -z "$baseline_include" ]]; then
    printf '| %s | %.2f | %s |\n' "$name" "$m" "$ratio"
  elif [[ -z "${baseline_medians[$i]}" ]]; then
    printf '| %s | %.2f | %s | | |\n' "$name" "$m" "$ratio"
  else
    b=${baseline_medians[$i]}
    printf '| %s | %.2f (%s) | %s | %.2f (%s) | %s |\n' "$name" "$m" "${ranges[$i]}" "$ratio" "$b" "${baseline_ranges[$i]}" \
      "$(awk -v a="$m" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
  fi
done
