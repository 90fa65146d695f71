/* libFuzzer harness: the safetensors parsers (ckpt/safetensors.c), which
 * read Hugging Face checkpoints for malleus-import and malleus-train
 * --init-from.  The first byte picks the parser: even, a file -- bytes 1..8
 * are the file's size (little endian, reduced below 2^40), the rest is its
 * first 8 bytes and header JSON, as mal_hf_open reads them (the length
 * checked by mal_st_header_length, then the JSON parsed); odd, a
 * model.safetensors.index.json.  Whatever a parser accepts must keep the
 * header's promises: every tensor's bytes inside the file after the
 * header, its size its shape's elements times its dtype's, no two
 * overlapping, names unique, sorted and found; every index entry naming a
 * plain *.safetensors file of its list. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_header(const mal_st_header *h, uint64_t file_bytes)
{
    if (h->n < 0 || (h->n > 0 && !h->t) || h->file_bytes != file_bytes) abort();
    for (int i = 0; i < h->n; i++) {
        const mal_st_tensor *t = &h->t[i];
        if (t->ndim < 0 || t->ndim > MAL_ST_MAX_NDIM || t->esize < 1 || t->esize > 8) abort();
        if (t->begin < h->data_start || t->end < t->begin || t->end > file_bytes) abort();
        uint64_t elems = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) abort();
            /* the parser refused any product that overflows */
            if (t->shape[d] && elems > UINT64_MAX / (uint64_t)t->shape[d]) abort();
            elems *= (uint64_t)t->shape[d];
        }
        if (elems > UINT64_MAX / (uint64_t)t->esize || t->end - t->begin != elems * t->esize)
            abort();
        if (i > 0 && strcmp(h->t[i - 1].name, t->name) >= 0) abort();
        if (mal_st_find(h, t->name) != t) abort();
        /* an empty tensor shares no byte with any other */
        for (int j = 0; j < i; j++) {
            const mal_st_tensor *u = &h->t[j];
            if (t->begin < t->end && u->begin < u->end && t->begin < u->end && u->begin < t->end)
                abort();
        }
    }
}

static void check_index(const mal_st_index *x)
{
    for (int f = 0; f < x->n_files; f++) {
        const char *s = x->files[f];
        size_t n = strlen(s), k = strlen(".safetensors");
        if (strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..") || n <= k ||
            strcmp(s + n - k, ".safetensors"))
            abort();
    }
    for (int i = 0; i < x->n; i++) {
        if (x->file[i] < 0 || x->file[i] >= x->n_files) abort();
        if (strlen(x->names[i]) == 0 || strlen(x->names[i]) > MAL_ST_MAX_NAME) abort();
        if (i > 0 && strcmp(x->names[i - 1], x->names[i]) >= 0) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] & 1) {
        if (size - 1 > MAL_ST_MAX_INDEX_BYTES) return 0;
        mal_st_index x;
        if (mal_st_parse_index((const char *)data + 1, size - 1, "fuzz", &x)) return 0;
        check_index(&x);
        mal_st_index_fini(&x);
        return 0;
    }
    if (size < 1 + 8 + 8) return 0;
    uint64_t file_bytes = 0;
    for (int k = 8; k >= 1; k--)
        file_bytes = file_bytes << 8 | data[k];
    file_bytes &= ((uint64_t)1 << 40) - 1;
    const unsigned char *img = data + 9;
    size_t len = size - 9;
    uint64_t n;
    if (mal_st_header_length(img, file_bytes, "fuzz", &n)) return 0;
    if (n > MAL_ST_MAX_HEADER_BYTES || 8 + n > file_bytes) abort();
    /* the reader reads the N header bytes from the file: those the input
     * holds, the rest of the header missing (a short read: not parsed) */
    if (n > len - 8) return 0;
    mal_st_header h;
    if (mal_st_parse_header((const char *)img + 8, (size_t)n, file_bytes, "fuzz", &h)) return 0;
    if (h.data_start != 8 + n) abort();
    check_header(&h, file_bytes);
    mal_st_header_fini(&h);
    return 0;
}
