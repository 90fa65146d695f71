#!/usr/bin/env python3
# The PyTorch peer of Malleus's CUDA backend: the same model (LLaMA layers:
# RMSNorm, interleaved-pair RoPE, causal attention, SwiGLU, untied LM head),
# the same shapes, batch and AdamW, trained the way people train it fast in
# PyTorch 2.11 -- bf16 autocast with fp32 weights, flash SDPA, fused AdamW --
# eager or under torch.compile.  One run = one process = one mode, so peak
# memory and compile caches never leak between runs.
#
#   python3 bench/gpu/torch_peer.py --model 1b --batch 8 --mode compile \
#       --steps 20 --warmup 5 --json out.jsonl
#
# Prints one line and appends one JSON object to --json: tokens/s (median
# step of the timed ones, device time from CUDA events), model TFLOP/s
# (bench/gpu/flops.py), MFU against 989 TFLOP/s and against a bf16 GEMM rate
# measured in this process (--gemm-rate), peak device memory (allocated and
# reserved), the loss of every step.
#
# --weights DIR (a malleus-train snapshot directory, read by tests/snapread.py:
# h5py, or tests/snapdump and numpy where h5py is missing) starts
# from Malleus's own initial weights; --data FILE draws Malleus's batches
# from a token file (bench/torch_model.py's sampler, checked against
# malleus-train by tests/test_torch_ref).  With both, --losses FILE writes
# every step's loss for a curve comparison with malleus-train.
#
# On a machine without a GPU (--device cpu, Debian's torch 1.13) it runs
# what that torch has: no SDPA (explicit masked softmax), no compile (the
# run says so and exits 3), no fused AdamW (foreach); tests/test_gpu_peer.sh
# uses that to check the model against bench/torch_model.py.

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flops  # noqa: E402

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
HAVE_COMPILE = hasattr(torch, "compile")


# ---- the model ---------------------------------------------------------------


def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def rope(x, cos, sin):
    """x (B,T,H,hd): pairs (2i, 2i+1) rotated by angle t * theta^(-2i/hd)
    (the original LLaMA convention, Malleus's).  Real arithmetic: inductor
    fuses it, where complex views would fall back."""
    B, T, H, hd = x.shape
    xr = x.float().reshape(B, T, H, hd // 2, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c, s = cos[None, :T, None, :], sin[None, :T, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).reshape(B, T, H, hd).type_as(x)


def causal_attention(q, k, v):
    """q, k, v (B,H,T,hd) -> (B,H,T,hd)."""
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T, hd = q.shape[-2], q.shape[-1]
    att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.float().masked_fill(mask, float("-inf")).softmax(-1).type_as(v)
    return torch.matmul(att, v)


class Block(nn.Module):
    def __init__(self, C, H, Fh, eps):
        super().__init__()
        self.H, self.eps = H, eps
        self.attn_norm = nn.Parameter(torch.ones(C))
        self.wq = nn.Linear(C, C, bias=False)
        self.wk = nn.Linear(C, C, bias=False)
        self.wv = nn.Linear(C, C, bias=False)
        self.wo = nn.Linear(C, C, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(C))
        self.w1 = nn.Linear(C, Fh, bias=False)
        self.w3 = nn.Linear(C, Fh, bias=False)
        self.w2 = nn.Linear(Fh, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        H = self.H
        hd = C // H
        h = rmsnorm(x, self.attn_norm, self.eps)
        q = rope(self.wq(h).view(B, T, H, hd), cos, sin)
        k = rope(self.wk(h).view(B, T, H, hd), cos, sin)
        v = self.wv(h).view(B, T, H, hd)
        o = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, C))
        h2 = rmsnorm(x, self.mlp_norm, self.eps)
        return x + self.w2(F.silu(self.w1(h2)) * self.w3(h2))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, V, L = cfg["d_model"], cfg["vocab"], cfg["n_layers"]
        self.cfg = cfg
        self.tok_embedding = nn.Embedding(V, C)
        self.layers = nn.ModuleList(
            Block(C, cfg["n_heads"], cfg["ffn_hidden"], cfg["norm_eps"]) for _ in range(L))
        self.final_norm = nn.Parameter(torch.ones(C))
        self.lm_head = nn.Linear(C, V, bias=False)
        hd = C // cfg["n_heads"]
        i = torch.arange(hd // 2, dtype=torch.float64)
        ang = torch.arange(cfg["seq_len"], dtype=torch.float64)[:, None] * \
            (cfg["rope_theta"] ** (-2.0 * i / hd))[None, :]
        self.register_buffer("cos", torch.cos(ang).float(), persistent=False)
        self.register_buffer("sin", torch.sin(ang).float(), persistent=False)

    def forward(self, tokens, targets):
        x = self.tok_embedding(tokens)
        for blk in self.layers:
            x = blk(x, self.cos, self.sin)
        h = rmsnorm(x, self.final_norm, self.cfg["norm_eps"])
        logits = self.lm_head(h)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    # Malleus's tensor names (bench/torch_model.py's tensor_layout) -> ours.
    def by_malleus_name(self):
        out = {"tok_embedding": self.tok_embedding.weight, "final_norm": self.final_norm,
               "lm_head": self.lm_head.weight}
        for l, b in enumerate(self.layers):
            for n in ("attn_norm", "mlp_norm"):
                out["layers.%d.%s" % (l, n)] = getattr(b, n)
            for n in ("wq", "wk", "wv", "wo", "w1", "w3", "w2"):
                out["layers.%d.%s" % (l, n)] = getattr(b, n).weight
        return out


@torch.no_grad()
def init_like_malleus(model, seed):
    """Malleus's distributions (model.c): N(0, 0.02) matrices, the residual
    outputs wo and w2 N(0, 0.02 / sqrt(2 L)), norms 1.  Drawn with torch's
    generator, not Malleus's counter RNG (which would take minutes in Python
    at 1 B parameters); --weights gives the exact values where they matter."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    L = model.cfg["n_layers"]
    for name, p in model.by_malleus_name().items():
        if p.dim() == 1:
            p.fill_(1.0)
            continue
        std = 0.02 / math.sqrt(2 * L) if name.endswith((".wo", ".w2")) else 0.02
        p.copy_(torch.randn(p.shape, generator=g) * std)


@torch.no_grad()
def load_malleus_weights(model, snap_dir):
    """The fp32 parameters of a malleus-train snapshot (tests/torch_ref.py
    reads it, through tests/snapread.py; group "param", Malleus's tensor
    names)."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
    import torch_ref
    params = model.by_malleus_name()
    f, _ = torch_ref.open_snapshot(snap_dir)
    with f:
        for name, t in torch_ref.read_group(f, "param", list(params)).items():
            params[name].copy_(torch.from_numpy(t).float())


def decay_groups(model, wd):
    """Weight decay on matrices only (the embedding and LM head included),
    as Malleus's optimizer."""
    dec = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": dec, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def lr_at(step, lr, warmup, total, min_ratio=0.1):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * min_ratio + 0.5 * lr * (1 - min_ratio) * (1 + math.cos(math.pi * p))


# ---- measurement -------------------------------------------------------------


def gemm_rate(device, n=8192, reps=30):
    """bf16 n^3 GEMM FLOP/s on random data, three input pairs rotated so the
    operands are not cache-resident; median of `reps` event-timed products."""
    if device.type != "cuda":
        return None
    xs = [(torch.randn(n, n, device=device, dtype=torch.bfloat16),
           torch.randn(n, n, device=device, dtype=torch.bfloat16)) for _ in range(3)]
    for i in range(5):
        torch.matmul(*xs[i % 3])
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.matmul(*xs[i % 3])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del xs
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / statistics.median(times)


def synthetic_batch(cfg, batch, step, seed, device):
    """Uniform random tokens: the peer's speed does not depend on the data."""
    g = torch.Generator(device="cpu").manual_seed(seed * 1000003 + step)
    t = torch.randint(0, cfg["vocab"], (batch, cfg["seq_len"] + 1), generator=g)
    return t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="124m", help="preset (bench/torch_model.py) or JSON")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20, help="steps in all, warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="untimed first steps")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-warmup", type=int, default=10)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's choice)")
    ap.add_argument("--gemm-rate", type=float, default=0.0,
                    help="bf16 GEMM FLOP/s to report MFU against (0: measure it here)")
    ap.add_argument("--weights", help="malleus-train snapshot dir with the initial weights")
    ap.add_argument("--data", help="token file: Malleus's batches (else uniform random)")
    ap.add_argument("--losses", help="write every step's loss here (one per line)")
    ap.add_argument("--json", help="append the result as one JSON line")
    ap.add_argument("--label", default="", help="free text carried into the JSON")
    a = ap.parse_args()

    dev = torch.device(a.device)
    if a.mode == "compile" and not HAVE_COMPILE:
        print("torch_peer: torch %s has no torch.compile: mode compile not run" % torch.__version__)
        return 3
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("torch_peer: no CUDA device visible to torch %s" % torch.__version__)
        return 3
    cfg = flops.model_config(a.model)
    B, T = a.batch, cfg["seq_len"]
    torch.manual_seed(a.seed)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if dev.type == "cuda":  # fp32 means fp32 (no tf32 products), as Malleus's fp32 mode
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rate = a.gemm_rate or gemm_rate(dev)

    model = Llama(cfg)
    if a.weights:
        load_malleus_weights(model, a.weights)
    else:
        init_like_malleus(model, a.seed)
    model.to(dev)
    kw = {}
    if dev.type == "cuda":
        kw["fused"] = True
    elif "foreach" in torch.optim.AdamW.__init__.__code__.co_varnames:
        kw["foreach"] = True
    opt = torch.optim.AdamW(decay_groups(model, a.weight_decay), lr=a.lr, betas=(0.9, 0.95),
                            eps=a.adam_eps, **kw)
    fwd = torch.compile(model) if a.mode == "compile" else model
    tokens = None
    if a.data:
        import torch_model as tm
        tokens = tm.load_tokens(a.data)

    def batch_of(step):
        if tokens is not None:
            import torch_model as tm
            x, y = tm.sample_batch(tokens, a.seed, step, 0, B, T, B)
            return x.to(dev), y.to(dev)
        return synthetic_batch(cfg, B, step, a.seed, dev)

    use_amp = a.precision == "bf16"
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    t_start = time.time()
    for step in range(a.steps):
        x, y = batch_of(step)
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        else:
            w0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.lr_warmup, a.steps)
        if use_amp:
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = fwd(x, y)
        else:
            loss = fwd(x, y)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            e1.record()
            e1.synchronize()  # the loss is read every step anyway, as Malleus logs it
            times.append(e0.elapsed_time(e1) / 1e3)
        else:
            times.append(time.perf_counter() - w0)
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            print("torch_peer: loss is %s at step %d" % (losses[-1], step))
            return 1
    wall = time.time() - t_start
    timed = times[a.warmup:] if len(times) > a.warmup else times
    step_s = statistics.median(timed)
    tps = B * T / step_s
    model_flops = flops.step_flops(cfg, B) / step_s
    res = {
        "who": "torch-" + a.mode, "label": a.label, "model": a.model, "batch": B, "seq_len": T,
        "precision": a.precision, "device": torch.cuda.get_device_name(dev)
        if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "params": flops.n_params(cfg), "steps": a.steps, "warmup": a.warmup,
        "step_ms": step_s * 1e3, "step_ms_min": min(timed) * 1e3,
        "step_ms_max": max(timed) * 1e3, "tokens_per_s": tps, "model_tflops": model_flops / 1e12,
        "mfu_peak": model_flops / flops.PEAK_BF16,
        "gemm_tflops": rate / 1e12 if rate else None,
        "mfu_gemm": model_flops / rate if rate else None,
        "peak_alloc_gib": torch.cuda.max_memory_allocated(dev) / 2 ** 30
        if dev.type == "cuda" else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2 ** 30
        if dev.type == "cuda" else None,
        "wall_s": wall, "first_step_ms": times[0] * 1e3, "losses": losses,
    }
    if a.losses:
        with open(a.losses, "w") as f:
            f.write("".join("%.9g\n" % v for v in losses))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    mem = "%.1f GiB" % res["peak_alloc_gib"] if res["peak_alloc_gib"] is not None else "-"
    print("torch-%-7s %-5s B%-3d %9.0f tok/s  %7.1f ms/step  %6.1f TFLOP/s  MFU %5.1f%% "
          "(of GEMM %s)  peak %s  loss %.4f -> %.4f" %
          (a.mode, a.model, B, tps, step_s * 1e3, model_flops / 1e12,
           100 * res["mfu_peak"],
           "%.1f%%" % (100 * res["mfu_gemm"]) if rate else "-", mem, losses[0], losses[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
