#!/bin/sh
# The straggler-adaptive loop on a real Slurm: start munge, slurmctld and
# slurmd on this machine (tests/slurm/cluster.sh), sbatch jobs/malleus.sbatch
# with 8 ranks and rank 3 slowed 4x from step 6, kill rank 5 with SIGKILL
# mid-training (its step must end within 45 s and the loop resume from the
# newest snapshot), wait for the job, check the run (tests/check_loop.py:
# re-plan, and the loss curve of an uninterrupted one-process run), stop the
# daemons.  Needs root and slurm-wlm
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
# One test cluster at a time on this machine: they share munged (the
# first to stop would take it from the other) and name their node after
# the host.  make -j runs the Slurm tests side by side otherwise.
exec 9>"${TMPDIR:-/tmp}/malleus-slurm-tests.lock"
flock 9
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
# (--change-cost 0: a restart must happen, paying or not; tests/test_loop.sh)
TRAIN_ARGS="--change-cost 0 --inject 3:4:6 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0"
export MALLEUS_BIN MALLEUS_LOOP RUN_DIR STEPS RANKS_PER_NODE SNAPSHOT_EVERY TRAIN_ARGS
jobid=$(sbatch --parsable --export=ALL -o "$W/job.out" "$top_srcdir/jobs/malleus.sbatch") || {
    echo "FAIL: sbatch refused the job"
    exit 1
}
echo "submitted job $jobid"

# A rank killed with SIGKILL in the middle of training (rank 5 of the
# second generation, the one on the new plan, once step 14 is done: after
# the snapshot of step 12) must end its job step within 45 s
# (srun --kill-on-bad-exit), not leave the other 7 ranks blocked until the
# job's time limit; the loop then resumes from the newest complete
# snapshot, and the curve checked below is still the uninterrupted one.
env_of() { (tr '\0' '\n' <"/proc/$1/environ") 2>/dev/null; }
n_failed() {
    n=$(grep -c "training failed" "$W/run/events.log" 2>/dev/null)
    echo "${n:-0}"
}
victim="" t=0
while [ -z "$victim" ] && [ $t -lt 1200 ]; do
    sleep 0.1
    t=$((t + 1))
    # Not in generation 0: a kill there can land while the generation is
    # already ending for its re-plan, and then no step fails at all.
    grep -q "generation 1: training" "$W/run/events.log" 2>/dev/null || continue
    [ "$( (wc -l <"$W/run/metrics.jsonl") 2>/dev/null || echo 0)" -ge 14 ] || continue
    for p in $(pgrep -x malleus-train); do
        env_of "$p" | grep -qx "SLURM_JOB_ID=$jobid" && env_of "$p" | grep -qx "SLURM_PROCID=5" &&
            victim=$p
    done
done
[ -n "$victim" ] || { echo "FAIL: no rank 5 of job $jobid to kill"; cat "$W/job.out"; exit 1; }
failed_before=$(n_failed)
kill -9 "$victim"
t0=$(date +%s)
echo "killed rank 5 (pid $victim) with SIGKILL after $(wc -l <"$W/run/metrics.jsonl") metrics lines"
while [ "$(n_failed)" -le "$failed_before" ]; do
    sleep 0.2
    if [ $(($(date +%s) - t0)) -gt 120 ]; then
        echo "FAIL: the job step still runs 120 s after rank 5 was killed"
        exit 1
    fi
done
dt=$(($(date +%s) - t0))
# srun sends the other ranks SIGTERM, which asks them for a stop at the end
# of a step that can never end (rank 5 is gone), and the peer watch ends
# their waits once rank 5 has been silent for 10 s (--peer-timeout): the
# fatal path's MPI_Abort, which srun no longer acts on while it ends the
# step, then ends each rank itself after 5 s (comm/comm_mpi.c) -- 14 s
# measured; or the step bound (10 s + 3x the longest step, train/preempt.h)
# where that comes first.  Not the time limit, and not Slurm's SIGKILL after
# KillWait (30 s): the survivors exit by themselves (before, srun reported
# them "Killed" at 30-31 s).
[ $dt -le 45 ] || { echo "FAIL: the job step ended ${dt} s after rank 5 was killed (limit 45 s)"; exit 1; }
killed=$(grep -E '^srun: error: [^:]*: tasks? [0-9,-]+: Killed' "$W/job.out" | grep -v ': task 5: Killed')
[ -z "$killed" ] || { echo "FAIL: Slurm killed ranks that should have ended by themselves: $killed"; exit 1; }
echo "ok: the job step ended ${dt} s after rank 5 was killed, the other ranks by themselves"

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
grep -q "training failed" "$W/run/events.log" || { echo "FAIL: the loop saw no failure"; exit 1; }
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/run" "$W/ref.jsonl" $STEPS 3
