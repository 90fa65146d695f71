#!/bin/sh
# The one command for a GPU machine (issue 12): set up, build, run the GPU
# test suite, then the benchmark against PyTorch, in under 10 minutes; write
# everything to $OUT and print a short summary last.
#
# Before the call, once per checkout, on the development machine:
#     sh ../shared/gpu/fetch-debs.sh        # MPICH, parallel HDF5, ... -> .gpu-debs/
# then, with the device tool, from the checkout's root:
#     run(command="sh bench/gpu/run.sh", carry=[".gpu-debs"], timeout_s=600)
#
# Stages (each with its own time limit, so a hang in one leaves time for the
# rest):  setup   unpack .gpu-debs (shared/gpu/README.md's recipe)
#         build   configure --with-cuda, make -j (the .cu files with nvcc)
#         tests   make check of the GPU tests: test_cuda_kernels (kernels vs
#                 float64), test_cuda_ops (every table op vs the CPU backend),
#                 test_cuda_model (fp32 = CPU, gradient check, bf16,
#                 determinism), test_cuda_train.sh (loss curves, 300 bf16
#                 steps, determinism, resume, cross-device snapshots, PyTorch
#                 from the same weights and batches)
#         bench   bench/gpu/bench.py: ceilings, then malleus / torch.compile /
#                 eager on the 124m and 1b shapes
# STAGES="build tests" (say) runs a subset; BENCH_ARGS passes options to
# bench.py (e.g. "--shapes 1b --who malleus").
#
# Exit status: 0 only when every stage ran and passed.  Anything missing --
# the carried packages, the toolkit, a GPU, torch with CUDA -- stops the
# stage with a message naming it; a GPU test that skips (77) on the GPU
# machine counts as a failure, so this never passes without having run.
# $OUT keeps at most 8 files (the device tool's limit): summary.txt,
# tests.txt, bench.md, bench.json and logs.tgz (every log).
set -u
T0=$(date +%s)
OUT=${OUT:-$PWD/gpu-out}
STAGES=${STAGES:-setup build tests bench}
BENCH_ARGS=${BENCH_ARGS:-}
mkdir -p "$OUT" || exit 2
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/malleus-gpu.XXXXXX") || exit 2
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
status=0

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(($(date +%s) - T0)); }
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
# stage NAME LIMIT_S COMMAND...: run with a time limit, log to $LOGS/NAME.log
stage() {
    name=$1 limit=$2
    shift 2
    say "[$(elapsed) s] $name: $*"
    timeout "$limit" sh -c "$*" >"$LOGS/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && say "[$(elapsed) s] $name: TIMED OUT after $limit s"
    [ $rc -eq 0 ] && say "[$(elapsed) s] $name: ok" || say "[$(elapsed) s] $name: FAILED (exit $rc)"
    return $rc
}
finish() {
    tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
    rm -rf "$LOGS"
    say "[$(elapsed) s] run.sh: $([ $status -eq 0 ] && echo 'all stages passed' || echo 'FAILED')"
    echo "==== summary ($OUT/summary.txt) ===="
    cat "$SUMMARY"
    exit $status
}

if has setup; then
    if [ ! -f .gpu-debs/setup-device.sh ]; then
        say "setup: FAILED: .gpu-debs/ is missing; on the development machine run"
        say "       sh ../shared/gpu/fetch-debs.sh   and carry .gpu-debs with the command"
        status=1
        finish
    fi
    stage setup 120 "sh .gpu-debs/setup-device.sh && nvidia-smi -L && nvcc --version | tail -1" ||
        { status=1; finish; }
    tail -3 "$LOGS/setup.log" | tee -a "$SUMMARY"
fi

if has build; then
    CCMPI=$(command -v mpicc.mpich || echo mpicc)
    # the GPU machine has NCCL under /usr (shared/gpu/README.md); elsewhere
    # configure looks in the CUDA directory
    NCCL=
    [ -f /usr/include/nccl.h ] && NCCL=--with-nccl=/usr
    stage build 300 "autoreconf -fi && ./configure CC=$CCMPI --with-cuda $NCCL && make -j$(nproc) && make -j$(nproc) check TESTS=" ||
        { tail -40 "$LOGS/build.log"; status=1; finish; }
    grep -E 'CUDA \+ cuBLAS|NCCL:' "$LOGS/build.log" | tee -a "$SUMMARY"
    grep -q '^#define HAVE_CUDA 1' malconf.h ||
        { say "build: FAILED: configure did not enable CUDA"; status=1; finish; }
fi

if has tests; then
    PY=$(command -v python3)
    GPU_TESTS="tests/test_cuda_kernels tests/test_cuda_ops tests/test_cuda_model tests/test_cuda_train.sh"
    stage tests 330 "make -j2 check PYTHON3=$PY TESTS='$GPU_TESTS'"
    rc=$?
    : >"$OUT/tests.txt"
    for t in $GPU_TESTS; do
        b=${t%.sh} # automake's names: tests/x.sh -> tests/x.log, tests/x.trs
        res=$(sed -n 's/^:test-result: //p' "$b.trs" 2>/dev/null)
        [ -n "$res" ] || res=MISSING
        say "  $res: $t"
        cat "$b.log" >>"$OUT/tests.txt" 2>/dev/null
        cp "$b.log" "$LOGS/" 2>/dev/null
        # on the GPU machine a skip means the test did not run: a failure
        [ "$res" = PASS ] || rc=1
    done
    [ $rc -eq 0 ] || status=1
fi

if has bench; then
    left=$((590 - $(elapsed)))
    [ $left -lt 60 ] && left=60
    PY=$(command -v python3)
    # shellcheck disable=SC2086
    stage bench $left "PYTHON3=$PY $PY bench/gpu/bench.py . '$LOGS/bench' $BENCH_ARGS" || status=1
    for f in bench.md bench.json; do cp "$LOGS/bench/$f" "$OUT/" 2>/dev/null; done
    grep -E 'ceilings|tokens/s|failed' "$LOGS/bench.log" | tee -a "$SUMMARY"
    [ -f "$OUT/bench.md" ] && cat "$OUT/bench.md" >>"$SUMMARY"
fi
finish
