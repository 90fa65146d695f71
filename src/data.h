/* Token data: loading and writing token files (llm.c format or headerless
 * uint16), the built-in default corpus, and deterministic sampling of training
 * windows.
 *
 * Sampling is a pure function of (seed, step, position in the global batch)
 * and the file: no rank keeps a data-loader cursor.  That is what lets a run
 * change its parallel layout (or world size) mid-training and still see the
 * same global batch at every step; progress is stored as consumed samples.
 *
 * A mal_data is owned by the library (mal_data_open* / mal_data_destroy) and
 * is read-only after opening, so several threads may sample from one object.
 */
#ifndef MAL_DATA_H
#define MAL_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct mal_data mal_data;

enum { MAL_DATA_AUTO = 0, MAL_DATA_LLMC = 1, MAL_DATA_RAW16 = 2 };

/* llm.c token file header: 256 little-endian int32; [0] magic, [1] version,
 * [2] number of uint16 tokens that follow. */
#define MAL_DATA_LLMC_MAGIC 20240520
#define MAL_DATA_LLMC_VERSION 1
#define MAL_DATA_LLMC_HEADER_INTS 256
#define MAL_DATA_LLMC_HEADER_BYTES (4 * MAL_DATA_LLMC_HEADER_INTS)

/* Salt xor-ed into the training seed for data sampling, so that the sample
 * stream is independent of the parameter-initialisation stream that uses the
 * same seed.  Part of the sampling contract: changing it changes every run. */
#define MAL_DATA_SALT 0x5A4D504C45444154ull

/* The seed validation sequences are drawn with, whatever the run's --seed:
 * validation sequence j (j = 0, 1, ...) of a file is
 * mal_data_sample(d, MAL_DATA_VAL_SEED, 0, j, ...), so the validation set
 * is a fixed function of the validation file (and T) alone. */
#define MAL_DATA_VAL_SEED 0x76616C69646174ull

/* Vocabulary size of the byte-level tokenizer and the built-in corpus. */
#define MAL_DATA_BYTE_VOCAB 256

/* Local.  Load the token file `path` into memory.  `format`: MAL_DATA_LLMC
 * (llm.c: 1024-byte header of 256 little-endian int32 {20240520, 1, count,
 * 0...}, then `count` little-endian uint16 tokens), MAL_DATA_RAW16
 * (headerless little-endian uint16, nanoGPT) or MAL_DATA_AUTO (LLMC when the
 * first int32 is the magic, else RAW16).  Everything is validated; failures
 * return, with a message naming the path:
 *   MAL_ENOENT   the file does not exist;
 *   MAL_EIO      it cannot be read (permissions, a directory, read error);
 *   MAL_EFORMAT  empty, wrong magic or version, odd byte count, or more bytes
 *                than the header's token count;
 *   MAL_ECORRUPT fewer bytes than the header's token count (truncated file);
 *   MAL_EINVAL   unknown format.
 * On success *out is a new object the caller releases with mal_data_destroy.
 * `path` "synthetic:V" opens generated tokens instead (src/data_synth.h):
 * unbounded (n_tokens SIZE_MAX, tokens NULL), max_token V - 1. */
int mal_data_open(mal_data **out, const char *path, int format);

/* Local.  The built-in default corpus (see src/corpus.h): generated
 * deterministically in memory, byte-level tokens 0..255 (vocab 256).  Its
 * name is "built-in corpus".  Caller releases *out with mal_data_destroy. */
int mal_data_open_default(mal_data **out);

/* Local.  The held-out continuation of the built-in corpus (corpus.h:
 * text the corpus never contains, from the same generator), the default
 * validation data.  Its name is "built-in corpus, held-out part". */
int mal_data_open_heldout(mal_data **out);

/* Local.  Release everything; NULL is allowed. */
void mal_data_destroy(mal_data *d);

/* Local.  Check the image of a token file (`len` bytes at `buf`, as read)
 * in `format` (MAL_DATA_AUTO: llm.c when the magic says so, else raw16):
 * the llm.c header's magic, version and token count against the length,
 * a raw file's even length.  On success the tokens are the *n uint16
 * (little endian) from byte *start.  MAL_EFORMAT (empty, malformed,
 * trailing data), MAL_ECORRUPT (truncated), MAL_EINVAL (unknown format),
 * each naming `path`.  The parser every token file goes through, and the
 * fuzzing entry (tests/fuzz/fuzz_llmc.c). */
int mal_data_parse_image(const char *path, int format, const unsigned char *buf, size_t len,
                         size_t *start, size_t *n);

/* Local accessors.  Pointers stay owned by `d` and valid until destroy. */
size_t mal_data_n_tokens(const mal_data *d);
int mal_data_max_token(const mal_data *d);    /* largest token id present */
const char *mal_data_name(const mal_data *d); /* the path, or "built-in corpus" */
const uint16_t *mal_data_tokens(const mal_data *d);

/* The identity of one file a data set reads: enough to tell whether a
 * resumed run reads the same data as the run that wrote its snapshot,
 * without reading the whole file again. */
typedef struct {
    char *path;           /* as opened; for generated data its name */
    uint64_t bytes;       /* the file's size (the built-in corpus: its tokens' bytes;
                           * synthetic data: 0) */
    uint64_t fingerprint; /* FNV-1a 64 of the size, the first MAL_DATA_ID_BLOCK bytes
                           * (the header) and MAL_DATA_ID_SAMPLES blocks of that size
                           * spread evenly over the rest (synthetic data: of its name) */
} mal_data_file_id;

enum { MAL_DATA_ID_BLOCK = 4096, MAL_DATA_ID_SAMPLES = 16 };

/* Local.  One entry per file `d` reads, in the order it reads them (the
 * built-in corpus and synthetic data are one entry named as they are);
 * each file is opened again and MAL_DATA_ID_SAMPLES + 1 blocks of it are
 * read, so this costs a few reads whatever the file's size.  *ids is
 * malloc'ed with *n entries, released with mal_data_identity_free.
 * MAL_EIO (a file that can no longer be read, naming it), MAL_ENOMEM. */
int mal_data_identity(const mal_data *d, mal_data_file_id **ids, int *n);
void mal_data_identity_free(mal_data_file_id *ids, int n);

/* Local, pure.  Sample `pos` of the global batch of step `step` (both >= 0):
 * the window tokens[off .. off+T] with
 *     off = mal_rng_below(seed ^ MAL_DATA_SALT, step, pos, n_tokens - T)
 * (base/rng.h), so every offset in [0, n_tokens - T) is possible and equally
 * likely.  Writes inputs[i] = tokens[off+i], targets[i] = tokens[off+i+1]
 * for i < T; both arrays (caller-owned) hold T ints.  Depends only on (seed,
 * step, pos) and the file, never on any cursor or call order.  MAL_EINVAL
 * when T < 1, step or pos is negative, or the file has fewer than T + 1
 * tokens. */
int mal_data_sample(const mal_data *d, uint64_t seed, int64_t step, int64_t pos, int T, int *inputs,
                    int *targets);

/* Local.  Write n tokens (n >= 1) to `path` in `format` (MAL_DATA_LLMC or
 * MAL_DATA_RAW16; LLMC holds at most INT32_MAX tokens) through mal_output
 * (fileio.h): atomically for a regular file (a temporary file in the same
 * directory is written, fsync'ed and renamed over `path`, then the directory
 * is fsync'ed; on failure `path` is untouched and the temporary file is
 * removed), directly into an existing device, FIFO or socket. */
int mal_data_write(const char *path, int format, const uint16_t *tokens, size_t n);

/* Local.  Byte-level tokenizer: each byte of the file `text_path` becomes
 * one token 0..255 (vocab 256).  On success *tokens is a malloc'ed array of
 * *n >= 1 tokens that the caller frees.  MAL_EFORMAT for an empty file. */
int mal_data_tokenize_bytes(const char *text_path, uint16_t **tokens, size_t *n);

/* Local.  Parse a format name ("auto", "llmc", "raw16") into *format;
 * MAL_EINVAL with a message for anything else.  For command-line options. */
int mal_data_parse_format(const char *name, int *format);

/* The name of a format constant ("auto", "llmc", "raw16", or "unknown"). */
const char *mal_data_format_name(int format);

#endif /* MAL_DATA_H */
