/* Block checksums of snapshots: CRC-32C (Castagnoli), the checksum of
 * every stored block and of the index file, and the whole-file checksum
 * the commit and the reader compute over index.h5.  Checksums are defined
 * over little-endian bytes and computed on the host buffer directly.
 */
#include "snap_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A big-endian port must byte-swap before mal_crc32c. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "snapshot checksums assume little-endian");

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

/* CRC-32C and size of a whole (small) file. */
int snap_file_crc(const char *open_path, const char *path, uint64_t *bytes, uint32_t *crc,
                  size_t limit)
{
    int fd = open(open_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return MAL_ERR(MAL_EIO, "cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(1 << 20);
    uint64_t n = 0;
    uint32_t c = 0;
    int rc = 0;
    if (!buf) {
        close(fd);
        return MAL_ERR(MAL_ENOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        ssize_t k = read(fd, buf, 1 << 20);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = MAL_ERR(MAL_EIO, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (k == 0) break;
        c = mal_crc32c(c, buf, (size_t)k);
        n += (uint64_t)k;
        if (n > limit) {
            rc = MAL_ERR(MAL_ECORRUPT, "%s is larger than %zu bytes: not a snapshot index", path,
                         limit);
            break;
        }
    }
    free(buf);
    close(fd);
    *bytes = n;
    *crc = c;
    return rc;
}
