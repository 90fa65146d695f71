#!/bin/sh
# The multi-rank suite on the cpu-opaque kernel backend, part 1: its device
# buffers fault on any host access, and it reports them as not
# host-addressable, so every consumer - TP all-reduce, pipeline sends,
# gradient sync over member lists, snapshots, resume and reshard into a live
# trainer - must take the kernel table and the staged data plane, as with a
# GPU.  The shortest configurations that still take every path:
#  - two plans of test_parallel (mixed TP sizes in one pipeline; unequal
#    micro-batches with suspended ranks, its gradient sum in a bucket per
#    layer: many staged non-blocking reductions in flight) against the
#    one-process run, and tiny-llama3 on the mixed plan (the
#    vocabulary-parallel embedding and cross-entropy's exchange, replicated
#    key/value heads, the tied embedding's stage sum);
#  - test_reshard: snapshot, exact resume, reshard uniform -> mixed TP and
#    resume on it (every loaded shard checked bit for bit);
#  - malleus-train --device cpu-opaque on 8 ranks: a background snapshot
#    (--snapshot-async: staged device -> pinned host through the kernel
#    table) and a final one, then resume.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
MALLEUS_TEST_DEVICE=cpu-opaque
export MALLEUS_TEST_DEVICE
P="$top_srcdir/tests/plans"
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-opaque-a.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
run() { sh "$top_srcdir/tests/mpirun.sh" 8 120 "$@" || exit $?; }

run "$top_builddir/tests/test_parallel" "$P/mixed_tp.json" --dp-bucket-mb 0 "$P/suspended.json" \
    --dp-bucket-mb 25 --model tiny-llama3 "$P/mixed_tp.json"
mkdir -p "$W/reshard"
run "$top_builddir/tests/test_reshard" "$W/reshard" "$P/pp4dp2.json" "$P/mixed_tp.json"

T="$top_builddir/malleus-train"
run "$T" --device cpu-opaque --model tiny --steps 2 --global-batch 16 --micro-batch 2 \
    --dp 2 --tp 2 --pp 2 --snapshot-dir "$W/snap" --metrics "$W/m.jsonl" \
    --snapshot-every 1 --snapshot-async >"$W/out" 2>&1
grep -Eq '^\| kernels / comm +\| cpu-opaque \(fp32\) +/ mpi' "$W/out" ||
    { cat "$W/out"; echo "FAIL: the start-up table does not show cpu-opaque / mpi"; exit 1; }
grep -q 'written in the background: .*step_00000001' "$W/out" ||
    { cat "$W/out"; echo "FAIL: no background snapshot on cpu-opaque"; exit 1; }
run "$T" --device cpu-opaque --model tiny --steps 3 --override steps --global-batch 16 --micro-batch 2 \
    --dp 2 --tp 2 --pp 2 --snapshot-dir "$W/snap" --metrics "$W/m.jsonl" --resume >"$W/out" 2>&1
grep -q 'resumed from' "$W/out" && grep -q 'step 3/3' "$W/out" ||
    { cat "$W/out"; echo "FAIL: malleus-train --device cpu-opaque did not resume"; exit 1; }
echo "PASS: the multi-rank suite (part 1) on cpu-opaque"
