/* Block geometry of snapshots: tensor names (HDF5 paths, with the reserved
 * group refused), shapes and element counts with overflow checks, the
 * check that a block lies inside its tensor, that names do not nest, and
 * that the blocks of a tensor tile it exactly (no overlap, no gap, one
 * global shape); and the dataset name of a block inside its shard file.
 * Pure functions of their arguments: no I/O.
 */
#include "snap_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- tensor validation */

void snap_fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

int snap_check_name(const char *name)
{
    if (!name || !name[0]) return MAL_ERR(MAL_EINVAL, "snapshot tensor with an empty name");
    if (strlen(name) > 900)
        return MAL_ERR(MAL_EINVAL, "snapshot tensor name '%.60s...' is longer than 900 bytes",
                       name);
    const char *p = name;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return MAL_ERR(MAL_EINVAL,
                           "snapshot tensor name '%s' has an empty, '.' or '..' component; "
                           "use paths like \"param/layers.0.wq\"",
                           name);
        if (p == name && len == strlen(SNAP_TABLE) && strncmp(p, SNAP_TABLE, len) == 0)
            return MAL_ERR(MAL_EINVAL,
                           "snapshot tensor name '%s': the group '%s' is reserved for the "
                           "block table",
                           name, SNAP_TABLE);
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* Number of elements of a block; -1 on overflow. */
int64_t snap_count(int ndim, const int64_t *ext)
{
    int64_t c = 1;
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(c, ext[d], &c) || c > INT64_MAX / 4) return -1;
    return c;
}

/* A block description (data not looked at): name, ndim, and the block
 * inside the shape. */
int snap_check_block(const mal_snap_tensor *t)
{
    int rc = snap_check_name(t->name);
    if (rc) return rc;
    if (t->ndim < 1 || t->ndim > MAL_SNAP_MAXDIM)
        return MAL_ERR(MAL_EINVAL, "tensor '%s': ndim %d is outside 1..%d", t->name, t->ndim,
                       MAL_SNAP_MAXDIM);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 1 || t->extent[d] < 1 || t->offset[d] < 0 ||
            t->offset[d] > t->shape[d] - t->extent[d]) {
            char s[128], o[128], x[128];
            snap_fmt_shape(s, sizeof s, t->ndim, t->shape);
            snap_fmt_shape(o, sizeof o, t->ndim, t->offset);
            snap_fmt_shape(x, sizeof x, t->ndim, t->extent);
            return MAL_ERR(MAL_EINVAL,
                           "tensor '%s': block offset %s extent %s does not fit in shape %s "
                           "(dimensions must be >= 1)",
                           t->name, o, x, s);
        }
    }
    if (snap_count(t->ndim, t->shape) < 0)
        return MAL_ERR(MAL_EINVAL, "tensor '%s' is too large", t->name);
    return 0;
}

int snap_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names must be unique, and no name may be a group on the path of another
 * ("a" and "a/b"): HDF5 cannot have both.  `v` is sorted (strcmp). */
int snap_check_names_disjoint(char *const *v, int n)
{
    for (int i = 0; i + 1 < n; i++)
        if (strcmp(v[i], v[i + 1]) == 0)
            return MAL_ERR(MAL_EINVAL, "tensor name '%s' appears twice in the snapshot", v[i]);
    for (int i = 0; i < n; i++) {
        char prefix[1024];
        const char *name = v[i];
        for (const char *s = strchr(name, '/'); s; s = strchr(s + 1, '/')) {
            size_t len = (size_t)(s - name);
            if (len >= sizeof prefix) break;
            memcpy(prefix, name, len);
            prefix[len] = '\0';
            char *key = prefix;
            if (bsearch(&key, v, (size_t)n, sizeof *v, snap_cmp_str))
                return MAL_ERR(MAL_EINVAL,
                               "tensor '%s' lies inside tensor '%s': a name cannot be both a "
                               "tensor and a group; rename one of them",
                               name, prefix);
        }
    }
    return 0;
}

int snap_cmp_block(const void *a, const void *b)
{
    const snap_block *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    for (int d = 0; d < x->ndim && d < y->ndim; d++)
        if (x->offset[d] != y->offset[d]) return x->offset[d] < y->offset[d] ? -1 : 1;
    return 0;
}

static int snap_blocks_overlap(const snap_block *x, const snap_block *y)
{
    for (int d = 0; d < x->ndim; d++)
        if (!(x->offset[d] < y->offset[d] + y->extent[d] &&
              y->offset[d] < x->offset[d] + x->extent[d]))
            return 0;
    return 1;
}

/* The n blocks of one tensor (sorted by offset) tile its shape exactly:
 * same shape everywhere, volumes adding up, no two overlapping. */
int snap_check_tiling(const snap_block *b, int64_t n, int64_t max_pairwise)
{
    const char *name = b[0].name;
    char s1[128], s2[128];
    for (int64_t i = 1; i < n; i++) {
        int same = b[i].ndim == b[0].ndim;
        for (int d = 0; same && d < b[0].ndim; d++)
            same = b[i].shape[d] == b[0].shape[d];
        if (!same) {
            snap_fmt_shape(s1, sizeof s1, b[0].ndim, b[0].shape);
            snap_fmt_shape(s2, sizeof s2, b[i].ndim, b[i].shape);
            return MAL_ERR(MAL_EINVAL,
                           "tensor '%s': its blocks disagree on the global shape (%s and %s); "
                           "every writer must describe the same tensor",
                           name, s1, s2);
        }
    }
    int64_t total = snap_count(b[0].ndim, b[0].shape), sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += snap_count(b[i].ndim, b[i].extent);
    /* Blocks that all span the full shape except along one dimension d
     * (slabs, the usual case) are sorted along d: neighbours suffice. */
    int slab_dim = -1;
    for (int d = 0; d < b[0].ndim && slab_dim < 0; d++) {
        int ok = 1;
        for (int64_t i = 0; ok && i < n; i++)
            for (int e = 0; ok && e < b[0].ndim; e++)
                if (e != d && (b[i].offset[e] != 0 || b[i].extent[e] != b[0].shape[e])) ok = 0;
        if (ok) slab_dim = d;
    }
    int64_t bad_i = -1, bad_j = -1;
    if (slab_dim >= 0) {
        for (int64_t i = 0; bad_i < 0 && i + 1 < n; i++)
            if (b[i + 1].offset[slab_dim] < b[i].offset[slab_dim] + b[i].extent[slab_dim])
                bad_i = i, bad_j = i + 1;
    } else if (n <= max_pairwise) {
        for (int64_t i = 0; bad_i < 0 && i < n; i++)
            for (int64_t j = i + 1; bad_i < 0 && j < n; j++)
                if (snap_blocks_overlap(&b[i], &b[j])) bad_i = i, bad_j = j;
    }
    if (bad_i >= 0) {
        snap_fmt_shape(s1, sizeof s1, b[0].ndim, b[bad_i].offset);
        snap_fmt_shape(s2, sizeof s2, b[0].ndim, b[bad_j].offset);
        return MAL_ERR(MAL_EINVAL,
                       "tensor '%s': the blocks at offsets %s and %s overlap (an element "
                       "would be stored twice); every element must have exactly one writer",
                       name, s1, s2);
    }
    if (sum != total) {
        snap_fmt_shape(s1, sizeof s1, b[0].ndim, b[0].shape);
        return MAL_ERR(MAL_EINVAL,
                       "tensor '%s' of shape %s: its %lld block(s) cover %lld of %lld "
                       "elements; every element must be written by exactly one process",
                       name, s1, (long long)n, (long long)sum, (long long)total);
    }
    return 0;
}

/* The dataset of a block inside its shard file: "<tensor>/block_<o0>_<o1>..". */
void snap_block_dset(char *out, size_t len, const char *name, int ndim, const int64_t *offset)
{
    size_t k = (size_t)snprintf(out, len, "%s/block", name);
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(out + k, len - k, "_%lld", (long long)offset[d]);
}
