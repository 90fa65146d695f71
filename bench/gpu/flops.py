# Work counts of one training step of Malleus's model, shared by the PyTorch
# peer (bench/gpu/torch_peer.py), the floors (bench/gpu/floors.py) and the
# benchmark driver (bench/gpu/bench.py), so every figure uses one formula.
#
# Model FLOPs per token (the convention of the MFU figures in
# bench/gpu/NOTES.md (peer figures), which it reproduces: 1b at 80 k tokens/s = 46% of
# 989 TFLOP/s):
#   matrix products: 6 x (matmul parameters) -- forward 2, backward 4, per
#     parameter of wq, wk, wv, wo, w1, w3, w2 and lm_head (the embedding is a
#     gather, not a product);
#   causal attention: 6 x L x T x C -- forward q.k and p.v are 2 x T x C each
#     per token over all T keys, halved by the causal mask, and the backward
#     is twice the forward.
# Recomputation is not model work and is never counted.

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import presets  # noqa: E402

PEAK_BF16 = 989e12  # H100 SXM dense bf16 (datasheet)
GEMM_MEASURED = 785e12  # 8192^3 bf16 GEMM on the H100 machine (bench/gpu/NOTES.md)


def model_config(spec):
    """A preset name (bench/presets.py), a JSON text or file, a dict."""
    return presets.config(spec)


def matmul_params(cfg):
    C, F, V, L = cfg["d_model"], cfg["ffn_hidden"], cfg["vocab"], cfg["n_layers"]
    return L * (4 * C * C + 3 * C * F) + V * C


def n_params(cfg):
    C, V, L = cfg["d_model"], cfg["vocab"], cfg["n_layers"]
    return matmul_params(cfg) + V * C + L * 2 * C + C


def flops_per_token(cfg):
    L, T, C = cfg["n_layers"], cfg["seq_len"], cfg["d_model"]
    return 6 * matmul_params(cfg) + 6 * L * T * C


def step_flops(cfg, batch):
    return flops_per_token(cfg) * batch * cfg["seq_len"]
