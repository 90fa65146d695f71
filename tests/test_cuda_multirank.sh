#!/bin/sh
# The multi-rank suite on the GPU: 8 ranks share the machine's
# GPU(s), each with the tiny model (a few hundred MiB of GPU memory a rank,
# most of it the CUDA context), fp32 compute (the tests' tolerances are
# fp32's; tests/tiny_options.h), exit 77 where no GPU is usable:
#   1. test_parallel: the six plans of tests/test_parallel.sh against the
#      one-rank run on the same device (every rank computes it): loss at
#      every step and every parameter shard within 1e-4, replicas bitwise
#      identical;
#   2. test_reshard: snapshot, exact resume, reshard pp4dp2 -> mixed_tp and
#      resume on it (state and loaded shards bit for bit, loss within 1e-4);
#   3. --adapt online with a straggler injected by sleeping (right when ranks
#      share a GPU): test_online (two plan changes, replicas bitwise
#      identical after each, loss within 1e-4 of the one-rank run), then
#      malleus-train --adapt online --inject (a migration line, and every
#      step's loss within 1e-4 of the one-rank malleus-train run);
#   4. the restart loop (jobs/adaptive-loop.sh through mpiexec, rank 3
#      slowed 4x): re-plan, reshard, resume, and the loss curve of the
#      one-rank run on the same device within 1e-4 (tests/check_loop.py);
#   5. cross-device under another plan (MPI data plane only), both ways:
#      4 steps of malleus-train on this device under mixed_tp.json, a
#      snapshot, malleus-reshard to pp4dp2.json, 4 more on --device cpu
#      under it; and cpu under pp4dp2.json -> reshard -> this device under
#      mixed_tp.json.  Each run's 8 losses (both legs append to one metrics
#      file) within 1e-4 of the one-rank run of 8 steps on the CPU, its
#      final state (parameters, Adam m and v) within 1e-4 of that run's per
#      tensor (norm-wise, tests/gpu_peer_ref.py state, which reads the
#      snapshots with h5py or, without it, through tests/snapdump; where
#      $PYTHON3 lacks numpy or torch a line says it was not compared), and the
#      second leg resumed from the resharded snapshot at step 4.
# All of it with the MPI data plane (--comm mpi: device buffers staged
# through pinned host memory), then parts 1-4 with NCCL (--comm nccl)
# where it can run 8 ranks: 8 or more GPUs (one rank each), or NCCL 2.30
# or newer, whose NCCL_MULTI_RANK_GPU_ENABLE=1 lets ranks share a GPU;
# otherwise a line says why the NCCL part is skipped.
#
# MALLEUS_TEST_DEVICE (default cuda) names the kernel backend: with
# cpu-opaque the script runs end to end without a GPU, MPI part only (make
# check does not do that: test_opaque_a/b.sh cover cpu-opaque).
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
: "${PYTHON3:=/usr/bin/python3}"
DEV=${MALLEUS_TEST_DEVICE:-cuda}
MALLEUS_TEST_DEVICE=$DEV
OPENBLAS_NUM_THREADS=1
export MALLEUS_TEST_DEVICE OPENBLAS_NUM_THREADS
TRAIN=$top_builddir/malleus-train
RESHARD=$top_builddir/malleus-reshard
P=$top_srcdir/tests/plans
[ -x "$TRAIN" ] || { echo "test_cuda_multirank: $TRAIN not built"; exit 99; }
if [ "$DEV" = cuda ]; then
    # shellcheck source=tests/cuda_skip.sh
    . "$top_srcdir/tests/cuda_skip.sh"
    mal_need_cuda test_cuda_multirank
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/test_cuda_multirank.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
fails=0
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0)) s] $*"; }
# mpi NAME TIMEOUT_S PROGRAM [ARGS...]: 8 ranks, output in $W/NAME.out and
# echoed; a failure is counted, named and the rest goes on
mpi() {
    name=$1 limit=$2
    shift 2
    sh "$top_srcdir/tests/mpirun.sh" 8 "$limit" "$@" >"$W/$name.out" 2>&1
    rc=$?
    verdicts='^(PASS|FAIL|SKIP|step [0-9]+: plan change)'
    grep -E "$verdicts" "$W/$name.out"
    if [ $rc -ne 0 ]; then
        grep -Ev "$verdicts" "$W/$name.out" | tail -20
        say "FAIL ($COMM): $name exited $rc"
        fails=$((fails + 1))
        return 1
    fi
    say "ok ($COMM): $name"
}
# check NAME WHAT FILE PATTERN: FILE has a line matching PATTERN (ERE)
check() {
    if ! grep -Eq "$4" "$3"; then
        tail -20 "$3"
        say "FAIL ($COMM): $1: $2"
        fails=$((fails + 1))
        return 1
    fi
}

# same_curve A B [N]: every step of metrics A has B's loss within 1e-4
# relative (B has the step), and A has N lines if N is given; prints the
# worst difference
same_curve() {
    for f in "$1" "$2"; do
        sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$f" >"$f.loss"
    done
    awk -v want="${3:-}" 'NR == FNR { ref[$1] = $2; next }
        { n++; if (!($1 in ref)) { miss = $1; next }
          d = ($2 - ref[$1]) / ref[$1]; if (d < 0) d = -d; if (d > w) w = d }
        END { printf "%d steps, max loss rel diff %.2e%s%s\n", n, w,
                     miss ? ", step " miss " missing" : "",
                     want != "" && n != want ? ", " want " expected" : ""
              exit !(n > 0 && !miss && w <= 1e-4 && (want == "" || n == want)) }' "$2.loss" "$1.loss"
}

# The one-rank runs on this device: the loss curves of malleus-train's
# online run (8 steps) and of the restart loop (24).
for n in 8 24; do
    "$TRAIN" --device "$DEV" --precision fp32 --model tiny --steps $n --global-batch 16 \
        --micro-batch 2 --quiet --metrics "$W/ref$n.jsonl" >"$W/ref.out" 2>&1 ||
        { cat "$W/ref.out"; echo "FAIL: the one-rank reference run"; exit 1; }
done
# and on the CPU (8 steps, its final state too), for part 5
"$TRAIN" --device cpu --precision fp32 --model tiny --steps 8 --global-batch 16 \
    --micro-batch 2 --quiet --metrics "$W/refcpu8.jsonl" --snapshot-dir "$W/refcpu8" \
    >"$W/ref.out" 2>&1 ||
    { cat "$W/ref.out"; echo "FAIL: the one-rank reference run on the CPU"; exit 1; }

suite() {
    COMM=$1
    MALLEUS_TEST_COMM=$COMM
    export MALLEUS_TEST_COMM
    say "== the multi-rank suite on $DEV, comm $COMM${NCCL_MULTI_RANK_GPU_ENABLE:+ (NCCL_MULTI_RANK_GPU_ENABLE=$NCCL_MULTI_RANK_GPU_ENABLE)}"
    mpi parallel 300 "$top_builddir/tests/test_parallel" "$P/dp8.json" "$P/tp8.json" \
        "$P/pp4dp2.json" "$P/mixed_tp.json" "$P/uneven_stages.json" "$P/suspended.json"
    mkdir -p "$W/reshard.$COMM"
    mpi reshard 120 "$top_builddir/tests/test_reshard" "$W/reshard.$COMM" "$P/pp4dp2.json" \
        "$P/mixed_tp.json"
    mpi online 240 "$top_builddir/tests/test_online"
    mpi train-online 120 "$TRAIN" --device "$DEV" --comm "$COMM" --precision fp32 --model tiny \
        --steps 8 --global-batch 16 --micro-batch 2 --dp 2 --tp 2 --pp 2 --inject 3:8:1 \
        --inject-mode sleep --adapt online --ranks-per-node 4 --check-every 2 --window 3 \
        --gap 1.5 --noise-floor 2.0 --threshold 2.0 --change-cost 0 \
        --metrics "$W/online.$COMM.jsonl" &&
        check train-online "the start-up table does not show $DEV (fp32) / $COMM" \
            "$W/train-online.out" "^\| kernels / comm +\| $DEV \(fp32\) +/ $COMM" &&
        check train-online "no online migration line" "$W/train-online.out" \
            '^online migration 1 at step [0-9]+: [0-9.]+ MiB moved' &&
        check train-online "training did not continue to step 8" "$W/train-online.out" \
            'step 8/8' && say "$(grep '^online migration 1' "$W/train-online.out" | cut -c1-100)" &&
        if same_curve "$W/online.$COMM.jsonl" "$W/ref8.jsonl" >"$W/cmp.out"; then
            say "ok ($COMM): malleus-train --adapt online against the one-rank run: $(cat "$W/cmp.out")"
        else
            say "FAIL ($COMM): malleus-train --adapt online against the one-rank run: $(cat "$W/cmp.out")"
            fails=$((fails + 1))
        fi
    # the restart loop, as tests/test_loop.sh runs it without Slurm
    run=$W/loop.$COMM
    MALLEUS_BIN="$top_builddir" RUN_DIR="$run" NPROCS=8 LAUNCH="timeout 120 $MPIEXEC -n 8" \
        STEPS=24 RANKS_PER_NODE=4 SNAPSHOT_EVERY=6 \
        TRAIN_ARGS="--device $DEV --comm $COMM --precision fp32 --change-cost 0 --inject 3:4:6 --inject-mode sleep --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0" \
        timeout 400 bash "$top_srcdir/jobs/adaptive-loop.sh" >"$W/loop.$COMM.out" 2>&1
    rc=$?
    grep -E 'generation|re-plan|done' "$run/events.log" 2>/dev/null | head -8
    if [ $rc -ne 0 ]; then
        tail -30 "$W/loop.$COMM.out"
        say "FAIL ($COMM): the restart loop exited $rc"
        fails=$((fails + 1))
    elif "$PYTHON3" "$top_srcdir/tests/check_loop.py" "$run" "$W/ref24.jsonl" 24 3; then
        say "ok ($COMM): the restart loop"
    else
        say "FAIL ($COMM): the restart loop against the one-rank run"
        fails=$((fails + 1))
    fi
}

suite mpi

# xtrain NAME DEVICE PLAN STEPS [ARGS...]: malleus-train on 8 ranks, tiny,
# fp32, MPI data plane, the schedule of 8 steps, the metrics of run NAME's
# two legs in $W/NAME.jsonl; checks that the start-up table shows DEVICE
xtrain() {
    xname=$1 xdev=$2 xplan=$3 xsteps=$4
    shift 4
    mpi "$xname.$xdev" 120 "$TRAIN" --device "$xdev" --comm mpi --precision fp32 --model tiny \
        --plan "$xplan" --global-batch 16 --steps "$xsteps" --decay-steps 8 \
        --metrics "$W/$xname.jsonl" "$@" &&
        check "$xname.$xdev" "the start-up table does not show $xdev (fp32) / mpi" \
            "$W/$xname.$xdev.out" "^\| kernels / comm +\| $xdev \(fp32\) +/ mpi"
}
# cross NAME DEV1 PLAN1 DEV2 PLAN2: 4 steps on DEV1 under PLAN1 and a
# snapshot, malleus-reshard to PLAN2, 4 more on DEV2 under PLAN2 from the
# resharded snapshot; the 8 losses and the final state against the
# one-rank CPU run's
cross() {
    d=$W/$1
    xtrain "$1" "$2" "$3" 4 --snapshot-dir "$d.a" || return 1
    if ! "$RESHARD" --quiet "$d.a" "$5" "$d.b" >"$W/$1.reshard.out" 2>&1; then
        cat "$W/$1.reshard.out"
        say "FAIL: $1: malleus-reshard to $(basename "$5")"
        fails=$((fails + 1))
        return 1
    fi
    xtrain "$1" "$4" "$5" 8 --snapshot-dir "$d.b" --resume &&
        check "$1.$4" "did not resume from the resharded snapshot at step 4" "$W/$1.$4.out" \
            "^resumed from $d.b/step_00000004 at step 4 " || return 1
    what="$2 $(basename "$3" .json) -> reshard -> $4 $(basename "$5" .json) against the one-rank CPU run"
    same_curve "$W/$1.jsonl" "$W/refcpu8.jsonl" 8 >"$W/cmp.out"
    rc=$?
    if [ -n "$state_py" ]; then
        "$PYTHON3" "$top_srcdir/tests/gpu_peer_ref.py" state "$d.b" "$W/refcpu8" --rtol 1e-4 \
            >"$W/state.out" 2>&1
        case $? in
        0) ;;
        77) s=$(tail -1 "$W/state.out") && echo "state not compared: $s" >"$W/state.out" ;;
        *) rc=1 ;;
        esac
    else
        echo "state not compared: $state_why" >"$W/state.out"
    fi
    if [ $rc -eq 0 ]; then
        say "ok: $what: $(cat "$W/cmp.out"); $(tail -1 "$W/state.out")"
    else
        head -5 "$W/state.out"
        say "FAIL: $what: $(cat "$W/cmp.out"); $(tail -1 "$W/state.out")"
        fails=$((fails + 1))
    fi
}
# the state comparison reads the snapshots with h5py, or without it through
# tests/snapdump (tests/snapread.py: the GPU machine's venv has no h5py);
# it needs numpy (gpu_peer_ref.py also imports torch: 77 without it);
# without them the loss curves still decide
MALLEUS_SNAPDUMP=$top_builddir/tests/snapdump
export MALLEUS_SNAPDUMP
state_py=yes state_why=
if ! "$PYTHON3" -c 'import numpy' 2>/dev/null; then
    state_py= state_why="$PYTHON3 cannot import numpy"
elif ! "$PYTHON3" -c 'import h5py' 2>/dev/null && [ ! -x "$MALLEUS_SNAPDUMP" ]; then
    state_py= state_why="$PYTHON3 has no h5py and $MALLEUS_SNAPDUMP is not built"
fi
say "== cross-device under another plan: $DEV <-> cpu, mixed_tp <-> pp4dp2, comm mpi"
cross xa "$DEV" "$P/mixed_tp.json" cpu "$P/pp4dp2.json"
cross xb cpu "$P/pp4dp2.json" "$DEV" "$P/mixed_tp.json"

# NCCL: 8 ranks need 8 GPUs, or GPUs they may share (NCCL 2.30+).
why=
gpus=0
if [ "$DEV" != cuda ]; then
    why="the device is $DEV, not cuda"
elif [ ! -x "$top_builddir/tests/test_comm_nccl" ]; then
    why="this build has no NCCL (configure --with-nccl)"
else
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    ver=$("$top_builddir/tests/test_comm_nccl" --nccl-version 2>&1) ||
        { echo "FAIL: test_comm_nccl --nccl-version: $ver"; exit 1; }
    if [ "$gpus" -ge 8 ]; then
        say "NCCL $ver, $gpus GPUs: one rank per GPU"
    elif [ "$ver" -ge 23000 ]; then
        NCCL_MULTI_RANK_GPU_ENABLE=1
        export NCCL_MULTI_RANK_GPU_ENABLE
        say "NCCL $ver, $gpus GPU(s): 8 ranks share them (NCCL_MULTI_RANK_GPU_ENABLE=1)"
    else
        why="NCCL $ver and $gpus GPU(s): 8 ranks would share a GPU, which NCCL refuses before 2.30 (23000); 8 GPUs, or NCCL 2.30+, run it"
    fi
fi
if [ -n "$why" ]; then
    say "the NCCL multi-rank part is skipped: $why"
else
    suite nccl
fi

if [ $fails -eq 0 ]; then
    say "PASS: the multi-rank suite on $DEV ($([ -n "$why" ] && echo 'comm mpi; nccl skipped' || echo 'comm mpi and nccl'))"
    exit 0
fi
say "FAIL: $fails check(s) of the multi-rank suite on $DEV"
exit 1
