#!/bin/sh
# Reshard matrix, part 1 (tests/test_reshard.c on 8 ranks): uniform <->
# non-uniform, TP 1 -> 4 and TP 4 -> 1, a stage-count change, adding
# suspended ranks; tiny-llama3 (key/value heads replicated on TP 4 and 8,
# split on TP 2; the tied embedding on two stages; a vocabulary of 259
# split unevenly) from mixed TP sizes to four stages and to TP 8.  Every
# pair: state bit for bit, the loaded shards bit for bit, the resumed loss
# curve within 1e-4; every source resumes on its own plan bit for bit.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-reshard-a.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
run() { d="$W/$1"; shift; mkdir -p "$d" && sh "$top_srcdir/tests/mpirun.sh" 8 60 "$top_builddir/tests/test_reshard" $M "$d" "$@"; }
M=
fails=0
run 1 "$P/pp4dp2.json" "$P/mixed_tp.json" || fails=$((fails + 1))         # uniform -> non-uniform
run 2 "$P/uneven_stages.json" "$P/pp4dp2.json" || fails=$((fails + 1))    # non-uniform -> uniform, stages 2/2/3 -> 4
run 3 "$P/tp4dp2.json" "$P/dp8.json" "$P/suspended.json" || fails=$((fails + 1))  # TP 4 -> 1; suspend 2 ranks
run 4 "$P/dp8.json" "$P/tp4dp2.json" || fails=$((fails + 1))             # TP 1 -> 4
M="--model tiny-llama3"
run 5 "$P/mixed_tp.json" "$P/pp4dp2.json" "$P/tp8.json" || fails=$((fails + 1))  # GQA, tied, vocab 259
[ $fails -eq 0 ]
