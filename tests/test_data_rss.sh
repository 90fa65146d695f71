#!/bin/sh
# Token files are mapped, not loaded: the peak resident set of a run on a
# 4 GB token file is within 8 MiB of the same run on a 4 MB one
# (bench/data/rss.sh measures it; sparse files, so nothing is written).
# Reading the file whole, as Malleus once did, costs the file's size.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
PY=${PYTHON3:-/usr/bin/python3}
"$PY" -c 'import resource' 2>/dev/null || { echo "no python3: skipped"; exit 77; }
out=$(sh "$top_srcdir/bench/data/rss.sh" "$B" 4 4096 5) || { echo "$out"; exit 1; }
echo "$out"
diff=$(echo "$out" | sed -n 's/^difference: \(-*[0-9]*\) KiB$/\1/p')
[ -n "$diff" ] || { echo "FAIL: no difference measured"; exit 1; }
if [ "$diff" -gt 8192 ]; then
    echo "FAIL: the 4 GB file costs $diff KiB more than the 4 MB one (at most 8192)"
    exit 1
fi
echo "test_data_rss: ok"
