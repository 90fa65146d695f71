#!/bin/sh
# The planner's memory per rank against the runtime's, plan by plan (run by
# hand; bench/README.md, "memory/run.sh").
#
# For each model (default: tiny tiny-llama3 small) and each plan (default:
# the valid plans of tests/plans plus two deep pipelines for the 4-layer
# models, three 8-layer plans for small, and two stages under each
# recompute mode and with one full and one selective stage (rc_*.json;
# small_pp2_*.json for small), all written to DIR), the
# planner's model of every stage comes from `malleus-replan --simulate PLAN
# --explain` (its "memory terms" lines), with two profiles: the preset's
# and one `malleus-train --profile` measured on this machine, both at a
# nominal TP size of the plan's largest group.  The runtime's figure is each
# rank's peak of the memory accountant (the kernel table's buffers, the
# "memory peak per rank" summary) after STEPS steps under mpiexec with
# --zero 0 and --zero 1, each against the planner's --zero 0 / --zero 1
# prediction.  The planner's fixed overhead X is process memory
# (the preset's guess, or the resident set the profile measured) that the
# accountant does not count, so the ratio is measured / (prediction - X).
#
# With -p bf16 (default fp32): every run and the measured profile compute
# in bf16 (--precision bf16: bf16 activations and working weights beside
# the fp32 master), and a third comparison is added: --zero 1
# --zero-master on (the master sharded as the moments) against the
# planner's --zero 1 --zero-master on.  --zero-master is passed explicitly
# to every run and prediction (-r: --zero 0 --zero-master off).
#
# Usage: bench/memory/run.sh [-p fp32|bf16] [-m "MODELS"] [-s STEPS] [-o DIR] [PLAN.json...]
#        bench/memory/run.sh -r [-p fp32|bf16] [-m "MODELS"] [-s STEPS] [-o DIR]
# With -r (activation recomputation; default model: small, 4 steps): each
# model on one rank (micro-batch 2, global batch 4) and on a two-stage
# pipeline of one rank each (micro-batch 1, 4 micro-batches: the first
# stage keeps 2 in flight) with --recompute none, selective and full: per
# rank the accountant's activation bytes at its peak, its peak, the least
# step time of steps 2.. (the first warms up; the least is the step other
# loads of a shared machine disturbed least) and the CPU time per step of
# all ranks (each run also with 1 step: the difference over STEPS - 1
# steps, without the set-up), with the ratios to none (memory saved, time
# added).
# Environment: MPIEXEC (default mpiexec.mpich), BUILD (default .: where
# malleus-train and malleus-replan are).
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
BUILD=${BUILD:-.}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
models=
steps=
out=
recompute=0
prec=fp32
while getopts m:s:o:p:rh opt; do
    case $opt in
    m) models=$OPTARG ;;
    p) prec=$OPTARG ;;
    s) steps=$OPTARG ;;
    o) out=$OPTARG ;;
    r) recompute=1 ;;
    *) sed -n '2,41p' "$0"; exit 2 ;;
    esac
done
case $prec in
fp32 | bf16) ;;
*) echo "run.sh: -p $prec: the precision is fp32 or bf16" >&2; exit 2 ;;
esac
if [ $recompute = 1 ]; then
    : "${models:=small}" "${steps:=4}"
else
    : "${models:=tiny tiny-llama3 small}" "${steps:=2}"
fi
shift $((OPTIND - 1))
for b in malleus-train malleus-replan; do
    [ -x "$BUILD/$b" ] || { echo "run.sh: no $BUILD/$b (build first, or set BUILD)" >&2; exit 2; }
done
command -v "$MPIEXEC" >/dev/null || { echo "run.sh: no $MPIEXEC (set MPIEXEC)" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/malleus-bench-memory-XXXXXX)
mkdir -p "$out" || exit 1
# -r: the recompute modes, one rank and two stages per model
recompute_bench() {
    : >"$out/runs"
    for model in $models; do
        layers=$("$BUILD/malleus-train" --model "$model" --steps 0 </dev/null 2>&1 |
            sed -n 's/^| layers \/ heads \/ ffn | *\([0-9]*\) .*/\1/p')
        [ -n "$layers" ] || { echo "run.sh: no model $model" >&2; return 1; }
        cat >"$out/$model-pp2.json" <<PLAN
{ "format": "malleus-plan/1", "micro_batch_size": 1, "comment": "two stages, 4 micro-batches",
  "pipelines": [ { "micro_batches": 4, "stages": [ { "ranks": [0], "layers": [0, $((layers / 2))] },
    { "ranks": [1], "layers": [$((layers / 2)), $layers] } ] } ], "suspended": [] }
PLAN
        for mode in none selective full; do
            for s in 1 "$steps"; do # CPU seconds of 1 and of STEPS steps: their difference
                pre="$out/$model-1rank-$mode-$s"
                /usr/bin/time -f "%U %S" -o "$pre.cpu" "$BUILD/malleus-train" --model "$model" \
                    --micro-batch 2 --global-batch 4 --steps "$s" --threads 1 --recompute $mode \
                    --precision $prec --zero 0 --zero-master off --metrics "$pre.jsonl" \
                    </dev/null >"$pre.log" 2>&1 ||
                    { cat "$pre.log"; return 1; }
                pre="$out/$model-pp2-$mode-$s"
                /usr/bin/time -f "%U %S" -o "$pre.cpu" "$MPIEXEC" -n 2 "$BUILD/malleus-train" \
                    --model "$model" --plan "$out/$model-pp2.json" --global-batch 4 --steps "$s" \
                    --threads 1 --recompute $mode --precision $prec --zero 0 --zero-master off \
                    --metrics "$pre.jsonl" </dev/null >"$pre.log" 2>&1 ||
                    { cat "$pre.log"; return 1; }
            done
            echo "$model 1rank $mode $out/$model-1rank-$mode" >>"$out/runs"
            echo "$model pp2 $mode $out/$model-pp2-$mode" >>"$out/runs"
        done
    done
    python3 - "$out/runs" "$steps" <<'PY'
import json, re, sys
RANK = re.compile(r"^\s*rank (\d+): ([0-9.]+) =.* activations ([0-9.]+)")
runs = [l.split() for l in open(sys.argv[1])]
steps = int(sys.argv[2])
res = {}
def cpu(path):
    u, s = open(path).read().split()[-2:]
    return float(u) + float(s)
for model, plan, mode, pre in runs:
    full = "%s-%d" % (pre, steps)
    peaks = {}
    for line in open(full + ".log"):
        m = RANK.match(line)
        if m:
            peaks[int(m[1])] = (float(m[3]), float(m[2]))
    rows = [json.loads(l) for l in open(full + ".jsonl")]
    # the least step time of steps 2..: on a shared machine, the step the
    # other loads disturbed least (the median moves with them)
    wall = min(r["step_ms"] for r in rows[1:]) if len(rows) > 1 else rows[0]["step_ms"]
    # CPU seconds per step (all ranks, one BLAS thread each): what the
    # work costs whoever else shares the cores
    per = (cpu(full + ".cpu") - cpu(pre + "-1.cpu")) / max(steps - 1, 1)
    res[model, plan, mode] = (peaks, wall, per)
print("activation recomputation: per rank, the accountant's activations at its peak and its "
      "peak (MiB); the least step time (ms) of steps 2..; the CPU time per step of all ranks "
      "(s, steps 2..%d); ratios to --recompute none" % steps)
fmt = "%-8s %-6s %-10s %4s %9s %9s %7s %7s %8s %7s %7s %7s"
print(fmt % ("model", "plan", "recompute", "rank", "acts MiB", "peak MiB", "acts/n", "peak/n",
             "step ms", "time/n", "cpu s", "cpu/n"))
for (model, plan, mode), (peaks, t, c) in res.items():
    base, tb, cb = res[model, plan, "none"]
    for r in sorted(peaks):
        a, p = peaks[r]
        step = ("%.0f" % t, "%.2f" % (t / tb), "%.2f" % c, "%.2f" % (c / cb)) if r == 0 else \
            ("", "", "", "")
        print(fmt % ((model, plan, mode, r, "%.1f" % a, "%.1f" % p, "%.2f" % (a / base[r][0]),
                      "%.2f" % (p / base[r][1])) + step))
PY
}
if [ $recompute = 1 ]; then
    echo "logs in $out" >&2
    recompute_bench
    exit $?
fi

# the default plans of a model: the suite's for the 4-layer models, plus
# two pipelines deeper than the suite's (1F1B keeps S - j micro-batches of
# activations on stage j); three 8-layer plans for `small`
write_plans() {
    cat >"$out/pp4.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 2, "comment": "one 4-stage pipeline, 8 micro-batches",
  "pipelines": [ { "micro_batches": 8, "stages": [ { "ranks": [0], "layers": [0, 1] },
    { "ranks": [1], "layers": [1, 2] }, { "ranks": [2], "layers": [2, 3] }, { "ranks": [3], "layers": [3, 4] } ] } ],
  "suspended": [] }
PLAN
    cat >"$out/pp3_uneven.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 2, "comment": "3 uneven stages beside a TP-2 replica",
  "pipelines": [ { "micro_batches": 6, "stages": [ { "ranks": [0], "layers": [0, 2] },
    { "ranks": [1], "layers": [2, 3] }, { "ranks": [2], "layers": [3, 4] } ] },
    { "micro_batches": 2, "stages": [ { "ranks": [3, 4], "layers": [0, 4] } ] } ],
  "suspended": [] }
PLAN
    cat >"$out/small_pp2.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 1, "comment": "small: 2 uneven stages",
  "pipelines": [ { "micro_batches": 4, "stages": [ { "ranks": [0], "layers": [0, 5] },
    { "ranks": [1], "layers": [5, 8] } ] } ], "suspended": [] }
PLAN
    cat >"$out/small_pp4.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 1, "comment": "small: one 4-stage pipeline",
  "pipelines": [ { "micro_batches": 8, "stages": [ { "ranks": [0], "layers": [0, 2] },
    { "ranks": [1], "layers": [2, 4] }, { "ranks": [2], "layers": [4, 6] }, { "ranks": [3], "layers": [6, 8] } ] } ],
  "suspended": [] }
PLAN
    cat >"$out/small_mixed.json" <<'PLAN'
{ "format": "malleus-plan/1", "micro_batch_size": 1, "comment": "small: a TP-2 replica beside a 2-stage pipeline",
  "pipelines": [ { "micro_batches": 5, "stages": [ { "ranks": [0, 1], "layers": [0, 8] } ] },
    { "micro_batches": 3, "stages": [ { "ranks": [2], "layers": [0, 3] }, { "ranks": [3], "layers": [3, 8] } ] } ],
  "suspended": [] }
PLAN
    # two stages under each recompute mode, and one with a full and a
    # selective stage: the planner's recomputation terms against the
    # runtime's (the measured profile's acts_kept)
    for m in none selective full mixed; do
        r0=$m r1=$m
        [ $m = mixed ] && r0=full r1=selective
        cat >"$out/rc_$m.json" <<PLAN
{ "format": "malleus-plan/1", "micro_batch_size": 2, "comment": "2 stages, recompute $r0 / $r1",
  "pipelines": [ { "micro_batches": 4, "stages": [ { "ranks": [0], "layers": [0, 2], "recompute": "$r0" },
    { "ranks": [1], "layers": [2, 4], "recompute": "$r1" } ] } ], "suspended": [] }
PLAN
        [ $m = none ] && continue
        cat >"$out/small_pp2_$m.json" <<PLAN
{ "format": "malleus-plan/1", "micro_batch_size": 1, "comment": "small: 2 uneven stages, recompute $r0 / $r1",
  "pipelines": [ { "micro_batches": 4, "stages": [ { "ranks": [0], "layers": [0, 5], "recompute": "$r0" },
    { "ranks": [1], "layers": [5, 8], "recompute": "$r1" } ] } ], "suspended": [] }
PLAN
    done
}
plans_of() { # MODEL: the default plans (one a line)
    P="$top/tests/plans"
    case $1 in
    small) printf '%s\n' "$out/small_pp2.json" "$out/small_pp4.json" "$out/small_mixed.json" \
        "$out/small_pp2_selective.json" "$out/small_pp2_full.json" "$out/small_pp2_mixed.json" ;;
    *) for n in one dp8 four four_moved three_replicas six keep_extend mixed_tp pp4dp2 tp4dp2 \
        tp8 uneven_stages suspended; do echo "$P/$n.json"; done
       printf '%s\n' "$out/pp4.json" "$out/pp3_uneven.json" "$out/rc_none.json" \
           "$out/rc_selective.json" "$out/rc_full.json" "$out/rc_mixed.json" ;;
    esac
}
write_plans
sfx= runs="z0 z1"
[ $prec = bf16 ] && sfx=-bf16 runs="z0 z1 z1m"
: >"$out/plans.given"
for plan in "$@"; do echo "$plan" >>"$out/plans.given"; done
echo "logs in $out" >&2
fails=0
for model in $models; do
    if [ -s "$out/plans.given" ]; then list="$out/plans.given"; else
        plans_of "$model" >"$out/plans.$model"; list="$out/plans.$model"; fi
    while read -r plan; do
        name=$(basename "$plan" .json)
        # world size, global batch, largest TP group of the plan
        info=$(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
ranks = [r for pl in p["pipelines"] for s in pl["stages"] for r in s["ranks"]] + p.get("suspended", [])
m = sum(pl["micro_batches"] for pl in p["pipelines"])
tp = max(len(s["ranks"]) for pl in p["pipelines"] for s in pl["stages"])
print(max(ranks) + 1, m * p["micro_batch_size"], m, p["micro_batch_size"], tp)' "$plan") || exit 1
        read -r world gb nmb mbs tp <<INFO
$info
INFO
        pre="$out/$model-$name"
        # the profile in the runs' precision (bf16: the working copy apart
        # in its state_bytes, activations at 2 bytes)
        prof="$out/profile-$model-b$mbs-tp$tp$sfx.json"
        if [ ! -s "$prof" ]; then
            "$BUILD/malleus-train" --model "$model" --micro-batch "$mbs" --tp "$tp" --threads 1 \
                --precision $prec --profile "$prof" </dev/null >"$prof.log" 2>&1 ||
                { cat "$prof.log"; exit 1; }
        fi
        echo "{\"preset\": \"$model\", \"tp\": $tp}" >"$out/preset-$model-tp$tp.json"
        C="--world-size $world --ranks-per-node $world --memory-mb 1048576 -b $mbs -M $nmb"
        ok=1
        "$BUILD/malleus-replan" $C -p "$out/preset-$model-tp$tp.json" --simulate "$plan" \
            --explain --zero 0 --zero-master off >"$pre.preset" 2>&1 &&
            "$BUILD/malleus-replan" $C -p "$prof" --simulate "$plan" --explain --zero 0 \
                --zero-master off >"$pre.measured" 2>&1 &&
            "$BUILD/malleus-replan" $C -p "$prof" --simulate "$plan" --explain --zero 1 \
                --zero-master off >"$pre.measured1" 2>&1 || ok=0
        # runs: z0, z1 (--zero-master off) and in bf16 z1m (--zero-master on)
        for z in $runs; do
            [ $ok = 1 ] || break
            case $z in
            z0) zo="--zero 0 --zero-master off" ;;
            z1) zo="--zero 1 --zero-master off" ;;
            z1m)
                zo="--zero 1 --zero-master on"
                "$BUILD/malleus-replan" $C -p "$prof" --simulate "$plan" --explain $zo \
                    >"$pre.measured1m" 2>&1 || { ok=0; break; }
                ;;
            esac
            "$MPIEXEC" -n "$world" "$BUILD/malleus-train" --model "$model" --plan "$plan" \
                --global-batch "$gb" --steps "$steps" --threads 1 --precision $prec $zo \
                </dev/null >"$pre.$z" 2>&1 || ok=0
        done
        if [ $ok = 0 ]; then
            echo "run.sh: $model $name failed (logs $pre.*)" >&2
            fails=$((fails + 1))
            continue
        fi
        echo "$model $name $pre"
    done <"$list"
done >"$out/runs"
python3 - "$out/runs" "$prec" <<'PY'
import re, sys
TERMS = re.compile(r"memory terms .*= total ([0-9.]+)")
STAGE = re.compile(r"pipeline (\d+) stage (\d+): TP \d+ ranks \[([0-9 ]+)\]")
OVER = re.compile(r"overhead ([0-9.]+)")
RANK = re.compile(r"^\s*rank (\d+): ([0-9.]+) =(.*)")

def stages(path):
    rows, cur = [], None
    for line in open(path):
        m = STAGE.search(line)
        if m:
            cur = (int(m[1]), int(m[2]), [int(r) for r in m[3].split()])
            continue
        m = TERMS.search(line)
        if m and cur:
            rows.append(cur + (float(m[1]) - float(OVER.search(line)[1]),))
            cur = None
    return rows

def peaks(path):  # rank -> total
    out, on = {}, False
    for line in open(path):
        if "memory peak per rank" in line:
            on = True
        elif on and RANK.match(line):
            m = RANK.match(line)
            out[int(m[1])] = float(m[2])
    return out

def ranks_str(r):
    return "%d-%d" % (r[0], r[-1]) if len(r) > 2 and r == list(range(r[0], r[-1] + 1)) else \
        ",".join(map(str, r))

# bf16: the third comparison, --zero 1 --zero-master on (m1m, z1m)
master = sys.argv[2] == "bf16"
if master:
    print("precision bf16 (malleus-train --precision bf16; the profile measured in bf16)")
print("memory per rank, MiB. pred: the planner's stage memory without its fixed overhead X "
      "(process memory the accountant does not count), from the preset profile and from a "
      "profile malleus-train --profile measured here (m0: --zero 0, m1: --zero 1%s). z0 / z1%s: "
      "the accountant's peak with --zero 0 / 1%s (the largest rank of the stage)" %
      ((", m1m: --zero 1 --zero-master on", " / z1m", " / 1 --zero-master on") if master else
       ("", "", "")))
hdr = ("model", "plan", "p.s", "ranks", "pred pre", "pred m0", "pred m1", "z0", "z1",
       "z0/pre", "z0/m0", "z1/m1")
fmt = "%-11s %-19s %-4s %-7s %8s %8s %8s %8s %8s %6s %6s %6s"
if master:
    hdr += ("pred m1m", "z1m", "z1m/m1m")
    fmt += " %8s %8s %7s"
print(fmt % hdr)
rows = []
for line in open(sys.argv[1]):
    model, name, pre = line.split()
    sp, sm, s1 = stages(pre + ".preset"), stages(pre + ".measured"), stages(pre + ".measured1")
    z0, z1 = peaks(pre + ".z0"), peaks(pre + ".z1")
    s1m, z1m = (stages(pre + ".measured1m"), peaks(pre + ".z1m")) if master else (s1, z1)
    for (i, j, ranks, p), (_, _, _, q), (_, _, _, q1), (_, _, _, q1m) in zip(sp, sm, s1, s1m):
        a = max(z0.get(r, 0) for r in ranks)
        b = max(z1.get(r, 0) for r in ranks)
        c = max(z1m.get(r, 0) for r in ranks)
        cells = (model, name, "%d.%d" % (i, j), ranks_str(ranks), "%.3f" % p, "%.3f" % q,
                 "%.3f" % q1, "%.3f" % a, "%.3f" % b, "%.2f" % (a / p), "%.2f" % (a / q),
                 "%.2f" % (b / q1))
        if master:
            cells += ("%.3f" % q1m, "%.3f" % c, "%.2f" % (c / q1m))
        print(fmt % cells)
        rows.append((model, a / q, b / q1, a / p, c / q1m))
for model in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == model]
    def span(k):
        v = [r[k] for r in rs]
        return "%.2f-%.2f" % (min(v), max(v))
    def within(k):
        return sum(1 for r in rs if abs(r[k] - 1) <= 0.10)
    print("%s: %d stages; measured profile: z0/pred %s (within 10%%: %d), z1/pred(--zero 1) %s "
          "(within 10%%: %d)%s; z0/pred(preset) %s" %
          (model, len(rs), span(1), within(1), span(2), within(2),
           ", z1m/pred(--zero 1 --zero-master on) %s (within 10%%: %d)" % (span(4), within(4))
           if master else "", span(3)))
PY
exit $((fails > 0))
