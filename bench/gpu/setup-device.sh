#!/bin/sh
# On the GPU machine, first thing in a command: unpack the carried Debian
# packages (.gpu-debs/, made by bench/gpu/fetch-debs.sh) into / without
# replacing any file the image already has, add the link-time names that the
# -dev packages not carried would provide, refresh the linker cache, and
# print the toolchain.  Takes a few seconds.
set -eu
dir=$(cd "$(dirname "$0")" && pwd)
stage=/tmp/gpu-debs-root
rm -rf "$stage"
mkdir -p "$stage"
for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$stage"; done
cp -rn "$stage"/. / 2>/dev/null || true
lib=/usr/lib/x86_64-linux-gnu
# lp_solve's static library wants -lcolamd; MPICH's wrapper adds -lucp
# -lucs -lhwloc: their .so names come from -dev packages
for n in colamd ucp ucs hwloc; do
    [ -e "$lib/lib$n.so" ] || ln -s "$(cd "$lib" && ls "lib$n.so."[0-9]* | head -n1)" "$lib/lib$n.so"
done
# OpenBLAS's pkg-config file is chosen by Debian's alternatives, which
# dpkg-deb -x does not run
[ -e "$lib/pkgconfig/openblas.pc" ] ||
    ln -s "$lib/openblas-pthread/pkgconfig/openblas.pc" "$lib/pkgconfig/openblas.pc"
ldconfig
# every multi-rank stage starts with mpiexec.mpich: say here if it cannot run
mpiexec.mpich --version >/dev/null 2>&1 || {
    echo "setup-device: mpiexec.mpich does not run; missing libraries:" >&2
    ldd /usr/bin/mpiexec.mpich | grep 'not found' >&2
    exit 1
}
echo "setup-device: $(mpicc.mpich -v 2>&1 | head -1); hdf5-mpich $(pkg-config --modversion hdf5-mpich);" \
    "$(nvcc --version | tail -1); NCCL $(grep -m1 'define NCCL_VERSION_CODE' /usr/include/nccl.h |
        awk '{print $3}'); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
