#!/bin/sh
# The straggler-adaptive restart loop without Slurm (jobs/adaptive-loop.sh
# under mpiexec): 8 ranks, rank 3 slowed 4x from step 6; the loop must
# re-plan, reshard, resume, reach the target step, and follow the
# straggler-free one-process loss curve (tests/check_loop.py).  Its
# periodic snapshots are written in the background (--snapshot-async; the
# re-plan's own snapshot is committed before exit 3): the loop must find
# the newest complete one all the same.  tests/test_slurm.sh runs the
# same loop with synchronous snapshots.  --change-cost 0: the loop is under
# test here, not whether a restart pays in a 24-step run of the tiny model
# (it does not: tests/test_policy_run.sh).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
: "${PYTHON3:=/usr/bin/python3}"
W=$(mktemp -d /tmp/malleus-test-loop-XXXXXX)
trap 'rm -rf "$W"' EXIT
STEPS=24
export OPENBLAS_NUM_THREADS=1
"$top_builddir/malleus-train" --model tiny --steps $STEPS --global-batch 16 --micro-batch 2 \
    --quiet --metrics "$W/ref.jsonl" || exit 99
MALLEUS_BIN="$top_builddir" RUN_DIR="$W/run" NPROCS=8 LAUNCH="timeout 120 $MPIEXEC -n 8" \
    STEPS=$STEPS RANKS_PER_NODE=4 SNAPSHOT_EVERY=6 \
    TRAIN_ARGS="--snapshot-async --change-cost 0 --inject 3:4:6 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0" \
    timeout 600 bash "$top_srcdir/jobs/adaptive-loop.sh" >"$W/loop.out" 2>&1
rc=$?
cat "$W/run/events.log" 2>/dev/null
[ $rc -eq 0 ] || { tail -30 "$W/loop.out"; echo "FAIL: the loop exited with $rc"; exit 1; }
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/run" "$W/ref.jsonl" $STEPS 3
