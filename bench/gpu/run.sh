#!/bin/sh
# The commands for a lent GPU machine, in three device calls of at most 5
# minutes each, in priority order, so that the first minutes of GPU time
# answer the first questions (bench/gpu/NOTES.md, "The commands").
#
#     sh bench/gpu/run.sh call1    # setup, build (sm_90a only), the kernel,
#                                  # table and model tests, the per-kernel
#                                  # harness at both shapes
#     sh bench/gpu/run.sh call2    # the training tests, the benchmark
#                                  # against PyTorch eager and torch.compile
#                                  # at both shapes, --inject-mode gpu
#     sh bench/gpu/run.sh call3    # the NCCL data plane, the multi-rank
#                                  # suite, the GPU job, the snapshot stall,
#                                  # one online plan change
#     STAGES="setup build multirank" sh bench/gpu/run.sh    # any subset
#
# Before the first call, once per checkout, on the development machine:
#     sh bench/gpu/fetch-debs.sh            # MPICH, parallel HDF5, ... -> .gpu-debs/
# then, with the device tool, from the checkout's root (NOTES.md):
#     run(command="sh bench/gpu/run.sh call1", carry=[".gpu-debs"], timeout_s=280)
#
# Every call starts with setup and build, which are skipped (a few seconds)
# when the machine is still warm from the call before and already has
# them; each stage runs under min(its own limit, the time left before the
# call's deadline, DEADLINE seconds after the start, default 240), and one
# that cannot get its minimum is reported NOT RUN (no time) with what to
# give the next call.  Inside the benchmark, each (shape, trainer) run is
# started only where its minimum still fits (bench.py --until).
#
# Stages (the calls above list them in their order):
#   setup       unpack .gpu-debs (bench/gpu/setup-device.sh)
#   build       configure --with-cuda (and NCCL), make -j and the test
#               programs: nvcc for sm_90a only (NVCC_ARCH_FLAGS)
#   kernels     tests/test_cuda_kernels: every kernel family vs float64
#   cudnn       tests/test_cuda_cudnn: cuDNN's fused attention (found in the
#               torch venv's nvidia-cudnn wheel, MALLEUS_CUDNN_LIB) against
#               the hand kernels and float64, determinism, and both timed
#   ops         tests/test_cuda_ops: every table op vs the CPU backend
#   attcmp      bench/gpu/kernel_bench_prev --attention: the attention
#               kernels (row-major tiles, cp.async, ldmatrix) against the
#               previous ones (transposed tiles, 2-byte stores), the same
#               inputs, both shapes: time, TFLOP/s, error of each; needs
#               .gpu-debs/attention_prev.cu (fetch-debs.sh writes it)
#   model       tests/test_cuda_model: fp32 = CPU, gradient check, bf16,
#               determinism
#   kbench1b, kbench124m
#               bench/gpu/kernel_bench: each kernel family and the products
#               against a float64 reference (samples) and its floor (FLOPs
#               over the measured GEMM rate, bytes over the measured copy
#               bandwidth), one table per shape
#   train       tests/test_cuda_train.sh (MAL_CUDA_LONG=0: 60 bf16 steps
#               instead of 300)
#   bench       bench/gpu/bench.py: ceilings, then malleus / torch.compile /
#               eager, in the order 1b malleus, 1b compile, 124m malleus,
#               124m compile, 1b eager, 124m eager (BENCH_PAIRS overrides;
#               1b:malleus-cudnn, 124m:malleus-cudnn: the malleus run with
#               MALLEUS_CUDA_ATTENTION=cudnn)
#   inject      tests/test_cuda_inject.sh (--inject-mode gpu)
#   nccl        tests/test_comm_nccl.sh: the NCCL data plane on one rank
#               (stream-ordered all-reduce, timeout, lists, groups)
#   multirank   tests/test_cuda_multirank.sh: 8 ranks share the GPU
#   job         jobs/malleus-gpu.sbatch by hand: 4 ranks, a straggler, the
#               loop re-plans, reshards and finishes
#   async       bench/snapshot/bench_async: the --snapshot-async stall
#               against the synchronous write of the 1b state
#   zeromaster  --zero-master on against off with a bf16 working copy, 4
#               ranks sharing the GPU: the same losses bit for bit
#   migrate     bench/migrate/run.sh: one online plan change against the
#               restart path, 8 ranks sharing the GPU
#
# Results come back as files under $OUT (at most 8, the device tool's
# limit): summary.txt (every stage's verdict and time, the figures),
# tests.txt (the logs of the call's tests), and per call: cudnn.txt,
# attention.txt, kernels.txt and kernels.tsv (call1), bench.md and bench.json (call2), job.txt and
# stall.txt (call3); logs.tgz holds every log.  Exit 0 only when every
# stage asked for ran and passed; a GPU test that skips (77) there is a
# failure, so nothing passes without having run.
set -u
T0=$(date +%s)
DEADLINE=${DEADLINE:-240}
OUT=${OUT:-$PWD/gpu-out}
CALL=${1:-}
case $CALL in
call1) STAGES=${STAGES:-"setup build kernels cudnn ops attcmp model kbench1b kbench124m"} ;;
call2) STAGES=${STAGES:-"setup build train bench inject"} ;;
call3) STAGES=${STAGES:-"setup build nccl multirank zeromaster job async migrate"} ;;
"") STAGES=${STAGES:-"setup build kernels cudnn ops attcmp model kbench1b kbench124m"} ;;
*)
    echo "usage: sh bench/gpu/run.sh [call1|call2|call3]   (or STAGES=\"...\")" >&2
    exit 2
    ;;
esac
BENCH_PAIRS=${BENCH_PAIRS:-1b:malleus,1b:compile,124m:malleus,124m:compile,1b:eager,124m:eager}
NVCC_ARCH_FLAGS=${NVCC_ARCH_FLAGS:-"-gencode arch=compute_90a,code=sm_90a"}
MAL_CUDA_LONG=${MAL_CUDA_LONG:-0}
export MAL_CUDA_LONG
mkdir -p "$OUT" || exit 2
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/malleus-gpu.XXXXXX") || exit 2
SUMMARY="$OUT/summary.txt"
TESTS_TXT="$OUT/tests.txt"
: >"$SUMMARY"
status=0
not_run=""

say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(($(date +%s) - T0)); }
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
# stage NAME CAP_S MIN_S COMMAND...: run under min(CAP_S, time left), log to
# $LOGS/NAME.log; not at all (status 125) when less than MIN_S is left
stage() {
    name=$1 cap=$2 min=$3
    shift 3
    left=$((DEADLINE - $(elapsed)))
    limit=$cap
    [ $left -lt $limit ] && limit=$left
    if [ $limit -lt "$min" ]; then
        say "[$(elapsed) s] $name: NOT RUN (no time: ${left} s left, needs $min)"
        not_run="$not_run $name"
        return 125
    fi
    say "[$(elapsed) s] $name (limit $limit s): $*"
    timeout -k 5 "$limit" sh -c "$*" >"$LOGS/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && say "[$(elapsed) s] $name: TIMED OUT after $limit s"
    [ $rc -eq 0 ] && say "[$(elapsed) s] $name: ok" || say "[$(elapsed) s] $name: FAILED (exit $rc)"
    return $rc
}
# test_stage NAME CAP MIN TEST: one test of `make check`, its log into
# tests.txt; a skip (77) on the GPU machine means it did not run: a failure
test_stage() {
    name=$1 cap=$2 min=$3 t=$4
    b=${t%.sh} # automake's names: tests/x.sh -> tests/x.log, tests/x.trs
    rm -f "$b.log" "$b.trs"
    stage "$name" "$cap" "$min" "make -j2 check PYTHON3=$PY MPIEXEC=$MPIEXEC TESTS='$t'"
    rc=$?
    [ $rc -eq 125 ] && return 125
    res=$(sed -n 's/^:test-result: //p' "$b.trs" 2>/dev/null)
    say "  ${res:-MISSING}: $t"
    { echo "==== $t (${res:-MISSING})"; cat "$b.log" 2>/dev/null; } >>"$TESTS_TXT"
    cp "$b.log" "$LOGS/" 2>/dev/null
    [ $rc -eq 0 ] && [ "$res" = PASS ] || status=1
}
finish() {
    tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
    rm -rf "$LOGS"
    [ -n "$not_run" ] &&
        say "NOT RUN in this call:$not_run -- next call: STAGES=\"setup build$not_run\" sh bench/gpu/run.sh"
    say "[$(elapsed) s] run.sh ${CALL:-(stages)}: $([ $status -eq 0 ] && [ -z "$not_run" ] && echo 'all stages passed' || echo 'FAILED or incomplete')"
    echo "==== summary ($OUT/summary.txt) ===="
    cat "$SUMMARY"
    [ -n "$not_run" ] && [ $status -eq 0 ] && status=1
    exit $status
}
PY=$(command -v python3)
say "run.sh ${CALL:-}: stages: $STAGES (deadline ${DEADLINE} s)"

if has setup; then
    if [ -f /tmp/malleus-gpu-setup.done ]; then
        say "[$(elapsed) s] setup: done by an earlier call on this machine"
    elif [ ! -f .gpu-debs/setup-device.sh ]; then
        say "setup: FAILED: .gpu-debs/ is missing; on the development machine run"
        say "       sh bench/gpu/fetch-debs.sh   and carry .gpu-debs with the command"
        status=1
        finish
    else
        stage setup 90 10 "sh .gpu-debs/setup-device.sh && nvidia-smi -L && nvcc --version | tail -1" ||
            { status=1; finish; }
        tail -3 "$LOGS/setup.log" | tee -a "$SUMMARY"
        touch /tmp/malleus-gpu-setup.done
    fi
fi

# MPICH's mpiexec exists only after setup has unpacked it: chosen before,
# a fresh machine's first call took the image's Open MPI mpiexec, which
# refuses root and runs MPICH programs as singletons (seen 2026-11-26)
MPIEXEC=$(command -v mpiexec.mpich || echo mpiexec)
export MPIEXEC
[ "$MPIEXEC" = mpiexec ] && say "note: no mpiexec.mpich; the multi-rank stages use $(command -v mpiexec || echo nothing)"

# cuDNN (kernels/cuda/cudnn.c loads it at run time): the GPU machine has it
# in the nvidia-cudnn-cu13 wheel of its torch venv; the headers come from the
# wheel when it has them, else from .gpu-debs/cudnn-include (fetch-debs.sh)
CUDNN_INC= CUDNN_SO=
for py in "$PY" /opt/torch/.venv/bin/python3; do
    [ -x "$py" ] || continue
    d=$("$py" -c 'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null) || continue
    [ -f "$d/lib/libcudnn.so.9" ] && CUDNN_SO="$d/lib/libcudnn.so.9"
    [ -f "$d/include/cudnn_graph.h" ] && CUDNN_INC="$d/include"
    [ -n "$CUDNN_SO" ] && break
done
[ -z "$CUDNN_INC" ] && [ -f .gpu-debs/cudnn-include/cudnn_graph.h ] && CUDNN_INC="$PWD/.gpu-debs/cudnn-include"
if [ -n "$CUDNN_SO" ]; then
    MALLEUS_CUDNN_LIB=$CUDNN_SO
    LD_LIBRARY_PATH=$(dirname "$CUDNN_SO")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # cuDNN compiles its attention kernels at run time through NVRTC
    # (libnvrtc.so.13): the toolkit's, or the venv's nvidia-cuda-nvrtc wheel
    nv=$("$py" -c 'import nvidia.cuda_nvrtc as m; print(m.__path__[0])' 2>/dev/null)
    [ -n "$nv" ] && [ -d "$nv/lib" ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nv/lib
    [ -d /usr/local/cuda/lib64 ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
    export MALLEUS_CUDNN_LIB LD_LIBRARY_PATH
    say "cuDNN library: $CUDNN_SO (MALLEUS_CUDNN_LIB, LD_LIBRARY_PATH)"
else
    say "cuDNN library: NOT FOUND (no nvidia.cudnn with lib/libcudnn.so.9 in $PY or the torch venv): the cudnn stage fails"
fi
say "cuDNN headers: ${CUDNN_INC:-NOT FOUND (neither the wheel nor .gpu-debs/cudnn-include: run fetch-debs.sh)}"

if has build; then
    CCMPI=$(command -v mpicc.mpich || echo mpicc)
    # the GPU machine has NCCL under /usr (bench/gpu/NOTES.md); elsewhere
    # configure looks in the CUDA directory
    NCCL=
    [ -f /usr/include/nccl.h ] && NCCL=--with-nccl=/usr
    # a warm machine keeps the configured tree (ignored files stay): make
    # alone then rebuilds what the new copy of the sources changed
    CUDNN_CF=
    [ -n "$CUDNN_INC" ] && CUDNN_CF="CUDNN_CFLAGS=-I$CUDNN_INC"
    CONF="autoreconf -fi && ./configure CC=$CCMPI --with-cuda $NCCL NVCC_ARCH_FLAGS='$NVCC_ARCH_FLAGS' $CUDNN_CF &&"
    grep -q '^#define HAVE_CUDA 1' malconf.h 2>/dev/null && [ -f config.status ] &&
        { [ -z "$CUDNN_INC" ] || grep -q '^#define HAVE_CUDNN_H 1' malconf.h; } && CONF=
    stage build 200 45 "$CONF make -j$(nproc) && make -j$(nproc) check TESTS=" ||
        { tail -40 "$LOGS/build.log"; status=1; finish; }
    grep -E 'CUDA \+ cuBLAS|cuDNN attention:|NCCL:' "$LOGS/build.log" | tee -a "$SUMMARY"
    grep -q '^#define HAVE_CUDA 1' malconf.h ||
        { say "build: FAILED: configure did not enable CUDA"; status=1; finish; }
    grep -q '^#define HAVE_NCCL 1' malconf.h ||
        say "build: NCCL not found: the NCCL tests and --comm nccl are not built (a failure below)"
fi

# ---- call 1: the kernels, the table, the model; the per-kernel harness
has kernels && test_stage kernels 60 15 tests/test_cuda_kernels
if has cudnn; then
    test_stage cudnn 90 20 tests/test_cuda_cudnn
    [ $? -ne 125 ] && cp tests/test_cuda_cudnn.log "$OUT/cudnn.txt" 2>/dev/null
fi
has ops && test_stage ops 60 15 tests/test_cuda_ops
if has attcmp; then
    if [ ! -f .gpu-debs/attention_prev.cu ]; then
        say "attcmp: NOT RUN: .gpu-debs/attention_prev.cu is missing (sh bench/gpu/fetch-debs.sh"
        say "        on the development machine writes it)"
        not_run="$not_run attcmp"
    else
        stage attcmp 120 45 "make bench/gpu/kernel_bench_prev &&
            ./bench/gpu/kernel_bench_prev --attention --shape 1b --shape 124m"
        rc=$?
        if [ $rc -ne 125 ]; then
            [ $rc -eq 0 ] || status=1
            cp "$LOGS/attcmp.log" "$OUT/attention.txt"
            grep -E '^ceilings|^attention|FAIL|kernel_bench' "$LOGS/attcmp.log" | tee -a "$SUMMARY"
        fi
    fi
fi
has model && test_stage model 90 20 tests/test_cuda_model
for s in 1b 124m; do
    has "kbench$s" || continue
    stage "kbench$s" 120 40 "./bench/gpu/kernel_bench --shape $s --tsv '$LOGS/kernels_$s.tsv'"
    rc=$?
    [ $rc -eq 125 ] && continue
    [ $rc -eq 0 ] || status=1
    cat "$LOGS/kbench$s.log" >>"$OUT/kernels.txt"
    cat "$LOGS/kernels_$s.tsv" >>"$OUT/kernels.tsv" 2>/dev/null
    grep -E '^ceilings|FAIL|kernel_bench:' "$LOGS/kbench$s.log" | tee -a "$SUMMARY"
done

# ---- call 2: training, the benchmark against PyTorch, the injected slowdown
has train && test_stage train 200 60 tests/test_cuda_train.sh
if has bench; then
    # bench.py starts each run only where its minimum still fits before
    # --until; a run it leaves out is in the table as NOT RUN
    until=$((T0 + DEADLINE - 5))
    stage bench 1000 60 "PYTHON3=$PY $PY bench/gpu/bench.py . '$LOGS/bench' --pairs $BENCH_PAIRS --until $until" ||
        status=1
    for f in bench.md bench.json; do cp "$LOGS/bench/$f" "$OUT/" 2>/dev/null; done
    grep -E 'ceilings|tokens/s|failed|NOT RUN' "$LOGS/bench.log" 2>/dev/null | tee -a "$SUMMARY"
    [ -f "$OUT/bench.md" ] && cat "$OUT/bench.md" >>"$SUMMARY"
fi
has inject && test_stage inject 90 45 tests/test_cuda_inject.sh

# ---- call 3: the data plane, many ranks, the job, the snapshot stall
has nccl && test_stage nccl 60 20 tests/test_comm_nccl.sh
if has multirank; then
    test_stage multirank 200 60 tests/test_cuda_multirank.sh
    grep -E '^\[[0-9]+ s\] (ok|FAIL|==|NCCL|the NCCL|PASS)' tests/test_cuda_multirank.log 2>/dev/null |
        tee -a "$SUMMARY"
fi
if has job; then
    # the README's by-hand command: 4 ranks share the GPU, MPI data plane,
    # a straggler from step 10; the loop must re-plan and reach step 30
    rm -rf /tmp/malleus-gpu-run
    stage job 120 45 "NPROCS=4 MALLEUS_BIN=$PWD RUN_DIR=/tmp/malleus-gpu-run MODEL=tiny STEPS=30 MALLEUS_GPU_BIND=verbose TRAIN_ARGS='--change-cost 0 --inject 3:4:10 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0' bash jobs/malleus-gpu.sbatch && grep -q 're-plan requested' /tmp/malleus-gpu-run/events.log && grep -q 'done: 30 steps' /tmp/malleus-gpu-run/events.log"
    rc=$?
    if [ $rc -ne 125 ]; then
        { cat "$LOGS/job.log"; echo "== events.log"; cat /tmp/malleus-gpu-run/events.log; } >"$OUT/job.txt" 2>&1
        grep -E '^malleus-gpu:|adaptive-loop:' "$LOGS/job.log" | head -12 | tee -a "$SUMMARY"
        [ $rc -eq 0 ] || status=1
    fi
fi
if has async; then
    # the 1b shape's state (fp32 parameters and both moments: 11.4 GB)
    # written synchronously and in the background, one repetition
    stage async 120 45 "make bench/snapshot/bench_async >/dev/null && ./bench/snapshot/bench_async --device cuda --model 1b --dir /tmp/malleus-bench-async --reps 1 --steps 3 --global-batch 8 --micro-batch 1; rc=\$?; rm -rf /tmp/malleus-bench-async; exit \$rc"
    rc=$?
    if [ $rc -ne 125 ]; then
        [ $rc -eq 0 ] || status=1
        { echo "==== async"; cat "$LOGS/async.log"; } >>"$OUT/stall.txt" 2>/dev/null
        grep -iE 'stall|synchronous' "$LOGS/async.log" 2>/dev/null | tail -4 | tee -a "$SUMMARY"
    fi
fi
if has zeromaster; then
    # the sharded fp32 master (--zero-master on) with a bf16 working copy:
    # 4 ranks share the GPU (MPI data plane), the same losses bit for bit
    # as the whole master, and the accountant's master per rank lower
    zm="rm -f /tmp/zm_*.jsonl; for z in off on; do $MPIEXEC -n 4 ./malleus-train --device cuda --comm mpi --precision bf16 --model tiny --plan tests/plans/four.json --global-batch 16 --steps 8 --warmup 2 --lr 3e-3 --zero 1 --zero-master \$z --metrics /tmp/zm_\$z.jsonl > /tmp/zm_\$z.log 2>&1 || { cat /tmp/zm_\$z.log; exit 1; }; grep -E 'fp32 master|rank [0-9]:.*master' /tmp/zm_\$z.log; done; a=\$(sed 's/.*\"loss\": *\\([^,]*\\),.*/\\1/' /tmp/zm_off.jsonl); b=\$(sed 's/.*\"loss\": *\\([^,]*\\),.*/\\1/' /tmp/zm_on.jsonl); echo \"losses off: \$a\"; echo \"losses on:  \$b\"; [ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ]"
    stage zeromaster 90 30 "$zm"
    rc=$?
    [ $rc -ne 125 ] && { [ $rc -eq 0 ] || status=1; tail -14 "$LOGS/zeromaster.log" | tee -a "$SUMMARY"; }
fi
if has migrate; then
    stage migrate 120 45 "DEVICE=cuda COMM=mpi WARM_MB=0 sh bench/migrate/run.sh . small"
    rc=$?
    if [ $rc -ne 125 ]; then
        [ $rc -eq 0 ] || status=1
        { echo "==== migrate"; cat "$LOGS/migrate.log"; } >>"$OUT/stall.txt" 2>/dev/null
        grep -iE 'online|restart|moved' "$LOGS/migrate.log" 2>/dev/null | tail -6 | tee -a "$SUMMARY"
    fi
fi
finish
