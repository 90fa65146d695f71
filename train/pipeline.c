/* The 1F1B pipeline schedule of one stage, with activations and their
 * gradients crossing between stages whose TP sizes differ.
 *
 * Every TP rank of a stage holds the full activation (N,C) after the TP
 * all-reduce, so any rank of a stage can feed any rank of the next:
 * receiver r of a stage of TP size b gets its activation from sender
 * r mod a of the previous stage (TP size a); gradients flow back the same
 * way (rank i of the earlier stage receives from rank i mod b of the later
 * one).  Activations and their gradients are device buffers moved by the
 * comm data plane (comm.h): sends are non-blocking and complete before
 * their buffer is reused; receives wait without burning CPU, and their
 * data is ordered before the kernels that read it (comm.h's rule 3).
 *
 * Stage j of S with m micro-batches runs min(S-j-1, m) warm-up forwards
 * (or the plan's deeper "warmup" for the stage, which hides a slow stage
 * boundary: mal_plan_stage_warmup), then alternates one forward and one
 * backward, then drains the remaining backwards.  No stage warms up less
 * than the next (mal_plan_validate), so every backward's gradient is
 * already on its way when the stage waits for it.  Micro-batch k of
 * pipeline p covers the global batch positions first_sample + k*B ... +
 * B-1, so the data never depends on the layout.  Evaluation and generation
 * (eval.c) run forward-only passes through the same stages, with their own
 * sequences (mal_pass).
 */
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "train_internal.h"

enum { TAG_ACT = 0, TAG_GRAD = 1 };

static int tag_of(int mb, int kind) { return 2 * mb + kind; }

int mal_pipeline_init(struct mal_trainer *tr)
{
    mal_pipeline *p = &tr->pipe;
    const mal_model *m = tr->part.model;
    const mal_plan_pipeline *pl = &tr->plan.pipelines[tr->part.loc.pipeline];
    const int j = tr->part.loc.stage;
    p->n_stages = pl->n_stages;
    p->n_micro = pl->micro_batches;
    p->prev_ranks = j > 0 ? pl->stages[j - 1].ranks : NULL;
    p->n_prev = j > 0 ? pl->stages[j - 1].n_ranks : 0;
    p->next_ranks = j + 1 < pl->n_stages ? pl->stages[j + 1].ranks : NULL;
    p->n_next = j + 1 < pl->n_stages ? pl->stages[j + 1].n_ranks : 0;
    int first = 0;
    for (int q = 0; q < tr->part.loc.pipeline; q++) first += tr->plan.pipelines[q].micro_batches;
    p->first_sample = first * tr->plan.micro_batch_size;

    /* Micro-batches in flight on stage j: the warm-up forwards plus one. */
    p->warmup = mal_plan_stage_warmup(pl, j);
    p->n_slots = MAL_MIN(p->n_micro, p->warmup + 1);
    mal_log(MAL_LOG_DEBUG,
            "pipeline %d stage %d: %d warm-up forwards (1F1B default %d), %d in flight",
            tr->part.loc.pipeline, j, MAL_MIN(p->warmup, p->n_micro),
            MAL_MIN(p->n_stages - j - 1, p->n_micro), p->n_slots);
    const int B = tr->plan.micro_batch_size;
    const size_t NC = (size_t)B * tr->o.model.seq_len * tr->o.model.d_model * m->esz;
    /* Fan-out: how many ranks of a neighbouring stage one rank feeds. */
    int tp = tr->part.loc.tp_size;
    p->max_fanout = 1 + MAL_MAX(p->n_next, p->n_prev) / (tp ? tp : 1);
    p->acts = calloc((size_t)p->n_slots, sizeof *p->acts);
    p->grad_send = calloc((size_t)p->n_slots, sizeof *p->grad_send);
    p->send_reqs = calloc((size_t)p->n_slots, sizeof *p->send_reqs);
    p->gsend_reqs = calloc((size_t)p->n_slots, sizeof *p->gsend_reqs);
    if (!p->acts || !p->grad_send || !p->send_reqs || !p->gsend_reqs)
        return MAL_ERR(MAL_ENOMEM, "pipeline: out of memory");
    for (int s = 0; s < p->n_slots; s++) {
        int rc = mal_acts_create(&p->acts[s], m, B);
        if (rc) return rc;
        p->send_reqs[s] = calloc((size_t)p->max_fanout, sizeof(mal_comm_req *));
        p->gsend_reqs[s] = calloc((size_t)p->max_fanout, sizeof(mal_comm_req *));
        if (!p->send_reqs[s] || !p->gsend_reqs[s])
            return MAL_ERR(MAL_ENOMEM, "pipeline: out of memory");
        if (j > 0 && !(p->grad_send[s] = mal_kern_alloc_as(m->k, NC, MAL_MEM_COMM)))
            return MAL_ERR(MAL_ENOMEM, "pipeline: out of memory for gradient buffers");
    }
    if (j + 1 < p->n_stages && !(p->grad_recv = mal_kern_alloc_as(m->k, NC, MAL_MEM_COMM)))
        return MAL_ERR(MAL_ENOMEM, "pipeline: out of memory for gradient buffers");
    /* the tokens of one micro-batch, loaded on the host (mal_pass) */
    size_t N = (size_t)B * (size_t)tr->o.model.seq_len;
    p->inputs = malloc(N * sizeof(int));
    p->targets = malloc(N * sizeof(int));
    if (!p->inputs || !p->targets) return MAL_ERR(MAL_ENOMEM, "out of memory");
    return 0;
}

void mal_pipeline_fini(struct mal_trainer *tr)
{
    mal_pipeline *p = &tr->pipe;
    mal_model *m = tr->part.model;
    for (int s = 0; s < p->n_slots; s++) {
        if (p->acts && p->acts[s]) mal_acts_destroy(m, p->acts[s]);
        if (p->grad_send && p->grad_send[s]) mal_kern_free(m->k, p->grad_send[s]);
        if (p->send_reqs) free(p->send_reqs[s]);
        if (p->gsend_reqs) free(p->gsend_reqs[s]);
    }
    if (p->grad_recv) mal_kern_free(m->k, p->grad_recv);
    free(p->acts);
    free(p->grad_send);
    free(p->send_reqs);
    free(p->gsend_reqs);
    free(p->inputs);
    free(p->targets);
    p->acts = NULL;
    p->grad_send = NULL;
    p->send_reqs = p->gsend_reqs = NULL;
    p->grad_recv = NULL;
    p->inputs = p->targets = NULL;
    p->n_slots = 0;
}

/* Wait for every pending send of a slot (before its buffer is reused). */
static int drain(struct mal_trainer *tr, mal_comm_req **reqs)
{
    if (!tr->world) return 0; /* one rank without MPI: nothing was sent */
    double t0 = mal_now();
    int rc = mal_comm_dp_waitall(tr->world, tr->pipe.max_fanout, reqs);
    tr->tally.times.pp += mal_now() - t0;
    return rc;
}

/* Receive `bytes` of activations (or their gradient) into device buffer buf. */
static int recv_from(struct mal_trainer *tr, void *buf, size_t bytes, int peer, int tag)
{
    double t0 = mal_now();
    mal_comm_req *req;
    int rc = mal_comm_dp_irecv(tr->world, tr->k, buf, bytes, peer, tag, &req);
    if (!rc) rc = mal_comm_dp_waitall(tr->world, 1, &req);
    /* --inject-link: the message took F times its measured time */
    tr->tally.times.pp += mal_inject_link_stretch(tr, peer, mal_now() - t0);
    return rc;
}

/* Post sends of `buf` to every rank r of `peers` (size n_peers) with
 * r mod my_tp == my tp rank. */
static int send_to(struct mal_trainer *tr, const void *buf, size_t bytes, const int *peers,
                   int n_peers, int tag, mal_comm_req **reqs)
{
    int k = 0, rc = mal_comm_dp_group_start(tr->world);
    for (int r = tr->part.loc.tp_rank; r < n_peers && !rc; r += tr->part.loc.tp_size)
        rc = mal_comm_dp_isend(tr->world, tr->k, buf, bytes, peers[r], tag, &reqs[k++]);
    int rc2 = mal_comm_dp_group_end(tr->world);
    return rc ? rc : rc2;
}

/* The sequences of training step `step`: micro-batch mb of pipeline p
 * covers the global batch positions first_sample + mb*B ... + B-1. */
static int load_train(struct mal_trainer *tr, const mal_pass *pass, int mb, int B, int T)
{
    const mal_pipeline *p = &tr->pipe;
    for (int i = 0; i < B; i++) {
        int64_t pos = p->first_sample + (int64_t)mb * B + i;
        int rc = mal_data_sample(tr->data, tr->o.seed, pass->step, pos, T,
                                 p->inputs + (size_t)i * T, p->targets + (size_t)i * T);
        if (rc) return rc;
    }
    return 0;
}

/* The time of the TP all-reduces queued since the last call (0 without a
 * TP group): the data plane's own measure (mal_comm_dp_elapsed: on a GPU
 * device time around each reduction, on MPI host time), and the host's
 * wait for them with the NCCL timeout -- the watchdog that ends the run
 * when a TP peer is dead.  Called after a pass is queued and before
 * anything waits for the kernel queue, which waits behind the reductions. */
static int tp_time(struct mal_trainer *tr, double *seconds)
{
    *seconds = 0;
    return tr->part.tp ? mal_comm_dp_elapsed(tr->part.tp, seconds) : 0;
}

static int forward(struct mal_trainer *tr, const mal_pass *pass, int mb, float dscale)
{
    mal_pipeline *p = &tr->pipe;
    mal_step_times *t = &tr->tally.times;
    mal_model *m = tr->part.model;
    int slot = mb % p->n_slots, rc;
    mal_acts *a = p->acts[slot];
    const size_t NC = (size_t)a->B * a->T * tr->o.model.d_model * m->esz; /* bytes */
    /* The slot's previous activation send must be done before res[] is
     * overwritten. */
    if ((rc = drain(tr, p->send_reqs[slot]))) return rc;
    if (m->part.has_embed || m->part.has_head) {
        if ((rc = pass->load(tr, pass, mb, a->B, a->T))) return rc;
        mal_acts_set_batch(m, a, p->inputs, p->targets);
    }
    if (!m->part.has_embed) {
        int peer = p->prev_ranks[tr->part.loc.tp_rank % p->n_prev];
        if ((rc = recv_from(tr, a->res[0], NC, peer, tag_of(mb, TAG_ACT)))) return rc;
    }
    /* compute: the pass's wall time, synchronised, less its TP time */
    double t0 = mal_now(), tp = 0;
    if ((rc = mal_model_forward(m, a, a->res[0], dscale)) || (rc = tp_time(tr, &tp))) return rc;
    if (m->part.has_head) tr->tally.loss_local += mal_acts_loss_sum(m, a);
    if ((rc = mal_kern_sync(m->k))) return rc;
    double t1 = mal_now();
    t->tp += mal_inject_link_stretch(tr, -1, tp);
    t->compute += mal_inject_stretch(tr, t1 - t0 - tp);
    if (!m->part.has_head)
        return send_to(tr, a->res[m->n_local_layers], NC, p->next_ranks, p->n_next,
                       tag_of(mb, TAG_ACT), p->send_reqs[slot]);
    return 0;
}

/* The model's gradient hook in the step's last backward pass: the
 * overlapped gradient sum posts the buckets whose gradients are final
 * (gradsync.h).  Its time is the data-parallel sync's, not compute. */
static int grads_ready(void *ctx, int layer)
{
    struct mal_trainer *tr = ctx;
    double t0 = mal_now();
    int rc = mal_gradsync_ready(tr->part.gsync, layer);
    tr->tally.times.dp += mal_now() - t0;
    return rc;
}

static int backward(struct mal_trainer *tr, int mb)
{
    mal_pipeline *p = &tr->pipe;
    mal_step_times *t = &tr->tally.times;
    mal_model *m = tr->part.model;
    int slot = mb % p->n_slots, rc;
    mal_acts *a = p->acts[slot];
    const size_t NC = (size_t)a->B * a->T * tr->o.model.d_model * m->esz; /* bytes */
    const void *dout = NULL;
    if (!m->part.has_head) {
        int peer = p->next_ranks[tr->part.loc.tp_rank % p->n_next];
        if ((rc = recv_from(tr, p->grad_recv, NC, peer, tag_of(mb, TAG_GRAD)))) return rc;
        dout = p->grad_recv;
    }
    double t0 = mal_now(), tp = 0, dp0 = t->dp;
    void *dinp = NULL;
    /* 1F1B runs a stage's backward passes in micro-batch order: in the
     * last one, each layer's gradients are final once its kernels are
     * queued */
    if (tr->o.dp_overlap && mb == p->n_micro - 1 && tr->part.gsync) {
        m->grad_ready = grads_ready;
        m->grad_ctx = tr;
    }
    rc = mal_model_backward(m, a, dout, &dinp);
    m->grad_ready = NULL;
    m->grad_ctx = NULL;
    if (rc || (rc = tp_time(tr, &tp))) return rc;
    if (!m->part.has_embed) {
        if ((rc = drain(tr, p->gsend_reqs[slot]))) return rc;
        mal_kern_copy(m->k, p->grad_send[slot], dinp, NC);
    }
    if ((rc = mal_kern_sync(m->k))) return rc;
    double t1 = mal_now(), dp = t->dp - dp0;
    t->tp += mal_inject_link_stretch(tr, -1, tp);
    t->compute += mal_inject_stretch(tr, t1 - t0 - tp - dp);
    if (!m->part.has_embed)
        return send_to(tr, p->grad_send[slot], NC, p->prev_ranks, p->n_prev, tag_of(mb, TAG_GRAD),
                       p->gsend_reqs[slot]);
    return 0;
}

/* Every send of the pass completes before its buffers are touched again. */
static int drain_all(struct mal_trainer *tr)
{
    mal_pipeline *p = &tr->pipe;
    int rc;
    for (int s = 0; s < p->n_slots; s++) {
        if ((rc = drain(tr, p->send_reqs[s]))) return rc;
        if ((rc = drain(tr, p->gsend_reqs[s]))) return rc;
    }
    return 0;
}

int mal_pipeline_run(struct mal_trainer *tr, int64_t step, float dscale)
{
    const int m = tr->pipe.n_micro, warm = MAL_MIN(tr->pipe.warmup, m);
    const mal_pass pass = {load_train, step, NULL};
    int rc, f = 0, b = 0;
    for (; f < warm; f++)
        if ((rc = forward(tr, &pass, f, dscale))) return rc;
    for (; f < m; f++, b++) {
        if ((rc = forward(tr, &pass, f, dscale))) return rc;
        if ((rc = backward(tr, b))) return rc;
    }
    for (; b < m; b++)
        if ((rc = backward(tr, b))) return rc;
    /* All sends of this step complete before the optimizer touches anything. */
    return drain_all(tr);
}

int mal_pipeline_forward_only(struct mal_trainer *tr, const mal_pass *pass, int n_micro)
{
    /* Stages only ever wait on earlier stages' sends of earlier
     * micro-batches, so forwards in order need no schedule. */
    for (int mb = 0; mb < n_micro; mb++) {
        int rc = forward(tr, pass, mb, 0.0f);
        if (rc) return rc;
    }
    return drain_all(tr);
}
