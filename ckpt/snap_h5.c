/* HDF5 plumbing of the snapshot files: silencing HDF5's error stack while
 * the library runs, converting HDF5 failures into MAL_E* errors with
 * HDF5's own reason, the file access and creation property lists,
 * attributes (integers and strings, written and read back with type and
 * size checks) and the plain datasets of the block table.  Everything here
 * is format-neutral: what goes where is decided by snap_write.c and
 * snap_index.c.
 */
#include "snap_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- HDF5 errors */

/* HDF5 prints its error stack on stderr by default; every public function
 * silences it for its own duration and restores the caller's setting, so
 * other code in the process keeps whatever it chose. */
void snap_h5quiet_begin(snap_h5quiet *q)
{
    if (H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data) < 0) {
        q->func = NULL;
        q->data = NULL;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void snap_h5quiet_end(snap_h5quiet *q)
{
    H5Eset_auto2(H5E_DEFAULT, q->func, q->data);
}

static herr_t snap_h5walk(unsigned n, const H5E_error2_t *e, void *data)
{
    /* walked upward: entry 0 is the innermost, most specific failure */
    if (n == 0 && e->desc) snprintf(data, 320, "%s", e->desc);
    return 0;
}

/* Record `fmt` plus the innermost HDF5 reason.  Must be called right after
 * the failing HDF5 call: the next API call clears the error stack. */
int snap_h5err_at(const char *file, int line, int code, const char *fmt, ...)
{
    char msg[640], why[320] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, snap_h5walk, why);
    if (why[0]) return mal_seterr_at(file, line, code, "%s (HDF5: %s)", msg, why);
    return mal_seterr_at(file, line, code, "%s", msg);
}

int mal_snapshot_library_init(void)
{
    if (H5open() < 0) return SNAP_H5ERR(MAL_EIO, "cannot start the HDF5 library");
    return 0;
}

int snap_h5close(hid_t *f, const char *fpath)
{
    hid_t id = *f;
    *f = -1; /* never retried: after a failed close the id is unusable */
    if (H5Fclose(id) < 0)
        return SNAP_H5ERR(MAL_EIO, "cannot close snapshot file %s (its metadata may be lost)",
                          fpath);
    return 0;
}

/* ---------------------------------------------------------------- HDF5 attributes */

hid_t snap_fapl(void)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    /* The library is the parallel build, but every snapshot file is
     * written by one process: the plain POSIX driver, which needs no
     * communication layer started.  STRONG close makes H5Fclose
     * really close the file, so the fsync that follows sees all data. */
    if (H5Pset_fapl_sec2(fapl) < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        H5Pclose(fapl);
        return -1;
    }
#if H5_VERSION_GE(1, 10, 7)
    /* Parallel file systems often lack flock(); do not fail because of it. */
    H5Pset_file_locking(fapl, 1, 1);
#endif
    return fapl;
}

/* Write attribute `name` on `loc` (scalar when count == 0). */
int snap_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, hsize_t count,
                    const void *buf, const char *fpath, const char *obj)
{
    int rc = 0;
    hid_t sp = count ? H5Screate_simple(1, &count, NULL) : H5Screate(H5S_SCALAR), a = -1;
    if (sp < 0) goto fail;
    a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, mtype, buf) < 0) goto fail;
    goto done;
fail:
    rc = SNAP_H5ERR(MAL_EIO, "%s: cannot write attribute '%s' of %s", fpath, name, obj);
done:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

int snap_attr_write_str(hid_t loc, const char *name, const char *s, const char *fpath)
{
    if (!s) return 0; /* NULL: attribute absent */
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        int rc = SNAP_H5ERR(MAL_EIO, "%s: cannot make a string type", fpath);
        if (t >= 0) H5Tclose(t);
        return rc;
    }
    int rc = snap_attr_write(loc, name, t, t, 0, &s, fpath, "the root group");
    H5Tclose(t);
    return rc;
}

/* Read integer attribute `name` of exactly `count` elements (count 0: a
 * scalar or 1 element), converted to `mtype`. */
int snap_attr_read_int(hid_t loc, const char *name, hid_t mtype, int count, void *buf,
                       const char *fpath, const char *obj)
{
    int rc = 0;
    hid_t a = -1, sp = -1, ft = -1;
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0)
        return SNAP_H5ERR(MAL_EIO, "%s: cannot look up attribute '%s' of %s", fpath, name, obj);
    if (!ex)
        return MAL_ERR(MAL_EFORMAT, "%s: %s has no attribute '%s': not a malleus snapshot?", fpath,
                       obj, name);
    a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0 || (sp = H5Aget_space(a)) < 0 || (ft = H5Aget_type(a)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot open attribute '%s' of %s", fpath, name, obj);
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    if (H5Tget_class(ft) != H5T_INTEGER || np != (count ? count : 1)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: attribute '%s' of %s is not %d integer(s)", fpath, name, obj,
                     count ? count : 1);
        goto done;
    }
    if (H5Aread(a, mtype, buf) < 0)
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read attribute '%s' of %s", fpath, name, obj);
done:
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Read string attribute `name` of the root group into a malloc'ed *out;
 * absent gives NULL when `optional`.  Exactly one string of at most `max`
 * bytes: HDF5 writes every element of an attribute into the buffer. */
int snap_attr_read_str(hid_t loc, const char *name, int optional, size_t max, char **out,
                       const char *fpath)
{
    int rc = 0;
    hid_t a = -1, ft = -1, mt = -1, sp = -1;
    *out = NULL;
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0) return SNAP_H5ERR(MAL_EIO, "%s: cannot look up root attribute '%s'", fpath, name);
    if (!ex)
        return optional ? 0
                        : MAL_ERR(MAL_EFORMAT,
                                  "%s: root attribute '%s' is missing: not a malleus snapshot",
                                  fpath, name);
    a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0 || (ft = H5Aget_type(a)) < 0) {
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot open root attribute '%s'", fpath, name);
        goto done;
    }
    if (H5Tget_class(ft) != H5T_STRING || (sp = H5Aget_space(a)) < 0 ||
        H5Sget_simple_extent_npoints(sp) != 1) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: root attribute '%s' is not one string", fpath, name);
        goto done;
    }
    if (H5Tis_variable_str(ft) > 0) {
        char *s = NULL;
        mt = H5Tcopy(H5T_C_S1);
        if (mt < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 || H5Tset_cset(mt, H5Tget_cset(ft)) < 0 ||
            H5Aread(a, mt, &s) < 0) {
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read root attribute '%s'", fpath, name);
            goto done;
        }
        *out = strdup(s ? s : "");
        H5free_memory(s);
    } else {
        /* fixed-length (e.g. written by another tool): read as stored */
        size_t sz = H5Tget_size(ft);
        if (sz == 0 || sz > max) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: root attribute '%s' claims %zu bytes", fpath, name, sz);
            goto done;
        }
        char *s = calloc(sz + 1, 1);
        if (!s) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
            goto done;
        }
        if (H5Aread(a, ft, s) < 0) {
            free(s);
            rc = SNAP_H5ERR(MAL_EIO, "%s: cannot read root attribute '%s'", fpath, name);
            goto done;
        }
        *out = s;
    }
    if (!*out) rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
done:
    if (sp >= 0) H5Sclose(sp);
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    if (a >= 0) H5Aclose(a);
    return rc;
}

/* Common root attributes of index and shard files. */
int snap_write_root_attrs(hid_t f, int64_t step, const char *fpath)
{
    int32_t version = MAL_SNAP_FORMAT_VERSION;
    int rc;
    if ((rc = snap_attr_write_str(f, "format", MAL_SNAP_FORMAT, fpath)) ||
        (rc = snap_attr_write(f, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, &version,
                              fpath, "the root group")) ||
        (rc = snap_attr_write(f, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, &step, fpath,
                              "the root group")))
        return rc;
    return 0;
}

/* Property lists shared by the writers: intermediate groups created on the
 * way; datasets contiguous and allocated at creation (one byte range each,
 * addressable with H5Dget_offset, usable as virtual-dataset sources), never
 * filled (every byte gets written), no timestamps (equal state gives equal
 * files). */
int snap_plists(hid_t *lcpl, hid_t *dcpl, const char *fpath)
{
    *lcpl = H5Pcreate(H5P_LINK_CREATE);
    *dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (*lcpl < 0 || *dcpl < 0 || H5Pset_create_intermediate_group(*lcpl, 1) < 0 ||
        H5Pset_layout(*dcpl, H5D_CONTIGUOUS) < 0 ||
        H5Pset_alloc_time(*dcpl, H5D_ALLOC_TIME_EARLY) < 0 ||
        H5Pset_fill_time(*dcpl, H5D_FILL_TIME_NEVER) < 0 || H5Pset_obj_track_times(*dcpl, 0) < 0)
        return SNAP_H5ERR(MAL_EIO, "%s: cannot set up HDF5 property lists", fpath);
    return 0;
}

/* Create HDF5 file `open_path` (it must not exist) with access list fapl;
 * the fault-injection hook can fail it like a full disk. */
int snap_file_create(const char *open_path, const char *fpath, hid_t fapl, hid_t *f)
{
    if (snap_fault())
        return MAL_ERR(MAL_EIO, "cannot create snapshot file %s: %s", fpath, strerror(errno));
    if ((*f = H5Fcreate(open_path, H5F_ACC_EXCL, H5P_DEFAULT, fapl)) < 0)
        return SNAP_H5ERR(MAL_EIO, "cannot create snapshot file %s", fpath);
    return 0;
}

int snap_table_write(hid_t g, const char *name, hid_t ftype, hid_t mtype, int rank,
                     const hsize_t *dims, const void *buf, const char *fpath)
{
    int rc = 0;
    hid_t sp = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE), ds = -1;
    if (sp < 0 || dcpl < 0 || H5Pset_obj_track_times(dcpl, 0) < 0) goto fail;
    ds = H5Dcreate2(g, name, ftype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (ds < 0) goto fail;
    if (dims[0] > 0 && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) goto fail;
    goto done;
fail:
    rc = SNAP_H5ERR(MAL_EIO, "%s: cannot write the block table '%s/%s'", fpath, SNAP_TABLE, name);
done:
    if (ds >= 0 && H5Dclose(ds) < 0 && !rc)
        rc = SNAP_H5ERR(MAL_EIO, "%s: cannot close '%s/%s'", fpath, SNAP_TABLE, name);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

hid_t snap_vlen_str(void)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t >= 0 && (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0)) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* Read table `name` of exactly `count` rows (of `width` values) into buf. */
int snap_table_read(hid_t g, const char *name, hid_t mtype, int64_t count, int width, void *buf,
                    const char *fpath)
{
    int rc = 0;
    hid_t ds = H5Dopen2(g, name, H5P_DEFAULT), sp = -1;
    if (ds < 0 || (sp = H5Dget_space(ds)) < 0) {
        rc = SNAP_H5ERR(MAL_EFORMAT, "%s: the block table '%s/%s' is missing", fpath, SNAP_TABLE,
                        name);
        goto done;
    }
    hsize_t dims[2] = {0, 1};
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd != (width > 1 ? 2 : 1) || H5Sget_simple_extent_dims(sp, dims, NULL) != nd ||
        dims[0] != (hsize_t)count || (width > 1 && dims[1] != (hsize_t)width)) {
        rc = MAL_ERR(MAL_EFORMAT, "%s: the block table '%s/%s' has the wrong size", fpath,
                     SNAP_TABLE, name);
        goto done;
    }
    if (count > 0 && H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        rc =
            SNAP_H5ERR(MAL_EIO, "%s: cannot read the block table '%s/%s'", fpath, SNAP_TABLE, name);
done:
    if (sp >= 0) H5Sclose(sp);
    if (ds >= 0) H5Dclose(ds);
    return rc;
}

/* Strings of a table: malloc'ed copies into out[count]. */
int snap_table_read_str(hid_t g, const char *name, int64_t count, char **out, const char *fpath)
{
    hid_t str = snap_vlen_str();
    char **tmp = calloc((size_t)count + 1, sizeof *tmp);
    int rc = 0;
    if (str < 0 || !tmp) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
        goto done;
    }
    if ((rc = snap_table_read(g, name, str, count, 1, tmp, fpath))) goto done;
    for (int64_t i = 0; i < count; i++)
        if (!(out[i] = strdup(tmp[i] ? tmp[i] : ""))) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", fpath);
            break;
        }
    for (int64_t i = 0; i < count; i++)
        H5free_memory(tmp[i]);
done:
    free(tmp);
    if (str >= 0) H5Tclose(str);
    return rc;
}
