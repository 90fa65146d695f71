#!/usr/bin/python3
"""Check one run of jobs/adaptive-loop.sh against a straggler-free,
one-process reference run.

usage: check_loop.py RUN_DIR REFERENCE_METRICS STEPS STRAGGLER_RANK [TOLERANCE]

Asserts: at least one re-plan happened; some new plan suspends the
straggler or gives it less work than the uniform plan did (both skipped
when STRAGGLER_RANK is -1: a run without a straggler); training reached
STEPS; the metrics hold every step once (rows a resume superseded are
marked so, or moved aside); every step's loss equals the reference within
TOLERANCE relative (1e-4).
Prints one verdict line; exit 0 pass, 1 fail."""
import json
import os
import sys


def load(path, dups=None):
    """step -> row; a step written twice is counted in dups (a list)."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                d = json.loads(line)
                if d.get("superseded"):
                    continue
                if d["step"] in out and dups is not None:
                    dups.append(d["step"])
                out[d["step"]] = d
    return out


def work(plan, rank):
    """layers x micro-batches / TP size of the stage holding `rank`."""
    for p in plan["pipelines"]:
        for st in p["stages"]:
            if rank in st["ranks"]:
                return (st["layers"][1] - st["layers"][0]) * p["micro_batches"] / len(st["ranks"])
    return 0.0


def check_replans(run, rank, n_replans, problems):
    if n_replans < 1:
        problems.append("no re-plan happened")
    # Some plan made after a re-plan must relieve the straggler (an earlier
    # re-plan may answer timing noise before the straggler appears).
    p0 = json.load(open(os.path.join(run, "plan.0.json")))
    w0, relieved, g = work(p0, rank), False, 1
    while os.path.exists(os.path.join(run, "plan.%d.json" % g)):
        pg = json.load(open(os.path.join(run, "plan.%d.json" % g)))
        wg, suspended = work(pg, rank), rank in pg.get("suspended", [])
        print("plan.%d.json: straggler rank %d work %.1f -> %.1f%s" % (g, rank, w0, wg, " (suspended)" if suspended else ""))
        relieved |= suspended or wg < w0
        g += 1
    if g == 1:
        problems.append("no new plan written")
    elif not relieved:
        problems.append("no new plan relieves rank %d" % rank)


def main():
    run, ref_path, steps, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tolerance = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-4
    problems = []
    events = open(os.path.join(run, "events.log")).read()
    n_replans = events.count("re-plan requested")
    if rank >= 0:
        check_replans(run, rank, n_replans, problems)
    dups = []
    got, ref = load(os.path.join(run, "metrics.jsonl"), dups), load(ref_path)
    if dups:
        problems.append("steps written twice in the metrics: %s" % sorted(set(dups))[:10])
    if max(got, default=0) != steps:
        problems.append("reached step %s, not %d" % (max(got, default=None), steps))
    worst = 0.0
    for s in range(1, steps + 1):
        if s not in got or s not in ref:
            problems.append("step %d missing" % s)
            break
        worst = max(worst, abs(got[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"]))
    if worst > tolerance:
        problems.append("loss differs from the reference by %.2e" % worst)
    tput = [(s, got[s]["tokens_per_s"]) for s in sorted(got)]
    print("re-plans: %d; max loss rel diff %.2e; tokens/s first/last: %.0f / %.0f"
          % (n_replans, worst, tput[0][1] if tput else 0, tput[-1][1] if tput else 0))
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
