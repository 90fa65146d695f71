/* Model configuration presets, JSON parsing and validation. */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/mal.h"

const char *const mal_config_presets[] = {"tiny",      "tiny-llama3", "small", "124m",
                                          "1b",        "llama3-1b",   "llama2-7b", "32b",
                                          "70b",       "110b",        NULL};

/* The paper's models use the LLaMA tokenizer (32000 tokens) and 4096-token
 * sequences; they exist here for planning and memory estimates.  `tiny` is
 * for tests (fast, TP sizes up to 8 divide its heads and FFN), `small`
 * (~26 M parameters) for benchmarks; both use the byte-level vocabulary.
 * `124m` and `1b` are the single-GPU benchmark shapes people compare
 * trainers on (GPT-2-small-like and TinyLlama-like widths, LLaMA layers,
 * the LLaMA tokenizer's 32000 tokens): bench/gpu/ measures them against
 * PyTorch; they train on token files of that vocabulary or on synthetic
 * tokens (--data synthetic:32000, src/data_synth.h). */
#define MHA(nm, V, C, L, H, F, T)                                                                  \
    {.name = nm, .vocab = V, .d_model = C, .n_layers = L, .n_heads = H, .n_kv_heads = H,           \
     .ffn_hidden = F, .seq_len = T, .rope = {10000.0f, 0, 1.0f, 1.0f, 1.0f, 0}, .norm_eps = 1e-5f}
/* LLaMA 3's rotary scaling (rope_type "llama3"): factor, low and high
 * frequency factors, original context length. */
#define LLAMA3_ROPE(factor, orig) {500000.0f, 1, factor, 1.0f, 4.0f, orig}
/* The LLaMA 3 family's shapes: grouped-query attention, rope_theta 500000
 * with the llama3 scaling, tied embeddings at these sizes.  `tiny-llama3`
 * is `tiny` in that shape for tests: 2 key/value heads for 8 query heads
 * (TP 2 splits them, TP 4 and 8 replicate them), a vocabulary of 259,
 * which no TP size divides (the vocabulary-parallel layers' uneven split),
 * and an original context of 256, so that within its 32 positions every
 * band of the scaling turns its pairs visibly (kept, interpolated,
 * divided: a reference that ignored the scaling would not agree).
 * `llama3-1b` is Llama 3.2 1B's (sequences of 2048 for training; its
 * frequencies are those of its 131072-token context).  `llama2-7b` is
 * Llama 2 7B's (multi-head: its 32 key/value heads are its 32 heads). */
static const mal_model_config presets[] = {
    MHA("tiny", 256, 64, 4, 8, 128, 32),
    {.name = "tiny-llama3", .vocab = 259, .d_model = 64, .n_layers = 4, .n_heads = 8,
     .n_kv_heads = 2, .ffn_hidden = 128, .seq_len = 32, .tie_embeddings = 1,
     .rope = LLAMA3_ROPE(8.0f, 256), .norm_eps = 1e-5f},
    MHA("small", 256, 512, 8, 8, 1408, 256),
    MHA("124m", 32000, 768, 12, 12, 2048, 1024),
    MHA("1b", 32000, 2048, 16, 16, 5632, 2048),
    {.name = "llama3-1b", .vocab = 128256, .d_model = 2048, .n_layers = 16, .n_heads = 32,
     .n_kv_heads = 8, .ffn_hidden = 8192, .seq_len = 2048, .tie_embeddings = 1,
     .rope = LLAMA3_ROPE(32.0f, 8192), .norm_eps = 1e-5f},
    MHA("llama2-7b", 32000, 4096, 32, 32, 11008, 4096),
    MHA("32b", 32000, 6656, 60, 64, 17920, 4096),
    MHA("70b", 32000, 8192, 80, 64, 28672, 4096),
    MHA("110b", 32000, 8192, 80, 64, 49152, 4096),
};
#undef MHA
#undef LLAMA3_ROPE

int mal_config_validate(const mal_model_config *c)
{
    /* Every size is bounded (config.h says why these bounds), so that no
     * product of sizes the model computes can overflow, and a config that
     * could never be trained is refused before anything is built from it. */
#define RANGE(f, hi, why)                                                                          \
    if (c->f < 1 || c->f > (hi))                                                                   \
    return MAL_ERR(MAL_EINVAL, "model config: %s must be in [1, %d] (got %d)%s", #f, (hi), c->f, \
                   why)
    RANGE(vocab, MAL_CONFIG_MAX_VOCAB, "");
    RANGE(d_model, MAL_CONFIG_MAX_D_MODEL, "");
    RANGE(n_layers, MAL_CONFIG_MAX_LAYERS, "");
    RANGE(n_heads, c->d_model, ": at most one head per hidden unit");
    RANGE(n_kv_heads, c->n_heads, ": key/value heads are shared by the query heads");
    RANGE(ffn_hidden, MAL_CONFIG_MAX_FFN, "");
    RANGE(seq_len, MAL_CONFIG_MAX_SEQ_LEN, "");
#undef RANGE
    if (c->d_model % c->n_heads)
        return MAL_ERR(MAL_EINVAL, "model config: d_model %d is not divisible by n_heads %d",
                       c->d_model, c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        return MAL_ERR(MAL_EINVAL,
                       "model config: n_heads %d is not divisible by n_kv_heads %d (each "
                       "key/value head serves the same number of query heads)",
                       c->n_heads, c->n_kv_heads);
    if ((c->d_model / c->n_heads) % 2)
        return MAL_ERR(MAL_EINVAL,
                       "model config: head dimension d_model/n_heads = %d must be even (rotary "
                       "embedding rotates pairs)",
                       c->d_model / c->n_heads);
    if (c->tie_embeddings != 0 && c->tie_embeddings != 1)
        return MAL_ERR(MAL_EINVAL, "model config: tie_embeddings must be true or false");
    const mal_rope *r = &c->rope;
    if (!(r->theta > 0) || !isfinite(r->theta))
        return MAL_ERR(MAL_EINVAL, "model config: rope_theta must be a positive finite number");
    if (r->llama3) {
        if (!(r->factor >= 1) || !isfinite(r->factor))
            return MAL_ERR(MAL_EINVAL, "model config: rope_scaling.factor must be >= 1");
        if (!(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) ||
            !isfinite(r->high_freq_factor))
            return MAL_ERR(MAL_EINVAL,
                           "model config: rope_scaling needs 0 < low_freq_factor < "
                           "high_freq_factor (got %g and %g)",
                           (double)r->low_freq_factor, (double)r->high_freq_factor);
        if (r->original_max_pos < 1 || r->original_max_pos > MAL_CONFIG_MAX_SEQ_LEN)
            return MAL_ERR(MAL_EINVAL,
                           "model config: rope_scaling.original_max_position_embeddings must be "
                           "in [1, %d]",
                           MAL_CONFIG_MAX_SEQ_LEN);
    }
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return MAL_ERR(MAL_EINVAL, "model config: norm_eps must be in (0, 1)");
    return 0;
}

static int get_int(json_t *root, const char *key, int *out, const char *what)
{
    json_t *v = json_object_get(root, key);
    if (!v) return MAL_ERR(MAL_EFORMAT, "%s: missing field \"%s\"", what, key);
    if (!json_is_integer(v))
        return MAL_ERR(MAL_EFORMAT, "%s: field \"%s\" must be an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < -2147483647 || x > 2147483647)
        return MAL_ERR(MAL_EFORMAT, "%s: field \"%s\" out of range", what, key);
    *out = (int)x;
    return 0;
}

static int get_real(json_t *root, const char *key, float *out, float dflt, const char *what)
{
    json_t *v = json_object_get(root, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v))
        return MAL_ERR(MAL_EFORMAT, "%s: field \"%s\" must be a number", what, key);
    *out = (float)json_number_value(v);
    return 0;
}

int mal_config_from_json(mal_model_config *cfg, const char *text, const char *what)
{
    return mal_config_parse_buffer(cfg, text, strlen(text), what);
}

/* Every key of object `o` is one of `known` (n of them); `where` names the
 * object in the message.  A typo in a field name would otherwise silently
 * train another model than intended. */
static int only_known(json_t *o, const char *const *known, size_t n, const char *what,
                      const char *where)
{
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val)
    {
        size_t i;
        for (i = 0; i < n; i++)
            if (!strcmp(key, known[i])) break;
        if (i == n) return MAL_ERR(MAL_EFORMAT, "%s: unknown field \"%s%s\"", what, where, key);
    }
    return 0;
}

/* "rope_scaling": null / absent (none), or Hugging Face's llama3 object:
 * {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
 * "original_max_position_embeddings"} (the older key "type" is accepted
 * for "rope_type"). */
static int rope_scaling_from(mal_rope *r, json_t *root, const char *what)
{
    static const char *const known[] = {"rope_type",       "type",
                                        "factor",          "low_freq_factor",
                                        "high_freq_factor", "original_max_position_embeddings"};
    json_t *o = json_object_get(root, "rope_scaling");
    int rc;
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o))
        return MAL_ERR(MAL_EFORMAT, "%s: field \"rope_scaling\" must be null or an object", what);
    if ((rc = only_known(o, known, MAL_ARRAY_SIZE(known), what, "rope_scaling."))) return rc;
    json_t *t = json_object_get(o, "rope_type");
    if (!t) t = json_object_get(o, "type");
    if (!json_is_string(t) || strcmp(json_string_value(t), "llama3"))
        return MAL_ERR(MAL_EFORMAT,
                       "%s: rope_scaling.rope_type must be \"llama3\" (the only rotary scaling "
                       "supported)",
                       what);
    r->llama3 = 1;
    if ((rc = get_int(o, "original_max_position_embeddings", &r->original_max_pos, what))) return rc;
    static const char *const reals[] = {"factor", "low_freq_factor", "high_freq_factor"};
    float *dst[] = {&r->factor, &r->low_freq_factor, &r->high_freq_factor};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(reals); i++) {
        if (!json_object_get(o, reals[i]))
            return MAL_ERR(MAL_EFORMAT, "%s: missing field \"rope_scaling.%s\"", what, reals[i]);
        if ((rc = get_real(o, reals[i], dst[i], 0.0f, what))) return rc;
    }
    return 0;
}

/* The config in `root` (borrowed) into cfg, checked. */
static int config_from_root(mal_model_config *cfg, json_t *root, const char *what)
{
    static const char *const known[] = {
        "name",       "vocab",   "d_model",        "n_layers",   "n_heads",      "n_kv_heads",
        "ffn_hidden", "seq_len", "tie_embeddings", "rope_theta", "rope_scaling", "norm_eps"};
    int rc = 0;
    if (!json_is_object(root)) return MAL_ERR(MAL_EFORMAT, "%s: expected a JSON object", what);
    if ((rc = only_known(root, known, MAL_ARRAY_SIZE(known), what, ""))) return rc;
    memset(cfg, 0, sizeof *cfg);
    json_t *name = json_object_get(root, "name");
    snprintf(cfg->name, sizeof cfg->name, "%s", json_is_string(name) ? json_string_value(name) : what);
    if ((rc = get_int(root, "vocab", &cfg->vocab, what)) || (rc = get_int(root, "d_model", &cfg->d_model, what)) ||
        (rc = get_int(root, "n_layers", &cfg->n_layers, what)) ||
        (rc = get_int(root, "n_heads", &cfg->n_heads, what)) ||
        (rc = get_int(root, "ffn_hidden", &cfg->ffn_hidden, what)) ||
        (rc = get_int(root, "seq_len", &cfg->seq_len, what)) ||
        (rc = get_real(root, "norm_eps", &cfg->norm_eps, 1e-5f, what)))
        return rc;
    /* optional: multi-head attention, untied, unscaled rotary frequencies */
    cfg->n_kv_heads = cfg->n_heads;
    if (json_object_get(root, "n_kv_heads") &&
        (rc = get_int(root, "n_kv_heads", &cfg->n_kv_heads, what)))
        return rc;
    json_t *tie = json_object_get(root, "tie_embeddings");
    if (tie && !json_is_boolean(tie))
        return MAL_ERR(MAL_EFORMAT, "%s: field \"tie_embeddings\" must be true or false", what);
    cfg->tie_embeddings = tie && json_is_true(tie);
    float theta;
    if ((rc = get_real(root, "rope_theta", &theta, 10000.0f, what))) return rc;
    cfg->rope = mal_rope_plain(theta);
    if ((rc = rope_scaling_from(&cfg->rope, root, what))) return rc;
    return mal_config_validate(cfg);
}

int mal_config_parse_buffer(mal_model_config *cfg, const char *buf, size_t len, const char *what)
{
    json_t *root;
    int rc = mal_json_parse(buf, len, what, &root);
    if (rc) return rc;
    rc = config_from_root(cfg, root, what);
    json_decref(root);
    return rc;
}

int mal_config_is_preset(const char *spec)
{
    for (size_t i = 0; i < MAL_ARRAY_SIZE(presets); i++)
        if (!strcmp(spec, presets[i].name)) return 1;
    return 0;
}

int mal_config_load(mal_model_config *cfg, const char *spec)
{
    for (size_t i = 0; i < MAL_ARRAY_SIZE(presets); i++)
        if (!strcmp(spec, presets[i].name)) {
            *cfg = presets[i];
            return 0;
        }
    /* Read with a bound: a config is a few hundred bytes, and /dev/zero or
     * a pipe that never ends must not fill the memory. */
    json_t *root;
    int rc = mal_json_read(spec, "model config", MAL_CONFIG_MAX_FILE_BYTES, 0, &root);
    if (rc == MAL_ENOENT)
    {
        char names[256] = "";
        for (int i = 0; mal_config_presets[i]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     mal_config_presets[i]);
        return MAL_ERR(MAL_ENOENT,
                       "model \"%s\" is neither a preset (%s) nor a readable JSON file: no such "
                       "file",
                       spec, names);
    }
    if (rc) return rc;
    rc = config_from_root(cfg, root, spec);
    json_decref(root);
    return rc;
}

char *mal_config_to_json(const mal_model_config *c)
{
    const mal_rope *r = &c->rope;
    json_t *scaling = r->llama3 ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3",
                                            "factor", (double)r->factor, "low_freq_factor",
                                            (double)r->low_freq_factor, "high_freq_factor",
                                            (double)r->high_freq_factor,
                                            "original_max_position_embeddings",
                                            r->original_max_pos)
                                : json_null();
    if (!scaling) return NULL;
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:o, s:f}", "name",
                          c->name, "vocab", c->vocab, "d_model", c->d_model, "n_layers",
                          c->n_layers, "n_heads", c->n_heads, "n_kv_heads", c->n_kv_heads,
                          "ffn_hidden", c->ffn_hidden, "seq_len", c->seq_len, "tie_embeddings",
                          c->tie_embeddings, "rope_theta", (double)r->theta, "rope_scaling",
                          scaling, "norm_eps", (double)c->norm_eps);
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

int mal_config_equal(const mal_model_config *a, const mal_model_config *b)
{
    return a->vocab == b->vocab && a->d_model == b->d_model && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->ffn_hidden == b->ffn_hidden && a->seq_len == b->seq_len &&
           a->tie_embeddings == b->tie_embeddings && mal_rope_same(&a->rope, &b->rope) &&
           a->norm_eps == b->norm_eps;
}

int64_t mal_config_n_params(const mal_model_config *c)
{
    int64_t C = c->d_model, F = c->ffn_hidden, V = c->vocab;
    int64_t KV = (int64_t)c->n_kv_heads * (c->d_model / c->n_heads); /* key/value width */
    int64_t per_layer = 2 * C * C + 2 * C * KV + 3 * C * F + 2 * C;
    return (c->tie_embeddings ? 1 : 2) * V * C + c->n_layers * per_layer + C;
}
