# src/comm.mk: communication backends (MPI) and the MPI test launcher.

libmalleus_a_SOURCES += src/comm.h src/comm_mpi.h src/comm_mpi.c src/comm_pool.h src/comm_pool.c \
    src/comm_ring.h src/comm_ring.c src/comm_registry.c

# The NCCL data plane (built with CUDA and NCCL) and its test: every
# data-plane operation against the MPI data plane on a GPU (exit 77
# without one).
if HAVE_NCCL
libmalleus_a_SOURCES += src/comm_nccl.h src/comm_nccl.c
check_PROGRAMS += tests/test_comm_nccl
tests_test_comm_nccl_SOURCES = tests/test_comm_nccl.c
dist_check_SCRIPTS += tests/test_comm_nccl.sh
TESTS += tests/test_comm_nccl.sh
else
EXTRA_DIST += src/comm_nccl.h src/comm_nccl.c tests/test_comm_nccl.c tests/test_comm_nccl.sh
endif

check_PROGRAMS += tests/test_comm
tests_test_comm_SOURCES = tests/test_comm.c
# tests/mpirun.sh is the launcher every MPI test script runs through.
dist_check_SCRIPTS += tests/mpirun.sh tests/test_comm.sh
TESTS += tests/test_comm.sh

# The control plane from two threads at once (MPI_THREAD_MULTIPLE; the
# background snapshot writer's use).
check_PROGRAMS += tests/test_comm_threads
tests_test_comm_threads_SOURCES = tests/test_comm_threads.c
dist_check_SCRIPTS += tests/test_comm_threads.sh
TESTS += tests/test_comm_threads.sh
