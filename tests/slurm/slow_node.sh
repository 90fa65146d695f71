#!/bin/sh
# A slow node, for tests: the rank wrapper (jobs/adaptive-loop.sh
# RANK_WRAPPER) that runs its command with --inject R:F (a rank F times
# slower) for every rank R placed on node SLOW_NODE in this Slurm step, so
# that the node's ranks straggle whichever ranks it holds.  Every rank
# computes the same list from the step's node list (ranks in blocks per
# node, srun's default), so all of them run the same command line.
#   SLOW_NODE=n2 SLOW_FACTOR=4 RANK_WRAPPER=tests/slurm/slow_node.sh ...
set -eu
per=$((SLURM_STEP_NUM_TASKS / SLURM_STEP_NUM_NODES))
k=0
for h in $(scontrol show hostnames "$SLURM_STEP_NODELIST"); do
    if [ "$h" = "${SLOW_NODE:?}" ]; then
        i=0
        while [ $i -lt $per ]; do
            set -- "$@" --inject "$((k * per + i)):${SLOW_FACTOR:-4}"
            i=$((i + 1))
        done
    fi
    k=$((k + 1))
done
exec "$@"
