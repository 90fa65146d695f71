#!/usr/bin/python3
"""Write the seed corpus of tests/fuzz/fuzz_index.c: valid snapshot indexes
(the parser accepts each) in the harness's record encoding (see the comment
at the top of fuzz_index.c).  Run from the source tree:

    /usr/bin/python3 tests/fuzz/index_seeds.py tests/fuzz/corpus/index
"""
import os
import sys

OBJECTS = ["format", "format_version", "step", "consumed_samples", "seed", "rng_counter",
           "config_json", "train_json", "plan_json", "n_tensors", "n_blocks", "n_shards",
           "shards", "shard_bytes", "tensors", "tensor_ndim", "tensor_shape",
           "tensor_first_block", "tensor_n_blocks", "block_shard", "block_offset",
           "block_extent", "block_addr", "block_crc32c"]
I32, I64, U64, U32, F64, VSTR, FSTR = range(7)
MAXDIM = 4


def varint(v):
    u = (v << 1) ^ (v >> 63) if v < 0 else v << 1
    u &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        out.append(b | (0x80 if u else 0))
        if not u:
            return bytes(out)


def record(name, typ, values, rows=None, cols=0, fixed=None):
    """rows None: a scalar attribute (one value)."""
    out = bytearray([OBJECTS.index(name), typ])
    if typ == FSTR:
        out.append(fixed - 1)
    r = 0 if rows is None else rows
    out += bytes([r, cols])
    n = max(r, 1) * max(cols, 1)
    vals = list(values) + [0 if typ not in (VSTR, FSTR) else ""] * (n - len(values))
    for v in vals[:n]:
        if typ in (VSTR, FSTR):
            b = v.encode()
            out.append(len(b))
            out += b
        else:
            out += varint(int(v))
    return bytes(out)


def pad(dims, fill):
    return list(dims) + [fill] * (MAXDIM - len(dims))


def index(tensors, shards, step=3, fixed_format=False, plan=True):
    """tensors: [(name, shape, [(offset, extent, shard, addr)])] in name order."""
    blocks = [b for _, _, bl in tensors for b in bl]
    out = bytearray()
    if fixed_format:
        out += record("format", FSTR, ["malleus-snapshot"], fixed=16)
    else:
        out += record("format", VSTR, ["malleus-snapshot"])
    out += record("format_version", I32, [2])
    out += record("step", I64, [step])
    out += record("consumed_samples", I64, [8 * step])
    out += record("seed", U64, [1234])
    out += record("rng_counter", U64, [0])
    out += record("config_json", VSTR, ['{"vocab":256,"d_model":8}'])
    out += record("train_json", VSTR, ['{"lr":0.001}'])
    if plan:
        out += record("plan_json", VSTR, ['{"format":"malleus-plan/1"}'])
    out += record("n_tensors", I64, [len(tensors)])
    out += record("n_blocks", I64, [len(blocks)])
    out += record("n_shards", I64, [len(shards)])
    out += record("shards", VSTR, [s for s, _ in shards], rows=len(shards))
    out += record("shard_bytes", U64, [b for _, b in shards], rows=len(shards))
    out += record("tensors", VSTR, [t for t, _, _ in tensors], rows=len(tensors))
    out += record("tensor_ndim", I32, [len(s) for _, s, _ in tensors], rows=len(tensors))
    out += record("tensor_shape", I64, [v for _, s, _ in tensors for v in pad(s, 1)],
                  rows=len(tensors), cols=MAXDIM)
    first, firsts = 0, []
    for _, _, bl in tensors:
        firsts.append(first)
        first += len(bl)
    out += record("tensor_first_block", I64, firsts, rows=len(tensors))
    out += record("tensor_n_blocks", I64, [len(bl) for _, _, bl in tensors], rows=len(tensors))
    out += record("block_shard", I32, [b[2] for b in blocks], rows=len(blocks))
    out += record("block_offset", I64, [v for b in blocks for v in pad(b[0], 0)],
                  rows=len(blocks), cols=MAXDIM)
    out += record("block_extent", I64, [v for b in blocks for v in pad(b[1], 1)],
                  rows=len(blocks), cols=MAXDIM)
    out += record("block_addr", U64, [b[3] for b in blocks], rows=len(blocks))
    out += record("block_crc32c", U32, [0x1234567 + i for i in range(len(blocks))],
                  rows=len(blocks))
    return bytes(out)


SEEDS = {
    # one matrix, split by rows over two shards (two data-parallel writers)
    "two_shards": index([("param/w", [4, 6], [([0, 0], [2, 6], 0, 2048),
                                              ([2, 0], [2, 6], 1, 2048)])],
                        [("shard_00000.h5", 4096), ("shard_00001.h5", 4096)]),
    # vectors, a 3-D tensor split by its last dimension (tensor parallel), one shard
    "three_tensors": index([("a", [8], [([0], [8], 0, 0)]),
                            ("b/c", [2, 4, 4], [([0, 0, 0], [2, 4, 2], 0, 32),
                                                ([0, 0, 2], [2, 4, 2], 0, 96)]),
                            ("d", [3, 5], [([0, 0], [3, 5], 0, 160)])],
                           [("shard_00000.h5", 4096)], step=7),
    # meta only: no tensor, block or shard
    "empty": index([], [], step=0, plan=False),
    # the format as a fixed-length string, as other tools write strings
    "fixed_string": index([("x", [2, 2], [([0, 0], [2, 2], 0, 0)])],
                          [("s.h5", 16)], fixed_format=True),
}

if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/index"
    os.makedirs(out_dir, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
