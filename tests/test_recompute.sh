#!/bin/sh
# Activation recomputation (tests/test_recompute.c) on 4 ranks: `tiny` in
# one process with --recompute none, selective and full (bitwise the same
# losses and parameters, less activation memory each), then a two-stage
# pipeline of TP-2 stages with 8 micro-batches (several in flight on the
# first stage) in every mode and with a plan whose first stage is "full"
# and whose second keeps everything: bitwise the losses and parameters of
# none on every rank, within 1e-4 of one process, and the activation
# memory each rank holds what the model promised before allocating.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
exec sh "$top_srcdir/tests/mpirun.sh" 4 120 "$top_builddir/tests/test_recompute" \
    "$P/tp2pp2.json" "$P/tp2pp2_mixed.json"
