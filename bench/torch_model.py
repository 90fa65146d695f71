# An independent PyTorch (and numpy) re-implementation of Malleus's model,
# initialisation, data sampling, learning-rate schedule and AdamW step.
#
# Written from the contracts in base/rng.h, src/data.h, src/model.h,
# src/optim.h and kernels/kernels.h, not by translating the C: it is the
# reference that tests/torch_ref.py checks malleus-train against, and the
# PyTorch peer that bench/bench_train.py times.  Nothing here imports Malleus
# code; everything is plain torch/numpy.
#
# The model: x = tok_embedding[tokens]; per layer
#   h = rmsnorm(x) * attn_norm;  q = h Wq^T (B,T,H,hd);  k, v = h Wk^T, h Wv^T
#   (B,T,Hkv,hd): grouped-query attention, each key/value head serving
#   H/Hkv consecutive query heads (repeated to H heads, as Hugging Face's
#   repeat_kv does)
#   rope on q, k (interleaved pairs (2i, 2i+1), angle t * inv_freq(i),
#   inv_freq(i) = theta^(-2i/hd), rescaled by the llama3 rope_scaling when
#   the config has one)
#   x = x + causal_softmax(q k^T / sqrt(hd)) v Wo^T
#   h2 = rmsnorm(x) * mlp_norm;  x = x + (silu(h2 W1^T) * (h2 W3^T)) W2^T
# then rmsnorm(x) * final_norm, logits = h lm_head^T (tok_embedding^T with
# tied embeddings: one parameter, both uses' gradients), cross-entropy.

import math
import os

import numpy as np
import torch
import torch.nn.functional as F

# ---- model configurations (mirror src/config.c's presets) -----------------

import presets  # noqa: E402  (bench/presets.py: src/config.c's shapes)
from presets import PRESETS  # noqa: E402,F401
F32 = np.float32


def model_config(spec):
    """A preset name or a JSON text/dict -> dict with every field (float
    fields as the float32 values the C code holds)."""
    cfg = presets.config(spec)
    cfg["rope_theta"] = float(F32(cfg["rope_theta"]))
    cfg["norm_eps"] = float(F32(cfg["norm_eps"]))
    sc = cfg.get("rope_scaling")
    if sc:
        sc = dict(sc)
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            sc[key] = float(F32(sc[key]))
        cfg["rope_scaling"] = sc
    return cfg


# ---- counter-based RNG (base/rng.h), bit-exact --------------------------------

M64 = (1 << 64) - 1


def mix64(z):
    """SplitMix64 finaliser on a Python int, masked to 64 bits."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rng_u64(seed, stream, index):
    return mix64(mix64(mix64(seed & M64) ^ (stream & M64)) ^ (index & M64))


def rng_below(seed, stream, index, n):
    return (rng_u64(seed, stream, index) * n) >> 64


def _mix64_np(z):
    """The same mixer over a numpy uint64 array (numpy wraps modulo 2^64)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def rng_normal_np(seed, stream, index):
    """mal_rng_normal for an array of indices (float64)."""
    base = np.uint64(mix64(mix64(seed & M64) ^ (stream & M64)))
    idx = np.asarray(index, dtype=np.uint64)

    def uniform(i):
        u = _mix64_np(base ^ i)
        return ((u >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)

    u1 = uniform(np.uint64(2) * idx)
    u2 = uniform(np.uint64(2) * idx + np.uint64(1))
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)


# ---- parameters: names, shapes, decay flags, initialisation ---------------


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def tensor_layout(cfg):
    """[(name, shape, decay, init_std)] in the order model.c lays them out.
    init_std 0 means "ones" (norm weights); decay is set for matrices."""
    C, F_, V, L = cfg["d_model"], cfg["ffn_hidden"], cfg["vocab"], cfg["n_layers"]
    KV = cfg.get("n_kv_heads", cfg["n_heads"]) * (C // cfg["n_heads"])
    std = float(F32(0.02))
    std_out = float(F32(0.02) / np.sqrt(F32(2.0) * F32(L)))
    out = [("tok_embedding", (V, C), True, std)]
    for l in range(L):
        p = "layers.%d." % l
        out += [
            (p + "attn_norm", (C,), False, 0.0),
            (p + "wq", (C, C), True, std),
            (p + "wk", (KV, C), True, std),
            (p + "wv", (KV, C), True, std),
            (p + "wo", (C, C), True, std_out),
            (p + "mlp_norm", (C,), False, 0.0),
            (p + "w1", (F_, C), True, std),
            (p + "w3", (F_, C), True, std),
            (p + "w2", (C, F_), True, std_out),
        ]
    out += [("final_norm", (C,), False, 0.0)]
    if not cfg.get("tie_embeddings"):
        out += [("lm_head", (V, C), True, std)]
    return out


def init_params(cfg, seed):
    """The initial parameters as float32 numpy arrays: element i (row-major)
    of a tensor is float(std * normal(seed, fnv1a(name), i))."""
    out = {}
    for name, shape, _, std in tensor_layout(cfg):
        n = int(np.prod(shape))
        if std == 0.0:
            out[name] = np.ones(shape, dtype=F32)
        else:
            z = rng_normal_np(seed, fnv1a64(name), np.arange(n, dtype=np.uint64))
            out[name] = (std * z).astype(F32).reshape(shape)
    return out


# ---- data ------------------------------------------------------------------

DATA_SALT = 0x5A4D504C45444154
LLMC_MAGIC = 20240520


def load_tokens(path):
    """Tokens of an llm.c file (header magic) or a headerless uint16 file."""
    raw = open(path, "rb").read()
    head = np.frombuffer(raw[:12], dtype="<i4") if len(raw) >= 12 else None
    if head is not None and head[0] == LLMC_MAGIC:
        n = int(head[2])
        return np.frombuffer(raw, dtype="<u2", count=n, offset=1024).astype(np.int64)
    return np.frombuffer(raw, dtype="<u2").astype(np.int64)


def sample_offset(seed, step, pos, n_tokens, T):
    """Random mode (the built-in corpus's): a counter-based offset."""
    return rng_below(seed ^ DATA_SALT, step, pos, n_tokens - T)


EPOCH_SALT = 0x45504F434853
FEISTEL_ROUNDS = 4


def permute(key, n, i):
    """mal_data_permute: element i of the keyed permutation of [0, n), a
    balanced Feistel network on 2h bits (4^h >= n) walked until below n."""
    if n <= 1:
        return 0
    h = 1
    while h < 32 and (1 << (2 * h)) < n:
        h += 1
    mask = (1 << h) - 1
    x = i
    while True:
        L, R = x >> h, x & mask
        for r in range(FEISTEL_ROUNDS):
            L, R = R, L ^ (rng_u64(key, r, R) & mask)
        x = (L << h) | R
        if x < n:
            return x


def epoch_offset(seed, step, pos, batch, n_tokens, T):
    """Epochs mode (malleus-train's default for --data, one file, no blend):
    sample g = step * batch + pos reads window permute(key(epoch), N, g mod
    N) of the N = (n_tokens - 1) // T windows, T apart."""
    n_win = (n_tokens - 1) // T
    g = step * batch + pos
    key = rng_u64(seed ^ DATA_SALT ^ EPOCH_SALT, 0, g // n_win)
    return permute(key, n_win, g % n_win) * T


def sample_batch(tokens, seed, step, first_pos, B, T, batch=None):
    """(inputs, targets) int64 (B,T) for global-batch positions
    first_pos .. first_pos+B-1 of step `step` (mal_data_sample): epochs
    with `batch` samples per step (a --data file), else random offsets."""
    if batch is None:
        offs = [sample_offset(seed, step, first_pos + i, len(tokens), T) for i in range(B)]
    else:
        offs = [epoch_offset(seed, step, first_pos + i, batch, len(tokens), T) for i in range(B)]
    win = np.stack([tokens[o:o + T + 1] for o in offs])
    return torch.from_numpy(win[:, :T].copy()), torch.from_numpy(win[:, 1:].copy())


# ---- learning-rate schedule (float32 like optim.c) -------------------------


def lr_at(step, lr, warmup, total, min_ratio):
    warmup = max(warmup, 1)
    if step < warmup:
        return float(F32(lr) * F32(step + 1) / F32(warmup))
    span = float(total - warmup)
    p = (step - warmup) / span if span > 0 else 1.0
    p = min(p, 1.0)
    lr64, min_lr = float(F32(lr)), float(F32(lr)) * float(F32(min_ratio))
    return float(F32(min_lr + 0.5 * (lr64 - min_lr) * (1.0 + math.cos(math.pi * p))))


# ---- the model ---------------------------------------------------------------


def inv_freq(hd, theta, scaling=None):
    """The rotary frequencies (hd/2,) in float64: theta^(-2i/hd), and with a
    llama3 rope_scaling Meta's apply_scaling (llama3 reference code): a
    wavelength below original/high_freq_factor keeps its frequency, one above
    original/low_freq_factor is divided by factor, one between is
    interpolated with smooth = (original/wavelength - low) / (high - low)."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv = theta ** (-2.0 * i / hd)
    if not scaling:
        return inv
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise ValueError("rope_scaling %r: only llama3 is known" % (scaling,))
    f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    out = []
    for x in inv.tolist():
        wavelen = 2 * math.pi / x
        if wavelen < orig / hi:
            out.append(x)
        elif wavelen > orig / lo:
            out.append(x / f)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * x / f + smooth * x)
    return torch.tensor(out, dtype=torch.float64)


def rope_tables(T, hd, theta, dtype, scaling=None):
    """cos, sin (T, hd/2): angle t * inv_freq(i), computed in float64."""
    inv = inv_freq(hd, theta, scaling)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin, convention="interleaved"):
    """x (B,T,H,hd).  "interleaved": pairs (2i, 2i+1) (Malleus, original
    LLaMA), done as the LLaMA code does it: each pair is a complex number
    multiplied by e^(i angle).  "halves": pairs (i, i + hd/2) (the HF
    convention; used only to show that the reference test notices a wrong
    convention)."""
    B, T, H, hd = x.shape
    if convention == "interleaved":
        rot = torch.complex(cos, sin)[None, :, None, :]
        xc = torch.view_as_complex(x.reshape(B, T, H, hd // 2, 2))
        return torch.view_as_real(xc * rot).reshape(B, T, H, hd)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    x0, x1 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Model:
    """Parameters in a dict keyed by Malleus's tensor names (leaf tensors
    with requires_grad), and the forward pass."""

    def __init__(self, cfg, params, dtype=torch.float32, rope_convention="interleaved",
                 kv_map="grouped"):
        self.cfg = cfg
        self.dtype = dtype
        self.rope_convention = rope_convention
        # "grouped": query head h reads key/value head h // (H / Hkv) (the
        # only right one; "cyclic", h % Hkv, exists to show the reference
        # test notices a wrong grouping)
        self.kv_map = kv_map
        self.names = [n for n, _, _, _ in tensor_layout(cfg)]
        self.decay = {n: d for n, _, d, _ in tensor_layout(cfg)}
        self.p = {}
        for n in self.names:
            t = torch.as_tensor(np.asarray(params[n])).to(dtype).clone()
            self.p[n] = t.requires_grad_(True)
        hd = cfg["d_model"] // cfg["n_heads"]
        self.cos, self.sin = rope_tables(cfg["seq_len"], hd, cfg["rope_theta"], dtype,
                                         cfg.get("rope_scaling"))
        T = cfg["seq_len"]
        self.mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def parameters(self):
        return [self.p[n] for n in self.names]

    def logits(self, tokens):
        """tokens (B,T) int64 -> logits (B,T,V)."""
        c, p = self.cfg, self.p
        B, T = tokens.shape
        C, H = c["d_model"], c["n_heads"]
        Hkv = c.get("n_kv_heads", H)
        hd, eps = C // H, c["norm_eps"]
        x = F.embedding(tokens, p["tok_embedding"])
        for l in range(c["n_layers"]):
            w = lambda s: p["layers.%d.%s" % (l, s)]  # noqa: E731
            h = rmsnorm(x, w("attn_norm"), eps)
            q = F.linear(h, w("wq")).view(B, T, H, hd)
            k = F.linear(h, w("wk")).view(B, T, Hkv, hd)
            v = F.linear(h, w("wv")).view(B, T, Hkv, hd)
            q = apply_rope(q, self.cos[:T], self.sin[:T], self.rope_convention)
            k = apply_rope(k, self.cos[:T], self.sin[:T], self.rope_convention)
            if Hkv != H:  # each key/value head serves H/Hkv query heads
                if self.kv_map == "grouped":
                    k, v = (t.repeat_interleave(H // Hkv, dim=2) for t in (k, v))
                else:
                    k, v = (t.repeat(1, 1, H // Hkv, 1) for t in (k, v))
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B,H,T,hd)
            # scale q (N*C values) rather than the scores (B*H*T*T values)
            att = torch.matmul(q * (1.0 / math.sqrt(hd)), k.transpose(-1, -2))
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(o, w("wo"))
            h2 = rmsnorm(x, w("mlp_norm"), eps)
            x = x + F.linear(F.silu(F.linear(h2, w("w1"))) * F.linear(h2, w("w3")), w("w2"))
        h = rmsnorm(x, p["final_norm"], eps)
        return F.linear(h, p["tok_embedding"] if c.get("tie_embeddings") else p["lm_head"])

    def token_losses(self, tokens, targets):
        """Per-token cross-entropy (B*T,)."""
        lg = self.logits(tokens)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1), reduction="none")


# ---- optimizer (kernels.h's AdamW, optim.c's clipping) --------------------


class AdamW:
    """AdamW exactly as kernels.h states it, element-wise on every tensor:
        g = grad * grad_scale
        m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
        p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * p)
    with wd applied only to tensors whose decay flag is set, t = step + 1,
    and grad_scale = clip / ||g|| when the global norm exceeds clip."""

    def __init__(self, model, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0):
        self.model = model
        self.b1, self.b2 = float(F32(beta1)), float(F32(beta2))
        self.eps, self.wd, self.clip = float(F32(eps)), float(F32(weight_decay)), float(F32(clip))
        self.m = {n: torch.zeros_like(t) for n, t in model.p.items()}
        self.v = {n: torch.zeros_like(t) for n, t in model.p.items()}

    def grad_norm(self):
        return math.sqrt(sum(float(t.grad.double().pow(2).sum()) for t in self.model.p.values()))

    @torch.no_grad()
    def step(self, step, lr):
        """Clip and update; returns the gradient norm before clipping."""
        norm = self.grad_norm()
        scale = self.clip / norm if self.clip > 0 and norm > self.clip else 1.0
        t = step + 1
        bc1, bc2 = 1.0 - self.b1 ** t, 1.0 - self.b2 ** t
        for n, p in self.model.p.items():
            g = p.grad * scale
            m, v = self.m[n], self.v[n]
            m.mul_(self.b1).add_(g, alpha=1.0 - self.b1)
            v.mul_(self.b2).add_(g * g, alpha=1.0 - self.b2)
            upd = (m / bc1) / (torch.sqrt(v / bc2) + self.eps)
            if self.model.decay[n]:
                upd = upd + self.wd * p
            p.sub_(lr * upd)
        return norm


# ---- memory the C trainer allocates (model.c) -----------------------------


def _pad16(n):
    return (n + 15) & ~15


def n_param_floats(cfg):
    """m->n_params: the flat buffer length with every tensor 16-float aligned."""
    off = 0
    for _, shape, _, _ in tensor_layout(cfg):
        off = _pad16(off) + int(np.prod(shape))
    return off


def acts_bytes(cfg, B):
    """mal_acts_bytes for the full model (one process, TP 1)."""
    T, C, V, L = cfg["seq_len"], cfg["d_model"], cfg["vocab"], cfg["n_layers"]
    H, Fh = cfg["n_heads"], cfg["ffn_hidden"]
    N, A = B * T, C
    K = cfg.get("n_kv_heads", H) * (C // H)
    per_layer = [N * C, N, N * A, N * K, N * K, B * H * T * T, N * A, N * C, N * C, N,
                 N * Fh, N * Fh, N * Fh]
    total = sum(_pad16(s) for s in per_layer) * L
    total += _pad16(N * C) * (L + 1)
    total += _pad16(N * C) + _pad16(N) + _pad16(N * V) + _pad16(N)
    return total * 4 + 2 * _pad16(N) * 4


def backward_scratch_bytes(cfg, B):
    """The model's backward scratch (d_res0 .. d_s in mal_model_create)."""
    T, C, H, Fh = cfg["seq_len"], cfg["d_model"], cfg["n_heads"], cfg["ffn_hidden"]
    N = B * T
    K = cfg.get("n_kv_heads", H) * (C // H)
    return 4 * (3 * N * C + 2 * N * C + 2 * N * K + B * H * T * T + 3 * N * Fh)


def footprint_bytes(cfg, B):
    """dict: parameters+gradients+Adam m and v, activations, scratch."""
    return {
        "state": 4 * 4 * n_param_floats(cfg),
        "acts": acts_bytes(cfg, B),
        "scratch": backward_scratch_bytes(cfg, B),
    }


def set_threads(n):
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["OPENBLAS_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
