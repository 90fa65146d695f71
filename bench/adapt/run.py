#!/usr/bin/python3
"""Benchmark of straggler adaptation (issues 6 and 7) on 8 ranks.

For each scenario - one straggler at 2x, 4x and 8x; two stragglers on one
node; a straggler that recovers - run the same training three ways:

  static   the uniform plan throughout (what a Megatron-style run does)
  restart  jobs/adaptive-loop.sh: snapshot, malleus-replan, malleus-reshard,
           restart (time lost in restarts included: whole-loop wall time)
  online   --adapt online: re-plan and migrate inside the job

and report tokens/s over the whole run, each against the capacity bound
(the straggler-free run's throughput scaled by the mean speed of the ranks,
sum(1/rate)/N, i.e. all work spread perfectly over every rank at its speed,
while the scenario's stragglers are slow).  Also: the time of one online
migration vs one snapshot + reshard + restart for the same plan change, and
the bytes an online change moves vs the full state.

usage: bench/adapt/run.py BUILD_DIR [--steps 40] [--model tiny]"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOOP = os.path.join(HERE, "..", "..", "jobs", "adaptive-loop.sh")
POLICY = ["--window", "3", "--gap", "1.5", "--noise-floor", "2.0", "--threshold", "2.0"]


def train(build, a, extra, tmp, tag):
    metrics = os.path.join(tmp, tag + ".jsonl")
    cmd = ["mpiexec.mpich", "-n", "8", os.path.join(build, "malleus-train"), "--model", a.model,
           "--steps", str(a.steps), "--global-batch", "16", "--micro-batch", "2", "--dp", "2",
           "--tp", "2", "--pp", "2", "--ranks-per-node", "4", "--metrics", metrics,
           "--log-every", "1"] + extra
    t0 = time.time()
    r = subprocess.run(cmd, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return wall, r.stdout, metrics


def loop(build, a, inject, tmp, tag):
    run = os.path.join(tmp, tag)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MALLEUS_BIN=build, RUN_DIR=run, NPROCS="8",
               LAUNCH="mpiexec.mpich -n 8", MODEL=a.model, STEPS=str(a.steps), RANKS_PER_NODE="4",
               SNAPSHOT_EVERY="1000", TRAIN_ARGS=" ".join(inject + POLICY))
    t0 = time.time()
    r = subprocess.run(["bash", LOOP], env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit("loop failed:\n%s\n%s" % (r.stdout[-2000:], r.stderr[-2000:]))
    events = open(os.path.join(run, "events.log")).read()
    return wall, events.count("re-plan requested"), run


def bound_factor(inject, steps):
    """Mean over steps of sum(1/rate)/N with the scenario's injected rates."""
    tot = 0.0
    for s in range(steps):
        rates = [1.0] * 8
        for spec in inject[1::2]:
            p = spec.split(":")
            r, f = int(p[0]), float(p[1])
            lo = int(p[2]) if len(p) > 2 else 0
            hi = int(p[3]) if len(p) > 3 else 1 << 30
            if lo <= s < hi:
                rates[r] *= f
        tot += sum(1 / x for x in rates) / 8
    return tot / steps


def timed(cmd, env=None):
    t0 = time.time()
    r = subprocess.run(cmd, env=env or dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return time.time() - t0, r.stdout


def one_plan_change(a, tmp, model=None, steps=5, reps=3):
    b = a.build
    model = model or a.model
    train = [os.path.join(b, "malleus-train"), "--model", model, "--global-batch", "16",
             "--micro-batch", "2", "--steps", str(steps), "--quiet"]
    mpi = ["mpiexec.mpich", "-n", "8"]
    plan0, plan1 = os.path.join(tmp, "p0.json"), os.path.join(tmp, "p1.json")
    rates = os.path.join(tmp, "rates.json")
    with open(rates, "w") as f:
        f.write('{"3": 8.0}')
    common = ["--world-size", "8", "--ranks-per-node", "4", "--memory-mb", "16384", "--model",
              model, "-g", "16", "-b", "2"]
    timed([os.path.join(b, "malleus-replan")] + common + ["--pipelines", "2", "--uniform", "-o", plan0])
    saves = []
    for i in range(reps):
        snap = os.path.join(tmp, "s0-%d" % i)
        # malleus-train logs the snapshot's own time (rank 0, after the
        # commit); --quiet would hide it, so the log level stays
        _, out = timed(mpi + train[:-1] + ["--plan", plan0, "--snapshot-dir", snap])
        saves.append(float(re.search(r"snapshot written: \S+ \(([\d.]+) s\)", out).group(1)))
    t_save = statistics.median(saves)
    t_replan, _ = timed([os.path.join(b, "malleus-replan")] + common +
                        ["--rates", rates, "--current", plan0, "-o", plan1])
    t_reshard, _ = timed([os.path.join(b, "malleus-reshard"), "--quiet", os.path.join(tmp, "s0-0"),
                          plan1, os.path.join(tmp, "s1")])
    t_restart, _ = timed(mpi + train + ["--plan", plan1, "--snapshot-dir", os.path.join(tmp, "s1"),
                                        "--resume"])
    restart = t_save + t_replan + t_reshard + t_restart
    _, out = timed(mpi + train[:-3] + ["--steps", str(steps + 4), "--dp", "2", "--tp", "2", "--pp",
                                       "2", "--inject", "3:8:1", "--adapt", "online",
                                       "--ranks-per-node", "4", "--check-every", "2"] + POLICY)
    mig = [(float(m.group(1)), float(m.group(2)), float(m.group(3)))
           for m in re.finditer(r"online migration \d+ at step \d+: ([\d.]+) MiB moved, "
                                r"([\d.]+) MiB kept in place, ([\d.]+) s", out)]
    print("model %s:" % model)
    print("one plan change, restart path: snapshot %.2f s + replan %.2f s + reshard %.2f s + "
          "restart and load %.2f s = %.2f s" % (t_save, t_replan, t_reshard, t_restart, restart))
    if mig:
        moved, kept, secs = mig[0]
        print("one plan change, online: migration %.3f s, %.2f MiB moved of %.2f MiB of state "
              "(%.0f%% kept in place) -> %.3fx the restart path"
              % (secs, moved, moved + kept, 100 * kept / max(moved + kept, 1e-9), secs / restart))
        line = re.search(r"online migration 1 at step .*", out)
        print("  malleus-train: " + line.group(0))
    else:
        print("one plan change, online: no migration happened")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", default="tiny")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    tokens = 16 * 32 * a.steps  # global batch x seq_len (tiny) x steps
    scenarios = [
        ("1 straggler 2x", ["--inject", "3:2:5"]),
        ("1 straggler 4x", ["--inject", "3:4:5"]),
        ("1 straggler 8x", ["--inject", "3:8:5"]),
        ("2 stragglers, one node", ["--inject", "2:4:5", "--inject", "3:4:5"]),
        ("straggler recovers", ["--inject", "3:4:5:%d" % (a.steps // 2)]),
    ]
    tmp = tempfile.mkdtemp(prefix="malleus-bench-adapt-")
    try:
        wall, _, _ = train(a.build, a, [], tmp, "healthy")
        healthy = tokens / wall
        print("model %s, 8 ranks, %d steps; healthy static run: %.0f tokens/s (wall %.1f s)"
              % (a.model, a.steps, healthy, wall))
        print("%-24s %9s %9s %9s %9s   %s" % ("scenario", "static", "restart", "online", "bound",
                                              "vs bound: static / restart / online"))
        for name, inject in scenarios:
            ws, _, _ = train(a.build, a, inject, tmp, "static")
            wr, n_re, _ = loop(a.build, a, inject, tmp, "loop-" + name.replace(" ", "_"))
            wo, out, _ = train(a.build, a, inject + ["--adapt", "online"] + POLICY, tmp, "online")
            b = healthy * bound_factor(inject, a.steps)
            ts, tr, to = tokens / ws, tokens / wr, tokens / wo
            print("%-24s %9.0f %9.0f %9.0f %9.0f   %.2f / %.2f / %.2f   (%d restarts, %d online changes)"
                  % (name, ts, tr, to, b, ts / b, tr / b, to / b, n_re,
                     len(re.findall(r"online migration \d+", out))))
        # One plan change both ways.  Restart path: the snapshot write (run
        # with minus run without --snapshot-dir), malleus-replan,
        # malleus-reshard, and a restart that loads the snapshot and stops.
        one_plan_change(a, tmp)
        # a state large enough for the copy, not process start, to dominate
        one_plan_change(a, tmp, model="small", steps=2, reps=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
