#!/bin/sh
# Six plans on 8 ranks train the same `tiny` model as one process
# (tests/test_parallel.c): uniform DP, uniform TP, uniform PP, mixed TP sizes
# inside one pipeline, pipelines with different stage counts and layer
# splits, and unequal micro-batches with suspended ranks -- all with the
# data-parallel gradient sum overlapped with the backward pass (the
# default); then mixed TP (several replica holder sets) again with the sum
# after the backward pass (--dp-overlap off, the reference path) and with a
# bucket per layer (--dp-bucket-mb 0: many buckets in flight at once).
# Then `tiny-llama3` (grouped-query attention with 2 key/value heads for 8
# query heads, tied embeddings, a vocabulary of 259 that no TP size
# divides) under the same plans: TP 8 (each key/value head replicated on 4
# ranks), mixed TP sizes 4, 2, 1 in one pipeline (the key/value heads
# replicated on the TP-4 stage, split on the TP-2 stage; the tied
# embedding on a TP-4 first stage and a TP-1 last stage), four stages;
# and a model whose 6 key/value heads a TP-4 group neither splits nor
# replicates whole (tests/models/gqa_straddle.json: a rank's query heads
# straddle two key/value heads) under the mixed TP plan.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
exec sh "$top_srcdir/tests/mpirun.sh" 8 300 "$top_builddir/tests/test_parallel" \
    "$P/dp8.json" "$P/tp8.json" "$P/pp4dp2.json" "$P/mixed_tp.json" \
    "$P/uneven_stages.json" "$P/suspended.json" \
    --dp-overlap off "$P/mixed_tp.json" --dp-overlap on --dp-bucket-mb 0 "$P/mixed_tp.json" \
    --dp-bucket-mb 25 --model tiny-llama3 "$P/dp8.json" "$P/tp8.json" "$P/mixed_tp.json" \
    "$P/pp4dp2.json" "$P/uneven_stages.json" --dp-overlap off "$P/mixed_tp.json" \
    --dp-overlap on --model "$top_srcdir/tests/models/gqa_straddle.json" "$P/mixed_tp.json" \
    "$P/tp4dp2.json"
