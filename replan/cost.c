/* The cost model of DESIGN.md: TP group rates, stage memory, the predicted
 * step time of a plan (1F1B closed form with the fill/drain bubble), the
 * capacity bound, and the bytes of state a plan change moves. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "replan.h"

/* The profile measured a layer's memory at TP size `size`. */
static int has_k_at(const mal_profile *p, int size)
{
    for (int l = 0; l <= MAL_REPLAN_MAX_TP_LOG; l++)
        if ((1 << l) == size) return p->rank_state_mb[l] > 0;
    return 0;
}

double mal_cost_stage_memory_d(const mal_profile *p, int size, int S, int j, int l, int d)
{
    /* the first stage holds the embedding, the last the LM head; a
     * single-stage pipeline holds both (DESIGN writes E * [first or last];
     * counting both is the stricter, correct reading for S = 1) */
    int ne = (j == 0) + (j == S - 1);
    if (has_k_at(p, size))
        return mal_profile_k_at(p, d, size) * l + p->embed_mb * ne * ((double)p->tp / size) +
               p->overhead_mb;
    return (mal_profile_k(p, d) * l + p->embed_mb * ne) * ((double)p->tp / size) + p->overhead_mb;
}

double mal_cost_stage_memory(const mal_profile *p, int size, int S, int j, int l)
{
    return mal_cost_stage_memory_d(p, size, S, j, l, S - 1 - j);
}

double mal_cost_acts_kept(const mal_profile *p, int mode)
{
    if (mode != MAL_RECOMPUTE_SELECTIVE && mode != MAL_RECOMPUTE_FULL) return 1.0;
    if (p->acts_kept[MAL_RECOMPUTE_NONE] != 1.0) /* a profile built without them */
        return mode == MAL_RECOMPUTE_FULL ? MAL_REPLAN_KEPT_FULL : MAL_REPLAN_KEPT_SELECTIVE;
    return p->acts_kept[mode];
}

double mal_cost_recompute_time(const mal_profile *p, int mode)
{
    if (mode != MAL_RECOMPUTE_SELECTIVE && mode != MAL_RECOMPUTE_FULL) return 0.0;
    if (p->acts_kept[MAL_RECOMPUTE_NONE] != 1.0)
        return mode == MAL_RECOMPUTE_FULL ? MAL_REPLAN_TIME_FULL : MAL_REPLAN_TIME_SELECTIVE;
    return p->recompute_time[mode];
}

double mal_cost_stage_factor(const mal_profile *p, const mal_plan_stage *st)
{
    return 1.0 + mal_cost_recompute_time(p, st->recompute);
}

double mal_cost_layer_acts(const mal_profile *p, int size)
{
    int lg = 0;
    while ((1 << lg) < size && lg < MAL_REPLAN_MAX_TP_LOG)
        lg++;
    if ((1 << lg) == size && p->rank_state_mb[lg] > 0) return p->rank_acts_mb[lg];
    /* k[d] grows by one micro-batch's activations per position */
    if (p->n_k < 2) return 0.0;
    /* never more than a layer holds with one micro-batch in flight */
    double a = MAL_MIN(mal_profile_k(p, 1) - mal_profile_k(p, 0), mal_profile_k(p, 0));
    return a > 0 ? a * ((double)p->tp / size) : 0.0;
}

void mal_cost_stage_terms(const mal_profile *p, int size, int S, int j, int l, int d, int replicas,
                          int mode, mal_cost_memory *out)
{
    const int ne = (j == 0) + (j == S - 1);
    const double scale = (double)p->tp / size, MB = 1048576.0;
    const double bpp = p->state_bytes > 0 ? p->state_bytes : 16.0;
    memset(out, 0, sizeof *out);
    out->depth = d;
    out->recompute = mode;
    /* not known: the most the gradient-sum terms can cost -- with zero the
     * copy of the gradients (4 bytes) is paid for by the moments shed (8
     * bytes x (1 - 1/R)) from two replicas on, without it every replica
     * pays the copy */
    out->replicas = replicas > 0 ? replicas : p->zero ? 1 : 2;
    out->slots = d + 1;
    out->layers = mal_profile_k_at(p, d, size) * l;
    out->k_at_size = has_k_at(p, size);
    /* recomputation keeps a share of each layer's activations per
     * micro-batch in flight and regenerates the rest, one layer and one
     * micro-batch at a time, into a workspace */
    const double acts = mal_cost_layer_acts(p, size), drop = 1.0 - mal_cost_acts_kept(p, mode);
    if (mode != MAL_RECOMPUTE_NONE && drop > 0) {
        out->recompute_saved = acts * drop * (d + 1) * l;
        out->layers -= out->recompute_saved;
        out->workspace = l > 0 ? acts * drop : 0.0;
    }
    /* a one-stage pipeline of a tied model holds the embedding's state
     * once (the LM head's logits still count) */
    const int tied = p->tied_embeddings, ne_state = tied && ne == 2 ? 1 : ne;
    out->embed_tied = (ne - ne_state) * p->embed_state_mb / p->tp * scale;
    out->embed = p->embed_mb * ne * scale - out->embed_tied;
    int lg = 0;
    while ((1 << lg) < size && lg < MAL_REPLAN_MAX_TP_LOG)
        lg++;
    out->scratch = (1 << lg) == size ? p->scratch_mb[lg] : 0.0;
    out->p2p = p->activation_bytes / MB * ((j > 0) * out->slots + (j < S - 1));
    /* the rank's share of the state of its layers and of its embedding /
     * head (all shards, over the stage's TP size), and how many ranks of a
     * TP position hold them: one per pipeline, and a tied embedding the
     * first and the last stage of each pipeline deeper than one */
    const double st_layers = p->layer_state_mb * l / size;
    const double st_embed = p->embed_state_mb * ne_state / size;
    const int h_layers = out->replicas, h_embed = out->replicas * (tied && S > 1 ? 2 : 1);
    const double held = (h_layers > 1 ? st_layers : 0) + (h_embed > 1 ? st_embed : 0);
    out->dp_grads = held * 4.0 / bpp;
    /* the moments shed, and the master where it is sharded too (only
     * beside a working copy: with none the master is the working weights) */
    const double shed = 8.0 + (p->zero_master && bpp > 16.0 ? 4.0 : 0.0);
    if (p->zero)
        out->zero_saved = shed / bpp *
                          ((h_layers > 1 ? st_layers * (1.0 - 1.0 / h_layers) : 0) +
                           (h_embed > 1 ? st_embed * (1.0 - 1.0 / h_embed) : 0));
    out->overhead = p->overhead_mb;
    out->total = out->layers + out->embed + out->scratch + out->p2p + out->dp_grads -
                 out->zero_saved + out->workspace + out->overhead;
}

double mal_cost_stage_need(const mal_profile *p, int size, int S, int j, int l, int d, int replicas,
                           int mode)
{
    mal_cost_memory t;
    mal_cost_stage_terms(p, size, S, j, l, d, replicas, mode, &t);
    return t.total;
}

void mal_cost_memory_terms(const mal_profile *p, const mal_plan *plan, int i, int j,
                           mal_cost_memory *out)
{
    const mal_plan_pipeline *pl = &plan->pipelines[i];
    const mal_plan_stage *st = &pl->stages[j];
    const int d = mal_plan_stage_warmup(pl, j);
    mal_cost_stage_terms(p, st->n_ranks, pl->n_stages, j, st->layer_end - st->layer_begin, d,
                         plan->n_pipelines, st->recompute, out);
    /* a pipeline never has more micro-batches in flight than it runs: the
     * pipeline's receive buffers are one per micro-batch in flight */
    int slots = MAL_MIN(pl->micro_batches, d + 1);
    if (slots != out->slots) {
        out->total -= out->p2p;
        out->p2p = p->activation_bytes / 1048576.0 * ((j > 0) * slots + (j < pl->n_stages - 1));
        out->total += out->p2p;
        out->slots = slots;
    }
}

int mal_cost_layer_cap_mode(const mal_profile *p, double memory_mb, int size, int S, int j,
                            int replicas, int mode)
{
    /* the need is affine in the layers: a + b l */
    const int d = S - 1 - j;
    double a = mal_cost_stage_need(p, size, S, j, 0, d, replicas, mode);
    double b = mal_cost_stage_need(p, size, S, j, 1, d, replicas, mode) - a;
    /* the workspace is there from the first layer on: part of b's first
     * layer, not of every layer */
    mal_cost_memory t1;
    mal_cost_stage_terms(p, size, S, j, 1, d, replicas, mode, &t1);
    a += t1.workspace;
    b -= t1.workspace;
    double room = memory_mb - a;
    if (room < 0) return 0;
    if (b <= 0) return p->n_layers;
    double l = floor(room / b * (1 + 1e-12) + 1e-9);
    if (l > p->n_layers) return p->n_layers;
    return (int)l;
}

int mal_cost_layer_cap(const mal_profile *p, double memory_mb, int size, int S, int j)
{
    return mal_cost_layer_cap_mode(p, memory_mb, size, S, j, 0, MAL_RECOMPUTE_NONE);
}

void mal_cost_eval_fini(mal_cost_eval *ev)
{
    if (!ev) return;
    free(ev->period);
    free(ev->time);
    free(ev->shaped_time);
    memset(ev, 0, sizeof *ev);
}

const mal_profile *mal_cost_stage_profile(const mal_profile *p, const mal_cluster *c,
                                          const mal_plan_stage *st)
{
    return c && st->n_ranks > 0 ? mal_cluster_rank_profile(c, st->ranks[0], p) : p;
}

double mal_cost_stage_capacity(const mal_cluster *c, const mal_plan_stage *st)
{
    double mem = INFINITY;
    for (int q = 0; q < st->n_ranks; q++)
        mem = MAL_MIN(mem, mal_cluster_rank_memory(c, st->ranks[q]));
    return st->n_ranks > 0 ? mem : c->memory_mb;
}

/* y * l of stage k (alpha known to exist: checked by the caller's loop) */
static double stage_time(const mal_plan_pipeline *pl, int k, const mal_profile *p,
                         const mal_cluster *c, const double *rates)
{
    const mal_plan_stage *st = &pl->stages[k];
    p = mal_cost_stage_profile(p, c, st);
    double x = 1.0;
    for (int q = 0; q < st->n_ranks; q++) {
        int r = st->ranks[q];
        if (r >= 0 && r < c->world_size) x = MAL_MAX(x, mal_cost_floor(rates[r]));
    }
    return x * mal_profile_alpha(p, st->n_ranks) * (st->layer_end - st->layer_begin) *
           mal_cost_stage_factor(p, st);
}

int mal_cost_eval_plan(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                       const double *rates, mal_cost_eval *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->n_pipelines = plan->n_pipelines;
    ev->memory_ok = 1;
    ev->period = calloc((size_t)MAL_MAX(1, plan->n_pipelines), sizeof *ev->period);
    ev->time = calloc((size_t)MAL_MAX(1, plan->n_pipelines), sizeof *ev->time);
    ev->shaped_time = calloc((size_t)MAL_MAX(1, plan->n_pipelines), sizeof *ev->shaped_time);
    if (!ev->period || !ev->time || !ev->shaped_time) {
        mal_cost_eval_fini(ev);
        return MAL_ERR(MAL_ENOMEM, "cost model: out of memory");
    }
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        double P = 0, total = 0;
        for (int j = 0; j < pl->n_stages; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            /* a stage of a mixed cluster: its type's profile and memory */
            const mal_profile *ps = mal_cost_stage_profile(p, c, st);
            double a = mal_profile_alpha(ps, st->n_ranks);
            if (a <= 0) {
                mal_cost_eval_fini(ev);
                return MAL_ERR(MAL_EINVAL,
                               "cost model: pipelines[%d].stages[%d] has TP size %d, for which the "
                               "profile has no alpha",
                               i, j, st->n_ranks);
            }
            double x = 1.0;
            for (int k = 0; k < st->n_ranks; k++) {
                int r = st->ranks[k];
                if (r >= 0 && r < c->world_size) x = MAL_MAX(x, mal_cost_floor(rates[r]));
            }
            int l = st->layer_end - st->layer_begin;
            double cj = x * a * l * mal_cost_stage_factor(ps, st);
            P = MAL_MAX(P, cj);
            total += cj;
            /* the whole need, plan-dependent terms included: what --explain
             * prints and the search's caps bound; against the stage's type's
             * memory (its least rank's) */
            mal_cost_memory mt;
            mal_cost_memory_terms(ps, plan, i, j, &mt);
            if (mt.total > mal_cost_stage_capacity(c, st) * (1 + 1e-12)) ev->memory_ok = 0;
        }
        ev->period[i] = P;
        ev->time[i] = (pl->micro_batches + pl->n_stages - 1) * P;
        ev->step_time = MAL_MAX(ev->step_time, ev->time[i]);
        /* the bubble by shape: stage k runs its m micro-batches after the
         * first forward reached it (the stages before it) and before the last
         * backward leaves through them; the round trip through the stages
         * after it delays its first backward unless its S - k - 1 warm-up
         * forwards cover it.  Each k is a chain of the schedule, so the
         * largest is a lower bound; for equal stages it is the closed form. */
        double before = 0;
        for (int k = 0; k < pl->n_stages; k++) {
            double ck = stage_time(pl, k, p, c, rates);
            double after = total - before - ck;
            double wait = after - (pl->n_stages - k - 1) * MAL_REPLAN_FORWARD_SHARE * ck;
            double tk = before + pl->micro_batches * ck + (wait > 0 ? wait : 0);
            ev->shaped_time[i] = MAL_MAX(ev->shaped_time[i], tk);
            before += ck;
        }
        ev->shaped = MAL_MAX(ev->shaped, ev->shaped_time[i]);
        ev->bubble_free = MAL_MAX(ev->bubble_free, pl->micro_batches * P);
    }
    return 0;
}

double mal_cost_capacity_bound(const mal_profile *p, int world_size, const double *rates, int M)
{
    double speed = 0; /* nominal groups' worth of throughput */
    for (int r = 0; r < world_size; r++)
        speed += 1.0 / (p->tp * mal_cost_floor(rates[r]));
    return speed > 0 ? (double)p->n_layers * M / speed : INFINITY;
}

/* What one rank holds under a plan. */
typedef struct holding {
    int active;
    int lb, le;      /* layers */
    int k, s;        /* TP shard k of s */
    int first, last; /* embedding / LM head */
} holding;

static int fill_holdings(const mal_plan *plan, holding *h, int world)
{
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        for (int j = 0; j < pl->n_stages; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            for (int k = 0; k < st->n_ranks; k++) {
                int r = st->ranks[k];
                if (r < 0 || r >= world) continue;
                h[r] = (holding){1,           st->layer_begin, st->layer_end,        k,
                                 st->n_ranks, j == 0,          j == pl->n_stages - 1};
            }
        }
    }
    return 0;
}

/* length of [k/s, (k+1)/s) intersected with [k2/s2, (k2+1)/s2) */
static double shard_overlap(int k, int s, int k2, int s2)
{
    double a = MAL_MAX((double)k / s, (double)k2 / s2);
    double b = MAL_MIN((double)(k + 1) / s, (double)(k2 + 1) / s2);
    return b > a ? b - a : 0.0;
}

double mal_cost_migration_bytes(const mal_plan *from, const mal_plan *to, const mal_profile *p)
{
    int world = MAL_MAX(mal_plan_world_size(from), mal_plan_world_size(to));
    if (world <= 0) return 0;
    holding *a = calloc((size_t)world, sizeof *a), *b = calloc((size_t)world, sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return NAN;
    }
    fill_holdings(from, a, world);
    fill_holdings(to, b, world);
    double moved_mb = 0;
    for (int r = 0; r < world; r++) {
        if (!b[r].active) continue;
        double frac = 1.0 / b[r].s;
        double need = (b[r].le - b[r].lb) * p->layer_state_mb * frac +
                      (b[r].first + b[r].last) * p->embed_state_mb * frac;
        double have = 0;
        if (a[r].active) {
            double ov = shard_overlap(a[r].k, a[r].s, b[r].k, b[r].s);
            int l = MAL_MIN(a[r].le, b[r].le) - MAL_MAX(a[r].lb, b[r].lb);
            if (l > 0) have += l * p->layer_state_mb * ov;
            if (a[r].first && b[r].first) have += p->embed_state_mb * ov;
            if (a[r].last && b[r].last) have += p->embed_state_mb * ov;
        }
        moved_mb += need - have;
    }
    free(a);
    free(b);
    return moved_mb * 1048576.0;
}
