#!/bin/sh
# The straggler-adaptive loop on a real Slurm: start munge, slurmctld and
# slurmd on this machine (tests/slurm/cluster.sh), sbatch jobs/malleus.sbatch
# with 8 ranks and rank 3 slowed 4x from step 6, wait for the job, check the
# run (tests/check_loop.py), stop the daemons.  Needs root and slurm-wlm
# (CI has both; elsewhere it skips).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
W=$(mktemp -d /tmp/malleus-test-slurm-XXXXXX)
cleanup() {
    [ -n "${jobid:-}" ] && scancel "$jobid" 2>/dev/null
    sh "$top_srcdir/tests/slurm/cluster.sh" down "$W/cluster"
    rm -rf "$W"
}
trap cleanup EXIT
out=$(sh "$top_srcdir/tests/slurm/cluster.sh" up "$W/cluster") || {
    rc=$?
    echo "cluster.sh up failed ($rc)"
    cat "$W"/cluster/log/* 2>/dev/null | tail -20
    exit $rc
}
eval "$out"
STEPS=24
export OPENBLAS_NUM_THREADS=1
"$top_builddir/malleus-train" --model tiny --steps $STEPS --global-batch 16 --micro-batch 2 \
    --quiet --metrics "$W/ref.jsonl" || exit 99
MALLEUS_BIN="$top_builddir" MALLEUS_LOOP="$top_srcdir/jobs/adaptive-loop.sh" RUN_DIR="$W/run"
RANKS_PER_NODE=4 SNAPSHOT_EVERY=6
TRAIN_ARGS="--inject 3:4:6 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0"
export MALLEUS_BIN MALLEUS_LOOP RUN_DIR STEPS RANKS_PER_NODE SNAPSHOT_EVERY TRAIN_ARGS
jobid=$(sbatch --parsable --export=ALL -o "$W/job.out" "$top_srcdir/jobs/malleus.sbatch") || {
    echo "FAIL: sbatch refused the job"
    exit 1
}
echo "submitted job $jobid"
t=0
while squeue -h -j "$jobid" 2>/dev/null | grep -q .; do
    sleep 0.5
    t=$((t + 1))
    [ $t -lt 1200 ] || { echo "FAIL: job $jobid still running after 600 s"; cat "$W/job.out"; exit 1; }
done
code=$(scontrol show job "$jobid" 2>/dev/null | sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' | head -1)
cat "$W/run/events.log" 2>/dev/null
echo "job $jobid exit code ${code:-unknown}"
[ "$code" = "0:0" ] || { tail -30 "$W/job.out"; echo "FAIL: job exit code $code"; exit 1; }
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/run" "$W/ref.jsonl" $STEPS 3
