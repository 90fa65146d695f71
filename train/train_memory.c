/* The trainer's memory check: a plan whose largest part cannot fit in a
 * rank's share of its machine's memory is refused, with the numbers, before
 * any part is allocated.  Without it a model too large for the machine was
 * allocated lazily and ended in the out-of-memory killer (or in swap) with
 * no message. */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mal.h"
#include "src/gradsync.h"
#include "src/layout.h"
#include "src/model.h"
#include "train_internal.h"

/* FNV-1a of this machine's host name: ranks with equal hashes share it. */
static uint64_t host_hash(void)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = host; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

/* Collective over the world: how many ranks of the job run on this rank's
 * machine (gathered host names, broadcast back). */
static int ranks_on_this_node(mal_trainer *tr, int *n)
{
    *n = 1;
    if (!tr->world || tr->world_size == 1) return 0;
    uint64_t mine = host_hash();
    uint64_t *all = malloc(sizeof *all * (size_t)tr->world_size);
    if (!all) return MAL_ERR(MAL_ENOMEM, "out of memory");
    int rc = mal_comm_gather(tr->world, &mine, all, sizeof mine, 0);
    if (!rc) rc = mal_comm_broadcast(tr->world, all, sizeof *all * (size_t)tr->world_size, 0);
    if (!rc) {
        *n = 0;
        for (int r = 0; r < tr->world_size; r++)
            *n += all[r] == mine;
    }
    free(all);
    return rc;
}

/* 1 when the fp32 master is sharded with the moments (--zero-master on
 * where the working weights are a separate copy: mal_gradsync_zero_master). */
static int master_sharded(const mal_trainer *tr)
{
    return tr->o.zero && tr->o.zero_master && mal_model_separate_work(tr->k);
}

/* What rank r's part needs, by kind (bytes). */
typedef struct {
    size_t state; /* the model part less its activations: fp32 state (the
                   * rank's share of the moments under --zero 1), working
                   * weights, backward scratch */
    size_t acts;  /* the activations of the micro-batches in flight and
                   * the recompute mode's one-layer buffer */
    size_t comm;  /* the gradient sum's buffer (buckets or packing) and
                   * the pipeline's gradient send/receive buffers */
    size_t other; /* the data's resident bytes, --snapshot-async's staging */
    size_t total;
    int in_flight; /* micro-batches of activations kept (1F1B) */
    int recompute; /* the stage's mode */
} part_need_t;

/* The bytes rank r's part needs: its model part (mal_model_bytes: state,
 * working weights, scratch, the activations of the micro-batches its stage
 * keeps in flight under 1F1B in its recompute mode and the mode's
 * one-layer buffer), the communication buffers made beside it (the
 * gradient sum's, the pipeline's) and the token data every rank loads.
 * All 0 for a suspended rank. */
static int part_need(mal_trainer *tr, int r, part_need_t *need, mal_model_part *part)
{
    const mal_plan *plan = &tr->plan;
    const mal_model_config *cfg = &tr->o.model;
    mal_plan_loc loc;
    int active, rc, ovf = 0;
    memset(need, 0, sizeof *need);
    if ((rc = mal_plan_locate(plan, r, &loc)) ||
        (rc = mal_layout_part(plan, cfg, r, part, &active)) || !active)
        return rc;
    const mal_plan_pipeline *pl = &plan->pipelines[loc.pipeline];
    const int B = plan->micro_batch_size;
    need->in_flight = MAL_MIN(pl->micro_batches, mal_plan_stage_warmup(pl, loc.stage) + 1);
    need->recompute = mal_trainer_recompute(tr, plan, loc.pipeline, loc.stage);
    size_t with_acts, without;
    if ((rc = mal_model_bytes(cfg, part, B, tr->k, need->in_flight, need->recompute, &with_acts)) ||
        (rc = mal_model_bytes(cfg, part, B, tr->k, 0, MAL_RECOMPUTE_NONE, &without)))
        return rc;
    need->state = without, need->acts = with_acts - without;
    size_t moments = 0;
    if (tr->o.zero) {
        /* sharded: the rank's share of both moments and its regions'
         * gradient sums, in place of the part's whole moments */
        size_t sums, n_params;
        mal_tensor_info *lt = NULL;
        int nlt;
        if ((rc = mal_model_layout(cfg, part, &lt, &nlt, &n_params))) return rc;
        free(lt);
        if ((rc = mal_gradsync_zero_need(plan, cfg, r, part, tr->o.dp_overlap, &moments, &sums)))
            return rc;
        need->state -= 2 * n_params * sizeof(float);
        need->state =
            mal_size_add(need->state, mal_size_mul(2 * moments + sums, sizeof(float), &ovf), &ovf);
        /* the master sharded too (a separate working copy): its share, at
         * the moments' regions, in place of the whole master */
        if (master_sharded(tr)) {
            need->state -= n_params * sizeof(float);
            need->state =
                mal_size_add(need->state, mal_size_mul(moments, sizeof(float), &ovf), &ovf);
        }
    }
    /* the gradient sum's buffer: the buckets (where a sharded sum's
     * regions stay) or the packing buffer */
    size_t sync_floats;
    if ((rc = mal_gradsync_buffer_need(plan, cfg, r, part, tr->o.dp_overlap, &sync_floats)))
        return rc;
    need->comm = mal_size_mul(sync_floats, sizeof(float), &ovf);
    /* the pipeline's (pipeline.c): a gradient send buffer per micro-batch
     * in flight behind a first stage, a receive buffer before a last one */
    size_t NCe =
        mal_size_mul(mal_size_mul((size_t)B * (size_t)cfg->seq_len, (size_t)cfg->d_model, &ovf),
                     mal_dtype_bytes(tr->k->compute), &ovf);
    size_t pipe_bufs =
        (loc.stage > 0 ? (size_t)need->in_flight : 0) + (loc.stage + 1 < pl->n_stages ? 1 : 0);
    need->comm = mal_size_add(need->comm, mal_size_mul(NCe, pipe_bufs, &ovf), &ovf);
    /* the data's own memory: the built-in corpus; token files are mapped
     * (their pages are the page cache's) and synthetic tokens computed */
    need->other = mal_data_resident_bytes(tr->data);
    /* the background snapshot writer's staging copy of the blocks r writes */
    size_t staged = 0;
    if (tr->o.snapshot_async && tr->o.snapshot_dir &&
        (rc = mal_ckpt_staging_floats(plan, cfg, r, &staged)))
        return rc;
    /* sharded, the staged moments are the rank's share (at most: the
     * copies of a TP group are written by one of them) */
    if (tr->o.zero && staged)
        staged = master_sharded(tr) ? 3 * moments : staged / MAL_STATE_N_SAVED + 2 * moments;
    need->other = mal_size_add(need->other, mal_size_mul(staged, sizeof(float), &ovf), &ovf);
    need->total = mal_size_add(mal_size_add(need->state, need->acts, &ovf),
                               mal_size_add(need->comm, need->other, &ovf), &ovf);
    if (ovf) need->total = SIZE_MAX;
    return 0;
}

/* `bytes` for a message: MiB below a GiB, else GiB. */
static const char *human(double bytes, char buf[32])
{
    const double mib = 1024.0 * 1024.0;
    if (bytes < 1024.0 * mib)
        snprintf(buf, 32, "%.1f MiB", bytes / mib);
    else
        snprintf(buf, 32, "%.2f GiB", bytes / (1024.0 * mib));
    return buf;
}

int mal_trainer_check_memory(mal_trainer *tr)
{
    /* Device memory is the backend allocator's to refuse; host memory is
     * what this check knows. */
    if (!tr->k->host_addressable) return 0;
    int rc, local;
    if ((rc = ranks_on_this_node(tr, &local))) return rc;
    size_t mem = mal_phys_memory_bytes();
    /* The smallest share of any rank, so every rank reaches one verdict:
     * max of the negated shares. */
    double share = mem ? -(double)mem / local : -INFINITY;
    if (tr->world && tr->world_size > 1 && (rc = mal_comm_allreduce_max_f64(tr->world, &share, 1)))
        return rc;
    share = -share;
    if (isinf(share)) return 0; /* memory unknown everywhere */

    /* The largest part, computed alike on every rank from the plan. */
    part_need_t need = {0}, b;
    int worst = -1;
    mal_model_part part, worst_part = {0};
    for (int r = 0; r < tr->world_size; r++) {
        if ((rc = part_need(tr, r, &b, &part))) return rc;
        if (b.total > need.total) need = b, worst = r, worst_part = part;
    }
    if ((double)need.total <= share) return 0;
    mal_plan_loc loc;
    if ((rc = mal_plan_locate(&tr->plan, worst, &loc))) return rc;
    char total[32], state[32], acts[32], comm[32], other[32], limit[32], machine[32];
    return MAL_ERR(
        MAL_EINVAL,
        "model %s does not fit in memory: pipeline %d stage %d (rank %d's part: layers [%d, "
        "%d)%s%s, TP %d, micro-batch %d, %d in flight, recompute %s) needs %zu bytes (%s: %s "
        "fp32 parameters, gradients and Adam moments%s, working weights and scratch; %s "
        "activations; %s communication buffers; %s data and --snapshot-async's staging), but a "
        "rank has %.0f bytes (%s: %s of memory shared by %d ranks on a node); use %smore "
        "ranks (more stages or TP), a smaller micro-batch or a smaller model",
        tr->o.model.name, loc.pipeline, loc.stage, worst, worst_part.layer_begin,
        worst_part.layer_end, worst_part.has_embed ? ", embedding" : "",
        worst_part.has_head ? ", head" : "", worst_part.tp_size, tr->plan.micro_batch_size,
        need.in_flight, mal_recompute_name(need.recompute), need.total, human(need.total, total),
        human(need.state, state),
        master_sharded(tr) ? " (its share of the master and moments, --zero-master on)"
        : tr->o.zero       ? " (its share of the moments, --zero 1)"
                           : "",
        human(need.acts, acts), human(need.comm, comm), human(need.other, other), share,
        human(share, limit), human(mem, machine), local,
        /* what recomputation could still save */
        need.recompute == MAL_RECOMPUTE_NONE        ? "--recompute selective or full (or the "
                                                      "plan's \"recompute\"), "
        : need.recompute == MAL_RECOMPUTE_SELECTIVE ? "--recompute full, "
                                                    : "");
}
