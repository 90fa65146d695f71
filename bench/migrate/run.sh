#!/bin/sh
# Online migration benchmark (not part of `make check`): builds
# bench_migrate in the build directory and, on 8 ranks, times plan changes of
# the `small` model (26 M parameters, ~300 MiB of parameters and Adam state)
# both ways: online migrations A -> B -> A ... against the in-process parts of
# the restart path (snapshot, reshard, load).  The plans are made by
# malleus-replan: A uniform dp 2 x tp 2 x pp 2, B for rank 3 eight times slow.
# Before every timed operation each rank touches and frees WARM_MB MiB
# (default 1024; 0: off) so that neither path pays for memory the host has
# not backed yet (bench/README.md).  DEVICE and COMM, when set, pick the
# kernel and communication backends (bench/gpu/run.sh: DEVICE=cuda COMM=mpi,
# 8 ranks sharing one GPU).
#   sh bench/migrate/run.sh [BUILD_DIR] [MODEL]
set -e
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-.}" && pwd)
model=${2:-small}
export OPENBLAS_NUM_THREADS=1
make -C "$build" bench/migrate/bench_migrate >/dev/null
dir=$(mktemp -d /tmp/malleus-bench-migrate-XXXXXX)
trap 'rm -rf "$dir"' EXIT
common="--world-size 8 --ranks-per-node 4 --memory-mb 16384 --model $model -g 16 -b 2"
"$build/malleus-replan" $common --pipelines 2 --uniform -o "$dir/a.json" >/dev/null
echo '{"3": 8.0}' >"$dir/rates.json"
"$build/malleus-replan" $common --rates "$dir/rates.json" --current "$dir/a.json" \
    -o "$dir/b.json" >/dev/null
# C: what the planner also picks for that straggler when the other ranks
# measure slightly slower - rank 3 suspended, rank 2 alone holds a whole
# replica (it receives three quarters of the model, a third of it strided)
L=$("$build/malleus-train" --model "$model" --steps 0 | sed -n 's/^| layers \/ heads \/ ffn | *\([0-9]*\) .*/\1/p')
cat >"$dir/c.json" <<PLAN
{ "format": "malleus-plan/1", "micro_batch_size": 2,
  "pipelines": [
    { "micro_batches": 2, "stages": [ { "ranks": [0, 1], "layers": [0, $L] } ] },
    { "micro_batches": 2, "stages": [ { "ranks": [2], "layers": [0, $L] } ] },
    { "micro_batches": 2, "stages": [ { "ranks": [4, 5], "layers": [0, $L] } ] },
    { "micro_batches": 2, "stages": [ { "ranks": [6, 7], "layers": [0, $L] } ] } ],
  "suspended": [3] }
PLAN
for b in b c; do
    echo "== plan A (uniform) <-> plan $(echo $b | tr bc BC)"
    ${MPIEXEC:-mpiexec.mpich} -n 8 "$build/bench/migrate/bench_migrate" --model "$model" \
        --plan-a "$dir/a.json" --plan-b "$dir/$b.json" --reps 3 --dir "$dir/snap" \
        --warm-mb "${WARM_MB:-1024}" ${DEVICE:+--device "$DEVICE"} ${COMM:+--comm "$COMM"}
done
