/* Holdings and ownership of model state under a plan (see layout.h). */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "base/mal.h"

int mal_layout_part(const mal_plan *plan, const mal_model_config *cfg, int rank,
                    mal_model_part *part, int *active)
{
    mal_plan_loc loc;
    int rc = mal_plan_locate(plan, rank, &loc);
    if (rc) return rc;
    *active = loc.pipeline >= 0;
    memset(part, 0, sizeof *part);
    if (!*active) return 0;
    const mal_plan_pipeline *pl = &plan->pipelines[loc.pipeline];
    const mal_plan_stage *st = &pl->stages[loc.stage];
    *part = (mal_model_part){st->layer_begin, st->layer_end, loc.stage == 0,
                             loc.stage == pl->n_stages - 1, st->n_ranks, loc.tp_rank};
    (void)cfg;
    return 0;
}

/* The index of the stage of pipeline pl that holds tensor t (the first
 * one, for a tied embedding). */
static int holding_stage(const mal_plan_pipeline *pl, const mal_tensor_info *t)
{
    if (t->layer < 0) return 0;
    for (int s = 0; s < pl->n_stages; s++)
        if (t->layer >= pl->stages[s].layer_begin && t->layer < pl->stages[s].layer_end) return s;
    return pl->n_stages - 1; /* head tensors: layer == n_layers */
}

int mal_layout_holdings(const mal_plan *plan, const mal_model_config *cfg, const mal_tensor_info *t,
                        mal_slice_holding *h)
{
    int nh = 0;
    for (int p = 0; p < plan->n_pipelines; p++) {
        const mal_plan_pipeline *pl = &plan->pipelines[p];
        const int first = holding_stage(pl, t);
        /* a tied embedding is the last stage's output layer too */
        const int last = t->tied ? pl->n_stages - 1 : first;
        for (int j = first; j <= last; j += MAL_MAX(1, last - first)) {
            const mal_plan_stage *st = &pl->stages[j];
            for (int r = 0; r < st->n_ranks; r++) {
                int64_t b, e;
                mal_model_tp_range(cfg, t, st->n_ranks, r, &b, &e);
                h[nh++] = (mal_slice_holding){st->ranks[r], p, b, e,
                                              t->tp_rule == MAL_TP_KV ? st->ranks[r] : j};
            }
        }
    }
    return nh;
}
