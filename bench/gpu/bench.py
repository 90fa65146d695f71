#!/usr/bin/env python3
# The single-GPU benchmark: malleus-train --device cuda against
# PyTorch 2.11 eager and torch.compile (bench/gpu/torch_peer.py) on the same
# GPU in the same run, for the 124m (B 16 x T 1024) and 1b (B 8 x T 2048)
# shapes, bf16.  Standard library only; the peer runs under $PYTHON3 (the
# GPU machine's python3 holds torch 2.11).
#
#   python3 bench/gpu/bench.py BUILD_DIR OUT_DIR [--shapes 124m,1b] [--who malleus,eager,compile]
#                              [--pairs 1b:malleus,1b:compile,...] [--until EPOCH_S]
#
# Trainers: malleus (the CUDA backend's default attention: cuDNN's where it
# loads), malleus-cudnn (MALLEUS_CUDA_ATTENTION=cudnn: cuDNN required),
# malleus-hand (MALLEUS_CUDA_ATTENTION=hand: the hand-written kernels),
# malleus-selective (the default with --recompute selective), compile, eager.
# --pairs gives the (shape, trainer) runs and their order (default: every
# shape of --shapes with every trainer of --who); --until (seconds since the
# epoch) is when the last run must have ended: a run is started only where
# its minimum (MIN_S below: a guess until measured) still fits, and runs
# with at most the time left; one left out is in the table as NOT RUN (the
# device calls of bench/gpu/run.sh have a fixed length).
#
# First it measures the two ceilings on this GPU (a bf16 8192^3 product and
# a large device-to-device copy, through torch), then runs every (shape,
# trainer) pair in its own process, sampling nvidia-smi's memory.used for
# the peak device memory of each (context and all: the same yardstick for
# both), and writes OUT_DIR/bench.json, OUT_DIR/bench.md and one log per run.
# Throughput is the median over the timed steps (the first ones are warm-up:
# module load, cuBLASLt heuristics, torch.compile).  MFU counts model FLOPs
# (bench/gpu/flops.py) against 989 TFLOP/s and against the GEMM rate
# measured here.  Nothing has been run on a GPU yet: the first run's output
# is the first measurement (bench/gpu/NOTES.md).

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import flops  # noqa: E402

SHAPES = {"124m": 16, "1b": 8}  # global batch (sequences of the preset's T)
# The least time each trainer's run needs (start, warm-up -- torch.compile's
# compilation -- and the timed steps), seconds: about twice the longest
# measured on the H100 on 2026-11-27 (bench.json's wall_s: malleus 4-13 s,
# torch.compile 45-103 s; eager 15 s on 2026-11-26).
MIN_S = {"malleus": 30, "malleus-cudnn": 30, "malleus-hand": 30, "malleus-selective": 30,
         "compile": 120, "eager": 40}
# The environment and extra arguments of each malleus trainer's run:
# malleus is the default (cuDNN's attention where it loads), malleus-hand
# the hand-written attention kernels, malleus-selective the default with
# selective activation recomputation (memory against time)
MALLEUS_ENV = {"malleus": {}, "malleus-cudnn": {"MALLEUS_CUDA_ATTENTION": "cudnn"},
               "malleus-hand": {"MALLEUS_CUDA_ATTENTION": "hand"}, "malleus-selective": {}}
MALLEUS_ARGS = {"malleus-selective": ["--recompute", "selective"]}


class SmiPeak:
    """Peak of nvidia-smi's memory.used (MiB) while the block runs."""

    def __enter__(self):
        self.peak, self.base, self.ok = 0, None, True
        try:
            self.p = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.ok, self.p = False, None
            return self
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        return self

    def _read(self):
        for line in self.p.stdout:
            try:
                v = int(line.strip().split()[0])
            except (ValueError, IndexError):
                continue
            if self.base is None:
                self.base = v
            self.peak = max(self.peak, v)

    def __exit__(self, *exc):
        if self.p:
            self.p.terminate()
            self.p.wait()
        return False

    def gib(self):
        return self.peak / 1024.0 if self.ok and self.peak else None


def ceilings(python):
    code = r"""
import json, statistics, torch
d = torch.device("cuda")
def timed(f, reps):
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize(); out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)
n = 8192
xs = [(torch.randn(n, n, device=d, dtype=torch.bfloat16), torch.randn(n, n, device=d, dtype=torch.bfloat16)) for _ in range(3)]
i = [0]
def mm():
    torch.matmul(*xs[i[0] % 3]); i[0] += 1
for _ in range(5): mm()
g = 2 * n ** 3 / timed(mm, 30)
del xs
src = torch.randn(1 << 30, device=d, dtype=torch.bfloat16)  # 2 GiB
dst = torch.empty_like(src)
for _ in range(3): dst.copy_(src)
bw = 2 * src.numel() * 2 / timed(lambda: dst.copy_(src), 20)
print(json.dumps({"gemm_flops": g, "copy_bytes_per_s": bw, "gpu": torch.cuda.get_device_name(0),
                  "torch": torch.__version__}))
"""
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("ceilings failed:\n" + r.stdout + r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_malleus(build, shape, B, steps, warmup, out, rate, timeout=600, who="malleus"):
    metrics = os.path.join(out, "%s_%s.jsonl" % (who, shape))
    log = os.path.join(out, "%s_%s.log" % (who, shape))
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [os.path.join(build, "malleus-train"), "--device", "cuda", "--precision", "bf16",
           "--model", shape, "--data", "synthetic:32000", "--global-batch", str(B),
           "--micro-batch", str(B), "--steps", str(steps), "--metrics", metrics]
    cmd += MALLEUS_ARGS.get(who, [])
    env = dict(os.environ, **MALLEUS_ENV[who])
    t0 = time.time()
    with SmiPeak() as smi, open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            return {"who": who, "model": shape, "error": "timed out after %d s" % timeout}
    if rc != 0:
        return {"who": who, "model": shape, "error": "exit %d (see %s)" % (rc, log)}
    rows = [json.loads(x) for x in open(metrics) if x.strip()]
    timed = rows[warmup:] if len(rows) > warmup else rows
    step_s = statistics.median(r["step_ms"] for r in timed) / 1e3
    cfg = flops.model_config(shape)
    f = flops.step_flops(cfg, B) / step_s
    return {"who": who, "model": shape, "batch": B, "seq_len": cfg["seq_len"],
            "steps": steps, "warmup": warmup, "step_ms": step_s * 1e3,
            "tokens_per_s": B * cfg["seq_len"] / step_s, "model_tflops": f / 1e12,
            "mfu_peak": f / flops.PEAK_BF16, "mfu_gemm": f / rate if rate else None,
            "peak_smi_gib": smi.gib(), "wall_s": time.time() - t0,
            "losses": [r["loss"] for r in rows]}


def run_torch(python, shape, B, mode, steps, warmup, out, rate, timeout=900):
    js = os.path.join(out, "torch_%s_%s.json" % (mode, shape))
    log = os.path.join(out, "torch_%s_%s.log" % (mode, shape))
    if os.path.exists(js):
        os.remove(js)
    cmd = [python, os.path.join(HERE, "torch_peer.py"), "--model", shape, "--batch", str(B),
           "--mode", mode, "--steps", str(steps), "--warmup", str(warmup), "--json", js,
           "--gemm-rate", str(rate or 0)]
    t0 = time.time()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with SmiPeak() as smi, open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            return {"who": "torch-" + mode, "model": shape,
                    "error": "timed out after %d s" % timeout}
    if rc != 0:
        return {"who": "torch-" + mode, "model": shape, "error": "exit %d (see %s)" % (rc, log)}
    res = json.loads(open(js).read().strip().splitlines()[-1])
    res["peak_smi_gib"] = smi.gib()
    res["wall_s"] = time.time() - t0
    return res


def table(results, ceil):
    lines = ["GPU: %s, torch %s; measured bf16 GEMM %.0f TFLOP/s, copy %.2f TB/s (read + write)"
             % (ceil.get("gpu"), ceil.get("torch"), ceil["gemm_flops"] / 1e12,
                ceil["copy_bytes_per_s"] / 1e12), "",
             "| shape | trainer | tokens/s | ms/step | model TFLOP/s | MFU (989) | MFU (GEMM) "
             "| peak GiB (smi) | peak GiB (torch) | vs compile |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for shape in SHAPES:
        rows = [r for r in results if r["model"] == shape]
        comp = [r for r in rows if r["who"] == "torch-compile" and "error" not in r]
        ref = comp[0]["tokens_per_s"] if comp else None
        for r in rows:
            if "error" in r:
                why = r["error"] if r["error"].startswith("NOT RUN") else "failed: " + r["error"]
                lines.append("| %s | %s | %s | | | | | | | |" % (shape, r["who"], why))
                continue
            g = r.get("peak_smi_gib")
            t = r.get("peak_reserved_gib")
            lines.append("| %s | %s | %.0f | %.1f | %.1f | %.1f%% | %s | %s | %s | %s |" % (
                shape, r["who"], r["tokens_per_s"], r["step_ms"], r["model_tflops"],
                100 * r["mfu_peak"], "%.1f%%" % (100 * r["mfu_gemm"]) if r.get("mfu_gemm") else "-",
                "%.1f" % g if g else "-", "%.1f" % t if t else "-",
                "%.2fx" % (r["tokens_per_s"] / ref) if ref else "-"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("out")
    ap.add_argument("--shapes", default="124m,1b")
    ap.add_argument("--who", default="malleus,compile,eager")
    ap.add_argument("--python", default=os.environ.get("PYTHON3", "python3"))
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--pairs", help="SHAPE:TRAINER,... in the order to run them")
    ap.add_argument("--until", type=float, default=0, help="epoch seconds the last run ends by")
    a = ap.parse_args()
    if a.pairs:
        pairs = [tuple(p.split(":", 1)) for p in a.pairs.split(",")]
    else:
        pairs = [(sh, who) for sh in a.shapes.split(",") for who in a.who.split(",")]
    for sh, who in pairs:
        if sh not in SHAPES or who not in MIN_S:
            ap.error("unknown run %s:%s (shapes %s, trainers %s)" %
                     (sh, who, ",".join(SHAPES), ",".join(MIN_S)))
    os.makedirs(a.out, exist_ok=True)
    ceil = ceilings(a.python)
    print("ceilings: bf16 GEMM %.0f TFLOP/s, copy %.2f TB/s (%s)" %
          (ceil["gemm_flops"] / 1e12, ceil["copy_bytes_per_s"] / 1e12, ceil["gpu"]), flush=True)
    rate = ceil["gemm_flops"]
    results = []
    for shape, who in pairs:
        B = SHAPES[shape]
        left = a.until - time.time() if a.until else 900
        if left < MIN_S[who]:
            r = {"who": who if who in MALLEUS_ENV else "torch-" + who, "model": shape,
                 "error": "NOT RUN (no time: %.0f s left, needs %d)" % (left, MIN_S[who])}
        elif who in MALLEUS_ENV:
            r = run_malleus(a.build, shape, B, a.steps, a.warmup, a.out, rate, int(left), who)
        else:
            r = run_torch(a.python, shape, B, who, a.steps, a.warmup, a.out, rate, int(left))
        results.append(r)
        print("%-14s %-5s %s" % (r["who"], shape, r.get("error") or
                                 "%.0f tokens/s, %.1f ms/step, MFU %.1f%%, peak %s GiB" %
                                 (r["tokens_per_s"], r["step_ms"], 100 * r["mfu_peak"],
                                  "%.1f" % r["peak_smi_gib"] if r.get("peak_smi_gib")
                                  else "?")), flush=True)
        with open(os.path.join(a.out, "bench.json"), "w") as f:
            json.dump({"ceilings": ceil, "results": results}, f, indent=1)
    md = table(results, ceil)
    with open(os.path.join(a.out, "bench.md"), "w") as f:
        f.write(md + "\n")
    print("\n" + md)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
