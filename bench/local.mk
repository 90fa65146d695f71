# bench/: the PyTorch peer of Malleus's model (bench/torch_model.py), the
# single-process training benchmark (bench/bench_train.py, run by hand, not
# part of `make check`) and the test that checks malleus-train against it.

EXTRA_DIST += bench/README.md bench/torch_model.py bench/bench_train.py tests/torch_ref.py \
	bench/models/small-gqa.json

dist_check_SCRIPTS += tests/test_torch_ref.sh
TESTS += tests/test_torch_ref.sh

# Runtime and adaptation benchmarks (run by hand).
# Token-data memory: a large token file costs a rank what a small one does.
EXTRA_DIST += bench/data/rss.sh

EXTRA_DIST += bench/parallel/run.py bench/parallel/overlap.py bench/adapt/run.py \
    bench/migrate/run.sh bench/links/run.sh bench/memory/run.sh

# The fine-tuning path end to end (run by hand): bench/finetune/run.sh.
EXTRA_DIST += bench/finetune/run.sh bench/finetune/setup.py

# Online migration benchmark: built with the tests so that it keeps
# compiling, run by hand (bench/migrate/run.sh), never by make check.
check_PROGRAMS += bench/migrate/bench_migrate
bench_migrate_bench_migrate_SOURCES = bench/migrate/bench_migrate.c

# The paper's experiment simulated: built with the tests so that
# it keeps compiling, run by hand (bench/paper/run.sh), never by make check.
check_PROGRAMS += bench/paper/bench_paper
bench_paper_bench_paper_SOURCES = bench/paper/bench_paper.c
EXTRA_DIST += bench/paper/run.sh bench/paper/plot.py bench/costmodel/run.py
