/* The read path of snapshots: opening a committed step directory (marker,
 * index checksum, block table, shard sizes), describing its tensors and
 * blocks, and reading any block of any tensor assembled from the stored
 * blocks it touches, each streamed through a fixed buffer and verified
 * against its CRC-32C.
 */
#include "snap_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int mal_snapshot_open(mal_snapshot **out, const char *step_dir)
{
    int rc = 0;
    mal_snapshot *s = NULL;
    struct stat st;
    mal_snap_marker mk;
    char ipath[PATH_MAX], *ibuf = NULL;
    size_t ilen = 0;
    snap_h5quiet q;
    snap_h5quiet_begin(&q);

    if (!out || !step_dir) {
        rc = MAL_ERR(MAL_EINVAL, "mal_snapshot_open: out and step_dir must not be NULL");
        goto done;
    }
    *out = NULL;
    if (stat(step_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = MAL_ERR(MAL_ENOENT, "snapshot directory %s does not exist", step_dir);
        goto done;
    }
    if ((rc = snap_read_marker(step_dir, &mk))) goto done;
    if ((rc = snap_join(ipath, sizeof ipath, step_dir, SNAP_INDEX_FILE))) goto done;
    if (stat(ipath, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = MAL_ERR(MAL_ECORRUPT, "committed snapshot %s lacks its index %s", step_dir, ipath);
        goto done;
    }
    /* The index is read whole (the marker bounds its size), checked
     * against the marker, then parsed from memory. */
    uint32_t icrc = 0;
    if ((uint64_t)st.st_size == (uint64_t)mk.index_bytes) {
        if ((rc = snap_read_file(ipath, (size_t)mk.index_bytes, &ibuf, &ilen))) goto done;
        icrc = mal_crc32c(0, ibuf, ilen);
    }
    if ((uint64_t)st.st_size != (uint64_t)mk.index_bytes || ilen != (size_t)mk.index_bytes ||
        icrc != mk.index_crc32c) {
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s (%lld bytes, CRC-32C %s%08x) does not match its COMPLETE marker (%lld "
                     "bytes, 0x%08x): the snapshot was altered after it was written; resume from "
                     "an earlier snapshot",
                     ipath, (long long)st.st_size, ibuf ? "0x" : "not computed, ", icrc,
                     (long long)mk.index_bytes, mk.index_crc32c);
        goto done;
    }
    if ((rc = mal_snapshot_parse_index(&s, ibuf, ilen, ipath))) goto done;
    free(ibuf);
    ibuf = NULL;
    const mal_snap_meta *m = &s->meta;
    if (m->step != mk.step || s->n_t != mk.n_tensors || s->n_b != mk.n_blocks ||
        s->n_s != mk.n_shards) {
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s says step %lld, %d tensors, %lld blocks, %d shards but its COMPLETE "
                     "marker says %lld, %lld, %lld, %lld",
                     ipath, (long long)m->step, s->n_t, (long long)s->n_b, s->n_s,
                     (long long)mk.step, (long long)mk.n_tensors, (long long)mk.n_blocks,
                     (long long)mk.n_shards);
        goto done;
    }
    if (!(s->dir = strdup(step_dir))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory opening %s", step_dir);
        goto done;
    }
    for (int i = 0; i < s->n_s; i++) {
        char p[PATH_MAX];
        if ((rc = snap_join(p, sizeof p, step_dir, s->s[i].file))) goto done;
        if (stat(p, &st) != 0) {
            rc = MAL_ERR(MAL_ECORRUPT, "shard file %s of snapshot %s is missing: %s", p, step_dir,
                         strerror(errno));
            goto done;
        }
        if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != s->s[i].bytes) {
            rc = MAL_ERR(MAL_ECORRUPT,
                         "shard file %s has %lld bytes but the index recorded %llu: truncated or "
                         "replaced; resume from an earlier snapshot",
                         p, (long long)st.st_size, (unsigned long long)s->s[i].bytes);
            goto done;
        }
    }
    *out = s;
    s = NULL;
done:
    free(ibuf);
    mal_snapshot_close(s);
    snap_h5quiet_end(&q);
    return rc;
}

const mal_snap_meta *mal_snapshot_meta(const mal_snapshot *s)
{
    return &s->meta;
}

int mal_snapshot_n_tensors(const mal_snapshot *s)
{
    return s->n_t;
}

int mal_snapshot_tensor_info(const mal_snapshot *s, int i, mal_snap_tensor *info)
{
    if (!s || !info || i < 0 || i >= s->n_t)
        return MAL_ERR(MAL_EINVAL, "tensor index %d out of range (snapshot has %d)", i,
                       s ? s->n_t : 0);
    const snap_tinfo *t = &s->t[i];
    memset(info, 0, sizeof *info);
    info->name = t->name;
    info->ndim = t->ndim;
    memcpy(info->shape, t->shape, sizeof t->shape);
    memcpy(info->extent, t->shape, sizeof t->shape);
    return 0;
}

int mal_snapshot_n_blocks(const mal_snapshot *s, int i)
{
    return s && i >= 0 && i < s->n_t ? (int)s->t[i].n : 0;
}

int mal_snapshot_block_info(const mal_snapshot *s, int i, int k, mal_snap_tensor *info,
                            const char **file)
{
    if (!s || !info || i < 0 || i >= s->n_t || k < 0 || k >= s->t[i].n)
        return MAL_ERR(MAL_EINVAL, "block %d of tensor %d out of range", k, i);
    const snap_block *b = &s->b[s->t[i].first + k];
    memset(info, 0, sizeof *info);
    info->name = b->name;
    info->ndim = b->ndim;
    memcpy(info->shape, b->shape, sizeof b->shape);
    memcpy(info->offset, b->offset, sizeof b->offset);
    memcpy(info->extent, b->extent, sizeof b->extent);
    if (file) *file = s->s[b->shard].file;
    return 0;
}

uint64_t mal_snapshot_bytes_read(const mal_snapshot *s)
{
    return s ? s->bytes_read : 0;
}

int mal_snapshot_read_fn(void *snapshot, const mal_snap_tensor *want)
{
    return mal_snapshot_read_block(snapshot, want);
}

int mal_snapshot_has_group(const mal_snapshot *s, const char *group)
{
    size_t n = strlen(group);
    for (int i = 0; i < mal_snapshot_n_tensors(s); i++) {
        mal_snap_tensor info;
        if (!mal_snapshot_tensor_info(s, i, &info) && !strncmp(info.name, group, n) &&
            info.name[n] == '/')
            return 1;
    }
    return 0;
}

static int snap_cmp_tinfo(const void *a, const void *b)
{
    return strcmp(((const snap_tinfo *)a)->name, ((const snap_tinfo *)b)->name);
}

static int snap_shard_fd(mal_snapshot *s, int i, char *path, size_t len)
{
    int rc = snap_join(path, len, s->dir, s->s[i].file);
    if (rc) return rc;
    if (s->fd[i] >= 0) return 0;
    s->fd[i] = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (s->fd[i] < 0 && (errno == EMFILE || errno == ENFILE)) {
        /* many shards: let go of the others and retry */
        for (int k = 0; k < s->n_s; k++)
            if (s->fd[k] >= 0) {
                close(s->fd[k]);
                s->fd[k] = -1;
            }
        s->fd[i] = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    }
    if (s->fd[i] < 0)
        return MAL_ERR(MAL_EIO, "cannot open shard file %s: %s", path, strerror(errno));
    /* opened non-blocking: something swapped in since the open of the
     * snapshot (a FIFO) is refused here, not waited on */
    struct stat st;
    if (fstat(s->fd[i], &st) != 0 || !S_ISREG(st.st_mode)) {
        close(s->fd[i]);
        s->fd[i] = -1;
        return MAL_ERR(MAL_ECORRUPT, "shard file %s is no longer a regular file", path);
    }
    return 0;
}

/* Stream stored block b through the chunk buffer, verify its checksum and
 * copy its intersection with the wanted block w into w->data.
 *
 * The intersection is a set of runs: one per index of its leading
 * dimensions, each a contiguous range along the last dimension, ascending
 * in the stored block's row-major order.  A cursor walks them while the
 * chunks go by, so any block size streams through a fixed buffer. */
static int snap_read_stored(mal_snapshot *s, const snap_block *b, const mal_snap_tensor *w)
{
    const int nd = b->ndim;
    int64_t lo[MAL_SNAP_MAXDIM], hi[MAL_SNAP_MAXDIM];
    for (int d = 0; d < nd; d++) {
        lo[d] = MAL_MAX(b->offset[d], w->offset[d]);
        hi[d] = MAL_MIN(b->offset[d] + b->extent[d], w->offset[d] + w->extent[d]);
    }
    char path[PATH_MAX];
    int rc = snap_shard_fd(s, b->shard, path, sizeof path);
    if (rc) return rc;
    const int64_t total = snap_count(nd, b->extent);
    const int64_t chunk = (int64_t)(MAL_SNAP_READ_CHUNK_BYTES / sizeof(float));
    const int64_t run = hi[nd - 1] - lo[nd - 1];
    int64_t idx[MAL_SNAP_MAXDIM]; /* current run: leading indices (global) */
    for (int d = 0; d < nd; d++)
        idx[d] = lo[d];
    int runs_left = 1;
    /* linear position of the current run's start in b and in w */
#define RUN_POS(off, ext, out)                                                                     \
    do {                                                                                           \
        int64_t p_ = 0;                                                                            \
        for (int d_ = 0; d_ < nd; d_++)                                                            \
            p_ = p_ * (ext)[d_] + (idx[d_] - (off)[d_]);                                           \
        (out) = p_;                                                                                \
    } while (0)
    int64_t rb, rw, done_in_run = 0;
    idx[nd - 1] = lo[nd - 1];
    RUN_POS(b->offset, b->extent, rb);
    RUN_POS(w->offset, w->extent, rw);
    uint32_t crc = 0;
    for (int64_t pos = 0; pos < total; pos += chunk) {
        int64_t n = MAL_MIN(chunk, total - pos);
        if ((rc = snap_pread_all(s->fd[b->shard], s->chunk, (size_t)n * sizeof(float),
                                 (off_t)(b->addr + (uint64_t)pos * sizeof(float)), path, b->name)))
            return rc;
        s->bytes_read += (uint64_t)n * sizeof(float);
        crc = mal_crc32c(crc, s->chunk, (size_t)n * sizeof(float));
        while (runs_left) {
            int64_t a = rb + done_in_run, e = rb + run;
            if (a >= pos + n) break; /* starts in a later chunk */
            int64_t stop = MAL_MIN(e, pos + n);
            memcpy(w->data + rw + done_in_run, s->chunk + (a - pos),
                   (size_t)(stop - a) * sizeof(float));
            done_in_run += stop - a;
            if (stop < e) break; /* continues in the next chunk */
            /* next run: odometer over the leading dimensions */
            done_in_run = 0;
            int d = nd - 2;
            for (; d >= 0; d--) {
                if (++idx[d] < hi[d]) break;
                idx[d] = lo[d];
            }
            if (d < 0) {
                runs_left = 0;
                break;
            }
            RUN_POS(b->offset, b->extent, rb);
            RUN_POS(w->offset, w->extent, rw);
        }
    }
#undef RUN_POS
    if (crc != b->crc) {
        char o[128];
        snap_fmt_shape(o, sizeof o, nd, b->offset);
        return MAL_ERR(MAL_ECORRUPT,
                       "%s: the block at %s of tensor '%s' fails its checksum (CRC-32C 0x%08x, "
                       "stored 0x%08x): the file is corrupt; resume from an earlier snapshot",
                       path, o, b->name, crc, b->crc);
    }
    return 0;
}

int mal_snapshot_read_block(mal_snapshot *s, const mal_snap_tensor *want)
{
    if (!s || !want || !want->name || !want->data)
        return MAL_ERR(MAL_EINVAL, "mal_snapshot_read_block: NULL snapshot, block, name or data");
    if (!s->dir)
        return MAL_ERR(MAL_EINVAL, "%s was parsed from memory: it has no files to read from",
                       s->index_path);
    snap_tinfo key = {.name = (char *)want->name};
    const snap_tinfo *t = bsearch(&key, s->t, (size_t)s->n_t, sizeof *s->t, snap_cmp_tinfo);
    if (!t) return MAL_ERR(MAL_ENOENT, "%s has no tensor '%s'", s->index_path, want->name);
    int same = want->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = want->shape[d] == t->shape[d];
    if (!same) {
        char w[128], h[128];
        snap_fmt_shape(w, sizeof w,
                       want->ndim > 0 && want->ndim <= MAL_SNAP_MAXDIM ? want->ndim : 0,
                       want->shape);
        snap_fmt_shape(h, sizeof h, t->ndim, t->shape);
        return MAL_ERR(MAL_EMISMATCH,
                       "%s: tensor '%s' has shape %s but the caller expects %s (model config "
                       "differs from the snapshot's?)",
                       s->index_path, want->name, h, w);
    }
    int rc = snap_check_block(want);
    if (rc) return rc;
    if (!s->chunk && !(s->chunk = malloc(MAL_SNAP_READ_CHUNK_BYTES)))
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", s->index_path);
    for (int64_t k = t->first; k < t->first + t->n; k++) {
        snap_block b = s->b[k];
        int hit = 1;
        for (int d = 0; hit && d < t->ndim; d++)
            hit = b.offset[d] < want->offset[d] + want->extent[d] &&
                  want->offset[d] < b.offset[d] + b.extent[d];
        if (hit && (rc = snap_read_stored(s, &b, want))) return rc;
    }
    return 0;
}

int mal_snapshot_read(mal_snapshot *s, const char *name, int ndim, const int64_t *shape,
                      float *data, size_t n)
{
    if (!s || !name || !shape || !data)
        return MAL_ERR(MAL_EINVAL, "mal_snapshot_read: s, name, shape and data must not be NULL");
    if (ndim < 1 || ndim > MAL_SNAP_MAXDIM)
        return MAL_ERR(MAL_EINVAL, "tensor '%s': ndim %d is outside 1..%d", name, ndim,
                       MAL_SNAP_MAXDIM);
    mal_snap_tensor w = {.name = name, .ndim = ndim, .data = data};
    memcpy(w.shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(w.extent, shape, sizeof(int64_t) * (size_t)ndim);
    /* check the name and shape first so that those errors win */
    snap_tinfo key = {.name = (char *)name};
    const snap_tinfo *t = bsearch(&key, s->t, (size_t)s->n_t, sizeof *s->t, snap_cmp_tinfo);
    if (t) {
        int64_t c = snap_count(t->ndim, t->shape);
        int same = ndim == t->ndim;
        for (int d = 0; same && d < ndim; d++)
            same = shape[d] == t->shape[d];
        if (same && (c < 0 || n < (size_t)c))
            return MAL_ERR(MAL_EINVAL, "tensor '%s' has %lld elements but the buffer holds %zu",
                           name, (long long)c, n);
    }
    return mal_snapshot_read_block(s, &w);
}

void mal_snapshot_close(mal_snapshot *s)
{
    if (!s) return;
    /* the read path's own (open shard files, chunk, directory), then what
     * loading the index allocated, s included */
    for (int i = 0; s->fd && i < s->n_s; i++)
        if (s->fd[i] >= 0) close(s->fd[i]);
    free(s->chunk);
    free(s->dir);
    snap_index_free(s);
}
