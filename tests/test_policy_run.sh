#!/bin/sh
# The re-plan policy in a real run (malleus-train --adapt restart on 4
# ranks, the default policy: check every 3 steps, a window of 2 samples,
# gap 0.3, noise floor 1.2):
#   1. an idle run with injected noise - single steps at 1.61x, 2.5x and 3x
#      on either rank - makes no change (the rule before this one, the
#      window's mean, re-planned on a single 1.61 sample);
#   2. a real 4x straggler from step 8 is advised at step 9, the first
#      check after it, as before; the change pays (gain over the 491
#      remaining steps against the estimated restart) and the run stops
#      for it (exit 3) with a snapshot;
#   3. the same straggler 3 steps before the end: the change would gain
#      less than it costs, so the run stays on its plan and ends (exit 0);
#   4. with --change-cost 0 every gain pays: the same run stops (exit 3).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
W=$(mktemp -d /tmp/malleus-test-policy-XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
train() { # NAME STEPS ARGS...: 4 ranks, --adapt restart; status in $rc
    name=$1 steps=$2
    shift 2
    sh "$top_srcdir/tests/mpirun.sh" 4 120 "$top_builddir/malleus-train" --model tiny \
        --steps "$steps" --global-batch 8 --micro-batch 2 --dp 4 --adapt restart --log-every 3 \
        --snapshot-dir "$W/$name.snap" --metrics "$W/$name.jsonl" "$@" >"$W/$name.out" 2>&1
    rc=$?
}
bad() {
    grep -v '^[|+]' "$W/$name.out" | tail -25
    echo "FAIL: $name: $*"
    fails=$((fails + 1))
}

# 1. noise: isolated slow samples (the probe of one step each).  A machine
# loaded by other tests (make -j2 check on 2 cores) can make a rank really
# slow for several checks, which the policy rightly advises on: a run that
# records a re-plan is run once more, and the second must not.
noise() {
    train noise 30 --inject 1:1.61:7:8 --inject 2:2.5:13:14 --inject 1:3:19:20 --inject 3:1.61:25:26
}
noise
if [ $rc -ne 0 ] || grep -q 're-plan advised' "$W/noise.out" || grep -q '"replan": true' "$W/noise.jsonl"; then
    echo "noise: a re-plan was recorded (status $rc; load on the machine?): once more"
    grep -h '"replan": true' "$W/noise.jsonl" | cut -c1-200
    rm -rf "$W/noise.snap" "$W/noise.jsonl"
    noise
fi
[ $rc -eq 0 ] || bad "exit status $rc, want 0 (no change)"
! grep -q 're-plan advised' "$W/noise.out" || bad "the noise was advised as a re-plan"
! grep -q '"replan": true' "$W/noise.jsonl" || bad "the metrics record a re-plan"
# the noise was measured: at least two of the four injected samples stand
# out (a busy machine can lift the median of a step, and with it hide one)
"${PYTHON3:-/usr/bin/python3}" - "$W/noise.jsonl" <<'PY' || bad "the injected samples do not show in the rates"
import json, sys
rows = {r["step"]: r["rates"] for r in map(json.loads, open(sys.argv[1]))}
seen = [(s, k) for s, k in [(8, 1), (14, 2), (20, 1), (26, 3)] if rows[s][k] >= 1.3]
sys.exit(0 if len(seen) >= 2 else 1)
PY

# 2. a 4x straggler from step 8 (0-based 7)
train slow 500 --inject 1:4:7
[ $rc -eq 3 ] || bad "exit status $rc, want 3 (stopped for a re-plan)"
grep -q 'monitor: re-plan advised at step 9 (rank 1' "$W/slow.out" ||
    bad "not advised at step 9, the first check after the onset"
grep -Eq 're-plan at step 9: .* gain [0-9.]+ s over 491 steps, cost [0-9.]+ s \(estimated: .*stopping for a re-plan' \
    "$W/slow.out" || bad "no weighed decision to stop"
[ "$(cat "$W/slow.snap/latest" 2>/dev/null)" = step_00000009 ] || bad "no snapshot of step 9"

# 3. the same straggler near the end: not worth a restart
train late 12 --inject 1:4:7
[ $rc -eq 0 ] || bad "exit status $rc, want 0 (stayed on the plan)"
grep -Eq 're-plan at step 9: .* gain -?[0-9.]+ s over 3 steps, cost [0-9.]+ s .*not worth it, staying on the plan in force' \
    "$W/late.out" || bad "no decision to stay"
grep -q 'step 12/12 ' "$W/late.out" || bad "did not train to the end"

# 4. --change-cost 0: every gain pays
train free 12 --inject 1:4:7 --change-cost 0
[ $rc -eq 3 ] || bad "exit status $rc, want 3 with --change-cost 0"
grep -q 'cost 0.00 s (--change-cost)' "$W/free.out" || bad "--change-cost not used"

[ $fails -eq 0 ] || exit 1
echo "PASS: noise made no change; the 4x straggler was advised at step 9 and changed when it paid" \
    "($(grep -o 'gain [0-9.]* s over 491 steps, cost [0-9.]* s' "$W/slow.out")), not when it did not" \
    "($(grep -o 'gain -*[0-9.]* s over 3 steps, cost [0-9.]* s' "$W/late.out"))"
