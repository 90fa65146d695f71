#!/bin/sh
# malleus-train on data prepared elsewhere: Megatron-LM indexed datasets
# written here by numpy in Megatron's layout (tests/megatron_write.py),
# uint16 and int32, alone and blended with an llm.c file; the invariant on
# such data: a blend with a held-out part (--val-fraction), sampled in
# epochs, trains the same curve and validation loss under an 8-rank
# non-uniform plan as on one process, and a restart continues it exactly;
# and the data mistakes refused before training with exit 2, naming the
# file: a truncated .bin, an .idx that belongs to another .bin, a token id
# the model cannot hold, a weight of 0 or NaN, a glob that matches nothing.
# A token file too large to read at start (over 64 MiB of tokens, no
# record) has its ids checked as windows are read: the first bad one ends
# the run with exit 2 naming the file and the token, on one rank or many.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
PY=${PYTHON3:-/usr/bin/python3}
"$PY" -c 'import numpy' 2>/dev/null || { echo "no numpy: skipped"; exit 77; }
W=$(mktemp -d /tmp/malleus-test-files-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0
fail() { echo "FAIL: $*"; exit 1; }
TRAIN="$B/malleus-train --model tiny --steps 2 --global-batch 4 --micro-batch 2 --quiet"

# expect CODE PATTERN CMD...: exit status CODE and PATTERN (grep -E; empty:
# anything) in the output
expect() {
    code=$1 pat=$2
    shift 2
    timeout 120 "$@" >"$W/out" 2>&1 </dev/null
    rc=$?
    if [ $rc -eq "$code" ] && { [ -z "$pat" ] || grep -Eq -- "$pat" "$W/out"; }; then
        echo "ok: $rc: $(grep -E -- "$pat" "$W/out" | head -1 | cut -c1-160)"
    else
        echo "FAIL: $* -> exit $rc, wanted $code and /$pat/:"
        tail -3 "$W/out"
        fails=$((fails + 1))
    fi
}

"$PY" "$top_srcdir/tests/megatron_write.py" "$W/m16" uint16 300 1 >/dev/null || exit 99
"$PY" "$top_srcdir/tests/megatron_write.py" "$W/m32" int32 200 2 >/dev/null || exit 99
"$B/malleus-tokenize" --default "$W/corpus.bin" >/dev/null || exit 99

echo "-- data prepared elsewhere trains"
expect 0 "" $TRAIN --data "$W/m16"
expect 0 "" $TRAIN --data "$W/m32.bin"
expect 0 "" $TRAIN --data "$W/m*"
expect 0 "" $TRAIN --data "$W/m16:1,$W/m32:2,$W/corpus.bin:1"

echo "-- a blend with a held-out part: one process, 8 ranks, a restart"
BLEND="$W/m16:1,$W/m32:2,$W/corpus.bin:1"
RUN="--model tiny --global-batch 16 --micro-batch 2 --threads 1 --lr 3e-3 --data $BLEND
 --val-fraction 0.1 --eval-every 3 --eval-batches 2 --quiet"
# shellcheck disable=SC2086
"$B/malleus-train" $RUN --steps 6 --metrics "$W/one.jsonl" >"$W/one.log" 2>&1 ||
    { cat "$W/one.log"; fail "one process"; }
# shellcheck disable=SC2086
sh "$top_srcdir/tests/mpirun.sh" 8 240 "$B/malleus-train" $RUN --steps 6 \
    --plan "$top_srcdir/tests/plans/mixed_tp.json" --metrics "$W/eight.jsonl" >"$W/eight.log" 2>&1 ||
    { tail -20 "$W/eight.log"; fail "8 ranks"; }
# shellcheck disable=SC2086
"$B/malleus-train" $RUN --steps 3 --decay-steps 6 --snapshot-dir "$W/snap" --metrics "$W/r1.jsonl" >"$W/r1.log" 2>&1 &&
    "$B/malleus-train" $RUN --steps 6 --decay-steps 6 --snapshot-dir "$W/snap" --resume --metrics "$W/r2.jsonl" \
        >"$W/r2.log" 2>&1 || { cat "$W/r1.log" "$W/r2.log"; fail "restart"; }
cat "$W/r1.jsonl" "$W/r2.jsonl" >"$W/restart.jsonl"
# every step's loss and the validation losses: 8 ranks within 1e-6
# relative of one process, the restarted run identical
"$PY" - "$W/one.jsonl" "$W/eight.jsonl" "$W/restart.jsonl" <<'PYEOF' || fail "curves differ"
import json, sys
runs = [[json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:]]
one, eight, restart = runs
assert len(one) == len(eight) == len(restart) == 6, [len(r) for r in runs]
worst = 0
for a, b, c in zip(one, eight, restart):
    for k in ("loss", "val_loss"):
        if k not in a:
            continue
        worst = max(worst, abs(a[k] - b[k]) / abs(a[k]))
        if a[k] != c[k]:
            sys.exit("step %d: %s %r after a restart, %r straight" % (a["step"], k, c[k], a[k]))
print("losses of 6 steps and 2 validations: 8 ranks within %.1e of one process; restart exact"
      % worst)
print("one process: " + " ".join("%.6f" % r["loss"] for r in one)
      + " | val " + " ".join("%.6f" % r["val_loss"] for r in one if "val_loss" in r))
sys.exit(worst > 1e-6)
PYEOF

echo "-- mistakes, refused before training"
cp "$W/m16.idx" "$W/cut.idx"
head -c 1000 "$W/m16.bin" >"$W/cut.bin"
expect 2 "cut.idx.*truncated" $TRAIN --data "$W/cut"
cp "$W/m32.bin" "$W/other.bin"
cp "$W/m16.idx" "$W/other.idx"
expect 2 "other.idx.*another .bin" $TRAIN --data "$W/other"
"$PY" "$top_srcdir/tests/megatron_write.py" "$W/big" uint16 20 3 1000 >/dev/null
expect 2 "big.bin holds token id 9[0-9][0-9] but the model has a vocabulary of 256" \
    $TRAIN --data "$W/big"
expect 2 "m32:0.*weight 0 must be" $TRAIN --data "$W/m16:1,$W/m32:0"
expect 2 "weight nan must be" $TRAIN --data "$W/m16:nan"
expect 2 "nothing\*.*matches no file" $TRAIN --data "$W/nothing*"
expect 2 "give one" $TRAIN --data "$W/m16" --val-data "$W/m32" --val-fraction 0.1 --eval-every 1
expect 2 "for token files" $TRAIN --val-fraction 0.1
# shellcheck disable=SC2086
expect 2 "val-fraction: snapshot 0.1, this run 0.2" "$B/malleus-train" $RUN \
    --steps 7 --snapshot-dir "$W/snap" --resume --val-fraction 0.2
# shellcheck disable=SC2086
expect 2 "data-sampling: snapshot epochs, this run random" "$B/malleus-train" $RUN \
    --steps 6 --decay-steps 6 --snapshot-dir "$W/snap" --resume --data-sampling random
expect 2 "holds out [0-9]* tokens of .*m16.bin" $TRAIN --data "$W/m16" --val-fraction 0.0001 \
    --eval-every 1

echo "-- a large file without a record: checked as its windows are read"
head -c 70000000 /dev/zero | tr '\0' '\377' >"$W/large.bin" # every token 65535
expect 2 "large.bin holds token id 65535 at token [0-9]* but the model has a vocabulary of 256" \
    $TRAIN --data "$W/large.bin" --data-format raw16
# (the status only: when a rank aborts the job, mpiexec may end the ranks
# before it has forwarded their last line, as seen under the sanitizers)
expect 2 "" sh "$top_srcdir/tests/mpirun.sh" 2 120 \
    $TRAIN --data "$W/large.bin" --data-format raw16 --dp 2
rm -f "$W/large.bin"

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "test_data_files: ok"
