#!/bin/sh
# malleus-export against an independent reference, in CI (Debian's torch):
# tests/hf_ref.py --impl torch parses model.safetensors itself and runs its
# own rotate-half LLaMA on the batch whose loss malleus-train reported for
# the exported parameters; the losses must agree within 1e-5 (fp32), the bf16
# export must be exactly torch's round-to-nearest-even of the fp32 one, and
# with the q/k permutation undone the comparison must fail; and its greedy
# continuation of a prompt must be malleus-sample --temperature 0's.  The
# same for tiny-llama3 (grouped-query attention, tied embeddings: no
# lm_head, rope_theta 500000 with the llama3 scaling), where dropping the
# rotary scaling must fail the comparison too.  Then: a
# snapshot resharded onto an 8-rank plan exports to the same bytes; an
# uncommitted or corrupt snapshot is refused (exit 2, nothing written); a
# target that is a link to /dev/null is written through; usage errors.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON3=${PYTHON3:-/usr/bin/python3}
TAG=test_export
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
REF=$top_srcdir/tests/hf_ref.py

W=$(mktemp -d "${TMPDIR:-/tmp}/test_export.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
. "$top_srcdir/tests/export_setup.sh"
fail() { echo "$TAG: FAIL: $*"; exit 1; }

"$EXPORT" "$SNAP" "$W/hf" >"$W/e.log" 2>&1 || { cat "$W/e.log"; fail "export failed"; }
cat "$W/e.log"
"$EXPORT" --quiet --dtype bf16 "$SNAP" "$W/hf-bf16" || fail "bf16 export failed"
[ -f "$W/hf/config.json" ] && [ -f "$W/hf/model.safetensors" ] || fail "export files missing"
ls "$W/hf" | grep -q tmp && fail "temporary files left in the export directory"

if "$PYTHON3" -c 'import torch, numpy' 2>/dev/null; then
    "$PYTHON3" "$REF" --impl torch --export "$W/hf" --bf16 "$W/hf-bf16" --data "$W/tokens.bin" \
        --seed $SEED --step $K --global-batch $GB --loss "$LOSS" --greedy "$PROMPT" $NGREEDY "$W/greedy"
    rc=$?
    [ $rc -eq 0 ] || fail "reference check exit $rc"
    "$PYTHON3" "$REF" --impl torch --export "$W/hf" --data "$W/tokens.bin" --seed $SEED \
        --step $K --global-batch $GB --loss "$LOSS" --perturb no-permute >"$W/neg" 2>&1
    rc=$?
    cat "$W/neg"
    [ $rc -eq 1 ] && grep -q MISMATCH "$W/neg" ||
        fail "the comparison did not notice q/k rows left interleaved (exit $rc)"
    echo "negative control (q/k permutation undone): mismatch detected, as it must"
    PY_DONE=1
    # grouped-query attention, tied embeddings, llama3 rotary scaling
    TINY_SNAP=$SNAP TINY_LOSS=$LOSS
    MODEL=tiny-llama3 SUFFIX=-gqa
    . "$top_srcdir/tests/export_setup.sh"
    "$EXPORT" --quiet "$SNAP" "$W/hf-gqa" || fail "export of tiny-llama3 failed"
    for want in '"num_key_value_heads": 2' '"tie_word_embeddings": true' '"rope_theta": 500000.0' \
        '"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 256}'; do
        grep -qF "$want" "$W/hf-gqa/config.json" || fail "tiny-llama3's config.json lacks $want"
    done
    "$PYTHON3" "$REF" --impl torch --export "$W/hf-gqa" --data "$W/tokens.bin" --seed $SEED \
        --step $K --global-batch $GB --loss "$LOSS"
    rc=$?
    [ $rc -eq 0 ] || fail "reference check of tiny-llama3 exit $rc"
    for perturb in no-permute unscaled-rope; do
        "$PYTHON3" "$REF" --impl torch --export "$W/hf-gqa" --data "$W/tokens.bin" --seed $SEED \
            --step $K --global-batch $GB --loss "$LOSS" --perturb $perturb >"$W/neg" 2>&1
        rc=$?
        cat "$W/neg"
        [ $rc -eq 1 ] && grep -q MISMATCH "$W/neg" ||
            fail "the comparison did not notice $perturb on tiny-llama3 (exit $rc)"
        echo "negative control ($perturb, tiny-llama3): mismatch detected, as it must"
    done
    SNAP=$TINY_SNAP LOSS=$TINY_LOSS
else
    echo "$TAG: $PYTHON3 cannot import torch: the loss comparison is skipped"
    PY_DONE=0
fi

# Any plan: the same state resharded for 8 ranks (TP 4 x DP 2) exports to
# the same bytes.
"$top_builddir/malleus-reshard" --quiet "$SNAP" "$top_srcdir/tests/plans/tp4dp2.json" \
    "$W/snap8" >"$W/r.log" 2>&1 || { cat "$W/r.log"; fail "reshard failed"; }
[ "$(ls "$W"/snap8/step_000000$K/shard_*.h5 | wc -l)" -gt 1 ] || fail "resharded snapshot has one shard"
"$EXPORT" --quiet --mem 1 "$W/snap8" "$W/hf8" || fail "export of the resharded snapshot failed"
cmp "$W/hf/model.safetensors" "$W/hf8/model.safetensors" ||
    fail "the 8-rank plan's snapshot exports to other bytes"
cmp "$W/hf/config.json" "$W/hf8/config.json" || fail "config.json differs"
echo "snapshot resharded for tp4dp2.json (8 ranks) exports to identical files (with --mem 1)"

# Refusals: exit 2, a message, nothing written.
refused() { # DIR WHAT PATTERN
    "$EXPORT" "$1" "$W/out-$2" >"$W/$2.log" 2>&1
    rc=$?
    [ $rc -eq 2 ] || { cat "$W/$2.log"; fail "$2: exit $rc, expected 2"; }
    grep -qi "$3" "$W/$2.log" || { cat "$W/$2.log"; fail "$2: message lacks '$3'"; }
    [ ! -e "$W/out-$2/model.safetensors" ] && [ ! -e "$W/out-$2/config.json" ] ||
        fail "$2: files written"
    [ -z "$(ls "$W/out-$2" 2>/dev/null)" ] || fail "$2: debris left: $(ls "$W/out-$2")"
    echo "refused $2: $(head -n 1 "$W/$2.log")"
}
refused "$W/nowhere" missing "does not exist"
cp -r "$SNAP" "$W/uncommitted"
rm "$W/uncommitted/COMPLETE"
refused "$W/uncommitted" uncommitted "COMPLETE"
if "$PYTHON3" -c 'import h5py' 2>/dev/null; then
    cp -r "$SNAP" "$W/corrupt"
# flip one byte inside the stored block of param/lm_head (its address from
# the index's block table, read with h5py)
"$PYTHON3" - "$W/corrupt" <<'EOF_PY' || { echo "$TAG: cannot corrupt the copy"; exit 99; }
import os, sys
import h5py
d = sys.argv[1]
with h5py.File(os.path.join(d, "index.h5"), "r") as f:
    g = f["_malleus"]
    names = [n.decode() if isinstance(n, bytes) else n for n in g["tensors"][()]]
    b = int(g["tensor_first_block"][names.index("param/lm_head")])
    shard = g["shards"][int(g["block_shard"][b])]
    addr = int(g["block_addr"][b])
path = os.path.join(d, shard.decode() if isinstance(shard, bytes) else shard)
with open(path, "r+b") as fh:
    fh.seek(addr + 1000)
    c = fh.read(1)
    fh.seek(addr + 1000)
    fh.write(bytes([c[0] ^ 0x40]))
EOF_PY
refused "$W/corrupt" corrupt "crc\|checksum\|corrupt"
else
    echo "$TAG: no h5py: the corrupt-block case is not run"
fi

# A target that is not a regular file is written through, not replaced.
mkdir "$W/dev"
ln -s /dev/null "$W/dev/model.safetensors"
"$EXPORT" --quiet "$SNAP" "$W/dev" || fail "export through a link to /dev/null failed"
[ -L "$W/dev/model.safetensors" ] || fail "the link to /dev/null was replaced"
[ -f "$W/dev/config.json" ] || fail "config.json missing beside the /dev/null target"

# Usage.
"$EXPORT" --help | grep -q -- "--dtype" || fail "--help lacks --dtype"
for args in "" "$SNAP" "--dtype fp16 $SNAP $W/x" "--mem 0 $SNAP $W/x" "--bogus $SNAP $W/x"; do
    # shellcheck disable=SC2086
    "$EXPORT" $args >/dev/null 2>&1
    rc=$?
    [ $rc -eq 2 ] || fail "'malleus-export $args' exit $rc, expected 2"
done
[ $PY_DONE -eq 1 ] || { echo "$TAG: skipped (no torch)"; exit 77; }
echo "$TAG: ok"
exit 0
