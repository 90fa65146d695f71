#!/bin/sh
# tests/mpirun.sh: the one launcher for MPI tests.
#   sh tests/mpirun.sh NPROCS TIMEOUT_S PROGRAM [ARGS...]
# Runs PROGRAM on NPROCS MPICH ranks under a time limit, with one BLAS thread
# per rank (ranks share the cores).  Exit status: the program's (77 = skip
# passes through); 99 (hard error) when the time limit hits or the launcher
# cannot start.  MPIEXEC comes from the test environment (configure found
# it); MPICH's hydra runs as root without any extra flag.  Open MPI's
# launcher needs --oversubscribe for more ranks than cores (the tests run 8
# ranks on any machine) and, as root, --allow-run-as-root; and a session
# directory of its own (two launchers starting at once race to create the
# shared one in /tmp, and one fails: seen with make check -j2).

if [ $# -lt 3 ]; then
    echo "usage: $0 NPROCS TIMEOUT_S PROGRAM [ARGS...]" >&2
    exit 99
fi
nprocs=$1
limit=$2
shift 2
: "${MPIEXEC:=mpiexec.mpich}"
OPENBLAS_NUM_THREADS=1
export OPENBLAS_NUM_THREADS

flags=""
session=""
case $("$MPIEXEC" --version 2>&1 | head -3) in
*"Open MPI"* | *OpenRTE*)
    flags="--oversubscribe"
    [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
    session=$(mktemp -d "${TMPDIR:-/tmp}/malleus-ompi-XXXXXX") || exit 99
    trap 'rm -rf "$session"' EXIT
    # Open MPI 4 (ORTE) and 5 (PRRTE) name the base differently
    OMPI_MCA_orte_tmpdir_base=$session
    PRTE_MCA_prte_tmpdir_base=$session
    export OMPI_MCA_orte_tmpdir_base PRTE_MCA_prte_tmpdir_base
    ;;
esac
echo "mpirun.sh: timeout -k 5 $limit $MPIEXEC${flags:+ $flags} -n $nprocs $*"
# shellcheck disable=SC2086
timeout -k 5 "$limit" "$MPIEXEC" $flags -n "$nprocs" "$@"
rc=$?
case $rc in
124 | 137)
    echo "mpirun.sh: $1 on $nprocs ranks did not finish within ${limit} s (killed)" >&2
    exit 99
    ;;
126 | 127)
    echo "mpirun.sh: could not run '$MPIEXEC' (status $rc): install MPICH or set MPIEXEC" >&2
    exit 99
    ;;
esac
exit $rc
