#!/bin/sh
# malleus-export's checkpoint in the real Hugging Face library: transformers'
# LlamaForCausalLM.from_pretrained loads it with every key matched, and its
# loss on the batch whose loss malleus-train reported for the exported
# parameters agrees within 1e-5 (fp32), and its generate() continues a
# prompt greedily as malleus-sample --temperature 0 does; with the q/k
# permutation undone the loss must not agree.  Then the same loss check
# for tiny-llama3: grouped-query attention (num_key_value_heads 2 of 8),
# tied embeddings (no lm_head in the file; Hugging Face ties it), rope_theta
# 500000 with rope_scaling {"rope_type": "llama3", ...}, which transformers
# computes itself (_compute_llama3_parameters); with the scaling dropped
# from the loaded config, or the q/k permutation undone, the loss must not
# agree.
#
# transformers 4.44 is found or installed by tests/hf_site.sh (else 77).
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON3=${PYTHON3:-/usr/bin/python3}
TAG=test_export_hf
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
REF=$top_srcdir/tests/hf_ref.py

. "$top_srcdir/tests/hf_site.sh"

W=$(mktemp -d "${TMPDIR:-/tmp}/test_export_hf.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
. "$top_srcdir/tests/export_setup.sh"
"$EXPORT" --quiet "$SNAP" "$W/hf" || { echo "$TAG: FAIL: export failed"; exit 1; }

"$PYTHON3" "$REF" --impl transformers --export "$W/hf" --data "$W/tokens.bin" --seed $SEED \
    --step $K --global-batch $GB --loss "$LOSS" --greedy "$PROMPT" $NGREEDY "$W/greedy"
rc=$?
[ $rc -eq 0 ] || { echo "$TAG: FAIL (exit $rc)"; exit $rc; }
# negative EXPORT_DIR PERTURBATION: the loss must then disagree
negative() {
    "$PYTHON3" "$REF" --impl transformers --export "$1" --data "$W/tokens.bin" --seed $SEED \
        --step $K --global-batch $GB --loss "$LOSS" --perturb "$2" >"$W/neg" 2>&1
    rc=$?
    cat "$W/neg"
    if [ $rc -ne 1 ] || ! grep -q MISMATCH "$W/neg"; then
        echo "$TAG: FAIL: the comparison did not notice $2 on $1 (exit $rc)"
        exit 1
    fi
    echo "negative control ($2, $1): mismatch detected, as it must"
}
negative "$W/hf" no-permute

# grouped-query attention, tied embeddings, llama3 rotary scaling
MODEL=tiny-llama3 SUFFIX=-gqa
. "$top_srcdir/tests/export_setup.sh"
"$EXPORT" --quiet "$SNAP" "$W/hf-gqa" || { echo "$TAG: FAIL: export of tiny-llama3 failed"; exit 1; }
"$PYTHON3" "$REF" --impl transformers --export "$W/hf-gqa" --data "$W/tokens.bin" --seed $SEED \
    --step $K --global-batch $GB --loss "$LOSS"
rc=$?
[ $rc -eq 0 ] || { echo "$TAG: FAIL on tiny-llama3 (exit $rc)"; exit $rc; }
negative "$W/hf-gqa" unscaled-rope
negative "$W/hf-gqa" no-permute
echo "$TAG: ok"
exit 0
