#!/bin/sh
# tests/snapdump and tests/snapread.py: the Python tests' snapshot reader
# without h5py (the GPU machine's venv has numpy and torch, no h5py).
#   1. snapdump's command line: --help, and exit 2 for a missing snapshot,
#      one never committed, a flipped byte in a block (CRC-32C), no output
#      directory;
#   2. the same snapshots read through h5py (index.h5's virtual datasets)
#      and through snapdump + numpy hold the same tensors, bit for bit, and
#      the same step, seed and config: a one-process snapshot, and the same
#      state resharded onto an 8-rank plan (blocks over seven shard files);
#   3. with h5py hidden (an h5py.py on PYTHONPATH that raises ImportError),
#      tests/gpu_peer_ref.py state -- the multi-rank GPU suite's comparison
#      -- finds 3 + resume 2 = 5 straight steps bit-identical and the
#      resharded snapshot equal to its source, reading through snapdump, and
#      a mismatch against a run of 4 steps.
# Exit 77 where $PYTHON3 lacks numpy, h5py or torch.
set -u
: "${top_srcdir:=.}"
: "${top_builddir:=.}"
PY=${PYTHON3:-/usr/bin/python3}
DUMP=$top_builddir/tests/snapdump
TRAIN=$top_builddir/malleus-train
RESHARD=$top_builddir/malleus-reshard
REF=$top_srcdir/tests/gpu_peer_ref.py
MALLEUS_SNAPDUMP=$DUMP
export MALLEUS_SNAPDUMP PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
"$PY" -c 'import numpy, h5py, torch' 2>/dev/null ||
    { echo "test_snapdump: skipped: $PY cannot import numpy, h5py and torch"; exit 77; }
for p in "$DUMP" "$TRAIN" "$RESHARD"; do
    [ -x "$p" ] || { echo "test_snapdump: $p not built"; exit 99; }
done
W=$(mktemp -d "${TMPDIR:-/tmp}/test_snapdump.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The snapshots: a (5 steps), b (3, then resumed to 5: a's state bit for
# bit), c (a resharded onto mixed_tp.json), d (4 steps: another state).
train() {
    "$TRAIN" --model tiny --quiet --threads 1 --decay-steps 5 "$@" >"$W/train.log" 2>&1 ||
        { cat "$W/train.log"; echo "test_snapdump: malleus-train $* failed"; exit 99; }
}
train --steps 5 --snapshot-dir "$W/a"
train --steps 3 --snapshot-dir "$W/b"
train --steps 5 --snapshot-dir "$W/b" --resume
train --steps 4 --snapshot-dir "$W/d"
"$RESHARD" --quiet "$W/a" "$top_srcdir/tests/plans/mixed_tp.json" "$W/c" >"$W/reshard.log" 2>&1 ||
    { cat "$W/reshard.log"; echo "test_snapdump: malleus-reshard failed"; exit 99; }

# 1. the command line
expect() { # WHAT STATUS PATTERN ARGS...: snapdump exits STATUS, output matches PATTERN
    what=$1 want=$2 pat=$3
    shift 3
    "$DUMP" "$@" >"$W/out" 2>&1
    rc=$?
    if [ $rc -ne "$want" ] || ! grep -Eq "$pat" "$W/out"; then
        cat "$W/out"
        fail "snapdump $what: exit $rc (expected $want, output matching '$pat')"
    else
        echo "ok: snapdump $what: exit $rc: $(head -1 "$W/out")"
    fi
}
expect "--help" 0 '^Usage: tests/snapdump' --help
expect "(no arguments)" 2 'expected SNAPSHOT' --quiet
expect "of a missing snapshot" 2 'does not exist' "$W/none" "$W/x.st"
cp -r "$W/a" "$W/u"
rm "$W/u/step_00000005/COMPLETE"
expect "of a snapshot never committed" 2 'COMPLETE' "$W/u" "$W/x.st"
cp -r "$W/a" "$W/k"
# one byte inside a block's data (blocks are contiguous, from the shard's end)
f=$W/k/step_00000005/shard_00000.h5
size=$(wc -c <"$f")
printf '\377' | dd of="$f" bs=1 seek=$((size - 100)) conv=notrunc 2>/dev/null
expect "of a flipped byte" 2 'CRC|checksum|corrupt' "$W/k" "$W/x.st"
[ -e "$W/x.st" ] && fail "snapdump left $W/x.st behind after refusing its input"
expect "into a missing directory" 2 'create its directory' "$W/a" "$W/no/x.st"
expect "of a step directory" 0 'step 5: 117 tensors' "$W/a/step_00000005" "$W/x.st"

# 2. h5py and snapdump read the same bits
"$PY" - "$top_srcdir/tests" "$W/a" "$W/c" <<'EOF' || fail "h5py and snapdump disagree"
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import snapread
bad = 0
for d in sys.argv[2:]:
    fh, sd = snapread.open_snapshot(d, "h5py")
    fs, _ = snapread.open_snapshot(d, "snapdump")
    n, bad0 = 0, bad
    with fh, fs:
        for k in ("step", "consumed_samples", "seed", "rng_counter", "config_json"):
            a, b = fh.attrs[k], fs.attrs[k]
            a = a.decode() if isinstance(a, bytes) else a
            if (str(a) if k == "config_json" else int(a)) != b:
                print("MISMATCH %s: attribute %s: h5py %r, snapdump %r" % (sd, k, a, b))
                bad += 1
        for g in ("param", "adam_m", "adam_v"):
            names = sorted(fh[g].keys())
            if names != sorted(fs[g].keys()) or not names:
                print("MISMATCH %s: %s: h5py has %d tensors, snapdump %d"
                      % (sd, g, len(names), len(fs[g].keys())))
                bad += 1
                continue
            for name in names:
                x, y = fh[g][name][...], fs["%s/%s" % (g, name)][()]
                n += 1
                if x.dtype != np.float32 or y.dtype != np.float32 or x.shape != y.shape or \
                        x.tobytes() != y.tobytes():
                    diff = int(np.sum(x != y)) if x.shape == y.shape else -1
                    print("MISMATCH %s: %s/%s: %s %s vs %s %s, %d elements differ"
                          % (sd, g, name, x.dtype, x.shape, y.dtype, y.shape, diff))
                    bad += 1
    print("%s: %d tensors and the meta, h5py = snapdump bit for bit%s"
          % (sd, n, "" if bad == bad0 else " NOT (%d mismatches)" % (bad - bad0)))
sys.exit(1 if bad else 0)
EOF

# 3. gpu_peer_ref.py state with h5py hidden
mkdir "$W/noh5py"
echo 'raise ImportError("h5py hidden by tests/test_snapdump.sh")' >"$W/noh5py/h5py.py"
hidden() { PYTHONPATH=$W/noh5py${PYTHONPATH:+:$PYTHONPATH} "$@"; }
r=$(cd "$top_srcdir/tests" && hidden "$PY" -c 'import snapread; print(snapread.reader())' 2>&1)
[ "$r" = snapdump ] || fail "with h5py hidden, snapread.reader() says '$r', not snapdump"
state() { # WANT A B: gpu_peer_ref.py state A B (bit for bit) exits WANT
    hidden "$PY" "$REF" state "$2" "$3" >"$W/state.out" 2>&1
    rc=$?
    if [ $rc -ne "$1" ]; then
        tail -5 "$W/state.out"
        fail "gpu_peer_ref.py state $(basename "$2") $(basename "$3") without h5py: exit $rc, expected $1"
    else
        echo "ok (no h5py): state $(basename "$2") $(basename "$3"): exit $rc: $(tail -1 "$W/state.out")"
    fi
}
state 0 "$W/a" "$W/b"
state 0 "$W/c" "$W/a"
state 1 "$W/a" "$W/d"
grep -q '^MISMATCH param/' "$W/state.out" ||
    fail "the mismatch against 4 steps names no parameter tensor"

[ $fails -eq 0 ] || { echo "test_snapdump: FAIL ($fails)"; exit 1; }
echo "test_snapdump: ok"
