/* The write path of snapshots: the collective writer (begin, declare a
 * shard file with its blocks, stream data into them, finish).  Each shard
 * file is an HDF5 skeleton whose contiguous datasets are filled by pwrite
 * while the CRC-32C of every block is computed on the way; finish closes
 * and fsyncs the shards, hands the block descriptors to rank 0
 * (snap_coord.c), which commits (snap_commit.c), and tells every process
 * the outcome.  mal_snapshot_write(_sharded) are the one-call forms.
 */
#include "snap_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/fileio.h"

/* ---------------------------------------------------------------- writing shards */

/* Refuse early, with a clear message, when the file system cannot hold
 * this process's share: a full disk is the most likely way for a write to
 * fail. */
static int snap_check_space(int dfd, const char *dir, const mal_snap_tensor *t, int n)
{
    struct statvfs sv;
    if (fstatvfs(dfd, &sv) != 0) return 0; /* unknown: let the writes tell */
    uint64_t need = 1u << 20;
    for (int i = 0; i < n; i++)
        need += (uint64_t)snap_count(t[i].ndim, t[i].extent) * sizeof(float) + 4096;
    uint64_t have = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    if (have < need)
        return MAL_ERR(MAL_EIO,
                       "not enough free space in %s for the snapshot: needs about %.1f MiB, "
                       "%.1f MiB available; free space there, or keep fewer snapshots (--keep N "
                       "keeps the newest N)",
                       dir, (double)need / 1048576.0, (double)have / 1048576.0);
    return 0;
}

/* Create the shard file's skeleton and record each block's byte address.
 *
 * HDF5 writes only the skeleton: attributes and datasets whose space is
 * allocated at creation and never filled.  The tensor bytes then go
 * through our own pwrite at each dataset's file offset.  Besides streaming
 * straight from the caller's buffers, this keeps bulk-data I/O errors (a
 * full disk) out of HDF5: HDF5 1.10 leaves a broken file id behind when
 * H5Fclose fails to flush, and the process then crashes in HDF5's atexit
 * handler (h5py issue 914).  The skeleton is a few KiB per block. */
static int snap_shard_create(snap_wshard *s, int64_t step, int tfd, const char *tmp)
{
    int rc = 0;
    hid_t fapl = -1, f = -1, lcpl = -1, dcpl = -1;
    const char *fpath = s->path;
    char open_path[PATH_MAX];
    if ((rc = snap_fd_path(open_path, sizeof open_path, tfd, s->fname, tmp))) return rc;
    if ((fapl = snap_fapl()) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up the HDF5 file access list", fpath);
        goto done;
    }
    if ((rc = snap_file_create(open_path, fpath, fapl, &f))) goto done;
    int32_t id = s->id;
    if ((rc = snap_write_root_attrs(f, step, fpath)) ||
        (rc = snap_attr_write(f, "shard", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &id, fpath,
                              "the root group")) ||
        (rc = snap_plists(&lcpl, &dcpl, fpath)))
        goto done;
    for (int i = 0; i < s->n; i++) {
        snap_wblock *b = &s->b[i];
        hsize_t dims[MAL_SNAP_MAXDIM];
        for (int d = 0; d < b->ndim; d++)
            dims[d] = (hsize_t)b->extent[d];
        char dname[1100], obj[1200];
        snap_block_dset(dname, sizeof dname, b->name, b->ndim, b->offset);
        snprintf(obj, sizeof obj, "a block of tensor '%s'", b->name);
        hid_t sp = H5Screate_simple(b->ndim, dims, NULL), ds = -1;
        if (sp < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot make the dataspace of %s", fpath, obj);
            goto done;
        }
        ds = H5Dcreate2(f, dname, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
        H5Sclose(sp);
        if (ds < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot create the dataset of %s", fpath, obj);
            goto done;
        }
        haddr_t a = H5Dget_offset(ds);
        hsize_t nd = (hsize_t)b->ndim;
        if (a == HADDR_UNDEF) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: no file space was allocated for %s", fpath, obj);
        } else if (!(rc = snap_attr_write(ds, "global_shape", H5T_STD_I64LE, H5T_NATIVE_INT64, nd,
                                          b->shape, fpath, obj)) &&
                   !(rc = snap_attr_write(ds, "block_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, nd,
                                          b->offset, fpath, obj))) {
            rc = snap_attr_write(ds, "block_extent", H5T_STD_I64LE, H5T_NATIVE_INT64, nd, b->extent,
                                 fpath, obj);
        }
        b->addr = (uint64_t)a;
        if (H5Dclose(ds) < 0 && !rc)
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close the dataset of %s", fpath, obj);
        if (rc) goto done;
    }
    rc = snap_h5close(&f, fpath);
done:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (f >= 0) {
        int r = snap_h5close(&f, fpath);
        if (!rc) rc = r;
    }
    if (fapl >= 0) H5Pclose(fapl);
    return rc;
}

static void snap_wshard_free(snap_wshard *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    for (int i = 0; i < s->n; i++)
        free(s->b[i].name);
    free(s->b);
    s->b = NULL;
    s->n = 0;
}

static void snap_writer_free(mal_snap_writer *w)
{
    if (!w) return;
    if (w->tfd >= 0) close(w->tfd);
    if (w->dfd >= 0) close(w->dfd);
    for (int i = 0; i < w->n_sh; i++)
        snap_wshard_free(&w->sh[i]);
    free(w->sh);
    free(w->counts);
    snap_meta_free(&w->meta);
    free(w);
}

/* Rank 0's part of begin: checks, names, the temporary directory.  Every
 * name below `dir` is then used relative to w->dfd. */
static int snap_begin_root(mal_snap_writer *w, const char *dir, const mal_snap_meta *meta)
{
    int rc;
    if (meta->step < 0 || meta->consumed_samples < 0)
        return MAL_ERR(MAL_EINVAL,
                       "snapshot meta: step %lld and consumed_samples %lld must be >= 0",
                       (long long)meta->step, (long long)meta->consumed_samples);
    /* a random part: nobody can plant a link at the name in advance */
    if ((rc = snap_tmp_name(w->tmpname, sizeof w->tmpname, w->stepname)) ||
        (rc = snap_join(w->final, sizeof w->final, dir, w->stepname)) ||
        (rc = snap_join(w->tmp, sizeof w->tmp, dir, w->tmpname)))
        return rc;
    if (strlen(w->tmp) + 32 >= PATH_MAX)
        return MAL_ERR(MAL_EINVAL, "snapshot directory name %s is too long", dir);
    if ((rc = snap_mkdirs(dir, &w->made))) return rc;
    if ((w->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return MAL_ERR(MAL_EIO, "cannot open snapshot directory %s: %s", dir, strerror(errno));
    /* A committed snapshot of this step is trusted: never replace it.  An
     * uncommitted one is debris of a crash and goes.  Anything else at
     * that name (a link, a file) is not ours to remove. */
    struct stat st;
    if (fstatat(w->dfd, w->stepname, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISDIR(st.st_mode))
            return MAL_ERR(MAL_EINVAL,
                           "%s is %s, not a snapshot directory: the snapshot of step %lld cannot "
                           "be written there; move it away or write to another directory",
                           w->final, mal_file_kind(st.st_mode), (long long)meta->step);
        if (snap_has_marker_at(w->dfd, w->stepname))
            return MAL_ERR(MAL_EINVAL,
                           "a committed snapshot of step %lld already exists at %s; remove it or "
                           "write to another directory",
                           (long long)meta->step, w->final);
        if ((rc = snap_rmtree_at(w->dfd, w->stepname, w->final))) return rc;
    }
    if (snap_fault() || mkdirat(w->dfd, w->tmpname, 0755) != 0)
        return MAL_ERR(MAL_EIO, "cannot create %s: %s", w->tmp, strerror(errno));
    return 0;
}

int mal_snap_writer_begin(mal_snap_writer **out, mal_comm *comm, const char *dir,
                          const mal_snap_meta *meta)
{
    if (!out || !dir || !meta)
        return MAL_ERR(MAL_EINVAL, "mal_snap_writer_begin: out, dir and meta must not be NULL");
    *out = NULL;
    snap_h5quiet q;
    snap_h5quiet_begin(&q);
    int rc = 0;
    mal_snap_writer *w = calloc(1, sizeof *w);
    struct {
        int rc;
        char msg[SNAP_MSG];
        char tmp[PATH_MAX], final[PATH_MAX], tmpname[NAME_MAX + 1];
    } *res = calloc(1, sizeof *res);
    if (!w || !res) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory starting a snapshot");
        goto done; /* only an allocation this small failing: peers would wait */
    }
    w->dfd = w->tfd = -1;
    w->comm = comm;
    w->rank = comm ? comm->rank : 0;
    w->size = comm ? comm->size : 1;
    snprintf(w->stepname, sizeof w->stepname, SNAP_STEP_PREFIX "%08lld", (long long)meta->step);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    if (w->rank == 0) {
        w->counts = calloc((size_t)w->size, sizeof *w->counts);
        res->rc = !w->counts ? MAL_ERR(MAL_ENOMEM, "out of memory starting a snapshot")
                             : snap_begin_root(w, dir, meta);
        if (res->rc) snap_unmkdirs(w->dir, &w->made);
        if (res->rc) snprintf(res->msg, sizeof res->msg, "%s", mal_errmsg());
        memcpy(res->tmp, w->tmp, sizeof w->tmp);
        memcpy(res->final, w->final, sizeof w->final);
        memcpy(res->tmpname, w->tmpname, sizeof w->tmpname);
    }
    if (comm && comm->size > 1 && (rc = mal_comm_broadcast(comm, res, sizeof *res, 0))) goto done;
    if (res->rc) {
        rc = res->rc;
        if (w->rank != 0) MAL_ERR(rc, "rank 0: %s", res->msg);
        goto done;
    }
    memcpy(w->tmp, res->tmp, sizeof w->tmp);
    memcpy(w->final, res->final, sizeof w->final);
    memcpy(w->tmpname, res->tmpname, sizeof w->tmpname);
    /* Every file of the snapshot is created relative to the temporary
     * directory as opened now (not through a link): a directory swapped in
     * at its name later cannot redirect a shard. */
    w->tfd = w->rank == 0 ? openat(w->dfd, w->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                                            O_CLOEXEC)
                          : open(w->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (w->tfd < 0) {
        /* peers went on: finish() reports it collectively */
        w->pending_rc = MAL_ERR(MAL_EIO, "cannot open %s: %s", w->tmp, strerror(errno));
        snprintf(w->pending_msg, sizeof w->pending_msg, "%s", mal_errmsg());
    }
    /* the whole meta, its strings copied: a new field is carried too */
    if ((rc = snap_meta_copy(&w->meta, meta)) && !w->pending_rc) {
        w->pending_rc = rc;
        snprintf(w->pending_msg, sizeof w->pending_msg, "%s", mal_errmsg());
    }
    w->kill = snap_kill_point(w->rank, meta->step);
    *out = w;
    w = NULL;
    rc = 0;
done:
    snap_writer_free(w);
    free(res);
    snap_h5quiet_end(&q);
    return rc;
}

int mal_snap_writer_add_shard(mal_snap_writer *w, int shard, const mal_snap_tensor *blocks, int n)
{
    if (!w || shard < 0 || n < 0 || (n > 0 && !blocks))
        return MAL_ERR(MAL_EINVAL, "mal_snap_writer_add_shard: bad arguments (shard %d, n %d)",
                       shard, n);
    for (int i = 0; i < w->n_sh; i++)
        if (w->sh[i].id == shard)
            return MAL_ERR(MAL_EINVAL, "shard %d of the snapshot is declared twice", shard);
    int rc = 0;
    char **names = NULL;
    for (int i = 0; i < n; i++)
        if ((rc = snap_check_block(&blocks[i]))) return rc;
    /* distinct tensors of one shard: no tensor inside another's group */
    names = malloc(sizeof *names * ((size_t)n + 1));
    if (!names) return MAL_ERR(MAL_ENOMEM, "out of memory declaring shard %d", shard);
    for (int i = 0; i < n; i++)
        names[i] = (char *)blocks[i].name;
    qsort(names, (size_t)n, sizeof *names, snap_cmp_str);
    int nu = 0;
    for (int i = 0; i < n; i++)
        if (nu == 0 || strcmp(names[nu - 1], names[i])) names[nu++] = names[i];
    rc = snap_check_names_disjoint(names, nu);
    free(names);
    if (rc) return rc;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(blocks[i].name, blocks[j].name) &&
                !memcmp(blocks[i].offset, blocks[j].offset,
                        sizeof(int64_t) * (size_t)blocks[i].ndim))
                return MAL_ERR(MAL_EINVAL, "tensor '%s': shard %d declares the same block twice",
                               blocks[i].name, shard);
    if (mal_grow(&w->sh, &w->cap_sh, w->n_sh, sizeof *w->sh, 4))
        return MAL_ERR(MAL_ENOMEM, "out of memory declaring shard %d", shard);
    snap_wshard *s = &w->sh[w->n_sh];
    memset(s, 0, sizeof *s);
    s->id = shard;
    s->fd = -1;
    snprintf(s->fname, sizeof s->fname, SNAP_SHARD_FMT, shard);
    if ((rc = snap_join(s->path, sizeof s->path, w->tmp, s->fname))) return rc;
    if (w->tfd < 0) return MAL_ERR(w->pending_rc, "%s", w->pending_msg);
    s->b = calloc((size_t)n + 1, sizeof *s->b);
    if (!s->b) return MAL_ERR(MAL_ENOMEM, "out of memory declaring shard %d", shard);
    for (int i = 0; i < n; i++) {
        snap_wblock *b = &s->b[i];
        const mal_snap_tensor *t = &blocks[i];
        if (!(b->name = strdup(t->name))) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory declaring shard %d", shard);
            break;
        }
        s->n = i + 1;
        b->ndim = t->ndim;
        memcpy(b->shape, t->shape, sizeof b->shape);
        memcpy(b->offset, t->offset, sizeof b->offset);
        memcpy(b->extent, t->extent, sizeof b->extent);
        for (int d = t->ndim; d < MAL_SNAP_MAXDIM; d++) {
            b->shape[d] = b->extent[d] = 1;
            b->offset[d] = 0;
        }
        b->count = snap_count(t->ndim, t->extent);
    }
    snap_h5quiet q;
    snap_h5quiet_begin(&q);
    if (!rc && !(rc = snap_check_space(w->tfd, w->tmp, blocks, n)) &&
        !(rc = snap_shard_create(s, w->meta.step, w->tfd, w->tmp))) {
        s->fd = snap_fault() ? -1 : openat(w->tfd, s->fname, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
        if (s->fd < 0)
            rc = MAL_ERR(MAL_EIO, "cannot open %s to write tensor data: %s", s->path,
                         strerror(errno));
    }
    snap_h5quiet_end(&q);
    if (rc) {
        snap_wshard_free(s);
        unlinkat(w->tfd, s->fname, 0);
        return rc;
    }
    return w->n_sh++;
}

int mal_snap_writer_put(mal_snap_writer *w, int h, int block, const float *data, size_t n)
{
    if (!w || h < 0 || h >= w->n_sh || block < 0 || block >= w->sh[h].n || (n && !data))
        return MAL_ERR(MAL_EINVAL, "mal_snap_writer_put: bad arguments (shard handle %d, block %d)",
                       h, block);
    snap_wshard *s = &w->sh[h];
    snap_wblock *b = &s->b[block];
    if ((int64_t)n > b->count - b->written)
        return MAL_ERR(MAL_EINVAL,
                       "tensor '%s': %zu more floats for a block of %lld with %lld written",
                       b->name, n, (long long)b->count, (long long)b->written);
    b->crc = mal_crc32c(b->crc, data, n * sizeof(float));
    int rc =
        snap_pwrite_all(s->fd, data, n * sizeof(float),
                        (off_t)(b->addr + (uint64_t)b->written * sizeof(float)), s->path, b->name);
    if (rc) return rc;
    b->written += (int64_t)n;
    if (w->kill == SNAP_KILL_DATA && b->written == b->count)
        snap_die(w->rank, "after writing its first block");
    return 0;
}

/* Check completeness, fsync and close every shard of this process. */
static int snap_close_shards(mal_snap_writer *w)
{
    for (int i = 0; i < w->n_sh; i++) {
        snap_wshard *s = &w->sh[i];
        for (int k = 0; k < s->n; k++)
            if (s->b[k].written != s->b[k].count)
                return MAL_ERR(MAL_EINVAL,
                               "%s: a block of tensor '%s' got %lld of its %lld floats: the "
                               "writer stopped before writing all it declared",
                               s->path, s->b[k].name, (long long)s->b[k].written,
                               (long long)s->b[k].count);
        if (snap_fault() || fsync(s->fd) != 0)
            return MAL_ERR(MAL_EIO, "fsync of %s failed: %s", s->path, strerror(errno));
        struct stat st;
        if (fstat(s->fd, &st) != 0)
            return MAL_ERR(MAL_EIO, "cannot stat %s: %s", s->path, strerror(errno));
        s->bytes = (uint64_t)st.st_size;
        int fd = s->fd;
        s->fd = -1;
        if (close(fd) != 0)
            return MAL_ERR(MAL_EIO, "cannot close %s: %s", s->path, strerror(errno));
    }
    return 0;
}

int mal_snap_writer_finish(mal_snap_writer *w, int local_rc, int keep_last, char *out_path,
                           size_t out_len)
{
    if (!w) return MAL_ERR(MAL_EINVAL, "mal_snap_writer_finish: no writer");
    snap_h5quiet q;
    snap_h5quiet_begin(&q);
    int rc = local_rc;
    if (!rc && w->pending_rc) rc = MAL_ERR(w->pending_rc, "%s", w->pending_msg);
    if (!rc && keep_last < 0) rc = MAL_ERR(MAL_EINVAL, "keep_last %d must be >= 0", keep_last);
    if (!rc && out_path && strlen(w->final) >= out_len)
        rc = MAL_ERR(MAL_EINVAL, "snapshot path %s does not fit the caller's %zu-byte buffer",
                     w->final, out_len);
    if (!rc) rc = snap_close_shards(w);
    for (int i = 0; i < w->n_sh; i++)
        if (w->sh[i].fd >= 0) {
            close(w->sh[i].fd);
            w->sh[i].fd = -1;
        }

    snap_buf mine = {0};
    if (snap_serialize(w, rc, &mine)) {
        /* cannot even describe ourselves: send a bare failure */
        free(mine.p);
        memset(&mine, 0, sizeof mine);
        if (!rc) rc = MAL_ENOMEM;
        snap_put_i32(&mine, rc);
        snap_put_str(&mine, "out of memory describing the shards");
    }
    struct {
        int rc, failed;
        char msg[SNAP_MSG];
    } res = {0, -1, ""};
    size_t *counts = w->counts, one_count = 0;
    char *all = NULL;
    int comm_rc = 0, multi = w->comm && w->size > 1;
    if (multi) {
        if ((comm_rc = snap_gather(w, &mine, &all))) goto comm_failed;
    } else {
        all = mine.p;
        mine.p = NULL;
        counts = &one_count;
        one_count = mine.len;
    }

    if (w->rank == 0) {
        snap_table t = {0};
        size_t at = 0;
        for (int r = 0; r < w->size; r++) {
            int status = 0;
            const char *msg = NULL;
            int prc = snap_parse(&t, all + at, counts[r], r, &status, &msg);
            at += counts[r];
            if (prc && res.failed < 0) {
                res.rc = prc;
                res.failed = 0;
                snprintf(res.msg, sizeof res.msg, "%s", mal_errmsg());
            }
            if (status && res.failed < 0) {
                res.rc = status;
                res.failed = r;
                snprintf(res.msg, sizeof res.msg, "%s", msg);
            }
        }
        if (res.failed >= 0) {
            if (snap_rmtree_at(w->dfd, w->tmpname, w->tmp))
                mal_log(MAL_LOG_WARN, "snapshot: could not remove %s: %s", w->tmp, mal_errmsg());
        } else if ((res.rc = snap_commit_root(w, &t, keep_last))) {
            res.failed = 0;
            snprintf(res.msg, sizeof res.msg, "%s", mal_errmsg());
        }
        snap_table_free(&t);
    }
    if (multi && (comm_rc = mal_comm_broadcast(w->comm, &res, sizeof res, 0))) goto comm_failed;
    rc = res.rc;
    if (rc && w->rank != res.failed) MAL_ERR(rc, "rank %d: %s", res.failed, res.msg);
    if (!rc && out_path) snprintf(out_path, out_len, "%s", w->final);
    goto done;
comm_failed:
    rc = comm_rc;
done:
    /* nothing committed: the directories begin made for it go too */
    if (rc && w->rank == 0) snap_unmkdirs(w->dir, &w->made);
    free(all);
    free(mine.p);
    snap_writer_free(w);
    snap_h5quiet_end(&q);
    return rc;
}

int mal_snapshot_write_sharded(mal_comm *comm, const char *dir, const mal_snap_meta *meta,
                               const mal_snap_tensor *t, int n, int keep_last, char *out_path,
                               size_t out_len)
{
    if (!dir || !meta || n < 0 || (n > 0 && !t) || keep_last < 0)
        return MAL_ERR(MAL_EINVAL,
                       "mal_snapshot_write: bad arguments (dir, meta, tensors, n = %d, "
                       "keep_last = %d)",
                       n, keep_last);
    mal_snap_writer *w;
    int rc = mal_snap_writer_begin(&w, comm, dir, meta), lrc = 0, h = -1;
    if (rc) return rc;
    for (int i = 0; i < n && !lrc; i++)
        if (!t[i].data)
            lrc = MAL_ERR(MAL_EINVAL, "tensor '%s' has no data buffer", t[i].name ? t[i].name : "");
    if (!lrc && n > 0 && (h = mal_snap_writer_add_shard(w, comm ? comm->rank : 0, t, n)) < 0)
        lrc = h;
    for (int i = 0; i < n && !lrc; i++)
        lrc = mal_snap_writer_put(w, h, i, t[i].data, (size_t)snap_count(t[i].ndim, t[i].extent));
    return mal_snap_writer_finish(w, lrc, keep_last, out_path, out_len);
}

int mal_snapshot_write(const char *dir, const mal_snap_meta *meta, const mal_snap_tensor *t, int n,
                       int keep_last, char *out_path, size_t out_len)
{
    return mal_snapshot_write_sharded(NULL, dir, meta, t, n, keep_last, out_path, out_len);
}
