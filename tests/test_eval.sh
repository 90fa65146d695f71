#!/bin/sh
# Validation loss and samples (train/eval.c, src/sample.c, malleus-sample):
#  - a one-process run with --eval-every writes val_loss into the metrics
#    and the step lines and ends with the best validation loss;
#  - malleus-train --eval-only --resume reports the same validation loss
#    for the same parameters on one process and on two 8-rank plans
#    (tests/plans/mixed_tp.json: TP 4/2/1 stages and a second pipeline;
#    suspended.json: suspended ranks, TP pairs): within 1e-6 relative; and
#    the same sample, which malleus-sample reproduces on one process;
#  - malleus-sample is deterministic for a seed, and reads a snapshot
#    resharded for another plan to the same text;
#  - refusals: validation without --val-data on a --data file, a bad
#    snapshot or usage (exit 2).
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
TAG=test_eval
TRAIN=$top_builddir/malleus-train
SAMPLE=$top_builddir/malleus-sample
MPIRUN="sh $top_srcdir/tests/mpirun.sh"
for p in "$TRAIN" "$SAMPLE" "$top_builddir/malleus-reshard"; do
    [ -x "$p" ] || { echo "$TAG: $p not built"; exit 99; }
done
W=$(mktemp -d "${TMPDIR:-/tmp}/test_eval.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
fail() { echo "$TAG: FAIL: $*"; exit 1; }
COMMON="--model tiny --global-batch 16 --micro-batch 2 --threads 1"

# 1. training with validation
# shellcheck disable=SC2086
"$TRAIN" $COMMON --steps 40 --lr 3e-3 --eval-every 20 --eval-batches 3 --snapshot-dir "$W/s" \
    --metrics "$W/m.jsonl" >"$W/train.log" 2>&1 || { cat "$W/train.log"; fail "training"; }
[ "$(grep -c '"val_loss"' "$W/m.jsonl")" -eq 2 ] || fail "val_loss not in exactly 2 metrics lines"
sed -n 20p "$W/m.jsonl" | grep -q '"val_loss"' || fail "no val_loss at step 20"
grep -q '^step 20/40 | loss [0-9.]* | val [0-9.]*' "$W/train.log" || fail "no val in step 20's line"
grep "best validation loss" "$W/train.log" || fail "no best validation loss line"
V40=$(sed -n 40p "$W/m.jsonl" | sed 's/.*"val_loss": \([0-9.e+-]*\).*/\1/')

# 2. the same parameters evaluated by three layouts
evaluate() { # OUT [mpirun args]
    out=$1
    shift
    # shellcheck disable=SC2086
    "$@" $COMMON --steps 40 --eval-batches 3 --resume --snapshot-dir "$W/s" --eval-only \
        --sample-every 1 --sample-prompt "The " --quiet >"$W/$out" 2>&1 ||
        { cat "$W/$out"; fail "eval-only ($out)"; }
    sed -n 's/^malleus-train: validation loss \([0-9.]*\) .*/\1/p' "$W/$out"
}
L1=$(evaluate one "$TRAIN")
L2=$(evaluate mixed $MPIRUN 8 120 "$TRAIN" --plan "$top_srcdir/tests/plans/mixed_tp.json")
L3=$(evaluate susp $MPIRUN 8 120 "$TRAIN" --plan "$top_srcdir/tests/plans/suspended.json")
echo "validation loss of the step-40 snapshot: 1 process $L1, mixed_tp.json $L2, suspended.json $L3 (run: $V40)"
awk -v a="$L1" -v b="$L2" -v c="$L3" -v r="$V40" 'function rel(x, y) { d = x - y; if (d < 0) d = -d; return d / y }
    BEGIN { printf "relative differences: %.2e %.2e (vs the run %.2e)\n", rel(b, a), rel(c, a), rel(r, a);
            exit !(a > 0 && rel(b, a) <= 1e-6 && rel(c, a) <= 1e-6 && rel(r, a) <= 1e-6) }' ||
    fail "validation losses differ by more than 1e-6"
grep '^sample at step 40: ' "$W/one" >"$W/s1" || fail "no sample line"
grep '^sample at step 40: ' "$W/mixed" | cmp -s - "$W/s1" || fail "mixed_tp.json's sample differs"
grep '^sample at step 40: ' "$W/susp" | cmp -s - "$W/s1" || fail "suspended.json's sample differs"
cat "$W/s1"

# 3. malleus-sample: the trainer's sample, deterministic, any plan
S="--tokens 64 --temperature 0.8 --top-k 40 --threads 1"
# shellcheck disable=SC2086
"$SAMPLE" $S --seed 1234 --prompt "The " "$W/s" >"$W/a" || fail "malleus-sample"
printf 'sample at step 40: %s\n' "$(cat "$W/a")" | cmp -s - "$W/s1" ||
    { cat "$W/a"; fail "malleus-sample differs from the trainer's sample"; }
# shellcheck disable=SC2086
"$SAMPLE" $S --seed 1234 --prompt "The " "$W/s/step_00000040" | cmp -s - "$W/a" ||
    fail "the same seed gave another text"
# shellcheck disable=SC2086
"$SAMPLE" $S --seed 99 --prompt "The " "$W/s" | cmp -s - "$W/a" && fail "another seed gave the same text"
"$top_builddir/malleus-reshard" --quiet "$W/s" "$top_srcdir/tests/plans/tp4dp2.json" "$W/s8" ||
    fail "reshard"
# shellcheck disable=SC2086
"$SAMPLE" $S --seed 1234 --prompt "The " "$W/s8" | cmp -s - "$W/a" ||
    fail "the snapshot resharded for 8 ranks gave another text"
"$SAMPLE" --tokens 40 --temperature 0 --prompt "Seven plus five is" "$W/s" | tee "$W/g"
[ "$(wc -c <"$W/g")" -eq $((18 + 40 + 1)) ] || fail "greedy sample of the wrong length"
echo "malleus-sample: the trainer's text; same seed same text, another seed another; any plan"

# 4. refusals
printf 'hello world, a few tokens of text to validate on.\n' >"$W/t.txt"
"$top_builddir/malleus-tokenize" "$W/t.txt" "$W/t.bin" >/dev/null || exit 99
# shellcheck disable=SC2086
"$TRAIN" $COMMON --steps 1 --data "$W/t.bin" --eval-every 1 --quiet >"$W/r1" 2>&1
[ $? -eq 2 ] && grep -q -- "--val-data" "$W/r1" || { cat "$W/r1"; fail "no --val-data refusal"; }
# shellcheck disable=SC2086
"$TRAIN" $COMMON --steps 1 --data "$W/t.bin" --val-data "$W/t.bin" --eval-every 1 \
    --eval-batches 1 --quiet --metrics "$W/m2.jsonl" >"$W/r2" 2>&1 || { cat "$W/r2"; fail "--val-data"; }
grep -q '"val_loss"' "$W/m2.jsonl" || fail "no val_loss with --val-data"
"$SAMPLE" "$W/nowhere" >"$W/r3" 2>&1
[ $? -eq 2 ] && grep -q "does not exist" "$W/r3" || { cat "$W/r3"; fail "missing snapshot"; }
for args in "" "--tokens -1 $W/s" "--temperature x $W/s" "$W/s $W/s"; do
    # shellcheck disable=SC2086
    "$SAMPLE" $args >/dev/null 2>&1
    rc=$?
    [ $rc -eq 2 ] || fail "'malleus-sample $args' exit $rc, expected 2"
done
"$SAMPLE" --help | grep -q -- "--top-k" || fail "--help lacks --top-k"
echo "$TAG: ok"
exit 0
