#!/bin/sh
# Planner at scale: planning time for 64 ... 100,000 ranks and the
# deep-pipeline cases, each against the capacity bound; with `envelope`, the
# planner's time and memory from 1,024 to 2^20 ranks (replan/README.md, "Time
# and memory").
#
#   sh bench/replan/scale.sh [BUILD_DIR]
#   sh bench/replan/scale.sh BUILD_DIR envelope [SIZES [FRACTIONS [MAX_S [LIMITS]]]]
#
# speed: 70b on 8-GPU nodes with 80 GiB, M = ranks / 2, stragglers from
#   bench/replan/gen.py (5 % of 64 and 1,024 ranks, 1 % of 10,000, 0.1 % of
#   100,000 at rates 1.5-12; 100,000 also with none);
# deep: 70b, one straggler (rate 2-6) in every fourth node of 8, M = ranks,
#   1,024 ranks with 12 and with 32 nominal pipelines, 10,000 with 125.
# Columns: ranks, stragglers, nominal pipelines, pipelines of the plan,
# suspended ranks, planning seconds, step (cost model), simulated, bound,
# bound / step.
# envelope: the same cluster and model, M = ranks / 2, stragglers from gen.py
#   at every fraction of FRACTIONS (default "0 0.05 0.2") for every size of
#   SIZES (default "1024 8192 32768 131072 1048576"), under every limit of
#   LIMITS (default "default 0": malleus-replan's default, and none; a run is
#   given up after MAX_S seconds, default 1800).  Columns: ranks, fraction,
#   limit, wall seconds of the whole command, peak resident MB (getrusage of
#   the child), planning seconds, step, the search's lower bound, gap, why
#   it stopped.
# Run under flock /tmp/malleus-heavy.lock for timings.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
bin="$build/malleus-replan"
py=${PYTHON3:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_scale.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ "${2:-}" = envelope ]; then
    sizes=${3:-"1024 8192 32768 131072 1048576"}
    fracs=${4:-"0 0.05 0.2"}
    max_s=${5:-1800}
    limits=${6:-"default 0"}
    printf '%8s %5s %6s %8s %8s %8s %8s %8s %6s %s\n' ranks frac limit wall_s peak_MB plan_s \
        step_s bound_s gap stop
    for n in $sizes; do
        for f in $fracs; do
            if [ "$f" = 0 ]; then echo '{}' >"$tmp/rates.json"; else
                "$py" "$here/gen.py" "$n" "$f" 1.5 12 "$n" >"$tmp/rates.json"; fi
            for limit in $limits; do
                lim=""
                [ "$limit" = default ] || lim="--time-limit $limit"
                # shellcheck disable=SC2086
                "$py" - "$max_s" "$n" "$f" "$limit" "$bin" --world-size "$n" --ranks-per-node 8 \
                    --memory-mb 81920 --model 70b --micro-batches $((n / 2)) \
                    --rates "$tmp/rates.json" --summary $lim -o "$tmp/plan.json" <<'PY'
import json, resource, subprocess, sys, time
max_s, n, f, limit, cmd = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
t0 = time.monotonic()
try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=max_s)
except subprocess.TimeoutExpired:
    print("%8s %5s %6s %8s  (no plan within %.0f s)" % (n, f, limit, ">%.0f" % max_s, max_s))
    sys.exit(0)
wall = time.monotonic() - t0
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0  # KiB -> MiB
if p.returncode:
    print("%8s %5s %6s %8.1f %8.0f  failed (%d): %s" % (n, f, limit, wall, peak, p.returncode,
                                                      p.stderr.strip()[-200:]))
    sys.exit(0)
s = json.loads(p.stdout.strip().splitlines()[-1])
print("%8s %5s %6s %8.1f %8.0f %8.2f %8.3f %8.3f %5.1f%% %s" % (
    n, f, limit, wall, peak, s["plan_seconds"], s["step"], s["lower_bound"], 100 * s["gap"],
    s["stop"]))
PY
            done
        done
    done
    exit 0
fi

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
