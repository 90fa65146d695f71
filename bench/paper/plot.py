#!/usr/bin/python3
"""The figure of bench/paper: Malleus's speedup (cost model) over the three
baselines in every scenario, one panel per model.

usage: bench/paper/plot.py ROWS.csv OUT.png   (ROWS.csv from bench_paper --csv)"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    models = []
    for r in rows:
        if r["setting"] not in models:
            models.append(r["setting"])
    fig, axes = plt.subplots(len(models), 1, figsize=(13, 3.2 * len(models)), squeeze=False)
    names = [("static", "1: static uniform", "o"), ("drop", "2: drop straggler nodes", "s"),
             ("nominal_tp", "3: nominal TP only", "^")]
    for ax, model in zip(axes[:, 0], models):
        rs = [r for r in rows if r["setting"] == model]
        x = list(range(len(rs)))
        for key, label, marker in names:
            ys = [float(r[key]) / float(r["malleus"]) for r in rs]
            ys = [y if y != float("inf") else float("nan") for y in ys]
            ax.plot(x, ys, marker=marker, linestyle="", label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("speedup of Malleus")
        ax.set_title("%s: Malleus at %.2f of the capacity bound on average" % (
            model, sum(float(r["bound"]) / float(r["malleus"]) for r in rs) / len(rs)))
        ax.set_xticks(x)
        ax.set_xticklabels(["%s@%s%s" % (r["stragglers"], r["rate"],
                                         "p" if r["placement"] == "packed" else "")
                            for r in rs], rotation=90, fontsize=7)
        ax.grid(True, which="both", axis="y", alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("stragglers @ rate (p: packed into one node, else one per node)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
