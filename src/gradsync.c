/* Data-parallel gradient sum over replicas that shard parameters
 * differently (gradsync.h). */
#include "gradsync.h"

#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "mal.h"
#include "piece.h"
#include "slices.h"

/* Tag of the sync's messages on its communicator. */
enum { TAG_SYNC = 1 };

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
} norm_range;

struct mal_gradsync {
    mal_model *m;
    mal_comm *comm;
    int n_groups;
    sync_group *groups;
    float *buf;        /* device: the packed pieces of the largest group (x2 for the replica check) */
    size_t buf_floats; /* floats of buf */
    int n_norm, cap_norm;
    norm_range *norm;
    double *norm_acc; /* device: one double */
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
        int nh = mal_layout_holdings(plan, t, h);
        if ((rc = mal_slices_partition(h, nh, t->shape[t->axis], &map))) break;
        for (int pi = 0; pi < map.n_pieces && !rc; pi++) {
            const mal_slice_piece *pc = &map.pieces[pi];
            const int *hi = map.holders + pc->first;
            int me = -1, n_groups = 0, contribute = 0;
            for (int j = 0; j < pc->n_holders; j++) {
                int first_of_group = j == 0 || h[hi[j]].group != h[hi[j - 1]].group;
                n_groups += first_of_group;
                if (h[hi[j]].rank == rank) {
                    me = j;
                    contribute = first_of_group;
                }
            }
            if (me < 0) continue;
            if (me == 0) { /* first holder overall counts it in the norm */
                if (mal_grow(&g->norm, &g->cap_norm, g->n_norm, sizeof *g->norm, 32)) {
                    rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                    break;
                }
                g->norm[g->n_norm++] = (norm_range){ti, pc->begin, pc->end};
            }
            if (n_groups < 2) continue; /* a single replica: nothing to sum */
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
    if (!rc && g->buf_floats && !(g->buf = mal_kern_alloc(m->k, g->buf_floats * sizeof(float))))
        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: cannot allocate %zu floats", g->buf_floats);
    if (!rc && !(g->norm_acc = mal_kern_alloc(m->k, sizeof(double))))
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
    for (int i = 0; i < g->n_groups; i++) {
        free(g->groups[i].pieces);
        free(g->groups[i].ranks);
    }
    free(g->groups);
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

/* Pack the pieces of group s of state buffer `base` into dst (device); a
 * piece this rank does not contribute is zeros when `zeros` is set. */
static void pack_group(mal_gradsync *g, const sync_group *s, const float *base, float *dst,
                       int zeros)
{
    mal_model *m = g->m;
    for (int i = 0; i < s->n_pieces; i++) {
        const sync_piece *p = &s->pieces[i];
        const mal_tensor_info *t = &m->tensors[p->tensor];
        size_t n = mal_piece_floats(t, p->begin, p->end);
        if (zeros && !p->contribute)
            mal_kern_zero(m->k, dst, n * sizeof(float));
        else
            mal_piece_pack(m->k, t, base, p->begin, p->end, dst, MAL_COPY_D2D);
        dst += n;
    }
}

int mal_gradsync_run(mal_gradsync *g)
{
    mal_model *m = g->m;
    int rc;
    for (int si = 0; si < g->n_groups; si++) {
        const sync_group *s = &g->groups[si];
        pack_group(g, s, m->grads, g->buf, 1);
        if ((rc = mal_comm_dp_allreduce_list(g->comm, m->k, s->ranks, s->n_ranks, TAG_SYNC, g->buf,
                                             s->n_floats, MAL_F32, MAL_OP_SUM)))
            return rc;
        const float *src = g->buf;
        for (int i = 0; i < s->n_pieces; i++) {
            const sync_piece *p = &s->pieces[i];
            const mal_tensor_info *t = &m->tensors[p->tensor];
            mal_piece_unpack(m->k, t, m->grads, p->begin, p->end, src, MAL_COPY_D2D);
            src += mal_piece_floats(t, p->begin, p->end);
        }
    }
    return 0;
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
    for (int i = 0; i < g->n_norm; i++) {
        const norm_range *r = &g->norm[i];
        const mal_tensor_info *t = &m->tensors[r->tensor];
        mal_piece_shape s;
        mal_piece_locate(t, r->begin, r->end, &s);
        if (t->ndim == 2 && t->axis == 1 && s.rows == 1) /* whole width, but per row */
            s = (mal_piece_shape){s.offset, t->local_shape[0], t->local_shape[1],
                                  t->local_shape[1]};
        mal_kern_sumsq(k, g->norm_acc, m->grads + s.offset, (size_t)s.rows, (size_t)s.width,
                       (size_t)s.stride);
    }
    *out = 0;
    mal_kern_to_host(k, out, g->norm_acc, sizeof *out);
    return mal_kern_sync(k);
}

int mal_gradsync_replica_mismatch(mal_gradsync *g, double *count)
{
    mal_model *m = g->m;
    mal_kern k = m->k;
    double local = 0;
    int rc = 0;
    float *host = NULL;
    if (g->buf_floats && !(host = malloc(g->buf_floats * sizeof(float))))
        return MAL_ERR(MAL_ENOMEM, "replica check: out of memory");
    /* Every holder packs its own copy and, behind it, the copy negated; the
     * element-wise max over the holders of both agree (max == -max(-x))
     * exactly when all copies are identical. */
    for (int si = 0; si < g->n_groups && !rc; si++) {
        const sync_group *s = &g->groups[si];
        for (int grp = 0; grp < MAL_STATE_N_SAVED && !rc; grp++) {
            const float *base = mal_model_state(m, grp);
            pack_group(g, s, base, g->buf, 0);
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
