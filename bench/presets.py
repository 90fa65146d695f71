# The model presets of src/config.c, for the Python side of the benchmarks
# and reference tests (bench/torch_model.py, bench/gpu/).  Plain data, no
# imports but the standard library's, so that scripts without numpy or torch
# can read it.
import json
import os

PRESETS = {
    "tiny": dict(vocab=256, d_model=64, n_layers=4, n_heads=8, ffn_hidden=128, seq_len=32),
    "small": dict(vocab=256, d_model=512, n_layers=8, n_heads=8, ffn_hidden=1408, seq_len=256),
    "124m": dict(vocab=32000, d_model=768, n_layers=12, n_heads=12, ffn_hidden=2048, seq_len=1024),
    "1b": dict(vocab=32000, d_model=2048, n_layers=16, n_heads=16, ffn_hidden=5632, seq_len=2048),
}


def config(spec):
    """A preset name, a JSON text, a JSON file or a dict -> dict with every
    field (rope_theta and norm_eps defaulted as src/config.c does)."""
    if isinstance(spec, str) and spec in PRESETS:
        cfg = dict(PRESETS[spec])
    elif isinstance(spec, str) and not spec.lstrip().startswith("{") and os.path.exists(spec):
        with open(spec) as f:
            cfg = json.load(f)
    elif isinstance(spec, str):
        cfg = json.loads(spec)
    else:
        cfg = dict(spec)
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("norm_eps", 1e-5)
    return cfg
