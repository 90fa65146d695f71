/* Planner input: the model profile -- memory and time per layer, the TP
 * sizes allowed and their slowdown -- read from JSON or derived from the
 * model shapes of a preset.  Formulas for the presets are documented in
 * replan/README.md ("Model profile"). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"
#include "replan.h"
#include "src/config.h"

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

double mal_profile_k_at(const mal_profile *p, int d, int size)
{
    int l = log2i(size);
    if (l >= 0 && l <= MAL_REPLAN_MAX_TP_LOG && p->rank_state_mb[l] > 0)
        return p->rank_state_mb[l] + p->rank_acts_mb[l] * (d + 1);
    return mal_profile_k(p, d) * ((double)p->tp / size);
}

/* Device assumptions per preset; the model shapes themselves come from
 * src/config.c's presets (mal_config_load), so the two cannot drift. */
typedef struct preset_shape {
    const char *name;

    int tp;
    double flops;       /* sustained FLOP/s of one device */
    double overhead_mb; /* X */
} preset_shape;

/* Every preset of src/config.c (tests/test_replan_cli.sh checks the two
 * lists agree).  The single-GPU shapes (124m, 1b, llama3-1b) plan with
 * TP 1 as their full group: data and pipeline parallelism only. */
static const preset_shape shapes[] = {
    {"tiny", 2, 2e9, 16},          {"tiny-llama3", 2, 2e9, 16}, {"small", 2, 2e10, 64},
    {"124m", 1, 4e14, 1024},       {"1b", 1, 4e14, 2048},       {"llama3-1b", 1, 4e14, 2048},
    {"llama2-7b", 8, 4e14, 3072},  {"32b", 8, 4e14, 3072},      {"70b", 8, 4e14, 3072},
    {"110b", 8, 4e14, 3072},
};

/* The most key/value heads a rank of a TP group of t holds: the heads its
 * query heads read (src/model.c's MAL_TP_KV rule) -- n_kv/t where t
 * divides n_kv, 1 where n_kv divides t, 2 where a rank's query heads
 * straddle two. */
static int kv_heads_per_rank(const mal_model_config *c, int t)
{
    int hl = c->n_heads / t, group = c->n_heads / c->n_kv_heads, most = 0;
    for (int r = 0; r < t; r++)
        most = MAL_MAX(most, ((r + 1) * hl - 1) / group + 1 - r * hl / group);
    return most;
}

#define PRESET_NK 128

/* The recomputation figures of a profile that gives none. */
static void default_recompute(mal_profile *p)
{
    p->acts_kept[MAL_RECOMPUTE_NONE] = 1.0;
    p->acts_kept[MAL_RECOMPUTE_SELECTIVE] = MAL_REPLAN_KEPT_SELECTIVE;
    p->acts_kept[MAL_RECOMPUTE_FULL] = MAL_REPLAN_KEPT_FULL;
    p->recompute_time[MAL_RECOMPUTE_NONE] = 0.0;
    p->recompute_time[MAL_RECOMPUTE_SELECTIVE] = MAL_REPLAN_TIME_SELECTIVE;
    p->recompute_time[MAL_RECOMPUTE_FULL] = MAL_REPLAN_TIME_FULL;
}

/* {"selective": x, "full": y} into out[mode]: numbers in [lo, hi]. */
static int get_mode_map(json_t *root, const char *name, const char *what, double lo, double hi,
                        double *out)
{
    json_t *o = json_object_get(root, name), *val;
    const char *key;
    if (!o) return 0;
    if (!json_is_object(o))
        return MAL_ERR(MAL_EFORMAT, "%s: %s must be an object {\"selective\": x, \"full\": y}",
                       what, name);
    json_object_foreach(o, key, val)
    {
        int m;
        if (mal_recompute_parse(key, &m) || m == MAL_RECOMPUTE_NONE)
            return MAL_ERR(MAL_EINVAL, "%s: %s key \"%s\" must be \"selective\" or \"full\"", what,
                           name, key);
        double x = json_is_number(val) ? json_number_value(val) : NAN;
        if (!(x >= lo && x <= hi))
            return MAL_ERR(MAL_EINVAL, "%s: %s[\"%s\"] must be a number in [%g, %g]", what, name,
                           key, lo, hi);
        out[m] = x;
    }
    return 0;
}

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
    if (!s) {
        char names[256] = "";
        for (size_t i = 0; i < MAL_ARRAY_SIZE(shapes); i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     shapes[i].name);
        return MAL_ERR(MAL_EINVAL, "model profile: unknown preset \"%s\" (presets: %s)", name,
                       names);
    }
    mal_model_config cfg;
    int rc = mal_config_load(&cfg, s->name);
    if (rc) return rc;
    if (micro_batch_size < 1) micro_batch_size = 1;
    int nominal = tp > 0 ? tp : s->tp;
    if (log2i(nominal) < 0 || nominal > 8 || cfg.n_heads % nominal || cfg.ffn_hidden % nominal)
        return MAL_ERR(MAL_EINVAL,
                       "model profile: preset \"%s\" at tp %d: the nominal TP size must be a "
                       "power of two up to 8 that divides n_heads (%d) and ffn_hidden (%d)",
                       name, nominal, cfg.n_heads, cfg.ffn_hidden);
    const double MB = 1048576.0, b = micro_batch_size, t = nominal;
    const double C = cfg.d_model, F = cfg.ffn_hidden, V = cfg.vocab, T = cfg.seq_len;
    /* LLaMA-style layer: query and output projections 2C^2, key and value
     * projections 2C KV (KV = n_kv_heads * head_dim: grouped-query
     * attention), SwiGLU MLP 3CF, two norms 2C */
    const double hd = C / cfg.n_heads, KV = cfg.n_kv_heads * hd;
    const double params = 2 * C * C + 2 * C * KV + 3 * C * F + 2 * C;
    /* One rank of the nominal group: everything split t ways but the
     * key/value heads, of which it holds those its query heads read
     * (replicated once t exceeds n_kv_heads).  Multi-head: exactly
     * params / t. */
    const double kv_rank = kv_heads_per_rank(&cfg, nominal) * hd;
    const double params_rank = (2 * C * C + 3 * C * F + 2 * C) / t + 2 * C * kv_rank;
    /* bf16 mixed precision: bf16 weights (2) + bf16 grads (2) + fp32 master
     * weights (4) + Adam m and v (4 + 4) = 16 bytes per parameter */
    const double state = 16 * params, state_rank = 16 * params_rank;
    /* activations kept per layer per in-flight micro-batch with selective
     * recomputation: 34 * T * b * C bytes (Korthikanti et al. 2022), of
     * which keys and values are 2 * T * b * C each; with grouped-query
     * attention those are 2 * T * b * KV, the rank's own key/value heads'
     * (a multi-head rank: 34 * T * b * C / t) */
    const double act_rank = 30 * T * b * C / t + 4 * T * b * kv_rank;
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
     * under 1F1B */
    for (int d = 0; d < PRESET_NK; d++)
        p->k[d] = (state_rank + act_rank * (d + 1)) / MB;
    /* embedding (or LM head) state plus fp32 logits and their gradient,
     * vocabulary-parallel over the group (with tied embeddings the first
     * and the last stage each hold a copy: the same E on both) */
    p->embed_mb = (16 * V * C + 8 * T * b * V) / t / MB;
    p->overhead_mb = s->overhead_mb;
    /* forward + backward = 6 FLOPs per parameter per token of the rank's
     * share (replicated key/value heads computed on every rank that holds
     * them), plus attention scores 12 * T^2 * C per sequence, split over
     * the group's query heads */
    p->layer_time = (6 * params_rank * T * b + 12 * T * T * C * b / t) / s->flops;
    p->layer_state_mb = state / MB;
    p->embed_state_mb = 16 * V * C / MB;
    p->tied_embeddings = cfg.tie_embeddings;
    p->sync_time = 0.0;
    /* Links: a CPU preset's ranks move fp32 activations through shared
     * memory; a GPU preset's bf16 over NVLink within a node and a 200 Gb/s
     * NIC between nodes.  The presets' alpha is measured with the healthy
     * links' all-reduces inside, so only a slow link's excess is charged. */
    const int cpu = s->flops < 1e12;
    const double esz = cpu ? 4 : 2;
    p->link_latency = cpu ? 2e-5 : 5e-6;
    p->link_bandwidth = cpu ? 5e9 : 1.5e11;
    p->node_link_latency = cpu ? 5e-5 : 1e-5;
    p->node_link_bandwidth = cpu ? 1e9 : 2.5e10;
    p->activation_bytes = esz * b * T * C;
    p->tp_allreduces = 4; /* two in the forward pass, two in the backward */
    /* Recomputation, counted as the activations above are (Megatron's
     * sequence-parallel ranks: every tensor split over the group):
     * selective drops the two norms' outputs (2 x 2 C bytes per token) and
     * the SwiGLU product (2 F), full keeps only the layer's input (2 C). */
    default_recompute(p);
    const double sel_drop = T * b * (4 * C + 2 * F) / t, full_kept = 2 * T * b * C / t;
    p->acts_kept[MAL_RECOMPUTE_FULL] = full_kept / act_rank;
    p->acts_kept[MAL_RECOMPUTE_SELECTIVE] =
        MAL_MAX(p->acts_kept[MAL_RECOMPUTE_FULL], 1.0 - sel_drop / act_rank);
    p->grad_bytes = esz * params;
    p->comm_in_alpha = 1;
    return 0;
}

int mal_profile_set_state_bytes(mal_profile *p, double bytes)
{
    const double from = p->state_bytes > 0 ? p->state_bytes : 16.0;
    if (!(bytes >= 12.0 && bytes <= 64.0))
        return MAL_ERR(MAL_EINVAL,
                       "model profile: state_bytes %g must be a number in [12, 64] (bytes of "
                       "state per parameter)",
                       bytes);
    if (p->n_k < 1) return MAL_ERR(MAL_EINVAL, "model profile: no layer_memory_mb to re-count");
    /* the state is the part of k[d] that does not grow with the
     * micro-batches in flight: k[d] = state + acts x (d + 1) */
    const double acts = p->n_k > 1 ? p->k[1] - p->k[0] : 0.0, state = p->k[0] - acts;
    for (int d = 0; d < p->n_k; d++)
        if (!(fabs(p->k[d] - state - acts * (d + 1)) <= 1e-9 * fabs(p->k[d]) + 1e-12) ||
            state < 0 || acts < 0)
            return MAL_ERR(MAL_EINVAL,
                           "model profile: layer_memory_mb[%d] = %g is not state + activations x "
                           "(d + 1) as layer_memory_mb[0..1] give: its state cannot be re-counted",
                           d, p->k[d]);
    const double f = bytes / from;
    for (int d = 0; d < p->n_k; d++)
        p->k[d] += state * (f - 1.0);
    /* E holds the nominal rank's share of the embedding's state (the
     * logits beside it do not change) */
    p->embed_mb += p->embed_state_mb / p->tp * (f - 1.0);
    p->layer_state_mb *= f;
    p->embed_state_mb *= f;
    for (int l = 0; l <= MAL_REPLAN_MAX_TP_LOG; l++)
        p->rank_state_mb[l] *= f;
    p->state_bytes = bytes;
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

/* {"size": number} by power-of-two TP size into out[log2 size]: positive
 * numbers (`positive`), else non-negative ones. */
static int get_size_map(json_t *o, const char *name, const char *what, int positive, double *out)
{
    const char *key;
    json_t *val;
    if (!json_is_object(o))
        return MAL_ERR(MAL_EFORMAT, "%s: %s must be an object {\"size\": number}", what, name);
    json_object_foreach(o, key, val)
    {
        char *end;
        long sz = strtol(key, &end, 10);
        int l = (*end || sz < 1 || sz > (1 << MAL_REPLAN_MAX_TP_LOG)) ? -1 : log2i((int)sz);
        if (l < 0)
            return MAL_ERR(MAL_EINVAL, "%s: %s key \"%s\" is not a power-of-two TP size", what,
                           name, key);
        double x = json_is_number(val) ? json_number_value(val) : NAN;
        if (!(positive ? x > 0 : x >= 0) || !isfinite(x))
            return MAL_ERR(MAL_EINVAL, "%s: %s[\"%s\"] must be a %s number", what, name, key,
                           positive ? "positive" : "non-negative");
        out[l] = x;
    }
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
                                       "link_latency",
                                       "link_bandwidth",
                                       "node_link_latency",
                                       "node_link_bandwidth",
                                       "activation_bytes",
                                       "tp_allreduces",
                                       "grad_bytes",
                                       "comm_in_alpha",
                                       "state_bytes",
                                       "scratch_mb",
                                       "rank_state_mb",
                                       "rank_acts_mb",
                                       "tied_embeddings",
                                       "acts_kept",
                                       "recompute_time",
                                       "links", /* measured pairs: --links reads them */
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
    default_recompute(p);
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
        /* the preset counts 16 bytes of state per parameter: another count
         * (18: the runtime in bf16) re-counts the preset's state in every
         * figure that holds it, before the file's own figures override */
        double sb = 0;
        if ((rc = get_num(root, "state_bytes", what, &sb, 0))) return rc;
        if (json_object_get(root, "state_bytes") && !(sb >= 12 && sb <= 64))
            return MAL_ERR(MAL_EINVAL,
                           "%s: state_bytes %g with a preset must be in [12, 64] (bytes of state "
                           "per parameter: 16 without a working copy, 18 with a bf16 one)",
                           what, sb);
        if (sb > 0 && (rc = mal_profile_set_state_bytes(p, sb))) return rc;
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
        memset(p->alpha, 0, sizeof p->alpha);
        if ((rc = get_size_map(al, "alpha", what, 1, p->alpha))) return rc;
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
    if ((rc = get_num(root, "state_bytes", what, &p->state_bytes, 0))) return rc;
    json_t *sm = json_object_get(root, "scratch_mb");
    if (sm && (rc = get_size_map(sm, "scratch_mb", what, 0, p->scratch_mb))) return rc;
    json_t *rs = json_object_get(root, "rank_state_mb"),
           *ra = json_object_get(root, "rank_acts_mb");
    if (rs && (rc = get_size_map(rs, "rank_state_mb", what, 1, p->rank_state_mb))) return rc;
    if (ra && (rc = get_size_map(ra, "rank_acts_mb", what, 0, p->rank_acts_mb))) return rc;
    static const char *const link_keys[] = {"link_latency",        "link_bandwidth",
                                            "node_link_latency",   "node_link_bandwidth",
                                            "activation_bytes",    "tp_allreduces",
                                            "grad_bytes"};
    double *link_vals[] = {&p->link_latency,        &p->link_bandwidth,   &p->node_link_latency,
                           &p->node_link_bandwidth, &p->activation_bytes, &p->tp_allreduces,
                           &p->grad_bytes};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(link_keys); i++)
        if ((rc = get_num(root, link_keys[i], what, link_vals[i], 0))) return rc;
    json_t *cia = json_object_get(root, "comm_in_alpha");
    if (cia && !json_is_boolean(cia))
        return MAL_ERR(MAL_EINVAL, "%s: comm_in_alpha must be true or false", what);
    if (cia) p->comm_in_alpha = json_is_true(cia);
    json_t *tie = json_object_get(root, "tied_embeddings");
    if (tie && !json_is_boolean(tie))
        return MAL_ERR(MAL_EINVAL, "%s: tied_embeddings must be true or false", what);
    if (tie) p->tied_embeddings = json_is_true(tie);
    if ((rc = get_mode_map(root, "acts_kept", what, 0.0, 1.0, p->acts_kept)) ||
        (rc = get_mode_map(root, "recompute_time", what, 0.0, 10.0, p->recompute_time)))
        return rc;
    if (p->acts_kept[MAL_RECOMPUTE_FULL] > p->acts_kept[MAL_RECOMPUTE_SELECTIVE] ||
        p->recompute_time[MAL_RECOMPUTE_FULL] < p->recompute_time[MAL_RECOMPUTE_SELECTIVE])
        return MAL_ERR(MAL_EINVAL,
                       "%s: full recomputation must keep no more activations (acts_kept) and "
                       "take no less time (recompute_time) than selective",
                       what);
    if (p->link_bandwidth > 0 && !(p->activation_bytes > 0))
        return MAL_ERR(MAL_EINVAL,
                       "%s: link_bandwidth prices communication, which needs activation_bytes "
                       "(bytes of one micro-batch's activation)",
                       what);
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
    json_t *root;
    int rc = mal_json_parse(buf, len, what, &root);
    if (rc) return rc;
    rc = profile_from_json(p, root, what, mbs);
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
    json_t *root;
    int rc = mal_json_read(path, "model profile", MAL_REPLAN_MAX_INPUT_BYTES, MAL_READ_REGULAR,
                           &root);
    if (rc) return rc;
    rc = profile_from_json(p, root, path, mbs);
    json_decref(root);
    return rc;
}

/* ,\n  "name": {"size": x, ...} of the sizes with x > 0 (nothing when none). */
static void write_size_map(FILE *f, const char *name, const double *x)
{
    int first = 1;
    for (int l = 0; l <= MAL_REPLAN_MAX_TP_LOG; l++)
        if (x[l] > 0) {
            if (first) fprintf(f, ",\n  \"%s\": {", name);
            fprintf(f, "%s\"%d\": %.6g", first ? "" : ", ", 1 << l, x[l]);
            first = 0;
        }
    if (!first) fprintf(f, "}");
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
    fprintf(f, "  \"layer_state_mb\": %.6g, \"embedding_state_mb\": %.6g, \"sync_time\": %.6g",
            p->layer_state_mb, p->embed_state_mb, p->sync_time);
    if (p->state_bytes > 0) fprintf(f, ", \"state_bytes\": %.6g", p->state_bytes);
    if (p->tied_embeddings) fprintf(f, ", \"tied_embeddings\": true");
    write_size_map(f, "scratch_mb", p->scratch_mb);
    write_size_map(f, "rank_state_mb", p->rank_state_mb);
    write_size_map(f, "rank_acts_mb", p->rank_acts_mb);
    fprintf(f,
            ",\n  \"acts_kept\": {\"selective\": %.6g, \"full\": %.6g}, \"recompute_time\": "
            "{\"selective\": %.6g, \"full\": %.6g}",
            p->acts_kept[MAL_RECOMPUTE_SELECTIVE], p->acts_kept[MAL_RECOMPUTE_FULL],
            p->recompute_time[MAL_RECOMPUTE_SELECTIVE], p->recompute_time[MAL_RECOMPUTE_FULL]);
    if (p->link_bandwidth > 0)
        fprintf(f,
                ",\n  \"link_latency\": %.6g, \"link_bandwidth\": %.6g, \"node_link_latency\": "
                "%.6g, \"node_link_bandwidth\": %.6g,\n  \"activation_bytes\": %.6g, "
                "\"tp_allreduces\": %.6g, \"grad_bytes\": %.6g, \"comm_in_alpha\": %s",
                p->link_latency, p->link_bandwidth, p->node_link_latency, p->node_link_bandwidth,
                p->activation_bytes, p->tp_allreduces, p->grad_bytes,
                p->comm_in_alpha ? "true" : "false");
    fprintf(f, " }\n");
    return ferror(f) ? MAL_ERR(MAL_EIO, "model profile: write failed") : 0;
}
