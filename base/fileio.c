/* Atomic-or-direct outputs and bounded whole-file reads (see fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "mal.h"

const char *mal_file_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG:
        return "a regular file";
    case S_IFDIR:
        return "a directory";
    case S_IFCHR:
        return "a character device";
    case S_IFBLK:
        return "a block device";
    case S_IFIFO:
        return "a FIFO";
    case S_IFSOCK:
        return "a socket";
    case S_IFLNK:
        return "a symbolic link";
    default:
        return "a special file";
    }
}

int mal_fsync_parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return MAL_ERR(MAL_ENOMEM, "out of memory syncing the directory of %s", path);
    int rc = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        rc =
            MAL_ERR(MAL_EIO, "cannot open directory %s to sync %s: %s", dir, path, strerror(errno));
    } else {
        if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
            rc = MAL_ERR(MAL_EIO, "cannot sync directory %s after writing %s: %s", dir, path,
                         strerror(errno));
        close(fd);
    }
    free(dir);
    return rc;
}

/* ---- outputs ---------------------------------------------------------- */

/* Open an existing non-regular target for writing as it is.  A Unix socket
 * cannot be open()ed: connect to it as a stream socket instead. */
static int open_direct(const char *path, const struct stat *st)
{
    if (!S_ISSOCK(st->st_mode)) return open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int mal_output_open(mal_output *o, const char *path)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    if (!(o->path = strdup(path))) return MAL_ERR(MAL_ENOMEM, "out of memory writing %s", path);

    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) {
            mal_output_discard(o);
            return MAL_ERR(MAL_EINVAL, "cannot write %s: it is a directory; name a file", path);
        }
        /* Never rename over a device, FIFO or socket: write into it. */
        if ((o->fd = open_direct(path, &st)) < 0) {
            int rc = MAL_ERR(MAL_EIO, "cannot open %s (%s) for writing: %s", path,
                             mal_file_kind(st.st_mode), strerror(errno));
            mal_output_discard(o);
            return rc;
        }
        return 0;
    }

    /* A regular file or a new name: a temporary file beside it, unique per
     * process and attempt; O_EXCL makes a collision fail instead of
     * clobbering.  (Not mkstemp: it forces mode 0600, and the output should
     * get the usual 0666 & ~umask.) */
    size_t tlen = strlen(path) + 64;
    if (!(o->tmp = malloc(tlen))) {
        mal_output_discard(o);
        return MAL_ERR(MAL_ENOMEM, "out of memory writing %s", path);
    }
    for (int attempt = 0; attempt < 100 && o->fd < 0; attempt++) {
        snprintf(o->tmp, tlen, "%s.tmp.%ld.%d.%llx", path, (long)getpid(), attempt,
                 (unsigned long long)(mal_now() * 1e9));
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (o->fd < 0 && errno != EEXIST) break;
    }
    if (o->fd < 0) {
        int e = errno;
        int rc =
            MAL_ERR(e == ENOENT || e == ENOTDIR ? MAL_ENOENT : MAL_EIO,
                    "cannot create %s (via a temporary file beside it): %s%s", path, strerror(e),
                    e == ENOENT || e == ENOTDIR ? "; create its directory first" : "");
        free(o->tmp); /* nothing was created: nothing to unlink */
        o->tmp = NULL;
        mal_output_discard(o);
        return rc;
    }
    return 0;
}

int mal_output_check_inputs(const char *out_what, const char *out, const mal_input_ref *in, int n)
{
    struct stat so, si;
    if (!out || stat(out, &so) != 0 || !S_ISREG(so.st_mode)) return 0;
    for (int i = 0; i < n; i++)
        if (in[i].path && stat(in[i].path, &si) == 0 && si.st_dev == so.st_dev &&
            si.st_ino == so.st_ino)
            return MAL_ERR(MAL_EINVAL,
                           "%s %s is the same file as %s %s%s: writing it would destroy that "
                           "input; name another output file",
                           out_what, out, in[i].what, in[i].path,
                           strcmp(out, in[i].path) ? " (a link, or another name of it)" : "");
    return 0;
}

int mal_output_is_direct(const mal_output *o)
{
    return o->tmp == NULL;
}

FILE *mal_output_stream(mal_output *o)
{
    if (o->stream) return o->stream;
    int fd = dup(o->fd);
    if (fd < 0 || !(o->stream = fdopen(fd, "w"))) {
        MAL_ERR(MAL_EIO, "cannot make a stream for %s: %s", o->path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    return o->stream;
}

int mal_output_write(mal_output *o, const void *buf, size_t len)
{
    /* Bytes already buffered in the stream must go first. */
    if (o->stream && fflush(o->stream) != 0)
        return MAL_ERR(MAL_EIO, "cannot write %s: %s", o->path, strerror(errno));
    const unsigned char *p = buf;
    while (len > 0) {
        ssize_t w = write(o->fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return MAL_ERR(MAL_EIO, "cannot write %s: %s", o->path, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsync, tolerating targets that cannot be synced (devices, pipes,
 * sockets: EINVAL, ENOTSUP, EROFS). */
static int sync_fd(const mal_output *o)
{
    if (fsync(o->fd) == 0) return 0;
    if (!o->tmp && (errno == EINVAL || errno == ENOTSUP || errno == EROFS)) return 0;
    return MAL_ERR(MAL_EIO, "cannot sync %s: %s", o->tmp ? o->tmp : o->path, strerror(errno));
}

int mal_output_commit(mal_output *o)
{
    int rc = 0;
    if (o->stream) {
        /* fclose flushes; the stream owns a dup of fd, so fd stays open. */
        int bad = ferror(o->stream);
        if (fclose(o->stream) != 0 || bad)
            rc = MAL_ERR(MAL_EIO, "cannot write %s: %s", o->path,
                         bad ? "a write failed" : strerror(errno));
        o->stream = NULL;
    }
    if (!rc) rc = sync_fd(o);
    int fd = o->fd;
    o->fd = -1;
    if (close(fd) != 0 && !rc)
        rc = MAL_ERR(MAL_EIO, "cannot write %s: %s", o->path, strerror(errno));
    if (!rc && o->tmp) {
        /* rename() is atomic: readers see the old file or the new one. */
        if (rename(o->tmp, o->path) != 0) {
            rc = MAL_ERR(MAL_EIO, "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
        } else {
            free(o->tmp);
            o->tmp = NULL; /* committed: nothing to remove */
            rc = mal_fsync_parent_dir(o->path);
        }
    }
    mal_output_discard(o);
    return rc;
}

void mal_output_discard(mal_output *o)
{
    if (o->stream) fclose(o->stream);
    if (o->fd >= 0) close(o->fd);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
    o->fd = -1;
}

int mal_output_write_file(const char *path, const void *buf, size_t len)
{
    mal_output o;
    int rc = mal_output_open(&o, path);
    if (rc) return rc;
    if ((rc = mal_output_write(&o, buf, len))) {
        mal_output_discard(&o);
        return rc;
    }
    return mal_output_commit(&o);
}

/* ---- inputs ----------------------------------------------------------- */

int mal_file_read(const char *path, const char *what, size_t max_bytes, int flags,
                  unsigned char **buf, size_t *len)
{
    int rc = 0;
    unsigned char *data = NULL;
    *buf = NULL;
    *len = 0;
    if (max_bytes > SIZE_MAX / 4) max_bytes = SIZE_MAX / 4; /* no overflow below */
    /* Non-blocking, so that opening a FIFO nobody writes to cannot hang
     * before its kind is checked; blocking reads are restored below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return MAL_ERR(MAL_ENOENT, "%s %s does not exist: check the path", what, path);
        /* a path the user can fix is bad input, not a failure of the run */
        int user = e == EACCES || e == EPERM || e == ENOTDIR || e == ELOOP || e == ENAMETOOLONG;
        return MAL_ERR(user ? MAL_EINVAL : MAL_EIO, "cannot open %s %s: %s", what, path,
                       strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot stat %s %s: %s", what, path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = MAL_ERR(MAL_EINVAL, "%s %s is a directory, not a file", what, path);
        goto fail;
    }
    if ((flags & MAL_READ_REGULAR) && !S_ISREG(st.st_mode)) {
        rc = MAL_ERR(MAL_EINVAL,
                     "%s %s is %s, not a regular file: it has no size to check in advance and "
                     "may never end; copy the data into a file first",
                     what, path, mal_file_kind(st.st_mode));
        goto fail;
    }
    if (S_ISFIFO(st.st_mode)) {
        /* A FIFO opened without waiting reads as empty until a writer
         * comes: open it again, waiting for one, as `cat fifo` does. */
        close(fd);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)) < 0)
            return MAL_ERR(MAL_EIO, "cannot open %s %s: %s", what, path, strerror(errno));
    } else {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
            rc = MAL_ERR(MAL_EIO, "cannot read %s %s: %s", what, path, strerror(errno));
            goto fail;
        }
    }
    if (S_ISREG(st.st_mode) && (uintmax_t)st.st_size > max_bytes) {
        rc = MAL_ERR(MAL_EINVAL, "%s %s is %jd bytes; at most %zu are accepted here", what, path,
                     (intmax_t)st.st_size, max_bytes);
        goto fail;
    }
    /* Regular files are read in one allocation of their size (+1 for the
     * terminator, and to see whether the file grew); anything else grows
     * the buffer as data arrives, up to the bound. */
    size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 65536;
    if (cap > max_bytes + 1) cap = max_bytes + 1;
    size_t n = 0;
    if (!(data = malloc(cap + 1))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s %s (%zu bytes)", what, path, cap);
        goto fail;
    }
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) {
                rc = MAL_ERR(MAL_EINVAL, "%s %s holds more than the %zu bytes accepted here%s",
                             what, path, max_bytes,
                             S_ISREG(st.st_mode) ? " (it grew while being read)"
                                                 : " (a device or pipe that does not end?)");
                goto fail;
            }
            size_t ncap = cap > max_bytes / 2 ? max_bytes + 1 : 2 * cap;
            unsigned char *p = realloc(data, ncap + 1);
            if (!p) {
                rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s %s (%zu bytes)", what, path,
                             ncap);
                goto fail;
            }
            data = p;
            cap = ncap;
        }
        ssize_t r = read(fd, data + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = MAL_ERR(MAL_EIO, "cannot read %s %s: %s", what, path, strerror(errno));
            goto fail;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    data[n] = '\0';
    *buf = data;
    *len = n;
    return 0;

fail:
    free(data);
    close(fd);
    return rc;
}
