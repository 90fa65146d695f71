#!/bin/sh
# A snapshot is readable without Malleus code: `tests/test_snapshot
# --write-demo` writes one whose tensors are split into blocks over three
# shard files; h5py (Debian's python3-h5py), run from another directory,
# reads every tensor by name through the virtual datasets of index.h5 and
# compares it bit for bit with values it computes itself, checks the block
# table against the shard files (every block's CRC-32C and the index's own
# checksum in COMPLETE, with its own CRC implementation), and h5dump lists
# and reads a tensor.  Exit 77 if h5py is missing.
set -u
: "${top_builddir:=.}"
PY=${PYTHON3:-/usr/bin/python3}
[ -x "$PY" ] || PY=/usr/bin/python3
if ! "$PY" -c 'import h5py, numpy' 2>/dev/null; then
    echo "h5py/numpy not importable by $PY: skipping"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/malleus-snap-h5py.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM

step_dir=$("$top_builddir/tests/test_snapshot" --write-demo "$tmp/snap") || {
    echo "FAIL: writing the demo snapshot"
    exit 1
}

"$PY" - "$tmp/snap" <<'EOF' || exit 1
import json, os, sys
import h5py
import numpy as np

def crc32c(data, crc=0):
    # bitwise CRC-32C (Castagnoli, reflected 0x82F63B78): independent of mal_crc32c
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283, "python CRC-32C self-check"

def s(v):
    return v.decode() if isinstance(v, bytes) else str(v)

snap = sys.argv[1]
with open(os.path.join(snap, "latest")) as f:
    step_dir = os.path.join(snap, f.read().strip())
with open(os.path.join(step_dir, "COMPLETE")) as f:
    marker = json.load(f)

def expect(shape, salt):
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    v = (((i * 37 + salt * 101) % 1001) - 500).astype(np.float32) / np.float32(64)
    return v.reshape(shape)

special = np.array([0x00000000, 0x80000000, 0x00000001, 0x7f7fffff,
                    0x7f800000, 0xff800000, 0x7fc00123, 0x3fc00000], dtype="<u4")
want = {
    "param/layers.0.wq": expect((8, 6), 1),
    "adam_m/lm_head": expect((3, 4, 5), 2),
    "special": special.view("<f4"),
}

os.chdir("/")  # relative source file names must resolve next to index.h5, not in the cwd
index = os.path.join(step_dir, "index.h5")
with open(index, "rb") as fh:
    ib = fh.read()
assert marker["format"] == "malleus-snapshot" and marker["format_version"] == 2
assert marker["step"] == 42 and marker["n_tensors"] == len(want)
assert marker["n_shards"] == 3 and marker["n_blocks"] == 6
assert marker["index_bytes"] == len(ib) and marker["index_crc32c"] == crc32c(ib), marker

with h5py.File(index, "r") as f:
    a = f.attrs
    assert s(a["format"]) == "malleus-snapshot", a["format"]
    assert int(a["format_version"]) == 2
    assert int(a["step"]) == 42 and int(a["consumed_samples"]) == 4200
    assert int(a["seed"]) == 0xFEEDFACECAFEBEEF, a["seed"]
    assert int(a["rng_counter"]) == 7
    assert json.loads(s(a["config_json"])) == {"d_model": 64}
    assert json.loads(s(a["train_json"])) == {"lr": 0.001}
    assert "plan_json" not in a

    for name, ref in want.items():
        ds = f[name]
        assert ds.is_virtual, name
        got = ds[()]
        assert got.dtype == np.dtype("<f4") and got.shape == ref.shape, (name, got.dtype, got.shape)
        if not np.array_equal(got.view("<u4"), ref.view("<u4")):
            sys.exit("FAIL: %s differs: %r vs %r" % (name, got.ravel()[:8], ref.ravel()[:8]))
        assert list(ds.attrs["global_shape"]) == list(ref.shape)

    t = f["_malleus"]
    shards = [s(x) for x in t["shards"][()]]
    names = [s(x) for x in t["tensors"][()]]
    assert names == sorted(want, key=lambda n: n.encode()), names
    covered = {n: np.zeros(want[n].shape, dtype=int) for n in names}
    for i, name in enumerate(names):
        nd = int(t["tensor_ndim"][i])
        first, n = int(t["tensor_first_block"][i]), int(t["tensor_n_blocks"][i])
        for k in range(first, first + n):
            off = [int(x) for x in t["block_offset"][k][:nd]]
            ext = [int(x) for x in t["block_extent"][k][:nd]]
            shard = os.path.join(step_dir, shards[int(t["block_shard"][k])])
            dname = name + "/block_" + "_".join(str(o) for o in off)
            with h5py.File(shard, "r") as sf:
                blk = sf[dname][()]
            sl = tuple(slice(o, o + e) for o, e in zip(off, ext))
            assert np.array_equal(blk.view("<u4"), want[name][sl].view("<u4")), (name, off)
            assert crc32c(blk.tobytes()) == int(t["block_crc32c"][k]), (name, off)
            covered[name][sl] += 1
    for name, c in covered.items():
        assert (c == 1).all(), "blocks of %s do not tile it" % name
print("h5py: %d tensors bit-exact through virtual datasets; blocks tile them; checksums agree" % len(want))
EOF

if ! command -v h5dump >/dev/null 2>&1; then
    echo "h5dump not installed (hdf5-tools): skipping the h5dump part"
    exit 77
fi
cd / || exit 99
out=$(h5dump -n "$step_dir/index.h5") || { echo "FAIL: h5dump -n"; exit 1; }
for ds in /param/layers.0.wq /adam_m/lm_head /special; do
    echo "$out" | grep -q "dataset *$ds\$" || { echo "FAIL: h5dump does not list $ds"; echo "$out"; exit 1; }
done
# elements through h5dump's own formatting, from two different shard files:
# wq[0][1] = ((1*37 + 101) % 1001 - 500) / 64 = -5.65625 (shard 0),
# wq[7][5] = ((47*37 + 101) % 1001 - 500) / 64 = 5.296875 (shard 2)
h5dump -d /param/layers.0.wq -s 0,1 -c 1,1 "$step_dir/index.h5" | grep -q -- '-5.65625' || {
    echo "FAIL: h5dump value of /param/layers.0.wq[0][1]"
    exit 1
}
h5dump -d /param/layers.0.wq -s 7,5 -c 1,1 "$step_dir/index.h5" | grep -q -- '(7,5): 5.29688' || {
    echo "FAIL: h5dump value of /param/layers.0.wq[7][5]"
    exit 1
}
echo "h5dump lists and reads the snapshot through its virtual datasets"
exit 0
