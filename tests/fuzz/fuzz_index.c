/* libFuzzer harness: the snapshot index parser (ckpt/,
 * mal_snapshot_parse_index: the meta attributes and the block table of an
 * index.h5, every count and size bounded, every block checked against its
 * tensor and shard).
 *
 * Structure-aware: the fuzz bytes describe the *contents* of an index --
 * which attributes and tables exist, with which HDF5 type, dataspace and
 * values -- and the harness writes that as a well-formed HDF5 file in
 * memory, then hands its bytes to the parser.  Raw mutated HDF5 bytes
 * would mostly exercise HDF5's own file-format decoder, which the real
 * path never shows unverified bytes (mal_snapshot_open parses an index
 * only after its size and CRC-32C match the COMPLETE marker), and which is
 * not memory-safe on crafted files (tests/fuzz/README.md).  What survives
 * the checksum is a well-formed file with hostile contents: a hand-made or
 * buggy writer's; that is what this harness generates.
 *
 * Input: records, until the bytes run out.  A record is
 *   object  (byte, mod 24): 0-11 the root attributes format,
 *           format_version, step, consumed_samples, seed, rng_counter,
 *           config_json, train_json, plan_json, n_tensors, n_blocks,
 *           n_shards; 12-23 the tables under /_malleus: shards,
 *           shard_bytes, tensors, tensor_ndim, tensor_shape,
 *           tensor_first_block, tensor_n_blocks, block_shard,
 *           block_offset, block_extent, block_addr, block_crc32c
 *   type    (byte, mod 7): int32, int64, uint64, uint32, float64,
 *           variable-length string, fixed-length string (its size: the
 *           next byte, 1..256)
 *   rows    (byte): 0 = a scalar (attributes) or no rows (tables)
 *   cols    (byte, mod 9): 0 = one-dimensional, else a second dimension
 *   values  max(rows,1) x max(cols,1) of them: numbers as zigzag LEB128
 *           varints, strings as a length byte and that many bytes
 * An object named twice keeps its first record.  tests/fuzz/index_seeds.py
 * writes the seed corpus (valid indexes) in this encoding. */
#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const objects[24] = {
    "format",        "format_version",     "step",            "consumed_samples",
    "seed",          "rng_counter",        "config_json",     "train_json",
    "plan_json",     "n_tensors",          "n_blocks",        "n_shards",
    "shards",        "shard_bytes",        "tensors",         "tensor_ndim",
    "tensor_shape",  "tensor_first_block", "tensor_n_blocks", "block_shard",
    "block_offset",  "block_extent",       "block_addr",      "block_crc32c"};

typedef struct {
    const uint8_t *p, *end;
} reader;

static unsigned get_byte(reader *r) { return r->p < r->end ? *r->p++ : 0; }

/* A zigzag LEB128 varint (small magnitudes in one byte). */
static int64_t get_int(reader *r)
{
    uint64_t u = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        unsigned b = get_byte(r);
        u |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

/* Write one object described at r into the file f (group g for tables). */
static void put_object(reader *r, hid_t f, hid_t *g, int *made)
{
    int obj = (int)(get_byte(r) % 24);
    int type = (int)(get_byte(r) % 7);
    size_t fixed = type == 6 ? get_byte(r) + 1 : 0;
    hsize_t dims[2] = {get_byte(r), get_byte(r) % 9};
    int rank = dims[1] ? 2 : 1;
    size_t n = (size_t)(dims[0] ? dims[0] : 1) * (size_t)(dims[1] ? dims[1] : 1);
    int is_table = obj >= 12;

    /* The values, in the memory type of the file type. */
    hid_t t = -1;
    void *buf = NULL;
    char **strs = NULL;
    if (type == 5 || type == 6) {
        t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, type == 5 ? H5T_VARIABLE : fixed);
        strs = calloc(n, sizeof *strs);
        char *flat = type == 6 ? calloc(n, fixed) : NULL;
        for (size_t i = 0; i < n; i++) {
            size_t len = get_byte(r);
            strs[i] = calloc(len + 1, 1);
            for (size_t k = 0; k < len; k++)
                strs[i][k] = (char)get_byte(r);
            if (flat) memcpy(flat + i * fixed, strs[i], len < fixed ? len : fixed);
        }
        buf = flat ? (void *)flat : (void *)strs;
    } else {
        t = H5Tcopy(type == 0   ? H5T_NATIVE_INT32
                    : type == 1 ? H5T_NATIVE_INT64
                    : type == 2 ? H5T_NATIVE_UINT64
                    : type == 3 ? H5T_NATIVE_UINT32
                                : H5T_NATIVE_DOUBLE);
        size_t esz = H5Tget_size(t);
        buf = calloc(n, esz);
        for (size_t i = 0; i < n; i++) {
            int64_t v = get_int(r);
            switch (type) {
            case 0: ((int32_t *)buf)[i] = (int32_t)v; break;
            case 1: ((int64_t *)buf)[i] = v; break;
            case 2: ((uint64_t *)buf)[i] = (uint64_t)v; break;
            case 3: ((uint32_t *)buf)[i] = (uint32_t)v; break;
            default: ((double *)buf)[i] = (double)v; break;
            }
        }
    }
    if (made[obj]) goto done; /* first record wins */
    made[obj] = 1;
    if (is_table) {
        if (*g < 0) *g = H5Gcreate2(f, "_malleus", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hid_t sp = H5Screate_simple(rank, dims, NULL);
        hid_t ds = H5Dcreate2(*g, objects[obj], t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (ds >= 0 && dims[0] > 0) H5Dwrite(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        if (ds >= 0) H5Dclose(ds);
        H5Sclose(sp);
    } else {
        hid_t sp = dims[0] ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, objects[obj], t, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) H5Awrite(a, t, buf);
        if (a >= 0) H5Aclose(a);
        H5Sclose(sp);
    }
done:
    if (strs)
        for (size_t i = 0; i < n; i++)
            free(strs[i]);
    if (buf != (void *)strs) free(buf);
    free(strs);
    H5Tclose(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned long n_files;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* HDF5 keeps what it frees for reuse: otherwise each file's metadata
     * cache (hundreds of KiB) is a fresh mmap under AddressSanitizer, and
     * the page faults halved the executions per second. */
    if (n_files == 0) H5set_free_list_limits(-1, -1, -1, -1, -1, -1);

    /* The index as an HDF5 file in memory (core driver, no backing file). */
    char name[64];
    snprintf(name, sizeof name, "fuzz-index-%lu", ++n_files);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 16, 0);
    hid_t f = H5Fcreate(name, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) abort();
    hid_t g = -1;
    int made[24] = {0};
    reader r = {data, data + size};
    while (r.p < r.end)
        put_object(&r, f, &g, made);
    if (g >= 0) H5Gclose(g);
    H5Fflush(f, H5F_SCOPE_GLOBAL);
    ssize_t len = H5Fget_file_image(f, NULL, 0);
    if (len <= 0) abort();
    void *img = malloc((size_t)len);
    if (!img || H5Fget_file_image(f, img, (size_t)len) != len) abort();
    H5Fclose(f);

    mal_snapshot *s = NULL;
    if (mal_snapshot_parse_index(&s, img, (size_t)len, "fuzz") == 0) {
        /* What was accepted describes tensors its blocks tile. */
        (void)mal_snapshot_meta(s);
        int nt = mal_snapshot_n_tensors(s);
        for (int i = 0; i < nt; i++) {
            mal_snap_tensor t, b;
            if (mal_snapshot_tensor_info(s, i, &t)) abort();
            int nb = mal_snapshot_n_blocks(s, i);
            if (nb < 1) abort();
            for (int k = 0; k < nb; k++) {
                const char *file;
                if (mal_snapshot_block_info(s, i, k, &b, &file) || !file || !file[0]) abort();
                for (int d = 0; d < t.ndim; d++)
                    if (b.offset[d] < 0 || b.extent[d] < 1 ||
                        b.offset[d] > t.shape[d] - b.extent[d])
                        abort();
            }
        }
        mal_snapshot_close(s);
    }
    free(img);
    return 0;
}
