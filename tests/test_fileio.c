/* fileio.h: outputs are atomic for regular files and direct for devices,
 * FIFOs and sockets (never renamed over); a directory is refused; inputs
 * are read with a bound, and "regular files only" refuses devices and FIFOs
 * without blocking.  Device nodes need mknod (root): those checks are
 * skipped, with a line saying so, where it is not permitted. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fileio.h"
#include "mal_test.h"

static char dir[64];

static const char *at(const char *name)
{
    static char buf[4][128];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

static int same_text(const char *path, const char *text)
{
    unsigned char *b;
    size_t n;
    if (mal_file_read(path, "file", 1 << 20, 0, &b, &n)) return 0;
    int ok = n == strlen(text) && !memcmp(b, text, n);
    free(b);
    return ok;
}

/* Number of directory entries whose name contains ".tmp." */
static int n_temporaries(void)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -c '\\.tmp\\.'", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    CHECK(p && fscanf(p, "%d", &n) == 1);
    pclose(p);
    return n;
}

static void regular_files(void)
{
    /* New file, then replaced; nothing left beside it. */
    CHECK_OK(mal_output_write_file(at("a"), "first", 5));
    CHECK(same_text(at("a"), "first"));
    CHECK_OK(mal_output_write_file(at("a"), "second", 6));
    CHECK(same_text(at("a"), "second"));
    CHECK_EQ_INT(n_temporaries(), 0);

    /* Readers see the old file until the commit. */
    mal_output o;
    CHECK_OK(mal_output_open(&o, at("a")));
    CHECK(!mal_output_is_direct(&o));
    FILE *f = mal_output_stream(&o);
    CHECK(f);
    fprintf(f, "through a stream ");
    CHECK_OK(mal_output_write(&o, "and a write", 11));
    CHECK(same_text(at("a"), "second"));
    CHECK_OK(mal_output_commit(&o));
    CHECK(same_text(at("a"), "through a stream and a write"));

    /* Discarded: the old file stays, the temporary file goes. */
    CHECK_OK(mal_output_open(&o, at("a")));
    CHECK_OK(mal_output_write(&o, "lost", 4));
    mal_output_discard(&o);
    CHECK(same_text(at("a"), "through a stream and a write"));
    CHECK_EQ_INT(n_temporaries(), 0);

    /* A directory target is refused; a missing directory is ENOENT. */
    CHECK(mkdir(at("d"), 0755) == 0);
    CHECK_EQ_INT(mal_output_write_file(at("d"), "x", 1), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "directory"));
    struct stat st;
    CHECK(stat(at("d"), &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(mal_output_write_file(at("nodir/x"), "x", 1), MAL_ENOENT);
    printf("ok: regular files atomic, directory refused\n");
}

static void device(void)
{
    if (mknod(at("null"), S_IFCHR | 0666, makedev(1, 3)) != 0) {
        printf("skipped: device node checks (mknod: %s)\n", strerror(errno));
        return;
    }
    mal_output o;
    CHECK_OK(mal_output_open(&o, at("null")));
    CHECK(mal_output_is_direct(&o));
    CHECK_OK(mal_output_write(&o, "into the device", 15));
    CHECK_OK(mal_output_commit(&o));
    CHECK_OK(mal_output_write_file(at("null"), "again", 5));
    struct stat st;
    CHECK(stat(at("null"), &st) == 0 && S_ISCHR(st.st_mode));
    CHECK_EQ_INT(n_temporaries(), 0);

    /* A symbolic link to the device writes through the link. */
    CHECK(symlink(at("null"), at("link")) == 0);
    CHECK_OK(mal_output_write_file(at("link"), "via link", 8));
    CHECK(lstat(at("link"), &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(stat(at("null"), &st) == 0 && S_ISCHR(st.st_mode));

    /* Reading a device: bounded, or refused when regular files only. */
    unsigned char *b;
    size_t n;
    CHECK_EQ_INT(mal_file_read(at("null"), "input", 100, MAL_READ_REGULAR, &b, &n), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "character device"));
    CHECK(b == NULL);
    CHECK_OK(mal_file_read(at("null"), "input", 100, 0, &b, &n));
    CHECK(n == 0 && b[0] == '\0');
    free(b);
    printf("ok: device written directly, never replaced\n");
}

static void endless_input(void)
{
    /* /dev/zero never ends: the bound stops it, with a message. */
    unsigned char *b;
    size_t n;
    CHECK_EQ_INT(mal_file_read("/dev/zero", "input", 1 << 20, 0, &b, &n), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "1048576 bytes"));
    CHECK_EQ_INT(mal_file_read("/dev/zero", "token file", 1 << 20, MAL_READ_REGULAR, &b, &n),
                 MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "not a regular file"));
    /* A regular file over the bound, at the bound, and a directory. */
    put(at("big"), "0123456789");
    CHECK_EQ_INT(mal_file_read(at("big"), "input", 9, 0, &b, &n), MAL_EINVAL);
    CHECK_OK(mal_file_read(at("big"), "input", 10, MAL_READ_REGULAR, &b, &n));
    CHECK(n == 10 && b[10] == '\0' && !memcmp(b, "0123456789", 10));
    free(b);
    CHECK_EQ_INT(mal_file_read(dir, "input", 10, 0, &b, &n), MAL_EINVAL);
    CHECK_EQ_INT(mal_file_read(at("missing"), "input", 10, 0, &b, &n), MAL_ENOENT);
    printf("ok: bounded reads\n");
}

static void fifo(void)
{
    CHECK(mkfifo(at("fifo"), 0600) == 0);
    /* Regular files only: refused at once, though nobody writes to it. */
    unsigned char *b;
    size_t n;
    CHECK_EQ_INT(mal_file_read(at("fifo"), "token file", 100, MAL_READ_REGULAR, &b, &n),
                 MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "FIFO"));

    /* Output into the FIFO arrives at its reader; the FIFO stays. */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(30);
        _exit(mal_output_write_file(at("fifo"), "through the fifo", 16) ? 1 : 0);
    }
    CHECK_OK(mal_file_read(at("fifo"), "input", 100, 0, &b, &n));
    CHECK(n == 16 && !memcmp(b, "through the fifo", 16));
    free(b);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* A writer that came, wrote and left before the reader opened the FIFO
     * (another reader kept its data there): read at once, not a wait for a
     * writer that never comes.  The reader once closed its first descriptor
     * and opened the FIFO again, which hung here -- and, when the writer
     * slipped in between the two, lost its data and hung the same way. */
    int keep = open(at("fifo"), O_RDONLY | O_NONBLOCK);
    CHECK(keep >= 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        alarm(30);
        _exit(mal_output_write_file(at("fifo"), "left early", 10) ? 1 : 0);
    }
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    alarm(20); /* a hang ends the test (SIGALRM) instead of the suite */
    CHECK_OK(mal_file_read(at("fifo"), "input", 100, 0, &b, &n));
    alarm(0);
    CHECK(n == 10 && !memcmp(b, "left early", 10));
    free(b);
    close(keep);

    struct stat st;
    CHECK(stat(at("fifo"), &st) == 0 && S_ISFIFO(st.st_mode));
    printf("ok: FIFO written through, never replaced\n");
}

static void unix_socket(void)
{
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(ls >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", at("sock"));
    CHECK(bind(ls, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(ls, 1) == 0);
    /* A small message fits the socket buffer before it is accepted. */
    CHECK_OK(mal_output_write_file(at("sock"), "to the socket", 13));
    int c = accept(ls, NULL, NULL);
    CHECK(c >= 0);
    char got[32];
    ssize_t r = read(c, got, sizeof got);
    CHECK(r == 13 && !memcmp(got, "to the socket", 13));
    close(c);
    close(ls);
    struct stat st;
    CHECK(stat(at("sock"), &st) == 0 && S_ISSOCK(st.st_mode));
    printf("ok: socket written through, never replaced\n");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof dir, "/tmp/malleus-test-fileio-XXXXXX");
    CHECK(mkdtemp(dir));
    regular_files();
    device();
    endless_input();
    fifo();
    unix_socket();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    printf("PASS\n");
    return 0;
}
