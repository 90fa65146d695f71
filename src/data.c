/* Data sets: opening (token files through data_file.c, synthetic data,
 * the built-in corpus as a token stream held in memory), deterministic
 * window sampling, atomic token-file writes and the byte-level tokenizer.
 * See data.h for the contracts. */
#include "data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
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
#include "tokenizer.h"

static const char default_name[] = "built-in corpus";
static const char heldout_name[] = "built-in corpus, held-out part";

/* ---- little-endian helpers ------------------------------------------- */

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
    else if (name && strcmp(name, "raw32") == 0)
        *format = MAL_DATA_RAW32;
    else if (name && strcmp(name, "megatron") == 0)
        *format = MAL_DATA_MEGATRON;
    else
        return MAL_ERR(MAL_EINVAL,
                       "unknown token file format '%s': use llmc, raw16, raw32, megatron or auto",
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
    case MAL_DATA_RAW32:
        return "raw32";
    case MAL_DATA_MEGATRON:
        return "megatron";
    default:
        return "unknown";
    }
}

/* ---- opening ---------------------------------------------------------- */

/* A new data set with room for n_files files in n_comps components (none
 * opened yet: n_files and the components' files are counted as they are). */
static int data_new(mal_data **out, const char *name, int n_files, int n_comps)
{
    mal_data *d = calloc(1, sizeof *d);
    if (!d || !(d->name = strdup(name)) ||
        (n_files && !(d->files = calloc((size_t)n_files, sizeof *d->files))) ||
        (n_comps && !(d->comps = calloc((size_t)n_comps, sizeof *d->comps)))) {
        mal_data_destroy(d);
        return MAL_ERR(MAL_ENOMEM, "out of memory opening the data set %s", name);
    }
    d->n_comps = n_comps;
    *out = d;
    return 0;
}

/* The one tokenizer the files' records name (data.h): files made with
 * different tokenizers cannot be trained on together. */
static int data_tokenizer(mal_data *d)
{
    mal_tokenizer_ref first, other;
    int rc = 0, k = -1;
    for (int i = 0; i < d->n_files && !rc; i++) {
        if (!d->files[i].tokenizer) continue;
        json_t *j = json_loads(d->files[i].tokenizer, 0, NULL);
        if (!j) return MAL_ERR(MAL_ENOMEM, "out of memory");
        rc = mal_tokenizer_ref_parse(k < 0 ? &first : &other, j, d->files[i].path);
        json_decref(j);
        if (rc) break;
        if (k < 0) {
            k = i;
            continue;
        }
        if (!mal_tokenizer_ref_same(&first, &other))
            rc = MAL_ERR(MAL_EMISMATCH,
                         "%s was tokenized with %s, %s with %s (another file, or it changed): "
                         "data made with different tokenizers cannot be trained on together",
                         d->files[k].path, first.file, d->files[i].path, other.file);
        mal_tokenizer_ref_fini(&other);
    }
    if (k >= 0) {
        mal_tokenizer_ref_fini(&first);
        d->tokenizer = d->files[k].tokenizer;
    }
    return rc;
}

/* The largest ids of the small files (up to MAL_DATA_SCAN_BYTES of tokens
 * in all: data.h) that have no record saying it, the tokenizer, then the
 * parts, windows and blend pattern. */
static int data_finish(mal_data *d)
{
    uint64_t scanned = 0;
    int rc;
    for (int i = 0; i < d->n_files; i++) {
        mal_data_file *f = &d->files[i];
        uint64_t bytes = f->n_tokens * (uint64_t)f->width;
        if (f->max_token < 0 && scanned + bytes <= MAL_DATA_SCAN_BYTES) {
            if ((rc = mal_data_file_scan(f))) return rc;
            scanned += bytes;
        }
    }
    if ((rc = data_tokenizer(d))) return rc;
    return mal_data_layout(d);
}

mal_data_options mal_data_options_default(void)
{
    mal_data_options o = {MAL_DATA_AUTO, MAL_DATA_SAMPLE_DEFAULT, 0, 0, 0, MAL_DATA_PART_ALL};
    return o;
}

/* The options a data set of token files is opened with, checked. */
static int check_options(const char *spec, const mal_data_options *o, int *sampling)
{
    if (o->format < MAL_DATA_AUTO || o->format > MAL_DATA_MEGATRON)
        return MAL_ERR(MAL_EINVAL, "unknown token file format %d for %s", o->format, spec);
    *sampling = o->sampling == MAL_DATA_SAMPLE_DEFAULT ? MAL_DATA_SAMPLE_EPOCHS : o->sampling;
    if (*sampling != MAL_DATA_SAMPLE_RANDOM && *sampling != MAL_DATA_SAMPLE_EPOCHS)
        return MAL_ERR(MAL_EINVAL, "unknown sampling mode %d for %s", o->sampling, spec);
    if (*sampling == MAL_DATA_SAMPLE_EPOCHS && (o->seq_len < 1 || o->batch < 1))
        return MAL_ERR(MAL_EINVAL,
                       "epochs over %s need the sequence length and the global batch (%d, "
                       "%lld)",
                       spec, o->seq_len, (long long)o->batch);
    if (o->part != MAL_DATA_PART_ALL && !(o->val_fraction > 0 && o->val_fraction < 1))
        return MAL_ERR(MAL_EINVAL,
                       "--val-fraction %g: the share of the data held out must be above 0 and "
                       "below 1",
                       o->val_fraction);
    if (o->part < MAL_DATA_PART_ALL || o->part > MAL_DATA_PART_HELDOUT)
        return MAL_ERR(MAL_EINVAL, "unknown data part %d for %s", o->part, spec);
    return 0;
}

int mal_data_open_opts(mal_data **out, const char *spec, const mal_data_options *o)
{
    int rc, sampling = 0;
    mal_data *d = NULL;
    mal_data_spec sp;

    *out = NULL;
    int synth_vocab = 0;
    if ((rc = mal_data_synth_spec(spec, &synth_vocab)) < 0) return rc;
    if (rc) {
        if (o->part != MAL_DATA_PART_ALL)
            return MAL_ERR(MAL_EINVAL,
                           "--val-fraction holds out part of token files; %s is generated "
                           "(every sample is new)",
                           spec);
        /* Generated on demand by mal_data_sample: no file, unbounded. */
        if ((rc = data_new(&d, spec, 0, 0))) return rc;
        d->n_tokens = UINT64_MAX;
        d->synth_vocab = synth_vocab;
        *out = d;
        return 0;
    }
    if ((rc = check_options(spec, o, &sampling))) return rc;
    if ((rc = mal_data_spec_parse(&sp, spec))) return rc;
    if ((rc = data_new(&d, spec, sp.n_files, sp.n_comps))) goto done;
    d->sampling = sampling;
    d->seq_len = o->seq_len;
    d->batch = o->batch;
    d->part = o->part;
    d->val_fraction = o->val_fraction;
    for (int c = 0; c < sp.n_comps; c++) {
        d->comps[c].weight = sp.weights[c];
        d->comps[c].first_file = -1;
    }
    for (int i = 0; i < sp.n_files; i++) {
        if ((rc = mal_data_file_open(&d->files[i], sp.paths[i], o->format))) goto done;
        d->n_files = i + 1;
        mal_data_comp *c = &d->comps[sp.comp_of[i]];
        d->files[i].comp = sp.comp_of[i];
        if (c->first_file < 0) c->first_file = i;
        c->n_files++;
    }
    rc = data_finish(d);
done:
    mal_data_spec_fini(&sp);
    if (rc) {
        mal_data_destroy(d);
        return rc;
    }
    *out = d;
    return 0;
}

int mal_data_open(mal_data **out, const char *spec, int format)
{
    mal_data_options o = mal_data_options_default();
    o.format = format;
    o.sampling = MAL_DATA_SAMPLE_RANDOM;
    return mal_data_open_opts(out, spec, &o);
}

/* The built-in corpus, or its held-out continuation, as byte tokens: one
 * in-memory "file" of 1-byte tokens, the generated text itself. */
static int open_generated(mal_data **out, int (*generate)(char **, size_t *), const char *what)
{
    char *text = NULL;
    size_t len = 0;
    mal_data *d = NULL;

    *out = NULL;
    int rc = generate(&text, &len);
    if (rc) return rc;
    if ((rc = data_new(&d, what, 1, 1))) goto fail;
    d->n_files = 1;
    d->comps[0] = (mal_data_comp){1.0, 0, 1, 0, 0};
    d->sampling = MAL_DATA_SAMPLE_RANDOM;
    mal_data_file *f = &d->files[0];
    f->max_token = -1;
    if (!(f->path = strdup(what))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory building the %s", what);
        goto fail;
    }
    f->format = MAL_DATA_MEM;
    f->width = 1;
    f->mem = (unsigned char *)text;
    text = NULL;
    f->tok = f->mem;
    f->n_tokens = len;
    if ((rc = data_finish(d))) goto fail;
    *out = d;
    return 0;
fail:
    free(text);
    mal_data_destroy(d);
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
    for (int i = 0; i < d->n_files; i++)
        mal_data_file_close(&d->files[i]);
    free(d->files);
    free(d->comps);
    free(d->blend_comp);
    free(d->blend_rank);
    free(d->name);
    free(d);
}

int mal_data_check_vocab(mal_data *d, int vocab)
{
    if (vocab < 1) return MAL_ERR(MAL_EINVAL, "vocabulary size %d must be at least 1", vocab);
    if (d->synth_vocab > vocab)
        return MAL_ERR(MAL_EINVAL,
                       "data %s holds token ids up to %d but the model has a vocabulary of %d: "
                       "use synthetic:%d or a model config with a larger vocab",
                       d->name, d->synth_vocab - 1, vocab, vocab);
    for (int i = 0; i < d->n_files; i++)
        if (d->files[i].max_token >= vocab)
            return MAL_ERR(MAL_EINVAL,
                           "data %s holds token id %" PRId64 " but the model has a vocabulary "
                           "of %d: use a model config with a larger vocab, or data tokenized "
                           "for this model",
                           d->files[i].path, d->files[i].max_token, vocab);
    d->vocab = vocab;
    return 0;
}

uint64_t mal_data_n_tokens(const mal_data *d)
{
    return d->n_tokens;
}

int64_t mal_data_max_token(const mal_data *d)
{
    if (d->synth_vocab) return d->synth_vocab - 1;
    int64_t mx = -1;
    for (int i = 0; i < d->n_files; i++) {
        if (d->files[i].max_token < 0) return -1; /* one file not known: not known */
        mx = MAL_MAX(mx, d->files[i].max_token);
    }
    return mx;
}

const char *mal_data_name(const mal_data *d)
{
    return d->name;
}

const char *mal_data_tokenizer(const mal_data *d)
{
    return d->tokenizer;
}

/* ---- identity --------------------------------------------------------- */

void mal_data_identity_free(mal_data_file_id *ids, int n)
{
    for (int i = 0; ids && i < n; i++)
        free(ids[i].path);
    free(ids);
}

int mal_data_identity(const mal_data *d, mal_data_file_id **ids, int *n)
{
    /* one entry per file read, in order (a Megatron dataset's index counts
     * as a file of its own: it decides where documents start); generated
     * data is one entry named as it is */
    int cap = d->synth_vocab ? 1 : 2 * d->n_files;
    mal_data_file_id *v = calloc((size_t)(cap > 0 ? cap : 1), sizeof *v);
    int k = 0, rc = 0;
    *ids = NULL;
    *n = 0;
    if (!v) return MAL_ERR(MAL_ENOMEM, "out of memory");
    if (d->synth_vocab) { /* a pure function of (seed, step, position) and its name */
        if (!(v[k].path = strdup(d->name))) rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        else v[k++].fingerprint = mal_fnv1a64(d->name, strlen(d->name));
    }
    for (int i = 0; !rc && !d->synth_vocab && i < d->n_files; i++) {
        const mal_data_file *f = &d->files[i];
        const char *paths[2] = {f->path, f->idx_path};
        for (int j = 0; !rc && j < 2; j++) {
            if (!paths[j] || (j == 1 && f->format == MAL_DATA_MEM)) continue;
            mal_data_file_id *id = &v[k];
            if (!(id->path = strdup(paths[j]))) {
                rc = MAL_ERR(MAL_ENOMEM, "out of memory");
                break;
            }
            k++;
            if (f->format == MAL_DATA_MEM) {
                /* the built-in corpus: a change of the generator shows as a
                 * change of contents */
                id->bytes = f->n_tokens * (uint64_t)f->width;
                id->fingerprint = mal_fingerprint_memory(f->tok, id->bytes);
            } else {
                rc = mal_file_fingerprint(paths[j], "data file", &id->bytes, &id->fingerprint);
            }
        }
    }
    if (rc) {
        mal_data_identity_free(v, k);
        return rc;
    }
    *ids = v;
    *n = k;
    return 0;
}

int mal_data_sampling(const mal_data *d)
{
    return d->sampling;
}

uint64_t mal_data_n_windows(const mal_data *d)
{
    uint64_t n = 0;
    if (d->sampling == MAL_DATA_SAMPLE_EPOCHS)
        for (int c = 0; c < d->n_comps; c++)
            n += d->comps[c].n_windows;
    return n;
}

int64_t mal_data_token(const mal_data *d, uint64_t i)
{
    for (int k = 0; k < d->n_files; k++) {
        const mal_data_file *f = &d->files[k];
        if (i < f->hi - f->lo) return mal_data_file_token(f, f->lo + i);
        i -= f->hi - f->lo;
    }
    return -1;
}

int mal_data_n_files(const mal_data *d)
{
    return d->n_files;
}

void mal_data_file_describe(const mal_data *d, int i, mal_data_file_info *info)
{
    const mal_data_file *f = &d->files[i];
    info->path = f->path;
    info->index_path = f->idx_path;
    info->bytes = f->format == MAL_DATA_MEM ? f->n_tokens : f->map.bytes;
    info->n_tokens = f->n_tokens;
    info->format = f->format == MAL_DATA_MEM ? 0 : f->format;
    info->width = f->width;
    info->component = f->comp;
    info->weight = d->comps[f->comp].weight;
}

size_t mal_data_resident_bytes(const mal_data *d)
{
    size_t b = 0;
    for (int i = 0; i < d->n_files; i++)
        if (d->files[i].mem) b += (size_t)d->files[i].n_tokens * (size_t)d->files[i].width;
    return b;
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
