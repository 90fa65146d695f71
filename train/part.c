/* This rank's share of the run under the plan in force: its model part
 * (none when suspended) and everything around it - TP group, pipeline
 * buffers, the data-parallel gradient sync.  Built at start-up and again
 * by every online plan change (online.c). */
#include <stdlib.h>

#include "base/mal.h"
#include "src/layout.h"
#include "train_internal.h"

/* The model's TP all-reduce: the data plane over the stage's group, on
 * activations in the compute dtype. */
static int tp_allreduce(void *ctx, void *x, size_t n)
{
    mal_trainer *tr = ctx;
    double t0 = mal_now();
    int rc = mal_comm_dp_allreduce(tr->tp, tr->k, x, n, tr->k->compute);
    tr->times.tp += mal_now() - t0;
    return rc;
}

/* This rank's part of the model under tr->plan (none when suspended).
 * Local. */
int mal_trainer_build_part(mal_trainer *tr)
{
    int rc;
    mal_model_part part;
    int active;
    if ((rc = mal_plan_locate(&tr->plan, tr->world_rank, &tr->loc))) return rc;
    if ((rc = mal_layout_part(&tr->plan, &tr->o.model, tr->world_rank, &part, &active)) || !active)
        return rc;
    /* A resumed run or an online plan change overwrites every parameter. */
    return mal_model_create_ex(&tr->model, &tr->o.model, &part, tr->plan.micro_batch_size, tr->k,
                               tr->o.seed, !tr->no_init);
}

/* Everything around the part: TP group, pipeline buffers, gradient-sync
 * groups.  Collective over the world. */
int mal_trainer_wire_part(mal_trainer *tr)
{
    int rc;
    const mal_model_config *c = &tr->o.model;
    if (tr->loc.pipeline >= 0) {
        const mal_plan_stage *st = &tr->plan.pipelines[tr->loc.pipeline].stages[tr->loc.stage];
        if (st->n_ranks > 1) {
            if (!tr->world)
                return MAL_ERR(MAL_EINVAL, "a TP group of %d ranks needs MPI", st->n_ranks);
            if (!tr->pool && (rc = mal_comm_pool_create(&tr->pool, tr->world))) return rc;
            if ((rc = mal_comm_pool_get(tr->pool, MAL_POOL_TP, st->ranks, st->n_ranks, &tr->tp)))
                return rc;
            tr->model->tp_allreduce = tp_allreduce;
            tr->model->tp_ctx = tr;
        }
        if ((rc = mal_pipeline_setup(tr))) return rc;
        size_t N = (size_t)tr->plan.micro_batch_size * (size_t)c->seq_len;
        tr->inputs = malloc(N * sizeof(int));
        tr->targets = malloc(N * sizeof(int));
        if (!tr->inputs || !tr->targets) return MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    if (!tr->model) return 0; /* suspended: no state to sync */
    if ((rc = mal_gradsync_create(&tr->gsync, &tr->plan, tr->world_rank, tr->model,
                                  tr->sync_world)))
        return rc;
    /* the overlapped sum's buckets follow the plan in force: made again
     * with the gradient sync after every online plan change */
    return tr->o.dp_overlap
               ? mal_gradsync_buckets(tr->gsync, (size_t)(tr->o.dp_bucket_mb * 1024 * 1024))
               : 0;
}

/* Undo mal_trainer_wire_part (the model itself stays). */
void mal_trainer_unwire_part(mal_trainer *tr)
{
    if (tr->model) mal_pipeline_teardown(tr);
    mal_gradsync_destroy(tr->gsync);
    tr->gsync = NULL;
    tr->tp = NULL; /* the pool keeps it */
    free(tr->inputs);
    free(tr->targets);
    tr->inputs = tr->targets = NULL;
}
