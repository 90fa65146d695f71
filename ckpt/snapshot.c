/* Training-state snapshots in HDF5, committed atomically (v0: one process).
 *
 * On-disk layout (format "malleus-snapshot", format_version 1):
 *
 *   DIR/latest                 text "step_NNNNNNNN\n": the newest committed snapshot
 *   DIR/step_NNNNNNNN/         one directory per snapshot (step zero-padded to 8)
 *       state.h5               all tensors and meta (v0: one file)
 *       COMPLETE               completion marker, JSON, written last
 *   DIR/.tmp-*.<pid>@<host>    work in progress of a writer (directories and files)
 *
 * state.h5, root group attributes:
 *   format            string "malleus-snapshot"
 *   format_version    int32 1 (readers refuse other versions)
 *   step, consumed_samples   int64
 *   seed, rng_counter        uint64
 *   config_json, train_json, plan_json   UTF-8 variable-length strings (absent = NULL)
 * Every tensor is a float32 (little-endian IEEE) contiguous dataset at its
 * name ('/'-separated path, intermediate groups created), row-major, whose
 * dimensions are the shard extent, with attributes
 *   global_shape, shard_offset, shard_extent   int64[ndim]
 *   crc32c            uint32: CRC-32C (mal_crc32c) of the shard's little-endian bytes
 * Contiguous layout keeps the data addressable (H5Dget_offset) and makes
 * the datasets usable as sources of virtual datasets later.
 *
 * COMPLETE is a small JSON object:
 *   {"format": "malleus-snapshot", "format_version": 1, "step": S,
 *    "n_tensors": N, "tensors_crc32c": C}
 * where C is the CRC-32C, over the tensors in byte-wise (strcmp) name order,
 * of each tensor's name, one NUL byte and its crc32c as 4 little-endian
 * bytes.  The reader recomputes C from the datasets it finds, so a missing,
 * extra or renamed tensor is noticed at open time; the data itself is
 * verified tensor by tensor at read time.
 *
 * HDF5 writes only the skeleton of state.h5; the tensor bytes go in with
 * pwrite at each dataset's offset (see snap_write_state for why).
 *
 * Commit protocol (crash-safe on a POSIX file system): write everything into
 * .tmp-step_S.<pid>@<host>, fsync its files and the directory, rename it to
 * step_S, fsync DIR, write COMPLETE through a temporary file (fsync, rename,
 * fsync the step directory), then move `latest` the same way.  A directory
 * without COMPLETE is never trusted; `latest` only ever names a directory
 * that had COMPLETE first.  Removal goes in the opposite order: COMPLETE is
 * unlinked before anything else of a snapshot.
 *
 * The future sharded (MPI) writer keeps this: every rank writes its own
 * shard file, state.h5 holds virtual datasets at the same names presenting
 * the full tensors, and rank 0 writes COMPLETE after a barrier.
 */
#include "snapshot.h"

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

#define SNAP_STATE_FILE "state.h5"
#define SNAP_COMPLETE "COMPLETE"
#define SNAP_LATEST "latest"
#define SNAP_TMP_PREFIX ".tmp-"
#define SNAP_STEP_PREFIX "step_"
#define SNAP_MAX_SMALL_FILE 65536

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

typedef struct {
    const char *name;
    uint32_t crc;
} snap_named_crc;

static int snap_cmp_named(const void *a, const void *b)
{
    return strcmp(((const snap_named_crc *)a)->name, ((const snap_named_crc *)b)->name);
}

/* The commit checksum over the per-tensor checksums; `v` sorted by name. */
static uint32_t snap_tensors_crc(const snap_named_crc *v, int n)
{
    uint32_t c = 0;
    for (int i = 0; i < n; i++) {
        c = mal_crc32c(c, v[i].name, strlen(v[i].name) + 1);
        unsigned char le[4] = {(unsigned char)v[i].crc, (unsigned char)(v[i].crc >> 8),
                               (unsigned char)(v[i].crc >> 16), (unsigned char)(v[i].crc >> 24)};
        c = mal_crc32c(c, le, 4);
    }
    return c;
}

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
    const char *p = name;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return MAL_ERR(MAL_EINVAL,
                           "snapshot tensor name '%s' has an empty, '.' or '..' component; "
                           "use paths like \"param/layers.0.wq\"",
                           name);
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

static int snap_check_tensor(const mal_snap_tensor *t)
{
    int rc = snap_check_name(t->name);
    if (rc) return rc;
    if (t->ndim < 1 || t->ndim > MAL_SNAP_MAXDIM)
        return MAL_ERR(MAL_EINVAL, "tensor '%s': ndim %d is outside 1..%d", t->name, t->ndim,
                       MAL_SNAP_MAXDIM);
    int whole = 1;
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
        if (t->offset[d] != 0 || t->extent[d] != t->shape[d]) whole = 0;
    }
    if (!whole)
        return MAL_ERR(MAL_ENOTSUP,
                       "tensor '%s' is a partial shard; snapshot v0 writes whole tensors only "
                       "(offset 0, extent == shape), sharded writes need the MPI writer",
                       t->name);
    if (snap_count(t->ndim, t->extent) < 0)
        return MAL_ERR(MAL_EINVAL, "tensor '%s' is too large", t->name);
    if (!t->data) return MAL_ERR(MAL_EINVAL, "tensor '%s' has no data buffer", t->name);
    return 0;
}

/* Names must be unique, and no name may be a group on the path of another
 * ("a" and "a/b"): HDF5 cannot have both.  `v` is sorted by name. */
static int snap_check_names_disjoint(const snap_named_crc *v, int n)
{
    for (int i = 0; i + 1 < n; i++)
        if (strcmp(v[i].name, v[i + 1].name) == 0)
            return MAL_ERR(MAL_EINVAL, "tensor name '%s' appears twice in the snapshot", v[i].name);
    for (int i = 0; i < n; i++) {
        char prefix[1024];
        const char *name = v[i].name;
        for (const char *s = strchr(name, '/'); s; s = strchr(s + 1, '/')) {
            size_t len = (size_t)(s - name);
            if (len >= sizeof prefix) break;
            memcpy(prefix, name, len);
            prefix[len] = '\0';
            snap_named_crc key = {prefix, 0};
            if (bsearch(&key, v, (size_t)n, sizeof *v, snap_cmp_named))
                return MAL_ERR(MAL_EINVAL,
                               "tensor '%s' lies inside tensor '%s': a name cannot be both a "
                               "tensor and a group; rename one of them",
                               name, prefix);
        }
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

/* ---------------------------------------------------------------- writing */

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

/* Create `fpath` with meta and all tensors, and fsync it; crc[i] receives
 * tensor i's checksum.
 *
 * HDF5 writes only the skeleton: attributes and datasets whose space is
 * allocated at creation and never filled.  The tensor bytes then go
 * through our own pwrite at each dataset's file offset.  Besides writing
 * straight from the caller's buffers, this keeps bulk-data I/O errors (a
 * full disk) out of HDF5: HDF5 1.10 leaves a broken file id behind when
 * H5Fclose fails to flush, and the process then crashes in HDF5's atexit
 * handler (h5py issue 914).  The skeleton is a few KiB per tensor. */
static int snap_write_state(const char *fpath, const mal_snap_meta *meta, const mal_snap_tensor *t,
                            int n, uint32_t *crc)
{
    int rc = 0, fd = -1;
    hid_t fapl = -1, f = -1, lcpl = -1, dcpl = -1;
    haddr_t *where = calloc((size_t)n + 1, sizeof *where);
    if (!where) return MAL_ERR(MAL_ENOMEM, "out of memory writing %s", fpath);

    fapl = snap_fapl();
    if (fapl < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up the HDF5 file access list", fpath);
        goto done;
    }
    if (snap_fault()) {
        rc = MAL_ERR(MAL_EIO, "cannot create snapshot file %s: %s", fpath, strerror(errno));
        goto done;
    }
    f = H5Fcreate(fpath, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (f < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "cannot create snapshot file %s", fpath);
        goto done;
    }

    int32_t version = MAL_SNAP_FORMAT_VERSION;
    int64_t i64[2] = {meta->step, meta->consumed_samples};
    const char *fmt = MAL_SNAP_FORMAT;
    if ((rc = snap_attr_write_str(f, "format", fmt, fpath)) ||
        (rc = snap_attr_write(f, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &version,
                              fpath, "the root group")) ||
        (rc = snap_attr_write(f, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &i64[0], fpath,
                              "the root group")) ||
        (rc = snap_attr_write(f, "consumed_samples", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &i64[1],
                              fpath, "the root group")) ||
        (rc = snap_attr_write(f, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0, &meta->seed, fpath,
                              "the root group")) ||
        (rc = snap_attr_write(f, "rng_counter", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0,
                              &meta->rng_counter, fpath, "the root group")) ||
        (rc = snap_attr_write_str(f, "config_json", meta->config_json, fpath)) ||
        (rc = snap_attr_write_str(f, "train_json", meta->train_json, fpath)) ||
        (rc = snap_attr_write_str(f, "plan_json", meta->plan_json, fpath)))
        goto done;

    lcpl = H5Pcreate(H5P_LINK_CREATE);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    /* contiguous and allocated now (addressable, VDS-friendly); never
     * filled, since we write every byte; no timestamps, so equal state gives
     * equal files */
    if (lcpl < 0 || dcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 ||
        H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 || H5Pset_obj_track_times(dcpl, 0) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5 property lists", fpath);
        goto done;
    }

    for (int i = 0; i < n; i++) {
        const mal_snap_tensor *x = &t[i];
        hsize_t dims[MAL_SNAP_MAXDIM];
        for (int d = 0; d < x->ndim; d++)
            dims[d] = (hsize_t)x->extent[d];
        size_t count = (size_t)snap_count(x->ndim, x->extent);
        crc[i] = mal_crc32c(0, x->data, count * sizeof(float));

        char obj[1100];
        snprintf(obj, sizeof obj, "tensor '%s'", x->name);
        hid_t sp = H5Screate_simple(x->ndim, dims, NULL), ds = -1;
        if (sp < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot make the dataspace of %s", fpath, obj);
            goto done;
        }
        ds = H5Dcreate2(f, x->name, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
        H5Sclose(sp);
        if (ds < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot create the dataset of %s", fpath, obj);
            goto done;
        }
        where[i] = H5Dget_offset(ds);
        if (where[i] == HADDR_UNDEF) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: no file space was allocated for %s", fpath, obj);
            H5Dclose(ds);
            goto done;
        }
        hsize_t nd = (hsize_t)x->ndim;
        if ((rc = snap_attr_write(ds, "global_shape", H5T_STD_I64LE, H5T_NATIVE_INT64, nd, x->shape,
                                  fpath, obj)) ||
            (rc = snap_attr_write(ds, "shard_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, nd,
                                  x->offset, fpath, obj)) ||
            (rc = snap_attr_write(ds, "shard_extent", H5T_STD_I64LE, H5T_NATIVE_INT64, nd,
                                  x->extent, fpath, obj)) ||
            (rc = snap_attr_write(ds, "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, 0, &crc[i], fpath,
                                  obj))) {
            H5Dclose(ds);
            goto done;
        }
        if (H5Dclose(ds) < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close the dataset of %s", fpath, obj);
            goto done;
        }
    }

    if ((rc = snap_h5close(&f, fpath))) goto done;

    fd = snap_fault() ? -1 : open(fpath, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = MAL_ERR(MAL_EIO, "cannot open %s to write tensor data: %s", fpath, strerror(errno));
        goto done;
    }
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)snap_count(t[i].ndim, t[i].extent) * sizeof(float);
        if ((rc = snap_pwrite_all(fd, t[i].data, bytes, (off_t)where[i], fpath, t[i].name)))
            goto done;
    }
    if (snap_fault() || fsync(fd) != 0) {
        rc = MAL_ERR(MAL_EIO, "fsync of %s failed: %s", fpath, strerror(errno));
        goto done;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) rc = MAL_ERR(MAL_EIO, "cannot close %s: %s", fpath, strerror(errno));

done:
    if (fd >= 0) close(fd);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (f >= 0) {
        int r = snap_h5close(&f, fpath);
        if (!rc) rc = r;
    }
    if (fapl >= 0) H5Pclose(fapl);
    free(where);
    return rc;
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
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            snap_stepdir *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                rc = MAL_ERR(MAL_ENOMEM, "out of memory listing %s", dir);
                goto done;
            }
            v = nv;
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

/* Refuse early, with a clear message, when the file system cannot hold
 * the snapshot: a full disk is the most likely way for a write to fail. */
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

int mal_snapshot_write(const char *dir, const mal_snap_meta *meta, const mal_snap_tensor *t, int n,
                       int keep_last, char *out_path, size_t out_len)
{
    int rc = 0;
    enum { NOTHING, TMPDIR, RENAMED, COMMITTED } stage = NOTHING;
    snap_named_crc *sorted = NULL;
    uint32_t *crc = NULL;
    char stepname[64], tmpname[400], id[300], final[PATH_MAX], tmp[PATH_MAX], fpath[PATH_MAX];
    char marker[PATH_MAX];
    snap_h5quiet q;
    snap_h5quiet_begin(&q);

    if (!dir || !meta || n < 0 || (n > 0 && !t) || keep_last < 0) {
        rc = MAL_ERR(MAL_EINVAL,
                     "mal_snapshot_write: bad arguments (dir, meta, tensors, n = %d, "
                     "keep_last = %d)",
                     n, keep_last);
        goto done;
    }
    if (meta->step < 0 || meta->consumed_samples < 0) {
        rc = MAL_ERR(MAL_EINVAL, "snapshot meta: step %lld and consumed_samples %lld must be >= 0",
                     (long long)meta->step, (long long)meta->consumed_samples);
        goto done;
    }
    sorted = calloc((size_t)n + 1, sizeof *sorted);
    crc = calloc((size_t)n + 1, sizeof *crc);
    if (!sorted || !crc) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory preparing a snapshot of %d tensors", n);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if ((rc = snap_check_tensor(&t[i]))) goto done;
        sorted[i].name = t[i].name;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, snap_cmp_named);
    if ((rc = snap_check_names_disjoint(sorted, n))) goto done;

    snprintf(stepname, sizeof stepname, SNAP_STEP_PREFIX "%08lld", (long long)meta->step);
    snap_writer_id(id, sizeof id);
    snprintf(tmpname, sizeof tmpname, SNAP_TMP_PREFIX "%s.%s", stepname, id);
    if ((rc = snap_join(final, sizeof final, dir, stepname)) ||
        (rc = snap_join(tmp, sizeof tmp, dir, tmpname)) ||
        (rc = snap_join(fpath, sizeof fpath, tmp, SNAP_STATE_FILE)) ||
        (rc = snap_join(marker, sizeof marker, final, SNAP_COMPLETE)))
        goto done;
    if (out_path && strlen(final) >= out_len) {
        rc = MAL_ERR(MAL_EINVAL, "snapshot path %s does not fit the caller's %zu-byte buffer",
                     final, out_len);
        goto done;
    }
    if ((rc = snap_mkdirs(dir))) goto done;

    /* A committed snapshot of this step is trusted: never replace it.  An
     * uncommitted one is debris of a crash and goes. */
    if (snap_exists(marker)) {
        rc = MAL_ERR(MAL_EINVAL,
                     "a committed snapshot of step %lld already exists at %s; remove it or "
                     "write to another directory",
                     (long long)meta->step, final);
        goto done;
    }
    if (snap_exists(final) && (rc = snap_rmtree(final))) goto done;
    if ((rc = snap_rmtree(tmp))) goto done;

    if (snap_fault() || mkdir(tmp, 0755) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot create %s: %s", tmp, strerror(errno));
        goto done;
    }
    stage = TMPDIR;
    if ((rc = snap_check_space(dir, t, n)) || (rc = snap_write_state(fpath, meta, t, n, crc)) ||
        (rc = snap_fsync(tmp, 1)))
        goto done;

    if (snap_fault() || rename(tmp, final) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        goto done;
    }
    stage = RENAMED;
    if ((rc = snap_fsync(dir, 1))) goto done;

    /* COMPLETE, last: from here on the snapshot is trusted. */
    for (int i = 0; i < n; i++) {
        snap_named_crc key = {t[i].name, 0};
        snap_named_crc *hit = bsearch(&key, sorted, (size_t)n, sizeof *sorted, snap_cmp_named);
        hit->crc = crc[i];
    }
    json_t *j = json_pack("{s:s, s:i, s:I, s:i, s:I}", "format", MAL_SNAP_FORMAT, "format_version",
                          MAL_SNAP_FORMAT_VERSION, "step", (json_int_t)meta->step, "n_tensors", n,
                          "tensors_crc32c", (json_int_t)snap_tensors_crc(sorted, n));
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
    rc = snap_write_atomic(final, SNAP_COMPLETE, line, &renamed);
    free(line);
    if (rc) goto done;
    stage = COMMITTED;

    char pointer[80];
    snprintf(pointer, sizeof pointer, "%s\n", stepname);
    if ((rc = snap_write_atomic(dir, SNAP_LATEST, pointer, &renamed))) {
        if (!renamed) goto done;
        /* `latest` already names the new, committed snapshot; whether the
         * old or the new name survives a crash, it names a trusted one. */
        mal_log(MAL_LOG_WARN, "snapshot %s committed and named by %s/%s, but: %s", final, dir,
                SNAP_LATEST, mal_errmsg());
        rc = 0;
    }

    if (out_path) snprintf(out_path, out_len, "%s", final);
    if (snap_retain(dir, meta->step, keep_last) != 0)
        mal_log(MAL_LOG_WARN, "snapshot %s committed, but retention failed: %s", final,
                mal_errmsg());

done:
    if (rc) {
        /* Undo what is not trusted.  COMMITTED (only `latest` failed): a
         * complete snapshot that `latest` does not name is harmless, and
         * retention treats it like any other. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mal_errmsg());
        int r = 0;
        if (stage == TMPDIR)
            r = snap_rmtree(tmp);
        else if (stage == RENAMED)
            r = snap_remove_step(final);
        if (r)
            mal_seterr_at(__FILE__, __LINE__, rc, "%s; cleaning up also failed: %s", msg,
                          mal_errmsg());
    }
    free(sorted);
    free(crc);
    snap_h5quiet_end(&q);
    return rc;
}

/* ---------------------------------------------------------------- finding and reading */

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

typedef struct {
    char *name;
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM], offset[MAL_SNAP_MAXDIM], extent[MAL_SNAP_MAXDIM];
    uint32_t crc;
} snap_entry;

struct mal_snapshot {
    char *file_path;
    hid_t file;
    mal_snap_meta meta;
    snap_entry *t;
    int n_t, cap_t;
};

static int snap_cmp_entry(const void *a, const void *b)
{
    return strcmp(((const snap_entry *)a)->name, ((const snap_entry *)b)->name);
}

typedef struct {
    mal_snapshot *s;
    int rc;
} snap_visit;

/* Describe one dataset found in the file. */
static int snap_load_entry(mal_snapshot *s, hid_t ds, const char *name)
{
    char obj[1100];
    int rc = 0;
    hid_t ft = -1, sp = -1;
    snprintf(obj, sizeof obj, "tensor '%s'", name);
    if (s->n_t == s->cap_t) {
        int cap = s->cap_t ? 2 * s->cap_t : 64;
        snap_entry *nv = realloc(s->t, (size_t)cap * sizeof *nv);
        if (!nv) return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", s->file_path);
        s->t = nv;
        s->cap_t = cap;
    }
    snap_entry *e = &s->t[s->n_t];
    memset(e, 0, sizeof *e);
    if ((ft = H5Dget_type(ds)) < 0 || (sp = H5Dget_space(ds)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot inspect %s", s->file_path, obj);
        goto done;
    }
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[MAL_SNAP_MAXDIM];
    if (H5Tget_class(ft) != H5T_FLOAT || H5Tget_size(ft) != 4 || nd < 1 || nd > MAL_SNAP_MAXDIM ||
        H5Sget_simple_extent_dims(sp, dims, NULL) != nd) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: %s is not a float32 dataset of 1..%d dimensions",
                     s->file_path, obj, MAL_SNAP_MAXDIM);
        goto done;
    }
    e->ndim = nd;
    if ((rc = snap_attr_read_int(ds, "global_shape", H5T_NATIVE_INT64, nd, e->shape, s->file_path,
                                 obj)) ||
        (rc = snap_attr_read_int(ds, "shard_offset", H5T_NATIVE_INT64, nd, e->offset, s->file_path,
                                 obj)) ||
        (rc = snap_attr_read_int(ds, "shard_extent", H5T_NATIVE_INT64, nd, e->extent, s->file_path,
                                 obj)) ||
        (rc = snap_attr_read_int(ds, "crc32c", H5T_NATIVE_UINT32, 0, &e->crc, s->file_path, obj)))
        goto done;
    for (int d = 0; d < nd; d++)
        if (e->extent[d] != (int64_t)dims[d] || e->offset[d] != 0 || e->extent[d] != e->shape[d]) {
            rc = MAL_ERR(MAL_EFORMAT,
                         "%s: %s: dataset dimensions, global_shape, shard_offset and "
                         "shard_extent disagree (format version 1 stores whole tensors)",
                         s->file_path, obj);
            goto done;
        }
    e->name = strdup(name);
    if (!e->name) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", s->file_path);
        goto done;
    }
    s->n_t++;
done:
    if (sp >= 0) H5Sclose(sp);
    if (ft >= 0) H5Tclose(ft);
    return rc;
}

static herr_t snap_visit_cb(hid_t g, const char *name, const H5L_info_t *info, void *data)
{
    snap_visit *v = data;
    if (info->type != H5L_TYPE_HARD) return 0;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        v->rc = SNAP_H5ERR(MAL_EIO, "%s: cannot open object '%s'", v->s->file_path, name);
        return -1;
    }
    if (H5Iget_type(o) == H5I_DATASET) v->rc = snap_load_entry(v->s, o, name);
    H5Oclose(o);
    return v->rc ? -1 : 0;
}

/* Parse and check COMPLETE of `step_dir`. */
static int snap_read_marker(const char *step_dir, int64_t *step, int *n_tensors, uint32_t *tcrc)
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
    json_int_t st = 0, c = 0;
    if (!j ||
        json_unpack(j, "{s:s, s:i, s:I, s:i, s:I}", "format", &fmt, "format_version", &version,
                    "step", &st, "n_tensors", n_tensors, "tensors_crc32c", &c) != 0) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s is not a valid marker (JSON with format, format_version, step, "
                     "n_tensors, tensors_crc32c expected)%s%s",
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
    *step = (int64_t)st;
    *tcrc = (uint32_t)c;
done:
    json_decref(j);
    return rc;
}

int mal_snapshot_open(mal_snapshot **out, const char *step_dir)
{
    int rc = 0, n_committed = 0;
    int64_t step = 0;
    uint32_t tcrc = 0;
    hid_t fapl = -1;
    mal_snapshot *s = NULL;
    struct stat st;
    char *fmt = NULL;
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
    if ((rc = snap_read_marker(step_dir, &step, &n_committed, &tcrc))) goto done;

    s = calloc(1, sizeof *s);
    if (s) s->file = -1;
    if (!s || !(s->file_path = malloc(PATH_MAX))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory opening %s", step_dir);
        goto done;
    }
    if ((rc = snap_join(s->file_path, PATH_MAX, step_dir, SNAP_STATE_FILE))) goto done;
    if (!snap_exists(s->file_path)) {
        rc = MAL_ERR(MAL_ECORRUPT, "committed snapshot %s lacks its data file %s", step_dir,
                     s->file_path);
        goto done;
    }
    if ((fapl = snap_fapl()) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up the HDF5 file access list", s->file_path);
        goto done;
    }
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_h5 = H5Fis_accessible(s->file_path, fapl);
#else
    htri_t is_h5 = H5Fis_hdf5(s->file_path);
#endif
    if (is_h5 == 0) {
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s is not an HDF5 file (overwritten or truncated?); resume from an "
                     "earlier snapshot",
                     s->file_path);
        goto done;
    }
    s->file = H5Fopen(s->file_path, H5F_ACC_RDONLY, fapl);
    if (s->file < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "cannot open snapshot file %s", s->file_path);
        goto done;
    }

    int32_t version = 0;
    if ((rc = snap_attr_read_str(s->file, "format", 0, &fmt, s->file_path))) goto done;
    if (strcmp(fmt, MAL_SNAP_FORMAT) != 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: format is \"%s\", not \"%s\"", s->file_path, fmt,
                     MAL_SNAP_FORMAT);
        goto done;
    }
    if ((rc = snap_attr_read_int(s->file, "format_version", H5T_NATIVE_INT32, 0, &version,
                                 s->file_path, "the root group")))
        goto done;
    if (version != MAL_SNAP_FORMAT_VERSION) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s: snapshot format_version %d; this build reads version %d only (use the "
                     "malleus version that wrote it)",
                     s->file_path, (int)version, MAL_SNAP_FORMAT_VERSION);
        goto done;
    }
    mal_snap_meta *m = &s->meta;
    if ((rc = snap_attr_read_int(s->file, "step", H5T_NATIVE_INT64, 0, &m->step, s->file_path,
                                 "the root group")) ||
        (rc = snap_attr_read_int(s->file, "consumed_samples", H5T_NATIVE_INT64, 0,
                                 &m->consumed_samples, s->file_path, "the root group")) ||
        (rc = snap_attr_read_int(s->file, "seed", H5T_NATIVE_UINT64, 0, &m->seed, s->file_path,
                                 "the root group")) ||
        (rc = snap_attr_read_int(s->file, "rng_counter", H5T_NATIVE_UINT64, 0, &m->rng_counter,
                                 s->file_path, "the root group")) ||
        (rc = snap_attr_read_str(s->file, "config_json", 1, &m->config_json, s->file_path)) ||
        (rc = snap_attr_read_str(s->file, "train_json", 1, &m->train_json, s->file_path)) ||
        (rc = snap_attr_read_str(s->file, "plan_json", 1, &m->plan_json, s->file_path)))
        goto done;
    if (m->step != step) {
        rc = MAL_ERR(MAL_ECORRUPT, "%s says step %lld but its COMPLETE marker says %lld",
                     s->file_path, (long long)m->step, (long long)step);
        goto done;
    }

    snap_visit v = {s, 0};
    if (H5Lvisit(s->file, H5_INDEX_NAME, H5_ITER_INC, snap_visit_cb, &v) < 0) {
        rc = v.rc ? v.rc : SNAP_H5ERR(MAL_EIO, "%s: cannot list the tensors", s->file_path);
        goto done;
    }
    qsort(s->t, (size_t)s->n_t, sizeof *s->t, snap_cmp_entry);
    snap_named_crc *nc = calloc((size_t)s->n_t + 1, sizeof *nc);
    if (!nc) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory opening %s", step_dir);
        goto done;
    }
    for (int i = 0; i < s->n_t; i++)
        nc[i] = (snap_named_crc){s->t[i].name, s->t[i].crc};
    uint32_t have = snap_tensors_crc(nc, s->n_t);
    free(nc);
    if (s->n_t != n_committed || have != tcrc) {
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s holds %d tensors (list checksum 0x%08x) but its COMPLETE marker "
                     "committed %d (0x%08x): the snapshot was altered after it was written",
                     s->file_path, s->n_t, have, n_committed, tcrc);
        goto done;
    }
    *out = s;
    s = NULL;
done:
    free(fmt);
    if (fapl >= 0) H5Pclose(fapl);
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
    const snap_entry *e = &s->t[i];
    memset(info, 0, sizeof *info);
    info->name = e->name;
    info->ndim = e->ndim;
    memcpy(info->shape, e->shape, sizeof e->shape);
    memcpy(info->offset, e->offset, sizeof e->offset);
    memcpy(info->extent, e->extent, sizeof e->extent);
    info->data = NULL;
    return 0;
}

int mal_snapshot_read(mal_snapshot *s, const char *name, int ndim, const int64_t *shape,
                      float *data, size_t n)
{
    int rc = 0;
    hid_t ds = -1;
    snap_h5quiet q;
    if (!s || !name || !shape || !data)
        return MAL_ERR(MAL_EINVAL, "mal_snapshot_read: s, name, shape and data must not be NULL");
    snap_entry key = {.name = (char *)name};
    const snap_entry *e = bsearch(&key, s->t, (size_t)s->n_t, sizeof *s->t, snap_cmp_entry);
    if (!e) return MAL_ERR(MAL_ENOENT, "%s has no tensor '%s'", s->file_path, name);
    int same = ndim == e->ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == e->shape[d];
    if (!same) {
        char want[128], have[128];
        snap_fmt_shape(want, sizeof want, ndim > 0 && ndim <= MAL_SNAP_MAXDIM ? ndim : 0, shape);
        snap_fmt_shape(have, sizeof have, e->ndim, e->shape);
        return MAL_ERR(MAL_EMISMATCH,
                       "%s: tensor '%s' has shape %s but the caller expects %s (model config "
                       "differs from the snapshot's?)",
                       s->file_path, name, have, want);
    }
    size_t count = (size_t)snap_count(e->ndim, e->extent);
    if (n < count)
        return MAL_ERR(MAL_EINVAL, "tensor '%s' has %zu elements but the buffer holds %zu", name,
                       count, n);

    snap_h5quiet_begin(&q);
    ds = H5Dopen2(s->file, name, H5P_DEFAULT);
    if (ds < 0 || H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read tensor '%s'", s->file_path, name);
        goto done;
    }
    uint32_t c = mal_crc32c(0, data, count * sizeof(float));
    if (c != e->crc)
        rc = MAL_ERR(MAL_ECORRUPT,
                     "%s: tensor '%s' fails its checksum (CRC-32C 0x%08x, stored 0x%08x): the "
                     "file is corrupt; resume from an earlier snapshot",
                     s->file_path, name, c, e->crc);
done:
    if (ds >= 0) H5Dclose(ds);
    snap_h5quiet_end(&q);
    return rc;
}

void mal_snapshot_close(mal_snapshot *s)
{
    if (!s) return;
    if (s->file >= 0) {
        snap_h5quiet q;
        snap_h5quiet_begin(&q);
        H5Fclose(s->file);
        snap_h5quiet_end(&q);
    }
    for (int i = 0; i < s->n_t; i++)
        free(s->t[i].name);
    free(s->t);
    free(s->meta.config_json);
    free(s->meta.train_json);
    free(s->meta.plan_json);
    free(s->file_path);
    free(s);
}
