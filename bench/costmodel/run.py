#!/usr/bin/python3
"""The planner's cost model against measured runs.

Profiles `tiny` on this machine (malleus-train --profile), then for every
plan the 8-rank CPU suite runs (tests/plans) and for bench/adapt's straggler
scenarios (rank 3 at 2x, 4x, 8x; ranks 2 and 3 at 4x on one node: the static
uniform plan and the planner's plan for those rates, both run with the
injection) measures the median step time of malleus-train on 8 ranks, and
compares it with the predicted step time: the cost model's closed form and
the event-level simulator (malleus-replan --simulate), from the measured
profile.

Columns: measured median step (ms) and the medians of the slowest rank's
compute, pipeline (send/receive), data-parallel (gradient sync) and TP
(all-reduce) time; predicted closed form and simulation (ms); errors.

Run under the shared lock, the timings mean nothing otherwise:
  flock /tmp/malleus-heavy.lock bench/costmodel/run.py BUILD_DIR [--steps 30]
  [--profile FILE] (reuse a profile) [--json OUT] (all numbers)"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PLANS = os.path.join(HERE, "..", "..", "tests", "plans")
SUITE = ["dp8", "tp8", "pp4dp2", "tp4dp2", "mixed_tp", "uneven_stages", "suspended",
         "keep_extend"]
SCENARIOS = [("rank 3 at 2x", {3: 2.0}), ("rank 3 at 4x", {3: 4.0}), ("rank 3 at 8x", {3: 8.0}),
             ("ranks 2, 3 at 4x", {2: 4.0, 3: 4.0})]
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, **kw)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), r.stdout[-2000:], r.stderr[-2000:]))
    return r.stdout


def n_micro_batches(plan):
    p = json.load(open(plan))
    return p["micro_batch_size"], sum(q["micro_batches"] for q in p["pipelines"])


def measure(build, plan, rates, steps, tmp, tag):
    """Median step time (ms) after the first 5 steps, and the slowest rank's
    median breakdown."""
    mbs, m = n_micro_batches(plan)
    metrics = os.path.join(tmp, tag + ".jsonl")
    cmd = ["mpiexec.mpich", "-n", "8", os.path.join(build, "malleus-train"), "--model", "tiny",
           "--plan", plan, "--global-batch", str(mbs * m), "--steps", str(steps), "--threads",
           "1", "--metrics", metrics, "--quiet"]
    for r, x in sorted(rates.items()):
        cmd += ["--inject", "%d:%g" % (r, x)]
    run(cmd)
    rows = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
    rows = [r for r in rows if r["step"] > 5]
    out = {"step_ms": statistics.median(r["step_ms"] for r in rows)}
    for k in ("compute_ms", "pp_ms", "dp_ms", "tp_ms", "idle_ms", "probe_ms", "monitor_ms"):
        out[k] = statistics.median(max(x[k] for x in r["ranks"]) for r in rows)
    return out


def predict(build, plan, rates, profile, tmp, tag):
    mbs, m = n_micro_batches(plan)
    rf = os.path.join(tmp, tag + "-rates.json")
    json.dump({str(r): x for r, x in rates.items()}, open(rf, "w"))
    out = run([os.path.join(build, "malleus-replan"), "--world-size", "8", "--ranks-per-node",
               "8", "--memory-mb", "65536", "--profile", profile, "--micro-batch-size", str(mbs),
               "--micro-batches", str(m), "--rates", rf, "--simulate", plan, "--summary"])
    s = json.loads(out.strip().splitlines()[-1])
    return 1e3 * s["closed_form"], 1e3 * s["simulated"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile")
    ap.add_argument("--json")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_costmodel.")
    profile = a.profile
    if not profile:
        profile = os.path.join(tmp, "profile.json")
        run([os.path.join(a.build, "malleus-train"), "--model", "tiny", "--tp", "8",
             "--micro-batch", "2", "--threads", "1", "--profile", profile])
    prof = json.load(open(profile))
    print("profile: layer time %.3f ms (TP 8), alpha %s" % (1e3 * prof["layer_time"],
                                                           prof["alpha"]))
    # the same measurements at the suite's nominal TP 2 (bench/adapt runs
    # dp 2 x tp 2 x pp 2): times and memory per TP-2 group, alpha relative
    # to it (sizes 4 and 8 faster per layer)
    a2 = prof["alpha"]["2"]
    p2 = dict(prof, tp=2, layer_time=prof["layer_time"] * a2,
              alpha={k: v / a2 for k, v in prof["alpha"].items()},
              layer_memory_mb=[4 * k for k in prof["layer_memory_mb"]],
              embedding_memory_mb=4 * prof["embedding_memory_mb"])
    p2["name"] = "tiny (measured, TP 2)"
    profile = os.path.join(tmp, "profile-tp2.json")
    json.dump(p2, open(profile, "w"))
    cases = [(name, os.path.join(PLANS, name + ".json"), {}) for name in SUITE]
    for name, rates in SCENARIOS:
        uni = os.path.join(tmp, "uniform.json")
        run([os.path.join(a.build, "malleus-replan"), "--world-size", "8", "--ranks-per-node", "4",
             "--memory-mb", "65536", "--profile", profile, "--micro-batch-size", "2",
             "--micro-batches", "8", "--pipelines", "2", "--uniform", "-o", uni])
        rf = os.path.join(tmp, "r.json")
        json.dump({str(r): x for r, x in rates.items()}, open(rf, "w"))
        planned = os.path.join(tmp, "plan-%s.json" % name.replace(" ", "_").replace(",", ""))
        run([os.path.join(a.build, "malleus-replan"), "--world-size", "8", "--ranks-per-node", "4",
             "--memory-mb", "65536", "--profile", profile, "--micro-batch-size", "2",
             "--micro-batches", "8", "--pipelines", "2", "--rates", rf, "-o", planned])
        cases.append(("static, " + name, uni, rates))
        cases.append(("planned, " + name, planned, rates))
    print("%-26s %8s %8s %7s %7s %7s %9s %8s %7s %7s" % (
        "plan", "measured", "compute", "pp", "dp", "tp", "predicted", "sim", "err", "err_sim"))
    results = []
    for i, (name, plan, rates) in enumerate(cases):
        m = measure(a.build, plan, rates, a.steps, tmp, "run%d" % i)
        cf, sim = predict(a.build, plan, rates, profile, tmp, "run%d" % i)
        err, err_sim = cf / m["step_ms"] - 1, sim / m["step_ms"] - 1
        print("%-26s %8.1f %8.1f %7.1f %7.1f %7.1f %9.1f %8.1f %+6.0f%% %+6.0f%%" % (
            name, m["step_ms"], m["compute_ms"], m["pp_ms"], m["dp_ms"], m["tp_ms"], cf, sim,
            100 * err, 100 * err_sim))
        results.append(dict(plan=name, rates=rates, predicted_ms=cf, simulated_ms=sim, **m))
    if a.json:
        json.dump({"profile": prof, "results": results}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
