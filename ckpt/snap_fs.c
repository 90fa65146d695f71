/* File system side of snapshots: paths, durable I/O (fsync of files and
 * directories, write-temporary-then-rename), retention and the removal of
 * debris, finding the snapshot to resume from (`latest`), and the COMPLETE
 * marker read back and parsed.  The commit that puts these in order (and
 * why that order is crash-safe) is snap_commit.c; every writer I/O step
 * here asks snap_fault() (snap_fault.c) first.
 */
#include "snap_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- files and directories */

int snap_join(char *out, size_t len, const char *a, const char *b)
{
    int k = snprintf(out, len, "%s/%s", a, b);
    if (k < 0 || (size_t)k >= len)
        return MAL_ERR(MAL_EINVAL, "path %s/%s is too long (limit %zu bytes)", a, b, len - 1);
    return 0;
}

int snap_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int snap_fsync(const char *path, int is_dir)
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

/* mkdir -p, fsyncing the parent of every directory it creates, and
 * recording which it created (see snap_internal.h). */
int snap_mkdirs(const char *dir, snap_created *made)
{
    char buf[PATH_MAX];
    size_t len = strlen(dir);
    made->n = 0;
    if (len == 0 || len >= sizeof buf)
        return MAL_ERR(MAL_EINVAL, "snapshot directory name '%s' is empty or too long", dir);
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) == 0) {
            /* beyond the room for it, a created directory is just kept */
            if (made->n < SNAP_MAX_CREATED) made->len[made->n++] = i;
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

void snap_unmkdirs(const char *dir, const snap_created *made)
{
    char buf[PATH_MAX];
    for (int k = made->n - 1; k >= 0; k--) {
        if (made->len[k] >= sizeof buf) return;
        memcpy(buf, dir, made->len[k]);
        buf[made->len[k]] = '\0';
        /* rmdir, never more: what someone else put there since stays */
        if (rmdir(buf) != 0) return;
        mal_log(MAL_LOG_DEBUG, "snapshot: removed %s, created for a snapshot that failed", buf);
    }
}

static int snap_rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

/* rm -rf without following symbolic links; a missing path is fine. */
int snap_rmtree(const char *path)
{
    if (nftw(path, snap_rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return MAL_ERR(MAL_EIO, "cannot remove %s: %s", path, strerror(errno));
    return 0;
}

/* Remove a step directory so that it stops being trusted first: COMPLETE
 * goes (durably) before any data, so a crash half-way leaves an
 * uncommitted directory, never a committed one with holes. */
int snap_remove_step(const char *step_dir)
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
void snap_writer_id(char *out, size_t len)
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
int snap_write_atomic(const char *dir, const char *name, const char *content, int *renamed)
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
int snap_read_small(const char *path, char **out)
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
int64_t snap_parse_step_name(const char *name)
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

/* Write all of `len` bytes at `off`. */
int snap_pwrite_all(int fd, const void *buf, size_t len, off_t off, const char *fpath,
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

int snap_pread_all(int fd, void *buf, size_t len, off_t off, const char *path, const char *name)
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
int snap_retain(const char *dir, int64_t cur, int keep_last)
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
        /* v is NULL while no older committed snapshot exists (the first) */
        if (n > 1) qsort(v, (size_t)n, sizeof *v, snap_cmp_step_desc);
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

/* ---------------------------------------------------------------- finding */

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

/* ---------------------------------------------------------------- the marker */

int mal_snapshot_parse_marker(const char *text, size_t len, const char *what, mal_snap_marker *mk)
{
    if (!text || !what || !mk) return MAL_ERR(MAL_EINVAL, "mal_snapshot_parse_marker: NULL");
    memset(mk, 0, sizeof *mk);
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    const char *fmt = NULL;
    json_int_t version = 0, st = 0, nt = 0, nb = 0, ns = 0, ib = 0, c = 0;
    int rc = 0;
    if (!j || json_unpack(j, "{s:s, s:I}", "format", &fmt, "format_version", &version) != 0) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s is not a valid marker (JSON with format, format_version, ... "
                     "expected)%s%s",
                     what, j ? "" : ": ", j ? "" : jerr.text);
        goto done;
    }
    if (strcmp(fmt, MAL_SNAP_FORMAT) != 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: format is \"%.100s\", not \"%s\"", what, fmt,
                     MAL_SNAP_FORMAT);
        goto done;
    }
    if (version != MAL_SNAP_FORMAT_VERSION) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s: snapshot format_version %lld; this build reads version %d only (use "
                     "the malleus version that wrote it)",
                     what, (long long)version, MAL_SNAP_FORMAT_VERSION);
        goto done;
    }
    if (json_unpack(j, "{s:I, s:I, s:I, s:I, s:I, s:I}", "step", &st, "n_tensors", &nt, "n_blocks",
                    &nb, "n_shards", &ns, "index_bytes", &ib, "index_crc32c", &c) != 0 ||
        st < 0 || nt < 0 || nb < 0 || ns < 0 || ib < 0 || c < 0 || c > UINT32_MAX) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s is not a valid marker (step, n_tensors, n_blocks, n_shards, "
                     "index_bytes, index_crc32c expected)",
                     what);
        goto done;
    }
    /* The counts only ever meet the index's own (which its parser bounds
     * by the index's size); the size bounds the read of the index. */
    if ((uint64_t)ib > SNAP_MAX_INDEX_BYTES || nt > INT_MAX || ns > INT_MAX) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s is not a valid marker: an index of %lld bytes (at most %zu) with %lld "
                     "tensors and %lld shards",
                     what, (long long)ib, (size_t)SNAP_MAX_INDEX_BYTES, (long long)nt,
                     (long long)ns);
        goto done;
    }
    mk->step = st;
    mk->n_tensors = nt;
    mk->n_blocks = nb;
    mk->n_shards = ns;
    mk->index_bytes = ib;
    mk->index_crc32c = (uint32_t)c;
done:
    json_decref(j);
    return rc;
}

/* Parse and check COMPLETE of `step_dir`. */
int snap_read_marker(const char *step_dir, mal_snap_marker *mk)
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
    rc = mal_snapshot_parse_marker(text, strlen(text), marker, mk);
    free(text);
    return rc;
}

int snap_read_file(const char *path, size_t limit, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return MAL_ERR(MAL_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return MAL_ERR(MAL_ECORRUPT, "%s is not a regular file", path);
    }
    /* one byte beyond the limit tells a file that grew past it */
    size_t cap = (size_t)MAL_MIN((uint64_t)st.st_size, (uint64_t)limit) + 1, n = 0;
    char *p = malloc(cap);
    if (!p) {
        close(fd);
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", path);
    }
    int rc = 0;
    while (n < cap) {
        ssize_t k = read(fd, p + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = MAL_ERR(MAL_EIO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    if (!rc && n > limit)
        rc =
            MAL_ERR(MAL_ECORRUPT, "%s is larger than %zu bytes: not a snapshot index", path, limit);
    if (rc) {
        free(p);
        return rc;
    }
    *buf = p;
    *len = n;
    return 0;
}
