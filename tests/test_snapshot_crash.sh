#!/bin/sh
# Crash consistency of the collective snapshot writer: malleus-train on 4
# ranks snapshots after step 2, then one rank kills itself with SIGKILL
# while the step-4 snapshot is being written (test hook
# MALLEUS_TEST_SNAPSHOT_KILL): rank 1 in the middle of its shard data, rank
# 0 after writing the index, rank 0 after the rename but before COMPLETE.
# Each time `latest` must still name step 2, which must load completely
# (malleus-reshard reads and verifies every block of it) and resume: the
# resumed run repeats the uninterrupted run's losses bit for bit, commits
# step 4, and the dead writer's debris is gone.  The fourth case kills rank
# 1 in its shard data while the step-4 snapshot is written in the
# background (--snapshot-async; MALLEUS_TEST_SNAPSHOT_HOLD=1 makes the
# writer start only after step 5 was trained, so training certainly went
# on during the write): the same guarantees hold.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
OPENBLAS_NUM_THREADS=1
export OPENBLAS_NUM_THREADS
T="$top_builddir/malleus-train"
R="$top_builddir/malleus-reshard"
P="$top_srcdir/tests/plans"
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-snap-crash.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
common="--model tiny --plan $P/four.json --global-batch 16 --decay-steps 4 --lr 3e-3 --warmup 2 --quiet --threads 1"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
loss() { sed -n "s/^{\"step\": $2, \"loss\": \([^,]*\),.*/\1/p" "$1"; }

sh "$top_srcdir/tests/mpirun.sh" 4 60 "$T" $common --steps 4 --metrics "$W/ref.jsonl" >"$W/ref.out" 2>&1 ||
    { cat "$W/ref.out"; echo "FAIL: reference run"; exit 1; }

for case in 1:data 0:index 0:rename 1:data:async; do
    rank=${case%%:*} point=${case#*:} mode=sync
    case $point in *:async) point=${point%:async} mode=async ;; esac
    d="$W/$point.$mode"
    mkdir -p "$d"
    if [ $mode = async ]; then
        # steps 5.. train while the step-4 snapshot is in flight
        MALLEUS_TEST_SNAPSHOT_HOLD=1 MALLEUS_TEST_SNAPSHOT_KILL="$rank:4:$point" timeout -k 5 60 \
            "$MPIEXEC" -n 4 "$T" $common --steps 8 --snapshot-every 2 --snapshot-async \
            --snapshot-dir "$d/snap" --metrics "$d/m.jsonl" >"$d/out" 2>&1
    else
        MALLEUS_TEST_SNAPSHOT_KILL="$rank:4:$point" timeout -k 5 60 "$MPIEXEC" -n 4 "$T" $common \
            --steps 4 --snapshot-every 2 --snapshot-dir "$d/snap" --metrics "$d/m.jsonl" >"$d/out" 2>&1
    fi
    rc=$?
    point="$point ($mode)"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$d/out"; fail "$point: the killed run exited with $rc"; continue; }
    grep -q "kills itself" "$d/out" || fail "$point: the hook did not fire"
    [ $mode = sync ] || [ -n "$(loss "$d/m.jsonl" 5)" ] ||
        fail "$point: step 5 was not trained while step 4 was being written"
    [ "$(cat "$d/snap/latest")" = step_00000002 ] || fail "$point: latest is $(cat "$d/snap/latest")"
    [ ! -e "$d/snap/step_00000004/COMPLETE" ] || fail "$point: step 4 was committed"
    case $point in
    rename*) [ -d "$d/snap/step_00000004" ] || fail "rename: no uncommitted step_00000004" ;;
    *) ls -d "$d/snap"/.tmp-step_00000004.* >/dev/null 2>&1 || fail "$point: no debris of the killed writer" ;;
    esac
    # step 4 is not trusted, step 2 loads whole
    "$R" "$d/snap/step_00000004" "$P/one.json" "$d/x" >"$d/r4" 2>&1 && fail "$point: uncommitted step 4 was read"
    "$R" --quiet "$d/snap" "$P/one.json" "$d/check" >"$d/r2" 2>&1 || { cat "$d/r2"; fail "$point: step 2 does not load"; }
    [ "$(cat "$d/check/latest" 2>/dev/null)" = step_00000002 ] || fail "$point: resharded copy lacks step 2"
    # and resumes, exactly, cleaning up after the dead writer
    sh "$top_srcdir/tests/mpirun.sh" 4 60 "$T" $common --steps 4 --snapshot-dir "$d/snap" --resume \
        --metrics "$d/m.jsonl" >"$d/res" 2>&1 || { cat "$d/res"; fail "$point: resume"; continue; }
    for s in 3 4; do
        [ -n "$(loss "$d/m.jsonl" $s)" ] && [ "$(loss "$d/m.jsonl" $s | tail -1)" = "$(loss "$W/ref.jsonl" $s)" ] ||
            fail "$point: step $s loss $(loss "$d/m.jsonl" $s | tail -1) vs uninterrupted $(loss "$W/ref.jsonl" $s)"
    done
    [ "$(cat "$d/snap/latest")" = step_00000004 ] && [ -f "$d/snap/step_00000004/COMPLETE" ] ||
        fail "$point: step 4 not committed after the resume"
    ls -d "$d/snap"/.tmp-* >/dev/null 2>&1 && fail "$point: debris left: $(ls -a "$d/snap")"
    [ $fails -eq 0 ] && echo "ok: SIGKILL of rank $rank at '$point': step 2 stayed latest, loaded, resumed exactly"
done
echo "$fails failure(s)"
[ $fails -eq 0 ]
