# jobs/: sbatch scripts users submit.
EXTRA_DIST += jobs/train-single.sbatch
