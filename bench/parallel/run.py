#!/usr/bin/python3
"""Benchmark of the hybrid-parallel runtime: tokens/s of uniform and
non-uniform plans on 8 ranks, with each time category's share of the step
(compute, TP all-reduce, pipeline send/recv wait, data-parallel sync, idle),
and 1 vs 2 ranks on this machine's cores.

usage: bench/parallel/run.py BUILD_DIR [--model tiny] [--steps 20]
                             [--global-batch 16] [--micro-batch 2]

Every run uses the same model, global batch and seed (so the same
mathematics); the first 3 steps are warm-up and left out.  Figures are
medians over steps.  Ratios, not absolute numbers, are the point: this
machine may be shared and oversubscribed (8 ranks on 2 cores)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PLANS = os.path.join(HERE, "..", "..", "tests", "plans")


def train_rows(build, nprocs, args, metrics, skip):
    """Run malleus-train ARGS on nprocs ranks (one BLAS thread each) with
    --quiet --metrics METRICS; its metrics rows after the first `skip`
    (warm-up).  Exits with the command and its stderr if the run fails.
    Shared with overlap.py."""
    if os.path.exists(metrics):
        os.unlink(metrics)
    cmd = ["mpiexec.mpich", "-n", str(nprocs), os.path.join(build, "malleus-train"),
           "--quiet", "--metrics", metrics] + args
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("run failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    with open(metrics) as f:
        return [json.loads(l) for l in f][skip:]


def run(build, nprocs, extra, a, tmp):
    rows = train_rows(build, nprocs, ["--model", a.model, "--steps", str(a.steps),
                                      "--global-batch", str(a.global_batch)] + extra,
                      os.path.join(tmp, "m.jsonl"), 3)
    tput = statistics.median(x["tokens_per_s"] for x in rows)
    share = {}
    for cat in ("compute_ms", "tp_ms", "pp_ms", "dp_ms", "idle_ms"):
        tot = [sum(r[cat] for r in x["ranks"]) for x in rows]
        step = [x["step_ms"] * len(x["ranks"]) for x in rows]
        share[cat[:-3]] = statistics.median(t / s for t, s in zip(tot, step))
    return tput, share


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=2)
    a = ap.parse_args()
    mb = ["--micro-batch", str(a.micro_batch)]
    cases = [
        ("1 rank", 1, mb),
        ("2 ranks dp2", 2, mb + ["--dp", "2"]),
        ("8 ranks dp8 (uniform)", 8, mb + ["--dp", "8"]),
        ("8 ranks tp8 (uniform)", 8, mb + ["--tp", "8"]),
        ("8 ranks dp2 tp2 pp2 (uniform)", 8, mb + ["--dp", "2", "--tp", "2", "--pp", "2"]),
        ("8 ranks pp4 x dp2 (uniform)", 8, ["--plan", os.path.join(PLANS, "pp4dp2.json")]),
        ("8 ranks mixed TP sizes", 8, ["--plan", os.path.join(PLANS, "mixed_tp.json")]),
        ("8 ranks uneven stages", 8, ["--plan", os.path.join(PLANS, "uneven_stages.json")]),
        ("8 ranks, 2 suspended", 8, ["--plan", os.path.join(PLANS, "suspended.json")]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        print("model %s, global batch %d, %d steps (median after 3 warm-up)" % (a.model, a.global_batch, a.steps))
        print("%-32s %10s %8s %8s %8s %8s %8s" % ("layout", "tokens/s", "compute", "tp", "pp", "dp", "idle"))
        base = None
        for name, n, extra in cases:
            t, sh = run(a.build, n, extra, a, tmp)
            base = base or t
            print("%-32s %10.0f %7.0f%% %7.0f%% %7.0f%% %7.0f%% %7.0f%%   (%.2fx 1 rank)"
                  % (name, t, 100 * sh["compute"], 100 * sh["tp"], 100 * sh["pp"], 100 * sh["dp"],
                     100 * sh["idle"], t / base))


if __name__ == "__main__":
    main()
