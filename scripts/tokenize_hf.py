#!/usr/bin/env python3
"""Tokenize text for malleus-train with a Hugging Face tokenizer.json.

    scripts/tokenize_hf.py --tokenizer TOK OUT_PREFIX INPUT...
    scripts/tokenize_hf.py --tokenizer TOK --encode TEXT

TOK is a tokenizer.json, or a directory holding one (a Hugging Face model
directory: its tokenizer_config.json and special_tokens_map.json, when
there, are recorded too, so that malleus-export copies them).  Each INPUT is
a text file (one document per file, or per paragraph / line with
--text-docs) or a JSON Lines file (.jsonl, .jsonl.gz or .json: one document
per line, its --json-key field, "text" by default); "-" reads text from
standard input.

Writes, each atomically (a temporary file renamed into place):

  OUT_PREFIX.bin          the tokens of every document back to back, each
                          document followed by the EOS token
  OUT_PREFIX.idx          Megatron-LM's index (MMIDIDX version 1, one
                          sequence per document): the pair is a Megatron
                          indexed dataset, which malleus-train (--data
                          OUT_PREFIX), Megatron-LM and GPT-NeoX read as is
  OUT_PREFIX.tokens.json  the record malleus-train reads beside the data:
                          token count, documents, the largest id (checked
                          against the model's vocabulary before training),
                          dtype, and the tokenizer -- its absolute path,
                          size and CRC-32 (zlib's), vocabulary size and EOS
                          -- which snapshots carry on, so that
                          malleus-export copies the tokenizer next to the
                          model and malleus-sample decodes with it.

Token dtype: uint16 when the vocabulary has fewer than 65,500 tokens, else
int32 (Megatron's rule), or --dtype.  The EOS token: --eos, else the
tokenizer_config.json's eos_token, else the first of <|endoftext|>,
<|end_of_text|>, </s>, <eos> in the vocabulary.  Memory: one batch of
documents (--batch) and two integers per document.

--encode TEXT prints TEXT's token ids (no EOS), e.g. for malleus-sample's
--prompt, which takes ids when the vocabulary is not byte-level.

Needs the `tokenizers` package (PyPI; python3 -m pip install tokenizers) and
numpy.  Exit status: 0 done, 1 failure, 2 bad usage or input.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import tempfile
import zlib

EOS_GUESSES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
RECORD_FORMAT = "malleus-tokens/1"
IDX_CODES = {"uint16": 8, "int32": 4}


class Usage(Exception):
    """Bad usage or input: exit status 2."""


def find_tokenizer(path):
    """(tokenizer.json, tokenizer_config.json or None, special_tokens_map.json or None)."""
    if os.path.isdir(path):
        tok = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tok):
            raise Usage("%s holds no tokenizer.json" % path)
        side = os.path.dirname(tok)
    elif os.path.isfile(path):
        tok, side = path, os.path.dirname(path)
    else:
        raise Usage("tokenizer %s does not exist" % path)

    def beside(name):
        p = os.path.join(side, name)
        return os.path.abspath(p) if os.path.isfile(p) else None

    return os.path.abspath(tok), beside("tokenizer_config.json"), beside("special_tokens_map.json")


def file_identity(path):
    """(size in bytes, CRC-32 as zlib computes it): what malleus-export checks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc & 0xFFFFFFFF


def choose_eos(tok, explicit, config):
    if explicit is not None:
        name = explicit
    else:
        name = None
        if config:
            eos = json.load(open(config, encoding="utf-8")).get("eos_token")
            name = eos.get("content") if isinstance(eos, dict) else eos
        if name is None:
            name = next((g for g in EOS_GUESSES if tok.token_to_id(g) is not None), None)
        if name is None:
            raise Usage("cannot tell the tokenizer's end-of-text token: name it with --eos")
    eos_id = tok.token_to_id(name)
    if eos_id is None:
        raise Usage("the EOS token %r is not in the tokenizer's vocabulary" % name)
    return name, eos_id


def documents(paths, text_docs, json_key):
    """Yield the text of every document, in order."""
    for path in paths:
        if path == "-":
            yield from split_text(sys.stdin.read(), text_docs)
            continue
        if not os.path.isfile(path):
            raise Usage("input %s does not exist or is not a file" % path)
        opener = gzip.open if path.endswith(".gz") else open
        base = path[:-3] if path.endswith(".gz") else path
        if base.endswith(".jsonl") or base.endswith(".json"):
            with opener(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except ValueError as e:
                        raise Usage("%s line %d is not JSON: %s" % (path, n, e))
                    if not isinstance(doc, dict) or not isinstance(doc.get(json_key), str):
                        raise Usage("%s line %d has no text field %r" % (path, n, json_key))
                    yield doc[json_key]
        else:
            with opener(path, "rt", encoding="utf-8") as f:
                yield from split_text(f.read(), text_docs)


def split_text(text, text_docs):
    if text_docs == "file":
        parts = [text]
    elif text_docs == "paragraph":
        parts = text.split("\n\n")
    else:
        parts = text.split("\n")
    for p in parts:
        if p.strip():
            yield p


class AtomicFile:
    """A file written beside its target and renamed over it on commit."""

    def __init__(self, path):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        fd, self.tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=d)
        self.f = os.fdopen(fd, "wb")

    def commit(self):
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)

    def discard(self):
        self.f.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


def tokenize(a, tok, np):
    tok_file, config, special = find_tokenizer(a.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eos_name, eos_id = choose_eos(tok, a.eos, config)
    dtype = a.dtype if a.dtype != "auto" else ("uint16" if vocab < 65500 else "int32")
    if dtype == "uint16" and vocab > 65536:
        raise Usage("a vocabulary of %d tokens does not fit uint16: use --dtype int32" % vocab)
    out_dir = os.path.dirname(os.path.abspath(a.out_prefix))
    if not os.path.isdir(out_dir):
        raise Usage("output directory %s does not exist" % out_dir)

    lengths, max_token, n_tokens = [], -1, 0
    binf = AtomicFile(a.out_prefix + ".bin")
    idxf = recf = None
    try:
        batch = []

        def flush():
            nonlocal max_token, n_tokens
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                ids = enc.ids + ([eos_id] if not a.no_eos else [])
                if not ids:
                    continue
                arr = np.asarray(ids, dtype=np.dtype(dtype).newbyteorder("<"))
                binf.f.write(arr.tobytes())
                lengths.append(len(ids))
                max_token = max(max_token, int(arr.max()))
                n_tokens += len(ids)
            batch.clear()

        for doc in documents(a.inputs, a.text_docs, a.json_key):
            batch.append(doc)
            if len(batch) >= a.batch:
                flush()
        flush()
        if not lengths:
            raise Usage("the inputs hold no document with text")

        # Megatron's index: one sequence per document
        n = len(lengths)
        lens = np.asarray(lengths, dtype="<i4")
        ptrs = np.zeros(n, dtype="<i8")
        ptrs[1:] = np.cumsum(lens[:-1].astype("<i8")) * np.dtype(dtype).itemsize
        idxf = AtomicFile(a.out_prefix + ".idx")
        idxf.f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", IDX_CODES[dtype]))
        idxf.f.write(struct.pack("<QQ", n, n + 1))
        idxf.f.write(lens.tobytes() + ptrs.tobytes() + np.arange(n + 1, dtype="<i8").tobytes())

        size, crc = file_identity(tok_file)
        record = {
            "format": RECORD_FORMAT, "n_tokens": n_tokens, "n_documents": n,
            "max_token": max_token, "dtype": dtype,
            "tokenizer": {"file": tok_file, "bytes": size, "crc32": crc, "vocab_size": vocab,
                          "eos_token": eos_name, "eos_id": eos_id, "config": config,
                          "special_tokens_map": special},
        }
        recf = AtomicFile(a.out_prefix + ".tokens.json")
        recf.f.write((json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        # the .bin first: a reader never sees an index or record of data
        # that is not there yet
        binf.commit()
        idxf.commit()
        recf.commit()
    except BaseException:
        for f in (binf, idxf, recf):
            if f is not None:
                f.discard()
        raise
    print("tokenize_hf: %d documents, %d tokens (max id %d, vocab %d, EOS %r = %d, %s) -> %s.bin, "
          ".idx, .tokens.json" % (n, n_tokens, max_token, vocab, eos_name, eos_id, dtype,
                                  a.out_prefix))


def main():
    ap = argparse.ArgumentParser(
        description="Tokenize text or JSON Lines with a Hugging Face tokenizer.json into a "
                    "Megatron indexed dataset (PREFIX.bin + PREFIX.idx) with document "
                    "boundaries and an EOS token, plus the record malleus-train reads "
                    "(PREFIX.tokens.json).",
        epilog="Example: scripts/tokenize_hf.py --tokenizer hf/llama3 data/web web/*.jsonl; "
               "then malleus-train --data data/web --val-fraction 0.01 ...")
    ap.add_argument("--tokenizer", required=True, metavar="TOK",
                    help="tokenizer.json, or a directory holding one")
    ap.add_argument("--encode", metavar="TEXT", help="print the token ids of TEXT and exit")
    ap.add_argument("out_prefix", nargs="?", metavar="OUT_PREFIX")
    ap.add_argument("inputs", nargs="*", metavar="INPUT",
                    help="text files, .jsonl files (.gz too), or - for standard input")
    ap.add_argument("--json-key", default="text", help="the text field of JSON Lines (text)")
    ap.add_argument("--text-docs", choices=("file", "paragraph", "line"), default="file",
                    help="documents of a text file: the whole file (default), each "
                         "paragraph (blank-line separated) or each line")
    ap.add_argument("--eos", help="the end-of-document token (default: the tokenizer's)")
    ap.add_argument("--no-eos", action="store_true", help="no EOS token after each document")
    ap.add_argument("--dtype", choices=("auto", "uint16", "int32"), default="auto")
    ap.add_argument("--batch", type=int, default=1000, help="documents per encode call")
    a = ap.parse_args()
    try:
        import numpy as np
        from tokenizers import Tokenizer
    except ImportError as e:
        print("tokenize_hf: %s (python3 -m pip install tokenizers numpy)" % e, file=sys.stderr)
        return 1
    try:
        tok_file = find_tokenizer(a.tokenizer)[0]
        try:
            tok = Tokenizer.from_file(tok_file)
        except Exception as e:  # the tokenizers library raises its own exception types
            raise Usage("%s is not a tokenizer.json the tokenizers library reads: %s"
                        % (tok_file, e))
        if a.encode is not None:
            print(" ".join(str(i) for i in tok.encode(a.encode, add_special_tokens=False).ids))
            return 0
        if not a.out_prefix or not a.inputs:
            raise Usage("give OUT_PREFIX and at least one INPUT (or --encode TEXT)")
        if a.batch < 1:
            raise Usage("--batch must be at least 1")
        tokenize(a, tok, np)
    except Usage as e:
        print("tokenize_hf: %s" % e, file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:
        print("tokenize_hf: %s" % e, file=sys.stderr)
        return 2 if isinstance(e, (FileNotFoundError, UnicodeDecodeError)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
