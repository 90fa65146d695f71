# src/: the core layer -- model config and presets, the model, the
# optimizer, plans and layouts, slice arithmetic and tensor pieces, the
# data-parallel gradient sum, the state mover of online migration, data
# files, sampling and the built-in corpus, text generation.

libmalleus_a_SOURCES += src/config.h src/config.c \
	src/model.h src/model.c \
	src/optim.h src/optim.c \
	src/plan.h src/plan.c \
	src/layout.h src/layout.c \
	src/slices.h src/slices.c \
	src/piece.h src/piece.c \
	src/gradsync.h src/gradsync.c \
	src/migrate.h src/migrate.c \
	src/sample.h src/sample.c \
	src/data.h src/data_internal.h src/data.c src/data_spec.c src/data_file.c src/data_sample.c src/corpus.h src/corpus.c \
	src/data_synth.h src/data_synth.c \
	src/tokenizer.h src/tokenizer.c

check_PROGRAMS += tests/test_slices
TESTS += tests/test_slices

# plan files (schema, validation, uniform plans)
check_PROGRAMS += tests/test_plan
TESTS += tests/test_plan

# data files, sampling, the default corpus, malleus-tokenize
check_PROGRAMS += tests/test_data
tests_test_data_SOURCES = tests/test_data.c
TESTS += tests/test_data
dist_check_SCRIPTS += tests/test_tokenize.sh
TESTS += tests/test_tokenize.sh
# data prepared elsewhere (Megatron datasets written by numpy) and blends
# train; bad data is refused before training
dist_check_SCRIPTS += tests/test_data_files.sh
TESTS += tests/test_data_files.sh
EXTRA_DIST += tests/megatron_write.py
# token files are mapped: a 4 GB file costs a rank what a 4 MB one does
dist_check_SCRIPTS += tests/test_data_rss.sh
TESTS += tests/test_data_rss.sh
# tokenizer references, decoding against the tokenizers library's
# (committed fixtures: no Python needed), the records beside token files
check_PROGRAMS += tests/test_tokenizer
tests_test_tokenizer_SOURCES = tests/test_tokenizer.c
TESTS += tests/test_tokenizer
EXTRA_DIST += tests/tokenizers
# the tokenizer from the data's record to the snapshot, the export and
# malleus-sample (numpy; no tokenizers package)
dist_check_SCRIPTS += tests/test_tokenizer_flow.sh
TESTS += tests/test_tokenizer_flow.sh
# scripts/tokenize_hf.py with a tokenizer trained on the fly (needs the
# tokenizers package: skipped where it cannot be installed)
dist_check_SCRIPTS += tests/test_tokenize_hf.sh
TESTS += tests/test_tokenize_hf.sh
check_PROGRAMS += tests/test_data_synth
tests_test_data_synth_SOURCES = tests/test_data_synth.c
TESTS += tests/test_data_synth

# Model configs: bounded sizes, checked arithmetic, the memory check.
dist_check_SCRIPTS += tests/test_model_limits.sh
TESTS += tests/test_model_limits.sh
