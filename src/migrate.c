/* The online fast path's state mover: move a part's state (parameters,
 * Adam m and v) rank to rank from the layout of one plan onto another's,
 * without touching disk.
 *
 * Tensor by tensor in the global order, every rank computes from the old
 * and the new plan the finest common partition of the tensor's holdings
 * (slices.h): a piece a new holder already held is copied in place; any
 * other piece is sent by one old holder - one on the receiver's node when
 * there is one, spread round-robin over the candidates - and received.
 * Contiguous pieces go straight from the old part's buffers into the new
 * part's (no staging copy) and are all posted first; strided ones (a TP
 * size change) follow through a bounded staging area.  Every byte moves
 * through the comm data plane (transfers) or the kernel table's strided
 * copy (tensor pieces, piece.h): the state may live in device memory.  All
 * replicas receive copies of the same bytes, so they stay bitwise
 * identical.
 *
 * Core layer: plan, layout, slices, model, tensor pieces, comm.  The
 * trainer (train/online.c) decides the new plan, builds the new part
 * and wires it; this module only moves state between two parts. */
#include "migrate.h"

#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "layout.h"
#include "piece.h"
#include "slices.h"

enum { TAG_MIGRATE = 7 };

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
                          const mal_model_config *cfg, const mal_tensor_info *gt,
                          const int *node_of, transfer **out, int *n_out)
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
    int nh = mal_layout_holdings(old_plan, cfg, gt, h);
    for (int i = 0; i < nh; i++)
        h[i].group = 0;
    int nh2 = mal_layout_holdings(new_plan, cfg, gt, h + nh);
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

/* Messages in flight, waited for together (a flush).  A piece that is
 * contiguous on this rank goes straight from the old part's state or into
 * the new part's.  A strided one (a column range of a matrix: a TP size
 * change) is packed into, or received into, a staging arena (a device
 * buffer) and copied out after the flush, which comes whenever the arena
 * is full: MPI's own non-contiguous path measured 2-2.5x slower here than
 * one contiguous transfer plus one local copy.  (Why the flushes cannot
 * deadlock: see mal_migrate_state.)  Each bucket's messages are posted as
 * one data-plane group. */
size_t mal_migrate_stage_bytes = (size_t)64 << 20;
typedef struct {
    float *dst; /* the new part's buffer */
    mal_piece_shape sh;
    size_t at; /* arena offset (floats) */
} unstage;
typedef struct {
    mal_comm *comm;
    mal_kern k;
    mal_comm_req **reqs;
    int n, cap;
    int grouped;       /* a data-plane group is open */
    float *arena;      /* device: staging for strided pieces */
    size_t arena_cap;  /* floats allocated */
    size_t arena_used; /* floats in use by this bucket */
    unstage *u;        /* received pieces to copy out after the flush */
    int n_u, cap_u;
    size_t want; /* floats this rank stages over the whole migration: the
                  * arena never needs more (0: unknown) */
} bucket;

static int bucket_open(bucket *bk)
{
    if (bk->grouped) return 0;
    bk->grouped = 1;
    return mal_comm_dp_group_start(bk->comm);
}

static int bucket_close(bucket *bk)
{
    if (!bk->grouped) return 0;
    bk->grouped = 0;
    return mal_comm_dp_group_end(bk->comm);
}

static int bucket_flush(bucket *bk)
{
    int rc = bucket_close(bk);
    int rc2 = mal_comm_dp_waitall(bk->comm, bk->n, bk->reqs);
    if (!rc) rc = rc2;
    if (!rc)
        for (int i = 0; i < bk->n_u; i++) {
            const unstage *u = &bk->u[i];
            mal_piece_shape packed = {u->at, 1, u->sh.rows * u->sh.width, u->sh.rows * u->sh.width};
            mal_piece_copy(bk->k, u->dst, &u->sh, bk->arena, &packed);
        }
    bk->n = bk->n_u = 0;
    bk->arena_used = 0;
    return rc; /* on failure the job stops; what is in flight goes with it */
}

static void bucket_fini(bucket *bk)
{
    free(bk->reqs);
    free(bk->u);
    if (bk->arena) mal_kern_free(bk->k, bk->arena);
}

/* Room for `floats` in the staging arena (flushing first when the bucket's
 * pieces fill it); *at is where they go. */
static int stage_reserve(bucket *bk, size_t floats, size_t *at)
{
    int rc;
    if (bk->arena_used + floats > bk->arena_cap && bk->arena_used) {
        if ((rc = bucket_flush(bk))) return rc;
        if ((rc = bucket_open(bk))) return rc;
    }
    if (floats > bk->arena_cap) {
        /* empty now: grow to the larger of a piece and the limit, or of
         * all this rank stages where that is less (a small change then
         * does not hold the whole limit) */
        size_t limit = mal_migrate_stage_bytes / sizeof(float);
        if (bk->want && bk->want < limit) limit = bk->want;
        size_t cap = MAL_MAX(floats, limit);
        if (bk->arena) mal_kern_free(bk->k, bk->arena);
        if (!(bk->arena = mal_kern_alloc_as(bk->k, cap * sizeof(float), MAL_MEM_STAGING))) {
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
static int post_piece(bucket *bk, float *base, const mal_piece_shape *sh, int send, int peer)
{
    size_t count = (size_t)(sh->rows * sh->width);
    float *buf = base + sh->offset;
    int rc;
    if ((rc = bucket_open(bk))) return rc;
    if (sh->rows > 1) {
        size_t at = 0;
        if ((rc = stage_reserve(bk, count, &at))) return rc;
        buf = bk->arena + at;
        mal_piece_shape packed = {at, 1, (int64_t)count, (int64_t)count};
        if (send)
            mal_piece_copy(bk->k, bk->arena, &packed, base, sh);
        else {
            if (mal_grow(&bk->u, &bk->cap_u, bk->n_u, sizeof *bk->u, 64))
                return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
            bk->u[bk->n_u++] = (unstage){base, *sh, at};
        }
    }
    if (mal_grow(&bk->reqs, &bk->cap, bk->n, sizeof *bk->reqs, 64))
        return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
    mal_comm_req **req = &bk->reqs[bk->n];
    rc = send ? mal_comm_dp_isend(bk->comm, bk->k, buf, count * sizeof(float), peer, TAG_MIGRATE,
                                  req)
              : mal_comm_dp_irecv(bk->comm, bk->k, buf, count * sizeof(float), peer, TAG_MIGRATE,
                                  req);
    if (!rc) bk->n++;
    return rc;
}

/* Bytes of state (parameters and both Adam moments) in transfer t of gt. */
static double state_bytes(const mal_tensor_info *gt, const transfer *t)
{
    return 3.0 * (double)mal_piece_floats(gt, t->begin, t->end) * sizeof(float);
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

/* The transfers of every tensor (in the global order) that involve `rank`,
 * and the whole job's totals.  Every rank computes the same lists. */
static int collect_transfers(int rank, const mal_plan *old_plan, const mal_plan *new_plan,
                             const mal_model_config *cfg, const mal_tensor_info *all, int n_all,
                             const int *node_of, mal_migrate_stats *ms, my_transfer **out,
                             int *n_out)
{
    my_transfer *mine = NULL;
    int n_mine = 0, cap = 0, rc = 0;
    for (int i = 0; i < n_all && !rc; i++) {
        transfer *t;
        int n;
        if ((rc = plan_transfers(old_plan, new_plan, cfg, &all[i], node_of, &t, &n))) break;
        tally(&all[i], t, n, &ms->moved, &ms->kept);
        for (int j = 0; j < n && !rc; j++) {
            if (t[j].src != rank && t[j].dst != rank) continue;
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

/* Floats of transfer t of global tensor gt that this rank stages: all of
 * the state groups' pieces where the piece is strided on its side. */
static size_t staged_floats(int rank, mal_model *from, mal_model *to, const mal_tensor_info *gt,
                            const transfer *t)
{
    mal_piece_shape sh;
    mal_piece_locate(mal_model_find(t->src == rank ? from : to, gt->name), t->begin, t->end, &sh);
    return sh.rows > 1 ? (size_t)(sh.rows * sh.width) * MAL_STATE_N_SAVED : 0;
}

/* Post this rank's send or receive of transfer t (not a kept piece) of
 * global tensor gt, from part `from` or into part `to`. */
static int post_transfer(int rank, mal_model *from, mal_model *to, const mal_tensor_info *gt,
                         const transfer *t, bucket *bk, mal_migrate_stats *ms)
{
    const int send = t->src == rank;
    mal_model *m = send ? from : to;
    mal_piece_shape sh;
    mal_piece_locate(mal_model_find(m, gt->name), t->begin, t->end, &sh);
    double bytes = state_bytes(gt, t);
    if (send)
        ms->sent += bytes;
    else
        ms->received += bytes;
    int rc = 0;
    for (int g = 0; g < MAL_STATE_N_SAVED && !rc; g++)
        rc = post_piece(bk, mal_model_state(m, g), &sh, send, send ? t->dst : t->src);
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
        if ((rc = plan_transfers(from, to, cfg, &all[i], node_of, &t, &n))) break;
        tally(&all[i], t, n, moved, kept);
        free(t);
    }
    free(node_of);
    free(all);
    return rc;
}

int mal_migrate_hand_over(mal_model *old, mal_model *next, int *handed)
{
    *handed = 0;
    if (!old || !next || !mal_model_extends(old, next)) return 0;
    size_t old_bytes = old->n_params * sizeof(float), new_bytes = next->n_params * sizeof(float);
    for (int g = 0; g < MAL_STATE_N_SAVED; g++) {
        float **a = mal_model_state_ref(old, g), **b = mal_model_state_ref(next, g);
        float *x = *a;
        if (new_bytes != old_bytes && !(x = mal_kern_resize(old->k, x, old_bytes, new_bytes)))
            /* groups before g were handed over already: no way back */
            return MAL_ERR(MAL_ENOMEM, "migration: cannot grow the state buffers to %zu bytes",
                           new_bytes);
        *a = *b;
        *b = x;
    }
    mal_model_rebind_views(next);
    *handed = 1;
    return 0;
}

int mal_migrate_state(mal_comm *comm, mal_kern k, const mal_model_config *cfg,
                      const mal_plan *old_plan, mal_model *old, const mal_plan *new_plan,
                      mal_model *next, int ranks_per_node, int handed, mal_migrate_stats *ms)
{
    const int rank = comm->rank, world = comm->size;
    mal_tensor_info *all = NULL;
    int n_all = 0, *node_of = NULL, rc;
    my_transfer *mine = NULL;
    int n_mine = 0;
    bucket direct = {.comm = comm, .k = k}, bk = {.comm = comm, .k = k};
    memset(ms, 0, sizeof *ms);
    /* every rank walks every tensor, with or without a part: the totals
     * are the whole job's */
    mal_model_part full = mal_model_part_full(cfg);
    if ((rc = mal_model_layout(cfg, &full, &all, &n_all, NULL))) goto out;
    if (!(node_of = malloc(sizeof *node_of * (size_t)world))) {
        rc = MAL_ERR(MAL_ENOMEM, "migration: out of memory");
        goto out;
    }
    int rpn = ranks_per_node > 0 ? ranks_per_node : world;
    for (int r = 0; r < world; r++)
        node_of[r] = r / rpn;
    if ((rc = collect_transfers(rank, old_plan, new_plan, cfg, all, n_all, node_of, ms, &mine,
                                &n_mine)))
        goto out;
    /* A part that begins with the old one took over its state buffers:
     * what this rank sends is read from the new part, what it keeps is in
     * place already. */
    mal_model *from = handed ? next : old;
    for (int i = 0; i < n_mine; i++) {
        const transfer *t = &mine[i].t;
        if (t->src != t->dst && !t->direct)
            bk.want += staged_floats(rank, from, next, &all[mine[i].tensor], t);
    }
    /* Pass 1 posts every piece that is contiguous on both sides, straight
     * from and into the parts: no memory, no waiting, so peers can pull what
     * this rank sends at once.  Pass 2 posts the others (staged where
     * strided on this rank), in global order, waiting (flushing) only for
     * pass-2 messages, each matched by the peer's pass-2 message at the same
     * place in the order, which the peer reaches unless it waits at an
     * earlier place - no cycle.  Pass-1 messages are waited for last.  Both
     * ends post every pair's messages in the same order (pass, then global
     * order), so they match in order. */
    for (int pass = 1; pass <= 2; pass++) {
        for (int i = 0; i < n_mine && !rc; i++) {
            const transfer *t = &mine[i].t;
            if (t->src != t->dst && t->direct == (pass == 1))
                rc = post_transfer(rank, from, next, &all[mine[i].tensor], t,
                                   pass == 1 ? &direct : &bk, ms);
        }
        /* pass 1 is one group: posted before pass 2 waits for anything */
        if (!rc && pass == 1) rc = bucket_close(&direct);
    }
    /* What stays on this rank is copied while the peers pull what it sends. */
    for (int i = 0; i < n_mine && !rc; i++) {
        const transfer *t = &mine[i].t;
        if (t->src != t->dst) continue;
        const mal_tensor_info *gt = &all[mine[i].tensor];
        ms->kept_here += state_bytes(gt, t);
        if (handed) continue;
        mal_piece_shape a, b;
        mal_piece_locate(mal_model_find(old, gt->name), t->begin, t->end, &a);
        mal_piece_locate(mal_model_find(next, gt->name), t->begin, t->end, &b);
        for (int g = 0; g < MAL_STATE_N_SAVED; g++)
            mal_piece_copy(k, mal_model_state(next, g), &b, mal_model_state(old, g), &a);
    }
    if (!rc) rc = bucket_flush(&bk);
    if (!rc) rc = bucket_flush(&direct);
    /* The parameters arrived in the master copy (fp32): the working copy
     * (bf16 compute) is made from it now, also where the state buffers
     * were handed over - the hand-over's refresh ran before the later
     * layers of an extended part arrived, so theirs would hold the new
     * part's initial values for one step. */
    if (!rc && next) mal_model_refresh_working(next);
    if (!rc) rc = mal_kern_sync(k);
out:
    bucket_fini(&bk);
    bucket_fini(&direct);
    free(mine);
    free(node_of);
    free(all);
    return rc;
}
