/* The index of a snapshot, index.h5: building the block table from the
 * descriptors rank 0 gathered (shards in id order, blocks grouped by
 * tensor and checked to tile each one), writing it (root attributes with
 * the meta, the table as plain datasets under /_malleus, one HDF5 virtual
 * dataset per tensor so stock tools read whole tensors) and loading it
 * back with every count, shape and address checked before it is trusted.
 * It owns the meta (copied, written, read, freed here) and what loading
 * allocates in a mal_snapshot; the read path (snap_read.c) adds its files
 * and buffers on top, the commit (snap_commit.c) writes through it.
 */
#include "snap_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the meta */

static int snap_strdup_opt(char **dst, const char *src)
{
    *dst = NULL;
    if (!src) return 0;
    *dst = strdup(src);
    return *dst ? 0 : MAL_ERR(MAL_ENOMEM, "out of memory");
}

int snap_meta_copy(mal_snap_meta *dst, const mal_snap_meta *src)
{
    /* Every field at once, so that a field added to mal_snap_meta is
     * carried without a line here; then the strings, which stay the
     * caller's, become our own copies (NULL first: a failure half-way
     * leaves nothing of the caller's for snap_meta_free). */
    *dst = *src;
    dst->config_json = dst->train_json = dst->plan_json = NULL;
    int rc;
    if ((rc = snap_strdup_opt(&dst->config_json, src->config_json)) ||
        (rc = snap_strdup_opt(&dst->train_json, src->train_json)) ||
        (rc = snap_strdup_opt(&dst->plan_json, src->plan_json)))
        return rc;
    return 0;
}

void snap_meta_free(mal_snap_meta *m)
{
    free(m->config_json);
    free(m->train_json);
    free(m->plan_json);
    m->config_json = m->train_json = m->plan_json = NULL;
}

/* ---------------------------------------------------------------- building */

static int snap_cmp_shard_id(const void *a, const void *b)
{
    int x = ((const snap_shard *)a)->id, y = ((const snap_shard *)b)->id;
    return (x > y) - (x < y);
}

/* Rank 0, every process done: the gathered shards in id order (unique),
 * the blocks grouped by tensor and checked (see snap_internal.h). */
int snap_index_build(snap_table *t, snap_tinfo **ti_out, int *nt_out, const char *what)
{
    int rc = 0, nt = 0;
    snap_tinfo *ti = NULL;
    char **names = NULL;
    int *remap = NULL;
    *ti_out = NULL;
    *nt_out = 0;

    /* shards in id order, unique; blocks follow their shard's new index */
    remap = malloc(sizeof *remap * ((size_t)t->ns + 1));
    snap_shard *sorted = malloc(sizeof *sorted * ((size_t)t->ns + 1));
    if (!remap || !sorted) {
        free(sorted);
        rc = MAL_ERR(MAL_ENOMEM, "out of memory committing %s", what);
        goto done;
    }
    /* A snapshot without shards (no process wrote a block: meta only) has
     * no shard or block array at all; memcpy and qsort must not see NULL. */
    if (t->ns > 0) memcpy(sorted, t->s, sizeof *sorted * (size_t)t->ns);
    if (t->ns > 1) qsort(sorted, (size_t)t->ns, sizeof *sorted, snap_cmp_shard_id);
    for (int i = 0; i < t->ns; i++) {
        snap_shard key = {NULL, t->s[i].id, 0};
        remap[i] = (int)((snap_shard *)bsearch(&key, sorted, (size_t)t->ns, sizeof *sorted,
                                               snap_cmp_shard_id) -
                         sorted);
    }
    free(t->s); /* the file names now belong to `sorted` */
    t->s = sorted;
    t->cap_s = t->ns;
    for (int i = 0; i + 1 < t->ns; i++)
        if (t->s[i].id == t->s[i + 1].id) {
            rc = MAL_ERR(MAL_EINVAL,
                         "shard %d of the snapshot was written by two processes; give every "
                         "shard a distinct id",
                         t->s[i].id);
            goto done;
        }
    for (int64_t k = 0; k < t->nb; k++)
        t->b[k].shard = remap[t->b[k].shard];

    /* blocks grouped by tensor, in name then offset order */
    if (t->nb > 1) qsort(t->b, (size_t)t->nb, sizeof *t->b, snap_cmp_block);
    ti = calloc((size_t)t->nb + 1, sizeof *ti);
    names = calloc((size_t)t->nb + 1, sizeof *names);
    if (!ti || !names) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory committing %s", what);
        goto done;
    }
    for (int64_t k = 0; k < t->nb;) {
        int64_t e = k + 1;
        while (e < t->nb && !strcmp(t->b[e].name, t->b[k].name))
            e++;
        if ((rc = snap_check_tiling(&t->b[k], e - k, INT64_MAX))) goto done;
        ti[nt] = (snap_tinfo){t->b[k].name, t->b[k].ndim, {0}, k, e - k};
        memcpy(ti[nt].shape, t->b[k].shape, sizeof ti[nt].shape);
        names[nt] = t->b[k].name;
        nt++;
        k = e;
    }
    if ((rc = snap_check_names_disjoint(names, nt))) goto done;

    *ti_out = ti;
    *nt_out = nt;
    ti = NULL;
done:
    free(remap);
    free(ti);
    free(names);
    return rc;
}

/* ---------------------------------------------------------------- writing */

/* Virtual-dataset source names are printf-like patterns: '%' must be doubled. */
static void snap_vds_escape(char *out, size_t len, const char *s)
{
    size_t k = 0;
    for (; *s && k + 2 < len; s++) {
        if (*s == '%') out[k++] = '%';
        out[k++] = *s;
    }
    out[k] = '\0';
}

/* One virtual dataset presenting tensor `ti` whole. */
static int snap_write_vds(hid_t f, hid_t lcpl, const snap_tinfo *ti, const snap_table *t,
                          const char *fpath)
{
    int rc = 0;
    hsize_t dims[MAL_SNAP_MAXDIM];
    for (int d = 0; d < ti->ndim; d++)
        dims[d] = (hsize_t)ti->shape[d];
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), vs = H5Screate_simple(ti->ndim, dims, NULL),
          ds = -1;
    char obj[1100];
    snprintf(obj, sizeof obj, "the virtual dataset of tensor '%s'", ti->name);
    if (dcpl < 0 || vs < 0 || H5Pset_obj_track_times(dcpl, 0) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up %s", fpath, obj);
        goto done;
    }
    for (int64_t k = ti->first; k < ti->first + ti->n; k++) {
        const snap_block *b = &t->b[k];
        hsize_t start[MAL_SNAP_MAXDIM], count[MAL_SNAP_MAXDIM];
        for (int d = 0; d < b->ndim; d++) {
            start[d] = (hsize_t)b->offset[d];
            count[d] = (hsize_t)b->extent[d];
        }
        char dname[1100], esc_d[2300], esc_f[200];
        snap_block_dset(dname, sizeof dname, b->name, b->ndim, b->offset);
        snap_vds_escape(esc_d, sizeof esc_d, dname);
        snap_vds_escape(esc_f, sizeof esc_f, t->s[b->shard].file);
        hid_t src = H5Screate_simple(b->ndim, count, NULL);
        int bad = src < 0 ||
                  H5Sselect_hyperslab(vs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
                  H5Pset_virtual(dcpl, vs, esc_f, esc_d, src) < 0;
        if (src >= 0) H5Sclose(src);
        if (bad) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot map a block into %s", fpath, obj);
            goto done;
        }
    }
    if (H5Sselect_all(vs) < 0 ||
        (ds = H5Dcreate2(f, ti->name, H5T_IEEE_F32LE, vs, lcpl, dcpl, H5P_DEFAULT)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot create %s", fpath, obj);
        goto done;
    }
    int64_t nb = ti->n;
    if ((rc = snap_attr_write(ds, "global_shape", H5T_STD_I64LE, H5T_NATIVE_INT64,
                              (hsize_t)ti->ndim, ti->shape, fpath, obj)) ||
        (rc = snap_attr_write(ds, "n_blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &nb, fpath, obj)))
        goto done;
done:
    if (ds >= 0 && H5Dclose(ds) < 0 && !rc)
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close %s", fpath, obj);
    if (vs >= 0) H5Sclose(vs);
    if (dcpl >= 0) H5Pclose(dcpl);
    return rc;
}

int snap_write_index(const mal_snap_meta *meta, const snap_table *t, const snap_tinfo *ti, int nt,
                     const char *open_path, const char *fpath)
{
    int rc = 0;
    hid_t fapl = -1, f = -1, g = -1, lcpl = -1, str = -1;
    int64_t nb = t->nb, ns = t->ns, n_t = nt;
    hsize_t one;
    void *tmp = NULL;
    if ((fapl = snap_fapl()) < 0 || (str = snap_vlen_str()) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5", fpath);
        goto done;
    }
    if ((rc = snap_file_create(open_path, fpath, fapl, &f))) goto done;
    const char *root = "the root group";
    if ((rc = snap_write_root_attrs(f, meta->step, fpath)) ||
        (rc = snap_attr_write(f, "consumed_samples", H5T_STD_I64LE, H5T_NATIVE_INT64, 0,
                              &meta->consumed_samples, fpath, root)) ||
        (rc = snap_attr_write(f, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0, &meta->seed, fpath,
                              root)) ||
        (rc = snap_attr_write(f, "rng_counter", H5T_STD_U64LE, H5T_NATIVE_UINT64, 0,
                              &meta->rng_counter, fpath, root)) ||
        (rc = snap_attr_write_str(f, "config_json", meta->config_json, fpath)) ||
        (rc = snap_attr_write_str(f, "train_json", meta->train_json, fpath)) ||
        (rc = snap_attr_write_str(f, "plan_json", meta->plan_json, fpath)) ||
        (rc = snap_attr_write(f, "n_tensors", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &n_t, fpath,
                              root)) ||
        (rc = snap_attr_write(f, "n_blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &nb, fpath,
                              root)) ||
        (rc = snap_attr_write(f, "n_shards", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &ns, fpath, root)))
        goto done;

    if ((g = H5Gcreate2(f, SNAP_TABLE, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot create the group %s", fpath, SNAP_TABLE);
        goto done;
    }
    size_t big = (size_t)MAL_MAX(MAL_MAX(nb, ns), nt) + 1;
    tmp = malloc(big * sizeof(int64_t) * MAL_SNAP_MAXDIM);
    if (!tmp) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory writing %s", fpath);
        goto done;
    }
    char **sv = tmp;
    int32_t *i32 = tmp;
    int64_t *i64 = tmp;
    uint64_t *u64 = tmp;
    uint32_t *u32 = tmp;
    hsize_t d2[2] = {0, MAL_SNAP_MAXDIM};
#define TABLE(nm, ft, mt, rank, dims)                                                              \
    if ((rc = snap_table_write(g, nm, ft, mt, rank, dims, tmp, fpath))) goto done
    one = (hsize_t)ns;
    for (int i = 0; i < ns; i++)
        sv[i] = t->s[i].file;
    TABLE("shards", str, str, 1, &one);
    for (int i = 0; i < ns; i++)
        u64[i] = t->s[i].bytes;
    TABLE("shard_bytes", H5T_STD_U64LE, H5T_NATIVE_UINT64, 1, &one);
    one = (hsize_t)nt;
    for (int i = 0; i < nt; i++)
        sv[i] = ti[i].name;
    TABLE("tensors", str, str, 1, &one);
    for (int i = 0; i < nt; i++)
        i32[i] = ti[i].ndim;
    TABLE("tensor_ndim", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &one);
    d2[0] = (hsize_t)nt;
    for (int i = 0; i < nt; i++)
        for (int d = 0; d < MAL_SNAP_MAXDIM; d++)
            i64[i * MAL_SNAP_MAXDIM + d] = d < ti[i].ndim ? ti[i].shape[d] : 1;
    TABLE("tensor_shape", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2);
    for (int i = 0; i < nt; i++)
        i64[i] = ti[i].first;
    TABLE("tensor_first_block", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &one);
    for (int i = 0; i < nt; i++)
        i64[i] = ti[i].n;
    TABLE("tensor_n_blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, &one);
    one = (hsize_t)nb;
    d2[0] = (hsize_t)nb;
    for (int64_t i = 0; i < nb; i++)
        i32[i] = t->b[i].shard;
    TABLE("block_shard", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &one);
    for (int64_t i = 0; i < nb; i++)
        for (int d = 0; d < MAL_SNAP_MAXDIM; d++)
            i64[i * MAL_SNAP_MAXDIM + d] = d < t->b[i].ndim ? t->b[i].offset[d] : 0;
    TABLE("block_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2);
    for (int64_t i = 0; i < nb; i++)
        for (int d = 0; d < MAL_SNAP_MAXDIM; d++)
            i64[i * MAL_SNAP_MAXDIM + d] = d < t->b[i].ndim ? t->b[i].extent[d] : 1;
    TABLE("block_extent", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2);
    for (int64_t i = 0; i < nb; i++)
        u64[i] = t->b[i].addr;
    TABLE("block_addr", H5T_STD_U64LE, H5T_NATIVE_UINT64, 1, &one);
    for (int64_t i = 0; i < nb; i++)
        u32[i] = t->b[i].crc;
    TABLE("block_crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, &one);
#undef TABLE

    lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5 property lists", fpath);
        goto done;
    }
    for (int i = 0; i < nt; i++)
        if ((rc = snap_write_vds(f, lcpl, &ti[i], t, fpath))) goto done;
    if (H5Gclose(g) < 0) {
        g = -1;
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close the group %s", fpath, SNAP_TABLE);
        goto done;
    }
    g = -1;
    rc = snap_h5close(&f, fpath);
done:
    free(tmp);
    if (lcpl >= 0) H5Pclose(lcpl);
    if (g >= 0) H5Gclose(g);
    if (f >= 0) {
        int r = snap_h5close(&f, fpath);
        if (!rc) rc = r;
    }
    if (str >= 0) H5Tclose(str);
    if (fapl >= 0) H5Pclose(fapl);
    return rc;
}

/* ---------------------------------------------------------------- loading */

void snap_index_free(mal_snapshot *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_t; i++)
        free(s->t[i].name);
    for (int i = 0; i < s->n_s; i++)
        free(s->s[i].file);
    free(s->t);
    free(s->b);
    free(s->s);
    free(s->fd);
    snap_meta_free(&s->meta);
    free(s->index_path);
    free(s);
}

/* HDF5's signature, which starts the superblock at offset 0, 512, 1024,
 * 2048, ... of a file. */
static int snap_is_hdf5(const unsigned char *p, size_t len)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (size_t off = 0; off + sizeof sig <= len; off = off ? 2 * off : 512)
        if (!memcmp(p + off, sig, sizeof sig)) return 1;
    return 0;
}

/* Open `len` bytes at `buf` as a read-only HDF5 file in memory (the core
 * driver with a file image, no backing file). */
static hid_t snap_open_image(const void *buf, size_t len, const char *fp)
{
    static unsigned long n_images;
    char name[64];
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
    /* the name only tells open images apart; no file of that name is used */
    snprintf(name, sizeof name, "malleus-index-image-%lu", ++n_images);
    if (fapl < 0 || H5Pset_fapl_core(fapl, 1 << 16, 0) < 0 ||
        H5Pset_file_image(fapl, (void *)(uintptr_t)buf, len) < 0)
        SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5 to read the index from memory", fp);
    else if ((f = H5Fopen(name, H5F_ACC_RDONLY, fapl)) < 0)
        SNAP_H5ERR(MAL_ECORRUPT, "%s: HDF5 cannot open it as a file", fp);
    if (fapl >= 0) H5Pclose(fapl);
    return f;
}

/* The checks of one tensor of a loaded table: its description, every
 * block inside it and inside its shard, the blocks in offset order and
 * tiling it exactly.  0, or a reason in `why`. */
static int snap_check_tensor(const mal_snapshot *s, int i, char *why, size_t len)
{
    const snap_tinfo *t = &s->t[i];
    int64_t total = -1;
    if (t->ndim < 1 || t->ndim > MAL_SNAP_MAXDIM) {
        snprintf(why, len, "ndim %d is outside 1..%d", t->ndim, MAL_SNAP_MAXDIM);
        return -1;
    }
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 1) {
            snprintf(why, len, "a dimension of its shape is %lld", (long long)t->shape[d]);
            return -1;
        }
    if ((total = snap_count(t->ndim, t->shape)) < 0) {
        snprintf(why, len, "its shape has more elements than a snapshot can hold");
        return -1;
    }
    int64_t vol = 0;
    for (int64_t k = t->first; k < t->first + t->n; k++) {
        const snap_block *b = &s->b[k];
        if (b->shard < 0 || b->shard >= s->n_s) {
            snprintf(why, len, "block %lld names shard %d of %d", (long long)(k - t->first),
                     b->shard, s->n_s);
            return -1;
        }
        for (int d = 0; d < t->ndim; d++)
            if (b->offset[d] < 0 || b->extent[d] < 1 || b->offset[d] > t->shape[d] - b->extent[d]) {
                snprintf(why, len, "block %lld lies outside the tensor", (long long)(k - t->first));
                return -1;
            }
        /* inside the shape, so at most `total` elements: no overflow */
        int64_t c = snap_count(t->ndim, b->extent);
        uint64_t bytes = (uint64_t)c * sizeof(float), sb = s->s[b->shard].bytes;
        if (b->addr > sb || bytes > sb - b->addr) {
            snprintf(why, len,
                     "block %lld lies outside its shard file (%llu bytes at %llu of %llu)",
                     (long long)(k - t->first), (unsigned long long)bytes,
                     (unsigned long long)b->addr, (unsigned long long)sb);
            return -1;
        }
        if (c > total - vol) {
            snprintf(why, len, "its blocks hold more elements than its shape");
            return -1;
        }
        vol += c;
        if (k > t->first && snap_cmp_block(&s->b[k - 1], b) >= 0) {
            snprintf(why, len, "its blocks are not in offset order (or one is listed twice)");
            return -1;
        }
    }
    if (vol != total) {
        snprintf(why, len, "its blocks hold %lld of its %lld elements", (long long)vol,
                 (long long)total);
        return -1;
    }
    if (snap_check_tiling(&s->b[t->first], t->n, SNAP_MAX_PAIRWISE_BLOCKS)) {
        snprintf(why, len, "%s", mal_errmsg());
        return -1;
    }
    return 0;
}

/* Read the meta and the block table of the open index `f` (`len` bytes of
 * input, which bounds every count) into s; `fp` names it in messages. */
static int snap_load_tables(mal_snapshot *s, hid_t f, size_t len, const char *fp)
{
    int rc = 0;
    hid_t g = -1;
    char *fmt = NULL, **names = NULL;
    int64_t *i64 = NULL;
    int32_t version = 0;
    int64_t nt = 0, nb = 0, ns = 0;
    size_t big = 0;
    const char *root = "the root group";
    mal_snap_meta *m = &s->meta;
    if ((rc = snap_attr_read_str(f, "format", 0, len, &fmt, fp))) goto done;
    if (strcmp(fmt, MAL_SNAP_FORMAT) != 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: format is \"%.100s\", not \"%s\"", fp, fmt, MAL_SNAP_FORMAT);
        goto done;
    }
    if ((rc = snap_attr_read_int(f, "format_version", H5T_NATIVE_INT32, 0, &version, fp, root)))
        goto done;
    if (version != MAL_SNAP_FORMAT_VERSION) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s: snapshot format_version %d; this build reads version %d only (use the "
                     "malleus version that wrote it)",
                     fp, (int)version, MAL_SNAP_FORMAT_VERSION);
        goto done;
    }
    if ((rc = snap_attr_read_int(f, "step", H5T_NATIVE_INT64, 0, &m->step, fp, root)) ||
        (rc = snap_attr_read_int(f, "consumed_samples", H5T_NATIVE_INT64, 0, &m->consumed_samples,
                                 fp, root)) ||
        (rc = snap_attr_read_int(f, "seed", H5T_NATIVE_UINT64, 0, &m->seed, fp, root)) ||
        (rc = snap_attr_read_int(f, "rng_counter", H5T_NATIVE_UINT64, 0, &m->rng_counter, fp,
                                 root)) ||
        (rc = snap_attr_read_str(f, "config_json", 1, len, &m->config_json, fp)) ||
        (rc = snap_attr_read_str(f, "train_json", 1, len, &m->train_json, fp)) ||
        (rc = snap_attr_read_str(f, "plan_json", 1, len, &m->plan_json, fp)) ||
        (rc = snap_attr_read_int(f, "n_tensors", H5T_NATIVE_INT64, 0, &nt, fp, root)) ||
        (rc = snap_attr_read_int(f, "n_blocks", H5T_NATIVE_INT64, 0, &nb, fp, root)) ||
        (rc = snap_attr_read_int(f, "n_shards", H5T_NATIVE_INT64, 0, &ns, fp, root)))
        goto done;
    if (m->step < 0 || m->consumed_samples < 0) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: step %lld and consumed_samples %lld must be >= 0", fp,
                     (long long)m->step, (long long)m->consumed_samples);
        goto done;
    }
    /* Every count is bounded by what `len` bytes of tables can hold before
     * anything is sized by it (see SNAP_INDEX_BYTES_PER_*). */
    if (nt < 0 || nb < 0 || ns < 0 || nt > (int64_t)(len / SNAP_INDEX_BYTES_PER_TENSOR) ||
        nb > (int64_t)(len / SNAP_INDEX_BYTES_PER_BLOCK) ||
        ns > (int64_t)(len / SNAP_INDEX_BYTES_PER_SHARD) || nt > nb) {
        rc = MAL_ERR(MAL_EFORMAT,
                     "%s: %lld tensors, %lld blocks and %lld shards do not fit an index of %zu "
                     "bytes: not a valid index",
                     fp, (long long)nt, (long long)nb, (long long)ns, len);
        goto done;
    }
    s->t = calloc((size_t)nt + 1, sizeof *s->t);
    s->b = calloc((size_t)nb + 1, sizeof *s->b);
    s->s = calloc((size_t)ns + 1, sizeof *s->s);
    s->fd = malloc(sizeof *s->fd * ((size_t)ns + 1));
    big = (size_t)MAL_MAX(MAL_MAX(nt, nb), ns) + 1;
    i64 = malloc(big * sizeof *i64 * MAL_SNAP_MAXDIM);
    names = calloc(big, sizeof *names);
    if (!s->t || !s->b || !s->s || !s->fd || !i64 || !names) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fp);
        goto done;
    }
    s->n_t = (int)nt;
    s->n_b = nb;
    s->n_s = (int)ns;
    for (int i = 0; i < s->n_s; i++)
        s->fd[i] = -1;
    if ((g = H5Gopen2(f, SNAP_TABLE, H5P_DEFAULT)) < 0) {
        rc = SNAP_H5ERR(MAL_EFORMAT, "%s has no block table (group %s)", fp, SNAP_TABLE);
        goto done;
    }
    int32_t *i32 = (int32_t *)i64;
    uint64_t *u64 = (uint64_t *)i64;
    uint32_t *u32 = (uint32_t *)i64;
    /* shards */
    if ((rc = snap_table_read_str(g, "shards", ns, names, fp))) goto done;
    for (int i = 0; i < s->n_s; i++) {
        s->s[i].file = names[i];
        s->s[i].id = i;
        names[i] = NULL;
    }
    if ((rc = snap_table_read(g, "shard_bytes", H5T_NATIVE_UINT64, ns, 1, u64, fp))) goto done;
    for (int i = 0; i < s->n_s; i++) {
        const char *fn = s->s[i].file;
        s->s[i].bytes = u64[i];
        if (!fn[0] || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..") ||
            strlen(fn) > 255) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: shard file name '%.100s' is not a plain file name", fp,
                         fn);
            goto done;
        }
    }
    /* tensors */
    if ((rc = snap_table_read_str(g, "tensors", nt, names, fp))) goto done;
    for (int i = 0; i < s->n_t; i++) {
        s->t[i].name = names[i];
        names[i] = NULL;
    }
    for (int i = 0; i < s->n_t; i++) {
        /* valid HDF5 paths, strictly increasing: unique and searchable */
        if (snap_check_name(s->t[i].name) ||
            (i > 0 && strcmp(s->t[i - 1].name, s->t[i].name) >= 0)) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: tensor name %d ('%.100s') is %s", fp, i, s->t[i].name,
                         i > 0 && strcmp(s->t[i - 1].name, s->t[i].name) >= 0
                             ? "out of order or repeated"
                             : "not a valid tensor name");
            goto done;
        }
    }
    if ((rc = snap_table_read(g, "tensor_ndim", H5T_NATIVE_INT32, nt, 1, i32, fp))) goto done;
    for (int i = 0; i < s->n_t; i++)
        s->t[i].ndim = i32[i];
    if ((rc = snap_table_read(g, "tensor_shape", H5T_NATIVE_INT64, nt, MAL_SNAP_MAXDIM, i64, fp)))
        goto done;
    for (int i = 0; i < s->n_t; i++)
        memcpy(s->t[i].shape, &i64[i * MAL_SNAP_MAXDIM], sizeof s->t[i].shape);
    if ((rc = snap_table_read(g, "tensor_first_block", H5T_NATIVE_INT64, nt, 1, i64, fp)))
        goto done;
    for (int i = 0; i < s->n_t; i++)
        s->t[i].first = i64[i];
    if ((rc = snap_table_read(g, "tensor_n_blocks", H5T_NATIVE_INT64, nt, 1, i64, fp))) goto done;
    for (int i = 0; i < s->n_t; i++)
        s->t[i].n = i64[i];
    /* blocks */
    if ((rc = snap_table_read(g, "block_shard", H5T_NATIVE_INT32, nb, 1, i32, fp))) goto done;
    for (int64_t k = 0; k < nb; k++)
        s->b[k].shard = i32[k];
    if ((rc = snap_table_read(g, "block_offset", H5T_NATIVE_INT64, nb, MAL_SNAP_MAXDIM, i64, fp)))
        goto done;
    for (int64_t k = 0; k < nb; k++)
        memcpy(s->b[k].offset, &i64[k * MAL_SNAP_MAXDIM], sizeof s->b[k].offset);
    if ((rc = snap_table_read(g, "block_extent", H5T_NATIVE_INT64, nb, MAL_SNAP_MAXDIM, i64, fp)))
        goto done;
    for (int64_t k = 0; k < nb; k++)
        memcpy(s->b[k].extent, &i64[k * MAL_SNAP_MAXDIM], sizeof s->b[k].extent);
    if ((rc = snap_table_read(g, "block_addr", H5T_NATIVE_UINT64, nb, 1, u64, fp))) goto done;
    for (int64_t k = 0; k < nb; k++)
        s->b[k].addr = u64[k];
    if ((rc = snap_table_read(g, "block_crc32c", H5T_NATIVE_UINT32, nb, 1, u32, fp))) goto done;
    for (int64_t k = 0; k < nb; k++)
        s->b[k].crc = u32[k];

    /* Consistency: an index that passed its marker's checksum can still be
     * hand-made or come from anywhere; nothing below trusts it unchecked.
     * Tensor i's blocks are rows first .. first+n-1, right after tensor
     * i-1's, and every block belongs to a tensor. */
    int64_t next = 0;
    for (int i = 0; i < s->n_t; i++) {
        snap_tinfo *t = &s->t[i];
        char why[700];
        if (t->first != next || t->n < 1 || t->n > nb - t->first) {
            rc = MAL_ERR(MAL_EFORMAT,
                         "%s: the block table of tensor '%s' is inconsistent: its blocks are "
                         "rows %lld.. (%lld of them) of %lld",
                         fp, t->name, (long long)t->first, (long long)t->n, (long long)nb);
            goto done;
        }
        for (int64_t k = t->first; k < t->first + t->n; k++) {
            snap_block *b = &s->b[k];
            b->name = t->name;
            b->ndim = t->ndim;
            memcpy(b->shape, t->shape, sizeof b->shape);
        }
        if (snap_check_tensor(s, i, why, sizeof why)) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: the block table of tensor '%s' is inconsistent: %s", fp,
                         t->name, why);
            goto done;
        }
        next = t->first + t->n;
    }
    if (next != nb) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: the block table lists blocks of no tensor", fp);
        goto done;
    }
done:
    if (names)
        for (size_t i = 0; i < big; i++)
            free(names[i]);
    free(names);
    free(i64);
    free(fmt);
    if (g >= 0) H5Gclose(g);
    return rc;
}

int mal_snapshot_parse_index(mal_snapshot **out, const void *buf, size_t len, const char *what)
{
    if (!out || (!buf && len) || !what)
        return MAL_ERR(MAL_EINVAL, "mal_snapshot_parse_index: NULL argument");
    *out = NULL;
    snap_h5quiet q;
    snap_h5quiet_begin(&q);
    int rc = 0;
    hid_t f = -1;
    mal_snapshot *s = calloc(1, sizeof *s);
    if (!s || !(s->index_path = strdup(what))) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", what);
        goto done;
    }
    if (len > SNAP_MAX_INDEX_BYTES) {
        rc = MAL_ERR(MAL_ECORRUPT, "%s is larger than %zu bytes: not a snapshot index", what,
                     (size_t)SNAP_MAX_INDEX_BYTES);
        goto done;
    }
    if (!snap_is_hdf5(buf, len)) {
        rc = MAL_ERR(MAL_ECORRUPT, "%s is not an HDF5 file; resume from an earlier snapshot", what);
        goto done;
    }
    if ((f = snap_open_image(buf, len, what)) < 0) {
        rc = MAL_ECORRUPT;
        goto done;
    }
    if ((rc = snap_load_tables(s, f, len, what))) goto done;
    *out = s;
    s = NULL;
done:
    if (f >= 0) H5Fclose(f);
    /* nothing of the read path's is in s yet: the index's part is all */
    snap_index_free(s);
    snap_h5quiet_end(&q);
    return rc;
}
