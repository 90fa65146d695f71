#!/bin/sh
# Preemption and time limits on a real Slurm (tests/slurm/cluster.sh, with
# a 5 s requeue delay):
#  * jobs/malleus.sbatch (the loop, 2 ranks under srun) with a one-minute
#    time limit and --signal=B:USR1@30: Slurm's warning reaches the loop in
#    the middle of the run, the run stops after a step with its snapshot,
#    the job requeues itself, the requeued job continues from that
#    snapshot and finishes; the loss curve is the uninterrupted one-process
#    run's, every step once (tests/check_loop.py), nothing lost;
#  * the same loop stopped for good with `scancel --batch --signal=TERM`:
#    exit status 4, its snapshot, no requeue;
#  * malleus-train under srun: SIGUSR1 to srun, SIGTERM and SIGINT to the
#    ranks, SIGUSR1 to rank 1 alone: every rank stops after the same step,
#    with its snapshot, exit status 4.
# (srun itself turns SIGTERM and SIGHUP into SIGKILL for its tasks: the job
# scripts never send it those; tests/test_preempt.sh has mpiexec.)  Takes
# about a minute, most of it waiting for Slurm's time-limit check, which
# runs every 30 s.  Needs root and slurm-wlm (CI has both; elsewhere it
# skips); run it under the suite's Slurm lock.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
TRAIN="$top_builddir/malleus-train"
W=$(mktemp -d /tmp/malleus-test-slurm-preempt-XXXXXX)
jobs=""
cleanup() {
    for j in $jobs; do scancel "$j" 2>/dev/null; done
    sh "$top_srcdir/tests/slurm/cluster.sh" down "$W/cluster"
    rm -rf "$W"
}
trap cleanup EXIT
# requeued jobs start again after cred_expire (default 120 s), found by
# the scheduler's next pass
MALLEUS_SLURM_CONF_EXTRA="AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=1,bf_interval=1"
export MALLEUS_SLURM_CONF_EXTRA
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
export OPENBLAS_NUM_THREADS=1
. "$top_srcdir/tests/run_watch.sh"
job_done() { # JOBID SECONDS: until it has left the queue
    t=0
    while squeue -h -j "$1" 2>/dev/null | grep -q . && [ $t -lt $((2 * $2)) ]; do
        sleep 0.5
        t=$((t + 1))
    done
    ! squeue -h -j "$1" 2>/dev/null | grep -q .
}
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

# ---- the time limit: submitted first, it runs while the rest is tested
STEPS=80
"$TRAIN" --model tiny --steps $STEPS --global-batch 8 --micro-batch 4 --quiet \
    --metrics "$W/ref.jsonl" || exit 99
# 80 steps, the first 60 paced at 0.5 s each: Slurm's warning (at its first
# time-limit check, 30 s after the controller started) comes in the middle
loop_env() {
    env MALLEUS_BIN="$top_builddir" MALLEUS_LOOP="$top_srcdir/jobs/adaptive-loop.sh" NPROCS=2 \
        STEPS=$STEPS GLOBAL_BATCH=8 MICRO_BATCH=4 PIPELINES=1 SNAPSHOT_EVERY=1000 \
        TRAIN_ARGS="--window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0" "$@"
}
tl=$(loop_env RUN_DIR="$W/tl" MALLEUS_TEST_STEP_SLEEP=500:60 sbatch --parsable --export=ALL \
    -n 2 --time=1 --signal=B:USR1@30 -o "$W/tl.out" "$top_srcdir/jobs/malleus.sbatch") ||
    { echo "FAIL: sbatch refused the time-limit job"; exit 1; }
jobs="$tl"
echo "submitted job $tl: 1 minute limit, warning 30 s before"

# ---- stopped for good: the loop gets SIGTERM through scancel --batch
st=$(loop_env RUN_DIR="$W/st" MALLEUS_TEST_STEP_SLEEP=200:1000 STEPS=1000 sbatch --parsable \
    --export=ALL -n 2 -o "$W/st.out" "$top_srcdir/jobs/malleus.sbatch") ||
    { echo "FAIL: sbatch refused a job"; exit 1; }
jobs="$jobs $st"
wait_rows "$W/st/metrics.jsonl" 4
scancel --batch --signal=TERM "$st"
job_done "$st" 60 || fail "job $st still runs 60 s after scancel --batch --signal=TERM"
s=$(snap_step "$W/st/snap.0")
[ "$(job_field "$st" ExitCode)" = 4:0 ] && [ -n "$s" ] && [ "$s" = "$(last_step "$W/st/metrics.jsonl")" ] &&
    [ "$(job_field "$st" Restarts)" = 0 ] &&
    echo "ok: scancel --batch --signal=TERM: the loop stopped after step $s with its snapshot, exit 4, no requeue" ||
    { tail -20 "$W/st.out"; fail "scancel --batch TERM: exit $(job_field "$st" ExitCode), snapshot $s, restarts $(job_field "$st" Restarts)"; }

# ---- malleus-train under srun: signals to srun and to the ranks
rank_pid() { # DIR RANK: the rank's pid (its command line names DIR)
    for p in $(pgrep -x malleus-train); do
        tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF "$1/snap" &&
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" && echo "$p"
    done
}
srun_stop() { # NAME SIGNAL TARGET(srun|ranks|rank1)
    d="$W/$1"
    mkdir -p "$d"
    MALLEUS_TEST_STEP_SLEEP=100:100000 srun --mpi=pmi2 --kill-on-bad-exit=1 -n 2 -t 2 "$TRAIN" --model tiny \
        --dp 2 --global-batch 8 --micro-batch 4 --steps 100000 --snapshot-dir "$d/snap" \
        --snapshot-every 100000 --metrics "$d/m.jsonl" --quiet >"$d/out" 2>&1 &
    pid=$!
    wait_rows "$d/m.jsonl" 3
    case $3 in
    srun) kill -s "$2" $pid ;;
    ranks) kill -s "$2" $(rank_pid "$d" 0) $(rank_pid "$d" 1) ;;
    rank1) kill -s "$2" $(rank_pid "$d" 1) ;;
    esac
    wait $pid
    rc=$?
    s=$(snap_step "$d/snap") l=$(last_step "$d/m.jsonl")
    [ $rc -eq 4 ] && grep -q "stopped by SIG$2 after step" "$d/out" && [ -n "$s" ] && [ "$s" = "$l" ] &&
        echo "ok: srun, SIG$2 to the $3: stopped after step $s with its snapshot, exit 4" ||
        { cat "$d/out"; fail "srun, SIG$2 to the $3: exit $rc, snapshot ${s:-none}, metrics to step $l"; }
}
srun_stop usr1-srun USR1 srun
srun_stop term-ranks TERM ranks
srun_stop int-ranks INT ranks
srun_stop usr1-rank1 USR1 rank1

# ---- the time-limit job: warned, stopped, requeued, finished
job_done "$tl" 150 || { tail -30 "$W/tl.out"; fail "job $tl still runs after 150 s"; }
grep -E "^(adaptive-loop|malleus-train):" "$W/tl/events.log" 2>/dev/null
code=$(job_field "$tl" ExitCode) restarts=$(job_field "$tl" Restarts)
echo "job $tl: exit code ${code:-unknown}, requeued ${restarts:-?} time(s)"
[ "$code" = 0:0 ] || { tail -30 "$W/tl.out"; fail "time-limit job: exit code $code"; }
[ "${restarts:-0}" -ge 1 ] && grep -q "got SIGUSR1: stopping" "$W/tl/events.log" &&
    grep -q "requeued: run 2" "$W/tl/events.log" ||
    fail "time-limit job: not warned and requeued (restarts ${restarts:-0})"
# nothing lost: the requeued run resumed from the step its predecessor stopped after
s1=$(sed -n 's/.*stopped by SIGUSR1 after step \([0-9]*\) .*/\1/p' "$W/tl/events.log" | head -1)
grep -q "resuming from step ${s1:-x}\$" "$W/tl/events.log" && echo "ok: stopped after step $s1, the requeued run resumed from step $s1: work lost 0 steps" ||
    fail "the requeued run did not resume from step ${s1:-?}"
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$W/tl" "$W/ref.jsonl" $STEPS -1 || fails=$((fails + 1))

[ $fails -eq 0 ] && echo "PASS: preemption and time limits under Slurm" && exit 0
echo "FAIL: $fails check(s)"
exit 1
