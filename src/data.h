/* Token data: token files (Megatron-LM indexed datasets, llm.c files of
 * uint16 or uint32 tokens, headerless uint16 / uint32), several of them
 * read as one or blended with weights, the records scripts/tokenize_hf.py
 * writes beside them, the built-in default corpus, deterministic sampling
 * of training windows (epochs without replacement, or random offsets),
 * held-out parts for validation, writing token files.
 *
 * Token files are mapped, never read whole into memory: a rank's memory
 * holds only the pages of the windows it reads (the page cache's, shared by
 * every rank of the machine that maps the same file), so a 4 GB corpus
 * costs a rank what a 4 MB one does (bench/README.md).
 *
 * Sampling is a pure function of (seed, step, position in the global batch)
 * and the files: no rank keeps a data-loader cursor.  That is what lets a run
 * change its parallel layout (or world size) mid-training and still see the
 * same global batch at every step; progress is stored as consumed samples.
 *
 * A mal_data is owned by the library (mal_data_open* / mal_data_destroy) and
 * is read-only after opening (and mal_data_check_vocab), so several threads
 * may sample from one object.
 */
#ifndef MAL_DATA_H
#define MAL_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct mal_data mal_data;

enum {
    MAL_DATA_AUTO = 0,
    MAL_DATA_LLMC = 1,
    MAL_DATA_RAW16 = 2,
    MAL_DATA_RAW32 = 3,
    MAL_DATA_MEGATRON = 4
};

/* llm.c token file header: 256 little-endian int32; [0] magic, [1] version,
 * [2] number of tokens that follow.  Magic 20240520 version 1: uint16
 * tokens (GPT-2's files); magic 20240801 version 7: uint32 tokens (llm.c's
 * LLaMA-3 files). */
#define MAL_DATA_LLMC_MAGIC 20240520
#define MAL_DATA_LLMC_VERSION 1
#define MAL_DATA_LLMC32_MAGIC 20240801
#define MAL_DATA_LLMC32_VERSION 7
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

/* Local.  Open the token files `spec` names (each mapped read-only),
 * whole, sampled in random mode (mal_data_open_opts for the rest).
 *
 * `spec` is one item or several separated by commas; an item is a path or
 * a glob (*, ?, [...]; its matches in byte order), optionally followed by
 * ":WEIGHT".  Either no item has a weight -- then all the files are read as
 * one data set, each window drawn from the whole -- or every item has one:
 * a blend, whose items (components) supply the samples in proportion to
 * their weights, whatever their sizes (a glob's files are one component).
 * A weight is a positive finite number; weights need not add up to 1.
 * Paths may not contain commas; a path that itself ends in ":NUMBER" must be
 * given with a weight.
 *
 * `format` (every file): MAL_DATA_LLMC (llm.c: 1024-byte header of 256
 * little-endian int32 {magic, version, count, 0...}, then `count`
 * little-endian tokens of the width the magic and version say),
 * MAL_DATA_RAW16 / RAW32 (headerless little-endian uint16, nanoGPT, or
 * uint32), MAL_DATA_MEGATRON (Megatron-LM's indexed dataset, below: the
 * item is PREFIX.bin or PREFIX) or MAL_DATA_AUTO: Megatron for PREFIX.bin
 * beside a PREFIX.idx, or for a PREFIX that does not exist while both do
 * (a glob's .idx matches beside their .bin are skipped); else LLMC when
 * the first int32 is one of the magics, else RAW16.  Headers and sizes are
 * validated here; token ids by mal_data_check_vocab and as windows are
 * read.  Failures return, with a message naming the file or item:
 *   MAL_ENOENT   a file does not exist, a glob matches nothing;
 *   MAL_EINVAL   a directory, a device or FIFO, an unreadable file
 *                (permissions); a bad weight; unknown format;
 *   MAL_EIO      a file cannot be mapped;
 *   MAL_EFORMAT  empty, wrong magic or version, a size that is not whole
 *                tokens, or more bytes than the header's token count; a
 *                malformed .idx or one describing less than its .bin;
 *   MAL_ECORRUPT fewer bytes than the header's token count or the .idx
 *                describes (truncated file).
 * On success *out is a new object the caller releases with mal_data_destroy.
 * `spec` "synthetic:V" opens generated tokens instead (src/data_synth.h):
 * unbounded (n_tokens UINT64_MAX), max_token V - 1. */
int mal_data_open(mal_data **out, const char *spec, int format);

/* How a data set is sampled (mal_data_sample states both modes). */
enum {
    MAL_DATA_SAMPLE_DEFAULT = 0, /* epochs for token files, random for the built-in corpus */
    MAL_DATA_SAMPLE_RANDOM = 1,
    MAL_DATA_SAMPLE_EPOCHS = 2
};
/* Which part of each file a data set reads (--val-fraction). */
enum { MAL_DATA_PART_ALL = 0, MAL_DATA_PART_TRAIN = 1, MAL_DATA_PART_HELDOUT = 2 };

typedef struct {
    int format;          /* MAL_DATA_AUTO, LLMC, ... (every file) */
    int sampling;        /* MAL_DATA_SAMPLE_* */
    int seq_len;         /* T: epochs read windows of T + 1 tokens, T apart */
    int64_t batch;       /* samples per step: sample (step, pos) is number step * batch + pos */
    double val_fraction; /* the share of every file held out for validation (0: none) */
    int part;            /* MAL_DATA_PART_*: with val_fraction, TRAIN or HELDOUT */
} mal_data_options;

/* Local.  {AUTO, DEFAULT, 0, 0, 0, ALL}: seq_len and batch must be set
 * for epochs. */
mal_data_options mal_data_options_default(void);

/* Local.  Open the token files `spec` names as mal_data_open does, sampled
 * as `o` says.  Epochs need o->seq_len >= 1 and o->batch >= 1.  With
 * o->val_fraction in (0, 1) each file is split: its last val_fraction of
 * tokens (for a Megatron file, moved to the nearest document start, so
 * that no document is split) is the held-out part, the rest the training
 * part; o->part says which one this object reads.  MAL_EINVAL for bad
 * options (a val_fraction with the built-in corpus or synthetic data
 * included), and when a component has no window of T + 1 tokens in its
 * part (naming its file and the part). */
int mal_data_open_opts(mal_data **out, const char *spec, const mal_data_options *o);

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

/* Local.  Check the image of a token file (`len` bytes at `buf`: the
 * mapping) in `format` (MAL_DATA_AUTO: llm.c when a magic says so, else
 * raw16): the llm.c header's magic, version and token count against the
 * length, a raw file's length in whole tokens.  On success the tokens are
 * the *n little-endian integers of *width bytes (2 or 4) from byte *start.
 * MAL_EFORMAT (empty, malformed, trailing data), MAL_ECORRUPT (truncated),
 * MAL_EINVAL (unknown format), each naming `path`.  The parser every token
 * file goes through, and the fuzzing entry (tests/fuzz/fuzz_llmc.c). */
int mal_data_parse_image(const char *path, int format, const unsigned char *buf, size_t len,
                         size_t *start, size_t *n, int *width);

/* Megatron-LM's indexed dataset: PREFIX.bin holds the tokens of every
 * document back to back (no header), PREFIX.idx describes them, all little
 * endian: the 9 bytes "MMIDIDX\0\0", uint64 version 1, uint8 dtype code
 * (1 uint8, 2 int8, 3 int16, 4 int32, 8 uint16; 5 int64, 6 float64 and
 * 7 float32 are not token types here), uint64 S (sequences), uint64 D
 * (document index entries: documents + 1), then int32 lengths[S] (tokens
 * per sequence), int64 pointers[S] (byte offset of each sequence in the
 * .bin), int64 doc_index[D] (document k is sequences doc_index[k] ..
 * doc_index[k+1] - 1; doc_index[0] = 0, doc_index[D-1] = S), and, for a
 * multimodal index only, int8 modes[S]. */
#define MAL_DATA_IDX_MAGIC "MMIDIDX\0\0"
#define MAL_DATA_IDX_HEADER_BYTES 34

/* The layout of a parsed index: where its arrays start in the image. */
typedef struct {
    int width;          /* bytes per token (1, 2 or 4) */
    int is_signed;      /* int8, int16, int32 */
    uint64_t n_seqs;    /* S */
    uint64_t n_docs;    /* D - 1 */
    size_t lengths_at;  /* int32 lengths[S] */
    size_t pointers_at; /* int64 pointers[S] */
    size_t docs_at;     /* int64 doc_index[D] */
} mal_data_idx;

/* Local.  Check the index image `buf` (`len` bytes: the mapping of
 * `path`) against its token file of `bin_bytes` bytes: magic, version,
 * dtype, the counts against the length, the first and last pointers and
 * document entries, and that the sequences end exactly at the end of the
 * .bin.  With `full`, every pointer (each sequence starts where the one
 * before ends) and every document entry (non-decreasing) too: O(S + D),
 * done for indexes up to MAL_DATA_SCAN_BYTES.  MAL_EFORMAT naming `path`
 * for a malformed index or one that disagrees with a larger .bin,
 * MAL_ECORRUPT for a .bin shorter than its index says (truncated).  The
 * parser every .idx goes through, and the fuzzing entry
 * (tests/fuzz/fuzz_idx.c). */
int mal_data_parse_idx(const char *path, const unsigned char *buf, size_t len, uint64_t bin_bytes,
                       int full, mal_data_idx *out);

/* The record scripts/tokenize_hf.py writes beside the token files it
 * makes: PREFIX.tokens.json for PREFIX.bin (PATH.tokens.json for a PATH not
 * ending in .bin), a JSON object {"format": "malleus-tokens/1",
 * "n_tokens", "n_documents", "max_token", "dtype", "tokenizer": {"file",
 * "bytes", "crc32", "vocab_size", "eos_token", "eos_id", "config",
 * "special_tokens_map"}} (src/tokenizer.h reads the tokenizer).  Where a
 * file has one, its token ids were checked when it was written: the
 * largest is checked against the model before training without reading
 * the file, however large; and its tokenizer is the data's (files made
 * with different tokenizers are refused together).  A record that
 * disagrees with its file (another token count) is refused as stale. */
#define MAL_DATA_RECORD_SUFFIX ".tokens.json"
#define MAL_DATA_RECORD_FORMAT "malleus-tokens/1"

/* Local.  The tokenizer the data's records name, as the JSON text of the
 * record's "tokenizer" object, or NULL when no file has a record with one. */
const char *mal_data_tokenizer(const mal_data *d);

/* Token files whose tokens add up to at most this many bytes are read once
 * at opening for their largest id (mal_data_max_token), so a token the
 * model cannot hold is refused before training starts; larger ones are
 * checked as their windows are read (mal_data_check_vocab). */
#define MAL_DATA_SCAN_BYTES ((uint64_t)64 << 20)

/* Local.  Check the data against a vocabulary of `vocab` tokens, and make
 * every later mal_data_sample check each token it reads against it.
 * MAL_EINVAL, naming the file, when a token id known now (the built-in
 * corpus, a file scanned at opening, synthetic data) is >= vocab.  Tokens
 * not known now -- files too large to scan at opening -- are checked as
 * windows are read: mal_data_sample then fails with MAL_EFORMAT naming the
 * file and the token's position.  Call once, before sampling (it is the
 * one change to an opened object). */
int mal_data_check_vocab(mal_data *d, int vocab);

/* At most this many token files in one data set. */
#define MAL_DATA_MAX_FILES 65536

/* Local accessors.  Pointers stay owned by `d` and valid until destroy. */
uint64_t mal_data_n_tokens(const mal_data *d); /* of the part read; UINT64_MAX: synthetic */
int mal_data_sampling(const mal_data *d);      /* MAL_DATA_SAMPLE_RANDOM or EPOCHS */
/* Epochs: the windows of one epoch over all components (0 otherwise). */
uint64_t mal_data_n_windows(const mal_data *d);
int64_t mal_data_max_token(const mal_data *d); /* largest token id, -1 when not known */
const char *mal_data_name(const mal_data *d);  /* the spec, or "built-in corpus" */
/* Token i (< n_tokens) of the data's parts, counted over its files in order. */
int64_t mal_data_token(const mal_data *d, uint64_t i);
/* Bytes the data holds in this process's own memory (the built-in corpus;
 * a mapped file's pages are the page cache's and are not counted). */
size_t mal_data_resident_bytes(const mal_data *d);

/* The identity of one file a data set reads: enough to tell whether a
 * resumed run reads the same data as the run that wrote its snapshot,
 * without reading the whole file again. */
typedef struct {
    char *path;           /* as opened; for generated data its name */
    uint64_t bytes;       /* the file's size (the built-in corpus: its tokens' bytes;
                           * synthetic data: 0) */
    uint64_t fingerprint; /* mal_file_fingerprint (base/fileio.h): of the size, the first
                           * block (the header) and blocks spread evenly over the rest
                           * (synthetic data: FNV-1a 64 of its name) */
} mal_data_file_id;

/* Local.  One entry per file `d` reads, in the order it reads them (the
 * built-in corpus and synthetic data are one entry named as they are);
 * each file is opened again and MAL_FILE_ID_SAMPLES + 1 blocks of it are
 * read, so this costs a few reads whatever the file's size.  *ids is
 * malloc'ed with *n entries, released with mal_data_identity_free.
 * MAL_EIO (a file that can no longer be read, naming it), MAL_ENOMEM. */
int mal_data_identity(const mal_data *d, mal_data_file_id **ids, int *n);
void mal_data_identity_free(mal_data_file_id *ids, int n);


/* The files of a data set, in order, for identifying what a run read:
 * the path (a glob's match), its size in bytes, its tokens, its format and
 * width, and the blend component it belongs to with that component's
 * weight (a share of 1; 1 when the files are read as one). */
typedef struct {
    const char *path;
    const char *index_path; /* a Megatron dataset's .idx; NULL otherwise */
    uint64_t bytes, n_tokens;
    int format, width;
    int component;
    double weight;
} mal_data_file_info;

/* Local.  Number of files (0 for synthetic data; 1 for the built-in corpus,
 * whose path is its name and whose format is 0), and file i's description
 * (strings owned by `d`). */
int mal_data_n_files(const mal_data *d);
void mal_data_file_describe(const mal_data *d, int i, mal_data_file_info *info);

/* Salts of a blend's component draw (random mode) and of the epochs'
 * permutations (xor-ed with the seed and MAL_DATA_SALT).  Part of the
 * sampling contract: changing one changes every run. */
#define MAL_DATA_BLEND_SALT 0x424C454E44ull
#define MAL_DATA_EPOCH_SALT 0x45504F434853ull
/* Slots of a blend's pattern (epochs) and rounds of the permutation. */
#define MAL_DATA_BLEND_SLOTS 65536u
#define MAL_DATA_FEISTEL_ROUNDS 4

/* Local, pure.  Element i (< n) of the keyed permutation of [0, n): a
 * balanced Feistel network of MAL_DATA_FEISTEL_ROUNDS rounds on 2h bits,
 * 4^h the smallest power of 4 >= n (h >= 1), round r mapping (L, R) to
 * (R, L ^ (mal_rng_u64(key, r, R) & (2^h - 1))), x = L * 2^h + R, applied
 * again while the result is >= n (cycle walking).  O(1) memory, expected
 * fewer than 4 applications: any element of an epoch of 10^9 windows
 * without a table. */
uint64_t mal_data_permute(uint64_t key, uint64_t n, uint64_t i);

/* Local, pure.  Sample `pos` of the global batch of step `step` (both >= 0).
 *
 * Epochs (the default for token files; mal_data_open_opts).  The windows
 * of a file's part [lo, hi) are tokens lo + w*T .. lo + w*T + T for w <
 * (hi - lo - 1) / T (T + 1 tokens each, T apart, as Megatron's samples;
 * they cross document boundaries, the EOS token between documents); a
 * component's windows are its files' in order, N of them.  The sample
 * number is g = step * batch + pos.  Without a blend, k = g; in a blend,
 * slot s = g mod MAL_DATA_BLEND_SLOTS of a fixed pattern names the
 * component c, and k = (g div SLOTS) * n_c + j, the pattern giving c its
 * n_c slots (its weight's share of SLOTS, largest remainders rounding,
 * each at least 1) in the order of (2j + 1) / (2 n_c) (ties: lower c),
 * slot j of c being its j-th.  The window is then
 *     mal_data_permute(mal_rng_u64(seed ^ MAL_DATA_SALT ^
 *                      MAL_DATA_EPOCH_SALT, c, k div N), N, k mod N):
 * every window once per epoch, a new order every epoch.  A restart or a
 * new plan computes the same g for the same (step, pos): no cursor.
 *
 * Random (the built-in corpus; mal_data_open).  Of a blend, component c
 * is drawn first: the first c whose cumulative weight exceeds u =
 * mal_rng_uniform(seed ^ MAL_DATA_SALT ^ MAL_DATA_BLEND_SALT, step, pos).
 * Then, within the component (all the files when there is no blend), the
 * window tokens[off .. off+T] of the component's files' parts laid end to
 * end, counting only the windows that lie in one file: with S_f = (hi -
 * lo) - T start positions in file f (none when negative),
 *     off = mal_rng_below(seed ^ MAL_DATA_SALT, step, pos, sum_f S_f)
 * (base/rng.h) read from the first file whose starts reach it, so every
 * start in [0, S) is possible and equally likely; for one whole file that
 * is the offset in the file.
 *
 * Both write inputs[i] = tokens[off+i], targets[i] = tokens[off+i+1] for
 * i < T; both arrays (caller-owned) hold T ints.  Depends only on (seed,
 * step, pos) and the files, never on any cursor or call order.  MAL_EINVAL
 * when T < 1 (or, for epochs, not the T opened with), step or pos is
 * negative, or no file of the component has T + 1 tokens; MAL_EFORMAT for
 * a token that is not below the vocabulary of mal_data_check_vocab, naming
 * the file and the token's position. */
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

/* Local.  Parse a format name ("auto", "llmc", "raw16", "raw32", "megatron") into *format;
 * MAL_EINVAL with a message for anything else.  For command-line options. */
int mal_data_parse_format(const char *name, int *format);

/* The name of a format constant ("auto", "llmc", "raw16", "raw32", "megatron",
 * or "unknown"). */
const char *mal_data_format_name(int format);

#endif /* MAL_DATA_H */
