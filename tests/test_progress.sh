#!/bin/sh
# What a person watching a run sees, and what the metrics keep:
#   1. the step line: loss, tokens/s, MFU against --peak-tflops, memory,
#      elapsed time and ETA; metrics rows with the wall-clock time, the plan
#      generation and id, memory and MFU; the plan line at the start and its
#      measured step time against the prediction a few steps later;
#   2. a restart onto another plan (4 ranks, dp 4, then dp 2 x pp 2 from the
#      same snapshot): a plan change line with the old and new plan, the old
#      one's measured step time, the new one's prediction, and the change's
#      measured cost; the rows after it carry generation 1 and the new id;
#   3. an online change (--adapt online, an injected 8x straggler): its plan
#      change line, and the new plan written next to the snapshots under the
#      id the metrics rows carry;
#   4. --profile under mpiexec: rank 0 alone writes the profile and says so;
#      every rank measures the links into it; the recomputation figures:
#      the share of a layer's activations each mode keeps equals what the
#      runtime's memory check counts (full < selective < 1), the time each
#      adds was measured (full > selective >= 0), and both read back through
#      malleus-replan (--print-profile, and --explain's workspace terms).
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
W=$(mktemp -d /tmp/malleus-test-progress-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
TRAIN=$top_builddir/malleus-train
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
mpi() { # NPROCS OUT ARGS...
    n=$1 out=$2
    shift 2
    sh "$top_srcdir/tests/mpirun.sh" "$n" 120 "$TRAIN" "$@" >"$out" 2>&1
}
field() { # FILE STEP KEY: the value of KEY in the metrics row of STEP
    grep "^{\"step\": $2," "$1" | sed -n "s/.*\"$3\": \"*\([^,\"}]*\).*/\1/p"
}

# 1. one process, MFU against a given peak
"$TRAIN" --model tiny --steps 8 --global-batch 4 --micro-batch 2 --peak-tflops 0.05 \
    --metrics "$W/one.jsonl" >"$W/one.out" 2>&1 || fail "one-process run"
grep -Eq '^step 8/8 \| loss [0-9.]+ \| .* tok/s \| +[0-9.]+ ms \| MFU +[0-9.]+% \| mem [0-9.]+ GiB \| [0-9]+:[0-9]{2}:[0-9]{2} elapsed, ETA [0-9]+:[0-9]{2}:[0-9]{2}$' \
    "$W/one.out" || fail "step line: $(grep '^step 8/8' "$W/one.out")"
grep -Eq '^\| MFU against +\| 0.05 TFLOP/s \(--peak-tflops\)' "$W/one.out" || fail "start-up table: MFU row"
grep -Eq '^plan [0-9a-f]{8} \(generation 0\): m=2 \[0:L0-4\]; predicted [0-9.]+ ms/step$' "$W/one.out" ||
    fail "no plan line at the start"
grep -Eq '^plan [0-9a-f]{8} \(generation 0\): measured [0-9.]+ ms/step over steps 2-5, predicted [0-9.]+ ms \(measured/predicted [0-9.]+\)$' \
    "$W/one.out" || fail "no measured line after 5 steps"
for k in time plan_gen plan_id mem_mb mfu; do
    [ -n "$(field "$W/one.jsonl" 8 $k)" ] || fail "metrics row 8 lacks $k"
done
t=$(field "$W/one.jsonl" 8 time)
now=$(date +%s)
[ "${t%.*}" -le "$now" ] && [ "${t%.*}" -ge $((now - 600)) ] || fail "row 8's time $t is not the wall clock ($now)"
# the MFU is the model FLOPs over the step time and the peak (bench/gpu/flops.py's count)
/usr/bin/python3 - "$W/one.jsonl" <<'PY' || fail "MFU does not match the FLOP count"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
C, F, V, L, T, B = 64, 128, 256, 4, 32, 4
per_token = 6 * (L * (4 * C * C + 3 * C * F) + V * C) + 6 * L * T * C
for r in rows:
    want = per_token * B * T / (r["step_ms"] / 1e3) / 0.05e12
    assert abs(r["mfu"] - want) <= 1e-3 * want + 1e-4, (r["step"], r["mfu"], want)
PY

# 2. a restart onto another plan
mpi 4 "$W/a.out" --model tiny --steps 6 --global-batch 8 --micro-batch 2 --dp 4 \
    --snapshot-dir "$W/snap" --metrics "$W/r.jsonl" || fail "first run: $(tail -3 "$W/a.out")"
id0=$(field "$W/r.jsonl" 6 plan_id)
mpi 4 "$W/b.out" --model tiny --steps 10 --global-batch 8 --micro-batch 2 --dp 2 --pp 2 \
    --snapshot-dir "$W/snap" --metrics "$W/r.jsonl" --resume --override steps || fail "resumed run: $(tail -3 "$W/b.out")"
id1=$(field "$W/r.jsonl" 7 plan_id)
grep -Eq "^plan change \(restart\) at step 6: generation 0 -> 1; old plan $id0: measured [0-9.]+ ms/step; new plan $id1: m=2 \[0:L0-2\] \[1:L2-4\] \| m=2 \[2:L0-2\] \[3:L2-4\], predicted [0-9.]+ ms/step; the change took [0-9.]+ s \(snapshot, re-plan, reshard, restart\)$" \
    "$W/b.out" || fail "no restart plan change line: $(grep 'plan' "$W/b.out")"
[ "$id0" != "$id1" ] && [ "$(field "$W/r.jsonl" 6 plan_gen)" = 0 ] &&
    [ "$(field "$W/r.jsonl" 10 plan_gen)" = 1 ] && [ "$(field "$W/r.jsonl" 10 plan_id)" = "$id1" ] ||
    fail "generations and ids in the metrics: $id0 -> $id1"
# the same layout resumed again is no change: same generation
mpi 4 "$W/c.out" --model tiny --steps 12 --global-batch 8 --micro-batch 2 --dp 2 --pp 2 \
    --snapshot-dir "$W/snap" --metrics "$W/r.jsonl" --resume --override steps || fail "third run"
grep -q "^plan $id1 (generation 1): " "$W/c.out" && ! grep -q 'plan change' "$W/c.out" ||
    fail "a resume on the same plan was taken for a change"

# 3. an online change
mpi 4 "$W/o.out" --model tiny --steps 8 --global-batch 8 --micro-batch 2 --dp 2 --pp 2 \
    --inject 3:8:1 --adapt online --check-every 2 --window 2 --change-cost 0 \
    --snapshot-dir "$W/osnap" --metrics "$W/o.jsonl" || fail "online run: $(tail -3 "$W/o.out")"
grep -Eq '^plan change \(online\) at step [0-9]+: generation 0 -> 1; old plan [0-9a-f]{8}: measured [0-9.]+ ms/step; new plan [0-9a-f]{8}: .*, predicted [0-9.]+ ms/step; the change took [0-9.]+ s$' \
    "$W/o.out" || fail "no online plan change line"
idn=$(field "$W/o.jsonl" 8 plan_id)
grep -q "^plan $idn written to $W/osnap/plan.1.json" "$W/o.out" && [ -f "$W/osnap/plan.1.json" ] ||
    fail "the new plan ($idn) was not written next to the snapshots"
grep -q '"suspended": \[3\]' "$W/osnap/plan.1.json" || fail "plan.1.json: $(cat "$W/osnap/plan.1.json")"
# the file is the plan in force: the run resumes on it with no change
mpi 4 "$W/p.out" --model tiny --steps 9 --global-batch 8 --plan "$W/osnap/plan.1.json" \
    --snapshot-dir "$W/osnap" --metrics "$W/o.jsonl" --resume --override steps || fail "resume on plan.1.json"
grep -q "^plan $idn (generation 1): " "$W/p.out" || fail "plan.1.json is not the plan in force"

# 4. --profile under mpiexec: rank 0 measures its device, every rank the
#    links (each pair's latency and bandwidth, the medians as the profile's
#    link figures, the pairs as a list malleus-replan --links reads)
mpi 3 "$W/prof.out" --model tiny --profile "$W/prof.json" || fail "--profile under mpiexec"
[ "$(grep -c 'written to' "$W/prof.out")" = 1 ] &&
    grep -q "profile of tiny written to $W/prof.json: the device's figures by rank 0 alone, the links' (latency .* s, bandwidth .* B/s within a node) by all 3 ranks" \
        "$W/prof.out" || fail "--profile: $(cat "$W/prof.out")"
for k in link_latency link_bandwidth activation_bytes grad_bytes; do
    grep -q "\"$k\": [1-9]" "$W/prof.json" || fail "--profile under mpiexec: no $k > 0"
done
[ "$(grep -c '{"a": [0-9], "b": [0-9], "latency": [0-9.e+-]*, "bandwidth": [0-9.e+-]*, "rate": ' "$W/prof.json")" = 3 ] ||
    fail "--profile on 3 ranks: not 3 measured pairs: $(cat "$W/prof.json")"
grep -q '"node_link' "$W/prof.json" && fail "--profile on one node measured links between nodes"
"$top_builddir/malleus-replan" --profile "$W/prof.json" --links "$W/prof.json" --world-size 3 \
    --ranks-per-node 3 --memory-mb 1000 -M 8 >/dev/null ||
    fail "the profile written under mpiexec does not plan (with its links)"
# The memory check's exact need (bytes) of one process per mode: a mode
# drops (L x in flight - 1) x a layer's dropped bytes (its one-layer buffer
# holds them once), which the profile's share kept must equal: 1 - dropped
# / rank_acts_mb.
for m in none selective full; do
    MALLEUS_MEMORY_MB=1 "$TRAIN" --model tiny --steps 1 --threads 1 --quiet --recompute $m \
        >"$W/need.$m" 2>&1
done
"$top_builddir/malleus-replan" -p "$W/prof.json" --print-profile >"$W/prof.back" 2>&1 ||
    fail "malleus-replan --print-profile of the measured profile: $(cat "$W/prof.back")"
cat >"$W/rc.json" <<'EOF'
{ "format": "malleus-plan/1", "micro_batch_size": 4,
  "pipelines": [ { "micro_batches": 4, "stages": [ { "ranks": [0], "layers": [0, 2], "recompute": "full" },
    { "ranks": [1], "layers": [2, 4], "recompute": "selective" } ] } ], "suspended": [] }
EOF
"$top_builddir/malleus-replan" -p "$W/prof.json" --world-size 2 --ranks-per-node 2 --memory-mb 1000 \
    -b 4 -M 4 --simulate "$W/rc.json" --explain >"$W/rc.explain" 2>&1 ||
    fail "malleus-replan --explain of a recomputing plan: $(cat "$W/rc.explain")"
python3 - "$W" <<'PY' || fail "--profile's recomputation figures: $(grep -A1 acts_kept "$W/prof.json")"
import json, re, sys
w = sys.argv[1]
p = json.load(open(w + "/prof.json"))
k, t, a = p["acts_kept"], p["recompute_time"], p["rank_acts_mb"]["1"]
bad = []
if not 0 < k["full"] < k["selective"] < 1:
    bad.append("acts_kept not 0 < full < selective < 1: %s" % k)
# full runs the layer's forward pass again: about a third of forward +
# backward (0.38-0.49 measured on tiny); selective a few element-wise
# kernels.  Timing one mode as another gives noise: a few per cent.
if not (t["full"] > t["selective"] + 0.15 and t["selective"] >= 0):
    bad.append("recompute_time not full > selective + 0.15, selective >= 0: %s" % t)
need = {}
for m in ("none", "selective", "full"):
    s = open("%s/need.%s" % (w, m)).read()
    g = re.search(r"layers \[0, (\d+)\).* (\d+) in flight, recompute %s\) needs (\d+) bytes" % m, s)
    if not g:
        sys.exit("no need for --recompute %s: %s" % (m, s))
    L, n, need[m] = int(g[1]), int(g[2]), int(g[3])
for m in ("selective", "full"):
    want = 1 - (need["none"] - need[m]) / (L * n - 1) / (a * 1048576)
    if abs(k[m] - want) > 2e-4:  # rank_acts_mb has 4 decimals
        bad.append("acts_kept %s %.6f, the runtime's %.6f" % (m, k[m], want))
back = json.loads(open(w + "/prof.back").read())
for f in ("acts_kept", "recompute_time"):
    if back[f] != p[f]:
        bad.append("%s read back as %s, written %s" % (f, back[f], p[f]))
# --explain: each recomputing stage's workspace is a layer's dropped share
ex = open(w + "/rc.explain").read()
ws = [float(x) for x in re.findall(r"recompute (?:full|selective) [0-9.]+ \+ workspace ([0-9.]+)", ex)]
exp = [a * (1 - k["full"]), a * (1 - k["selective"])]
if len(ws) != 2 or any(abs(x - y) > 1e-3 for x, y in zip(ws, exp)):
    bad.append("--explain's workspaces %s, not %s" % (ws, exp))
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
PY

[ $fails -eq 0 ] || exit 1
echo "PASS: step line, metrics fields, plan lines (start, restart, online), plan file, --profile on one rank"
