#!/bin/sh
# Online plan change == offline reshard, bit for bit (tests/test_online_reshard.c).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
W=$(mktemp -d /tmp/malleus-test-online-reshard-XXXXXX)
trap 'rm -rf "$W"' EXIT
sh "$top_srcdir/tests/mpirun.sh" 8 180 "$top_builddir/tests/test_online_reshard" \
    "$top_srcdir/tests/plans/mixed_tp.json" "$W"
