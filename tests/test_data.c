/* Tests for src/data.c and src/corpus.c: token file round trips in both
 * formats, format detection, every malformed-file error, the purity and
 * uniformity of window sampling, and the built-in corpus. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mal.h"
#include "base/rng.h"
#include "mal_test.h"
#include "src/corpus.h"
#include "src/data.h"

static char dir[64];

static char *path_in(const char *name)
{
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

/* Write raw bytes with stdio: an independent writer for the reader tests. */
static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(len == 0 || fwrite(buf, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

static unsigned char *read_bytes(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0);
    rewind(f);
    unsigned char *b = malloc((size_t)n + 1);
    CHECK(b != NULL);
    CHECK(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* An llm.c image built byte by byte: header {magic, version, count}, then
 * `n_tok` little-endian tokens tok(i) = (i * 7919) & 0xffff. */
static unsigned char *llmc_image(int32_t magic, int32_t version, int32_t count, size_t n_tok,
                                 size_t *len)
{
    *len = 1024 + 2 * n_tok;
    unsigned char *b = calloc(1, *len);
    CHECK(b != NULL);
    int32_t h[3] = {magic, version, count};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++)
            b[4 * k + j] = (unsigned char)((uint32_t)h[k] >> (8 * j));
    for (size_t i = 0; i < n_tok; i++) {
        unsigned v = (unsigned)((i * 7919) & 0xffff);
        b[1024 + 2 * i] = (unsigned char)v;
        b[1024 + 2 * i + 1] = (unsigned char)(v >> 8);
    }
    return b;
}

/* open must fail with `want` and a message naming the path. */
static void expect_open_error(const char *path, int format, int want)
{
    mal_data *d = (mal_data *)0x1;
    mal_clearerr();
    int rc = mal_data_open(&d, path, format);
    if (rc != want || strstr(mal_errmsg(), path) == NULL) {
        fprintf(stderr, "open %s (format %d): rc %d (%s), want %d; message: %s\n", path, format, rc,
                mal_strerror(rc), want, mal_errmsg());
        exit(1);
    }
    CHECK(d == NULL);
}

static void test_round_trip(void)
{
    enum { N = 5000 };
    uint16_t *tok = malloc(N * sizeof *tok);
    CHECK(tok != NULL);
    for (size_t i = 0; i < N; i++)
        tok[i] = (uint16_t)(mal_rng_u64(1, 2, i) & 0xffff);
    tok[1234] = 65535; /* the largest id must survive and be reported */
    int formats[2] = {MAL_DATA_LLMC, MAL_DATA_RAW16};
    for (int f = 0; f < 2; f++) {
        const char *p = path_in(formats[f] == MAL_DATA_LLMC ? "rt.llmc" : "rt.raw16");
        CHECK_OK(mal_data_write(p, formats[f], tok, N));

        /* Independent check of the bytes on disk. */
        size_t len;
        unsigned char *b = read_bytes(p, &len);
        size_t hdr = formats[f] == MAL_DATA_LLMC ? 1024 : 0;
        CHECK_EQ_INT(len, hdr + 2 * N);
        if (hdr) {
            size_t elen;
            unsigned char *e = llmc_image(20240520, 1, N, 0, &elen);
            CHECK(memcmp(b, e, 1024) == 0);
            free(e);
        }
        for (size_t i = 0; i < N; i++)
            CHECK_EQ_INT(b[hdr + 2 * i] | b[hdr + 2 * i + 1] << 8, tok[i]);
        free(b);

        /* Read back with the explicit format and with AUTO. */
        int how[2] = {formats[f], MAL_DATA_AUTO};
        for (int h = 0; h < 2; h++) {
            mal_data *d;
            CHECK_OK(mal_data_open(&d, p, how[h]));
            CHECK_EQ_INT(mal_data_n_tokens(d), N);
            for (size_t i = 0; i < N; i++)
                if (mal_data_token(d, i) != tok[i]) CHECK(!"tokens differ");
            CHECK_EQ_INT(mal_data_max_token(d), 65535);
            CHECK(strcmp(mal_data_name(d), p) == 0);
            mal_data_destroy(d);
        }
        /* An llm.c file read as raw16 is a valid (different) stream that
         * includes the header; AUTO must not do that. */
        if (formats[f] == MAL_DATA_LLMC) {
            mal_data *d;
            CHECK_OK(mal_data_open(&d, p, MAL_DATA_RAW16));
            CHECK_EQ_INT(mal_data_n_tokens(d), 512 + N);
            mal_data_destroy(d);
        }
    }
    /* No temporary file is left behind; overwriting works. */
    CHECK_OK(mal_data_write(path_in("rt.raw16"), MAL_DATA_RAW16, tok, 10));
    mal_data *d;
    CHECK_OK(mal_data_open(&d, path_in("rt.raw16"), MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_n_tokens(d), 10);
    mal_data_destroy(d);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp > /dev/null", dir);
    CHECK(system(cmd) != 0); /* grep finds nothing: exit status 1 */

    /* Write errors leave nothing behind. */
    CHECK_EQ_INT(mal_data_write(path_in("nodir/x.bin"), MAL_DATA_LLMC, tok, N), MAL_ENOENT);
    CHECK(strstr(mal_errmsg(), "nodir/x.bin") != NULL);
    CHECK_EQ_INT(mal_data_write(path_in("w.bin"), MAL_DATA_AUTO, tok, N), MAL_EINVAL);
    CHECK_EQ_INT(mal_data_write(path_in("w.bin"), MAL_DATA_LLMC, tok, 0), MAL_EINVAL);
    CHECK(access(path_in("w.bin"), F_OK) != 0);
    free(tok);
}

/* 32-bit tokens: an llm.c LLaMA-3 file (magic 20240801, version 7, uint32)
 * and a headerless uint32 file, written byte by byte here, read back with
 * ids far above 65535; check_vocab refuses a vocabulary that cannot hold
 * them, naming the file. */
static void test_wide_tokens(void)
{
    enum { N = 3000 };
    unsigned char *b = calloc(1, 1024 + 4 * N);
    CHECK(b != NULL);
    const int32_t h[3] = {20240801, 7, N};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++)
            b[4 * k + j] = (unsigned char)((uint32_t)h[k] >> (8 * j));
    uint32_t want[N];
    for (int i = 0; i < N; i++) {
        want[i] = (uint32_t)(mal_rng_below(5, 6, (uint64_t)i, 128256));
        if (i == 17) want[i] = 128255; /* LLaMA-3's last id */
        for (int j = 0; j < 4; j++)
            b[1024 + 4 * i + j] = (unsigned char)(want[i] >> (8 * j));
    }
    const char *llmc = path_in("wide.llmc"), *raw = path_in("wide.raw32");
    write_bytes(llmc, b, 1024 + 4 * N);
    write_bytes(raw, b + 1024, 4 * N);
    free(b);
    const char *paths[2] = {llmc, raw};
    const int fmts[2] = {MAL_DATA_AUTO, MAL_DATA_RAW32};
    for (int k = 0; k < 2; k++) {
        mal_data *d;
        CHECK_OK(mal_data_open(&d, paths[k], fmts[k]));
        CHECK_EQ_INT(mal_data_n_tokens(d), N);
        CHECK_EQ_INT(mal_data_max_token(d), 128255);
        for (int i = 0; i < N; i++)
            if (mal_data_token(d, (uint64_t)i) != want[i]) CHECK(!"uint32 tokens differ");
        /* windows read at the documented offsets */
        int in[16], tg[16];
        CHECK_OK(mal_data_sample(d, 3, 4, 5, 16, in, tg));
        uint64_t off = mal_rng_below(3 ^ MAL_DATA_SALT, 4, 5, N - 16);
        for (int i = 0; i < 16; i++) {
            CHECK_EQ_INT(in[i], want[off + (uint64_t)i]);
            CHECK_EQ_INT(tg[i], want[off + (uint64_t)i + 1]);
        }
        mal_clearerr();
        CHECK_EQ_INT(mal_data_check_vocab(d, 128000), MAL_EINVAL);
        CHECK(strstr(mal_errmsg(), paths[k]) && strstr(mal_errmsg(), "128255"));
        CHECK_OK(mal_data_check_vocab(d, 128256));
        mal_data_destroy(d);
    }
}

/* A file above MAL_DATA_SCAN_BYTES is not read at opening (its largest id
 * stays unknown); a token the model cannot hold is then refused as its
 * window is read, naming the file and the token's position. */
static void test_unscanned_file(void)
{
    enum { T = 8 };
    const char *p = path_in("big.raw16");
    uint64_t n = MAL_DATA_SCAN_BYTES / 2 + 4096; /* tokens */
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, (off_t)(2 * n)) == 0); /* sparse: all tokens 0 */
    /* token 1000 in the window of (seed 9, step 0, pos 1) */
    uint64_t off = mal_rng_below(9 ^ MAL_DATA_SALT, 0, 1, n - T);
    const unsigned char bad[2] = {1000 & 0xff, 1000 >> 8};
    CHECK(pwrite(fd, bad, 2, (off_t)(2 * (off + 3))) == 2);
    CHECK(close(fd) == 0);
    mal_data *d;
    CHECK_OK(mal_data_open(&d, p, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_max_token(d), -1);
    CHECK_OK(mal_data_check_vocab(d, 256)); /* nothing known to refuse yet */
    int in[T], tg[T];
    CHECK_OK(mal_data_sample(d, 9, 0, 0, T, in, tg));
    mal_clearerr();
    CHECK_EQ_INT(mal_data_sample(d, 9, 0, 1, T, in, tg), MAL_EFORMAT);
    char at[64];
    snprintf(at, sizeof at, "at token %llu ", (unsigned long long)(off + 3));
    CHECK(strstr(mal_errmsg(), p) && strstr(mal_errmsg(), "token id 1000") &&
          strstr(mal_errmsg(), at));
    mal_data_destroy(d);
    unlink(p);
}

static void test_detection_of_raw_lookalike(void)
{
    /* A raw16 file whose first tokens are not the magic stays raw under
     * AUTO even when it is exactly header-sized. */
    uint16_t tok[512];
    for (int i = 0; i < 512; i++)
        tok[i] = (uint16_t)i;
    const char *p = path_in("raw512.bin");
    write_bytes(p, tok, sizeof tok);
    mal_data *d;
    CHECK_OK(mal_data_open(&d, p, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_n_tokens(d), 512);
    CHECK_EQ_INT(mal_data_max_token(d), 511);
    mal_data_destroy(d);
    /* ...and a 2-byte file (shorter than a magic) is one raw token. */
    p = path_in("two.bin");
    write_bytes(p, "\x05\x01", 2);
    CHECK_OK(mal_data_open(&d, p, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_n_tokens(d), 1);
    CHECK_EQ_INT(mal_data_token(d, 0), 0x0105);
    mal_data_destroy(d);
}

static void test_bad_files(void)
{
    size_t len;
    unsigned char *b;

    expect_open_error(path_in("missing.bin"), MAL_DATA_AUTO, MAL_ENOENT);
    expect_open_error(dir, MAL_DATA_AUTO, MAL_EINVAL); /* a directory */
    /* Streams that never end (and would fill memory until the OOM killer
     * struck) and a FIFO nobody writes to (would block): refused at once,
     * because they are not regular files. */
    expect_open_error("/dev/zero", MAL_DATA_AUTO, MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "not a regular file"));
    expect_open_error("/dev/urandom", MAL_DATA_RAW16, MAL_EINVAL);
    const char *fifo = path_in("fifo.bin");
    CHECK(mkfifo(fifo, 0600) == 0);
    alarm(30); /* a regression blocks on the FIFO: fail, do not hang */
    expect_open_error(fifo, MAL_DATA_AUTO, MAL_EINVAL);
    alarm(0);

    const char *p = path_in("empty.bin");
    write_bytes(p, "", 0);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);
    expect_open_error(p, MAL_DATA_LLMC, MAL_EFORMAT);
    expect_open_error(p, MAL_DATA_RAW16, MAL_EFORMAT);

    /* Wrong magic, read as llm.c. */
    p = path_in("magic.bin");
    b = llmc_image(20240521, 1, 100, 100, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_LLMC, MAL_EFORMAT);

    /* Wrong versions: 2 (no such llm.c file), 7 with the uint16 magic, 1
     * with the uint32 magic, and 0. */
    p = path_in("version.bin");
    b = llmc_image(20240520, 2, 100, 100, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);
    expect_open_error(p, MAL_DATA_LLMC, MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "version 2") != NULL);
    b = llmc_image(20240520, 7, 100, 100, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);
    b = llmc_image(20240801, 1, 50, 100, &len); /* 100 uint16 = 50 uint32 */
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);
    b = llmc_image(20240520, 0, 100, 100, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);

    /* Count larger than the file holds: truncated. */
    p = path_in("truncated.bin");
    b = llmc_image(20240520, 1, 101, 100, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_ECORRUPT);
    /* Header alone, claiming tokens. */
    b = llmc_image(20240520, 1, 5, 0, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_ECORRUPT);

    /* Count smaller than the file holds: trailing data. */
    p = path_in("trailing.bin");
    b = llmc_image(20240520, 1, 99, 100, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);
    /* One stray byte after the tokens. */
    b = llmc_image(20240520, 1, 100, 101, &len);
    write_bytes(p, b, len - 1);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);

    /* Zero and negative counts. */
    p = path_in("count.bin");
    b = llmc_image(20240520, 1, 0, 0, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);
    b = llmc_image(20240520, 1, -3, 0, &len);
    write_bytes(p, b, len);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);

    /* Header shorter than 1024 bytes but starting with the magic. */
    p = path_in("short.bin");
    b = llmc_image(20240520, 1, 1, 0, &len);
    write_bytes(p, b, 100);
    free(b);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);

    /* Odd-sized raw file. */
    p = path_in("odd.bin");
    write_bytes(p, "abcde", 5);
    expect_open_error(p, MAL_DATA_RAW16, MAL_EFORMAT);
    expect_open_error(p, MAL_DATA_AUTO, MAL_EFORMAT);

    /* Raw uint32: a size that is not whole tokens. */
    write_bytes(p, "abcdef", 6);
    expect_open_error(p, MAL_DATA_RAW32, MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "multiple of 4") != NULL);

    /* Unknown format constant. */
    expect_open_error(p, 7, MAL_EINVAL);

    /* Unreadable file: only meaningful when permissions are enforced (not
     * as root). */
    p = path_in("noperm.bin");
    write_bytes(p, "abcd", 4);
    CHECK(chmod(p, 0) == 0);
    int fd = open(p, O_RDONLY);
    if (fd < 0)
        expect_open_error(p, MAL_DATA_AUTO, MAL_EINVAL); /* the user's to fix */
    else
        close(fd);
    chmod(p, 0600);
}

/* A file whose token at position i is i (n <= 65536): the first input of a
 * window is its offset. */
static mal_data *open_identity(const char *name, size_t n)
{
    uint16_t *tok = malloc(n * sizeof *tok);
    CHECK(tok != NULL);
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint16_t)i;
    const char *p = path_in(name);
    CHECK_OK(mal_data_write(p, MAL_DATA_LLMC, tok, n));
    free(tok);
    mal_data *d;
    CHECK_OK(mal_data_open(&d, p, MAL_DATA_AUTO));
    return d;
}

static void test_sampling(void)
{
    enum { N = 60000, T = 32, STEPS = 50, POS = 40 };
    mal_data *a = open_identity("id_a.bin", N);
    mal_data *b = open_identity("id_b.bin", N);
    int in[T], tg[T], in2[T], tg2[T];
    static int off[STEPS][POS];

    /* Forward order on copy a; windows are contiguous; targets are inputs
     * shifted by one; the offset matches the documented formula. */
    for (int s = 0; s < STEPS; s++)
        for (int p = 0; p < POS; p++) {
            CHECK_OK(mal_data_sample(a, 42, s, p, T, in, tg));
            for (int i = 0; i < T; i++) {
                CHECK_EQ_INT(in[i], in[0] + i);
                CHECK_EQ_INT(tg[i], in[0] + i + 1);
                if (i + 1 < T) CHECK_EQ_INT(tg[i], in[i + 1]);
            }
            CHECK(in[0] >= 0 && in[0] <= N - T - 1);
            CHECK_EQ_INT(in[0], mal_rng_below(42 ^ MAL_DATA_SALT, (uint64_t)s, (uint64_t)p, N - T));
            off[s][p] = in[0];
        }
    /* Reverse order, interleaved with other seeds, on copy b: same windows. */
    for (int s = STEPS - 1; s >= 0; s--)
        for (int p = POS - 1; p >= 0; p--) {
            CHECK_OK(mal_data_sample(b, 7, s, p, T, in2, tg2));
            CHECK_OK(mal_data_sample(b, 42, s, p, T, in, tg));
            CHECK_EQ_INT(in[0], off[s][p]);
            CHECK_EQ_INT(tg[T - 1], off[s][p] + T);
        }

    /* Different step, position or seed: different windows almost always
     * (two of N - T offsets collide with probability ~1/60000). */
    int same_step = 0, same_pos = 0, same_seed = 0;
    for (int s = 0; s + 1 < STEPS; s++)
        for (int p = 0; p + 1 < POS; p++) {
            same_step += off[s][p] == off[s + 1][p];
            same_pos += off[s][p] == off[s][p + 1];
            CHECK_OK(mal_data_sample(a, 43, s, p, T, in, tg));
            same_seed += in[0] == off[s][p];
        }
    CHECK(same_step <= 2 && same_pos <= 2 && same_seed <= 2);

    /* Uniform coverage: 20 equal buckets over [0, N - T), 20000 draws;
     * expected 1000 per bucket (sd ~31).  A constant offset, a mapping that
     * ignores pos or step, or one that reaches only part of the file fails. */
    enum { NB = 20, DRAWS = 20000 };
    int bucket[NB] = {0};
    int lo = N, hi = -1;
    for (int k = 0; k < DRAWS; k++) {
        CHECK_OK(mal_data_sample(a, 1234, k / 100, k % 100, T, in, tg));
        bucket[(int64_t)in[0] * NB / (N - T)]++;
        lo = MAL_MIN(lo, in[0]);
        hi = MAL_MAX(hi, in[0]);
    }
    for (int k = 0; k < NB; k++)
        if (bucket[k] < 800 || bucket[k] > 1200) {
            fprintf(stderr, "bucket %d of %d holds %d of %d samples\n", k, NB, bucket[k], DRAWS);
            exit(1);
        }
    CHECK(lo < 50 && hi > N - T - 50);

    /* The last possible window (off = N - T - 1) ends at the last token. */
    CHECK(hi <= N - T - 1);

    /* Bad arguments. */
    CHECK_EQ_INT(mal_data_sample(a, 1, 0, 0, 0, in, tg), MAL_EINVAL);
    CHECK_EQ_INT(mal_data_sample(a, 1, -1, 0, T, in, tg), MAL_EINVAL);
    CHECK_EQ_INT(mal_data_sample(a, 1, 0, -1, T, in, tg), MAL_EINVAL);
    mal_data_destroy(a);
    mal_data_destroy(b);

    /* Too short: exactly T tokens fails, T + 1 tokens gives the one window. */
    mal_data *s = open_identity("short_t.bin", T);
    mal_clearerr();
    CHECK_EQ_INT(mal_data_sample(s, 1, 0, 0, T, in, tg), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), path_in("short_t.bin")) != NULL);
    mal_data_destroy(s);
    s = open_identity("exact_t.bin", T + 1);
    for (int k = 0; k < 10; k++) {
        CHECK_OK(mal_data_sample(s, 99, k, 3 * k, T, in, tg));
        CHECK_EQ_INT(in[0], 0);
        CHECK_EQ_INT(tg[T - 1], T);
    }
    mal_data_destroy(s);
}

/* A raw16 file `name` of n tokens base + i. */
static const char *write_ramp(const char *name, int base, int n)
{
    uint16_t *t = malloc((size_t)n * sizeof *t);
    CHECK(t != NULL);
    for (int i = 0; i < n; i++)
        t[i] = (uint16_t)(base + i);
    const char *p = path_in(name);
    CHECK_OK(mal_data_write(p, MAL_DATA_RAW16, t, (size_t)n));
    free(t);
    return p;
}

/* Several files, globs and weights: the files of an unweighted list are
 * one data set (a window never crosses a file, every start equally
 * likely); a blend gives each item its weight's share of the samples
 * whatever its size; the spec's mistakes are refused naming the item. */
static void test_many_files(void)
{
    enum { T = 16 };
    const char *a = write_ramp("many_a.bin", 0, 2000);
    const char *b = write_ramp("many_b.bin", 10000, 6000);
    char spec[1024];
    mal_data *d;
    int in[T], tg[T];

    /* one data set of two files */
    snprintf(spec, sizeof spec, "%s,%s", a, b);
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_n_files(d), 2);
    CHECK_EQ_INT(mal_data_n_tokens(d), 8000);
    CHECK_EQ_INT(mal_data_token(d, 1999), 1999);
    CHECK_EQ_INT(mal_data_token(d, 2000), 10000);
    CHECK_EQ_INT(mal_data_max_token(d), 15999);
    mal_data_file_info fi;
    mal_data_file_describe(d, 1, &fi);
    CHECK(!strcmp(fi.path, b) && fi.bytes == 12000 && fi.n_tokens == 6000 && fi.width == 2);
    CHECK(fi.component == 0 && fi.weight == 1.0 && fi.format == MAL_DATA_RAW16);
    int from_a = 0;
    for (int k = 0; k < 4000; k++) {
        CHECK_OK(mal_data_sample(d, 11, k / 50, k % 50, T, in, tg));
        /* the documented offset over both files' starts */
        uint64_t off = mal_rng_below(11 ^ MAL_DATA_SALT, (uint64_t)(k / 50), (uint64_t)(k % 50),
                                     (2000 - T) + (6000 - T));
        int want = off < 2000 - T ? (int)off : 10000 + (int)(off - (2000 - T));
        CHECK_EQ_INT(in[0], want);
        CHECK_EQ_INT(tg[T - 1], want + T); /* within one file */
        from_a += in[0] < 10000;
    }
    /* a quarter of the starts are a's: 1000 expected, sd 27 */
    printf("one data set of two files: %d of 4000 windows from the first\n", from_a);
    CHECK(from_a > 880 && from_a < 1120);
    mal_data_destroy(d);

    /* a blend: weight 3 on the small file, 1 on the large one */
    snprintf(spec, sizeof spec, "%s:3,%s:1", a, b);
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    mal_data_file_describe(d, 0, &fi);
    CHECK(fi.component == 0 && fi.weight == 0.75);
    mal_data_file_describe(d, 1, &fi);
    CHECK(fi.component == 1 && fi.weight == 0.25);
    from_a = 0;
    for (int k = 0; k < 4000; k++) {
        CHECK_OK(mal_data_sample(d, 11, k / 50, k % 50, T, in, tg));
        CHECK_EQ_INT(tg[T - 1], in[0] + T);
        from_a += in[0] < 10000;
    }
    printf("blend 3:1: %d of 4000 windows from the first\n", from_a);
    CHECK(from_a > 2880 && from_a < 3120); /* 3000 expected, sd 27 */
    mal_data_destroy(d);

    /* globs: matches in byte order, one component per weighted item */
    write_ramp("shard_2.bin", 200, 100);
    write_ramp("shard_10.bin", 1000, 100);
    write_ramp("shard_1.bin", 100, 100);
    snprintf(spec, sizeof spec, "%s/shard_*.bin:1,%s:1", dir, a);
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    CHECK_EQ_INT(mal_data_n_files(d), 4);
    const char *order[3] = {"shard_1.bin", "shard_10.bin", "shard_2.bin"};
    for (int i = 0; i < 3; i++) {
        mal_data_file_describe(d, i, &fi);
        CHECK(strstr(fi.path, order[i]) && fi.component == 0 && fi.weight == 0.5);
    }
    mal_data_file_describe(d, 3, &fi);
    CHECK(fi.component == 1);
    mal_data_destroy(d);

    /* mistakes, each naming the item or file */
    const char *bad_w[] = {":0", ":nan", ":-1", ":inf", ":0.0"};
    for (int i = 0; i < 5; i++) {
        snprintf(spec, sizeof spec, "%s:1,%s%s", a, b, bad_w[i]);
        mal_clearerr();
        CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_EINVAL);
        CHECK(strstr(mal_errmsg(), b) && strstr(mal_errmsg(), "weight"));
    }
    snprintf(spec, sizeof spec, "%s:1,%s", a, b);
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), b) && strstr(mal_errmsg(), "every item"));
    snprintf(spec, sizeof spec, "%s,%s/none_*.bin", a, dir);
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_ENOENT);
    CHECK(strstr(mal_errmsg(), "none_*.bin") && strstr(mal_errmsg(), "matches no file"));
    snprintf(spec, sizeof spec, "%s,%s", a, path_in("missing.bin"));
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_ENOENT);
    CHECK(strstr(mal_errmsg(), "missing.bin"));
    snprintf(spec, sizeof spec, "synthetic:5,%s", a);
    CHECK_EQ_INT(mal_data_open(&d, spec, MAL_DATA_AUTO), MAL_EINVAL);
    /* a file too short for a window, read with one long enough, is skipped */
    const char *tiny = write_ramp("many_tiny.bin", 50000, T);
    snprintf(spec, sizeof spec, "%s,%s", tiny, a);
    CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
    for (int k = 0; k < 100; k++) {
        CHECK_OK(mal_data_sample(d, 1, 0, k, T, in, tg));
        CHECK(in[0] < 2000);
    }
    mal_data_destroy(d);
}

/* A Megatron dataset written byte by byte (an independent writer): docs
 * documents of `per` sequences each, sequence lengths lens(i) = 3 + i % 5,
 * token j of the .bin = (j * 37) % 1000 (or j with `ident`) in `code`'s
 * dtype (8 uint16, 4 int32, 1 uint8).  Returns the prefix; *n_tok the
 * tokens. */
static const char *write_megatron_as(const char *name, int code, int docs, int per, int ident,
                                     uint64_t *n_tok)
{
    int w = code == 4 ? 4 : code == 8 ? 2 : 1, S = docs * per;
    char prefix[256], bin[300], idx[300];
    snprintf(prefix, sizeof prefix, "%s", path_in(name));
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    size_t ilen = 34 + 12 * (size_t)S + 8 * (size_t)(docs + 1);
    unsigned char *ib = calloc(1, ilen);
    CHECK(ib != NULL);
    memcpy(ib, "MMIDIDX\0\0", 9);
    ib[9] = 1;
    ib[17] = (unsigned char)code;
    for (int k = 0; k < 8; k++) {
        ib[18 + k] = (unsigned char)((uint64_t)S >> (8 * k));
        ib[26 + k] = (unsigned char)((uint64_t)(docs + 1) >> (8 * k));
    }
    uint64_t at = 0;
    for (int i = 0; i < S; i++) {
        uint32_t l = (uint32_t)(3 + i % 5);
        for (int k = 0; k < 4; k++)
            ib[34 + 4 * i + k] = (unsigned char)(l >> (8 * k));
        for (int k = 0; k < 8; k++)
            ib[34 + 4 * (size_t)S + 8 * i + k] = (unsigned char)((at * (uint64_t)w) >> (8 * k));
        at += l;
    }
    for (int dk = 0; dk <= docs; dk++)
        for (int k = 0; k < 8; k++)
            ib[34 + 12 * (size_t)S + 8 * dk + k] = (unsigned char)((uint64_t)(dk * per) >> (8 * k));
    write_bytes(idx, ib, ilen);
    free(ib);
    unsigned char *bb = calloc(1, at * (uint64_t)w);
    CHECK(bb != NULL);
    for (uint64_t j = 0; j < at; j++)
        for (int k = 0; k < w; k++)
            bb[j * (uint64_t)w + (uint64_t)k] =
                (unsigned char)((ident ? j : (j * 37) % 1000) >> (8 * k));
    write_bytes(bin, bb, at * (uint64_t)w);
    free(bb);
    *n_tok = at;
    return path_in(name);
}

static const char *write_megatron(const char *name, int code, int docs, int per, uint64_t *n_tok)
{
    return write_megatron_as(name, code, docs, per, 0, n_tok);
}

/* Megatron-LM's indexed datasets: found by prefix, by .bin, by a glob that
 * matches both files; every supported dtype; documents; and the index
 * that disagrees with its .bin, refused naming the file. */
static void test_megatron(void)
{
    uint64_t n;
    const int codes[3] = {8, 4, 1};
    for (int c = 0; c < 3; c++) {
        char name[32];
        snprintf(name, sizeof name, "mega%d", codes[c]);
        char prefix[256], spec[300];
        snprintf(prefix, sizeof prefix, "%s", write_megatron(name, codes[c], 40, 3, &n));
        for (int how = 0; how < 3; how++) {
            if (how == 0) snprintf(spec, sizeof spec, "%s", prefix);
            if (how == 1) snprintf(spec, sizeof spec, "%s.bin", prefix);
            if (how == 2) snprintf(spec, sizeof spec, "%s.*", prefix); /* .bin and .idx */
            mal_data *d;
            CHECK_OK(mal_data_open(&d, spec, MAL_DATA_AUTO));
            CHECK_EQ_INT(mal_data_n_files(d), 1);
            mal_data_file_info fi;
            mal_data_file_describe(d, 0, &fi);
            CHECK(fi.format == MAL_DATA_MEGATRON && fi.index_path && strstr(fi.index_path, ".idx"));
            CHECK(strstr(fi.path, ".bin") && fi.width == (codes[c] == 4   ? 4
                                                          : codes[c] == 8 ? 2
                                                                          : 1));
            CHECK_EQ_INT(mal_data_n_tokens(d), n);
            CHECK_EQ_INT(mal_data_max_token(d), codes[c] == 1 ? 255 : 999);
            for (uint64_t j = 0; j < n; j += 7)
                CHECK_EQ_INT(mal_data_token(d, j),
                             codes[c] == 1 ? ((j * 37) % 1000) & 0xff : (j * 37) % 1000);
            mal_data_destroy(d);
        }
    }
    char prefix[256], bin[300], idx[300];
    snprintf(prefix, sizeof prefix, "%s", write_megatron("megabad", 8, 10, 2, &n));
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    size_t blen, ilen;
    unsigned char *bb = read_bytes(bin, &blen), *ib = read_bytes(idx, &ilen);
    /* truncated .bin */
    write_bytes(bin, bb, blen - 2);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_ECORRUPT);
    CHECK(strstr(mal_errmsg(), "truncated"));
    /* a .bin longer than its index says */
    unsigned char *longer = calloc(1, blen + 4);
    memcpy(longer, bb, blen);
    write_bytes(bin, longer, blen + 4);
    free(longer);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "another .bin"));
    write_bytes(bin, bb, blen);
    /* an index cut short, a float32 dtype, version 2, a wild pointer */
    write_bytes(idx, ib, ilen - 8);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_EFORMAT);
    unsigned char *x = malloc(ilen);
    memcpy(x, ib, ilen);
    x[17] = 7;
    write_bytes(idx, x, ilen);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "float32"));
    memcpy(x, ib, ilen);
    x[9] = 2;
    write_bytes(idx, x, ilen);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_EFORMAT);
    memcpy(x, ib, ilen);
    x[34 + 4 * 20 + 8 * 5] ^= 2; /* sequence 5's pointer */
    write_bytes(idx, x, ilen);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "sequence 5"));
    /* a negative id in a signed (int16) file */
    memcpy(x, ib, ilen);
    x[17] = 3;
    write_bytes(idx, x, ilen);
    bb[1] = 0xff;
    write_bytes(bin, bb, blen);
    expect_open_error(prefix, MAL_DATA_AUTO, MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "negative id"));
    /* the format named: the item is the prefix, no .idx is an error */
    expect_open_error(path_in("nomega"), MAL_DATA_MEGATRON, MAL_ENOENT);
    free(x);
    free(bb);
    free(ib);
}

/* The keyed permutation is a bijection of [0, n) for every n, and another
 * key gives another order. */
static void test_permute(void)
{
    static const uint64_t ns[] = {1, 2, 3, 4, 5, 15, 16, 17, 100, 255, 256, 257, 1000, 65537};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        uint64_t n = ns[t];
        unsigned char *seen = calloc(n, 1);
        uint64_t moved = 0, same = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t x = mal_data_permute(77, n, i);
            CHECK(x < n && !seen[x]);
            seen[x] = 1;
            moved += x != i;
            same += x == mal_data_permute(78, n, i);
        }
        if (n >= 100) CHECK(moved > n * 9 / 10 && same < n / 10);
        free(seen);
    }
    /* O(1) at the scale of 10^12 windows */
    uint64_t big = 1000000000000ull, x = mal_data_permute(5, big, big - 1);
    CHECK(x < big && x != mal_data_permute(5, big, big - 2));
}

/* Epochs: every window once per epoch, a new order each epoch, windows T
 * apart; a blend gives each component exactly its slots and reads each
 * component's windows without replacement; --val-fraction splits each
 * file into disjoint parts, at a document start for Megatron files. */
static void test_epochs(void)
{
    enum { T = 8, NW = 100, B = 7 };
    uint16_t tok[NW * T + 1];
    for (int i = 0; i <= NW * T; i++)
        tok[i] = (uint16_t)i;
    const char *p = path_in("ep.bin");
    CHECK_OK(mal_data_write(p, MAL_DATA_RAW16, tok, NW * T + 1));
    mal_data_options o = mal_data_options_default();
    o.seq_len = T;
    o.batch = B;
    mal_data *d;
    CHECK_OK(mal_data_open_opts(&d, p, &o));
    CHECK_EQ_INT(mal_data_sampling(d), MAL_DATA_SAMPLE_EPOCHS);
    CHECK_EQ_INT(mal_data_n_windows(d), NW);
    int in[T], tg[T], first[2][NW];
    for (int e = 0; e < 2; e++) {
        int seen[NW] = {0};
        for (int k = 0; k < NW; k++) {
            int g = e * NW + k;
            CHECK_OK(mal_data_sample(d, 5, g / B, g % B, T, in, tg));
            CHECK(in[0] % T == 0 && tg[T - 1] == in[0] + T);
            /* the documented window */
            uint64_t key = mal_rng_u64(5 ^ MAL_DATA_SALT ^ MAL_DATA_EPOCH_SALT, 0, (uint64_t)e);
            CHECK_EQ_INT(in[0] / T, mal_data_permute(key, NW, (uint64_t)k));
            seen[in[0] / T]++;
            first[e][k] = in[0];
        }
        for (int w = 0; w < NW; w++)
            CHECK_EQ_INT(seen[w], 1);
    }
    CHECK(memcmp(first[0], first[1], sizeof first[0]) != 0);
    /* any order of calls, any other object: the same windows */
    mal_data *d2;
    CHECK_OK(mal_data_open_opts(&d2, p, &o));
    for (int k = NW - 1; k >= 0; k--) {
        CHECK_OK(mal_data_sample(d2, 5, k / B, k % B, T, in, tg));
        CHECK_EQ_INT(in[0], first[0][k]);
    }
    mal_clearerr();
    CHECK_EQ_INT(mal_data_sample(d2, 5, 0, 0, T + 1, in, tg), MAL_EINVAL); /* not its T */
    mal_data_destroy(d2);
    mal_data_destroy(d);
    o.seq_len = 0;
    CHECK_EQ_INT(mal_data_open_opts(&d, p, &o), MAL_EINVAL);
    o.seq_len = T;

    /* a blend 3:1 of a 100-window file and a 30-window one: exactly 3/4 of
     * each block of slots from the first, each read without replacement */
    const char *q = write_ramp("ep_b.bin", 20000, 30 * T + 1);
    char spec[600];
    snprintf(spec, sizeof spec, "%s:3,%s:1", p, q);
    CHECK_OK(mal_data_open_opts(&d, spec, &o));
    int from_a = 0, na = 0, nb = 0, seen_a[NW] = {0}, seen_b[30] = {0};
    for (int g = 0; g < (int)MAL_DATA_BLEND_SLOTS; g++) {
        CHECK_OK(mal_data_sample(d, 9, g / B, g % B, T, in, tg));
        if (in[0] < 20000) {
            from_a++;
            if (na++ < NW) seen_a[in[0] / T]++;
        } else {
            if (nb++ < 30) seen_b[(in[0] - 20000) / T]++;
        }
        /* spread evenly: any 8 consecutive samples hold 6 of the first */
        if (g % 8 == 7) CHECK(from_a == (g + 1) / 8 * 6);
    }
    CHECK_EQ_INT(from_a, MAL_DATA_BLEND_SLOTS / 4 * 3);
    for (int w = 0; w < NW; w++)
        CHECK_EQ_INT(seen_a[w], 1);
    for (int w = 0; w < 30; w++)
        CHECK_EQ_INT(seen_b[w], 1);
    mal_data_destroy(d);
    /* a weight too small for a slot */
    snprintf(spec, sizeof spec, "%s:1,%s:1e-6", p, q);
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open_opts(&d, spec, &o), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), q) && strstr(mal_errmsg(), "below 1/65536"));

    /* --val-fraction 0.25 of a raw file: the last 200 tokens held out */
    o.val_fraction = 0.25;
    mal_data *tr, *va;
    o.part = MAL_DATA_PART_TRAIN;
    CHECK_OK(mal_data_open_opts(&tr, p, &o));
    o.part = MAL_DATA_PART_HELDOUT;
    CHECK_OK(mal_data_open_opts(&va, p, &o));
    uint64_t cut = NW * T + 1 - 200;
    CHECK_EQ_INT(mal_data_n_tokens(tr), cut);
    CHECK_EQ_INT(mal_data_n_tokens(va), 200);
    CHECK_EQ_INT(mal_data_token(va, 0), cut);
    for (int k = 0; k < 300; k++) {
        CHECK_OK(mal_data_sample(tr, 1, k / B, k % B, T, in, tg));
        CHECK(tg[T - 1] < (int)cut);
        CHECK_OK(mal_data_sample(va, MAL_DATA_VAL_SEED, 0, k, T, in, tg));
        CHECK(in[0] >= (int)cut);
    }
    mal_data_destroy(tr);
    mal_data_destroy(va);
    /* too little held out for one window */
    o.val_fraction = 0.005;
    mal_clearerr();
    CHECK_EQ_INT(mal_data_open_opts(&va, p, &o), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "holds out") && strstr(mal_errmsg(), p));

    /* a Megatron file: the cut moves to the nearest document start */
    uint64_t n;
    const char *m = write_megatron_as("ep_mega", 8, 50, 3, 1, &n);
    o.val_fraction = 0.13;
    o.part = MAL_DATA_PART_HELDOUT;
    CHECK_OK(mal_data_open_opts(&va, m, &o));
    uint64_t start = (uint64_t)mal_data_token(va, 0), at = 0, nearest = 0;
    /* the document starts: documents of 3 sequences of lengths 3 + i % 5 */
    uint64_t want = n - (uint64_t)llround(0.13 * (double)n);
    for (int i = 0; i < 150; i++) {
        if (i % 3 == 0 && (at > want ? at - want : want - at) <
                              (nearest > want ? nearest - want : want - nearest))
            nearest = at;
        at += (uint64_t)(3 + i % 5);
    }
    printf("held-out part of a Megatron file starts at token %llu (wanted near %llu)\n",
           (unsigned long long)start, (unsigned long long)want);
    CHECK_EQ_INT(start, nearest);
    CHECK(start != want); /* the document start moved it */
    CHECK_EQ_INT(mal_data_n_tokens(va), n - start);
    mal_data_destroy(va);
    /* --val-fraction is for token files */
    CHECK_EQ_INT(mal_data_open_opts(&va, "synthetic:10", &o), MAL_EINVAL);
}

static void test_tokenize_bytes(void)
{
    unsigned char text[300];
    for (int i = 0; i < 300; i++)
        text[i] = (unsigned char)(255 - i % 256);
    const char *p = path_in("text.txt");
    write_bytes(p, text, sizeof text);
    uint16_t *t;
    size_t n;
    CHECK_OK(mal_data_tokenize_bytes(p, &t, &n));
    CHECK_EQ_INT(n, 300);
    for (int i = 0; i < 300; i++)
        CHECK_EQ_INT(t[i], text[i]); /* 255 stays 255 */
    free(t);
    mal_clearerr();
    CHECK_EQ_INT(mal_data_tokenize_bytes(path_in("nope.txt"), &t, &n), MAL_ENOENT);
    CHECK(strstr(mal_errmsg(), "nope.txt") != NULL);
    write_bytes(path_in("empty.txt"), "", 0);
    CHECK_EQ_INT(mal_data_tokenize_bytes(path_in("empty.txt"), &t, &n), MAL_EFORMAT);
    CHECK(strstr(mal_errmsg(), "empty.txt") != NULL);

    int f;
    CHECK_OK(mal_data_parse_format("raw16", &f));
    CHECK_EQ_INT(f, MAL_DATA_RAW16);
    CHECK_OK(mal_data_parse_format("llmc", &f));
    CHECK_EQ_INT(f, MAL_DATA_LLMC);
    CHECK_EQ_INT(mal_data_parse_format("gpt2", &f), MAL_EINVAL);
}

/* Independent spelling of 0..99 for checking the corpus arithmetic. */
static void number_words(int v, char *out)
{
    static const char *const small[20] = {
        "zero",     "one",     "two",     "three",     "four",     "five",    "six",
        "seven",    "eight",   "nine",    "ten",       "eleven",   "twelve",  "thirteen",
        "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
    static const char *const decade[10] = {"",      "",      "twenty",  "thirty", "forty",
                                           "fifty", "sixty", "seventy", "eighty", "ninety"};
    if (v < 20)
        strcpy(out, small[v]);
    else if (v % 10 == 0)
        strcpy(out, decade[v / 10]);
    else
        sprintf(out, "%s-%s", decade[v / 10], small[v % 10]);
}

static void test_default_corpus(void)
{
    char *t1, *t2;
    size_t n1, n2;
    double t0 = mal_now();
    CHECK_OK(mal_corpus_generate(&t1, &n1));
    double dt = mal_now() - t0;
    CHECK_OK(mal_corpus_generate(&t2, &n2));
    printf("default corpus: %zu bytes in %.3f s\n", n1, dt);
    CHECK(dt < 1.0); /* the target is well under 0.2 s; loose for a loaded machine */
    CHECK_EQ_INT(n1, n2);
    CHECK(memcmp(t1, t2, n1) == 0);
    CHECK(n1 >= 1000000 && n1 <= 2000000);
    CHECK(t1[n1] == '\0' && strlen(t1) == n1);

    /* Printable ASCII and newlines only; several letters of variety. */
    size_t hist[256] = {0};
    for (size_t i = 0; i < n1; i++)
        hist[(unsigned char)t1[i]]++;
    int distinct = 0;
    for (int c = 0; c < 256; c++) {
        if (!hist[c]) continue;
        distinct++;
        CHECK(c == '\n' || (c >= 32 && c < 127));
    }
    CHECK(distinct >= 30);
    /* Each kind of paragraph is present and correct where checkable. */
    CHECK(strstr(t1, " plus ") && strstr(t1, " minus ") && strstr(t1, " times "));
    CHECK(strstr(t1, "Seven plus five is twelve.") || strstr(t1, "seven plus five is twelve."));
    CHECK(strstr(t1, "q: what is ") && strstr(t1, "\n\n") && strstr(t1, "name: "));
    CHECK(strstr(t1, "counting: ") && strstr(t1, "The sky is blue."));
    CHECK(strstr(t1, "The cats chase") || strstr(t1, "The cats see"));
    /* No agreement errors from the templates. */
    CHECK(!strstr(t1, "cat chase ") && !strstr(t1, "cats chases ") && !strstr(t1, " one cats"));
    /* Arithmetic in words is right: for every operand pair, the first
     * statement "X op Y is " in the text (capitalised, as a sentence start)
     * must go on with the right result. */
    static const char *const ops[3] = {"plus", "minus", "times"};
    int found = 0;
    for (int op = 0; op < 3; op++)
        for (int x = 0; x <= 20; x++)
            for (int y = 0; y <= 20; y++) {
                char s[96], want[48], got[48];
                number_words(x, s);
                s[0] = (char)(s[0] - 'a' + 'A');
                size_t k = strlen(s);
                snprintf(s + k, sizeof s - k, " %s ", ops[op]);
                k = strlen(s);
                number_words(y, s + k);
                strcat(s, " is ");
                /* memmem with the length known: 1,323 strstr calls would
                 * each make AddressSanitizer's interceptor measure the
                 * 1.5 MB text first (a minute under make check-sanitize) */
                const char *hit = memmem(t1, n1, s, strlen(s));
                if (!hit) continue;
                found++;
                int r = op == 0 ? x + y : op == 1 ? x - y : x * y;
                CHECK(r >= 0 && r < 100);
                number_words(r, want);
                strcat(want, ".");
                snprintf(got, sizeof got, "%.*s", (int)strlen(want), hit + strlen(s));
                if (strcmp(got, want) != 0) {
                    fprintf(stderr, "corpus says '%s%s', want '%s'\n", s, got, want);
                    exit(1);
                }
            }
    CHECK(found >= 300); /* 169 sums + 231 differences + 100 products possible */
    free(t1);
    free(t2);

    mal_data *d;
    CHECK_OK(mal_data_open_default(&d));
    CHECK_EQ_INT(mal_data_n_tokens(d), n1);
    CHECK(mal_data_max_token(d) < 256);
    CHECK(strcmp(mal_data_name(d), "built-in corpus") == 0);
    int in[64], tg[64];
    CHECK_OK(mal_data_sample(d, 5, 0, 0, 64, in, tg));
    mal_data_destroy(d);
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* The held-out continuation: the training corpus is the same bytes as
 * before it existed (pinned), the held-out text is new text from the same
 * generator, and the data sets hold exactly one each. */
static void test_heldout_corpus(void)
{
    char *t, *h;
    size_t n, nh;
    CHECK_OK(mal_corpus_generate(&t, &n));
    CHECK_OK(mal_corpus_generate_heldout(&h, &nh));
    printf("corpus %zu bytes (FNV-1a %016llx), held-out %zu bytes\n", n,
           (unsigned long long)fnv1a(t, n), nh);
    /* the corpus of every run so far: adding the held-out part changed nothing */
    CHECK_EQ_INT(n, 1500105);
    CHECK(fnv1a(t, n) == 0xf0ae69d25e3bcd3dull);
    CHECK(nh >= MAL_CORPUS_HELDOUT_BYTES && nh < MAL_CORPUS_HELDOUT_BYTES + 20000);
    CHECK(h[nh] == '\0' && strlen(h) == nh);
    CHECK(!strncmp(h + nh - 2, "\n\n", 2) && h[0] != '\n');
    /* New text, not a copy: of 20 windows of 160 bytes spread over it,
     * most appear nowhere in the corpus (short templated paragraphs may). */
    int unseen = 0;
    for (int w = 0; w < 20; w++) {
        char win[161];
        memcpy(win, h + (nh - 161) / 20 * (size_t)w, 160);
        win[160] = '\0';
        unseen += strstr(t, win) == NULL;
    }
    printf("held-out windows not in the corpus: %d of 20\n", unseen);
    CHECK(unseen >= 15);
    mal_data *d, *v;
    CHECK_OK(mal_data_open_default(&d));
    CHECK_OK(mal_data_open_heldout(&v));
    CHECK_EQ_INT(mal_data_n_tokens(d), n);
    CHECK_EQ_INT(mal_data_n_tokens(v), nh);
    CHECK(strcmp(mal_data_name(v), "built-in corpus, held-out part") == 0);
    for (size_t i = 0; i < nh; i++)
        if (mal_data_token(v, i) != (unsigned char)h[i]) CHECK(!"held-out tokens differ");
    mal_data_destroy(d);
    mal_data_destroy(v);
    free(t);
    free(h);
}

int main(void)
{
    /* A regression that reads /dev/zero to the end must fail here, not
     * take the machine's memory (AddressSanitizer needs its large address
     * space, so not under it). */
    if (!MAL_TEST_ASAN) {
        struct rlimit lim = {4ul << 30, 4ul << 30};
        setrlimit(RLIMIT_AS, &lim);
    }
    snprintf(dir, sizeof dir, "test_data.XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "cannot create a temporary directory: %s\n", strerror(errno));
        return MAL_TEST_ERROR;
    }
    test_round_trip();
    test_wide_tokens();
    test_unscanned_file();
    test_detection_of_raw_lookalike();
    test_bad_files();
    test_sampling();
    test_many_files();
    test_megatron();
    test_permute();
    test_epochs();
    test_tokenize_bytes();
    test_default_corpus();
    test_heldout_corpus();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return MAL_TEST_ERROR;
    printf("test_data: ok\n");
    return 0;
}
