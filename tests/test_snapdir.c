/* Snapshot directories as hostile input (ckpt/snap_fs.c, snap_find.c,
 * snap_dest.c), one process: links planted at the names a writer uses,
 * links and FIFOs where step directories, markers and `latest` belong, a
 * `latest` that lags behind, the destination's lock and probe, and what a
 * snapshot directory owns.  Each case names what it guards; every one
 * failed before the file system side stopped trusting the directory
 * (atomic writes through a planted link, retention through a linked step
 * directory, readers blocked on a FIFO, `latest` followed blindly). */
#include "ckpt/snap_internal.h"
#include "ckpt/snapshot.h"
#include "mal_test.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char base[PATH_MAX];

static void path2(char *out, const char *a, const char *b)
{
    int k = snprintf(out, PATH_MAX, "%s/%s", a, b);
    CHECK(k > 0 && k < PATH_MAX);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

static int file_is(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

static int lexists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A one-tensor snapshot of step `step` into dir (keep_last `keep`). */
static int write_snap(const char *dir, int64_t step, int keep)
{
    float data[16];
    for (int i = 0; i < 16; i++)
        data[i] = (float)(step * 100 + i);
    mal_snap_tensor t = {.name = "param/w", .ndim = 1, .shape = {16}, .extent = {16}, .data = data};
    mal_snap_meta m = {.step = step, .consumed_samples = step * 4, .seed = 1};
    return mal_snapshot_write(dir, &m, &t, 1, keep, NULL, 0);
}

static void check_found(const char *dir, int64_t step, const char *want_name)
{
    char got[PATH_MAX], want[PATH_MAX];
    int64_t found = -2;
    CHECK_OK(mal_snapshot_find(dir, step, got, sizeof got, &found));
    path2(want, dir, want_name);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "found %s (step %lld), expected %s\n", got, (long long)found, want);
        exit(1);
    }
}

/* A FIFO read by mistake blocks forever: the alarm turns that into a
 * failure of this test instead of a hang. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_snapdir: blocked (a FIFO opened for reading?)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

/* The atomic-write helper's temporary names cannot be planted: a link at
 * the name the writer used to take (".tmp-latest.<pid>@<host>", and the
 * same for COMPLETE) is never written through. */
static void test_planted_tmp_links(void)
{
    char d[PATH_MAX], outside[PATH_MAX], p[PATH_MAX], id[SNAP_WRITER_ID_MAX], name[512];
    path2(d, base, "planted");
    path2(outside, base, "outside.txt");
    CHECK(mkdir(d, 0755) == 0);
    write_text(outside, "precious\n");
    snap_writer_id(id, sizeof id);
    snprintf(name, sizeof name, ".tmp-latest.%s", id);
    path2(p, d, name);
    CHECK(symlink(outside, p) == 0);
    /* the step directory's COMPLETE: plant it where the step will be */
    char step[PATH_MAX];
    path2(step, d, "step_00000001");
    CHECK_OK(write_snap(d, 1, 0));
    snprintf(name, sizeof name, ".tmp-COMPLETE.%s", id);
    path2(p, step, name);
    CHECK(symlink(outside, p) == 0);
    CHECK_OK(write_snap(d, 2, 0));
    CHECK(file_is(outside, "precious\n"));
    check_found(d, -1, "step_00000002");

    /* the creation primitive itself: a link at the name is refused */
    int dfd = open(d, O_RDONLY | O_DIRECTORY), fd = -1;
    CHECK(dfd >= 0);
    CHECK(symlink(outside, (path2(p, d, "trap"), p)) == 0);
    CHECK(snap_create_at(dfd, "trap", p, &fd) == MAL_EIO && fd < 0);
    CHECK(file_is(outside, "precious\n"));
    close(dfd);
    printf("planted links at temporary names: never written through\n");
}

/* Retention and debris cleaning never follow a link: a step directory
 * that is a link into another run keeps that run's COMPLETE (and the link
 * itself stays, reported); an old uncommitted "step" that is a link to a
 * directory outside is left alone too. */
static void test_retention_links(void)
{
    char a[PATH_MAX], b[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
    path2(a, base, "runA");
    path2(b, base, "runB");
    CHECK_OK(write_snap(b, 5, 0));
    CHECK_OK(write_snap(b, 6, 0));
    CHECK_OK(write_snap(a, 2, 0));
    path2(p, a, "step_00000001");
    path2(q, b, "step_00000005");
    CHECK(symlink(q, p) == 0);
    char outdir[PATH_MAX];
    path2(outdir, base, "outdir");
    CHECK(mkdir(outdir, 0755) == 0);
    path2(q, outdir, "keepme");
    write_text(q, "x");
    path2(p, a, "step_00000000");
    CHECK(symlink(outdir, p) == 0);
    path2(p, a, ".tmp-step_00000000.1.99999999@elsewhere");
    CHECK(symlink(outdir, p) == 0);
    /* keep 1: everything older than the new snapshot is a candidate */
    CHECK_OK(write_snap(a, 3, 1));
    CHECK_OK(write_snap(a, 4, 1));
    path2(q, b, "step_00000005/COMPLETE");
    CHECK(lexists(q));
    path2(q, b, "step_00000005/index.h5");
    CHECK(lexists(q));
    path2(q, outdir, "keepme");
    CHECK(lexists(q));
    path2(p, a, "step_00000001");
    CHECK(lexists(p)); /* the link itself: not Malleus's to remove */
    path2(p, a, "step_00000002");
    CHECK(!lexists(p)); /* a real old snapshot of this run: removed */
    check_found(b, 5, "step_00000005");
    check_found(b, -1, "step_00000006");

    /* the scan does not count a linked step as this directory's snapshot */
    mal_snap_scan sc;
    CHECK_OK(mal_snapshot_scan(a, -1, &sc));
    CHECK_EQ_INT(sc.n_committed, 1);
    CHECK_EQ_INT(sc.newest, 4);
    CHECK(sc.n_foreign >= 2);
    printf("retention through links: the other run's snapshot and files untouched\n");
}

/* `latest` is a hint: a committed snapshot newer than it (a disk that
 * filled between COMPLETE and the pointer, a manual rollback) is found;
 * an older one is named by its step. */
static void test_latest_lags(void)
{
    char d[PATH_MAX], p[PATH_MAX];
    path2(d, base, "lag");
    CHECK_OK(write_snap(d, 1, 0));
    CHECK_OK(write_snap(d, 2, 0));
    path2(p, d, "latest");
    write_text(p, "step_00000001\n");
    check_found(d, -1, "step_00000002");
    check_found(d, 1, "step_00000001");
    char got[PATH_MAX];
    int rc = mal_snapshot_find(d, 3, got, sizeof got, NULL);
    CHECK(rc == MAL_ENOENT && strstr(mal_errmsg(), "committed: 1 and 2"));
    /* the resolver of the commands that take a snapshot directory too */
    CHECK_OK(mal_snapshot_resolve(d, got, sizeof got));
    CHECK(strstr(got, "step_00000002") != NULL);
    printf("latest lagging: the newest committed snapshot found by listing\n");
}

/* FIFOs, directories and links where small files belong: nothing blocks,
 * every reader answers. */
static void test_fifos(void)
{
    char d[PATH_MAX], p[PATH_MAX], got[PATH_MAX];
    path2(d, base, "fifo");
    CHECK_OK(write_snap(d, 1, 0));
    CHECK_OK(write_snap(d, 2, 0));
    alarm(60);
    /* `latest` a FIFO: ignored (a hint), the newest found */
    path2(p, d, "latest");
    CHECK(unlink(p) == 0 && mkfifo(p, 0644) == 0);
    check_found(d, -1, "step_00000002");
    CHECK_OK(mal_snapshot_resolve(d, got, sizeof got));
    /* COMPLETE a FIFO: that step is not committed, and opening it says so */
    path2(p, d, "step_00000002/COMPLETE");
    CHECK(unlink(p) == 0 && mkfifo(p, 0644) == 0);
    check_found(d, -1, "step_00000001");
    mal_snapshot *s = NULL;
    path2(p, d, "step_00000002");
    int rc = mal_snapshot_open(&s, p);
    CHECK(rc == MAL_EFORMAT && strstr(mal_errmsg(), "FIFO, not a regular file") && !s);
    /* COMPLETE a directory, the index a FIFO */
    path2(p, d, "step_00000002/COMPLETE");
    CHECK(unlink(p) == 0 && mkdir(p, 0755) == 0);
    path2(p, d, "step_00000002");
    CHECK(mal_snapshot_open(&s, p) != 0 && !s);
    path2(p, d, "step_00000001/index.h5");
    CHECK(unlink(p) == 0 && mkfifo(p, 0644) == 0);
    path2(p, d, "step_00000001");
    CHECK(mal_snapshot_open(&s, p) == MAL_ECORRUPT && !s);
    /* a marker naming another step does not commit this one */
    char d2[PATH_MAX], m1[PATH_MAX], m2[PATH_MAX];
    path2(d2, base, "wrongstep");
    CHECK_OK(write_snap(d2, 1, 0));
    CHECK_OK(write_snap(d2, 2, 0));
    path2(m1, d2, "step_00000001/COMPLETE");
    path2(m2, d2, "step_00000002/COMPLETE");
    CHECK(unlink(m2) == 0 && link(m1, m2) == 0);
    check_found(d2, -1, "step_00000001");
    alarm(0);
    printf("FIFOs and directories as latest, COMPLETE, index.h5: refused, nothing blocked\n");
}

/* The destination: lock held once, probe, `latest` a directory, a parent
 * that is a file, a name too long; clear removes only what it should. */
static void test_dest(void)
{
    char d[PATH_MAX], p[PATH_MAX];
    path2(p, base, "dest");
    CHECK(mkdir(p, 0755) == 0);
    path2(d, base, "dest/a/b");
    mal_snap_dest *x = NULL, *y = NULL;
    CHECK_OK(mal_snap_dest_open(&x, d, "test-one"));
    /* flock conflicts between two opens even in one process */
    int rc = mal_snap_dest_open(&y, d, "test-two");
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    CHECK(rc == MAL_EINVAL && strstr(mal_errmsg(), "test-one") && strstr(mal_errmsg(), pid) && !y);
    /* no probe file left behind, only the lock */
    mal_snap_scan sc;
    CHECK_OK(mal_snapshot_scan(d, -1, &sc));
    CHECK_EQ_INT(sc.n_steps + sc.n_foreign, 0);
    mal_snap_dest_close(x, 1); /* created a, b: removed again (undo) */
    path2(p, base, "dest/a");
    CHECK(!lexists(p));
    path2(p, base, "dest");
    CHECK(lexists(p)); /* it existed before: stays */

    /* a parent that is a file */
    char f[PATH_MAX];
    path2(f, base, "plainfile");
    write_text(f, "x");
    path2(p, f, "snap");
    rc = mal_snap_dest_open(&x, p, "t");
    CHECK(rc == MAL_EINVAL && strstr(mal_errmsg(), "Not a directory"));
    /* `latest` a directory */
    path2(d, base, "latestdir");
    path2(p, d, "latest");
    CHECK(mkdir(d, 0755) == 0 && mkdir(p, 0755) == 0);
    rc = mal_snap_dest_open(&x, d, "t");
    CHECK(rc == MAL_EINVAL && strstr(mal_errmsg(), "latest is a directory"));
    /* a name that leaves no room below PATH_MAX */
    char longname[PATH_MAX];
    memset(longname, 'x', PATH_MAX - 100);
    longname[0] = '/';
    longname[PATH_MAX - 100] = '\0';
    rc = mal_snap_dest_open(&x, longname, "t");
    CHECK(rc == MAL_EINVAL && strstr(mal_errmsg(), "limit of"));
    /* the lock file a link: refused, the target untouched */
    char outside[PATH_MAX];
    path2(outside, base, "lock-target.txt");
    write_text(outside, "precious\n");
    path2(d, base, "locklink");
    CHECK(mkdir(d, 0755) == 0);
    path2(p, d, ".lock");
    CHECK(symlink(outside, p) == 0);
    rc = mal_snap_dest_open(&x, d, "t");
    CHECK(rc == MAL_EINVAL && file_is(outside, "precious\n"));

    /* clear: the steps after 2 and the link left alone */
    path2(d, base, "clear");
    for (int s = 1; s <= 4; s++)
        CHECK_OK(write_snap(d, s, 0));
    char target[PATH_MAX];
    path2(target, base, "runB/step_00000006");
    path2(p, d, "step_00000009");
    CHECK(symlink(target, p) == 0);
    CHECK_OK(mal_snap_dest_open(&x, d, "t"));
    int n = 0;
    CHECK_OK(mal_snap_dest_clear(x, 2, &n));
    CHECK_EQ_INT(n, 2);
    path2(p, d, "latest");
    CHECK(file_is(p, "step_00000002\n"));
    check_found(d, -1, "step_00000002");
    path2(p, target, "COMPLETE");
    CHECK(lexists(p));
    CHECK_OK(mal_snap_dest_clear(x, -1, &n));
    CHECK_EQ_INT(n, 2);
    path2(p, d, "latest");
    CHECK(!lexists(p));
    mal_snap_dest_close(x, 0);
    path2(p, d, ".lock");
    CHECK(!lexists(p));
    printf("destination: lock, probe, latest, parent, name length, clear\n");
}

/* What a snapshot directory owns, for commands whose outputs must not be
 * its entries. */
static void test_owns(void)
{
    char d[PATH_MAX], p[PATH_MAX], l[PATH_MAX];
    path2(d, base, "lag");
    path2(p, d, "latest");
    CHECK(mal_snapshot_dir_owns(d, p));
    path2(p, d, "step_00000001/COMPLETE");
    CHECK(mal_snapshot_dir_owns(d, p));
    path2(p, d, "step_00000001/new.txt");
    CHECK(mal_snapshot_dir_owns(d, p));
    path2(p, d, "metrics.jsonl");
    CHECK(!mal_snapshot_dir_owns(d, p));
    path2(p, d, ".tmp-anything");
    CHECK(mal_snapshot_dir_owns(d, p));
    /* through a link to the entry */
    path2(l, base, "link-to-latest");
    path2(p, d, "latest");
    CHECK(symlink(p, l) == 0);
    CHECK(mal_snapshot_dir_owns(d, l));
    path2(p, base, "elsewhere.txt");
    CHECK(!mal_snapshot_dir_owns(d, p));
    printf("owned entries: latest, steps, their files, temporaries, links to them\n");
}

/* The free-space refusal names the flag that keeps fewer snapshots. */
static void test_free_space_message(void)
{
    char d[PATH_MAX];
    path2(d, base, "space");
    mal_snap_meta m = {.step = 1};
    mal_snap_writer *w = NULL;
    CHECK_OK(mal_snap_writer_begin(&w, NULL, d, &m));
    /* 2^50 floats: more than any disk here */
    mal_snap_tensor t = {
        .name = "param/huge", .ndim = 2, .shape = {1 << 25, 1 << 25}, .extent = {1 << 25, 1 << 25}};
    int h = mal_snap_writer_add_shard(w, 0, &t, 1);
    CHECK(h == MAL_EIO && strstr(mal_errmsg(), "not enough free space") &&
          strstr(mal_errmsg(), "--keep"));
    CHECK(mal_snap_writer_finish(w, h, 0, NULL, 0) == MAL_EIO);
    printf("free space: the message names --keep\n");
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    snprintf(base, sizeof base, "/tmp/malleus-snapdir-XXXXXX");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return MAL_TEST_ERROR;
    }
    /* the warnings about foreign entries are expected here */
    mal_log_level = MAL_LOG_ERROR;
    test_planted_tmp_links();
    test_retention_links();
    test_latest_lags();
    test_fifos();
    test_dest();
    test_owns();
    test_free_space_message();
    nftw(base, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    printf("snapshot directory tests passed\n");
    return 0;
}
