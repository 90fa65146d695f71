"""Make the committed tokenizer fixtures (run by hand; needs the tokenizers
package): two small tokenizers trained here on generated text, in the two
families malleus-sample decodes -- byte-level BPE (GPT-2, LLaMA-3) and
SentencePiece-style BPE with byte fallback (LLaMA-2: Metaspace-like
normalizer, decoder Sequence[Replace, ByteFallback, Fuse, Strip]) -- and
expected.json: id sequences and the text the tokenizers library decodes
them to, which tests/test_tokenizer checks the C decoder against.

    PYTHONPATH=DIR_WITH_TOKENIZERS python3 tests/tokenizers/make_fixtures.py tests/tokenizers
"""
import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

TEXT = ["The cat sat on the mat. Seven plus five is twelve.\n",
        "Ünïcödé: café, naïve, 日本語, emoji 🙂 and tabs\tand\nnewlines.",
        "q: what is 3 + 4? a: seven. name: Ada; age: 36; city: Zürich."]


def corpus(n):
    rng = random.Random(7)
    return [" ".join(rng.choice(TEXT) for _ in range(3)) for _ in range(n)]


def bytelevel():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=420, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(300), tr)
    return tok


def metaspace():
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    bytes_ = ["<0x%02X>" % b for b in range(256)]
    tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"] + bytes_)
    tok.train_from_iterator(corpus(300), tr)
    return tok


def main():
    out = sys.argv[1]
    rng = random.Random(11)
    expected = []
    for name, tok in (("bytelevel.json", bytelevel()), ("metaspace.json", metaspace())):
        tok.save(os.path.join(out, name))
        cases = [tok.encode(t).ids for t in TEXT]
        # random ids too, kept to those that decode to valid UTF-8 (the
        # library replaces a broken sequence by U+FFFD; malleus-sample
        # passes the bytes through for the terminal to show)
        while len(cases) < len(TEXT) + 20:
            ids = [rng.randrange(tok.get_vocab_size()) for _ in range(rng.randrange(1, 30))]
            text = tok.decode(ids, skip_special_tokens=False)
            if "\ufffd" not in text and "\x00" not in text:  # no NUL in a C string
                cases.append(ids)
        for ids in cases:
            expected.append({"tokenizer": name, "ids": ids,
                             "text": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in expected) + "\n]\n")


if __name__ == "__main__":
    main()
