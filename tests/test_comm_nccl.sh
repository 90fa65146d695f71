#!/bin/sh
# tests/test_comm_nccl.sh: the NCCL data plane (tests/test_comm_nccl.c)
# against the MPI data plane.  One rank always (NCCL communicators of one
# rank: all a one-GPU machine can run); then, where there are two or more
# GPUs, one rank per GPU (at most 8).  77 without a GPU.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
prog="$top_builddir/tests/test_comm_nccl"
sh "$top_srcdir/tests/mpirun.sh" 1 120 "$prog"
rc=$?
[ $rc -eq 0 ] || exit $rc
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$n" -gt 8 ] && n=8
if [ "$n" -ge 2 ]; then
    sh "$top_srcdir/tests/mpirun.sh" "$n" 180 "$prog" || exit $?
else
    echo "one GPU: the multi-rank run needs two or more (NCCL refuses two ranks on one GPU)"
fi
exit 0
