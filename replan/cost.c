/* The cost model of DESIGN.md: TP group rates, stage memory, the predicted
 * step time of a plan (1F1B closed form with the fill/drain bubble), the
 * capacity bound, and the bytes of state a plan change moves. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "replan.h"

double mal_cost_stage_memory_d(const mal_profile *p, int size, int S, int j, int l, int d)
{
    int ne = (j == 0) + (j == S - 1);
    return (mal_profile_k(p, d) * l + p->embed_mb * ne) * ((double)p->tp / size) + p->overhead_mb;
}

double mal_cost_stage_memory(const mal_profile *p, int size, int S, int j, int l)
{
    /* the first stage holds the embedding, the last the LM head; a
     * single-stage pipeline holds both (DESIGN writes E * [first or last];
     * counting both is the stricter, correct reading for S = 1) */
    int ne = (j == 0) + (j == S - 1);
    double per_gpu = (mal_profile_k(p, S - 1 - j) * l + p->embed_mb * ne) * ((double)p->tp / size);
    return per_gpu + p->overhead_mb;
}

int mal_cost_layer_cap(const mal_profile *p, double memory_mb, int size, int S, int j)
{
    int ne = (j == 0) + (j == S - 1);
    double room = (memory_mb - p->overhead_mb) * size / (double)p->tp - p->embed_mb * ne;
    if (room < 0) return 0;
    double k = mal_profile_k(p, S - 1 - j);
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

/* y * l of stage k (alpha known to exist: checked by the caller's loop) */
static double stage_time(const mal_plan_pipeline *pl, int k, const mal_profile *p,
                         const mal_cluster *c, const double *rates)
{
    const mal_plan_stage *st = &pl->stages[k];
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
            double a = mal_profile_alpha(p, st->n_ranks);
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
            if (mal_cost_stage_memory(p, st->n_ranks, pl->n_stages, j, l) >
                c->memory_mb * (1 + 1e-12))
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
