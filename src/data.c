/* Token data files (llm.c and headerless uint16), the built-in corpus as a
 * token stream, deterministic window sampling, atomic token-file writes and
 * the byte-level tokenizer.  See data.h for the contracts. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "base/rng.h"
#include "corpus.h"
#include "data_synth.h"

struct mal_data {
    char *name;
    uint16_t *tokens;
    size_t n_tokens;
    int max_token;
    int synth_vocab; /* > 0: synthetic data (data_synth.h), no tokens */
    int generated;   /* the built-in corpus or its held-out part: no file */
};

static const char default_name[] = "built-in corpus";
static const char heldout_name[] = "built-in corpus, held-out part";

/* ---- little-endian helpers ------------------------------------------- */

static int32_t get_le32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)v;
}

static void put_le32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Token files are little endian; on a big-endian host swap in place. */
static void tokens_from_le(uint16_t *t, size_t n)
{
    if (host_is_little_endian()) return;
    for (size_t i = 0; i < n; i++)
        t[i] = (uint16_t)(t[i] >> 8 | t[i] << 8);
}

/* ---- whole-file reading ----------------------------------------------- */

/* Read all of `path` into a malloc'ed buffer.  Regular files only: a
 * device or a pipe has no size to check and may never end (/dev/zero would
 * grow the buffer until the out-of-memory killer ends the job).  A file
 * larger than this machine's physical memory is refused for the same
 * reason (it could only be loaded into swap, or killed).  `what` names the
 * kind of file in messages ("token file", "text file"). */
static int read_whole_file(const char *path, const char *what, unsigned char **buf, size_t *len)
{
    size_t mem = mal_phys_memory_bytes();
    return mal_file_read(path, what, mem ? mem : SIZE_MAX, MAL_READ_REGULAR, buf, len);
}

/* ---- formats ---------------------------------------------------------- */

int mal_data_parse_format(const char *name, int *format)
{
    if (name && strcmp(name, "auto") == 0)
        *format = MAL_DATA_AUTO;
    else if (name && strcmp(name, "llmc") == 0)
        *format = MAL_DATA_LLMC;
    else if (name && strcmp(name, "raw16") == 0)
        *format = MAL_DATA_RAW16;
    else
        return MAL_ERR(MAL_EINVAL, "unknown token file format '%s': use llmc, raw16 or auto",
                       name ? name : "(null)");
    return 0;
}

const char *mal_data_format_name(int format)
{
    switch (format) {
    case MAL_DATA_AUTO:
        return "auto";
    case MAL_DATA_LLMC:
        return "llmc";
    case MAL_DATA_RAW16:
        return "raw16";
    default:
        return "unknown";
    }
}

/* ---- opening ---------------------------------------------------------- */

/* Take ownership of `tokens` (n >= 1) and `name` into a new object. */
static int data_create(mal_data **out, char *name, uint16_t *tokens, size_t n)
{
    mal_data *d = calloc(1, sizeof *d);
    if (!d) return MAL_ERR(MAL_ENOMEM, "out of memory creating the data set %s", name);
    int mx = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] > mx) mx = tokens[i];
    d->name = name;
    d->tokens = tokens;
    d->n_tokens = n;
    d->max_token = mx;
    *out = d;
    return 0;
}

int mal_data_parse_image(const char *path, int format, const unsigned char *buf, size_t len,
                         size_t *start, size_t *n)
{
    if (format != MAL_DATA_AUTO && format != MAL_DATA_LLMC && format != MAL_DATA_RAW16)
        return MAL_ERR(MAL_EINVAL, "unknown token file format %d for %s", format, path);
    if (len == 0) return MAL_ERR(MAL_EFORMAT, "token file %s is empty", path);
    if (format == MAL_DATA_AUTO)
        format = len >= 4 && get_le32(buf) == MAL_DATA_LLMC_MAGIC ? MAL_DATA_LLMC : MAL_DATA_RAW16;

    if (format == MAL_DATA_RAW16) {
        if (len % 2 != 0)
            return MAL_ERR(MAL_EFORMAT,
                           "raw uint16 token file %s has an odd size (%zu bytes): it is not a "
                           "headerless uint16 file, or it was truncated",
                           path, len);
        *start = 0;
        *n = len / 2;
        return 0;
    }

    /* LLMC */
    if (len < MAL_DATA_LLMC_HEADER_BYTES)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s is too short (%zu bytes) for an llm.c header (%d bytes); "
                       "if it is headerless uint16 use format raw16",
                       path, len, MAL_DATA_LLMC_HEADER_BYTES);
    int32_t magic = get_le32(buf), version = get_le32(buf + 4), count = get_le32(buf + 8);
    if (magic != MAL_DATA_LLMC_MAGIC)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s is not in llm.c format (magic %d, expected %d); if it is "
                       "headerless uint16 use format raw16",
                       path, (int)magic, MAL_DATA_LLMC_MAGIC);
    if (version != MAL_DATA_LLMC_VERSION)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s has llm.c version %d; only version %d (uint16 tokens) is "
                       "supported%s",
                       path, (int)version, MAL_DATA_LLMC_VERSION,
                       version == 2 ? " (version 2 holds uint32 tokens: re-tokenize with a "
                                      "vocabulary below 65536)"
                                    : "");
    if (count <= 0)
        return MAL_ERR(MAL_EFORMAT, "token file %s declares %d tokens in its header: %s", path,
                       (int)count, count == 0 ? "it holds no data" : "the header is corrupt");
    size_t have = (len - MAL_DATA_LLMC_HEADER_BYTES) / 2;
    size_t want = (size_t)count;
    if ((len - MAL_DATA_LLMC_HEADER_BYTES) % 2 != 0 || have > want)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s has %zu bytes after its header but the header declares "
                       "%zu tokens (%zu bytes): trailing data, the file is malformed",
                       path, len - MAL_DATA_LLMC_HEADER_BYTES, want, 2 * want);
    if (have < want)
        return MAL_ERR(MAL_ECORRUPT,
                       "token file %s is truncated: the header declares %zu tokens but only %zu "
                       "are present; regenerate or re-download it",
                       path, want, have);
    *start = MAL_DATA_LLMC_HEADER_BYTES;
    *n = want;
    return 0;
}

int mal_data_open(mal_data **out, const char *path, int format)
{
    int rc;
    unsigned char *buf = NULL;
    size_t len = 0, start = 0, n = 0;
    uint16_t *tokens = NULL;
    char *name = NULL;

    *out = NULL;
    int synth_vocab = 0;
    if ((rc = mal_data_synth_spec(path, &synth_vocab)) < 0) return rc;
    if (rc) {
        /* Generated on demand by mal_data_sample: no token array, unbounded. */
        if (!(*out = calloc(1, sizeof **out)) || !((*out)->name = strdup(path))) {
            free(*out);
            *out = NULL;
            return MAL_ERR(MAL_ENOMEM, "out of memory opening %s", path);
        }
        (*out)->n_tokens = SIZE_MAX;
        (*out)->max_token = synth_vocab - 1;
        (*out)->synth_vocab = synth_vocab;
        return 0;
    }
    if (format != MAL_DATA_AUTO && format != MAL_DATA_LLMC && format != MAL_DATA_RAW16)
        return MAL_ERR(MAL_EINVAL, "unknown token file format %d for %s", format, path);
    rc = read_whole_file(path, "token file", &buf, &len);
    if (rc) return rc;
    rc = mal_data_parse_image(path, format, buf, len, &start, &n);
    if (rc) goto cleanup;

    /* For raw files the image is the token array already; for llm.c files
     * copy the tokens out so the 1 KiB header is not kept. */
    if (start == 0) {
        tokens = (uint16_t *)buf;
        buf = NULL;
    } else {
        tokens = malloc(n * sizeof *tokens);
        if (!tokens) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory loading %zu tokens from %s", n, path);
            goto cleanup;
        }
        memcpy(tokens, buf + start, n * sizeof *tokens);
    }
    tokens_from_le(tokens, n);
    name = strdup(path);
    if (!name) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory loading %s", path);
        goto cleanup;
    }
    rc = data_create(out, name, tokens, n);
    if (rc) goto cleanup;
    tokens = NULL;
    name = NULL;

cleanup:
    free(name);
    free(tokens);
    free(buf);
    return rc;
}

/* The built-in corpus, or its held-out continuation, as byte tokens. */
static int open_generated(mal_data **out, int (*generate)(char **, size_t *), const char *what)
{
    char *text = NULL, *name = NULL;
    size_t len = 0;
    uint16_t *tokens = NULL;

    *out = NULL;
    int rc = generate(&text, &len);
    if (rc) return rc;
    tokens = malloc(len * sizeof *tokens);
    name = strdup(what);
    if (!tokens || !name) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory building the %s (%zu tokens)", what, len);
        goto cleanup;
    }
    for (size_t i = 0; i < len; i++)
        tokens[i] = (unsigned char)text[i];
    rc = data_create(out, name, tokens, len);
    if (rc) goto cleanup;
    (*out)->generated = 1;
    tokens = NULL;
    name = NULL;

cleanup:
    free(name);
    free(tokens);
    free(text);
    return rc;
}

int mal_data_open_default(mal_data **out)
{
    return open_generated(out, mal_corpus_generate, default_name);
}

int mal_data_open_heldout(mal_data **out)
{
    return open_generated(out, mal_corpus_generate_heldout, heldout_name);
}

void mal_data_destroy(mal_data *d)
{
    if (!d) return;
    free(d->tokens);
    free(d->name);
    free(d);
}

size_t mal_data_n_tokens(const mal_data *d)
{
    return d->n_tokens;
}
int mal_data_max_token(const mal_data *d)
{
    return d->max_token;
}
const char *mal_data_name(const mal_data *d)
{
    return d->name;
}
const uint16_t *mal_data_tokens(const mal_data *d)
{
    return d->tokens;
}

/* ---- identity --------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The fingerprint of `bytes` bytes read through `get` (which copies n
 * bytes at an offset into buf, returning 0 or a MAL_E* code): the first
 * block, then blocks at evenly spread offsets up to the end, so a file
 * replaced, regenerated, truncated or extended is told apart with a few
 * reads of a file of any size. */
static int fingerprint(uint64_t bytes, int (*get)(const void *src, uint64_t off, void *buf, size_t n),
                       const void *src, uint64_t *out)
{
    unsigned char buf[MAL_DATA_ID_BLOCK];
    uint64_t h = fnv1a(0xcbf29ce484222325ull, &bytes, sizeof bytes);
    uint64_t blk = bytes < MAL_DATA_ID_BLOCK ? bytes : MAL_DATA_ID_BLOCK;
    for (int i = 0; i <= MAL_DATA_ID_SAMPLES && blk > 0; i++) {
        uint64_t off = (bytes - blk) / MAL_DATA_ID_SAMPLES * (uint64_t)i;
        int rc = get(src, off, buf, (size_t)blk);
        if (rc) return rc;
        h = fnv1a(h, buf, (size_t)blk);
    }
    *out = h;
    return 0;
}

typedef struct {
    int fd;
    const char *path;
} id_file;

static int get_file(const void *src, uint64_t off, void *buf, size_t n)
{
    const id_file *f = src;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(f->fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return MAL_ERR(MAL_EIO, "data file %s: cannot read it again for its identity: %s",
                           f->path, r < 0 ? strerror(errno) : "it became shorter");
        got += (size_t)r;
    }
    return 0;
}

static int get_memory(const void *src, uint64_t off, void *buf, size_t n)
{
    memcpy(buf, (const unsigned char *)src + off, n);
    return 0;
}

/* One file's identity, read from the file again. */
static int file_identity(const char *path, mal_data_file_id *id)
{
    id_file f = {open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), path};
    struct stat st;
    if (f.fd < 0)
        return MAL_ERR(MAL_EIO, "data file %s: cannot open it again for its identity: %s", path,
                       strerror(errno));
    int rc = 0;
    if (fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = MAL_ERR(MAL_EIO, "data file %s is no longer a regular file", path);
    if (!rc) {
        id->bytes = (uint64_t)st.st_size;
        rc = fingerprint(id->bytes, get_file, &f, &id->fingerprint);
    }
    close(f.fd);
    return rc;
}

void mal_data_identity_free(mal_data_file_id *ids, int n)
{
    for (int i = 0; ids && i < n; i++)
        free(ids[i].path);
    free(ids);
}

int mal_data_identity(const mal_data *d, mal_data_file_id **ids, int *n)
{
    /* every file this object reads: one today (a token file), none for
     * generated data, which is identified by its name and contents */
    mal_data_file_id *v = calloc(1, sizeof *v);
    int rc = 0;
    *ids = NULL;
    *n = 0;
    if (!v || !(v->path = strdup(d->name))) {
        free(v);
        return MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    if (d->generated) {
        /* a change of the generator shows as a change of contents */
        v->bytes = (uint64_t)d->n_tokens * sizeof *d->tokens;
        rc = fingerprint(v->bytes, get_memory, d->tokens, &v->fingerprint);
    } else if (d->synth_vocab) { /* a pure function of (seed, step, position) and its name */
        v->fingerprint = fnv1a(0xcbf29ce484222325ull, d->name, strlen(d->name));
    } else {
        rc = file_identity(d->name, v);
    }
    if (rc) {
        mal_data_identity_free(v, 1);
        return rc;
    }
    *ids = v;
    *n = 1;
    return 0;
}

/* ---- sampling --------------------------------------------------------- */

int mal_data_sample(const mal_data *d, uint64_t seed, int64_t step, int64_t pos, int T, int *inputs,
                    int *targets)
{
    if (T < 1) return MAL_ERR(MAL_EINVAL, "sequence length %d must be at least 1", T);
    if (step < 0 || pos < 0)
        return MAL_ERR(MAL_EINVAL, "negative step (%lld) or batch position (%lld) for sampling",
                       (long long)step, (long long)pos);
    if (d->n_tokens < (size_t)T + 1)
        return MAL_ERR(MAL_EINVAL,
                       "data set %s has %zu tokens, fewer than sequence length + 1 = %lld: use a "
                       "larger token file or a shorter sequence length",
                       d->name, d->n_tokens, (long long)T + 1);
    if (d->synth_vocab) {
        mal_data_synth_window(seed, d->synth_vocab, step, pos, T, inputs, targets);
        return 0;
    }
    uint64_t off = mal_rng_below(seed ^ MAL_DATA_SALT, (uint64_t)step, (uint64_t)pos,
                                 (uint64_t)(d->n_tokens - (size_t)T));
    const uint16_t *w = d->tokens + off;
    for (int i = 0; i < T; i++) {
        inputs[i] = w[i];
        targets[i] = w[i + 1];
    }
    return 0;
}

/* ---- atomic writing --------------------------------------------------- */

int mal_data_write(const char *path, int format, const uint16_t *tokens, size_t n)
{
    int rc = 0;
    uint16_t *swapped = NULL;
    mal_output out;

    if (format != MAL_DATA_LLMC && format != MAL_DATA_RAW16)
        return MAL_ERR(MAL_EINVAL, "cannot write %s: format must be llmc or raw16, not %s", path,
                       mal_data_format_name(format));
    if (n == 0) return MAL_ERR(MAL_EINVAL, "refusing to write %s with no tokens", path);
    if (format == MAL_DATA_LLMC && n > INT32_MAX)
        return MAL_ERR(MAL_EINVAL,
                       "cannot write %s: %zu tokens exceed the llm.c header's int32 count; use "
                       "format raw16 or split the file",
                       path, n);
    if ((rc = mal_output_open(&out, path))) return rc;

    if (format == MAL_DATA_LLMC) {
        unsigned char header[MAL_DATA_LLMC_HEADER_BYTES] = {0};
        put_le32(header, MAL_DATA_LLMC_MAGIC);
        put_le32(header + 4, MAL_DATA_LLMC_VERSION);
        put_le32(header + 8, (int32_t)n);
        if ((rc = mal_output_write(&out, header, sizeof header))) goto fail;
    }
    const uint16_t *src = tokens;
    if (!host_is_little_endian()) {
        swapped = malloc(n * sizeof *swapped);
        if (!swapped) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory writing %s", path);
            goto fail;
        }
        for (size_t i = 0; i < n; i++)
            swapped[i] = (uint16_t)(tokens[i] >> 8 | tokens[i] << 8);
        src = swapped;
    }
    if ((rc = mal_output_write(&out, src, n * sizeof *src))) goto fail;
    rc = mal_output_commit(&out);
    free(swapped);
    return rc;

fail:
    mal_output_discard(&out);
    free(swapped);
    return rc;
}

/* ---- byte-level tokenizer --------------------------------------------- */

int mal_data_tokenize_bytes(const char *text_path, uint16_t **tokens, size_t *n)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    *tokens = NULL;
    *n = 0;
    int rc = read_whole_file(text_path, "text file", &buf, &len);
    if (rc) return rc;
    if (len == 0) {
        free(buf);
        return MAL_ERR(MAL_EFORMAT, "text file %s is empty: nothing to tokenize", text_path);
    }
    uint16_t *t = malloc(len * sizeof *t);
    if (!t) {
        free(buf);
        return MAL_ERR(MAL_ENOMEM, "out of memory tokenizing %s (%zu bytes)", text_path, len);
    }
    for (size_t i = 0; i < len; i++)
        t[i] = buf[i];
    free(buf);
    *tokens = t;
    *n = len;
    return 0;
}
