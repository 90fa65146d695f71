/* One token file of a data set: mapped read-only, never read whole into
 * memory (a rank touches only the windows it samples, and those pages are
 * the page cache's, shared by every rank of the machine), its header
 * parsed and checked against its size.  Formats: llm.c (uint16 or uint32
 * tokens after a 1 KiB header), headerless uint16 / uint32, and
 * Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx, documents and
 * their boundaries).  See data.h for the contracts. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
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

/* ---- Megatron indexed datasets --------------------------------------- */

static int32_t get_i32(const unsigned char *p)
{
    return get_le32(p);
}

int mal_data_parse_idx(const char *path, const unsigned char *buf, size_t len, uint64_t bin_bytes,
                       int full, mal_data_idx *out)
{
    const size_t H = MAL_DATA_IDX_HEADER_BYTES;
    if (len < H || memcmp(buf, MAL_DATA_IDX_MAGIC, 9) != 0)
        return MAL_ERR(MAL_EFORMAT,
                       "%s is not a Megatron index (.idx): %s; rebuild it with Megatron's "
                       "preprocess_data.py or tools/tokenize.py",
                       path, len < H ? "too short" : "no MMIDIDX header");
    uint64_t version = mal_data_le64(buf + 9);
    if (version != 1)
        return MAL_ERR(MAL_EFORMAT, "Megatron index %s has version %" PRIu64 "; only 1 is known",
                       path, version);
    int code = buf[17];
    switch (code) {
    case 1:
        out->width = 1, out->is_signed = 0;
        break;
    case 2:
        out->width = 1, out->is_signed = 1;
        break;
    case 3:
        out->width = 2, out->is_signed = 1;
        break;
    case 4:
        out->width = 4, out->is_signed = 1;
        break;
    case 8:
        out->width = 2, out->is_signed = 0;
        break;
    default:
        return MAL_ERR(MAL_EFORMAT,
                       "Megatron index %s has dtype code %d (%s): token ids are integers of "
                       "at most 32 bits (codes 1, 2, 3, 4, 8)",
                       path, code,
                       code == 5   ? "int64"
                       : code == 6 ? "float64"
                       : code == 7 ? "float32"
                                   : "unknown");
    }
    uint64_t S = mal_data_le64(buf + 18), D = mal_data_le64(buf + 26);
    /* the arrays must fill the rest exactly: 12 bytes per sequence, 8 per
     * document entry, plus 1 per sequence in a multimodal index */
    size_t body = len - H;
    if (S > body / 12 || D < 1 || D > (body - 12 * S) / 8 ||
        (body - 12 * S - 8 * D != 0 && body - 12 * S - 8 * D != S))
        return MAL_ERR(MAL_EFORMAT,
                       "Megatron index %s declares %" PRIu64 " sequences and %" PRIu64
                       " document entries, which do not fill its %zu bytes: it is truncated "
                       "or corrupt",
                       path, S, D, len);
    out->n_seqs = S;
    out->n_docs = D - 1;
    out->lengths_at = H;
    out->pointers_at = H + 4 * S;
    out->docs_at = H + 12 * S;
    const unsigned char *lens = buf + out->lengths_at, *ptrs = buf + out->pointers_at,
                        *docs = buf + out->docs_at;
    uint64_t w = (uint64_t)out->width;
    if (mal_data_le64(docs) != 0 || mal_data_le64(docs + 8 * (D - 1)) != S)
        return MAL_ERR(MAL_EFORMAT,
                       "Megatron index %s: its document index must run from 0 to the %" PRIu64
                       " sequences; it runs from %" PRIu64 " to %" PRIu64,
                       path, S, mal_data_le64(docs), mal_data_le64(docs + 8 * (D - 1)));
    /* where the sequences end: the .bin's size */
    uint64_t end = 0;
    if (S > 0) {
        int32_t last_len = get_i32(lens + 4 * (S - 1));
        uint64_t last_ptr = mal_data_le64(ptrs + 8 * (S - 1));
        if (mal_data_le64(ptrs) != 0 || last_len < 0 || last_ptr > UINT64_MAX / 2)
            return MAL_ERR(MAL_EFORMAT,
                           "Megatron index %s is corrupt: its first sequence does not start at "
                           "byte 0, or its last one has a negative length or a wild pointer",
                           path);
        end = last_ptr + (uint64_t)last_len * w;
    }
    if (end > bin_bytes)
        return MAL_ERR(MAL_ECORRUPT,
                       "the token file of Megatron index %s holds %" PRIu64 " bytes but the "
                       "index describes %" PRIu64 ": the .bin is truncated (or the .idx belongs "
                       "to another .bin)",
                       path, bin_bytes, end);
    if (end < bin_bytes)
        return MAL_ERR(MAL_EFORMAT,
                       "the token file of Megatron index %s holds %" PRIu64 " bytes but the "
                       "index describes only %" PRIu64 ": the .idx belongs to another .bin, or "
                       "the .bin was appended to; rebuild the index",
                       path, bin_bytes, end);
    if (!full) return 0;
    /* every sequence starts where the one before it ends, and documents
     * are runs of sequences in order */
    uint64_t at = 0;
    for (uint64_t i = 0; i < S; i++) {
        int32_t l = get_i32(lens + 4 * i);
        if (mal_data_le64(ptrs + 8 * i) != at || l < 0)
            return MAL_ERR(MAL_EFORMAT,
                           "Megatron index %s is corrupt at sequence %" PRIu64 " (pointer %" PRIu64
                           ", length %d; expected pointer %" PRIu64 ")",
                           path, i, mal_data_le64(ptrs + 8 * i), (int)l, at);
        at += (uint64_t)l * w;
    }
    for (uint64_t k = 0; k + 1 < D; k++)
        if (mal_data_le64(docs + 8 * k) > mal_data_le64(docs + 8 * (k + 1)))
            return MAL_ERR(MAL_EFORMAT,
                           "Megatron index %s is corrupt: document %" PRIu64 " starts after "
                           "document %" PRIu64,
                           path, k, k + 1);
    return 0;
}

uint64_t mal_data_doc_start(const mal_data_file *f, uint64_t k)
{
    if (k >= f->idx.n_docs) return f->n_tokens;
    const unsigned char *im = f->idx_map.data;
    uint64_t seq = mal_data_le64(im + f->idx.docs_at + 8 * k);
    if (seq >= f->idx.n_seqs) return f->n_tokens;
    return mal_data_le64(im + f->idx.pointers_at + 8 * seq) / (uint64_t)f->width;
}

/* PREFIX.bin and PREFIX.idx of the item `path` (PREFIX.bin or PREFIX):
 * 1 when `path` names a Megatron dataset (with `format` AUTO: a .bin whose
 * .idx exists, or a prefix whose .bin and .idx do while the prefix itself
 * does not), writing both paths; 0 when it does not. */
static int megatron_paths(const char *path, int format, char **bin, char **idx)
{
    size_t n = strlen(path);
    int has_bin = n > 4 && strcmp(path + n - 4, ".bin") == 0;
    size_t pre = has_bin ? n - 4 : n;
    *bin = malloc(pre + 5);
    *idx = malloc(pre + 5);
    if (!*bin || !*idx) goto no;
    memcpy(*bin, path, pre);
    memcpy(*idx, path, pre);
    strcpy(*bin + pre, ".bin");
    strcpy(*idx + pre, ".idx");
    if (format == MAL_DATA_MEGATRON) return 1;
    if (format != MAL_DATA_AUTO) goto no;
    if (access(*idx, F_OK) == 0 &&
        (has_bin || (access(path, F_OK) != 0 && access(*bin, F_OK) == 0)))
        return 1;
no:
    free(*bin);
    free(*idx);
    *bin = *idx = NULL;
    return 0;
}

static int open_megatron(mal_data_file *f, char *bin, char *idx)
{
    int rc;
    free(f->path);
    f->path = bin;
    f->idx_path = idx;
    f->format = MAL_DATA_MEGATRON;
    if ((rc = mal_file_map_open(&f->map, bin, "token file", MAL_MAP_RANDOM)) ||
        (rc = mal_file_map_open(&f->idx_map, idx, "Megatron index", MAL_MAP_RANDOM)))
        return rc;
    int full = f->idx_map.bytes <= MAL_DATA_SCAN_BYTES;
    if ((rc = mal_data_parse_idx(idx, f->idx_map.data, f->idx_map.bytes, f->map.bytes, full,
                                 &f->idx)))
        return rc;
    if (full) mal_file_map_release(&f->idx_map, 0, f->idx_map.bytes);
    f->width = f->idx.width;
    f->is_signed = f->idx.is_signed;
    f->tok = f->map.data;
    f->n_tokens = f->map.bytes / (uint64_t)f->width;
    if (f->n_tokens == 0)
        return MAL_ERR(MAL_EFORMAT, "token file %s (Megatron index %s) holds no tokens", bin, idx);
    return 0;
}

/* ---- any token file ---------------------------------------------------- */

int mal_data_file_open(mal_data_file *f, const char *path, int format)
{
    int rc;
    size_t start = 0, n = 0;
    memset(f, 0, sizeof *f);
    f->max_token = -1;
    if (!(f->path = strdup(path))) return MAL_ERR(MAL_ENOMEM, "out of memory opening %s", path);
    char *bin = NULL, *idx = NULL;
    if (megatron_paths(path, format, &bin, &idx)) {
        if ((rc = open_megatron(f, bin, idx)) || (rc = mal_data_file_record(f))) goto fail;
        return 0;
    }
    if (format == MAL_DATA_MEGATRON) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory opening %s", path);
        goto fail;
    }
    /* Random advice: training reads windows scattered over the file, and
     * read-ahead around each would bring in pages nobody asked for. */
    if ((rc = mal_file_map_open(&f->map, path, "token file", MAL_MAP_RANDOM))) goto fail;
    if ((rc = mal_data_parse_image(path, format, f->map.data, f->map.bytes, &start, &n, &f->width)))
        goto fail;
    f->format = start ? MAL_DATA_LLMC : f->width == 2 ? MAL_DATA_RAW16 : MAL_DATA_RAW32;
    f->tok = f->map.data + start;
    f->n_tokens = n;
    if ((rc = mal_data_file_record(f))) goto fail;
    return 0;
fail:
    mal_data_file_close(f);
    return rc;
}

/* ---- the record beside a file ------------------------------------------ */

int mal_data_file_record(mal_data_file *f)
{
    size_t n = strlen(f->path), base = n > 4 && !strcmp(f->path + n - 4, ".bin") ? n - 4 : n;
    char *rec = malloc(base + sizeof MAL_DATA_RECORD_SUFFIX);
    json_t *root = NULL;
    int rc = 0;
    if (!rec) return MAL_ERR(MAL_ENOMEM, "out of memory");
    memcpy(rec, f->path, base);
    strcpy(rec + base, MAL_DATA_RECORD_SUFFIX);
    if (access(rec, F_OK) != 0) goto done; /* no record: nothing known beyond the file */
    if ((rc = mal_json_read(rec, "token record", (size_t)1 << 20, MAL_READ_REGULAR, &root)))
        goto done;
    const json_t *nt = json_object_get(root, "n_tokens"), *mx = json_object_get(root, "max_token");
    const json_t *tok = json_object_get(root, "tokenizer");
    const char *format = json_string_value(json_object_get(root, "format"));
    if (!json_is_object(root) || !format || strcmp(format, MAL_DATA_RECORD_FORMAT) != 0 ||
        !json_is_integer(nt) || !json_is_integer(mx) || json_integer_value(mx) < 0 ||
        (tok && !json_is_object(tok))) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "token record %s is not a %s record with n_tokens, max_token and a "
                     "tokenizer object",
                     rec, MAL_DATA_RECORD_FORMAT);
        goto done;
    }
    if ((uint64_t)json_integer_value(nt) != f->n_tokens) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "token record %s describes %lld tokens but %s holds %" PRIu64
                     ": the record is stale (re-run scripts/tokenize_hf.py, or remove it)",
                     rec, (long long)json_integer_value(nt), f->path, f->n_tokens);
        goto done;
    }
    f->max_token = json_integer_value(mx);
    if (tok && !(f->tokenizer = json_dumps(tok, JSON_COMPACT | JSON_SORT_KEYS)))
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", rec);
done:
    json_decref(root);
    free(rec);
    return rc;
}

void mal_data_file_close(mal_data_file *f)
{
    free(f->tokenizer);
    mal_file_unmap(&f->map);
    mal_file_unmap(&f->idx_map);
    free(f->idx_path);
    free(f->mem);
    free(f->path);
    memset(f, 0, sizeof *f);
}

int mal_data_file_scan(mal_data_file *f)
{
    int64_t mx = 0, mn = 0;
    /* In pieces, each dropped from the resident set once read: the scan
     * must not leave the file counted in this process's memory. */
    const uint64_t piece = ((uint64_t)1 << 20) / (uint64_t)f->width;
    for (uint64_t i0 = 0; i0 < f->n_tokens; i0 += piece) {
        uint64_t i1 = MAL_MIN(f->n_tokens, i0 + piece);
        for (uint64_t i = i0; i < i1; i++) {
            int64_t t = mal_data_file_token(f, i);
            if (t > mx) mx = t;
            if (t < mn) mn = t;
        }
        if (f->map.data)
            mal_file_map_release(&f->map, (size_t)(f->tok - f->map.data) + i0 * f->width,
                                 (i1 - i0) * f->width);
    }
    if (mn < 0)
        return MAL_ERR(MAL_EFORMAT,
                       "token file %s holds the negative id %" PRId64 ": it is not a token "
                       "file of this dtype, or it is corrupt",
                       f->path, mn);
    f->max_token = mx;
    return 0;
}
