#!/bin/sh
# tests/openmpi-build.sh: the helper of `make check-openmpi`, which builds
# this tree against Open MPI and runs the multi-rank part of the suite that
# exercises MPI most (the MPI backend, six plans on 8 ranks, snapshot and
# reshard round trips) -- so that portability to a second MPI is checked,
# not hoped.
#
#   sh tests/openmpi-build.sh DIR
#
# DIR/src is a copy of the distributed sources (make variant-src).  Open MPI
# and its parallel HDF5 come from Debian's packages, downloaded (apt-get
# download: no installation) and unpacked with dpkg -x into DIR/root, a
# private prefix that nothing else sees: installed the ordinary way, Open
# MPI's alternatives would take over mpicc and mpiexec from MPICH for
# everything on the machine.  DIR/build is configured from DIR/src with
# MPICC naming that prefix's mpicc.openmpi and HDF5_CFLAGS/HDF5_LIBS its
# HDF5 (the way a module system hands them over), CUDA off.
#
# Environment: OMPI_TESTS (the tests run), OMPI_CHECK_PROGRAMS (what they
# need built), OMPI_PACKAGES (the packages unpacked).
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 99; }
dir=$(cd "$1" && pwd)
[ -x "$dir/src/configure" ] || { echo "$0: $dir/src is not a source copy (make variant-src)" >&2; exit 99; }
root=$dir/root
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
: "${OMPI_PACKAGES:=openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 \
libevent-pthreads-2.1-7 libfabric1 libpsm2-2 libpsm-infinipath1 libhwloc-plugins libxnvctrl0 \
libhdf5-openmpi-103-1 libhdf5-openmpi-dev}"
: "${OMPI_TESTS:=tests/test_comm.sh tests/test_parallel.sh tests/test_reshard_a.sh}"
: "${OMPI_CHECK_PROGRAMS:=tests/test_comm tests/test_parallel tests/test_reshard}"

# 1. Open MPI in the private prefix (once)
if [ ! -x "$root/usr/bin/mpicc.openmpi" ]; then
    command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
        { echo "$0: needs Debian's apt-get and dpkg to fetch Open MPI" >&2; exit 2; }
    rm -rf "$dir/debs" "$root"
    mkdir -p "$dir/debs" "$root"
    # apt's download user must be able to write there; the files are ours
    chmod 777 "$dir/debs"
    echo "openmpi-build: downloading $OMPI_PACKAGES"
    # shellcheck disable=SC2086
    fetch() { (cd "$dir/debs" && apt-get download $OMPI_PACKAGES) >"$dir/download.log" 2>&1; }
    # package lists that are missing or stale: refreshed once (as root)
    fetch || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null 2>&1 && fetch; } ||
        { cat "$dir/download.log" >&2; echo "$0: apt-get download failed (apt-get update first?)" >&2; exit 1; }
    for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$root"; done
fi

# 2. its environment: relocated (OPAL_PREFIX), its libraries found, no
# noise from the transports this machine lacks (shared memory only), and
# root allowed where CI runs as root
OPAL_PREFIX=$root/usr
LD_LIBRARY_PATH=$root/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OMPI_MCA_pml=ob1
OMPI_MCA_btl=self,vader
OMPI_MCA_mca_base_component_show_load_errors=0
PMIX_MCA_pcompress_base_silence_warning=1
export OPAL_PREFIX LD_LIBRARY_PATH OMPI_MCA_pml OMPI_MCA_btl \
    OMPI_MCA_mca_base_component_show_load_errors PMIX_MCA_pcompress_base_silence_warning
mpicc=$root/usr/bin/mpicc.openmpi
"$root/usr/bin/mpiexec.openmpi" --version | head -1

# 3. configure (unless it already is) and build
h5inc=$root/usr/include/hdf5/openmpi
h5lib=$root/usr/lib/$arch/hdf5/openmpi
settings="MPICC=$mpicc HDF5=$h5inc $h5lib"
if ! [ -f "$dir/build/config.status" ] || [ "$(cat "$dir/build/openmpi.settings" 2>/dev/null)" != "$settings" ]; then
    rm -rf "$dir/build"
    mkdir -p "$dir/build"
    echo "openmpi-build: configuring $dir/build: $settings"
    (cd "$dir/build" && ../src/configure -q MPICC="$mpicc" HDF5_CFLAGS="-I$h5inc" \
        HDF5_LIBS="-L$h5lib -lhdf5 -Wl,-rpath,$h5lib -Wl,-rpath,$root/usr/lib/$arch" \
        --without-cuda --without-nccl) ||
        { echo "$0: configure of $dir/build failed: see $dir/build/config.log" >&2; exit 1; }
    printf '%s\n' "$settings" >"$dir/build/openmpi.settings"
fi
cd "$dir/build"
grep -E '^  (C compiler|mpiexec|parallel HDF5)' config.log 2>/dev/null || true
make -j"$(nproc)" >/dev/null
# the binaries use Open MPI's libraries and this prefix's HDF5, nothing of MPICH's
if ldd malleus-train | grep -q mpich; then
    ldd malleus-train | grep -E 'mpi|hdf5' >&2
    echo "$0: malleus-train links MPICH's libraries" >&2
    exit 1
fi
ldd malleus-train | grep -E 'libmpi\.so|hdf5' | sed 's/^/openmpi-build: /'

# 4. the subset
make -j"$(nproc)" check TESTS="$OMPI_TESTS" check_PROGRAMS="$OMPI_CHECK_PROGRAMS"
