#!/bin/sh
# Six plans on 8 ranks train the same `tiny` model as one process
# (tests/test_parallel.c): uniform DP, uniform TP, uniform PP, mixed TP sizes
# inside one pipeline, pipelines with different stage counts and layer
# splits, and unequal micro-batches with suspended ranks -- all with the
# data-parallel gradient sum overlapped with the backward pass (the
# default); then mixed TP (several replica holder sets) again with the sum
# after the backward pass (--dp-overlap off, the reference path) and with a
# bucket per layer (--dp-bucket-mb 0: many buckets in flight at once).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
exec sh "$top_srcdir/tests/mpirun.sh" 8 240 "$top_builddir/tests/test_parallel" \
    "$P/dp8.json" "$P/tp8.json" "$P/pp4dp2.json" "$P/mixed_tp.json" \
    "$P/uneven_stages.json" "$P/suspended.json" \
    --dp-overlap off "$P/mixed_tp.json" --dp-overlap on --dp-bucket-mb 0 "$P/mixed_tp.json"
