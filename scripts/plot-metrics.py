#!/usr/bin/python3
"""Draw tokens/s over steps from a malleus-train metrics file, with straggler
onsets and re-plans marked, and below it the training loss and (where the run
measured it, --eval-every) the validation loss.

usage: plot-metrics.py METRICS.jsonl OUT.png [--inject R:F[:FROM[:TO]] ...]
                       [--title TEXT] [--threshold 1.2]

Each step is drawn once: a row marked "superseded" is skipped, and where a
file holds a step twice (a run resumed from a snapshot older than its last
rows, appended by a version that did not move those rows aside) the later
row wins, and a row that says "resumed_from": S drops the earlier rows past S.
Plan changes are the steps after which the plan generation ("plan_gen")
goes up (a restart or an online migration); advice that changed nothing (the
change would not have paid) is drawn dotted.  Metrics without plan_gen: the
steps whose line says "replan": true.  Straggler onsets are
the FROM steps of --inject specs if given, else the first step at which some
rank's measured rate rose above --threshold after being below it."""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics")
    ap.add_argument("out")
    ap.add_argument("--inject", action="append", default=[], help="R:F[:FROM[:TO]] as given to malleus-train")
    ap.add_argument("--title", default="Malleus training throughput")
    ap.add_argument("--threshold", type=float, default=1.2)
    a = ap.parse_args()

    rows = {}  # step -> its row, the latest one
    try:
        with open(a.metrics) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit("plot-metrics: %s line %d: not JSON (%s)" % (a.metrics, n, e))
                if "step" not in d or "tokens_per_s" not in d:
                    sys.exit("plot-metrics: %s line %d: missing step or tokens_per_s" % (a.metrics, n))
                if d.get("superseded"):
                    continue
                if "resumed_from" in d:
                    rows = {s: r for s, r in rows.items() if s <= d["resumed_from"]}
                rows[d["step"]] = d
    except OSError as e:
        sys.exit("plot-metrics: cannot read %s: %s" % (a.metrics, e))
    steps, tput, replans, onsets, rates, gens = [], [], [], [], {}, []
    losses, val_steps, val = [], [], []
    for s in sorted(rows):
        d = rows[s]
        steps.append(s)
        tput.append(d["tokens_per_s"])
        losses.append(d.get("loss"))
        if "val_loss" in d:
            val_steps.append(s)
            val.append(d["val_loss"])
        if d.get("replan"):
            replans.append(s)
        gens.append(d.get("plan_gen"))
        if "rates" in d:
            rates[s] = d["rates"]
    if not steps:
        sys.exit("plot-metrics: %s holds no steps" % a.metrics)

    advice = []
    if any(g is not None for g in gens):
        changes = [steps[i - 1] for i in range(1, len(steps))
                   if gens[i] is not None and gens[i - 1] is not None and gens[i] != gens[i - 1]]
        advice = [s for s in replans if s not in changes]
        replans = changes

    for spec in a.inject:
        parts = spec.split(":")
        try:
            rank, factor = int(parts[0]), float(parts[1])
            start = int(parts[2]) + 1 if len(parts) > 2 else 1
            stop = int(parts[3]) + 1 if len(parts) > 3 else None
        except (ValueError, IndexError):
            sys.exit("plot-metrics: --inject expects R:F[:FROM[:TO]], got %r" % spec)
        onsets.append((start, "rank %d x%g" % (rank, factor)))
        if stop:
            onsets.append((stop, "rank %d recovers" % rank))
    if not a.inject and rates:
        prev = None
        for s in sorted(rates):
            hot = {r for r, x in enumerate(rates[s]) if x is not None and x >= a.threshold}
            if prev is not None:
                for r in hot - prev:
                    onsets.append((s, "rank %d slow" % r))
            prev = hot

    fig, (ax, lax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    ax.plot(steps, tput, lw=1.4, color="#1f77b4", label="tokens/s")
    top = max(tput) * 1.15
    for s, label in onsets:
        ax.axvline(s, color="#d62728", ls="--", lw=1)
        ax.text(s, top * 0.97, " " + label, color="#d62728", fontsize=8, va="top")
    for i, s in enumerate(replans):
        ax.axvline(s, color="#2ca02c", lw=1, label="plan change" if i == 0 else None)
    for i, s in enumerate(advice):
        ax.axvline(s, color="#2ca02c", lw=1, ls=":", label="advice, plan kept" if i == 0 else None)
    ax.set_ylim(0, top)
    ax.set_ylabel("tokens / s")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    pts = [(s, l) for s, l in zip(steps, losses) if l is not None]
    lax.plot([s for s, _ in pts], [l for _, l in pts], lw=1.2, color="#7f7f7f", label="training loss")
    if val:
        lax.plot(val_steps, val, "o-", ms=3.5, lw=1.4, color="#ff7f0e", label="validation loss")
        best = min(range(len(val)), key=val.__getitem__)
        lax.annotate("best %.4f (step %d)" % (val[best], val_steps[best]),
                     (val_steps[best], val[best]), xytext=(0, 10), textcoords="offset points",
                     fontsize=8, color="#ff7f0e", ha="right" if best > len(val) / 2 else "left")
    for s in replans:
        lax.axvline(s, color="#2ca02c", lw=1)
    lax.set_xlabel("step")
    lax.set_ylabel("loss")
    lax.grid(alpha=0.3)
    lax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print("plot-metrics: wrote %s (%d steps, %d plan changes, %d validation points)"
          % (a.out, len(steps), len(replans), len(val)))


if __name__ == "__main__":
    main()
