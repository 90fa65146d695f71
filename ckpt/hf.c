/* A Hugging Face LlamaForCausalLM checkpoint directory read as Malleus
 * tensors: config.json to a model config, safetensors headers checked
 * against the model, blocks read with pread and converted (hf.h). */
#include "hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"
#include "export.h"
#include "safetensors.h"
#include "src/model.h"

/* One safetensors file of the checkpoint. */
typedef struct {
    char *path;
    mal_st_header hdr;
} hf_file;

/* One Malleus parameter tensor and where its data lies. */
typedef struct {
    char name[48]; /* Malleus name ("layers.0.wq") */
    char hf[96];   /* the checkpoint's ("model.layers.0.self_attn.q_proj.weight") */
    int ndim;
    int64_t shape[2];
    int permute; /* q/k: rows permuted within each head */
    int file;    /* index into files */
    const mal_st_tensor *st;
} hf_tensor;

struct mal_hf {
    mal_model_config cfg;
    char dir[PATH_MAX];
    char *index_path; /* model.safetensors.index.json, or NULL */
    hf_file *files;
    int n_files;
    hf_tensor *t;
    int n;
    int round;
    char unknown[512];
    char dtype[8];
    uint64_t bytes_read;
    unsigned char *chunk; /* MAL_HF_READ_CHUNK_BYTES */
};

/* ---- config.json ---------------------------------------------------------- */

/* Fields that describe the model, read below; and fields that do not change
 * what the model computes (ids, generation and loading settings, versions),
 * ignored without a word. */
static const char *const handled[] = {
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "attention_dropout",
    "pretraining_tp",
    "quantization_config",
};
static const char *const harmless[] = {
    "bos_token_id",         "eos_token_id",  "pad_token_id",
    "initializer_range",    "use_cache",     "torch_dtype",
    "transformers_version", "_name_or_path", "output_attentions",
    "output_hidden_states", "return_dict",   "tokenizer_class",
    "_attn_implementation", "is_decoder",    "use_return_dict",
    "output_past",
};

static int in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i])) return 1;
    return 0;
}

/* An integer field: required (dflt < 0) or defaulting to dflt. */
static int hf_int(json_t *root, const char *key, int dflt, const char *what, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (dflt < 0)
            return MAL_ERR(MAL_EFORMAT,
                           "%s: missing field \"%s\" (a LlamaForCausalLM config has it)", what,
                           key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT_MAX)
        return MAL_ERR(MAL_EFORMAT, "%s: field \"%s\" must be a positive integer", what, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* A boolean field that must be false (absent: false). */
static int hf_false(json_t *root, const char *key, const char *what, const char *why)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_false(v) || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return MAL_ERR(MAL_EFORMAT, "%s: field \"%s\" must be true or false", what, key);
    return MAL_ERR(MAL_EINVAL, "%s: \"%s\": true is not supported: %s", what, key, why);
}

int mal_hf_parse_config(const char *text, size_t len, const char *what, const mal_hf_options *o,
                        mal_model_config *cfg, char *unknown, size_t unknown_len)
{
    json_t *root = NULL, *m = NULL;
    char *mtext = NULL;
    int rc = mal_json_parse(text, len, what, &root);
    if (rc) return rc;
    if (unknown && unknown_len) unknown[0] = '\0';
    if (!json_is_object(root)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: not a JSON object", what);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (in_list(key, handled, MAL_ARRAY_SIZE(handled)) ||
            in_list(key, harmless, MAL_ARRAY_SIZE(harmless)) || !unknown)
            continue;
        size_t k = strlen(unknown);
        if (k + strlen(key) + 8 < unknown_len)
            snprintf(unknown + k, unknown_len - k, "%s%s", k ? ", " : "", key);
        else if (k + 4 < unknown_len && !strstr(unknown, "..."))
            snprintf(unknown + k, unknown_len - k, ", ...");
    }
    /* the architecture: a decoder of LLaMA's layers and nothing else */
    json_t *mt = json_object_get(root, "model_type"),
           *arch = json_object_get(root, "architectures");
    if (!json_is_string(mt) || strcmp(json_string_value(mt), "llama")) {
        rc = MAL_ERR(MAL_EINVAL,
                     "%s: \"model_type\" is %s%s%s: only \"llama\" (LlamaForCausalLM) is "
                     "supported",
                     what, json_is_string(mt) ? "\"" : "",
                     json_is_string(mt) ? json_string_value(mt) : "missing",
                     json_is_string(mt) ? "\"" : "");
        goto out;
    }
    if (arch && !json_is_null(arch)) {
        json_t *a0 = json_array_get(arch, 0);
        if (!json_is_array(arch) || json_array_size(arch) != 1 || !json_is_string(a0) ||
            strcmp(json_string_value(a0), "LlamaForCausalLM")) {
            rc = MAL_ERR(MAL_EINVAL,
                         "%s: \"architectures\" is %s: only [\"LlamaForCausalLM\"] is supported "
                         "(a causal language model with LLaMA's head)",
                         what, json_is_string(a0) ? json_string_value(a0) : "not one name");
            goto out;
        }
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        rc = MAL_ERR(MAL_EINVAL, "%s: \"hidden_act\" is %s: only \"silu\" (SwiGLU) is supported",
                     what, json_is_string(act) ? json_string_value(act) : "not a string");
        goto out;
    }
    if ((rc = hf_false(root, "attention_bias", what,
                       "Malleus's attention projections have no bias")) ||
        (rc = hf_false(root, "mlp_bias", what, "Malleus's MLP projections have no bias")))
        goto out;
    json_t *drop = json_object_get(root, "attention_dropout");
    if (drop && !json_is_null(drop) && (!json_is_number(drop) || json_number_value(drop) != 0)) {
        rc = MAL_ERR(MAL_EINVAL,
                     "%s: \"attention_dropout\" must be 0: Malleus trains without dropout", what);
        goto out;
    }
    if (json_object_get(root, "quantization_config")) {
        rc = MAL_ERR(MAL_EINVAL,
                     "%s: \"quantization_config\": a quantized checkpoint is not supported "
                     "(give the unquantized weights)",
                     what);
        goto out;
    }
    json_t *ptp = json_object_get(root, "pretraining_tp");
    if (ptp && !json_is_null(ptp) && (!json_is_integer(ptp) || json_integer_value(ptp) < 1)) {
        /* any positive value computes the same model (in slices) */
        rc = MAL_ERR(MAL_EFORMAT, "%s: \"pretraining_tp\" must be a positive integer", what);
        goto out;
    }
    int vocab, d, ffn, layers, heads, kv, seq;
    if ((rc = hf_int(root, "vocab_size", -1, what, &vocab)) ||
        (rc = hf_int(root, "hidden_size", -1, what, &d)) ||
        (rc = hf_int(root, "intermediate_size", -1, what, &ffn)) ||
        (rc = hf_int(root, "num_hidden_layers", -1, what, &layers)) ||
        (rc = hf_int(root, "num_attention_heads", -1, what, &heads)) ||
        (rc = hf_int(root, "num_key_value_heads", heads, what, &kv)) ||
        (rc = hf_int(root, "max_position_embeddings", o && o->seq_len > 0 ? o->seq_len : -1, what,
                     &seq)))
        goto out;
    if (o && o->seq_len > 0) seq = o->seq_len;
    int hd = d % heads == 0 ? d / heads : 0;
    json_t *hdj = json_object_get(root, "head_dim");
    if (hdj && !json_is_null(hdj) &&
        (!json_is_integer(hdj) || hd == 0 || json_integer_value(hdj) != hd)) {
        rc = MAL_ERR(MAL_EINVAL,
                     "%s: \"head_dim\" must be hidden_size / num_attention_heads (%d / %d): "
                     "Malleus's heads span the hidden size",
                     what, d, heads);
        goto out;
    }
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie) && !json_is_null(tie)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: \"tie_word_embeddings\" must be true or false", what);
        goto out;
    }
    json_t *eps = json_object_get(root, "rms_norm_eps"),
           *theta = json_object_get(root, "rope_theta");
    if ((eps && !json_is_number(eps)) || (theta && !json_is_number(theta))) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: \"rms_norm_eps\" and \"rope_theta\" must be numbers", what);
        goto out;
    }
    /* The Malleus config, through its own parser: the rotary scaling in
     * Hugging Face's form is its form too, so a rope_type Malleus does not
     * compute (linear, dynamic, yarn, ...) is refused there by name, and
     * every value is validated as for --model. */
    char name[64];
    const char *base = strrchr(what, '/');
    snprintf(name, sizeof name, "hf:%.56s", base && base[1] ? base + 1 : what);
    json_t *scaling = json_object_get(root, "rope_scaling");
    m = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:O, s:f}", "name", name,
                  "vocab", vocab, "d_model", d, "n_layers", layers, "n_heads", heads, "n_kv_heads",
                  kv, "ffn_hidden", ffn, "seq_len", seq, "tie_embeddings", tie && json_is_true(tie),
                  "rope_theta", theta ? json_number_value(theta) : 10000.0, "rope_scaling",
                  scaling ? scaling : json_null(), "norm_eps",
                  eps ? json_number_value(eps) : 1e-6 /* LlamaConfig's default */);
    if (!m || !(mtext = json_dumps(m, 0))) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
        goto out;
    }
    rc = mal_config_parse_buffer(cfg, mtext, strlen(mtext), what);
out:
    free(mtext);
    json_decref(m);
    json_decref(root);
    return rc;
}

/* ---- files ---------------------------------------------------------------- */

/* pread all of [off, off + n) of `path` open at fd. */
static int read_at(int fd, const char *path, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return MAL_ERR(MAL_EIO, "cannot read %s: %s", path, strerror(errno));
        if (r == 0)
            return MAL_ERR(MAL_ECORRUPT,
                           "%s ends at byte %llu, before the data its header "
                           "promises (truncated or replaced since?)",
                           path, (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}

/* Open `path` for reading: a regular file, never blocking on a FIFO. */
static int open_regular(const char *path, int *fd, uint64_t *bytes)
{
    struct stat st;
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0)
        return MAL_ERR(errno == ENOENT ? MAL_ENOENT : MAL_EIO, "cannot open %s: %s", path,
                       strerror(errno));
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return MAL_ERR(MAL_EINVAL, "%s is not a regular file", path);
    }
    *bytes = (uint64_t)st.st_size;
    return 0;
}

/* Parse the header of file f->path. */
static int load_header(hf_file *f)
{
    int fd;
    uint64_t size, n;
    unsigned char first[8];
    char *json = NULL;
    int rc = open_regular(f->path, &fd, &size);
    if (rc) return rc;
    if (size < 8) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: %llu bytes, too short for a safetensors file", f->path,
                     (unsigned long long)size);
        goto out;
    }
    if ((rc = read_at(fd, f->path, first, 8, 0)) ||
        (rc = mal_st_header_length(first, size, f->path, &n)))
        goto out;
    if (!(json = malloc(n ? n : 1))) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory for a %llu-byte header", f->path,
                     (unsigned long long)n);
        goto out;
    }
    if ((rc = read_at(fd, f->path, json, n, 8))) goto out;
    rc = mal_st_parse_header(json, n, size, f->path, &f->hdr);
out:
    free(json);
    close(fd);
    return rc;
}

static int add_file(mal_hf *h, const char *name)
{
    hf_file *f = &h->files[h->n_files];
    size_t n = strlen(h->dir) + strlen(name) + 2;
    if (!(f->path = malloc(n))) return MAL_ERR(MAL_ENOMEM, "out of memory");
    snprintf(f->path, n, "%s/%s", h->dir, name);
    h->n_files++;
    return load_header(f);
}

/* The checkpoint's files: model.safetensors, else the index (into *x,
 * which stays empty for a single file) and the files it names. */
static int load_files(mal_hf *h, mal_st_index *x)
{
    char path[PATH_MAX + 64];
    struct stat st;
    memset(x, 0, sizeof *x);
    snprintf(path, sizeof path, "%s/model.safetensors", h->dir);
    if (stat(path, &st) == 0) {
        if (!(h->files = calloc(1, sizeof *h->files))) return MAL_ERR(MAL_ENOMEM, "out of memory");
        return add_file(h, "model.safetensors");
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", h->dir);
    if (stat(path, &st) != 0) {
        snprintf(path, sizeof path, "%s/pytorch_model.bin", h->dir);
        int pt = stat(path, &st) == 0;
        snprintf(path, sizeof path, "%s/pytorch_model.bin.index.json", h->dir);
        pt |= stat(path, &st) == 0;
        return MAL_ERR(MAL_ENOENT,
                       "%s holds no model.safetensors nor model.safetensors.index.json%s", h->dir,
                       pt ? " (pytorch_model.bin is not read: save the model with "
                            "safe_serialization=True, transformers' default)"
                          : "");
    }
    unsigned char *text = NULL;
    size_t len;
    int rc = mal_file_read(path, "checkpoint index", MAL_ST_MAX_INDEX_BYTES, MAL_READ_REGULAR,
                           &text, &len);
    if (rc) return rc;
    rc = mal_st_parse_index((const char *)text, len, path, x);
    free(text);
    if (rc) return rc;
    if (!(h->index_path = strdup(path)) ||
        !(h->files = calloc((size_t)x->n_files, sizeof *h->files)))
        return MAL_ERR(MAL_ENOMEM, "out of memory");
    for (int i = 0; i < x->n_files && !rc; i++)
        rc = add_file(h, x->files[i]);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The file that holds checkpoint tensor `hf` (-1: none): the one the
 * index names, or the single file. */
static int file_of(const mal_hf *h, const mal_st_index *x, const char *hf)
{
    if (!h->index_path) return mal_st_find(&h->files[0].hdr, hf) ? 0 : -1;
    char **k = bsearch(&hf, x->names, (size_t)x->n, sizeof *x->names, cmp_str);
    return k ? x->file[k - x->names] : -1;
}

/* A tensor of the checkpoint that is not one of the model's: refused,
 * unless a buffer transformers recomputes itself. */
static int check_extra(const mal_hf *h, const char *name, const char *where)
{
    size_t n = strlen(name);
    if (n > 21 && !strcmp(name + n - 21, ".rotary_emb.inv_freq")) return 0;
    if (n > 5 && !strcmp(name + n - 5, ".bias"))
        return MAL_ERR(MAL_EINVAL,
                       "%s holds the bias tensor '%s': Malleus's projections have no bias "
                       "(attention_bias, mlp_bias)",
                       where, name);
    if (!strcmp(name, "lm_head.weight") && h->cfg.tie_embeddings)
        return MAL_ERR(MAL_EMISMATCH,
                       "%s holds lm_head.weight but config.json says tie_word_embeddings: true "
                       "(the output layer is the embedding): set tie_word_embeddings false to "
                       "keep lm_head, or remove it",
                       where);
    return MAL_ERR(MAL_EMISMATCH,
                   "%s holds the tensor '%s', which a LlamaForCausalLM of this config does not "
                   "have",
                   where, name);
}

/* The model's tensors, each found in its file with its shape and a dtype
 * that converts; then nothing else in the checkpoint. */
static int match_tensors(mal_hf *h, const mal_st_index *x)
{
    mal_tensor_info *t = NULL;
    int n = 0, rc;
    mal_model_part full = mal_model_part_full(&h->cfg);
    if ((rc = mal_model_layout(&h->cfg, &full, &t, &n, NULL))) return rc;
    if (!(h->t = calloc((size_t)n, sizeof *h->t))) {
        free(t);
        return MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    const char *where = h->index_path ? h->index_path : h->files[0].path;
    int dt = -1;
    for (int i = 0; i < n && !rc; i++) {
        hf_tensor *y = &h->t[h->n++];
        const char *hf = y->hf;
        snprintf(y->name, sizeof y->name, "%s", t[i].name);
        y->ndim = t[i].ndim;
        y->shape[0] = t[i].shape[0];
        y->shape[1] = t[i].ndim == 2 ? t[i].shape[1] : 1;
        if ((rc = mal_export_hf_name(t[i].name, y->hf, sizeof y->hf, &y->permute))) break;
        if ((y->file = file_of(h, x, hf)) < 0) {
            rc = MAL_ERR(MAL_EMISMATCH, "%s lacks the tensor '%s'%s", where, hf,
                         !strcmp(hf, "lm_head.weight")
                             ? " (config.json says tie_word_embeddings: false)"
                             : "");
            break;
        }
        const hf_file *f = &h->files[y->file];
        if (!(y->st = mal_st_find(&f->hdr, hf))) {
            rc = MAL_ERR(MAL_EFORMAT, "%s maps '%s' to %s, which does not hold it", where, hf,
                         f->path);
            break;
        }
        const mal_st_tensor *s = y->st;
        if (s->dtype != MAL_ST_F32 && s->dtype != MAL_ST_F16 && s->dtype != MAL_ST_BF16) {
            rc = MAL_ERR(MAL_EINVAL, "%s: tensor '%s' is %s: only F32, F16 and BF16 are read",
                         f->path, hf, s->dtype_name);
            break;
        }
        if (s->ndim != y->ndim || s->shape[0] != y->shape[0] ||
            (y->ndim == 2 && s->shape[1] != y->shape[1])) {
            rc = MAL_ERR(MAL_EMISMATCH,
                         "%s: tensor '%s' has shape [%lld%s%lld] but config.json makes it "
                         "[%lld%s%lld]",
                         f->path, hf, (long long)(s->ndim ? s->shape[0] : 0),
                         s->ndim > 1 ? ", " : "", (long long)(s->ndim > 1 ? s->shape[1] : 0),
                         (long long)y->shape[0], y->ndim == 2 ? ", " : "",
                         (long long)(y->ndim == 2 ? y->shape[1] : 0));
            break;
        }
        dt = dt < 0 || dt == s->dtype ? s->dtype : 99;
    }
    free(t);
    if (rc) return rc;
    snprintf(h->dtype, sizeof h->dtype, "%s",
             dt == MAL_ST_F32    ? "F32"
             : dt == MAL_ST_F16  ? "F16"
             : dt == MAL_ST_BF16 ? "BF16"
                                 : "mixed");
    /* every name of the checkpoint (the index's, or the single file's) is
     * one of the model's */
    int total = h->index_path ? x->n : h->files[0].hdr.n;
    for (int i = 0; i < total && !rc; i++) {
        const char *name = h->index_path ? x->names[i] : h->files[0].hdr.t[i].name;
        int found = 0;
        for (int k = 0; k < h->n && !found; k++)
            found = !strcmp(h->t[k].hf, name);
        if (!found) rc = check_extra(h, name, where);
    }
    return rc;
}

int mal_hf_open(mal_hf **out, const char *dir, const mal_hf_options *o)
{
    mal_hf *h = calloc(1, sizeof *h);
    mal_st_index x;
    unsigned char *text = NULL;
    size_t len;
    char path[PATH_MAX + 64];
    int rc;
    memset(&x, 0, sizeof x);
    *out = NULL;
    if (!h) return MAL_ERR(MAL_ENOMEM, "out of memory");
    h->round = o ? o->round : MAL_HF_AS_STORED;
    if (!realpath(dir, h->dir)) {
        rc = MAL_ERR(errno == ENOENT ? MAL_ENOENT : MAL_EINVAL, "Hugging Face checkpoint %s: %s",
                     dir, strerror(errno));
        goto fail;
    }
    snprintf(path, sizeof path, "%s/config.json", h->dir);
    if ((rc = mal_file_read(path, "config.json", MAL_HF_MAX_CONFIG_BYTES, MAL_READ_REGULAR, &text,
                            &len))) {
        if (rc == MAL_ENOENT)
            rc = MAL_ERR(MAL_ENOENT,
                         "%s holds no config.json: not a Hugging Face checkpoint "
                         "directory",
                         dir);
        goto fail;
    }
    /* the config's name is the directory's */
    if ((rc = mal_hf_parse_config((const char *)text, len, h->dir, o, &h->cfg, h->unknown,
                                  sizeof h->unknown)))
        goto fail;
    if ((rc = load_files(h, &x)) || (rc = match_tensors(h, &x))) goto fail;
    if (!(h->chunk = malloc(MAL_HF_READ_CHUNK_BYTES))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto fail;
    }
    free(text);
    mal_st_index_fini(&x);
    *out = h;
    return 0;
fail:
    free(text);
    mal_st_index_fini(&x);
    mal_hf_close(h);
    return rc;
}

const mal_model_config *mal_hf_config(const mal_hf *h)
{
    return &h->cfg;
}
const char *mal_hf_unknown_fields(const mal_hf *h)
{
    return h->unknown;
}
const char *mal_hf_dtype(const mal_hf *h)
{
    return h->dtype;
}
uint64_t mal_hf_bytes_read(const mal_hf *h)
{
    return h->bytes_read;
}

/* ---- reading ---------------------------------------------------------------- */

/* A run of elements contiguous in the file and in the output. */
typedef struct {
    uint64_t off; /* file offset */
    size_t n;     /* elements */
    float *out;
} run;

/* Read run r of tensor y (open at fd) into r->out through the chunk. */
static int flush(mal_hf *h, const hf_tensor *y, int fd, const run *r)
{
    const mal_st_tensor *s = y->st;
    const char *path = h->files[y->file].path;
    const size_t per = MAL_HF_READ_CHUNK_BYTES / (size_t)s->esize;
    for (size_t done = 0; done < r->n;) {
        size_t k = MAL_MIN(per, r->n - done);
        int rc =
            read_at(fd, path, h->chunk, k * (size_t)s->esize, r->off + done * (size_t)s->esize);
        if (rc) return rc;
        if ((rc = mal_st_to_f32(h->chunk, s->dtype, k, r->out + done))) return rc;
        if (h->round == MAL_HF_ROUND_BF16)
            for (size_t i = 0; i < k; i++)
                r->out[done + i] = mal_f32_from_bf16(mal_bf16_from_f32(r->out[done + i]));
        h->bytes_read += k * (size_t)s->esize;
        done += k;
    }
    return 0;
}

int mal_hf_read_block(mal_hf *h, const mal_snap_tensor *want)
{
    if (strncmp(want->name, "param/", 6))
        return MAL_ERR(MAL_ENOENT,
                       "a Hugging Face checkpoint holds parameters only, not '%s' (no optimizer "
                       "state)",
                       want->name);
    const hf_tensor *y = NULL;
    for (int i = 0; i < h->n && !y; i++)
        if (!strcmp(h->t[i].name, want->name + 6)) y = &h->t[i];
    if (!y) return MAL_ERR(MAL_ENOENT, "the checkpoint's model has no tensor '%s'", want->name);
    if (want->ndim != y->ndim || want->shape[0] != y->shape[0] ||
        (y->ndim == 2 && want->shape[1] != y->shape[1]))
        return MAL_ERR(MAL_EMISMATCH, "tensor '%s' has another shape in the checkpoint",
                       want->name);
    /* as rows x columns: a 1-D tensor is one row */
    const int two = y->ndim == 2;
    const int64_t cols = two ? y->shape[1] : y->shape[0];
    const int64_t r0 = two ? want->offset[0] : 0, nr = two ? want->extent[0] : 1;
    const int64_t c0 = two ? want->offset[1] : want->offset[0];
    const int64_t nc = two ? want->extent[1] : want->extent[0];
    const int64_t rows = two ? y->shape[0] : 1;
    if (r0 < 0 || nr < 1 || r0 + nr > rows || c0 < 0 || nc < 1 || c0 + nc > cols)
        return MAL_ERR(MAL_EINVAL, "block of '%s' outside the tensor", want->name);
    const int hd = h->cfg.d_model / h->cfg.n_heads;
    const int es = y->st->esize;
    int fd;
    uint64_t size;
    int rc = open_regular(h->files[y->file].path, &fd, &size);
    if (rc) return rc;
    /* Row r of Malleus's tensor is a row of the checkpoint's: the same
     * one, or for q and k, within each head, row 2i + s is row s*hd/2 + i
     * (export.h: the inverse of the export's permutation).  Runs that are
     * contiguous in both are read together. */
    run cur = {0, 0, want->data};
    for (int64_t r = r0; r < r0 + nr && !rc; r++) {
        int64_t src = r;
        if (y->permute) {
            int64_t head = r / hd, j = r % hd;
            src = head * hd + (j % 2) * (hd / 2) + j / 2;
        }
        uint64_t off =
            y->st->begin + ((uint64_t)src * (uint64_t)cols + (uint64_t)c0) * (uint64_t)es;
        float *out = want->data + (r - r0) * nc;
        if (cur.n && cur.off + cur.n * (size_t)es == off && cur.out + cur.n == out) {
            cur.n += (size_t)nc;
            continue;
        }
        if (cur.n) rc = flush(h, y, fd, &cur);
        cur = (run){off, (size_t)nc, out};
    }
    if (!rc && cur.n) rc = flush(h, y, fd, &cur);
    close(fd);
    return rc;
}

/* ---- identity -------------------------------------------------------------- */

int mal_hf_identity(const mal_hf *h, char **out)
{
    json_t *files = json_array();
    json_t *j =
        json_pack("{s:s, s:s, s:s}", "format", "huggingface", "path", h->dir, "dtype", h->dtype);
    int rc = 0;
    if (!files || !j) rc = MAL_ERR(MAL_ENOMEM, "out of memory");
    char config[PATH_MAX + 16];
    snprintf(config, sizeof config, "%s/config.json", h->dir);
    for (int i = -2; i < h->n_files && !rc; i++) {
        const char *path = i == -2 ? config : i == -1 ? h->index_path : h->files[i].path;
        if (!path) continue;
        uint64_t bytes, fp;
        char hex[17];
        if ((rc = mal_file_fingerprint(path, "checkpoint file", &bytes, &fp))) break;
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fp);
        if (json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", path, "bytes",
                                                   (json_int_t)bytes, "fingerprint", hex)))
            rc = MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    if (!rc) {
        json_object_set(j, "files", files);
        if (!(*out = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT)))
            rc = MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    json_decref(files);
    json_decref(j);
    return rc;
}

void mal_hf_close(mal_hf *h)
{
    if (!h) return;
    for (int i = 0; i < h->n_files; i++) {
        free(h->files[i].path);
        mal_st_header_fini(&h->files[i].hdr);
    }
    free(h->files);
    free(h->index_path);
    free(h->t);
    free(h->chunk);
    free(h);
}
