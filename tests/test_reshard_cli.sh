#!/bin/sh
# malleus-reshard's command line: --help; usage errors (exit 2); refusals
# with a clear message and exit 2 (bad input, the rule of every command) for
# a plan of another model (layers, heads), an incomplete, corrupt or missing
# snapshot, a destination inside the source (resolved paths) or above it
# where its writer would remove the source; a run that fails half-way leaves no directory it
# created; the source is never modified; one process and two processes under mpiexec
# write identical files; a round trip 1 -> 8 -> 1 ranks resumes the run
# exactly; progress only on a terminal (or --progress), a summary line.
set -u
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${MPIEXEC:=mpiexec.mpich}"
OPENBLAS_NUM_THREADS=1
export OPENBLAS_NUM_THREADS
T="$top_builddir/malleus-train"
R="$top_builddir/malleus-reshard"
P="$top_srcdir/tests/plans"
W=$(mktemp -d "${TMPDIR:-/tmp}/malleus-reshard-cli.XXXXXX") || exit 99
trap 'rm -rf "$W"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect CODE PATTERN ARGS...: exit status CODE and PATTERN (grep -E) in stderr
expect() {
    code=$1 pat=$2
    shift 2
    "$R" "$@" >"$W/out" 2>"$W/err"
    rc=$?
    if [ $rc -eq "$code" ] && grep -Eq -- "$pat" "$W/err"; then
        echo "ok: $* -> $rc: $(head -c 200 "$W/err")"
    else
        fail "$* -> exit $rc, wanted $code and /$pat/; stderr: $(cat "$W/err")"
    fi
}
loss() { sed -n "s/^{\"step\": $2, \"loss\": \([^,]*\),.*/\1/p" "$1" | tail -1; }
common="--model tiny --global-batch 16 --micro-batch 2 --decay-steps 6 --quiet --threads 1"

"$T" $common --steps 6 --metrics "$W/ref.jsonl" >/dev/null 2>&1 || { echo "FAIL: reference run"; exit 1; }
"$T" $common --steps 3 --metrics "$W/m.jsonl" --snapshot-dir "$W/snap" >/dev/null 2>&1 ||
    { echo "FAIL: snapshot run"; exit 1; }
(cd "$W/snap" && find . -type f | sort | xargs md5sum) >"$W/src.before"

"$R" --help >"$W/out" 2>&1 && grep -q "Usage: malleus-reshard" "$W/out" && grep -q -- "--mem" "$W/out" ||
    fail "--help"
expect 2 "expected SNAPSHOT PLAN.json DEST"
expect 2 "unknown option" --frobnicate "$W/snap" "$P/one.json" "$W/x"
expect 2 "--mem expects an integer" --mem lots "$W/snap" "$P/one.json" "$W/x"
expect 2 "nosuch.json" "$W/snap" "$W/nosuch.json" "$W/x"
expect 2 "does not fit the snapshot's model \(4 layers.*layers" "$W/snap" "$P/wrong_layers.json" "$W/x"
expect 2 "does not fit the snapshot's model.*(TP|8 heads)" "$W/snap" "$P/wrong_heads.json" "$W/x"
expect 2 "does not exist" "$W/nothing" "$P/one.json" "$W/x"
# DEST inside the source, as resolved paths: the snapshot
# directory, a step directory, below either (also through a symbolic link or
# "..", and when SNAPSHOT names the step directory), and a source inside the
# very directory DEST's writer would clean up: refused with status 2 before
# anything is written, and no DEST left behind
expect 2 "never writes into its source" "$W/snap" "$P/one.json" "$W/snap"
expect 2 "never writes into its source" "$W/snap" "$P/one.json" "$W/snap/sub"
expect 2 "never writes into its source" "$W/snap" "$P/one.json" "$W/snap/step_00000003"
expect 2 "never writes into its source" "$W/snap" "$P/one.json" "$W/snap/step_00000003/sub/deeper"
expect 2 "never writes into its source" "$W/snap/step_00000003" "$P/one.json" "$W/snap/sub"
expect 2 "never writes into its source" "$W/snap/step_00000003" "$P/one.json" "$W/snap"
expect 2 "never writes into its source" "$W/snap" "$P/one.json" "$W/elsewhere/../snap/./sub"
ln -s "$W/snap" "$W/link"
expect 2 "never writes into its source" "$W/link" "$P/one.json" "$W/snap/sub"
expect 2 "never writes into its source" "$W/snap" "$P/one.json" "$W/link/sub"
for d in sub step_00000003/sub; do [ ! -e "$W/snap/$d" ] || fail "a refused run left $W/snap/$d"; done
[ ! -e "$W/elsewhere" ] || fail "a refused run left $W/elsewhere"
# the source inside DEST's uncommitted-looking step_00000001 (retention there
# would remove it as debris of a crash)
mkdir -p "$W/outer/step_00000001"
cp -r "$W/snap" "$W/outer/step_00000001/snap"
expect 2 "would remove or replace" "$W/outer/step_00000001/snap" "$P/one.json" "$W/outer"
[ ! -e "$W/outer/latest" ] || fail "a refused run wrote into $W/outer"
# a source below DEST in a directory no writer touches is harmless
mkdir -p "$W/outer2"
cp -r "$W/snap" "$W/outer2/snap"
"$R" --quiet "$W/outer2/snap" "$P/one.json" "$W/outer2" >"$W/out" 2>&1 ||
    fail "a source in a plain directory below DEST was refused: $(cat "$W/out")"
cp -r "$W/snap" "$W/broken"
rm "$W/broken/step_00000003/COMPLETE"
expect 2 "COMPLETE" "$W/broken" "$P/one.json" "$W/x"
expect 2 "COMPLETE" "$W/broken/step_00000003" "$P/one.json" "$W/x"
[ ! -e "$W/x/latest" ] || fail "a refused run committed something"
# a run that fails half-way (a flipped byte in the source's tensor data)
# commits nothing and leaves none of the directories it created
cp -r "$W/snap" "$W/bad"
f="$W/bad/step_00000003/shard_00000.h5"
off=$(($(wc -c <"$f") / 2))
b=$(od -An -tu1 -j $off -N1 "$f" | tr -d ' ')
printf "$(printf '\\%03o' $(((b + 1) % 256)))" | dd of="$f" bs=1 seek=$off conv=notrunc 2>/dev/null
expect 2 "fails its checksum" "$W/bad" "$P/one.json" "$W/fresh/a/b"
[ ! -e "$W/fresh" ] || fail "a failed run left $(find "$W/fresh")"
mkdir "$W/kept"
expect 2 "fails its checksum" "$W/bad" "$P/one.json" "$W/kept/a"
[ -d "$W/kept" ] && [ ! -e "$W/kept/a" ] || fail "a failed run removed too much or too little of $W/kept"

# one process and two share the work: the same files
"$R" "$W/snap" "$P/mixed_tp.json" "$W/d1" >"$W/out1" 2>&1 || { cat "$W/out1"; fail "reshard 1 process"; }
grep -Eq "^malleus-reshard: step 3: 117 tensors into 7 shard files.*1 process\) -> " "$W/out1" ||
    fail "summary line: $(cat "$W/out1")"
if printf '%s' "$(cat "$W/out1")" | grep -q "$(printf '\r')"; then fail "progress drawn on a pipe"; fi
timeout -k 5 60 "$MPIEXEC" -n 2 "$R" --progress "$W/snap/step_00000003" "$P/mixed_tp.json" "$W/d2" \
    >"$W/out2" 2>&1 || { cat "$W/out2"; fail "reshard 2 processes"; }
grep -q "reshard: tensor 117/117" "$W/out2" || fail "--progress: $(cat "$W/out2")"
grep -q "2 processes" "$W/out2" || fail "summary of 2 processes: $(cat "$W/out2")"
for f in $(cd "$W/d1/step_00000003" && ls); do
    cmp -s "$W/d1/step_00000003/$f" "$W/d2/step_00000003/$f" || fail "$f differs between 1 and 2 processes"
done
[ "$(ls "$W/d1/step_00000003" | wc -l)" -eq 9 ] || fail "expected 7 shard files, index.h5 and COMPLETE"

# back to one rank, and resume: steps 4-6 as if never interrupted
"$R" --quiet "$W/d2" "$P/one.json" "$W/d3" >"$W/out3" 2>&1 || { cat "$W/out3"; fail "reshard 8 -> 1"; }
[ ! -s "$W/out3" ] || fail "--quiet printed: $(cat "$W/out3")"
"$T" $common --plan "$P/one.json" --steps 6 --snapshot-dir "$W/d3" --resume --metrics "$W/m.jsonl" \
    >"$W/out4" 2>&1 || { cat "$W/out4"; fail "resume"; }
for s in 4 5 6; do
    [ -n "$(loss "$W/m.jsonl" $s)" ] && [ "$(loss "$W/m.jsonl" $s)" = "$(loss "$W/ref.jsonl" $s)" ] ||
        fail "step $s: loss $(loss "$W/m.jsonl" $s) vs uninterrupted $(loss "$W/ref.jsonl" $s)"
done

# on a terminal the progress line appears by itself (needs script(1))
# (skipped, with a note, where no pseudo-terminal can be allocated)
if command -v script >/dev/null 2>&1 && script -qec true /dev/null </dev/null >/dev/null 2>&1; then
    script -qec "'$R' '$W/snap' '$P/tp8.json' '$W/d5'" /dev/null >"$W/out5" 2>&1 </dev/null
    grep -q "reshard: tensor 117/117" "$W/out5" || fail "no progress on a terminal: $(cat "$W/out5")"
else
    echo "note: no pseudo-terminal here; the terminal progress check is skipped"
fi

(cd "$W/snap" && find . -type f | sort | xargs md5sum) | cmp -s - "$W/src.before" ||
    fail "the source snapshot changed"
echo "$fails failure(s)"
[ $fails -eq 0 ]
