#!/bin/sh
# Set up everything on a fresh Debian 12 machine, build, and run the main
# job: 8 ranks train the `tiny` model on the built-in corpus with the
# straggler-adaptive restart loop (jobs/adaptive-loop.sh); rank 3 turns 8x
# slow at step 15 (injected); the monitor notices, the job stops with a
# snapshot, malleus-replan plans around the straggler, malleus-reshard moves
# the snapshot onto the new plan, and training resumes on it.  At the end:
# throughput before / during / after, the plans, and a plot.
# This is the README's first command.
set -eu
cd "$(dirname "$0")/.."
MALLEUS_NO_TORCH=1 sh scripts/install-deps.sh
[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure
make -j"$(nproc)"

RUN=${RUN_DIR:-$(pwd)/demo-run}
rm -rf "$RUN"
mkdir -p "$RUN"
STEPS=${STEPS:-60}
echo "demo: 8 ranks (uniform dp 2 x tp 2 x pp 2), rank 3 slowed 8x from step 15, $STEPS steps"
MALLEUS_BIN=$(pwd) RUN_DIR="$RUN" NPROCS=8 LAUNCH="mpiexec.mpich -n 8" STEPS=$STEPS \
    RANKS_PER_NODE=4 SNAPSHOT_EVERY=20 OPENBLAS_NUM_THREADS=1 \
    TRAIN_ARGS="--inject 3:8:14 --window 3 --gap 1.5 --noise-floor 2.0 --threshold 2.0" \
    bash jobs/adaptive-loop.sh

/usr/bin/python3 - "$RUN" <<'PY'
import json, os, statistics, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
replans = [r["step"] for r in rows if r.get("replan")]
after = [s for s in replans if s >= 15]
first = after[0] if after else None
def med(lo, hi):
    xs = [r["tokens_per_s"] for r in rows if lo <= r["step"] < hi]
    return statistics.median(xs) if xs else float("nan")
print("\ndemo: loss %.3f -> %.3f over %d steps" % (rows[0]["loss"], rows[-1]["loss"], rows[-1]["step"]))
print("demo: re-plans at steps %s" % replans)
if first:
    print("demo: median tokens/s: healthy (steps 3-14) %.0f | straggler on the old plan (15-%d) %.0f | "
          "new plans (%d-%d) %.0f" % (med(3, 15), first, med(15, first + 1), first + 2, rows[-1]["step"],
                                       med(first + 2, 10**9)))
else:
    print("demo: no re-plan after the straggler appeared (see events.log)")
for name in sorted(os.listdir(run)):
    if name.startswith("plan.") and name.endswith(".json"):
        p = json.load(open(os.path.join(run, name)))
        desc = []
        for i, pl in enumerate(p["pipelines"]):
            desc.append("m=%d " % pl["micro_batches"] + " ".join(
                "[%s: L%d-%d]" % (",".join(map(str, s["ranks"])), s["layers"][0], s["layers"][1]) for s in pl["stages"]))
        print("demo: %s: %s%s" % (name, " | ".join(desc), "  suspended %s" % p["suspended"] if p.get("suspended") else ""))
PY
/usr/bin/python3 scripts/plot-metrics.py "$RUN/metrics.jsonl" "$RUN/throughput.png" \
    --inject 3:8:14 --title "8 ranks, rank 3 slowed 8x at step 15: re-plan and restart" || true
echo "demo: metrics $RUN/metrics.jsonl, events $RUN/events.log, plot $RUN/throughput.png"
