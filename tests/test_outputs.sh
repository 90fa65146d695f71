#!/bin/sh
# Every output option of every command (malleus-sample writes only to its
# standard output), pointed at a character device made
# with mknod in a temporary directory (a private /dev/null: major 1, minor
# 3): the command must write into the device, and the device node must still
# be a device afterwards.  Renaming a temporary file over it -- right for a
# regular file -- would replace /dev/null itself when run as root.  Also: a
# FIFO target receives the output through the FIFO, a regular target is
# still replaced atomically, and an output directory target is refused.
# Needs mknod (root); skips (77) where it is not permitted.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
W=$(mktemp -d /tmp/malleus-test-outputs-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0

if ! mknod "$W/null" c 1 3 2>/dev/null; then
    echo "SKIP: mknod not permitted here (needs root)"
    exit 77
fi

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

# check NAME: $W/null must still be a character device.
check() {
    if [ -c "$W/null" ]; then
        echo "ok: $1 left the device node a device"
    else
        fail "$1 replaced the device node with $(stat -c %F "$W/null" 2>/dev/null || echo nothing)"
        rm -f "$W/null"
        mknod "$W/null" c 1 3
    fi
}

# run NAME CMD...: CMD must succeed (its output going into the device).
run() {
    name=$1
    shift
    if "$@" >"$W/out" 2>&1; then :; else
        fail "$name exited $?:"
        tail -5 "$W/out"
    fi
    check "$name"
}

REPLAN_ARGS="--world-size 8 --ranks-per-node 8 --memory-mb 16384 --model tiny -g 16 -b 2"
printf 'some text to tokenize, byte by byte.\n' >"$W/in.txt"

# shellcheck disable=SC2086
run "malleus-replan -o" "$B/malleus-replan" $REPLAN_ARGS --pipelines 2 --uniform -o "$W/null"
# shellcheck disable=SC2086
run "malleus-replan --output" "$B/malleus-replan" $REPLAN_ARGS --output "$W/null"
run "malleus-train --profile" "$B/malleus-train" --model tiny --profile "$W/null"
run "malleus-train --metrics" "$B/malleus-train" --model tiny --steps 2 --global-batch 4 \
    --micro-batch 2 --quiet --metrics "$W/null"
run "malleus-tokenize IN OUT" "$B/malleus-tokenize" "$W/in.txt" "$W/null"
run "malleus-tokenize --format raw16 IN OUT" "$B/malleus-tokenize" --format raw16 "$W/in.txt" "$W/null"
run "malleus-tokenize --default OUT" "$B/malleus-tokenize" --default "$W/null"

# Directory outputs cannot go into a device: refused, the node untouched.
"$B/malleus-train" --model tiny --steps 1 --global-batch 4 --micro-batch 2 --quiet \
    --snapshot-dir "$W/null" >"$W/out" 2>&1 && fail "malleus-train --snapshot-dir DEVICE succeeded"
check "malleus-train --snapshot-dir"
"$B/malleus-train" --model tiny --steps 2 --global-batch 4 --micro-batch 2 --quiet \
    --snapshot-dir "$W/snap" >"$W/out" 2>&1 || { cat "$W/out"; fail "training a snapshot"; }
# shellcheck disable=SC2086
cat >"$W/plan.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 2,
  "pipelines": [ { "micro_batches": 2, "stages": [ { "ranks": [0], "layers": [0, 4] } ] } ],
  "suspended": [] }
PLAN
"$B/malleus-reshard" --quiet "$W/snap" "$W/plan.json" "$W/null" >"$W/out" 2>&1 &&
    fail "malleus-reshard into a device succeeded"
grep -q "null" "$W/out" || { cat "$W/out"; fail "malleus-reshard: no message naming DEST"; }
check "malleus-reshard DEST"
"$B/malleus-export" --quiet "$W/snap" "$W/null" >"$W/out" 2>&1 &&
    fail "malleus-export into a device succeeded"
check "malleus-export OUT_DIR"
# malleus-export's files inside OUT_DIR: a device there is written into.
mkdir "$W/hf"
mknod "$W/hf/model.safetensors" c 1 3
mknod "$W/hf/config.json" c 1 3
"$B/malleus-export" --quiet "$W/snap" "$W/hf" >"$W/out" 2>&1 || { cat "$W/out"; fail "malleus-export"; }
[ -c "$W/hf/model.safetensors" ] && [ -c "$W/hf/config.json" ] ||
    fail "malleus-export replaced device nodes in OUT_DIR"
echo "ok: malleus-export OUT_DIR/{model.safetensors,config.json} left device nodes devices"

# A FIFO: the output arrives through it, and it stays a FIFO.
mkfifo "$W/fifo"
timeout 60 cat "$W/fifo" >"$W/fifo.got" &
reader=$!
# shellcheck disable=SC2086
timeout 60 "$B/malleus-replan" $REPLAN_ARGS --pipelines 2 --uniform -o "$W/fifo" >"$W/out" 2>&1 ||
    { cat "$W/out"; fail "malleus-replan -o FIFO"; }
# (a replaced FIFO never gets a writer: stop its reader)
[ -p "$W/fifo" ] || { fail "the FIFO was replaced"; kill $reader; }
wait $reader
grep -q '"format": "malleus-plan/1"' "$W/fifo.got" || fail "no plan came through the FIFO"

# A regular file is still replaced atomically: the result is complete, no
# temporary file is left beside it, and a failed write leaves it as it was.
echo old >"$W/plan.out"
# shellcheck disable=SC2086
"$B/malleus-replan" $REPLAN_ARGS --pipelines 2 --uniform -o "$W/plan.out" >/dev/null 2>&1 ||
    fail "malleus-replan -o regular file"
grep -q '"format": "malleus-plan/1"' "$W/plan.out" || fail "the regular output is not the plan"
ls "$W" | grep -q '\.tmp\.' && fail "temporary files left: $(ls "$W" | grep '\.tmp\.')"
echo keep >"$W/prof.json"
"$B/malleus-train" --model tiny --profile "$W/prof.json" --tp 3 >/dev/null 2>&1 &&
    fail "--profile with --tp 3 succeeded"
[ "$(cat "$W/prof.json")" = keep ] || fail "a failed --profile changed its regular file"

# A directory as an output file: refused with a message, left alone.
mkdir "$W/adir"
"$B/malleus-tokenize" "$W/in.txt" "$W/adir" >"$W/out" 2>&1 && fail "tokenize into a directory succeeded"
grep -q "directory" "$W/out" || { cat "$W/out"; fail "no message naming the directory"; }
[ -d "$W/adir" ] || fail "the directory was replaced"

echo "$fails failure(s)"
[ $fails -eq 0 ]
