#!/usr/bin/env python3
"""Write the seed corpus of tests/fuzz/fuzz_snapdir.c (encoding at its top):
snapshot directories with links, FIFOs, directories and huge files where a
snapshot's entries belong.  python3 tests/fuzz/snapdir_seeds.py OUTDIR"""
import os
import sys

NAMES = ["latest", "COMPLETE", "index.h5", "shard_00000.h5", "step_00000001",
         "step_00000002", "step_00000003", "step_00000010", ".tmp-step_00000004",
         ".tmp-latest", ".lock", "step_x", "step_", "notes.txt", "step_huge", "step_2b"]
N = {n: i for i, n in enumerate(NAMES)}
FILE, DIR, L_FILE, L_SNAP, L_STEP, L_SIB, FIFO, SPARSE, MARKER, COPY, EMPTY = range(11)


def rec(parent, name, kind, *extra):
    return bytes([parent, N[name], kind, *extra])


def text(parent, name, s):
    b = s.encode()
    return rec(parent, name, FILE, len(b)) + b


SEEDS = {
    # a clean committed snapshot, `latest` lagging behind it
    "committed_latest_lags": rec(0, "step_00000002", COPY) + text(0, "latest", "step_00000001\n")
    + bytes([1, 0]),
    # another run's committed step linked in, retention keep 1
    "linked_step_keep1": rec(0, "step_00000001", L_STEP) + rec(0, "step_00000002", COPY)
    + rec(0, "step_00000010", L_SNAP) + bytes([3, 1]),
    # FIFOs as latest and COMPLETE, a sparse 1 TiB index
    "fifos_sparse": rec(0, "latest", FIFO) + rec(0, "step_00000003", DIR)
    + rec(1, "COMPLETE", FIFO) + rec(1, "index.h5", SPARSE, 20) + rec(0, "step_00000002", COPY)
    + bytes([2, 2]),
    # a valid-looking marker over a huge index, shards that are links
    "marker_huge_index": rec(0, "step_00000003", DIR) + rec(1, "COMPLETE", MARKER, 3)
    + rec(1, "index.h5", SPARSE, 10) + rec(1, "shard_00000.h5", L_FILE) + bytes([0, 0]),
    # debris that is a link, a lock that is a FIFO, latest a directory
    "debris_links_lock_fifo": rec(0, ".tmp-latest", L_FILE) + rec(0, ".tmp-step_00000004", L_SNAP)
    + rec(0, ".lock", FIFO) + rec(0, "latest", DIR) + rec(0, "step_00000001", COPY)
    + bytes([5, 3]),
    # the lock a link to the outside file; step names that are files
    "lock_link_step_files": rec(0, ".lock", L_FILE) + text(0, "step_00000001", "not a dir")
    + rec(0, "step_00000002", EMPTY) + rec(0, "step_00000003", COPY) + bytes([0, 3]),
    # links inside a copied step directory, to a sibling and dangling
    "links_inside_step": rec(0, "step_00000002", DIR) + rec(1, "COMPLETE", MARKER, 2)
    + rec(1, "index.h5", L_SIB, N["shard_00000.h5"]) + rec(1, "shard_00000.h5", L_SIB, 0)
    + rec(0, "step_00000010", COPY) + bytes([1, 1]),
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
