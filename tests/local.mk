# tests/: model, trainer and end-to-end tests (other areas list their own
# tests in their local.mk).  EXTRA_DIST carries the shared test helpers.
EXTRA_DIST += tests/mal_test.h tests/mal_test_rand.h tests/tiny_options.h tests/zero_test.h tests/replan_test.h

# The library's layers point one way (docs/DEVELOPING.md, "Layout"), and no two of
# its files call each other in a circle (read from the built objects).
dist_check_SCRIPTS += tests/check_layers.sh tests/check_cycles.sh
TESTS += tests/check_layers.sh tests/check_cycles.sh
# The GPU code queues nothing on the legacy default stream.
dist_check_SCRIPTS += tests/check_streams.sh
TESTS += tests/check_streams.sh

check_PROGRAMS += tests/test_model_grad tests/test_train
TESTS += tests/test_model_grad tests/test_train
# What a training step asks of the kernel table (launches, memsets, drains).
check_PROGRAMS += tests/test_kern_counts
TESTS += tests/test_kern_counts
dist_check_SCRIPTS += tests/test_cli.sh
TESTS += tests/test_cli.sh

# Parallel runtime: plans on 8 ranks against the one-process run.
check_PROGRAMS += tests/test_parallel
dist_check_SCRIPTS += tests/test_parallel.sh
TESTS += tests/test_parallel.sh
EXTRA_DIST += tests/plans/dp8.json tests/plans/tp8.json tests/plans/pp4dp2.json \
	tests/plans/mixed_tp.json tests/plans/uneven_stages.json tests/plans/suspended.json \
	tests/plans/keep_extend.json tests/models/gqa_straddle.json

# The sharded optimizer (ZeRO-1) against the unsharded one and one process.
check_PROGRAMS += tests/test_zero
dist_check_SCRIPTS += tests/test_zero.sh
TESTS += tests/test_zero.sh
EXTRA_DIST += tests/plans/four_moved.json tests/plans/three_replicas.json

# The sharded master (--zero-master on) against the whole one and one
# process; snapshots, resume and malleus-reshard of its blocks.
check_PROGRAMS += tests/test_zero_master
dist_check_SCRIPTS += tests/test_zero_master.sh
TESTS += tests/test_zero_master.sh

# Activation recomputation: every mode bitwise the numbers of none (one
# process, TP 2 x PP 2, a plan mixing modes per stage).
check_PROGRAMS += tests/test_recompute
dist_check_SCRIPTS += tests/test_recompute.sh
TESTS += tests/test_recompute.sh
EXTRA_DIST += tests/plans/tp2pp2.json tests/plans/tp2pp2_mixed.json

# Online fast path: straggler appears and recovers, state migrates in-job.
check_PROGRAMS += tests/test_online
dist_check_SCRIPTS += tests/test_online.sh
TESTS += tests/test_online.sh

# bf16 compute on the CPU: 300 steps against fp32, a rerun, the parallel
# plans, resume (also into the other precision), an online change and the
# opaque backend, against one process (snapshots read by tests/snapdump).
dist_check_SCRIPTS += tests/test_bf16.sh
TESTS += tests/test_bf16.sh

# The adaptive restart loop, with and without Slurm.
dist_check_SCRIPTS += tests/test_loop.sh tests/test_slurm.sh
TESTS += tests/test_loop.sh tests/test_slurm.sh

# A resumed run is its snapshot's run; stop requests by signal (mpiexec,
# the loop); the job scripts with spaces and quotes in their paths, built
# and installed; a time limit under Slurm: warned, stopped, requeued.
dist_check_SCRIPTS += tests/test_resume.sh tests/test_preempt.sh tests/test_jobs.sh \
	tests/test_slurm_preempt.sh
TESTS += tests/test_resume.sh tests/test_preempt.sh tests/test_jobs.sh tests/test_slurm_preempt.sh
EXTRA_DIST += tests/run_watch.sh tests/pip_site.sh
EXTRA_DIST += tests/check_loop.py tests/slurm/cluster.sh tests/slurm/common.sh tests/slurm/nodes.sh \
    tests/slurm/nodes_test.sh tests/slurm/slow_node.sh

# Several Slurm nodes on this machine (network namespaces): one job across
# them; a node that stops answering or dies ends the job step in seconds
# (the ranks' heartbeat, --peer-timeout; under mpiexec: test_peer_watch).
# A node killed under the adaptive loop: the job shrinks onto the others
# and grows back when the node returns (test_shrink, with a rank killed
# too); started again on more nodes, it grows onto them, and a node slow
# run after run is left out (test_grow).
dist_check_SCRIPTS += tests/test_nodes.sh tests/test_peer_watch.sh tests/test_shrink.sh \
	tests/test_grow.sh
TESTS += tests/test_nodes.sh tests/test_peer_watch.sh tests/test_shrink.sh tests/test_grow.sh

# An online plan change leaves the same state as malleus-reshard.
check_PROGRAMS += tests/test_online_reshard
dist_check_SCRIPTS += tests/test_online_reshard.sh
TESTS += tests/test_online_reshard.sh

# Validation loss on 1 process and two 8-rank plans, samples, malleus-sample.
check_PROGRAMS += tests/test_sample
TESTS += tests/test_sample
dist_check_SCRIPTS += tests/test_eval.sh
TESTS += tests/test_eval.sh

# A failing rank brings the job down promptly (mpiexec; Slurm: test_slurm.sh).
dist_check_SCRIPTS += tests/test_dying.sh
TESTS += tests/test_dying.sh

# One exit-status rule for every command.
dist_check_SCRIPTS += tests/test_exit_codes.sh
TESTS += tests/test_exit_codes.sh

# The multi-rank suite again on the cpu-opaque kernel backend, whose device
# buffers the host cannot touch: the device-memory seam, checked without a GPU.
dist_check_SCRIPTS += tests/test_opaque_a.sh tests/test_opaque_b.sh
TESTS += tests/test_opaque_a.sh tests/test_opaque_b.sh
# ...and on it, the staging of every transfer through pooled pinned buffers
# (pinned O(1) times, not per transfer), and the TP time the data plane reports.
check_PROGRAMS += tests/test_staging
dist_check_SCRIPTS += tests/test_staging.sh
TESTS += tests/test_staging.sh

# The multi-rank suite on the GPU (--device cuda, fp32; comm mpi, then nccl
# where 8 ranks can use it); exit 77 without a GPU.  bench/gpu/run.sh runs
# it on a GPU machine (stage multirank).
dist_check_SCRIPTS += tests/test_cuda_multirank.sh
TESTS += tests/test_cuda_multirank.sh

# Snapshots for a Python without h5py (the GPU machine's venv):
# tests/snapdump writes a snapshot's tensors as one safetensors file,
# tests/snapread.py reads it with numpy (h5py where importable); the test
# checks both readers agree bit for bit and runs a comparison without h5py.
check_PROGRAMS += tests/snapdump
tests_snapdump_SOURCES = tests/snapdump.c
dist_check_SCRIPTS += tests/test_snapdump.sh
TESTS += tests/test_snapdump.sh
EXTRA_DIST += tests/snapread.py

# ---- builds of this tree with other flags (make check-sanitize, make fuzz)
# VARIANT/src: a copy of the distributed sources (the checkout is usually
# configured in place, and automake allows no VPATH build of such a tree);
# tests/variant-build.sh configures VARIANT/build from it.  distdir keeps
# the files' times, so a second run rebuilds only what changed.
EXTRA_DIST += tests/variant-build.sh tests/sanitize/lsan.supp
variant-src:
	@test -n "$(VARIANT)" || { echo "variant-src: set VARIANT" >&2; exit 2; }
	@$(MKDIR_P) $(VARIANT)
	@$(MAKE) $(AM_MAKEFLAGS) distdir distdir=$(VARIANT)/src >/dev/null

# make check-sanitize: the whole make check again in san-build/, built by
# clang with AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer,
# every report fatal (halt_on_error) and written to san-build/reports/.
# clang rather than the tree's gcc: its one runtime writes every report,
# ASan's, LeakSanitizer's and UBSan's, to log_path, where gcc's separate
# libubsan prints some on stderr only -- and a test that captures a
# command's stderr would hide them.  A report fails the target even where
# the test passed (a command expected to fail may have failed for the
# sanitizer's reason).  tests/sanitize/lsan.supp lists leaks that are not
# ours.  SAN_TESTS='tests/a.sh ...' runs a subset.
SAN_CC = mpicc.mpich -cc=clang
SAN_CFLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
SAN_TESTS =
SAN_LOG = $(abs_builddir)/san-build/reports/san
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:log_path=$(SAN_LOG) \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(SAN_LOG) \
	LSAN_OPTIONS=suppressions=$(abs_srcdir)/tests/sanitize/lsan.supp:print_suppressions=0
check-sanitize:
	@$(SHELL) $(srcdir)/tests/variant-build.sh check-cc check-sanitize "$(SAN_CC)" "$(SAN_CFLAGS)"
	$(MAKE) $(AM_MAKEFLAGS) variant-src VARIANT=san-build
	@$(SHELL) $(srcdir)/tests/variant-build.sh configure san-build "$(SAN_CC)" "$(SAN_CFLAGS)"
	cd san-build/build && $(MAKE) $(AM_MAKEFLAGS)
	rm -rf san-build/reports && $(MKDIR_P) san-build/reports
	tests='$(SAN_TESTS)'; cd san-build/build && $(SAN_ENV) $(MAKE) $(AM_MAKEFLAGS) check \
	  $${tests:+TESTS="$$tests"}; rc=$$?; \
	cd ../reports && n=`ls | wc -l` && if [ $$n -gt 0 ]; then \
	  for f in `ls | head -3`; do echo "==== $$f"; head -40 "$$f"; done; \
	  for f in `ls | tail -n +4`; do echo "==== $$f: `grep -m1 -E 'ERROR|runtime error' $$f`"; done; \
	  echo "check-sanitize: $$n sanitizer report(s) in san-build/reports (above)" >&2; exit 1; fi; \
	exit $$rc
.PHONY: variant-src check-sanitize

# make check-openmpi: this tree built against Open MPI (Debian's packages
# unpacked into ompi-build/root, never installed: tests/openmpi-build.sh says
# why) and the multi-rank subset of the suite run with it.
EXTRA_DIST += tests/openmpi-build.sh
check-openmpi:
	$(MAKE) $(AM_MAKEFLAGS) variant-src VARIANT=ompi-build
	@$(SHELL) $(srcdir)/tests/openmpi-build.sh ompi-build
.PHONY: check-openmpi
clean-local:
	-rm -rf san-build fuzz-build ompi-build

# Slow links at run time: a plan's deeper warm-up, --inject-link (4 ranks).
dist_check_SCRIPTS += tests/test_inject_link.sh
TESTS += tests/test_inject_link.sh

# The link monitor: an active probe of the plan's links, rates in the
# metrics that malleus-replan --links reads (4 ranks).
dist_check_SCRIPTS += tests/test_link_monitor.sh
TESTS += tests/test_link_monitor.sh
