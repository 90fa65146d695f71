/* Sharded training-state snapshots in HDF5, committed atomically.
 *
 * On-disk layout (format "malleus-snapshot", format_version 2):
 *
 *   DIR/latest                 text "step_NNNNNNNN\n": the newest committed snapshot
 *   DIR/step_NNNNNNNN/         one directory per snapshot (step zero-padded to 8)
 *       shard_RRRRR.h5         blocks written by one process (usually rank R's)
 *       index.h5               meta, block table, one virtual dataset per tensor
 *       COMPLETE               completion marker, JSON, written last
 *   DIR/.tmp-*.<pid>@<host>    work in progress of a writer (rank 0's pid and host)
 *
 * shard_RRRRR.h5: root attributes format, format_version, step, shard (int32);
 * one float32 little-endian contiguous dataset per block at
 * "<tensor name>/block_<o0>_<o1>..." (o = the block's offset), whose
 * dimensions are the block's extent, with attributes global_shape,
 * block_offset, block_extent (int64[ndim]).  Contiguous, allocated at
 * creation, so every block is one byte range of the file; HDF5 writes only
 * the skeleton and the data goes in with pwrite (see snap_shard_create).
 *
 * index.h5: root attributes format, format_version (int32), step,
 * consumed_samples (int64), seed, rng_counter (uint64), config_json,
 * train_json, plan_json (UTF-8 strings, absent = NULL), n_tensors,
 * n_blocks, n_shards (int64).  Group /_malleus holds the block table:
 *   shards        string[n_shards]   shard file names, relative to the step dir
 *   shard_bytes   uint64[n_shards]   each shard file's size
 *   tensors       string[n_tensors]  tensor names, byte-wise sorted
 *   tensor_ndim   int32[n_tensors]
 *   tensor_shape  int64[n_tensors][4]   (unused dimensions 1)
 *   tensor_first_block, tensor_n_blocks   int64[n_tensors]: blocks of tensor
 *                 i are rows first .. first+n-1 of the block arrays
 *   block_shard   int32[n_blocks]    index into shards
 *   block_offset, block_extent   int64[n_blocks][4]
 *   block_addr    uint64[n_blocks]   byte address of the block's data in its shard
 *   block_crc32c  uint32[n_blocks]   CRC-32C of the block's little-endian bytes
 * Every tensor is also an HDF5 virtual dataset at its own name (float32,
 * the global shape; attributes global_shape and n_blocks) mapping each block
 * to its dataset in its shard file by a *relative* file name, so h5py or
 * h5dump read a whole tensor from index.h5 wherever the directory lives.
 *
 * COMPLETE is a small JSON object:
 *   {"format": "malleus-snapshot", "format_version": 2, "step": S,
 *    "n_tensors": N, "n_blocks": B, "n_shards": K,
 *    "index_bytes": L, "index_crc32c": C}
 * C is the CRC-32C of the whole index.h5, which the reader checks before
 * trusting the table; the table's per-block checksums then cover the data,
 * verified whenever a block is read, and the shard sizes are checked at open.
 *
 * Commit protocol (crash-safe on a POSIX file system): rank 0 creates
 * .tmp-step_S.<pid>@<host> and broadcasts its name; every process writes
 * and fsyncs its shard files there; rank 0 gathers the block descriptors
 * (which also tells it that every process finished), checks that the blocks
 * tile every tensor exactly once, writes and fsyncs index.h5 and the
 * directory, renames it to step_S, fsyncs DIR, writes COMPLETE through a
 * temporary file (fsync, rename, fsync the step directory), then moves
 * `latest` the same way.  A directory without COMPLETE is never trusted;
 * `latest` only ever names a directory that had COMPLETE first.  Removal
 * goes in the opposite order: COMPLETE is unlinked before anything else.
 */
#include "snapshot.h"

#include "comm_mpi.h"
#include "mal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Checksums are defined over little-endian bytes and computed on the host
 * buffer directly; a big-endian port must byte-swap before mal_crc32c. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "snapshot checksums assume little-endian");

#define SNAP_INDEX_FILE "index.h5"
#define SNAP_SHARD_FMT "shard_%05d.h5"
#define SNAP_TABLE "_malleus"
#define SNAP_COMPLETE "COMPLETE"
#define SNAP_LATEST "latest"
#define SNAP_TMP_PREFIX ".tmp-"
#define SNAP_STEP_PREFIX "step_"
#define SNAP_MAX_SMALL_FILE 65536
#define SNAP_MAX_INDEX_BYTES ((size_t)1 << 30)
#define SNAP_MSG 1024

/* ---------------------------------------------------------------- HDF5 errors */

/* HDF5 prints its error stack on stderr by default; every public function
 * silences it for its own duration and restores the caller's setting, so
 * other code in the process keeps whatever it chose. */
typedef struct {
    H5E_auto2_t func;
    void *data;
} snap_h5quiet;

static void snap_h5quiet_begin(snap_h5quiet *q)
{
    if (H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data) < 0) {
        q->func = NULL;
        q->data = NULL;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void snap_h5quiet_end(snap_h5quiet *q)
{
    H5Eset_auto2(H5E_DEFAULT, q->func, q->data);
}

static herr_t snap_h5walk(unsigned n, const H5E_error2_t *e, void *data)
{
    /* walked upward: entry 0 is the innermost, most specific failure */
    if (n == 0 && e->desc) snprintf(data, 320, "%s", e->desc);
    return 0;
}

/* Record `fmt` plus the innermost HDF5 reason.  Must be called right after
 * the failing HDF5 call: the next API call clears the error stack. */
static int snap_h5err_at(const char *file, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int snap_h5err_at(const char *file, int line, int code, const char *fmt, ...)
{
    char msg[640], why[320] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, snap_h5walk, why);
    if (why[0]) return mal_seterr_at(file, line, code, "%s (HDF5: %s)", msg, why);
    return mal_seterr_at(file, line, code, "%s", msg);
}
#define SNAP_H5ERR(code, ...) snap_h5err_at(__FILE__, __LINE__, (code), __VA_ARGS__)

static int snap_h5close(hid_t *f, const char *fpath)
{
    hid_t id = *f;
    *f = -1; /* never retried: after a failed close the id is unusable */
    if (H5Fclose(id) < 0)
        return SNAP_H5ERR(MAL_EIO, "cannot close snapshot file %s (its metadata may be lost)",
                          fpath);
    return 0;
}

/* ---------------------------------------------------------------- fault injection */

int mal_snapshot_fault_nth_io = 0;

/* True (with errno = EIO) when the armed fault fires at this I/O step. */
static int snap_fault(void)
{
    if (mal_snapshot_fault_nth_io <= 0 || --mal_snapshot_fault_nth_io > 0) return 0;
    errno = EIO;
    return 1;
}

/* ---------------------------------------------------------------- files and directories */

static int snap_join(char *out, size_t len, const char *a, const char *b)
{
    int k = snprintf(out, len, "%s/%s", a, b);
    if (k < 0 || (size_t)k >= len)
        return MAL_ERR(MAL_EINVAL, "path %s/%s is too long (limit %zu bytes)", a, b, len - 1);
    return 0;
}

static int snap_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int snap_fsync(const char *path, int is_dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0) return MAL_ERR(MAL_EIO, "cannot open %s to fsync it: %s", path, strerror(errno));
    /* Some file systems cannot fsync a directory (EINVAL); their renames
     * are then as durable as they get. */
    if (snap_fault() || (fsync(fd) != 0 && !(is_dir && errno == EINVAL))) {
        int e = errno;
        close(fd);
        return MAL_ERR(MAL_EIO, "fsync of %s failed: %s", path, strerror(e));
    }
    close(fd);
    return 0;
}

/* mkdir -p, fsyncing the parent of every directory it creates. */
static int snap_mkdirs(const char *dir)
{
    char buf[PATH_MAX];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof buf)
        return MAL_ERR(MAL_EINVAL, "snapshot directory name '%s' is empty or too long", dir);
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) == 0) {
            char parent[PATH_MAX];
            memcpy(parent, buf, i + 1);
            char *slash = strrchr(parent, '/');
            if (slash == parent)
                slash[1] = '\0';
            else if (slash)
                *slash = '\0';
            else
                strcpy(parent, ".");
            int rc = snap_fsync(parent, 1);
            if (rc) return rc;
        } else if (errno != EEXIST) {
            return MAL_ERR(MAL_EIO, "cannot create snapshot directory %s: %s", buf,
                           strerror(errno));
        }
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return MAL_ERR(MAL_EIO, "snapshot location %s exists but is not a directory", dir);
    return 0;
}

static int snap_rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

/* rm -rf without following symbolic links; a missing path is fine. */
static int snap_rmtree(const char *path)
{
    if (nftw(path, snap_rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return MAL_ERR(MAL_EIO, "cannot remove %s: %s", path, strerror(errno));
    return 0;
}

/* Remove a step directory so that it stops being trusted first: COMPLETE
 * goes (durably) before any data, so a crash half-way leaves an
 * uncommitted directory, never a committed one with holes. */
static int snap_remove_step(const char *step_dir)
{
    char marker[PATH_MAX];
    int rc = snap_join(marker, sizeof marker, step_dir, SNAP_COMPLETE);
    if (rc) return rc;
    if (unlink(marker) == 0) {
        rc = snap_fsync(step_dir, 1);
        if (rc) return rc;
    } else if (errno != ENOENT) {
        return MAL_ERR(MAL_EIO, "cannot remove %s: %s", marker, strerror(errno));
    }
    return snap_rmtree(step_dir);
}

/* The writer's identity in temporary names: "<pid>@<host>".  The host
 * matters because DIR may be on a file system shared by many nodes, where a
 * pid alone says nothing about liveness. */
static void snap_writer_id(char *out, size_t len)
{
    char host[256] = "unknown";
    if (gethostname(host, sizeof host) != 0) strcpy(host, "unknown");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            *p = '_';
    snprintf(out, len, "%ld@%s", (long)getpid(), host);
}

/* Write `content` to dir/name atomically: temporary file, fsync, rename,
 * fsync of the directory.  *renamed tells whether dir/name was replaced
 * (which may be so even when the final fsync failed). */
static int snap_write_atomic(const char *dir, const char *name, const char *content, int *renamed)
{
    *renamed = 0;
    char id[300], tmpname[400], tmp[PATH_MAX], final[PATH_MAX];
    snap_writer_id(id, sizeof id);
    snprintf(tmpname, sizeof tmpname, SNAP_TMP_PREFIX "%s.%s", name, id);
    int rc = snap_join(tmp, sizeof tmp, dir, tmpname);
    if (!rc) rc = snap_join(final, sizeof final, dir, name);
    if (rc) return rc;

    int fd = snap_fault() ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return MAL_ERR(MAL_EIO, "cannot create %s: %s", tmp, strerror(errno));
    size_t len = strlen(content), done = 0;
    while (done < len) {
        ssize_t k = snap_fault() ? -1 : write(fd, content + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = MAL_ERR(MAL_EIO, "cannot write %s: %s", tmp, strerror(errno));
            goto fail_close;
        }
        done += (size_t)k;
    }
    if (snap_fault() || fsync(fd) != 0) {
        rc = MAL_ERR(MAL_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
        goto fail_close;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = MAL_ERR(MAL_EIO, "cannot close %s: %s", tmp, strerror(errno));
        goto fail_unlink;
    }
    fd = -1;
    if (snap_fault() || rename(tmp, final) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        goto fail_unlink;
    }
    *renamed = 1;
    return snap_fsync(dir, 1);

fail_close:
    close(fd);
fail_unlink:
    unlink(tmp);
    return rc;
}

/* Read a small text file into a NUL-terminated malloc'ed buffer.  Returns
 * MAL_ENOENT (without a message) if it does not exist. */
static int snap_read_small(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return MAL_ENOENT;
        return MAL_ERR(MAL_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    char *buf = malloc(SNAP_MAX_SMALL_FILE + 1);
    if (!buf) {
        fclose(f);
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", path);
    }
    size_t k = fread(buf, 1, SNAP_MAX_SMALL_FILE + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return MAL_ERR(MAL_EIO, "cannot read %s", path);
    }
    if (k > SNAP_MAX_SMALL_FILE) {
        free(buf);
        return MAL_ERR(MAL_EFORMAT, "%s is larger than %d bytes: not a snapshot marker", path,
                       SNAP_MAX_SMALL_FILE);
    }
    buf[k] = '\0';
    *out = buf;
    return 0;
}

/* "step_<digits>" -> step; -1 if `name` is not exactly that. */
static int64_t snap_parse_step_name(const char *name)
{
    if (strncmp(name, SNAP_STEP_PREFIX, strlen(SNAP_STEP_PREFIX)) != 0) return -1;
    const char *p = name + strlen(SNAP_STEP_PREFIX);
    if (*p < '0' || *p > '9') return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* ---------------------------------------------------------------- tensor validation */

static void snap_fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

static int snap_check_name(const char *name)
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
static int64_t snap_count(int ndim, const int64_t *ext)
{
    int64_t c = 1;
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(c, ext[d], &c) || c > INT64_MAX / 4) return -1;
    return c;
}

/* A block description (data not looked at): name, ndim, and the block
 * inside the shape. */
static int snap_check_block(const mal_snap_tensor *t)
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

static int snap_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names must be unique, and no name may be a group on the path of another
 * ("a" and "a/b"): HDF5 cannot have both.  `v` is sorted (strcmp). */
static int snap_check_names_disjoint(char *const *v, int n)
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

/* One stored block, as gathered by the committing rank and as read from
 * the index. */
typedef struct {
    char *name; /* not owned: points at the tensor's (reader) or the payload's (writer) name */
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM], offset[MAL_SNAP_MAXDIM], extent[MAL_SNAP_MAXDIM];
    int shard;     /* index into the shard list */
    uint64_t addr; /* byte address of the data in the shard file */
    uint32_t crc;
} snap_block;

typedef struct {
    char *file; /* relative to the step directory */
    int id;
    uint64_t bytes;
} snap_shard;

typedef struct {
    char *name;
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM];
    int64_t first, n; /* its blocks */
} snap_tinfo;

static int snap_cmp_block(const void *a, const void *b)
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
static int snap_check_tiling(const snap_block *b, int64_t n)
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
    } else {
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
/* ---------------------------------------------------------------- HDF5 attributes */

static hid_t snap_fapl(void)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    /* The library is the parallel build, but v0 is one process: the plain
     * POSIX driver, which needs no MPI_Init.  STRONG close makes H5Fclose
     * really close the file, so the fsync that follows sees all data. */
    if (H5Pset_fapl_sec2(fapl) < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        H5Pclose(fapl);
        return -1;
    }
#if H5_VERSION_GE(1, 10, 7)
    /* Parallel file systems often lack flock(); do not fail because of it. */
    H5Pset_file_locking(fapl, 1, 1);
#endif
    return fapl;
}

/* Write attribute `name` on `loc` (scalar when count == 0). */
static int snap_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, hsize_t count,
                           const void *buf, const char *fpath, const char *obj)
{
    int rc = 0;
    hid_t sp = count ? H5Screate_simple(1, &count, NULL) : H5Screate(H5S_SCALAR), a = -1;
    if (sp < 0) goto fail;
    a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, mtype, buf) < 0) goto fail;
    goto done;
fail:
    rc = SNAP_H5ERR(MAL_EIO, "%s: cannot write attribute '%s' of %s", fpath, name, obj);
done:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

static int snap_attr_write_str(hid_t loc, const char *name, const char *s, const char *fpath)
{
    if (!s) return 0; /* NULL: attribute absent */
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        int rc = SNAP_H5ERR(MAL_EIO, "%s: cannot make a string type", fpath);
        if (t >= 0) H5Tclose(t);
        return rc;
    }
    int rc = snap_attr_write(loc, name, t, t, 0, &s, fpath, "the root group");
    H5Tclose(t);
    return rc;
}

/* Read integer attribute `name` of exactly `count` elements (count 0: a
 * scalar or 1 element), converted to `mtype`. */
static int snap_attr_read_int(hid_t loc, const char *name, hid_t mtype, int count, void *buf,
                              const char *fpath, const char *obj)
{
    int rc = 0;
    hid_t a = -1, sp = -1, ft = -1;
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0)
        return SNAP_H5ERR(MAL_EIO, "%s: cannot look up attribute '%s' of %s", fpath, name, obj);
    if (!ex)
        return MAL_ERR(MAL_EFORMAT, "%s: %s has no attribute '%s': not a malleus snapshot?", fpath,
                       obj, name);
    a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0 || (sp = H5Aget_space(a)) < 0 || (ft = H5Aget_type(a)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot open attribute '%s' of %s", fpath, name, obj);
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    if (H5Tget_class(ft) != H5T_INTEGER || np != (count ? count : 1)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: attribute '%s' of %s is not %d integer(s)", fpath, name, obj,
                     count ? count : 1);
        goto done;
    }
    if (H5Aread(a, mtype, buf) < 0)
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read attribute '%s' of %s", fpath, name, obj);
done:
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Read string attribute `name` of the root group into a malloc'ed *out;
 * absent gives NULL when `optional`. */
static int snap_attr_read_str(hid_t loc, const char *name, int optional, char **out,
                              const char *fpath)
{
    int rc = 0;
    hid_t a = -1, ft = -1, mt = -1;
    *out = NULL;
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0) return SNAP_H5ERR(MAL_EIO, "%s: cannot look up root attribute '%s'", fpath, name);
    if (!ex)
        return optional ? 0
                        : MAL_ERR(MAL_EFORMAT,
                                  "%s: root attribute '%s' is missing: not a malleus snapshot",
                                  fpath, name);
    a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0 || (ft = H5Aget_type(a)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot open root attribute '%s'", fpath, name);
        goto done;
    }
    if (H5Tget_class(ft) != H5T_STRING) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: root attribute '%s' is not a string", fpath, name);
        goto done;
    }
    if (H5Tis_variable_str(ft) > 0) {
        char *s = NULL;
        mt = H5Tcopy(H5T_C_S1);
        if (mt < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 || H5Tset_cset(mt, H5Tget_cset(ft)) < 0 ||
            H5Aread(a, mt, &s) < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read root attribute '%s'", fpath, name);
            goto done;
        }
        *out = strdup(s ? s : "");
        H5free_memory(s);
    } else {
        /* fixed-length (e.g. written by another tool): read as stored */
        size_t sz = H5Tget_size(ft);
        char *s = calloc(sz + 1, 1);
        if (!s) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
            goto done;
        }
        if (H5Aread(a, ft, s) < 0) {
            free(s);
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read root attribute '%s'", fpath, name);
            goto done;
        }
        *out = s;
    }
    if (!*out) rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
done:
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Write all of `len` bytes at `off`. */
static int snap_pwrite_all(int fd, const void *buf, size_t len, off_t off, const char *fpath,
                           const char *name)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t k = snap_fault() ? -1 : pwrite(fd, p, len, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return MAL_ERR(MAL_EIO, "%s: cannot write the data of tensor '%s': %s", fpath, name,
                           k < 0 ? strerror(errno) : "no progress");
        p += k;
        len -= (size_t)k;
        off += k;
    }
    return 0;
}
/* A ".tmp-<what>.<pid>[@<host>]" entry whose writer is gone. */
static int snap_tmp_is_stale(const char *dir, const char *name)
{
    char mine[300];
    snap_writer_id(mine, sizeof mine);
    const char *myhost = strchr(mine, '@') + 1;

    const char *at = strchr(name, '@');
    const char *end = at ? at : name + strlen(name);
    const char *p = end;
    while (p > name && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == end || p == name || p[-1] != '.') return 0; /* not ours: leave it alone */
    long pid = strtol(p, NULL, 10);

    if (!at || strcmp(at + 1, myhost) == 0) {
        if (pid == (long)getpid() || pid <= 0) return 0;
        return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    }
    /* another host: no way to ask whether the writer lives; go by age */
    char path[PATH_MAX];
    struct stat st;
    if (snap_join(path, sizeof path, dir, name) || lstat(path, &st) != 0) return 0;
    return difftime(time(NULL), st.st_mtime) > MAL_SNAP_FOREIGN_STALE_S;
}

typedef struct {
    int64_t step;
    char name[64];
} snap_stepdir;

static int snap_cmp_step_desc(const void *a, const void *b)
{
    int64_t x = ((const snap_stepdir *)a)->step, y = ((const snap_stepdir *)b)->step;
    return (x < y) - (x > y);
}

/* Retention after committing step `cur`; see mal_snapshot_write. */
static int snap_retain(const char *dir, int64_t cur, int keep_last)
{
    int rc = 0, n = 0, cap = 0;
    snap_stepdir *v = NULL;
    DIR *d = opendir(dir);
    if (!d) return MAL_ERR(MAL_EIO, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX], marker[PATH_MAX];
        if (snap_join(path, sizeof path, dir, e->d_name)) continue;
        if (strncmp(e->d_name, SNAP_TMP_PREFIX, strlen(SNAP_TMP_PREFIX)) == 0) {
            if (snap_tmp_is_stale(dir, e->d_name)) {
                mal_log(MAL_LOG_DEBUG, "snapshot: removing %s of a dead writer", path);
                int r = snap_rmtree(path);
                if (r && !rc) rc = r;
            }
            continue;
        }
        int64_t step = snap_parse_step_name(e->d_name);
        if (step < 0 || snap_join(marker, sizeof marker, path, SNAP_COMPLETE)) continue;
        if (!snap_exists(marker)) {
            /* Uncommitted: a crash between rename and COMPLETE.  Older ones
             * can never be completed; a newer one is replaced when that
             * step is written again. */
            if (step < cur) {
                mal_log(MAL_LOG_DEBUG, "snapshot: removing uncommitted %s", path);
                int r = snap_rmtree(path);
                if (r && !rc) rc = r;
            }
            continue;
        }
        if (step == cur || strlen(e->d_name) >= sizeof v->name) continue;
        if (mal_grow(&v, &cap, n, sizeof *v, 16)) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory listing %s", dir);
            goto done;
        }
        v[n].step = step;
        strcpy(v[n].name, e->d_name);
        n++;
    }
    if (keep_last > 0) {
        /* the snapshot just written counts as one of the kept */
        qsort(v, (size_t)n, sizeof *v, snap_cmp_step_desc);
        for (int i = keep_last - 1; i < n; i++) {
            char path[PATH_MAX];
            if (snap_join(path, sizeof path, dir, v[i].name)) continue;
            mal_log(MAL_LOG_DEBUG, "snapshot: retention removes %s", path);
            int r = snap_remove_step(path);
            if (r && !rc) rc = r;
        }
    }
done:
    closedir(d);
    free(v);
    return rc;
}

/* ---------------------------------------------------------------- MPI plumbing */

/* Every collective here is non-blocking plus mal_mpi_wait: MPICH's
 * blocking calls spin and starve oversubscribed ranks (comm_mpi.h). */
static int snap_mpi(mal_comm *c, MPI_Comm *out)
{
    *out = mal_comm_mpi_handle(c);
    if (*out == MPI_COMM_NULL)
        return MAL_ERR(MAL_ENOTSUP, "snapshots need an MPI communicator (the control plane)");
    return 0;
}

static int snap_bcast(mal_comm *c, void *buf, size_t bytes, int root)
{
    MPI_Comm m;
    MPI_Request rq;
    int rc = snap_mpi(c, &m);
    if (rc) return rc;
    if (bytes > INT_MAX) return MAL_ERR(MAL_EINVAL, "snapshot broadcast of %zu bytes", bytes);
    if ((rc = MAL_MPI_ERR(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, m, &rq), "MPI_Ibcast")))
        return rc;
    return mal_mpi_wait(&rq, MPI_STATUS_IGNORE, "snapshot broadcast");
}

int mal_snapshot_agree(mal_comm *comm, int rc)
{
    if (!comm || comm->size <= 1) return rc;
    MPI_Comm m;
    MPI_Request rq;
    int r = snap_mpi(comm, &m);
    if (r) return r;
    int mine = rc ? comm->rank : comm->size, first = comm->size;
    if ((r = MAL_MPI_ERR(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, m, &rq),
                         "MPI_Iallreduce")) ||
        (r = mal_mpi_wait(&rq, MPI_STATUS_IGNORE, "snapshot agreement")))
        return r;
    if (first >= comm->size) return 0;
    struct {
        int rc;
        char msg[SNAP_MSG];
    } e;
    memset(&e, 0, sizeof e);
    if (comm->rank == first) {
        e.rc = rc;
        snprintf(e.msg, sizeof e.msg, "%s", mal_errmsg());
    }
    if ((r = snap_bcast(comm, &e, sizeof e, first))) return r;
    if (comm->rank != first) return MAL_ERR(e.rc, "rank %d: %s", first, e.msg);
    return rc;
}

/* ---------------------------------------------------------------- test hooks */

enum { SNAP_KILL_NONE, SNAP_KILL_DATA, SNAP_KILL_INDEX, SNAP_KILL_RENAME };

/* MALLEUS_TEST_SNAPSHOT_KILL=RANK:STEP:POINT (see snapshot.h). */
static int snap_kill_point(int rank, int64_t step)
{
    const char *e = getenv("MALLEUS_TEST_SNAPSHOT_KILL");
    int r;
    long long s;
    char what[16];
    if (!e || sscanf(e, "%d:%lld:%15s", &r, &s, what) != 3 || r != rank || s != step)
        return SNAP_KILL_NONE;
    if (!strcmp(what, "data")) return SNAP_KILL_DATA;
    if (!strcmp(what, "index")) return SNAP_KILL_INDEX;
    if (!strcmp(what, "rename")) return SNAP_KILL_RENAME;
    return SNAP_KILL_NONE;
}

static void snap_die(int rank, const char *where)
{
    fprintf(stderr, "malleus: test hook: rank %d kills itself (SIGKILL) %s\n", rank, where);
    fflush(NULL);
    raise(SIGKILL);
}

/* ---------------------------------------------------------------- writing shards */

typedef struct {
    char *name;
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM], offset[MAL_SNAP_MAXDIM], extent[MAL_SNAP_MAXDIM];
    int64_t count, written; /* floats */
    uint64_t addr;
    uint32_t crc;
} snap_wblock;

typedef struct {
    int id;
    char path[PATH_MAX];
    int fd;
    int n;
    snap_wblock *b;
    uint64_t bytes; /* file size, known once closed */
} snap_wshard;

struct mal_snap_writer {
    mal_comm *comm;
    int rank, size;
    char dir[PATH_MAX], tmp[PATH_MAX], final[PATH_MAX], stepname[64];
    mal_snap_meta meta; /* strings owned */
    int n_sh, cap_sh;
    snap_wshard *sh;
    int kill;
    int *counts, *displs; /* rank 0: [size], for gathering the descriptors */
    int pending_rc;       /* a local failure inside begin, reported by finish */
    char pending_msg[SNAP_MSG];
};

/* The dataset of a block inside its shard file: "<tensor>/block_<o0>_<o1>..". */
static void snap_block_dset(char *out, size_t len, const char *name, int ndim,
                            const int64_t *offset)
{
    size_t k = (size_t)snprintf(out, len, "%s/block", name);
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(out + k, len - k, "_%lld", (long long)offset[d]);
}

/* Refuse early, with a clear message, when the file system cannot hold
 * this process's share: a full disk is the most likely way for a write to
 * fail. */
static int snap_check_space(const char *dir, const mal_snap_tensor *t, int n)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) return 0; /* unknown: let the writes tell */
    uint64_t need = 1u << 20;
    for (int i = 0; i < n; i++)
        need += (uint64_t)snap_count(t[i].ndim, t[i].extent) * sizeof(float) + 4096;
    uint64_t have = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    if (have < need)
        return MAL_ERR(MAL_EIO,
                       "not enough free space in %s for the snapshot: needs about %.1f MiB, "
                       "%.1f MiB available; free space or lower keep_last",
                       dir, (double)need / 1048576.0, (double)have / 1048576.0);
    return 0;
}

static int snap_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, hsize_t count,
                           const void *buf, const char *fpath, const char *obj);
static int snap_attr_write_str(hid_t loc, const char *name, const char *s, const char *fpath);
static hid_t snap_fapl(void);

/* Common root attributes of index and shard files. */
static int snap_write_root_attrs(hid_t f, int64_t step, const char *fpath)
{
    int32_t version = MAL_SNAP_FORMAT_VERSION;
    int rc;
    if ((rc = snap_attr_write_str(f, "format", MAL_SNAP_FORMAT, fpath)) ||
        (rc = snap_attr_write(f, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &version,
                              fpath, "the root group")) ||
        (rc = snap_attr_write(f, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &step, fpath,
                              "the root group")))
        return rc;
    return 0;
}

/* Property lists shared by the writers: intermediate groups created on the
 * way; datasets contiguous and allocated at creation (one byte range each,
 * addressable with H5Dget_offset, usable as virtual-dataset sources), never
 * filled (every byte gets written), no timestamps (equal state gives equal
 * files). */
static int snap_plists(hid_t *lcpl, hid_t *dcpl, const char *fpath)
{
    *lcpl = H5Pcreate(H5P_LINK_CREATE);
    *dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (*lcpl < 0 || *dcpl < 0 || H5Pset_create_intermediate_group(*lcpl, 1) < 0 ||
        H5Pset_layout(*dcpl, H5D_CONTIGUOUS) < 0 ||
        H5Pset_alloc_time(*dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
        H5Pset_fill_time(*dcpl, H5D_FILL_TIME_NEVER) < 0 || H5Pset_obj_track_times(*dcpl, 0) < 0)
        return SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5 property lists", fpath);
    return 0;
}

/* Create HDF5 file `fpath` (it must not exist) with access list fapl; the
 * fault-injection hook can fail it like a full disk. */
static int snap_file_create(const char *fpath, hid_t fapl, hid_t *f)
{
    if (snap_fault())
        return MAL_ERR(MAL_EIO, "cannot create snapshot file %s: %s", fpath, strerror(errno));
    if ((*f = H5Fcreate(fpath, H5F_ACC_EXCL, H5P_DEFAULT, fapl)) < 0)
        return SNAP_H5ERR(MAL_EIO, "cannot create snapshot file %s", fpath);
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
static int snap_shard_create(snap_wshard *s, int64_t step)
{
    int rc = 0;
    hid_t fapl = -1, f = -1, lcpl = -1, dcpl = -1;
    const char *fpath = s->path;
    if ((fapl = snap_fapl()) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up the HDF5 file access list", fpath);
        goto done;
    }
    if ((rc = snap_file_create(fpath, fapl, &f))) goto done;
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
    for (int i = 0; i < w->n_sh; i++)
        snap_wshard_free(&w->sh[i]);
    free(w->sh);
    free(w->counts);
    free(w->displs);
    free(w->meta.config_json);
    free(w->meta.train_json);
    free(w->meta.plan_json);
    free(w);
}

/* Rank 0's part of begin: checks, names, the temporary directory. */
static int snap_begin_root(mal_snap_writer *w, const char *dir, const mal_snap_meta *meta)
{
    char tmpname[400], id[300], marker[PATH_MAX];
    int rc;
    if (meta->step < 0 || meta->consumed_samples < 0)
        return MAL_ERR(MAL_EINVAL,
                       "snapshot meta: step %lld and consumed_samples %lld must be >= 0",
                       (long long)meta->step, (long long)meta->consumed_samples);
    snap_writer_id(id, sizeof id);
    snprintf(tmpname, sizeof tmpname, SNAP_TMP_PREFIX "%s.%s", w->stepname, id);
    if ((rc = snap_join(w->final, sizeof w->final, dir, w->stepname)) ||
        (rc = snap_join(w->tmp, sizeof w->tmp, dir, tmpname)) ||
        (rc = snap_join(marker, sizeof marker, w->final, SNAP_COMPLETE)))
        return rc;
    if (strlen(w->tmp) + 32 >= PATH_MAX)
        return MAL_ERR(MAL_EINVAL, "snapshot directory name %s is too long", dir);
    if ((rc = snap_mkdirs(dir))) return rc;
    /* A committed snapshot of this step is trusted: never replace it.  An
     * uncommitted one is debris of a crash and goes. */
    if (snap_exists(marker))
        return MAL_ERR(MAL_EINVAL,
                       "a committed snapshot of step %lld already exists at %s; remove it or "
                       "write to another directory",
                       (long long)meta->step, w->final);
    if (snap_exists(w->final) && (rc = snap_rmtree(w->final))) return rc;
    if ((rc = snap_rmtree(w->tmp))) return rc;
    if (snap_fault() || mkdir(w->tmp, 0755) != 0)
        return MAL_ERR(MAL_EIO, "cannot create %s: %s", w->tmp, strerror(errno));
    return 0;
}

static int snap_strdup_opt(char **dst, const char *src)
{
    *dst = NULL;
    if (!src) return 0;
    *dst = strdup(src);
    return *dst ? 0 : MAL_ERR(MAL_ENOMEM, "out of memory");
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
        char tmp[PATH_MAX], final[PATH_MAX];
    } *res = calloc(1, sizeof *res);
    if (!w || !res) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory starting a snapshot");
        goto done; /* only an allocation this small failing: peers would wait */
    }
    w->comm = comm;
    w->rank = comm ? comm->rank : 0;
    w->size = comm ? comm->size : 1;
    snprintf(w->stepname, sizeof w->stepname, SNAP_STEP_PREFIX "%08lld", (long long)meta->step);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    if (w->rank == 0) {
        w->counts = calloc((size_t)w->size, sizeof *w->counts);
        w->displs = calloc((size_t)w->size, sizeof *w->displs);
        res->rc = !w->counts || !w->displs
                      ? MAL_ERR(MAL_ENOMEM, "out of memory starting a snapshot")
                      : snap_begin_root(w, dir, meta);
        if (res->rc) snprintf(res->msg, sizeof res->msg, "%s", mal_errmsg());
        memcpy(res->tmp, w->tmp, sizeof w->tmp);
        memcpy(res->final, w->final, sizeof w->final);
    }
    if (comm && comm->size > 1 && (rc = snap_bcast(comm, res, sizeof *res, 0))) goto done;
    if (res->rc) {
        rc = res->rc;
        if (w->rank != 0) MAL_ERR(rc, "rank 0: %s", res->msg);
        goto done;
    }
    memcpy(w->tmp, res->tmp, sizeof w->tmp);
    memcpy(w->final, res->final, sizeof w->final);
    w->meta.step = meta->step;
    w->meta.consumed_samples = meta->consumed_samples;
    w->meta.seed = meta->seed;
    w->meta.rng_counter = meta->rng_counter;
    if ((rc = snap_strdup_opt(&w->meta.config_json, meta->config_json)) ||
        (rc = snap_strdup_opt(&w->meta.train_json, meta->train_json)) ||
        (rc = snap_strdup_opt(&w->meta.plan_json, meta->plan_json))) {
        /* peers went on: finish() reports it collectively */
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
    char fname[64];
    snprintf(fname, sizeof fname, SNAP_SHARD_FMT, shard);
    if ((rc = snap_join(s->path, sizeof s->path, w->tmp, fname))) return rc;
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
    if (!rc && !(rc = snap_check_space(w->tmp, blocks, n)) &&
        !(rc = snap_shard_create(s, w->meta.step))) {
        s->fd = snap_fault() ? -1 : open(s->path, O_WRONLY | O_CLOEXEC);
        if (s->fd < 0)
            rc = MAL_ERR(MAL_EIO, "cannot open %s to write tensor data: %s", s->path,
                         strerror(errno));
    }
    snap_h5quiet_end(&q);
    if (rc) {
        snap_wshard_free(s);
        unlink(s->path);
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

/* ---------------------------------------------------------------- descriptors */

/* What a process tells the committing rank: a growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} snap_buf;

static void snap_put_bytes(snap_buf *b, const void *x, size_t n)
{
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, x, n);
    b->len += n;
}

static void snap_put_i32(snap_buf *b, int32_t v)
{
    snap_put_bytes(b, &v, sizeof v);
}
static void snap_put_u64(snap_buf *b, uint64_t v)
{
    snap_put_bytes(b, &v, sizeof v);
}
static void snap_put_str(snap_buf *b, const char *s)
{
    snap_put_bytes(b, s, strlen(s) + 1);
}

/* Payload: int32 status; on failure the message; else int32 n_shards,
 * {int32 id, uint64 bytes}*, int32 n_blocks, {int32 shard (index into
 * this payload's shards), int32 ndim, int64 shape/offset/extent [4],
 * uint64 addr, uint32 crc, name NUL}*. */
static int snap_serialize(const mal_snap_writer *w, int status, snap_buf *b)
{
    snap_put_i32(b, status);
    if (status) {
        snap_put_str(b, mal_errmsg());
    } else {
        snap_put_i32(b, w->n_sh);
        int32_t nb = 0;
        for (int i = 0; i < w->n_sh; i++) {
            snap_put_i32(b, w->sh[i].id);
            snap_put_u64(b, w->sh[i].bytes);
            nb += w->sh[i].n;
        }
        snap_put_i32(b, nb);
        for (int i = 0; i < w->n_sh; i++)
            for (int k = 0; k < w->sh[i].n; k++) {
                const snap_wblock *x = &w->sh[i].b[k];
                snap_put_i32(b, i);
                snap_put_i32(b, x->ndim);
                snap_put_bytes(b, x->shape, sizeof x->shape);
                snap_put_bytes(b, x->offset, sizeof x->offset);
                snap_put_bytes(b, x->extent, sizeof x->extent);
                snap_put_u64(b, x->addr);
                snap_put_bytes(b, &x->crc, sizeof x->crc);
                snap_put_str(b, x->name);
            }
    }
    return b->oom ? MAL_ERR(MAL_ENOMEM, "out of memory describing the shards") : 0;
}

typedef struct {
    const char *p, *end;
    int bad;
} snap_rd;

static void snap_get(snap_rd *r, void *x, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        memset(x, 0, n);
        return;
    }
    memcpy(x, r->p, n);
    r->p += n;
}

static char *snap_get_str(snap_rd *r)
{
    const char *z = r->bad ? NULL : memchr(r->p, '\0', (size_t)(r->end - r->p));
    if (!z) {
        r->bad = 1;
        return NULL;
    }
    char *s = (char *)r->p;
    r->p = z + 1;
    return s;
}

/* Everything rank 0 collected. */
typedef struct {
    snap_block *b;
    int64_t nb, cap_b;
    snap_shard *s;
    int ns, cap_s;
} snap_table;

static void snap_table_free(snap_table *t)
{
    free(t->b);
    for (int i = 0; i < t->ns; i++)
        free(t->s[i].file);
    free(t->s);
    memset(t, 0, sizeof *t);
}

/* Parse the payload of `rank` into t (names point into the payload).  A
 * failed rank gives its status and message. */
static int snap_parse(snap_table *t, const char *p, size_t len, int rank, int *status,
                      const char **msg)
{
    snap_rd r = {p, p + len, 0};
    int32_t st = 0, ns = 0, nb = 0;
    snap_get(&r, &st, sizeof st);
    *status = st;
    if (st) {
        *msg = snap_get_str(&r);
        if (!*msg) *msg = "(no message)";
        return 0;
    }
    snap_get(&r, &ns, sizeof ns);
    int base = t->ns;
    for (int32_t i = 0; i < ns && !r.bad; i++) {
        int32_t id = 0;
        uint64_t bytes = 0;
        snap_get(&r, &id, sizeof id);
        snap_get(&r, &bytes, sizeof bytes);
        if (mal_grow(&t->s, &t->cap_s, t->ns, sizeof *t->s, 16))
            return MAL_ERR(MAL_ENOMEM, "out of memory gathering shards");
        char fname[64];
        snprintf(fname, sizeof fname, SNAP_SHARD_FMT, id);
        t->s[t->ns] = (snap_shard){strdup(fname), id, bytes};
        if (!t->s[t->ns].file) return MAL_ERR(MAL_ENOMEM, "out of memory gathering shards");
        t->ns++;
    }
    snap_get(&r, &nb, sizeof nb);
    for (int32_t i = 0; i < nb && !r.bad; i++) {
        snap_block x;
        int32_t sh = 0, nd = 0;
        snap_get(&r, &sh, sizeof sh);
        snap_get(&r, &nd, sizeof nd);
        snap_get(&r, x.shape, sizeof x.shape);
        snap_get(&r, x.offset, sizeof x.offset);
        snap_get(&r, x.extent, sizeof x.extent);
        snap_get(&r, &x.addr, sizeof x.addr);
        snap_get(&r, &x.crc, sizeof x.crc);
        x.name = snap_get_str(&r);
        x.ndim = nd;
        x.shard = base + sh;
        if (r.bad || sh < 0 || sh >= ns) {
            r.bad = 1;
            break;
        }
        if (t->nb == t->cap_b) {
            int64_t cap = t->cap_b ? 2 * t->cap_b : 64;
            snap_block *nv = realloc(t->b, sizeof *nv * (size_t)cap);
            if (!nv) return MAL_ERR(MAL_ENOMEM, "out of memory gathering blocks");
            t->b = nv;
            t->cap_b = cap;
        }
        t->b[t->nb++] = x;
    }
    if (r.bad || r.p != r.end)
        return MAL_ERR(MAL_EFORMAT, "malformed block descriptors from rank %d", rank);
    return 0;
}

/* ---------------------------------------------------------------- the index */

static int snap_table_write(hid_t g, const char *name, hid_t ftype, hid_t mtype, int rank,
                            const hsize_t *dims, const void *buf, const char *fpath)
{
    int rc = 0;
    hid_t sp = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE), ds = -1;
    if (sp < 0 || dcpl < 0 || H5Pset_obj_track_times(dcpl, 0) < 0) goto fail;
    ds = H5Dcreate2(g, name, ftype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (ds < 0) goto fail;
    if (dims[0] > 0 && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) goto fail;
    goto done;
fail:
    rc = SNAP_H5ERR(MAL_EIO, "%s: cannot write the block table '%s/%s'", fpath, SNAP_TABLE, name);
done:
    if (ds >= 0 && H5Dclose(ds) < 0 && !rc)
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close '%s/%s'", fpath, SNAP_TABLE, name);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

static hid_t snap_vlen_str(void)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t >= 0 && (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0)) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* Virtual-dataset source names are printf-like patterns: '%' must be doubled. */
static void snap_vds_escape(char *out, size_t len, const char *s)
{
    size_t k = 0;
    for (; *s && k + 2 < len; s++) {
        if (*s == '%') out[k++] = '%';
        out[k++] = *s;
    }
    out[k] = '\0';
}

/* One virtual dataset presenting tensor `ti` whole. */
static int snap_write_vds(hid_t f, hid_t lcpl, const snap_tinfo *ti, const snap_table *t,
                          const char *fpath)
{
    int rc = 0;
    hsize_t dims[MAL_SNAP_MAXDIM];
    for (int d = 0; d < ti->ndim; d++)
        dims[d] = (hsize_t)ti->shape[d];
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), vs = H5Screate_simple(ti->ndim, dims, NULL),
          ds = -1;
    char obj[1100];
    snprintf(obj, sizeof obj, "the virtual dataset of tensor '%s'", ti->name);
    if (dcpl < 0 || vs < 0 || H5Pset_obj_track_times(dcpl, 0) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up %s", fpath, obj);
        goto done;
    }
    for (int64_t k = ti->first; k < ti->first + ti->n; k++) {
        const snap_block *b = &t->b[k];
        hsize_t start[MAL_SNAP_MAXDIM], count[MAL_SNAP_MAXDIM];
        for (int d = 0; d < b->ndim; d++) {
            start[d] = (hsize_t)b->offset[d];
            count[d] = (hsize_t)b->extent[d];
        }
        char dname[1100], esc_d[2300], esc_f[200];
        snap_block_dset(dname, sizeof dname, b->name, b->ndim, b->offset);
        snap_vds_escape(esc_d, sizeof esc_d, dname);
        snap_vds_escape(esc_f, sizeof esc_f, t->s[b->shard].file);
        hid_t src = H5Screate_simple(b->ndim, count, NULL);
        int bad = src < 0 ||
                  H5Sselect_hyperslab(vs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
                  H5Pset_virtual(dcpl, vs, esc_f, esc_d, src) < 0;
        if (src >= 0) H5Sclose(src);
        if (bad) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot map a block into %s", fpath, obj);
            goto done;
        }
    }
    if (H5Sselect_all(vs) < 0 ||
        (ds = H5Dcreate2(f, ti->name, H5T_IEEE_F32LE, vs, lcpl, dcpl, H5P_DEFAULT)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot create %s", fpath, obj);
        goto done;
    }
    int64_t nb = ti->n;
    if ((rc = snap_attr_write(ds, "global_shape", H5T_STD_I64LE, H5T_NATIVE_INT64,
                              (hsize_t)ti->ndim, ti->shape, fpath, obj)) ||
        (rc = snap_attr_write(ds, "n_blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &nb, fpath, obj)))
        goto done;
done:
    if (ds >= 0 && H5Dclose(ds) < 0 && !rc)
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close %s", fpath, obj);
    if (vs >= 0) H5Sclose(vs);
    if (dcpl >= 0) H5Pclose(dcpl);
    return rc;
}

static int snap_write_index(const mal_snap_meta *meta, const snap_table *t, const snap_tinfo *ti,
                            int nt, const char *fpath)
{
    int rc = 0;
    hid_t fapl = -1, f = -1, g = -1, lcpl = -1, str = -1;
    int64_t nb = t->nb, ns = t->ns, n_t = nt;
    hsize_t one;
    void *tmp = NULL;
    if ((fapl = snap_fapl()) < 0 || (str = snap_vlen_str()) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5", fpath);
        goto done;
    }
    if ((rc = snap_file_create(fpath, fapl, &f))) goto done;
    const char *root = "the root group";
    if ((rc = snap_write_root_attrs(f, meta->step, fpath)) ||
        (rc = snap_attr_write(f, "consumed_samples", H5T_STD_I64LE, H5T_NATIVE_INT64, 0,
                              &meta->consumed_samples, fpath, root)) ||
        (rc = snap_attr_write(f, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0, &meta->seed, fpath,
                              root)) ||
        (rc = snap_attr_write(f, "rng_counter", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0,
                              &meta->rng_counter, fpath, root)) ||
        (rc = snap_attr_write_str(f, "config_json", meta->config_json, fpath)) ||
        (rc = snap_attr_write_str(f, "train_json", meta->train_json, fpath)) ||
        (rc = snap_attr_write_str(f, "plan_json", meta->plan_json, fpath)) ||
        (rc = snap_attr_write(f, "n_tensors", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &n_t, fpath,
                              root)) ||
        (rc = snap_attr_write(f, "n_blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &nb, fpath,
                              root)) ||
        (rc = snap_attr_write(f, "n_shards", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &ns, fpath, root)))
        goto done;

    if ((g = H5Gcreate2(f, SNAP_TABLE, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot create the group %s", fpath, SNAP_TABLE);
        goto done;
    }
    size_t big = (size_t)MAL_MAX(MAL_MAX(nb, ns), nt) + 1;
    tmp = malloc(big * sizeof(int64_t) * MAL_SNAP_MAXDIM);
    if (!tmp) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory writing %s", fpath);
        goto done;
    }
    char **sv = tmp;
    int32_t *i32 = tmp;
    int64_t *i64 = tmp;
    uint64_t *u64 = tmp;
    uint32_t *u32 = tmp;
    hsize_t d2[2] = {0, MAL_SNAP_MAXDIM};
#define TABLE(nm, ft, mt, rank, dims)                                                              \
    if ((rc = snap_table_write(g, nm, ft, mt, rank, dims, tmp, fpath))) goto done
    one = (hsize_t)ns;
    for (int i = 0; i < ns; i++)
        sv[i] = t->s[i].file;
    TABLE("shards", str, str, 1, &one);
    for (int i = 0; i < ns; i++)
        u64[i] = t->s[i].bytes;
    TABLE("shard_bytes", H5T_STD_U64LE, H5T_NATIVE_UINT64, 1, &one);
    one = (hsize_t)nt;
    for (int i = 0; i < nt; i++)
        sv[i] = ti[i].name;
    TABLE("tensors", str, str, 1, &one);
    for (int i = 0; i < nt; i++)
        i32[i] = ti[i].ndim;
    TABLE("tensor_ndim", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &one);
    d2[0] = (hsize_t)nt;
    for (int i = 0; i < nt; i++)
        for (int d = 0; d < MAL_SNAP_MAXDIM; d++)
            i64[i * MAL_SNAP_MAXDIM + d] = d < ti[i].ndim ? ti[i].shape[d] : 1;
    TABLE("tensor_shape", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2);
    for (int i = 0; i < nt; i++)
        i64[i] = ti[i].first;
    TABLE("tensor_first_block", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &one);
    for (int i = 0; i < nt; i++)
        i64[i] = ti[i].n;
    TABLE("tensor_n_blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &one);
    one = (hsize_t)nb;
    d2[0] = (hsize_t)nb;
    for (int64_t i = 0; i < nb; i++)
        i32[i] = t->b[i].shard;
    TABLE("block_shard", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &one);
    for (int64_t i = 0; i < nb; i++)
        for (int d = 0; d < MAL_SNAP_MAXDIM; d++)
            i64[i * MAL_SNAP_MAXDIM + d] = d < t->b[i].ndim ? t->b[i].offset[d] : 0;
    TABLE("block_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2);
    for (int64_t i = 0; i < nb; i++)
        for (int d = 0; d < MAL_SNAP_MAXDIM; d++)
            i64[i * MAL_SNAP_MAXDIM + d] = d < t->b[i].ndim ? t->b[i].extent[d] : 1;
    TABLE("block_extent", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2);
    for (int64_t i = 0; i < nb; i++)
        u64[i] = t->b[i].addr;
    TABLE("block_addr", H5T_STD_U64LE, H5T_NATIVE_UINT64, 1, &one);
    for (int64_t i = 0; i < nb; i++)
        u32[i] = t->b[i].crc;
    TABLE("block_crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, &one);
#undef TABLE

    lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5 property lists", fpath);
        goto done;
    }
    for (int i = 0; i < nt; i++)
        if ((rc = snap_write_vds(f, lcpl, &ti[i], t, fpath))) goto done;
    if (H5Gclose(g) < 0) {
        g = -1;
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close the group %s", fpath, SNAP_TABLE);
        goto done;
    }
    g = -1;
    rc = snap_h5close(&f, fpath);
done:
    free(tmp);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (g >= 0) H5Gclose(g);
    if (f >= 0) {
        int r = snap_h5close(&f, fpath);
        if (!rc) rc = r;
    }
    if (str >= 0) H5Tclose(str);
    if (fapl >= 0) H5Pclose(fapl);
    return rc;
}

/* CRC-32C and size of a whole (small) file. */
static int snap_file_crc(const char *path, uint64_t *bytes, uint32_t *crc, size_t limit)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return MAL_ERR(MAL_EIO, "cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(1 << 20);
    uint64_t n = 0;
    uint32_t c = 0;
    int rc = 0;
    if (!buf) {
        close(fd);
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        ssize_t k = read(fd, buf, 1 << 20);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = MAL_ERR(MAL_EIO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (k == 0) break;
        c = mal_crc32c(c, buf, (size_t)k);
        n += (uint64_t)k;
        if (n > limit) {
            rc = MAL_ERR(MAL_ECORRUPT, "%s is larger than %zu bytes: not a snapshot index", path,
                         limit);
            break;
        }
    }
    free(buf);
    close(fd);
    *bytes = n;
    *crc = c;
    return rc;
}

static int snap_cmp_shard_id(const void *a, const void *b)
{
    int x = ((const snap_shard *)a)->id, y = ((const snap_shard *)b)->id;
    return (x > y) - (x < y);
}

/* Rank 0, every process done: check the gathered blocks, write the index,
 * commit.  Cleans up after itself on failure. */
static int snap_commit_root(mal_snap_writer *w, snap_table *t, int keep_last)
{
    int rc = 0, nt = 0;
    enum { TMPDIR, RENAMED, COMMITTED } stage = TMPDIR;
    snap_tinfo *ti = NULL;
    char **names = NULL;
    int *remap = NULL;
    char ipath[PATH_MAX], marker[PATH_MAX];

    /* shards in id order, unique; blocks follow their shard's new index */
    remap = malloc(sizeof *remap * ((size_t)t->ns + 1));
    snap_shard *sorted = malloc(sizeof *sorted * ((size_t)t->ns + 1));
    if (!remap || !sorted) {
        free(sorted);
        rc = MAL_ERR(MAL_ENOMEM, "out of memory committing %s", w->final);
        goto done;
    }
    memcpy(sorted, t->s, sizeof *sorted * (size_t)t->ns);
    qsort(sorted, (size_t)t->ns, sizeof *sorted, snap_cmp_shard_id);
    for (int i = 0; i < t->ns; i++) {
        snap_shard key = {NULL, t->s[i].id, 0};
        remap[i] = (int)((snap_shard *)bsearch(&key, sorted, (size_t)t->ns, sizeof *sorted,
                                               snap_cmp_shard_id) -
                         sorted);
    }
    free(t->s); /* the file names now belong to `sorted` */
    t->s = sorted;
    t->cap_s = t->ns;
    for (int i = 0; i + 1 < t->ns; i++)
        if (t->s[i].id == t->s[i + 1].id) {
            rc = MAL_ERR(MAL_EINVAL,
                         "shard %d of the snapshot was written by two processes; give every "
                         "shard a distinct id",
                         t->s[i].id);
            goto done;
        }
    for (int64_t k = 0; k < t->nb; k++)
        t->b[k].shard = remap[t->b[k].shard];

    /* blocks grouped by tensor, in name then offset order */
    qsort(t->b, (size_t)t->nb, sizeof *t->b, snap_cmp_block);
    ti = calloc((size_t)t->nb + 1, sizeof *ti);
    names = calloc((size_t)t->nb + 1, sizeof *names);
    if (!ti || !names) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory committing %s", w->final);
        goto done;
    }
    for (int64_t k = 0; k < t->nb;) {
        int64_t e = k + 1;
        while (e < t->nb && !strcmp(t->b[e].name, t->b[k].name))
            e++;
        if ((rc = snap_check_tiling(&t->b[k], e - k))) goto done;
        ti[nt] = (snap_tinfo){t->b[k].name, t->b[k].ndim, {0}, k, e - k};
        memcpy(ti[nt].shape, t->b[k].shape, sizeof ti[nt].shape);
        names[nt] = t->b[k].name;
        nt++;
        k = e;
    }
    if ((rc = snap_check_names_disjoint(names, nt))) goto done;

    if ((rc = snap_join(ipath, sizeof ipath, w->tmp, SNAP_INDEX_FILE)) ||
        (rc = snap_join(marker, sizeof marker, w->final, SNAP_COMPLETE)) ||
        (rc = snap_write_index(&w->meta, t, ti, nt, ipath)) || (rc = snap_fsync(ipath, 0)))
        goto done;
    uint64_t ibytes;
    uint32_t icrc;
    if ((rc = snap_file_crc(ipath, &ibytes, &icrc, SNAP_MAX_INDEX_BYTES)) ||
        (rc = snap_fsync(w->tmp, 1)))
        goto done;
    if (w->kill == SNAP_KILL_INDEX) snap_die(w->rank, "after writing the index");

    if (snap_fault() || rename(w->tmp, w->final) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot rename %s to %s: %s", w->tmp, w->final, strerror(errno));
        goto done;
    }
    stage = RENAMED;
    if ((rc = snap_fsync(w->dir, 1))) goto done;
    if (w->kill == SNAP_KILL_RENAME) snap_die(w->rank, "after renaming, before COMPLETE");

    /* COMPLETE, last: from here on the snapshot is trusted. */
    json_t *j =
        json_pack("{s:s, s:i, s:I, s:i, s:I, s:i, s:I, s:I}", "format", MAL_SNAP_FORMAT,
                  "format_version", MAL_SNAP_FORMAT_VERSION, "step", (json_int_t)w->meta.step,
                  "n_tensors", nt, "n_blocks", (json_int_t)t->nb, "n_shards", t->ns, "index_bytes",
                  (json_int_t)ibytes, "index_crc32c", (json_int_t)icrc);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    char *line = text ? malloc(strlen(text) + 2) : NULL;
    if (!line) {
        free(text);
        rc = MAL_ERR(MAL_ENOMEM, "out of memory writing %s", marker);
        goto done;
    }
    sprintf(line, "%s\n", text);
    free(text);
    int renamed;
    rc = snap_write_atomic(w->final, SNAP_COMPLETE, line, &renamed);
    free(line);
    if (rc) goto done;
    stage = COMMITTED;

    char pointer[80];
    snprintf(pointer, sizeof pointer, "%s\n", w->stepname);
    if ((rc = snap_write_atomic(w->dir, SNAP_LATEST, pointer, &renamed))) {
        if (!renamed) goto done;
        /* `latest` already names the new, committed snapshot; whether the
         * old or the new name survives a crash, it names a trusted one. */
        mal_log(MAL_LOG_WARN, "snapshot %s committed and named by %s/%s, but: %s", w->final, w->dir,
                SNAP_LATEST, mal_errmsg());
        rc = 0;
    }
    if (snap_retain(w->dir, w->meta.step, keep_last) != 0)
        mal_log(MAL_LOG_WARN, "snapshot %s committed, but retention failed: %s", w->final,
                mal_errmsg());
done:
    if (rc) {
        /* Undo what is not trusted.  COMMITTED (only `latest` failed): a
         * complete snapshot that `latest` does not name is harmless, and
         * retention treats it like any other. */
        char msg[SNAP_MSG];
        snprintf(msg, sizeof msg, "%s", mal_errmsg());
        int r = 0;
        if (stage == TMPDIR)
            r = snap_rmtree(w->tmp);
        else if (stage == RENAMED)
            r = snap_remove_step(w->final);
        if (r)
            mal_seterr_at(__FILE__, __LINE__, rc, "%s; cleaning up also failed: %s", msg,
                          mal_errmsg());
    }
    free(remap);
    free(ti);
    free(names);
    return rc;
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
    int *counts = w->counts, *displs = w->displs, one_count = 0, one_displ = 0;
    char *all = NULL;
    int mpi_rc = 0, multi = w->comm && w->size > 1;
    if (multi) {
        /* sizes first, then a broadcast saying whether rank 0 could make
         * room for everything (a failed allocation must not leave peers
         * waiting in a gather nobody receives), then the descriptors */
        MPI_Comm m;
        MPI_Request rq;
        int len = mine.len > INT_MAX ? -1 : (int)mine.len, ok = 1;
        if ((mpi_rc = snap_mpi(w->comm, &m)) ||
            (mpi_rc = MAL_MPI_ERR(MPI_Igather(&len, 1, MPI_INT, counts, 1, MPI_INT, 0, m, &rq),
                                  "MPI_Igather")) ||
            (mpi_rc = mal_mpi_wait(&rq, MPI_STATUS_IGNORE, "gathering snapshot descriptors")))
            goto mpi_failed;
        if (w->rank == 0) {
            int64_t total = 0;
            for (int r = 0; r < w->size; r++) {
                if (counts[r] < 0 || total + counts[r] > INT_MAX) ok = 0;
                displs[r] = (int)total;
                total += counts[r] > 0 ? counts[r] : 0;
            }
            if (ok && !(all = malloc((size_t)total + 1))) ok = 0;
        }
        if ((mpi_rc = snap_bcast(w->comm, &ok, sizeof ok, 0))) goto mpi_failed;
        if (!ok) {
            mpi_rc = MAL_ERR(MAL_ENOMEM,
                             "rank 0 cannot hold the block descriptors of %d processes (out of "
                             "memory or over 2 GiB)",
                             w->size);
            if (w->rank == 0) snap_rmtree(w->tmp);
            goto mpi_failed;
        }
        if ((mpi_rc = MAL_MPI_ERR(
                 MPI_Igatherv(mine.p, len, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, m, &rq),
                 "MPI_Igatherv")) ||
            (mpi_rc = mal_mpi_wait(&rq, MPI_STATUS_IGNORE, "gathering snapshot descriptors")))
            goto mpi_failed;
    } else {
        all = mine.p;
        mine.p = NULL;
        counts = &one_count;
        displs = &one_displ;
        one_count = (int)mine.len;
    }

    if (w->rank == 0) {
        snap_table t = {0};
        for (int r = 0; r < w->size; r++) {
            int status = 0;
            const char *msg = NULL;
            int prc = snap_parse(&t, all + displs[r], (size_t)counts[r], r, &status, &msg);
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
            if (snap_rmtree(w->tmp))
                mal_log(MAL_LOG_WARN, "snapshot: could not remove %s: %s", w->tmp, mal_errmsg());
        } else if ((res.rc = snap_commit_root(w, &t, keep_last))) {
            res.failed = 0;
            snprintf(res.msg, sizeof res.msg, "%s", mal_errmsg());
        }
        snap_table_free(&t);
    }
    if (multi && (mpi_rc = snap_bcast(w->comm, &res, sizeof res, 0))) goto mpi_failed;
    rc = res.rc;
    if (rc && w->rank != res.failed) MAL_ERR(rc, "rank %d: %s", res.failed, res.msg);
    if (!rc && out_path) snprintf(out_path, out_len, "%s", w->final);
    goto done;
mpi_failed:
    rc = mpi_rc;
done:
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
int mal_snapshot_find_latest(const char *dir, char *path, size_t len)
{
    char ptr[PATH_MAX], step_dir[PATH_MAX], marker[PATH_MAX], *text = NULL;
    struct stat st;
    int rc;
    if (!dir || !path)
        return MAL_ERR(MAL_EINVAL, "mal_snapshot_find_latest: dir and path must not be NULL");
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return MAL_ERR(MAL_ENOENT,
                       "snapshot directory %s does not exist: no snapshot to resume from", dir);
    if ((rc = snap_join(ptr, sizeof ptr, dir, SNAP_LATEST))) return rc;
    rc = snap_read_small(ptr, &text);
    if (rc == MAL_ENOENT)
        return MAL_ERR(MAL_ENOENT, "no committed snapshot in %s (no '%s' pointer)", dir,
                       SNAP_LATEST);
    if (rc) return rc;
    size_t k = strlen(text);
    while (k > 0 && (text[k - 1] == '\n' || text[k - 1] == '\r' || text[k - 1] == ' '))
        k--;
    text[k] = '\0';
    if (snap_parse_step_name(text) < 0) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s does not name a step directory (\"%.60s\"); repair it to "
                     "name a step_NNNNNNNN directory or remove it",
                     ptr, text);
        goto done;
    }
    if ((rc = snap_join(step_dir, sizeof step_dir, dir, text)) ||
        (rc = snap_join(marker, sizeof marker, step_dir, SNAP_COMPLETE)))
        goto done;
    if (!snap_exists(step_dir)) {
        rc = MAL_ERR(MAL_ECORRUPT, "%s names %s, which does not exist", ptr, step_dir);
        goto done;
    }
    if (!snap_exists(marker)) {
        rc = MAL_ERR(MAL_ECORRUPT, "%s names %s, which has no %s marker (snapshot not committed)",
                     ptr, step_dir, SNAP_COMPLETE);
        goto done;
    }
    if (strlen(step_dir) >= len) {
        rc = MAL_ERR(MAL_EINVAL, "snapshot path %s does not fit the caller's %zu-byte buffer",
                     step_dir, len);
        goto done;
    }
    strcpy(path, step_dir);
done:
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- finding */

int mal_snapshot_resolve(const char *path, char *out, size_t len)
{
    char p[PATH_MAX];
    struct stat st;
    int rc;
    if (!path || !out) return MAL_ERR(MAL_EINVAL, "mal_snapshot_resolve: NULL argument");
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return MAL_ERR(MAL_ENOENT, "snapshot %s does not exist (or is not a directory)", path);
    if ((rc = snap_join(p, sizeof p, path, SNAP_LATEST))) return rc;
    if (snap_exists(p)) return mal_snapshot_find_latest(path, out, len);
    if ((rc = snap_join(p, sizeof p, path, SNAP_COMPLETE))) return rc;
    if (!snap_exists(p)) {
        char q[PATH_MAX];
        if ((rc = snap_join(q, sizeof q, path, SNAP_INDEX_FILE))) return rc;
        if (snap_exists(q))
            return MAL_ERR(MAL_ECORRUPT,
                           "%s has no %s marker: the snapshot was never committed (writer "
                           "crashed or still running); use a committed one",
                           path, SNAP_COMPLETE);
        return MAL_ERR(MAL_ENOENT,
                       "%s is neither a snapshot directory (no '%s' pointer) nor a step "
                       "directory (no %s)",
                       path, SNAP_LATEST, SNAP_COMPLETE);
    }
    if (strlen(path) >= len)
        return MAL_ERR(MAL_EINVAL, "snapshot path %s does not fit the caller's %zu-byte buffer",
                       path, len);
    strcpy(out, path);
    return 0;
}

/* ---------------------------------------------------------------- reading */

struct mal_snapshot {
    char *dir;
    char *index_path;
    mal_snap_meta meta;
    int n_t;
    snap_tinfo *t;
    int64_t n_b;
    snap_block *b;
    int n_s;
    snap_shard *s;
    int *fd; /* [n_s], opened on first use */
    float *chunk;
    uint64_t bytes_read;
};

typedef struct {
    int64_t step, n_blocks, index_bytes;
    int n_tensors, n_shards;
    uint32_t index_crc;
} snap_marker;

/* Parse and check COMPLETE of `step_dir`. */
static int snap_read_marker(const char *step_dir, snap_marker *mk)
{
    char marker[PATH_MAX], *text = NULL;
    int rc = snap_join(marker, sizeof marker, step_dir, SNAP_COMPLETE);
    if (rc) return rc;
    rc = snap_read_small(marker, &text);
    if (rc == MAL_ENOENT)
        return MAL_ERR(MAL_ECORRUPT,
                       "%s has no %s marker: the snapshot was never committed (writer crashed "
                       "or still running); resume from the one 'latest' names",
                       step_dir, SNAP_COMPLETE);
    if (rc) return rc;
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    free(text);
    const char *fmt = NULL;
    int version = 0;
    json_int_t st = 0, nb = 0, ib = 0, c = 0;
    if (!j || json_unpack(j, "{s:s, s:i}", "format", &fmt, "format_version", &version) != 0) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s is not a valid marker (JSON with format, format_version, ... "
                     "expected)%s%s",
                     marker, j ? "" : ": ", j ? "" : jerr.text);
        goto done;
    }
    if (strcmp(fmt, MAL_SNAP_FORMAT) != 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: format is \"%s\", not \"%s\"", marker, fmt, MAL_SNAP_FORMAT);
        goto done;
    }
    if (version != MAL_SNAP_FORMAT_VERSION) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s: snapshot format_version %d; this build reads version %d only (use the "
                     "malleus version that wrote it)",
                     marker, version, MAL_SNAP_FORMAT_VERSION);
        goto done;
    }
    if (json_unpack(j, "{s:I, s:i, s:I, s:i, s:I, s:I}", "step", &st, "n_tensors", &mk->n_tensors,
                    "n_blocks", &nb, "n_shards", &mk->n_shards, "index_bytes", &ib, "index_crc32c",
                    &c) != 0 ||
        st < 0 || nb < 0 || ib < 0 || mk->n_tensors < 0 || mk->n_shards < 0) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s is not a valid marker (step, n_tensors, n_blocks, n_shards, "
                     "index_bytes, index_crc32c expected)",
                     marker);
        goto done;
    }
    mk->step = st;
    mk->n_blocks = nb;
    mk->index_bytes = ib;
    mk->index_crc = (uint32_t)c;
done:
    json_decref(j);
    return rc;
}

/* Read table `name` of exactly `count` rows (of `width` values) into buf. */
static int snap_table_read(hid_t g, const char *name, hid_t mtype, int64_t count, int width,
                           void *buf, const char *fpath)
{
    int rc = 0;
    hid_t ds = H5Dopen2(g, name, H5P_DEFAULT), sp = -1;
    if (ds < 0 || (sp = H5Dget_space(ds)) < 0) {
        rc = SNAP_H5ERR(MAL_EFORMAT, "%s: the block table '%s/%s' is missing", fpath, SNAP_TABLE,
                        name);
        goto done;
    }
    hsize_t dims[2] = {0, 1};
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd != (width > 1 ? 2 : 1) || H5Sget_simple_extent_dims(sp, dims, NULL) != nd ||
        dims[0] != (hsize_t)count || (width > 1 && dims[1] != (hsize_t)width)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: the block table '%s/%s' has the wrong size", fpath,
                     SNAP_TABLE, name);
        goto done;
    }
    if (count > 0 && H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        rc =
            SNAP_H5ERR(MAL_EIO, "%s: cannot read the block table '%s/%s'", fpath, SNAP_TABLE, name);
done:
    if (sp >= 0) H5Sclose(sp);
    if (ds >= 0) H5Dclose(ds);
    return rc;
}

/* Strings of a table: malloc'ed copies into out[count]. */
static int snap_table_read_str(hid_t g, const char *name, int64_t count, char **out,
                               const char *fpath)
{
    hid_t str = snap_vlen_str();
    char **tmp = calloc((size_t)count + 1, sizeof *tmp);
    int rc = 0;
    if (str < 0 || !tmp) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
        goto done;
    }
    if ((rc = snap_table_read(g, name, str, count, 1, tmp, fpath))) goto done;
    for (int64_t i = 0; i < count; i++)
        if (!(out[i] = strdup(tmp[i] ? tmp[i] : ""))) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
            break;
        }
    for (int64_t i = 0; i < count; i++)
        H5free_memory(tmp[i]);
done:
    free(tmp);
    if (str >= 0) H5Tclose(str);
    return rc;
}

/* Read and check the whole block table of index.h5. */
static int snap_load_index(mal_snapshot *s, const snap_marker *mk)
{
    int rc = 0;
    hid_t fapl = -1, f = -1, g = -1;
    const char *fp = s->index_path;
    char *fmt = NULL;
    int64_t *i64 = NULL;
    if ((fapl = snap_fapl()) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up the HDF5 file access list", fp);
        goto done;
    }
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_h5 = H5Fis_accessible(fp, fapl);
#else
    htri_t is_h5 = H5Fis_hdf5(fp);
#endif
    if (is_h5 <= 0) {
        rc = MAL_ERR(MAL_ECORRUPT, "%s is not an HDF5 file; resume from an earlier snapshot", fp);
        goto done;
    }
    if ((f = H5Fopen(fp, H5F_ACC_RDONLY, fapl)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "cannot open snapshot file %s", fp);
        goto done;
    }
    int32_t version = 0;
    int64_t nt = 0, nb = 0, ns = 0;
    const char *root = "the root group";
    mal_snap_meta *m = &s->meta;
    if ((rc = snap_attr_read_str(f, "format", 0, &fmt, fp))) goto done;
    if (strcmp(fmt, MAL_SNAP_FORMAT) != 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: format is \"%s\", not \"%s\"", fp, fmt, MAL_SNAP_FORMAT);
        goto done;
    }
    if ((rc = snap_attr_read_int(f, "format_version", H5T_NATIVE_INT32, 0, &version, fp, root)))
        goto done;
    if (version != MAL_SNAP_FORMAT_VERSION) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s: snapshot format_version %d; this build reads version %d only (use the "
                     "malleus version that wrote it)",
                     fp, (int)version, MAL_SNAP_FORMAT_VERSION);
        goto done;
    }
    if ((rc = snap_attr_read_int(f, "step", H5T_NATIVE_INT64, 0, &m->step, fp, root)) ||
        (rc = snap_attr_read_int(f, "consumed_samples", H5T_NATIVE_INT64, 0, &m->consumed_samples,
                                 fp, root)) ||
        (rc = snap_attr_read_int(f, "seed", H5T_NATIVE_UINT64, 0, &m->seed, fp, root)) ||
        (rc = snap_attr_read_int(f, "rng_counter", H5T_NATIVE_UINT64, 0, &m->rng_counter, fp,
                                 root)) ||
        (rc = snap_attr_read_str(f, "config_json", 1, &m->config_json, fp)) ||
        (rc = snap_attr_read_str(f, "train_json", 1, &m->train_json, fp)) ||
        (rc = snap_attr_read_str(f, "plan_json", 1, &m->plan_json, fp)) ||
        (rc = snap_attr_read_int(f, "n_tensors", H5T_NATIVE_INT64, 0, &nt, fp, root)) ||
        (rc = snap_attr_read_int(f, "n_blocks", H5T_NATIVE_INT64, 0, &nb, fp, root)) ||
        (rc = snap_attr_read_int(f, "n_shards", H5T_NATIVE_INT64, 0, &ns, fp, root)))
        goto done;
    if (m->step != mk->step || nt != mk->n_tensors || nb != mk->n_blocks || ns != mk->n_shards) {
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s says step %lld, %lld tensors, %lld blocks, %lld shards but its COMPLETE "
                     "marker says %lld, %d, %lld, %d",
                     fp, (long long)m->step, (long long)nt, (long long)nb, (long long)ns,
                     (long long)mk->step, mk->n_tensors, (long long)mk->n_blocks, mk->n_shards);
        goto done;
    }
    s->t = calloc((size_t)nt + 1, sizeof *s->t);
    s->b = calloc((size_t)nb + 1, sizeof *s->b);
    s->s = calloc((size_t)ns + 1, sizeof *s->s);
    s->fd = malloc(sizeof *s->fd * ((size_t)ns + 1));
    size_t big = (size_t)MAL_MAX(MAL_MAX(nt, nb), ns) + 1;
    i64 = malloc(big * sizeof *i64 * MAL_SNAP_MAXDIM);
    char **names = calloc(big, sizeof *names);
    if (!s->t || !s->b || !s->s || !s->fd || !i64 || !names) {
        free(names);
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fp);
        goto done;
    }
    s->n_t = (int)nt;
    s->n_b = nb;
    s->n_s = (int)ns;
    for (int i = 0; i < s->n_s; i++)
        s->fd[i] = -1;
    if ((g = H5Gopen2(f, SNAP_TABLE, H5P_DEFAULT)) < 0) {
        free(names);
        rc = SNAP_H5ERR(MAL_EFORMAT, "%s has no block table (group %s)", fp, SNAP_TABLE);
        goto done;
    }
    int32_t *i32 = (int32_t *)i64;
    uint64_t *u64 = (uint64_t *)i64;
    uint32_t *u32 = (uint32_t *)i64;
    /* shards */
    if ((rc = snap_table_read_str(g, "shards", ns, names, fp))) {
        for (int64_t i = 0; i < ns; i++)
            free(names[i]);
        free(names);
        goto done;
    }
    for (int i = 0; i < s->n_s; i++) {
        s->s[i].file = names[i];
        s->s[i].id = i;
        names[i] = NULL;
    }
    if ((rc = snap_table_read(g, "shard_bytes", H5T_NATIVE_UINT64, ns, 1, u64, fp))) goto fail_n;
    for (int i = 0; i < s->n_s; i++) {
        s->s[i].bytes = u64[i];
        if (!s->s[i].file[0] || strchr(s->s[i].file, '/')) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: shard file name '%s' is not a plain file name", fp,
                         s->s[i].file);
            goto fail_n;
        }
    }
    /* tensors */
    if ((rc = snap_table_read_str(g, "tensors", nt, names, fp))) {
        for (int64_t i = 0; i < nt; i++)
            free(names[i]);
        goto fail_n;
    }
    for (int i = 0; i < s->n_t; i++) {
        s->t[i].name = names[i];
        names[i] = NULL;
    }
    if ((rc = snap_table_read(g, "tensor_ndim", H5T_NATIVE_INT32, nt, 1, i32, fp))) goto fail_n;
    for (int i = 0; i < s->n_t; i++)
        s->t[i].ndim = i32[i];
    if ((rc = snap_table_read(g, "tensor_shape", H5T_NATIVE_INT64, nt, MAL_SNAP_MAXDIM, i64, fp)))
        goto fail_n;
    for (int i = 0; i < s->n_t; i++)
        memcpy(s->t[i].shape, &i64[i * MAL_SNAP_MAXDIM], sizeof s->t[i].shape);
    if ((rc = snap_table_read(g, "tensor_first_block", H5T_NATIVE_INT64, nt, 1, i64, fp)))
        goto fail_n;
    for (int i = 0; i < s->n_t; i++)
        s->t[i].first = i64[i];
    if ((rc = snap_table_read(g, "tensor_n_blocks", H5T_NATIVE_INT64, nt, 1, i64, fp))) goto fail_n;
    for (int i = 0; i < s->n_t; i++)
        s->t[i].n = i64[i];
    /* blocks */
    if ((rc = snap_table_read(g, "block_shard", H5T_NATIVE_INT32, nb, 1, i32, fp))) goto fail_n;
    for (int64_t k = 0; k < nb; k++)
        s->b[k].shard = i32[k];
    if ((rc = snap_table_read(g, "block_offset", H5T_NATIVE_INT64, nb, MAL_SNAP_MAXDIM, i64, fp)))
        goto fail_n;
    for (int64_t k = 0; k < nb; k++)
        memcpy(s->b[k].offset, &i64[k * MAL_SNAP_MAXDIM], sizeof s->b[k].offset);
    if ((rc = snap_table_read(g, "block_extent", H5T_NATIVE_INT64, nb, MAL_SNAP_MAXDIM, i64, fp)))
        goto fail_n;
    for (int64_t k = 0; k < nb; k++)
        memcpy(s->b[k].extent, &i64[k * MAL_SNAP_MAXDIM], sizeof s->b[k].extent);
    if ((rc = snap_table_read(g, "block_addr", H5T_NATIVE_UINT64, nb, 1, u64, fp))) goto fail_n;
    for (int64_t k = 0; k < nb; k++)
        s->b[k].addr = u64[k];
    if ((rc = snap_table_read(g, "block_crc32c", H5T_NATIVE_UINT32, nb, 1, u32, fp))) goto fail_n;
    for (int64_t k = 0; k < nb; k++)
        s->b[k].crc = u32[k];

    /* Consistency: the index passed its checksum, so this only guards
     * against a writer bug or a hand-made index. */
    int64_t next = 0;
    for (int i = 0; i < s->n_t; i++) {
        snap_tinfo *t = &s->t[i];
        int ok = t->ndim >= 1 && t->ndim <= MAL_SNAP_MAXDIM && t->first == next && t->n >= 1 &&
                 t->first + t->n <= nb && (i == 0 || strcmp(s->t[i - 1].name, t->name) < 0) &&
                 snap_count(t->ndim, t->shape) > 0;
        int64_t vol = 0;
        for (int64_t k = t->first; ok && k < t->first + t->n; k++) {
            snap_block *b = &s->b[k];
            b->name = t->name;
            b->ndim = t->ndim;
            memcpy(b->shape, t->shape, sizeof b->shape);
            ok = b->shard >= 0 && b->shard < s->n_s;
            for (int d = 0; ok && d < t->ndim; d++)
                ok = b->offset[d] >= 0 && b->extent[d] >= 1 &&
                     b->offset[d] <= t->shape[d] - b->extent[d];
            int64_t c = ok ? snap_count(b->ndim, b->extent) : -1;
            ok = ok && c > 0 && b->addr + (uint64_t)c * 4 <= s->s[b->shard].bytes;
            vol += ok ? c : 0;
        }
        if (!ok || vol != snap_count(t->ndim, t->shape)) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: the block table of tensor '%s' is inconsistent", fp,
                         t->name);
            goto fail_n;
        }
        next = t->first + t->n;
    }
    if (next != nb) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: the block table lists blocks of no tensor", fp);
        goto fail_n;
    }
fail_n:
    free(names);
done:
    free(i64);
    free(fmt);
    if (g >= 0) H5Gclose(g);
    if (f >= 0) H5Fclose(f);
    if (fapl >= 0) H5Pclose(fapl);
    return rc;
}

int mal_snapshot_open(mal_snapshot **out, const char *step_dir)
{
    int rc = 0;
    mal_snapshot *s = NULL;
    struct stat st;
    snap_marker mk;
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

    s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(step_dir)) || !(s->index_path = malloc(PATH_MAX))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory opening %s", step_dir);
        goto done;
    }
    if ((rc = snap_join(s->index_path, PATH_MAX, step_dir, SNAP_INDEX_FILE))) goto done;
    if (!snap_exists(s->index_path)) {
        rc = MAL_ERR(MAL_ECORRUPT, "committed snapshot %s lacks its index %s", step_dir,
                     s->index_path);
        goto done;
    }
    uint64_t ibytes;
    uint32_t icrc;
    if ((rc = snap_file_crc(s->index_path, &ibytes, &icrc, SNAP_MAX_INDEX_BYTES))) goto done;
    if (ibytes != (uint64_t)mk.index_bytes || icrc != mk.index_crc) {
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s (%llu bytes, CRC-32C 0x%08x) does not match its COMPLETE marker (%lld "
                     "bytes, 0x%08x): the snapshot was altered after it was written; resume from "
                     "an earlier snapshot",
                     s->index_path, (unsigned long long)ibytes, icrc, (long long)mk.index_bytes,
                     mk.index_crc);
        goto done;
    }
    if ((rc = snap_load_index(s, &mk))) goto done;
    for (int i = 0; i < s->n_s; i++) {
        char p[PATH_MAX];
        if ((rc = snap_join(p, sizeof p, step_dir, s->s[i].file))) goto done;
        if (stat(p, &st) != 0) {
            rc = MAL_ERR(MAL_ECORRUPT, "shard file %s of snapshot %s is missing: %s", p, step_dir,
                         strerror(errno));
            goto done;
        }
        if ((uint64_t)st.st_size != s->s[i].bytes) {
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

static int snap_cmp_tinfo(const void *a, const void *b)
{
    return strcmp(((const snap_tinfo *)a)->name, ((const snap_tinfo *)b)->name);
}

static int snap_shard_fd(mal_snapshot *s, int i, char *path, size_t len)
{
    int rc = snap_join(path, len, s->dir, s->s[i].file);
    if (rc) return rc;
    if (s->fd[i] >= 0) return 0;
    s->fd[i] = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd[i] < 0 && (errno == EMFILE || errno == ENFILE)) {
        /* many shards: let go of the others and retry */
        for (int k = 0; k < s->n_s; k++)
            if (s->fd[k] >= 0) {
                close(s->fd[k]);
                s->fd[k] = -1;
            }
        s->fd[i] = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (s->fd[i] < 0)
        return MAL_ERR(MAL_EIO, "cannot open shard file %s: %s", path, strerror(errno));
    return 0;
}

static int snap_pread_all(int fd, void *buf, size_t len, off_t off, const char *path,
                          const char *name)
{
    char *p = buf;
    while (len > 0) {
        ssize_t k = pread(fd, p, len, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return MAL_ERR(k < 0 ? MAL_EIO : MAL_ECORRUPT,
                           "%s: cannot read the data of tensor '%s': %s", path, name,
                           k < 0 ? strerror(errno) : "file ends early (truncated)");
        p += k;
        len -= (size_t)k;
        off += k;
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
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", s->dir);
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
    for (int i = 0; s->fd && i < s->n_s; i++)
        if (s->fd[i] >= 0) close(s->fd[i]);
    for (int i = 0; i < s->n_t; i++)
        free(s->t[i].name);
    for (int i = 0; i < s->n_s; i++)
        free(s->s[i].file);
    free(s->t);
    free(s->b);
    free(s->s);
    free(s->fd);
    free(s->chunk);
    free(s->meta.config_json);
    free(s->meta.train_json);
    free(s->meta.plan_json);
    free(s->index_path);
    free(s->dir);
    free(s);
}
