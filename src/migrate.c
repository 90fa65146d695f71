/* The online fast path: plan anew for the measured rates inside the running
 * job and move the model state (parameters, Adam m and v) rank to rank onto
 * the new layout, without touching disk or restarting MPI.
 *
 * Rank 0 runs the planner (replan/replan.h) on the policy's windowed rates
 * with the current plan as the starting point (so ranks keep as much state as
 * possible) and broadcasts the plan text; every rank parses and validates it.
 * Then, tensor by tensor in the global order, every rank computes from the
 * old and the new plan the finest common partition of the tensor's holdings
 * (slices.h): a piece a new holder already held is copied in place; any
 * other piece is sent by one old holder - one on the receiver's node when
 * there is one, spread round-robin over the candidates - and received.
 * Contiguous pieces go straight from the old part's buffers into the new
 * part's (no staging copy) and are all posted first; strided ones (a TP
 * size change) follow through a bounded staging area.  All replicas
 * receive copies of the same bytes, so they stay bitwise identical; progress
 * (step, consumed samples) and the counter-based RNG carry over unchanged.
 *
 * A failure part-way returns an error; malleus-train then stops and the job
 * script falls back to the last complete snapshot (the restart path). */
#include <stdlib.h>
#include <string.h>

#include "comm_mpi.h"
#include "kernels.h"
#include "layout.h"
#include "mal.h"
#include "policy.h"
#include "replan.h"
#include "slices.h"
#include "train_internal.h"

enum { TAG_MIGRATE = 7 };

/* Rank 0: the new plan as JSON text (NULL when planning failed). */
static char *plan_on_rank0(struct mal_trainer *tr)
{
    const mal_train_options *o = &tr->o;
    mal_cluster cl;
    mal_profile prof;
    mal_plan out;
    char *text = NULL;
    int rc;
    double *rates = malloc(sizeof *rates * (size_t)tr->world_size);
    memset(&cl, 0, sizeof cl);
    memset(&prof, 0, sizeof prof);
    mal_plan_init(&out);
    if (!rates) goto done;
    mal_policy_means(tr->policy, rates);
    int rpn = o->ranks_per_node > 0 ? o->ranks_per_node : tr->world_size;
    if ((rc = mal_cluster_regular(&cl, tr->world_size, rpn,
                                  o->device_memory_mb > 0 ? o->device_memory_mb : 16384.0)))
        goto fail;
    if (o->profile && strchr(o->profile, '.'))
        rc = mal_profile_read(&prof, o->profile, tr->plan.micro_batch_size);
    else
        rc = mal_profile_preset(&prof, o->profile ? o->profile : o->model.name,
                                tr->plan.micro_batch_size);
    if (rc) goto fail;
    mal_replan_input in = {&cl,
                           &prof,
                           rates,
                           tr->plan.micro_batch_size,
                           mal_plan_n_micro_batches(&tr->plan),
                           0,
                           &tr->plan,
                           MAL_REPLAN_AUTO};
    mal_replan_stats stats;
    if ((rc = mal_replan(&in, &out, &stats))) goto fail;
    if ((rc = mal_plan_to_string(&out, &text))) goto fail;
    mal_log(MAL_LOG_INFO, "replan: new plan in %.3f s (%d pipelines, %d suspended)", stats.seconds,
            out.n_pipelines, out.n_suspended);
    goto done;
fail:
    mal_log(MAL_LOG_WARN, "replan failed, keeping the current plan: %s", mal_errmsg());
done:
    mal_plan_fini(&out);
    mal_profile_fini(&prof);
    mal_cluster_fini(&cl);
    free(rates);
    return text;
}

/* Agree on the new plan: rank 0 plans, everybody parses the same text.
 * *changed = 0 when planning failed or the layout is the same. */
static int agree_on_plan(struct mal_trainer *tr, mal_plan *next, int *changed)
{
    char *text = tr->world_rank == 0 ? plan_on_rank0(tr) : NULL;
    int64_t len = text ? (int64_t)strlen(text) + 1 : 0;
    int rc;
    *changed = 0;
    if ((rc = mal_comm_broadcast(tr->world, &len, sizeof len, 0))) goto out;
    if (len == 0) goto out;
    if (!text && !(text = malloc((size_t)len))) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto out;
    }
    if ((rc = mal_comm_broadcast(tr->world, text, (size_t)len, 0))) goto out;
    if ((rc = mal_plan_parse_string(next, text, "the new plan"))) goto out;
    if ((rc = mal_plan_validate(next, tr->world_size, tr->o.model.n_layers, tr->o.model.n_heads,
                                tr->o.model.ffn_hidden, tr->o.global_batch)))
        goto out;
    *changed = !mal_plan_same_layout(next, &tr->plan);
out:
    free(text);
    return rc;
}


/* One piece that one new holder needs: from `src` (== dst: kept in place).
 * `direct`: contiguous on both sides (posted in the first pass). */
typedef struct {
    int64_t begin, end;
    int src, dst;
    int direct;
} transfer;

/* The transfers of global tensor `gt` from the old to the new plan's holders.
 * Every rank computes the same list. */
static int plan_transfers(const mal_plan *old_plan, const mal_plan *new_plan,
                          const mal_tensor_info *gt, const int *node_of, transfer **out, int *n_out)
{
    int n_old = mal_plan_n_active(old_plan), n_new = mal_plan_n_active(new_plan), rc, n = 0;
    mal_slice_holding *h = malloc(sizeof *h * (size_t)(n_old + n_new));
    transfer *t = malloc(sizeof *t * (size_t)(n_old + n_new) * 2 + sizeof *t);
    mal_slice_map map = {0};
    *out = NULL;
    *n_out = 0;
    if (!h || !t) {
        rc = MAL_ERR(MAL_ENOMEM, "migration: out of memory");
        goto fail;
    }
    int nh = mal_layout_holdings(old_plan, gt, h);
    for (int i = 0; i < nh; i++)
        h[i].group = 0;
    int nh2 = mal_layout_holdings(new_plan, gt, h + nh);
    for (int i = nh; i < nh + nh2; i++)
        h[i].group = 1;
    if ((rc = mal_slices_partition(h, nh + nh2, gt->shape[gt->axis], &map))) goto fail;
    int cap = (n_old + n_new) * 2 + 1;
    for (int pi = 0; pi < map.n_pieces; pi++) {
        const mal_slice_piece *pc = &map.pieces[pi];
        const int *hi = map.holders + pc->first;
        int n_o = 0;
        while (n_o < pc->n_holders && h[hi[n_o]].group == 0)
            n_o++;
        int k = 0; /* receivers served so far: spreads the senders */
        for (int j = n_o; j < pc->n_holders; j++) {
            int dst = h[hi[j]].rank, src = -1, src_h = -1;
            for (int i = 0; i < n_o; i++)
                if (h[hi[i]].rank == dst) src = dst, src_h = hi[i];
            if (src < 0) {
                /* prefer a sender on the receiver's node */
                int same = 0;
                for (int i = 0; i < n_o; i++)
                    same += node_of[h[hi[i]].rank] == node_of[dst];
                int pick = k++ % (same ? same : n_o), seen = 0;
                for (int i = 0; i < n_o && src < 0; i++)
                    if (!same || node_of[h[hi[i]].rank] == node_of[dst])
                        if (seen++ == pick) src = h[hi[i]].rank, src_h = hi[i];
            }
            /* Contiguous in a holder's shard: rows of a row-split (or 1-D)
             * tensor, or a column range that is the holder's whole width. */
            const mal_slice_holding *hs = &h[src_h], *hd = &h[hi[j]];
            int direct = gt->ndim == 1 || gt->axis == 0 ||
                         (pc->begin == hs->begin && pc->end == hs->end && pc->begin == hd->begin &&
                          pc->end == hd->end);
            if (n == cap) {
                cap *= 2;
                transfer *nt = realloc(t, sizeof *nt * (size_t)cap);
                if (!nt) {
                    rc = MAL_ERR(MAL_ENOMEM, "migration: out of memory");
                    goto fail;
                }
                t = nt;
            }
            t[n++] = (transfer){pc->begin, pc->end, src, dst, direct};
        }
    }
    mal_slices_fini(&map);
    free(h);
    *out = t;
    *n_out = n;
    return 0;
fail:
    mal_slices_fini(&map);
    free(h);
    free(t);
    return rc;
}

typedef struct {
    double bytes_moved, bytes_kept;
} move_stats;

/* Messages in flight, waited for together (a flush).  A piece that is
 * contiguous on this rank goes straight from the old part's state or into
 * the new part's.  A strided one (a column range of a matrix: a TP size
 * change) is packed into, or received into, a staging arena and copied out
 * after the flush, which comes whenever the arena is full: MPI's own
 * non-contiguous path measured 2-2.5x slower here than one contiguous
 * transfer plus one local copy.  (Why the flushes cannot deadlock: see
 * mal_trainer_change_plan.) */
size_t mal_migrate_stage_bytes = (size_t)64 << 20;
typedef struct {
    float *dst; /* the new part's buffer */
    mal_range_shape sh;
    size_t at; /* arena offset (floats) */
} unstage;
typedef struct {
    MPI_Request *reqs;
    int n, cap;
    size_t bytes;
    float *arena;      /* staging for strided pieces */
    size_t arena_cap;  /* floats allocated */
    size_t arena_used; /* floats in use by this bucket */
    unstage *u;        /* received pieces to copy out after the flush */
    int n_u, cap_u;
} bucket;

static void copy_rows(float *to, int64_t to_stride, const float *from, int64_t from_stride,
                      int64_t rows, int64_t width)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy(to + (size_t)(r * to_stride), from + (size_t)(r * from_stride),
               (size_t)width * sizeof(float));
}

static int bucket_flush(bucket *bk)
{
    int rc = mal_mpi_waitall(bk->n, bk->reqs, "migration");
    if (!rc)
        for (int i = 0; i < bk->n_u; i++) {
            const unstage *u = &bk->u[i];
            copy_rows(u->dst + u->sh.offset, u->sh.stride, bk->arena + u->at, u->sh.width,
                      u->sh.rows, u->sh.width);
        }
    bk->n = bk->n_u = 0;
    bk->bytes = 0;
    bk->arena_used = 0;
    return rc; /* on failure the job stops; what is in flight goes with it */
}

static void bucket_fini(bucket *bk)
{
    free(bk->reqs);
    free(bk->u);
    free(bk->arena);
}

static MPI_Request *bucket_slot(bucket *bk)
{
    if (mal_grow(&bk->reqs, &bk->cap, bk->n, sizeof *bk->reqs, 64)) return NULL;
    return &bk->reqs[bk->n++];
}

/* Room for `floats` in the staging arena (flushing first when the bucket's
 * pieces fill it); *at is where they go. */
static int stage_reserve(bucket *bk, size_t floats, size_t *at)
{
    int rc;
    if (bk->arena_used + floats > bk->arena_cap && bk->arena_used)
        if ((rc = bucket_flush(bk))) return rc;
    if (floats > bk->arena_cap) { /* empty now: grow to the larger of a piece and the limit */
        size_t cap = MAL_MAX(floats, mal_migrate_stage_bytes / sizeof(float));
        free(bk->arena);
        if (!(bk->arena = malloc(cap * sizeof(float)))) {
            bk->arena_cap = 0;
            return MAL_ERR(MAL_ENOMEM, "migration: out of memory for a %zu-byte staging area",
                           cap * sizeof(float));
        }
        bk->arena_cap = cap;
    }
    *at = bk->arena_used;
    bk->arena_used += floats;
    return 0;
}

/* Post the send (to `peer`) or receive (from `peer`) of one piece of one
 * state buffer, laid out as `sh` in `base`. */
static int post_piece(bucket *bk, float *base, const mal_range_shape *sh, int send, int peer,
                      MPI_Comm comm)
{
    MPI_Count count = sh->rows * sh->width;
    float *buf = base + sh->offset;
    int rc;
    if (sh->rows > 1) {
        size_t at = 0;
        if ((rc = stage_reserve(bk, (size_t)count, &at))) return rc;
        buf = bk->arena + at;
        if (send)
            copy_rows(buf, sh->width, base + sh->offset, sh->stride, sh->rows, sh->width);
        else {
            if (mal_grow(&bk->u, &bk->cap_u, bk->n_u, sizeof *bk->u, 64))
                return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
            bk->u[bk->n_u++] = (unstage){base, *sh, at};
        }
    }
    MPI_Request *req = bucket_slot(bk);
    if (!req) return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
    rc = send ? MPI_Isend_c(buf, count, MPI_FLOAT, peer, TAG_MIGRATE, comm, req)
              : MPI_Irecv_c(buf, count, MPI_FLOAT, peer, TAG_MIGRATE, comm, req);
    if (rc) {
        bk->n--;
        return MAL_MPI_ERR(rc, send ? "migration send" : "migration receive");
    }
    bk->bytes += (size_t)count * sizeof(float);
    return 0;
}

/* Copy one piece of one state buffer from the old part to the new. */
static void copy_piece(const float *from, const mal_range_shape *a, float *to,
                       const mal_range_shape *b)
{
    if (a->rows == 1 && b->rows == 1) {
        memcpy(to + b->offset, from + a->offset, (size_t)a->width * sizeof(float));
        return;
    }
    /* one side strided: both are the same rows x width (a run of the
     * contiguous side is rows x width long) */
    int64_t rows = MAL_MAX(a->rows, b->rows), width = a->rows > 1 ? a->width : b->width;
    copy_rows(to + b->offset, b->rows > 1 ? b->stride : width, from + a->offset,
              a->rows > 1 ? a->stride : width, rows, width);
}

/* Bytes of state (parameters and both Adam moments) in transfer t of gt. */
static double state_bytes(const mal_tensor_info *gt, const transfer *t)
{
    return 3.0 * (double)mal_tensor_range_floats(gt, t->begin, t->end) * sizeof(float);
}

/* Add the bytes of state that the n transfers of tensor gt move between
 * ranks and keep in place. */
static void tally(const mal_tensor_info *gt, const transfer *t, int n, double *moved, double *kept)
{
    for (int i = 0; i < n; i++) {
        double b = state_bytes(gt, &t[i]);
        if (t[i].src == t[i].dst)
            *kept += b;
        else
            *moved += b;
    }
}

/* A transfer this rank takes part in, with its tensor (index into `all`). */
typedef struct {
    int tensor;
    transfer t;
} my_transfer;

/* The transfers of every tensor (in the global order) that involve this
 * rank, and the whole job's totals.  Every rank computes the same lists. */
static int collect_transfers(struct mal_trainer *tr, const mal_plan *old_plan,
                             const mal_tensor_info *all, int n_all, const int *node_of,
                             move_stats *ms, my_transfer **out, int *n_out)
{
    my_transfer *mine = NULL;
    int n_mine = 0, cap = 0, rc = 0;
    for (int i = 0; i < n_all && !rc; i++) {
        transfer *t;
        int n;
        if ((rc = plan_transfers(old_plan, &tr->plan, &all[i], node_of, &t, &n))) break;
        tally(&all[i], t, n, &ms->bytes_moved, &ms->bytes_kept);
        for (int j = 0; j < n && !rc; j++) {
            if (t[j].src != tr->world_rank && t[j].dst != tr->world_rank) continue;
            if (mal_grow(&mine, &cap, n_mine, sizeof *mine, 64))
                rc = MAL_ERR(MAL_ENOMEM, "migration: out of memory");
            else
                mine[n_mine++] = (my_transfer){i, t[j]};
        }
        free(t);
    }
    if (rc) {
        free(mine);
        return rc;
    }
    *out = mine;
    *n_out = n_mine;
    return 0;
}

/* Post this rank's send or receive of transfer t (not a kept piece).
 * `old` / tr->model: this rank's old and new parts. */
static int post_transfer(struct mal_trainer *tr, mal_model *old, const mal_tensor_info *gt,
                         const transfer *t, bucket *bk)
{
    const int send = t->src == tr->world_rank;
    mal_model *m = send ? old : tr->model;
    mal_range_shape sh;
    mal_tensor_range_shape(mal_model_find(m, gt->name), t->begin, t->end, &sh);
    double bytes = state_bytes(gt, t);
    if (send)
        tr->mig_times.bytes_sent += bytes;
    else
        tr->mig_times.bytes_received += bytes;
    MPI_Comm comm = mal_comm_mpi_handle(tr->world);
    int rc = 0;
    for (int g = 0; g < 3 && !rc; g++)
        rc = post_piece(bk, mal_model_state(m, g), &sh, send, send ? t->dst : t->src, comm);
    return rc;
}

int mal_migration_bytes(const mal_plan *from, const mal_plan *to, const mal_model_config *cfg,
                        int ranks_per_node, double *moved, double *kept)
{
    mal_tensor_info *all = NULL;
    int n_all = 0, rc, world = MAL_MAX(mal_plan_world_size(from), mal_plan_world_size(to));
    mal_model_part full = mal_model_part_full(cfg);
    *moved = *kept = 0;
    if ((rc = mal_model_layout(cfg, &full, &all, &n_all, NULL))) return rc;
    int *node_of = malloc(sizeof *node_of * (size_t)(world + 1));
    if (!node_of) {
        free(all);
        return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
    }
    for (int r = 0; r < world; r++)
        node_of[r] = ranks_per_node > 0 ? r / ranks_per_node : 0;
    for (int i = 0; i < n_all && !rc; i++) {
        transfer *t;
        int n;
        if ((rc = plan_transfers(from, to, &all[i], node_of, &t, &n))) break;
        tally(&all[i], t, n, moved, kept);
        free(t);
    }
    free(node_of);
    free(all);
    return rc;
}

/* Rank 0 logs the change: its total and, per phase, the slowest rank's
 * time (and at debug level every rank's).  Collective (a gather after the
 * change is complete, outside its timing). */
static int log_times(struct mal_trainer *tr)
{
    enum { K = 10, STARTED = 8, HANDED = 9 };
    const mal_migration_times *t = &tr->mig_times;
    double mine[K] = {t->total,      t->build,          t->move,       t->wait,    t->wire,
                      t->bytes_sent, t->bytes_received, t->bytes_kept, t->started, t->handed_over};
    double *all = NULL;
    int n = tr->world_size, rc;
    if (tr->world_rank == 0 && !(all = malloc(sizeof *all * K * (size_t)n)))
        return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
    if ((rc = mal_comm_gather(tr->world, mine, all, sizeof mine, 0)) || tr->world_rank) {
        free(all);
        return rc;
    }
    double mx[K] = {0}, first = all[STARTED];
    int slowest = 0;
    for (int r = 1; r < n; r++)
        first = MAL_MIN(first, all[K * r + STARTED]);
    for (int r = 0; r < n; r++) {
        for (int k = 0; k < K; k++)
            mx[k] = MAL_MAX(mx[k], all[K * r + k]);
        if (all[K * r] > all[K * slowest]) slowest = r;
        mal_log(MAL_LOG_DEBUG,
                "  rank %d: %.3f s (started %.3f s after the first rank; new part %.3f, state "
                "%.3f, waiting %.3f, communicators %.3f); sent %.1f MiB, received %.1f MiB, kept "
                "%.1f MiB%s",
                r, all[K * r], all[K * r + STARTED] - first, all[K * r + 1], all[K * r + 2],
                all[K * r + 3], all[K * r + 4], all[K * r + 5] / 1048576.0,
                all[K * r + 6] / 1048576.0, all[K * r + 7] / 1048576.0,
                all[K * r + HANDED] ? " (state buffers handed over, not copied)" : "");
    }
    mal_log(MAL_LOG_INFO,
            "online migration %d at step %lld: %.1f MiB moved, %.1f MiB kept in place, %.3f s "
            "(slowest rank %d; per phase, slowest rank: new part %.3f s, state %.3f s, waiting "
            "%.3f s, communicators and buffers %.3f s; most sent by one rank %.1f MiB, received "
            "%.1f MiB)",
            tr->migrations, (long long)tr->step, tr->migrated_bytes / 1048576.0,
            tr->kept_bytes / 1048576.0, mx[0], slowest, mx[1], mx[2], mx[3], mx[4],
            mx[5] / 1048576.0, mx[6] / 1048576.0);
    free(all);
    return 0;
}

/* Move the running job onto `next` (validated by the caller; same on every
 * rank).  Collective. */
int mal_trainer_change_plan(struct mal_trainer *tr, const mal_plan *next_in)
{
    mal_plan next, old_plan;
    double t0 = mal_now();
    int rc;
    if (!tr->world) return MAL_ERR(MAL_EINVAL, "a plan change needs MPI");
    if ((rc = mal_plan_copy(&next, next_in))) return rc;
    if ((rc = mal_plan_validate(&next, tr->world_size, tr->o.model.n_layers, tr->o.model.n_heads,
                                tr->o.model.ffn_hidden, tr->o.global_batch))) {
        mal_plan_fini(&next);
        return rc;
    }
    /* Take the old part out of service, build the new one, move the state. */
    mal_model *old = tr->model;
    mal_trainer_unwire_part(tr);
    /* The old part is only read from now: its gradients and scratch go
     * first, so the peak is old state + new part, and the new part can
     * reuse memory just given back instead of fresh pages. */
    mal_model_release_work(old);
    tr->model = NULL;
    old_plan = tr->plan;
    tr->plan = next;
    mal_tensor_info *all = NULL;
    int n_all = 0, *node_of = NULL;
    move_stats ms = {0, 0};
    int handed = 0; /* this rank's state buffers went to the new part */
    memset(&tr->mig_times, 0, sizeof tr->mig_times);
    tr->no_init = 1;
    rc = mal_trainer_build_part(tr);
    tr->no_init = 0;
    if (rc) goto out;
    /* A rank whose new part begins with its old one - the same part (a
     * pipeline the change leaves alone) or one extended by later layers -
     * hands its state buffers over instead of copying them, grown to the
     * new size (the CPU backend remaps the pages: no copy); the new part's
     * fresh, untouched buffers go with the old part. */
    if (old && tr->model && mal_model_extends(old, tr->model)) {
        size_t old_bytes = old->n_params * sizeof(float),
               new_bytes = tr->model->n_params * sizeof(float);
        for (int g = 0; g < MAL_STATE_N_SAVED; g++) {
            float **a = mal_model_state_ref(old, g), **b = mal_model_state_ref(tr->model, g);
            float *x = *a;
            if (new_bytes != old_bytes && !(x = mal_kern_resize(old->k, x, old_bytes, new_bytes))) {
                /* groups before g were handed over already: no way back */
                rc = MAL_ERR(MAL_ENOMEM, "migration: cannot grow the state buffers to %zu bytes",
                             new_bytes);
                goto out;
            }
            *a = *b;
            *b = x;
        }
        mal_model_rebind_views(tr->model);
        handed = 1;
    }
    tr->mig_times.handed_over = handed;
    mal_model_part full = mal_model_part_full(&tr->o.model);
    if ((rc = mal_model_layout(&tr->o.model, &full, &all, &n_all, NULL))) goto out;
    node_of = malloc(sizeof *node_of * (size_t)tr->world_size);
    if (!node_of) {
        rc = MAL_ERR(MAL_ENOMEM, "migration: out of memory");
        goto out;
    }
    int rpn = tr->o.ranks_per_node > 0 ? tr->o.ranks_per_node : tr->world_size;
    for (int r = 0; r < tr->world_size; r++)
        node_of[r] = r / rpn;
    double t_build = mal_now() - t0, t_move = mal_now();
    bucket direct = {0}, bk = {0};
    my_transfer *mine = NULL;
    int n_mine = 0;
    rc = collect_transfers(tr, &old_plan, all, n_all, node_of, &ms, &mine, &n_mine);
    /* A part that begins with the old one took over its state buffers:
     * what this rank sends is read from the new part, what it keeps is in
     * place already. */
    mal_model *src_part = handed ? tr->model : old;
    /* Pass 1 posts every piece that is contiguous on both sides, straight
     * from and into the parts: no memory, no waiting, so peers can pull what
     * this rank sends at once.  Pass 2 posts the others (staged where
     * strided on this rank), in global order, waiting (flushing) only for
     * pass-2 messages, each matched by the peer's pass-2 message at the same
     * place in the order, which the peer reaches unless it waits at an
     * earlier place - no cycle.  Pass-1 messages are waited for last.  Both
     * ends post every pair's messages in the same order (pass, then global
     * order), so they match in order. */
    for (int pass = 1; pass <= 2; pass++)
        for (int i = 0; i < n_mine && !rc; i++) {
            const transfer *t = &mine[i].t;
            if (t->src != t->dst && t->direct == (pass == 1))
                rc =
                    post_transfer(tr, src_part, &all[mine[i].tensor], t, pass == 1 ? &direct : &bk);
        }
    /* What stays on this rank is copied while the peers pull what it sends. */
    for (int i = 0; i < n_mine && !rc; i++) {
        const transfer *t = &mine[i].t;
        if (t->src != t->dst) continue;
        const mal_tensor_info *gt = &all[mine[i].tensor];
        tr->mig_times.bytes_kept += state_bytes(gt, t);
        if (handed) continue;
        mal_range_shape a, b;
        mal_tensor_range_shape(mal_model_find(old, gt->name), t->begin, t->end, &a);
        mal_tensor_range_shape(mal_model_find(tr->model, gt->name), t->begin, t->end, &b);
        for (int g = 0; g < 3; g++)
            copy_piece(mal_model_state(old, g), &a, mal_model_state(tr->model, g), &b);
    }
    if (!rc) rc = bucket_flush(&bk);
    if (!rc) rc = bucket_flush(&direct);
    bucket_fini(&bk);
    bucket_fini(&direct);
    free(mine);
    if (rc) goto out;
    /* the parameters arrived in the master copy (fp32) */
    if (!handed && tr->model) mal_model_refresh_working(tr->model);
    t_move = mal_now() - t_move;
    /* Timed separately so the log tells this rank's own copying from waiting
     * for the slowest rank to finish receiving. */
    double t_wait = mal_now();
    if ((rc = mal_comm_barrier(tr->world))) goto out;
    t_wait = mal_now() - t_wait;
    double t_wire = mal_now();
    if ((rc = mal_trainer_wire_part(tr))) goto out;
    t_wire = mal_now() - t_wire;
    tr->migrations++;
    tr->mig_times.total = mal_now() - t0;
    tr->mig_times.started = t0;
    tr->mig_times.build = t_build;
    tr->mig_times.move = t_move;
    tr->mig_times.wait = t_wait;
    tr->mig_times.wire = t_wire;
    tr->migrated_bytes = ms.bytes_moved;
    tr->kept_bytes = ms.bytes_kept;
    rc = log_times(tr);
out:
    free(node_of);
    free(all);
    mal_model_destroy(old);
    mal_plan_fini(&old_plan);
    return rc;
}

int mal_trainer_replan_online(struct mal_trainer *tr)
{
    mal_plan next;
    int changed = 0, rc;
    if (!tr->world) return 0; /* one rank: nothing to re-plan */
    mal_plan_init(&next);
    if (!(rc = agree_on_plan(tr, &next, &changed)) && changed)
        rc = mal_trainer_change_plan(tr, &next);
    mal_plan_fini(&next);
    /* The rates the (new or kept) plan stands for become the baseline. */
    if (!rc && tr->world_rank == 0) {
        double *means = malloc(sizeof *means * (size_t)tr->world_size);
        if (!means) return MAL_ERR(MAL_ENOMEM, "re-plan: out of memory");
        mal_policy_means(tr->policy, means);
        rc = mal_monitor_set_plan(tr, means);
        free(means);
    }
    return rc;
}
