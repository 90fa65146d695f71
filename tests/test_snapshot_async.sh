#!/bin/sh
# Asynchronous snapshots (malleus-train --snapshot-async): the step loop
# stages the state in pinned host memory and trains on while a thread
# writes and commits it.  4 ranks on tests/plans/four.json (a TP-2 replica
# and a two-stage pipeline: blocks shared out among replicas, TP shards);
# MALLEUS_TEST_SNAPSHOT_HOLD=N makes the writer start only after the loop
# trained N more steps, so that the overlap is certain, not a race.
#  1. the files of every snapshot equal the synchronous writer's byte for
#     byte, the loss curve is the synchronous run's, and steps 5 and 6
#     were trained while step 4 was being written;
#  2. resuming from the background-written step 4 continues bit for bit
#     like the uninterrupted run;
#  3. one process: one snapshot in flight (a request waits for the one
#     before), retention (--keep 2) right, nothing left behind;
#  4. a write that fails in the background (rank 1's I/O, test hook
#     MALLEUS_TEST_SNAPSHOT_FAIL) ends the run with exit status 1 and the
#     failing rank's message, before the end of the run, and `latest`
#     stays at the previous snapshot.
# (A crash during a background write: tests/test_snapshot_crash.sh.)
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
OPENBLAS_NUM_THREADS=1
export OPENBLAS_NUM_THREADS
T="$top_builddir/malleus-train"
P="$top_srcdir/tests/plans"
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-snap-async.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
common="--model tiny --plan $P/four.json --global-batch 16 --decay-steps 8 --lr 3e-3 --warmup 2 --threads 1"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
run4() { sh "$top_srcdir/tests/mpirun.sh" 4 60 "$T" $common "$@"; }

# 1. synchronous and background snapshots of the same run
run4 --steps 8 --snapshot-every 4 --snapshot-dir "$W/sync" --metrics "$W/sync.jsonl" \
    >"$W/sync.out" 2>&1 || { cat "$W/sync.out"; echo "FAIL: synchronous run"; exit 1; }
MALLEUS_TEST_SNAPSHOT_HOLD=2 run4 --steps 8 --snapshot-every 4 --snapshot-dir "$W/async" \
    --snapshot-async --metrics "$W/async.jsonl" >"$W/async.out" 2>&1 ||
    { cat "$W/async.out"; echo "FAIL: background run"; exit 1; }
grep -Eq '^\| snapshots +\| every 4 steps, keep all, background' "$W/async.out" ||
    fail "the start-up table does not show background snapshots"
# the step lines of steps 5 and 6 come before the write of step 4 is collected
order=$(grep -n -e '^step [56]/8' -e 'written in the background: .*step_00000004' "$W/async.out" | cut -d: -f1 | tr '\n' ' ')
line4=$(grep -n 'written in the background: .*step_00000004' "$W/async.out" | cut -d: -f1)
line6=$(grep -n '^step 6/8' "$W/async.out" | cut -d: -f1)
[ -n "$line4" ] && [ -n "$line6" ] && [ "$line6" -lt "$line4" ] ||
    { cat "$W/async.out"; fail "step 6 was not trained while step 4 was written (lines: $order)"; }
for s in 00000004 00000008; do
    for f in "$W/sync/step_$s"/*; do
        cmp "$f" "$W/async/step_$s/${f##*/}" || fail "step_$s/${f##*/} differs from the synchronous writer's"
    done
    [ "$(ls "$W/sync/step_$s")" = "$(ls "$W/async/step_$s")" ] || fail "step_$s holds other files"
done
[ "$(cat "$W/async/latest")" = step_00000008 ] || fail "latest is $(cat "$W/async/latest")"
losses "$W/sync.jsonl" >"$W/sync.loss"
losses "$W/async.jsonl" >"$W/async.loss"
[ "$(wc -l <"$W/sync.loss")" -eq 8 ] && cmp -s "$W/sync.loss" "$W/async.loss" ||
    fail "loss curves differ: $(paste "$W/sync.loss" "$W/async.loss" | tr '\n' ';')"
[ $fails -eq 0 ] && echo "ok: background snapshots equal the synchronous ones; steps 5-6 trained during the write"

# 2. resume from the background-written step 4 (step 8 dropped)
cp -r "$W/async" "$W/res"
rm -rf "$W/res/step_00000008"
echo step_00000004 >"$W/res/latest"
run4 --steps 8 --snapshot-every 2 --snapshot-async --snapshot-dir "$W/res" --resume \
    --metrics "$W/res.jsonl" >"$W/res.out" 2>&1 || { cat "$W/res.out"; fail "resume"; }
grep -q 'resumed from .*step_00000004' "$W/res.out" || fail "did not resume from step 4"
losses "$W/res.jsonl" >"$W/res.loss"
sed -n '5,8p' "$W/sync.loss" | cmp -s - "$W/res.loss" ||
    fail "resumed steps 5-8 differ: $(paste "$W/res.loss" | tr '\n' ';') vs $(sed -n '5,8p' "$W/sync.loss" | tr '\n' ';')"
[ $fails -eq 0 ] && echo "ok: resumed from a background snapshot bit for bit"

# 3. one process: requests wait for the write in flight; retention
MALLEUS_TEST_SNAPSHOT_HOLD=3 "$T" --model tiny --global-batch 8 --micro-batch 4 --threads 1 \
    --steps 8 --snapshot-every 2 --keep 2 --snapshot-async --snapshot-dir "$W/one" \
    >"$W/one.out" 2>&1 || { cat "$W/one.out"; fail "one-process run"; }
grep -q 'snapshot of step 4 waited' "$W/one.out" || fail "the request at step 4 did not wait for step 2's write"
[ "$(ls -a "$W/one" | tr '\n' ' ')" = ". .. latest step_00000006 step_00000008 " ] ||
    fail "retention: $(ls -a "$W/one" | tr '\n' ' ')"
[ $fails -eq 0 ] && echo "ok: one snapshot in flight, --keep 2 kept steps 6 and 8"

# 4. a failure in the background write reaches every rank and ends the run
MALLEUS_TEST_SNAPSHOT_FAIL=1:4:3 run4 --steps 8 --snapshot-every 2 --snapshot-async \
    --snapshot-dir "$W/fail" --metrics "$W/fail.jsonl" >"$W/fail.out" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$W/fail.out"; fail "a failed background write exited with $rc, not 1"; }
grep -q 'snapshot of step 4, written in the background, failed: .*rank 1: .*Input/output error' "$W/fail.out" ||
    { cat "$W/fail.out"; fail "no message naming the failed write and rank 1"; }
last=$(losses "$W/fail.jsonl" | tail -1 | cut -d' ' -f1)
[ "${last:-8}" -lt 8 ] || fail "the run went on to step ${last:-?} after its snapshot failed"
[ "$(cat "$W/fail/latest")" = step_00000002 ] && [ ! -e "$W/fail/step_00000004" ] ||
    fail "after the failure: $(ls -a "$W/fail" | tr '\n' ' ')"
ls -d "$W/fail"/.tmp-* >/dev/null 2>&1 && fail "the failed write left $(ls -a "$W/fail" | tr '\n' ' ')"
[ $fails -eq 0 ] && echo "ok: a failed background write ended the run at step $last (exit 1), step 2 stayed latest"

echo "$fails failure(s)"
[ $fails -eq 0 ]
