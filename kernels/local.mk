# kernels/: the compute-operation table (kernels.h) and its CPU backend;
# this fragment is included by Makefile.am.

libmalleus_a_SOURCES += kernels/kernels.h kernels/registry.c kernels/hostpool.c \
	kernels/memacct.c kernels/cpu.c

# every CPU operation against a naive double-precision reference and
# finite differences
check_PROGRAMS += tests/test_ops
TESTS += tests/test_ops
tests_test_ops_SOURCES = tests/test_ops.c tests/mal_test.h

# the memory accountant: every buffer counted by category, the model's
# buffers as mal_model_bytes promised
check_PROGRAMS += tests/test_memacct
TESTS += tests/test_memacct
tests_test_memacct_SOURCES = tests/test_memacct.c tests/mal_test.h

# the CPU backends' bf16 compute: every operation's results exactly the fp32
# compute's, rounded once to nearest even where stored in bf16
check_PROGRAMS += tests/test_ops_bf16
TESTS += tests/test_ops_bf16
tests_test_ops_bf16_SOURCES = tests/test_ops_bf16.c tests/mal_test.h tests/mal_test_rand.h
