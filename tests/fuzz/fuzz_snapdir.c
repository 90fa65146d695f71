/* libFuzzer harness: snapshot directories as hostile input (ckpt/: the
 * scan and the finding of the newest committed snapshot, the resolver of
 * command-line snapshot paths, the reader's open and a read of every
 * tensor, retention and debris cleaning, the destination's lock, probe
 * and clear).
 *
 * Structure-aware: the fuzz bytes describe a directory tree -- which
 * entries exist where, with which name and of which kind: regular files
 * with given bytes, directories, links (to a file or a directory outside
 * the tree, to a sibling, dangling), FIFOs, sparse files up to 2^40
 * bytes, valid COMPLETE markers, and copies of a real committed step
 * directory written once at start-up -- and the harness builds it in a
 * scratch directory, runs every operation on it, and checks:
 *   - nothing outside the tree changed: the files and the committed
 *     snapshot that the links point to ("outside") are compared with
 *     their state at start-up after every input (retention and clear must
 *     never follow a link, and never remove what is not theirs);
 *   - no operation blocks: a FIFO anywhere is opened non-blocking or not
 *     at all (a hang is a finding: libFuzzer's -timeout; the replay in
 *     make check runs under `timeout`);
 *   - what the finders return is a real directory (not a link) inside the
 *     tree, and the scan's counts are consistent.
 *
 * Input: records, until the bytes run out.  A record is
 *   parent (byte): the index, mod the number made so far, of a directory
 *          made by an earlier record (0: the snapshot directory itself)
 *   name   (byte, mod 16): latest, COMPLETE, index.h5, shard_00000.h5,
 *          step_00000001, step_00000002, step_00000003, step_00000010,
 *          .tmp-step_00000004.0123456789abcdef.1@host (a dead writer's),
 *          .tmp-latest.00.999999999@elsewhere, .lock, step_x, step_,
 *          notes.txt, step_99999999999999999999, step_00000002 again
 *   kind   (byte, mod 11): 0 regular file (a length byte, that many bytes),
 *          1 directory, 2 link to the outside file, 3 link to the outside
 *          snapshot directory, 4 link to its committed step directory,
 *          5 link to a sibling name (maybe dangling), 6 FIFO, 7 sparse
 *          file of 2^(20 + byte % 21) bytes, 8 a COMPLETE marker for step
 *          (byte % 12), 9 a copy of the real step directory, 10 an empty
 *          file; kind 5 takes a byte (the sibling's name, mod 16)
 * Then one byte: the step `after` / `cur` for the operations (mod 12),
 * and one: keep_last (mod 4).  An entry whose name exists already is
 * skipped. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mal.h"
#include "ckpt/snap_internal.h"
#include "ckpt/snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[16] = {"latest",
                                      "COMPLETE",
                                      "index.h5",
                                      "shard_00000.h5",
                                      "step_00000001",
                                      "step_00000002",
                                      "step_00000003",
                                      "step_00000010",
                                      ".tmp-step_00000004.0123456789abcdef.1@host",
                                      ".tmp-latest.00.999999999@elsewhere",
                                      ".lock",
                                      "step_x",
                                      "step_",
                                      "notes.txt",
                                      "step_99999999999999999999",
                                      "step_00000002"};

enum { MAX_DIRS = 64 };

static char root[256];         /* per process: scratch, outside, template */
static char outside[300];      /* what links point to: must never change */
static char out_file[400], out_snap[400], out_step[500];
static char tmpl[PATH_MAX]; /* a real committed step directory, copied in */
static char *outside_state; /* the listing of `outside` at start-up */

typedef struct {
    const uint8_t *p, *end;
} reader;

static unsigned get_byte(reader *r)
{
    return r->p < r->end ? *r->p++ : 0;
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

static void rmtree(const char *path)
{
    nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* Names, kinds, sizes and the bytes of every regular file below `dir`
 * (links not followed), as one string: the state that must not change. */
static char *state;
static size_t state_len, state_cap;
static void state_add(const char *s, size_t n)
{
    if (state_len + n + 1 > state_cap) {
        state_cap = (state_len + n + 1) * 2;
        state = realloc(state, state_cap);
        if (!state) abort();
    }
    memcpy(state + state_len, s, n);
    state_len += n;
    state[state_len] = '\0';
}
static int state_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)flag, (void)ftw;
    char line[PATH_MAX + 64];
    int k = snprintf(line, sizeof line, "%s %o %lld\n", path, (unsigned)st->st_mode,
                     (long long)st->st_size);
    state_add(line, (size_t)k);
    if (S_ISREG(st->st_mode) && st->st_size < (1 << 20)) {
        FILE *f = fopen(path, "rb");
        char buf[4096];
        size_t n;
        while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
            state_add(buf, n);
        if (f) fclose(f);
    }
    return 0;
}
static char *snapshot_state(const char *dir)
{
    state = NULL;
    state_len = state_cap = 0;
    state_add("", 0);
    nftw(dir, state_cb, 16, FTW_PHYS);
    return state;
}

/* A creation that fails (a full scratch disk) just builds less. */
static void try(long rc)
{
    (void)rc;
}

static void write_file(const char *path, const void *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return;
    if (n) try(write(fd, buf, n));
    close(fd);
}

static int copy_cb_base_len;
static char copy_dst[PATH_MAX];
static int copy_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    char to[PATH_MAX];
    if (snprintf(to, sizeof to, "%s%s", copy_dst, path + copy_cb_base_len) >= (int)sizeof to)
        return 0;
    if (flag == FTW_D) return mkdir(to, 0755) != 0 && errno != EEXIST;
    if (!S_ISREG(st->st_mode)) return 0;
    FILE *a = fopen(path, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    while (a && b && (n = fread(buf, 1, sizeof buf, a)) > 0)
        fwrite(buf, 1, n, b);
    if (a) fclose(a);
    if (b) fclose(b);
    return 0;
}
static void copy_tree(const char *from, const char *to)
{
    copy_cb_base_len = (int)strlen(from);
    snprintf(copy_dst, sizeof copy_dst, "%s", to);
    nftw(from, copy_cb, 16, FTW_PHYS);
}

static int write_snap(const char *dir, int64_t step)
{
    float a[24], b[6];
    for (int i = 0; i < 24; i++)
        a[i] = (float)i;
    for (int i = 0; i < 6; i++)
        b[i] = (float)-i;
    mal_snap_tensor t[2] = {
        {.name = "param/a", .ndim = 2, .shape = {4, 6}, .extent = {4, 6}, .data = a},
        {.name = "param/b", .ndim = 1, .shape = {6}, .extent = {6}, .data = b},
    };
    mal_snap_meta m = {.step = step, .consumed_samples = step, .seed = 1};
    return mal_snapshot_write(dir, &m, t, 2, 0, NULL, 0);
}

static void cleanup(void)
{
    rmtree(root);
}

static void setup(void)
{
    mal_log_level = -1; /* the foreign-entry warnings are the point here */
    /* on tmpfs where there is one: the operations fsync, which a disk
     * makes milliseconds each */
    struct stat st;
    snprintf(root, sizeof root, "%s/malleus-fuzz-snapdir-XXXXXX",
             stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0
                 ? "/dev/shm"
                 : "/tmp");
    if (!mkdtemp(root)) abort();
    snprintf(outside, sizeof outside, "%s/outside", root);
    snprintf(out_file, sizeof out_file, "%s/precious.txt", outside);
    snprintf(out_snap, sizeof out_snap, "%s/snap", outside);
    snprintf(out_step, sizeof out_step, "%s/step_00000005", out_snap);
    snprintf(tmpl, sizeof tmpl, "%s/template/step_00000002", root);
    char t[PATH_MAX];
    snprintf(t, sizeof t, "%s/template", root);
    if (mkdir(outside, 0755) != 0 || write_snap(out_snap, 5) != 0 || write_snap(t, 2) != 0) abort();
    write_file(out_file, "precious\n", 9);
    outside_state = snapshot_state(outside);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    reader r = {data, data + size};
    char dir[PATH_MAX], dirs[MAX_DIRS][PATH_MAX];
    snprintf(dir, sizeof dir, "%s/snap", root);
    rmtree(dir);
    if (mkdir(dir, 0755) != 0) abort();
    int n_dirs = 1;
    snprintf(dirs[0], sizeof dirs[0], "%s", dir);
    /* build the tree; the last two bytes are the operations' numbers */
    while (r.end - r.p > 2) {
        const char *parent = dirs[get_byte(&r) % (unsigned)n_dirs];
        const char *name = names[get_byte(&r) % 16];
        unsigned kind = get_byte(&r) % 11;
        char p[PATH_MAX], sib[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", parent, name) >= (int)sizeof p) continue;
        struct stat st;
        if (lstat(p, &st) == 0) {
            if (kind == 0 || kind == 5 || kind == 7 || kind == 8) get_byte(&r);
            continue;
        }
        switch (kind) {
        case 0: {
            unsigned n = get_byte(&r);
            if (n > (unsigned)(r.end - r.p)) n = (unsigned)(r.end - r.p);
            write_file(p, r.p, n);
            r.p += n;
            break;
        }
        case 1:
            if (mkdir(p, 0755) == 0 && n_dirs < MAX_DIRS)
                snprintf(dirs[n_dirs++], PATH_MAX, "%s", p);
            break;
        /* a failed creation (a full scratch disk) just builds less */
        case 2:
            try(symlink(out_file, p));
            break;
        case 3:
            try(symlink(out_snap, p));
            break;
        case 4:
            try(symlink(out_step, p));
            break;
        case 5:
            snprintf(sib, sizeof sib, "%s", names[get_byte(&r) % 16]);
            try(symlink(sib, p));
            break;
        case 6:
            try(mkfifo(p, 0644));
            break;
        case 7: {
            int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
            unsigned e = get_byte(&r) % 21;
            if (fd >= 0) {
                try(ftruncate(fd, (off_t)1 << (20 + e)));
                close(fd);
            }
            break;
        }
        case 8: {
            char text[256];
            int k = snprintf(text, sizeof text,
                             "{\"format\": \"malleus-snapshot\", \"format_version\": 2, "
                             "\"step\": %u, \"n_tensors\": 2, \"n_blocks\": 2, \"n_shards\": 1, "
                             "\"index_bytes\": 100, \"index_crc32c\": 1}\n",
                             get_byte(&r) % 12);
            write_file(p, text, (size_t)k);
            break;
        }
        case 9:
            copy_tree(tmpl, p);
            if (n_dirs < MAX_DIRS) snprintf(dirs[n_dirs++], PATH_MAX, "%s", p);
            break;
        default:
            write_file(p, "", 0);
            break;
        }
    }
    int64_t num = (int64_t)(get_byte(&r) % 12);
    int keep = (int)(get_byte(&r) % 4);

    /* readers */
    mal_snap_scan sc;
    if (mal_snapshot_scan(dir, num, &sc) == 0 &&
        (sc.n_committed > sc.n_steps || sc.n_committed > sc.n_marked || sc.n_marked > sc.n_steps ||
         sc.n_after > sc.n_marked || (sc.n_committed > 0) != (sc.newest >= 0)))
        abort();
    char found[PATH_MAX];
    for (int i = 0; i < 2; i++) {
        int64_t step = -1;
        if (mal_snapshot_find(dir, i ? num : -1, found, sizeof found, &step) == 0) {
            struct stat st;
            if (lstat(found, &st) != 0 || !S_ISDIR(st.st_mode) ||
                strncmp(found, dir, strlen(dir)) != 0 || step < 0)
                abort();
        }
    }
    if (mal_snapshot_resolve(dir, found, sizeof found) == 0) {
        mal_snapshot *s = NULL;
        if (mal_snapshot_open(&s, found) == 0) {
            float buf[24];
            mal_snapshot_read(s, "param/a", 2, (const int64_t[]){4, 6}, buf, 24);
            mal_snapshot_read(s, "param/b", 1, (const int64_t[]){6}, buf, 24);
            mal_snapshot_close(s);
        }
    }
    for (int i = 1; i < n_dirs; i++) {
        mal_snapshot *s = NULL;
        if (mal_snapshot_open(&s, dirs[i]) == 0) mal_snapshot_close(s);
    }
    char probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/latest", dir);
    mal_snapshot_dir_owns(dir, probe);
    /* writers' clean-up */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        snap_retain(dfd, dir, num, keep);
        close(dfd);
    }
    mal_snap_dest *d = NULL;
    if (mal_snap_dest_open(&d, dir, "fuzz") == 0) {
        mal_snap_dest_clear(d, keep == 3 ? -1 : num, NULL);
        mal_snap_dest_close(d, 0);
    }
    mal_clearerr();

    /* nothing outside the tree changed */
    char *now = snapshot_state(outside);
    if (strcmp(now, outside_state) != 0) {
        fprintf(stderr, "fuzz_snapdir: the outside tree changed\n");
        abort();
    }
    free(now);
    return 0;
}
