#!/bin/sh
# Online re-plan and state migration on 8 ranks (tests/test_online.c), then
# the same through malleus-train: an injected 8x straggler triggers an online
# change, rank 0 logs it, and --verbose adds one line per rank.  That run
# also snapshots every 2 steps in the background (--snapshot-async, the
# writer held 3 steps by MALLEUS_TEST_SNAPSHOT_HOLD so that a write is in
# flight when the plan changes): the change waits for it, the snapshots
# after it are the new plan's and complete, and the last one resumes.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
sh "$top_srcdir/tests/mpirun.sh" 8 240 "$top_builddir/tests/test_online" || exit $?

W=$(mktemp -d /tmp/malleus-test-online-XXXXXX)
trap 'rm -rf "$W"' EXIT
MALLEUS_TEST_SNAPSHOT_HOLD=3 sh "$top_srcdir/tests/mpirun.sh" 8 120 "$top_builddir/malleus-train" \
    --model tiny --steps 8 \
    --global-batch 16 --micro-batch 2 --dp 2 --tp 2 --pp 2 --inject 3:8:1 --adapt online \
    --ranks-per-node 4 --check-every 2 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0 \
    --planner-time-limit 30 \
    --snapshot-dir "$W/snap" --snapshot-every 2 --snapshot-async --verbose >"$W/out" 2>&1
rc=$?
cat "$W/out"
[ $rc -eq 0 ] || { echo "FAIL: malleus-train --adapt online exited $rc"; exit 1; }
grep -Eq '^online migration 1 at step [0-9]+: [0-9.]+ MiB moved, [0-9.]+ MiB kept in place, [0-9.]+ s \(slowest rank [0-7];' "$W/out" ||
    { echo "FAIL: no online migration line"; exit 1; }
n=$(grep -Ec '^  rank [0-7]: [0-9.]+ s \(started' "$W/out")
[ "$n" -ge 8 ] || { echo "FAIL: --verbose gave $n per-rank lines, want 8 per change"; exit 1; }
# a rank stages no more than it moves (the staging area was the whole 64 MiB
# limit for any change: 68.4 MiB the peak of a rank that moved 2.3 MiB)
awk '/^  rank [0-7]: [0-9.]+ s \(started/ {
         r = $2; for (i = 1; i < NF; i++) if ($i == "sent" || $i == "received") m[r] += $(i + 1) }
     /^  rank [0-7]: [0-9.]+ = / {
         r = $2; for (i = 1; i < NF; i++) if ($i == "staging" && $(i + 1) > m[r] + 0.01) {
             print "FAIL: " $0 " (moved " m[r] + 0 " MiB)"; bad = 1 } }
     END { exit bad }' "$W/out" || exit 1
grep -q 'step 8/8' "$W/out" || { echo "FAIL: training did not continue to step 8"; exit 1; }
nbg=$(grep -c 'snapshot written in the background' "$W/out")
[ "$nbg" -ge 2 ] && [ "$(cat "$W/snap/latest")" = step_00000008 ] ||
    { echo "FAIL: $nbg background snapshots, latest $(cat "$W/snap/latest" 2>/dev/null)"; exit 1; }
# the write in flight when the plan changed was finished first
grep -E '^(snapshot written in the background|online migration 1 )' "$W/out" |
    grep -B1 '^online migration 1 ' | head -1 | grep -q '^snapshot written in the background' ||
    { echo "FAIL: the plan change did not wait for the background snapshot in flight"; exit 1; }
for d in "$W/snap"/step_*; do
    [ -f "$d/COMPLETE" ] || { echo "FAIL: $d is not complete"; exit 1; }
done
sh "$top_srcdir/tests/mpirun.sh" 8 120 "$top_builddir/malleus-train" --model tiny --steps 9 --override steps \
    --global-batch 16 --micro-batch 2 --dp 2 --tp 2 --pp 2 --snapshot-dir "$W/snap" --resume \
    >"$W/res" 2>&1 && grep -q 'resumed from .*step_00000008 at step 8 .* written under another plan' "$W/res" ||
    { cat "$W/res"; echo "FAIL: the snapshot written after the plan change does not resume"; exit 1; }
echo "PASS: malleus-train --adapt online: $(grep -c '^online migration' "$W/out") change(s), $n per-rank lines"
