#!/bin/sh
# One exit-status rule for every command (README, "Exit status"): 2 for bad
# usage or input, 1 for a failure of the run itself, 0 done (and 3 for
# malleus-train stopped for a re-plan: tests/test_loop.sh).  Bad --data
# files (empty, truncated header, wrong counts, a directory, an endless
# device, a FIFO) exited 1 before, and /dev/zero was read until the
# out-of-memory killer struck.  The runtime failure used here is a full
# disk: a private full device (mknod c 1 7, as /dev/full) in the temporary
# directory, written into directly -- never the system's /dev/full, which a
# regression would replace with a regular file.  Without mknod (not root)
# those cases are skipped.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
W=$(mktemp -d /tmp/malleus-test-exit-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0
# A regression that reads /dev/zero must fail here, not take the machine's
# memory (not under AddressSanitizer, which reserves terabytes).
[ -n "${ASAN_OPTIONS:-}" ] || ulimit -v 8000000

FULL="$W/full"
mknod "$FULL" c 1 7 2>/dev/null || FULL=""
# expect_full ...: expect, when a private full device could be made
expect_full() {
    if [ -n "$FULL" ]; then expect "$@"; else echo "skipped (no mknod): $*"; fi
}

# expect CODE PATTERN CMD...: status CODE and PATTERN (grep -E) in the
# output, within 60 s (a FIFO read would block).
expect() {
    code=$1 pat=$2
    shift 2
    timeout 60 "$@" >"$W/out" 2>&1 </dev/null
    rc=$?
    if [ $rc -eq "$code" ] && grep -Eq -- "$pat" "$W/out"; then
        echo "ok: $rc: $(grep -E -- "$pat" "$W/out" | head -1 | cut -c1-150)"
    else
        echo "FAIL: $* -> exit $rc, wanted $code and /$pat/:"
        tail -3 "$W/out"
        fails=$((fails + 1))
    fi
}

# Token files: llm.c header = 256 int32 (magic, version, count), then uint16.
python_hdr() { # COUNT NBYTES_AFTER_HEADER OUT
    "${PYTHON3:-/usr/bin/python3}" -c '
import struct, sys
n, extra, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
h = struct.pack("<3i", 20240520, 1, n) + bytes(1024 - 12)
open(out, "wb").write(h + bytes(extra))' "$@"
}
: >"$W/empty.bin"
head -c 100 /dev/zero >"$W/short.bin"        # truncated header
python_hdr 1000 100 "$W/truncated.bin"       # header says 1000 tokens, 50 present
python_hdr 10 100 "$W/trailing.bin"          # header says 10, 50 present
mkdir "$W/dir.bin"
mkfifo "$W/fifo.bin"
TRAIN="$B/malleus-train --steps 1 --global-batch 4 --micro-batch 2 --quiet"

echo "-- malleus-train"
expect 2 "unknown option" $TRAIN --frobnicate
expect 2 "does not exist" $TRAIN --data "$W/missing.bin"
expect 2 "is empty" $TRAIN --data "$W/empty.bin"
expect 2 "too short .* for an llm.c header" $TRAIN --data "$W/short.bin" --data-format llmc
expect 2 "truncated" $TRAIN --data "$W/truncated.bin"
expect 2 "trailing data" $TRAIN --data "$W/trailing.bin"
expect 2 "is a directory" $TRAIN --data "$W/dir.bin"
expect 2 "character device, not a regular file" $TRAIN --data /dev/zero
expect 2 "character device, not a regular file" $TRAIN --data /dev/urandom
expect 2 "FIFO, not a regular file" $TRAIN --data "$W/fifo.bin"
expect 2 "matches no file" $TRAIN --data "$W/nothing*.bin"
expect 2 "weight 0 must be a positive" $TRAIN --data "$W/truncated.bin:0"
expect 2 "weight nan must be a positive" $TRAIN --data "$W/truncated.bin:1,$W/trailing.bin:nan"
expect 2 "neither a preset" $TRAIN --model "$W/missing.json"
expect 2 "not a directory" $TRAIN --snapshot-dir /dev/null
expect 2 "cannot open metrics file" $TRAIN --metrics "$W/nodir/m.jsonl"
expect 2 "no snapshot|does not exist|not found" $TRAIN --resume --snapshot-dir "$W/nosnap"
expect_full 1 "No space left on device" $TRAIN --metrics "$FULL"
expect_full 1 "No space left on device" "$B/malleus-train" --model tiny --profile "$FULL"

echo "-- malleus-replan"
REPLAN="$B/malleus-replan --world-size 8 --ranks-per-node 8 --memory-mb 16384 --model tiny -g 16 -b 2"
expect 2 "unknown option" $REPLAN --frobnicate
expect 2 "does not exist|cannot|No such file" $REPLAN --rates "$W/missing.json"
expect 2 "invalid JSON|expected|malformed" $REPLAN --current "$W/empty.bin"
expect_full 1 "No space left on device" $REPLAN --pipelines 2 --uniform -o "$FULL"

echo "-- malleus-tokenize"
printf 'hello, world\n' >"$W/in.txt"
expect 2 "unknown option|invalid option|unrecognized option" "$B/malleus-tokenize" --frobnicate "$W/in.txt" "$W/o.bin"
expect 2 "expected INPUT.txt and OUTPUT.bin" "$B/malleus-tokenize" "$W/in.txt"
expect 2 "does not exist" "$B/malleus-tokenize" "$W/missing.txt" "$W/o.bin"
expect 2 "is empty" "$B/malleus-tokenize" "$W/empty.bin" "$W/o.bin"
expect 2 "is a directory" "$B/malleus-tokenize" "$W/dir.bin" "$W/o.bin"
expect 2 "character device, not a regular file" "$B/malleus-tokenize" /dev/zero "$W/o.bin"
expect 2 "is a directory" "$B/malleus-tokenize" "$W/in.txt" "$W/dir.bin"
expect 2 "create its directory" "$B/malleus-tokenize" "$W/in.txt" "$W/nodir/o.bin"
expect_full 1 "No space left on device" "$B/malleus-tokenize" "$W/in.txt" "$FULL"

echo "-- malleus-reshard"
"$B/malleus-train" --steps 2 --global-batch 4 --micro-batch 2 --quiet --snapshot-dir "$W/snap" \
    >"$W/out" 2>&1 || { cat "$W/out"; echo "FAIL: training a snapshot"; fails=$((fails + 1)); }
cat >"$W/plan1.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 2,
  "pipelines": [ { "micro_batches": 2, "stages": [ { "ranks": [0], "layers": [0, 4] } ] } ],
  "suspended": [] }
PLAN
cat >"$W/plan3.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 2,
  "pipelines": [ { "micro_batches": 2, "stages": [ { "ranks": [0], "layers": [0, 3] } ] } ],
  "suspended": [] }
PLAN
expect 2 "unknown option" "$B/malleus-reshard" --frobnicate "$W/snap" "$W/plan1.json" "$W/new"
expect 2 "expected SNAPSHOT PLAN.json DEST" "$B/malleus-reshard" "$W/snap"
expect 2 "." "$B/malleus-reshard" "$W/nosnap" "$W/plan1.json" "$W/new"
expect 2 "." "$B/malleus-reshard" "$W/snap" "$W/missing.json" "$W/new"
expect 2 "does not fit|layers" "$B/malleus-reshard" "$W/snap" "$W/plan3.json" "$W/new"
expect 2 "inside" "$B/malleus-reshard" "$W/snap" "$W/plan1.json" "$W/snap/sub"

echo "-- malleus-export"
expect 2 "unknown option" "$B/malleus-export" --frobnicate "$W/snap" "$W/hf"
expect 2 "." "$B/malleus-export" "$W/nosnap" "$W/hf"
expect 2 "not a directory" "$B/malleus-export" "$W/snap" "$W/in.txt"
expect_full 1 "No space left on device" sh -c "mkdir -p '$W/hf' && ln -sf '$FULL' '$W/hf/model.safetensors' && exec '$B/malleus-export' '$W/snap' '$W/hf'"

echo "-- malleus-import"
expect 2 "unknown option" "$B/malleus-import" --frobnicate "$W/hf" "$W/imp"
expect 2 "expected HF_DIR OUT_SNAPSHOT" "$B/malleus-import" "$W/snap"
expect 2 "holds no config.json" "$B/malleus-import" "$W/snap" "$W/imp"

echo "-- malleus-sample"
expect 2 "unknown option" "$B/malleus-sample" --frobnicate "$W/snap"
expect 2 "." "$B/malleus-sample" "$W/nosnap"
expect 2 "." "$B/malleus-sample" --tokens -3 "$W/snap"

echo "$fails failure(s)"
[ $fails -eq 0 ]
