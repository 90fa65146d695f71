#!/usr/bin/python3
"""Benchmark of the overlapped data-parallel gradient sum:
--dp-overlap on vs off, the same plan and model, repetitions alternated
(on, off, on, off, ...) so that both see the same machine load.

usage: bench/parallel/overlap.py BUILD_DIR [--ranks 8] [--reps 3] [--steps 8]
           [--model FILE|PRESET] [--plan FILE | --layout DP,TP,PP]
           [--bucket-mb X] [--global-batch 16] [--micro-batch 2]
           [-- MORE MALLEUS-TRAIN FLAGS, e.g. --device cuda --comm nccl]

Per run: the median over steps (the first 2 left out as warm-up) of the
step time (rank 0's wall time of the step) and of the gradient sum's time
after the backward pass (`dp_wait_ms` of the metrics, the mean over the
ranks that hold a model part): with overlap off that is the whole sum, with
it on the waits for the buckets still in flight plus their unpacking.
Prints every run, then the medians over repetitions and the on/off ratios.

Default model: a mid-size one written to a temporary file (d_model 256,
4 layers, FFN 704, sequence 64: 13 MB of gradients per full replica), so
that the gradient sum is a visible part of the step on 8 ranks without
making a repetition last minutes."""
import argparse
import json
import os
import statistics
import sys
import tempfile

from run import train_rows

MID = {"name": "bench-mid", "vocab": 256, "d_model": 256, "n_layers": 4, "n_heads": 8,
       "ffn_hidden": 704, "seq_len": 64}


def run(a, model, overlap, tmp):
    layout = ["--plan", a.plan] if a.plan else \
        sum(([f, v] for f, v in zip(("--dp", "--tp", "--pp"), a.layout.split(","))), [])
    args = ["--model", model, "--steps", str(a.steps), "--global-batch", str(a.global_batch),
            "--micro-batch", str(a.micro_batch), "--threads", "1", "--dp-overlap", overlap,
            "--dp-bucket-mb", str(a.bucket_mb)] + layout + a.rest
    rows = train_rows(a.build, a.ranks, args, os.path.join(tmp, "m-%s.jsonl" % overlap), 2)
    step = statistics.median(x["step_ms"] for x in rows)
    waits = []
    for x in rows:
        active = [rk["dp_wait_ms"] for rk in x["ranks"] if rk["compute_ms"] > 0]
        waits.append(statistics.mean(active))
    return step, statistics.median(waits), statistics.median(x["loss"] for x in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default=None, help="preset or JSON file (default: the mid model)")
    ap.add_argument("--plan", default=None)
    ap.add_argument("--layout", default="2,2,2", help="DP,TP,PP when no --plan (default 2,2,2)")
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=2)
    # after "--": more malleus-train flags (e.g. --device cuda --comm nccl)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    a.rest = argv[cut + 1:]
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if not model:
            model = os.path.join(tmp, "mid.json")
            with open(model, "w") as f:
                json.dump(MID, f)
        res = {"on": [], "off": []}
        print("%-4s %-4s %12s %16s %10s" % ("rep", "dp", "step ms", "dp wait ms", "loss"))
        for rep in range(a.reps):
            for ov in ("on", "off"):
                step, wait, loss = run(a, model, ov, tmp)
                res[ov].append((step, wait))
                print("%-4d %-4s %12.1f %16.2f %10.5f" % (rep, ov, step, wait, loss), flush=True)
        med = {k: (statistics.median(s for s, _ in v), statistics.median(w for _, w in v))
               for k, v in res.items()}
        print("\nmedian over %d repetitions (%d ranks, %s, buckets %g MiB):"
              % (a.reps, a.ranks, a.plan or "dp,tp,pp " + a.layout, a.bucket_mb))
        for k in ("on", "off"):
            print("  overlap %-3s  step %8.1f ms   dp wait after backward %8.2f ms"
                  % (k, med[k][0], med[k][1]))
        print("  on/off       step %8.3f      dp wait %8.3f"
              % (med["on"][0] / med["off"][0],
                 med["on"][1] / med["off"][1] if med["off"][1] > 0 else float("nan")))


if __name__ == "__main__":
    main()
