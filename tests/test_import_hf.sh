#!/bin/sh
# malleus-import and malleus-train --init-from on checkpoints written by the
# real Hugging Face library: random LlamaForCausalLM models made by
# transformers in this test (tests/hf_import_ref.py transformers: grouped-
# query attention 4/2, rope_theta 500000, the llama3 rope_scaling, tied and
# untied embeddings, save_pretrained's sharded safetensors via
# max_shard_size).
#  * each imported: malleus-train --init-from's first loss (the parameters
#    as read, on step 0's batch) equals transformers' loss on that batch
#    within 1e-5 relative, fp32 (tests/hf_ref.py); with the q/k permutation
#    undone the loss must not agree (the comparison can fail);
#  * import -> malleus-export gives back save_pretrained's tensors bit for
#    bit (names, dtypes, shapes, bytes);
#  * the tied model imported under tests/plans/four.json (a TP-2 replica
#    and a two-stage pipeline: the embedding on both ends) and fine-tuned
#    from that snapshot on 4 ranks trains the losses of one process within
#    1e-5;
#  * refused with exit 2, naming the field, nothing written: a LLaMA with
#    attention_bias, a GPT-2 (another architecture), a shard cut short.
# tests/test_import.sh checks the same without transformers (CI).
# transformers 4.44 is found or installed by tests/hf_site.sh (else 77).
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
B=$top_builddir
PYTHON3=${PYTHON3:-/usr/bin/python3}
TAG=test_import_hf
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 top_builddir
REF="$top_srcdir/tests/hf_import_ref.py"
for p in malleus-train malleus-export malleus-import malleus-tokenize; do
    [ -x "$B/$p" ] || { echo "$TAG: $B/$p not built"; exit 99; }
done
. "$top_srcdir/tests/hf_site.sh"
W=$(mktemp -d "${TMPDIR:-/tmp}/test_import_hf.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
fail() { echo "$TAG: FAIL: $*"; exit 1; }
IMPORT="$B/malleus-import --quiet"

"$PYTHON3" "$REF" transformers "$W" 2>"$W/py.err" || { cat "$W/py.err"; exit 99; }
i=0
while [ $i -lt 300 ]; do
    echo "Line $i: the $((i * 7 % 13)) quick brown foxes jump over $((i * i % 97)) lazy dogs."
    i=$((i + 1))
done >"$W/text.txt"
"$B/malleus-tokenize" "$W/text.txt" "$W/tokens.bin" >/dev/null || exit 99
SEED=7
FT="--data $W/tokens.bin --seed $SEED --global-batch 16 --steps 3 --lr 1e-3 --threads 1 --quiet"

for m in tied untied; do
    set -- "$W/$m"/model-*.safetensors
    echo "-- $m: $# safetensors files"
    $IMPORT "$W/$m" "$W/imp-$m" || fail "import of $m"
    "$B/malleus-export" --quiet "$W/imp-$m" "$W/back-$m" || fail "export of the $m import"
    "$PYTHON3" "$REF" same-tensors "$W/$m" "$W/back-$m" || fail "$m: import -> export changed tensors"
    # shellcheck disable=SC2086
    "$B/malleus-train" $FT --micro-batch 4 --init-from "$W/imp-$m" --metrics "$W/$m.jsonl" ||
        fail "--init-from the $m import"
    LOSS=$(sed -n 1p "$W/$m.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
    "$PYTHON3" "$top_srcdir/tests/hf_ref.py" --impl transformers --export "$W/$m" \
        --data "$W/tokens.bin" --seed $SEED --step 0 --global-batch 16 --loss "$LOSS" \
        2>/dev/null || fail "$m: Malleus's loss is not transformers'"
done
"$PYTHON3" "$top_srcdir/tests/hf_ref.py" --impl transformers --export "$W/untied" \
    --data "$W/tokens.bin" --seed $SEED --step 0 --global-batch 16 --loss "$LOSS" \
    --perturb no-permute >"$W/neg" 2>/dev/null
rc=$?
cat "$W/neg"
if [ $rc -ne 1 ] || ! grep -q MISMATCH "$W/neg"; then
    fail "the loss comparison did not notice no-permute (exit $rc)"
fi

echo "-- fine-tuning the tied model on 4 ranks (tests/plans/four.json)"
$IMPORT --plan "$top_srcdir/tests/plans/four.json" "$W/tied" "$W/imp4" || fail "import --plan"
# shellcheck disable=SC2086
sh "$top_srcdir/tests/mpirun.sh" 4 120 "$B/malleus-train" $FT --init-from "$W/imp4" \
    --plan "$top_srcdir/tests/plans/four.json" --metrics "$W/four.jsonl" >"$W/four.log" 2>&1 ||
    { tail "$W/four.log"; fail "4 ranks"; }
"$PYTHON3" - "$W/tied.jsonl" "$W/four.jsonl" <<'EOF' || fail "the fine-tuning curves differ"
import json, sys
a, c = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
assert len(a) == len(c) == 3
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, c))
print("losses %s; 4 ranks (four.json) within %.1e of one process"
      % (" ".join("%.6f" % x["loss"] for x in a), worst))
sys.exit(worst > 1e-5)
EOF

echo "-- refusals (exit 2, nothing written)"
refuse() { # WHAT PATTERN CKPT: import and --init-from exit 2 naming PATTERN
    for cmd in import train; do
        if [ $cmd = import ]; then
            $IMPORT "$W/$3" "$W/out-snap" >"$W/out" 2>&1
        else
            # shellcheck disable=SC2086
            "$B/malleus-train" $FT --init-from "$W/$3" --snapshot-dir "$W/out-snap" >"$W/out" 2>&1
        fi
        rc=$?
        [ $rc -eq 2 ] || { cat "$W/out"; fail "$1 ($cmd): exit $rc, not 2"; }
        grep -q -- "$2" "$W/out" || { cat "$W/out"; fail "$1 ($cmd): no message matching '$2'"; }
        [ ! -e "$W/out-snap" ] || fail "$1 ($cmd): the refused $cmd wrote $W/out-snap"
    done
    echo "refused: $1: $(tail -1 "$W/out" | sed 's/^[^:]*: [a-z_]*\.c:[0-9]*: //' | cut -c1-110)"
}
refuse "attention bias" '"attention_bias": true is not supported' bias
refuse "GPT-2" '"model_type" is "gpt2"' gpt2
cp -r "$W/tied" "$W/cut"
for f in "$W"/cut/model-*.safetensors; do :; done # the last shard
head -c $(($(wc -c <"$f") - 64)) "$f" >"$W/part" && mv "$W/part" "$f"
refuse "a shard cut short" "$(basename "$f"): tensor .* runs past the end of the file" cut
echo "$TAG: ok"
exit 0
