#!/bin/sh
# Install every Debian package Malleus needs to build, test and benchmark.
# clang and libclang-rt-14-dev (libFuzzer, clang's sanitizer runtimes) are
# for `make fuzz`; gcc's AddressSanitizer and UBSan runtimes, which `make
# check-sanitize` uses, come with build-essential.
#
# Idempotent: packages already present are skipped by apt-get, and the package
# lists are refreshed only when a package is actually missing.  Must run as
# root (or through sudo).  Open MPI is never installed: its alternatives would
# silently replace MPICH's mpicc/mpiexec (docs/DEVELOPING.md, "MPI").
set -eu

PKGS="build-essential autoconf automake libtool pkg-config
      mpich libmpich-dev
      libhdf5-mpich-dev hdf5-tools
      liblpsolve55-dev lp-solve
      libopenblas-dev
      libjansson-dev
      slurm-wlm munge
      clang libclang-rt-14-dev
      python3 python3-numpy python3-h5py python3-matplotlib"

# PyTorch is only needed by the benchmarks (bench/); skip it with
# MALLEUS_NO_TORCH=1 to save a minute on machines that only run tests.
if [ "${MALLEUS_NO_TORCH:-0}" != 1 ]; then
    PKGS="$PKGS python3-torch"
fi

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo MALLEUS_NO_TORCH="${MALLEUS_NO_TORCH:-0}" sh "$0" "$@"
    fi
    echo "install-deps.sh: must run as root (or with sudo available)" >&2
    exit 1
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing="$missing $p"
    fi
done

if [ -n "$missing" ]; then
    echo "install-deps.sh: installing:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing
else
    echo "install-deps.sh: all packages present"
fi

# Refuse to continue if Open MPI sneaked in through some other package: it
# would take over mpicc and mpiexec.
if dpkg-query -W -f='${Status}\n' libopenmpi3 2>/dev/null | grep -q 'ok installed'; then
    echo "install-deps.sh: warning: Open MPI is installed; Malleus uses mpicc.mpich/mpiexec.mpich explicitly" >&2
fi
