/* Atomic-or-direct outputs, bounded whole-file reads and read-only
 * mappings (see fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "mal.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

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
    /* A FIFO stays on this descriptor, non-blocking: closing it and opening
     * the FIFO again to wait for a writer lost a writer that came, wrote and
     * left in between (the data goes with the last descriptor), and the
     * second open then waited for a writer that never came (a hang seen in
     * test_fileio under the sanitizers).  The read loop below waits with
     * poll() instead, as `cat fifo` waits in open(). */
    int fifo = S_ISFIFO(st.st_mode), seen_writer = 0;
    if (!fifo) {
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
        if (fifo && (r == 0 ? !seen_writer : r < 0 && errno == EAGAIN)) {
            /* 0 before any writer: none has opened it yet; EAGAIN: one is
             * there but has not written.  Wait for data, or for a writer
             * that came and went (POLLHUP: then the next read says EOF). */
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            while (poll(&pf, 1, -1) < 0 && errno == EINTR)
                ;
            seen_writer = 1;
            continue;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = MAL_ERR(MAL_EIO, "cannot read %s %s: %s", what, path, strerror(errno));
            goto fail;
        }
        if (r == 0) break;
        seen_writer = 1;
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

/* ---- mappings ---------------------------------------------------------- */

int mal_file_map_open(mal_file_map *m, const char *path, const char *what, int advice)
{
    int rc = 0;
    m->data = NULL;
    m->bytes = 0;
    /* Non-blocking for the same reason as mal_file_read: a FIFO is refused
     * below, never waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return MAL_ERR(MAL_ENOENT, "%s %s does not exist: check the path", what, path);
        int user = e == EACCES || e == EPERM || e == ENOTDIR || e == ELOOP || e == ENAMETOOLONG;
        return MAL_ERR(user ? MAL_EINVAL : MAL_EIO, "cannot open %s %s: %s", what, path,
                       strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot stat %s %s: %s", what, path, strerror(errno));
        goto done;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = MAL_ERR(MAL_EINVAL, "%s %s is a directory, not a file", what, path);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = MAL_ERR(MAL_EINVAL,
                     "%s %s is %s, not a regular file: it has no size to check in advance and "
                     "may never end; copy the data into a file first",
                     what, path, mal_file_kind(st.st_mode));
        goto done;
    }
    if ((uintmax_t)st.st_size > SIZE_MAX) {
        rc = MAL_ERR(MAL_EINVAL, "%s %s is too large to map here (%jd bytes)", what, path,
                     (intmax_t)st.st_size);
        goto done;
    }
    m->bytes = (size_t)st.st_size;
    if (m->bytes == 0) goto done; /* mmap refuses length 0; nothing to read anyway */
    void *p = mmap(NULL, m->bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = MAL_ERR(MAL_EIO, "cannot map %s %s (%zu bytes): %s", what, path, m->bytes,
                     strerror(errno));
        m->bytes = 0;
        goto done;
    }
    /* Advice only: a kernel that ignores it reads ahead more, nothing else. */
    (void)madvise(p, m->bytes, advice == MAL_MAP_SEQUENTIAL ? MADV_SEQUENTIAL : MADV_RANDOM);
    m->data = p;
done:
    close(fd); /* the mapping keeps the file */
    return rc;
}

void mal_file_unmap(mal_file_map *m)
{
    if (m->data) munmap((void *)m->data, m->bytes);
    m->data = NULL;
    m->bytes = 0;
}

void mal_file_map_release(const mal_file_map *m, size_t off, size_t len)
{
    if (!m->data || off >= m->bytes) return;
    if (len > m->bytes - off) len = m->bytes - off;
    /* madvise works on whole pages: round the start down (the pages before
     * it were read too, or will be again from the cache). */
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    uintptr_t a = (uintptr_t)(m->data + off) & ~(uintptr_t)(page - 1);
    size_t n = (size_t)((uintptr_t)(m->data + off + len) - a);
    (void)madvise((void *)a, n, MADV_DONTNEED);
}

/* ---- identities --------------------------------------------------------- */

uint64_t mal_fnv1a64(const void *p, size_t n)
{
    return fnv1a(0xcbf29ce484222325ull, p, n);
}

/* The fingerprint of `bytes` bytes read through `get` (which copies n
 * bytes at an offset into buf, returning 0 or a MAL_E* code): the first
 * block, then blocks at evenly spread offsets up to the end. */
static int fingerprint(uint64_t bytes,
                       int (*get)(const void *src, uint64_t off, void *buf, size_t n),
                       const void *src, uint64_t *out)
{
    unsigned char buf[MAL_FILE_ID_BLOCK];
    uint64_t h = fnv1a(0xcbf29ce484222325ull, &bytes, sizeof bytes);
    uint64_t blk = bytes < MAL_FILE_ID_BLOCK ? bytes : MAL_FILE_ID_BLOCK;
    for (int i = 0; i <= MAL_FILE_ID_SAMPLES && blk > 0; i++) {
        uint64_t off = (bytes - blk) / MAL_FILE_ID_SAMPLES * (uint64_t)i;
        int rc = get(src, off, buf, (size_t)blk);
        if (rc) return rc;
        h = fnv1a(h, buf, (size_t)blk);
    }
    *out = h;
    return 0;
}

static int get_memory(const void *src, uint64_t off, void *buf, size_t n)
{
    memcpy(buf, (const unsigned char *)src + off, n);
    return 0;
}

uint64_t mal_fingerprint_memory(const void *p, uint64_t bytes)
{
    uint64_t h = 0;
    fingerprint(bytes, get_memory, p, &h); /* never fails */
    return h;
}

typedef struct {
    int fd;
    const char *path, *what;
} id_file;

static int get_file(const void *src, uint64_t off, void *buf, size_t n)
{
    const id_file *f = src;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(f->fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return MAL_ERR(MAL_EIO, "%s %s: cannot read it again for its identity: %s", f->what,
                           f->path, r < 0 ? strerror(errno) : "it became shorter");
        got += (size_t)r;
    }
    return 0;
}

int mal_file_fingerprint(const char *path, const char *what, uint64_t *bytes, uint64_t *fp)
{
    id_file f = {open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), path, what};
    struct stat st;
    if (f.fd < 0)
        return MAL_ERR(MAL_EIO, "%s %s: cannot open it again for its identity: %s", what, path,
                       strerror(errno));
    int rc = 0;
    if (fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = MAL_ERR(MAL_EIO, "%s %s is no longer a regular file", what, path);
    if (!rc) {
        *bytes = (uint64_t)st.st_size;
        rc = fingerprint(*bytes, get_file, &f, fp);
    }
    close(f.fd);
    return rc;
}
