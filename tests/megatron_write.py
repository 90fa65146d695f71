"""Write a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) with numpy,
in the layout of Megatron's IndexedDatasetBuilder (one sequence per
document), for the tests: an independent writer of what Malleus reads.

    megatron_write.py PREFIX DTYPE N_DOCS SEED [VOCAB]

DTYPE is a numpy name (uint16, int32, uint8, ...); documents are 1..200
random tokens below VOCAB (default 256), each ending with token 0 (EOS).
Prints the number of tokens written."""
import struct
import sys

import numpy as np

CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5,
         "float64": 6, "float32": 7, "uint16": 8}


def write(prefix, dtype, docs):
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.zeros(len(docs), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * np.dtype(dtype).itemsize
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<QQ", len(docs), len(docs) + 1))
        f.write(lengths.tobytes() + pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    return int(lengths.sum())


def main():
    prefix, dtype, n_docs, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    vocab = int(sys.argv[5]) if len(sys.argv) > 5 else 256
    rng = np.random.default_rng(seed)
    docs = [np.append(rng.integers(1, vocab, int(rng.integers(1, 200))), 0) for _ in range(n_docs)]
    print(write(prefix, dtype, docs))


if __name__ == "__main__":
    main()
