#!/bin/sh
# tests/test_comm.sh: the MPI communication backend test (tests/test_comm.c)
# on 8 ranks with a 60 s limit, through the common MPI launcher.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
exec sh "$top_srcdir/tests/mpirun.sh" 8 60 "$top_builddir/tests/test_comm"
