#!/bin/sh
# Model configs whose sizes overflow or cannot fit: every size is bounded
# with a message naming the field, and a model too large for a rank's share
# of the machine's memory is refused before anything is allocated, with exit
# status 2 and the numbers (needed vs available).  Before this, a config
# whose sizes wrapped wrote past a heap buffer, n_layers 100000000 grew to
# 13 GB and hung, and d_model 1000000000 was refused with a wrapped byte
# count and status 1.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
: "${MPIEXEC:=mpiexec.mpich}"
W=$(mktemp -d /tmp/malleus-test-limits-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0
# A regression must fail here, not take the machine's memory: cap the
# address space (not under AddressSanitizer, which reserves terabytes).
[ -n "${ASAN_OPTIONS:-}" ] || ulimit -v 8000000

# expect CODE PATTERN CMD...: exit status CODE and PATTERN (grep -E) in the
# output, within 60 s.
expect() {
    code=$1 pat=$2
    shift 2
    timeout 60 "$@" >"$W/out" 2>&1
    rc=$?
    if [ $rc -eq "$code" ] && grep -Eq -- "$pat" "$W/out"; then
        echo "ok: exit $rc: $(grep -E -- "$pat" "$W/out" | head -1 | cut -c1-200)"
    else
        echo "FAIL: $* -> exit $rc, wanted $code and /$pat/:"
        tail -5 "$W/out"
        fails=$((fails + 1))
    fi
}

cfg() { # NAME VOCAB D_MODEL N_LAYERS N_HEADS FFN SEQ
    printf '{"vocab": %s, "d_model": %s, "n_layers": %s, "n_heads": %s, "ffn_hidden": %s, "seq_len": %s}\n' \
        "$2" "$3" "$4" "$5" "$6" "$7" >"$W/$1.json"
}
cfg wrap 256 1073741824 1 1 1431655764 1 # sizes that wrapped a size_t
cfg layers 256 64 100000000 8 128 32     # hung at 13 GB building tables
cfg dmodel 256 1000000000 4 8 128 32     # refused with a wrapped count
cfg ffn 256 64 4 8 2000000 32
cfg seq 256 64 4 8 128 2000000
cfg heads 256 64 4 128 128 32
cfg vocab 2000000 64 4 8 128 32
cfg huge 256 65536 64 64 262144 32       # within the bounds: 64 TiB of state
cfg attn 256 131072 1 65536 128 1048576  # attention scores overflow 64 bits
TRAIN="$B/malleus-train --steps 1 --global-batch 1 --micro-batch 1 --quiet"

expect 2 'd_model must be in \[1, 131072\] \(got 1073741824\)' $TRAIN --model "$W/wrap.json"
expect 2 'n_layers must be in \[1, 65536\] \(got 100000000\)' $TRAIN --model "$W/layers.json"
expect 2 'd_model must be in \[1, 131072\] \(got 1000000000\)' $TRAIN --model "$W/dmodel.json"
expect 2 'ffn_hidden must be in \[1, 1048576\]' $TRAIN --model "$W/ffn.json"
expect 2 'seq_len must be in \[1, 1048576\]' $TRAIN --model "$W/seq.json"
expect 2 'n_heads must be in \[1, 64\]' $TRAIN --model "$W/heads.json"
expect 2 'vocab must be in \[1, 1048576\]' $TRAIN --model "$W/vocab.json"
expect 2 'does not fit in memory: .* needs [0-9]+ bytes .* but a rank has [0-9]+ bytes' \
    $TRAIN --model "$W/huge.json"
expect 2 'overflow' "$B/malleus-train" --steps 1 --global-batch 64 --micro-batch 64 --model "$W/attn.json"
expect 2 'profile: one layer of model .* needs [0-9]+ bytes' \
    "$B/malleus-train" --model "$W/huge.json" --profile "$W/prof.json"
[ -e "$W/prof.json" ] && { echo "FAIL: a refused --profile wrote its file"; fails=$((fails + 1)); }
# The per-rank share: model small (about 770 MiB with micro-batch 4) fits
# one rank of a 1000 MiB machine but not two ranks sharing it.
export MALLEUS_MEMORY_MB=1000
"$B/malleus-train" --model small --steps 1 --global-batch 8 \
    --micro-batch 4 --quiet >"$W/out" 2>&1 || { cat "$W/out"; echo "FAIL: small on one rank"; fails=$((fails + 1)); }
expect 2 'shared by 2 ranks on a node' \
    "$MPIEXEC" -n 2 "$B/malleus-train" --model small --dp 2 --steps 1 --global-batch 8 \
    --micro-batch 4 --quiet
# Generated tokens (--data synthetic:V) are not held: they fit (the check
# once counted their unbounded stream as SIZE_MAX bytes and refused every
# synthetic run on CPUs).  --snapshot-async's staging copy of the
# parameters and Adam moments (~300 MiB for small) is held: it does not.
"$B/malleus-train" --model small --data synthetic:256 --steps 1 --global-batch 8 \
    --micro-batch 4 --quiet >"$W/out" 2>&1 ||
    { cat "$W/out"; echo "FAIL: small on synthetic data"; fails=$((fails + 1)); }
expect 2 'does not fit in memory: .*snapshot-async' "$B/malleus-train" --model small --steps 1 \
    --global-batch 8 --micro-batch 4 --quiet --snapshot-dir "$W/snap" --snapshot-async
unset MALLEUS_MEMORY_MB

echo "$fails failure(s)"
[ $fails -eq 0 ]
