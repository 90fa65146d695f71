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

const char *const mal_config_presets[] = {"tiny", "small", "124m", "1b", "32b", "70b", "110b", NULL};

/* The paper's models use the LLaMA tokenizer (32000 tokens) and 4096-token
 * sequences; they exist here for planning and memory estimates.  `tiny` is
 * for tests (fast, TP sizes up to 8 divide its heads and FFN), `small`
 * (~26 M parameters) for benchmarks; both use the byte-level vocabulary.
 * `124m` and `1b` are the single-GPU benchmark shapes people compare
 * trainers on (GPT-2-small-like and TinyLlama-like widths, LLaMA layers,
 * the LLaMA tokenizer's 32000 tokens): bench/gpu/ measures them against
 * PyTorch; they train on token files of that vocabulary or on synthetic
 * tokens (--data synthetic:32000, src/data_synth.h). */
static const mal_model_config presets[] = {
    {"tiny", 256, 64, 4, 8, 128, 32, 10000.0f, 1e-5f},
    {"small", 256, 512, 8, 8, 1408, 256, 10000.0f, 1e-5f},
    {"124m", 32000, 768, 12, 12, 2048, 1024, 10000.0f, 1e-5f},
    {"1b", 32000, 2048, 16, 16, 5632, 2048, 10000.0f, 1e-5f},
    {"32b", 32000, 6656, 60, 64, 17920, 4096, 10000.0f, 1e-5f},
    {"70b", 32000, 8192, 80, 64, 28672, 4096, 10000.0f, 1e-5f},
    {"110b", 32000, 8192, 80, 64, 49152, 4096, 10000.0f, 1e-5f},
};

int mal_config_validate(const mal_model_config *c)
{
    /* Every size is bounded (config.h says why these bounds), so that no
     * product of sizes the model computes can overflow, and a config that
     * could never be trained is refused before anything is built from it. */
#define RANGE(f, hi, why)                                                                          \
    if (c->f < 1 || c->f > (hi))                                                                   \
    return MAL_ERR(MAL_EINVAL, "model config: %s must be in [1, %d] (got %d)%s", #f, (hi), c->f, \
                   why)
    RANGE(vocab, MAL_CONFIG_MAX_VOCAB, ": tokens are stored as uint16");
    RANGE(d_model, MAL_CONFIG_MAX_D_MODEL, "");
    RANGE(n_layers, MAL_CONFIG_MAX_LAYERS, "");
    RANGE(n_heads, c->d_model, ": at most one head per hidden unit");
    RANGE(ffn_hidden, MAL_CONFIG_MAX_FFN, "");
    RANGE(seq_len, MAL_CONFIG_MAX_SEQ_LEN, "");
#undef RANGE
    if (c->d_model % c->n_heads)
        return MAL_ERR(MAL_EINVAL, "model config: d_model %d is not divisible by n_heads %d",
                       c->d_model, c->n_heads);
    if ((c->d_model / c->n_heads) % 2)
        return MAL_ERR(MAL_EINVAL,
                       "model config: head dimension d_model/n_heads = %d must be even (rotary "
                       "embedding rotates pairs)",
                       c->d_model / c->n_heads);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return MAL_ERR(MAL_EINVAL, "model config: rope_theta must be a positive finite number");
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

/* The config in `root` (borrowed) into cfg, checked. */
static int config_from_root(mal_model_config *cfg, json_t *root, const char *what)
{
    static const char *known[] = {"name",       "vocab",   "d_model",    "n_layers", "n_heads",
                                  "ffn_hidden", "seq_len", "rope_theta", "norm_eps"};
    int rc = 0;
    if (!json_is_object(root)) return MAL_ERR(MAL_EFORMAT, "%s: expected a JSON object", what);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        size_t i;
        for (i = 0; i < MAL_ARRAY_SIZE(known); i++)
            if (!strcmp(key, known[i])) break;
        if (i == MAL_ARRAY_SIZE(known)) {
            /* A typo in a field name would otherwise silently train another
             * model than intended. */
            return MAL_ERR(MAL_EFORMAT, "%s: unknown field \"%s\"", what, key);
        }
    }
    memset(cfg, 0, sizeof *cfg);
    json_t *name = json_object_get(root, "name");
    snprintf(cfg->name, sizeof cfg->name, "%s", json_is_string(name) ? json_string_value(name) : what);
    if ((rc = get_int(root, "vocab", &cfg->vocab, what)) || (rc = get_int(root, "d_model", &cfg->d_model, what)) ||
        (rc = get_int(root, "n_layers", &cfg->n_layers, what)) ||
        (rc = get_int(root, "n_heads", &cfg->n_heads, what)) ||
        (rc = get_int(root, "ffn_hidden", &cfg->ffn_hidden, what)) ||
        (rc = get_int(root, "seq_len", &cfg->seq_len, what)) ||
        (rc = get_real(root, "rope_theta", &cfg->rope_theta, 10000.0f, what)) ||
        (rc = get_real(root, "norm_eps", &cfg->norm_eps, 1e-5f, what)))
        return rc;
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
        return MAL_ERR(MAL_ENOENT,
                       "model \"%s\" is neither a preset (tiny, small, 124m, 1b, 32b, 70b, "
                       "110b) nor a readable JSON file: no such file",
                       spec);
    if (rc) return rc;
    rc = config_from_root(cfg, root, spec);
    json_decref(root);
    return rc;
}

char *mal_config_to_json(const mal_model_config *c)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f}", "name", c->name, "vocab",
                          c->vocab, "d_model", c->d_model, "n_layers", c->n_layers, "n_heads",
                          c->n_heads, "ffn_hidden", c->ffn_hidden, "seq_len", c->seq_len,
                          "rope_theta", (double)c->rope_theta, "norm_eps", (double)c->norm_eps);
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

int mal_config_equal(const mal_model_config *a, const mal_model_config *b)
{
    return a->vocab == b->vocab && a->d_model == b->d_model && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->ffn_hidden == b->ffn_hidden && a->seq_len == b->seq_len &&
           a->rope_theta == b->rope_theta && a->norm_eps == b->norm_eps;
}

int64_t mal_config_n_params(const mal_model_config *c)
{
    int64_t C = c->d_model, F = c->ffn_hidden, V = c->vocab;
    int64_t per_layer = 4 * C * C + 3 * C * F + 2 * C;
    return 2 * V * C + c->n_layers * per_layer + C;
}
