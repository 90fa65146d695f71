# comm/: the communication table (comm.h) and its backends -- MPI (control
# plane always, data plane on host buffers), the ring all-reduce, the MPI
# error conversion both use, the communicator pool, NCCL, the peer watch
# (a heartbeat the waits check) -- with the MPI test launcher.

libmalleus_a_SOURCES += comm/comm.h comm/comm_mpi.h comm/comm_mpi.c comm/comm_pool.h comm/comm_pool.c \
	comm/comm_ring.h comm/comm_ring.c comm/mpi_err.h comm/mpi_err.c comm/mpi_bytes.h \
	comm/mpi_bytes.c comm/registry.c comm/watch.h comm/watch.c

# The NCCL data plane (built with CUDA and NCCL) and its test: every
# data-plane operation against the MPI data plane on a GPU (exit 77
# without one).
if HAVE_NCCL
libmalleus_a_SOURCES += comm/comm_nccl.h comm/comm_nccl.c
check_PROGRAMS += tests/test_comm_nccl
tests_test_comm_nccl_SOURCES = tests/test_comm_nccl.c
dist_check_SCRIPTS += tests/test_comm_nccl.sh
TESTS += tests/test_comm_nccl.sh
else
EXTRA_DIST += comm/comm_nccl.h comm/comm_nccl.c tests/test_comm_nccl.c tests/test_comm_nccl.sh
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
