#!/bin/sh
# A tokenizer from the data to the exported model, without Python's
# tokenizers package (CI has none): a Megatron dataset written by numpy with
# the record scripts/tokenize_hf.py would write beside it, naming the
# committed byte-level BPE fixture (tests/tokenizers/bytelevel.json);
# malleus-train carries the tokenizer into its snapshots, malleus-export
# copies tokenizer.json next to the model with a tokenizer_config.json,
# malleus-sample prints decoded text (ids with --token-ids); a tokenizer
# changed or gone since is refused (exit 2) unless named with --tokenizer,
# and so are data of two tokenizers and a stale record.  Where transformers
# imports ($MALLEUS_HF_SITE, as tests/test_export_hf.sh), AutoTokenizer
# loads the export and decodes malleus-sample's ids to its text.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
PY=${PYTHON3:-/usr/bin/python3}
TAG=test_tokenizer_flow
"$PY" -c 'import numpy' 2>/dev/null || { echo "$TAG: skipped: no numpy"; exit 77; }
W=$(mktemp -d /tmp/malleus-test-tokflow-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fail() { echo "$TAG: FAIL: $*"; exit 1; }
# expect CODE PATTERN CMD...: exit status CODE and PATTERN (grep -E) in the output
expect() {
    code=$1 pat=$2
    shift 2
    "$@" >"$W/out" 2>&1 </dev/null
    rc=$?
    [ $rc -eq "$code" ] && grep -Eaq -- "$pat" "$W/out" ||
        { tail -3 "$W/out"; fail "$* -> exit $rc, wanted $code and /$pat/"; }
    echo "ok: $rc: $(grep -Ea -- "$pat" "$W/out" | head -1 | cut -c1-150)"
}

mkdir "$W/tok"
cp "$top_srcdir/tests/tokenizers/bytelevel.json" "$W/tok/tokenizer.json"
# data: ids below the fixture's vocabulary, and the record of them
"$PY" "$top_srcdir/tests/megatron_write.py" "$W/d" uint16 200 5 364 >/dev/null || exit 99
record() { # PREFIX TOKENIZER_JSON [N_TOKENS_DELTA]
    "$PY" - "$@" <<'PYEOF'
import json, os, sys, zlib, numpy as np
prefix, tok = sys.argv[1], os.path.abspath(sys.argv[2])
delta = int(sys.argv[3]) if len(sys.argv) > 3 else 0
t = np.fromfile(prefix + ".bin", dtype="<u2")
data = open(tok, "rb").read()
rec = {"format": "malleus-tokens/1", "n_tokens": int(t.size) + delta, "n_documents": 200,
       "max_token": int(t.max()), "dtype": "uint16",
       "tokenizer": {"file": tok, "bytes": len(data), "crc32": zlib.crc32(data) & 0xFFFFFFFF,
                     "vocab_size": 364, "eos_token": "<|endoftext|>", "eos_id": 0,
                     "config": None, "special_tokens_map": None}}
json.dump(rec, open(prefix + ".tokens.json", "w"))
PYEOF
}
record "$W/d" "$W/tok/tokenizer.json" || exit 99
cat >"$W/model.json" <<'JSONEOF'
{"vocab": 384, "d_model": 64, "n_layers": 2, "n_heads": 4, "ffn_hidden": 128, "seq_len": 32}
JSONEOF
RUN="$B/malleus-train --model $W/model.json --global-batch 8 --micro-batch 4 --threads 1 --quiet"
# shellcheck disable=SC2086
$RUN --data "$W/d" --steps 3 --snapshot-dir "$W/snap" >"$W/train.log" 2>&1 ||
    { cat "$W/train.log"; fail "training"; }

echo "-- export: the tokenizer next to the model"
"$B/malleus-export" --quiet "$W/snap" "$W/hf" || fail "export"
cmp -s "$W/hf/tokenizer.json" "$W/tok/tokenizer.json" || fail "tokenizer.json not copied"
grep -q '"tokenizer_class": "PreTrainedTokenizerFast"' "$W/hf/tokenizer_config.json" &&
    grep -q '"eos_token": "<|endoftext|>"' "$W/hf/tokenizer_config.json" ||
    { cat "$W/hf/tokenizer_config.json"; fail "tokenizer_config.json"; }
echo "ok: tokenizer.json and tokenizer_config.json in the export"

echo "-- sample: text, decoded"
S="$B/malleus-sample --tokens 24 --temperature 0 --threads 1 --prompt"
# shellcheck disable=SC2086
$S "276 291" "$W/snap" >"$W/text" || fail "malleus-sample"
# shellcheck disable=SC2086
$S "276 291" --token-ids "$W/snap" >"$W/ids" || fail "malleus-sample --token-ids"
head -c 7 "$W/text" | grep -qx "The cat" || { cat "$W/text"; fail "the prompt is not decoded"; }
[ "$(wc -w <"$W/ids")" -eq 26 ] || { cat "$W/ids"; fail "--token-ids: not 26 ids"; }
echo "ok: '$(head -c 60 "$W/text" | tr '\n' ' ')' / ids $(head -c 40 "$W/ids")"

echo "-- a tokenizer changed since, gone, named by hand"
printf ' ' >>"$W/tok/tokenizer.json"
expect 2 "changed since the data was tokenized" "$B/malleus-export" "$W/snap" "$W/hf2"
[ -e "$W/hf2/model.safetensors" ] && fail "export wrote the model before refusing"
expect 2 "changed since" $S "276" "$W/snap"
expect 0 "" "$B/malleus-export" --tokenizer "$W/tok" "$W/snap" "$W/hf3"
cmp -s "$W/hf3/tokenizer.json" "$W/tok/tokenizer.json" || fail "--tokenizer not copied"
expect 0 "" "$B/malleus-export" --no-tokenizer "$W/snap" "$W/hf4"
[ -e "$W/hf4/tokenizer.json" ] && fail "--no-tokenizer copied one"
# shellcheck disable=SC2086
expect 0 "^The" $S "276" --tokenizer "$W/tok/tokenizer.json" "$W/snap"
rm "$W/tok/tokenizer.json"
expect 2 "is gone" "$B/malleus-export" "$W/snap" "$W/hf5"
cp "$top_srcdir/tests/tokenizers/bytelevel.json" "$W/tok/tokenizer.json"

echo "-- data of two tokenizers, a stale record"
"$PY" "$top_srcdir/tests/megatron_write.py" "$W/e" uint16 50 6 300 >/dev/null || exit 99
record "$W/e" "$top_srcdir/tests/tokenizers/metaspace.json" || exit 99
# shellcheck disable=SC2086
expect 2 "different tokenizers" $RUN --steps 1 --data "$W/d,$W/e"
record "$W/e" "$W/tok/tokenizer.json" 5 || exit 99
# shellcheck disable=SC2086
expect 2 "e.tokens.json describes .* stale" $RUN --steps 1 --data "$W/e"

# AutoTokenizer on the export, where transformers imports
SITE=${MALLEUS_HF_SITE:-${XDG_CACHE_HOME:-$HOME/.cache}/malleus/hf-site-4.40}
if PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import transformers' 2>/dev/null; then
    PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$W/hf" "$W/ids" "$W/text" <<'PYEOF' ||
import re, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = [int(x) for x in open(sys.argv[2]).read().split()]
# malleus-sample's bytes, its \xNN escapes of control bytes undone, read
# as the library reads bytes (a broken UTF-8 sequence: U+FFFD)
raw = re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
             open(sys.argv[3], "rb").read().rstrip(b"\n"))
text = raw.decode("utf-8", errors="replace")
got = tok.decode(ids)
print("AutoTokenizer (%s) decodes malleus-sample's %d ids to its text: %s"
      % (type(tok).__name__, len(ids), got == text))
sys.exit(got != text or tok.decode(ids[:2]) != "The cat")
PYEOF
        fail "AutoTokenizer's text differs from malleus-sample's"
else
    echo "transformers does not import here: AutoTokenizer not checked"
fi
echo "$TAG: ok"
