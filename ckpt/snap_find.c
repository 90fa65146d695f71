/* Finding snapshots in a snapshot directory: what it holds (committed,
 * marked, foreign entries), the newest committed snapshot -- found by
 * looking, not by trusting `latest`, which is only a hint -- a snapshot of
 * a given step, and what a path given on the command line names (a
 * snapshot directory or a step directory).
 *
 * `latest` can lag behind (a disk that filled between COMPLETE and the
 * pointer) or be moved by hand; a resume that followed it blindly would
 * then write steps that are already committed and fail after training.
 * So the directory is listed: a step_N entry that is a directory (never a
 * link: another run's snapshot linked in is not this run's) holding a
 * COMPLETE marker that parses, for step N, is committed.  Every small file
 * is read through snap_read_small_at (non-blocking, regular files only,
 * bounded), so a FIFO or a device in the directory cannot wedge the
 * reader.
 */
#include "snap_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether step directory dfd/name is committed: a directory (not a link)
 * with a COMPLETE marker that parses and names step `step`.  *marked: it
 * holds a COMPLETE entry at all (a damaged marker, or a newer format's,
 * still marks a snapshot that no writer may replace). */
static int snap_is_committed(int dfd, const char *dir, const char *name, int64_t step, int *marked)
{
    char shown[PATH_MAX], *text = NULL;
    int sfd;
    *marked = 0;
    if (snap_join(shown, sizeof shown, dir, name) || snap_open_dir_at(dfd, name, shown, &sfd)) {
        mal_clearerr();
        return 0;
    }
    struct stat st;
    *marked = fstatat(sfd, SNAP_COMPLETE, &st, AT_SYMLINK_NOFOLLOW) == 0;
    char mshown[PATH_MAX];
    mal_snap_marker mk;
    int ok = *marked && !snap_join(mshown, sizeof mshown, shown, SNAP_COMPLETE) &&
             !snap_read_small_at(sfd, SNAP_COMPLETE, mshown, &text) &&
             !mal_snapshot_parse_marker(text, strlen(text), mshown, &mk) && mk.step == step;
    if (!ok) mal_clearerr();
    free(text);
    close(sfd);
    return ok;
}

/* Keep the newest MAL_SNAP_SCAN_LIST steps, descending. */
static void snap_scan_list(mal_snap_scan *sc, int64_t step)
{
    int n = sc->n_listed, i = n;
    while (i > 0 && sc->listed[i - 1] < step)
        i--;
    if (i >= MAL_SNAP_SCAN_LIST) return;
    if (n == MAL_SNAP_SCAN_LIST) n--;
    memmove(sc->listed + i + 1, sc->listed + i, sizeof *sc->listed * (size_t)(n - i));
    sc->listed[i] = step;
    sc->n_listed = n + 1;
}

int mal_snapshot_scan(const char *dir, int64_t after, mal_snap_scan *sc)
{
    if (!dir || !sc) return MAL_ERR(MAL_EINVAL, "mal_snapshot_scan: NULL argument");
    memset(sc, 0, sizeof *sc);
    sc->newest = sc->newest_marked = sc->newest_after = sc->latest = -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        if (errno == ENOENT) return MAL_ENOENT;
        return MAL_ERR(errno == ENOTDIR ? MAL_EINVAL : MAL_EIO,
                       "cannot open snapshot directory %s: %s", dir, strerror(errno));
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return MAL_ERR(MAL_EIO, "cannot list %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (!strcmp(e->d_name, SNAP_LATEST)) {
            char shown[PATH_MAX], *text = NULL;
            if (snap_join(shown, sizeof shown, dir, SNAP_LATEST) ||
                snap_read_small_at(dfd, SNAP_LATEST, shown, &text)) {
                mal_clearerr();
                continue;
            }
            size_t k = strlen(text);
            while (k > 0 && (text[k - 1] == '\n' || text[k - 1] == '\r' || text[k - 1] == ' '))
                k--;
            text[k] = '\0';
            sc->latest = snap_parse_step_name(text);
            free(text);
            continue;
        }
        int is_tmp = !strncmp(e->d_name, SNAP_TMP_PREFIX, strlen(SNAP_TMP_PREFIX));
        /* no step name the writer makes is that long ("step_" and digits) */
        int64_t step = is_tmp || strlen(e->d_name) >= sizeof sc->newest_name
                           ? -1
                           : snap_parse_step_name(e->d_name);
        if ((!is_tmp && step < 0) || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!S_ISDIR(st.st_mode) && !(is_tmp && S_ISREG(st.st_mode))) {
            snap_report_foreign(dir, e->d_name, st.st_mode);
            sc->n_foreign++;
            if (step > after && sc->n_foreign_after++ == 0)
                snprintf(sc->foreign_after_name, sizeof sc->foreign_after_name, "%.63s", e->d_name);
            continue;
        }
        if (is_tmp) continue;
        sc->n_steps++;
        int marked;
        if (snap_is_committed(dfd, dir, e->d_name, step, &marked)) {
            sc->n_committed++;
            if (step > sc->newest) {
                sc->newest = step;
                snprintf(sc->newest_name, sizeof sc->newest_name, "%.63s", e->d_name);
            }
            snap_scan_list(sc, step);
        }
        if (!marked) continue;
        sc->n_marked++;
        if (step > sc->newest_marked) sc->newest_marked = step;
        if (step > after) {
            sc->n_after++;
            if (step > sc->newest_after) {
                sc->newest_after = step;
                snprintf(sc->newest_after_name, sizeof sc->newest_after_name, "%.63s", e->d_name);
            }
        }
    }
    closedir(d);
    return 0;
}

/* "10, 20 and 30" (the newest listed ones, oldest first). */
static void snap_fmt_steps(char *out, size_t len, const mal_snap_scan *sc)
{
    size_t k = 0;
    out[0] = '\0';
    for (int i = sc->n_listed - 1; i >= 0 && k < len; i--)
        k += (size_t)snprintf(out + k, len - k, "%s%lld",
                              i == sc->n_listed - 1 ? ""
                              : i                   ? ", "
                                                    : " and ",
                              (long long)sc->listed[i]);
    if (sc->n_committed > sc->n_listed && k < len)
        snprintf(out + k, len - k, " (the newest %d of %d)", sc->n_listed, sc->n_committed);
}

int mal_snapshot_find(const char *dir, int64_t step, char *path, size_t len, int64_t *found)
{
    if (!dir || !path)
        return MAL_ERR(MAL_EINVAL, "mal_snapshot_find: dir and path must not be NULL");
    mal_snap_scan sc;
    int rc = mal_snapshot_scan(dir, -1, &sc);
    if (rc == MAL_ENOENT)
        return MAL_ERR(MAL_ENOENT,
                       "snapshot directory %s does not exist: no snapshot to resume from", dir);
    if (rc) return rc;
    char name[64];
    if (step < 0) {
        if (sc.newest < 0) {
            if (sc.n_marked > 0) {
                /* the marker's own message says what is wrong with it */
                char sd[PATH_MAX];
                snprintf(name, sizeof name, SNAP_STEP_PREFIX "%08lld", (long long)sc.newest_marked);
                mal_snap_marker mk;
                if (!snap_join(sd, sizeof sd, dir, name) && (rc = snap_read_marker(sd, &mk)))
                    return MAL_ERR(rc, "no committed snapshot in %s that this build can read: %s",
                                   dir, mal_errmsg());
            }
            if (sc.n_steps > 0)
                return MAL_ERR(MAL_ENOENT,
                               "no committed snapshot in %s: its %d step director%s no %s "
                               "marker (never committed: the writer crashed or is still running)",
                               dir, sc.n_steps, sc.n_steps == 1 ? "y has" : "ies have",
                               SNAP_COMPLETE);
            return MAL_ERR(MAL_ENOENT, "no committed snapshot in %s", dir);
        }
        if (sc.latest >= 0 && sc.latest != sc.newest)
            mal_log(MAL_LOG_WARN,
                    "snapshot: %s/%s names step %lld, but the newest committed snapshot is %s: "
                    "using it (`latest` is a hint; to go back to an older one, name its step: "
                    "malleus-train --resume-from STEP)",
                    dir, SNAP_LATEST, (long long)sc.latest, sc.newest_name);
        snprintf(name, sizeof name, "%s", sc.newest_name);
        step = sc.newest;
    } else {
        /* the name the writer gives it; a hand-made "step_10" is found too */
        snprintf(name, sizeof name, SNAP_STEP_PREFIX "%08lld", (long long)step);
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), marked = 0, ok = 0;
        if (dfd >= 0) {
            ok = snap_is_committed(dfd, dir, name, step, &marked);
            if (!ok && !marked) {
                snprintf(name, sizeof name, SNAP_STEP_PREFIX "%lld", (long long)step);
                ok = snap_is_committed(dfd, dir, name, step, &marked);
            }
            close(dfd);
        }
        if (!ok) {
            char have[256];
            snap_fmt_steps(have, sizeof have, &sc);
            return MAL_ERR(marked ? MAL_ECORRUPT : MAL_ENOENT,
                           "%s holds no committed snapshot of step %lld%s (committed: %s)", dir,
                           (long long)step,
                           marked ? " (its COMPLETE marker is unreadable or names another step)"
                                  : "",
                           sc.n_committed ? have : "none");
        }
    }
    char p[PATH_MAX];
    if ((rc = snap_join(p, sizeof p, dir, name))) return rc;
    if (strlen(p) >= len)
        return MAL_ERR(MAL_EINVAL, "snapshot path %s does not fit the caller's %zu-byte buffer", p,
                       len);
    strcpy(path, p);
    if (found) *found = step;
    return 0;
}

int mal_snapshot_find_latest(const char *dir, char *path, size_t len)
{
    return mal_snapshot_find(dir, -1, path, len, NULL);
}

int mal_snapshot_resolve(const char *path, char *out, size_t len)
{
    char p[PATH_MAX];
    struct stat st;
    int rc;
    if (!path || !out) return MAL_ERR(MAL_EINVAL, "mal_snapshot_resolve: NULL argument");
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return MAL_ERR(MAL_ENOENT, "snapshot %s does not exist (or is not a directory)", path);
    /* a step directory has (or had) its marker and index; a snapshot
     * directory has step directories or `latest` */
    if ((rc = snap_join(p, sizeof p, path, SNAP_COMPLETE))) return rc;
    if (!snap_exists(p)) {
        mal_snap_scan sc;
        if ((rc = mal_snapshot_scan(path, -1, &sc))) return rc;
        if (sc.n_steps > 0 || sc.latest >= 0 ||
            (!snap_join(p, sizeof p, path, SNAP_LATEST) && snap_exists(p)))
            return mal_snapshot_find_latest(path, out, len);
        char q[PATH_MAX];
        if ((rc = snap_join(q, sizeof q, path, SNAP_INDEX_FILE))) return rc;
        if (snap_exists(q))
            return MAL_ERR(MAL_ECORRUPT,
                           "%s has no %s marker: the snapshot was never committed (writer "
                           "crashed or still running); use a committed one",
                           path, SNAP_COMPLETE);
        return MAL_ERR(MAL_ENOENT,
                       "%s is neither a snapshot directory (no step directories, no '%s') nor a "
                       "step directory (no %s)",
                       path, SNAP_LATEST, SNAP_COMPLETE);
    }
    if (strlen(path) >= len)
        return MAL_ERR(MAL_EINVAL, "snapshot path %s does not fit the caller's %zu-byte buffer",
                       path, len);
    strcpy(out, path);
    return 0;
}
