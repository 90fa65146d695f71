#!/bin/sh
# Planner benchmark: planning time and predicted step time for
# 8 ... 4096 ranks with 1-5% stragglers at rates 1.5-12, against the uniform
# plan (what a Megatron-style run keeps doing) and the capacity bound (all the
# work spread over every GPU at its speed, no bubble).
#
#   sh bench/replan/run.sh [BUILD_DIR] [SIZES]
#
# Prints one table row per case; the 1F1B simulation of each plan is shown
# next to the cost model's closed form.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
sizes=${2:-"8 64 256 1024 4096"}
bin="$build/malleus-replan"
py=${PYTHON3:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_replan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
printf '%6s %5s %5s %4s %9s %10s %10s %10s %10s %8s %8s\n' ranks strag susp pipe plan_s \
    step_s sim_s uniform_s bound_s vs_unif vs_bound
for n in $sizes; do
    if [ "$n" -le 8 ]; then model=small; M=32; else model=70b; M=$((n / 2)); fi
    for frac in 0.01 0.05; do
        "$py" "$here/gen.py" "$n" "$frac" 1.5 12 "$n" >"$tmp/rates.json"
        "$bin" --world-size "$n" --ranks-per-node 8 --memory-mb 81920 --model "$model" \
            --micro-batches "$M" --rates "$tmp/rates.json" --summary -o "$tmp/plan.json" >"$tmp/sum"
        "$py" - "$tmp/sum" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%6d %5d %5d %4d %9.4f %10.3f %10.3f %10.3f %10.3f %7.2fx %7.3fx" % (
    s["ranks"], s["stragglers"], s["suspended"], s["pipelines"], s["plan_seconds"], s["step"],
    s["simulated"], s["uniform"], s["bound"], s["uniform"] / s["step"], s["step"] / s["bound"]))
PY
    done
done
