#!/bin/sh
# A throw-away Slurm cluster of several nodes on this machine, for tests:
# one network namespace per node, each with a hostname of its own (a UTS
# namespace) and a veth pair to a bridge, a slurmd inside each, slurmctld
# beside them on the bridge's address, munge shared (its socket is a file).
# MPI ranks of one job then talk TCP across the namespaces as across hosts.
#
#   eval "$(sh nodes.sh up DIR [N [CPUS]])"  # N nodes n1..nN (4) of CPUS
#                            # CPUs (2); prints SLURM_CONF=... for the caller
#   sh nodes.sh kill DIR NODE     # node failure: SIGKILL to every process
#                                 # of the node (slurmd, steps, ranks)
#   sh nodes.sh stop DIR NODE     # a node that stops answering: SIGSTOP to
#   sh nodes.sh cont DIR NODE     #   them all; SIGCONT undoes it
#   sh nodes.sh start DIR NODE    # slurmd again on a killed node; waits
#                                 # until slurmctld hears from it
#   sh nodes.sh pids DIR NODE     # the node's processes
#   sh nodes.sh idle DIR          # wait until every node is idle (30 s)
#   sh nodes.sh run DIR NODE CMD... # CMD inside the node (its network, its
#                                 # hostname), e.g. sbatch from n1
#   sh nodes.sh down DIR          # stop everything `up` started, by pid;
#                                 # remove the namespaces and the bridge
#
# MALLEUS_SLURM_CONF_EXTRA: more slurm.conf lines (a test's own settings);
# MALLEUS_SLURMD_TIMEOUT: Slurm's SlurmdTimeout (20 s here).
#
# Addresses live only on the links created here (a private /24 on the
# bridge, not routed anywhere); names carry this script's pid so that a
# leftover of a killed run does not collide.  Needs root, ip, nsenter and
# unshare; exits 77 with the reason where network namespaces are not
# permitted.  A node is entered with nsenter and `unshare --uts`, not `ip
# netns exec`, which remounts /sys (slurmd then finds no cgroup file system
# and dies); slurmctld accepts only this host's name as SlurmctldHost (its
# address is the bridge's); the slurmd paths carry %n, one per node.
set -eu
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || {
    echo "usage: $0 up|down|kill|stop|cont|start|pids|idle|run DIR [...]" >&2
    exit 2
}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

# The cluster's names and addresses, saved by `up` for the other commands.
load() {
    [ -f "$dir/nodes.env" ] || { echo "nodes.sh: no cluster in $dir" >&2; exit 2; }
    . "$dir/nodes.env"
    SLURM_CONF=$dir/slurm.conf
    export SLURM_CONF
}
ns_of() { echo "${prefix}-$1"; }
pids_of() { ip netns pids "$(ns_of "$1")" 2>/dev/null || true; }

# slurmd of node $1 inside its namespace, under its own hostname.
start_slurmd() {
    rm -f "$dir/run/slurmd.$1.pid"
    nsenter --net="/run/netns/$(ns_of "$1")" unshare --uts \
        sh -c 'hostname "$1" && exec /usr/sbin/slurmd -f "$2" -N "$1"' sh "$1" "$SLURM_CONF"
}

# Until slurmctld counts node $1 as answering (no `*` after its state) and
# in state $2 (a sinfo %t prefix: idle, alloc, mix...; '' any): 30 s at most.
wait_node() {
    i=0
    while [ $i -lt 60 ]; do
        s=$(sinfo -h -n "$1" -o %t 2>/dev/null | head -1 || true)
        case $s in *'*' | '') ;; "$2"*) return 0 ;; esac
        sleep 0.5
        i=$((i + 1))
    done
    echo "nodes.sh: node $1 is '$s' after 30 s; logs in $dir/log" >&2
    return 1
}

case $cmd in
up)
    n=${3:-4} cpus=${4:-2}
    slurm_need_tools ip nsenter unshare
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
    prefix="mal$$"
    br="mlb$$"
    net="10.$((200 + $$ % 50)).$(($$ / 50 % 250))"
    # namespaces may be forbidden (a container without CAP_SYS_ADMIN):
    # a skip with the reason, not a failure
    if ! err=$(ip netns add "${prefix}-probe" 2>&1); then
        echo "nodes.sh: network namespaces are not permitted here ($err)" >&2
        exit 77
    fi
    ip netns del "${prefix}-probe"
    # the subnet must be free on this machine (nothing routes it but the default)
    if ip -4 route show | grep -q "^$net\."; then
        echo "nodes.sh: $net.0/24 is in use here" >&2
        exit 99
    fi
    {
        echo "prefix=$prefix br=$br net=$net n=$n"
    } >"$dir/nodes.env"
    ip link add "$br" type bridge
    ip addr add "$net.254/24" dev "$br"
    ip link set "$br" up
    nodelines=""
    k=1
    while [ $k -le "$n" ]; do
        ns=$(ns_of "n$k")
        ip netns add "$ns"
        ip link add "${prefix}v$k" type veth peer name "${prefix}p$k"
        ip link set "${prefix}p$k" master "$br" up
        ip link set "${prefix}v$k" netns "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "${prefix}v$k" name eth0
        ip -n "$ns" addr add "$net.$k/24" dev eth0
        ip -n "$ns" link set eth0 up
        nodelines="${nodelines}NodeName=n$k NodeAddr=$net.$k CPUs=$cpus RealMemory=4000 State=UNKNOWN
"
        k=$((k + 1))
    done
    port=$((17000 + $$ % 2000))
    # SlurmdTimeout: a dead node is marked down after 20 s (300 by
    # default; a node that answers again before is still its jobs'); KillWait: srun gives up on a dead node's tasks 2 + 2 s
    # after the step was cancelled (30 + 2 by default)
    slurm_write_conf "$dir/slurm.conf" "$net.254" "$port" "$dir" \
        "SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/run/slurmd.%n.pid
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmdTimeout=${MALLEUS_SLURMD_TIMEOUT:-20}
KillWait=2" \
        "$nodelines" "n[1-$n]"
    slurm_start_munge "$dir"
    SLURM_CONF=$dir/slurm.conf
    export SLURM_CONF
    /usr/sbin/slurmctld -f "$SLURM_CONF"
    k=1
    while [ $k -le "$n" ]; do
        start_slurmd "n$k"
        k=$((k + 1))
    done
    k=1
    while [ $k -le "$n" ]; do
        wait_node "n$k" idle || exit 99
        k=$((k + 1))
    done
    echo "SLURM_CONF=$SLURM_CONF; export SLURM_CONF"
    ;;
kill | stop | cont)
    load
    node=${3:?NODE}
    sig=KILL
    [ "$cmd" = stop ] && sig=STOP
    [ "$cmd" = cont ] && sig=CONT
    p=$(pids_of "$node")
    [ -n "$p" ] || { echo "nodes.sh: node $node runs nothing" >&2; exit 1; }
    # shellcheck disable=SC2086
    kill -s $sig $p
    ;;
start)
    load
    node=${3:?NODE}
    start_slurmd "$node"
    wait_node "$node" ""
    ;;
pids)
    load
    pids_of "${3:?NODE}"
    ;;
idle)
    load
    k=1
    while [ $k -le "$n" ]; do
        wait_node "n$k" idle || exit 1
        k=$((k + 1))
    done
    ;;
run)
    load
    node=${3:?NODE}
    shift 3
    exec nsenter --net="/run/netns/$(ns_of "$node")" unshare --uts \
        sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
    ;;
down)
    [ -f "$dir/nodes.env" ] || exit 0
    load
    # every process of every node (a stopped one must be continued to die
    # of SIGTERM; SIGKILL needs no such care), then the controller
    k=1
    while [ $k -le "$n" ]; do
        p=$(pids_of "n$k")
        # shellcheck disable=SC2086
        [ -z "$p" ] || kill -KILL $p 2>/dev/null || true
        k=$((k + 1))
    done
    # slurmctld's state dies with DIR: no orderly shutdown to wait for
    # (2-4 s of saving state, longer with a node down)
    [ -f "$dir/slurmctld.pid" ] && kill -KILL "$(cat "$dir/slurmctld.pid")" 2>/dev/null || true
    slurm_stop_pidfile "$dir/munged.pid"
    k=1
    while [ $k -le "$n" ]; do
        ip netns del "$(ns_of "n$k")" 2>/dev/null || true
        k=$((k + 1))
    done
    ip link del "$br" 2>/dev/null || true
    ;;
*)
    echo "usage: $0 up|down|kill|stop|cont|start|pids|idle|run DIR [...]" >&2
    exit 2
    ;;
esac
