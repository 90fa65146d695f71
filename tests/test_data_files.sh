#!/bin/sh
# malleus-train on data prepared elsewhere: Megatron-LM indexed datasets
# written here by numpy in Megatron's layout (tests/megatron_write.py),
# uint16 and int32, alone and blended with an llm.c file; and the data
# mistakes refused before training with exit 2, naming the file: a
# truncated .bin, an .idx that belongs to another .bin, a token id the
# model cannot hold, a weight of 0 or NaN, a glob that matches nothing.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
PY=${PYTHON3:-/usr/bin/python3}
"$PY" -c 'import numpy' 2>/dev/null || { echo "no numpy: skipped"; exit 77; }
W=$(mktemp -d /tmp/malleus-test-files-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0
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

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "test_data_files: ok"
