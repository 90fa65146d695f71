# kernels/cuda/: the CUDA backend (built when configure finds the CUDA
# toolkit; see m4/mal_cuda.m4).  The .cu files, one per kernel family
# (common.cuh lists them), are compiled by nvcc through the suffix rule
# below (IOR's way), the host side (cuda.c, runtime.c: the device runtime
# under comm/comm_nccl.c, and cudnn.c: cuDNN's fused attention, loaded at
# run time) by the C compiler like every other file.
# Included by Makefile.am.

CUDA_SRC = kernels/cuda/cuda.c kernels/cuda/cudnn.c kernels/cuda/cudnn.h kernels/cuda/cuda_ops.h \
	kernels/cuda/common.cuh \
	kernels/cuda/emu.h kernels/cuda/runtime.h kernels/cuda/runtime.c \
	kernels/cuda/rmsnorm.cu kernels/cuda/rope.cu kernels/cuda/swiglu.cu \
	kernels/cuda/elementwise.cu kernels/cuda/sumsq.cu kernels/cuda/embedding.cu \
	kernels/cuda/xent.cu kernels/cuda/adamw.cu kernels/cuda/attention.cu kernels/cuda/slow.cu

if HAVE_CUDA
libmalleus_a_SOURCES += $(CUDA_SRC)
else
EXTRA_DIST += $(CUDA_SRC)
endif

SUFFIXES = .cu
# -Xptxas -v prints registers, spills and shared memory per kernel:
# make NVCC_EXTRA=-Xptxas=-v kernels/cuda/attention.o
NVCC_FLAGS = -std=c++17 -O3 $(NVCC_ARCH_FLAGS) -Xcompiler -Wall,-Wno-unused-function \
	-I$(top_srcdir) $(NVCC_EXTRA)
AM_V_NVCC = $(am__v_NVCC_@AM_V@)
am__v_NVCC_ = $(am__v_NVCC_@AM_DEFAULT_V@)
am__v_NVCC_0 = @echo "  NVCC    " $@;
am__v_NVCC_1 =
.cu.$(OBJEXT):
	$(AM_V_NVCC)$(NVCC) $(NVCC_FLAGS) -c -o $@ $<

# nvcc leaves header dependencies to us
kernels/cuda/rmsnorm.$(OBJEXT) kernels/cuda/rope.$(OBJEXT) kernels/cuda/swiglu.$(OBJEXT) \
	kernels/cuda/elementwise.$(OBJEXT) kernels/cuda/sumsq.$(OBJEXT) \
	kernels/cuda/embedding.$(OBJEXT) kernels/cuda/xent.$(OBJEXT) kernels/cuda/adamw.$(OBJEXT) \
	kernels/cuda/attention.$(OBJEXT) kernels/cuda/slow.$(OBJEXT): \
	kernels/cuda/common.cuh kernels/cuda/cuda_ops.h kernels/cuda/emu.h

# The kernels against float64 references: on the CPU through the emulation
# of emu.h (runs everywhere the toolkit's headers are), and on the GPU
# (exits 77 without one).  One source, tests/test_cuda_kernels.cu.  The
# backend through the table against the CPU backend (test_cuda_ops), the
# whole model (test_cuda_model) and malleus-train (test_cuda_train.sh) on
# the GPU: exit 77 without one (test_cuda_model_cpu.sh runs the model
# test's checks, bf16 included, on the CPU backend).  --inject-mode gpu's slowdown as the
# monitor sees it (test_cuda_inject.sh): exit 77 without one.  cuDNN's
# fused attention against the hand kernels and float64, timed
# (test_cuda_cudnn): exit 77 without a GPU or without cuDNN.
# bench/gpu/run.sh runs them on a GPU machine.
# The emulation's own checks (test_emu_checks.sh: each rule it enforces
# stops a kernel that breaks it) run here too.
EXTRA_DIST += tests/cuda_skip.sh
if HAVE_CUDA
check_PROGRAMS += tests/test_cuda_emu tests/test_cuda_kernels tests/test_cuda_ops \
	tests/test_cuda_model tests/test_emu_checks tests/test_cudnn_graph tests/test_cuda_cudnn
TESTS += tests/test_cuda_emu tests/test_cuda_kernels tests/test_cuda_ops tests/test_cuda_model \
	tests/test_cudnn_graph tests/test_cuda_cudnn \
	tests/test_cuda_train.sh tests/test_cuda_inject.sh tests/test_emu_checks.sh \
	tests/test_cuda_model_cpu.sh
dist_check_SCRIPTS += tests/test_cuda_train.sh tests/test_cuda_inject.sh tests/test_emu_checks.sh \
	tests/test_cuda_model_cpu.sh
tests_test_emu_checks_SOURCES = tests/test_emu_checks.cpp
tests_test_emu_checks_CPPFLAGS = -U_FORTIFY_SOURCE $(CUDA_CFLAGS) -I$(top_srcdir)
tests_test_emu_checks_CXXFLAGS = -std=c++17 -O1
tests_test_emu_checks_LDADD =
tests/test_emu_checks.$(OBJEXT): $(CUDA_SRC)
tests_test_cuda_ops_SOURCES = tests/test_cuda_ops.c
tests_test_cuda_model_SOURCES = tests/test_cuda_model.c
# cuDNN's attention graphs against cuDNN's engines for a described H100, no
# GPU needed (the toolkit's stub libcuda stands in for the driver)
tests_test_cudnn_graph_SOURCES = tests/test_cudnn_graph.c
tests_test_cudnn_graph_CPPFLAGS = $(AM_CPPFLAGS) -DMAL_CUDA_DIR='"$(CUDA_DIR)"'
tests_test_cuda_cudnn_SOURCES = tests/test_cuda_cudnn.c
tests_test_cuda_emu_SOURCES = tests/test_cuda_emu.cpp
tests_test_cuda_emu_CPPFLAGS = -U_FORTIFY_SOURCE $(CUDA_CFLAGS) -I$(top_srcdir)
tests_test_cuda_emu_CXXFLAGS = -std=c++17 -O2
tests_test_cuda_emu_LDADD =
tests_test_cuda_kernels_SOURCES = tests/test_cuda_kernels.cu
tests_test_cuda_kernels_LDADD = $(CUDA_LIBS)
tests/test_cuda_emu.$(OBJEXT) tests/test_cuda_kernels.$(OBJEXT): tests/test_cuda_kernels.cu \
	$(CUDA_SRC)
else
EXTRA_DIST += tests/test_cuda_emu.cpp tests/test_cuda_kernels.cu tests/test_cuda_ops.c \
	tests/test_cuda_model.c tests/test_cuda_model_cpu.sh tests/test_cuda_train.sh \
	tests/test_cuda_inject.sh \
	tests/test_emu_checks.cpp tests/test_emu_checks.sh tests/test_cudnn_graph.c \
	tests/test_cuda_cudnn.c
endif
