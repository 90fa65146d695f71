/* One token file of a data set: mapped read-only, never read whole into
 * memory (a rank touches only the windows it samples, and those pages are
 * the page cache's, shared by every rank of the machine), its header
 * parsed and checked against its size.  Formats: llm.c (uint16 or uint32
 * tokens after a 1 KiB header) and headerless uint16 / uint32.  See data.h
 * for the contracts. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "data_internal.h"

static int32_t get_le32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)v;
}

int mal_data_parse_image(const char *path, int format, const unsigned char *buf, size_t len,
                         size_t *start, size_t *n, int *width)
{
    if (format != MAL_DATA_AUTO && format != MAL_DATA_LLMC && format != MAL_DATA_RAW16 &&
        format != MAL_DATA_RAW32)
        return MAL_ERR(MAL_EINVAL, "unknown token file format %d for %s", format, path);
    if (len == 0) return MAL_ERR(MAL_EFORMAT, "token file %s is empty", path);
    int32_t magic = len >= 4 ? get_le32(buf) : 0;
    if (format == MAL_DATA_AUTO)
        format = magic == MAL_DATA_LLMC_MAGIC || magic == MAL_DATA_LLMC32_MAGIC ? MAL_DATA_LLMC
                                                                                : MAL_DATA_RAW16;

    if (format == MAL_DATA_RAW16 || format == MAL_DATA_RAW32) {
        int w = format == MAL_DATA_RAW16 ? 2 : 4;
        if (len % (size_t)w != 0)
            return MAL_ERR(MAL_EFORMAT,
                           "raw uint%d token file %s has a size (%zu bytes) that is not a "
                           "multiple of %d: it is not a headerless uint%d file, or it was "
                           "truncated",
                           8 * w, path, len, w, 8 * w);
        *start = 0;
        *n = len / (size_t)w;
        *width = w;
        return 0;
    }

    /* llm.c: 256 little-endian int32 {magic, version, count, 0...}, then
     * the tokens; the magic and version say their width. */
    if (len < MAL_DATA_LLMC_HEADER_BYTES)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s is too short (%zu bytes) for an llm.c header (%d bytes); "
                       "if it is headerless use format raw16 or raw32",
                       path, len, MAL_DATA_LLMC_HEADER_BYTES);
    int32_t version = get_le32(buf + 4), count = get_le32(buf + 8);
    int w;
    if (magic == MAL_DATA_LLMC_MAGIC && version == MAL_DATA_LLMC_VERSION)
        w = 2;
    else if (magic == MAL_DATA_LLMC32_MAGIC && version == MAL_DATA_LLMC32_VERSION)
        w = 4;
    else if (magic == MAL_DATA_LLMC_MAGIC || magic == MAL_DATA_LLMC32_MAGIC)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s has llm.c magic %d with version %d; known are magic %d "
                       "version %d (uint16 tokens) and magic %d version %d (uint32 tokens)",
                       path, (int)magic, (int)version, MAL_DATA_LLMC_MAGIC, MAL_DATA_LLMC_VERSION,
                       MAL_DATA_LLMC32_MAGIC, MAL_DATA_LLMC32_VERSION);
    else
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s is not in llm.c format (magic %d, expected %d or %d); if "
                       "it is headerless use format raw16 or raw32",
                       path, (int)magic, MAL_DATA_LLMC_MAGIC, MAL_DATA_LLMC32_MAGIC);
    if (count <= 0)
        return MAL_ERR(MAL_EFORMAT, "token file %s declares %d tokens in its header: %s", path,
                       (int)count, count == 0 ? "it holds no data" : "the header is corrupt");
    size_t body = len - MAL_DATA_LLMC_HEADER_BYTES;
    size_t have = body / (size_t)w, want = (size_t)count;
    if (body % (size_t)w != 0 || have > want)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s has %zu bytes after its header but the header declares "
                       "%zu tokens (%zu bytes): trailing data, the file is malformed",
                       path, body, want, want * (size_t)w);
    if (have < want)
        return MAL_ERR(MAL_ECORRUPT,
                       "token file %s is truncated: the header declares %zu tokens but only %zu "
                       "are present; regenerate or re-download it",
                       path, want, have);
    *start = MAL_DATA_LLMC_HEADER_BYTES;
    *n = want;
    *width = w;
    return 0;
}

int mal_data_file_open(mal_data_file *f, const char *path, int format)
{
    int rc;
    size_t start = 0, n = 0;
    memset(f, 0, sizeof *f);
    f->max_token = -1;
    if (!(f->path = strdup(path))) return MAL_ERR(MAL_ENOMEM, "out of memory opening %s", path);
    /* Random advice: training reads windows scattered over the file, and
     * read-ahead around each would bring in pages nobody asked for. */
    if ((rc = mal_file_map_open(&f->map, path, "token file", MAL_MAP_RANDOM))) goto fail;
    if ((rc = mal_data_parse_image(path, format, f->map.data, f->map.bytes, &start, &n, &f->width)))
        goto fail;
    f->format = start ? MAL_DATA_LLMC : f->width == 2 ? MAL_DATA_RAW16 : MAL_DATA_RAW32;
    f->tok = f->map.data + start;
    f->n_tokens = n;
    return 0;
fail:
    mal_data_file_close(f);
    return rc;
}

void mal_data_file_close(mal_data_file *f)
{
    mal_file_unmap(&f->map);
    free(f->mem);
    free(f->path);
    memset(f, 0, sizeof *f);
}

int mal_data_file_scan(mal_data_file *f)
{
    int64_t mx = 0;
    /* In pieces, each dropped from the resident set once read: the scan
     * must not leave the file counted in this process's memory. */
    const uint64_t piece = ((uint64_t)1 << 20) / (uint64_t)f->width;
    for (uint64_t i0 = 0; i0 < f->n_tokens; i0 += piece) {
        uint64_t i1 = MAL_MIN(f->n_tokens, i0 + piece);
        for (uint64_t i = i0; i < i1; i++) {
            int64_t t = mal_data_file_token(f, i);
            if (t > mx) mx = t;
        }
        if (f->map.data)
            mal_file_map_release(&f->map, (size_t)(f->tok - f->map.data) + i0 * f->width,
                                 (i1 - i0) * f->width);
    }
    f->max_token = mx;
    return 0;
}
