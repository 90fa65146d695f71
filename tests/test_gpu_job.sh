#!/bin/sh
# The GPU job script without a GPU: jobs/gpu-bind.sh's rank -> GPU mapping
# (Slurm's, MPICH's and Open MPI's local ranks, GPU lists of numbers and of
# UUIDs, more ranks than GPUs, MALLEUS_GPU_BIND=off, a bad local rank), and
# jobs/malleus-gpu.sbatch run outside Slurm with DEVICE=cpu (2 ranks through
# mpiexec and the bind wrapper, the whole adaptive loop) plus its refusals
# (DEVICE=cuda without a GPU; NCCL with more ranks than GPUs).  The script's
# srun path and a real GPU binding need a GPU cluster (README "Jobs").
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
BIND="$top_srcdir/jobs/gpu-bind.sh"
W=$(mktemp -d /tmp/malleus-test-gpu-job-XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0

# bind ENV... -> what CUDA_VISIBLE_DEVICES the command sees
bind() {
    env -u SLURM_LOCALID -u MPI_LOCALRANKID -u OMPI_COMM_WORLD_LOCAL_RANK "$@" \
        sh "$BIND" sh -c 'echo "${CUDA_VISIBLE_DEVICES-unset}"'
}
want() {
    got=$1 exp=$2 what=$3
    if [ "$got" = "$exp" ]; then echo "ok: $what -> $got"; else
        echo "FAIL: $what -> '$got', wanted '$exp'"
        fails=$((fails + 1))
    fi
}
want "$(bind SLURM_LOCALID=2 CUDA_VISIBLE_DEVICES=4,5,6,7)" 6 "Slurm local rank 2 of GPUs 4-7"
want "$(bind SLURM_LOCALID=0 CUDA_VISIBLE_DEVICES=4,5,6,7)" 4 "Slurm local rank 0"
want "$(bind SLURM_LOCALID=5 CUDA_VISIBLE_DEVICES=4,5,6,7)" 5 "6 ranks on 4 GPUs share round-robin"
want "$(bind MPI_LOCALRANKID=3 CUDA_VISIBLE_DEVICES=0,1,2,3)" 3 "MPICH's local rank"
want "$(bind OMPI_COMM_WORLD_LOCAL_RANK=1 CUDA_VISIBLE_DEVICES=0,1)" 1 "Open MPI's local rank"
want "$(bind SLURM_LOCALID=1 MPI_LOCALRANKID=0 CUDA_VISIBLE_DEVICES=0,1)" 1 "srun's local rank first"
want "$(bind SLURM_LOCALID=1 CUDA_VISIBLE_DEVICES=GPU-aa11,GPU-bb22)" GPU-bb22 "GPU UUIDs"
want "$(bind SLURM_LOCALID=3 CUDA_VISIBLE_DEVICES=0)" 0 "4 ranks share one GPU"
want "$(bind SLURM_LOCALID=1 CUDA_VISIBLE_DEVICES=0,1 MALLEUS_GPU_BIND=off)" 0,1 "MALLEUS_GPU_BIND=off"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    want "$(bind SLURM_LOCALID=1)" unset "no GPU: nothing set"
fi
bind SLURM_LOCALID=x CUDA_VISIBLE_DEVICES=0 >/dev/null 2>&1
want $? 2 "a local rank that is not a number"

# The job outside Slurm on CPUs: 2 ranks, the loop to the end.
export MALLEUS_BIN="$top_builddir" MALLEUS_LOOP="$top_srcdir/jobs/adaptive-loop.sh"
export OPENBLAS_NUM_THREADS=1
# (SNAPSHOT_ASYNC=1: the background snapshots a cuda job writes by default)
out=$(DEVICE=cpu NPROCS=2 RUN_DIR="$W/run" MODEL=tiny STEPS=4 GLOBAL_BATCH=8 PIPELINES=1 \
    SNAPSHOT_EVERY=2 SNAPSHOT_ASYNC=1 timeout 300 bash "$top_srcdir/jobs/malleus-gpu.sbatch" 2>&1)
rc=$?
want $rc 0 "DEVICE=cpu job outside Slurm (exit status)"
echo "$out" | grep -q 'malleus-gpu: 2 ranks, 2 per node, .* device cpu, comm mpi, snapshots in the background' ||
    { echo "$out" | tail -20; echo "FAIL: no start line"; fails=$((fails + 1)); }
grep -q 'done: 4 steps' "$W/run/events.log" 2>/dev/null ||
    { echo "$out" | tail -20; echo "FAIL: the loop did not finish"; fails=$((fails + 1)); }
[ -f "$W/run/snap.0/latest" ] || { echo "FAIL: no snapshot"; fails=$((fails + 1)); }

# Refusals, before anything runs.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    err=$(env -u SLURM_GPUS_ON_NODE DEVICE=cuda NPROCS=2 RUN_DIR="$W/r2" bash "$top_srcdir/jobs/malleus-gpu.sbatch" 2>&1)
    want $? 2 "DEVICE=cuda without a GPU"
    echo "$err" | grep -q 'no GPU on this node' || { echo "FAIL: message: $err"; fails=$((fails + 1)); }
fi
err=$(SLURM_GPUS_ON_NODE=1 DEVICE=cuda COMM=nccl NPROCS=2 RUN_DIR="$W/r3" \
    bash "$top_srcdir/jobs/malleus-gpu.sbatch" 2>&1)
want $? 2 "COMM=nccl with 2 ranks on 1 GPU"
echo "$err" | grep -q 'NCCL refuses two ranks on one GPU' || { echo "FAIL: message: $err"; fails=$((fails + 1)); }
[ ! -e "$W/r3" ] || { echo "FAIL: a refused job wrote $W/r3"; fails=$((fails + 1)); }

[ $fails -eq 0 ] && echo "PASS: GPU job script (bind wrapper, loop on CPUs, refusals)" && exit 0
echo "FAIL: $fails check(s)"
exit 1
