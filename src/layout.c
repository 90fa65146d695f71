/* Holdings and ownership of model state under a plan (see layout.h). */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "mal.h"

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

int mal_layout_owned(const mal_plan *plan, const mal_model_config *cfg, int rank,
                     mal_tensor_info **tensors, int *n_tensors, mal_owned_block **blocks,
                     int *n_blocks)
{
    mal_model_part part;
    int active, rc, cap = 0;
    *tensors = NULL;
    *n_tensors = 0;
    *blocks = NULL;
    *n_blocks = 0;
    if ((rc = mal_layout_part(plan, cfg, rank, &part, &active))) return rc;
    if (!active) return 0;
    if ((rc = mal_model_layout(cfg, &part, tensors, n_tensors, NULL))) return rc;
    mal_slice_holding *h = malloc(sizeof *h * (size_t)(mal_plan_n_active(plan) + 1));
    mal_slice_map map = {0};
    if (!h) {
        rc = MAL_ERR(MAL_ENOMEM, "layout: out of memory");
        goto fail;
    }
    for (int ti = 0; ti < *n_tensors; ti++) {
        const mal_tensor_info *t = &(*tensors)[ti];
        int nh = mal_layout_holdings(plan, t, h);
        if ((rc = mal_slices_partition(h, nh, t->shape[t->axis], &map))) goto fail;
        for (int pi = 0; pi < map.n_pieces; pi++) {
            const mal_slice_piece *pc = &map.pieces[pi];
            if (h[map.holders[pc->first]].rank != rank) continue;
            if (*n_blocks == cap) {
                cap = cap ? 2 * cap : 32;
                mal_owned_block *nb = realloc(*blocks, sizeof *nb * (size_t)cap);
                if (!nb) {
                    rc = MAL_ERR(MAL_ENOMEM, "layout: out of memory");
                    goto fail;
                }
                *blocks = nb;
            }
            (*blocks)[(*n_blocks)++] = (mal_owned_block){ti, pc->begin, pc->end};
        }
        mal_slices_fini(&map);
    }
    free(h);
    return 0;
fail:
    mal_slices_fini(&map);
    free(h);
    free(*tensors);
    free(*blocks);
    *tensors = NULL;
    *blocks = NULL;
    *n_tensors = *n_blocks = 0;
    return rc;
}
