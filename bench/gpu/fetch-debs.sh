#!/bin/sh
# On the development machine (Debian 12), in the checkout's root: download
# the packages of bench/gpu/debs.txt into .gpu-debs/ (git-ignored), with
# setup-device.sh beside them, so that this one folder carries to the GPU
# machine everything Malleus needs that its image lacks (~35 MB).  Name
# .gpu-debs in the carry list of the command that runs bench/gpu/run.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-.gpu-debs}
mkdir -p "$dest"
cp "$here/setup-device.sh" "$dest/"
pkgs=$(grep -v '^#' "$here/debs.txt" | tr '\n' ' ')
# shellcheck disable=SC2086
(cd "$dest" && apt-get download $pkgs 2>&1 | grep -v 'Download is performed unsandboxed' || true)
# The attention kernels of before the row-major / cp.async / ldmatrix
# version, for run.sh's attcmp stage (kernel_bench_prev times both on the
# same inputs); ATTN_PREV_REV overrides the revision.
rev=${ATTN_PREV_REV:-cdb85ccfa82e85c244ad88bf2714c086661571ff}
if git -C "$here" show "$rev:kernels/cuda/attention.cu" >"$dest/attention_prev.cu.tmp" 2>/dev/null; then
    mv "$dest/attention_prev.cu.tmp" "$dest/attention_prev.cu"
    echo "fetch-debs: $dest/attention_prev.cu from $rev"
else
    rm -f "$dest/attention_prev.cu.tmp"
    echo "fetch-debs: no git revision $rev here: run.sh's attcmp stage will not run" >&2
fi
# cuDNN's headers (NVIDIA's: they travel in this ignored folder only) for
# the GPU machine, whose cuDNN wheel may come without them: run.sh passes
# CUDNN_CFLAGS=-I$dest/cudnn-include to configure when it has no others.
cudnn_inc=${CUDNN_INCLUDE:-/usr/local/cuda/include}
if ls "$cudnn_inc"/cudnn*.h >/dev/null 2>&1; then
    mkdir -p "$dest/cudnn-include"
    cp "$cudnn_inc"/cudnn*.h "$dest/cudnn-include/"
    echo "fetch-debs: cuDNN headers from $cudnn_inc -> $dest/cudnn-include"
else
    echo "fetch-debs: no cudnn*.h in $cudnn_inc: the GPU machine must have its own cuDNN headers" >&2
fi
n=$(find "$dest" -name '*.deb' | wc -l)
echo "fetch-debs: $n packages in $dest ($(du -sh "$dest" | cut -f1)); on the GPU machine: sh $dest/setup-device.sh"
