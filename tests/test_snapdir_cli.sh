#!/bin/sh
# The commands against snapshot directories that users reuse, share, link
# and damage, and against outputs that are their own inputs:
#   - a new run in a directory holding another run's snapshots is refused
#     at start (exit 2, naming the newest), nothing touched, unless
#     --overwrite-snapshots; --resume-from STEP rolls back;
#   - --resume finds the newest committed snapshot when `latest` lags;
#   - --resume with --steps at the snapshot's step: said, exit 0, nothing
#     written; below it: exit 2;
#   - a second job on a directory is refused naming the first's host and
#     pid; the lock goes with the first job's process (kill -9);
#   - destination problems (a parent that is a file, `latest` a directory,
#     a name past PATH_MAX, a read-only file system) refused at start,
#     before a step is trained;
#   - FIFOs as `latest` / COMPLETE wedge no command (train, export,
#     sample, reshard);
#   - bad input found after training exits 1, not 2;
#   - outputs that are inputs (tokenize, train --metrics, replan -o,
#     export OUT_DIR) refused, the input intact;
#   - --summary is JSON (no inf), rate files with duplicate or padded keys
#     refused naming the key, out-of-range integers reported as such.
# Before these checks every case here misbehaved: runs trained and then
# failed (or deleted the other run's snapshots), readers blocked forever,
# inputs were overwritten.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
B="${top_builddir:-.}"
W=$(mktemp -d /tmp/malleus-test-snapdir-XXXXXX)
bg=""
trap '[ -n "$bg" ] && kill -9 $bg 2>/dev/null; rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
# expect CODE PATTERN CMD...: status CODE and PATTERN (grep -E) in the
# output, within 60 s (a FIFO read would block: 124).
expect() {
    code=$1 pat=$2
    shift 2
    timeout 60 "$@" >"$W/out" 2>&1 </dev/null
    rc=$?
    if [ $rc -eq "$code" ] && { [ -z "$pat" ] || grep -Eq -- "$pat" "$W/out"; }; then
        echo "ok: $rc: $(grep -E -- "$pat" "$W/out" | head -1 | cut -c1-160)"
    else
        fail "$* -> exit $rc, wanted $code and /$pat/:"
        tail -3 "$W/out"
    fi
}
T="$B/malleus-train --global-batch 4 --micro-batch 2 --quiet"
tree() { (cd "$1" && find . | LC_ALL=C sort && cat latest 2>/dev/null); }

echo "-- another run's snapshots"
$T --steps 3 --snapshot-every 1 --snapshot-dir "$W/old" >/dev/null 2>&1 || fail "first run"
tree "$W/old" >"$W/old.before"
expect 2 "holds the snapshots of another run .*step_00000003" \
    $T --steps 3 --keep 1 --snapshot-dir "$W/old" --metrics "$W/m.jsonl"
tree "$W/old" | cmp -s - "$W/old.before" || fail "a refused run changed the old run's snapshots"
[ ! -e "$W/m.jsonl" ] || fail "a refused run wrote its metrics"
expect 0 "" $T --steps 2 --snapshot-dir "$W/old" --overwrite-snapshots
[ "$(ls "$W/old")" = "latest
step_00000002" ] || fail "--overwrite-snapshots left: $(ls "$W/old" | tr '\n' ' ')"

echo "-- resume: latest lags, --resume-from, --steps"
$T --steps 4 --snapshot-every 1 --snapshot-dir "$W/lag" >/dev/null 2>&1 || fail "lag run"
echo step_00000002 >"$W/lag/latest"
expect 0 "resumed from .*step_00000004" "$B/malleus-train" --global-batch 4 --micro-batch 2 \
    --steps 6 --snapshot-dir "$W/lag" --resume
# at the snapshot's step the run is complete: said, status 0, nothing
# written (a restart loop re-run after the final snapshot ends); below
# it, refused
tree "$W/lag" >"$W/lag.before"
expect 0 "at step 6 = --steps: the run is complete, nothing to train" \
    $T --steps 6 --snapshot-dir "$W/lag" --resume
tree "$W/lag" | cmp -s - "$W/lag.before" || fail "a complete run changed its snapshots"
expect 2 "at step 6, past --steps 5: a run cannot train backwards" \
    $T --steps 5 --snapshot-dir "$W/lag" --resume
expect 2 "snapshot\(s\) after step 2.*--overwrite-snapshots" \
    $T --steps 5 --snapshot-dir "$W/lag" --resume-from 2
expect 0 "" $T --steps 3 --snapshot-dir "$W/lag" --resume-from 2 --overwrite-snapshots
[ "$(ls "$W/lag" | tr '\n' ' ')" = "latest step_00000001 step_00000002 step_00000003 " ] ||
    fail "rollback to 2 left: $(ls "$W/lag" | tr '\n' ' ')"
expect 2 "no committed snapshot of step 9 \(committed: 1, 2 and 3\)" \
    $T --steps 12 --snapshot-dir "$W/lag" --resume-from 9

echo "-- a second job on the directory"
# far more steps than the test lasts: the test kills it
$T --steps 100000 --snapshot-dir "$W/busy" >"$W/bg.out" 2>&1 &
bg=$!
i=0
while [ ! -s "$W/busy/.lock" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
expect 2 "in use by another job: malleus-train, pid $bg on host $(hostname)" \
    $T --steps 2 --snapshot-dir "$W/busy"
expect 2 "in use by another job" "$B/malleus-reshard" --no-progress "$W/old" \
    "$top_srcdir/tests/plans/one.json" "$W/busy"
kill -9 $bg
wait $bg 2>/dev/null
bg=""
expect 0 "" $T --steps 2 --snapshot-dir "$W/busy"

echo "-- destination problems, found before training"
: >"$W/file"
expect 2 "Not a directory" $T --steps 2 --snapshot-dir "$W/file/snap" --metrics "$W/m1.jsonl"
mkdir -p "$W/ld/latest"
expect 2 "latest is a directory" $T --steps 2 --snapshot-dir "$W/ld" --metrics "$W/m1.jsonl"
long="$W"
while [ ${#long} -lt 4000 ]; do long="$long/dddddddddddddddddddddddddddddddddddddddddddddddddddddd"; done
expect 2 "limit of 4096" $T --steps 2 --snapshot-dir "$long" --metrics "$W/m1.jsonl"
[ ! -e "$W/m1.jsonl" ] || fail "a run refused at start wrote its metrics"
# read-only: a private read-only mount where user namespaces allow one
if unshare -rm true 2>/dev/null; then
    mkdir -p "$W/ro"
    expect 2 "Read-only file system" unshare -rm sh -c \
        "mount -t tmpfs -o ro tmpfs '$W/ro' && exec $T --steps 2 --snapshot-dir '$W/ro/snap'"
else
    echo "skipped (no user namespaces): a read-only file system"
fi

echo "-- FIFOs in a snapshot directory"
cp -r "$W/lag" "$W/ff"
rm "$W/ff/latest" && mkfifo "$W/ff/latest"
# read: `latest` is only a hint; write: it is refused at start, not waited on
expect 0 "resumed from .*step_00000003" "$B/malleus-train" --global-batch 4 --micro-batch 2 \
    --steps 4 --snapshot-dir "$W/ff" --resume --eval-only
expect 2 "latest is a FIFO" $T --steps 4 --snapshot-dir "$W/ff" --resume
expect 0 "step 3" "$B/malleus-export" "$W/ff" "$W/hf"
rm "$W/ff/latest" "$W/ff/step_00000003/COMPLETE" && mkfifo "$W/ff/step_00000003/COMPLETE"
expect 2 "FIFO, not a regular file" "$B/malleus-export" "$W/ff/step_00000003" "$W/hf"
expect 0 "step 2" "$B/malleus-export" "$W/ff" "$W/hf"
expect 2 "FIFO, not a regular file" "$B/malleus-sample" --tokens 2 "$W/ff/step_00000003"
expect 2 "FIFO, not a regular file" "$B/malleus-reshard" --no-progress "$W/ff/step_00000003" \
    "$top_srcdir/tests/plans/one.json" "$W/rs"
expect 2 "after step 2, the newest one this build can resume, that cannot be read" \
    $T --steps 4 --snapshot-dir "$W/ff" --resume

echo "-- bad input found after training: status 1"
# --inject slows rank 0 (sleeps) so that step 1's snapshot is seen before
# step 3 is reached; a committed snapshot of step 3 then appears under
# the run (another writer's), and its final snapshot is refused
$T --steps 3 --snapshot-every 1 --inject 0:400 --snapshot-dir "$W/late" >"$W/late.out" 2>&1 &
bg=$!
i=0
while [ ! -e "$W/late/step_00000001/COMPLETE" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
mkdir -p "$W/late/step_00000003" && echo '{}' >"$W/late/step_00000003/COMPLETE"
wait $bg
rc=$?
bg=""
if [ $rc -eq 1 ] && grep -q "already exists" "$W/late.out"; then
    echo "ok: 1: $(grep "already exists" "$W/late.out" | cut -c1-120)"
else
    fail "a refusal after training: exit $rc (wanted 1): $(tail -1 "$W/late.out")"
fi

echo "-- outputs that are inputs"
printf 'hello, world\n' >"$W/in.txt"
ln -s "$W/in.txt" "$W/in-link.txt"
expect 2 "same file as INPUT.txt" "$B/malleus-tokenize" "$W/in.txt" "$W/in.txt"
expect 2 "same file as INPUT.txt" "$B/malleus-tokenize" "$W/in.txt" "$W/in-link.txt"
[ "$(cat "$W/in.txt")" = "hello, world" ] || fail "malleus-tokenize overwrote its input"
"$B/malleus-tokenize" "$W/in.txt" "$W/tok.bin" >/dev/null || fail "tokenize"
cp "$W/tok.bin" "$W/tok.before"
expect 2 "--metrics .* is the same file as --data" \
    $T --steps 1 --data "$W/tok.bin" --val-data "$W/tok.bin" --metrics "$W/tok.bin"
cmp -s "$W/tok.bin" "$W/tok.before" || fail "--metrics overwrote --data"
expect 2 "is an entry of --snapshot-dir" $T --steps 6 --resume --snapshot-dir "$W/lag" \
    --metrics "$W/lag/latest"
echo '{"3": 2.0}' >"$W/rates.json"
expect 2 "--output .* is the same file as --rates" "$B/malleus-replan" --world-size 8 \
    --ranks-per-node 8 --memory-mb 16384 --model tiny -M 8 --rates "$W/rates.json" -o "$W/rates.json"
[ "$(cat "$W/rates.json")" = '{"3": 2.0}' ] || fail "replan -o overwrote --rates"
expect 2 "OUT_DIR .* is the snapshot's own directory" "$B/malleus-export" "$W/lag" "$W/lag/step_00000003"
expect 2 "OUT_DIR .* is the snapshot's own directory" "$B/malleus-export" "$W/lag" "$W/lag"

echo "-- JSON out, rates in, integers"
REPLAN="$B/malleus-replan --world-size 8 --ranks-per-node 8 --memory-mb 16384 -M 64"
"$B/malleus-replan" --model tiny --print-profile >"$W/prof.json"
sed 's/"layer_time": [0-9.e-]*/"layer_time": 1e307/' "$W/prof.json" >"$W/huge.json"
$REPLAN --profile "$W/huge.json" --summary -o /dev/null >"$W/sum.json" 2>&1 || fail "replan --summary"
"${PYTHON3:-/usr/bin/python3}" -c '
import json, sys
def bad(c): raise ValueError("not JSON: " + c)
line = open(sys.argv[1]).read().strip().splitlines()[-1]
json.loads(line, parse_constant=bad)' "$W/sum.json" 2>"$W/py.err" &&
    echo "ok: --summary with overflowing times is JSON: $(tail -1 "$W/sum.json" | cut -c1-100)" ||
    fail "--summary is not JSON: $(tail -1 "$W/sum.json" | cut -c1-160) ($(tail -1 "$W/py.err"))"
for r in '{"3": 2.0, "3": 4.0}|duplicate object key near .\"3\"' \
    '{" 3": 2.0}|key " 3" is not a rank number' '{"03": 2.0}|key "03" is not a rank number' \
    '{"3": null}|rank 3: the rate must be a number, not null' \
    '{"99999999999999999999": 2}|rank 99999999999999999999 is not in the cluster'; do
    printf '%s\n' "${r%%|*}" >"$W/r.json"
    expect 2 "${r#*|}" $REPLAN --model tiny --rates "$W/r.json" -o /dev/null
done
expect 2 "--inject 4294967296:2: rank 4294967296 is out of range" $T --steps 1 --inject 4294967296:2
expect 2 "--steps expects an integer in .*: 99999999999999999999 is out of range" \
    $T --steps 99999999999999999999
expect 2 "--seed expects an integer in .*: 18446744073709551616 is out of range" \
    $T --seed 18446744073709551616

echo "$fails failure(s)"
[ $fails -eq 0 ]
