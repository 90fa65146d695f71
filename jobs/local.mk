# jobs/: sbatch scripts users submit.
EXTRA_DIST += jobs/train-single.sbatch
EXTRA_DIST += jobs/adaptive-loop.sh jobs/malleus.sbatch
# The GPU form: one rank per GPU, bound by gpu-bind.sh; its test runs
# without a GPU (the bind wrapper, the loop on CPUs, refusals).
EXTRA_DIST += jobs/malleus-gpu.sbatch jobs/gpu-bind.sh
dist_check_SCRIPTS += tests/test_gpu_job.sh
TESTS += tests/test_gpu_job.sh
