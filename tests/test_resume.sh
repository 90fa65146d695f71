#!/bin/sh
# A resumed run is the run its snapshot was written by (train/resume.h), on
# one process and a token file:
#  * a run that crashes at step 16 (snapshot of step 12) resumes with
#    nothing but --resume: the snapshot's model, data and steps; the loss
#    curve is the uninterrupted run's, bit for bit; the metrics hold every
#    step once, the three rows the crash superseded moved aside and marked;
#    scripts/plot-metrics.py draws each step once, from that file and from
#    one that holds steps twice;
#  * every setting that changes the run is refused (exit 2, nothing
#    written), all differences listed with both values: learning rate,
#    seed, warmup, more steps, decay steps, other data (a file, synthetic
#    data of another vocabulary), the same data file changed in place, a model that differs only in n_heads, seq_len or
#    rope_theta; a data file that is gone is named, not replaced by the
#    built-in corpus; an unknown --override key is refused;
#  * --override accepts a difference, logged in the metrics and the events;
#    more --steps keep the schedule (the learning rate stays at its floor,
#    no jump back up), with --override steps or an explicit --decay-steps;
#    the same data file moved elsewhere is accepted with a note.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
: "${PYTHON3:=/usr/bin/python3}"
TRAIN="$top_builddir/malleus-train"
W=$(mktemp -d /tmp/malleus-test-resume-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

"$top_builddir/malleus-tokenize" "$top_srcdir/README.md" "$W/a.bin" >/dev/null &&
    "$top_builddir/malleus-tokenize" "$top_srcdir/ckpt/README.md" "$W/b.bin" >/dev/null || exit 99
set -- --model tiny --global-batch 8 --micro-batch 4 --quiet
"$TRAIN" "$@" --data "$W/a.bin" --steps 24 --metrics "$W/ref.jsonl" || exit 99

# ---- a crash at step 16, then --resume and nothing else
MALLEUS_TEST_STEP_FAIL=0:16 "$TRAIN" "$@" --data "$W/a.bin" --steps 24 --snapshot-dir "$W/s" \
    --snapshot-every 6 --keep 0 --metrics "$W/m.jsonl" >"$W/crash.out" 2>&1
[ $? -eq 1 ] || fail "the crashed run's exit status"
[ "$(cat "$W/s/latest")" = step_00000012 ] || fail "the crashed run left $(cat "$W/s/latest")"
"$TRAIN" --resume --snapshot-dir "$W/s" --metrics "$W/m.jsonl" --events "$W/ev" --quiet \
    >"$W/resume.out" 2>&1 || { cat "$W/resume.out"; fail "resume with nothing but --resume"; }
"$PYTHON3" - "$W" <<'PY' || fails=$((fails + 1))
import json, sys
w = sys.argv[1]
ref = [json.loads(l) for l in open(w + "/ref.jsonl")]
got = [json.loads(l) for l in open(w + "/m.jsonl")]
old = [json.loads(l) for l in open(w + "/m.jsonl.superseded")]
bad = []
if [r["step"] for r in got] != list(range(1, 25)):
    bad.append("metrics steps %s, not 1..24 once each" % [r["step"] for r in got])
elif any(g["loss"] != r["loss"] for g, r in zip(got, ref)):
    bad.append("the resumed curve is not the uninterrupted one (built-in corpus instead of the file?)")
if [(r["step"], r["superseded"], r["resumed_from"]) for r in old] != [(s, True, 12) for s in (13, 14, 15)]:
    bad.append("superseded rows %s" % [(r.get("step"), r.get("superseded")) for r in old])
if got[12].get("resumed_from") != 12 or any("resumed_from" in r for r in got[13:]):
    bad.append("the first row after the resume does not say resumed_from 12")
print("FAIL: " + "; ".join(bad) if bad else
      "ok: resumed with --resume alone: steps 1..24 once, the uninterrupted curve, 13-15 superseded")
sys.exit(1 if bad else 0)
PY

# plot-metrics draws each step once (a file without the rows moved aside
# too: steps 13-15 twice)
if "$PYTHON3" -c "import matplotlib" 2>/dev/null; then
    "$PYTHON3" "$top_srcdir/scripts/plot-metrics.py" "$W/m.jsonl" "$W/a.png" >"$W/plot.out" 2>&1 &&
        grep -q '(24 steps' "$W/plot.out" || { cat "$W/plot.out"; fail "plot of the resumed metrics"; }
    { head -n 15 "$W/m.jsonl"; sed -n '13,$p' "$W/m.jsonl"; } | sed 's/, "resumed_from": 12//' >"$W/dup.jsonl"
    "$PYTHON3" "$top_srcdir/scripts/plot-metrics.py" "$W/dup.jsonl" "$W/b.png" >"$W/plot.out" 2>&1 &&
        grep -q '(24 steps' "$W/plot.out" || { cat "$W/plot.out"; fail "plot of metrics with steps twice"; }
else
    echo "(plot-metrics not checked: this Python has no matplotlib)"
fi

# ---- refusals: exit 2, every difference named with both values, nothing written
cp "$W/m.jsonl" "$W/m.before"
refused() { # WHAT PATTERN... -- FLAGS
    what=$1
    shift
    pats=""
    while [ "$1" != -- ]; do
        pats="$pats
$1"
        shift
    done
    shift
    "$TRAIN" --resume --snapshot-dir "$W/s" --metrics "$W/m.jsonl" --quiet "$@" >"$W/out" 2>&1
    rc=$?
    [ $rc -eq 2 ] || { cat "$W/out"; fail "$what: exit status $rc, not 2"; return; }
    echo "$pats" | while read -r p; do
        [ -z "$p" ] || grep -q -e "$p" "$W/out" || { cat "$W/out"; echo "FAIL: $what: no '$p'"; exit 1; }
    done || { fails=$((fails + 1)); return; }
    echo "ok: $what refused"
}
refused "another learning rate" "lr: snapshot 0.001, this run 0.002" -- --lr 2e-3
refused "three settings at once" "in 3 settings" "lr: snapshot 0.001, this run 0.0005" \
    "seed: snapshot 1234, this run 7" "warmup: snapshot 10, this run 3" -- --lr 5e-4 --seed 7 --warmup 3
refused "more steps" "steps: snapshot 24, this run 48 (more steps than the snapshot's run" -- --steps 48
refused "another schedule" "decay-steps: snapshot 24, this run 48" -- --steps 48 --decay-steps 48
refused "other data" "data: snapshot .*a.bin ([0-9]* bytes, fingerprint [0-9a-f]*), this run .*b.bin" \
    -- --data "$W/b.bin"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 4, "ffn_hidden": 128, "seq_len": 32}' >"$W/heads.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 16}' >"$W/seq.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32, "rope_theta": 500000}' >"$W/rope.json"
refused "n_heads alone" "n_heads: snapshot 8, this run 4" "cannot change" -- --model "$W/heads.json"
refused "seq_len alone" "seq_len: snapshot 32, this run 16" -- --model "$W/seq.json"
refused "rope_theta alone" "rope_theta: snapshot 10000, this run 500000" -- --model "$W/rope.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "ffn_hidden": 128, "seq_len": 32}' >"$W/gqa.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32, "tie_embeddings": true}' >"$W/tied.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 16}}' >"$W/scaled.json"
refused "n_kv_heads alone" "n_kv_heads: snapshot 8, this run 2" "cannot change" -- --model "$W/gqa.json"
refused "tie_embeddings alone" "tie_embeddings: snapshot 0, this run 1" "cannot change" -- --model "$W/tied.json"
refused "rope_scaling alone" "rope_scaling: snapshot none, this run llama3 (factor 8" -- --model "$W/scaled.json"
refused "an unknown --override key" "unknown setting 'learning-rate'" -- --override learning-rate
cp "$W/a.bin" "$W/a.orig"
printf 'X' | dd of="$W/a.bin" bs=1 seek=2000 conv=notrunc 2>/dev/null
refused "the data file changed in place" "data: snapshot" -- --data "$W/a.bin"
mv "$W/a.orig" "$W/a.bin"
mv "$W/a.bin" "$W/moved.bin"
refused "the data file gone" "a.bin" -- --steps 24
"$TRAIN" "$@" --data synthetic:256 --steps 2 --snapshot-dir "$W/syn" >/dev/null 2>&1 || fail "a synthetic run"
"$TRAIN" --resume --snapshot-dir "$W/syn" --data synthetic:128 --quiet >"$W/out" 2>&1
[ $? -eq 2 ] && grep -q "data: snapshot synthetic:256 .*, this run synthetic:128" "$W/out" &&
    echo "ok: other synthetic data refused" || { cat "$W/out"; fail "other synthetic data"; }
cmp -s "$W/m.jsonl" "$W/m.before" || fail "a refused resume changed the metrics"
[ "$(cat "$W/s/latest")" = step_00000024 ] || fail "a refused resume moved latest"
"$TRAIN" "$@" --steps 2 --override lr >"$W/out" 2>&1
[ $? -eq 2 ] && grep -q "add --resume" "$W/out" || fail "--override without --resume"

# ---- accepted: the same data elsewhere; --override, logged; more steps keep the schedule
cp -r "$W/s" "$W/s2"
"$TRAIN" --resume --snapshot-dir "$W/s2" --data "$W/moved.bin" --steps 36 --override steps,lr --lr 5e-4 \
    --metrics "$W/m2.jsonl" --events "$W/ev2" --quiet >"$W/out" 2>&1 || { cat "$W/out"; fail "override run"; }
grep -q "the same contents as the snapshot's (.*a.bin), read from .*moved.bin" "$W/ev2" ||
    { cat "$W/ev2"; fail "the moved data file: no note in the events"; }
grep -q -- "--override lr: snapshot 0.001, this run 0.0005" "$W/ev2" || fail "the override is not in the events"
grep -q -- "--override steps: snapshot 24, this run 36" "$W/ev2" || fail "the steps override is not in the events"
"$PYTHON3" - "$W/m2.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = []
if [r["step"] for r in rows] != list(range(25, 37)):
    bad.append("steps %s" % [r["step"] for r in rows])
if rows[0].get("overrides") != {"lr": ["0.001", "0.0005"], "steps": ["24", "36"]}:
    bad.append("first row's overrides: %s" % rows[0].get("overrides"))
# decay-steps 24 kept: past it the rate stays at the floor, 0.1 x 5e-4
if any(abs(r["lr"] - 5e-5) > 1e-12 for r in rows):
    bad.append("lr after the schedule's end: %s (a jump back up?)" % [r["lr"] for r in rows])
print("FAIL: " + "; ".join(bad) if bad else "ok: --override lr,steps logged; lr stays at its floor 5e-05")
sys.exit(1 if bad else 0)
PY
cp -r "$W/s" "$W/s3"
"$TRAIN" --resume --snapshot-dir "$W/s3" --data "$W/moved.bin" --steps 30 --decay-steps 24 \
    --metrics "$W/m3.jsonl" --quiet >"$W/out" 2>&1 || { cat "$W/out"; fail "--steps with an explicit --decay-steps"; }
"$PYTHON3" -c "
import json, sys
lr = [json.loads(l)['lr'] for l in open('$W/m3.jsonl')]
sys.exit(0 if len(lr) == 6 and all(abs(x - 1e-4) < 1e-12 for x in lr) else 1)" ||
    fail "--steps 30 --decay-steps 24: lr $(grep -o '"lr": [^,]*' "$W/m3.jsonl" | tr '\n' ' ')"

[ $fails -eq 0 ] && echo "PASS: resume is the snapshot's run" && exit 0
echo "FAIL: $fails check(s)"
exit 1
