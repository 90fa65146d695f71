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

/* The stage of pipeline pl that holds tensor t. */
static const mal_plan_stage *holding_stage(const mal_plan_pipeline *pl, const mal_tensor_info *t)
{
    if (t->layer < 0) return &pl->stages[0];
    for (int s = 0; s < pl->n_stages; s++)
        if (t->layer >= pl->stages[s].layer_begin && t->layer < pl->stages[s].layer_end)
            return &pl->stages[s];
    return &pl->stages[pl->n_stages - 1]; /* head tensors: layer == n_layers */
}

int mal_layout_holdings(const mal_plan *plan, const mal_tensor_info *t, mal_slice_holding *h)
{
    int64_t len = t->shape[t->axis];
    int nh = 0;
    for (int p = 0; p < plan->n_pipelines; p++) {
        const mal_plan_stage *st = holding_stage(&plan->pipelines[p], t);
        for (int r = 0; r < st->n_ranks; r++) {
            int64_t b = 0, e = len;
            if (t->tp_splittable && st->n_ranks > 1) {
                b = len / st->n_ranks * r;
                e = b + len / st->n_ranks;
            }
            h[nh++] = (mal_slice_holding){st->ranks[r], p, b, e};
        }
    }
    return nh;
}
