# jobs/: sbatch scripts users submit.
EXTRA_DIST += jobs/train-single.sbatch
EXTRA_DIST += jobs/adaptive-loop.sh jobs/malleus.sbatch
