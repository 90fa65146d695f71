#!/bin/sh
# One malleus-train job across a real Slurm cluster of 4 nodes on this
# machine (tests/slurm/nodes.sh: a network and UTS namespace per node, a
# slurmd in each): srun --mpi=pmi2, 8 ranks, 2 per node, TP 2 inside a node
# and DP 4 across the nodes, so the gradient sums travel TCP between the
# namespaces.  Checks that the ranks ran on 4 different nodes (each rank
# prints its SLURM_NODEID and hostname before it becomes malleus-train) and
# that the loss curve equals a one-process run (tests/check_loop.py).
# Then node n3 fails in the middle of a run, twice: first it stops
# answering (SIGSTOP to every process of its namespace, slurmd included),
# then it dies (SIGKILL to them all).  Slurm would notice only after
# SlurmdTimeout; the ranks' own watchdog (--peer-timeout 3: a heartbeat
# between the ranks) must end every surviving rank within 6 s.  srun's own
# end is Slurm's: usually KillWait (2 here) + 2 s after the ranks, but when
# the node's slurmd is dead srun may wait until slurmctld marks the node
# down: SlurmdTimeout (20 here) after its last answer, noticed at its next
# ping round (every SlurmdTimeout / 3) -- seen in the sanitizer build:
# 20.0 s and 31.3 s -- so its bound is 45 s.
# Needs root, slurm-wlm, munge and network namespaces (else skips, 77).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
NAME=nodes
. "$top_srcdir/tests/slurm/nodes_test.sh"

STEPS=6
export OPENBLAS_NUM_THREADS=1
ARGS="--model tiny --steps $STEPS --global-batch 16 --micro-batch 2 --quiet"
# shellcheck disable=SC2086
"$top_builddir/malleus-train" $ARGS --metrics "$W/ref.jsonl" || exit 99
mkdir -p "$W/run" && : >"$W/run/events.log"
# shellcheck disable=SC2086
timeout -k 5 60 srun -N4 -n8 --ntasks-per-node=2 --mpi=pmi2 --kill-on-bad-exit=1 -l \
    sh -c 'echo "rank $SLURM_PROCID node $SLURM_NODEID host $(hostname)"; exec "$@"' sh \
    "$top_builddir/malleus-train" $ARGS --tp 2 --dp 4 --metrics "$W/run/metrics.jsonl" \
    >"$W/job.out" 2>&1
rc=$?
cat "$W/job.out"
[ $rc = 0 ] || { echo "FAIL: srun exited $rc"; exit 1; }
# every node ran 2 ranks, under its own hostname
hosts=$(sed -n 's/.*rank [0-9]* node \([0-9]*\) host \(n[0-9]*\)$/\1 \2/p' "$W/job.out" | sort | uniq -c)
echo "ranks per node:"
echo "$hosts"
[ "$(echo "$hosts" | grep -c '^ *2 [0-3] n[1-4]$')" = 4 ] ||
    { echo "FAIL: the 8 ranks did not run 2 on each of 4 nodes"; exit 1; }
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/run" "$W/ref.jsonl" $STEPS -1 || exit 1

# Node n3 fails once rank 0 has written 5 steps; every rank on the other
# nodes must be gone within 6 s; srun within 45 s (see the top).
T=3
survivors() {
    for k in 1 2 4; do
        for p in $(sh "$top_srcdir/tests/slurm/nodes.sh" pids "$W/cluster" "n$k"); do
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = malleus-train ] && echo "$p"
        done
    done
}
fail_node() { # kill|stop
    what="killed"
    [ "$1" = stop ] && what="stopped"
    rm -f "$W/fail.jsonl" "$W"/fail.out*
    # each task's output into a file of its own, written by its node's
    # slurmstepd: what srun forwards can lose a rank's last line when the
    # step is cancelled right after it
    # shellcheck disable=SC2086
    timeout -k 5 60 srun -N4 -n8 --ntasks-per-node=2 --mpi=pmi2 --kill-on-bad-exit=1 \
        -o "$W/fail.out.%t" "$top_builddir/malleus-train" $ARGS --steps 100000 --tp 2 --dp 4 \
        --peer-timeout $T --metrics "$W/fail.jsonl" >"$W/fail.out" 2>&1 &
    srun_pid=$!
    i=0
    while [ "$( (wc -l <"$W/fail.jsonl") 2>/dev/null || echo 0)" -lt 5 ]; do
        sleep 0.1
        i=$((i + 1))
        [ $i -lt 300 ] || { cat "$W/fail.out"; echo "FAIL: the job did not reach step 5"; exit 1; }
    done
    tf=$(date +%s%N)
    sh "$top_srcdir/tests/slurm/nodes.sh" "$1" "$W/cluster" n3 || exit 99
    while [ -n "$(survivors)" ] && [ "$(ms "$tf")" -lt 15000 ]; do sleep 0.1; done
    ranks_ms=$(ms "$tf")
    while kill -0 $srun_pid 2>/dev/null && [ "$(ms "$tf")" -lt 35000 ]; do sleep 0.1; done
    srun_ms=$(ms "$tf")
    grep -h "has not been heard from" "$W"/fail.out* | head -2
    echo "node n3 $what at step $(wc -l <"$W/fail.jsonl" | tr -d ' '): the surviving ranks were gone after $ranks_ms ms, srun after $srun_ms ms"
    [ "$ranks_ms" -le 6000 ] || {
        tail -5 "$W/fail.out"
        echo "FAIL: surviving ranks still ran $ranks_ms ms after node n3 $what (bound 6 s)"
        exit 1
    }
    [ "$srun_ms" -le 45000 ] || { echo "FAIL: srun still ran $srun_ms ms after node n3 $what"; exit 1; }
    grep -q "rank [45] (host n3) has not been heard from" "$W"/fail.out* ||
        { tail "$W"/fail.out*; echo "FAIL: no rank named the silent peer on n3"; exit 1; }
    wait $srun_pid
}
fail_node stop
sh "$top_srcdir/tests/slurm/nodes.sh" cont "$W/cluster" n3
sh "$top_srcdir/tests/slurm/nodes.sh" idle "$W/cluster" || exit 1
fail_node kill
echo "cluster up to the end of the checks: $(ms "$t0") ms"
