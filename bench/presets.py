# The model presets of src/config.c, for the Python side of the benchmarks
# and reference tests (bench/torch_model.py, bench/gpu/).  Plain data, no
# imports but the standard library's, so that scripts without numpy or torch
# can read it.
import json
import os

def _llama3_scaling(factor, original):
    return dict(rope_type="llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=original)


PRESETS = {
    "tiny": dict(vocab=256, d_model=64, n_layers=4, n_heads=8, ffn_hidden=128, seq_len=32),
    "tiny-llama3": dict(vocab=259, d_model=64, n_layers=4, n_heads=8, n_kv_heads=2,
                        ffn_hidden=128, seq_len=32, tie_embeddings=True, rope_theta=500000.0,
                        rope_scaling=_llama3_scaling(8.0, 256)),
    "small": dict(vocab=256, d_model=512, n_layers=8, n_heads=8, ffn_hidden=1408, seq_len=256),
    "124m": dict(vocab=32000, d_model=768, n_layers=12, n_heads=12, ffn_hidden=2048, seq_len=1024),
    "1b": dict(vocab=32000, d_model=2048, n_layers=16, n_heads=16, ffn_hidden=5632, seq_len=2048),
    "llama3-1b": dict(vocab=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                      ffn_hidden=8192, seq_len=2048, tie_embeddings=True, rope_theta=500000.0,
                      rope_scaling=_llama3_scaling(32.0, 8192)),
    "llama2-7b": dict(vocab=32000, d_model=4096, n_layers=32, n_heads=32, ffn_hidden=11008,
                      seq_len=4096),
}


def config(spec):
    """A preset name, a JSON text, a JSON file or a dict -> dict with every
    field (rope_theta, norm_eps, n_kv_heads, tie_embeddings and rope_scaling
    defaulted as src/config.c does)."""
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
    cfg.setdefault("n_kv_heads", cfg["n_heads"])
    cfg.setdefault("tie_embeddings", False)
    cfg.setdefault("rope_scaling", None)
    return cfg
