#!/bin/sh
# malleus-import and malleus-train --init-from without transformers (CI):
# Hugging Face checkpoints written by malleus-export and, independently,
# by tests/hf_import_ref.py with numpy.
#  * a trained tiny-llama3 (grouped-query attention, tied embeddings, the
#    llama3 rotary scaling) exported and imported gives back its parameters
#    bit for bit; so do an F16, a BF16 and a sharded checkpoint written with
#    numpy (the first two: the parameters rounded as numpy rounds them);
#    import -> export gives back the checkpoint's tensors bit for bit (fp32,
#    and BF16 -> fp32 snapshot -> bf16 export); an import under the
#    8-rank plan mixed_tp.json, and one resharded, export the same tensors;
#  * --init-from the snapshot and from the checkpoint directory itself
#    train the same losses; under mixed_tp.json on 8 ranks within 1e-5 of
#    one process; seq_len 16 chosen by import --seq-len or by --model
#    gives one loss; a resume of the fine-tuning run keeps its record of
#    the source; --resume of an import and --init-from with --resume are
#    refused;
#  * every refusal (exit 2, nothing written): another architecture or
#    model_type, hidden_act, attention and MLP biases (in the config or as
#    a tensor), a rope_scaling Malleus does not compute, head_dim,
#    attention_dropout, quantization, tied embeddings with an lm_head and
#    untied without, missing, extra and misshapen tensors, an I32 tensor, a
#    truncated file, overlapping tensors, a header past the end, an index
#    that names a file outside its directory or a file without the tensor,
#    no safetensors, a destination holding snapshots or the checkpoint's
#    own directory.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
B=$top_builddir
PY=${PYTHON3:-/usr/bin/python3}
TAG=test_import
REF="$top_srcdir/tests/hf_import_ref.py"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 top_builddir
W=$(mktemp -d "${TMPDIR:-/tmp}/test_import.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
fail() { echo "$TAG: FAIL: $*"; exit 1; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "$TAG: skipped: $PY has no numpy"; exit 77; }
for p in malleus-train malleus-export malleus-import malleus-reshard malleus-tokenize; do
    [ -x "$B/$p" ] || { echo "$TAG: $B/$p not built"; exit 99; }
done
IMPORT="$B/malleus-import --quiet"
PLAN8="$top_srcdir/tests/plans/mixed_tp.json"

# the source: tiny-llama3 trained a little (positions matter: a q/k row
# permutation that is wrong changes the losses)
i=0
while [ $i -lt 300 ]; do
    echo "Line $i: the $((i * 7 % 13)) quick brown foxes jump over $((i * i % 97)) lazy dogs."
    i=$((i + 1))
done >"$W/text.txt"
"$B/malleus-tokenize" "$W/text.txt" "$W/tokens.bin" >/dev/null || exit 99
"$B/malleus-train" --model tiny-llama3 --data "$W/tokens.bin" --steps 20 --lr 3e-3 --threads 1 \
    --snapshot-dir "$W/src" --quiet || fail "training the source"
"$B/malleus-export" --quiet "$W/src" "$W/hf" || fail "export"
"$B/malleus-export" --quiet --dtype bf16 "$W/src" "$W/hf-bf16" || fail "bf16 export"

echo "-- import gives back the parameters"
$IMPORT "$W/hf" "$W/imp" || fail "import"
"$PY" "$REF" same-params "$W/src" "$W/imp" || fail "import of the export differs"
for v in f16 bf16 sharded; do
    "$PY" "$REF" write "$W/hf" "$W/hf-$v" $v || exit 99
    $IMPORT "$W/hf-$v" "$W/imp-$v" || fail "import of the $v checkpoint"
    r=$v
    [ $v = sharded ] && r=
    # shellcheck disable=SC2086
    "$PY" "$REF" same-params "$W/src" "$W/imp-$v" ${r:+--round $r} || fail "$v import differs"
done
[ -f "$W/hf-sharded/model-00003-of-00003.safetensors" ] || fail "the sharded checkpoint has no third file"

echo "-- import -> export gives back the tensors"
"$B/malleus-export" --quiet "$W/imp-sharded" "$W/back" || fail "export of the import"
"$PY" "$REF" same-tensors "$W/hf" "$W/back" || fail "fp32: import -> export changed tensors"
$IMPORT "$W/hf-bf16" "$W/imp-bf16x" || fail "import of the bf16 export"
"$B/malleus-export" --quiet --dtype bf16 "$W/imp-bf16x" "$W/back-bf16" || fail "bf16 export"
"$PY" "$REF" same-tensors "$W/hf-bf16" "$W/back-bf16" || fail "bf16 -> fp32 -> bf16 changed tensors"
$IMPORT --dtype bf16 "$W/hf" "$W/imp-round" || fail "import --dtype bf16"
"$PY" "$REF" same-params "$W/src" "$W/imp-round" --round bf16 || fail "--dtype bf16 rounds otherwise"
$IMPORT --plan "$PLAN8" "$W/hf" "$W/imp8" || fail "import --plan"
[ "$(ls "$W"/imp8/step_00000000/shard_*.h5 | wc -l)" -gt 1 ] || fail "--plan wrote one shard"
"$B/malleus-reshard" --quiet "$W/imp8" "$top_srcdir/tests/plans/pp4dp2.json" "$W/imp-rs" ||
    fail "reshard of a weights-only snapshot"
for s in imp8 imp-rs; do
    "$B/malleus-export" --quiet "$W/$s" "$W/back-$s" || fail "export of $s"
    "$PY" "$REF" same-tensors "$W/hf" "$W/back-$s" || fail "$s exports other tensors"
done

echo "-- fine-tuning: --init-from a snapshot or a checkpoint, any plan"
FT="--data $W/tokens.bin --global-batch 16 --micro-batch 2 --steps 4 --lr 1e-3 --threads 1 --quiet"
# shellcheck disable=SC2086
"$B/malleus-train" $FT --init-from "$W/imp" --metrics "$W/a.jsonl" --snapshot-dir "$W/ft" ||
    fail "--init-from the snapshot"
# shellcheck disable=SC2086
"$B/malleus-train" $FT --init-from "$W/hf-sharded" --metrics "$W/b.jsonl" || fail "--init-from HF_DIR"
# the same parameters: the same losses and gradient norms, to the last digit
[ "$(cut -d, -f2,4 "$W/a.jsonl")" = "$(cut -d, -f2,4 "$W/b.jsonl")" ] ||
    fail "--init-from the checkpoint and its import train different losses"
# shellcheck disable=SC2086
sh "$top_srcdir/tests/mpirun.sh" 8 240 "$B/malleus-train" $FT --init-from "$W/hf-sharded" \
    --plan "$PLAN8" --metrics "$W/c.jsonl" >"$W/c.log" 2>&1 || { tail "$W/c.log"; fail "8 ranks"; }
"$PY" - "$W/a.jsonl" "$W/c.jsonl" <<'EOF' || fail "the fine-tuning curves differ"
import json, sys
a, c = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
assert len(a) == len(c) == 4
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, c))
print("losses %s; 8 ranks (mixed_tp.json) within %.1e of one process"
      % (" ".join("%.6f" % x["loss"] for x in a), worst))
sys.exit(worst > 1e-5)
EOF
# the training sequence length is the run's: malleus-import --seq-len, or a
# --model with the source's shapes
$IMPORT --seq-len 16 "$W/hf" "$W/imp16" || fail "import --seq-len"
"$PY" - "$W/hf/config.json" >"$W/m16.json" <<'EOF' || exit 99
import json, sys
c = json.load(open(sys.argv[1]))
print(json.dumps({"vocab": c["vocab_size"], "d_model": c["hidden_size"], "n_layers":
                  c["num_hidden_layers"], "n_heads": c["num_attention_heads"], "n_kv_heads":
                  c["num_key_value_heads"], "ffn_hidden": c["intermediate_size"], "seq_len": 16,
                  "tie_embeddings": c["tie_word_embeddings"], "rope_theta": c["rope_theta"],
                  "rope_scaling": c["rope_scaling"], "norm_eps": c["rms_norm_eps"]}))
EOF
# shellcheck disable=SC2086
"$B/malleus-train" $FT --steps 1 --init-from "$W/imp16" --metrics "$W/s16a.jsonl" &&
    "$B/malleus-train" $FT --steps 1 --init-from "$W/hf" --model "$W/m16.json" \
        --metrics "$W/s16b.jsonl" || fail "--init-from with seq_len 16"
l16=$(cut -d, -f2 "$W/s16a.jsonl")
l32=$(sed -n 1p "$W/a.jsonl" | cut -d, -f2)
if [ "$l16" != "$(cut -d, -f2 "$W/s16b.jsonl")" ] || [ "$l16" = "$l32" ]; then
    fail "seq_len 16: import --seq-len gives$l16, --model$(cut -d, -f2 "$W/s16b.jsonl"), 32:$l32"
fi
echo "seq_len 16, by import --seq-len and by --model:$l16 (seq_len 32:$l32)"

# the record of the source, carried on by a resume
# shellcheck disable=SC2086
"$B/malleus-train" $FT --steps 6 --override steps --snapshot-dir "$W/ft" --resume ||
    fail "resume of the fine-tuning run"
"$PY" - "$W/ft" "$W/hf" <<'EOF' || fail "the source is not recorded"
import json, os, sys
sys.path.insert(0, os.path.join(os.environ.get("top_srcdir", "."), "tests"))
from snapread import open_snapshot
f, d = open_snapshot(sys.argv[1])
s = json.loads(f.attrs["train_json"])
src = s["init_from"]
assert f.attrs["step"] == 6 and src["format"] == "malleus-snapshot", (f.attrs["step"], src)
assert src["imported_from"]["path"] == os.path.realpath(sys.argv[2]), src
print("step 6 of the fine-tuning run records its source %s, imported from %s"
      % (src["path"], src["imported_from"]["path"]))
EOF

echo "-- refusals (exit 2, nothing written)"
refuse() { # WHAT PATTERN CMD...: exit 2 and a message matching PATTERN
    what=$1 pat=$2
    shift 2
    "$@" >"$W/out" 2>&1
    rc=$?
    [ $rc -eq 2 ] || { cat "$W/out"; fail "$what: exit $rc, not 2"; }
    grep -q -- "$pat" "$W/out" || { cat "$W/out"; fail "$what: no message matching '$pat'"; }
    echo "refused: $what: $(tail -1 "$W/out" | sed 's/^[^:]*: [a-z_]*\.c:[0-9]*: //' | cut -c1-110)"
}
bad() { # VARIANT PATTERN: the variant's import is refused and writes nothing
    "$PY" "$REF" write "$W/hf" "$W/bad" "$1" || exit 99
    rm -rf "$W/out-snap"
    refuse "$1" "$2" $IMPORT "$W/bad" "$W/out-snap"
    [ ! -e "$W/out-snap" ] || fail "$1: the refused import left $W/out-snap"
}
bad 'config:model_type="mistral"' '"model_type" is "mistral"'
bad 'config:architectures=["LlamaForSequenceClassification"]' 'LlamaForSequenceClassification'
bad 'config:hidden_act="gelu"' '"hidden_act" is gelu'
bad 'config:attention_bias=true' '"attention_bias": true is not supported'
bad 'config:mlp_bias=true' '"mlp_bias": true is not supported'
bad 'config:rope_scaling={"rope_type":"linear","factor":2.0}' 'rope_type must be "llama3"'
bad 'config:rope_scaling={"type":"dynamic","factor":2.0}' 'rope_type must be "llama3"'
bad 'config:head_dim=16' '"head_dim" must be hidden_size'
bad 'config:attention_dropout=0.1' 'attention_dropout'
bad 'config:quantization_config={"quant_method":"gptq"}' 'quantization_config'
bad 'config:vocab_size=DELETE' 'missing field "vocab_size"'
bad 'config:num_key_value_heads=3' 'n_kv_heads'
bad bias 'bias tensor .model.layers.0.self_attn.q_proj.bias'
bad tied-lm-head 'holds lm_head.weight but config.json says tie_word_embeddings: true'
bad untied-no-lm-head "lacks the tensor 'lm_head.weight' (config.json says tie_word_embeddings: false)"
bad missing "lacks the tensor 'model.layers.1.mlp.up_proj.weight'"
bad misshapen "'model.layers.0.mlp.up_proj.weight' has shape \[64, 128\] but config.json makes it \[128, 64\]"
bad int32 "'model.norm.weight' is I32: only F32, F16 and BF16"
bad extra "the tensor 'model.layers.0.self_attn.q_norm.weight'"
bad truncated 'runs past the end of the file'
bad overlap 'overlap in the file'
bad header-beyond 'header length .* runs past the end of the file'
bad index-escape '../outside.safetensors: a file of the checkpoint is a plain name'
bad index-missing "maps 'model.norm.weight' to .*, which does not hold it"
bad pytorch-only 'pytorch_model.bin is not read'
refuse "no config.json" "holds no config.json" $IMPORT "$W/src" "$W/out-snap"
refuse "a destination with snapshots" "holds snapshots already" $IMPORT "$W/hf" "$W/src"
refuse "the checkpoint's own directory" "is the checkpoint's own directory" $IMPORT "$W/hf" "$W/hf"
[ ! -e "$W/hf/latest" ] && [ ! -e "$W/hf/step_00000000" ] || fail "the refused import wrote into $W/hf"
refuse "--resume of an import" "holds weights only .*--init-from" \
    "$B/malleus-train" --snapshot-dir "$W/imp" --resume --steps 1 --quiet
refuse "--init-from with --resume" "give one of them" \
    "$B/malleus-train" --init-from "$W/imp" --resume --snapshot-dir "$W/x" --steps 1
refuse "--init-from with another model's shapes" "its model has vocab 259, --model 256" \
    "$B/malleus-train" --init-from "$W/hf" --model tiny --steps 1 --quiet
refuse "--init-from inside --snapshot-dir" "lies in --snapshot-dir" \
    "$B/malleus-train" --init-from "$W/imp/step_00000000" --snapshot-dir "$W/imp" --steps 1 --quiet
refuse "--init-from nothing" "neither a Hugging Face checkpoint directory" \
    "$B/malleus-train" --init-from "$W/nothing" --steps 1 --quiet
echo "$TAG: ok"
exit 0
