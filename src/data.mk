# src/data.mk: data files, sampling, default corpus, malleus-tokenize.

libmalleus_a_SOURCES += src/data.h src/data.c src/corpus.h src/corpus.c \
	src/data_synth.h src/data_synth.c

bin_PROGRAMS += malleus-tokenize
malleus_tokenize_SOURCES = src/tokenize_main.c

check_PROGRAMS += tests/test_data
tests_test_data_SOURCES = tests/test_data.c
TESTS += tests/test_data

dist_check_SCRIPTS += tests/test_tokenize.sh
TESTS += tests/test_tokenize.sh

check_PROGRAMS += tests/test_data_synth
tests_test_data_synth_SOURCES = tests/test_data_synth.c
TESTS += tests/test_data_synth
