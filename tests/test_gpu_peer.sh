#!/bin/sh
# The GPU benchmark's PyTorch peer (bench/gpu/torch_peer.py), run here on the
# CPU with Debian's torch: (1) its model is Malleus's model -- loss and every
# gradient equal bench/torch_model.py's reference in float32; (2) started from
# malleus-train's step-0 snapshot on malleus-train's batches, its fp32 loss
# curve is malleus-train's (the harness that bench/gpu/run.sh uses for the
# bf16 comparison on the GPU); (3) negative control: with another learning
# rate the curve comparison fails, so it can.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON3=${PYTHON3:-/usr/bin/python3}
TRAIN=$top_builddir/malleus-train
TOKENIZE=$top_builddir/malleus-tokenize
PEER=$top_srcdir/bench/gpu/torch_peer.py
REF=$top_srcdir/tests/gpu_peer_ref.py
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1

"$PYTHON3" -c 'import torch, numpy' 2>/dev/null ||
    { echo "test_gpu_peer: skipped: $PYTHON3 cannot import torch and numpy"; exit 77; }
# snapshots are read with h5py, or without it through tests/snapdump
MALLEUS_SNAPDUMP=$top_builddir/tests/snapdump
export MALLEUS_SNAPDUMP
for p in "$TRAIN" "$TOKENIZE"; do
    [ -x "$p" ] || { echo "test_gpu_peer: $p not built"; exit 99; }
done
W=$(mktemp -d "${TMPDIR:-/tmp}/test_gpu_peer.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT

"$PYTHON3" "$REF" model --model tiny || { echo "test_gpu_peer: FAIL: model differs"; exit 1; }

i=0
while [ $i -lt 150 ]; do
    echo "Row $i: $((i * 13 % 17)) green $((i * i % 89)) apples fall on $((i * 7 % 31)) red roofs."
    i=$((i + 1))
done >"$W/text.txt"
"$TOKENIZE" "$W/text.txt" "$W/tokens.bin" >/dev/null || { echo "test_gpu_peer: tokenize failed"; exit 99; }
STEPS=6
HP="--seed 99 --global-batch 4 --micro-batch 2 --lr 3e-3 --warmup 2 --decay-steps $STEPS \
 --min-lr-ratio 0.1 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --adam-eps 1e-6 --clip 1.0"
# shellcheck disable=SC2086
"$TRAIN" --model tiny --data "$W/tokens.bin" $HP --threads 1 --quiet --steps 0 \
    --snapshot-dir "$W/d0" >"$W/log0" 2>&1 || { cat "$W/log0"; exit 99; }
# shellcheck disable=SC2086
"$TRAIN" --model tiny --data "$W/tokens.bin" $HP --threads 1 --quiet --steps $STEPS \
    --metrics "$W/m.jsonl" >"$W/log1" 2>&1 || { cat "$W/log1"; exit 99; }
peer() {
    "$PYTHON3" "$PEER" --device cpu --threads 1 --model tiny --precision fp32 --batch 4 \
        --steps $STEPS --warmup 0 --seed 99 --lr-warmup 2 --weight-decay 0.1 --adam-eps 1e-6 \
        --clip 1.0 --weights "$W/d0" --data "$W/tokens.bin" "$@"
}
peer --lr 3e-3 --losses "$W/peer.txt" || { echo "test_gpu_peer: peer failed"; exit 99; }
"$PYTHON3" "$REF" curve "$W/peer.txt" "$W/m.jsonl" --rtol 1e-4 ||
    { echo "test_gpu_peer: FAIL: the peer does not train malleus-train's curve"; exit 1; }

peer --lr 2e-3 --losses "$W/neg.txt" >/dev/null || exit 99
if "$PYTHON3" "$REF" curve "$W/neg.txt" "$W/m.jsonl" --rtol 1e-4 >"$W/neg" 2>&1; then
    cat "$W/neg"
    echo "test_gpu_peer: FAIL: the curve comparison did not notice another learning rate"
    exit 1
fi
echo "negative control (peer with lr 2e-3): mismatch detected, as it must"
echo "test_gpu_peer: ok"
