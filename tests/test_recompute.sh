#!/bin/sh
# Activation recomputation (tests/test_recompute.c) on 4 ranks: `tiny` in
# one process with --recompute none, selective and full (bitwise the same
# losses and parameters, less activation memory each), then a two-stage
# pipeline of TP-2 stages with 8 micro-batches (several in flight on the
# first stage) in every mode and with a plan whose first stage is "full"
# and whose second keeps everything (from the start, and moved onto
# online half way from the same plan without modes): bitwise the losses
# and parameters of none on every rank, within 1e-4 of one process, and
# the activation memory each rank holds what the model promised before
# allocating; on
# the CPU backend, on cpu-opaque and on a GPU where one is usable.  Then
# malleus-train's memory check before allocating counts the mode: on 12
# MiB shared by the 4 ranks (3 MiB each), the TP-2 x PP-2 plan is refused
# without recomputation, naming the stage, its need and the limit
# (its first stage keeps 2 micro-batches in flight: 3227593 bytes), and
# fits with --recompute selective (3078601) and with the plan whose first
# stage is "full" (its second stage is then the largest, 2901449); a mode
# that is not one is refused naming the flag.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
fails=0
TRAIN="$top_builddir/malleus-train"
# the CPU backend; cpu-opaque (no code outside the backend may touch a
# device buffer: the shared one-layer buffer is carved, never read); the
# GPU where one is usable
devices="cpu cpu-opaque"
"$TRAIN" --device cuda --steps 0 --quiet >/dev/null 2>&1 && devices="$devices cuda"
for dev in $devices; do
    echo "device $dev:"
    MALLEUS_TEST_DEVICE=$dev sh "$top_srcdir/tests/mpirun.sh" 4 120 \
        "$top_builddir/tests/test_recompute" "$P/tp2pp2.json" "$P/tp2pp2_mixed.json" ||
        fails=$((fails + 1))
done

W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-test-recompute-XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT
run4() {
    MALLEUS_MEMORY_MB=12 sh "$top_srcdir/tests/mpirun.sh" 4 60 "$TRAIN" --model tiny \
        --global-batch 16 --steps 1 --threads 1 --quiet "$@" >"$W/out" 2>&1
}
run4 --plan "$P/tp2pp2.json"
rc=$?
pat='does not fit in memory: pipeline 0 stage 0 \(.*recompute none\) needs 3227593 bytes .* but a rank has 3145728 bytes'
if [ $rc -eq 2 ] && grep -Eq "$pat" "$W/out"; then
    echo "ok: 12 MiB, --recompute none: refused, naming the stage, the need and the limit"
else
    echo "FAIL: 12 MiB, --recompute none -> exit $rc, wanted 2 and /$pat/:"; cat "$W/out"
    fails=$((fails + 1))
fi
for args in "--plan $P/tp2pp2.json --recompute selective" "--plan $P/tp2pp2_mixed.json"; do
    # shellcheck disable=SC2086
    if run4 $args; then
        echo "ok: 12 MiB, $args: fits"
    else
        echo "FAIL: 12 MiB, $args -> exit $?, wanted 0:"; cat "$W/out"
        fails=$((fails + 1))
    fi
done
"$TRAIN" --recompute some --steps 1 >"$W/out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q -- "--recompute" "$W/out"; then
    echo "ok: --recompute some -> 2"
else
    echo "FAIL: --recompute some -> exit $rc, wanted 2 naming the flag:"; cat "$W/out"
    fails=$((fails + 1))
fi
echo "$fails failure(s)"
[ $fails -eq 0 ]
