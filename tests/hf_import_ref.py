# Helpers of the malleus-import tests (tests/test_import.sh, and
# tests/test_import_hf.sh), with numpy alone: Hugging Face checkpoints
# written here, independently of Malleus's writer, and compared bit for bit.
#
#   write SRC DST VARIANT   DST: a copy of the checkpoint SRC (config.json +
#       model.safetensors, F32, as malleus-export writes it) made into
#       VARIANT: f16, bf16 (every tensor converted, round to nearest even),
#       sharded (three files and model.safetensors.index.json), or a hostile
#       one (bias, tied-lm-head, untied-no-lm-head, missing, misshapen,
#       int32, extra, truncated, overlap, header-beyond, index-escape,
#       index-missing, pytorch-only), or config:KEY=JSON (config.json's KEY
#       set to the JSON value; =DELETE removes it)
#   same-tensors A B        the tensors of two checkpoints (single file or
#       sharded, any dtypes) are the same names, dtypes, shapes and bytes
#   same-params SNAP CKPT_SNAP [--round f16|bf16]   the "param/" tensors of
#       two snapshots are equal bit for bit, the first's rounded as asked
#       (read through tests/snapread.py); CKPT_SNAP holds no "adam_m/"
#   transformers DIR   (torch and transformers) random models made and
#       saved by transformers itself (save_pretrained, safetensors, F32) in
#       DIR: tied/ and untied/ (LLaMA-3 shapes: grouped-query attention,
#       rope_theta 500000, the llama3 rope_scaling; sharded by
#       max_shard_size), and what an import must refuse: bias/ (a LLaMA
#       with attention_bias) and gpt2/ (another architecture)
# Exit status: 0 as expected, 1 a difference (printed), 99 an error.
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def read_file(path):
    """{name: (dtype, shape, bytes)} of one safetensors file, checked."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), raw[8 + n + b:8 + n + end])
    return out


def read_checkpoint(d):
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return read_file(os.path.join(d, "model.safetensors"))
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    files, out = {}, {}
    for name, f in index["weight_map"].items():
        if f not in files:
            files[f] = read_file(os.path.join(d, f))
        out[name] = files[f][name]
    return out


def write_file(path, tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] in file order."""
    header, off = {}, 0
    if meta:
        header["__metadata__"] = meta
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors:
            f.write(t[3])


def as_f32(dt, shape, data):
    if dt == "F32":
        return np.frombuffer(data, dtype="<f4").reshape(shape)
    raise SystemExit("hf_import_ref: source tensors must be F32")


def bf16_bytes(x):
    u = x.astype("<f4").view("<u4").astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    r[nan] = ((u[nan] >> 16) | 0x40).astype("<u2")
    return r.tobytes()


def write(src, dst, variant):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    cfg = json.load(open(os.path.join(src, "config.json")))
    t = read_checkpoint(src)
    names = list(t.keys())
    tensors = [(n, t[n][0], t[n][1], t[n][2]) for n in names]
    st = os.path.join(dst, "model.safetensors")
    if variant in ("f16", "bf16"):
        conv = []
        for n, dt, shape, data in tensors:
            x = as_f32(dt, shape, data)
            if variant == "f16":
                conv.append((n, "F16", shape, x.astype("<f2").tobytes()))
            else:
                conv.append((n, "BF16", shape, bf16_bytes(x)))
        write_file(st, conv, {"format": "pt"})
    elif variant == "sharded":
        k = (len(tensors) + 2) // 3
        wm = {}
        for i in range(3):
            part = tensors[i * k:(i + 1) * k]
            fn = "model-%05d-of-00003.safetensors" % (i + 1)
            write_file(os.path.join(dst, fn), part, {"format": "pt"})
            for p in part:
                wm[p[0]] = fn
        json.dump({"metadata": {"total_size": sum(len(p[3]) for p in tensors)}, "weight_map": wm},
                  open(os.path.join(dst, "model.safetensors.index.json"), "w"))
    elif variant == "bias":
        d = cfg["hidden_size"]
        write_file(st, tensors + [("model.layers.0.self_attn.q_proj.bias", "F32", (d,),
                                   np.zeros(d, "<f4").tobytes())])
    elif variant == "tied-lm-head":
        cfg["tie_word_embeddings"] = True
        e = t["model.embed_tokens.weight"]
        write_file(st, [x for x in tensors if x[0] != "lm_head.weight"] +
                   [("lm_head.weight", e[0], e[1], e[2])])
    elif variant == "untied-no-lm-head":
        cfg["tie_word_embeddings"] = False
        write_file(st, [x for x in tensors if x[0] != "lm_head.weight"])
    elif variant == "missing":
        write_file(st, [x for x in tensors if x[0] != "model.layers.1.mlp.up_proj.weight"])
    elif variant == "misshapen":
        write_file(st, [(n, dt, (shape[1], shape[0]) if n.endswith("mlp.up_proj.weight") else shape,
                         data) for n, dt, shape, data in tensors])
    elif variant == "int32":
        write_file(st, [(n, "I32" if n == "model.norm.weight" else dt, shape, data)
                        for n, dt, shape, data in tensors])
    elif variant == "extra":
        write_file(st, tensors + [("model.layers.0.self_attn.q_norm.weight", "F32", (4,),
                                   np.ones(4, "<f4").tobytes())])
    elif variant in ("truncated", "overlap", "header-beyond"):
        write_file(st, tensors)
        raw = open(st, "rb").read()
        if variant == "truncated":
            raw = raw[:len(raw) - 100]
        elif variant == "header-beyond":
            raw = struct.pack("<Q", len(raw)) + raw[8:]
        else:
            (n,) = struct.unpack("<Q", raw[:8])
            h = json.loads(raw[8:8 + n])
            a, b = names[0], names[1]
            h[b]["data_offsets"] = [h[a]["data_offsets"][0],
                                    h[a]["data_offsets"][0] + (h[b]["data_offsets"][1] -
                                                               h[b]["data_offsets"][0])]
            text = json.dumps(h).encode()
            text += b" " * (-len(text) % 8)
            raw = struct.pack("<Q", len(text)) + text + raw[8 + n:]
        open(st, "wb").write(raw)
    elif variant in ("index-escape", "index-missing"):
        write("%s" % src, dst, "sharded")
        ip = os.path.join(dst, "model.safetensors.index.json")
        index = json.load(open(ip))
        victim = "model.norm.weight"
        if variant == "index-escape":
            index["weight_map"][victim] = "../outside.safetensors"
        else:
            other = [f for f in sorted(set(index["weight_map"].values()))
                     if f != index["weight_map"][victim]][0]
            index["weight_map"][victim] = other
        json.dump(index, open(ip, "w"))
    elif variant == "pytorch-only":
        open(os.path.join(dst, "pytorch_model.bin"), "wb").write(b"\0" * 64)
    elif variant.startswith("config:"):
        key, val = variant[7:].split("=", 1)
        if val == "DELETE":
            cfg.pop(key, None)
        else:
            cfg[key] = json.loads(val)
        shutil.copy(os.path.join(src, "model.safetensors"), st)
    else:
        raise SystemExit("hf_import_ref: unknown variant %s" % variant)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)


def same_tensors(a, b):
    x, y = read_checkpoint(a), read_checkpoint(b)
    bad = 0
    if sorted(x) != sorted(y):
        print("names differ: %s" % sorted(set(x) ^ set(y)))
        return 1
    for n in sorted(x):
        if x[n][0] != y[n][0] or x[n][1] != y[n][1] or x[n][2] != y[n][2]:
            print("tensor %s differs (%s %s vs %s %s)" % (n, x[n][0], x[n][1], y[n][0], y[n][1]))
            bad += 1
    print("%d tensors: %s" % (len(x), "identical bytes" if not bad else "%d differ" % bad))
    return 1 if bad else 0


def same_params(a, b, rnd):
    from snapread import open_snapshot
    fa, _ = open_snapshot(a)
    fb, _ = open_snapshot(b)
    ka, kb = sorted(fa["param"].keys()), sorted(fb["param"].keys())
    if ka != kb:
        print("parameter names differ")
        return 1
    if "adam_m/" + kb[0] in fb:
        print("%s holds Adam moments: not a weights-only snapshot" % b)
        return 1
    bad = 0
    for k in ka:
        x = np.asarray(fa["param/" + k][...], dtype=np.float32)
        if rnd == "f16":
            x = x.astype(np.float16).astype(np.float32)
        elif rnd == "bf16":
            x = np.frombuffer(bf16_bytes(x), dtype="<u2").astype(np.uint32)
            x = (x << 16).view(np.float32).reshape(fa["param/" + k][...].shape)
        y = np.asarray(fb["param/" + k][...], dtype=np.float32)
        if x.shape != y.shape or not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
            print("param/%s differs" % k)
            bad += 1
    print("%d parameter tensors: %s" % (len(ka), "bit for bit" if not bad else "%d differ" % bad))
    return 1 if bad else 0


def transformers_models(d):
    """Random LlamaForCausalLM checkpoints written by transformers."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                rms_norm_eps=1e-5, rope_theta=500000.0, initializer_range=0.1,
                # original_max_position_embeddings 8 < seq_len 32: every
                # frequency is scaled or interpolated, none left as is
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                bos_token_id=1, eos_token_id=2)
    for name, extra in (("tied", {"tie_word_embeddings": True}),
                        ("untied", {"tie_word_embeddings": False}),
                        ("bias", {"tie_word_embeddings": False, "attention_bias": True})):
        model = LlamaForCausalLM(LlamaConfig(**dict(base, **extra)))
        with torch.no_grad():
            # the norms' weights start at 1: made random too, so that
            # swapping two of them changes the loss
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.copy_(1 + 0.2 * torch.randn_like(p))
        model.save_pretrained(os.path.join(d, name), safe_serialization=True,
                              max_shard_size="200KB")
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=1,
                               n_head=2)).save_pretrained(os.path.join(d, "gpt2"),
                                                          safe_serialization=True)
    for name in ("tied", "untied", "bias", "gpt2"):
        files = sorted(f for f in os.listdir(os.path.join(d, name)) if "safetensors" in f)
        print("transformers %s wrote %s: %s" % (__import__("transformers").__version__, name,
                                                " ".join(files)))
    return 0


def main():
    a = sys.argv[1:]
    if a[:1] == ["write"] and len(a) == 4:
        write(a[1], a[2], a[3])
        return 0
    if a[:1] == ["same-tensors"] and len(a) == 3:
        return same_tensors(a[1], a[2])
    if a[:1] == ["same-params"] and len(a) in (3, 5):
        return same_params(a[1], a[2], a[4] if len(a) == 5 else None)
    if a[:1] == ["transformers"] and len(a) == 2:
        return transformers_models(a[1])
    print(__doc__ if __doc__ else "usage: see the top of this file")
    return 99


if __name__ == "__main__":
    sys.exit(main())
