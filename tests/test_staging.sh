#!/bin/sh
# The staged MPI data plane on cpu-opaque (tests/test_staging.c): pinned
# staging buffers pooled (no pinning after the first steps), and the TP
# time reported by the data plane, on 4 ranks under tests/plans/four.json.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
exec sh "$top_srcdir/tests/mpirun.sh" 4 120 "$top_builddir/tests/test_staging" \
    "$top_srcdir/tests/plans/four.json"
