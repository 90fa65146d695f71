/* Error codes, per-thread error messages, logging and small utilities. */
#include "mal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int mal_log_level = MAL_LOG_INFO;

static _Thread_local char errbuf[1024];

const char *mal_strerror(int err)
{
    switch (err) {
    case MAL_OK: return "success";
    case MAL_EINVAL: return "invalid argument";
    case MAL_ENOMEM: return "out of memory";
    case MAL_EIO: return "I/O error";
    case MAL_EFORMAT: return "malformed input";
    case MAL_ENOENT: return "not found";
    case MAL_ECORRUPT: return "corrupt or incomplete data";
    case MAL_EMPI: return "MPI error";
    case MAL_ELP: return "lp_solve error";
    case MAL_EDEVICE: return "device error";
    case MAL_ENOTSUP: return "not supported by this build";
    case MAL_EMISMATCH: return "mismatch";
    default: return "unknown error";
    }
}

int mal_seterr_at(const char *file, int line, int err, const char *fmt, ...)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(errbuf, sizeof errbuf, "%s:%d: ", base, line);
    if (n < 0 || (size_t)n >= sizeof errbuf) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf + n, sizeof errbuf - (size_t)n, fmt, ap);
    va_end(ap);
    return err;
}

const char *mal_errmsg(void) { return errbuf; }

void mal_clearerr(void) { errbuf[0] = '\0'; }

void mal_log_at(int level, const char *fmt, ...)
{
    static const char *tag[] = {"error", "warning", "info", "debug"};
    FILE *f = level <= MAL_LOG_WARN ? stderr : stdout;
    if (level <= MAL_LOG_WARN) fprintf(f, "malleus: %s: ", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fflush(f);
}

int mal_grow(void *array_ptr, int *cap, int n, size_t elem_size, int first)
{
    if (n < *cap) return 0;
    int ncap = *cap ? 2 * *cap : first;
    if (ncap <= n) ncap = n + 1;
    void *old, *grown;
    memcpy(&old, array_ptr, sizeof old); /* any T **, without aliasing it as void ** */
    if (!(grown = realloc(old, elem_size * (size_t)ncap))) return -1;
    memcpy(array_ptr, &grown, sizeof grown);
    *cap = ncap;
    return 0;
}

double mal_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CRC-32C (Castagnoli), reflected polynomial 0x82F63B78.
 *
 * Snapshots checksum every byte they write and read, so this runs at disk
 * speed or the checksum becomes the bottleneck: the byte-at-a-time table
 * managed ~330 MiB/s.  x86-64 CPUs with SSE4.2 have an instruction for
 * exactly this polynomial (8 bytes per instruction, several GB/s); everything
 * else uses slicing-by-8 (8 table lookups per 8 bytes, ~1-2 GB/s).  The
 * choice is made once, at the first call, from what the CPU reports, so one
 * binary runs everywhere.  Both give the same value as the bitwise
 * definition (tests/test_snapshot checks "123456789" -> 0xE3069283 and
 * random buffers at every alignment against a bitwise reference). */
static uint32_t crc_table[8][256];

static void crc_init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* MALLEUS_CRC32C_SOFTWARE=1 in the environment forces slicing-by-8 (tests
 * compare both paths).  crc here is the raw register (already inverted by the caller). */
static uint32_t crc_sliced(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        /* little-endian: the first byte is the lowest */
        uint32_t lo = (uint32_t)w ^ crc, hi = (uint32_t)(w >> 32);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <nmmintrin.h>
#define MAL_CRC_HW 1
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                         size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        len--;
    }
    uint64_t c = crc;
    while (len >= 32) { /* unrolled: one dependent chain, fewer loop branches */
        uint64_t w[4];
        memcpy(w, p, 32);
        c = _mm_crc32_u64(c, w[0]);
        c = _mm_crc32_u64(c, w[1]);
        c = _mm_crc32_u64(c, w[2]);
        c = _mm_crc32_u64(c, w[3]);
        p += 32;
        len -= 32;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    crc = (uint32_t)c;
    while (len--) crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

static uint32_t (*crc_impl)(uint32_t, const unsigned char *, size_t);
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_choose(void)
{
    crc_init_tables();
    crc_impl = crc_sliced;
#ifdef MAL_CRC_HW
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2") && !getenv("MALLEUS_CRC32C_SOFTWARE")) crc_impl = crc_hw;
#endif
}

uint32_t mal_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_choose);
    return ~crc_impl(~crc, buf, len);
}
