#!/usr/bin/env bash
# Training across nodes gives the bits of training on one node where the arithmetic is the same
# (herd's ring, whose order of additions depends on the ranks, not on where they are): the digests
# of the parameters, trained with and without fusion, from a run on the nodes of LAYOUT and from a
# run of as many ranks on one node.
#   check_training.sh <nodes.sh> <mpi> <layout> <program> [nodes.sh options...]
# The program's arguments: CHECK_TRAINING_ARGS if set (empty: none), else the doctest filter of
# multinode_tests' training case.
set -uo pipefail
harness=$1 mpi=$2 layout=$3 program=$4
shift 4
IFS=, read -r -a per_node <<<"$layout"
total=0
for n in "${per_node[@]}"; do total=$((total + n)); done
program_args=('-tc=distributed optimizer*')
if [[ -n "${CHECK_TRAINING_ARGS+set}" ]]; then read -r -a program_args <<<"$CHECK_TRAINING_ARGS"; fi
run() {
  "$harness" --mpi "$mpi" --layout "$1" --env HERD_MULTINODE_DIGEST=1 "${@:2}" -- "$program" ${program_args[@]+"${program_args[@]}"}
}
across=$(run "$layout" "$@") || { echo "$across"; echo "FAIL: the run on nodes $layout failed"; exit 1; }
one=$(run "$total" "$@") || { echo "$one"; echo "FAIL: the run on one node of $total ranks failed"; exit 1; }
digests_across=$(grep -o 'training digest.*' <<<"$across")
digests_one=$(grep -o 'training digest.*' <<<"$one")
echo "nodes $layout:"; echo "$digests_across"
echo "one node of $total ranks:"; echo "$digests_one"
if [[ -z "$digests_across" || $(wc -l <<<"$digests_across") -ne 2 ]]; then echo "FAIL: no digests"; exit 1; fi
if [[ "$digests_across" != "$digests_one" ]]; then echo "FAIL: the parameters differ"; exit 1; fi
echo "the same parameters, bit for bit"
