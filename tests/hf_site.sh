# shellcheck shell=sh
# Sourced by the tests that run the real Hugging Face library
# (tests/test_export_hf.sh, tests/test_import_hf.sh): finds transformers 4.44
# or newer (the first with the llama3 rotary scaling) and puts it on
# PYTHONPATH, or exits the test with 77 (skipped).  Needs TAG and PYTHON3.
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
# pip, no package index: CI) the test skips.
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
    [ "${MALLEUS_HF_INSTALL:-1}" != 0 ] ||
        { echo "$TAG: skipped: no transformers and MALLEUS_HF_INSTALL=0"; exit 77; }
    "$PYTHON3" -m pip --version >/dev/null 2>&1 ||
        { echo "$TAG: skipped: no transformers and no pip to install it"; exit 77; }
    mkdir -p "$(dirname "$SITE")" 2>/dev/null ||
        { echo "$TAG: skipped: cannot create $(dirname "$SITE")"; exit 77; }
    # Installed beside the target and renamed, so a concurrent run or an
    # interrupted install never leaves a half-filled directory in use.
    TMPSITE=$(mktemp -d "$SITE.tmp.XXXXXX") || exit 77
    echo "$TAG: installing transformers 4.44 into $SITE (pip --target, --no-deps)"
    timeout 300 "$PYTHON3" -m pip install -q --disable-pip-version-check --no-deps \
        --timeout 15 --retries 1 --target "$TMPSITE" 'transformers==4.44.*' \
        'tokenizers==0.19.*' 'safetensors==0.4.*' 'huggingface-hub==0.23.*' tqdm filelock \
        regex fsspec >"$TMPSITE.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || ! has_hf "$TMPSITE"; then
        tail -n 3 "$TMPSITE.log"
        rm -rf "$TMPSITE" "$TMPSITE.log"
        echo "$TAG: skipped: transformers cannot be installed here (pip exit $rc)"
        exit 77
    fi
    rm -f "$TMPSITE.log"
    mv -T "$TMPSITE" "$SITE" 2>/dev/null || rm -rf "$TMPSITE" # another run won: use its copy
    has_hf "$SITE" || { echo "$TAG: skipped: $SITE does not import transformers"; exit 77; }
fi
[ -n "$SITE" ] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
