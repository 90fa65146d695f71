#!/bin/sh
# Reshard matrix, part 2 (tests/test_reshard.c on 8 ranks): removing
# suspended ranks, world size 8 -> 6 and 4 -> 8, 8 -> 1, and a flipped byte
# in a shard file refused by resume and reshard alike (file and tensor
# named on every rank, nothing loaded or committed).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-reshard-b.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
run() { d="$W/$1"; shift; mkdir -p "$d" && sh "$top_srcdir/tests/mpirun.sh" 8 60 "$top_builddir/tests/test_reshard" "$d" "$@"; }
fails=0
run 1 "$P/suspended.json" "$P/uneven_stages.json" || fails=$((fails + 1))  # unsuspend ranks 6, 7
run 2 "$P/mixed_tp.json" "$P/six.json" "$P/one.json" || fails=$((fails + 1))  # 8 -> 6, 8 -> 1
run 3 "$P/four.json" "$P/uneven_stages.json" || fails=$((fails + 1))       # 4 -> 8
mkdir -p "$W/4" && sh "$top_srcdir/tests/mpirun.sh" 8 60 "$top_builddir/tests/test_reshard" --corrupt "$W/4" "$P/mixed_tp.json" || fails=$((fails + 1))
[ $fails -eq 0 ]
