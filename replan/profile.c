/* Planner inputs: cluster description, model profile (with presets derived
 * from the model shapes) and straggling rates (hand-written map or the
 * metrics file of malleus-train).  Formulas for the presets are documented in
 * replan/README.md ("Profile presets"). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "replan.h"
#include "src/config.h"

/* ---- cluster ------------------------------------------------------------- */

void mal_cluster_fini(mal_cluster *c)
{
    if (!c) return;
    free(c->node_of);
    memset(c, 0, sizeof *c);
}

int mal_cluster_regular(mal_cluster *c, int world_size, int ranks_per_node, double memory_mb)
{
    memset(c, 0, sizeof *c);
    if (world_size < 1 || world_size > MAL_REPLAN_MAX_WORLD)
        return MAL_ERR(MAL_EINVAL, "cluster: world_size must be 1..%d (got %d)",
                       MAL_REPLAN_MAX_WORLD, world_size);
    if (ranks_per_node < 1)
        return MAL_ERR(MAL_EINVAL, "cluster: ranks_per_node must be >= 1 (got %d)", ranks_per_node);
    if (world_size % ranks_per_node)
        return MAL_ERR(MAL_EINVAL,
                       "cluster: world_size %d is not divisible into nodes of %d ranks "
                       "(ranks_per_node must divide world_size)",
                       world_size, ranks_per_node);
    if (!(memory_mb > 0) || !isfinite(memory_mb))
        return MAL_ERR(MAL_EINVAL, "cluster: memory_mb must be a positive number");
    c->node_of = malloc((size_t)world_size * sizeof *c->node_of);
    if (!c->node_of) return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
    for (int r = 0; r < world_size; r++)
        c->node_of[r] = r / ranks_per_node;
    c->world_size = world_size;
    c->n_nodes = world_size / ranks_per_node;
    c->memory_mb = memory_mb;
    return 0;
}

static int cluster_from_json(mal_cluster *c, json_t *root, const char *what)
{
    static const char *const keys[] = {"world_size", "ranks_per_node", "nodes", "memory_mb", NULL};
    const char *key;
    json_t *val;
    if (!json_is_object(root))
        return MAL_ERR(MAL_EFORMAT, "%s: the cluster must be a JSON object", what);
    json_object_foreach(root, key, val)
    {
        int ok = 0;
        for (int i = 0; keys[i]; i++)
            ok |= !strcmp(key, keys[i]);
        if (!ok) return MAL_ERR(MAL_EFORMAT, "%s: unknown key \"%s\" in the cluster", what, key);
    }
    json_t *mem = json_object_get(root, "memory_mb");
    if (!json_is_number(mem) || !(json_number_value(mem) > 0))
        return MAL_ERR(MAL_EINVAL,
                       "%s: memory_mb (device memory per rank, MB) must be a positive number",
                       what);
    double memory_mb = json_number_value(mem);
    json_t *ws = json_object_get(root, "world_size");
    json_t *rpn = json_object_get(root, "ranks_per_node");
    json_t *nodes = json_object_get(root, "nodes");
    if (nodes) {
        /* two descriptions of one cluster: whichever were used, the other
         * would be silently ignored or could disagree */
        if (ws || rpn)
            return MAL_ERR(MAL_EINVAL,
                           "%s: give either \"nodes\" or \"world_size\" with \"ranks_per_node\", "
                           "not both (\"nodes\" lists every rank, so the world size is implied)",
                           what);
        if (!json_is_array(nodes) || json_array_size(nodes) == 0)
            return MAL_ERR(MAL_EFORMAT, "%s: nodes must be a non-empty array of rank lists", what);
        size_t world_z = 0;
        for (size_t n = 0; n < json_array_size(nodes); n++) {
            json_t *nl = json_array_get(nodes, n);
            if (!json_is_array(nl) || json_array_size(nl) == 0)
                return MAL_ERR(MAL_EFORMAT, "%s: nodes[%zu] must be a non-empty array of ranks",
                               what, n);
            world_z += json_array_size(nl);
        }
        if (world_z > MAL_REPLAN_MAX_WORLD)
            return MAL_ERR(MAL_EINVAL, "%s: nodes list %zu ranks; the planner handles up to %d",
                           what, world_z, MAL_REPLAN_MAX_WORLD);
        int world = (int)world_z;
        c->node_of = malloc((size_t)world * sizeof *c->node_of);
        if (!c->node_of) return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
        for (int r = 0; r < world; r++)
            c->node_of[r] = -1;
        c->world_size = world;
        c->n_nodes = (int)json_array_size(nodes);
        c->memory_mb = memory_mb;
        for (size_t n = 0; n < json_array_size(nodes); n++) {
            json_t *nl = json_array_get(nodes, n);
            for (size_t i = 0; i < json_array_size(nl); i++) {
                json_t *rv = json_array_get(nl, i);
                if (!json_is_integer(rv))
                    return MAL_ERR(MAL_EFORMAT, "%s: nodes[%zu][%zu] must be a rank number", what,
                                   n, i);
                json_int_t r = json_integer_value(rv);
                if (r < 0 || r >= world)
                    return MAL_ERR(
                        MAL_EINVAL,
                        "%s: nodes[%zu]: rank %lld is unknown (the %d listed ranks must be "
                        "0..%d)",
                        what, n, (long long)r, world, world - 1);
                if (c->node_of[r] >= 0)
                    return MAL_ERR(MAL_EINVAL, "%s: nodes[%zu]: rank %lld is listed twice", what, n,
                                   (long long)r);
                c->node_of[r] = (int)n;
            }
        }
        return 0;
    }
    if (!json_is_integer(ws) || !json_is_integer(rpn))
        return MAL_ERR(MAL_EFORMAT, "%s: give world_size and ranks_per_node (integers), or nodes",
                       what);
    /* range-check before narrowing to int, so that 2^31 is not read as -2^31 */
    json_int_t w = json_integer_value(ws), g = json_integer_value(rpn);
    if (w < 1 || w > MAL_REPLAN_MAX_WORLD)
        return MAL_ERR(MAL_EINVAL, "%s: world_size must be 1..%d (got %lld)", what,
                       MAL_REPLAN_MAX_WORLD, (long long)w);
    if (g < 1 || g > w)
        return MAL_ERR(MAL_EINVAL, "%s: ranks_per_node must be 1..world_size (%lld) (got %lld)",
                       what, (long long)w, (long long)g);
    return mal_cluster_regular(c, (int)w, (int)g, memory_mb);
}

int mal_cluster_parse_buffer(mal_cluster *c, const char *buf, size_t len, const char *what)
{
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    if (!root) return MAL_ERR(MAL_EFORMAT, "%s: line %d: %s", what, jerr.line, jerr.text);
    int rc = cluster_from_json(c, root, what);
    json_decref(root);
    return rc;
}

int mal_cluster_parse_string(mal_cluster *c, const char *json, const char *what)
{
    return mal_cluster_parse_buffer(c, json, strlen(json), what);
}

/* Inputs are read whole through the bounded reader (base/fileio.h): a
 * device or FIFO given by mistake is refused instead of read forever. */
#define JSON_INPUT_MAX ((size_t)64 << 20)
#define RATES_INPUT_MAX ((size_t)1 << 30)

int mal_cluster_read(mal_cluster *c, const char *path)
{
    memset(c, 0, sizeof *c);
    unsigned char *buf;
    size_t len;
    int rc = mal_file_read(path, "cluster", JSON_INPUT_MAX, MAL_READ_REGULAR, &buf, &len);
    if (rc) return rc;
    rc = mal_cluster_parse_buffer(c, (const char *)buf, len, path);
    free(buf);
    return rc;
}

/* ---- profile ------------------------------------------------------------- */

void mal_profile_fini(mal_profile *p)
{
    if (!p) return;
    free(p->k);
    memset(p, 0, sizeof *p);
}

static int log2i(int x)
{
    int l = 0;
    while ((1 << l) < x)
        l++;
    return (1 << l) == x ? l : -1;
}

double mal_profile_alpha(const mal_profile *p, int size)
{
    int l = log2i(size);
    if (l < 0 || l > MAL_REPLAN_MAX_TP_LOG) return 0.0;
    return p->alpha[l];
}

double mal_profile_k(const mal_profile *p, int d)
{
    if (p->n_k == 0) return 0.0;
    if (d < p->n_k) return p->k[d];
    if (p->n_k == 1) return p->k[0];
    /* 1F1B: each position further from the end keeps one more micro-batch of
     * activations, so k grows linearly; extrapolate the last step */
    double step = p->k[p->n_k - 1] - p->k[p->n_k - 2];
    return p->k[p->n_k - 1] + step * (d - (p->n_k - 1));
}

/* Device assumptions per preset; the model shapes themselves come from
 * src/config.c's presets (mal_config_load), so the two cannot drift. */
typedef struct preset_shape {
    const char *name;

    int tp;
    double flops;       /* sustained FLOP/s of one device */
    double overhead_mb; /* X */
} preset_shape;

static const preset_shape shapes[] = {
    {"tiny", 2, 2e9, 16},
    {"small", 2, 2e10, 64},
    {"32b", 8, 4e14, 3072},
    {"70b", 8, 4e14, 3072},
    {"110b", 8, 4e14, 3072},
};

#define PRESET_NK 128

int mal_profile_preset(mal_profile *p, const char *name, int micro_batch_size)
{
    return mal_profile_preset_tp(p, name, micro_batch_size, 0);
}

int mal_profile_preset_tp(mal_profile *p, const char *name, int micro_batch_size, int tp)
{
    memset(p, 0, sizeof *p);
    const preset_shape *s = NULL;
    for (size_t i = 0; i < MAL_ARRAY_SIZE(shapes); i++)
        if (!strcmp(shapes[i].name, name)) s = &shapes[i];
    if (!s)
        return MAL_ERR(
            MAL_EINVAL,
            "model profile: unknown preset \"%s\" (presets: tiny, small, 32b, 70b, 110b)", name);
    mal_model_config cfg;
    int rc = mal_config_load(&cfg, s->name);
    if (rc) return rc;
    if (micro_batch_size < 1) micro_batch_size = 1;
    const double MB = 1048576.0, b = micro_batch_size;
    const double C = cfg.d_model, F = cfg.ffn_hidden, V = cfg.vocab, T = cfg.seq_len;
    /* LLaMA-style layer: attention 4C^2, SwiGLU MLP 3CF, two norms 2C */
    const double params = 4 * C * C + 3 * C * F + 2 * C;
    /* bf16 mixed precision: bf16 weights (2) + bf16 grads (2) + fp32 master
     * weights (4) + Adam m and v (4 + 4) = 16 bytes per parameter */
    const double state = 16 * params;
    /* activations kept per layer per in-flight micro-batch with selective
     * recomputation: 34 * T * b * C bytes (Korthikanti et al. 2022) */
    const double act = 34 * T * b * C;
    int nominal = tp > 0 ? tp : s->tp;
    if (log2i(nominal) < 0 || nominal > 8 || cfg.n_heads % nominal || cfg.ffn_hidden % nominal)
        return MAL_ERR(MAL_EINVAL,
                       "model profile: preset \"%s\" at tp %d: the nominal TP size must be a "
                       "power of two up to 8 that divides n_heads (%d) and ffn_hidden (%d)",
                       name, nominal, cfg.n_heads, cfg.ffn_hidden);
    const double t = nominal;
    snprintf(p->name, sizeof p->name, "%s", s->name);
    p->n_layers = cfg.n_layers;
    p->tp = nominal;
    p->n_heads = cfg.n_heads;
    p->ffn_hidden = cfg.ffn_hidden;
    /* measured slowdown of smaller TP groups (the example profile
     * for TP 8), relative to the nominal size: alpha8[s] / alpha8[t], for
     * every size up to 8 (larger groups than the nominal one are faster per
     * layer, slower per rank) */
    static const double alpha8[] = {7.22, 3.66, 1.90, 1.0};
    for (int l = 0; l <= (s->tp == 8 ? 3 : log2i(nominal)); l++)
        p->alpha[l] = s->tp == 8 ? alpha8[l] / alpha8[log2i(nominal)]
                                 : (l == log2i(nominal) ? 1.0 : 1.9 * (1 << (log2i(nominal) - l - 1)));
    p->n_k = PRESET_NK;
    p->k = malloc(PRESET_NK * sizeof *p->k);
    if (!p->k) return MAL_ERR(MAL_ENOMEM, "model profile: out of memory");
    /* stage d positions before the last holds d + 1 micro-batches in flight
     * under 1F1B; state and activations are split over the nominal TP group */
    for (int d = 0; d < PRESET_NK; d++)
        p->k[d] = (state + act * (d + 1)) / t / MB;
    /* embedding (or LM head) state plus fp32 logits and their gradient */
    p->embed_mb = (16 * V * C + 8 * T * b * V) / t / MB;
    p->overhead_mb = s->overhead_mb;
    /* forward + backward = 6 FLOPs per parameter per token, plus attention
     * scores 12 * T^2 * C per sequence, spread over the TP group */
    p->layer_time = (6 * params * T * b + 12 * T * T * C * b) / (t * s->flops);
    p->layer_state_mb = state / MB;
    p->embed_state_mb = 16 * V * C / MB;
    p->sync_time = 0.0;
    return 0;
}

static int get_num(json_t *o, const char *key, const char *what, double *out, int required)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (required)
            return MAL_ERR(MAL_EFORMAT, "%s: %s is missing from the model profile", what, key);
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
        return MAL_ERR(MAL_EINVAL, "%s: %s must be a non-negative number", what, key);
    *out = json_number_value(v);
    return 0;
}

static int get_posint(json_t *o, const char *key, const char *what, int *out, int required)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (required)
            return MAL_ERR(MAL_EFORMAT, "%s: %s is missing from the model profile", what, key);
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
        return MAL_ERR(MAL_EINVAL, "%s: %s must be a positive integer", what, key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int profile_from_json(mal_profile *p, json_t *root, const char *what, int mbs)
{
    static const char *const keys[] = {"preset",
                                       "name",
                                       "n_layers",
                                       "tp",
                                       "n_heads",
                                       "ffn_hidden",
                                       "alpha",
                                       "layer_memory_mb",
                                       "embedding_memory_mb",
                                       "overhead_mb",
                                       "layer_time",
                                       "layer_state_mb",
                                       "embedding_state_mb",
                                       "sync_time",
                                       NULL};
    int rc;
    const char *key;
    json_t *val;
    memset(p, 0, sizeof *p);
    if (!json_is_object(root))
        return MAL_ERR(MAL_EFORMAT, "%s: the model profile must be a JSON object", what);
    json_object_foreach(root, key, val)
    {
        int ok = 0;
        for (int i = 0; keys[i]; i++)
            ok |= !strcmp(key, keys[i]);
        if (!ok)
            return MAL_ERR(MAL_EFORMAT, "%s: unknown key \"%s\" in the model profile", what, key);
    }
    json_t *pre = json_object_get(root, "preset");
    int req = 1;
    if (pre) {
        if (!json_is_string(pre)) return MAL_ERR(MAL_EFORMAT, "%s: preset must be a string", what);
        /* with "tp", the preset is derived at that nominal size (memory per
         * layer and layer time are per nominal group) */
        json_t *tpv = json_object_get(root, "tp");
        int tp = 0;
        if (tpv && (!json_is_integer(tpv) || json_integer_value(tpv) < 1 ||
                    json_integer_value(tpv) > 1024))
            return MAL_ERR(MAL_EINVAL, "%s: tp must be a positive integer", what);
        if (tpv) tp = (int)json_integer_value(tpv);
        if ((rc = mal_profile_preset_tp(p, json_string_value(pre), mbs, tp))) return rc;
        req = 0; /* the preset supplies every field; the file overrides */
    }
    json_t *nm = json_object_get(root, "name");
    if (json_is_string(nm)) snprintf(p->name, sizeof p->name, "%s", json_string_value(nm));
    if ((rc = get_posint(root, "n_layers", what, &p->n_layers, req))) return rc;
    if ((rc = get_posint(root, "tp", what, &p->tp, req))) return rc;
    if ((rc = get_posint(root, "n_heads", what, &p->n_heads, 0))) return rc;
    if ((rc = get_posint(root, "ffn_hidden", what, &p->ffn_hidden, 0))) return rc;
    if (log2i(p->tp) < 0 || log2i(p->tp) > MAL_REPLAN_MAX_TP_LOG)
        return MAL_ERR(MAL_EINVAL, "%s: tp %d must be a power of two up to %d", what, p->tp,
                       1 << MAL_REPLAN_MAX_TP_LOG);
    json_t *al = json_object_get(root, "alpha");
    if (al) {
        if (!json_is_object(al))
            return MAL_ERR(MAL_EFORMAT, "%s: alpha must be an object {\"size\": factor}", what);
        memset(p->alpha, 0, sizeof p->alpha);
        json_object_foreach(al, key, val)
        {
            char *end;
            long sz = strtol(key, &end, 10);
            int l = (*end || sz < 1 || sz > (1 << MAL_REPLAN_MAX_TP_LOG)) ? -1 : log2i((int)sz);
            if (l < 0)
                return MAL_ERR(MAL_EINVAL, "%s: alpha key \"%s\" is not a power-of-two TP size",
                               what, key);
            if (!json_is_number(val) || !(json_number_value(val) > 0) ||
                !isfinite(json_number_value(val)))
                return MAL_ERR(MAL_EINVAL, "%s: alpha[\"%s\"] must be a positive number", what,
                               key);
            p->alpha[l] = json_number_value(val);
        }
    } else if (req) {
        return MAL_ERR(MAL_EFORMAT, "%s: alpha is missing from the model profile", what);
    }
    if (mal_profile_alpha(p, p->tp) <= 0)
        return MAL_ERR(MAL_EINVAL, "%s: alpha has no entry for the nominal TP size %d", what,
                       p->tp);
    json_t *km = json_object_get(root, "layer_memory_mb");
    if (km) {
        if (!json_is_array(km) || json_array_size(km) == 0)
            return MAL_ERR(MAL_EFORMAT,
                           "%s: layer_memory_mb must be a non-empty list (MB per layer, "
                           "by distance from the pipeline's last stage)",
                           what);
        free(p->k);
        p->n_k = (int)json_array_size(km);
        p->k = malloc((size_t)p->n_k * sizeof *p->k);
        if (!p->k) return MAL_ERR(MAL_ENOMEM, "model profile: out of memory");
        for (int d = 0; d < p->n_k; d++) {
            json_t *v = json_array_get(km, (size_t)d);
            if (!json_is_number(v) || !(json_number_value(v) >= 0) ||
                !isfinite(json_number_value(v)))
                return MAL_ERR(MAL_EINVAL, "%s: layer_memory_mb[%d] must be a non-negative number",
                               what, d);
            p->k[d] = json_number_value(v);
        }
    } else if (req) {
        return MAL_ERR(MAL_EFORMAT, "%s: layer_memory_mb is missing from the model profile", what);
    }
    if ((rc = get_num(root, "embedding_memory_mb", what, &p->embed_mb, req))) return rc;
    if ((rc = get_num(root, "overhead_mb", what, &p->overhead_mb, req))) return rc;
    if ((rc = get_num(root, "layer_time", what, &p->layer_time, req))) return rc;
    if ((rc = get_num(root, "layer_state_mb", what, &p->layer_state_mb, 0))) return rc;
    if ((rc = get_num(root, "embedding_state_mb", what, &p->embed_state_mb, 0))) return rc;
    if ((rc = get_num(root, "sync_time", what, &p->sync_time, 0))) return rc;
    /* nominal TP groups split heads and the MLP: a model that they cannot
     * split has no plan at all, so say so here rather than after planning */
    if (p->n_heads > 0 && p->n_heads % p->tp)
        return MAL_ERR(MAL_EINVAL,
                       "%s: n_heads %d is not divisible by the nominal TP size tp = %d (every TP "
                       "group splits the heads evenly)",
                       what, p->n_heads, p->tp);
    if (p->ffn_hidden > 0 && p->ffn_hidden % p->tp)
        return MAL_ERR(MAL_EINVAL,
                       "%s: ffn_hidden %d is not divisible by the nominal TP size tp = %d (every "
                       "TP group splits the MLP evenly)",
                       what, p->ffn_hidden, p->tp);
    if (!p->name[0]) snprintf(p->name, sizeof p->name, "custom");
    return 0;
}

int mal_profile_parse_buffer(mal_profile *p, const char *buf, size_t len, const char *what,
                             int mbs)
{
    memset(p, 0, sizeof *p);
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    if (!root) return MAL_ERR(MAL_EFORMAT, "%s: line %d: %s", what, jerr.line, jerr.text);
    int rc = profile_from_json(p, root, what, mbs);
    json_decref(root);
    return rc;
}

int mal_profile_parse_string(mal_profile *p, const char *json, const char *what, int mbs)
{
    return mal_profile_parse_buffer(p, json, strlen(json), what, mbs);
}

int mal_profile_read(mal_profile *p, const char *path, int mbs)
{
    memset(p, 0, sizeof *p);
    unsigned char *buf;
    size_t len;
    int rc = mal_file_read(path, "model profile", JSON_INPUT_MAX, MAL_READ_REGULAR, &buf, &len);
    if (rc) return rc;
    rc = mal_profile_parse_buffer(p, (const char *)buf, len, path, mbs);
    free(buf);
    return rc;
}

int mal_profile_write(const mal_profile *p, FILE *f)
{
    fprintf(
        f,
        "{ \"name\": \"%s\", \"n_layers\": %d, \"tp\": %d, \"n_heads\": %d, \"ffn_hidden\": %d,\n",
        p->name, p->n_layers, p->tp, p->n_heads, p->ffn_hidden);
    fprintf(f, "  \"alpha\": {");
    int first = 1;
    for (int l = MAL_REPLAN_MAX_TP_LOG; l >= 0; l--)
        if (p->alpha[l] > 0) {
            fprintf(f, "%s\"%d\": %.6g", first ? "" : ", ", 1 << l, p->alpha[l]);
            first = 0;
        }
    fprintf(f, "},\n  \"layer_memory_mb\": [");
    for (int d = 0; d < p->n_k; d++)
        fprintf(f, "%s%.6g", d ? ", " : "", p->k[d]);
    fprintf(f,
            "],\n  \"embedding_memory_mb\": %.6g, \"overhead_mb\": %.6g, \"layer_time\": %.6g,\n",
            p->embed_mb, p->overhead_mb, p->layer_time);
    fprintf(f, "  \"layer_state_mb\": %.6g, \"embedding_state_mb\": %.6g, \"sync_time\": %.6g }\n",
            p->layer_state_mb, p->embed_state_mb, p->sync_time);
    return ferror(f) ? MAL_ERR(MAL_EIO, "model profile: write failed") : 0;
}

/* ---- rates --------------------------------------------------------------- */

/* A rate value: a JSON number, or a string holding one (so that "nan" or
 * "inf" written by hand get a precise message instead of a parse error). */
static int rate_value(json_t *v, const char *what, long rank, double *out)
{
    double x;
    if (json_is_number(v)) {
        x = json_number_value(v);
    } else if (json_is_string(v)) {
        char *end;
        const char *s = json_string_value(v);
        x = strtod(s, &end);
        if (end == s || *end)
            return MAL_ERR(MAL_EINVAL, "%s: rank %ld has rate \"%s\", which is not a number", what,
                           rank, s);
    } else {
        return MAL_ERR(MAL_EINVAL, "%s: rank %ld: the rate must be a number", what, rank);
    }
    if (isnan(x) || isinf(x) || x <= 0)
        return MAL_ERR(
            MAL_EINVAL,
            "%s: rank %ld has rate %g; rates must be finite and > 0 (1.0 = healthy, 2.0 = "
            "twice as slow)",
            what, rank, x);
    *out = x;
    return 0;
}

static int parse_rank_key(const char *key, const char *what, int world, long *rank)
{
    char *end;
    long r = strtol(key, &end, 10);
    if (end == key || *end)
        return MAL_ERR(MAL_EINVAL, "%s: key \"%s\" is not a rank number", what, key);
    if (r < 0 || r >= world)
        return MAL_ERR(MAL_EINVAL,
                       "%s: rank %ld is not in the cluster (world size %d, ranks 0..%d)", what, r,
                       world, world - 1);
    *rank = r;
    return 0;
}

int mal_rates_parse_buffer(const char *buf, size_t len, const char *what, int world, int window,
                           double *rates)
{
    int rc = 0;
    double *ring = NULL;
    int *count = NULL;
    char *copy = NULL;
    for (int r = 0; r < world; r++)
        rates[r] = 1.0;
    if (window < 1) window = 1;
    if (memchr(buf, '\0', len))
        return MAL_ERR(MAL_EFORMAT, "%s: the rates contain a NUL byte (not a text file?)", what);

    /* the whole text as one JSON value: a {"rank": rate} map */
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    if (root && json_is_object(root) && !json_object_get(root, "step") &&
        !json_object_get(root, "rates") && !json_object_get(root, "rate")) {
        const char *key;
        json_t *val;
        json_object_foreach(root, key, val)
        {
            long r = 0;
            if ((rc = parse_rank_key(key, what, world, &r))) break;
            if ((rc = rate_value(val, what, r, &rates[r]))) break;
        }
        json_decref(root);
        return rc;
    }
    json_decref(root);

    /* JSON lines: keep the last `window` samples of every rank; there are
     * no more samples per rank than lines, which bounds the ring */
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++)
        n_lines += buf[i] == '\n';
    if ((size_t)window > n_lines) window = (int)n_lines;
    ring = calloc((size_t)world * (size_t)window, sizeof *ring);
    count = calloc((size_t)world, sizeof *count);
    copy = malloc(len + 1);
    if (copy) {
        memcpy(copy, buf, len);
        copy[len] = '\0';
    }
    if (!ring || !count || !copy) {
        rc = MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
        goto cleanup;
    }
    int lineno = 0, n_samples = 0;
    for (char *line = copy, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        lineno++;
        const char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r')
            s++;
        if (!*s) continue;
        json_t *o = json_loads(s, 0, &jerr);
        if (!o || !json_is_object(o)) {
            json_decref(o);
            rc =
                MAL_ERR(MAL_EFORMAT,
                        "%s: line %d is not a JSON object (expected a {\"rank\": rate} map or JSON "
                        "lines with \"rates\")",
                        what, lineno);
            goto cleanup;
        }
        json_t *arr = json_object_get(o, "rates");
        json_t *one = json_object_get(o, "rate");
        if (arr) {
            if (!json_is_array(arr)) {
                json_decref(o);
                rc = MAL_ERR(MAL_EFORMAT, "%s: line %d: \"rates\" must be an array indexed by rank",
                             what, lineno);
                goto cleanup;
            }
            size_t n_rates = json_array_size(arr); /* arr dies with o */
            if (n_rates > (size_t)world) {
                json_decref(o);
                rc = MAL_ERR(MAL_EINVAL,
                             "%s: line %d: rates for %zu ranks, but rank %d is not in the cluster "
                             "(world size %d)",
                             what, lineno, n_rates, world, world);
                goto cleanup;
            }
            for (size_t r = 0; r < json_array_size(arr); r++) {
                json_t *v = json_array_get(arr, r);
                if (json_is_null(v)) continue; /* not measured this step */
                double x;
                if ((rc = rate_value(v, what, (long)r, &x))) {
                    json_decref(o);
                    goto cleanup;
                }
                ring[r * (size_t)window + (size_t)(count[r] % window)] = x;
                count[r]++;
            }
            n_samples++;
        } else if (one) {
            json_t *rk = json_object_get(o, "rank");
            if (!json_is_integer(rk)) {
                json_decref(o);
                rc = MAL_ERR(MAL_EFORMAT, "%s: line %d: \"rate\" without an integer \"rank\"", what,
                             lineno);
                goto cleanup;
            }
            long r = (long)json_integer_value(rk);
            if (r < 0 || r >= world) {
                json_decref(o);
                rc = MAL_ERR(MAL_EINVAL,
                             "%s: line %d: rank %ld is not in the cluster (world size %d)", what,
                             lineno, r, world);
                goto cleanup;
            }
            double x;
            if ((rc = rate_value(one, what, r, &x))) {
                json_decref(o);
                goto cleanup;
            }
            ring[(size_t)r * (size_t)window + (size_t)(count[r] % window)] = x;
            count[r]++;
            n_samples++;
        }
        /* other lines (loss, throughput...) are not ours: skip them */
        json_decref(o);
    }
    if (n_samples == 0) {
        rc =
            MAL_ERR(MAL_EFORMAT,
                    "%s: no rates found (expected {\"rank\": rate} or lines with \"rates\")", what);
        goto cleanup;
    }
    for (int r = 0; r < world; r++) {
        int n = MAL_MIN(count[r], window);
        if (n == 0) continue;
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += ring[(size_t)r * (size_t)window + (size_t)i];
        rates[r] = sum / n;
    }
cleanup:
    free(ring);
    free(count);
    free(copy);
    return rc;
}

int mal_rates_parse_string(const char *text, const char *what, int world, int window, double *rates)
{
    return mal_rates_parse_buffer(text, strlen(text), what, world, window, rates);
}

int mal_rates_read(const char *path, int world, int window, double *rates)
{
    unsigned char *buf;
    size_t len;
    /* the whole file is parsed; only its last samples count, but a metrics
     * file of a long run stays far below the bound */
    int rc = mal_file_read(path, "rates file", RATES_INPUT_MAX, MAL_READ_REGULAR, &buf, &len);
    if (rc) return rc;
    rc = mal_rates_parse_buffer((const char *)buf, len, path, world, window, rates);
    free(buf);
    return rc;
}
