# src/: the runtime library by layer (README.md, "Layout") and the program
# mains (thin shells over the library).

# base
libmalleus_a_SOURCES += src/mal.h src/error.c src/rng.h src/opts.h src/opts.c src/fileio.h \
	src/fileio.c
# core: model, optimizer, layout, tensor pieces, gradient sync, state mover
libmalleus_a_SOURCES += src/config.h src/config.c \
	src/model.h src/model.c \
	src/optim.h src/optim.c \
	src/layout.h src/layout.c \
	src/piece.h src/piece.c \
	src/gradsync.h src/gradsync.c \
	src/migrate.h src/migrate.c \
	src/sample.h src/sample.c
# the trainer layer
libmalleus_a_SOURCES += src/train/train.h src/train/train_internal.h src/train/train.c \
	src/train/part.c src/train/pipeline.c src/train/monitor.c src/train/online.c \
	src/train/ckpt.c src/train/ckpt_async.c src/train/eval.c src/train/train_memory.c src/train/profile_measure.c \
	src/train/train_cli.h src/train/train_cli.c

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
