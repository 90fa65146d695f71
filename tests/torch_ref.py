# Reference check of malleus-train against an independent PyTorch model
# (bench/torch_model.py), driven by tests/test_torch_ref.sh.
#
# Given the token file, malleus-train's step-0 snapshot (initial weights), its
# metrics and its final snapshot after N steps, this script
#   1. re-derives the initial weights from the seed (FNV-1a name hash,
#      SplitMix64, Box-Muller) and compares them with the step-0 snapshot;
#   2. starts from the snapshot's weights, re-draws every step's global batch
#      with the re-implemented sampler, and trains N steps in float64 with the
#      same micro-batching, loss scaling, clipping, schedule and AdamW;
#   3. asserts every step's loss (and lr, gradient norm) equals the metrics
#      and that the final parameters and Adam moments equal the final
#      snapshot, within tolerances that float32 rounding cannot reach but any
#      real difference in the mathematics does.
# Exit status: 0 all match, 1 mismatch, 77 torch/numpy missing, 99 error.
# Snapshots are read by tests/snapread.py: h5py, or tests/snapdump + numpy
# where h5py is missing (the GPU machine).

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True

try:
    import numpy as np
    import torch
except ImportError as e:  # the automake "skip" status
    print("torch_ref: skipped: %s" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, HERE)
import torch_model as tm  # noqa: E402
# open_snapshot(d) -> (f, step_dir) and read_group(f, group, names), used
# here and by gpu_peer_ref.py and bench/gpu/torch_peer.py through this module
from snapread import open_snapshot, read_group  # noqa: E402,F401


def main():
    ap = argparse.ArgumentParser(description="malleus-train vs. a float64 PyTorch reference")
    ap.add_argument("--data", required=True)
    ap.add_argument("--snap0", required=True, help="snapshot dir holding the step-0 snapshot")
    ap.add_argument("--snap1", required=True, help="snapshot dir holding the final snapshot")
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--decay-steps", type=int, required=True)
    ap.add_argument("--min-lr-ratio", type=float, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--beta1", type=float, required=True)
    ap.add_argument("--beta2", type=float, required=True)
    ap.add_argument("--adam-eps", type=float, required=True)
    ap.add_argument("--clip", type=float, required=True)
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--update-rtol", type=float, default=2e-3,
                    help="max |p_C - p_ref| allowed, relative to max |p_ref - p_0| of the tensor")
    ap.add_argument("--moment-rtol", type=float, default=3e-4,
                    help="max |m_C - m_ref| allowed, relative to max |m_ref| (same for v)")
    ap.add_argument("--perturb", choices=["none", "rope-halves", "decay-norms", "sampler-shift",
                                          "kv-cyclic", "rope-unscaled"],
                    default="none", help="deliberately break the reference (negative control)")
    a = ap.parse_args()

    torch.set_num_threads(1)
    failures = []
    f0, d0 = open_snapshot(a.snap0)
    # The model the snapshot says it holds (the preset is the fallback).
    cj = f0.attrs.get("config_json")
    cfg = tm.model_config(cj.decode() if isinstance(cj, bytes) else cj) if cj else \
        tm.model_config(a.model)
    if "seed" in f0.attrs and int(f0.attrs["seed"]) != a.seed:
        failures.append("snapshot seed %d, expected %d" % (int(f0.attrs["seed"]), a.seed))
    names = [n for n, _, _, _ in tm.tensor_layout(cfg)]
    tokens = tm.load_tokens(a.data)
    T = cfg["seq_len"]

    # 1. initial weights: snapshot vs. re-derivation from the seed
    with f0:
        p0 = read_group(f0, "param", names)
    mine = tm.init_params(cfg, a.seed)
    worst = 0.0
    for n in names:
        if p0[n].shape != mine[n].shape:
            failures.append("init: %s has shape %s, expected %s" % (n, p0[n].shape, mine[n].shape))
            continue
        scale = max(np.abs(mine[n]).max(), 1e-30)
        worst = max(worst, np.abs(p0[n] - mine[n]).max() / scale)
    print("initial weights (%s) vs. re-derived from seed %d: max rel. difference %.2e"
          % (d0, a.seed, worst))
    if worst > 1e-6:
        failures.append("initial weights differ from the seed's (max rel. %.3g)" % worst)

    # 2. train in float64 from the snapshot's weights
    if a.perturb == "rope-unscaled":
        cfg = dict(cfg, rope_scaling=None)
    model = tm.Model(cfg, p0, dtype=torch.float64,
                     rope_convention="halves" if a.perturb == "rope-halves" else "interleaved",
                     kv_map="cyclic" if a.perturb == "kv-cyclic" else "grouped")
    opt = tm.AdamW(model, a.beta1, a.beta2, a.adam_eps, a.weight_decay, a.clip)
    if a.perturb == "decay-norms":
        model.decay = {n: True for n in names}
    metrics = [json.loads(line) for line in open(a.metrics) if line.strip()]
    if len(metrics) != a.steps:
        failures.append("metrics file has %d lines, expected %d" % (len(metrics), a.steps))
    n_micro = a.global_batch // a.micro_batch
    dscale = 1.0 / (a.global_batch * T)
    print("step | loss malleus     | loss torch       | rel.diff | grad norm C / torch | lr")
    for step in range(a.steps):
        for p in model.parameters():
            p.grad = None
        loss_sum = 0.0
        for mb in range(n_micro):
            first = mb * a.micro_batch + (1 if a.perturb == "sampler-shift" else 0)
            x, y = tm.sample_batch(tokens, a.seed, step, first, a.micro_batch, T, a.global_batch)
            losses = model.token_losses(x, y)
            (losses.sum() * dscale).backward()
            loss_sum += float(losses.sum())
        loss = loss_sum * dscale
        lr = tm.lr_at(step, a.lr, a.warmup, a.decay_steps, a.min_lr_ratio)
        norm = opt.step(step, lr)
        if step >= len(metrics):
            continue
        mt = metrics[step]
        rel = abs(mt["loss"] - loss) / abs(loss)
        print("%4d | %.10f | %.10f | %8.1e | %9.6f / %9.6f | %.4e"
              % (mt["step"], mt["loss"], loss, rel, mt["grad_norm"], norm, lr))
        if mt["step"] != step + 1:
            failures.append("metrics line %d has step %s" % (step + 1, mt["step"]))
        if not rel <= a.loss_rtol:
            failures.append("step %d: loss %.9g vs. reference %.9g" % (step + 1, mt["loss"], loss))
        if not abs(mt["lr"] - lr) <= 1e-6 * lr:
            failures.append("step %d: lr %.9g vs. reference %.9g" % (step + 1, mt["lr"], lr))
        if not abs(mt["grad_norm"] - norm) <= 1e-3 * norm:
            failures.append("step %d: grad norm %.9g vs. reference %.9g"
                            % (step + 1, mt["grad_norm"], norm))

    # 3. final state: parameters and both Adam moments
    f1, d1 = open_snapshot(a.snap1)
    with f1:
        state = {g: read_group(f1, g, names) for g in ("param", "adam_m", "adam_v")}
    ref = {"param": {n: model.p[n].detach().numpy() for n in names},
           "adam_m": {n: opt.m[n].numpy() for n in names},
           "adam_v": {n: opt.v[n].numpy() for n in names}}
    # Parameters are judged against how far training moved them: Adam moves
    # every tensor by about the same amount whatever its scale (a tensor
    # initialised 3x smaller is not updated 3x more precisely), so "the C
    # update equals the reference update to update_rtol" is the tolerance
    # that is equally tight for every tensor.  Float32 rounding (the C, or
    # this reference run in float32) reaches ~2e-4 of the update here (a
    # few elements whose gradient is near Adam's eps after a clipped step);
    # real mistakes (a wrong decay set, schedule, bias correction) are
    # 1e-2 .. 1e-1 of it.
    for g in ("param", "adam_m", "adam_v"):
        worst, worst_name = 0.0, ""
        for n in names:
            r = ref[g][n]
            if g == "param":
                scale, tol = np.abs(r - p0[n]).max(), a.update_rtol
            else:
                scale, tol = np.abs(r).max(), a.moment_rtol
            d = np.abs(state[g][n] - r).max() / max(scale, 1e-30)
            if d > worst:
                worst, worst_name = d, n
            if not d <= tol:
                failures.append("%s/%s after %d steps: max |C - ref| = %.3g x %s (> %.0e)"
                                % (g, n, a.steps, d, "max|update|" if g == "param" else
                                   "max|ref|", tol))
        print("final %-6s (%s) vs. torch: worst |C - ref| = %.2e x %s (%s)"
              % (g, d1, worst, "max|p - p0|" if g == "param" else "max|ref|   ", worst_name))

    if failures:
        print("torch_ref: MISMATCH (%d):" % len(failures))
        for msg in failures[:20]:
            print("  " + msg)
        return 1
    print("torch_ref: malleus-train matches the PyTorch reference (%d steps)" % a.steps)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception as e:  # a broken set-up, not a mismatch
        import traceback
        traceback.print_exc()
        print("torch_ref: ERROR: %s" % e)
        sys.exit(99)
