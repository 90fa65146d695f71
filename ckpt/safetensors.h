/* Reading safetensors files (Hugging Face's checkpoint format) as outside
 * input: malleus-import and malleus-train --init-from read checkpoints the
 * user names, so nothing in them is trusted unchecked.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes
 * of JSON ({"__metadata__": {string: string}, NAME: {"dtype": "F32",
 * "shape": [..], "data_offsets": [BEGIN, END]}, ...}), then the tensors'
 * bytes, little-endian, row-major; offsets count from the end of the
 * header.  A sharded checkpoint adds an index, model.safetensors.index.json
 * ({"metadata": {...}, "weight_map": {NAME: FILE}}).
 *
 * The parsers work on bytes in memory and are the fuzz targets
 * (tests/fuzz/fuzz_safetensors.c): the header length is bounded
 * (MAL_ST_MAX_HEADER_BYTES, as the safetensors library's) and checked
 * against the file's size before anything is read or allocated by it;
 * every tensor's dtype is known, its shape's element count times the
 * dtype's size equals its byte range (overflow-checked), every range lies
 * inside the file and no two overlap.  An index names only plain file
 * names (no directory part: a checkpoint cannot make the reader open
 * files outside its directory).  Every function here is Local. */
#ifndef MAL_SAFETENSORS_H
#define MAL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* The most bytes a header's JSON may have (the safetensors library's bound). */
#define MAL_ST_MAX_HEADER_BYTES ((uint64_t)100000000)
/* The most bytes an index file may have. */
#define MAL_ST_MAX_INDEX_BYTES ((size_t)64 << 20)
#define MAL_ST_MAX_NDIM 8
#define MAL_ST_MAX_NAME 255

/* Element types.  Every dtype of the format is parsed (so a file with any
 * of them is described correctly); mal_st_to_f32 converts the first three. */
enum {
    MAL_ST_F32 = 0,
    MAL_ST_F16,
    MAL_ST_BF16,
    MAL_ST_F64,
    MAL_ST_OTHER_INT, /* BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F8_*: never converted */
};

typedef struct {
    char name[MAL_ST_MAX_NAME + 1];
    char dtype_name[12]; /* as written: "F32", "BF16", ... */
    int dtype;           /* MAL_ST_* */
    int esize;           /* bytes per element */
    int ndim;            /* 0 .. MAL_ST_MAX_NDIM */
    int64_t shape[MAL_ST_MAX_NDIM];
    uint64_t begin, end; /* absolute byte range in the file */
} mal_st_tensor;

/* A parsed header; caller-owned storage, mal_st_header_fini frees it. */
typedef struct {
    int n;               /* tensors */
    mal_st_tensor *t;    /* [n], in byte-wise name order */
    uint64_t data_start; /* 8 + N: where the data begins */
    uint64_t file_bytes; /* the size it was checked against */
} mal_st_header;

/* The header length N from the file's first 8 bytes, checked: N at most
 * MAL_ST_MAX_HEADER_BYTES and 8 + N at most `file_bytes`.  MAL_EFORMAT
 * naming `what` otherwise. */
int mal_st_header_length(const unsigned char first8[8], uint64_t file_bytes, const char *what,
                         uint64_t *n);

/* Parse the N = `len` bytes of header JSON of a file of `file_bytes`
 * bytes (len <= MAL_ST_MAX_HEADER_BYTES, 8 + len <= file_bytes, as
 * mal_st_header_length checks) into *out, with every check above.
 * MAL_EFORMAT naming `what` and the tensor or key at fault; MAL_ENOMEM.
 * On failure *out is empty. */
int mal_st_parse_header(const char *json, size_t len, uint64_t file_bytes, const char *what,
                        mal_st_header *out);
void mal_st_header_fini(mal_st_header *h);

/* The tensor `name` of h, or NULL. */
const mal_st_tensor *mal_st_find(const mal_st_header *h, const char *name);

/* A parsed model.safetensors.index.json: for each tensor the file that
 * holds it.  Caller-owned storage, mal_st_index_fini frees it. */
typedef struct {
    int n_files;
    char **files; /* [n_files] distinct plain file names, in order of first use */
    int n;        /* tensors */
    char **names; /* [n] in byte-wise order */
    int *file;    /* [n] index into files */
} mal_st_index;

/* Parse `len` bytes of an index (len <= MAL_ST_MAX_INDEX_BYTES): a JSON
 * object with an object "weight_map" of tensor names (at most
 * MAL_ST_MAX_NAME bytes) to plain file names (no '/', not "." or "..",
 * ending in ".safetensors"), and an optional object "metadata"; other keys
 * are refused.  MAL_EFORMAT naming `what`; MAL_ENOMEM. */
int mal_st_parse_index(const char *json, size_t len, const char *what, mal_st_index *out);
void mal_st_index_fini(mal_st_index *x);

/* Convert n elements of dtype MAL_ST_F32, _F16 or _BF16 (little-endian
 * bytes at src) to float at dst (exact: every F16 and BF16 value is a
 * float).  0, or MAL_EINVAL for another dtype. */
int mal_st_to_f32(const void *src, int dtype, size_t n, float *dst);

#endif /* MAL_SAFETENSORS_H */
