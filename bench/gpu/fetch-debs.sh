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
n=$(find "$dest" -name '*.deb' | wc -l)
echo "fetch-debs: $n packages in $dest ($(du -sh "$dest" | cut -f1)); on the GPU machine: sh $dest/setup-device.sh"
