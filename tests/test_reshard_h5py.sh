#!/bin/sh
# Stock h5py reads a full tensor of a sharded snapshot through the index's
# virtual datasets, and it is the tensor the trainer holds: `test_reshard
# --h5py-demo` trains on 8 ranks under a plan with mixed TP sizes, writes a
# snapshot and dumps the shards every rank holds; Python assembles each
# tensor from those dumps (replicas must agree, every element must be
# covered) and compares it bit for bit with index.h5:/param/<name> and
# /adam_v/<name>, reading from another working directory.  Exit 77 if h5py
# is missing.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
PY=${PYTHON3:-/usr/bin/python3}
[ -x "$PY" ] || PY=/usr/bin/python3
if ! "$PY" -c 'import h5py, numpy' 2>/dev/null; then
    echo "h5py/numpy not importable by $PY: skipping"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-reshard-h5py.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
sh "$top_srcdir/tests/mpirun.sh" 8 60 "$top_builddir/tests/test_reshard" --h5py-demo "$W" \
    "$top_srcdir/tests/plans/mixed_tp.json" || exit 1
cd / && "$PY" - "$W" <<'PYEOF' || exit 1
import glob, os, sys
import h5py
import numpy as np

w = sys.argv[1]
with open(os.path.join(w, "snap", "latest")) as f:
    step = os.path.join(w, "snap", f.read().strip())
held = {}
for man in glob.glob(os.path.join(w, "held", "manifest.*.txt")):
    for line in open(man):
        name, fname, nd, o0, o1, e0, e1 = line.split()
        nd, o0, o1, e0, e1 = int(nd), int(o0), int(o1), int(e0), int(e1)
        data = np.fromfile(os.path.join(w, "held", fname), dtype="<f4")
        shape = (e0, e1) if nd == 2 else (e0,)
        held.setdefault(name, []).append(((o0, o1)[:nd], data.reshape(shape)))
assert len(held) > 20, len(held)
n = 0
with h5py.File(os.path.join(step, "index.h5"), "r") as f:
    for name, shards in sorted(held.items()):
        ds = f[name]
        assert ds.is_virtual, name
        got = ds[()]
        full = np.zeros(got.shape, dtype="<f4")
        cnt = np.zeros(got.shape, dtype=int)
        for off, data in shards:
            sl = tuple(slice(o, o + e) for o, e in zip(off, data.shape))
            prev = full[sl][cnt[sl] > 0]
            assert np.array_equal(prev.view("<u4"), data[cnt[sl] > 0].view("<u4")), \
                "replicas of %s disagree" % name
            full[sl] = data
            cnt[sl] += 1
        assert (cnt > 0).all(), "the ranks do not hold all of %s" % name
        if not np.array_equal(got.view("<u4"), full.view("<u4")):
            sys.exit("FAIL: %s through h5py differs from what the trainer holds" % name)
        n += 1
print("h5py: %d full tensors read through virtual datasets equal what the 8 ranks hold" % n)
PYEOF
