# kernels/: the compute-operation table (kernels.h) and its CPU backend;
# this fragment is included by Makefile.am.

libmalleus_a_SOURCES += kernels/kernels.h kernels/registry.c kernels/hostpool.c kernels/cpu.c

# every CPU operation against a naive double-precision reference and
# finite differences
check_PROGRAMS += tests/test_ops
TESTS += tests/test_ops
tests_test_ops_SOURCES = tests/test_ops.c tests/mal_test.h
