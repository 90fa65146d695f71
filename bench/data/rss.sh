#!/bin/sh
# The memory a rank pays for its token data: the peak resident set of
# `malleus-train` on a small token file and on a large one (sparse files of
# the same tokens, made in an instant), everything else equal.  Token files
# are mapped, so the large file must cost what the small one does: only the
# pages of the windows the run reads are ever resident.
#
#   sh bench/data/rss.sh [BUILD_DIR] [SMALL_MB] [LARGE_MB] [STEPS]
#
# Prints one line per file (its size, the peak RSS in KiB) and the
# difference.  Defaults: the current directory, 4 MB and 4096 MB, 20 steps
# of the tiny model (global batch 16: 320 windows).  The peak is the run's
# ru_maxrss as Python's resource module reports it for a child.
set -eu
B=${1:-.}
SMALL=${2:-4}
LARGE=${3:-4096}
STEPS=${4:-20}
PY=${PYTHON3:-/usr/bin/python3}
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-rss.XXXXXX")
trap 'rm -rf "$W"' EXIT

# headerless uint16: all tokens 0 (the tiny model's vocabulary holds them)
truncate -s "${SMALL}M" "$W/small.bin"
truncate -s "${LARGE}M" "$W/large.bin"

peak() {
    "$PY" - "$@" <<'PYEOF'
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
if r.returncode != 0:
    sys.exit("run failed with status %d: %s" % (r.returncode, " ".join(sys.argv[1:])))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PYEOF
}

run() {
    peak "$B/malleus-train" --model tiny --data "$1" --data-format raw16 --steps "$STEPS" \
        --threads 1 --quiet --log-every 0
}
s=$(run "$W/small.bin")
l=$(run "$W/large.bin")
echo "token file ${SMALL} MB: peak RSS $s KiB"
echo "token file ${LARGE} MB: peak RSS $l KiB"
echo "difference: $((l - s)) KiB"
