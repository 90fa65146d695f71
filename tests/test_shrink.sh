#!/bin/sh
# A node dies and the job goes on without it: jobs/malleus.sbatch (the
# adaptive loop) with sbatch --no-kill on a 4-node Slurm cluster on this
# machine (tests/slurm/nodes.sh), 8 ranks, 2 per node, a snapshot every 4
# steps.  Once 10 steps are done, every process of node n3 is killed.  The
# ranks' heartbeat ends the step in seconds (--peer-timeout 3); the loop
# finds that n3 no longer runs a task, plans for the 6 ranks of n1, n2 and
# n4 with the rates measured so far, reshards the newest snapshot (step 8)
# onto that plan and finishes the run there.  Checks: the shrink in the
# events, a 6-rank plan, the job's exit 0:0, and every step's loss equal to
# an uninterrupted one-process run (tests/check_loop.py: the snapshot and
# its consumed samples are the restart point).  Prints the steps lost and
# the seconds from the kill to the first step on the survivors.
# Needs root, slurm-wlm, munge and network namespaces (else skips, 77).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
NAME=shrink
. "$top_srcdir/tests/slurm/nodes_test.sh"

STEPS=16
export OPENBLAS_NUM_THREADS=1
"$top_builddir/malleus-train" --model tiny --steps $STEPS --global-batch 16 --micro-batch 2 \
    --quiet --metrics "$W/ref.jsonl" || exit 99
MALLEUS_BIN="$top_builddir" MALLEUS_LOOP="$top_srcdir/jobs/adaptive-loop.sh" RUN_DIR="$W/run"
RANKS_PER_NODE=2 SNAPSHOT_EVERY=4
# no re-plan for timing noise on this loaded machine: the shrink is the
# only change of plan
TRAIN_ARGS="--peer-timeout 3 --noise-floor 50"
export MALLEUS_BIN MALLEUS_LOOP RUN_DIR STEPS RANKS_PER_NODE SNAPSHOT_EVERY TRAIN_ARGS
jobid=$(sbatch --parsable --no-kill -N4 -n8 --ntasks-per-node=2 --export=ALL -o "$W/job.out" \
    "$top_srcdir/jobs/malleus.sbatch") || {
    echo "FAIL: sbatch refused the job"
    exit 1
}
i=0
while [ "$( (wc -l <"$W/run/metrics.jsonl") 2>/dev/null || echo 0)" -lt 10 ]; do
    sleep 0.1
    i=$((i + 1))
    [ $i -lt 600 ] || { cat "$W/job.out"; echo "FAIL: the job did not reach step 10"; exit 1; }
done
kill_s=$(date +%s.%N)
sh "$top_srcdir/tests/slurm/nodes.sh" kill "$W/cluster" n3 || exit 99
echo "killed node n3 after step $(wc -l <"$W/run/metrics.jsonl" | tr -d ' ')"
i=0
while squeue -h -j "$jobid" 2>/dev/null | grep -q .; do
    sleep 0.5
    i=$((i + 1))
    [ $i -lt 180 ] || { tail -30 "$W/job.out"; echo "FAIL: job $jobid still running 90 s after the kill"; exit 1; }
done
cat "$W/run/events.log"
code=$(scontrol show job "$jobid" 2>/dev/null | sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' | head -1)
[ "$code" = "0:0" ] || { tail -30 "$W/job.out"; echo "FAIL: job exit code $code"; exit 1; }
grep -q "node(s) n3 do not answer: continuing on n1 n2 n4 (6 ranks" "$W/run/events.log" ||
    { echo "FAIL: the loop did not shrink onto n1 n2 n4"; exit 1; }
# the new plan's ranks: its stages' and the suspended ones (timing noise
# may make the planner suspend a rank of the survivors)
n6=$(tr -d '\n' <"$W/run/plan.1.json" | grep -o '"\(ranks\|suspended\)": *\[[0-9, ]*\]' |
    tr -cd '0-9,\n' | tr ',' '\n' | grep . | sort -un | wc -l)
[ "$n6" = 6 ] || { cat "$W/run/plan.1.json"; echo "FAIL: plan.1.json has $n6 ranks, not 6"; exit 1; }
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/run" "$W/ref.jsonl" $STEPS -1 || exit 1
# the first step of generation 1 (the resumed run's first metrics row)
resumed=$(sed -n 's/.*resuming from step \([0-9]*\).*/\1/p' "$W/run/events.log" | tail -1)
first=$(grep "^{\"step\": $((resumed + 1))," "$W/run/metrics.jsonl" | sed -n 's/.*"time": *\([0-9.]*\).*/\1/p' | tail -1)
echo "shrink: $(grep -o '[0-9]* steps lost' "$W/run/events.log"); kill to the first step on the survivors: $(echo "$first $kill_s" | awk '{printf "%.1f", $1 - $2}') s"
echo "cluster up to the end of the checks: $(ms "$t0") ms"
