#!/bin/sh
# The whole single-process training stack (tokenizer, data sampling, model
# forward/backward, loss scaling over micro-batches, clipping, LR schedule,
# AdamW, snapshots) against an independent PyTorch re-implementation:
# tests/torch_ref.py trains the same 8 steps from malleus-train's step-0
# snapshot in float64 and compares every step's loss and the final state,
# for `tiny` and for `tiny-llama3` (grouped-query attention, tied
# embeddings, rope_theta 500000 with the llama3 scaling).  Negative
# controls then run the reference with the wrong RoPE convention, with the
# key/value heads mapped to the query heads cyclically instead of in
# groups, and without the rotary scaling: each must see a mismatch, so the
# comparison is shown able to fail.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON3=${PYTHON3:-/usr/bin/python3}
TRAIN=$top_builddir/malleus-train
TOKENIZE=$top_builddir/malleus-tokenize
REF=$top_srcdir/tests/torch_ref.py
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1

"$PYTHON3" -c 'import torch, numpy' 2>/dev/null ||
    { echo "test_torch_ref: skipped: $PYTHON3 cannot import torch and numpy"; exit 77; }
# snapshots are read with h5py, or without it through tests/snapdump
MALLEUS_SNAPDUMP=$top_builddir/tests/snapdump
export MALLEUS_SNAPDUMP
for p in "$TRAIN" "$TOKENIZE"; do
    [ -x "$p" ] || { echo "test_torch_ref: $p not built"; exit 99; }
done

W=$(mktemp -d "${TMPDIR:-/tmp}/test_torch_ref.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT

# A few KB of varied text (deterministic), byte-tokenized.
i=0
while [ $i -lt 120 ]; do
    echo "Line $i: the $((i * 7 % 13)) quick brown foxes jump over $((i * i % 97)) lazy dogs; x=$((i * 31 % 1000))."
    i=$((i + 1))
done >"$W/text.txt"
"$TOKENIZE" "$W/text.txt" "$W/tokens.bin" >/dev/null || { echo "test_torch_ref: tokenize failed"; exit 99; }

# Training settings, spelled out so the reference needs no defaults.
# The clip threshold lies inside the range of gradient norms of these steps
# (about 1.9 to 15), so both the clipped and the unclipped branch run; the
# metrics' grad_norm is compared too, which catches a wrong loss scaling that
# Adam alone would hide.  Adam's eps is 1e-6, not the default 1e-8: with 1e-8,
# a gradient element of ~1e-8 (a sum that cancels down to its float32
# rounding noise) sits where g / (|g| + eps) turns that noise into a visible
# part of a step, and float32 code may legitimately differ from the float64
# reference by ~1e-3 of the update; with 1e-6 the noise stays ~10x inside the
# tolerance.
STEPS=8
# The same flags mean the same in malleus-train and torch_ref.py.
HP="--seed 1234 --global-batch 4 --micro-batch 2 --lr 3e-3 --warmup 2 --decay-steps $STEPS \
 --min-lr-ratio 0.1 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --adam-eps 1e-6 --clip 2.0"

for MODEL in tiny tiny-llama3; do
    # shellcheck disable=SC2086
    "$TRAIN" --model $MODEL --data "$W/tokens.bin" $HP --threads 1 --quiet --steps 0 \
        --snapshot-dir "$W/$MODEL.d0" >"$W/log0" 2>&1 ||
        { cat "$W/log0"; echo "test_torch_ref: malleus-train --steps 0 failed"; exit 99; }
    # shellcheck disable=SC2086
    "$TRAIN" --model $MODEL --data "$W/tokens.bin" $HP --threads 1 --quiet --steps $STEPS \
        --snapshot-dir "$W/$MODEL.d1" --metrics "$W/$MODEL.m.jsonl" >"$W/log1" 2>&1 ||
        { cat "$W/log1"; echo "test_torch_ref: malleus-train --steps $STEPS failed"; exit 99; }
done

ref() { # MODEL [torch_ref.py flags]
    m=$1
    shift
    # shellcheck disable=SC2086
    "$PYTHON3" "$REF" --model $m --data "$W/tokens.bin" --snap0 "$W/$m.d0" --snap1 "$W/$m.d1" \
        --metrics "$W/$m.m.jsonl" --steps $STEPS $HP "$@"
}
for MODEL in tiny tiny-llama3; do
    echo "== $MODEL"
    ref $MODEL
    rc=$?
    [ $rc -eq 0 ] || { echo "test_torch_ref: FAIL on $MODEL (reference exit $rc)"; exit $rc; }
done

# Negative controls: a reference with another RoPE pairing, another
# key/value grouping, or unscaled rotary frequencies must disagree.
negative() { # MODEL PERTURBATION WHAT
    ref "$1" --perturb "$2" >"$W/neg" 2>&1
    rc=$?
    if [ $rc -ne 1 ] || ! grep -q MISMATCH "$W/neg"; then
        cat "$W/neg"
        echo "test_torch_ref: FAIL: the comparison did not notice $3 (exit $rc)"
        exit 1
    fi
    echo "negative control ($3 in the reference, $1): mismatch detected, as it must"
}
negative tiny rope-halves "RoPE pairs (i, i+hd/2)"
negative tiny-llama3 kv-cyclic "query head h reading key/value head h mod n_kv_heads"
negative tiny-llama3 rope-unscaled "rotary frequencies without the llama3 scaling"
echo "test_torch_ref: ok"
exit 0
