/* The destination of a program's snapshots, made ready at start: its name
 * checked against PATH_MAX, the directory created, locked against a
 * second program (flock on dir/.lock) and probed with a file; the old
 * run's snapshots cleared when the user says they may go; and which paths
 * belong to a snapshot directory (for commands that check that an output
 * is not one of their inputs).
 *
 * Why at start: a destination that cannot take a snapshot (a parent that
 * is a file, a read-only file system, a name too long, `latest` a
 * directory) used to be found at the first snapshot -- with snapshots only
 * at the end, after the whole run.  And two jobs writing one directory
 * delete each other's snapshots through retention.
 *
 * The lock file is opened O_NOFOLLOW and must be a regular file; after
 * flock succeeds the descriptor is checked to still be the file at
 * dir/.lock (a holder that just finished removes it), so two programs can
 * never both believe they hold it.
 */
#include "snap_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fileio.h"

struct mal_snap_dest {
    char dir[PATH_MAX];
    int dfd;    /* the directory, for everything below */
    int lockfd; /* dir/.lock, flock'ed; -1: no lock (the file system has none) */
    snap_created made;
};

/* Take the lock of d->dir.  MAL_EINVAL naming the holder when another
 * process has it. */
static int snap_dest_lock(mal_snap_dest *d, const char *who)
{
    char shown[PATH_MAX];
    int rc = snap_join(shown, sizeof shown, d->dir, SNAP_LOCK);
    if (rc) return rc;
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd =
            openat(d->dfd, SNAP_LOCK, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST)
            fd = openat(d->dfd, SNAP_LOCK, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* removed in between: again */
            return MAL_ERR(MAL_EINVAL,
                           "cannot open the lock file %s: %s; remove it if it is not "
                           "a regular file",
                           shown, strerror(errno));
        }
        struct stat st, now;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            return MAL_ERR(MAL_EINVAL, "%s is %s, not a lock file: remove it", shown,
                           mal_file_kind(st.st_mode));
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                char holder[512] = "";
                ssize_t k = pread(fd, holder, sizeof holder - 1, 0);
                holder[k > 0 ? k : 0] = '\0';
                holder[strcspn(holder, "\n")] = '\0';
                close(fd);
                return MAL_ERR(MAL_EINVAL,
                               "snapshot directory %s is in use by another job: %s holds %s; "
                               "wait for it to end (the lock goes with its process), or use "
                               "another directory",
                               d->dir,
                               holder[0] ? holder : "a process that has not written its name yet",
                               shown);
            }
            close(fd);
            /* A file system without locks (some network mounts): the lock
             * is advisory anyway; say so and go on without it. */
            mal_log(MAL_LOG_WARN,
                    "snapshot: cannot lock %s (%s): going on without the lock, so nothing stops a "
                    "second job from writing into %s",
                    shown, strerror(e), d->dir);
            return 0;
        }
        /* the file we locked must still be the one at the name */
        if (fstatat(d->dfd, SNAP_LOCK, &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != st.st_ino ||
            now.st_dev != st.st_dev) {
            close(fd);
            continue;
        }
        char host[256] = "unknown", text[512], when[64] = "";
        if (gethostname(host, sizeof host) != 0) strcpy(host, "unknown");
        host[sizeof host - 1] = '\0';
        time_t t = time(NULL);
        struct tm tm;
        if (localtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        int n = snprintf(text, sizeof text, "%s, pid %ld on host %s (since %s)\n", who,
                         (long)getpid(), host, when);
        /* only for the message of a job refused: a failure here is harmless */
        if (ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)n, 0) != n)
            mal_log(MAL_LOG_DEBUG, "snapshot: could not write %s", shown);
        d->lockfd = fd;
        return 0;
    }
    return MAL_ERR(MAL_EINVAL, "cannot take the lock %s: it keeps being replaced", shown);
}

/* Create, write, fsync and remove a file in the directory: what a snapshot
 * will do, found out now. */
static int snap_dest_probe(mal_snap_dest *d)
{
    char name[NAME_MAX + 1], shown[PATH_MAX];
    int fd = -1, rc = snap_tmp_name(name, sizeof name, "probe");
    if (!rc) rc = snap_join(shown, sizeof shown, d->dir, name);
    if (rc) return rc;
    static const char text[] = "malleus: can snapshots be written here?\n";
    int ok = (fd = openat(d->dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                          0644)) >= 0 &&
             write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1) && fsync(fd) == 0;
    int e = errno;
    if (fd >= 0) {
        if (close(fd) != 0 && ok) ok = 0, e = errno;
        if (unlinkat(d->dfd, name, 0) != 0 && ok) ok = 0, e = errno;
    }
    if (!ok)
        return MAL_ERR(MAL_EINVAL,
                       "snapshots cannot be written into %s (a test file there failed: %s); "
                       "choose a directory on a writable file system with free space",
                       d->dir, strerror(e));
    struct stat st;
    if (fstatat(d->dfd, SNAP_LATEST, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
        return MAL_ERR(MAL_EINVAL,
                       "%s/%s is %s: it must be the regular file that names the newest snapshot "
                       "(every snapshot rewrites it); remove it",
                       d->dir, SNAP_LATEST, mal_file_kind(st.st_mode));
    return 0;
}

int mal_snap_dest_open(mal_snap_dest **out, const char *dir, const char *who)
{
    if (!out || !dir || !who) return MAL_ERR(MAL_EINVAL, "mal_snap_dest_open: NULL argument");
    *out = NULL;
    size_t len = strlen(dir);
    if (len == 0) return MAL_ERR(MAL_EINVAL, "the snapshot directory name is empty");
    if (len + SNAP_MAX_REL_PATH >= PATH_MAX)
        return MAL_ERR(MAL_EINVAL,
                       "snapshot directory name %.80s... is %zu bytes long: the paths of a "
                       "snapshot below it would pass the system's limit of %d; choose a shorter "
                       "path",
                       dir, len, PATH_MAX);
    mal_snap_dest *d = calloc(1, sizeof *d);
    if (!d) return MAL_ERR(MAL_ENOMEM, "out of memory");
    d->dfd = d->lockfd = -1;
    memcpy(d->dir, dir, len + 1);
    int rc = snap_mkdirs(dir, &d->made);
    if (rc) {
        /* a parent that is a file, no permission, a read-only file system:
         * the user's to fix */
        char why[SNAP_MSG];
        snprintf(why, sizeof why, "%s", mal_errmsg());
        rc = MAL_ERR(MAL_EINVAL, "%s; choose another directory", why);
        goto fail;
    }
    if ((d->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = MAL_ERR(MAL_EINVAL, "cannot open snapshot directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    if ((rc = snap_dest_lock(d, who)) || (rc = snap_dest_probe(d))) goto fail;
    *out = d;
    return 0;
fail:
    mal_snap_dest_close(d, 1);
    return rc;
}

int mal_snap_dest_clear(mal_snap_dest *d, int64_t after, int *n_removed)
{
    int rc = 0, n = 0;
    if (n_removed) *n_removed = 0;
    if (!d) return MAL_ERR(MAL_EINVAL, "mal_snap_dest_clear: no destination");
    int lfd = openat(d->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dd = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!dd) {
        if (lfd >= 0) close(lfd);
        return MAL_ERR(MAL_EIO, "cannot list %s: %s", d->dir, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        int64_t step = snap_parse_step_name(e->d_name);
        struct stat st;
        if (step < 0 || step <= after || fstatat(d->dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!S_ISDIR(st.st_mode)) {
            snap_report_foreign(d->dir, e->d_name, st.st_mode);
            continue;
        }
        char shown[PATH_MAX];
        if (snap_join(shown, sizeof shown, d->dir, e->d_name)) continue;
        int r = snap_remove_step_at(d->dfd, e->d_name, shown);
        if (r && !rc) rc = r;
        if (!r) n++;
    }
    closedir(dd);
    if (rc) return rc;
    if (after < 0) {
        struct stat st;
        if (fstatat(d->dfd, SNAP_LATEST, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            unlinkat(d->dfd, SNAP_LATEST, 0) != 0)
            return MAL_ERR(MAL_EIO, "cannot remove %s/%s: %s", d->dir, SNAP_LATEST,
                           strerror(errno));
        rc = snap_fsync_fd(d->dfd, d->dir, 1);
    } else {
        char pointer[80];
        int renamed;
        snprintf(pointer, sizeof pointer, SNAP_STEP_PREFIX "%08lld\n", (long long)after);
        rc = snap_write_atomic(d->dfd, d->dir, SNAP_LATEST, pointer, &renamed);
    }
    if (n_removed) *n_removed = n;
    return rc;
}

void mal_snap_dest_close(mal_snap_dest *d, int undo)
{
    if (!d) return;
    if (d->lockfd >= 0) {
        /* removed while still held: whoever opens the name next makes a
         * new file, and one that opened the old file finds, once it gets
         * the lock, that it is no longer the file at the name */
        unlinkat(d->dfd, SNAP_LOCK, 0);
        close(d->lockfd);
    }
    if (d->dfd >= 0) close(d->dfd);
    if (undo) snap_unmkdirs(d->dir, &d->made);
    free(d);
}

/* The name Malleus gives an entry of a snapshot directory. */
static int snap_managed_name(const char *name)
{
    return !strcmp(name, SNAP_LATEST) || !strcmp(name, SNAP_LOCK) ||
           !strncmp(name, SNAP_TMP_PREFIX, strlen(SNAP_TMP_PREFIX)) ||
           snap_parse_step_name(name) >= 0;
}

static int snap_dir_owns_one(const struct stat *ds, const char *path)
{
    struct stat ps, pps;
    /* split `path` into its directory and its last component */
    char parent[PATH_MAX], name[NAME_MAX + 1];
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    if (len == 0 || len >= sizeof parent) return 0;
    memcpy(parent, path, len);
    parent[len] = '\0';
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : parent;
    if (strlen(base) >= sizeof name) return 0;
    memcpy(name, base, strlen(base) + 1);
    if (!slash)
        strcpy(parent, ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    if (stat(parent, &ps) != 0) return 0;
    /* an entry of dir itself */
    if (ps.st_dev == ds->st_dev && ps.st_ino == ds->st_ino) return snap_managed_name(name);
    /* a file inside one of dir's step or temporary directories */
    char up[PATH_MAX], real[PATH_MAX];
    if (snprintf(up, sizeof up, "%s/..", parent) >= (int)sizeof up || stat(up, &pps) != 0 ||
        pps.st_dev != ds->st_dev || pps.st_ino != ds->st_ino || !realpath(parent, real))
        return 0;
    const char *pbase = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
    return snap_parse_step_name(pbase) >= 0 ||
           !strncmp(pbase, SNAP_TMP_PREFIX, strlen(SNAP_TMP_PREFIX));
}

int mal_snapshot_dir_owns(const char *dir, const char *path)
{
    struct stat ds;
    if (!dir || !path || stat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode)) return 0;
    if (snap_dir_owns_one(&ds, path)) return 1;
    /* an existing link is written through by some outputs: its target too */
    char real[PATH_MAX];
    return realpath(path, real) && strcmp(real, path) != 0 && snap_dir_owns_one(&ds, real);
}
