#!/bin/sh
# bench/finetune/run.sh [WORKDIR]: the fine-tuning path measured end to end
# (README, "Fine-tune a Hugging Face model"), run by hand, not by make check.
# A random LLaMA-3-shaped model saved by transformers (bench/finetune/setup.py:
# 128,256-token vocabulary, GQA, tied, llama3 rotary scaling) is imported,
# fine-tuned on a 0.7/0.3 blend of two Megatron datasets of 32-bit tokens
# (scripts/tokenize_hf.py with its tokenizer) for 6 steps in one process and
# on 8 ranks under tests/plans/mixed_tp.json (TP 4/2/1 stages and a second
# pipeline), and exported; prints
#   * the largest relative difference of the two loss curves;
#   * that the export loads in transformers with AutoTokenizer, and
#     transformers' loss of the exported model against malleus-train's on
#     the same batch (tests/hf_ref.py);
#   * the peak RSS of malleus-import on a 357 MiB BF16 checkpoint, --mem 64
#     and 16.
# Needs torch and transformers 4.44 (found or installed by tests/hf_site.sh),
# a build in the tree (or top_builddir), mpiexec.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${top_builddir:-$top}
PYTHON3=${PYTHON3:-/usr/bin/python3}
# shellcheck disable=SC2034 # read by tests/hf_site.sh
TAG=bench-finetune
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
. "$top/tests/hf_site.sh"
W=${1:-$(mktemp -d "${TMPDIR:-/tmp}/bench-finetune.XXXXXX")}
mkdir -p "$W/data"
cd "$W"
rm -rf imp ft hf-ft big-snap*
"$PYTHON3" "$top/bench/finetune/setup.py" "$W" 2>/dev/null
for x in a b; do
    "$PYTHON3" "$top/scripts/tokenize_hf.py" --tokenizer hf "data/$x" "corpus/$x.jsonl"
done
"$B/malleus-import" hf imp
FT="--data data/a:0.7,data/b:0.3 --global-batch 16 --steps 6 --lr 3e-3 --threads 1 --quiet --seed 11"
# shellcheck disable=SC2086
"$B/malleus-train" $FT --micro-batch 2 --init-from imp --metrics one.jsonl
# shellcheck disable=SC2086
sh "$top/tests/mpirun.sh" 8 600 "$B/malleus-train" $FT --init-from imp \
    --plan "$top/tests/plans/mixed_tp.json" --metrics eight.jsonl --snapshot-dir ft
"$PYTHON3" - one.jsonl eight.jsonl <<'PY'
import json, sys
a, c = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
print("one process: %s" % " ".join("%.6f" % x["loss"] for x in a))
print("8 ranks:     %s" % " ".join("%.6f" % x["loss"] for x in c))
print("largest relative difference: %.2e" % max(abs(x["loss"] - y["loss"]) / x["loss"]
                                               for x, y in zip(a, c)))
PY
"$B/malleus-export" ft hf-ft
"$PYTHON3" - hf-ft <<'PY' 2>/dev/null
import sys
from transformers import AutoTokenizer, LlamaForCausalLM
t = AutoTokenizer.from_pretrained(sys.argv[1])
m = LlamaForCausalLM.from_pretrained(sys.argv[1])
ids = t("Item 12 costs")["input_ids"]
print("AutoTokenizer: %s, %d tokens, eos %s = %d; LlamaForCausalLM vocab %d; 'Item 12 costs' -> %s"
      % (type(t).__name__, len(t), t.eos_token, t.eos_token_id, m.config.vocab_size, ids))
PY
# transformers' loss of the export on a batch against malleus-train's
# (byte-level tokens: ids the 128k vocabulary holds, in the llm.c format
# the reference's sampler reads)
"$PYTHON3" -c 'import json, sys
for l in open(sys.argv[1]): print(json.loads(l)["text"])' corpus/a.jsonl >text.txt
"$B/malleus-tokenize" text.txt bytes.bin >/dev/null
"$B/malleus-train" --init-from hf-ft --data bytes.bin --seed 7 --global-batch 16 --micro-batch 4 \
    --steps 1 --threads 1 --quiet --metrics h.jsonl
"$PYTHON3" "$top/tests/hf_ref.py" --impl transformers --export hf-ft --data bytes.bin --seed 7 \
    --step 0 --global-batch 16 --loss "$(sed 's/.*"loss": \([^,]*\),.*/\1/' h.jsonl)" 2>/dev/null
echo "checkpoint: $(du -sh big | cut -f1) BF16"
for m in 64 16; do
    /usr/bin/time -f "malleus-import --mem $m: %e s, peak RSS %M KiB" \
        "$B/malleus-import" --quiet --mem $m big "big-snap$m"
done
rm -rf big-snap*
