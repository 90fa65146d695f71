/* Finest common partition of holdings along one axis (see slices.h). */
#include "slices.h"

#include <stdlib.h>
#include <string.h>

#include "base/mal.h"

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_holder(const void *a, const void *b, void *base)
{
    const mal_slice_holding *h = base;
    const mal_slice_holding *x = &h[*(const int *)a], *y = &h[*(const int *)b];
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

int mal_slices_partition(const mal_slice_holding *h, int n, int64_t axis_len, mal_slice_map *out)
{
    memset(out, 0, sizeof *out);
    if (n < 0 || axis_len < 0) return MAL_ERR(MAL_EINVAL, "slices: negative count or length");
    for (int i = 0; i < n; i++)
        if (h[i].begin < 0 || h[i].end > axis_len || h[i].begin >= h[i].end)
            return MAL_ERR(MAL_EINVAL,
                           "slices: holding %d of rank %d is [%lld, %lld), not a non-empty "
                           "interval inside [0, %lld)",
                           i, h[i].rank, (long long)h[i].begin, (long long)h[i].end,
                           (long long)axis_len);
    int rc = 0, nb = 0, cap_p = 0, cap_h = 0;
    int64_t *cuts = malloc(sizeof *cuts * (size_t)(2 * n + 1));
    int *cur = malloc(sizeof *cur * (size_t)(n + 1)), *prev = malloc(sizeof *prev * (size_t)(n + 1));
    if (!cuts || !cur || !prev) {
        rc = MAL_ERR(MAL_ENOMEM, "slices: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        cuts[nb++] = h[i].begin;
        cuts[nb++] = h[i].end;
    }
    qsort(cuts, (size_t)nb, sizeof *cuts, cmp_i64);
    int nu = 0;
    for (int i = 0; i < nb; i++)
        if (nu == 0 || cuts[i] != cuts[nu - 1]) cuts[nu++] = cuts[i];

    int n_prev = -1;
    for (int c = 0; c + 1 < nu; c++) {
        int64_t a = cuts[c], b = cuts[c + 1];
        int nc = 0;
        for (int i = 0; i < n; i++)
            if (h[i].begin <= a && h[i].end >= b) cur[nc++] = i;
        if (nc == 0) {
            n_prev = -1;
            continue;
        }
        qsort_r(cur, (size_t)nc, sizeof *cur, cmp_holder, (void *)h);
        /* Same holders as the piece just before and touching it: extend it. */
        if (n_prev == nc && out->n_pieces > 0 && out->pieces[out->n_pieces - 1].end == a &&
            !memcmp(prev, cur, sizeof *cur * (size_t)nc)) {
            out->pieces[out->n_pieces - 1].end = b;
            continue;
        }
        if (out->n_pieces == cap_p) {
            cap_p = cap_p ? 2 * cap_p : 16;
            mal_slice_piece *np = realloc(out->pieces, sizeof *np * (size_t)cap_p);
            if (!np) goto oom;
            out->pieces = np;
        }
        int used = out->n_pieces ? out->pieces[out->n_pieces - 1].first +
                                       out->pieces[out->n_pieces - 1].n_holders
                                 : 0;
        if (used + nc > cap_h) {
            cap_h = 2 * (used + nc);
            int *nh = realloc(out->holders, sizeof *nh * (size_t)cap_h);
            if (!nh) goto oom;
            out->holders = nh;
        }
        memcpy(out->holders + used, cur, sizeof *cur * (size_t)nc);
        out->pieces[out->n_pieces++] = (mal_slice_piece){a, b, nc, used};
        memcpy(prev, cur, sizeof *cur * (size_t)nc);
        n_prev = nc;
    }
    goto out;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "slices: out of memory");
    mal_slices_fini(out);
out:
    free(cuts);
    free(cur);
    free(prev);
    return rc;
}

void mal_slices_fini(mal_slice_map *m)
{
    free(m->pieces);
    free(m->holders);
    memset(m, 0, sizeof *m);
}
