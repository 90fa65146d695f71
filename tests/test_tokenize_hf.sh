#!/bin/sh
# scripts/tokenize_hf.py on real text: a byte-level BPE tokenizer trained
# here on the fly (no download) with the tokenizers package, text and JSON
# Lines tokenized into a Megatron dataset with document boundaries and an
# EOS token after each document (read back with numpy: every document is
# the tokenizer's encoding of it, then EOS) and its record; malleus-train
# trains on it with --val-fraction, malleus-sample's text is the
# tokenizers library's decode of its ids, and the script's mistakes exit 2.
#
# tokenizers is not packaged by Debian.  The test uses, in this order: a
# $PYTHON3 that imports it; $MALLEUS_HF_SITE (default
# ${XDG_CACHE_HOME:-~/.cache}/malleus/hf-site-4.40, tests/test_export_hf.sh's);
# $MALLEUS_TOKENIZERS_SITE (default .../malleus/tokenizers-0.19), installed
# there with pip --target --no-deps unless MALLEUS_HF_INSTALL=0.  Where that
# fails (no pip, no package index: CI) it skips with 77.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
PY=${PYTHON3:-/usr/bin/python3}
TAG=test_tokenize_hf
export OPENBLAS_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
"$PY" -c 'import numpy' 2>/dev/null || { echo "$TAG: skipped: no numpy"; exit 77; }
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/malleus
HF_SITE=${MALLEUS_HF_SITE:-$CACHE/hf-site-4.40}
TOK_SITE=${MALLEUS_TOKENIZERS_SITE:-$CACHE/tokenizers-0.19}
has_tok() { PYTHONPATH=${1:-}${1:+${PYTHONPATH:+:}}${PYTHONPATH:-} "$PY" -c 'import tokenizers' \
    >/dev/null 2>&1; }
SITE=
if has_tok ""; then
    :
elif has_tok "$HF_SITE"; then
    SITE=$HF_SITE
elif has_tok "$TOK_SITE"; then
    SITE=$TOK_SITE
else
    . "$top_srcdir/tests/pip_site.sh"
    pip_site "$TOK_SITE" has_tok 'tokenizers==0.19.*' ||
        { echo "$TAG: skipped: $PIP_SITE_WHY"; exit 77; }
    SITE=$TOK_SITE
fi
[ -n "$SITE" ] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
W=$(mktemp -d /tmp/malleus-test-tokhf-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "$TAG: FAIL: $*"; exit 1; }
TOKENIZE="$PY $top_srcdir/scripts/tokenize_hf.py"

# text to learn from and to tokenize: the built-in corpus, in paragraphs,
# and a JSON Lines file of a few documents with non-ASCII text
"$B/malleus-tokenize" --default "$W/corpus.bin" >/dev/null || exit 99
"$PY" - "$W" <<'PYEOF' || exit 99
import json, sys, numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
w = sys.argv[1]
text = np.fromfile(w + "/corpus.bin", dtype="<u2", offset=1024).astype(np.uint8).tobytes().decode()
open(w + "/corpus.txt", "w").write(text[:200000])
docs = [{"text": "Café %d: naïve über 日本 %s" % (i, "x" * i), "id": i} for i in range(40)]
open(w + "/docs.jsonl", "w").write("".join(json.dumps(d) + "\n" for d in docs))
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tr = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|endoftext|>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator([text[:200000]] + [d["text"] for d in docs], tr)
import os
os.mkdir(w + "/tok")
tok.save(w + "/tok/tokenizer.json")
# a model of the tokenizer's vocabulary
json.dump({"vocab": tok.get_vocab_size(), "d_model": 64, "n_layers": 2, "n_heads": 4,
           "ffn_hidden": 128, "seq_len": 32}, open(w + "/model.json", "w"))
print("trained a byte-level BPE tokenizer of %d tokens" % tok.get_vocab_size())
PYEOF

# shellcheck disable=SC2086
$TOKENIZE --tokenizer "$W/tok" --text-docs paragraph "$W/data" "$W/corpus.txt" "$W/docs.jsonl" ||
    fail "tokenize_hf.py"
# the dataset, read back independently
"$PY" - "$W" <<'PYEOF' || fail "the dataset is not the documents' encodings"
import json, struct, sys, zlib, numpy as np
from tokenizers import Tokenizer
w = sys.argv[1]
tok = Tokenizer.from_file(w + "/tok/tokenizer.json")
eos = tok.token_to_id("<|endoftext|>")
docs = [p for p in open(w + "/corpus.txt").read().split("\n\n") if p.strip()]
docs += [json.loads(l)["text"] for l in open(w + "/docs.jsonl")]
idx = open(w + "/data.idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", idx[9:17])[0] == 1
code = idx[17]
S, D = struct.unpack("<QQ", idx[18:34])
lens = np.frombuffer(idx, "<i4", S, 34)
ptrs = np.frombuffer(idx, "<i8", S, 34 + 4 * S)
doc_idx = np.frombuffer(idx, "<i8", D, 34 + 12 * S)
assert code == 8 and S == len(docs) and D == S + 1 and list(doc_idx) == list(range(S + 1))
tokens = np.fromfile(w + "/data.bin", dtype="<u2")
for k, d in enumerate(docs):
    got = tokens[ptrs[k] // 2: ptrs[k] // 2 + lens[k]].tolist()
    assert got == tok.encode(d).ids + [eos], "document %d" % k
rec = json.load(open(w + "/data.tokens.json"))
t = rec["tokenizer"]
data = open(w + "/tok/tokenizer.json", "rb").read()
assert rec["n_tokens"] == tokens.size and rec["max_token"] == int(tokens.max())
assert rec["n_documents"] == S and t["eos_id"] == eos and t["eos_token"] == "<|endoftext|>"
assert t["bytes"] == len(data) and t["crc32"] == zlib.crc32(data) & 0xFFFFFFFF
print("%d documents, %d tokens: each the tokenizer's encoding then EOS; record right"
      % (S, tokens.size))
PYEOF

# train on it, then sample: malleus-sample's text is the library's decode
PROMPT=$($TOKENIZE --tokenizer "$W/tok" --encode "Seven plus five is") || fail "--encode"
"$B/malleus-train" --model "$W/model.json" --data "$W/data" --val-fraction 0.05 --eval-every 4 \
    --global-batch 8 --micro-batch 4 --steps 4 --threads 1 --snapshot-dir "$W/snap" \
    --sample-every 4 --sample-prompt "$PROMPT" >"$W/train.log" 2>&1 ||
    { cat "$W/train.log"; fail "training"; }
grep -a "^sample at step 4: Seven plus five is" "$W/train.log" ||
    { grep -a "sample at" "$W/train.log"; fail "the trainer's sample is not decoded"; }
S="$B/malleus-sample --tokens 30 --temperature 0.8 --threads 1"
# shellcheck disable=SC2086
$S --prompt "$PROMPT" "$W/snap" >"$W/text" && $S --prompt "$PROMPT" --token-ids "$W/snap" \
    >"$W/ids" || fail "malleus-sample"
"$PY" - "$W" <<'PYEOF' || fail "malleus-sample's text is not the tokenizers library's decode"
import re, sys
from tokenizers import Tokenizer
w = sys.argv[1]
tok = Tokenizer.from_file(w + "/tok/tokenizer.json")
ids = [int(x) for x in open(w + "/ids").read().split()]
raw = re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
             open(w + "/text", "rb").read().rstrip(b"\n"))
text, want = raw.decode("utf-8", errors="replace"), tok.decode(ids, skip_special_tokens=False)
print("malleus-sample: %r" % text[:70])
assert want.startswith("Seven plus five is") and text == want, (text, want)
PYEOF

# the script's mistakes: exit 2, nothing written
echo '{"body": "no text field"}' >"$W/bad.jsonl"
for args in "--tokenizer $W/tok $W/x $W/missing.txt" "--tokenizer $W/tok $W/x $W/bad.jsonl" \
    "--tokenizer $W/nowhere $W/x $W/corpus.txt" "--tokenizer $W/tok --eos <nope> $W/x $W/corpus.txt" \
    "--tokenizer $W/tok $W/x"; do
    # shellcheck disable=SC2086
    $TOKENIZE $args >"$W/out" 2>&1
    rc=$?
    [ $rc -eq 2 ] || { cat "$W/out"; fail "tokenize_hf.py $args: exit $rc, wanted 2"; }
    [ -e "$W/x.bin" ] && fail "tokenize_hf.py $args left $W/x.bin"
    echo "ok: 2: $(tail -1 "$W/out" | cut -c1-120)"
done
echo "$TAG: ok"
