# tests/fuzz/: one libFuzzer harness per parser of outside input, each with
# a committed seed corpus (tests/fuzz/corpus/NAME/, regression inputs
# included).  tests/fuzz/README.md says what each covers and what they found.
#
# * make check replays every committed input through every harness, linked
#   with a plain main() (tests/fuzz/replay.c), with the tree's own compiler.
# * make fuzz builds the harnesses with clang's libFuzzer, AddressSanitizer
#   and UndefinedBehaviorSanitizer in fuzz-build/ (a copy of the distributed
#   sources configured out of tree, like distcheck's) and runs each for
#   FUZZ_SECONDS seconds.  It needs clang and libclang-rt-14-dev
#   (scripts/install-deps.sh installs them).
FUZZ_NAMES = config llmc plan cluster profile rates index marker snapdir idx safetensors

# libFuzzer builds (EXTRA_PROGRAMS: made only by `fuzz-harnesses`, which
# only a tree configured with the fuzzer flags can link).
FUZZ_PROGS = tests/fuzz/fuzz_config tests/fuzz/fuzz_llmc tests/fuzz/fuzz_plan \
	tests/fuzz/fuzz_cluster tests/fuzz/fuzz_profile tests/fuzz/fuzz_rates \
	tests/fuzz/fuzz_index tests/fuzz/fuzz_marker tests/fuzz/fuzz_snapdir tests/fuzz/fuzz_idx \
	tests/fuzz/fuzz_safetensors
EXTRA_PROGRAMS = $(FUZZ_PROGS)
FUZZ_LINK = -fsanitize=fuzzer
tests_fuzz_fuzz_config_SOURCES = tests/fuzz/fuzz_config.c
tests_fuzz_fuzz_config_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_llmc_SOURCES = tests/fuzz/fuzz_llmc.c
tests_fuzz_fuzz_llmc_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_plan_SOURCES = tests/fuzz/fuzz_plan.c
tests_fuzz_fuzz_plan_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_cluster_SOURCES = tests/fuzz/fuzz_cluster.c
tests_fuzz_fuzz_cluster_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_profile_SOURCES = tests/fuzz/fuzz_profile.c
tests_fuzz_fuzz_profile_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_rates_SOURCES = tests/fuzz/fuzz_rates.c
tests_fuzz_fuzz_rates_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_index_SOURCES = tests/fuzz/fuzz_index.c
tests_fuzz_fuzz_index_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_marker_SOURCES = tests/fuzz/fuzz_marker.c
tests_fuzz_fuzz_marker_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_snapdir_SOURCES = tests/fuzz/fuzz_snapdir.c
tests_fuzz_fuzz_snapdir_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_idx_SOURCES = tests/fuzz/fuzz_idx.c
tests_fuzz_fuzz_idx_LDFLAGS = $(FUZZ_LINK)
tests_fuzz_fuzz_safetensors_SOURCES = tests/fuzz/fuzz_safetensors.c
tests_fuzz_fuzz_safetensors_LDFLAGS = $(FUZZ_LINK)
CLEANFILES += $(FUZZ_PROGS)

# The same harnesses with replay.c's main(), for make check.
check_PROGRAMS += tests/fuzz/replay_config tests/fuzz/replay_llmc tests/fuzz/replay_plan \
	tests/fuzz/replay_cluster tests/fuzz/replay_profile tests/fuzz/replay_rates \
	tests/fuzz/replay_index tests/fuzz/replay_marker tests/fuzz/replay_snapdir tests/fuzz/replay_idx \
	tests/fuzz/replay_safetensors
tests_fuzz_replay_config_SOURCES = tests/fuzz/fuzz_config.c tests/fuzz/replay.c
tests_fuzz_replay_llmc_SOURCES = tests/fuzz/fuzz_llmc.c tests/fuzz/replay.c
tests_fuzz_replay_plan_SOURCES = tests/fuzz/fuzz_plan.c tests/fuzz/replay.c
tests_fuzz_replay_cluster_SOURCES = tests/fuzz/fuzz_cluster.c tests/fuzz/replay.c
tests_fuzz_replay_profile_SOURCES = tests/fuzz/fuzz_profile.c tests/fuzz/replay.c
tests_fuzz_replay_rates_SOURCES = tests/fuzz/fuzz_rates.c tests/fuzz/replay.c
tests_fuzz_replay_index_SOURCES = tests/fuzz/fuzz_index.c tests/fuzz/replay.c
tests_fuzz_replay_marker_SOURCES = tests/fuzz/fuzz_marker.c tests/fuzz/replay.c
tests_fuzz_replay_snapdir_SOURCES = tests/fuzz/fuzz_snapdir.c tests/fuzz/replay.c
tests_fuzz_replay_idx_SOURCES = tests/fuzz/fuzz_idx.c tests/fuzz/replay.c
tests_fuzz_replay_safetensors_SOURCES = tests/fuzz/fuzz_safetensors.c tests/fuzz/replay.c
dist_check_SCRIPTS += tests/test_fuzz_corpus.sh
TESTS += tests/test_fuzz_corpus.sh
EXTRA_DIST += tests/fuzz/README.md tests/fuzz/run.sh tests/fuzz/index_seeds.py \
	tests/fuzz/snapdir_seeds.py tests/fuzz/corpus

fuzz-harnesses: $(FUZZ_PROGS)

# make fuzz: the libFuzzer build in fuzz-build/ (configured once, then
# rebuilt incrementally: distdir keeps the sources' times), each harness
# FUZZ_SECONDS seconds from its committed corpus.  New inputs it finds go to
# fuzz-build/work/NAME/, never into the committed corpus; a crash, leak,
# sanitizer report or broken promise stops that harness, leaves the input
# as fuzz-build/work/NAME-crash-*, and makes the target fail.
# FUZZERS=NAME... runs some of them.
FUZZ_SECONDS = 600
FUZZERS = $(FUZZ_NAMES)
FUZZ_CC = mpicc.mpich -cc=clang
FUZZ_CFLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
fuzz:
	@$(SHELL) $(srcdir)/tests/variant-build.sh check-cc fuzz "$(FUZZ_CC)" \
	  "$(FUZZ_CFLAGS) -fsanitize=fuzzer"
	$(MAKE) $(AM_MAKEFLAGS) variant-src VARIANT=fuzz-build
	@$(SHELL) $(srcdir)/tests/variant-build.sh configure fuzz-build "$(FUZZ_CC)" \
	  "$(FUZZ_CFLAGS)"
	cd fuzz-build/build && $(MAKE) $(AM_MAKEFLAGS) fuzz-harnesses
	cd fuzz-build && $(SHELL) src/tests/fuzz/run.sh $(FUZZ_SECONDS) src build/tests/fuzz \
	  $(FUZZERS)
.PHONY: fuzz fuzz-harnesses
