# Reading malleus-train snapshots from the Python tests (tests/torch_ref.py,
# tests/gpu_peer_ref.py, bench/gpu/torch_peer.py): through h5py where it can
# be imported (the index's virtual datasets), otherwise through
# tests/snapdump (the library's own reader, every block verified) into a
# safetensors file read with numpy alone -- the GPU machine's PyTorch venv
# has numpy but no h5py, and nothing can be installed there.
#
# open_snapshot(DIR) returns (f, step_dir); f answers what the callers use of
# an h5py.File: f["param/layers.0.wq"][...] (or [()]), f["param"].keys(),
# f["param"]["layers.0.wq"][...], "param/x" in f, f.attrs (step,
# consumed_samples, seed, rng_counter as int; config_json, train_json,
# plan_json as str), f.filename, with f: ....
#
# MALLEUS_SNAPSHOT_READER=h5py|snapdump forces a reader; the snapdump binary
# is $MALLEUS_SNAPDUMP, else $top_builddir/tests/snapdump (make check exports
# top_builddir), else tests/snapdump next to this file (an in-tree build).
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np

try:
    import h5py
except ImportError:
    h5py = None

HERE = os.path.dirname(os.path.abspath(__file__))


def reader():
    """The reader open_snapshot uses: "h5py" or "snapdump"."""
    want = os.environ.get("MALLEUS_SNAPSHOT_READER", "")
    if want not in ("", "h5py", "snapdump"):
        raise RuntimeError("MALLEUS_SNAPSHOT_READER=%s: expected h5py or snapdump" % want)
    if want == "h5py" and h5py is None:
        raise RuntimeError("MALLEUS_SNAPSHOT_READER=h5py, but h5py cannot be imported")
    return want or ("h5py" if h5py is not None else "snapdump")


def snapdump_path():
    p = os.environ.get("MALLEUS_SNAPDUMP")
    if p:
        return p
    b = os.environ.get("top_builddir")
    return os.path.join(b, "tests", "snapdump") if b else os.path.join(HERE, "snapdump")


def step_dir_of(d):
    """The newest committed snapshot under d (through its `latest`)."""
    with open(os.path.join(d, "latest")) as f:
        target = f.read().strip()
    step_dir = target if os.path.isabs(target) else os.path.join(d, target)
    if not os.path.exists(os.path.join(step_dir, "COMPLETE")):
        raise RuntimeError("snapshot %s has no COMPLETE marker" % step_dir)
    return step_dir


class _Tensor:
    def __init__(self, array):
        self._a = array
        self.shape, self.dtype = array.shape, array.dtype

    def __getitem__(self, idx):  # a fresh, writable array, as h5py returns
        return np.array(self._a[idx])


class _Group:
    def __init__(self, f, prefix):
        self._f, self._p = f, prefix

    def keys(self):
        return self._f._children(self._p)

    def __iter__(self):
        return iter(self.keys())

    def __contains__(self, name):
        return "%s/%s" % (self._p, name) in self._f

    def __getitem__(self, name):
        return self._f["%s/%s" % (self._p, name)]


class SafetensorsSnapshot:
    """A snapdump file read with numpy: float32 tensors by snapshot name."""

    def __init__(self, path):
        self.filename = path
        with open(path, "rb") as fh:
            data = fh.read()
        if len(data) < 8:
            raise RuntimeError("%s: not a safetensors file (%d bytes)" % (path, len(data)))
        n = int.from_bytes(data[:8], "little")
        if n > len(data) - 8:
            raise RuntimeError("%s: header of %d bytes in a %d-byte file" % (path, n, len(data)))
        header = json.loads(data[8:8 + n].decode("utf-8"))
        meta = header.pop("__metadata__", {})
        if meta.get("format") != "malleus-snapdump":
            raise RuntimeError("%s: not written by tests/snapdump" % path)
        self.attrs = {k: (int(v) if k in ("step", "consumed_samples", "seed", "rng_counter")
                          else v) for k, v in meta.items() if k != "format"}
        self._t, end = {}, 0
        for name, e in header.items():
            a, b = e["data_offsets"]
            count = int(np.prod(e["shape"], dtype=np.int64))
            if e["dtype"] != "F32" or a != end or b - a != 4 * count or 8 + n + b > len(data):
                raise RuntimeError("%s: bad entry for %s: %s" % (path, name, e))
            self._t[name] = np.frombuffer(data, dtype="<f4", count=count,
                                          offset=8 + n + a).reshape(e["shape"])
            end = b
        if 8 + n + end != len(data):
            raise RuntimeError("%s: %d bytes of data, the header lists %d"
                               % (path, len(data) - 8 - n, end))

    def _children(self, prefix):
        p = prefix + "/"
        return sorted({k[len(p):].split("/")[0] for k in self._t if k.startswith(p)})

    def __contains__(self, key):
        return key in self._t or bool(self._children(key))

    def __getitem__(self, key):
        if key in self._t:
            return _Tensor(self._t[key])
        if self._children(key):
            return _Group(self, key)
        raise KeyError("%s: no tensor or group %s" % (self.filename, key))

    def keys(self):
        return sorted({k.split("/")[0] for k in self._t})

    def close(self):
        self._t = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def dump(step_dir, out):
    """Run tests/snapdump on step_dir, writing the safetensors file out."""
    exe = snapdump_path()
    if not os.access(exe, os.X_OK):
        raise RuntimeError("no h5py, and %s is not built (make check builds it; or set "
                           "MALLEUS_SNAPDUMP)" % exe)
    r = subprocess.run([exe, "--quiet", step_dir, out], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        raise RuntimeError("%s %s failed (exit %d): %s" % (exe, step_dir, r.returncode,
                                                          r.stdout.strip()))


def open_step(step_dir, how=None):
    """The snapshot in step directory step_dir through reader `how`
    (default: reader())."""
    how = how or reader()
    if how == "h5py":  # index.h5 (format 2), or a format-1 state.h5
        path = os.path.join(step_dir, "state.h5")
        if not os.path.exists(path):
            h5s = sorted(x for x in os.listdir(step_dir) if x.endswith(".h5"))
            if not h5s:
                raise RuntimeError("no .h5 file in snapshot %s" % step_dir)
            path = os.path.join(step_dir, h5s[0])
        return h5py.File(path, "r")
    tmp = tempfile.mkdtemp(prefix="snapread.")
    try:
        path = os.path.join(tmp, os.path.basename(os.path.normpath(step_dir)) + ".safetensors")
        dump(step_dir, path)
        f = SafetensorsSnapshot(path)
        f.filename = step_dir + " (tests/snapdump)"
        return f
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_snapshot(d, how=None):
    """(f, step_dir): the newest committed snapshot under d (through the
    `latest` pointer file); raises if it cannot be found or read."""
    step_dir = step_dir_of(d)
    return open_step(step_dir, how), step_dir


def read_group(f, group, names):
    """{name: float64 array} of tensors group/name (all must exist)."""
    out = {}
    for n in names:
        key = "%s/%s" % (group, n)
        if key not in f:
            raise RuntimeError("snapshot %s lacks tensor %s" % (f.filename, key))
        out[n] = np.asarray(f[key][...], dtype=np.float64)
    return out
