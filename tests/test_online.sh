#!/bin/sh
# Online re-plan and state migration on 8 ranks (tests/test_online.c), then
# the same through malleus-train: an injected 8x straggler triggers an online
# change, rank 0 logs it, and --verbose adds one line per rank.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
sh "$top_srcdir/tests/mpirun.sh" 8 240 "$top_builddir/tests/test_online" || exit $?

W=$(mktemp -d /tmp/malleus-test-online-XXXXXX)
trap 'rm -rf "$W"' EXIT
sh "$top_srcdir/tests/mpirun.sh" 8 120 "$top_builddir/malleus-train" --model tiny --steps 8 \
    --global-batch 16 --micro-batch 2 --dp 2 --tp 2 --pp 2 --inject 3:8:1 --adapt online \
    --ranks-per-node 4 --check-every 2 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0 \
    --verbose >"$W/out" 2>&1
rc=$?
cat "$W/out"
[ $rc -eq 0 ] || { echo "FAIL: malleus-train --adapt online exited $rc"; exit 1; }
grep -Eq '^online migration 1 at step [0-9]+: [0-9.]+ MiB moved, [0-9.]+ MiB kept in place, [0-9.]+ s \(slowest rank [0-7];' "$W/out" ||
    { echo "FAIL: no online migration line"; exit 1; }
n=$(grep -Ec '^  rank [0-7]: [0-9.]+ s \(started' "$W/out")
[ "$n" -ge 8 ] || { echo "FAIL: --verbose gave $n per-rank lines, want 8 per change"; exit 1; }
grep -q 'step 8/8' "$W/out" || { echo "FAIL: training did not continue to step 8"; exit 1; }
echo "PASS: malleus-train --adapt online: $(grep -c '^online migration' "$W/out") change(s), $n per-rank lines"
