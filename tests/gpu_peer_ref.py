# Checks that bench/gpu/torch_peer.py (the PyTorch peer of the GPU benchmark)
# trains Malleus's model, driven by tests/test_gpu_peer.sh:
#   model      the peer's nn.Module, loaded with the reference initial weights
#              (bench/torch_model.py, checked against malleus-train by
#              tests/test_torch_ref), gives the reference model's loss and
#              gradients in float32 on a random batch;
#   curve A B  two loss curves (malleus-train metrics JSONL or one loss per
#              line) agree within --rtol at every step (or every mean of
#              --window steps);
#   state A B  two malleus-train snapshot directories hold the same state
#              (parameters, Adam m and v): bit for bit, or within --rtol
#              per tensor (norm-wise) when given.
# Exit status: 0 match, 1 mismatch, 77 torch missing, 99 error.
import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
try:
    import numpy as np
    import torch
except ImportError as e:
    print("gpu_peer_ref: skipped: %s" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, "..", "bench", "gpu"))
import torch_model as tm  # noqa: E402
import torch_peer as tp  # noqa: E402


def check_model(model_name, seed):
    cfg = tm.model_config(model_name)
    params = tm.init_params(cfg, seed)
    ref = tm.Model(cfg, params, dtype=torch.float32)
    peer = tp.Llama(cfg)
    with torch.no_grad():
        for n, t in peer.by_malleus_name().items():
            t.copy_(torch.from_numpy(params[n]))
    g = torch.Generator().manual_seed(seed)
    B, T = 3, cfg["seq_len"]
    x = torch.randint(0, cfg["vocab"], (B, T), generator=g)
    y = torch.randint(0, cfg["vocab"], (B, T), generator=g)
    lr_ = ref.token_losses(x, y).mean()
    lr_.backward()
    lp = peer(x, y)
    lp.backward()
    worst, bad = 0.0, 0
    pp = peer.by_malleus_name()
    for n in ref.names:
        a, b = pp[n].grad.double(), ref.p[n].grad.double()
        e = float((a - b).norm() / max(float(b.norm()), 1e-30))
        worst = max(worst, e)
        if e > 1e-4:
            bad += 1
            print("MISMATCH gradient of %s: relative error %.3g" % (n, e))
    d = abs(float(lp) - float(lr_)) / abs(float(lr_))
    print("model %s: loss peer %.7f reference %.7f (rel %.2g); worst gradient rel error %.2g"
          % (model_name, float(lp), float(lr_), d, worst))
    if d > 1e-5:
        print("MISMATCH loss")
        bad += 1
    return 1 if bad else 0


def read_curve(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            out.append(float(json.loads(line)["loss"]) if line.startswith("{") else float(line))
    return out


def check_curve(a_path, b_path, rtol, window=1):
    a, b = read_curve(a_path), read_curve(b_path)
    if len(a) != len(b) or not a:
        print("MISMATCH: %d vs %d steps" % (len(a), len(b)))
        return 1
    if window > 1:  # means of consecutive windows (the last one may be short)
        a = [sum(a[i:i + window]) / len(a[i:i + window]) for i in range(0, len(a), window)]
        b = [sum(b[i:i + window]) / len(b[i:i + window]) for i in range(0, len(b), window)]
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    for i, (x, y) in enumerate(zip(a, b)):
        print("step %2d  %.7f  %.7f  rel %.2g" % (i + 1, x, y, abs(x - y) / abs(y)))
    print("worst relative difference %.3g (tolerance %.3g)" % (worst, rtol))
    if not worst <= rtol:
        print("MISMATCH loss curves")
        return 1
    return 0


def check_state(a_dir, b_dir, rtol):
    sys.path.insert(0, HERE)
    import torch_ref
    fa, _ = torch_ref.open_snapshot(a_dir)
    fb, _ = torch_ref.open_snapshot(b_dir)
    bad, n, worst = 0, 0, 0.0
    with fa, fb:
        for group in ("param", "adam_m", "adam_v"):
            names = sorted(fa[group].keys())
            if names != sorted(fb[group].keys()):
                print("MISMATCH: %s tensors differ" % group)
                return 1
            for name in names:
                x = np.asarray(fa[group][name][...])
                y = np.asarray(fb[group][name][...])
                n += 1
                if rtol is None:
                    if x.shape != y.shape or x.tobytes() != y.tobytes():
                        diff = int(np.sum(x != y)) if x.shape == y.shape else -1
                        print("MISMATCH %s/%s: %d elements differ" % (group, name, diff))
                        bad += 1
                else:
                    e = float(np.linalg.norm((x - y).astype(np.float64)) /
                              max(float(np.linalg.norm(y.astype(np.float64))), 1e-30))
                    worst = max(worst, e)
                    if not e <= rtol:
                        print("MISMATCH %s/%s: relative difference %.3g" % (group, name, e))
                        bad += 1
    if rtol is None:
        print("state: %d tensors, %s" % (n, "%d differ" % bad if bad else "bit-identical"))
    else:
        print("state: %d tensors, worst relative difference %.3g (tolerance %.3g)" %
              (n, worst, rtol))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--model", default="tiny")
    m.add_argument("--seed", type=int, default=7)
    c = sub.add_parser("curve")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--rtol", type=float, default=1e-4)
    c.add_argument("--window", type=int, default=1, help="compare means of this many steps")
    st = sub.add_parser("state")
    st.add_argument("a")
    st.add_argument("b")
    st.add_argument("--rtol", type=float, default=None, help="default: bit-identical")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "model":
        return check_model(a.model, a.seed)
    if a.cmd == "state":
        return check_state(a.a, a.b, a.rtol)
    return check_curve(a.a, a.b, a.rtol, a.window)


if __name__ == "__main__":
    sys.exit(main())
