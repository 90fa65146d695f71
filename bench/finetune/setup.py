# bench/finetune/run.sh's inputs, made here (no download): in DIR,
#   corpus/a.jsonl, corpus/b.jsonl   two small corpora of different text;
#   hf/    a random LLaMA-3-shaped LlamaForCausalLM saved by transformers
#          (128,256-token vocabulary, grouped-query attention 4/2, tied
#          embeddings, rope_theta 500000, the llama3 rope_scaling; sharded)
#          with a tokenizer.json: a byte-level BPE trained on the corpora,
#          padded to 128,000 tokens, then LLaMA 3's 256 special tokens at
#          128,000.. (EOS <|end_of_text|> = 128,001: the token files need
#          32-bit ids);
#   big/   a 357 MiB BF16 checkpoint (vocabulary 32,000, d_model 1024, 8
#          layers, GQA 16/4), written with numpy, for the import's memory.
#   python3 bench/finetune/setup.py DIR
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM


def corpora(d):
    a = ["Line %d: the %d quick brown foxes jump over %d lazy dogs." % (i, i * 7 % 13, i * i % 97)
         for i in range(3000)]
    b = ["Item %d costs %d.%02d euros in shop %d, says the list of %d." % (i, i % 50, i * 13 % 100,
                                                                          i % 7, i * 3)
         for i in range(3000)]
    os.makedirs(os.path.join(d, "corpus"), exist_ok=True)
    for name, lines in (("a", a), ("b", b)):
        with open(os.path.join(d, "corpus", name + ".jsonl"), "w") as f:
            for i in range(0, len(lines), 5):
                f.write(json.dumps({"text": " ".join(lines[i:i + 5])}) + "\n")
    return a + b


def tokenizer(d, lines):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel()
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    for i in range(len(vocab), 128000):
        vocab["<|reserved_%d|>" % i] = i
    names = ["<|begin_of_text|>", "<|end_of_text|>"] + ["<|reserved_special_%d|>" % r
                                                        for r in range(254)]
    j["added_tokens"] = [{"id": 128000 + k, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for k, c in enumerate(names)]
    path = os.path.join(d, "hf", "tokenizer.json")
    with open(path, "w") as f:
        json.dump(j, f)
    assert Tokenizer.from_file(path).get_vocab_size() == 128256


def llama3(d):
    torch.manual_seed(3)
    m = LlamaForCausalLM(LlamaConfig(
        vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 8},
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
        initializer_range=0.05))
    m.save_pretrained(os.path.join(d, "hf"), max_shard_size="10MB")


def big(d):
    V, C, L, H, KV, F = 32000, 1024, 8, 16, 4, 4096
    hd = C // H
    out = os.path.join(d, "big")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
                   "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
                   "num_attention_heads": H, "num_key_value_heads": KV,
                   "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                   "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"}, f)
    shapes = [("model.embed_tokens.weight", (V, C)), ("model.norm.weight", (C,)),
              ("lm_head.weight", (V, C))]
    for l in range(L):
        p = "model.layers.%d." % l
        shapes += [(p + "input_layernorm.weight", (C,)),
                   (p + "post_attention_layernorm.weight", (C,)),
                   (p + "self_attn.q_proj.weight", (C, C)),
                   (p + "self_attn.k_proj.weight", (KV * hd, C)),
                   (p + "self_attn.v_proj.weight", (KV * hd, C)),
                   (p + "self_attn.o_proj.weight", (C, C)), (p + "mlp.gate_proj.weight", (F, C)),
                   (p + "mlp.up_proj.weight", (F, C)), (p + "mlp.down_proj.weight", (C, F))]
    rng = np.random.default_rng(0)
    half, wm = len(shapes) // 2, {}
    for i, part in enumerate((shapes[:half], shapes[half:])):
        fn = "model-%05d-of-00002.safetensors" % (i + 1)
        header, off = {}, 0
        for n, s in part:
            size = 2 * int(np.prod(s))
            header[n] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + size]}
            off += size
            wm[n] = fn
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(out, fn), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for n, s in part:
                x = (rng.standard_normal(int(np.prod(s)), dtype=np.float32) * 0.02)
                f.write((x.view(np.uint32) >> 16).astype("<u2").tobytes())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)


def main():
    d = sys.argv[1]
    for sub in ("hf", "big"):
        shutil.rmtree(os.path.join(d, sub), ignore_errors=True)
    lines = corpora(d)
    llama3(d)
    tokenizer(d, lines)
    big(d)


if __name__ == "__main__":
    main()
