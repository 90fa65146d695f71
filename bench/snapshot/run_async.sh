#!/bin/sh
# Asynchronous snapshot benchmark (not part of `make check`): builds
# bench_async in the build directory and runs it with 1 process (2 BLAS
# threads) and with 2 processes (DP 2, 1 BLAS thread each: the replicas
# share the writing, and the writer threads communicate while the loop
# does), in DIR (default /tmp/malleus-bench-async; needs ~2.5 GB free).
# Each takes 1.5-3 minutes on the 2-core development VM: run them under
# the heavy lock one at a time (bench/README.md).
# The third part, "mt", measures what the thread level costs by itself:
# malleus-train on 8 ranks (tiny, DP 2 x TP 2 x PP 2, 30 steps, no periodic
# snapshot) with MPI started as MPI_THREAD_SINGLE and as
# MPI_THREAD_MULTIPLE (--snapshot-async), three times each, alternating: the
# median step time of steps 6-30.
#   sh bench/snapshot/run_async.sh [BUILD_DIR] [DIR] [1|2|mt]
set -e
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-.}
dir=${2:-/tmp/malleus-bench-async}
which=${3:-}
export top_srcdir
make -C "$build" bench/snapshot/bench_async >/dev/null
if [ -z "$which" ] || [ "$which" = 1 ]; then
    echo "== 1 process, 2 BLAS threads"
    OPENBLAS_NUM_THREADS=2 "$build/bench/snapshot/bench_async" --dir "$dir" --reps 3 \
        --global-batch 1 --threads 2
fi
if [ -z "$which" ] || [ "$which" = 2 ]; then
    echo "== 2 processes, DP 2, 1 BLAS thread each"
    OPENBLAS_NUM_THREADS=1 ${MPIEXEC:-mpiexec.mpich} -n 2 "$build/bench/snapshot/bench_async" \
        --dir "$dir" --reps 3 --global-batch 2 --threads 1
fi
if [ -z "$which" ] || [ "$which" = mt ]; then
    echo "== MPI thread level alone: 8 ranks, tiny, median step ms of steps 6-30"
    mkdir -p "$dir"
    for rep in 1 2 3; do
        for mode in single multiple; do
            extra=""
            [ $mode = multiple ] && extra="--snapshot-async"
            rm -rf "$dir/mt-snap"
            OPENBLAS_NUM_THREADS=1 ${MPIEXEC:-mpiexec.mpich} -n 8 "$build/malleus-train" --model tiny \
                --dp 2 --tp 2 --pp 2 --global-batch 16 --micro-batch 2 --steps 30 --quiet \
                --snapshot-dir "$dir/mt-snap" --metrics "$dir/mt.jsonl" $extra
            printf '%-9s rep %d: ' "$mode" "$rep"
            sed -n 's/^{"step": \([0-9]*\), .*"step_ms": \([0-9.]*\),.*/\1 \2/p' "$dir/mt.jsonl" |
                awk '$1 >= 6 { print $2 }' | sort -n | awk '{ v[NR] = $1 } END { printf "%.1f ms\n", v[int((NR + 1) / 2)] }'
        done
    done
fi
rm -rf "$dir"
