#!/bin/sh
# Planner at scale (issue 14): planning time for 64 ... 100,000 ranks and the
# deep-pipeline cases, each against the capacity bound.
#
#   sh bench/replan/scale.sh [BUILD_DIR]
#
# speed: 70b on 8-GPU nodes with 80 GiB, M = ranks / 2, stragglers from
#   bench/replan/gen.py (5 % of 64 and 1,024 ranks, 1 % of 10,000, 0.1 % of
#   100,000 at rates 1.5-12; 100,000 also with none);
# deep: 70b, one straggler (rate 2-6) in every fourth node of 8, M = ranks,
#   1,024 ranks with 12 and with 32 nominal pipelines, 10,000 with 125.
# Columns: ranks, stragglers, nominal pipelines, pipelines of the plan,
# suspended ranks, planning seconds, step (cost model), simulated, bound,
# bound / step.  Run under flock /tmp/malleus-heavy.lock for timings.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
bin="$build/malleus-replan"
py=${PYTHON3:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_scale.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
row() { # ranks M pipelines(0: default) rates-file label
    dp=""
    [ "$3" -gt 0 ] && dp="--pipelines $3"
    # shellcheck disable=SC2086
    "$bin" --world-size "$1" --ranks-per-node 8 --memory-mb 81920 --model 70b \
        --micro-batches "$2" $dp --rates "$4" --summary -o "$tmp/plan.json" >"$tmp/sum"
    "$py" - "$tmp/sum" "$5" "$3" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%-6s %7d %5d %5s %5d %5d %8.3f %8.3f %8.3f %8.3f %6.3f" % (
    sys.argv[2], s["ranks"], s["stragglers"], sys.argv[3] if sys.argv[3] != "0" else "-",
    s["pipelines"], s["suspended"], s["plan_seconds"], s["step"], s["simulated"], s["bound"],
    s["bound"] / s["step"]))
PY
}
printf '%-6s %7s %5s %5s %5s %5s %8s %8s %8s %8s %6s\n' case ranks strag nomDP pipes susp \
    plan_s step_s sim_s bound_s frac
for spec in "64 0.05" "1024 0.05" "10000 0.01" "100000 0.001" "100000 0"; do
    set -- $spec
    if [ "$2" = 0 ]; then echo '{}' >"$tmp/rates.json"; else
        "$py" "$here/gen.py" "$1" "$2" 1.5 12 "$1" >"$tmp/rates.json"; fi
    row "$1" $(($1 / 2)) 0 "$tmp/rates.json" speed
done
for spec in "1024 12" "1024 32" "10000 125"; do
    set -- $spec
    "$py" - "$1" >"$tmp/deep.json" <<'PY'
import json, random, sys
world = int(sys.argv[1])
rng = random.Random(1)
rates = {}
for n in range(0, world // 8, 4):
    rates[n * 8 + rng.randrange(8)] = round(rng.uniform(2, 6), 2)
json.dump({str(r): x for r, x in sorted(rates.items())}, sys.stdout)
PY
    row "$1" "$1" "$2" "$tmp/deep.json" deep
done
