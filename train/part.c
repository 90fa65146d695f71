/* This rank's share of the run under the plan in force: its model part
 * (none when suspended) and everything around it - TP group, pipeline
 * buffers, the data-parallel gradient sync.  Built at start-up and again
 * by every online plan change (online.c). */
#include <stdlib.h>

#include "base/mal.h"
#include "src/layout.h"
#include "train_internal.h"

/* The model's TP all-reduce: the data plane over the stage's group, on
 * activations in the compute dtype or fp32 statistics.  Not timed here: on a GPU it returns
 * once queued (comm.h), and its time is the data plane's to measure
 * (mal_comm_dp_elapsed, read by pipeline.c where the pass is synchronised). */
static int tp_allreduce(void *ctx, void *x, size_t n, mal_dtype dt)
{
    mal_trainer *tr = ctx;
    return mal_comm_dp_allreduce(tr->part.tp, tr->k, x, n, dt);
}

int mal_trainer_part_init(mal_trainer *tr, int init_params)
{
    mal_train_part *p = &tr->part;
    int rc;
    /* The gradient sync's messages get a communicator of their own, made
     * once (every rank, suspended or not, is here). */
    if (tr->world && (rc = mal_comm_split(tr->world, 0, tr->world_rank, &p->sync_world))) return rc;
    if ((rc = mal_trainer_build_part(tr, init_params, 0))) return rc;
    return mal_trainer_wire_part(tr);
}

void mal_trainer_part_fini(mal_trainer *tr)
{
    mal_train_part *p = &tr->part;
    mal_trainer_unwire_part(tr);
    mal_model_destroy(p->model);
    mal_comm_pool_destroy(p->pool);
    mal_comm_destroy(p->sync_world);
    p->model = NULL;
    p->pool = NULL;
    p->sync_world = NULL;
}

int mal_trainer_build_part(mal_trainer *tr, int init_params, int whole_moments)
{
    mal_train_part *p = &tr->part;
    int rc;
    mal_model_part part;
    int active;
    if ((rc = mal_plan_locate(&tr->plan, tr->world_rank, &p->loc))) return rc;
    if ((rc = mal_layout_part(&tr->plan, &tr->o.model, tr->world_rank, &part, &active)) || !active)
        return rc;
    /* sharded, the gradient sync keeps this rank's share of the moments */
    if ((rc = mal_model_create_ex(&p->model, &tr->o.model, &part, tr->plan.micro_batch_size, tr->k,
                                  tr->o.seed,
                                  (init_params ? MAL_MODEL_INIT : 0) |
                                      (tr->o.zero && !whole_moments ? MAL_MODEL_NO_MOMENTS : 0))))
        return rc;
    /* A fresh part whose master will be sharded (mal_trainer_wire_part):
     * parked in the gradient buffer now, before the activations, buckets
     * and moments' shares are made, so that the whole master never sits
     * beside them (an online change's part, which receives the whole
     * master and moments first, shards them in the same place). */
    if (!whole_moments && tr->o.zero && tr->o.zero_master &&
        (rc = mal_model_park_master(p->model)))
        return rc;
    /* before the pipeline makes its activation sets (mal_trainer_wire_part):
     * they are laid out for the mode */
    return mal_model_set_recompute(
        p->model, mal_trainer_recompute(tr, &tr->plan, p->loc.pipeline, p->loc.stage));
}

int mal_trainer_wire_part(mal_trainer *tr)
{
    mal_train_part *p = &tr->part;
    int rc;
    if (p->loc.pipeline >= 0) {
        const mal_plan_stage *st = &tr->plan.pipelines[p->loc.pipeline].stages[p->loc.stage];
        if (st->n_ranks > 1) {
            if (!tr->world)
                return MAL_ERR(MAL_EINVAL, "a TP group of %d ranks needs MPI", st->n_ranks);
            if (!p->pool && (rc = mal_comm_pool_create(&p->pool, tr->world))) return rc;
            if ((rc = mal_comm_pool_get(p->pool, MAL_POOL_TP, st->ranks, st->n_ranks, &p->tp)))
                return rc;
            p->model->tp_allreduce = tp_allreduce;
            p->model->tp_ctx = tr;
        }
        if ((rc = mal_pipeline_init(tr))) return rc;
    }
    if (!p->model) return 0; /* suspended: no state to sync */
    if ((rc = mal_gradsync_create(&p->gsync, &tr->plan, tr->world_rank, p->model, p->sync_world)))
        return rc;
    /* the overlapped sum's buckets follow the plan in force: made again
     * with the gradient sync after every online plan change; sharded, the
     * regions are the buckets' */
    if (tr->o.dp_overlap &&
        (rc = mal_gradsync_buckets(p->gsync, (size_t)(tr->o.dp_bucket_mb * 1024 * 1024))))
        return rc;
    if (!tr->o.zero) return 0;
    if ((rc = mal_gradsync_zero(p->gsync, tr->world_rank))) return rc;
    /* the master too (nothing where it is the working weights) */
    return tr->o.zero_master ? mal_gradsync_zero_master(p->gsync) : 0;
}

void mal_trainer_unwire_part(mal_trainer *tr)
{
    mal_train_part *p = &tr->part;
    if (p->model) mal_pipeline_fini(tr);
    mal_gradsync_destroy(p->gsync);
    p->gsync = NULL;
    p->tp = NULL; /* the pool keeps it */
}

mal_model *mal_trainer_retire_part(mal_trainer *tr)
{
    mal_model *m = tr->part.model;
    mal_trainer_unwire_part(tr);
    tr->part.model = NULL;
    return m;
}
