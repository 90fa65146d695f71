/* File system side of snapshots: paths, durable I/O (fsync of files and
 * directories, write-temporary-then-rename), retention and the removal of
 * debris, and small files (the COMPLETE marker, `latest`) read back.  The
 * commit that puts these in order (and why that order is crash-safe) is
 * snap_commit.c; finding the snapshot to resume from is snap_find.c; every
 * writer I/O step here asks snap_fault() (snap_fault.c) first.
 *
 * A snapshot directory is outside input that users copy, link and share,
 * so nothing here trusts its entries: every file created in it is created
 * relative to a descriptor of its directory (openat), O_CREAT|O_EXCL|
 * O_NOFOLLOW, temporary ones under a name with a random part, so a link
 * planted at a predictable name or a directory swapped for a link cannot
 * redirect a write; removal (retention, debris, a failed snapshot) never
 * follows a link and never leaves the file system of the directory it was
 * given; and small files are opened non-blocking, checked to be regular
 * files and read with a bound, so a FIFO or a device cannot wedge a reader.
 */
#include "snap_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fileio.h"

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

int snap_fsync_fd(int fd, const char *shown, int is_dir)
{
    /* Some file systems cannot fsync a directory (EINVAL); their renames
     * are then as durable as they get. */
    if (snap_fault() || (fsync(fd) != 0 && !(is_dir && errno == EINVAL)))
        return MAL_ERR(MAL_EIO, "fsync of %s failed: %s", shown, strerror(errno));
    return 0;
}

int snap_fsync(const char *path, int is_dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0) return MAL_ERR(MAL_EIO, "cannot open %s to fsync it: %s", path, strerror(errno));
    int rc = snap_fsync_fd(fd, path, is_dir);
    close(fd);
    return rc;
}

int snap_open_dir_at(int dfd, const char *name, const char *shown, int *out)
{
    *out = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*out >= 0) return 0;
    if (errno == ENOENT) return MAL_ENOENT;
    /* ELOOP / ENOTDIR: a link or a file where a directory was expected */
    return MAL_ERR(MAL_EIO, "cannot open directory %s: %s", shown, strerror(errno));
}

/* ---------------------------------------------------------------- names */

void snap_random_hex(char *out, size_t len)
{
    unsigned char r[8];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        /* no entropy yet (early boot): unique enough with O_EXCL behind it */
        uint64_t x = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^
                     (uint64_t)(uintptr_t)out;
        memcpy(r, &x, sizeof r);
    }
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; i < sizeof r && k + 2 < len; i++) {
        out[k++] = hex[r[i] >> 4];
        out[k++] = hex[r[i] & 15];
    }
    if (len) out[k < len ? k : len - 1] = '\0';
}

int snap_tmp_name(char *out, size_t len, const char *what)
{
    char id[SNAP_WRITER_ID_MAX], rnd[20];
    snap_writer_id(id, sizeof id);
    snap_random_hex(rnd, sizeof rnd);
    int k = snprintf(out, len, SNAP_TMP_PREFIX "%s.%s.%s", what, rnd, id);
    if (k < 0 || (size_t)k >= len)
        return MAL_ERR(MAL_EINVAL, "temporary name for '%s' is too long", what);
    return 0;
}

int snap_fd_path(char *out, size_t len, int dfd, const char *name, const char *dir_shown)
{
    /* /proc/self/fd/N is the directory itself, wherever it has been moved
     * or whatever now sits at its path; without /proc, its path */
    static int have_proc = -1;
    if (have_proc < 0) have_proc = access("/proc/self/fd", X_OK) == 0;
    int k = have_proc ? snprintf(out, len, "/proc/self/fd/%d/%s", dfd, name)
                      : snprintf(out, len, "%s/%s", dir_shown, name);
    if (k < 0 || (size_t)k >= len)
        return MAL_ERR(MAL_EINVAL, "path %s/%s is too long (limit %zu bytes)", dir_shown, name,
                       len - 1);
    return 0;
}

int snap_create_at(int dfd, const char *name, const char *shown, int *out)
{
    *out = snap_fault() ? -1
                        : openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                                 0644);
    if (*out < 0) return MAL_ERR(MAL_EIO, "cannot create %s: %s", shown, strerror(errno));
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

/* Remove dfd/name and everything below it: entries are looked at with
 * fstatat(AT_SYMLINK_NOFOLLOW) and directories opened O_NOFOLLOW relative
 * to their parent's descriptor, so a link is removed as a link (what it
 * points to is never touched) and a directory swapped for a link while we
 * work cannot send the removal elsewhere; another file system mounted
 * below (st_dev differs) is left alone, as is anything deeper than
 * SNAP_MAX_TREE_DEPTH (Malleus writes two levels). */
static int snap_rmtree_rec(int dfd, const char *name, dev_t dev, int depth, const char *shown)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : MAL_ERR(MAL_EIO, "cannot remove %s: %s", shown,
                                             strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT)
            return MAL_ERR(MAL_EIO, "cannot remove %s: %s", shown, strerror(errno));
        return 0;
    }
    if (st.st_dev != dev)
        return MAL_ERR(MAL_EIO, "%s is on another file system (a mount point): left alone", shown);
    if (depth >= SNAP_MAX_TREE_DEPTH)
        return MAL_ERR(MAL_EIO, "%s is nested deeper than a snapshot ever is: left alone", shown);
    int fd, rc = snap_open_dir_at(dfd, name, shown, &fd);
    if (rc) return rc == MAL_ENOENT ? 0 : rc;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return MAL_ERR(MAL_EIO, "cannot list %s: %s", shown, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", shown, e->d_name);
        int r = snap_rmtree_rec(dirfd(d), e->d_name, dev, depth + 1, sub);
        if (r && !rc) rc = r;
    }
    closedir(d);
    if (rc) return rc;
    if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        return MAL_ERR(MAL_EIO, "cannot remove %s: %s", shown, strerror(errno));
    return 0;
}

int snap_rmtree_at(int dfd, const char *name, const char *shown)
{
    struct stat st;
    if (fstat(dfd, &st) != 0) return MAL_ERR(MAL_EIO, "cannot stat the directory of %s", shown);
    return snap_rmtree_rec(dfd, name, st.st_dev, 0, shown);
}

/* Remove a step directory so that it stops being trusted first: COMPLETE
 * goes (durably) before any data, so a crash half-way leaves an
 * uncommitted directory, never a committed one with holes.  A link or
 * anything else that is not a directory is not a step directory: the
 * caller decides about it (retention reports it and leaves it alone). */
int snap_remove_step_at(int dfd, const char *name, const char *shown)
{
    int sfd, rc = snap_open_dir_at(dfd, name, shown, &sfd);
    if (rc) return rc == MAL_ENOENT ? 0 : rc;
    if (unlinkat(sfd, SNAP_COMPLETE, 0) == 0) {
        rc = snap_fsync_fd(sfd, shown, 1);
    } else if (errno != ENOENT) {
        rc = MAL_ERR(MAL_EIO, "cannot remove %s/%s: %s", shown, SNAP_COMPLETE, strerror(errno));
    }
    close(sfd);
    return rc ? rc : snap_rmtree_at(dfd, name, shown);
}

int snap_has_marker_at(int dfd, const char *name)
{
    int sfd;
    if (snap_open_dir_at(dfd, name, name, &sfd)) {
        mal_clearerr();
        return 0;
    }
    struct stat st;
    int has = fstatat(sfd, SNAP_COMPLETE, &st, AT_SYMLINK_NOFOLLOW) == 0;
    close(sfd);
    return has;
}

/* The writer's identity in temporary names: "<pid>@<host>".  The host
 * matters because DIR may be on a file system shared by many nodes, where a
 * pid alone says nothing about liveness. */
void snap_writer_id(char *out, size_t len)
{
    char host[256] = "unknown";
    if (gethostname(host, sizeof host) != 0) strcpy(host, "unknown");
    /* names built from it must stay within NAME_MAX (255) */
    host[SNAP_HOST_MAX] = '\0';
    for (char *p = host; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            *p = '_';
    snprintf(out, len, "%ld@%s", (long)getpid(), host);
}

/* Write `content` to dfd/name atomically: a temporary file created
 * O_EXCL|O_NOFOLLOW under a random name beside it, fsync, renameat,
 * fsync of the directory.  *renamed tells whether dfd/name was replaced
 * (which may be so even when the final fsync failed).  `dir` names dfd in
 * messages. */
int snap_write_atomic(int dfd, const char *dir, const char *name, const char *content,
                      int *renamed)
{
    *renamed = 0;
    char tmpname[NAME_MAX + 1], tmp[PATH_MAX], final[PATH_MAX];
    int rc = snap_tmp_name(tmpname, sizeof tmpname, name), fd = -1;
    if (!rc) rc = snap_join(tmp, sizeof tmp, dir, tmpname);
    if (!rc) rc = snap_join(final, sizeof final, dir, name);
    if (rc) return rc;

    if ((rc = snap_create_at(dfd, tmpname, tmp, &fd))) return rc;
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
    if ((rc = snap_fsync_fd(fd, tmp, 0))) goto fail_close;
    if (close(fd) != 0) {
        fd = -1;
        rc = MAL_ERR(MAL_EIO, "cannot close %s: %s", tmp, strerror(errno));
        goto fail_unlink;
    }
    fd = -1;
    /* rename replaces what is at `name` -- a link itself, never its target */
    if (snap_fault() || renameat(dfd, tmpname, dfd, name) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        goto fail_unlink;
    }
    *renamed = 1;
    return snap_fsync_fd(dfd, dir, 1);

fail_close:
    close(fd);
fail_unlink:
    unlinkat(dfd, tmpname, 0);
    return rc;
}

/* A small text file into a NUL-terminated malloc'ed buffer: opened
 * non-blocking (a FIFO would otherwise wait for a writer forever), refused
 * unless a regular file, read with a bound.  MAL_ENOENT (without a message)
 * if it does not exist. */
int snap_read_small_at(int dfd, const char *name, const char *shown, char **out)
{
    *out = NULL;
    int fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return MAL_ENOENT;
        return MAL_ERR(MAL_EIO, "cannot open %s: %s", shown, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        unsigned mode = st.st_mode;
        close(fd);
        return MAL_ERR(MAL_EFORMAT, "%s is %s, not a regular file: not a snapshot's; remove it",
                       shown, mal_file_kind(mode));
    }
    char *buf = malloc(SNAP_MAX_SMALL_FILE + 1);
    if (!buf) {
        close(fd);
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", shown);
    }
    size_t k = 0;
    int rc = 0;
    /* one byte beyond the bound tells a file that is too large */
    while (k < SNAP_MAX_SMALL_FILE + 1) {
        ssize_t r = read(fd, buf + k, SNAP_MAX_SMALL_FILE + 1 - k);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = MAL_ERR(MAL_EIO, "cannot read %s: %s", shown, strerror(errno));
            break;
        }
        if (r == 0) break;
        k += (size_t)r;
    }
    close(fd);
    if (!rc && k > SNAP_MAX_SMALL_FILE)
        rc = MAL_ERR(MAL_EFORMAT, "%s is larger than %d bytes: not a snapshot's", shown,
                     SNAP_MAX_SMALL_FILE);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[k] = '\0';
    *out = buf;
    return 0;
}

int snap_read_small(const char *path, char **out)
{
    return snap_read_small_at(AT_FDCWD, path, path, out);
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

/* A ".tmp-<what>[.<random>].<pid>[@<host>]" entry of dfd whose writer is
 * gone. */
static int snap_tmp_is_stale(int dfd, const char *name)
{
    char mine[SNAP_WRITER_ID_MAX];
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
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
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

void snap_report_foreign(const char *dir, const char *name, unsigned mode)
{
    mal_log(MAL_LOG_WARN,
            "snapshot: %s/%s is %s, not a directory Malleus wrote: left alone (remove it, or "
            "move it out of the snapshot directory)",
            dir, name, mal_file_kind(mode));
}

/* Retention after committing step `cur`; see mal_snapshot_write.  Only
 * entries of dfd itself are considered, by name and by what they are
 * (fstatat without following links): a step_* or .tmp-* name that is a
 * link, a FIFO, a device -- or a file where a step directory belongs -- is
 * not Malleus's and is reported and left alone, whatever it points to. */
int snap_retain(int dfd, const char *dir, int64_t cur, int keep_last)
{
    int rc = 0, n = 0, cap = 0;
    snap_stepdir *v = NULL;
    /* a descriptor of its own: readdir moves the position of its file */
    int lfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!d) {
        if (lfd >= 0) close(lfd);
        return MAL_ERR(MAL_EIO, "cannot list %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX];
        struct stat st;
        if (snap_join(path, sizeof path, dir, e->d_name)) continue;
        int is_tmp = strncmp(e->d_name, SNAP_TMP_PREFIX, strlen(SNAP_TMP_PREFIX)) == 0;
        int64_t step = is_tmp ? -1 : snap_parse_step_name(e->d_name);
        if (!is_tmp && step < 0) continue;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISDIR(st.st_mode) && !(is_tmp && S_ISREG(st.st_mode))) {
            snap_report_foreign(dir, e->d_name, st.st_mode);
            continue;
        }
        if (is_tmp) {
            if (snap_tmp_is_stale(dfd, e->d_name)) {
                mal_log(MAL_LOG_DEBUG, "snapshot: removing %s of a dead writer", path);
                int r = snap_rmtree_at(dfd, e->d_name, path);
                if (r && !rc) rc = r;
            }
            continue;
        }
        if (!snap_has_marker_at(dfd, e->d_name)) {
            /* Uncommitted: a crash between rename and COMPLETE.  Older ones
             * can never be completed; a newer one is replaced when that
             * step is written again. */
            if (step < cur) {
                mal_log(MAL_LOG_DEBUG, "snapshot: removing uncommitted %s", path);
                int r = snap_rmtree_at(dfd, e->d_name, path);
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
            int r = snap_remove_step_at(dfd, v[i].name, path);
            if (r && !rc) rc = r;
        }
    }
done:
    closedir(d);
    free(v);
    return rc;
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
                       "or still running); resume from a committed one",
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
    /* non-blocking: a FIFO in its place must not wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
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
