#!/bin/sh
# jobs/gpu-bind.sh COMMAND [ARGS...]: run COMMAND (one MPI rank) bound to
# its node-local GPU, then exec it.  The launcher (srun, mpiexec) starts one
# of these per rank; jobs/malleus-gpu.sbatch puts it in front of
# malleus-train.
#
#   local rank  SLURM_LOCALID (srun), else MPI_LOCALRANKID (MPICH's
#               mpiexec), else OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), else 0
#   GPUs        CUDA_VISIBLE_DEVICES as Slurm set it for the node's share of
#               the allocation (--gpus-per-node), else every GPU nvidia-smi
#               lists
#   binding     GPU number (local rank mod GPUs) of that list becomes this
#               rank's only visible GPU: CUDA_VISIBLE_DEVICES=<it>, so the
#               cuda backend takes device 0 and NCCL finds its GPU.  More
#               ranks than GPUs share them round-robin (then --comm mpi:
#               NCCL before 2.30 refuses two ranks on one GPU).
#   no GPU      COMMAND runs unchanged (DEVICE=cpu jobs, the tests).
#
# MALLEUS_GPU_BIND=off leaves CUDA_VISIBLE_DEVICES alone (a site whose srun
# binds GPUs itself, e.g. --gpu-bind=single:1).  The binding is printed
# on stderr when MALLEUS_GPU_BIND=verbose.
if [ $# -lt 1 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
[ "${MALLEUS_GPU_BIND:-}" = off ] && exec "$@"
local_rank=${SLURM_LOCALID:-${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-0}}}
case $local_rank in
'' | *[!0-9]*)
    echo "gpu-bind: local rank '$local_rank' is not a number" >&2
    exit 2
    ;;
esac
gpus=${CUDA_VISIBLE_DEVICES-}
if [ -z "$gpus" ] && command -v nvidia-smi >/dev/null 2>&1; then
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    i=0 gpus=
    while [ "$i" -lt "${n:-0}" ]; do
        gpus=${gpus:+$gpus,}$i
        i=$((i + 1))
    done
fi
if [ -n "$gpus" ] && [ "$gpus" != NoDevFiles ]; then
    # the (local rank mod count)-th entry of the comma-separated list
    count=$(echo "$gpus" | tr ',' '\n' | grep -c .)
    pick=$((local_rank % count + 1))
    CUDA_VISIBLE_DEVICES=$(echo "$gpus" | tr ',' '\n' | grep . | sed -n "${pick}p")
    export CUDA_VISIBLE_DEVICES
    [ "${MALLEUS_GPU_BIND:-}" = verbose ] &&
        echo "gpu-bind: local rank $local_rank of $(hostname) -> GPU $CUDA_VISIBLE_DEVICES (of $gpus)" >&2
fi
exec "$@"
