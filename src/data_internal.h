/* The inside of a data set (data.h), shared by the files that build and
 * read it: data.c (opening, the built-in corpus, writing), data_spec.c
 * (what --data names: files, globs, weights), data_file.c (one token file:
 * mapping, formats, reading tokens), data_sample.c (parts, windows, the
 * blend's pattern, sampling).  Nothing outside
 * src/data*.c includes this header. */
#ifndef MAL_DATA_INTERNAL_H
#define MAL_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/fileio.h"
#include "data.h"
#include "data_synth.h"

/* One token file, mapped read-only (or, for the built-in corpus, held in
 * memory).  Token i of the file is at tok + i * width, little endian. */
typedef struct {
    char *path;               /* as named (a glob's match) */
    int format;               /* resolved: MAL_DATA_LLMC, RAW16, RAW32, MEGATRON (or MEM) */
    int width;                /* bytes per token: 1, 2 or 4 */
    int is_signed;            /* int8/int16/int32 tokens (Megatron's dtype codes 2-4) */
    mal_file_map map;         /* the whole file (not for MEM) */
    char *idx_path;           /* MEGATRON: the index */
    mal_file_map idx_map;     /* MEGATRON: the whole index, read-only */
    mal_data_idx idx;         /* MEGATRON: its layout */
    unsigned char *mem;       /* MEM: the tokens, owned */
    const unsigned char *tok; /* the first token */
    uint64_t n_tokens;        /* tokens in the file */
    int64_t max_token;        /* the largest id, -1 while unknown (not scanned) */
    int comp;                 /* the blend component it belongs to */
    char *tokenizer;          /* its record's "tokenizer" object as JSON text, or NULL */
    uint64_t lo, hi;          /* the tokens of the part read: [lo, hi) */
    uint64_t win0, n_win;     /* epochs: its windows within its component */
} mal_data_file;

/* A blend component: the files of one --data item, read as one. */
typedef struct {
    double weight;  /* its share of the samples (the weights add up to 1) */
    int first_file; /* its files: first_file .. first_file + n_files - 1 */
    int n_files;
    uint64_t n_windows; /* epochs: the windows of its files */
    uint32_t n_slots;   /* epochs, in a blend: its slots in the pattern */
} mal_data_comp;

enum { MAL_DATA_MEM = 100 }; /* a file's format: tokens generated in memory */

struct mal_data {
    char *name;           /* the spec as given, or the built-in corpus's name */
    mal_data_file *files; /* [n_files] */
    int n_files;
    mal_data_comp *comps; /* [n_comps] */
    int n_comps;
    uint64_t n_tokens; /* of the parts read, over all files */
    int sampling;      /* MAL_DATA_SAMPLE_RANDOM or EPOCHS */
    int seq_len;       /* T of the windows (epochs) */
    int64_t batch;     /* samples per step (epochs) */
    int part;          /* MAL_DATA_PART_* */
    double val_fraction;
    uint16_t *blend_comp, *blend_rank; /* epochs, blend: [MAL_DATA_BLEND_SLOTS] */
    int vocab;             /* > 0: every token read is checked against it (check_vocab) */
    const char *tokenizer; /* the files' tokenizer (a file's string), or NULL */
    int synth_vocab;       /* > 0: synthetic data (data_synth.h), no files */
};

/* What --data names (data_spec.c): n_files paths in order, the component of
 * each (a component's files are consecutive), and each component's weight
 * as a share of the whole.  Caller-owned; mal_data_spec_fini releases it. */
typedef struct {
    char **paths; /* [n_files] */
    int *comp_of; /* [n_files] */
    int n_files;
    double *weights; /* [n_comps] */
    int n_comps;
} mal_data_spec;

/* Local.  Parse `spec` (data.h: items PATH[:WEIGHT] separated by commas,
 * PATH a file or a glob) into *s.  MAL_EINVAL naming the item for a weight
 * that is not a positive finite number, or for weights on some items and
 * not others; MAL_ENOENT for a glob that matches nothing. */
int mal_data_spec_parse(mal_data_spec *s, const char *spec);
void mal_data_spec_fini(mal_data_spec *s);

/* Local.  Open one token file: map it, parse its header in `format`
 * (MAL_DATA_AUTO: llm.c when a magic says so, else raw16).  On failure
 * *f is released.  f->max_token is -1 (scan_file fills it). */
int mal_data_file_open(mal_data_file *f, const char *path, int format);

/* Local.  Read the record beside the opened file `f`, when there is one
 * (data.h, MAL_DATA_RECORD_SUFFIX): its token count must be the file's
 * (MAL_EFORMAT naming the record when it is stale), its largest id becomes
 * f->max_token (no scan needed), its tokenizer object f->tokenizer. */
int mal_data_file_record(mal_data_file *f);

/* Local.  Release everything `f` holds (safe on a zeroed one). */
void mal_data_file_close(mal_data_file *f);

/* Local.  Read every token of `f` once for its largest id (through the
 * mapping, then dropped from the resident set again), and check them:
 * MAL_EFORMAT naming the file for an id that is not a token (negative). */

int mal_data_file_scan(mal_data_file *f);

/* Local.  Lay out the parts, windows and blend pattern of an opened data
 * set (data_sample.c); MAL_EINVAL naming the file when a component has no
 * window to read, or a blend weight is too small to get a slot. */
int mal_data_layout(mal_data *d);

/* Local, pure.  Little-endian uint64 at p. */
static inline uint64_t mal_data_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

/* Local, pure.  The first token of document k (0 <= k <= n_docs; n_docs
 * gives n_tokens) of a Megatron file. */
uint64_t mal_data_doc_start(const mal_data_file *f, uint64_t k);

/* Local, pure.  Token i (< n_tokens) of `f` (negative for a negative id of
 * a signed file: not a token). */
static inline int64_t mal_data_file_token(const mal_data_file *f, uint64_t i)
{
    const unsigned char *p = f->tok + i * (uint64_t)f->width;
    switch (f->width) {
    case 1:
        return f->is_signed ? (int64_t)(int8_t)p[0] : p[0];
    case 2: {
        uint16_t v = (uint16_t)(p[0] | p[1] << 8);
        return f->is_signed ? (int64_t)(int16_t)v : v;
    }
    default: {
        uint32_t v =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        return f->is_signed ? (int64_t)(int32_t)v : v;
    }
    }
}

#endif /* MAL_DATA_INTERNAL_H */
