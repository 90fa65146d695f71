#!/bin/sh
# Nodes go and come back while the job runs: jobs/malleus.sbatch (the
# adaptive loop) with sbatch --no-kill on a 4-node Slurm cluster on this
# machine (tests/slurm/nodes.sh), 8 ranks, 2 per node, a snapshot every 4
# steps.  Once 10 steps are done, every process of node n3 is killed.  The
# ranks' heartbeat ends the step in seconds (--peer-timeout 3); the loop
# finds that n3 no longer runs a task, plans for the 6 ranks of n1, n2 and
# n4 with the rates measured so far, reshards the newest snapshot (step 8)
# onto that plan and goes on there.  Once a step is done on 6 ranks, n3's
# slurmd is started again (before Slurm marks the node down: it is still
# the job's); the loop, which probes the missing node every second while
# the 6 ranks train (GROW_POLL=1), stops them at a step boundary with a
# snapshot, plans for 8 ranks, reshards and finishes the run on all four
# nodes.  Checks: the shrink and the growth in the events, a 6-rank plan
# then an 8-rank one, the job's exit 0:0, and every step's loss equal to an
# uninterrupted one-process run within 1e-5 relative (tests/check_loop.py:
# the snapshot and its consumed samples are the restart point; what is
# left is float rounding of the layouts, 0 to 3e-7 measured).  Then one rank on n3 is killed (its node lives on): the
# other ranks must end within 6 s (srun --kill-on-bad-exit, else the
# heartbeat), every node answers, and the loop resumes on the same four
# nodes and plan from the newest snapshot.  Prints the steps lost and the
# seconds from the kill to the first step on the survivors, from the
# node's return to the first step on 8 ranks, and from the rank's death to
# the first step after it.
# Needs root, slurm-wlm, munge and network namespaces (else skips, 77).
# (the polls below are shell commands in single quotes, evaluated later)
# shellcheck disable=SC2016,SC2034,SC2046
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
NAME=shrink
# the node must come back before Slurm marks it down (and takes it out of
# the job): 30 s of silence, not 20, leaves room on a loaded machine
MALLEUS_SLURMD_TIMEOUT=30
export MALLEUS_SLURMD_TIMEOUT
. "$top_srcdir/tests/slurm/nodes_test.sh"

STEPS=60
export OPENBLAS_NUM_THREADS=1
"$top_builddir/malleus-train" --model tiny --steps $STEPS --global-batch 16 --micro-batch 2 \
    --quiet --metrics "$W/ref.jsonl" || exit 99
MALLEUS_BIN="$top_builddir" MALLEUS_LOOP="$top_srcdir/jobs/adaptive-loop.sh" RUN_DIR="$W/run"
RANKS_PER_NODE=2 SNAPSHOT_EVERY=4 GROW_POLL=1
# no re-plan for timing noise on this loaded machine: the shrink and the
# growth are the only changes of plan; ranks 0-5 (there in every
# generation) sleep 14x their compute up to step 36, ~0.2 s a step, so
# that the run is still going when the node is back (it grows at step
# 14-19), and the steps after it take less time
TRAIN_ARGS="--peer-timeout 3 --noise-floor 50"
for r in 0 1 2 3 4 5; do TRAIN_ARGS="$TRAIN_ARGS --inject $r:15:0:36"; done
export MALLEUS_BIN MALLEUS_LOOP RUN_DIR STEPS RANKS_PER_NODE SNAPSHOT_EVERY GROW_POLL TRAIN_ARGS
jobid=$(sbatch --parsable --no-kill -N4 -n8 --ntasks-per-node=2 --export=ALL -o "$W/job.out" \
    "$top_srcdir/jobs/malleus.sbatch") || {
    echo "FAIL: sbatch refused the job"
    exit 1
}
lines() { (wc -l <"$W/run/metrics.jsonl") 2>/dev/null || echo 0; }
# until_ok SECONDS WHAT TEST: poll the shell command TEST every 0.1 s while
# the job runs; fail naming WHAT (TEST is evaluated there, so its variables
# are written in single quotes)
until_ok() {
    i=0
    until eval "$3"; do
        sleep 0.1
        i=$((i + 1))
        [ $i -lt $(($1 * 10)) ] && squeue -h -j "$jobid" 2>/dev/null | grep -q . ||
            { grep '^srun' "$W/job.out"; cat "$W/run/events.log"; echo "FAIL: $2"; exit 1; }
    done
}
ranks() { # the malleus-train processes of nodes $@
    for k in "$@"; do
        for p in $(sh "$top_srcdir/tests/slurm/nodes.sh" pids "$W/cluster" "$k"); do
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = malleus-train ] && echo "$p"
        done
    done
}
gone() { for p in $others; do [ -d "/proc/$p" ] && return 1; done; return 0; }
until_ok 60 "the job did not reach step 10" '[ "$(lines)" -ge 10 ]'
others=$(ranks n1 n2 n4)
kill_s=$(date +%s.%N)
sh "$top_srcdir/tests/slurm/nodes.sh" kill "$W/cluster" n3 || exit 99
echo "killed node n3 after step $(lines | tr -d ' ')"
until_ok 10 "the ranks of n1, n2 and n4 still ran 10 s after n3 was killed" gone
echo "the ranks of n1, n2 and n4 gone $(echo "$(date +%s.%N) $kill_s" | awk '{printf "%.1f", $1 - $2}') s after the kill"
until_ok 40 "the loop did not see the failure" 'grep -q "training failed" "$W/run/events.log"'
seen=$(echo "$(date +%s.%N) $kill_s" | awk '{printf "%.1f", $1 - $2}')
echo "the loop saw the failure $seen s after the kill"
# srun usually ends KillWait after the ranks; rarely (1 run in 10) it
# waits until Slurm marks the dead node down, which takes the node out of
# the job: then its return cannot be grown onto in this job
scontrol show job "$jobid" | grep -q ' NodeList=n\[1-4\]' || {
    scontrol show job "$jobid" | grep ' NodeList='
    echo "SKIP: srun ended only when Slurm marked n3 down ($seen s after the kill), which took n3 out of the job"
    exit 77
}
# a step done on the survivors: a metrics row after generation 1 started
until_ok 40 "the job did not shrink onto 6 ranks" 'grep -q "generation 1: training" "$W/run/events.log"'
at=$(lines)
until_ok 20 "no step on 6 ranks" '[ "$(lines)" -gt "$at" ]'
back_s=$(date +%s.%N)
sh "$top_srcdir/tests/slurm/nodes.sh" start "$W/cluster" n3 || exit 99
echo "node n3 back $(echo "$back_s $kill_s" | awk '{printf "%.1f", $1 - $2}') s after the kill, after step $(lines | tr -d ' ')"
# a step on 8 ranks, then one rank of n3 is killed (its node lives on)
until_ok 30 "the job did not grow onto 8 ranks" 'grep -q "generation 2: training" "$W/run/events.log"'
at=$(lines)
until_ok 20 "no step on 8 ranks" '[ "$(lines)" -gt "$at" ]'
others=$(ranks n1 n2 n4)
victim=$(ranks n3 | head -1)
[ -n "$victim" ] && [ -n "$others" ] || { echo "FAIL: no ranks found on the nodes"; exit 1; }
rank_s=$(date +%s.%N)
kill -KILL "$victim"
echo "killed rank pid $victim on n3 after step $(lines | tr -d ' ')"
until_ok 6 "the other ranks still ran 6 s after a rank was killed" gone
gone_s=$(date +%s.%N)
i=0
while squeue -h -j "$jobid" 2>/dev/null | grep -q .; do
    sleep 0.5
    i=$((i + 1))
    [ $i -lt 120 ] || { tail -30 "$W/job.out"; echo "FAIL: job $jobid still running 60 s after n3 came back"; exit 1; }
done
cat "$W/run/events.log"
code=$(scontrol show job "$jobid" 2>/dev/null | sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' | head -1)
[ "$code" = "0:0" ] || { tail -30 "$W/job.out"; echo "FAIL: job exit code $code"; exit 1; }
grep -q "node(s) n3 do not answer: continuing on n1 n2 n4 (6 ranks" "$W/run/events.log" ||
    { echo "FAIL: the loop did not shrink onto n1 n2 n4"; exit 1; }
grep -q "node(s) n3 answer again: continuing on n1 n2 n3 n4 (8 ranks" "$W/run/events.log" || {
    scontrol show job "$jobid" | grep -E ' NodeList'
    echo "FAIL: the loop did not grow back onto n1 n2 n3 n4"
    exit 1
}
# a plan's ranks: its stages' and the suspended ones (timing noise may
# make the planner suspend a rank of the survivors)
plan_ranks() {
    tr -d '\n' <"$1" | grep -o '"\(ranks\|suspended\)": *\[[0-9, ]*\]' |
        tr -cd '0-9,\n' | tr ',' '\n' | grep . | sort -un | wc -l
}
[ "$(plan_ranks "$W/run/plan.1.json")" = 6 ] || { cat "$W/run/plan.1.json"; echo "FAIL: plan.1.json does not have 6 ranks"; exit 1; }
[ "$(plan_ranks "$W/run/plan.2.json")" = 8 ] || { cat "$W/run/plan.2.json"; echo "FAIL: plan.2.json does not have 8 ranks"; exit 1; }
# the rank's death: the job restarted on the same 4 nodes, no shrink
sed -n '/generation 2: training/,$p' "$W/run/events.log" >"$W/gen2.log"
grep -q "training failed" "$W/gen2.log" && grep -q "every node (n1 n2 n3 n4) answers" "$W/gen2.log" &&
    ! grep -q "do not answer" "$W/gen2.log" && [ ! -e "$W/run/plan.3.json" ] ||
    { echo "FAIL: after a rank was killed the loop did not resume on the same 4 nodes"; exit 1; }
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/run" "$W/ref.jsonl" $STEPS -1 1e-5 || exit 1
# the step a run of generation $1 resumed from (its $2th run) and the time
# of its first row, the first after time $3 (a row a later resume
# superseded counts: it was moved aside)
first_step() {
    r=$(sed -n "s/.*generation $1: training.*resuming from step \([0-9]*\).*/\1/p" "$W/run/events.log" | sed -n "$2p")
    t=$(cat "$W/run/metrics.jsonl" "$W/run/metrics.jsonl.superseded" 2>/dev/null | grep "^{\"step\": $((r + 1))," |
        sed -n 's/.*"time": *\([0-9.]*\).*/\1/p' | awk -v t0="$3" '$1 > t0 && (m == "" || $1 < m) { m = $1 } END { print m }')
    echo "$r $t"
}
since() { echo "$1 $2" | awk '{printf "%.1f", $1 - $2}'; }
set -- $(first_step 1 1 "$kill_s") $(first_step 2 1 "$back_s") $(first_step 2 2 "$rank_s")
echo "shrink: $(grep -o '[0-9]* steps lost' "$W/run/events.log" | head -1); kill to the first step on the survivors: $(since "$2" "$kill_s") s"
echo "grow: resumed from step $3 (0 steps lost: the stop's snapshot); node back to the first step on 8 ranks: $(since "$4" "$back_s") s"
echo "rank killed: the other ranks gone after $(since "$gone_s" "$rank_s") s; resumed from step $5 on the same nodes; kill to the first step: $(since "$6" "$rank_s") s"
grep '^srun' "$W/job.out"
echo "cluster up to the end of the checks: $(ms "$t0") ms"
