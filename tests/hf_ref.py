# Checks a Hugging Face export (malleus-export) against Malleus's own loss,
# driven by tests/test_export.sh (--impl torch) and tests/test_export_hf.sh
# (--impl transformers).
#
# Given the export directory, the token file, and the loss malleus-train
# reported for the same parameters on the global batch of step K (the
# metrics line of step K+1 of a run whose snapshot at step K was exported),
# this script re-draws that batch with the documented sampler and computes
# the mean cross-entropy of the exported model on it, in float32, with
#   --impl transformers: transformers' LlamaForCausalLM.from_pretrained, every
#       key of the checkpoint and of the model matched (none missing,
#       unexpected or of another shape);
#   --impl torch: an independent PyTorch implementation of Hugging Face's
#       LLaMA (rotate_half rotary embedding, grouped-query attention by
#       repeat_kv, tied embeddings, the llama3 rope_scaling, all written from
#       the modelling code's conventions, not from Malleus) that reads
#       model.safetensors with its own parser of the format (8-byte
#       little-endian header length, JSON header, raw little-endian
#       tensors), checking the header's offsets tile the data exactly.
# --perturb no-permute undoes the q/k row permutation after loading (what an
# exporter that forgot it would have written), --perturb unscaled-rope drops
# the config's rope_scaling: the losses must then differ, which shows the
# comparison can fail.  --bf16 DIR (torch only) also checks
# a bf16 export of the same snapshot holds exactly torch's round-to-nearest-
# even bf16 of the fp32 export.
# Exit status: 0 match, 1 mismatch, 77 a module is missing, 99 error.

import argparse
import json
import math
import os
import struct
import sys

sys.dont_write_bytecode = True

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("hf_ref: skipped: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch_model as tm  # noqa: E402  (only its sampler: load_tokens, sample_batch)


# ---- safetensors, parsed here --------------------------------------------


def read_safetensors(path):
    """{name: float32 numpy array}, {metadata}; raises on any format error."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        raise RuntimeError("%s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise RuntimeError("%s: header length %d beyond the file" % (path, n))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans, out = [], {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        shape = tuple(e["shape"])
        esize = {"F32": 4, "BF16": 2}[e["dtype"]]
        if end - b != esize * int(np.prod(shape)):
            raise RuntimeError("%s: %s: %d bytes for shape %s" % (path, name, end - b, shape))
        spans.append((b, end))
        buf = data[b:end]
        if e["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        else:  # bf16: the upper half of a float32
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        out[name] = arr.reshape(shape)
    spans.sort()
    pos = 0
    for b, end in spans:
        if b != pos:
            raise RuntimeError("%s: tensor data not contiguous at byte %d" % (path, pos))
        pos = end
    if pos != len(data):
        raise RuntimeError("%s: %d data bytes, the header covers %d" % (path, len(data), pos))
    return out, meta


# ---- an independent Hugging Face LLaMA forward ----------------------------


def hf_names(L, tied):
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not tied:
        names.append("lm_head.weight")
    for l in range(L):
        p = "model.layers.%d." % l
        names += [p + s + ".weight" for s in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj")]
    return names


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def inv_freq(cfg, hd):
    """The rotary frequencies as transformers computes them in float32:
    1 / theta^(2i/hd), and for rope_scaling {"rope_type": "llama3"} the
    frequencies whose wavelength exceeds original/low_freq_factor divided by
    factor, those between original/high_freq_factor and it interpolated."""
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    sc = cfg.get("rope_scaling")
    if not sc:
        return inv
    if sc.get("rope_type", sc.get("type")) != "llama3":
        raise RuntimeError("rope_scaling %r is not llama3" % (sc,))
    f, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    orig = sc["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / lo, inv / f, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / f + smooth * scaled
    medium = ~(wavelen < orig / hi) * ~(wavelen > orig / lo)
    return torch.where(medium, smoothed, scaled)


def torch_logits(cfg, W, tokens):
    """LlamaForCausalLM's forward, float32: tokens (B,T) -> logits (B,T,V)."""
    B, T = tokens.shape
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    Hkv = cfg.get("num_key_value_heads") or H
    hd, eps = C // H, cfg["rms_norm_eps"]
    inv = inv_freq(cfg, hd)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # (1,1,T,hd)
    mask = torch.full((T, T), float("-inf")).triu(1)
    x = F.embedding(tokens, W["model.embed_tokens.weight"])
    for l in range(L):
        w = lambda s: W["model.layers.%d.%s.weight" % (l, s)]  # noqa: E731
        h = rms(x, w("input_layernorm"), eps)
        q = F.linear(h, w("self_attn.q_proj")).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(h, w("self_attn.k_proj")).view(B, T, Hkv, hd).transpose(1, 2)
        v = F.linear(h, w("self_attn.v_proj")).view(B, T, Hkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: key/value head j serves query heads j*g .. j*g+g-1
        k, v = (x.repeat_interleave(H // Hkv, dim=1) for x in (k, v))
        att = (torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + mask).softmax(dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(o, w("self_attn.o_proj"))
        h = rms(x, w("post_attention_layernorm"), eps)
        x = x + F.linear(F.silu(F.linear(h, w("mlp.gate_proj"))) * F.linear(h, w("mlp.up_proj")),
                         w("mlp.down_proj"))
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return F.linear(rms(x, W["model.norm.weight"], eps), head)


def unpermute(w, H):
    """Rotate-half rows back to interleaved pairs, within every head."""
    rows, cols = w.shape
    hd = rows // H
    return w.reshape(H, 2, hd // 2, cols).transpose(1, 2).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser(description="a Hugging Face export vs Malleus's loss")
    ap.add_argument("--impl", choices=["torch", "transformers"], required=True)
    ap.add_argument("--export", required=True, help="malleus-export's output directory")
    ap.add_argument("--data", required=True, help="the token file the run trained on")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--step", type=int, required=True, help="K: the exported snapshot's step")
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--loss", type=float, required=True,
                    help="malleus-train's loss for step K's batch with these parameters")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--perturb", choices=["none", "no-permute", "unscaled-rope"], default="none",
                    help="no-permute: q/k rows left interleaved; unscaled-rope: the export's "
                         "rope_scaling dropped")
    ap.add_argument("--bf16", help="(torch) a bf16 export of the same snapshot to check")
    ap.add_argument("--greedy", nargs=3, metavar=("PROMPT", "N", "FILE"),
                    help="also continue PROMPT greedily by N tokens and compare with FILE "
                         "(malleus-sample --temperature 0's output)")
    a = ap.parse_args()
    torch.set_num_threads(1)

    cfg = json.load(open(os.path.join(a.export, "config.json")))
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        print("hf_ref: MISMATCH: config.json is not a LlamaForCausalLM: %s" % cfg)
        return 1
    T, H = cfg["max_position_embeddings"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    tied = bool(cfg.get("tie_word_embeddings"))
    tokens = tm.load_tokens(a.data)
    x, y = tm.sample_batch(tokens, a.seed, a.step, 0, a.global_batch, T, a.global_batch)

    if a.impl == "transformers":
        try:
            from transformers import LlamaForCausalLM
        except ImportError as e:
            print("hf_ref: skipped: %s" % e)
            return 77
        extra = {"rope_scaling": None} if a.perturb == "unscaled-rope" else {}
        model, info = LlamaForCausalLM.from_pretrained(
            a.export, output_loading_info=True, torch_dtype=torch.float32,
            attn_implementation="eager", **extra)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            print("hf_ref: MISMATCH: keys not matched strictly: %s" % bad)
            return 1
        model.eval()
        # tied: one tensor for both (Hugging Face ties lm_head to the
        # embedding when the config says so, and the export has no lm_head)
        if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            print("hf_ref: MISMATCH: tie_word_embeddings set but lm_head is not the embedding")
            return 1
        with torch.no_grad():
            if a.perturb == "no-permute":
                for layer in model.model.layers:
                    for proj, n in ((layer.self_attn.q_proj, H), (layer.self_attn.k_proj, Hkv)):
                        proj.weight.copy_(unpermute(proj.weight, n))
            logits = model(input_ids=x).logits

        def continue_greedily(ids, n):
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                                     pad_token_id=0)
            return out[0].tolist()
        what = "transformers %s LlamaForCausalLM" % __import__("transformers").__version__
    else:
        if a.perturb == "unscaled-rope":
            cfg = dict(cfg, rope_scaling=None)
        W, meta = read_safetensors(os.path.join(a.export, "model.safetensors"))
        if meta.get("format") != "pt":
            print("hf_ref: MISMATCH: __metadata__ lacks format 'pt': %s" % meta)
            return 1
        want = set(hf_names(cfg["num_hidden_layers"], tied))
        if set(W) != want:
            print("hf_ref: MISMATCH: tensors %s missing, %s unexpected"
                  % (sorted(want - set(W)), sorted(set(W) - want)))
            return 1
        if a.bf16:
            Wb, _ = read_safetensors(os.path.join(a.bf16, "model.safetensors"))
            nbad = 0
            for n, w in W.items():
                ref = torch.from_numpy(w).to(torch.bfloat16).to(torch.float32).numpy()
                got = Wb[n]
                same = (ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))
                nbad += int((~same).sum())
            print("bf16 export vs torch's bf16 rounding of the fp32 export: %d elements differ"
                  % nbad)
            if nbad:
                print("hf_ref: MISMATCH: bf16 export is not round-to-nearest-even of fp32")
                return 1
        Wt = {n: torch.from_numpy(w.copy()) for n, w in W.items()}
        if a.perturb == "no-permute":
            for n in Wt:
                if n.endswith("q_proj.weight"):
                    Wt[n] = unpermute(Wt[n], H)
                elif n.endswith("k_proj.weight"):
                    Wt[n] = unpermute(Wt[n], Hkv)
        with torch.no_grad():
            logits = torch_logits(cfg, Wt, x)

        def continue_greedily(ids, n):
            ids = list(ids)
            with torch.no_grad():
                for _ in range(n):
                    lg = torch_logits(cfg, Wt, torch.tensor([ids[-T:]]))
                    ids.append(int(lg[0, -1].argmax()))
            return ids
        what = "independent PyTorch rotate-half LLaMA"

    V = logits.shape[-1]
    loss = float(F.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1)))
    rel = abs(loss - a.loss) / abs(a.loss)
    print("%s on step %d's batch (%d x %d tokens): loss %.8f; malleus-train %.8f; rel. diff %.2e%s"
          % (what, a.step, a.global_batch, T, loss, a.loss, rel,
             " [perturbed: %s]" % a.perturb if a.perturb != "none" else ""))
    if not rel <= a.rtol:
        print("hf_ref: MISMATCH: relative difference %.3g > %g" % (rel, a.rtol))
        return 1
    if a.greedy:
        prompt, n, path = a.greedy[0].encode(), int(a.greedy[1]), a.greedy[2]
        ids = continue_greedily(list(prompt), n)
        # malleus-sample's printing: printable ASCII, newline and tab as
        # they are, every other byte as \xNN
        text = "".join(chr(c) if c in (9, 10) or 32 <= c < 127 else "\\x%02x" % c for c in ids)
        want = open(path).read()
        want = want[:-1] if want.endswith("\n") else want
        print("greedy continuation (%s): %r" % (what, text))
        if text != want:
            print("hf_ref: MISMATCH: malleus-sample --temperature 0 wrote %r" % want)
            return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        print("hf_ref: error: %s" % e)
        sys.exit(99)
