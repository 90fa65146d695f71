#!/bin/sh
# One malleus-train job across a real Slurm cluster of 4 nodes on this
# machine (tests/slurm/nodes.sh: a network and UTS namespace per node, a
# slurmd in each): srun --mpi=pmi2, 8 ranks, 2 per node, TP 2 inside a node
# and DP 4 across the nodes, so the gradient sums travel TCP between the
# namespaces.  Checks that the ranks ran on 4 different nodes (each rank
# prints its SLURM_NODEID and hostname before it becomes malleus-train) and
# that the loss curve equals a one-process run (tests/check_loop.py).
# Needs root, slurm-wlm, munge and network namespaces (else skips, 77).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
W=$(mktemp -d /tmp/malleus-test-nodes-XXXXXX)
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
cleanup() {
    t=$(date +%s%N)
    sh "$top_srcdir/tests/slurm/nodes.sh" down "$W/cluster"
    echo "cluster down in $(ms "$t") ms"
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# one test cluster at a time (shared munged; test_slurm.sh)
exec 9>"${TMPDIR:-/tmp}/malleus-slurm-tests.lock"
flock 9
t0=$(date +%s%N)
out=$(sh "$top_srcdir/tests/slurm/nodes.sh" up "$W/cluster" 4 2) || {
    rc=$?
    echo "nodes.sh up failed ($rc)"
    tail -5 "$W"/cluster/log/* 2>/dev/null
    exit $rc
}
eval "$out"
echo "cluster of 4 nodes up in $(ms "$t0") ms"

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
echo "cluster up to checked run: $(ms "$t0") ms"
