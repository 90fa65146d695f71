# jobs/: the job scripts users submit, and the loop they run.  Installed
# under $(pkgdatadir)/jobs, where the scripts look for each other when the
# programs come from PATH.
jobsdir = $(pkgdatadir)/jobs
dist_jobs_SCRIPTS = jobs/adaptive-loop.sh jobs/malleus.sbatch jobs/train-single.sbatch
# The GPU form: one rank per GPU, bound by gpu-bind.sh; its test runs
# without a GPU (the bind wrapper, the loop on CPUs, refusals).
dist_jobs_SCRIPTS += jobs/malleus-gpu.sbatch jobs/gpu-bind.sh
dist_check_SCRIPTS += tests/test_gpu_job.sh
TESTS += tests/test_gpu_job.sh
