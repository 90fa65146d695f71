#!/usr/bin/env python3
# The two floors of one training step (METHOD.md: FLOPs over the matrix
# rate, bytes over memory bandwidth) and a predicted time per operation of
# Malleus's CUDA backend, for the benchmark shapes.  Pure arithmetic on the
# shapes: runs anywhere, `python3 bench/gpu/floors.py [--markdown]`.
#
# Every operation the model issues per step (src/model.c's forward and
# backward, the optimizer over the state slab) is listed with
#   flops  - arithmetic it must do (matrix products at 2 per multiply-add;
#            attention with the causal half only, and its backward as this
#            backend computes it: S and dP recomputed in both the dK/dV and
#            the dQ kernel, 7 products of T x T x hd per head instead of the
#            model's 4);
#   bytes  - device memory it must move at least: each input read once,
#            each output written once (accumulated outputs read and written),
#            activations in bf16, state (master, grads, Adam m/v) in fp32.
# The floor of an operation is max(flops / matrix rate, bytes / bandwidth);
# the step's floor is the sum.  The prediction divides by rates this
# backend can plausibly reach (PRED_* below, assumptions until measured).

import argparse
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flops  # noqa: E402

GEMM_RATE = 785e12  # bf16 GEMM, measured on the H100 machine (bench/gpu/NOTES.md)
HBM_RATE = 3.0e12  # H100 device-to-device copy, bytes read + written, measured once in this
#                    workplace (.library/device/KINDS.md, 2026-11-13); re-measured by run.sh
# Predicted achieved rates (assumptions, to be replaced by measurements):
PRED_GEMM = 650e12  # cuBLASLt bf16 on these shapes (N = 16 k tokens, K 2 k..5.6 k)
PRED_ATT_FWD = 250e12  # the mma.sync flash forward written here (no wgmma)
PRED_ATT_BWD = 170e12  # its deterministic two-kernel backward
PRED_BW = 0.8 * HBM_RATE  # element-wise kernels with 16-byte accesses


def ops_of(cfg, B):
    """[(name, phase, count per step, flops, bytes, kind)] for one step."""
    T, C, F, V, L, H = (cfg[k] for k in ("seq_len", "d_model", "ffn_hidden", "vocab", "n_layers",
                                        "n_heads"))
    hd = C // H
    N = B * T
    e, f = 2, 4  # bf16 activations, fp32 state
    P = flops.n_params(cfg)
    att_unit = B * H * T * T * hd  # one causal T x T x hd product: 2 * (T^2 / 2) * hd per head
    out = []

    def gemm(name, phase, n, M, K, Nn, c_bytes=e, c_read=False, a_bytes=e):
        out.append((name, phase, n, 2 * M * K * Nn,
                    a_bytes * M * K + e * K * Nn + c_bytes * M * Nn * (2 if c_read else 1),
                    "gemm"))

    def elem(name, phase, n, bts, fl=0):
        out.append((name, phase, n, fl, bts, "mem"))

    # forward
    elem("embedding fwd", "fwd", 1, N * C * e * 2 + N * 4)
    elem("rmsnorm fwd", "fwd", 2 * L + 1, N * C * e * 2 + N * 4 + C * e)
    gemm("q/k/v proj", "fwd", 3 * L, N, C, C)
    elem("rope fwd", "fwd", 2 * L, 2 * N * C * e)
    out.append(("attention fwd", "fwd", L, 2 * att_unit, 4 * N * C * e + B * H * T * 4, "att_f"))
    gemm("o proj", "fwd", L, N, C, C)
    elem("residual add", "fwd", 2 * L, 3 * N * C * e)
    gemm("w1/w3 (gate, up)", "fwd", 2 * L, N, C, F)
    elem("swiglu fwd", "fwd", L, 3 * N * F * e)
    gemm("w2 (down)", "fwd", L, N, F, C)
    gemm("lm head", "fwd", 1, N, C, V)
    elem("cross-entropy fwd+bwd", "fwd", 1, 2 * N * V * e + 2 * N * 4)
    # backward (src/model.c's order; dX accumulates: read + write; dW fp32 +=)
    gemm("lm head dX", "bwd", 1, N, V, C, c_read=True)
    gemm("lm head dW", "bwd", 1, V, N, C, c_bytes=f, c_read=True)
    elem("rmsnorm bwd", "bwd", 2 * L + 1, N * C * e * 4 + N * 4 + C * f * 2)
    gemm("w2 dX", "bwd", L, N, C, F, c_read=True)
    gemm("w2 dW", "bwd", L, C, N, F, c_bytes=f, c_read=True)
    elem("swiglu bwd", "bwd", L, 3 * N * F * e + 2 * 2 * N * F * e)
    gemm("w1/w3 dX", "bwd", 2 * L, N, F, C, c_read=True)
    gemm("w1/w3 dW", "bwd", 2 * L, F, N, C, c_bytes=f, c_read=True)
    gemm("o proj dX", "bwd", L, N, C, C, c_read=True)
    gemm("o proj dW", "bwd", L, C, N, C, c_bytes=f, c_read=True)
    out.append(("attention bwd", "bwd", L, 7 * att_unit,
                (4 + 2 + 3 * 2) * N * C * e + 2 * B * H * T * 4, "att_b"))
    elem("rope bwd", "bwd", 2 * L, 2 * N * C * e)
    gemm("q/k/v dX", "bwd", 3 * L, N, C, C, c_read=True)
    gemm("q/k/v dW", "bwd", 3 * L, C, N, C, c_bytes=f, c_read=True)
    elem("embedding bwd", "bwd", 1, N * C * e + N * 4 + 2 * N * C * f)
    # what src/model.c adds around the kernels: zeroing of accumulated
    # gradients and copies of the residual gradient (removable: see NOTES)
    elem("zero/copy (model code)", "bwd", L,
         (3 * N * F + 6 * N * C) * e + 2 * 2 * N * C * e)
    elem("zero grads", "opt", 1, P * f)
    elem("grad norm (sumsq)", "opt", 1, P * f)
    elem("adamw + bf16 copy", "opt", 1, P * (4 * f + 3 * f + e))
    return out


def predicted(fl, bts, kind):
    rate = {"gemm": PRED_GEMM, "att_f": PRED_ATT_FWD, "att_b": PRED_ATT_BWD}.get(kind)
    return max(fl / rate if rate else 0.0, bts / PRED_BW)


def report(model, B, md):
    cfg = flops.model_config(model)
    ops = ops_of(cfg, B)
    tok = B * cfg["seq_len"]
    model_fl = flops.step_flops(cfg, B)
    exec_fl = sum(n * fl for _, _, n, fl, _, _ in ops)
    bts = sum(n * b for _, _, n, _, b, _ in ops)
    fl_floor = model_fl / GEMM_RATE
    by_floor = bts / HBM_RATE
    op_floor = sum(n * max(fl / GEMM_RATE, b / HBM_RATE) for _, _, n, fl, b, _ in ops)
    pred = sum(n * predicted(fl, b, k) for _, _, n, fl, b, k in ops)
    print("\n%s %s: B %d x T %d = %d tokens/step, %.3f G params, %.3f GFLOP/token (model)" %
          ("###" if md else "==", model, B, cfg["seq_len"], tok, flops.n_params(cfg) / 1e9,
           flops.flops_per_token(cfg) / 1e9))
    print("")
    rows = [
        ("model FLOPs / step", "%.1f TFLOP" % (model_fl / 1e12)),
        ("executed FLOPs / step (attention recompute)", "%.1f TFLOP" % (exec_fl / 1e12)),
        ("minimum bytes / step", "%.1f GB" % (bts / 1e9)),
        ("FLOP floor (model FLOPs / %.0f TFLOP/s)" % (GEMM_RATE / 1e12),
         "%.1f ms = %.0f k tokens/s" % (fl_floor * 1e3, tok / fl_floor / 1e3)),
        ("byte floor (bytes / %.1f TB/s)" % (HBM_RATE / 1e12),
         "%.1f ms" % (by_floor * 1e3)),
        ("sum over ops of max(flop, byte) time", "%.1f ms = %.0f k tokens/s" %
         (op_floor * 1e3, tok / op_floor / 1e3)),
        ("predicted (rates in floors.py)", "%.1f ms = %.0f k tokens/s, MFU %.0f%%" %
         (pred * 1e3, tok / pred / 1e3, 100 * model_fl / pred / flops.PEAK_BF16)),
    ]
    if md:
        print("| quantity | value |\n|---|---|")
        for a, b in rows:
            print("| %s | %s |" % (a, b))
    else:
        for a, b in rows:
            print("  %-46s %s" % (a, b))
    print("")
    hdr = ("op", "calls", "GFLOP/call", "MB/call", "floor ms", "pred ms", "pred share")
    if md:
        print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
    else:
        print("  %-24s %5s %10s %9s %9s %8s %6s" % hdr)
    for name, _, n, fl, b, k in ops:
        fl_t = n * max(fl / GEMM_RATE, b / HBM_RATE)
        p = n * predicted(fl, b, k)
        cells = (name, "%d" % n, "%.1f" % (fl / 1e9), "%.1f" % (b / 1e6), "%.2f" % (fl_t * 1e3),
                 "%.2f" % (p * 1e3), "%.1f%%" % (100 * p / pred))
        if md:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  %-24s %5s %10s %9s %9s %8s %6s" % cells)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    for model, B in (("124m", 16), ("1b", 8)):
        report(model, B, a.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
