/* Data-parallel gradient sum over replicas that shard parameters
 * differently (gradsync.h). */
#include "gradsync.h"

#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "layout.h"
#include "optim.h"
#include "piece.h"
#include "slices.h"

/* Tags of the sync's messages on its communicator: the blocking
 * reductions (the sync after the backward pass, the replica check) and
 * the overlapped buckets, kept apart (comm.h: a distinct tag where both
 * kinds are used on one communicator). */
enum { TAG_SYNC = 1, TAG_BUCKET = 2, TAG_ZERO = 3 };

/* One piece of a tensor that this rank sums with other replicas. */
typedef struct {
    int tensor;         /* index into the model's tensor table */
    int64_t begin, end; /* along the tensor's axis, global coordinates */
    int contribute;     /* 1: this rank's gradient is its replica's share; 0: send zeros */
} sync_piece;

/* All pieces shared by one set of ranks: one reduction over their packed
 * buffer. */
typedef struct {
    int *ranks; /* world ranks, ascending */
    int n_ranks;
    int n_pieces, cap;
    sync_piece *pieces;
    size_t n_floats;
} sync_group;

/* A range of a tensor whose gradient this rank counts in the global norm
 * (every element is counted by exactly one rank). */
typedef struct {
    int tensor;
    int64_t begin, end;
    int synced; /* a piece summed over its holders (a group's) */
} norm_range;

/* Consecutive pieces of one holder set reduced together while the
 * backward pass goes on (mal_gradsync_buckets). */
typedef struct {
    int group;           /* its holder set: index into groups */
    int first, n_pieces; /* its pieces: bpieces[first .. first+n_pieces) */
    size_t off, n_floats; /* its region of bbuf */
    int ready_layer;     /* model layer (mal_tensor_info.layer) whose
                          * gradients are the last of its pieces to become
                          * final in the backward pass */
    mal_comm_req *req;   /* in flight between post and finish */
} sync_bucket;

/* What the sharded optimizer reduce-scatters and gathers as one: a holder
 * set's pieces (without buckets) or a bucket's.  Its packed buffer is cut
 * into a region per member (counts[n_ranks], in the order of the ranks);
 * this rank's is [r_off, r_off + r_len), its gradient sum and moments at
 * s_off of the shard buffers. */
typedef struct {
    const int *ranks;
    int n_ranks;
    const sync_piece *pieces;
    int n_pieces;
    size_t n_floats;
    float *buf; /* its region of the buckets' buffer; NULL: the shared g->buf */
    size_t *counts;
    size_t r_off, r_len, s_off;
    mal_comm_req *req; /* the all-gather in flight */
} zero_unit;

struct mal_gradsync {
    mal_model *m;
    mal_comm *comm;
    int n_groups;
    sync_group *groups;
    float *buf;        /* device: the packed pieces of the largest group (x2 for the replica
                        * check); allocated on first use */
    size_t buf_floats; /* floats of buf */
    /* overlap (mal_gradsync_buckets): buckets in the global order, their
     * pieces, one device buffer with a region per bucket */
    int n_buckets, next_bucket, lists_made;
    int posted_early; /* buckets the last step posted from the hooks, before finish */
    sync_bucket *buckets;
    sync_piece *bpieces;
    float *bbuf;
    size_t bbuf_floats;
    int n_norm, cap_norm;
    norm_range *norm;
    double *norm_acc; /* device: one double */
    /* the pieces this rank holds that no group sums: it steps them alone */
    int n_local, cap_local;
    sync_piece *local;
    /* the sharded optimizer (mal_gradsync_zero): the Adam moments of the
     * owned regions then of the local pieces (zm, zv, z_floats; the
     * regions' zg_floats first); the owned regions' gradient sums stay in
     * the buckets' regions, or without buckets (every unit shares g->buf)
     * are copied to the device shard zg (zg_floats) */
    int zero;
    int n_units; /* the buckets' when there are buckets, else the groups' */
    zero_unit *units;
    float *zg, *zm, *zv;
    size_t zg_floats, z_floats;
    /* the sharded master (mal_gradsync_zero_master): the fp32 parameters
     * of the same regions and local pieces, at the moments' offsets
     * (z_floats); NULL while m->params is whole */
    float *zp;
};

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* The group of exactly these (sorted) ranks, added when new. */
static int group_of(mal_gradsync *g, const int *rk, int n, int *cap, sync_group **out)
{
    for (int i = 0; i < g->n_groups; i++)
        if (g->groups[i].n_ranks == n && !memcmp(g->groups[i].ranks, rk, sizeof *rk * (size_t)n)) {
            *out = &g->groups[i];
            return 0;
        }
    if (mal_grow(&g->groups, cap, g->n_groups, sizeof *g->groups, 8))
        return MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    sync_group *s = &g->groups[g->n_groups];
    memset(s, 0, sizeof *s);
    if (!(s->ranks = malloc(sizeof *rk * (size_t)n)))
        return MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    memcpy(s->ranks, rk, sizeof *rk * (size_t)n);
    s->n_ranks = n;
    g->n_groups++;
    *out = s;
    return 0;
}

/* Walk every tensor's finest common partition: the norm ranges this rank
 * counts and the pieces it sums, by holder set.  The groups come out in
 * the order they first appear in the global tensor order: every member
 * runs its reductions in that order, so messages between two ranks match
 * in order and no wait forms a cycle. */
static int plan_pieces(mal_gradsync *g, const mal_plan *plan, int rank)
{
    mal_model *m = g->m;
    int rc = 0, max_h = 0, cap_groups = 0;
    mal_slice_map map = {0};
    for (int p = 0; p < plan->n_pipelines; p++)
        for (int s = 0; s < plan->pipelines[p].n_stages; s++)
            max_h += plan->pipelines[p].stages[s].n_ranks;
    mal_slice_holding *h = malloc(sizeof *h * (size_t)(max_h + 1));
    int *rk = malloc(sizeof *rk * (size_t)(max_h + 1));
    if (!h || !rk) {
        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
        goto out;
    }
    for (int ti = 0; ti < m->n_tensors && !rc; ti++) {
        const mal_tensor_info *t = &m->tensors[ti];
        int nh = mal_layout_holdings(plan, &m->cfg, t, h);
        if ((rc = mal_slices_partition(h, nh, t->shape[t->axis], &map))) break;
        for (int pi = 0; pi < map.n_pieces && !rc; pi++) {
            const mal_slice_piece *pc = &map.pieces[pi];
            const int *hi = map.holders + pc->first;
            /* One contribution per distinct gradient: the first holder of
             * each (pipeline, sub) -- sub tells the copies of one gradient
             * (a norm weight on every rank of a TP group) from the parts
             * of one (a key/value head that TP ranks share, a tied
             * embedding on two stages), slices.h.  Holders come sorted by
             * pipeline, so a pipeline's holders are adjacent. */
            int me = -1, n_contrib = 0, contribute = 0, group_start = 0;
            for (int j = 0; j < pc->n_holders; j++) {
                const mal_slice_holding *x = &h[hi[j]];
                if (j > 0 && x->group != h[hi[j - 1]].group) group_start = j;
                int first = 1;
                for (int i = group_start; i < j && first; i++)
                    first = h[hi[i]].sub != x->sub;
                n_contrib += first;
                if (x->rank == rank) {
                    me = j;
                    contribute = first;
                }
            }
            if (me < 0) continue;
            if (me == 0) { /* first holder overall counts it in the norm */
                if (mal_grow(&g->norm, &g->cap_norm, g->n_norm, sizeof *g->norm, 32)) {
                    rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                    break;
                }
                g->norm[g->n_norm++] = (norm_range){ti, pc->begin, pc->end, n_contrib >= 2};
            }
            if (n_contrib < 2) { /* copies of one gradient: nothing to sum */
                if (mal_grow(&g->local, &g->cap_local, g->n_local, sizeof *g->local, 32)) {
                    rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                    break;
                }
                /* contribute: here, whether this rank writes its moments
                 * in a snapshot (the first holder, as for the norm) */
                g->local[g->n_local++] = (sync_piece){ti, pc->begin, pc->end, me == 0};
                continue;
            }
            for (int j = 0; j < pc->n_holders; j++)
                rk[j] = h[hi[j]].rank;
            qsort(rk, (size_t)pc->n_holders, sizeof *rk, cmp_int);
            sync_group *s = NULL;
            if ((rc = group_of(g, rk, pc->n_holders, &cap_groups, &s))) break;
            if (mal_grow(&s->pieces, &s->cap, s->n_pieces, sizeof *s->pieces, 8)) {
                rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                break;
            }
            s->pieces[s->n_pieces++] = (sync_piece){ti, pc->begin, pc->end, contribute};
            s->n_floats += mal_piece_floats(t, pc->begin, pc->end);
        }
        mal_slices_fini(&map);
    }
out:
    mal_slices_fini(&map);
    free(h);
    free(rk);
    return rc;
}

int mal_gradsync_create(mal_gradsync **out, const mal_plan *plan, int rank, mal_model *m,
                        mal_comm *comm)
{
    *out = NULL;
    mal_gradsync *g = calloc(1, sizeof *g);
    if (!g) return MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    g->m = m;
    g->comm = comm;
    int rc = plan_pieces(g, plan, rank);
    if (!rc && g->n_groups && !comm)
        rc = MAL_ERR(MAL_EINVAL, "gradient sync: replicas to sum but no communicator");
    size_t max_floats = 0;
    for (int i = 0; i < g->n_groups; i++)
        max_floats = MAL_MAX(max_floats, g->groups[i].n_floats);
    /* the replica check packs each group twice (values and negated values) */
    g->buf_floats = 2 * max_floats;
    if (!rc && !(g->norm_acc = mal_kern_alloc_as(m->k, sizeof(double), MAL_MEM_COMM)))
        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    if (rc) {
        mal_gradsync_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

void mal_gradsync_destroy(mal_gradsync *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_units; i++) {
        if (g->units[i].req) mal_comm_dp_waitall(g->comm, 1, &g->units[i].req);
        free(g->units[i].counts);
    }
    free(g->units);
    for (int i = 0; i < g->n_groups; i++) {
        free(g->groups[i].pieces);
        free(g->groups[i].ranks);
    }
    free(g->local);
    mal_kern_free(g->m->k, g->zg);
    mal_kern_free(g->m->k, g->zm);
    mal_kern_free(g->m->k, g->zv);
    mal_kern_free(g->m->k, g->zp);
    free(g->groups);
    /* buckets still in flight (only after an error): waited for, so that
     * no reduction is left writing into freed memory */
    for (int b = 0; b < g->n_buckets; b++)
        if (g->buckets[b].req) mal_comm_dp_waitall(g->comm, 1, &g->buckets[b].req);
    free(g->buckets);
    free(g->bpieces);
    if (g->bbuf) mal_kern_free(g->m->k, g->bbuf);
    if (g->buf) mal_kern_free(g->m->k, g->buf);
    if (g->norm_acc) mal_kern_free(g->m->k, g->norm_acc);
    free(g->norm);
    free(g);
}

size_t mal_gradsync_floats(const mal_gradsync *g)
{
    size_t n = 0;
    for (int i = 0; i < g->n_groups; i++)
        n += g->groups[i].n_floats;
    return n;
}

/* Pack `n_pieces` pieces of state buffer `base` into dst (device); a
 * piece this rank does not contribute is zeros when `zeros` is set. */
static void pack_group(mal_gradsync *g, const sync_piece *pieces, int n_pieces, const float *base,
                       float *dst, int zeros)
{
    mal_model *m = g->m;
    for (int i = 0; i < n_pieces; i++) {
        const sync_piece *p = &pieces[i];
        const mal_tensor_info *t = &m->tensors[p->tensor];
        size_t n = mal_piece_floats(t, p->begin, p->end);
        if (zeros && !p->contribute)
            mal_kern_zero(m->k, dst, n * sizeof(float));
        else
            mal_piece_pack(m->k, t, base, p->begin, p->end, dst, MAL_COPY_D2D);
        dst += n;
    }
}

/* g->buf, allocated the first time a blocking path needs it (the
 * overlapped sync does not, so it costs no memory there until a replica
 * check runs). */
static int need_buf(mal_gradsync *g)
{
    if (g->buf || !g->buf_floats) return 0;
    if (!(g->buf = mal_kern_alloc_as(g->m->k, g->buf_floats * sizeof(float), MAL_MEM_COMM)))
        return MAL_ERR(MAL_ENOMEM, "gradient sync: cannot allocate %zu floats", g->buf_floats);
    return 0;
}

/* Packed `n` pieces at src back into state buffer `base`. */
static void unpack_into(mal_gradsync *g, const sync_piece *pieces, int n, const float *src,
                        float *base)
{
    mal_model *m = g->m;
    for (int i = 0; i < n; i++) {
        const sync_piece *p = &pieces[i];
        const mal_tensor_info *t = &m->tensors[p->tensor];
        mal_piece_unpack(m->k, t, base, p->begin, p->end, src, MAL_COPY_D2D);
        src += mal_piece_floats(t, p->begin, p->end);
    }
}

/* Packed `n` pieces at src back into the gradients. */
static void unpack_pieces(mal_gradsync *g, const sync_piece *pieces, int n, const float *src)
{
    unpack_into(g, pieces, n, src, g->m->grads);
}

int mal_gradsync_run(mal_gradsync *g)
{
    mal_model *m = g->m;
    int rc;
    if ((rc = need_buf(g))) return rc;
    for (int si = 0; si < g->n_groups; si++) {
        const sync_group *s = &g->groups[si];
        pack_group(g, s->pieces, s->n_pieces, m->grads, g->buf, 1);
        if ((rc = mal_comm_dp_allreduce_list(g->comm, m->k, s->ranks, s->n_ranks, TAG_SYNC, g->buf,
                                             s->n_floats, MAL_F32, MAL_OP_SUM)))
            return rc;
        unpack_pieces(g, s->pieces, s->n_pieces, g->buf);
    }
    return 0;
}

/* ---- overlapped: buckets posted during the backward pass ---------------- */

/* Order of pieces in the backward pass: later tensors of the table first
 * (the table is in forward order: embedding, layers, final norm, head),
 * the pieces of one tensor by their start.  Every rank's table is in the
 * global tensor order, so this is one global order restricted to what a
 * rank holds. */
static int before(const sync_piece *a, const sync_piece *b)
{
    return a->tensor != b->tensor ? a->tensor > b->tensor : a->begin < b->begin;
}

static int cmp_bucket(const sync_bucket *a, const sync_bucket *b, const sync_piece *bp)
{
    const sync_piece *la = &bp[a->first + a->n_pieces - 1], *lb = &bp[b->first + b->n_pieces - 1];
    return before(la, lb) ? -1 : before(lb, la) ? 1 : 0;
}

/* qsort has no context argument in C11: buckets are few (tens to
 * thousands), so an insertion sort does. */
static void sort_buckets(sync_bucket *b, int n, const sync_piece *bp)
{
    for (int i = 1; i < n; i++) {
        sync_bucket x = b[i];
        int j = i;
        for (; j > 0 && cmp_bucket(&b[j - 1], &x, bp) > 0; j--)
            b[j] = b[j - 1];
        b[j] = x;
    }
}

int mal_gradsync_buckets(mal_gradsync *g, size_t cap_bytes)
{
    mal_model *m = g->m;
    if (g->zero)
        return MAL_ERR(MAL_EINVAL, "gradient sync: the buckets are cut before the sharded "
                                   "optimizer's regions, not after");
    size_t n_pieces = 0, total = 0;
    for (int si = 0; si < g->n_groups; si++)
        n_pieces += (size_t)g->groups[si].n_pieces, total += g->groups[si].n_floats;
    free(g->buckets);
    free(g->bpieces);
    g->buckets = NULL;
    g->n_buckets = 0;
    if (!n_pieces) return 0;
    /* at most one bucket per piece */
    g->bpieces = malloc(n_pieces * sizeof *g->bpieces);
    g->buckets = calloc(n_pieces, sizeof *g->buckets);
    if (!g->bpieces || !g->buckets) return MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    int at = 0;
    for (int si = 0; si < g->n_groups; si++) {
        const sync_group *s = &g->groups[si];
        /* the group's pieces in backward order: they were collected in
         * table order, pieces of a tensor by their start */
        int first = at;
        for (int hi = s->n_pieces; hi > 0;) {
            int lo = hi - 1;
            while (lo > 0 && s->pieces[lo - 1].tensor == s->pieces[hi - 1].tensor) lo--;
            for (int i = lo; i < hi; i++) g->bpieces[at++] = s->pieces[i];
            hi = lo;
        }
        /* Cut them into buckets: every member of the holder set sees the
         * same pieces in the same order and cuts them alike.  A bucket
         * closes once it holds cap_bytes, or (cap 0) where the next piece
         * belongs to another layer. */
        sync_bucket *b = NULL;
        size_t bytes = 0;
        for (int i = first; i < at; i++) {
            const sync_piece *p = &g->bpieces[i];
            const mal_tensor_info *t = &m->tensors[p->tensor];
            if (!b) {
                b = &g->buckets[g->n_buckets++];
                *b = (sync_bucket){si, i, 0, 0, 0, t->layer, NULL};
                bytes = 0;
            }
            size_t n = mal_piece_floats(t, p->begin, p->end);
            b->n_pieces++;
            b->n_floats += n;
            b->ready_layer = t->layer; /* backward order: the last piece is the latest */
            bytes += n * sizeof(float);
            int last = i + 1 == at;
            int next_layer = last ? 0 : m->tensors[g->bpieces[i + 1].tensor].layer;
            if (last || (cap_bytes ? bytes >= cap_bytes : next_layer != t->layer)) b = NULL;
        }
    }
    /* The post order: by the bucket's last piece in the backward order,
     * which is one total order over all buckets of the job (comm.h: no
     * cycles across lists) and the order in which they become ready. */
    sort_buckets(g->buckets, g->n_buckets, g->bpieces);
    size_t off = 0;
    for (int b = 0; b < g->n_buckets; b++) {
        g->buckets[b].off = off;
        off += g->buckets[b].n_floats;
    }
    if (g->bbuf && g->bbuf_floats < total) {
        mal_kern_free(m->k, g->bbuf);
        g->bbuf = NULL;
    }
    if (!g->bbuf) {
        /* one more copy of the replicated gradients, a region per bucket */
        if (!(g->bbuf = mal_kern_alloc_as(m->k, total * sizeof(float), MAL_MEM_COMM)))
            return MAL_ERR(MAL_ENOMEM, "gradient sync: cannot allocate %zu floats for the buckets",
                           total);
        g->bbuf_floats = total;
    }
    return 0;
}

int mal_gradsync_n_buckets(const mal_gradsync *g, int *posted_early)
{
    if (posted_early) *posted_early = g->posted_early;
    return g->n_buckets;
}

int mal_gradsync_begin(mal_gradsync *g)
{
    g->next_bucket = 0;
    g->posted_early = 0;
    if (g->lists_made || !g->n_buckets) return 0;
    /* A backend that makes a communicator per member list (NCCL) makes it
     * at the first reduction on the list, which blocks on the members:
     * made here, in the bucket order every member follows, instead of in
     * the middle of a backward pass. */
    for (int b = 0; b < g->n_buckets; b++) {
        const sync_group *s = &g->groups[g->buckets[b].group];
        int rc = mal_comm_dp_allreduce_list(g->comm, g->m->k, s->ranks, s->n_ranks, TAG_BUCKET,
                                            g->bbuf, 0, MAL_F32, MAL_OP_SUM);
        if (rc) return rc;
    }
    g->lists_made = 1;
    return 0;
}

/* Pack and post bucket b: its all-reduce, or sharded its reduce-scatter. */
static int post_bucket(mal_gradsync *g, sync_bucket *b)
{
    mal_model *m = g->m;
    const sync_group *s = &g->groups[b->group];
    float *dst = g->bbuf + b->off;
    pack_group(g, g->bpieces + b->first, b->n_pieces, m->grads, dst, 1);
    if (g->zero)
        return mal_comm_dp_ilist(g->comm, m->k, MAL_LIST_REDUCE_SCATTER, s->ranks, s->n_ranks,
                                 TAG_BUCKET, dst, g->units[b - g->buckets].counts, MAL_F32,
                                 &b->req);
    return mal_comm_dp_iallreduce_list(g->comm, m->k, s->ranks, s->n_ranks, TAG_BUCKET, dst,
                                       b->n_floats, MAL_F32, MAL_OP_SUM, &b->req);
}

int mal_gradsync_ready(mal_gradsync *g, int layer)
{
    int rc;
    while (g->next_bucket < g->n_buckets && g->buckets[g->next_bucket].ready_layer >= layer)
        if ((rc = post_bucket(g, &g->buckets[g->next_bucket++]))) return rc;
    g->posted_early = g->next_bucket;
    return g->n_buckets ? mal_comm_dp_progress(g->comm) : 0;
}

int mal_gradsync_finish(mal_gradsync *g)
{
    int rc = 0;
    /* what the hooks did not post (no hooks ran: the blocking order of
     * events, or a part whose last layers hold no replicated piece) */
    while (!rc && g->next_bucket < g->n_buckets)
        rc = post_bucket(g, &g->buckets[g->next_bucket++]);
    /* waited in the order posted; each bucket's result unpacked once its
     * wait returns (rule 3: kernels queued after the wait see it) */
    for (int bi = 0; bi < g->n_buckets; bi++) {
        sync_bucket *b = &g->buckets[bi];
        int rc2 = mal_comm_dp_waitall(g->comm, 1, &b->req);
        if (!rc) rc = rc2;
        if (rc) continue;
        /* sharded: the sum of this rank's region stays in the bucket's
         * region until mal_gradsync_zero_step (no second copy) */
        if (!g->zero) unpack_pieces(g, g->bpieces + b->first, b->n_pieces, g->bbuf + b->off);
    }
    return rc;
}

/* Where the sums of this rank's region of unit u are between the
 * reduce-scatter and the update: in the bucket's region itself, else in
 * the shard zg. */
static float *region_sums(const mal_gradsync *g, const zero_unit *u)
{
    return u->buf ? u->buf + u->r_off : g->zg + u->s_off;
}

int mal_gradsync_norm_sumsq(mal_gradsync *g, double *out)
{
    mal_model *m = g->m;
    mal_kern k = m->k;
    /* Every range adds into one device-side accumulator, which the host
     * reads once.  A column range of a row-major matrix is a run per row
     * (also when it spans the whole width: the sums stay those of one run
     * per row). */
    mal_kern_zero(k, g->norm_acc, sizeof(double));
    /* One multi-tensor operation over every range (a launch pair per ~100
     * ranges on a GPU instead of one per range; the same bits); without
     * memory for the table, one range at a time. */
    mal_kern_run one, *runs = malloc((size_t)(g->n_norm + g->n_units + 1) * sizeof *runs);
    int n = 0;
    /* sharded: each summed element is counted by the owner of its region,
     * from its region's sums (the holders' gradients are not summed) */
    for (int ui = 0; g->zero && ui < g->n_units; ui++)
        if (g->units[ui].r_len) {
            const zero_unit *u = &g->units[ui];
            one = (mal_kern_run){region_sums(g, u), 1, u->r_len, u->r_len};
            if (runs)
                runs[n++] = one;
            else
                mal_kern_sumsq_multi(k, g->norm_acc, &one, 1);
        }
    for (int i = 0; i < g->n_norm; i++) {
        const norm_range *r = &g->norm[i];
        if (g->zero && r->synced) continue;
        const mal_tensor_info *t = &m->tensors[r->tensor];
        mal_piece_shape s;
        mal_piece_locate(t, r->begin, r->end, &s);
        if (t->ndim == 2 && t->axis == 1 && s.rows == 1) /* whole width, but per row */
            s = (mal_piece_shape){s.offset, t->local_shape[0], t->local_shape[1],
                                  t->local_shape[1]};
        one =
            (mal_kern_run){m->grads + s.offset, (size_t)s.rows, (size_t)s.width, (size_t)s.stride};
        if (runs)
            runs[n++] = one;
        else
            mal_kern_sumsq_multi(k, g->norm_acc, &one, 1);
    }
    if (runs) mal_kern_sumsq_multi(k, g->norm_acc, runs, n);
    free(runs);
    *out = 0;
    mal_kern_to_host(k, out, g->norm_acc, sizeof *out);
    return mal_kern_sync(k);
}

/* The working copies of n pieces (n_floats elements), packed into g->buf
 * as fp32: through host memory `host` (n_floats floats), each element
 * widened exactly (bf16 is the top half of an fp32). */
static int pack_work_f32(mal_gradsync *g, const sync_piece *pieces, int n, size_t n_floats,
                         float *host)
{
    mal_model *m = g->m;
    char *dst = (char *)g->buf;
    for (int i = 0; i < n; i++) {
        const mal_tensor_info *t = &m->tensors[pieces[i].tensor];
        mal_piece_pack_elems(m->k, t, m->work, m->esz, pieces[i].begin, pieces[i].end, dst,
                             MAL_COPY_D2D);
        dst += mal_piece_floats(t, pieces[i].begin, pieces[i].end) * m->esz;
    }
    mal_kern_to_host(m->k, host, g->buf, n_floats * m->esz);
    int rc = mal_kern_sync(m->k);
    if (rc) return rc;
    if (m->esz == 2) /* from the back: element i's 2 bytes lie before float i */
        for (size_t i = n_floats; i-- > 0;) {
            uint16_t h;
            memcpy(&h, (char *)host + 2 * i, 2);
            uint32_t w = (uint32_t)h << 16;
            memcpy(&host[i], &w, 4);
        }
    mal_kern_from_host(m->k, g->buf, host, n_floats * sizeof(float));
    return 0;
}

int mal_gradsync_replica_mismatch(mal_gradsync *g, double *count)
{
    mal_model *m = g->m;
    mal_kern k = m->k;
    double local = 0;
    int rc = 0;
    float *host = NULL;
    if ((rc = need_buf(g))) return rc;
    if (g->buf_floats && !(host = malloc(g->buf_floats * sizeof(float))))
        return MAL_ERR(MAL_ENOMEM, "replica check: out of memory");
    /* Every holder packs its own copy and, behind it, the copy negated; the
     * element-wise max over the holders of both agree (max == -max(-x))
     * exactly when all copies are identical. */
    for (int si = 0; si < g->n_groups && !rc; si++) {
        const sync_group *s = &g->groups[si];
        /* sharded, the moments are not replicated: the parameters only */
        for (int grp = 0; grp < (g->zero ? 1 : MAL_STATE_N_SAVED) && !rc; grp++) {
            const float *base = mal_model_state(m, grp);
            if (grp == MAL_STATE_PARAM && g->zp) {
                /* the master sharded: the working copies, which every
                 * holder has whole, widened to fp32 (exact) */
                if ((rc = pack_work_f32(g, s->pieces, s->n_pieces, s->n_floats, host))) break;
            } else {
                pack_group(g, s->pieces, s->n_pieces, base, g->buf, 0);
            }
            mal_kern_copy(k, g->buf + s->n_floats, g->buf, s->n_floats * sizeof(float));
            mal_kern_scale(k, g->buf + s->n_floats, s->n_floats, -1.0f);
            if ((rc = mal_comm_dp_allreduce_list(g->comm, k, s->ranks, s->n_ranks, TAG_SYNC,
                                                 g->buf, 2 * s->n_floats, MAL_F32, MAL_OP_MAX)))
                break;
            mal_kern_to_host(k, host, g->buf, 2 * s->n_floats * sizeof(float));
            if ((rc = mal_kern_sync(k))) break;
            for (size_t i = 0; i < s->n_floats; i++)
                local += host[i] != -host[s->n_floats + i];
        }
    }
    free(host);
    *count = local;
    return rc;
}

/* ---- the sharded optimizer (ZeRO-1) ------------------------------------- */

/* The units (the buckets', else the groups'), every unit's packed buffer
 * cut into a region per member; *owned: floats of this rank's regions,
 * *local: of its local pieces. */
static int zero_regions(mal_gradsync *g, int rank, size_t *owned_out, size_t *local_out)
{
    const mal_model *m = g->m;
    size_t owned = 0, local = 0;
    int n = g->n_buckets ? g->n_buckets : g->n_groups;
    if (n && !(g->units = calloc((size_t)n, sizeof *g->units)))
        return MAL_ERR(MAL_ENOMEM, "sharded optimizer: out of memory");
    g->n_units = n;
    for (int ui = 0; ui < n; ui++) {
        zero_unit *u = &g->units[ui];
        const sync_bucket *b = g->n_buckets ? &g->buckets[ui] : NULL;
        const sync_group *s = &g->groups[b ? b->group : ui];
        u->ranks = s->ranks, u->n_ranks = s->n_ranks;
        if (b) {
            u->pieces = g->bpieces + b->first, u->n_pieces = b->n_pieces;
            u->n_floats = b->n_floats, u->buf = g->bbuf + b->off;
        } else {
            u->pieces = s->pieces, u->n_pieces = s->n_pieces, u->n_floats = s->n_floats;
        }
        if (!(u->counts = malloc((size_t)u->n_ranks * sizeof *u->counts)))
            return MAL_ERR(MAL_ENOMEM, "sharded optimizer: out of memory");
        /* regions as equal as the floats allow, in the order of the
         * ranks (the members' list) */
        size_t q = u->n_floats / (size_t)u->n_ranks, rem = u->n_floats % (size_t)u->n_ranks;
        size_t off = 0;
        for (int j = 0; j < u->n_ranks; j++) {
            u->counts[j] = q + ((size_t)j < rem);
            if (u->ranks[j] == rank) u->r_off = off, u->r_len = u->counts[j];
            off += u->counts[j];
        }
        u->s_off = owned;
        owned += u->r_len;
    }
    for (int i = 0; i < g->n_local; i++)
        local += mal_piece_floats(&m->tensors[g->local[i].tensor], g->local[i].begin,
                                  g->local[i].end);
    *owned_out = owned, *local_out = local;
    return 0;
}

/* g->buf for the sharded optimizer's units: only when they have no
 * bucket regions of their own (a sum after the backward pass). */
static int zero_need_buf(mal_gradsync *g)
{
    return g->n_buckets ? 0 : need_buf(g);
}

/* This rank's shard (its regions, then its local pieces) of the whole
 * state buffer `full` (queued). */
static void shard_from(mal_gradsync *g, const float *full, float *shard)
{
    mal_model *m = g->m;
    for (int ui = 0; ui < g->n_units; ui++) {
        const zero_unit *u = &g->units[ui];
        float *buf = u->buf ? u->buf : g->buf;
        if (!u->r_len) continue;
        pack_group(g, u->pieces, u->n_pieces, full, buf, 0);
        mal_kern_copy(m->k, shard + u->s_off, buf + u->r_off, u->r_len * sizeof(float));
    }
    size_t moff = g->zg_floats;
    for (int i = 0; i < g->n_local; i++) {
        const sync_piece *p = &g->local[i];
        const mal_tensor_info *t = &m->tensors[p->tensor];
        mal_piece_pack(m->k, t, full, p->begin, p->end, shard + moff, MAL_COPY_D2D);
        moff += mal_piece_floats(t, p->begin, p->end);
    }
}

/* Whole moments (m->adam_m, adam_v) into this rank's shards, then freed:
 * an online plan change hands them in. */
static int zero_absorb(mal_gradsync *g)
{
    mal_model *m = g->m;
    int rc = zero_need_buf(g);
    if (!rc) {
        shard_from(g, m->adam_m, g->zm);
        shard_from(g, m->adam_v, g->zv);
        rc = mal_kern_sync(m->k);
    }
    if (rc) return rc;
    mal_kern_free(m->k, m->adam_m);
    mal_kern_free(m->k, m->adam_v);
    m->adam_m = m->adam_v = NULL;
    return 0;
}

/* The whole state buffer `full` from every holder's shards: each unit's
 * regions gathered from their owners, the local pieces from this rank's
 * own shard.  Collective over the holders of each unit. */
static int whole_from(mal_gradsync *g, const float *shard, float *full)
{
    mal_model *m = g->m;
    int rc = 0;
    for (int ui = 0; ui < g->n_units && !rc; ui++) {
        const zero_unit *u = &g->units[ui];
        float *buf = u->buf ? u->buf : g->buf;
        mal_comm_req *req = NULL;
        if (u->r_len)
            mal_kern_copy(m->k, buf + u->r_off, shard + u->s_off, u->r_len * sizeof(float));
        if ((rc = mal_comm_dp_ilist(g->comm, m->k, MAL_LIST_ALLGATHER, u->ranks, u->n_ranks,
                                    TAG_ZERO, buf, u->counts, MAL_F32, &req)) ||
            (req && (rc = mal_comm_dp_waitall(g->comm, 1, &req))))
            break;
        unpack_into(g, u->pieces, u->n_pieces, buf, full);
    }
    size_t moff = g->zg_floats;
    for (int i = 0; i < g->n_local && !rc; i++) {
        const sync_piece *p = &g->local[i];
        const mal_tensor_info *t = &m->tensors[p->tensor];
        mal_piece_unpack(m->k, t, full, p->begin, p->end, shard + moff, MAL_COPY_D2D);
        moff += mal_piece_floats(t, p->begin, p->end);
    }
    return rc;
}

int mal_gradsync_zero_gather(mal_gradsync *g)
{
    mal_model *m = g->m;
    size_t bytes = m->n_params * sizeof(float);
    int rc;
    if (!g->zero || (m->adam_m && m->params)) return 0;
    if ((rc = zero_need_buf(g))) return rc;
    if (!m->params) {
        /* the master sharded: whole again first (a transient peak of the
         * whole fp32 master beside its shard) */
        if (!(m->params = mal_kern_alloc_as(m->k, MAL_MAX(bytes, 1), MAL_MEM_MASTER)))
            return MAL_ERR(MAL_ENOMEM,
                           "sharded master: cannot allocate %zu bytes for the whole master", bytes);
        if ((rc = whole_from(g, g->zp, m->params)) || (rc = mal_kern_sync(m->k))) return rc;
        mal_kern_free(m->k, g->zp);
        g->zp = NULL;
    }
    if (m->adam_m) return 0;
    m->adam_m = mal_kern_alloc_as(m->k, bytes, MAL_MEM_MOMENTS);
    m->adam_v = mal_kern_alloc_as(m->k, bytes, MAL_MEM_MOMENTS);
    if (!m->adam_m || !m->adam_v) {
        mal_kern_free(m->k, m->adam_m);
        mal_kern_free(m->k, m->adam_v);
        m->adam_m = m->adam_v = NULL;
        return MAL_ERR(MAL_ENOMEM, "sharded optimizer: cannot allocate %zu bytes x2 for the "
                                   "whole moments",
                       bytes);
    }
    if (!(rc = whole_from(g, g->zm, m->adam_m))) rc = whole_from(g, g->zv, m->adam_v);
    if (!rc) rc = mal_kern_sync(m->k);
    return rc;
}

int mal_gradsync_zero_master(mal_gradsync *g)
{
    mal_model *m = g->m;
    int rc;
    if (!g->zero) return MAL_ERR(MAL_EINVAL, "sharded master: the sharded optimizer is not set up");
    /* with the working weights the master itself there is nothing to shard */
    if (g->zp || m->work == m->params) return 0;
    if (!m->params && !m->master_parked)
        return MAL_ERR(MAL_EINVAL, "sharded master: no whole master to shard");
    if ((rc = zero_need_buf(g))) return rc;
    /* The whole master moves into the gradient buffer (rebuilt from zero
     * every step, as _stage uses it) and is freed before the shard is
     * allocated: otherwise the whole master and the share live side by
     * side, a peak above the steady state's (measured in bf16 on the CPU:
     * the master's peak per rank 1.5x the whole master's instead of half
     * of it), which the memory check and the planner do not count.  At
     * start-up it is there already (mal_model_park_master), freed before
     * the activations, buckets and moments were made. */
    if (!m->master_parked && (rc = mal_model_park_master(m))) return rc;
    m->master_parked = 0;
    if (!(g->zp = mal_kern_alloc_as(m->k, MAL_MAX(g->z_floats, 1) * sizeof(float), MAL_MEM_MASTER)))
        return MAL_ERR(MAL_ENOMEM, "sharded master: cannot allocate %zu floats", g->z_floats);
    shard_from(g, m->grads, g->zp);
    return mal_kern_sync(m->k);
}

int mal_gradsync_zero_master_sharded(const mal_gradsync *g)
{
    return g && g->zp != NULL;
}

float *mal_gradsync_zero_master_stage(mal_gradsync *g)
{
    if (!g || !g->zp) return NULL;
    mal_model *m = g->m;
    /* the gradients are rebuilt from zero every step: their buffer holds
     * the whole master while it is loaded */
    m->params = m->grads;
    return m->params;
}

int mal_gradsync_zero_master_unstage(mal_gradsync *g)
{
    if (!g || !g->zp || g->m->params != g->m->grads) return 0;
    mal_model *m = g->m;
    int rc = zero_need_buf(g);
    if (!rc) {
        shard_from(g, m->params, g->zp);
        rc = mal_kern_sync(m->k);
    }
    m->params = NULL;
    return rc;
}

int mal_gradsync_zero(mal_gradsync *g, int rank)
{
    mal_model *m = g->m;
    if (g->zero) return 0;
    size_t owned, local;
    int rc = zero_regions(g, rank, &owned, &local);
    if (rc) return rc;
    g->zg_floats = owned;
    g->z_floats = owned + local;
    /* a rank that owns nothing still gets (one-float) buffers, never read;
     * the sums need a shard of their own only without buckets (the
     * buckets' regions keep them until the update) */
    if (!g->n_buckets)
        g->zg = mal_kern_alloc_as(m->k, MAL_MAX(owned, 1) * sizeof(float), MAL_MEM_GRADIENTS);
    g->zm = mal_kern_alloc_as(m->k, MAL_MAX(g->z_floats, 1) * sizeof(float), MAL_MEM_MOMENTS);
    g->zv = mal_kern_alloc_as(m->k, MAL_MAX(g->z_floats, 1) * sizeof(float), MAL_MEM_MOMENTS);
    if ((!g->n_buckets && !g->zg) || !g->zm || !g->zv)
        return MAL_ERR(MAL_ENOMEM, "sharded optimizer: cannot allocate %zu floats of moments",
                       g->z_floats);
    g->zero = 1;
    return m->adam_m ? zero_absorb(g) : 0;
}

size_t mal_gradsync_zero_floats(const mal_gradsync *g) { return g->zero ? g->z_floats : 0; }

/* A sync of `part` under `plan` on a model with nothing allocated: the
 * tensor table alone (plan_pieces and the regions read only that); the
 * caller reads it, then frees it with layout_sync_free. */
static int layout_sync(const mal_plan *plan, const mal_model_config *cfg, int rank,
                       const mal_model_part *part, mal_model *m, mal_gradsync **out)
{
    *m = (mal_model){.cfg = *cfg, .part = *part};
    mal_gradsync *g = *out = calloc(1, sizeof *g);
    if (!g) return MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    g->m = m;
    int rc = mal_model_layout(cfg, part, &m->tensors, &m->n_tensors, &m->n_params);
    return rc ? rc : plan_pieces(g, plan, rank);
}

static void layout_sync_free(mal_model *m, mal_gradsync *g)
{
    mal_gradsync_destroy(g); /* no device buffers to free: none were made */
    free(m->tensors);
}

int mal_gradsync_zero_need(const mal_plan *plan, const mal_model_config *cfg, int rank,
                           const mal_model_part *part, int overlapped, size_t *moments,
                           size_t *sums)
{
    mal_model m;
    mal_gradsync *g;
    size_t owned = 0, local = 0;
    int rc = layout_sync(plan, cfg, rank, part, &m, &g);
    if (!rc) rc = zero_regions(g, rank, &owned, &local);
    /* overlapped, the sums stay in the buckets' regions (counted with
     * the buckets, mal_gradsync_buffer_need) */
    *moments = owned + local, *sums = overlapped ? 0 : owned;
    layout_sync_free(&m, g);
    return rc;
}

int mal_gradsync_buffer_need(const mal_plan *plan, const mal_model_config *cfg, int rank,
                             const mal_model_part *part, int overlapped, size_t *floats)
{
    mal_model m;
    mal_gradsync *g;
    *floats = 0;
    int rc = layout_sync(plan, cfg, rank, part, &m, &g);
    /* overlapped: the buckets' buffer, a region for every replicated
     * piece (mal_gradsync_buckets); after the backward pass: the packing
     * buffer, twice the largest holder set's pieces (need_buf) */
    size_t total = 0, largest = 0;
    for (int i = 0; !rc && i < g->n_groups; i++) {
        total += g->groups[i].n_floats;
        largest = MAL_MAX(largest, g->groups[i].n_floats);
    }
    if (!rc) *floats = overlapped ? total : 2 * largest;
    layout_sync_free(&m, g);
    return rc;
}

int mal_gradsync_zero_reduce(mal_gradsync *g)
{
    mal_model *m = g->m;
    int rc;
    if ((rc = need_buf(g))) return rc;
    for (int ui = 0; ui < g->n_units; ui++) {
        const zero_unit *u = &g->units[ui];
        float *buf = u->buf ? u->buf : g->buf;
        mal_comm_req *req = NULL;
        pack_group(g, u->pieces, u->n_pieces, m->grads, buf, 1);
        if ((rc = mal_comm_dp_ilist(g->comm, m->k, MAL_LIST_REDUCE_SCATTER, u->ranks, u->n_ranks,
                                    TAG_ZERO, buf, u->counts, MAL_F32, &req)) ||
            (req && (rc = mal_comm_dp_waitall(g->comm, 1, &req))))
            return rc;
        if (u->r_len)
            mal_kern_copy(m->k, g->zg + u->s_off, buf + u->r_off, u->r_len * sizeof(float));
    }
    return 0;
}

/* One AdamW update of n elements (the step's settings). */
static void adamw_run(mal_gradsync *g, const mal_optim_config *oc, float *param, void *work,
                      const float *grad, size_t moff, size_t n, int decay, float lr, float scale,
                      int t)
{
    mal_kern_adamw(g->m->k, param, work, grad, g->zm + moff, g->zv + moff, n, lr, oc->beta1,
                   oc->beta2, oc->eps, decay ? oc->weight_decay : 0.0f, scale, t);
}

/* AdamW on packed floats [a, b) of unit u's pieces (within this rank's
 * region), in place in the parameters' own layout, run by run (a column
 * range of a matrix is a run per row), the gradient sums and moments read
 * packed.  The parameters of the region need no packed copy beside the
 * sums: the update is made where they live, then packed for the gather. */
static void step_region(mal_gradsync *g, const mal_optim_config *oc, const zero_unit *u, float lr,
                        float scale, int t)
{
    mal_model *m = g->m;
    const float *sums = region_sums(g, u);
    size_t po = 0, r_end = u->r_off + u->r_len;
    for (int i = 0; i < u->n_pieces && po < r_end; i++) {
        const sync_piece *p = &u->pieces[i];
        const mal_tensor_info *ti = &m->tensors[p->tensor];
        size_t n = mal_piece_floats(ti, p->begin, p->end);
        size_t lo = MAL_MAX(po, u->r_off), hi = MAL_MIN(po + n, r_end);
        mal_piece_shape sh;
        mal_piece_locate(ti, p->begin, p->end, &sh);
        const size_t w = (size_t)sh.width, contiguous = sh.stride == sh.width;
        for (size_t a = lo - po; a < hi - po;) {
            size_t col = a % w, len = contiguous ? hi - po - a : MAL_MIN(w - col, hi - po - a);
            size_t off = sh.offset + (contiguous ? a : a / w * (size_t)sh.stride + col);
            size_t at = po + a - u->r_off; /* in the region's sums and moments */
            float *param = g->zp ? g->zp + u->s_off + at : m->params + off;
            adamw_run(g, oc, param, (char *)m->work + off * m->esz, sums + at, u->s_off + at, len,
                      ti->decay, lr, scale, t);
            a += len;
        }
        po += n;
    }
}

/* The working copies of n pieces packed into `buf` (pack) or unpacked
 * from it (elements of the compute dtype, m->esz bytes). */
static void work_pieces(mal_gradsync *g, const sync_piece *pieces, int n, void *buf, int pack)
{
    mal_model *m = g->m;
    char *b = buf;
    for (int i = 0; i < n; i++) {
        const mal_tensor_info *t = &m->tensors[pieces[i].tensor];
        if (pack)
            mal_piece_pack_elems(m->k, t, m->work, m->esz, pieces[i].begin, pieces[i].end, b,
                                 MAL_COPY_D2D);
        else
            mal_piece_unpack_elems(m->k, t, m->work, m->esz, pieces[i].begin, pieces[i].end, b,
                                   MAL_COPY_D2D);
        b += mal_piece_floats(t, pieces[i].begin, pieces[i].end) * m->esz;
    }
}

/* Unit u's gathered parameters in `buf` into the model: the whole master,
 * or with the master sharded the working copy (the compute dtype: what
 * the gather moved). */
static void gathered(mal_gradsync *g, const zero_unit *u, float *buf)
{
    if (g->zp)
        work_pieces(g, u->pieces, u->n_pieces, buf, 0);
    else
        unpack_into(g, u->pieces, u->n_pieces, buf, g->m->params);
}

int mal_gradsync_zero_step(mal_gradsync *g, const mal_optim_config *oc, int64_t step, float lr,
                           float grad_scale)
{
    mal_model *m = g->m;
    const int t = (int)(step + 1);
    int rc;
    if (!g->zero) return MAL_ERR(MAL_EINVAL, "sharded optimizer: not set up");
    if ((rc = zero_need_buf(g))) return rc;
    /* Summed pieces: the owner of each region updates it in place with its
     * region's gradient sums and its moments, then every holder packs the
     * parameters (its own updated region, the others' old values) into the
     * unit's buffer -- the sums there are spent -- and the regions are
     * gathered back to every holder.  The update is the element-wise
     * AdamW of the whole state: the same bits as an unsharded step given
     * the same sums. */
    for (int ui = 0; ui < g->n_units && !rc; ui++) {
        zero_unit *u = &g->units[ui];
        float *buf = u->buf ? u->buf : g->buf;
        step_region(g, oc, u, lr, grad_scale, t);
        if (g->zp)
            work_pieces(g, u->pieces, u->n_pieces, buf, 1);
        else
            pack_group(g, u->pieces, u->n_pieces, m->params, buf, 0);
        /* the buckets' gathers in flight together (a region each), a
         * group's waited for at once (they share g->buf) */
        rc = mal_comm_dp_ilist(g->comm, m->k, MAL_LIST_ALLGATHER, u->ranks, u->n_ranks, TAG_ZERO,
                               buf, u->counts, g->zp ? m->k->compute : MAL_F32, &u->req);
        if (!rc && !u->buf) {
            rc = mal_comm_dp_waitall(g->comm, 1, &u->req);
            if (!rc) gathered(g, u, buf);
        }
    }
    for (int ui = 0; ui < g->n_units; ui++) {
        zero_unit *u = &g->units[ui];
        if (!u->buf) continue;
        int rc2 = mal_comm_dp_waitall(g->comm, 1, &u->req);
        if (!rc) rc = rc2;
        if (!rc) gathered(g, u, u->buf);
    }
    if (rc) return rc;
    /* the whole master changed: its working copy follows (a sharded master
     * gathered the working copy itself) */
    if (g->n_units && !g->zp && m->work != m->params) mal_model_refresh_working(m);
    /* The pieces no group sums: updated in place, run by run (a column
     * range of a matrix is a run per row), moments packed in that order. */
    size_t moff = g->zg_floats;
    for (int i = 0; i < g->n_local; i++) {
        const sync_piece *p = &g->local[i];
        const mal_tensor_info *ti = &m->tensors[p->tensor];
        mal_piece_shape sh;
        mal_piece_locate(ti, p->begin, p->end, &sh);
        int64_t runs = sh.stride == sh.width ? 1 : sh.rows;
        size_t len = sh.stride == sh.width ? (size_t)(sh.rows * sh.width) : (size_t)sh.width;
        for (int64_t r = 0; r < runs; r++) {
            size_t off = sh.offset + (size_t)(r * sh.stride);
            float *param = g->zp ? g->zp + moff : m->params + off;
            adamw_run(g, oc, param, (char *)m->work + off * m->esz, m->grads + off, moff, len,
                      ti->decay, lr, grad_scale, t);
            moff += len;
        }
    }
    return 0;
}

/* The blocks of packed floats [a, b) of piece p (a rectangle of its
 * tensor, row-major when packed) whose first float is `at` of the shards:
 * a partial row, whole rows, a partial row. */
static int add_blocks(const mal_model *m, const sync_piece *p, size_t a, size_t b, size_t at,
                      mal_zero_block **out, int *n, int *cap)
{
    const mal_tensor_info *t = &m->tensors[p->tensor];
    int64_t r0 = 0, c0 = p->begin, W = p->end - p->begin; /* 1-D: one row */
    if (t->ndim == 2 && t->axis == 0) r0 = p->begin, c0 = 0, W = t->shape[1];
    if (t->ndim == 2 && t->axis == 1) r0 = 0, c0 = p->begin;
    while (a < b) {
        int64_t r = (int64_t)a / W, c = (int64_t)a % W, rows = 1, cols;
        if (c != 0 || (int64_t)(b - a) < W)
            cols = MAL_MIN(W - c, (int64_t)(b - a));
        else
            rows = (int64_t)(b - a) / W, cols = W;
        if (mal_grow(out, cap, *n, sizeof **out, 32))
            return MAL_ERR(MAL_ENOMEM, "sharded optimizer: out of memory");
        mal_zero_block *z = &(*out)[(*n)++];
        memset(z, 0, sizeof *z);
        z->tensor = p->tensor;
        if (t->ndim == 1) {
            z->offset[0] = c0 + c, z->extent[0] = cols;
        } else {
            z->offset[0] = r0 + r, z->extent[0] = rows;
            z->offset[1] = c0 + c, z->extent[1] = cols;
        }
        z->at = at, z->n = (size_t)(rows * cols);
        a += z->n, at += z->n;
    }
    return 0;
}

int mal_gradsync_zero_blocks(const mal_gradsync *g, int all_local, mal_zero_block **out,
                             int *n_out)
{
    const mal_model *m = g->m;
    int n = 0, cap = 0, rc = 0;
    *out = NULL;
    *n_out = 0;
    if (!g->zero) return MAL_ERR(MAL_EINVAL, "sharded optimizer: not set up");
    /* this rank's region of every unit, piece by piece */
    for (int ui = 0; ui < g->n_units && !rc; ui++) {
        const zero_unit *u = &g->units[ui];
        size_t po = 0, r_end = u->r_off + u->r_len;
        for (int i = 0; i < u->n_pieces && po < r_end && !rc; i++) {
            const sync_piece *p = &u->pieces[i];
            size_t pn = mal_piece_floats(&m->tensors[p->tensor], p->begin, p->end);
            size_t lo = MAL_MAX(po, u->r_off), hi = MAL_MIN(po + pn, r_end);
            if (lo < hi)
                rc = add_blocks(m, p, lo - po, hi - po, u->s_off + (lo - u->r_off), out, &n, &cap);
            po += pn;
        }
    }
    /* the local pieces: the first holder's, or all */
    size_t at = g->zg_floats;
    for (int i = 0; i < g->n_local && !rc; i++) {
        const sync_piece *p = &g->local[i];
        size_t pn = mal_piece_floats(&m->tensors[p->tensor], p->begin, p->end);
        if (all_local || p->contribute) rc = add_blocks(m, p, 0, pn, at, out, &n, &cap);
        at += pn;
    }
    if (rc) {
        free(*out);
        *out = NULL;
        return rc;
    }
    *n_out = n;
    return 0;
}

/* The shard of group grp: a moment, or the sharded master. */
static float *shard_of(const mal_gradsync *g, int grp)
{
    return grp == MAL_STATE_PARAM ? g->zp : grp == MAL_STATE_ADAM_M ? g->zm : g->zv;
}

void mal_gradsync_zero_to_host(const mal_gradsync *g, int grp, size_t at, size_t n, float *dst)
{
    mal_kern_to_host(g->m->k, dst, shard_of(g, grp) + at, n * sizeof(float));
}

void mal_gradsync_zero_from_host(mal_gradsync *g, int grp, size_t at, size_t n, const float *src)
{
    mal_kern_from_host(g->m->k, shard_of(g, grp) + at, src, n * sizeof(float));
}
