/* libFuzzer harness: the Megatron index parser (src/data_file.c,
 * mal_data_parse_idx: header, dtype code, counts against the length,
 * pointers and document entries against the .bin's size).  The first 8
 * bytes are the .bin's size (little endian, reduced below 2^40), the ninth
 * picks the full check, the rest is the .idx.  Whatever it accepts must lie
 * inside the image, and its sequences must tile the .bin. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 9) return 0;
    uint64_t bin = le64(data) & (((uint64_t)1 << 40) - 1);
    int full = data[8] & 1;
    const unsigned char *img = data + 9;
    size_t len = size - 9;
    mal_data_idx x;
    if (mal_data_parse_idx("fuzz", img, len, bin, full, &x)) return 0;
    if (x.width != 1 && x.width != 2 && x.width != 4) abort();
    if (x.n_seqs > len / 12 || x.docs_at + 8 * (x.n_docs + 1) > len) abort();
    if (x.lengths_at + 4 * x.n_seqs > x.pointers_at || x.pointers_at + 8 * x.n_seqs > x.docs_at)
        abort();
    if (le64(img + x.docs_at) != 0 || le64(img + x.docs_at + 8 * x.n_docs) != x.n_seqs) abort();
    if (full) {
        /* the sequences tile [0, bin) */
        uint64_t at = 0;
        for (uint64_t i = 0; i < x.n_seqs; i++) {
            int32_t l;
            memcpy(&l, img + x.lengths_at + 4 * i, 4);
            if (l < 0 || le64(img + x.pointers_at + 8 * i) != at) abort();
            at += (uint64_t)l * (uint64_t)x.width;
        }
        if (at != bin) abort();
    }
    return 0;
}
