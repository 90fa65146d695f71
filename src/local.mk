# src/: runtime library sources (common, config, model, optimizer, trainer)
# and the program mains (thin shells over the library).

libmalleus_a_SOURCES += src/mal.h src/error.c src/rng.h src/fileio.h src/fileio.c \
	src/config.h src/config.c \
	src/model.h src/model.c \
	src/optim.h src/optim.c \
	src/train.h src/train.c src/train_internal.h \
	src/pipeline.c src/gradsync.c src/layout.h src/layout.c src/monitor.c \
	src/migrate.c src/train_memory.c src/profile_measure.c src/eval.c src/sample.h src/sample.c \
	src/opts.h src/opts.c src/train_cli.h src/train_cli.c

bin_PROGRAMS += malleus-train
malleus_train_SOURCES = src/train_main.c
bin_PROGRAMS += malleus-sample
malleus_sample_SOURCES = src/sample_main.c

libmalleus_a_SOURCES += src/slices.h src/slices.c
check_PROGRAMS += tests/test_slices
TESTS += tests/test_slices

# fileio: atomic-or-direct outputs, bounded inputs; every command's outputs
# against a device node.
check_PROGRAMS += tests/test_fileio
TESTS += tests/test_fileio
dist_check_SCRIPTS += tests/test_outputs.sh
TESTS += tests/test_outputs.sh

# Model configs: bounded sizes, checked arithmetic, the memory check.
dist_check_SCRIPTS += tests/test_model_limits.sh
TESTS += tests/test_model_limits.sh
