#!/bin/sh
# Online re-plan and state migration on 8 ranks (tests/test_online.c).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
exec sh "$top_srcdir/tests/mpirun.sh" 8 240 "$top_builddir/tests/test_online"
