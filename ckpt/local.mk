# ckpt/: snapshots (and later resharding); included by Makefile.am.

libmalleus_a_SOURCES += ckpt/snapshot.h ckpt/snapshot.c ckpt/train_ckpt.c
EXTRA_DIST += ckpt/README.md

check_PROGRAMS += tests/test_snapshot
TESTS += tests/test_snapshot
# h5py and h5dump read a snapshot written by `tests/test_snapshot --write-demo`
dist_check_SCRIPTS += tests/test_snapshot_h5py.sh
TESTS += tests/test_snapshot_h5py.sh
