/* malleus-train --profile: measure a model profile for the planner on this
 * machine (replan/README.md, "Model profile").
 *
 * Time: one transformer layer, forward and backward of one micro-batch, as
 * each TP size's rank 0 computes it (heads and FFN columns split, the TP
 * all-reduce left out: this measures the device, communication is modelled
 * separately), median of several repetitions.  alpha[s] is that time over
 * the nominal size's.  Memory: the exact bytes the runtime allocates -
 * parameters, gradients, Adam m and v of one layer's shard, and activations
 * of one micro-batch per 1F1B slot - and the embedding/LM-head state plus
 * logits.  The fixed overhead X is this process's resident memory before the
 * model exists.  Recomputation (acts_kept, recompute_time): the share of a
 * layer's activations each mode keeps, from the runtime's exact sizes, and
 * the share of the nominal layer's time it adds, the modes timed in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "linkprobe.h"
#include "src/model.h"
#include "train.h"

/* The straggler monitor's probe holds three n x n matrices in the compute
 * dtype at its default size (monitor.c: 192) and, while it fills them, an
 * fp32 one: buffers of every rank outside the model, counted with the
 * scratch (the fp32 one is in the peak of a small part, whose set-up is
 * its largest moment). */
enum { PROBE_N = 192 };

/* Bytes of the buffers a rank of TP size t holds beside the state and the
 * activations: the backward scratch of its layers (the model's own count,
 * mal_model_bytes without activations, less its state) and the probe. */
static int scratch_bytes(mal_kern k, const mal_model_config *cfg, int B, int t, double *out)
{
    mal_model_part part = {0, 1, 0, 0, t, 0};
    mal_tensor_info *tens;
    int n_t, rc;
    size_t np, all;
    if ((rc = mal_model_layout(cfg, &part, &tens, &n_t, &np))) return rc;
    free(tens);
    if ((rc = mal_model_bytes(cfg, &part, B, k, 0, MAL_RECOMPUTE_NONE, &all))) return rc;
    /* the state (4 buffers of fp32) and a working copy apart (its dtype) */
    double state = 16.0 * (double)np, esz = (double)mal_dtype_bytes(k->compute);
    if (k->compute != MAL_F32) state += esz * (double)(np + 1);
    *out = (double)all - state + (3.0 * esz + 4.0) * PROBE_N * PROBE_N;
    return 0;
}

/* One layer on rank 0 of a TP group of t: its state (per_param bytes per
 * parameter) and one micro-batch's activations. */
static int layer_bytes(mal_kern k, const mal_model_config *cfg, int B, int t, double per_param,
                       double *state, double *acts)
{
    mal_model_part part = {0, 1, 0, 0, t, 0};
    mal_model *m;
    int rc = mal_model_create(&m, cfg, &part, B, k, 1);
    if (rc) return rc;
    *state = per_param * (double)m->n_params;
    *acts = (double)mal_acts_bytes(m, B);
    mal_model_destroy(m);
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double rss_mb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * 4096.0 / 1048576.0;
}

/* Seconds of one layer fwd+bwd on TP size t (rank 0 of the group) under
 * each of the n_modes recompute modes modes[]: out_med[i] the median of at
 * least `reps` repetitions (the layer time), out_best[i] the least (where
 * two modes are compared: the repetition other loads of the machine
 * disturbed least).  With min_s > 0 the repetitions go on, up to
 * MAX_REPS, until the first mode has run min_s seconds: a small layer's
 * pass takes under a millisecond, and the least of a few hundred is what
 * a loaded machine leaves undisturbed.  The modes take turns within each repetition, so noise that
 * lasts longer than one pass hits every mode alike; each has its own
 * instance of the layer (the same weights), as a run holds one shared
 * buffer for its mode, allocated once: switching one instance's mode
 * would time fresh pages of a new buffer. */
static int time_layer(mal_kern k, const mal_model_config *cfg, int B, int t, int reps, double min_s,
                      const int *modes, int n_modes, double *out_med, double *out_best)
{
    enum { MAX_MODES = MAL_RECOMPUTE_FULL + 1, MAX_REPS = 500 };
    mal_model_part part = {0, 1, 0, 0, t, 0};
    mal_model *m[MAX_MODES] = {NULL};
    mal_acts *a[MAX_MODES] = {NULL};
    void *dout = NULL;
    double *ts = malloc(sizeof *ts * MAX_REPS * (size_t)n_modes), spent = 0;
    int rc;
    if (!ts) return MAL_ERR(MAL_ENOMEM, "profile: out of memory");
    if (n_modes < 1 || n_modes > MAX_MODES || reps < 1 || reps > MAX_REPS) {
        rc = MAL_ERR(MAL_EINVAL, "profile: %d recompute modes to time", n_modes);
        goto out;
    }
    for (int i = 0; i < n_modes; i++) {
        if ((rc = mal_model_create(&m[i], cfg, &part, B, k, 1))) goto out;
        /* No all-reduce: the part computes its own shard only. */
        m[i]->part.tp_size = 1;
        if ((rc = mal_model_set_recompute(m[i], modes[i])) ||
            (rc = mal_acts_create(&a[i], m[i], B)))
            goto out;
    }
    size_t NC = (size_t)B * cfg->seq_len * cfg->d_model;
    dout = mal_kern_alloc(m[0]->k, NC * m[0]->esz);
    if (!dout) {
        rc = MAL_ERR(MAL_ENOMEM, "profile: out of memory");
        goto out;
    }
    int n = 0; /* repetitions timed */
    for (int r = 0; r == 0 || n < reps || (spent < min_s && n < MAX_REPS); r++)
        for (int i = 0; i < n_modes; i++) {
            double t0 = mal_now();
            if ((rc = mal_model_forward(m[i], a[i], a[i]->res[0], 0.0f))) goto out;
            void *dinp;
            if ((rc = mal_model_backward(m[i], a[i], dout, &dinp))) goto out;
            if ((rc = mal_kern_sync(m[i]->k))) goto out;
            if (r == 0) continue; /* the first run warms caches */
            double dt = mal_now() - t0;
            ts[(size_t)i * MAX_REPS + n] = dt;
            if (i == 0) spent += dt;
            if (i == n_modes - 1) n++;
        }
    for (int i = 0; i < n_modes; i++) {
        double *ti = ts + (size_t)i * MAX_REPS;
        qsort(ti, (size_t)n, sizeof *ts, cmp_d);
        out_med[i] = ti[n / 2];
        out_best[i] = ti[0];
    }
out:
    if (dout) mal_kern_free(m[0]->k, dout);
    for (int i = 0; i < MAX_MODES; i++) {
        if (a[i]) mal_acts_destroy(m[i], a[i]);
        mal_model_destroy(m[i]);
    }
    free(ts);
    return rc;
}

/* The recomputation figures of the planner (replan/README.md,
 * "Recomputation") on the nominal part m for micro-batches of B:
 * kept[mode] the share of a layer's activations `acts` (the profile's
 * rank_acts_mb at that size: mal_acts_bytes of a one-layer part) that the
 * mode keeps.  The runtime's exact sizes (mal_acts_layer_bytes): a mode
 * drops none's per-layer bytes less its own, per layer and micro-batch in
 * flight, and the planner counts acts * (1 - kept) both as that saving
 * and as the one-layer workspace, which is the runtime's shared buffer
 * (the same arrays at max_B = B): so kept = 1 - dropped / acts, not the
 * per-layer ratio, which leaves out what acts holds beside the layer (the
 * part's output residual, the token ids). */
static int acts_kept(const mal_model *m, int B, double acts, double *kept)
{
    size_t none = mal_acts_layer_bytes(m, B, MAL_RECOMPUTE_NONE, NULL);
    for (int mode = MAL_RECOMPUTE_SELECTIVE; mode <= MAL_RECOMPUTE_FULL; mode++) {
        size_t own = mal_acts_layer_bytes(m, B, mode, NULL);
        if (none == SIZE_MAX || own == SIZE_MAX || own > none || !(acts > 0))
            return MAL_ERR(MAL_EINVAL,
                           "profile: the activation sizes of recompute mode %s overflow",
                           mal_recompute_name(mode));
        kept[mode] = 1.0 - (double)(none - own) / acts;
    }
    return 0;
}

/* The link figures (linkprobe.h) as profile keys, and every pair's, as a
 * "links" list that malleus-replan --links reads from the same file: a
 * pair's rate is its time for one activation message over the median
 * pair's of its kind (within a node or between nodes). */
static void write_links(FILE *f, const mal_link_figures *lf, double act_bytes, double grad_bytes)
{
    fprintf(f, "  \"link_latency\": %.4g,\n  \"link_bandwidth\": %.4g,\n", lf->latency,
            lf->bandwidth);
    if (lf->node_bandwidth > 0)
        fprintf(f, "  \"node_link_latency\": %.4g,\n  \"node_link_bandwidth\": %.4g,\n",
                lf->node_latency, lf->node_bandwidth);
    /* the layer time above leaves the TP all-reduce out: every message is
     * priced (comm_in_alpha false) */
    fprintf(f,
            "  \"activation_bytes\": %.0f,\n  \"tp_allreduces\": 4,\n  \"grad_bytes\": %.0f,\n"
            "  \"comm_in_alpha\": false,\n  \"links\": [",
            act_bytes, grad_bytes);
    const double t_in = lf->latency + act_bytes / lf->bandwidth;
    const double t_out =
        lf->node_bandwidth > 0 ? lf->node_latency + act_bytes / lf->node_bandwidth : t_in;
    for (int i = 0; i < lf->n; i++) {
        const double *p = lf->pair + 5 * (size_t)i;
        double t = p[2] + act_bytes / p[3], ref = p[4] ? t_out : t_in;
        fprintf(f,
                "%s\n    {\"a\": %d, \"b\": %d, \"latency\": %.4g, \"bandwidth\": %.4g, "
                "\"rate\": %.3f}",
                i ? "," : "", (int)p[0], (int)p[1], p[2], p[3], t / ref);
    }
    fprintf(f, "\n  ],\n");
}

int mal_profile_measure(mal_kern k, const mal_model_config *cfg, int B, int nominal_tp,
                        const mal_link_figures *links, FILE *f)
{
    const double MB = 1048576.0;
    double overhead = rss_mb();
    double times[11] = {0};
    int rc, n_sizes = 0;
    if (nominal_tp < 1 || (nominal_tp & (nominal_tp - 1)) || cfg->n_heads % nominal_tp ||
        cfg->ffn_hidden % nominal_tp)
        return MAL_ERR(MAL_EINVAL,
                       "profile: nominal TP size %d must be a power of two dividing n_heads %d and "
                       "ffn_hidden %d",
                       nominal_tp, cfg->n_heads, cfg->ffn_hidden);
    /* The most this holds at once is one layer at TP 1, or the nominal
     * size's layer in the three recompute modes (an instance each, with
     * one micro-batch's activations): refuse, with the numbers, a model
     * whose layer cannot fit in this machine's memory, before allocating. */
    mal_model_part one = {0, 1, 0, 0, 1, 0}, npart = {0, 1, 0, 0, nominal_tp, 0};
    size_t need = 0, mem = mal_phys_memory_bytes();
    for (int mode = MAL_RECOMPUTE_NONE; mode <= MAL_RECOMPUTE_FULL; mode++) {
        size_t b;
        if ((rc = mal_model_bytes(cfg, &npart, B, k, 1, mode, &b))) return rc;
        need = need + b < need ? SIZE_MAX : need + b;
    }
    if (nominal_tp > 1) {
        size_t b;
        if ((rc = mal_model_bytes(cfg, &one, B, k, 1, MAL_RECOMPUTE_NONE, &b))) return rc;
        need = MAL_MAX(need, b);
    }
    if (mem && need > mem)
        return MAL_ERR(MAL_EINVAL,
                       "profile: one layer of model %s needs %zu bytes (%.1f GiB) to measure (at "
                       "TP 1 and in each recompute mode at TP %d), more than this machine's %zu "
                       "(%.1f GiB)",
                       cfg->name, need, need / (MB * 1024), nominal_tp, mem, mem / (MB * 1024));
    /* the nominal size's layer in every recompute mode, for the time
     * recomputation adds: more repetitions (at least 9, and a quarter of a
     * second of mode none's), since a ratio of two least times is what the
     * planner reads */
    static const int modes[] = {MAL_RECOMPUTE_NONE, MAL_RECOMPUTE_SELECTIVE, MAL_RECOMPUTE_FULL};
    double med[3], best[3];
    for (int l = 0; (1 << l) <= nominal_tp; l++) {
        int t = 1 << l, nom = t == nominal_tp;
        if ((rc = time_layer(k, cfg, B, t, nom ? 9 : 7, nom ? 0.25 : 0, modes, nom ? 3 : 1, med,
                             best)))
            return rc;
        times[l] = med[0];
        n_sizes++;
    }
    int ln = n_sizes - 1;
    /* the share of the layer's time each mode adds; noise can make a mode
     * look faster than none or full than selective, which no mode is */
    double rtime[3] = {0};
    for (int i = 1; i < 3; i++)
        rtime[i] = MAL_MAX(0.0, best[i] / best[0] - 1.0);
    rtime[2] = MAL_MAX(rtime[2], rtime[1]);
    /* Memory from the runtime's own layout: fp32 parameters, gradients,
     * Adam m and v (16 bytes per parameter) and the activation bytes. */
    mal_model_part lpart = {0, 1, 0, 0, nominal_tp, 0};
    mal_tensor_info *tens;
    int n_t;
    size_t n_layer;
    if ((rc = mal_model_layout(cfg, &lpart, &tens, &n_t, &n_layer))) return rc;
    free(tens);
    mal_model_part fpart = {0, 1, 0, 0, 1, 0};
    size_t n_layer_full;
    if ((rc = mal_model_layout(cfg, &fpart, &tens, &n_t, &n_layer_full))) return rc;
    free(tens);
    mal_model_part hpart = {0, 0, 1, 0, nominal_tp, 0}, hfull = {0, 0, 1, 0, 1, 0};
    size_t n_embed, n_embed_full;
    if ((rc = mal_model_layout(cfg, &hpart, &tens, &n_t, &n_embed))) return rc;
    free(tens);
    if ((rc = mal_model_layout(cfg, &hfull, &tens, &n_t, &n_embed_full))) return rc;
    free(tens);
    mal_model *m;
    if ((rc = mal_model_create(&m, cfg, &lpart, B, k, 1))) return rc;
    double acts = (double)mal_acts_bytes(m, B), kept[3];
    if ((rc = acts_kept(m, B, acts, kept))) {
        mal_model_destroy(m);
        return rc;
    }
    /* fp32 master parameters, gradients, Adam m and v, plus a working copy
     * where the instance computes in another dtype */
    double per_param = 16.0 + (mal_model_separate_work(k) ? (double)m->esz : 0.0);
    double esz = (double)m->esz;
    mal_model_destroy(m);
    double layer_state = per_param * (double)n_layer;
    /* the logits and their gradient: the vocabulary-parallel head holds
     * its rows' columns (the largest shard: V/tp rounded up) */
    double logits =
        2.0 * esz * (double)B * cfg->seq_len * (double)((cfg->vocab + nominal_tp - 1) / nominal_tp);

    fprintf(f, "{\n  \"name\": \"%s (measured)\",\n  \"n_layers\": %d,\n  \"tp\": %d,\n", cfg->name,
            cfg->n_layers, nominal_tp);
    fprintf(f, "  \"n_heads\": %d,\n  \"ffn_hidden\": %d,\n  \"alpha\": {", cfg->n_heads,
            cfg->ffn_hidden);
    for (int l = 0; l < n_sizes; l++)
        fprintf(f, "%s\"%d\": %.4f", l ? ", " : "", 1 << l, times[l] / times[ln]);
    fprintf(f, "},\n  \"layer_memory_mb\": [");
    for (int d = 0; d < 16; d++)
        fprintf(f, "%s%.4f", d ? ", " : "", (layer_state + acts * (d + 1)) / MB);
    fprintf(f, "],\n  \"embedding_memory_mb\": %.4f,\n",
            (per_param * (double)n_embed + logits) / MB);
    fprintf(f, "  \"overhead_mb\": %.1f,\n  \"layer_time\": %.6g,\n", overhead, times[ln]);
    fprintf(f, "  \"layer_state_mb\": %.4f,\n  \"embedding_state_mb\": %.4f,\n",
            per_param * (double)n_layer_full / MB, per_param * (double)n_embed_full / MB);
    if (cfg->tie_embeddings) fprintf(f, "  \"tied_embeddings\": true,\n");
    fprintf(f, "  \"state_bytes\": %.4g,\n  \"scratch_mb\": {", per_param);
    for (int l = 0; l < n_sizes; l++) {
        double sb;
        if ((rc = scratch_bytes(k, cfg, B, 1 << l, &sb))) return rc;
        fprintf(f, "%s\"%d\": %.4f", l ? ", " : "", 1 << l, sb / MB);
    }
    /* a layer at every TP size: what the ranks of a group hold whole (norm
     * weights, the residual stream's activations) is not split */
    double st[11], ac[11];
    for (int l = 0; l < n_sizes; l++)
        if ((rc = layer_bytes(k, cfg, B, 1 << l, per_param, &st[l], &ac[l]))) return rc;
    fprintf(f, "},\n  \"rank_state_mb\": {");
    for (int l = 0; l < n_sizes; l++)
        fprintf(f, "%s\"%d\": %.4f", l ? ", " : "", 1 << l, st[l] / MB);
    fprintf(f, "},\n  \"rank_acts_mb\": {");
    for (int l = 0; l < n_sizes; l++)
        fprintf(f, "%s\"%d\": %.4f", l ? ", " : "", 1 << l, ac[l] / MB);
    fprintf(f, "},\n");
    /* recomputation at the nominal size: the workspace the planner adds is
     * acts * (1 - kept), the runtime's shared buffer, so nothing here
     * counts it (the layer figures above are mode none's) */
    fprintf(f,
            "  \"acts_kept\": {\"selective\": %.6f, \"full\": %.6f},\n"
            "  \"recompute_time\": {\"selective\": %.4f, \"full\": %.4f},\n",
            kept[MAL_RECOMPUTE_SELECTIVE], kept[MAL_RECOMPUTE_FULL], rtime[1], rtime[2]);
    /* one micro-batch's activation (B, T, C) in the compute dtype: the
     * pipeline's gradient buffers are of its size (the link keys carry it
     * where the links were measured) */
    if (links && links->n > 0 && links->bandwidth > 0)
        write_links(f, links, esz * (double)B * cfg->seq_len * cfg->d_model,
                    4.0 * (double)n_layer_full);
    else
        fprintf(f, "  \"activation_bytes\": %.0f,\n", esz * B * cfg->seq_len * cfg->d_model);
    fprintf(f, "  \"sync_time\": 0.0\n}\n");
    return ferror(f) ? MAL_ERR(MAL_EIO, "profile: write failed") : 0;
}
