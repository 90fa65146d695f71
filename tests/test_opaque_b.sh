#!/bin/sh
# The multi-rank suite on the cpu-opaque kernel backend, part 2 (see
# tests/test_opaque_a.sh for why): online migration - test_online (an
# injected straggler, two plan changes, replica checks after each) and
# test_online_reshard for a change of every part (strided pieces through
# the staging area) and for one where most ranks hand their state buffers
# over.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
MALLEUS_TEST_DEVICE=cpu-opaque
export MALLEUS_TEST_DEVICE
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-opaque-b.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
run() { sh "$top_srcdir/tests/mpirun.sh" 8 180 "$@" || exit $?; }

run "$top_builddir/tests/test_online"
for plan in mixed_tp keep_extend; do
    mkdir -p "$W/$plan"
    run "$top_builddir/tests/test_online_reshard" "$top_srcdir/tests/plans/$plan.json" "$W/$plan"
done
echo "PASS: the multi-rank suite (part 2) on cpu-opaque"
