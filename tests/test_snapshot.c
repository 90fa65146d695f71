/* Tests for ckpt/snapshot in one process: CRC-32C (both implementations
 * against a bitwise reference), bit-exact round trip of tensors and meta,
 * blocks that tile tensors across several shard files read back through
 * arbitrary blocks (against a naive reference), the writer's refusals
 * (overlap, gaps, shape disagreement, incomplete blocks, duplicate shards),
 * the latest pointer, retention, crash debris, corruption and version
 * checks, argument errors, injected failures of every I/O step, a failure
 * inside HDF5 (file size limit) and the same round trip after the
 * communication layer (MPI) was started.
 * The multi-process writer is tested by tests/test_snapshot_mpi.c.
 *
 * `test_snapshot --write-demo DIR` only writes a known snapshot into DIR for
 * tests/test_snapshot_h5py.sh, which reads it with h5py and h5dump. */
#include "base/rng.h"
#include "ckpt/snapshot.h"
#include "mal_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char base[PATH_MAX];

/* ------------------------------------------------------------ helpers */

static void path2(char *out, const char *a, const char *b)
{
    int k = snprintf(out, PATH_MAX, "%s/%s", a, b);
    CHECK(k > 0 && k < PATH_MAX);
}

static int rm_cb(const char *p, const struct stat *st, int fl, struct FTW *f)
{
    (void)st, (void)fl, (void)f;
    return remove(p);
}

static void rmtree(const char *p)
{
    nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* number of entries of `dir` whose name starts with `prefix` */
static int count_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

/* copy the first `n` bytes of `src` to `dst` (a partially written file) */
static void copy_prefix(const char *src, const char *dst, long n)
{
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    CHECK(a && b);
    for (long i = 0; i < n; i++) {
        int c = fgetc(a);
        if (c == EOF) break;
        fputc(c, b);
    }
    fclose(a);
    CHECK(fclose(b) == 0);
}

static void check_latest(const char *dir, const char *stepname)
{
    char got[PATH_MAX], want[PATH_MAX];
    CHECK_OK(mal_snapshot_find_latest(dir, got, sizeof got));
    path2(want, dir, stepname);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "latest is %s, expected %s\n", got, want);
        exit(1);
    }
}

#define CHECK_ERR(call, code, needle)                                                              \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ != (code) || !strstr(mal_errmsg(), (needle))) {                                     \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d with \"%s\" in: %s\n",        \
                    __FILE__, __LINE__, #call, e_, mal_strerror(e_), (code), (needle),             \
                    mal_errmsg());                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A tensor set: names, shapes and random bit patterns (NaN payloads,
 * denormals and infinities included, so only a bit-exact path passes). */
typedef struct {
    mal_snap_tensor t[8];
    int n;
} tset;

static void tset_add(tset *s, const char *name, int ndim, const int64_t *shape, uint64_t salt)
{
    mal_snap_tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->ndim = ndim;
    size_t count = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = t->extent[d] = shape[d];
        count *= (size_t)shape[d];
    }
    t->data = malloc(count * sizeof(float));
    CHECK(t->data != NULL);
    for (size_t i = 0; i < count; i++) {
        uint32_t bits = (uint32_t)mal_rng_u64(salt, 7, i);
        memcpy(&t->data[i], &bits, 4);
    }
}

static void tset_std(tset *s, uint64_t salt)
{
    s->n = 0;
    tset_add(s, "param/tok_emb", 1, (int64_t[]){37}, salt + 1);
    tset_add(s, "param/layers.0.wq", 2, (int64_t[]){6, 5}, salt + 2);
    tset_add(s, "adam_m/layers.0.wq", 3, (int64_t[]){2, 3, 4}, salt + 3);
    tset_add(s, "adam_v/x/deep", 4, (int64_t[]){2, 1, 3, 5}, salt + 4);
    /* hand-picked bit patterns on top of the random ones */
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu,
                                       0x7f800000u, 0xff800000u, 0x7fc00123u, 0x7f800001u};
    memcpy(s->t[0].data, special, sizeof special);
}

static void tset_free(tset *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->t[i].data);
    s->n = 0;
}

static size_t tcount(const mal_snap_tensor *t)
{
    size_t c = 1;
    for (int d = 0; d < t->ndim; d++)
        c *= (size_t)t->shape[d];
    return c;
}

static mal_snap_meta meta_std(int64_t step)
{
    mal_snap_meta m = {
        .step = step,
        .consumed_samples = 1000 * step + 17,
        .seed = 0xFEEDFACECAFEBEEFull, /* above INT64_MAX: must stay unsigned */
        .rng_counter = (1ull << 63) + 5,
        .config_json = "{\"d_model\": 64, \"name\": \"tiny \xc3\xa9\"}",
        .train_json = "",
        .plan_json = NULL,
    };
    return m;
}

static void check_str_eq(const char *a, const char *b)
{
    if ((a == NULL) != (b == NULL) || (a && strcmp(a, b) != 0)) {
        fprintf(stderr, "string mismatch: \"%s\" vs \"%s\"\n", a ? a : "(null)", b ? b : "(null)");
        exit(1);
    }
}

/* open `step_dir` and compare everything in it with `m` and `s` */
static void check_snapshot(const char *step_dir, const mal_snap_meta *m, const tset *s)
{
    mal_snapshot *snap = NULL;
    CHECK_OK(mal_snapshot_open(&snap, step_dir));
    const mal_snap_meta *g = mal_snapshot_meta(snap);
    CHECK_EQ_INT(g->step, m->step);
    CHECK_EQ_INT(g->consumed_samples, m->consumed_samples);
    CHECK(g->seed == m->seed);
    CHECK(g->rng_counter == m->rng_counter);
    check_str_eq(g->config_json, m->config_json);
    check_str_eq(g->train_json, m->train_json);
    check_str_eq(g->plan_json, m->plan_json);
    CHECK_EQ_INT(mal_snapshot_n_tensors(snap), s->n);
    for (int i = 0; i < mal_snapshot_n_tensors(snap); i++) {
        mal_snap_tensor info;
        CHECK_OK(mal_snapshot_tensor_info(snap, i, &info));
        if (i > 0) {
            mal_snap_tensor prev;
            CHECK_OK(mal_snapshot_tensor_info(snap, i - 1, &prev));
            CHECK(strcmp(prev.name, info.name) < 0);
        }
        int found = 0;
        for (int k = 0; k < s->n; k++)
            if (strcmp(s->t[k].name, info.name) == 0) {
                found = 1;
                CHECK_EQ_INT(info.ndim, s->t[k].ndim);
                for (int d = 0; d < info.ndim; d++) {
                    CHECK_EQ_INT(info.shape[d], s->t[k].shape[d]);
                    CHECK_EQ_INT(info.offset[d], 0);
                    CHECK_EQ_INT(info.extent[d], s->t[k].shape[d]);
                }
            }
        CHECK(found);
    }
    for (int k = 0; k < s->n; k++) {
        const mal_snap_tensor *t = &s->t[k];
        size_t c = tcount(t);
        float *buf = malloc((c + 3) * sizeof(float)); /* a larger buffer is fine */
        CHECK(buf != NULL);
        memset(buf, 0xAB, (c + 3) * sizeof(float));
        CHECK_OK(mal_snapshot_read(snap, t->name, t->ndim, t->shape, buf, c + 3));
        if (memcmp(buf, t->data, c * sizeof(float)) != 0) {
            fprintf(stderr, "tensor %s differs after the round trip\n", t->name);
            exit(1);
        }
        free(buf);
    }
    mal_snapshot_close(snap);
}

static void write_ok(const char *dir, int64_t step, const tset *s, int keep, const char *plan)
{
    mal_snap_meta m = meta_std(step);
    m.plan_json = (char *)plan;
    char out[PATH_MAX], want[PATH_MAX], name[64];
    CHECK_OK(mal_snapshot_write(dir, &m, s->t, s->n, keep, out, sizeof out));
    snprintf(name, sizeof name, "step_%08lld", (long long)step);
    path2(want, dir, name);
    CHECK(strcmp(out, want) == 0);
}

/* ------------------------------------------------------------ tests */

/* CRC-32C bit by bit, straight from the definition (reflected 0x82F63B78):
 * independent of the table and hardware paths. */
static uint32_t crc_bitwise(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (crc & 1 ? 0x82F63B78u : 0);
    }
    return ~crc;
}

/* mal_crc32c against the bitwise definition: the standard check value,
 * every length 0..300 at every alignment 0..15, a large buffer, and
 * incremental updates equal to one call. */
static void test_crc(const char *which)
{
    CHECK(mal_crc32c(0, "123456789", 9) == 0xE3069283u);
    enum { N = 1 << 20 };
    unsigned char *buf = malloc(N + 64);
    CHECK(buf != NULL);
    for (size_t i = 0; i < N + 64; i++)
        buf[i] = (unsigned char)mal_rng_u64(77, 1, i);
    for (size_t off = 0; off < 16; off++)
        for (size_t len = 0; len <= 300; len++)
            CHECK(mal_crc32c(0, buf + off, len) == crc_bitwise(0, buf + off, len));
    uint32_t whole = mal_crc32c(0, buf + 3, N);
    CHECK(whole == crc_bitwise(0, buf + 3, N));
    uint32_t inc = 0;
    for (size_t pos = 0; pos < N;) {
        size_t k = MAL_MIN((size_t)N - pos, 1 + (size_t)(mal_rng_u64(5, 5, pos) % 70000));
        inc = mal_crc32c(inc, buf + 3 + pos, k);
        pos += k;
    }
    CHECK(inc == whole);
    free(buf);
    printf("crc32c (%s): check value 0xE3069283 and bitwise reference agree\n", which);
}

/* Both CRC implementations: a child forced to the software path, then
 * this process with whatever the CPU offers.  Runs before anything else
 * computes a checksum (the choice is made at the first call). */
static void test_crc_both(void)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        setenv("MALLEUS_CRC32C_SOFTWARE", "1", 1);
        test_crc("slicing-by-8");
        fflush(NULL);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    test_crc("default");
}

/* The reference answer for a block: copied element by element from the
 * whole tensor. */
static void extract(const float *full, const mal_snap_tensor *b, float *out)
{
    int64_t idx[MAL_SNAP_MAXDIM] = {0}, n = 1;
    for (int d = 0; d < b->ndim; d++)
        n *= b->extent[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t lin = 0;
        for (int d = 0; d < b->ndim; d++)
            lin = lin * b->shape[d] + b->offset[d] + idx[d];
        out[i] = full[lin];
        for (int d = b->ndim - 1; d >= 0; d--) {
            if (++idx[d] < b->extent[d]) break;
            idx[d] = 0;
        }
    }
}

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM];
    float *full;
} ttensor;

static mal_snap_tensor blk(const ttensor *t, int64_t o0, int64_t o1, int64_t o2, int64_t e0,
                           int64_t e1, int64_t e2)
{
    mal_snap_tensor b = {t->name, t->ndim, {0}, {o0, o1, o2}, {e0, e1, e2}, NULL};
    memcpy(b.shape, t->shape, sizeof b.shape);
    return b;
}

/* Put block b of tensor t through the writer in pieces of varying size. */
static void put_block(mal_snap_writer *w, int h, int k, const ttensor *t, const mal_snap_tensor *b)
{
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++)
        n *= b->extent[d];
    float *v = malloc((size_t)n * sizeof(float));
    CHECK(v != NULL);
    extract(t->full, b, v);
    for (int64_t pos = 0; pos < n;) {
        int64_t m =
            MAL_MIN(n - pos, 1 + (int64_t)(mal_rng_u64(9, (uint64_t)k, (uint64_t)pos) % 300000));
        CHECK_OK(mal_snap_writer_put(w, h, k, v + pos, (size_t)m));
        pos += m;
    }
    free(v);
}

/* Tensors tiled by irregular blocks over three shard files (one larger
 * than the reader's chunk, slabs and non-slab tilings, 1-D to 3-D),
 * written in interleaved pieces; whole tensors and random blocks read
 * back bit for bit; then every way the writer must refuse a tiling. */
static void test_blocks(void)
{
    char d[PATH_MAX], sd[PATH_MAX];
    path2(d, base, "blocks");
    ttensor T[3] = {{"param/a", 2, {1100, 2048}, NULL},
                    {"adam_m/b", 3, {5, 6, 7}, NULL},
                    {"param/c", 1, {100}, NULL}};
    for (int i = 0; i < 3; i++) {
        int64_t n = 1;
        for (int k = 0; k < T[i].ndim; k++)
            n *= T[i].shape[k];
        T[i].full = malloc((size_t)n * sizeof(float));
        CHECK(T[i].full != NULL);
        for (int64_t k = 0; k < n; k++) {
            uint32_t bits = (uint32_t)mal_rng_u64(31, (uint64_t)i, (uint64_t)k);
            memcpy(&T[i].full[k], &bits, 4);
        }
    }
    /* shard 0: a's top slab, c's tail, b's first 2 blocks; shard 7: a's
     * lower left, b's rest; shard 3: a's lower right and c's head */
    mal_snap_tensor s0[] = {blk(&T[0], 0, 0, 0, 300, 2048, 1), blk(&T[2], 10, 0, 0, 90, 1, 1),
                            blk(&T[1], 0, 0, 0, 5, 2, 7), blk(&T[1], 0, 2, 0, 3, 4, 7)};
    mal_snap_tensor s7[] = {blk(&T[0], 300, 0, 0, 800, 1000, 1), blk(&T[1], 3, 2, 0, 2, 4, 4),
                            blk(&T[1], 3, 2, 4, 2, 4, 3)};
    mal_snap_tensor s3[] = {blk(&T[0], 300, 1000, 0, 800, 1048, 1), blk(&T[2], 0, 0, 0, 10, 1, 1)};
    const int tof0[] = {0, 2, 1, 1}, tof7[] = {0, 1, 1}, tof3[] = {0, 2};
    mal_snap_meta m = meta_std(21);
    mal_snap_writer *w;
    CHECK_OK(mal_snap_writer_begin(&w, NULL, d, &m));
    int h0 = mal_snap_writer_add_shard(w, 0, s0, 4), h7 = mal_snap_writer_add_shard(w, 7, s7, 3),
        h3 = mal_snap_writer_add_shard(w, 3, s3, 2);
    CHECK(h0 >= 0 && h7 >= 0 && h3 >= 0);
    CHECK_ERR(mal_snap_writer_add_shard(w, 7, s7, 1), MAL_EINVAL, "declared twice");
    /* interleaved: blocks of different shards in turn */
    put_block(w, h7, 1, &T[tof7[1]], &s7[1]);
    for (int k = 0; k < 4; k++)
        put_block(w, h0, k, &T[tof0[k]], &s0[k]);
    for (int k = 0; k < 2; k++)
        put_block(w, h3, k, &T[tof3[k]], &s3[k]);
    put_block(w, h7, 0, &T[tof7[0]], &s7[0]);
    put_block(w, h7, 2, &T[tof7[2]], &s7[2]);
    float one = 0;
    CHECK_ERR(mal_snap_writer_put(w, h7, 2, &one, 1), MAL_EINVAL, "more floats");
    char out[PATH_MAX];
    CHECK_OK(mal_snap_writer_finish(w, 0, 0, out, sizeof out));
    path2(sd, d, "step_00000021");
    CHECK(strcmp(out, sd) == 0);

    mal_snapshot *snap;
    CHECK_OK(mal_snapshot_open(&snap, sd));
    CHECK_EQ_INT(mal_snapshot_n_tensors(snap), 3);
    /* sorted names: adam_m/b, param/a, param/c */
    CHECK_EQ_INT(mal_snapshot_n_blocks(snap, 0), 4);
    CHECK_EQ_INT(mal_snapshot_n_blocks(snap, 1), 3);
    CHECK_EQ_INT(mal_snapshot_n_blocks(snap, 2), 2);
    mal_snap_tensor bi;
    const char *file;
    CHECK_OK(mal_snapshot_block_info(snap, 2, 0, &bi, &file));
    CHECK(bi.offset[0] == 0 && bi.extent[0] == 10 && strcmp(file, "shard_00003.h5") == 0);
    float *buf = malloc(1100 * 2048 * sizeof(float)), *ref = malloc(1100 * 2048 * sizeof(float));
    CHECK(buf && ref);
    for (int i = 0; i < 3; i++) {
        int64_t n = 1;
        for (int k = 0; k < T[i].ndim; k++)
            n *= T[i].shape[k];
        CHECK_OK(mal_snapshot_read(snap, T[i].name, T[i].ndim, T[i].shape, buf, (size_t)n));
        CHECK(memcmp(buf, T[i].full, (size_t)n * sizeof(float)) == 0);
        for (int r = 0; r < 40; r++) {
            mal_snap_tensor want = {T[i].name, T[i].ndim, {0}, {0}, {0}, buf};
            for (int k = 0; k < T[i].ndim; k++) {
                uint64_t x = mal_rng_u64(1000 + (uint64_t)i, (uint64_t)r, (uint64_t)k);
                want.shape[k] = T[i].shape[k];
                want.offset[k] = (int64_t)(x % (uint64_t)T[i].shape[k]);
                want.extent[k] =
                    1 + (int64_t)((x >> 20) % (uint64_t)(T[i].shape[k] - want.offset[k]));
            }
            int64_t c = 1;
            for (int k = 0; k < T[i].ndim; k++)
                c *= want.extent[k];
            CHECK_OK(mal_snapshot_read_block(snap, &want));
            extract(T[i].full, &want, ref);
            if (memcmp(buf, ref, (size_t)c * sizeof(float)) != 0) {
                fprintf(stderr, "block %d of %s differs\n", r, T[i].name);
                exit(1);
            }
        }
    }
    CHECK(mal_snapshot_bytes_read(snap) >= 1100 * 2048 * 4);
    mal_snapshot_close(snap);

    /* Refusals: each leaves `latest` on step 21 and nothing behind. */
    struct {
        const char *why;
        mal_snap_tensor blk[2];
        int n, code;
    } bad[] = {
        {"overlap",
         {{"x/o", 1, {10}, {0}, {6}, NULL}, {"x/o", 1, {10}, {5}, {5}, NULL}},
         2,
         MAL_EINVAL},
        {"cover 9 of 10",
         {{"x/g", 1, {10}, {0}, {4}, NULL}, {"x/g", 1, {10}, {5}, {5}, NULL}},
         2,
         MAL_EINVAL},
        {"disagree",
         {{"x/s", 1, {10}, {0}, {5}, NULL}, {"x/s", 1, {11}, {5}, {6}, NULL}},
         2,
         MAL_EINVAL},
        {"overlap",
         {{"x/q", 2, {4, 4}, {0, 0}, {3, 3}, NULL}, {"x/q", 2, {4, 4}, {2, 2}, {2, 2}, NULL}},
         2,
         MAL_EINVAL},
        {"lies inside",
         {{"x/t", 1, {4}, {0}, {4}, NULL}, {"x/t/u", 1, {4}, {0}, {4}, NULL}},
         2,
         MAL_EINVAL},
    };
    float junk[16] = {0};
    for (size_t c = 0; c < MAL_ARRAY_SIZE(bad); c++) {
        mal_snap_meta mb = meta_std(22);
        CHECK_OK(mal_snap_writer_begin(&w, NULL, d, &mb));
        /* one block per shard, as if two processes wrote them */
        for (int k = 0; k < bad[c].n; k++) {
            int h = mal_snap_writer_add_shard(w, 10 + k, &bad[c].blk[k], 1);
            CHECK(h >= 0);
            int64_t n = 1;
            for (int e = 0; e < bad[c].blk[k].ndim; e++)
                n *= bad[c].blk[k].extent[e];
            CHECK_OK(mal_snap_writer_put(w, h, 0, junk, (size_t)n));
        }
        CHECK_ERR(mal_snap_writer_finish(w, 0, 0, NULL, 0), bad[c].code, bad[c].why);
        check_latest(d, "step_00000021");
        CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);
        CHECK_EQ_INT(count_prefix(d, "step_"), 1);
    }
    /* a block left incomplete, a reserved name, a failure reported by the
     * caller */
    mal_snap_meta mb = meta_std(22);
    mal_snap_tensor one_blk = {"x/i", 1, {10}, {0}, {10}, NULL};
    CHECK_OK(mal_snap_writer_begin(&w, NULL, d, &mb));
    int h = mal_snap_writer_add_shard(w, 0, &one_blk, 1);
    CHECK(h >= 0);
    CHECK_OK(mal_snap_writer_put(w, h, 0, junk, 9));
    CHECK_ERR(mal_snap_writer_finish(w, 0, 0, NULL, 0), MAL_EINVAL, "got 9 of its 10 floats");
    CHECK_OK(mal_snap_writer_begin(&w, NULL, d, &mb));
    mal_snap_tensor reserved = {"_malleus/x", 1, {10}, {0}, {10}, NULL};
    CHECK_ERR(mal_snap_writer_add_shard(w, 0, &reserved, 1), MAL_EINVAL, "reserved");
    CHECK_ERR(mal_snap_writer_finish(w, MAL_ERR(MAL_EIO, "caller says no"), 0, NULL, 0), MAL_EIO,
              "caller says no");
    check_latest(d, "step_00000021");
    CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);
    CHECK_EQ_INT(count_prefix(d, "step_"), 1);
    for (int i = 0; i < 3; i++)
        free(T[i].full);
    free(buf);
    free(ref);
}

static void test_missing(void)
{
    char d[PATH_MAX], p[PATH_MAX], buf[PATH_MAX];
    path2(d, base, "nothing-here");
    CHECK_ERR(mal_snapshot_find_latest(d, buf, sizeof buf), MAL_ENOENT, "does not exist");
    path2(p, d, "step_00000001");
    mal_snapshot *s = (mal_snapshot *)&s; /* must be reset to NULL */
    CHECK_ERR(mal_snapshot_open(&s, p), MAL_ENOENT, "does not exist");
    CHECK(s == NULL);
    CHECK(mkdir(d, 0755) == 0);
    CHECK_ERR(mal_snapshot_find_latest(d, buf, sizeof buf), MAL_ENOENT, "no committed snapshot");
}

static void test_roundtrip_latest_retention(void)
{
    char d[PATH_MAX], p[PATH_MAX], text[64];
    tset s;
    tset_std(&s, 100);
    path2(d, base, "rt/nested"); /* parents are created too */

    mal_snap_meta m7 = meta_std(7);
    write_ok(d, 7, &s, 0, NULL);
    check_latest(d, "step_00000007");
    path2(p, d, "latest");
    FILE *f = fopen(p, "r");
    CHECK(f && fgets(text, sizeof text, f));
    fclose(f);
    CHECK(strcmp(text, "step_00000007\n") == 0);
    CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);
    path2(p, d, "step_00000007/COMPLETE");
    CHECK(exists(p));
    path2(p, d, "step_00000007");
    check_snapshot(p, &m7, &s);

    /* second snapshot: latest moves, the first stays readable */
    tset s8;
    tset_std(&s8, 800);
    mal_snap_meta m8 = meta_std(8);
    m8.plan_json = "{\"pipelines\": [[0, 1]]}";
    m8.config_json = NULL;
    CHECK_OK(mal_snapshot_write(d, &m8, s8.t, s8.n, 0, NULL, 0));
    check_latest(d, "step_00000008");
    path2(p, d, "step_00000008");
    check_snapshot(p, &m8, &s8);
    path2(p, d, "step_00000007");
    check_snapshot(p, &m7, &s);

    /* retention: keep the newest 3 */
    for (int step = 9; step <= 13; step++)
        write_ok(d, step, &s, 3, NULL);
    CHECK_EQ_INT(count_prefix(d, "step_"), 3);
    for (int step = 7; step <= 13; step++) {
        char name[64];
        snprintf(name, sizeof name, "step_%08d", step);
        path2(p, d, name);
        CHECK_EQ_INT(exists(p), step >= 11);
    }
    check_latest(d, "step_00000013");

    /* retention on the first snapshot of a directory: nothing older to
     * sort or remove (under UBSan this once passed NULL to qsort) */
    char first[PATH_MAX];
    path2(first, base, "first_keep");
    write_ok(first, 5, &s, 2, NULL);
    CHECK_EQ_INT(count_prefix(first, "step_"), 1);
    check_latest(first, "step_00000005");

    /* going back (a rollback run): the snapshot just written is always kept
     * and counts as one of keep_last, whatever its step number; `latest`
     * names it, but it is only a hint: the newest committed snapshot is
     * found by listing, and the older one by its step */
    write_ok(d, 10, &s, 2, NULL);
    path2(p, d, "latest");
    f = fopen(p, "r");
    CHECK(f && fgets(text, sizeof text, f));
    fclose(f);
    CHECK(strcmp(text, "step_00000010\n") == 0);
    check_latest(d, "step_00000013");
    {
        char got[PATH_MAX], want[PATH_MAX];
        int64_t found = -1;
        CHECK_OK(mal_snapshot_find(d, 10, got, sizeof got, &found));
        path2(want, d, "step_00000010");
        CHECK(strcmp(got, want) == 0 && found == 10);
        CHECK_ERR(mal_snapshot_find(d, 11, got, sizeof got, NULL), MAL_ENOENT,
                  "no committed snapshot of step 11 (committed: 10 and 13)");
    }
    CHECK_EQ_INT(count_prefix(d, "step_"), 2);
    path2(p, d, "step_00000013");
    CHECK(exists(p));
    path2(p, d, "step_00000010");
    mal_snap_meta m10 = meta_std(10);
    check_snapshot(p, &m10, &s);

    /* a committed step is never overwritten; nothing changes */
    mal_snap_meta m13 = meta_std(13);
    CHECK_ERR(mal_snapshot_write(d, &m13, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "already exists");
    check_latest(d, "step_00000013");
    CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);

    /* out_path too small: refused before anything is written */
    char tiny[8];
    mal_snap_meta m20 = meta_std(20);
    CHECK_ERR(mal_snapshot_write(d, &m20, s.t, s.n, 0, tiny, sizeof tiny), MAL_EINVAL,
              "does not fit");
    CHECK_EQ_INT(count_prefix(d, "step_"), 2);

    tset_free(&s);
    tset_free(&s8);
}

static pid_t dead_pid(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(0);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    return pid;
}

static void test_crash_debris(void)
{
    char d[PATH_MAX], p[PATH_MAX], q[PATH_MAX], buf[PATH_MAX], name[256];
    tset s;
    tset_std(&s, 300);
    path2(d, base, "crash");
    mal_snap_meta m1 = meta_std(1);
    write_ok(d, 1, &s, 0, NULL);

    /* A writer that died while writing step 2: partial shard file in its
     * temporary directory.  Plus a live writer's, and two of other hosts. */
    char dead_tmp[PATH_MAX], live_tmp[PATH_MAX], far_old[PATH_MAX], far_new[PATH_MAX];
    snprintf(name, sizeof name, ".tmp-step_00000002.%ld", (long)dead_pid());
    path2(dead_tmp, d, name);
    CHECK(mkdir(dead_tmp, 0755) == 0);
    path2(p, d, "step_00000001/shard_00000.h5");
    path2(q, dead_tmp, "shard_00000.h5");
    copy_prefix(p, q, 3000);
    snprintf(name, sizeof name, ".tmp-step_00000009.%ld", (long)getppid());
    path2(live_tmp, d, name);
    CHECK(mkdir(live_tmp, 0755) == 0);
    path2(far_old, d, ".tmp-step_00000002.12345@malleus-test-otherhost.example");
    path2(far_new, d, ".tmp-step_00000004.12345@malleus-test-otherhost.example");
    CHECK(mkdir(far_old, 0755) == 0 && mkdir(far_new, 0755) == 0);
    struct timespec old[2] = {{time(NULL) - 2 * MAL_SNAP_FOREIGN_STALE_S, 0},
                              {time(NULL) - 2 * MAL_SNAP_FOREIGN_STALE_S, 0}};
    CHECK(utimensat(AT_FDCWD, far_old, old, 0) == 0);

    /* Crashes between rename and COMPLETE: full data, no marker, not
     * pointed to; one newer than what comes next, one older. */
    char unc3[PATH_MAX], unc0[PATH_MAX];
    path2(unc3, d, "step_00000003");
    path2(unc0, d, "step_00000000");
    CHECK(mkdir(unc3, 0755) == 0 && mkdir(unc0, 0755) == 0);
    path2(q, unc3, "shard_00000.h5");
    copy_prefix(p, q, 1L << 30);
    path2(p, d, "step_00000001/index.h5");
    path2(q, unc3, "index.h5");
    copy_prefix(p, q, 1L << 30);

    /* the previous snapshot is still the latest and loadable */
    check_latest(d, "step_00000001");
    path2(p, d, "step_00000001");
    check_snapshot(p, &m1, &s);
    mal_snapshot *snap = NULL;
    CHECK_ERR(mal_snapshot_open(&snap, unc3), MAL_ECORRUPT, "COMPLETE");
    CHECK(snap == NULL);
    CHECK_ERR(mal_snapshot_open(&snap, dead_tmp), MAL_ECORRUPT, "COMPLETE");

    /* the next write cleans up what is safe to clean up */
    write_ok(d, 2, &s, 0, NULL);
    check_latest(d, "step_00000002");
    CHECK(!exists(dead_tmp));
    CHECK(exists(live_tmp));
    CHECK(!exists(far_old));
    CHECK(exists(far_new));
    CHECK(!exists(unc0));
    CHECK(exists(unc3));
    path2(p, d, "step_00000001");
    check_snapshot(p, &m1, &s); /* keep_last 0 keeps all committed ones */

    /* writing step 3 for real replaces the uncommitted directory */
    tset s3;
    tset_std(&s3, 333);
    write_ok(d, 3, &s3, 0, NULL);
    mal_snap_meta m3 = meta_std(3);
    check_snapshot(unc3, &m3, &s3);
    check_latest(d, "step_00000003");

    /* `latest` is only a hint: naming a directory that lost COMPLETE, or
     * garbage, or an older snapshot, the newest committed one is found */
    path2(p, unc3, "COMPLETE");
    CHECK(unlink(p) == 0);
    check_latest(d, "step_00000002");
    path2(p, d, "latest");
    write_text(p, "../../etc\n");
    check_latest(d, "step_00000002");
    write_text(p, "step_00000001\n");
    check_latest(d, "step_00000002");
    (void)buf;

    tset_free(&s);
    tset_free(&s3);
}

/* Replace `from` by `to` in the text file `path` (once). */
static void edit_text(const char *path, const char *from, const char *to)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *hit = strstr(buf, from), out[4096];
    CHECK(hit != NULL);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(hit - buf), buf, to, hit + strlen(from));
    write_text(path, out);
}

/* After a deliberate edit of index.h5: recompute the size and checksum the
 * COMPLETE marker holds, so that the reader's later checks are reached. */
static void reseal(const char *step_dir)
{
    char ip[PATH_MAX], mp[PATH_MAX], text[1024];
    path2(ip, step_dir, "index.h5");
    path2(mp, step_dir, "COMPLETE");
    FILE *f = fopen(ip, "rb");
    CHECK(f != NULL);
    uint32_t c = 0;
    long n = 0;
    unsigned char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        c = mal_crc32c(c, buf, k);
        n += (long)k;
    }
    fclose(f);
    f = fopen(mp, "r");
    CHECK(f != NULL);
    k = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[k] = '\0';
    long long step, nt, nb, ns;
    const char *p = strstr(text, "\"step\"");
    CHECK(p && sscanf(p, "\"step\": %lld", &step) == 1);
    CHECK((p = strstr(text, "\"n_tensors\"")) && sscanf(p, "\"n_tensors\": %lld", &nt) == 1);
    CHECK((p = strstr(text, "\"n_blocks\"")) && sscanf(p, "\"n_blocks\": %lld", &nb) == 1);
    CHECK((p = strstr(text, "\"n_shards\"")) && sscanf(p, "\"n_shards\": %lld", &ns) == 1);
    snprintf(text, sizeof text,
             "{\"format\": \"malleus-snapshot\", \"format_version\": 2, \"step\": %lld, "
             "\"n_tensors\": %lld, \"n_blocks\": %lld, \"n_shards\": %lld, \"index_bytes\": %ld, "
             "\"index_crc32c\": %u}\n",
             step, nt, nb, ns, n, c);
    write_text(mp, text);
}

static void test_corruption(void)
{
    char d[PATH_MAX], sd[PATH_MAX], fp[PATH_MAX], p[PATH_MAX];
    tset s;
    tset_std(&s, 500);
    path2(d, base, "corrupt");
    write_ok(d, 5, &s, 0, NULL);
    path2(sd, d, "step_00000005");
    path2(fp, sd, "shard_00000.h5");

    /* find where the data of one tensor lies and flip one bit of one byte */
    hid_t f = H5Fopen(fp, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(f >= 0);
    hid_t ds = H5Dopen2(f, "param/layers.0.wq/block_0_0", H5P_DEFAULT);
    CHECK(ds >= 0);
    haddr_t off = H5Dget_offset(ds);
    CHECK(off != HADDR_UNDEF);
    H5Dclose(ds);
    H5Fclose(f);
    int fd = open(fp, O_RDWR);
    CHECK(fd >= 0);
    unsigned char byte;
    CHECK(pread(fd, &byte, 1, (off_t)off + 13) == 1);
    byte ^= 0x10;
    CHECK(pwrite(fd, &byte, 1, (off_t)off + 13) == 1);
    close(fd);

    mal_snapshot *snap = NULL;
    CHECK_OK(mal_snapshot_open(&snap, sd)); /* metadata is intact */
    float buf[64];
    CHECK_OK(mal_snapshot_read(snap, "param/tok_emb", 1, (int64_t[]){37}, buf, 64));
    CHECK_ERR(mal_snapshot_read(snap, "param/layers.0.wq", 2, (int64_t[]){6, 5}, buf, 64),
              MAL_ECORRUPT, "'param/layers.0.wq'");
    CHECK(strstr(mal_errmsg(), "shard_00000.h5") != NULL);
    /* the flip did reach the data (so the checksum is what caught it) */
    CHECK(memcmp(buf, s.t[1].data, 30 * sizeof(float)) != 0);
    CHECK(((unsigned char *)buf)[13] == (((unsigned char *)s.t[1].data)[13] ^ 0x10));
    /* any block touching the corrupt stored block is refused, too */
    mal_snap_tensor part = {"param/layers.0.wq", 2, {6, 5}, {5, 4}, {1, 1}, buf};
    CHECK_ERR(mal_snapshot_read_block(snap, &part), MAL_ECORRUPT, "shard_00000.h5");

    /* shape and argument mismatches */
    CHECK_ERR(mal_snapshot_read(snap, "param/tok_emb", 2, (int64_t[]){37, 1}, buf, 64),
              MAL_EMISMATCH, "param/tok_emb");
    CHECK_ERR(mal_snapshot_read(snap, "adam_m/layers.0.wq", 3, (int64_t[]){2, 4, 3}, buf, 64),
              MAL_EMISMATCH, "[2, 3, 4]");
    CHECK_ERR(mal_snapshot_read(snap, "param/nope", 1, (int64_t[]){37}, buf, 64), MAL_ENOENT,
              "param/nope");
    CHECK_ERR(mal_snapshot_read(snap, "param/tok_emb", 1, (int64_t[]){37}, buf, 36), MAL_EINVAL,
              "param/tok_emb");
    mal_snap_tensor outside = {"param/tok_emb", 1, {37}, {30}, {8}, buf};
    CHECK_ERR(mal_snapshot_read_block(snap, &outside), MAL_EINVAL, "does not fit");
    mal_snap_tensor info;
    CHECK_ERR(mal_snapshot_tensor_info(snap, 4, &info), MAL_EINVAL, "out of range");
    mal_snapshot_close(snap);

    /* a tensor removed from the index after commit: the marker's checksum
     * of the index catches it */
    path2(d, base, "corrupt2");
    write_ok(d, 6, &s, 0, NULL);
    path2(sd, d, "step_00000006");
    path2(fp, sd, "index.h5");
    f = H5Fopen(fp, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0);
    CHECK(H5Ldelete(f, "adam_v/x/deep", H5P_DEFAULT) >= 0);
    H5Fclose(f);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_ECORRUPT, "does not match its COMPLETE marker");

    /* a shard file replaced or truncated: its size gives it away at open */
    path2(d, base, "corrupt4");
    write_ok(d, 8, &s, 0, NULL);
    path2(sd, d, "step_00000008");
    path2(fp, sd, "shard_00000.h5");
    write_text(fp, "this is not HDF5\n");
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_ECORRUPT, "truncated or replaced");
    CHECK(strstr(mal_errmsg(), "shard_00000.h5") != NULL);
    CHECK(unlink(fp) == 0);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_ECORRUPT, "missing");
    /* an index that is not HDF5 at all (marker resealed to reach that check) */
    path2(fp, sd, "index.h5");
    write_text(fp, "this is not HDF5\n");
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_ECORRUPT, "not an HDF5 file");

    /* the marker's own checks */
    path2(d, base, "corrupt3");
    write_ok(d, 7, &s, 0, NULL);
    path2(sd, d, "step_00000007");
    path2(p, sd, "COMPLETE");
    edit_text(p, "\"step\": 7", "\"step\": 8");
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_ECORRUPT, "marker says 8");
    edit_text(p, "\"step\": 8", "\"step\": 7");
    CHECK_OK(mal_snapshot_open(&snap, sd));
    mal_snapshot_close(snap);
    edit_text(p, "\"index_crc32c\": ", "\"index_crc32c\": 1");
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_ECORRUPT, "altered");
    edit_text(p, "\"format_version\": 2", "\"format_version\": 1");
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "format_version 1");
    write_text(p, "{\"format\": \"malleus-snap");
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "COMPLETE");
    tset_free(&s);
}

static void test_format_version(void)
{
    char d[PATH_MAX], sd[PATH_MAX], fp[PATH_MAX];
    tset s;
    tset_std(&s, 900);
    path2(d, base, "version");
    write_ok(d, 3, &s, 0, NULL);
    path2(sd, d, "step_00000003");
    path2(fp, sd, "index.h5");
    hid_t f = H5Fopen(fp, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    CHECK(a >= 0);
    int32_t v = 3;
    CHECK(H5Awrite(a, H5T_NATIVE_INT32, &v) >= 0);
    H5Aclose(a);
    H5Fclose(f);
    reseal(sd);
    mal_snapshot *snap = NULL;
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "format_version 3");
    CHECK(snap == NULL);
    tset_free(&s);
}

/* A whole file into a malloc'ed buffer. */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0);
    unsigned char *b = malloc((size_t)n + 1);
    CHECK(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Replace root attribute `name` of index.h5 by `n` strings (variable or
 * fixed length), as a hand-made index could. */
static void put_string_array(const char *fp, const char *name, int n, int vlen)
{
    hid_t f = H5Fopen(fp, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0);
    if (H5Aexists(f, name) > 0) CHECK(H5Adelete(f, name) >= 0);
    hid_t t = H5Tcopy(H5T_C_S1);
    CHECK(t >= 0 && H5Tset_size(t, vlen ? H5T_VARIABLE : 8) >= 0);
    hsize_t dims = (hsize_t)n;
    hid_t sp = H5Screate_simple(1, &dims, NULL);
    hid_t a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(sp >= 0 && a >= 0);
    const char *v[4] = {"{\"a\":1}", "{\"b\":2}", "{\"c\":3}", "{\"d\":4}"};
    char fixed[4][8] = {"1234567", "abcdefg", "ABCDEFG", "!@#$%^&"};
    CHECK(n <= 4 && H5Awrite(a, t, vlen ? (const void *)v : (const void *)fixed) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
}

/* Overwrite element `i` of the integer table /_malleus/<name> (row-major)
 * with v, as a uint64 when `u64` (else an int64). */
static void poke_table_as(const char *fp, const char *name, size_t i, int64_t v, int u64)
{
    char path[256];
    snprintf(path, sizeof path, "/_malleus/%s", name);
    hid_t f = H5Fopen(fp, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0);
    hid_t ds = H5Dopen2(f, path, H5P_DEFAULT), sp = H5Dget_space(ds);
    CHECK(ds >= 0 && sp >= 0);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    CHECK(n > 0 && (size_t)n > i);
    hid_t mt = u64 ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
    int64_t *all = malloc(sizeof *all * (size_t)n);
    CHECK(all && H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) >= 0);
    all[i] = v; /* the same 64 bits either way */
    CHECK(H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) >= 0);
    free(all);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
}

static void poke_table(const char *fp, const char *name, size_t i, int64_t v)
{
    poke_table_as(fp, name, i, v, 0);
}

static void put_attr_i64(const char *fp, const char *name, int64_t v)
{
    hid_t f = H5Fopen(fp, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    CHECK(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
    H5Fclose(f);
}

/* The index and the marker are outside input: a user can point
 * --resume or malleus-reshard at anything.  Hand-made indexes, resealed so
 * that they pass the marker's checksum, are refused with a message: never
 * a crash, never an allocation the input does not justify, never blocks
 * that overlap.  The parsers from memory refuse garbage and every
 * truncation tried. */
static void test_hostile_index(void)
{
    char d[PATH_MAX], sd[PATH_MAX], fp[PATH_MAX], mp[PATH_MAX];
    tset s;
    tset_std(&s, 1400);
    mal_snapshot *snap = NULL;
    path2(d, base, "hostile");
    write_ok(d, 3, &s, 0, NULL);
    path2(sd, d, "step_00000003");
    path2(fp, sd, "index.h5");
    path2(mp, sd, "COMPLETE");
    size_t ilen, mlen;
    unsigned char *good = slurp(fp, &ilen), *mark = slurp(mp, &mlen);
#define RESTORE()                                                                                  \
    do {                                                                                           \
        FILE *f_ = fopen(fp, "wb");                                                                \
        CHECK(f_ && fwrite(good, 1, ilen, f_) == ilen && fclose(f_) == 0);                         \
        f_ = fopen(mp, "wb");                                                                      \
        CHECK(f_ && fwrite(mark, 1, mlen, f_) == mlen && fclose(f_) == 0);                         \
    } while (0)

    /* a string attribute holding four strings: HDF5 writes all four into
     * room for one (variable length: pointers on the stack; fixed: heap) */
    put_string_array(fp, "config_json", 4, 1);
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "is not one string");
    RESTORE();
    put_string_array(fp, "train_json", 4, 0);
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "is not one string");
    RESTORE();

    /* tensor 1 claims INT64_MAX blocks: first + n overflowed and the
     * reader walked off the block table */
    poke_table(fp, "tensor_n_blocks", 1, INT64_MAX);
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "inconsistent");
    RESTORE();

    /* counts far beyond what the file can hold: refused before sizing
     * anything by them */
    put_attr_i64(fp, "n_blocks", (int64_t)1 << 59);
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "do not fit");
    RESTORE();

    /* a block outside its shard file, at an address where address + size
     * wraps around to a small number */
    poke_table_as(fp, "block_addr", 0, -8, 1);
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "outside its shard file");
    RESTORE();

    /* negative progress */
    put_attr_i64(fp, "consumed_samples", -5);
    reseal(sd);
    CHECK_ERR(mal_snapshot_open(&snap, sd), MAL_EFORMAT, "must be >= 0");
    RESTORE();
    CHECK_OK(mal_snapshot_open(&snap, sd));
    mal_snapshot_close(snap);

    /* two blocks of a tensor that overlap by a row and leave a row out, with
     * the right total volume: the reader's tiling check catches it */
    char d2[PATH_MAX], sd2[PATH_MAX], fp2[PATH_MAX];
    path2(d2, base, "hostile_overlap");
    mal_snap_tensor two[2] = {s.t[1], s.t[1]}; /* param/layers.0.wq, 6 x 5 */
    two[0].extent[0] = 3;
    two[1].offset[0] = 3;
    two[1].extent[0] = 3;
    two[1].data = s.t[1].data + 15;
    mal_snap_meta m = meta_std(4);
    CHECK_OK(mal_snapshot_write(d2, &m, two, 2, 0, NULL, 0));
    path2(sd2, d2, "step_00000004");
    path2(fp2, sd2, "index.h5");
    CHECK_OK(mal_snapshot_open(&snap, sd2));
    mal_snapshot_close(snap);
    poke_table(fp2, "block_offset", 4, 2); /* block 1 starts at row 2, not 3 */
    reseal(sd2);
    CHECK_ERR(mal_snapshot_open(&snap, sd2), MAL_EFORMAT, "overlap");

    /* from memory: the real index parses and describes itself; reading
     * from it has no files */
    CHECK_OK(mal_snapshot_parse_index(&snap, good, ilen, "good index"));
    CHECK_EQ_INT(mal_snapshot_n_tensors(snap), 4);
    CHECK_EQ_INT(mal_snapshot_meta(snap)->step, 3);
    float buf[64];
    CHECK_ERR(mal_snapshot_read(snap, "param/tok_emb", 1, (int64_t[]){37}, buf, 64), MAL_EINVAL,
              "parsed from memory");
    mal_snapshot_close(snap);
    CHECK_ERR(mal_snapshot_parse_index(&snap, NULL, 0, "nothing"), MAL_ECORRUPT, "not an HDF5");
    CHECK_ERR(mal_snapshot_parse_index(&snap, "\x89HDF\r\n\x1a\n", 8, "a signature"),
              MAL_ECORRUPT, "HDF5");
    CHECK(snap == NULL);
    /* every prefix at 64-byte steps: refused.  (Flipped bytes inside
     * HDF5's own structures are not tried: libhdf5 1.10 does not survive
     * all of them -- e.g. a global-heap reference read in H5HG_read -- and
     * that decoder is HDF5's, not ours.  mal_snapshot_open never hands
     * HDF5 an index whose checksum does not match its marker.) */
    int n_refused = 0;
    for (size_t k = 0; k < ilen; k += 64) {
        int rc = mal_snapshot_parse_index(&snap, good, k, "a prefix");
        CHECK(rc != 0 && snap == NULL);
        n_refused++;
    }
    printf("hostile index: 7 hand-made indexes and %d truncations refused, none crashed\n",
           n_refused);

    /* the marker */
    mal_snap_marker mk;
    CHECK_OK(mal_snapshot_parse_marker((const char *)mark, mlen, "COMPLETE", &mk));
    CHECK_EQ_INT(mk.step, 3);
    CHECK_EQ_INT(mk.index_bytes, (long long)ilen);
    CHECK_ERR(mal_snapshot_parse_marker((const char *)mark, mlen / 2, "half", &mk), MAL_EFORMAT,
              "not a valid marker");
    const char *huge = "{\"format\": \"malleus-snapshot\", \"format_version\": 2, \"step\": 1, "
                       "\"n_tensors\": 1, \"n_blocks\": 1, \"n_shards\": 1, "
                       "\"index_bytes\": 4611686018427387904, \"index_crc32c\": 7}";
    CHECK_ERR(mal_snapshot_parse_marker(huge, strlen(huge), "huge", &mk), MAL_EFORMAT,
              "not a valid marker");
    const char *v9 = "{\"format\": \"malleus-snapshot\", \"format_version\": 4294967298}";
    CHECK_ERR(mal_snapshot_parse_marker(v9, strlen(v9), "v", &mk), MAL_EFORMAT,
              "format_version 4294967298");
#undef RESTORE
    free(good);
    free(mark);
    tset_free(&s);
}

static void test_bad_writes(void)
{
    char d[PATH_MAX];
    tset s;
    tset_std(&s, 700);
    path2(d, base, "bad");
    write_ok(d, 1, &s, 0, NULL);
    mal_snap_meta m = meta_std(2);

    const char *keep = s.t[1].name;
    s.t[1].name = s.t[0].name;
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "same block twice");
    s.t[1].name = "param/tok_emb/inner";
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "lies inside");
    s.t[1].name = "param//x";
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "param//x");
    s.t[1].name = "param/../x";
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "'..'");
    s.t[1].name = keep;

    s.t[2].offset[0] = 1;
    s.t[2].extent[0] = 1;
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "cover 12 of 24");
    s.t[2].offset[0] = 2;
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "does not fit");
    s.t[2].offset[0] = 0;
    s.t[2].extent[0] = s.t[2].shape[0];
    s.t[2].ndim = 5;
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "ndim 5");
    s.t[2].ndim = 3;
    m.step = -1;
    CHECK_ERR(mal_snapshot_write(d, &m, s.t, s.n, 0, NULL, 0), MAL_EINVAL, "step -1");
    m.step = 2;

    /* nothing of the refused writes is left behind */
    check_latest(d, "step_00000001");
    CHECK_EQ_INT(count_prefix(d, "step_"), 1);
    CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);

    /* zero tensors is a valid (meta-only) snapshot */
    CHECK_OK(mal_snapshot_write(d, &m, NULL, 0, 0, NULL, 0));
    tset none = {.n = 0};
    char p[PATH_MAX];
    path2(p, d, "step_00000002");
    check_snapshot(p, &m, &none);
    tset_free(&s);
}

/* Fail each of the writer's own I/O steps in turn (sqlite-style): every
 * failure returns MAL_EIO, leaves `latest` on the previous snapshot, which
 * stays loadable, and leaves no temporary or uncommitted directory. */
static void test_fault_injection(void)
{
    char d[PATH_MAX], p[PATH_MAX], name[64], prev[64];
    tset s;
    tset_std(&s, 1100);
    path2(d, base, "faults");
    write_ok(d, 1, &s, 0, NULL);
    snprintf(prev, sizeof prev, "step_00000001");
    mal_snap_meta mprev = meta_std(1);
    int n_failed = 0, nth;
    for (nth = 1; nth < 200; nth++) {
        mal_snap_meta m = meta_std(100 + nth);
        mal_snapshot_fault_nth_io = nth;
        int rc = mal_snapshot_write(d, &m, s.t, s.n, 2, NULL, 0);
        int fired = mal_snapshot_fault_nth_io == 0;
        mal_snapshot_fault_nth_io = 0;
        snprintf(name, sizeof name, "step_%08d", 100 + nth);
        path2(p, d, name);
        if (rc == 0) {
            /* the fault hit retention (only logged) or nothing at all */
            check_latest(d, name);
            check_snapshot(p, &m, &s);
            snprintf(prev, sizeof prev, "%s", name);
            mprev = m;
            if (!fired) break; /* every I/O step has had its failure */
            continue;
        }
        n_failed++;
        if (rc != MAL_EIO) {
            fprintf(stderr, "fault %d: rc %d (%s): %s\n", nth, rc, mal_strerror(rc), mal_errmsg());
            exit(1);
        }
        path2(p, d, prev);
        check_snapshot(p, &mprev, &s);
        CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);
        /* the step itself is gone, or committed (only `latest` failed):
         * then it is the newest committed snapshot, whatever `latest` says */
        path2(p, d, name);
        if (exists(p)) {
            check_snapshot(p, &m, &s);
            check_latest(d, name);
            snprintf(prev, sizeof prev, "%s", name);
            mprev = m;
        } else {
            check_latest(d, prev);
        }
    }
    CHECK(nth < 200);
    CHECK(n_failed >= 10); /* mkdir, create, data, fsyncs, renames, COMPLETE, latest */

    /* The first snapshot into directories that do not exist yet: a failure
     * leaves none of the directories the writer created (the outermost,
     * "fresh", included), and never removes more. */
    char top[PATH_MAX], nested[PATH_MAX];
    path2(top, base, "fresh");
    path2(nested, top, "a/b");
    int n_fresh = 0;
    for (nth = 1; nth < 200; nth++) {
        mal_snap_meta m = meta_std(7);
        mal_snapshot_fault_nth_io = nth;
        int rc = mal_snapshot_write(nested, &m, s.t, s.n, 0, NULL, 0);
        int fired = mal_snapshot_fault_nth_io == 0;
        mal_snapshot_fault_nth_io = 0;
        if (rc == 0) {
            rmtree(top);
            if (!fired) break;
            continue;
        }
        n_fresh++;
        CHECK_EQ_INT(rc, MAL_EIO);
        /* only a committed snapshot (just `latest` failed) keeps them */
        char marker[PATH_MAX];
        path2(marker, nested, "step_00000007/COMPLETE");
        if (exists(top) && !exists(marker)) {
            fprintf(stderr, "fault %d of a first snapshot left %s behind: %s\n", nth, top,
                    mal_errmsg());
            exit(1);
        }
        rmtree(top);
    }
    CHECK(nth < 200 && n_fresh >= 10);
    printf("fault injection: %d I/O steps failed one by one, all clean; %d of a first snapshot "
           "into new directories, none left behind\n",
           n_failed, n_fresh);
    tset_free(&s);
}

/* A failure inside HDF5 (file size limit): reported as MAL_EIO naming the
 * file, nothing left behind.  Runs in a child that leaves with _exit():
 * HDF5 1.10 keeps a broken file id after a failed H5Fclose and crashes in
 * its atexit handler (h5py issue 914). */
static void test_hdf5_failure(void)
{
    char d[PATH_MAX], p[PATH_MAX];
    tset s;
    tset_std(&s, 1200);
    path2(d, base, "efbig");
    write_ok(d, 1, &s, 0, NULL);
    tset big = {.n = 0};
    tset_add(&big, "param/big", 2, (int64_t[]){512, 512}, 42); /* 1 MiB */
    mal_snap_meta m = meta_std(2);

    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct rlimit lim;
        int ok = getrlimit(RLIMIT_FSIZE, &lim) == 0;
        lim.rlim_cur = 256 * 1024;
        signal(SIGXFSZ, SIG_IGN);
        ok = ok && setrlimit(RLIMIT_FSIZE, &lim) == 0;
        int rc = mal_snapshot_write(d, &m, big.t, big.n, 0, NULL, 0);
        if (!ok || rc != MAL_EIO || !strstr(mal_errmsg(), "shard_00000.h5")) {
            fprintf(stderr, "file size limit: rc %d (%s): %s\n", rc, mal_strerror(rc),
                    mal_errmsg());
            _exit(1);
        }
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    check_latest(d, "step_00000001");
    CHECK_EQ_INT(count_prefix(d, "step_"), 1);
    CHECK_EQ_INT(count_prefix(d, ".tmp-"), 0);

    /* without the limit the same write succeeds */
    write_ok(d, 2, &big, 0, NULL);
    path2(p, d, "step_00000002");
    check_snapshot(p, &m, &big);
    tset_free(&s);
    tset_free(&big);
}

/* The same module in a program that started MPI (mal_comm_init; the sec2
 * driver, one rank). */
static void test_after_mpi_init(int *argc, char ***argv)
{
    char d[PATH_MAX], p[PATH_MAX];
    mal_comm *world = NULL;
    CHECK_OK(mal_comm_init(argc, argv, &world));
    tset s;
    tset_std(&s, 1300);
    path2(d, base, "mpi");
    write_ok(d, 4, &s, 1, NULL);
    path2(p, d, "step_00000004");
    mal_snap_meta m = meta_std(4);
    check_snapshot(p, &m, &s);
    tset_free(&s);
    mal_comm_finalize(world);
}

/* ------------------------------------------------------------ demo for h5py */

/* Values Python can recompute exactly: small multiples of 1/64. */
static void demo_fill(mal_snap_tensor *t, int salt)
{
    size_t c = tcount(t);
    for (size_t i = 0; i < c; i++)
        t->data[i] = (float)((long)((i * 37 + (size_t)salt * 101) % 1001) - 500) / 64.0f;
}

/* A known snapshot whose tensors are split into blocks over three shard
 * files, for tests/test_snapshot_h5py.sh. */
static int write_demo(const char *dir)
{
    tset s = {.n = 0};
    tset_add(&s, "param/layers.0.wq", 2, (int64_t[]){8, 6}, 0);
    tset_add(&s, "adam_m/lm_head", 3, (int64_t[]){3, 4, 5}, 0);
    tset_add(&s, "special", 1, (int64_t[]){8}, 0);
    demo_fill(&s.t[0], 1);
    demo_fill(&s.t[1], 2);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu,
                                       0x7f800000u, 0xff800000u, 0x7fc00123u, 0x3fc00000u};
    memcpy(s.t[2].data, special, sizeof special);
    mal_snap_meta m = {.step = 42,
                       .consumed_samples = 4200,
                       .seed = 0xFEEDFACECAFEBEEFull,
                       .rng_counter = 7,
                       .config_json = "{\"d_model\": 64}",
                       .train_json = "{\"lr\": 0.001}",
                       .plan_json = NULL};
    ttensor T[3];
    for (int i = 0; i < 3; i++) {
        T[i] = (ttensor){s.t[i].name, s.t[i].ndim, {0}, s.t[i].data};
        memcpy(T[i].shape, s.t[i].shape, sizeof T[i].shape);
    }
    /* shard 0: wq rows 0-2, lm_head [:, 1:4, :]; shard 1: wq rows 3-7
     * columns 0-3, lm_head [:, 0:1, :]; shard 2: wq rows 3-7 columns 4-5,
     * special */
    mal_snap_tensor s0[] = {blk(&T[0], 0, 0, 0, 3, 6, 1), blk(&T[1], 0, 1, 0, 3, 3, 5)};
    mal_snap_tensor s1[] = {blk(&T[0], 3, 0, 0, 5, 4, 1), blk(&T[1], 0, 0, 0, 3, 1, 5)};
    mal_snap_tensor s2[] = {blk(&T[0], 3, 4, 0, 5, 2, 1), blk(&T[2], 0, 0, 0, 8, 1, 1)};
    const int t0[] = {0, 1}, t1[] = {0, 1}, t2[] = {0, 2};
    mal_snap_writer *w;
    char out[PATH_MAX];
    int rc = mal_snap_writer_begin(&w, NULL, dir, &m);
    if (!rc) {
        int h0 = mal_snap_writer_add_shard(w, 0, s0, 2),
            h1 = mal_snap_writer_add_shard(w, 1, s1, 2),
            h2 = mal_snap_writer_add_shard(w, 2, s2, 2);
        CHECK(h0 >= 0 && h1 >= 0 && h2 >= 0);
        for (int k = 0; k < 2; k++) {
            put_block(w, h0, k, &T[t0[k]], &s0[k]);
            put_block(w, h1, k, &T[t1[k]], &s1[k]);
            put_block(w, h2, k, &T[t2[k]], &s2[k]);
        }
        rc = mal_snap_writer_finish(w, 0, 0, out, sizeof out);
    }
    tset_free(&s);
    if (rc) {
        fprintf(stderr, "write failed: %s\n", mal_errmsg());
        return 1;
    }
    printf("%s\n", out);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-demo") == 0) return write_demo(argv[2]);

    const char *tmp = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/malleus-snap-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return MAL_TEST_ERROR;
    }
    double t0 = mal_now();
    test_crc_both();
    test_missing();
    test_blocks();
    test_roundtrip_latest_retention();
    test_crash_debris();
    test_corruption();
    test_format_version();
    test_hostile_index();
    test_bad_writes();
    test_fault_injection();
    test_hdf5_failure();
    test_after_mpi_init(&argc, &argv);
    rmtree(base);
    printf("snapshot tests passed (%.2f s)\n", mal_now() - t0);
    return 0;
}
