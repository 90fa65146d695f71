# shellcheck shell=sh
# Sourced by the tests that run the real Hugging Face library
# (tests/test_export_hf.sh, tests/test_import_hf.sh): finds transformers 4.44
# or newer (the first with the llama3 rotary scaling) and puts it on
# PYTHONPATH, or exits the test with 77 (skipped).  Needs TAG, PYTHON3 and top_srcdir.
#
# transformers is not packaged by Debian.  Tried in this order: a $PYTHON3
# that imports it; $MALLEUS_HF_SITE (default
# ${XDG_CACHE_HOME:-~/.cache}/malleus/hf-site-4.44), a directory of packages
# put on PYTHONPATH; or, unless MALLEUS_HF_INSTALL=0, an install there with
#   python3 -m pip install --no-deps --target DIR transformers==4.44.* \
#       tokenizers==0.19.* safetensors==0.4.* huggingface-hub==0.23.* \
#       tqdm filelock regex fsspec
# (the only way found to run transformers 4.44 on Debian's torch 1.13:
# without --no-deps pip would pull a newer torch).  Where that fails (no
# pip, no package index: CI) the test skips (tests/pip_site.sh: one
# bounded attempt, then every test skips at once for six hours).
"$PYTHON3" -c 'import torch, numpy' 2>/dev/null ||
    { echo "$TAG: skipped: $PYTHON3 cannot import torch and numpy"; exit 77; }
SITE=${MALLEUS_HF_SITE:-${XDG_CACHE_HOME:-$HOME/.cache}/malleus/hf-site-4.44}
has_hf() { # [DIR on PYTHONPATH]: transformers with the llama3 rotary scaling
    PYTHONPATH=${1:-}${1:+${PYTHONPATH:+:}}${PYTHONPATH:-} "$PYTHON3" -c \
        'from transformers import LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
assert "llama3" in ROPE_INIT_FUNCTIONS' >/dev/null 2>&1
}
if has_hf ""; then
    SITE=
elif ! has_hf "$SITE"; then
    . "$top_srcdir/tests/pip_site.sh"
    pip_site "$SITE" has_hf 'transformers==4.44.*' 'tokenizers==0.19.*' 'safetensors==0.4.*' \
        'huggingface-hub==0.23.*' tqdm filelock regex fsspec ||
        { echo "$TAG: skipped: $PIP_SITE_WHY"; exit 77; }
fi
[ -n "$SITE" ] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
