#!/bin/sh
# tests/mpirun.sh: the one launcher for MPI tests.
#   sh tests/mpirun.sh NPROCS TIMEOUT_S PROGRAM [ARGS...]
# Runs PROGRAM on NPROCS MPICH ranks under a time limit, with one BLAS thread
# per rank (ranks share the cores).  Exit status: the program's (77 = skip
# passes through); 99 (hard error) when the time limit hits or the launcher
# cannot start.  MPIEXEC comes from the test environment (configure found
# it); MPICH's hydra runs as root without any extra flag.

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

echo "mpirun.sh: timeout -k 5 $limit $MPIEXEC -n $nprocs $*"
timeout -k 5 "$limit" "$MPIEXEC" -n "$nprocs" "$@"
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
