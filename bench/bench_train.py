#!/usr/bin/python3
# Single-process training benchmark: malleus-train against the same model,
# batch, data, optimizer and thread count in PyTorch (bench/torch_model.py).
#
#   /usr/bin/python3 bench/bench_train.py BUILD_DIR [--steps 12] [--threads 2]
#
# Each trainer runs in its own child process; its peak RSS comes from
# wait4()'s rusage of that child alone.  Throughput is the median tokens/s of
# the steps after the first two (warm-up), from each trainer's metrics file.
# The footprint is what the C trainer must hold by construction (parameters,
# gradients, Adam m and v, activations of one micro-batch: mal_acts_bytes),
# computed from the shapes.  See bench/README.md for the targets.

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))

MiB = 1048576.0


def run_child(argv, env, log_path):
    """Run argv with stdout+stderr to log_path; returns (exit status, peak
    RSS in bytes of that child alone (wait4), wall seconds)."""
    t0 = time.time()
    with open(log_path, "w") as log:
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru.ru_maxrss * 1024, time.time() - t0


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median_tps(rows, skip=2):
    tail = rows[skip:] if len(rows) > skip else rows
    return statistics.median(r["tokens_per_s"] for r in tail)


def thread_env(n):
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(n)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


# ---- the PyTorch trainer (runs in its own process) -------------------------


def torch_worker(a):
    import torch

    sys.path.insert(0, HERE)
    import torch_model as tm

    tm.set_threads(a.threads)
    cfg = tm.model_config(a.model)
    T = cfg["seq_len"]
    tokens = tm.load_tokens(a.data)
    # Same initial weights as malleus-train (same seed), so the two loss
    # curves should agree to float32 rounding: a check that the benchmark
    # compares the same work.
    model = tm.Model(cfg, tm.init_params(cfg, a.seed), dtype=torch.float32)
    decay = [model.p[n] for n in model.names if model.decay[n]]
    other = [model.p[n] for n in model.names if not model.decay[n]]
    # Malleus's defaults: lr 1e-3, warmup 10, cosine over --steps to 0.1 lr,
    # betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices, clip 1.0.
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    params = model.parameters()
    n_micro = a.global_batch // a.micro_batch
    scale = 1.0 / (a.global_batch * T)
    with open(a.metrics, "w") as out:
        for step in range(a.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for mb in range(n_micro):
                x, y = tm.sample_batch(tokens, a.seed, step, mb * a.micro_batch, a.micro_batch, T)
                losses = model.token_losses(x, y)
                (losses.sum() * scale).backward()
                loss_sum += float(losses.detach().sum())
            norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
            lr = tm.lr_at(step, 1e-3, 10, a.steps, 0.1)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            dt = time.perf_counter() - t0
            out.write(json.dumps({"step": step + 1, "loss": loss_sum * scale, "lr": lr,
                                  "grad_norm": norm, "tokens_per_s": a.global_batch * T / dt,
                                  "step_ms": 1e3 * dt}) + "\n")
            out.flush()
    return 0


# ---- the driver -------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description="malleus-train vs. PyTorch, one process each")
    ap.add_argument("build_dir", nargs="?", help="the Malleus build directory")
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=None, help="work directory (default: BUILD_DIR/bench-out)")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-malleus", action="store_true")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--metrics", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if not a.build_dir:
        ap.error("give the Malleus build directory (where malleus-train was built)")

    build = os.path.abspath(a.build_dir)
    out = os.path.abspath(a.out or os.path.join(build, "bench-out"))
    os.makedirs(out, exist_ok=True)
    train, tokenize = os.path.join(build, "malleus-train"), os.path.join(build, "malleus-tokenize")
    env = thread_env(a.threads)
    print("model %s, %d steps, global batch %d, micro-batch %d, %d threads; work dir %s"
          % (a.model, a.steps, a.global_batch, a.micro_batch, a.threads, out))
    try:
        print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    except OSError:
        pass

    res = {}
    if not a.skip_malleus:
        m_metrics = os.path.join(out, "malleus.jsonl")
        argv = [train, "--model", a.model, "--steps", str(a.steps), "--global-batch",
                str(a.global_batch), "--micro-batch", str(a.micro_batch), "--threads",
                str(a.threads), "--seed", str(a.seed), "--metrics", m_metrics]
        rc, rss, wall = run_child(argv, env, os.path.join(out, "malleus.log"))
        if rc != 0:
            sys.stdout.write(open(os.path.join(out, "malleus.log")).read())
            print("malleus-train failed (exit %d)" % rc)
            return 1
        res["malleus"] = (read_metrics(m_metrics), rss, wall)

    if not a.skip_torch:
        corpus = os.path.join(out, "corpus.bin")
        if not os.path.exists(corpus):
            subprocess.run([tokenize, "--default", corpus], check=True, stdout=subprocess.DEVNULL)
        t_metrics = os.path.join(out, "torch.jsonl")
        argv = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--model", a.model,
                "--steps", str(a.steps), "--global-batch", str(a.global_batch), "--micro-batch",
                str(a.micro_batch), "--threads", str(a.threads), "--seed", str(a.seed),
                "--data", corpus, "--metrics", t_metrics]
        rc, rss, wall = run_child(argv, env, os.path.join(out, "torch.log"))
        if rc != 0:
            sys.stdout.write(open(os.path.join(out, "torch.log")).read())
            print("PyTorch worker failed (exit %d)" % rc)
            return 1
        res["torch"] = (read_metrics(t_metrics), rss, wall)
        # What importing torch alone costs (part of the PyTorch RSS).
        _, base, _ = run_child([sys.executable, "-c", "import torch, numpy"], env,
                               os.path.join(out, "torch-import.log"))
        res["torch_import_rss"] = base

    # Only now import torch: a child's ru_maxrss starts from the RSS of the
    # process that forked it (Linux carries the parent's high-water mark
    # through fork and exec), so the driver stays small until every child
    # has run.
    sys.path.insert(0, HERE)
    import torch_model as tm

    cfg = tm.model_config(a.model)
    print("model %s: d_model %d, %d layers, %d heads (%d key/value), ffn %d, seq %d, vocab %d%s%s"
          % (a.model, cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
             cfg["ffn_hidden"], cfg["seq_len"], cfg["vocab"],
             ", tied embeddings" if cfg["tie_embeddings"] else "",
             ", llama3 rope scaling" if cfg["rope_scaling"] else ""))
    fp = tm.footprint_bytes(cfg, a.micro_batch)
    footprint = fp["state"] + fp["acts"]

    if "malleus" in res and "torch" in res:
        print("\nstep | loss malleus | loss torch | ms malleus | ms torch")
        for mr, tr in zip(res["malleus"][0], res["torch"][0]):
            print("%4d | %12.6f | %10.6f | %10.1f | %8.1f"
                  % (mr["step"], mr["loss"], tr["loss"], mr["step_ms"], tr["step_ms"]))

    print("\n%-34s %14s %14s" % ("", "malleus-train", "PyTorch " + tm.torch.__version__))
    row = lambda k, m, t: print("%-34s %14s %14s" % (k, m, t))  # noqa: E731
    tps = {k: median_tps(res[k][0]) for k in ("malleus", "torch") if k in res}
    rss = {k: res[k][1] for k in ("malleus", "torch") if k in res}
    row("tokens/s (median, steps 3..)", *("%.0f" % tps[k] if k in tps else "-"
                                           for k in ("malleus", "torch")))
    # On a shared machine other processes stretch some steps; the fastest
    # step is the better estimate of what the code itself can do.
    best = {k: max(r["tokens_per_s"] for r in res[k][0][2:] or res[k][0])
            for k in ("malleus", "torch") if k in res}
    row("tokens/s (best step, steps 3..)", *("%.0f" % best[k] if k in best else "-"
                                              for k in ("malleus", "torch")))
    row("peak RSS (MiB)", *("%.1f" % (rss[k] / MiB) if k in rss else "-"
                             for k in ("malleus", "torch")))
    row("RSS / footprint", *("%.3f" % (rss[k] / footprint) if k in rss else "-"
                              for k in ("malleus", "torch")))
    print()
    print("footprint, from the shapes (MiB):")
    print("  parameters+gradients+Adam m,v  %9.1f  (%d floats each, 16-float aligned)"
          % (fp["state"] / MiB, tm.n_param_floats(cfg)))
    print("  activations (mal_acts_bytes)   %9.1f  (micro-batch %d)" % (fp["acts"] / MiB,
                                                                      a.micro_batch))
    print("  = footprint                    %9.1f" % (footprint / MiB))
    print("  (+ backward scratch, not in the footprint: %.1f)" % (fp["scratch"] / MiB))
    if "torch_import_rss" in res:
        print("  (PyTorch process RSS after only `import torch, numpy`: %.1f)"
              % (res["torch_import_rss"] / MiB))
    if "malleus" in tps and "torch" in tps:
        ratio = tps["malleus"] / tps["torch"]
        r = rss["malleus"] / footprint
        print("\nthroughput ratio malleus/torch = %.3f   (target >= 1.0: %s; best steps: %.3f)"
              % (ratio, "met" if ratio >= 1.0 else "NOT met", best["malleus"] / best["torch"]))
        print("malleus RSS / footprint        = %.3f   (target <= 1.2: %s)"
              % (r, "met" if r <= 1.2 else "NOT met"))
    elif "malleus" in rss:
        r = rss["malleus"] / footprint
        print("\nmalleus RSS / footprint = %.3f   (target <= 1.2: %s)"
              % (r, "met" if r <= 1.2 else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
