#!/bin/sh
# Six plans on 8 ranks train the same `tiny` model as one process
# (tests/test_parallel.c): uniform DP, uniform TP, uniform PP, mixed TP sizes
# inside one pipeline, pipelines with different stage counts and layer
# splits, and unequal micro-batches with suspended ranks.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
exec sh "$top_srcdir/tests/mpirun.sh" 8 240 "$top_builddir/tests/test_parallel" \
    "$P/dp8.json" "$P/tp8.json" "$P/pp4dp2.json" "$P/mixed_tp.json" \
    "$P/uneven_stages.json" "$P/suspended.json"
