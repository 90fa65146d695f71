/* Hugging Face tokenizers on the C side: which tokenizer a data set was
 * made with (its reference, recorded beside the data by
 * scripts/tokenize_hf.py and carried on in snapshots), whether a file on
 * disk is still that tokenizer (size and CRC-32), and decoding token ids
 * to text with its tokenizer.json.
 *
 * Encoding text is left to the `tokenizers` library (the script): BPE
 * merges behind Unicode-aware pre-tokenizer patterns are a library, and
 * data preparation is offline.  Decoding is a table from id to bytes plus
 * the decoder's few rules, small enough to do here, so malleus-sample
 * prints text wherever it runs, Python or not.  Supported: BPE and Unigram
 * vocabularies, added tokens, and the decoders ByteLevel (GPT-2, LLaMA-3),
 * Metaspace, and Sequence of Replace / ByteFallback / Fuse / Strip
 * (LLaMA-2); anything else is refused by name. */
#ifndef MAL_TOKENIZER_H
#define MAL_TOKENIZER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The tokenizer a data set names (the "tokenizer" object of its record,
 * data.h; the same object in a snapshot's training settings).  Strings
 * are owned by the reference. */
typedef struct {
    char *file;      /* tokenizer.json, absolute path */
    char *config;    /* tokenizer_config.json beside it, or NULL */
    char *special;   /* special_tokens_map.json beside it, or NULL */
    char *eos_token; /* the end-of-document token, or NULL */
    uint64_t bytes;  /* tokenizer.json's size ... */
    uint32_t crc32;  /* ... and CRC-32 (zlib's polynomial): its identity */
    int vocab_size;
    int eos_id; /* -1: none */
} mal_tokenizer_ref;

/* Local.  Read a reference from the JSON object `obj` (`where` names it in
 * messages): "file", "bytes", "crc32" required, "config",
 * "special_tokens_map", "eos_token", "eos_id", "vocab_size" optional.
 * MAL_EFORMAT for a missing or mistyped field.  *r is the caller's
 * (mal_tokenizer_ref_fini), zeroed on failure. */
int mal_tokenizer_ref_parse(mal_tokenizer_ref *r, const json_t *obj, const char *where);
void mal_tokenizer_ref_fini(mal_tokenizer_ref *r);

/* Local.  The reference of the tokenizer.json at `path` (a file, or a
 * directory holding tokenizer.json): its size and CRC-32, the config and
 * special-tokens files beside it; vocab_size and eos from the file when it
 * loads (mal_tokenizer_load).  For naming a tokenizer by hand
 * (malleus-export --tokenizer). */
int mal_tokenizer_ref_of(mal_tokenizer_ref *r, const char *path);

/* Local.  1 when two references name the same tokenizer (size and CRC). */
int mal_tokenizer_ref_same(const mal_tokenizer_ref *a, const mal_tokenizer_ref *b);

/* Local.  Check that r->file is still the tokenizer it names: MAL_ENOENT
 * when it is gone, MAL_EMISMATCH when its size or CRC-32 differs (it was
 * changed or replaced since the data was tokenized); messages name the
 * file and say what to do. */
int mal_tokenizer_ref_check(const mal_tokenizer_ref *r);

/* Local.  Size and CRC-32 (zlib's: reflected polynomial 0xEDB88320) of the
 * file at `path`, read in pieces. */
int mal_file_crc32(const char *path, uint64_t *bytes, uint32_t *crc);

/* Local, pure.  CRC-32 of `len` bytes continuing from `crc` (0 to start). */
uint32_t mal_crc32_update(uint32_t crc, const void *buf, size_t len);

/* A tokenizer loaded for decoding; library-owned. */
typedef struct mal_tokenizer mal_tokenizer;

/* Local.  Load `path` (tokenizer.json, or a directory holding one), read
 * with a bound of 256 MiB.  MAL_ENOENT, MAL_EFORMAT (not a tokenizer.json),
 * MAL_ENOTSUP (a model type or decoder not listed above, named). */
int mal_tokenizer_load(mal_tokenizer **out, const char *path);
void mal_tokenizer_destroy(mal_tokenizer *t);

/* Local.  Ids 0 .. n-1 (the largest id + 1 of the vocabulary and the added
 * tokens). */
int mal_tokenizer_vocab_size(const mal_tokenizer *t);

/* Local.  Decode ids[0..n) as the tokenizer's decoder does (special tokens
 * included, as their text), into a malloc'ed NUL-terminated buffer *text of
 * *len bytes (UTF-8, as the tokens make it).  An id without a token is
 * MAL_EINVAL. */
int mal_tokenizer_decode(const mal_tokenizer *t, const int *ids, int n, char **text, size_t *len);

/* Local.  Write the text of ids[0..n) to f, as a continuation of the `done`
 * tokens already written (a leading-space rule applies only at the start of
 * the whole text), for streaming: control bytes but newline and tab as
 * \xNN, so a terminal never receives escape sequences; everything else
 * (UTF-8) as is.  An id the tokenizer does not have (a model's vocabulary
 * may be padded beyond it) prints as [ID]. */
int mal_tokenizer_print(const mal_tokenizer *t, FILE *f, const int *ids, int n, int done);

#endif /* MAL_TOKENIZER_H */
