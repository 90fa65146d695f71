#!/bin/sh
# Snapshot benchmark (not part of `make check`): builds bench_snapshot in
# the build directory and runs it with 1 process, 2 processes (TP 2) and 2
# processes (DP 2),
# in DIR (default /tmp/malleus-bench-snapshot; needs ~3 GB free).
#   sh bench/snapshot/run.sh [BUILD_DIR] [DIR]
set -e
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-.}
dir=${2:-/tmp/malleus-bench-snapshot}
export top_srcdir OPENBLAS_NUM_THREADS=1
make -C "$build" bench/snapshot/bench_snapshot >/dev/null
echo "== 1 process"
"$build/bench/snapshot/bench_snapshot" --dir "$dir" --reps 3
echo "== 2 processes, TP 2"
${MPIEXEC:-mpiexec.mpich} -n 2 "$build/bench/snapshot/bench_snapshot" --dir "$dir" --reps 3
echo "== 2 processes, DP 2 (the replicas share the writing)"
${MPIEXEC:-mpiexec.mpich} -n 2 "$build/bench/snapshot/bench_snapshot" --dir "$dir" --reps 3 --tp 1
rm -rf "$dir"
