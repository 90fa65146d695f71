# bench/gpu/: the single-GPU benchmark against PyTorch (run by hand on a GPU
# machine through bench/gpu/run.sh) and the CPU-side test of its peer.

EXTRA_DIST += bench/gpu/NOTES.md bench/gpu/flops.py bench/gpu/floors.py bench/presets.py \
	bench/gpu/torch_peer.py bench/gpu/bench.py bench/gpu/run.sh tests/gpu_peer_ref.py \
	bench/gpu/fetch-debs.sh bench/gpu/setup-device.sh bench/gpu/debs.txt

dist_check_SCRIPTS += tests/test_gpu_peer.sh
TESTS += tests/test_gpu_peer.sh

# The per-kernel harness (each CUDA kernel family and the products against
# a float64 reference and its floor at the benchmark shapes): built with
# the GPU tests, run by bench/gpu/run.sh call1; exits 77 without a GPU.
if HAVE_CUDA
check_PROGRAMS += bench/gpu/kernel_bench
bench_gpu_kernel_bench_SOURCES = bench/gpu/kernel_bench.cu
bench/gpu/kernel_bench.$(OBJEXT): kernels/cuda/cuda_ops.h kernels/cuda/cudnn.h kernels/kernels.h \
	base/mal.h
# The harness with the attention kernels of an earlier version beside the
# current ones (rows "(previous)"), for bench/gpu/run.sh's attcmp stage:
# ATTN_PREV names that version's attention.cu (bench/gpu/fetch-debs.sh
# exports it from git into .gpu-debs/).  Not built by default.
ATTN_PREV = $(abs_top_builddir)/.gpu-debs/attention_prev.cu
bench/gpu/kernel_bench_prev$(EXEEXT): bench/gpu/kernel_bench.cu $(ATTN_PREV) libmalleus.a
	$(AM_V_NVCC)$(NVCC) $(NVCC_FLAGS) -I$(top_srcdir)/kernels/cuda -DMAL_ATTN_PREV='"$(ATTN_PREV)"' \
		-c -o bench/gpu/kernel_bench_prev.$(OBJEXT) $(srcdir)/bench/gpu/kernel_bench.cu
	$(AM_V_CCLD)$(LINK) bench/gpu/kernel_bench_prev.$(OBJEXT) $(bench_gpu_kernel_bench_LDADD) $(LIBS)
CLEANFILES += bench/gpu/kernel_bench_prev$(EXEEXT) bench/gpu/kernel_bench_prev.$(OBJEXT)
else
EXTRA_DIST += bench/gpu/kernel_bench.cu
endif
