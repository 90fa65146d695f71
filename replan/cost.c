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

void mal_cost_memory_terms(const mal_profile *p, const mal_plan *plan, int i, int j,
                           mal_cost_memory *out)
{
    const mal_plan_pipeline *pl = &plan->pipelines[i];
    const mal_plan_stage *st = &pl->stages[j];
    const int S = pl->n_stages, l = st->layer_end - st->layer_begin, size = st->n_ranks;
    const int ne = (j == 0) + (j == S - 1);
    const double scale = (double)p->tp / size, MB = 1048576.0;
    const double bpp = p->state_bytes > 0 ? p->state_bytes : 16.0;
    memset(out, 0, sizeof *out);
    out->depth = mal_plan_stage_warmup(pl, j);
    out->replicas = plan->n_pipelines;
    out->slots = MAL_MIN(pl->micro_batches, out->depth + 1);
    out->layers = mal_profile_k_at(p, out->depth, size) * l;
    out->k_at_size = has_k_at(p, size);
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
    if (p->zero)
        out->zero_saved = 8.0 / bpp *
                          ((h_layers > 1 ? st_layers * (1.0 - 1.0 / h_layers) : 0) +
                           (h_embed > 1 ? st_embed * (1.0 - 1.0 / h_embed) : 0));
    out->overhead = p->overhead_mb;
    out->total = out->layers + out->embed + out->scratch + out->p2p + out->dp_grads -
                 out->zero_saved + out->overhead;
}

int mal_cost_layer_cap(const mal_profile *p, double memory_mb, int size, int S, int j)
{
    int ne = (j == 0) + (j == S - 1);
    double room = (memory_mb - p->overhead_mb) * size / (double)p->tp - p->embed_mb * ne;
    double k = mal_profile_k(p, S - 1 - j);
    if (has_k_at(p, size)) /* per rank: room and k at the group's own size */
        room = room * p->tp / size, k = mal_profile_k_at(p, S - 1 - j, size);
    if (room < 0) return 0;
    if (k <= 0) return p->n_layers;
    double l = floor(room / k * (1 + 1e-12) + 1e-9);
    if (l > p->n_layers) return p->n_layers;
    return (int)l;
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
    return x * mal_profile_alpha(p, st->n_ranks) * (st->layer_end - st->layer_begin);
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
            P = MAL_MAX(P, x * a * l);
            total += x * a * l;
            if (mal_cost_stage_memory(ps, st->n_ranks, pl->n_stages, j, l) >
                mal_cost_stage_capacity(c, st) * (1 + 1e-12))
                ev->memory_ok = 0;
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
