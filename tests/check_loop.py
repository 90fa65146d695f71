#!/usr/bin/python3
"""Check one run of jobs/adaptive-loop.sh against a straggler-free,
one-process reference run.

usage: check_loop.py RUN_DIR REFERENCE_METRICS STEPS STRAGGLER_RANK

Asserts: at least one re-plan happened; the first new plan suspends the
straggler or gives it less work than the uniform plan did; training reached
STEPS; every step's loss equals the reference within 1e-4 relative.
Prints one verdict line; exit 0 pass, 1 fail."""
import json
import os
import sys


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                d = json.loads(line)
                out[d["step"]] = d
    return out


def work(plan, rank):
    """layers x micro-batches / TP size of the stage holding `rank`."""
    for p in plan["pipelines"]:
        for st in p["stages"]:
            if rank in st["ranks"]:
                return (st["layers"][1] - st["layers"][0]) * p["micro_batches"] / len(st["ranks"])
    return 0.0


def main():
    run, ref_path, steps, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    problems = []
    events = open(os.path.join(run, "events.log")).read()
    n_replans = events.count("re-plan requested")
    if n_replans < 1:
        problems.append("no re-plan happened")
    p0 = json.load(open(os.path.join(run, "plan.0.json")))
    p1_path = os.path.join(run, "plan.1.json")
    if os.path.exists(p1_path):
        p1 = json.load(open(p1_path))
        w0, w1 = work(p0, rank), work(p1, rank)
        suspended = rank in p1.get("suspended", [])
        print("straggler rank %d: work %.1f -> %.1f%s" % (rank, w0, w1, " (suspended)" if suspended else ""))
        if not (suspended or w1 < w0):
            problems.append("the new plan does not relieve rank %d" % rank)
    else:
        problems.append("no new plan written")
    got, ref = load(os.path.join(run, "metrics.jsonl")), load(ref_path)
    if max(got, default=0) != steps:
        problems.append("reached step %s, not %d" % (max(got, default=None), steps))
    worst = 0.0
    for s in range(1, steps + 1):
        if s not in got or s not in ref:
            problems.append("step %d missing" % s)
            break
        worst = max(worst, abs(got[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"]))
    if worst > 1e-4:
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
