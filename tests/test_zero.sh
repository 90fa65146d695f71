#!/bin/sh
# The sharded optimizer (--zero 1, tests/test_zero.c) on 4 ranks: a TP-2
# replica beside a two-stage pipeline (tests/plans/four.json: holder sets
# of 3 and 2 ranks), `tiny` and `tiny-llama3` (grouped-query attention,
# tied embeddings on two stages), the reduce-scatter in the buckets of the
# overlapped sum (default size, and a bucket per layer: many regions) and
# after the backward pass, and (tiny-llama3) moved online half way onto
# another plan (tests/plans/four_moved.json: the moments made whole, moved,
# shared out again): the same losses and parameters as one process and
# bitwise those of --zero 0, each Adam moment kept once, each rank's peak
# memory lower by (at least 0.9 x) the moments it saves; and three
# replicas (tests/plans/three_replicas.json: holder sets of 3 ranks over
# the ring, within 1e-4 of one process, the moments a third).  Then
# malleus-train: a --zero other than 0 or 1 is refused before anything is
# written (exit 2, naming the flag); a one-process run
# reports its moments in the memory summary, and the memory check before
# allocating counts the sharded moments (a plan refused with --zero 0
# fits with --zero 1); without --zero, a plan with replicas is sharded and
# one process is not.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
P="$top_srcdir/tests/plans"
sh "$top_srcdir/tests/mpirun.sh" 4 120 "$top_builddir/tests/test_zero" \
    "$P/four.json" --dp-overlap off "$P/four.json" --dp-overlap on --dp-bucket-mb 0 \
    "$P/four.json" --dp-bucket-mb 25 --bitwise off "$P/three_replicas.json" --bitwise on \
    --model tiny-llama3 --change "$P/four_moved.json" "$P/four.json" || exit 1

TRAIN="$top_builddir/malleus-train"
W=$(mktemp -d /tmp/malleus-test-zero-XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
run="--model tiny --steps 2 --global-batch 4 --micro-batch 2 --threads 1 --zero 1"
# expect PATTERN ARGS...: exit 2, PATTERN in stderr, nothing written
expect() {
    pat=$1; shift
    "$TRAIN" $run "$@" >"$W/out" 2>"$W/err"; rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pat" "$W/err" && [ ! -e "$W/snap" ]; then
        echo "ok: --zero 1 $* -> 2: $(head -1 "$W/err")"
    else
        echo "FAIL: --zero 1 $* -> exit $rc, wanted 2 and /$pat/:"; cat "$W/err"
        fails=$((fails + 1))
    fi
}
expect "--zero expects an integer in \[0, 1\]" --zero 2 --snapshot-dir "$W/snap"
# 1 MiB x 1.5 of moments: tiny's 197184 parameters x 2 x 4 bytes
"$TRAIN" $run >"$W/out" 2>&1 || { cat "$W/out"; echo "FAIL: --zero 1 run"; exit 1; }
grep -q 'moments 1.50' "$W/out" && grep -q 'sharded over the holders' "$W/out" ||
    { cat "$W/out"; echo "FAIL: --zero 1 run: no moments in the summary"; fails=$((fails + 1)); }
# The memory check before allocating counts a rank's share of the moments:
# on four.json rank 2 needs 4981705 bytes whole, 4587121 sharded (the sums of
# its regions stay in the buckets, 0.4 MiB counted with the communication
# buffers), and 18 MiB over the 4 ranks of this machine leaves each 4718592.
for z in 0 1; do
    MALLEUS_MEMORY_MB=18 sh "$top_srcdir/tests/mpirun.sh" 4 60 "$TRAIN" --model tiny \
        --plan "$P/four.json" --global-batch 16 --steps 1 --threads 1 --zero $z \
        >"$W/out" 2>&1
    rc=$?
    want=$((2 - 2 * z))
    if [ $rc -eq $want ] && { [ $z = 1 ] || grep -q "does not fit in memory" "$W/out"; }; then
        echo "ok: 4 ranks, 18 MiB, --zero $z -> $rc"
    else
        echo "FAIL: 4 ranks, 18 MiB, --zero $z -> exit $rc, wanted $want:"; cat "$W/out"
        fails=$((fails + 1))
    fi
done
# The default: sharded where the plan has replicas (four.json: two
# pipelines), whole where it has none (one process).
sh "$top_srcdir/tests/mpirun.sh" 4 60 "$TRAIN" --model tiny --plan "$P/four.json" \
    --global-batch 16 --steps 1 --threads 1 >"$W/out" 2>&1 &&
    grep -q 'sharded over the holders' "$W/out" &&
    "$TRAIN" --model tiny --steps 1 --global-batch 4 --micro-batch 2 --threads 1 >"$W/out1" 2>&1 &&
    grep -q 'whole on every replica' "$W/out1" && echo "ok: default --zero: 1 on four.json, 0 alone" ||
    { cat "$W/out" "$W/out1"; echo "FAIL: default --zero"; fails=$((fails + 1)); }
# Snapshots: each rank writes the moments it keeps (its regions, as
# rectangles); a snapshot is read whatever wrote it.  On four.json, the
# snapshots of step 2 (runs with snapshots every 2 steps) resume to the
# losses of the uninterrupted --zero 1 run, bit for bit: a --zero 1
# snapshot resumed with --zero 0 (whole moments from the shards'
# rectangles), a --zero 0 snapshot resumed with --zero 1 (the regions
# from whole blocks), and a --zero 1 background snapshot (staged from the
# shards) resumed with --zero 1; and the first resharded onto one process.
mpi4() { sh "$top_srcdir/tests/mpirun.sh" 4 60 "$TRAIN" --model tiny --plan "$P/four.json" \
    --threads 1 --quiet "$@"; }
C="--global-batch 16 --steps 4 --warmup 2 --lr 3e-3"
mpi4 $C --zero 1 --metrics "$W/ref.jsonl" >"$W/out" 2>&1 || { cat "$W/out"; echo "FAIL: ref"; exit 1; }
# (The background snapshot of step 2 is resumed with --resume-from 2
# after a whole run: a stop at step 4 might come before it is committed.)
for case in "1 0 crash" "0 1 crash" "1 1 whole --snapshot-async"; do
    set -- $case
    wz=$1 rz=$2 how=$3
    shift 3
    rm -rf "$W/s"
    if [ "$how" = crash ]; then
        MALLEUS_TEST_STEP_FAIL=0:3 mpi4 $C --zero "$wz" --snapshot-dir "$W/s" \
            --snapshot-every 2 "$@" >"$W/out" 2>&1
        from=--resume
    else
        mpi4 $C --zero "$wz" --snapshot-dir "$W/s" --snapshot-every 2 "$@" >"$W/out" 2>&1
        from="--resume-from 2 --overwrite-snapshots"
    fi
    [ "$case" = "1 0 crash" ] && cp -r "$W/s" "$W/s1"
    mpi4 $from --snapshot-dir "$W/s" --zero "$rz" --metrics "$W/res.jsonl" >"$W/out" 2>&1 &&
        [ "$(cat "$W/s/latest")" = step_00000004 ] || { cat "$W/out"; echo "FAIL: resume $case"; }
    tail -n 2 "$W/ref.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/' >"$W/a"
    tail -n 2 "$W/res.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/' >"$W/b"
    if cmp -s "$W/a" "$W/b" && [ "$(wc -l <"$W/b")" -eq 2 ]; then
        echo "ok: written with --zero $wz $*, resumed with --zero $rz: steps 3-4 bitwise"
    else
        echo "FAIL: written with --zero $wz $*, resumed with --zero $rz: losses" \
            "$(tr '\n' ' ' <"$W/b"), want $(tr '\n' ' ' <"$W/a")"
        fails=$((fails + 1))
    fi
    rm -f "$W/res.jsonl"
done
# The --zero 1 snapshot of step 2 resharded onto one process, resumed there
# with --zero 1 (every piece its own): the losses within 1e-6 of the run's.
"$top_builddir/malleus-reshard" --quiet "$W/s1" "$P/one.json" "$W/r1" >"$W/out" 2>&1 &&
    "$TRAIN" --resume --snapshot-dir "$W/r1" --zero 1 --threads 1 --quiet \
        --metrics "$W/res.jsonl" >>"$W/out" 2>&1 || { cat "$W/out"; echo "FAIL: reshard, resume"; }
tail -n 2 "$W/res.jsonl" 2>/dev/null | sed 's/.*"loss":\([^,]*\),.*/\1/' >"$W/b"
if paste "$W/a" "$W/b" | awk 'NF != 2 || ($1 - $2) / $1 > 1e-6 || ($2 - $1) / $1 > 1e-6 { bad = 1 }
                              END { exit bad || NR != 2 }'; then
    echo "ok: resharded onto one process, resumed with --zero 1: $(tr '\n' ' ' <"$W/b")"
else
    echo "FAIL: resharded onto one process: losses $(tr '\n' ' ' <"$W/b"), want $(tr '\n' ' ' <"$W/a")"
    fails=$((fails + 1))
fi
[ $fails -eq 0 ] || { echo "test_zero.sh: $fails failures"; exit 1; }
echo "test_zero.sh: PASS"
