#!/bin/sh
# Online plan change == offline reshard, bit for bit (tests/test_online_reshard.c),
# for a change of every part (mixed TP sizes) and for one that keeps or
# extends most ranks' parts (those hand their state buffers over); for
# tiny and tiny-llama3.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
W=$(mktemp -d /tmp/malleus-test-online-reshard-XXXXXX)
trap 'rm -rf "$W"' EXIT
for plan in mixed_tp keep_extend; do
    mkdir -p "$W/$plan"
    sh "$top_srcdir/tests/mpirun.sh" 8 180 "$top_builddir/tests/test_online_reshard" \
        "$top_srcdir/tests/plans/$plan.json" "$W/$plan" || exit $?
done
# the same with grouped-query attention (key/value heads split at TP 2,
# replicated at TP 4), a tied embedding and a vocabulary of 259
for plan in mixed_tp keep_extend; do
    mkdir -p "$W/gqa-$plan"
    sh "$top_srcdir/tests/mpirun.sh" 8 180 "$top_builddir/tests/test_online_reshard" \
        --model tiny-llama3 "$top_srcdir/tests/plans/$plan.json" "$W/gqa-$plan" || exit $?
done
