/* Data-parallel gradient sum over replicas that may shard the same parameter
 * differently (different TP sizes, different stage boundaries).
 *
 * For every tensor this rank holds, the holdings of all pipelines are
 * computed from the plan (no communication), cut into the finest common
 * partition (slices.h), and every piece held by two or more pipelines is
 * summed over its holders: the first holder of each pipeline contributes its
 * gradient (its pipeline's share), other TP ranks of the same pipeline that
 * hold a replica of it contribute zeros, and every holder receives the sum.
 * Pieces with the same holder set travel together: one all-reduce per
 * distinct set, by point-to-point messages among its members on one
 * communicator of all ranks (comm_ring.h), so regrouping the replicas after
 * a plan change creates no communicator.
 *
 * The same pieces decide who counts which gradient element in the global
 * norm: the first holder overall (pipeline 0's lowest rank).
 */
#include <stdlib.h>
#include <string.h>

#include "comm_ring.h"
#include "layout.h"
#include "mal.h"
#include "slices.h"
#include "train_internal.h"

size_t mal_tensor_range_floats(const mal_tensor_info *t, int64_t begin, int64_t end)
{
    int64_t other = t->ndim == 2 ? t->local_shape[1 - t->axis] : 1;
    return (size_t)((end - begin) * other);
}

/* Local offset of the tensor's shard along its axis. */
static int64_t local_axis_off(const mal_tensor_info *t)
{
    return t->split_dim == t->axis && t->split_dim >= 0 ? t->split_off : 0;
}

static void copy_range(const mal_tensor_info *t, float *base, int64_t begin, int64_t end,
                       float *packed, int to_packed)
{
    int64_t off = local_axis_off(t), b = begin - off, e = end - off;
    float *x = base + t->offset;
    if (t->ndim == 1 || t->axis == 0) {
        int64_t cols = t->ndim == 2 ? t->local_shape[1] : 1;
        float *src = x + b * cols;
        size_t n = (size_t)((e - b) * cols);
        if (to_packed)
            memcpy(packed, src, n * sizeof(float));
        else
            memcpy(src, packed, n * sizeof(float));
        return;
    }
    int64_t rows = t->local_shape[0], cols = t->local_shape[1], w = e - b;
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * cols + b;
        if (to_packed)
            memcpy(packed + r * w, row, (size_t)w * sizeof(float));
        else
            memcpy(row, packed + r * w, (size_t)w * sizeof(float));
    }
}

/* These copy on the host: valid for the CPU backend, where device buffers
 * are host memory.  A device backend must supply a strided copy kernel. */
void mal_tensor_range_shape(const mal_tensor_info *t, int64_t begin, int64_t end,
                            mal_range_shape *out)
{
    int64_t off = local_axis_off(t), b = begin - off, e = end - off;
    if (t->ndim == 1 || t->axis == 0) {
        int64_t cols = t->ndim == 2 ? t->local_shape[1] : 1;
        *out = (mal_range_shape){t->offset + (size_t)(b * cols), 1, (e - b) * cols, (e - b) * cols};
        return;
    }
    int64_t rows = t->local_shape[0], cols = t->local_shape[1];
    if (e - b == cols) /* the whole width: one run */
        *out = (mal_range_shape){t->offset, 1, rows * cols, rows * cols};
    else
        *out = (mal_range_shape){t->offset + (size_t)b, rows, e - b, cols};
}

void mal_tensor_pack(const mal_tensor_info *t, const float *base, int64_t begin, int64_t end,
                     float *dst)
{
    copy_range(t, (float *)base, begin, end, dst, 1);
}

void mal_tensor_unpack(const mal_tensor_info *t, float *base, int64_t begin, int64_t end,
                       const float *src)
{
    copy_range(t, base, begin, end, (float *)src, 0);
}

typedef struct {
    int n;
    int *ranks; /* sorted */
    int n_pieces, cap;
    mal_sync_piece *pieces;
} set_acc;

static int set_add_piece(set_acc *s, mal_sync_piece p)
{
    if (mal_grow(&s->pieces, &s->cap, s->n_pieces, sizeof *s->pieces, 8))
        return MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
    s->pieces[s->n_pieces++] = p;
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

int mal_gradsync_setup(struct mal_trainer *tr)
{
    mal_model *m = tr->model;
    const mal_plan *plan = &tr->plan;
    int rc = 0, n_sets = 0, cap_sets = 0, max_h = 0, cap_norm = 0;
    set_acc *sets = NULL;
    mal_slice_holding *h = NULL;
    int *rk = NULL;
    mal_slice_map map = {0};

    for (int p = 0; p < plan->n_pipelines; p++)
        for (int s = 0; s < plan->pipelines[p].n_stages; s++)
            max_h += plan->pipelines[p].stages[s].n_ranks;
    h = malloc(sizeof *h * (size_t)(max_h + 1));
    rk = malloc(sizeof *rk * (size_t)(max_h + 1));
    if (!h || !rk) {
        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
        goto out;
    }

    for (int ti = 0; ti < m->n_tensors; ti++) {
        const mal_tensor_info *t = &m->tensors[ti];
        int64_t len = t->shape[t->axis];
        int nh = mal_layout_holdings(plan, t, h);
        if ((rc = mal_slices_partition(h, nh, len, &map))) goto out;
        for (int pi = 0; pi < map.n_pieces; pi++) {
            const mal_slice_piece *pc = &map.pieces[pi];
            const int *hi = map.holders + pc->first;
            int me = -1, n_groups = 0, contribute = 0;
            for (int j = 0; j < pc->n_holders; j++) {
                int first_of_group = j == 0 || h[hi[j]].group != h[hi[j - 1]].group;
                n_groups += first_of_group;
                if (h[hi[j]].rank == tr->world_rank) {
                    me = j;
                    contribute = first_of_group;
                }
            }
            if (me < 0) continue;
            if (me == 0) { /* first holder overall counts it in the norm */
                if (tr->n_norm == cap_norm) {
                    cap_norm = cap_norm ? 2 * cap_norm : 32;
                    mal_norm_range *nn = realloc(tr->norm, sizeof *nn * (size_t)cap_norm);
                    if (!nn) {
                        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                        goto out;
                    }
                    tr->norm = nn;
                }
                tr->norm[tr->n_norm++] = (mal_norm_range){ti, pc->begin, pc->end};
            }
            if (n_groups < 2) continue; /* a single replica: nothing to sum */
            for (int j = 0; j < pc->n_holders; j++)
                rk[j] = h[hi[j]].rank;
            qsort(rk, (size_t)pc->n_holders, sizeof *rk, cmp_int);
            int si;
            for (si = 0; si < n_sets; si++)
                if (sets[si].n == pc->n_holders &&
                    !memcmp(sets[si].ranks, rk, sizeof *rk * (size_t)pc->n_holders))
                    break;
            if (si == n_sets) {
                if (n_sets == cap_sets) {
                    cap_sets = cap_sets ? 2 * cap_sets : 8;
                    set_acc *ns = realloc(sets, sizeof *ns * (size_t)cap_sets);
                    if (!ns) {
                        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                        goto out;
                    }
                    sets = ns;
                }
                memset(&sets[si], 0, sizeof sets[si]);
                sets[si].n = pc->n_holders;
                sets[si].ranks = malloc(sizeof *rk * (size_t)pc->n_holders);
                if (!sets[si].ranks) {
                    rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
                    goto out;
                }
                memcpy(sets[si].ranks, rk, sizeof *rk * (size_t)pc->n_holders);
                n_sets++;
            }
            if ((rc = set_add_piece(&sets[si],
                                    (mal_sync_piece){ti, pc->begin, pc->end, contribute})))
                goto out;
        }
        mal_slices_fini(&map);
    }

    /* The sets in the order they first appear in the global tensor order:
     * every member runs its all-reduces in that order, so messages between
     * two ranks match in order and no wait forms a cycle. */
    tr->sync = calloc((size_t)(n_sets ? n_sets : 1), sizeof *tr->sync);
    if (!tr->sync) {
        rc = MAL_ERR(MAL_ENOMEM, "gradient sync: out of memory");
        goto out;
    }
    size_t max_floats = 0, max_scratch = 0;
    for (int si = 0; si < n_sets; si++) {
        mal_sync_group *g = &tr->sync[si];
        tr->n_sync = si + 1;
        g->ranks = sets[si].ranks;
        g->n_ranks = sets[si].n;
        sets[si].ranks = NULL;
        g->pieces = sets[si].pieces;
        g->n_pieces = sets[si].n_pieces;
        sets[si].pieces = NULL;
        for (int k = 0; k < g->n_pieces; k++)
            g->n_floats += mal_tensor_range_floats(&m->tensors[g->pieces[k].tensor],
                                                   g->pieces[k].begin, g->pieces[k].end);
        if (g->n_floats > max_floats) max_floats = g->n_floats;
        /* the replica check reduces 2 doubles per element over the same group */
        max_scratch = MAL_MAX(max_scratch, mal_comm_ring_scratch_bytes(2 * g->n_floats, g->n_ranks,
                                                                       MAL_RING_MAX_F64));
        max_scratch = MAL_MAX(
            max_scratch, mal_comm_ring_scratch_bytes(g->n_floats, g->n_ranks, MAL_RING_SUM_F32));
    }
    if (max_scratch && !(tr->sync_scratch = malloc(max_scratch))) {
        rc =
            MAL_ERR(MAL_ENOMEM, "gradient sync: cannot allocate %zu bytes of scratch", max_scratch);
        goto out;
    }
    if (max_floats) {
        tr->sync_buf = malloc(max_floats * sizeof(float));
        if (!tr->sync_buf) {
            rc = MAL_ERR(MAL_ENOMEM, "gradient sync: cannot allocate %zu floats", max_floats);
            goto out;
        }
        tr->sync_buf_floats = max_floats;
    }
out:
    mal_slices_fini(&map);
    for (int si = 0; si < n_sets; si++) {
        free(sets[si].ranks);
        free(sets[si].pieces);
    }
    free(sets);
    free(h);
    free(rk);
    return rc;
}

int mal_gradsync_run(struct mal_trainer *tr)
{
    mal_model *m = tr->model;
    int rc;
    for (int si = 0; si < tr->n_sync; si++) {
        mal_sync_group *g = &tr->sync[si];
        float *buf = tr->sync_buf;
        for (int k = 0; k < g->n_pieces; k++) {
            const mal_sync_piece *p = &g->pieces[k];
            const mal_tensor_info *t = &m->tensors[p->tensor];
            size_t n = mal_tensor_range_floats(t, p->begin, p->end);
            if (p->contribute)
                mal_tensor_pack(t, m->grads, p->begin, p->end, buf);
            else
                memset(buf, 0, n * sizeof(float));
            buf += n;
        }
        if ((rc = mal_comm_ring_allreduce(tr->sync_world, g->ranks, g->n_ranks, MAL_TAG_SYNC,
                                          tr->sync_buf, g->n_floats, MAL_RING_SUM_F32,
                                          tr->sync_scratch)))
            return rc;
        buf = tr->sync_buf;
        for (int k = 0; k < g->n_pieces; k++) {
            const mal_sync_piece *p = &g->pieces[k];
            const mal_tensor_info *t = &m->tensors[p->tensor];
            mal_tensor_unpack(t, m->grads, p->begin, p->end, buf);
            buf += mal_tensor_range_floats(t, p->begin, p->end);
        }
    }
    return 0;
}

double mal_gradsync_local_sumsq(struct mal_trainer *tr)
{
    mal_model *m = tr->model;
    mal_kern k = m->k;
    /* Every range adds into one device-side accumulator; the host reads it
     * once.  A column range of a row-major matrix is a run per row. */
    mal_kern_zero(k, tr->norm_acc, sizeof(double));
    for (int i = 0; i < tr->n_norm; i++) {
        const mal_norm_range *r = &tr->norm[i];
        const mal_tensor_info *t = &m->tensors[r->tensor];
        int64_t off = local_axis_off(t);
        if (t->ndim == 1 || t->axis == 0) {
            int64_t cols = t->ndim == 2 ? t->local_shape[1] : 1;
            size_t n = (size_t)((r->end - r->begin) * cols);
            mal_kern_sumsq(k, tr->norm_acc, m->grads + t->offset + (r->begin - off) * cols, 1, n,
                           n);
        } else {
            mal_kern_sumsq(k, tr->norm_acc, m->grads + t->offset + (r->begin - off),
                           (size_t)t->local_shape[0], (size_t)(r->end - r->begin),
                           (size_t)t->local_shape[1]);
        }
    }
    double s = 0;
    mal_kern_to_host(k, &s, tr->norm_acc, sizeof s);
    mal_kern_queue_wait(k);
    return s;
}

void mal_gradsync_teardown(struct mal_trainer *tr)
{
    for (int si = 0; si < tr->n_sync; si++) {
        free(tr->sync[si].pieces);
        free(tr->sync[si].ranks);
    }
    free(tr->sync);
    tr->sync = NULL;
    tr->n_sync = 0;
    free(tr->sync_buf);
    tr->sync_buf = NULL;
    free(tr->sync_scratch);
    tr->sync_scratch = NULL;
    free(tr->norm);
    tr->norm = NULL;
    tr->n_norm = 0;
}

int mal_gradsync_replica_mismatch(struct mal_trainer *tr, double *count)
{
    mal_model *m = tr->model;
    double local = 0;
    int rc = 0;
    /* Every holder contributes its own copy; the element-wise max and min
     * over the holders agree exactly when all copies are identical. */
    for (int si = 0; m && si < tr->n_sync && !rc; si++) {
        mal_sync_group *g = &tr->sync[si];
        for (int grp = 0; grp < 3 && !rc; grp++) {
            float *base = grp == 0 ? m->params : grp == 1 ? m->adam_m : m->adam_v;
            double *hi = malloc(2 * g->n_floats * sizeof(double) + sizeof(double));
            float *tmp = malloc(g->n_floats * sizeof(float) + sizeof(float));
            if (!hi || !tmp) {
                free(hi);
                free(tmp);
                return MAL_ERR(MAL_ENOMEM, "replica check: out of memory");
            }
            double *lo = hi + g->n_floats;
            float *p = tmp;
            for (int k = 0; k < g->n_pieces; k++) {
                const mal_sync_piece *pc = &g->pieces[k];
                const mal_tensor_info *t = &m->tensors[pc->tensor];
                mal_tensor_pack(t, base, pc->begin, pc->end, p);
                p += mal_tensor_range_floats(t, pc->begin, pc->end);
            }
            for (size_t i = 0; i < g->n_floats; i++) {
                hi[i] = tmp[i];
                lo[i] = -(double)tmp[i];
            }
            rc = mal_comm_ring_allreduce(tr->sync_world, g->ranks, g->n_ranks, MAL_TAG_SYNC, hi,
                                         2 * g->n_floats, MAL_RING_MAX_F64, tr->sync_scratch);
            for (size_t i = 0; !rc && i < g->n_floats; i++)
                local += hi[i] != -lo[i];
            free(hi);
            free(tmp);
        }
    }
    if (rc) return rc;
    *count = local;
    return tr->world ? mal_comm_allreduce_f64(tr->world, count, 1) : 0;
}
