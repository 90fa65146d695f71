# ckpt/: sharded snapshots, offline resharding (malleus-reshard's library
# side), export, and their tests and benchmark; included by Makefile.am.

# The snapshot layer, one facility per file (ckpt/snap_internal.h lists them).
# Listed bottom up, as they call each other (snap_internal.h, "who owns what").
libmalleus_a_SOURCES += ckpt/snapshot.h ckpt/snap_internal.h ckpt/snap_fault.c \
	ckpt/snap_crc32c.c ckpt/snap_blocks.c ckpt/snap_fs.c ckpt/snap_find.c ckpt/snap_dest.c \
	ckpt/snap_h5.c \
	ckpt/snap_index.c ckpt/snap_read.c ckpt/snap_coord.c ckpt/snap_commit.c \
	ckpt/snap_write.c ckpt/reshard.h ckpt/reshard.c \
	ckpt/reshard_cli.c ckpt/export.h ckpt/export.c ckpt/export_tok.h ckpt/export_tok.c \
	ckpt/load.h ckpt/load.c ckpt/safetensors.h ckpt/safetensors.c ckpt/hf.h ckpt/hf.c \
	ckpt/import.h ckpt/import.c
EXTRA_DIST += ckpt/README.md

# One process: CRC-32C, blocks and tiling, commit protocol, corruption,
# fault injection.
check_PROGRAMS += tests/test_snapshot
TESTS += tests/test_snapshot
# Snapshot directories as hostile input: links at the names a writer uses,
# links and FIFOs where steps, markers and `latest` belong, the lock and
# probe of a destination.
check_PROGRAMS += tests/test_snapdir
TESTS += tests/test_snapdir
# ... and the commands on such directories, and outputs that are inputs
dist_check_SCRIPTS += tests/test_snapdir_cli.sh
TESTS += tests/test_snapdir_cli.sh
# h5py and h5dump read a snapshot written by `tests/test_snapshot --write-demo`
dist_check_SCRIPTS += tests/test_snapshot_h5py.sh
TESTS += tests/test_snapshot_h5py.sh

# Multi-rank (tests/mpirun.sh, 8 ranks): the reshard matrix over plan pairs,
# exact resume, corruption; crash consistency of the collective writer;
# h5py reads what the trainer holds; the malleus-reshard command line.
check_PROGRAMS += tests/test_reshard
dist_check_SCRIPTS += tests/test_reshard_a.sh tests/test_reshard_b.sh
TESTS += tests/test_reshard_a.sh tests/test_reshard_b.sh
EXTRA_DIST += tests/plans/tp4dp2.json tests/plans/six.json tests/plans/four.json \
	tests/plans/one.json tests/plans/wrong_layers.json tests/plans/wrong_heads.json
dist_check_SCRIPTS += tests/test_snapshot_crash.sh
TESTS += tests/test_snapshot_crash.sh
# Asynchronous snapshots (malleus-train --snapshot-async): the synchronous
# writer's files, exact resume, one in flight, retention, failures.
dist_check_SCRIPTS += tests/test_snapshot_async.sh
TESTS += tests/test_snapshot_async.sh
dist_check_SCRIPTS += tests/test_reshard_h5py.sh
TESTS += tests/test_reshard_h5py.sh
dist_check_SCRIPTS += tests/test_reshard_cli.sh
TESTS += tests/test_reshard_cli.sh

# Benchmark: built with the tests so that it keeps compiling, run by hand
# (bench/snapshot/run.sh), never by make check.
check_PROGRAMS += bench/snapshot/bench_snapshot
bench_snapshot_bench_snapshot_SOURCES = bench/snapshot/bench_snapshot.c bench/snapshot/bench_util.h
# ... and its asynchronous counterpart: the loop's stall against the
# synchronous write (bench/snapshot/run_async.sh).
check_PROGRAMS += bench/snapshot/bench_async
bench_snapshot_bench_async_SOURCES = bench/snapshot/bench_async.c bench/snapshot/bench_util.h
EXTRA_DIST += bench/snapshot/run.sh bench/snapshot/run_async.sh bench/snapshot/README.md \
	bench/snapshot/model.json

# malleus-export: an independent rotate-half LLaMA reads the safetensors
# (CI), and transformers' LlamaForCausalLM where it can be had (else 77).
dist_check_SCRIPTS += tests/test_export.sh tests/test_export_hf.sh
TESTS += tests/test_export.sh tests/test_export_hf.sh
EXTRA_DIST += tests/export_setup.sh tests/hf_ref.py tests/hf_site.sh

# malleus-import and malleus-train --init-from: checkpoints written by
# malleus-export and by numpy (CI), every refusal; and checkpoints made by
# transformers itself (tests/test_import_hf.sh) where it can be had (else 77).
dist_check_SCRIPTS += tests/test_import.sh tests/test_import_hf.sh
TESTS += tests/test_import.sh tests/test_import_hf.sh
EXTRA_DIST += tests/hf_import_ref.py
