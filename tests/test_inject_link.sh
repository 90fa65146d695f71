#!/bin/sh
# The runtime side of slow links (replan/README.md "Links"), 4 ranks:
#  - a plan stage's deeper 1F1B warm-up ("warmup") runs: the banner shows
#    it and the losses are those of the default schedule, bit for bit;
#  - --inject-link A:B:16 stretches the messages between A and B: inside a
#    TP group it slows every step (the all-reduces), between pipelines it
#    touches only the gradient sum, so the first run is slower than the
#    second in the same test; the losses do not change.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
TAG=test_inject_link
TRAIN=$top_builddir/malleus-train
MPIRUN="sh $top_srcdir/tests/mpirun.sh"
[ -x "$TRAIN" ] || { echo "$TAG: $TRAIN not built"; exit 99; }
W=$(mktemp -d "${TMPDIR:-/tmp}/$TAG.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
fail() { echo "$TAG: FAIL: $*"; exit 1; }
COMMON="--model tiny --global-batch 12 --micro-batch 2 --threads 1"

run() { # NAME PLAN STEPS [ARGS...]
    name=$1 plan=$2 steps=$3
    shift 3
    # shellcheck disable=SC2086
    $MPIRUN 4 120 "$TRAIN" $COMMON --steps "$steps" --plan "$plan" --metrics "$W/$name.jsonl" "$@" \
        >"$W/$name.log" 2>&1 || { cat "$W/$name.log"; fail "run $name"; }
}
losses() { sed 's/.*"loss": \([0-9.e+-]*\).*/\1/' "$W/$1.jsonl"; }
# the median of a metrics field over steps 3.. (the first two warm up):
# the row's first occurrence (step_ms), or rank 0's (tp_ms)
median() {
    awk -v f="$2" 'NR >= 3 && match($0, "\"" f "\": [0-9.e+-]+") {
        s = substr($0, RSTART, RLENGTH); sub(/.*: /, "", s); print s }' "$W/$1.jsonl" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# 1. two stages of TP 2; stage 0 warms up 4 deep instead of 1
cat >"$W/pp.json" <<'EOP'
{"format": "malleus-plan/1", "micro_batch_size": 2,
 "pipelines": [{"micro_batches": 6, "stages": [
   {"ranks": [0, 1], "layers": [0, 2]}, {"ranks": [2, 3], "layers": [2, 4]}]}]}
EOP
sed 's/"layers": \[0, 2\]}/"layers": [0, 2], "warmup": 4}/' "$W/pp.json" >"$W/ppw.json"
run pp "$W/pp.json" 3
run ppw "$W/ppw.json" 3 --verbose
grep -q 'pipeline 0 stage 0: 4 warm-up forwards (1F1B default 1), 5 in flight' "$W/ppw.log" ||
    fail "stage 0 does not run the plan's warm-up"
grep -q 'm=6: \[L0-2 tp2 w4\] \[L2-4 tp2\]' "$W/ppw.log" || fail "the banner shows no warm-up 4"
grep -q 'w4' "$W/pp.log" && fail "the default schedule shows a warm-up"
[ "$(losses pp)" = "$(losses ppw)" ] || fail "a deeper warm-up changed the losses"

# 2. two pipelines of TP 2: a slow link inside a group, then between them
cat >"$W/dp.json" <<'EOP'
{"format": "malleus-plan/1", "micro_batch_size": 2,
 "pipelines": [{"micro_batches": 3, "stages": [{"ranks": [0, 1], "layers": [0, 4]}]},
               {"micro_batches": 3, "stages": [{"ranks": [2, 3], "layers": [0, 4]}]}]}
EOP
run tp "$W/dp.json" 16 --inject-link 0:1:16
run dp "$W/dp.json" 16 --inject-link 0:2:16
[ "$(losses tp)" = "$(losses dp)" ] || fail "--inject-link changed the losses"
TP=$(median tp step_ms)
DP=$(median dp step_ms)
TPA=$(median tp tp_ms)
DPA=$(median dp tp_ms)
echo "median step: slow link inside the TP group $TP ms, between the pipelines $DP ms"
echo "rank 0's TP all-reduces per step: $TPA ms and $DPA ms"
# the injection finds the link inside the group (rank 0's all-reduces
# stretched) and not between the pipelines; and the whole step pays
awk -v a="$TPA" -v b="$DPA" 'BEGIN { exit !(a > 2 * b) }' ||
    fail "a slow TP link did not stretch rank 0's all-reduces"
awk -v a="$TP" -v b="$DP" 'BEGIN { exit !(a > 1.3 * b) }' ||
    fail "a slow TP link did not slow the step more than a slow link between pipelines"
echo "$TAG: ok"
