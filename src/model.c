/* Transformer parameter layout, initialisation, forward and backward.
 * See model.h for the part/shard model and buffer ownership. */
#include "model.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mal.h"
#include "base/rng.h"

mal_model_part mal_model_part_full(const mal_model_config *cfg)
{
    mal_model_part p = {0, cfg->n_layers, 1, 1, 1, 0};
    return p;
}

/* A mal_recompute mode. */
static int valid_mode(int mode) { return mode >= 0 && mode < MAL_RECOMPUTE_COUNT; }

/* FNV-1a of the global tensor name: the RNG stream of its initial values. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void mal_model_tp_range(const mal_model_config *cfg, const mal_tensor_info *t, int size, int r,
                        int64_t *begin, int64_t *end)
{
    const int64_t len = t->shape[t->axis];
    *begin = 0;
    *end = len;
    if (size <= 1) return;
    switch (t->tp_rule) {
    case MAL_TP_EVEN:
        *begin = len / size * r;
        *end = *begin + len / size;
        break;
    case MAL_TP_KV: {
        /* the key/value heads read by query heads [r Hl, (r+1) Hl) */
        const int64_t hd = cfg->d_model / cfg->n_heads, Hl = cfg->n_heads / size;
        const int64_t group = cfg->n_heads / cfg->n_kv_heads;
        *begin = r * Hl / group * hd;
        *end = (((r + 1) * Hl - 1) / group + 1) * hd;
        break;
    }
    case MAL_TP_VOCAB:
        *begin = len * r / size;
        *end = len * (r + 1) / size;
        break;
    default: break; /* replicated */
    }
}

/* split_dim: the axis TP splits it along (0 rows, 1 columns; -1 for a
 * replicated tensor), rule: how (MAL_TP_*). */
static int add_tensor(mal_model *m, int *cap, int layer, const char *name, int64_t rows,
                      int64_t cols, int split_dim, int rule, int decay, float std)
{
    if (mal_grow(&m->tensors, cap, m->n_tensors, sizeof *m->tensors, 32))
        return MAL_ERR(MAL_ENOMEM, "model: out of memory for tensor table");
    mal_tensor_info *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->split_dim = m->part.tp_size > 1 ? split_dim : -1;
    t->axis = split_dim >= 0 ? split_dim : 0;
    t->tp_rule = rule;
    t->tied = !strcmp(name, "tok_embedding") && m->cfg.tie_embeddings;
    t->layer = layer;
    t->local_shape[0] = rows;
    t->local_shape[1] = cols;
    int64_t b, e;
    mal_model_tp_range(&m->cfg, t, m->part.tp_size, m->part.tp_rank, &b, &e);
    t->split_off = b;
    t->split_len = e - b;
    if (t->split_dim >= 0) t->local_shape[t->split_dim] = e - b;
    /* Checked: a config's sizes must never wrap into a small buffer. */
    int ovf = 0;
    t->n = mal_size_mul((size_t)t->local_shape[0], (size_t)(cols ? t->local_shape[1] : 1), &ovf);
    /* Keep every tensor 16-float aligned so vector loads never straddle. */
    t->offset = mal_size_add(m->n_params, 15, &ovf) & ~(size_t)15;
    m->n_params = mal_size_add(t->offset, t->n, &ovf);
    if (ovf)
        return MAL_ERR(MAL_EINVAL, "model: the element count of the part overflows at tensor %s",
                       name);
    t->decay = decay;
    t->init_std = std;
    return 0;
}

/* 1 when the part holds the token embedding: the first stage, and with
 * tied embeddings the last (its output projection). */
static int holds_embedding(const mal_model *m)
{
    return m->part.has_embed || (m->part.has_head && m->cfg.tie_embeddings);
}

/* Build the tensor table of the part.  Order is the order of use, and
 * every part's table is in one global order (the embedding first, also
 * where a last stage holds it as its tied output layer), which the
 * gradient sum relies on (gradsync.c). */
static int build_layout(mal_model *m)
{
    const mal_model_config *c = &m->cfg;
    int cap = 0, rc;
    char nm[48];
    const float std = 0.02f;
    const int64_t kv = (int64_t)c->n_kv_heads * (c->d_model / c->n_heads);
    /* Residual-output projections scaled down with depth (GPT-2 / LLaMA
     * practice) so the residual stream's variance does not grow with L. */
    const float std_out = 0.02f / sqrtf(2.0f * (float)c->n_layers);
    if (holds_embedding(m) &&
        (rc = add_tensor(m, &cap, -1, "tok_embedding", c->vocab, c->d_model, 0, MAL_TP_VOCAB, 1,
                         std)))
        return rc;
    for (int l = m->part.layer_begin; l < m->part.layer_end; l++) {
#define T(suffix, r, cc, split, rule, decay, s)                                                    \
    snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);                                            \
    if ((rc = add_tensor(m, &cap, l, nm, r, cc, split, rule, decay, s))) return rc;
        T("attn_norm", c->d_model, 0, -1, MAL_TP_REPLICATE, 0, 0.0f);
        T("wq", c->d_model, c->d_model, 0, MAL_TP_EVEN, 1, std);
        T("wk", kv, c->d_model, 0, MAL_TP_KV, 1, std);
        T("wv", kv, c->d_model, 0, MAL_TP_KV, 1, std);
        T("wo", c->d_model, c->d_model, 1, MAL_TP_EVEN, 1, std_out);
        T("mlp_norm", c->d_model, 0, -1, MAL_TP_REPLICATE, 0, 0.0f);
        T("w1", c->ffn_hidden, c->d_model, 0, MAL_TP_EVEN, 1, std);
        T("w3", c->ffn_hidden, c->d_model, 0, MAL_TP_EVEN, 1, std);
        T("w2", c->d_model, c->ffn_hidden, 1, MAL_TP_EVEN, 1, std_out);
#undef T
    }
    if (m->part.has_head) {
        if ((rc = add_tensor(m, &cap, c->n_layers, "final_norm", c->d_model, 0, -1,
                             MAL_TP_REPLICATE, 0, 0.0f)))
            return rc;
        if (!c->tie_embeddings && (rc = add_tensor(m, &cap, c->n_layers, "lm_head", c->vocab,
                                                   c->d_model, 0, MAL_TP_VOCAB, 1, std)))
            return rc;
    }
    return 0;
}

int mal_model_layout(const mal_model_config *cfg, const mal_model_part *part,
                     mal_tensor_info **tensors, int *n_tensors, size_t *n_params)
{
    mal_model m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.part = *part;
    int rc = build_layout(&m);
    if (rc) {
        free(m.tensors);
        return rc;
    }
    *tensors = m.tensors;
    *n_tensors = m.n_tensors;
    if (n_params) *n_params = m.n_params;
    return 0;
}

/* Views of the tensors in `base`, a buffer of elements of `esz` bytes laid
 * out like the state (pointer arithmetic on a device buffer: no access). */
static void make_views(mal_model *m, void *base, size_t esz, mal_model_views *v)
{
    int i = 0;
#define AT() ((char *)base + m->tensors[i++].offset * esz)
    v->tok_embedding = holds_embedding(m) ? AT() : NULL;
    for (int l = 0; l < m->n_local_layers; l++) {
        mal_layer_views *lv = &v->layer[l];
        lv->attn_norm = AT();
        lv->wq = AT();
        lv->wk = AT();
        lv->wv = AT();
        lv->wo = AT();
        lv->mlp_norm = AT();
        lv->w1 = AT();
        lv->w3 = AT();
        lv->w2 = AT();
    }
    v->final_norm = m->part.has_head ? AT() : NULL;
    v->lm_head = !m->part.has_head ? NULL : m->cfg.tie_embeddings ? v->tok_embedding : AT();
#undef AT
}

/* Rows [part/parts of every tensor] of the initial parameters into host:
 * the values are a pure function of (seed, tensor, global index), so the
 * split over threads changes nothing but the time (a 1 B-parameter model
 * takes a minute on one core: ~70 ns per Box-Muller draw). */
typedef struct {
    const mal_model *m;
    float *host;
    uint64_t seed;
    int part, parts;
} init_job;

static void *init_rows(void *arg)
{
    const init_job *j = arg;
    const mal_model *m = j->m;
    for (int i = 0; i < m->n_tensors; i++) {
        const mal_tensor_info *t = &m->tensors[i];
        float *dst = j->host + t->offset;
        int64_t rows = t->local_shape[0], cols = t->ndim == 2 ? t->local_shape[1] : 1;
        int64_t r0 = rows * j->part / j->parts, r1 = rows * (j->part + 1) / j->parts;
        if (t->init_std == 0.0f) {
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = 0; c < cols; c++)
                    dst[r * cols + c] = 1.0f;
            continue;
        }
        uint64_t stream = name_hash(t->name);
        int64_t gcols = t->ndim == 2 ? t->shape[1] : 1;
        for (int64_t r = r0; r < r1; r++) {
            int64_t gr = t->split_dim == 0 ? r + t->split_off : r;
            int64_t c0 = t->split_dim == 1 ? t->split_off : 0;
            for (int64_t c = 0; c < cols; c++) {
                uint64_t gidx = (uint64_t)(gr * gcols + c0 + c);
                dst[r * cols + c] = (float)(t->init_std * mal_rng_normal(j->seed, stream, gidx));
            }
        }
    }
    return NULL;
}

int mal_model_init_params(mal_model *m, uint64_t seed)
{
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) return MAL_ERR(MAL_ENOMEM, "model: out of memory initialising parameters");
    memset(host, 0, m->n_params * sizeof(float));
    /* threads only where it pays (the 124m and 1b presets), never more
     * than the cores the process may use */
    enum { MAX_THREADS = 16 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = m->n_params < ((size_t)1 << 24) ? 1 : (int)MAL_MIN(MAL_MAX(cores, 1), MAX_THREADS);
    init_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int p = 0; p < parts; p++) {
        jobs[p] = (init_job){m, host, seed, p, parts};
        if (p > 0 && pthread_create(&tid[p], NULL, init_rows, &jobs[p]) == 0)
            started |= 1 << p;
        else if (p > 0)
            init_rows(&jobs[p]); /* no thread: do it here */
    }
    init_rows(&jobs[0]);
    for (int p = 1; p < parts; p++)
        if (started & (1 << p)) pthread_join(tid[p], NULL);
    mal_kern_from_host(m->k, m->params, host, m->n_params * sizeof(float));
    mal_model_refresh_working(m);
    int rc = mal_kern_sync(m->k);
    free(host);
    return rc;
}

int mal_model_create(mal_model **out, const mal_model_config *cfg, const mal_model_part *part,
                     int max_B, mal_kern k, uint64_t seed)
{
    return mal_model_create_ex(out, cfg, part, max_B, k, seed, MAL_MODEL_INIT);
}

/* Check a part against its config and fill the fields of `m` that say its
 * shape (no allocation).  Every size that the kernels take as an int (the
 * micro-batch's token count B*T) must fit one. */
static int shape_part(mal_model *m, const mal_model_config *cfg, const mal_model_part *part,
                      int max_B, mal_kern k)
{
    int rc = mal_config_validate(cfg);
    if (rc) return rc;
    if (part->layer_begin < 0 || part->layer_end > cfg->n_layers ||
        part->layer_begin > part->layer_end)
        return MAL_ERR(MAL_EINVAL, "model part: layers [%d, %d) outside [0, %d)", part->layer_begin,
                       part->layer_end, cfg->n_layers);
    if (part->tp_size < 1 || (part->tp_size & (part->tp_size - 1)) ||
        cfg->n_heads % part->tp_size || cfg->ffn_hidden % part->tp_size)
        return MAL_ERR(MAL_EINVAL,
                       "model part: TP size %d must be a power of two dividing n_heads %d and "
                       "ffn_hidden %d",
                       part->tp_size, cfg->n_heads, cfg->ffn_hidden);
    if ((part->has_embed || part->has_head) && cfg->vocab < part->tp_size)
        return MAL_ERR(MAL_EINVAL,
                       "model part: TP size %d splits a vocabulary of only %d tokens (each rank "
                       "holds at least one row)",
                       part->tp_size, cfg->vocab);
    if (part->tp_rank < 0 || part->tp_rank >= part->tp_size)
        return MAL_ERR(MAL_EINVAL, "model part: TP rank %d outside [0, %d)", part->tp_rank,
                       part->tp_size);
    if (max_B < 1) return MAL_ERR(MAL_EINVAL, "model: micro-batch size must be >= 1");
    if ((int64_t)max_B * cfg->seq_len > INT32_MAX)
        return MAL_ERR(MAL_EINVAL,
                       "model: micro-batch %d x seq_len %d = %lld tokens, more than %d: use a "
                       "smaller micro-batch",
                       max_B, cfg->seq_len, (long long)max_B * cfg->seq_len, INT32_MAX);
    m->cfg = *cfg;
    m->part = *part;
    m->k = k;
    m->esz = mal_dtype_bytes(k->compute);
    m->max_B = max_B;
    m->n_local_layers = part->layer_end - part->layer_begin;
    m->n_heads_local = cfg->n_heads / part->tp_size;
    m->head_dim = cfg->d_model / cfg->n_heads;
    m->ffn_local = cfg->ffn_hidden / part->tp_size;
    /* the key/value heads read by query heads [h0, h0 + Hl):
     * mal_model_tp_range's MAL_TP_KV rule in heads */
    const int group = cfg->n_heads / cfg->n_kv_heads, h0 = part->tp_rank * m->n_heads_local;
    m->kv_first = h0 / group;
    m->heads = (mal_attn_heads){m->n_heads_local,
                                (h0 + m->n_heads_local - 1) / group + 1 - m->kv_first, group,
                                h0 % group};
    m->vocab_first = (int)((int64_t)cfg->vocab * part->tp_rank / part->tp_size);
    m->vocab_local =
        (int)((int64_t)cfg->vocab * (part->tp_rank + 1) / part->tp_size) - m->vocab_first;
    m->rope = cfg->rope;
    return 0;
}

/* The backward scratch buffers, in the order mal_model_create allocates
 * them (model.h: d_res0 ... d_s, then the cross-entropy's exchange). */
enum { N_SCRATCH = 12 };

/* Where each scratch buffer's pointer lives, in that order. */
static void scratch_slots(mal_model *m, void **slots[N_SCRATCH])
{
    void **s[N_SCRATCH] = {&m->d_res0, &m->d_res1, &m->d_h, &m->d_q, &m->d_k, &m->d_v,
                           &m->d_ao,   &m->d_att,  &m->d_g, &m->d_u, &m->d_s,
                           (void **)&m->xent_stats};
    memcpy(slots, s, sizeof s);
}

int mal_model_separate_work(mal_kern k)
{
    return k->compute != MAL_F32;
}

/* Bytes of each of the part's buffers, checked: the fp32 state (one of the
 * four), the working weights (0 when they are the parameters themselves,
 * mal_model_separate_work) and the backward scratch.  MAL_EINVAL when a size overflows. */
static int part_bytes(const mal_model *m, size_t *state, size_t *work, size_t scratch[N_SCRATCH])
{
    int ovf = 0;
    size_t np = m->n_params ? m->n_params : 1;
    *state = mal_size_mul(np, sizeof(float), &ovf);
    *work = !mal_model_separate_work(m->k) ? 0 : mal_size_mul(np + 1, m->esz, &ovf);
    size_t N = (size_t)m->max_B * (size_t)m->cfg.seq_len, C = (size_t)m->cfg.d_model;
    size_t A = (size_t)m->n_heads_local * (size_t)m->head_dim, F = (size_t)m->ffn_local, att;
    size_t K = (size_t)m->heads.Hkv * (size_t)m->head_dim;
    mal_kern_attention_bytes(m->k, m->max_B, m->cfg.seq_len, m->n_heads_local, m->head_dim, NULL,
                             &att);
    if (att == SIZE_MAX) ovf = 1;
    size_t NCe = mal_size_mul(mal_size_mul(N, C, &ovf), m->esz, &ovf);
    size_t NAe = mal_size_mul(mal_size_mul(N, A, &ovf), m->esz, &ovf);
    size_t NKe = mal_size_mul(mal_size_mul(N, K, &ovf), m->esz, &ovf);
    size_t NFe = mal_size_mul(mal_size_mul(N, F, &ovf), m->esz, &ovf);
    size_t xs = m->part.has_head && m->part.tp_size > 1
                    ? mal_size_mul(3 * (size_t)m->part.tp_size * N, sizeof(float), &ovf)
                    : 0;
    size_t sizes[N_SCRATCH] = {NCe, NCe, NCe, NAe, NKe, NKe, NAe, att, NFe, NFe, NFe, xs};
    memcpy(scratch, sizes, sizeof sizes);
    if (ovf)
        return MAL_ERR(MAL_EINVAL,
                       "model: the buffer sizes of this part overflow (d_model %d, ffn_hidden %d, "
                       "seq_len %d, micro-batch %d): the model cannot exist in memory",
                       m->cfg.d_model, m->cfg.ffn_hidden, m->cfg.seq_len, m->max_B);
    return 0;
}

int mal_model_bytes(const mal_model_config *cfg, const mal_model_part *part, int max_B, mal_kern k,
                    int n_acts, int recompute, size_t *bytes)
{
    mal_model m;
    memset(&m, 0, sizeof m);
    int rc = shape_part(&m, cfg, part, max_B, k);
    if (!rc) rc = build_layout(&m);
    size_t state, work, scratch[N_SCRATCH];
    if (!rc) rc = part_bytes(&m, &state, &work, scratch);
    if (!rc && !valid_mode(recompute))
        rc = MAL_ERR(MAL_EINVAL, "model: recompute mode %d is not one (none, selective, full)",
                     recompute);
    if (!rc) {
        int ovf = 0;
        size_t total = mal_size_add(mal_size_mul(state, 4, &ovf), work, &ovf);
        for (int i = 0; i < N_SCRATCH; i++)
            total = mal_size_add(total, scratch[i], &ovf);
        m.recompute = recompute;
        size_t shared, acts = mal_acts_bytes(&m, max_B);
        if (acts == SIZE_MAX || mal_acts_layer_bytes(&m, max_B, recompute, &shared) == SIZE_MAX)
            ovf = 1;
        else
            total = mal_size_add(total, shared, &ovf);
        total = mal_size_add(total, mal_size_mul(acts, (size_t)(n_acts > 0 ? n_acts : 0), &ovf),
                             &ovf);
        if (ovf)
            rc = MAL_ERR(MAL_EINVAL,
                         "model: the memory this part needs overflows a 64-bit count (d_model "
                         "%d, ffn_hidden %d, n_layers %d, seq_len %d)",
                         cfg->d_model, cfg->ffn_hidden, cfg->n_layers, cfg->seq_len);
        *bytes = total;
    }
    free(m.tensors);
    return rc;
}

int mal_model_create_ex(mal_model **out, const mal_model_config *cfg, const mal_model_part *part,
                        int max_B, mal_kern k, uint64_t seed, int flags)
{
    mal_model *m = calloc(1, sizeof *m);
    if (!m) return MAL_ERR(MAL_ENOMEM, "model: out of memory");
    int rc;
    if ((rc = shape_part(m, cfg, part, max_B, k))) goto fail;
    if ((rc = build_layout(m))) goto fail;
    /* Every size first, checked, before anything is allocated. */
    size_t bytes, work_bytes, sizes[N_SCRATCH];
    if ((rc = part_bytes(m, &bytes, &work_bytes, sizes))) goto fail;
    m->w.layer = calloc((size_t)m->n_local_layers + 1, sizeof *m->w.layer);
    m->g.layer = calloc((size_t)m->n_local_layers + 1, sizeof *m->g.layer);
    if (!m->w.layer || !m->g.layer) {
        rc = MAL_ERR(MAL_ENOMEM, "model: out of memory");
        goto fail;
    }
    /* fp32 compute reads the master parameters themselves: they are the
     * working weights */
    m->params = mal_kern_alloc_as(k, bytes, work_bytes ? MAL_MEM_MASTER : MAL_MEM_WEIGHTS);
    m->grads = mal_kern_alloc_as(k, bytes, MAL_MEM_GRADIENTS);
    const int moments = !(flags & MAL_MODEL_NO_MOMENTS);
    if (moments) {
        m->adam_m = mal_kern_alloc_as(k, bytes, MAL_MEM_MOMENTS);
        m->adam_v = mal_kern_alloc_as(k, bytes, MAL_MEM_MOMENTS);
    }
    if (!m->params || !m->grads || (moments && (!m->adam_m || !m->adam_v))) {
        rc = MAL_ERR(MAL_ENOMEM, "model: cannot allocate %zu bytes x4 for parameters and state",
                     bytes);
        goto fail;
    }
    /* fp32 compute reads the master parameters themselves */
    m->work = m->params;
    if (work_bytes && !(m->work = mal_kern_alloc_as(k, work_bytes, MAL_MEM_WEIGHTS))) {
        rc = MAL_ERR(MAL_ENOMEM, "model: cannot allocate the %s working weights",
                     mal_dtype_name(k->compute));
        goto fail;
    }
    make_views(m, m->work, m->esz, &m->w);
    make_views(m, m->grads, sizeof(float), &m->g);

    void **bufs[N_SCRATCH];
    scratch_slots(m, bufs);
    for (size_t i = 0; i < N_SCRATCH; i++) {
        if (!sizes[i]) continue; /* not needed by this part */
        *bufs[i] = mal_kern_alloc_as(k, sizes[i], MAL_MEM_SCRATCH);
        if (!*bufs[i]) {
            rc = MAL_ERR(MAL_ENOMEM, "model: cannot allocate backward scratch");
            goto fail;
        }
    }
    if ((flags & MAL_MODEL_INIT) && (rc = mal_model_init_params(m, seed))) goto fail;
    *out = m;
    return 0;
fail:
    mal_model_destroy(m);
    return rc;
}

int mal_model_park_master(mal_model *m)
{
    if (!m->params || (void *)m->params == m->work) return 0;
    mal_kern_copy(m->k, m->grads, m->params, m->n_params * sizeof(float));
    int rc = mal_kern_sync(m->k);
    if (rc) return rc;
    mal_kern_free(m->k, m->params);
    m->params = NULL;
    m->master_parked = 1;
    return 0;
}

void mal_model_destroy(mal_model *m)
{
    if (!m) return;
    void *bufs[] = {m->work != m->params ? m->work : NULL, m->params, m->grads, m->adam_m,
                    m->adam_v};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        if (bufs[i]) mal_kern_free(m->k, bufs[i]);
    void **scr[N_SCRATCH];
    scratch_slots(m, scr);
    for (size_t i = 0; i < N_SCRATCH; i++)
        if (*scr[i]) mal_kern_free(m->k, *scr[i]);
    if (m->rc_block) mal_kern_free(m->k, m->rc_block);
    free(m->w.layer);
    free(m->g.layer);
    free(m->tensors);
    free(m);
}

void mal_model_release_work(mal_model *m)
{
    if (!m) return;
    /* the working copy is only read by the passes: a separate one goes */
    if (m->work != m->params) mal_kern_free(m->k, m->work);
    m->work = NULL;
    if (m->grads) mal_kern_free(m->k, m->grads);
    m->grads = NULL;
    void **bufs[N_SCRATCH];
    scratch_slots(m, bufs);
    for (size_t i = 0; i < N_SCRATCH; i++) {
        if (*bufs[i]) mal_kern_free(m->k, *bufs[i]);
        *bufs[i] = NULL;
    }
    /* no pass runs on it again: the recompute buffer goes too */
    if (m->rc_block) mal_kern_free(m->k, m->rc_block);
    m->rc_block = NULL;
    memset(m->rc_arr, 0, sizeof m->rc_arr);
}

void mal_model_rebind_views(mal_model *m)
{
    if (!mal_model_separate_work(m->k)) m->work = m->params;
    make_views(m, m->work, m->esz, &m->w);
    mal_model_refresh_working(m);
}

void mal_model_refresh_working(mal_model *m)
{
    /* no whole master (sharded, gradsync.h): its owners refresh the copy */
    if (m && m->work && m->params && m->work != m->params)
        mal_kern_cast_working(m->k, m->work, m->params, m->n_params);
}

float **mal_model_state_ref(mal_model *m, int g)
{
    switch (g) {
    case MAL_STATE_PARAM: return &m->params;
    case MAL_STATE_ADAM_M: return &m->adam_m;
    case MAL_STATE_ADAM_V: return &m->adam_v;
    default: return &m->grads;
    }
}

float *mal_model_state(const mal_model *m, int g)
{
    return *mal_model_state_ref((mal_model *)m, g);
}

const char *mal_model_state_name(int g)
{
    static const char *const names[] = {"param", "adam_m", "adam_v", "grad"};
    return g >= 0 && g <= MAL_STATE_GRAD ? names[g] : "?";
}

/* A group the model does not keep: the moments of a part made with
 * MAL_MODEL_NO_MOMENTS (the sharded optimizer keeps its share). */
static int state_missing(const mal_model *m, int g)
{
    if (mal_model_state(m, g)) return 0;
    return MAL_ERR(MAL_ENOTSUP,
                   "model: the %s state is not kept whole on this rank (the sharded optimizer, "
                   "--zero 1, and for the parameters --zero-master on, keep only this rank's "
                   "share)",
                   mal_model_state_name(g));
}

int mal_model_state_to_host(const mal_model *m, int g, const mal_tensor_info *t, float *host)
{
    int rc = state_missing(m, g);
    if (rc) return rc;
    mal_kern_to_host(m->k, host, mal_model_state(m, g) + t->offset, t->n * sizeof(float));
    return mal_kern_sync(m->k);
}

int mal_model_state_from_host(mal_model *m, int g, const mal_tensor_info *t, const float *host)
{
    int rc = state_missing(m, g);
    if (rc) return rc;
    mal_kern_from_host(m->k, mal_model_state(m, g) + t->offset, host, t->n * sizeof(float));
    if (g == MAL_STATE_PARAM && m->work != m->params)
        mal_kern_cast_working(m->k, (char *)m->work + t->offset * m->esz,
                              m->params + t->offset, t->n);
    return mal_kern_sync(m->k);
}

int mal_model_extends(const mal_model *a, const mal_model *b)
{
    if (a->n_params > b->n_params || a->n_tensors > b->n_tensors) return 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const mal_tensor_info *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) || x->offset != y->offset || x->split_dim != y->split_dim ||
            x->split_off != y->split_off || x->local_shape[0] != y->local_shape[0] ||
            x->local_shape[1] != y->local_shape[1])
            return 0;
    }
    return 1;
}

const mal_tensor_info *mal_model_find(const mal_model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

void mal_model_zero_grad(mal_model *m)
{
    mal_kern_zero(m->k, m->grads, m->n_params * sizeof(float));
}

/* ---- activations ---------------------------------------------------- */

/* Per-layer activation arrays, in the order they are carved from the block. */
enum { A_H1, A_RSTD1, A_Q, A_K, A_V, A_ATT, A_AO, A_MID, A_H2, A_RSTD2, A_G, A_U, A_S, A_NARR };
_Static_assert((int)A_NARR == (int)MAL_ACTS_LAYER_ARRAYS, "model.h's count of per-layer arrays");

/* 1 when recompute mode `mode` does not keep per-layer array i (A_*) in a
 * mal_acts.  Selective drops what one element-wise kernel rebuilds from
 * kept arrays: the norms' outputs and rstd (from the layer's input and the
 * mid-layer residual) and the SwiGLU product (from the gate and up
 * products, the largest, N x F); full drops everything of a layer. */
static int dropped(int mode, int i)
{
    if (mode == MAL_RECOMPUTE_FULL) return 1;
    if (mode == MAL_RECOMPUTE_SELECTIVE)
        return i == A_H1 || i == A_RSTD1 || i == A_H2 || i == A_RSTD2 || i == A_S;
    return 0;
}

/* Where each per-layer array's pointer table lives in `a`, in A_* order
 * (float ** and void ** tables alike hold device pointers). */
static void acts_tables(mal_acts *a, void ***t[A_NARR])
{
    void ***s[A_NARR] = {&a->h1,  (void ***)&a->rstd1, &a->q,  &a->k, &a->v,
                         &a->att, &a->ao,              &a->mid, &a->h2,
                         (void ***)&a->rstd2,          &a->g,  &a->u, &a->s};
    memcpy(t, s, sizeof s);
}

/* Every array starts at a multiple of 64 bytes (16 floats), so vector loads
 * never straddle.  Checked: sets *ovf instead of wrapping. */
static size_t pad64(size_t bytes, int *ovf)
{
    return mal_size_add(bytes, 63, ovf) & ~(size_t)63;
}

/* a * b * c bytes, checked */
static size_t mul3(size_t a, size_t b, size_t c, int *ovf)
{
    return mal_size_mul(mal_size_mul(a, b, ovf), c, ovf);
}

/* Bytes of each per-layer array for micro-batches of B sequences
 * (checked: *ovf set when one overflows). */
static void layer_bytes(const mal_model *m, int B, size_t sz[A_NARR], int *ovf)
{
    size_t N = (size_t)B * (size_t)m->cfg.seq_len, C = (size_t)m->cfg.d_model;
    size_t A = (size_t)m->n_heads_local * (size_t)m->head_dim, F = (size_t)m->ffn_local;
    size_t K = (size_t)m->heads.Hkv * (size_t)m->head_dim;
    size_t e = m->esz, f = sizeof(float), att;
    mal_kern_attention_bytes(m->k, B, m->cfg.seq_len, m->n_heads_local, m->head_dim, &att, NULL);
    if (att == SIZE_MAX) *ovf = 1;
    size_t NCe = mul3(N, C, e, ovf), NAe = mul3(N, A, e, ovf), NFe = mul3(N, F, e, ovf);
    size_t NKe = mul3(N, K, e, ovf);
    size_t s[A_NARR] = {NCe, N * f, NAe, NKe, NKe, att, NAe, NCe, NCe, N * f, NFe, NFe, NFe};
    memcpy(sz, s, sizeof s);
}

size_t mal_acts_layer_bytes(const mal_model *m, int B, int mode, size_t *shared)
{
    size_t sz[A_NARR], msz[A_NARR], kept = 0, sh = 0;
    size_t N = (size_t)B * (size_t)m->cfg.seq_len, C = (size_t)m->cfg.d_model;
    int ovf = !valid_mode(mode);
    layer_bytes(m, B, sz, &ovf);
    layer_bytes(m, m->max_B, msz, &ovf);
    for (int i = 0; i < A_NARR && !ovf; i++) {
        if (dropped(mode, i))
            sh = mal_size_add(sh, pad64(msz[i], &ovf), &ovf);
        else
            kept = mal_size_add(kept, pad64(sz[i], &ovf), &ovf);
    }
    /* the layer's input, the residual stream: kept in every mode */
    kept = mal_size_add(kept, pad64(mul3(N, C, m->esz, &ovf), &ovf), &ovf);
    if (shared) *shared = ovf ? SIZE_MAX : m->n_local_layers ? sh : 0;
    return ovf ? SIZE_MAX : kept;
}

size_t mal_acts_bytes(const mal_model *m, int B)
{
    size_t N = (size_t)B * (size_t)m->cfg.seq_len, C = (size_t)m->cfg.d_model;
    size_t V = (size_t)m->vocab_local, e = m->esz, f = sizeof(float);
    size_t L = (size_t)m->n_local_layers;
    int ovf = 0;
    size_t per_layer = mal_acts_layer_bytes(m, B, m->recompute, NULL);
    if (per_layer == SIZE_MAX) return SIZE_MAX;
    size_t total = mal_size_mul(per_layer, L, &ovf);
    /* the residual stream leaving the last layer (the part's output) */
    total = mal_size_add(total, pad64(mul3(N, C, e, &ovf), &ovf), &ovf);
    if (m->part.has_head) {
        total = mal_size_add(total, pad64(mul3(N, C, e, &ovf), &ovf), &ovf);
        total = mal_size_add(total, pad64(mul3(N, V, e, &ovf), &ovf), &ovf);
        total = mal_size_add(total, 2 * pad64(N * f, &ovf), &ovf);
    }
    total = mal_size_add(total, 2 * pad64(N * sizeof(int), &ovf), &ovf);
    return ovf ? SIZE_MAX : total;
}

int mal_model_set_recompute(mal_model *m, int mode)
{
    if (!valid_mode(mode))
        return MAL_ERR(MAL_EINVAL, "model: recompute mode %d is not one (none, selective, full)",
                       mode);
    if (m->rc_block) mal_kern_free(m->k, m->rc_block);
    m->rc_block = NULL;
    memset(m->rc_arr, 0, sizeof m->rc_arr);
    m->recompute = MAL_RECOMPUTE_NONE;
    size_t shared, msz[A_NARR];
    int ovf = 0;
    if (mal_acts_layer_bytes(m, m->max_B, mode, &shared) == SIZE_MAX)
        return MAL_ERR(MAL_EINVAL, "model: the recompute buffer's size overflows");
    if (shared) {
        if (!(m->rc_block = mal_kern_alloc_as(m->k, shared, MAL_MEM_ACTIVATIONS)))
            return MAL_ERR(MAL_ENOMEM,
                           "model: cannot allocate %zu bytes for --recompute %s's one-layer "
                           "buffer",
                           shared, mal_recompute_name(mode));
        layer_bytes(m, m->max_B, msz, &ovf);
        char *p = m->rc_block; /* carving a device buffer: pointer arithmetic only */
        for (int i = 0; i < A_NARR; i++)
            if (dropped(mode, i)) {
                m->rc_arr[i] = p;
                p += pad64(msz[i], &ovf);
            }
    }
    m->recompute = mode;
    return 0;
}

int mal_acts_create(mal_acts **out, const mal_model *m, int B)
{
    if (B < 1 || B > m->max_B)
        return MAL_ERR(MAL_EINVAL, "activations: micro-batch %d outside [1, %d]", B, m->max_B);
    mal_acts *a = calloc(1, sizeof *a);
    int L = m->n_local_layers;
    if (!a) return MAL_ERR(MAL_ENOMEM, "activations: out of memory");
    a->B = B;
    a->T = m->cfg.seq_len;
    a->recompute = m->recompute;
    void ***arrs[A_NARR];
    acts_tables(a, arrs);
    a->res = calloc((size_t)L + 1, sizeof(void *));
    int ok = a->res != NULL;
    for (int i = 0; i < A_NARR; i++)
        ok = ok && (*arrs[i] = calloc((size_t)L + 1, sizeof(void *)));
    size_t bytes = mal_acts_bytes(m, B);
    if (bytes == SIZE_MAX) {
        mal_acts_destroy(m, a);
        return MAL_ERR(MAL_EINVAL, "activations: the sizes for micro-batch %d overflow", B);
    }
    if (ok) a->block = mal_kern_alloc_as(m->k, bytes, MAL_MEM_ACTIVATIONS);
    if (!ok || !a->block) {
        mal_acts_destroy(m, a);
        return MAL_ERR(MAL_ENOMEM, "activations: cannot allocate %zu bytes", bytes);
    }
    size_t N = (size_t)B * (size_t)m->cfg.seq_len, C = (size_t)m->cfg.d_model, e = m->esz;
    size_t sz[A_NARR];
    int ovf = 0; /* not again: mal_acts_bytes checked these */
    layer_bytes(m, B, sz, &ovf);
    /* carving a device buffer: pointer arithmetic only; an array the mode
     * drops stays NULL */
    char *p = a->block;
    for (int l = 0; l <= L; l++, p += pad64(N * C * e, &ovf))
        a->res[l] = p;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < A_NARR; i++) {
            if (dropped(a->recompute, i)) continue;
            (*arrs[i])[l] = p;
            p += pad64(sz[i], &ovf);
        }
    if (m->part.has_head) {
        a->hf = p, p += pad64(N * C * e, &ovf);
        a->rstdf = (float *)p, p += pad64(N * sizeof(float), &ovf);
        a->logits = p, p += pad64(N * (size_t)m->vocab_local * e, &ovf);
        a->losses = (float *)p, p += pad64(N * sizeof(float), &ovf);
    }
    a->tokens = (int *)p;
    a->targets = (int *)(p + pad64(N * sizeof(int), &ovf));
    *out = a;
    return 0;
}

void mal_acts_destroy(const mal_model *m, mal_acts *a)
{
    if (!a) return;
    if (a->block) mal_kern_free(m->k, a->block);
    void ***arrs[A_NARR];
    acts_tables(a, arrs);
    for (int i = 0; i < A_NARR; i++)
        free(*arrs[i]);
    free(a->res);
    free(a);
}

void mal_acts_set_batch(const mal_model *m, mal_acts *a, const int *inputs, const int *targets)
{
    size_t N = (size_t)a->B * (size_t)a->T;
    mal_kern_from_host(m->k, a->tokens, inputs, N * sizeof(int));
    mal_kern_from_host(m->k, a->targets, targets, N * sizeof(int));
    /* the caller may refill its host arrays as soon as this returns */
    mal_kern_queue_wait(m->k);
}

double mal_acts_loss_sum(const mal_model *m, const mal_acts *a)
{
    size_t N = (size_t)a->B * (size_t)a->T;
    float *h = malloc(N * sizeof(float));
    if (!h) return NAN;
    mal_kern_to_host(m->k, h, a->losses, N * sizeof(float));
    mal_kern_queue_wait(m->k);
    double s = 0;
    for (size_t i = 0; i < N; i++)
        s += h[i];
    free(h);
    return s;
}

/* ---- forward / backward ---------------------------------------------- */

/* Sum n elements of type dt over the TP group (nothing with TP 1). */
static int tp_reduce_dt(mal_model *m, void *x, size_t n, mal_dtype dt)
{
    if (m->part.tp_size == 1) return 0;
    if (!m->tp_allreduce)
        return MAL_ERR(MAL_EINVAL, "model: TP size %d but no TP all-reduce installed",
                       m->part.tp_size);
    return m->tp_allreduce(m->tp_ctx, x, n, dt);
}

/* The same on activations (compute dtype). */
static int tp_reduce(mal_model *m, void *x, size_t n)
{
    return tp_reduce_dt(m, x, n, m->k->compute);
}

/* The loss of the head's logits (N,Vl) and, when dloss_scale != 0, their
 * gradient in place.  One rank: the fused kernel.  A TP group: each rank's
 * row statistics go into its slot of the (P,3,N) exchange buffer, zero
 * elsewhere, and one sum over the group gives every rank all P slots
 * (Megatron's vocabulary-parallel cross-entropy: the max, the sum of
 * exponentials and the target's logit, never the logits themselves). */
static int head_loss(mal_model *m, mal_acts *a, float dloss_scale)
{
    mal_kern k = m->k;
    const int N = a->B * a->T, P = m->part.tp_size, Vl = m->vocab_local, v0 = m->vocab_first;
    void *dlogits = dloss_scale != 0.0f ? a->logits : NULL;
    if (P == 1) {
        mal_kern_xent_fwd_bwd(k, a->losses, dlogits, a->logits, a->targets, N, m->cfg.vocab,
                              dloss_scale);
        return 0;
    }
    const size_t slot = 3 * (size_t)N;
    mal_kern_zero(k, m->xent_stats, (size_t)P * slot * sizeof(float));
    mal_kern_xent_stats(k, m->xent_stats + (size_t)m->part.tp_rank * slot, a->logits, a->targets,
                        N, Vl, v0);
    int rc = tp_reduce_dt(m, m->xent_stats, (size_t)P * slot, MAL_F32);
    if (rc) return rc;
    mal_kern_xent_combine(k, a->losses, dlogits, a->logits, m->xent_stats, P, a->targets, N, Vl, v0,
                          m->cfg.vocab, dloss_scale);
    return 0;
}

static int grad_ready(mal_model *m, int layer)
{
    return m->grad_ready ? m->grad_ready(m->grad_ctx, layer) : 0;
}

/* Layer l's arrays for activation set a (A_* order): its own where its
 * mode keeps them, else the model's shared one-layer buffer. */
static void layer_arrays(const mal_model *m, mal_acts *a, int l, void *p[A_NARR])
{
    void ***t[A_NARR];
    acts_tables(a, t);
    for (int i = 0; i < A_NARR; i++)
        p[i] = (*t[i])[l] ? (*t[i])[l] : m->rc_arr[i];
}

/* A pass on activations made under another mode would read arrays that do
 * not exist. */
static int check_mode(const mal_model *m, const mal_acts *a)
{
    if (a->recompute == m->recompute) return 0;
    return MAL_ERR(MAL_EINVAL,
                   "model: activations made for recompute mode %s, the model is in mode %s",
                   mal_recompute_name(a->recompute), mal_recompute_name(m->recompute));
}

/* Forward of local layer l from its input x into its arrays p (A_*), and
 * its output into y; with y NULL it stops after the SwiGLU product: the
 * full recomputation before the layer's backward, which reads everything
 * but the output (already in the next layer's input, or sent on). */
static int layer_forward(mal_model *m, int B, int T, int l, const void *x, void *const p[A_NARR],
                         void *y)
{
    mal_kern k = m->k;
    const mal_model_config *c = &m->cfg;
    const int N = B * T, C = c->d_model;
    const int Hl = m->n_heads_local, hd = m->head_dim, A = Hl * hd, F = m->ffn_local;
    const int Kl = m->heads.Hkv, AK = Kl * hd;
    const mal_layer_views *w = &m->w.layer[l];
    void *mid = p[A_MID];
    int rc;
    mal_kern_rmsnorm_fwd(k, p[A_H1], p[A_RSTD1], x, w->attn_norm, N, C, c->norm_eps);
    mal_kern_matmul_fwd(k, p[A_Q], p[A_H1], w->wq, N, C, A, 0);
    mal_kern_matmul_fwd(k, p[A_K], p[A_H1], w->wk, N, C, AK, 0);
    mal_kern_matmul_fwd(k, p[A_V], p[A_H1], w->wv, N, C, AK, 0);
    mal_kern_rope_fwd(k, p[A_Q], B, T, Hl, hd, &m->rope);
    mal_kern_rope_fwd(k, p[A_K], B, T, Kl, hd, &m->rope);
    mal_kern_attention_fwd(k, p[A_AO], p[A_ATT], p[A_Q], p[A_K], p[A_V], B, T, m->heads, hd);
    /* Row-parallel output projection: partial sums over the TP group are
     * reduced before the residual is added, so it is added once. */
    mal_kern_matmul_fwd(k, mid, p[A_AO], w->wo, N, A, C, 0);
    if ((rc = tp_reduce(m, mid, (size_t)N * C))) return rc;
    mal_kern_add(k, mid, mid, x, (size_t)N * C);

    mal_kern_rmsnorm_fwd(k, p[A_H2], p[A_RSTD2], mid, w->mlp_norm, N, C, c->norm_eps);
    mal_kern_matmul_fwd(k, p[A_G], p[A_H2], w->w1, N, C, F, 0);
    mal_kern_matmul_fwd(k, p[A_U], p[A_H2], w->w3, N, C, F, 0);
    mal_kern_swiglu_fwd(k, p[A_S], p[A_G], p[A_U], (size_t)N * F);
    if (!y) return 0;
    mal_kern_matmul_fwd(k, y, p[A_S], w->w2, N, F, C, 0);
    if ((rc = tp_reduce(m, y, (size_t)N * C))) return rc;
    mal_kern_add(k, y, y, mid, (size_t)N * C);
    return 0;
}

/* Before layer l's backward: what its mode dropped, computed again by the
 * forward's own kernels on the same inputs (so bitwise the same values)
 * into the shared buffer that p points into. */
static int layer_recompute(mal_model *m, mal_acts *a, int l, void *const p[A_NARR])
{
    mal_kern k = m->k;
    const mal_model_config *c = &m->cfg;
    const mal_layer_views *w = &m->w.layer[l];
    const int N = a->B * a->T, C = c->d_model;
    switch (a->recompute) {
    case MAL_RECOMPUTE_FULL: return layer_forward(m, a->B, a->T, l, a->res[l], p, NULL);
    case MAL_RECOMPUTE_SELECTIVE:
        mal_kern_rmsnorm_fwd(k, p[A_H1], p[A_RSTD1], a->res[l], w->attn_norm, N, C, c->norm_eps);
        mal_kern_rmsnorm_fwd(k, p[A_H2], p[A_RSTD2], p[A_MID], w->mlp_norm, N, C, c->norm_eps);
        mal_kern_swiglu_fwd(k, p[A_S], p[A_G], p[A_U], (size_t)N * m->ffn_local);
        return 0;
    default: return 0;
    }
}

int mal_model_forward(mal_model *m, mal_acts *a, const void *inp, float dloss_scale)
{
    mal_kern k = m->k;
    const mal_model_config *c = &m->cfg;
    const int N = a->B * a->T, C = c->d_model, Vl = m->vocab_local;
    int rc;
    if ((rc = check_mode(m, a))) return rc;

    if (m->part.has_embed) {
        /* Vocabulary-parallel: each rank looks up the tokens of its rows,
         * zeros for the others, and the sum over the group is the
         * embedding (one rank's row plus exact zeros). */
        mal_kern_embedding_fwd(k, a->res[0], a->tokens, m->w.tok_embedding, N, C, c->vocab,
                               m->vocab_first, Vl);
        if ((rc = tp_reduce(m, a->res[0], (size_t)N * C))) return rc;
    } else if (inp != a->res[0]) {
        mal_kern_copy(k, a->res[0], inp, (size_t)N * C * m->esz);
    }

    for (int l = 0; l < m->n_local_layers; l++) {
        /* arrays the mode drops are written to the shared buffer, read
         * within this layer only */
        void *p[A_NARR];
        layer_arrays(m, a, l, p);
        if ((rc = layer_forward(m, a->B, a->T, l, a->res[l], p, a->res[l + 1]))) return rc;
    }

    if (m->part.has_head) {
        void *x = a->res[m->n_local_layers];
        mal_kern_rmsnorm_fwd(k, a->hf, a->rstdf, x, m->w.final_norm, N, C, c->norm_eps);
        mal_kern_matmul_fwd(k, a->logits, a->hf, m->w.lm_head, N, C, Vl, 0);
        if ((rc = head_loss(m, a, dloss_scale))) return rc;
    }
    return 0;
}

int mal_model_backward(mal_model *m, mal_acts *a, const void *dout, void **dinp)
{
    mal_kern k = m->k;
    const mal_model_config *c = &m->cfg;
    const int B = a->B, T = a->T, N = B * T, C = c->d_model, Vl = m->vocab_local;
    const int Hl = m->n_heads_local, hd = m->head_dim, A = Hl * hd, F = m->ffn_local;
    const int Kl = m->heads.Hkv, AK = Kl * hd;
    const size_t NC = (size_t)N * C;
    int rc;
    if ((rc = check_mode(m, a))) return rc;
    /* d0: gradient of the residual stream leaving the current layer;
     * d1: gradient of the mid-layer residual. */
    void *d0 = m->d_res0, *d1 = m->d_res1;
    const size_t e = m->esz;

    /* Each block zeroes the gradients it accumulates into with one
     * operation (one launch on a GPU, not a memset each): none of them is
     * read between that zero and its first accumulation, and each was last
     * read before it (the queue runs in order). */
    if (m->part.has_head) {
        void *x = a->res[m->n_local_layers];
        void *const hz[] = {m->d_h, d0};
        const size_t hzb[] = {NC * e, NC * e};
        mal_kern_zero_multi(k, hz, hzb, 2);
        mal_kern_matmul_bwd(k, m->d_h, m->g.lm_head, a->logits, a->hf, m->w.lm_head, N, C, Vl);
        /* each rank's vocabulary rows gave part of the final norm's
         * output gradient */
        if ((rc = tp_reduce(m, m->d_h, NC))) return rc;
        mal_kern_rmsnorm_bwd(k, d0, m->g.final_norm, m->d_h, x, m->w.final_norm, a->rstdf, N, C);
        if ((rc = grad_ready(m, c->n_layers))) return rc;
    } else {
        mal_kern_copy(k, d0, dout, NC * e);
    }

    for (int l = m->n_local_layers - 1; l >= 0; l--) {
        const mal_layer_views *w = &m->w.layer[l];
        mal_layer_views *gw = &m->g.layer[l];
        void *p[A_NARR];
        layer_arrays(m, a, l, p);
        /* the shared buffer holds another layer's (or micro-batch's)
         * arrays: this layer's first, on the same queue as its readers */
        if ((rc = layer_recompute(m, a, l, p))) return rc;
        /* MLP block: y = mid + swiglu(h2 W1^T, h2 W3^T) W2^T */
        void *const mz[] = {m->d_s, m->d_g, m->d_u, m->d_h};
        const size_t mzb[] = {(size_t)N * F * e, (size_t)N * F * e, (size_t)N * F * e, NC * e};
        mal_kern_copy(k, d1, d0, NC * e);
        mal_kern_zero_multi(k, mz, mzb, 4);
        mal_kern_matmul_bwd(k, m->d_s, gw->w2, d0, p[A_S], w->w2, N, F, C);
        mal_kern_swiglu_bwd(k, m->d_g, m->d_u, m->d_s, p[A_G], p[A_U], (size_t)N * F);
        mal_kern_matmul_bwd(k, m->d_h, gw->w1, m->d_g, p[A_H2], w->w1, N, C, F);
        mal_kern_matmul_bwd(k, m->d_h, gw->w3, m->d_u, p[A_H2], w->w3, N, C, F);
        /* Column-parallel input: each TP rank saw only its FFN columns. */
        if ((rc = tp_reduce(m, m->d_h, NC))) return rc;
        mal_kern_rmsnorm_bwd(k, d1, gw->mlp_norm, m->d_h, p[A_MID], w->mlp_norm, p[A_RSTD2], N, C);

        /* Attention block: mid = x + attn(rope(h1 Wq^T), rope(h1 Wk^T), h1 Wv^T) Wo^T
         * (d_h was last read by the norm's backward just above; the
         * attention backward writes d_q, d_k, d_v itself) */
        void *const az[] = {m->d_ao, m->d_h};
        const size_t azb[] = {(size_t)N * A * e, NC * e};
        mal_kern_zero_multi(k, az, azb, 2);
        mal_kern_matmul_bwd(k, m->d_ao, gw->wo, d1, p[A_AO], w->wo, N, A, C);
        mal_kern_attention_bwd(k, m->d_q, m->d_k, m->d_v, m->d_att, m->d_ao, p[A_AO], p[A_Q],
                               p[A_K], p[A_V], p[A_ATT], B, T, m->heads, hd);
        mal_kern_rope_bwd(k, m->d_q, B, T, Hl, hd, &m->rope);
        mal_kern_rope_bwd(k, m->d_k, B, T, Kl, hd, &m->rope);
        /* A key/value head replicated over TP ranks gets here only the
         * gradient from this rank's query heads (d_k, d_v partial): the
         * sum over the replicas is the gradient sync's (gradsync.c); its
         * input gradient is summed with the rest just below. */
        mal_kern_matmul_bwd(k, m->d_h, gw->wq, m->d_q, p[A_H1], w->wq, N, C, A);
        mal_kern_matmul_bwd(k, m->d_h, gw->wk, m->d_k, p[A_H1], w->wk, N, C, AK);
        mal_kern_matmul_bwd(k, m->d_h, gw->wv, m->d_v, p[A_H1], w->wv, N, C, AK);
        if ((rc = tp_reduce(m, m->d_h, NC))) return rc;
        mal_kern_copy(k, d0, d1, NC * e);
        mal_kern_rmsnorm_bwd(k, d0, gw->attn_norm, m->d_h, a->res[l], w->attn_norm, p[A_RSTD1], N,
                             C);
        if ((rc = grad_ready(m, m->part.layer_begin + l))) return rc;
    }

    if (m->part.has_embed) {
        /* with tied embeddings, onto the output layer's gradient */
        mal_kern_embedding_bwd(k, m->g.tok_embedding, d0, a->tokens, N, C, m->vocab_first, Vl);
        if ((rc = grad_ready(m, -1))) return rc;
        if (dinp) *dinp = NULL;
    } else if (dinp) {
        *dinp = d0;
    }
    return 0;
}

int mal_model_logits_row(mal_model *m, const mal_acts *a, int row, float *host)
{
    const size_t V = (size_t)m->cfg.vocab, Vl = (size_t)m->vocab_local, e = m->esz;
    const char *src = (const char *)a->logits + (size_t)row * Vl * e;
    void *full = NULL;
    int rc = 0;
    if (m->part.tp_size > 1) {
        /* the shards' columns into a zeroed row, summed over the group:
         * each element is one shard's value plus exact zeros */
        if (!(full = mal_kern_alloc_as(m->k, V * e, MAL_MEM_SCRATCH)))
            return MAL_ERR(MAL_ENOMEM, "model: no memory for a row of %zu logits", V);
        mal_kern_copy(m->k, (char *)full + (size_t)m->vocab_first * e, src, Vl * e);
        if ((rc = tp_reduce(m, full, V))) goto out;
        src = full;
    }
    mal_kern_to_host(m->k, host, src, V * e);
    if ((rc = mal_kern_sync(m->k)) || e == sizeof(float)) goto out;
    /* bf16 compute: the row arrived as V halves at the front of `host`;
     * widen in place from the end (element i's bits are the upper half of
     * float i, so its source at byte 2i is read before byte 4i is
     * written). */
    const uint16_t *h = (const uint16_t *)(void *)host;
    for (size_t i = V; i-- > 0;) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(host + i, &u, sizeof u);
    }
out:
    if (full) mal_kern_free(m->k, full);
    return rc;
}
