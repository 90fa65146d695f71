/* Export of a snapshot to the Hugging Face LlamaForCausalLM format
 * (config.json + model.safetensors), streamed tensor by tensor with bounded
 * memory.  See export.h for the format, the names and the q/k permutation. */
#include "export.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "snapshot.h"
#include "src/config.h"
#include "src/model.h"

int mal_export_hf_name(const char *name, char *out, size_t len, int *permute)
{
    static const struct {
        const char *mal, *hf;
        int permute;
    } layer_map[] = {
        {"attn_norm", "input_layernorm.weight", 0}, {"wq", "self_attn.q_proj.weight", 1},
        {"wk", "self_attn.k_proj.weight", 1},       {"wv", "self_attn.v_proj.weight", 0},
        {"wo", "self_attn.o_proj.weight", 0},       {"mlp_norm", "post_attention_layernorm.weight", 0},
        {"w1", "mlp.gate_proj.weight", 0},          {"w3", "mlp.up_proj.weight", 0},
        {"w2", "mlp.down_proj.weight", 0},
    };
    const char *hf = NULL;
    int layer = -1, n = 0, perm = 0;
    if (!strcmp(name, "tok_embedding"))
        hf = "model.embed_tokens.weight";
    else if (!strcmp(name, "final_norm"))
        hf = "model.norm.weight";
    else if (!strcmp(name, "lm_head"))
        hf = "lm_head.weight";
    else if (sscanf(name, "layers.%d.%n", &layer, &n) == 1 && n > 0 && layer >= 0) {
        for (size_t i = 0; i < MAL_ARRAY_SIZE(layer_map); i++)
            if (!strcmp(name + n, layer_map[i].mal)) {
                hf = layer_map[i].hf;
                perm = layer_map[i].permute;
            }
    }
    if (!hf) return MAL_ERR(MAL_EINVAL, "export: no Hugging Face name for tensor '%s'", name);
    int w = layer >= 0 ? snprintf(out, len, "model.layers.%d.%s", layer, hf)
                       : snprintf(out, len, "%s", hf);
    if (w < 0 || (size_t)w >= len) return MAL_ERR(MAL_EINVAL, "export: name '%s' too long", name);
    if (permute) *permute = perm;
    return 0;
}

/* Output files go through mal_output (fileio.h): a regular file through a
 * temporary name, fsync and rename; an existing device or FIFO written in
 * place, never renamed over. */

/* mkdir -p */
static int make_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p) return MAL_ERR(MAL_ENOMEM, "export: out of memory");
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = '\0';
        struct stat st;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            rc = MAL_ERR(MAL_EIO, "export: cannot create directory %s: %s", p, strerror(errno));
        } else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = MAL_ERR(MAL_EINVAL, "export: %s exists and is not a directory", p);
        }
        *s = c;
        if (rc || !c) break;
    }
    free(p);
    return rc;
}

/* ---- the export ------------------------------------------------------- */

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Shortest decimal text that reads back as the same float32. */
static void float_text(char *out, size_t len, float x)
{
    if (x == (float)(long long)x && x > -1e15f && x < 1e15f) {
        snprintf(out, len, "%.1f", (double)x); /* 10000.0, not 1e+04 */
        return;
    }
    for (int p = 1; p <= 9; p++) {
        snprintf(out, len, "%.*g", p, (double)x);
        if ((float)strtod(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".en")) strncat(out, ".0", len - strlen(out) - 1);
}

static int write_config(const char *dir, const mal_model_config *c, int dtype)
{
    char path[4096], eps[32], theta[32];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return MAL_ERR(MAL_EINVAL, "export: output path %s too long", dir);
    float_text(eps, sizeof eps, c->norm_eps);
    float_text(theta, sizeof theta, c->rope_theta);
    char *text = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&text, &n);
    if (!m) return MAL_ERR(MAL_ENOMEM, "export: out of memory");
    fprintf(m,
            "{\n"
            "  \"architectures\": [\"LlamaForCausalLM\"],\n"
            "  \"model_type\": \"llama\",\n"
            "  \"vocab_size\": %d,\n"
            "  \"hidden_size\": %d,\n"
            "  \"intermediate_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n"
            "  \"head_dim\": %d,\n"
            "  \"max_position_embeddings\": %d,\n"
            "  \"rms_norm_eps\": %s,\n"
            "  \"rope_theta\": %s,\n"
            "  \"rope_scaling\": null,\n"
            "  \"hidden_act\": \"silu\",\n"
            "  \"attention_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n"
            "  \"mlp_bias\": false,\n"
            "  \"tie_word_embeddings\": false,\n"
            "  \"initializer_range\": 0.02,\n"
            "  \"bos_token_id\": null,\n"
            "  \"eos_token_id\": null,\n"
            "  \"pad_token_id\": null,\n"
            "  \"use_cache\": true,\n"
            "  \"torch_dtype\": \"%s\"\n"
            "}\n",
            c->vocab, c->d_model, c->ffn_hidden, c->n_layers, c->n_heads, c->n_heads,
            c->d_model / c->n_heads, c->seq_len, eps, theta,
            dtype == MAL_EXPORT_BF16 ? "bfloat16" : "float32");
    if (fclose(m) != 0) {
        free(text);
        return MAL_ERR(MAL_ENOMEM, "export: out of memory");
    }
    int rc = mal_output_write_file(path, text, n);
    free(text);
    return rc;
}

/* Index of snapshot tensor `name` (the tensors are in byte-wise name
 * order), or -1. */
static int find_tensor(const mal_snapshot *s, const char *name, mal_snap_tensor *info)
{
    int lo = 0, hi = mal_snapshot_n_tensors(s) - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (mal_snapshot_tensor_info(s, mid, info)) return -1;
        int c = strcmp(info->name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Check that the snapshot's parameters are exactly the model's tensors,
 * with their shapes. */
static int check_tensors(const mal_snapshot *s, const mal_tensor_info *t, int n, const char *dir)
{
    int n_param = 0;
    mal_snap_tensor info;
    for (int i = 0; i < mal_snapshot_n_tensors(s); i++)
        if (!mal_snapshot_tensor_info(s, i, &info) && !strncmp(info.name, "param/", 6)) n_param++;
    for (int i = 0; i < n; i++) {
        char name[96];
        snprintf(name, sizeof name, "param/%s", t[i].name);
        if (find_tensor(s, name, &info) < 0)
            return MAL_ERR(MAL_EMISMATCH, "snapshot %s lacks tensor %s of its model", dir, name);
        int same = info.ndim == t[i].ndim;
        for (int d = 0; same && d < t[i].ndim; d++)
            same = info.shape[d] == t[i].shape[d];
        if (!same)
            return MAL_ERR(MAL_EMISMATCH, "snapshot %s: tensor %s has another shape than its model's",
                           dir, name);
    }
    if (n_param != n)
        return MAL_ERR(MAL_EMISMATCH,
                       "snapshot %s holds %d parameter tensors but its model has %d: it was not "
                       "written by this version of Malleus",
                       dir, n_param, n);
    return 0;
}

int mal_export_safetensors_header(mal_output *f, const json_t *header, size_t *bytes)
{
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t tl = text ? strlen(text) : 0, padded = (tl + 7) / 8 * 8;
    char *buf = text ? realloc(text, padded) : NULL;
    if (!buf) {
        free(text);
        return MAL_ERR(MAL_ENOMEM, "safetensors: out of memory for the header");
    }
    memset(buf + tl, ' ', padded - tl);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    int rc = mal_output_write(f, len8, 8);
    if (!rc) rc = mal_output_write(f, buf, padded);
    free(buf);
    if (!rc && bytes) *bytes = 8 + padded;
    return rc;
}

/* The safetensors header of the export (owned by the caller). */
static int make_header(const mal_tensor_info *t, int n, int dtype, const mal_snap_meta *meta,
                       json_t **out)
{
    const size_t esize = dtype == MAL_EXPORT_BF16 ? 2 : 4;
    char step[32], hf[128];
    snprintf(step, sizeof step, "%lld", (long long)meta->step);
    json_t *h = json_object();
    json_t *md = json_pack("{s:s, s:s, s:s, s:s}", "format", "pt", "malleus_step", step,
                           "malleus_config", meta->config_json ? meta->config_json : "",
                           "malleus_rotary", "rotate_half (q/k rows permuted from interleaved "
                                             "pairs)");
    int rc = 0;
    if (!h || !md || json_object_set_new(h, "__metadata__", md)) {
        rc = MAL_ERR(MAL_ENOMEM, "export: out of memory");
        goto out;
    }
    uint64_t off = 0;
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = mal_export_hf_name(t[i].name, hf, sizeof hf, NULL))) break;
        uint64_t bytes = (uint64_t)t[i].shape[0] * (uint64_t)(t[i].ndim == 2 ? t[i].shape[1] : 1) *
                         esize;
        json_t *shape = t[i].ndim == 2
                            ? json_pack("[I, I]", (json_int_t)t[i].shape[0], (json_int_t)t[i].shape[1])
                            : json_pack("[I]", (json_int_t)t[i].shape[0]);
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", esize == 2 ? "BF16" : "F32",
                              "shape", shape, "data_offsets", (json_int_t)off,
                              (json_int_t)(off + bytes));
        if (!e || json_object_set_new(h, hf, e)) rc = MAL_ERR(MAL_ENOMEM, "export: out of memory");
        off += bytes;
    }
    if (!rc) {
        *out = h;
        return 0;
    }
out:
    json_decref(h);
    return rc;
}

/* Within every head of rows [0, rows) (rows a multiple of hd) of a q or k
 * projection, row 2i + s becomes row s*hd/2 + i.  scratch: hd*cols floats. */
static void permute_heads(float *x, int64_t rows, int64_t cols, int hd, float *scratch)
{
    const size_t row_bytes = (size_t)cols * sizeof(float);
    for (int64_t h0 = 0; h0 < rows; h0 += hd) {
        float *head = x + h0 * cols;
        for (int i = 0; i < hd / 2; i++)
            for (int s = 0; s < 2; s++)
                memcpy(scratch + ((int64_t)s * (hd / 2) + i) * cols, head + (2 * i + s) * cols,
                       row_bytes);
        memcpy(head, scratch, (size_t)hd * row_bytes);
    }
}

/* In place: n floats -> the output's little-endian bytes (F32 or BF16). */
static size_t encode(float *x, size_t n, int dtype)
{
    const int swap = !host_is_little_endian();
    if (dtype == MAL_EXPORT_BF16) {
        /* Forward in place is safe: output element i (2 bytes at 2i) never
         * overwrites an input element not yet read (4 bytes at 4i). */
        unsigned char *o = (unsigned char *)x;
        for (size_t i = 0; i < n; i++) {
            uint16_t b = mal_bf16_from_f32(x[i]);
            o[2 * i] = (unsigned char)(b & 0xff);
            o[2 * i + 1] = (unsigned char)(b >> 8);
        }
        return 2 * n;
    }
    if (swap) {
        unsigned char *o = (unsigned char *)x;
        for (size_t i = 0; i < n; i++) {
            unsigned char t = o[4 * i];
            o[4 * i] = o[4 * i + 3], o[4 * i + 3] = t;
            t = o[4 * i + 1];
            o[4 * i + 1] = o[4 * i + 2], o[4 * i + 2] = t;
        }
    }
    return 4 * n;
}

/* OUT_DIR among the snapshot's own files -- its step directory, the
 * snapshot directory above it, or a directory inside a step directory --
 * would put the export where retention removes it and next to what it
 * reads: refused. */
static int check_out_dir(const char *step_dir, const char *out_dir)
{
    char snapdir[4096];
    snprintf(snapdir, sizeof snapdir, "%s", step_dir);
    char *slash = strrchr(snapdir, '/');
    if (slash && slash != snapdir)
        *slash = '\0';
    else
        snprintf(snapdir, sizeof snapdir, "%s", slash ? "/" : ".");
    struct stat a, b;
    if ((stat(out_dir, &a) == 0 && stat(step_dir, &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino) ||
        mal_snapshot_dir_owns(out_dir, step_dir) || mal_snapshot_dir_owns(snapdir, out_dir))
        return MAL_ERR(MAL_EINVAL,
                       "OUT_DIR %s is the snapshot's own directory or lies inside it (%s): give "
                       "a directory outside the snapshot",
                       out_dir, step_dir);
    return 0;
}

int mal_export_hf(const mal_export_options *o, mal_export_stats *st)
{
    double t0 = mal_now();
    char step_dir[4096], path[4096];
    mal_snapshot *s = NULL;
    mal_tensor_info *t = NULL;
    float *buf = NULL, *scratch = NULL;
    json_t *header = NULL;
    size_t header_len = 0;
    uint64_t written = 0;
    int n = 0, rc;
    mal_output f;
    int f_open = 0;

    if (o->dtype != MAL_EXPORT_F32 && o->dtype != MAL_EXPORT_BF16)
        return MAL_ERR(MAL_EINVAL, "export: dtype must be fp32 or bf16");
    if ((rc = mal_snapshot_resolve(o->snapshot, step_dir, sizeof step_dir)) ||
        (rc = check_out_dir(step_dir, o->out_dir)))
        return rc;
    if ((rc = mal_snapshot_open(&s, step_dir))) return rc;
    const mal_snap_meta *meta = mal_snapshot_meta(s);
    mal_model_config cfg;
    if (!meta->config_json || mal_config_from_json(&cfg, meta->config_json, step_dir)) {
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s has no valid model config", step_dir);
        goto out;
    }
    mal_model_part full = mal_model_part_full(&cfg);
    if ((rc = mal_model_layout(&cfg, &full, &t, &n, NULL))) goto out;
    if ((rc = check_tensors(s, t, n, step_dir))) goto out;
    if ((rc = make_header(t, n, o->dtype, meta, &header))) goto out;

    /* The row buffer: mem_bytes, but at least one head's rows of the
     * widest matrix (a q/k chunk never splits a head). */
    const int hd = cfg.d_model / cfg.n_heads;
    int64_t max_cols = 1;
    for (int i = 0; i < n; i++)
        if (t[i].ndim == 2) max_cols = MAL_MAX(max_cols, t[i].shape[1]);
    size_t mem = o->mem_bytes ? o->mem_bytes : MAL_EXPORT_MEM_DEFAULT;
    size_t buf_floats = MAL_MAX(mem / sizeof(float), (size_t)hd * (size_t)max_cols);
    buf = malloc(buf_floats * sizeof(float));
    scratch = malloc((size_t)hd * (size_t)max_cols * sizeof(float));
    if (!buf || !scratch) {
        rc = MAL_ERR(MAL_ENOMEM, "export: out of memory for a %zu-byte buffer",
                     buf_floats * sizeof(float));
        goto out;
    }

    if ((rc = make_dirs(o->out_dir))) goto out;
    if (snprintf(path, sizeof path, "%s/model.safetensors", o->out_dir) >= (int)sizeof path) {
        rc = MAL_ERR(MAL_EINVAL, "export: output path %s too long", o->out_dir);
        goto out;
    }
    if ((rc = mal_output_open(&f, path))) goto out;
    f_open = 1;
    if ((rc = mal_export_safetensors_header(&f, header, &header_len))) goto out;
    written = header_len;

    /* Tensor by tensor, in header order, a bounded block of rows at a
     * time; q/k blocks hold whole heads so each is permuted in place. */
    for (int i = 0; i < n && !rc; i++) {
        int permute = 0;
        char hf[128], name[96];
        if ((rc = mal_export_hf_name(t[i].name, hf, sizeof hf, &permute))) break;
        snprintf(name, sizeof name, "param/%s", t[i].name);
        const int64_t rows = t[i].shape[0], cols = t[i].ndim == 2 ? t[i].shape[1] : 1;
        const int64_t unit = permute ? hd : 1;
        int64_t step_rows = (int64_t)(buf_floats / (size_t)cols) / unit * unit;
        if (t[i].ndim == 1) step_rows = rows; /* a norm weight: one small block */
        for (int64_t r0 = 0; r0 < rows && !rc; r0 += step_rows) {
            int64_t nr = MAL_MIN(step_rows, rows - r0);
            mal_snap_tensor want = {.name = name, .ndim = t[i].ndim, .data = buf};
            want.shape[0] = rows, want.offset[0] = r0, want.extent[0] = nr;
            if (t[i].ndim == 2) want.shape[1] = cols, want.offset[1] = 0, want.extent[1] = cols;
            if ((rc = mal_snapshot_read_block(s, &want))) break;
            if (permute) permute_heads(buf, nr, cols, hd, scratch);
            size_t bytes = encode(buf, (size_t)(nr * cols), o->dtype);
            if ((rc = mal_output_write(&f, buf, bytes))) break;
            written += bytes;
        }
    }
    if (rc) goto out;
    f_open = 0;
    if ((rc = mal_output_commit(&f))) goto out;
    /* config.json last: a directory with it holds a complete export */
    if ((rc = write_config(o->out_dir, &cfg, o->dtype))) goto out;
    if (st) {
        memset(st, 0, sizeof *st);
        st->step = meta->step;
        st->n_tensors = n;
        st->bytes_read = mal_snapshot_bytes_read(s);
        st->bytes_written = written;
        st->seconds = mal_now() - t0;
        snprintf(st->step_dir, sizeof st->step_dir, "%s", step_dir);
    }
out:
    if (f_open) mal_output_discard(&f);
    mal_snapshot_close(s);
    free(t);
    free(buf);
    free(scratch);
    json_decref(header);
    return rc;
}
