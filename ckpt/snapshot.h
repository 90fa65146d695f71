/* Training-state snapshots: the complete model and optimizer state plus the
 * progress counters needed to resume exactly, stored as HDF5 in one
 * directory per step and committed atomically (see ckpt/README.md and the
 * comment at the top of ckpt/snapshot.c for the on-disk layout).
 *
 * The API is shard-shaped: every tensor is described by its global shape and
 * the block (offset, extent) that the caller holds.  v0 writes from one
 * process and only whole tensors (offset 0, extent == shape); the sharded MPI
 * writer, where every rank writes its own block and HDF5 virtual datasets
 * present the full tensors, keeps these structures.
 */
#ifndef MAL_SNAPSHOT_H
#define MAL_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#define MAL_SNAP_MAXDIM 4
#define MAL_SNAP_FORMAT "malleus-snapshot"
#define MAL_SNAP_FORMAT_VERSION 1

/* A temporary directory of a writer on another host cannot be checked for a
 * live process; it counts as stale once it is this old. */
#define MAL_SNAP_FOREIGN_STALE_S (6 * 3600)

/* One tensor (or, later, one shard of it).  All memory belongs to the caller. */
typedef struct {
    const char *name; /* HDF5 path in the file, e.g. "param/layers.0.wq", "adam_m/lm_head";
                         '/'-separated, no empty, "." or ".." components */
    int ndim;         /* 1 .. MAL_SNAP_MAXDIM */
    int64_t shape[MAL_SNAP_MAXDIM];  /* global shape, every dimension >= 1 */
    int64_t offset[MAL_SNAP_MAXDIM]; /* this shard's block in the global tensor (v0: zeros) */
    int64_t extent[MAL_SNAP_MAXDIM]; /* block size (v0: == shape) */
    float *data;                     /* host buffer, prod(extent) floats, row-major */
} mal_snap_tensor;

/* Progress counters and the texts that describe the run.  In a snapshot
 * returned by mal_snapshot_meta() the strings belong to the snapshot. */
typedef struct {
    int64_t step;             /* optimizer steps completed (>= 0) */
    int64_t consumed_samples; /* global samples consumed so far (>= 0) */
    uint64_t seed;
    uint64_t rng_counter; /* RNG state beyond the seed (0 if unused) */
    char *config_json;    /* model config as JSON text (NULL: not stored) */
    char *train_json;     /* training hyper-parameters as JSON text (NULL: not stored) */
    char *plan_json;      /* plan the snapshot was written under (NULL in v0 runs without one) */
} mal_snap_meta;

/* Local (one process in v0).  Write a snapshot of the `n` tensors `t` and
 * `meta` as dir/step_%08lld, atomically: everything goes into a temporary
 * directory dir/.tmp-step_%08lld.<pid>@<host>, whose files and the directory
 * itself are fsync'ed; it is renamed to the final name, then the completion
 * marker COMPLETE is written (temp + fsync + rename) LAST, then the pointer
 * file dir/latest is moved (temp + fsync + rename + fsync of dir).  Then
 * retention keeps the snapshot just written plus the newest (highest step)
 * complete snapshots up to `keep_last` in all (0 = keep all), and removes
 * stale temporary directories of dead writers and uncommitted step
 * directories older than this step.  A retention failure is only logged.
 *
 * Creates `dir` (and its parents) if needed.  On failure nothing trusted
 * changes: `latest` and every committed snapshot stay as they were.  Refuses
 * (MAL_EINVAL) to overwrite a committed snapshot of the same step; an
 * uncommitted one is replaced.  `out_path` (may be NULL) receives the final
 * step directory path (`out_len` bytes, MAL_EINVAL if too small).  Reads the
 * caller's buffers only. */
int mal_snapshot_write(const char *dir, const mal_snap_meta *meta, const mal_snap_tensor *t, int n,
                       int keep_last, char *out_path, size_t out_len);

/* Local.  Resolve the newest committed snapshot through dir/latest into
 * `path` (`len` bytes, caller-owned).  MAL_ENOENT if `dir` does not exist or
 * holds no committed snapshot; MAL_ECORRUPT if the pointed-to directory is
 * missing or lacks its COMPLETE marker; MAL_EFORMAT if `latest` is garbled. */
int mal_snapshot_find_latest(const char *dir, char *path, size_t len);

/* An open snapshot for reading; library-owned, freed by mal_snapshot_close(). */
typedef struct mal_snapshot mal_snapshot;

/* Local.  Open the step directory `step_dir`: checks the COMPLETE marker
 * (MAL_ECORRUPT if missing), the format and its version (MAL_EFORMAT),
 * that the tensors in the file are exactly those the marker committed
 * (MAL_ECORRUPT), and reads meta.  Tensor data is read and verified by
 * mal_snapshot_read().  On success *out is owned by the caller until
 * mal_snapshot_close(). */
int mal_snapshot_open(mal_snapshot **out, const char *step_dir);

/* Local.  The snapshot's meta; strings are owned by `s` (valid until close). */
const mal_snap_meta *mal_snapshot_meta(const mal_snapshot *s);

/* Local.  Number of tensors in the snapshot. */
int mal_snapshot_n_tensors(const mal_snapshot *s);

/* Local.  Describe tensor i (0 <= i < n_tensors, in byte-wise name order)
 * into *info: name (owned by `s`), ndim, shape, offset, extent; data = NULL.
 * MAL_EINVAL if i is out of range. */
int mal_snapshot_tensor_info(const mal_snapshot *s, int i, mal_snap_tensor *info);

/* Local.  Read tensor `name` into `data` (caller-owned, room for `n` floats,
 * n >= prod(shape)).  The stored global shape must equal ndim/shape
 * (MAL_EMISMATCH otherwise; MAL_ENOENT if there is no such tensor).  Verifies
 * the stored CRC-32C; on mismatch returns MAL_ECORRUPT with a message naming
 * the file and the tensor (the contents of `data` are then unspecified). */
int mal_snapshot_read(mal_snapshot *s, const char *name, int ndim, const int64_t *shape,
                      float *data, size_t n);

/* Local.  Close the file and free everything `s` owns; NULL is a no-op. */
void mal_snapshot_close(mal_snapshot *s);

/* Fault injection for tests (not thread-safe): when set to N > 0, the Nth
 * of the writer's own I/O steps from now (create, write, fsync, rename)
 * fails with EIO, once.  0 = off. */
extern int mal_snapshot_fault_nth_io;

#endif /* MAL_SNAPSHOT_H */
