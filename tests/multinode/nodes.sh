#!/usr/bin/env bash
# Simulated nodes on one machine, and an MPI program launched across them.
#
#   tests/multinode/nodes.sh --mpi mpich|openmpi --layout 2,2 [--timeout S] [--env NAME=VALUE]... -- program [args]
#
# --layout gives the ranks of each node: 2,2 is two nodes of two ranks, 3,1 an uneven pair, 1,1,1,1
# four nodes of one. Each node is a set of Linux namespaces held by one long-lived process
# (`unshare ... sleep infinity`): network, UTS (hostname nodeK), IPC, and mount, in which /dev/shm is
# a fresh tmpfs, /sys a fresh sysfs (so that UCX and hwloc see the node's interfaces, not the
# machine's) and /etc/hosts names every node. Node K is 10.213.0.(K+1)/24 on interface mnK, a veth
# pair whose other end sits on a bridge in a network namespace of its own: the machine's own network
# is never touched. No PID namespace: Hydra's proxies enter the nodes by /proc paths.
#
# The launchers reach the nodes through `ssh`, a stand-in written to the run's folder that enters a
# node's namespaces with nsenter and runs the command there with a clean environment, as ssh would.
# mpiexec itself runs inside node0. Whatever happens (the program fails, the timeout strikes, the
# harness is interrupted), every process left in a node is killed and the namespaces go; the
# holders also die with the harness (parent-death signal) should it be killed outright.
#
# Exit status: the program's (mpiexec's); 124 after --timeout; 77 where namespaces cannot be made
# (not root, no util-linux/iproute2, a container that forbids them), with the reason on stderr.
# HERD_MULTINODE_KEEP=1 leaves the run's folder (hosts, stand-in, logs) in /tmp for a look.
set -uo pipefail

mpi=""
layout=""
timeout_s=120
extra_env=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mpi) mpi="$2"; shift 2 ;;
    --layout) layout="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --env) extra_env+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "nodes.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z "$mpi" || -z "$layout" || $# -eq 0 ]]; then
  echo "usage: nodes.sh --mpi mpich|openmpi --layout 2,2 [--timeout S] [--env NAME=VALUE]... -- program [args]" >&2
  exit 2
fi

skip() { echo "nodes.sh: SKIP: $*" >&2; exit 77; }

[[ $(id -u) -eq 0 ]] || skip "simulated nodes need root (CAP_SYS_ADMIN and CAP_NET_ADMIN for namespaces and veth pairs)"
for tool in unshare nsenter setpriv ip mount timeout; do
  command -v "$tool" >/dev/null || skip "$tool is missing (Debian: apt-get install util-linux iproute2 coreutils)"
done
case "$mpi" in
  mpich) mpiexec_bin=$(command -v mpiexec.mpich || true) ;;
  openmpi) mpiexec_bin=$(command -v mpiexec.openmpi || true) ;;
  *) echo "nodes.sh: --mpi is mpich or openmpi, not $mpi" >&2; exit 2 ;;
esac
[[ -n "$mpiexec_bin" ]] || skip "no mpiexec for $mpi"
if ! why=$(unshare --net --uts --ipc --mount --propagation private sh -c 'mount -t tmpfs tmpfs /dev/shm && mount -t sysfs sysfs /sys && ip link add t0 type veth peer name t1' 2>&1); then
  skip "this machine does not allow network, UTS, IPC and mount namespaces with veth pairs: $why"
fi

IFS=, read -r -a ranks_per_node <<<"$layout"
nodes=${#ranks_per_node[@]}
work=$(mktemp -d /tmp/herd-multinode.XXXXXX)
holders=()   # holder pids, node0 first; the bridge's holder last

# Ends every process in a node (those the launchers started there), then the holders; the network
# namespaces, the veth pairs and the bridge go with their last process.
teardown() {
  local status=$?
  trap - EXIT INT TERM
  local h p ns
  for h in "${holders[@]}"; do
    ns=$(readlink "/proc/$h/ns/net" 2>/dev/null) || continue
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [[ "$p" == "$h" || "$p" == "$$" ]] && continue
      [[ $(readlink "/proc/$p/ns/net" 2>/dev/null) == "$ns" ]] && kill -KILL "$p" 2>/dev/null
    done
  done
  for h in "${holders[@]}"; do kill -KILL "$h" 2>/dev/null; done
  for h in "${holders[@]}"; do wait "$h" 2>/dev/null; done
  if [[ "${HERD_MULTINODE_KEEP:-0}" == 1 ]]; then
    echo "nodes.sh: kept $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts a holder: a process that enters new namespaces, runs its setup there, writes its ready
# file, and sleeps until the teardown (or the harness's death) kills it.
start_holder() {
  local name=$1 flags=$2 setup=$3
  setpriv --pdeathsig KILL -- unshare $flags --propagation private \
    sh -c "$setup && touch '$work/$name.ready' && exec sleep infinity" >"$work/$name.log" 2>&1 &
  holders+=($!)
  local tries=0
  until [[ -e "$work/$name.ready" ]]; do
    if ! kill -0 "${holders[-1]}" 2>/dev/null || ((++tries > 500)); then
      echo "nodes.sh: could not set up $name: $(cat "$work/$name.log")" >&2
      exit 1
    fi
    sleep 0.01
  done
}

: >"$work/hosts"
{
  echo "127.0.0.1 localhost"
  for ((k = 0; k < nodes; ++k)); do echo "10.213.0.$((k + 1)) node$k"; done
} >"$work/hosts"

node_pids=()
for ((k = 0; k < nodes; ++k)); do
  start_holder "node$k" "--net --uts --ipc --mount" \
    "hostname node$k && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount -t sysfs sysfs /sys && mount --bind '$work/hosts' /etc/hosts"
  node_pids+=("${holders[-1]}")
  echo "${holders[-1]}" >"$work/node$k.pid"
done
start_holder bridge "--net" "ip link add br0 type bridge && ip link set br0 up"
bridge_pid=${holders[-1]}
# The holder pids are known only now: node0's list goes first so that teardown meets nodes first.
# --root: entering a mount namespace sets the root to that namespace's own; the holder's root is
# where the nodes live when this runs inside a chroot (a build root) too, and / its working folder.
in_bridge() { nsenter --target "$bridge_pid" --net -- "$@"; }
in_node() { nsenter --target "${node_pids[$1]}" --net --uts --ipc --mount --root --wd=/ -- "${@:2}"; }
for ((k = 0; k < nodes; ++k)); do
  in_bridge ip link add "br-mn$k" type veth peer name "mn$k" netns "/proc/${node_pids[$k]}/ns/net" || exit 1
  in_bridge ip link set "br-mn$k" master br0 up || exit 1
  in_node "$k" ip link set lo up || exit 1
  in_node "$k" ip addr add "10.213.0.$((k + 1))/24" dev "mn$k" || exit 1
  in_node "$k" ip link set "mn$k" up || exit 1
done

# The ssh stand-in: `ssh [options] host command...`. It runs the command as ssh's remote shell does
# (the words joined, given to sh -c) inside the node, with only the environment a login would give.
cat >"$work/ssh" <<EOF
#!/usr/bin/env bash
while [[ \$# -gt 0 && \$1 == -* ]]; do
  case "\$1" in -[lpoiFJ]) shift 2 ;; *) shift ;; esac
done
host=\${1%%.*}; shift
pid=\$(cat "$work/\$host.pid" 2>/dev/null) || { echo "ssh stand-in: no node \$host" >&2; exit 255; }
exec nsenter --target "\$pid" --net --uts --ipc --mount --root --wd=/ -- env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/sh \\
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 sh -c "\$*"
EOF
chmod +x "$work/ssh"

# The program by its absolute path: the ranks start in other nodes' shells.
program=$1
shift
[[ "$program" == */* ]] && program=$(realpath "$program")
set -- "$program" "$@"

hosts=""
total=0
for ((k = 0; k < nodes; ++k)); do
  hosts+="${hosts:+,}node$k:${ranks_per_node[$k]}"
  total=$((total + ranks_per_node[k]))
done

# The program learns the layout it runs on (the tests check where each rank landed).
extra_env=("HERD_MULTINODE_LAYOUT=$layout" ${extra_env[@]+"${extra_env[@]}"})
env_args=()
case "$mpi" in
  mpich)
    for e in "${extra_env[@]}"; do env_args+=(-genv "${e%%=*}" "${e#*=}"); done
    launch=("$mpiexec_bin" -launcher ssh -launcher-exec "$work/ssh" -hosts "$hosts" -n "$total" "${env_args[@]}") ;;
  openmpi)
    for e in "${extra_env[@]}"; do env_args+=(-x "$e"); done
    # --bind-to none: the nodes share this machine's cores, and each node's daemon, believing it
    # owns them all, would bind its first rank to core 0 (at 1,1 both ranks then took turns on one
    # core, 4-12 ms for an allreduce of 4 bytes). Ranks yield while they wait: more ranks than cores.
    launch=("$mpiexec_bin" --allow-run-as-root --mca plm_rsh_agent "$work/ssh" --mca plm_rsh_no_tree_spawn 1
            --bind-to none --mca mpi_yield_when_idle 1
            --mca btl_tcp_if_include 10.213.0.0/24 --mca oob_tcp_if_include 10.213.0.0/24
            -H "$hosts" -n "$total" "${env_args[@]}") ;;
esac

echo "nodes.sh: $nodes nodes ($layout ranks; holders ${holders[*]}; folder $work), $mpi: ${launch[*]} $*" >&2
# mpiexec in node0, with the caller's environment (as a user's shell on the login node would have).
# In the background, so that a signal to the harness is handled at once (bash runs traps only
# between commands, and `wait` is one it interrupts).
in_node 0 timeout -k 5 "$timeout_s" "${launch[@]}" "$@" &
wait $!
status=$?
[[ $status -eq 124 ]] && echo "nodes.sh: the run did not end within $timeout_s s (timeout)" >&2
exit "$status"
