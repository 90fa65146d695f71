/* Event-by-event 1F1B simulator (see sim.h).  Each stage executes its ops in
 * the fixed 1F1B order; an op starts when its stage is free and its input has
 * arrived (the previous stage's forward, or the next stage's backward). */
#include <math.h>
#include <stdlib.h>

#include "base/mal.h"
#include "sim.h"

double mal_sim_pipeline(int S, const double *fwd, const double *bwd, int m, double p2p)
{
    return mal_sim_pipeline_ex(S, fwd, bwd, m, p2p, NULL, NULL);
}

double mal_sim_pipeline_ex(int S, const double *fwd, const double *bwd, int m, double p2p,
                           const double *hop, const int *warm)
{
    if (S < 1 || m < 1) return MAL_ERR(MAL_EINVAL, "simulator: %d stages, %d micro-batches", S, m);
    /* Its tables hold every op of every stage (24 bytes each): a plan file
     * may name two billion micro-batches, which would ask for tens of GB. */
    if ((long long)S * m > MAL_SIM_MAX_OPS)
        return MAL_ERR(
            MAL_EINVAL,
            "simulator: %d stages x %d micro-batches is more than the %d stage-micro-batches "
            "it simulates (MAL_SIM_MAX_OPS)",
            S, m, MAL_SIM_MAX_OPS);
    /* per stage: its op sequence (+i = forward of micro-batch i, -(i+1) = backward) */
    int n_ops = 2 * m;
    int *seq = malloc((size_t)S * n_ops * sizeof *seq);
    int *next = calloc((size_t)S, sizeof *next);
    double *free_at = calloc((size_t)S, sizeof *free_at);
    double *fdone = malloc((size_t)S * m * sizeof *fdone); /* forward finish times */
    double *bdone = malloc((size_t)S * m * sizeof *bdone);
    double end = 0;
    if (!seq || !next || !free_at || !fdone || !bdone) {
        end = MAL_ERR(MAL_ENOMEM, "simulator: out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < (size_t)S * m; i++)
        fdone[i] = bdone[i] = -1;
    for (int j = 0; j < S; j++) {
        int *q = seq + (size_t)j * n_ops, n = 0, f = 0, b = 0;
        int w = MAL_MIN(warm ? MAL_MAX(warm[j], 0) : S - j - 1, m);
        if (warm && j + 1 < S && w < MAL_MIN(warm[j + 1], m)) {
            end = MAL_ERR(MAL_EINVAL, "simulator: stage %d warms up less than stage %d", j, j + 1);
            goto cleanup;
        }
        while (f < w)
            q[n++] = f++;
        while (f < m) {
            q[n++] = f++;
            q[n++] = -(++b);
        }
        while (b < m)
            q[n++] = -(++b);
    }
    /* sweep the stages, running every op whose input is ready, until all are
     * done; 1F1B is deadlock-free so every sweep makes progress */
    int remaining = S * n_ops;
    while (remaining > 0) {
        int progress = 0;
        for (int j = 0; j < S; j++) {
            while (next[j] < n_ops) {
                int op = seq[(size_t)j * n_ops + next[j]];
                double ready;
                if (op >= 0) {
                    if (j == 0)
                        ready = 0;
                    else if (fdone[(size_t)(j - 1) * m + op] < 0)
                        break;
                    else
                        ready = fdone[(size_t)(j - 1) * m + op] + p2p + (hop ? hop[j - 1] : 0);
                    double st = MAL_MAX(ready, free_at[j]);
                    free_at[j] = fdone[(size_t)j * m + op] = st + fwd[j];
                } else {
                    int i = -op - 1;
                    if (fdone[(size_t)j * m + i] < 0) break;
                    if (j == S - 1)
                        ready = fdone[(size_t)j * m + i];
                    else if (bdone[(size_t)(j + 1) * m + i] < 0)
                        break;
                    else
                        ready = bdone[(size_t)(j + 1) * m + i] + p2p + (hop ? hop[j] : 0);
                    double st = MAL_MAX(ready, free_at[j]);
                    free_at[j] = bdone[(size_t)j * m + i] = st + bwd[j];
                }
                next[j]++;
                remaining--;
                progress = 1;
            }
        }
        if (!progress) {
            end = MAL_ERR(MAL_EINVAL, "simulator: schedule deadlocked (internal error)");
            goto cleanup;
        }
    }
    for (int j = 0; j < S; j++)
        end = MAL_MAX(end, free_at[j]);
cleanup:
    free(seq);
    free(next);
    free(free_at);
    free(fdone);
    free(bdone);
    return end;
}

static int sim_plan(const mal_plan *plan, const mal_profile *p, const mal_cluster *cl,
                    const double *rates, int world_size, double p2p, double *step_out,
                    double *pipe_out);

int mal_sim_plan(const mal_plan *plan, const mal_profile *p, const double *rates, int world_size,
                 double p2p, double *step_out, double *pipe_out)
{
    return sim_plan(plan, p, NULL, rates, world_size, p2p, step_out, pipe_out);
}

int mal_sim_plan_on(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                    const double *rates, double p2p, double *step_out, double *pipe_out)
{
    return sim_plan(plan, p, c, rates, c->world_size, p2p, step_out, pipe_out);
}

static int sim_plan(const mal_plan *plan, const mal_profile *p, const mal_cluster *cl,
                    const double *rates, int world_size, double p2p, double *step_out,
                    double *pipe_out)
{
    double step = 0;
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        double *fwd = malloc((size_t)pl->n_stages * sizeof *fwd);
        double *bwd = malloc((size_t)pl->n_stages * sizeof *bwd);
        if (!fwd || !bwd) {
            free(fwd);
            free(bwd);
            return MAL_ERR(MAL_ENOMEM, "simulator: out of memory");
        }
        for (int j = 0; j < pl->n_stages; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            const mal_profile *ps = mal_cost_stage_profile(p, cl, st); /* its type's */
            double a = mal_profile_alpha(ps, st->n_ranks), x = 1.0;
            if (a <= 0) {
                free(fwd);
                free(bwd);
                return MAL_ERR(MAL_EINVAL,
                               "simulator: pipelines[%d].stages[%d]: no alpha for TP size %d", i, j,
                               st->n_ranks);
            }
            for (int k = 0; k < st->n_ranks; k++)
                if (st->ranks[k] >= 0 && st->ranks[k] < world_size)
                    x = MAL_MAX(x, mal_cost_floor(rates[st->ranks[k]]));
            /* recomputation runs before the stage's backward pass */
            double c = x * a * (st->layer_end - st->layer_begin);
            fwd[j] = c * MAL_SIM_FORWARD_SHARE;
            bwd[j] = c * mal_cost_stage_factor(ps, st) - fwd[j];
        }
        double t = mal_sim_pipeline(pl->n_stages, fwd, bwd, pl->micro_batches, p2p);
        free(fwd);
        free(bwd);
        if (t < 0) return (int)t;
        if (pipe_out) pipe_out[i] = t;
        step = MAL_MAX(step, t);
    }
    *step_out = step;
    return 0;
}

int mal_sim_plan_links(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                       const double *rates, const mal_links *ln, double *step_out, double *pipe_out)
{
    double step = 0;
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        int S = pl->n_stages;
        double *fwd = malloc((size_t)S * 3 * sizeof *fwd);
        int *warm = malloc((size_t)S * sizeof *warm);
        if (!fwd || !warm) {
            free(fwd);
            free(warm);
            return MAL_ERR(MAL_ENOMEM, "simulator: out of memory");
        }
        double *bwd = fwd + S, *hop = fwd + 2 * S;
        for (int j = 0; j < S; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            double a = mal_profile_alpha(mal_cost_stage_profile(p, c, st), st->n_ranks), x = 1.0;
            if (a <= 0) {
                free(fwd);
                free(warm);
                return MAL_ERR(MAL_EINVAL,
                               "simulator: pipelines[%d].stages[%d]: no alpha for TP size %d", i, j,
                               st->n_ranks);
            }
            for (int k = 0; k < st->n_ranks; k++)
                if (st->ranks[k] >= 0 && st->ranks[k] < c->world_size)
                    x = MAL_MAX(x, mal_cost_floor(rates[st->ranks[k]]));
            int l = st->layer_end - st->layer_begin;
            /* the TP all-reduces split like the compute (as many in the
             * backward pass as in the forward, but the forward's share of
             * the compute is a third: a simplification the cost model makes
             * too, by folding them into the stage's time) */
            double cst = l * (x * a + mal_cost_tp_comm(p, c, ln, st->ranks, st->n_ranks));
            fwd[j] = cst * MAL_SIM_FORWARD_SHARE;
            /* recomputation runs before the backward pass */
            bwd[j] = mal_cost_stage_links_time(p, c, ln, st, x * a) - fwd[j];
            hop[j] = j + 1 < S ? mal_cost_p2p(p, c, ln, st, &pl->stages[j + 1]) : 0;
            warm[j] = mal_plan_stage_warmup(pl, j);
        }
        double t = mal_sim_pipeline_ex(S, fwd, bwd, pl->micro_batches, 0.0, hop, warm);
        free(fwd);
        free(warm);
        if (t < 0) return (int)t;
        if (pipe_out) pipe_out[i] = t;
        step = MAL_MAX(step, t);
    }
    *step_out = step + mal_cost_dp_comm(plan, p, c, ln);
    return 0;
}
