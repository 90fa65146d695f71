#!/bin/sh
# tests/test_comm_threads.sh: the control plane from two threads at once
# (tests/test_comm_threads.c) on 4 ranks with a 60 s limit.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
exec sh "$top_srcdir/tests/mpirun.sh" 4 60 "$top_builddir/tests/test_comm_threads"
