# jobs/: sbatch scripts users submit, the restart loop they run, the GPU
# bind wrapper.  `make install` puts them, and the plot script, under
# $(pkgdatadir) (PREFIX/share/malleus) as the tree holds them -- jobs/ and
# scripts/ side by side, so the paths the scripts use between themselves
# hold -- and the programs in $(bindir); tests/test_install.sh runs a job
# from an installed tree.  Architecture-independent scripts that users
# read, copy and submit: data of the package rather than libexec helpers.
jobsdir = $(pkgdatadir)/jobs
dist_jobs_SCRIPTS = jobs/malleus.sbatch jobs/malleus-gpu.sbatch jobs/train-single.sbatch \
	jobs/adaptive-loop.sh jobs/gpu-bind.sh
plotdir = $(pkgdatadir)/scripts
dist_plot_SCRIPTS = scripts/plot-metrics.py
dist_check_SCRIPTS += tests/test_install.sh
TESTS += tests/test_install.sh
dist_check_SCRIPTS += tests/test_gpu_job.sh
TESTS += tests/test_gpu_job.sh
