#!/bin/sh
# malleus-train on the GPU (--device cuda); exit 77 where none is usable.
#   1. fp32 on the GPU trains the CPU's loss curve: tiny 20 steps within
#      1e-4 at every step; small 10 steps within 1e-4, 20 within 1e-2 (after
#      step 10 rounding differences grow: section 1 says how that was shown);
#   2. bf16 stays within 2% of fp32 over 300 steps of small on the built-in
#      corpus, compared on means of 10 steps, so that one batch where the two
#      differ by chance does not decide (MAL_CUDA_LONG=0: 60 steps);
#   3. determinism: two bf16 runs end in bit-identical state (parameters and
#      Adam moments of the final snapshot);
#   4. resume: 10 steps, a snapshot, 10 more in a new process end in the
#      state of 20 straight steps, bit for bit (bf16 on the GPU);
#   5. a GPU snapshot resumes on the CPU and a CPU snapshot on the GPU (fp32),
#      continuing the other device's curve within 1e-4;
#   6. PyTorch on the GPU (bench/gpu/torch_peer.py), started from
#      malleus-train's step-0 snapshot on malleus-train's batches, trains
#      malleus-train's fp32 loss curve within 5e-3 (means of 5 steps); the
#      bf16 curves of both (autocast on the PyTorch side) are printed against
#      each other and fp32, not checked (section 6 says why); skipped with a
#      message when $PYTHON3 has no torch with CUDA.
# Every comparison is made by tests/gpu_peer_ref.py; each was shown to fail
# on a perturbed run (another learning rate) in tests/test_gpu_peer.sh.  It
# needs numpy and torch; snapshots are read with h5py where $PYTHON3 has it,
# else through tests/snapdump (tests/snapread.py: the GPU machine's venv).
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON3=${PYTHON3:-python3}
TRAIN=$top_builddir/malleus-train
TOKENIZE=$top_builddir/malleus-tokenize
REF=$top_srcdir/tests/gpu_peer_ref.py
PEER=$top_srcdir/bench/gpu/torch_peer.py
export PYTHONDONTWRITEBYTECODE=1

[ -x "$TRAIN" ] || { echo "test_cuda_train: $TRAIN not built"; exit 99; }
. "$top_srcdir/tests/cuda_skip.sh"
mal_need_cuda test_cuda_train
"$PYTHON3" -c 'import numpy, torch' 2>/dev/null ||
    { echo "test_cuda_train: $PYTHON3 lacks numpy/torch (the comparisons need them)"; exit 99; }
# snapshots without h5py: tests/snapdump (built by make check)
MALLEUS_SNAPDUMP=$top_builddir/tests/snapdump
export MALLEUS_SNAPDUMP
"$PYTHON3" -c 'import h5py' 2>/dev/null || [ -x "$MALLEUS_SNAPDUMP" ] ||
    { echo "test_cuda_train: $PYTHON3 lacks h5py and $MALLEUS_SNAPDUMP is not built"; exit 99; }

W=$(mktemp -d "${TMPDIR:-/tmp}/test_cuda_train.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
fails=0
step() { printf '\n== %s\n' "$*"; }
run() { # name, then malleus-train arguments; log in $W/name.log
    name=$1
    shift
    if ! "$TRAIN" --quiet "$@" >"$W/$name.log" 2>&1; then
        cat "$W/$name.log"
        echo "FAIL: malleus-train $*"
        fails=$((fails + 1))
        return 1
    fi
}
compare() { # what, then gpu_peer_ref.py arguments
    what=$1
    shift
    if "$PYTHON3" "$REF" "$@" >"$W/cmp.out" 2>&1; then
        tail -1 "$W/cmp.out"
        echo "ok: $what"
    else
        cat "$W/cmp.out"
        echo "FAIL: $what"
        fails=$((fails + 1))
    fi
}

inform() { # what, then gpu_peer_ref.py arguments: printed, never a failure
    what=$1
    shift
    "$PYTHON3" "$REF" "$@" >"$W/cmp.out" 2>&1
    echo "(for information) $what:"
    cat "$W/cmp.out"
}

# the CPU runs use every core (the harness sets OPENBLAS_NUM_THREADS=1)
NT=$(nproc 2>/dev/null || echo 2)
step "1. fp32 on the GPU = the CPU's curve (20 steps)"
for m in tiny small; do
    run cpu_$m --model $m --device cpu --threads $NT --precision fp32 --steps 20 \
        --metrics "$W/cpu_$m.jsonl" &&
        run gpu_$m --model $m --device cuda --precision fp32 --steps 20 --metrics "$W/gpu_$m.jsonl" || continue
    if [ $m = tiny ]; then
        compare "$m fp32: GPU vs CPU" curve "$W/gpu_$m.jsonl" "$W/cpu_$m.jsonl" --rtol 1e-4
        continue
    fi
    # small, measured on an H100 (2026-11-26): the same losses to 7 digits
    # for 10 steps, then 0.3-1.4e-3 apart from step 13 on.  Not a GPU
    # fault: two CPU runs that differ only in OpenBLAS's kernels
    # (OPENBLAS_CORETYPE=Prescott against the default) part the same way
    # (equal for 10 steps, 2.7e-6 at step 11, 2.1e-3 at 13, 4.5e-3 at 17):
    # once the learning rate reaches its peak, rounding-level differences
    # in the gradients grow (Adam turns the sign of a near-zero gradient
    # into a full step).  So: strict over the first 10 steps, 1e-2 over 20.
    grep '"loss"' "$W/gpu_$m.jsonl" | head -n 10 >"$W/gpu_${m}10.jsonl"
    grep '"loss"' "$W/cpu_$m.jsonl" | head -n 10 >"$W/cpu_${m}10.jsonl"
    compare "$m fp32: GPU vs CPU, steps 1-10" curve "$W/gpu_${m}10.jsonl" "$W/cpu_${m}10.jsonl" \
        --rtol 1e-4
    compare "$m fp32: GPU vs CPU, steps 1-20" curve "$W/gpu_$m.jsonl" "$W/cpu_$m.jsonl" --rtol 1e-2
done

LONG=300
[ "${MAL_CUDA_LONG:-1}" = 0 ] && LONG=60
step "2. bf16 within 2% of fp32 ($LONG steps of small, GPU)"
run f32 --model small --device cuda --precision fp32 --steps $LONG --metrics "$W/f32.jsonl" &&
    run b16 --model small --device cuda --precision bf16 --steps $LONG --metrics "$W/b16.jsonl" &&
    compare "small bf16 vs fp32 over $LONG steps (means of 10 steps)" curve "$W/b16.jsonl" \
        "$W/f32.jsonl" --rtol 0.02 --window 10

step "3. determinism: two bf16 runs, the same bits"
for r in a b; do
    run det_$r --model small --device cuda --precision bf16 --steps 20 --snapshot-dir "$W/det_$r"
done
compare "bf16 runs bit-identical" state "$W/det_a" "$W/det_b"

step "4. resume on the GPU continues bit for bit"
# (one 20-step schedule in two halves: both runs say so with --decay-steps,
# which resume requires when a run asks for more steps than its snapshot's)
run res1 --model small --device cuda --precision bf16 --steps 10 --decay-steps 20 --snapshot-dir "$W/res" &&
    run res2 --model small --device cuda --precision bf16 --steps 20 --decay-steps 20 --snapshot-dir "$W/res" \
        --resume &&
    compare "10 + resume + 10 = 20 straight" state "$W/res" "$W/det_a"

step "5. snapshots cross devices (fp32, tiny)"
run x_cpu20 --model tiny --device cpu --threads $NT --precision fp32 --steps 20 --metrics "$W/x_cpu20.jsonl"
run x_cuda20 --model tiny --device cuda --precision fp32 --steps 20 --metrics "$W/x_cuda20.jsonl"
# cross A B: 10 steps on device A, a snapshot, 10 more on device B; steps
# 11-20 must be B's own 20-step curve
cross() {
    run x_$1_$2_a --model tiny --device $1 --precision fp32 --steps 10 --decay-steps 20 \
        --snapshot-dir "$W/$1$2" &&
        run x_$1_$2_b --model tiny --device $2 --precision fp32 --steps 20 --decay-steps 20 \
            --snapshot-dir "$W/$1$2" --resume --metrics "$W/$1$2.jsonl" &&
        tail -n 10 "$W/x_${2}20.jsonl" >"$W/$2_tail.jsonl" &&
        compare "$1 snapshot -> $2 resume: $2's own steps 11-20" curve "$W/$1$2.jsonl" \
            "$W/$2_tail.jsonl" --rtol 1e-4
}
cross cuda cpu
cross cpu cuda
# a bf16 run's snapshot holds fp32 master weights: the CPU resumes it
run x_b10 --model tiny --device cuda --precision bf16 --steps 10 --snapshot-dir "$W/b2c" &&
    run x_b20 --model tiny --device cpu --steps 12 --override steps --snapshot-dir "$W/b2c" --resume &&
    echo "ok: bf16 GPU snapshot resumed on the CPU"

step "6. PyTorch on the GPU, same weights and batches: fp32 checked, bf16 printed"
if "$PYTHON3" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$PYTHON3" - "$W/text.txt" <<'PY'
import random, sys
r = random.Random(5)
words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs",
         "far", "away", "from", "home", "while", "birds", "sing", "in", "trees"]
with open(sys.argv[1], "w") as f:
    for i in range(6000):
        f.write(" ".join(r.choice(words) for _ in range(12)) + ".\n")
PY
    "$TOKENIZE" "$W/text.txt" "$W/tok.bin" >/dev/null || { echo "tokenize failed"; exit 99; }
    S=40
    HP="--seed 7 --global-batch 8 --micro-batch 8 --lr 1e-3 --warmup 5 --decay-steps $S \
        --min-lr-ratio 0.1 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8 --clip 1.0"
    # shellcheck disable=SC2086
    run pt0 --model small --device cuda --data "$W/tok.bin" $HP --steps 0 --snapshot-dir "$W/pt0" &&
        run pt --model small --device cuda --precision bf16 --data "$W/tok.bin" $HP --steps $S \
            --metrics "$W/pt.jsonl" &&
        "$PYTHON3" "$PEER" --device cuda --model small --precision bf16 --batch 8 --steps $S \
            --warmup 0 --seed 7 --lr 1e-3 --lr-warmup 5 --weight-decay 0.1 --adam-eps 1e-8 \
            --clip 1.0 --weights "$W/pt0" --data "$W/tok.bin" --losses "$W/torch.txt" \
            >"$W/peer.log" 2>&1 ||
        { cat "$W/peer.log"; echo "FAIL: the PyTorch peer"; fails=$((fails + 1)); }
    # The check is fp32 on both sides: the same model, optimizer and batches
    # give the same curve (measured on an H100, 2026-11-26: 5.8e-4 apart,
    # means of 5 steps).  The bf16 curves are printed, not checked: the two
    # precision policies differ (malleus-train keeps activations and the
    # residual stream in bf16; autocast keeps them in fp32 and rounds only
    # the matrix products' inputs), and on this fast-falling 40-step curve
    # they were 4.3 % apart with each more than 2 % from fp32.  Whose bf16
    # stays nearer fp32 is the figure these lines give.
    # shellcheck disable=SC2086
    run ptf --model small --device cuda --precision fp32 --data "$W/tok.bin" $HP --steps $S \
        --metrics "$W/ptf.jsonl" && {
        "$PYTHON3" "$PEER" --device cuda --model small --precision fp32 --batch 8 --steps $S \
            --warmup 0 --seed 7 --lr 1e-3 --lr-warmup 5 --weight-decay 0.1 --adam-eps 1e-8 \
            --clip 1.0 --weights "$W/pt0" --data "$W/tok.bin" --losses "$W/torchf.txt" \
            >"$W/peerf.log" 2>&1 || {
            cat "$W/peerf.log"
            echo "FAIL: the PyTorch peer (fp32)"
            fails=$((fails + 1))
        }
    }
    [ -s "$W/torchf.txt" ] && [ -s "$W/ptf.jsonl" ] && {
        compare "PyTorch fp32 vs malleus-train fp32 (small, $S steps, means of 5)" \
            curve "$W/ptf.jsonl" "$W/torchf.txt" --rtol 5e-3 --window 5
        [ -s "$W/torch.txt" ] &&
            inform "malleus-train bf16 vs PyTorch bf16 autocast" curve "$W/pt.jsonl" \
                "$W/torch.txt" --rtol 0.02 --window 5
        inform "malleus-train bf16 vs fp32" curve "$W/pt.jsonl" "$W/ptf.jsonl" --rtol 0.02 --window 5
        inform "malleus-train fp32 vs PyTorch bf16" curve "$W/ptf.jsonl" "$W/torch.txt" \
            --rtol 0.02 --window 5
    }
else
    echo "skipped: $PYTHON3 has no torch with CUDA"
fi

echo
if [ $fails -gt 0 ]; then
    echo "test_cuda_train: FAIL ($fails)"
    exit 1
fi
echo "test_cuda_train: ok"
