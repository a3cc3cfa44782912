#!/usr/bin/env bash
# The harness leaves nothing behind: after a program that succeeds, one that fails, one the timeout
# ends, and a harness stopped by SIGTERM mid-run, the namespaces' holders, every process started in
# the nodes, and the run's folder are gone, and the machine's own network has the interfaces it had.
#   check_teardown.sh <nodes.sh>
set -uo pipefail
harness=$1
failures=0
links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort)

# Runs the harness with the arguments given; checks its exit status and that its holders, its
# nodes' processes and its folder are gone.
check() {
  local want=$1 what=$2
  shift 2
  local log status
  log=$(mktemp)
  "$harness" "$@" 2>"$log" >/dev/null &
  local pid=$!
  if [[ "$what" == "SIGTERM mid-run" ]]; then
    until grep -q 'holders' "$log" || ! kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    sleep 0.5
    kill -TERM "$pid"
  fi
  wait "$pid"
  status=$?
  if grep -q 'SKIP' "$log"; then cat "$log" >&2; rm -f "$log"; exit 77; fi
  local holders folder
  holders=$(sed -n 's/.*holders \([0-9 ]*\);.*/\1/p' "$log" | head -1)
  folder=$(sed -n 's/.*; folder \([^)]*\)).*/\1/p' "$log" | head -1)
  if [[ "$status" != "$want" ]]; then
    echo "FAIL ($what): exit status $status, expected $want"; cat "$log"; failures=$((failures + 1))
  fi
  if [[ -z "$holders" || -z "$folder" ]]; then
    echo "FAIL ($what): the harness did not name its holders and folder"; cat "$log"; failures=$((failures + 1))
  fi
  sleep 0.2
  for h in $holders; do
    if [[ -e /proc/$h ]] && [[ $(cat /proc/$h/comm 2>/dev/null) == sleep ]]; then
      echo "FAIL ($what): holder $h still runs"; failures=$((failures + 1))
    fi
  done
  if [[ -n "$folder" && -e "$folder" ]]; then echo "FAIL ($what): $folder is still there"; failures=$((failures + 1)); fi
  if pgrep -f 'sleep 7777' >/dev/null; then echo "FAIL ($what): a process started in a node still runs"; failures=$((failures + 1)); fi
  echo "ok ($what): exit status $status, holders ${holders:-?} gone, ${folder:-?} removed"
  rm -f "$log"
}

check 0 "a program that succeeds" --mpi mpich --layout 1,1 --timeout 30 -- true
check 1 "a program that fails" --mpi mpich --layout 1,1 --timeout 30 -- false
# A rank that never ends, with a child of its own in the node: the timeout ends the run.
check 124 "the timeout" --mpi mpich --layout 1,1 --timeout 2 -- sh -c 'sleep 7777 & sleep 7777'
check 143 "SIGTERM mid-run" --mpi mpich --layout 1,1 --timeout 30 -- sh -c 'sleep 7777 & sleep 7777'

links_after=$(ip -o link show | awk -F': ' '{print $2}' | sort)
if [[ "$links_before" != "$links_after" ]]; then
  echo "FAIL: the machine's interfaces changed: before [$links_before] after [$links_after]"; failures=$((failures + 1))
fi
if ((failures > 0)); then echo "$failures failures"; exit 1; fi
echo "the harness tore everything down in every case"
