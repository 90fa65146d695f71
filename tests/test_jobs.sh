#!/bin/sh
# The job scripts with paths that contain spaces and quotes, built and
# installed, outside Slurm (mpiexec; tests/test_slurm*.sh run them under
# Slurm):
#  * jobs/malleus-gpu.sbatch (DEVICE=cpu, 2 ranks through the bind
#    wrapper) and jobs/malleus.sbatch, run from a copy elsewhere (as sbatch
#    runs them), MALLEUS_BIN a build-like directory named `bin dir "q" 'x'`,
#    RUN_DIR `run dir 'a' "b"`: the loop to the end;
#  * jobs/train-single.sbatch from an installed layout found through PATH
#    alone (PREFIX/bin, PREFIX/share/malleus/jobs), with the trainer
#    argument --data "my data 'x'.bin": the snapshot's run trained on it;
#  * a job started again after a re-plan cut short before its snapshot was
#    committed continues the generation before it;
#  * a MALLEUS_BIN without the programs, and none found at all: exit 2
#    naming what to set;
#  * PRECISION: the gpu job's run above in bf16 (trainer and planner, which
#    accepts it); a value other than fp32/bf16: exit 2, nothing made.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
W=$(mktemp -d /tmp/malleus-test-jobs-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1 MPIEXEC
unset MALLEUS_BIN MALLEUS_LOOP SLURM_JOB_ID
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
B="$W/bin dir \"q\" 'x'"
P="$W/prefix 'p' \"q\""
mkdir -p "$B/jobs" "$P/bin" "$P/share/malleus/jobs" "$W/spool"
for p in malleus-train malleus-replan malleus-reshard malleus-tokenize; do
    ln -s "$top_builddir/$p" "$B/$p"
    ln -s "$top_builddir/$p" "$P/bin/$p"
done
for j in adaptive-loop.sh malleus.sbatch malleus-gpu.sbatch train-single.sbatch gpu-bind.sh; do
    cp "$top_srcdir/jobs/$j" "$B/jobs/$j"
    cp "$top_srcdir/jobs/$j" "$P/share/malleus/jobs/$j"
    cp "$top_srcdir/jobs/$j" "$W/spool/$j" # what sbatch runs: a copy, away from the others
done
done_ok() { # RUN_DIR STEPS WHAT
    grep -q "done: $2 steps" "$1/events.log" 2>/dev/null && [ -f "$1/snap.0/latest" ] ||
        { tail -20 "$W/out"; fail "$3: the loop did not finish"; return 1; }
    echo "ok: $3"
}

R="$W/run dir 'a' \"b\""
# (CUDA_VISIBLE_DEVICES: the bind wrapper maps the ranks to GPUs 0 and 1
# and says so; the cpu device does not look)
(cd "$W" && MALLEUS_BIN="$B" DEVICE=cpu NPROCS=2 RUN_DIR="$R/gpu" STEPS=4 GLOBAL_BATCH=8 PIPELINES=1 \
    SNAPSHOT_EVERY=2 MALLEUS_GPU_BIND=verbose CUDA_VISIBLE_DEVICES=0,1 PRECISION=bf16 \
    bash "$W/spool/malleus-gpu.sbatch") >"$W/out" 2>&1 || fail "malleus-gpu.sbatch: exit $?"
done_ok "$R/gpu" 4 "malleus-gpu.sbatch with MALLEUS_BIN and RUN_DIR holding spaces and quotes"
grep -q "gpu-bind: local rank 1 of .* -> GPU 1 (of 0,1)" "$W/out" ||
    { cat "$W/out"; fail "the ranks did not run through the bind wrapper"; }
grep -q "| cpu (bf16) " "$W/out" || { cat "$W/out"; fail "PRECISION=bf16 did not reach the trainer"; }
(cd "$W" && MALLEUS_BIN="$B" NPROCS=2 RUN_DIR="$R/prec" PRECISION=fp64 bash "$W/spool/malleus.sbatch") \
    >"$W/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "PRECISION must be fp32 or bf16, not 'fp64'" "$W/out" && [ ! -e "$R/prec" ] &&
    echo "ok: PRECISION=fp64 refused (exit 2), nothing made" ||
    { cat "$W/out"; fail "PRECISION=fp64: exit $rc"; }

(cd "$W" && MALLEUS_BIN="$B" NPROCS=2 RUN_DIR="$R/cpu" STEPS=4 GLOBAL_BATCH=8 PIPELINES=1 \
    SNAPSHOT_EVERY=2 bash "$W/spool/malleus.sbatch") >"$W/out" 2>&1 || fail "malleus.sbatch: exit $?"
done_ok "$R/cpu" 4 "malleus.sbatch with MALLEUS_BIN and RUN_DIR holding spaces and quotes"

# A re-plan cut short after its plan, before its reshard committed: the job
# started again continues the generation before it, from its newest snapshot.
cp "$R/cpu/plan.0.json" "$R/cpu/plan.1.json"
mkdir -p "$R/cpu/snap.1/.tmp-step_00000004.1@x"
(cd "$W" && MALLEUS_BIN="$B" NPROCS=2 RUN_DIR="$R/cpu" STEPS=6 GLOBAL_BATCH=8 PIPELINES=1 \
    SNAPSHOT_EVERY=2 TRAIN_ARGS="--override steps" bash "$W/spool/malleus.sbatch") >"$W/out" 2>&1 ||
    fail "malleus.sbatch again: exit $?"
grep -q "generation 1 was never completed (no committed snapshot): removing it, continuing generation 0" \
    "$R/cpu/events.log" && grep -q "generation 0: training on .*, resuming from step 4" "$R/cpu/events.log" &&
    [ ! -e "$R/cpu/plan.1.json" ] && [ ! -e "$R/cpu/snap.1" ] && grep -q "done: 6 steps" "$R/cpu/events.log" &&
    echo "ok: an incomplete generation 1 removed; generation 0 continued from step 4 to 6" ||
    { tail -20 "$W/out"; fail "the incomplete generation"; }

D="$W/my data 'x'.bin"
"$top_builddir/malleus-tokenize" "$top_srcdir/README.md" "$D" >/dev/null || exit 99
(cd "$W" && PATH="$P/bin:$PATH" RUN_DIR="$R/single" STEPS=4 SNAPSHOT_EVERY=2 GLOBAL_BATCH=8 \
    MICRO_BATCH=4 bash "$W/spool/train-single.sbatch" --data "$D") >"$W/out" 2>&1 ||
    fail "train-single.sbatch: exit $?"
done_ok "$R/single" 4 "train-single.sbatch installed, found through PATH, --data with spaces and quotes"
h5dump -a /train_json "$R/single/snap.0/step_00000004/index.h5" 2>/dev/null | grep -qF "my data 'x'.bin" ||
    fail "the single run's snapshot does not name its data file"

out=$(MALLEUS_BIN="$W/nowhere" RUN_DIR="$W/r4" bash "$W/spool/adaptive-loop.sh" 2>&1)
[ $? -eq 2 ] && echo "$out" | grep -q "malleus-train not found in MALLEUS_BIN=$W/nowhere" ||
    fail "a MALLEUS_BIN without the programs: '$out'"
out=$(cd "$W" && PATH=/usr/bin:/bin RUN_DIR="$W/r5" bash "$W/spool/malleus.sbatch" 2>&1)
[ $? -eq 2 ] && echo "$out" | grep -q "set MALLEUS_BIN" || fail "no programs anywhere: '$out'"

[ $fails -eq 0 ] && echo "PASS: job scripts with spaces and quotes, built and installed" && exit 0
echo "FAIL: $fails check(s)"
exit 1
