# src/comm.mk: communication backends (MPI) and the MPI test launcher.

libmalleus_a_SOURCES += src/comm.h src/comm_mpi.h src/comm_mpi.c src/comm_pool.h src/comm_pool.c \
    src/comm_ring.h src/comm_ring.c src/comm_registry.c

check_PROGRAMS += tests/test_comm
tests_test_comm_SOURCES = tests/test_comm.c
# tests/mpirun.sh is the launcher every MPI test script runs through.
dist_check_SCRIPTS += tests/mpirun.sh tests/test_comm.sh
TESTS += tests/test_comm.sh
