#!/bin/sh
# Stop requests by signal (train/preempt.h) under mpiexec, 2 ranks:
#  * SIGTERM, SIGINT and SIGUSR1 sent to the launcher, SIGTERM, SIGINT and
#    SIGHUP sent to both ranks, SIGUSR1 sent to rank 1 alone: every rank
#    stops after the same step, the snapshot of that step is committed, exit
#    status 4; work lost = steps in the metrics past the snapshot = 0; no
#    UCX debug lines in the output (UCX's SIGHUP handler is replaced);
#  * a rank stuck in a step: the job ends within the step bound (10 s +
#    3x the longest step) or, with a short --stop-timeout, within that
#    (status 1, the last committed snapshot intact); a second signal ends
#    it at once;
#  * jobs/adaptive-loop.sh stopped by SIGTERM, SIGINT, SIGUSR1 and SIGHUP:
#    its run stops with a snapshot, the loop exits 4 and leaves no process
#    behind, its ranks see UCX_DEBUG_SIGNO=0; run again, it continues, and
#    after four stops the loss curve is the uninterrupted one-process run's
#    with every step once (tests/check_loop.py).
# tests/test_slurm_preempt.sh does the same under srun and Slurm.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
: "${PYTHON3:=/usr/bin/python3}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
TRAIN="$top_builddir/malleus-train"
W=$(mktemp -d /tmp/malleus-test-preempt-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
. "$top_srcdir/tests/run_watch.sh"

# the malleus-train ranks below the launcher
rank_pid() { # LAUNCHER_PID RANK
    for d in $(descendants "$1"); do
        [ "$(cat "/proc/$d/comm" 2>/dev/null)" = malleus-train ] &&
            tr '\0' '\n' <"/proc/$d/environ" 2>/dev/null | grep -qx "PMI_RANK=$2" && echo "$d"
    done
}

# ---- the trainer under mpiexec: every signal, to the launcher and the ranks
run_stop() { # NAME SIGNAL TARGET(launcher|ranks|rank1)
    d="$W/$1"
    mkdir -p "$d"
    "$MPIEXEC" -n 2 "$TRAIN" --model tiny --dp 2 --global-batch 8 --micro-batch 4 --steps 100000 \
        --snapshot-dir "$d/snap" --snapshot-every 100000 --metrics "$d/m.jsonl" --quiet \
        >"$d/out" 2>&1 &
    pid=$!
    guard $pid 60
    wait_rows "$d/m.jsonl" 3
    case $3 in
    launcher) kill -s "$2" $pid ;;
    ranks) kill -s "$2" $(rank_pid $pid 0) $(rank_pid $pid 1) ;;
    rank1) kill -s "$2" $(rank_pid $pid 1) ;;
    esac
    wait $pid
    rc=$?
    # MPICH's mpiexec may report 0 once it has forwarded a signal, whatever
    # the ranks exit with (the loop tells a stop by its snapshot)
    [ $rc -eq 4 ] || { [ $rc -eq 0 ] && [ "$3" = launcher ]; } ||
        { cat "$d/out"; fail "SIG$2 to the $3: exit status $rc"; return; }
    grep -q "stopped by SIG$2 after step" "$d/out" || { cat "$d/out"; fail "SIG$2 to the $3: no stop line"; }
    s=$(snap_step "$d/snap") l=$(last_step "$d/m.jsonl")
    [ -n "$s" ] && [ "$s" = "$l" ] ||
        { fail "SIG$2 to the $3: snapshot of step ${s:-none}, metrics to step $l"; return; }
    ! grep -q 'UCX  DEBUG' "$d/out" || fail "SIG$2 to the $3: UCX debug lines in the output"
    echo "ok: SIG$2 to the $3: stopped after step $s with its snapshot; work lost 0 steps"
}
run_stop term-launcher TERM launcher
run_stop int-launcher INT launcher
run_stop usr1-launcher USR1 launcher
run_stop term-ranks TERM ranks
run_stop int-ranks INT ranks
run_stop hup-ranks HUP ranks
run_stop usr1-rank1 USR1 rank1

# ---- bounds: a stuck rank, a second signal
# Rank 1 hangs in step 6; SIGTERM to rank 0 alone, which then waits for
# rank 1 in the step's all-reduce: its stop timeout ends it, and mpiexec
# the stuck rank with it.
d="$W/stuck"
mkdir -p "$d"
MALLEUS_TEST_STEP_STALL=1:6 "$MPIEXEC" -n 2 "$TRAIN" --model tiny --dp 2 --global-batch 8 \
    --micro-batch 4 --steps 1000 --snapshot-dir "$d/snap" --snapshot-every 2 --metrics "$d/m.jsonl" \
    --quiet --stop-timeout 2 >"$d/out" 2>&1 &
pid=$!
guard $pid 60
wait_rows "$d/m.jsonl" 5
sleep 0.5
t0=$(date +%s)
kill -TERM "$(rank_pid $pid 0)"
wait $pid
rc=$? dt=$(($(date +%s) - t0))
[ $rc -ne 0 ] && [ $rc -ne 4 ] && [ $dt -le 8 ] && grep -q "did not finish within the stop timeout" "$d/out" &&
    [ "$(snap_step "$d/snap")" = 4 ] && echo "ok: rank 1 stuck in step 6: the job ended ${dt} s after SIGTERM to rank 0 (--stop-timeout 2), status $rc, snapshot 4 intact" ||
    { cat "$d/out"; fail "stuck rank: status $rc after ${dt} s, snapshot $(snap_step "$d/snap")"; }

d="$W/twice"
mkdir -p "$d"
MALLEUS_TEST_STEP_STALL=1:6 "$MPIEXEC" -n 2 "$TRAIN" --model tiny --dp 2 --global-batch 8 \
    --micro-batch 4 --steps 1000 --metrics "$d/m.jsonl" --quiet --stop-timeout 100 >"$d/out" 2>&1 &
pid=$!
guard $pid 60
wait_rows "$d/m.jsonl" 5
r0=$(rank_pid $pid 0)
kill -TERM "$r0"
sleep 1.5
t0=$(date +%s)
kill -TERM "$r0"
wait $pid
rc=$? dt=$(($(date +%s) - t0))
[ $rc -ne 0 ] && [ $dt -le 5 ] && grep -q "second stop signal" "$d/out" &&
    echo "ok: a second SIGTERM ended the stuck job ${dt} s after it (status $rc)" ||
    { cat "$d/out"; fail "second signal: status $rc after ${dt} s"; }

# The step bound (train/preempt.h): a stop that cannot reach the end of
# its step -- rank 1 hangs in step 6, as a rank whose peer died does --
# ends within 10 s + 3x the longest step, long before the stop timeout
# (100 s here; the guard would stop the job at 60 s and fail it).
d="$W/bound"
mkdir -p "$d"
MALLEUS_TEST_STEP_STALL=1:6 "$MPIEXEC" -n 2 "$TRAIN" --model tiny --dp 2 --global-batch 8 \
    --micro-batch 4 --steps 1000 --metrics "$d/m.jsonl" --quiet --stop-timeout 100 >"$d/out" 2>&1 &
pid=$!
guard $pid 60
wait_rows "$d/m.jsonl" 5
sleep 0.5
t0=$(date +%s)
kill -TERM "$(rank_pid $pid 0)"
wait $pid
rc=$? dt=$(($(date +%s) - t0))
[ $rc -ne 0 ] && [ $rc -ne 4 ] && [ $dt -le 30 ] && grep -q "did not reach the end of the step" "$d/out" &&
    echo "ok: a stop stuck in its step ended the job ${dt} s after SIGTERM (step bound; --stop-timeout 100), status $rc" ||
    { cat "$d/out"; fail "step bound: status $rc after ${dt} s"; }

# ---- the loop: stopped four ways, continued, the uninterrupted curve
STEPS=40
"$TRAIN" --model tiny --steps $STEPS --global-batch 8 --micro-batch 4 --quiet \
    --metrics "$W/ref.jsonl" || exit 99
R="$W/loop run"
# a job started in the background ignores SIGINT, which a shell's job would
# not: env --default-signal gives the loop SIGINT back
loop_start() {
    MALLEUS_BIN="$top_builddir" RUN_DIR="$R" NPROCS=2 MPIEXEC="$MPIEXEC" STEPS=$STEPS \
        GLOBAL_BATCH=8 MICRO_BATCH=4 PIPELINES=1 SNAPSHOT_EVERY=100 \
        TRAIN_ARGS="--inject 0:10 --inject 1:10 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0" \
        env --default-signal=INT bash "$top_srcdir/jobs/adaptive-loop.sh" >>"$W/loop.out" 2>&1 &
    pid=$!
    guard $pid 120
}
newest_snap() { ls -d "$R"/snap.* | sort -t. -k2 -n | tail -n 1; }
for sig in TERM INT USR1 HUP; do
    n=$(rows "$R/metrics.jsonl")
    loop_start
    wait_rows "$R/metrics.jsonl" $((n + 3))
    r=$(rank_pid $pid 0)
    [ -n "$r" ] && tr '\0' '\n' <"/proc/$r/environ" | grep -qx UCX_DEBUG_SIGNO=0 ||
        fail "the loop's ranks do not run with UCX_DEBUG_SIGNO=0"
    kill -s $sig $pid
    wait $pid
    rc=$?
    left=$(pgrep -f "$R" | tr '\n' ' ')
    s=$(snap_step "$(newest_snap)")
    [ $rc -eq 4 ] && [ -z "$left" ] && grep -q "got SIG$sig: stopping" "$R/events.log" &&
        [ "$s" = "$(last_step "$R/metrics.jsonl")" ] &&
        echo "ok: the loop stopped by SIG$sig after step $s (exit 4, its snapshot, nothing left running)" ||
        { tail -20 "$W/loop.out"; fail "the loop and SIG$sig: exit $rc, snapshot $s, left running: '$left'"; }
done
loop_start
wait $pid || fail "the loop run again after the stops: exit $?"
[ "$(grep -c "resuming from step" "$R/events.log")" = 4 ] || fail "the loop did not resume 4 times"
"$PYTHON3" "$top_srcdir/tests/check_loop.py" "$R" "$W/ref.jsonl" $STEPS -1 || fails=$((fails + 1))

[ $fails -eq 0 ] && echo "PASS: stop requests by signal" && exit 0
echo "FAIL: $fails check(s)"
exit 1
