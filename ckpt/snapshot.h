/* Training-state snapshots: the complete model and optimizer state plus the
 * progress counters needed to resume exactly, stored as HDF5 in one
 * directory per step, written by many processes at once and committed
 * atomically (ckpt/README.md and the comment at the top of
 * ckpt/snap_internal.h describe the on-disk layout, format version 2; that
 * header also lists which ckpt/snap_*.c file implements what).
 *
 * A snapshot holds named float32 tensors ("param/layers.0.wq",
 * "adam_m/lm_head", ...).  Writers store *blocks*: hyper-rectangles (offset,
 * extent) of a tensor's global shape; every process writes the blocks it owns
 * into its own shard file(s), and the blocks of each tensor must tile it
 * exactly (every element stored once).  Readers ask for any block of any
 * tensor and get it assembled from the stored blocks it touches, each
 * verified against its CRC-32C; stock HDF5 tools read whole tensors through
 * the virtual datasets of the index file.
 */
#ifndef MAL_SNAPSHOT_H
#define MAL_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

#define MAL_SNAP_MAXDIM 4
#define MAL_SNAP_FORMAT "malleus-snapshot"
#define MAL_SNAP_FORMAT_VERSION 2

/* A temporary directory of a writer on another host cannot be checked for a
 * live process; it counts as stale once it is this old. */
#define MAL_SNAP_FOREIGN_STALE_S (6 * 3600)

/* Readers stream stored blocks through a buffer of this many bytes, so a
 * read needs this much memory besides the caller's buffer, whatever the
 * size of the stored blocks. */
#define MAL_SNAP_READ_CHUNK_BYTES ((size_t)8 << 20)

/* One block of a tensor.  All memory belongs to the caller. */
typedef struct {
    const char *name; /* tensor name, an HDF5 path: "param/layers.0.wq"; '/'-separated, no
                         empty, "." or ".." components; the first component may not be
                         "_malleus" (reserved) */
    int ndim;         /* 1 .. MAL_SNAP_MAXDIM */
    int64_t shape[MAL_SNAP_MAXDIM];  /* global shape of the tensor, every dimension >= 1 */
    int64_t offset[MAL_SNAP_MAXDIM]; /* the block's corner in the global tensor */
    int64_t extent[MAL_SNAP_MAXDIM]; /* the block's size, every dimension >= 1 */
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
    char *plan_json;      /* plan the snapshot was written under (NULL: not stored) */
} mal_snap_meta;

/* ------------------------------------------------------------------ threads */

/* HDF5 here is built without thread safety (Debian's parallel HDF5 cannot
 * be both), so the functions of this header are called by one thread at a
 * time: a program that writes snapshots from a thread of its own (the
 * trainer's background writer, train/ckpt_async.c) calls none of them
 * from any other thread while that thread runs, and the test hooks below
 * are not thread-safe either.
 *
 * Local.  Start the libraries the snapshot code uses (H5open) on the
 * calling thread; idempotent.  HDF5's start-up registers with MPI (a
 * callback at MPI_Finalize), so a program whose first snapshot call may
 * run on another thread calls this first from the thread that started
 * the communication layer. */
int mal_snapshot_library_init(void);

/* ------------------------------------------------------------------ writing */

/* A snapshot being written; library-owned, freed by mal_snap_writer_finish. */
typedef struct mal_snap_writer mal_snap_writer;

/* Collective over `comm` (NULL: this process alone, no MPI needed).  Start
 * writing the snapshot of step meta->step into dir/step_%08lld: rank 0
 * checks the arguments, creates `dir` (and parents) if needed, refuses
 * (MAL_EINVAL) when a committed snapshot of that step exists there, removes
 * an uncommitted one, creates the temporary directory
 * dir/.tmp-step_%08lld.<random>.<pid>@<host> and broadcasts its name;
 * every file of the snapshot is then created relative to a descriptor of
 * it, O_CREAT|O_EXCL|O_NOFOLLOW.  Every process
 * passes the same dir and meta (rank 0's strings are stored).  On failure
 * every process gets the same error code and nothing was created; on
 * success *out belongs to the library until mal_snap_writer_finish. */
int mal_snap_writer_begin(mal_snap_writer **out, mal_comm *comm, const char *dir,
                          const mal_snap_meta *meta);

/* Local.  Declare shard file `shard` (shard_%05d.h5; the id must be unique
 * over all processes of this snapshot, e.g. the rank whose blocks it holds)
 * and the `n` blocks it will hold (their data pointers are ignored; the
 * caller's strings and arrays are copied).  Creates the file's HDF5
 * skeleton with the space of every block allocated.  Returns a handle >= 0
 * for mal_snap_writer_put, or a negative MAL_E* code. */
int mal_snap_writer_add_shard(mal_snap_writer *w, int shard, const mal_snap_tensor *blocks, int n);

/* Local.  Append `n` floats (row-major order of the block) to block `block`
 * (index into the declaration) of shard handle `h`.  A block's data may
 * come in any number of pieces, in order; blocks may be written in any
 * order and interleaved.  The CRC-32C is computed on the way.  Reads the
 * caller's buffer only. */
int mal_snap_writer_put(mal_snap_writer *w, int h, int block, const float *data, size_t n);

/* Collective over the writer's comm; every process must call it exactly
 * once after a successful begin, whatever happened since: `local_rc` is
 * the caller's own failure (0 if none), which fails the snapshot on every
 * process.  Checks that every declared block is complete, fsyncs the shard
 * files, gathers the block descriptors at rank 0, which checks that the
 * blocks of every tensor tile it exactly, writes index.h5 (meta, block
 * table, one HDF5 virtual dataset per tensor), fsyncs it and the
 * directory, renames the temporary directory to step_%08lld, writes the
 * COMPLETE marker (temporary file, fsync, rename) and only then moves
 * dir/latest; then retention keeps the snapshot just written plus the
 * newest complete ones up to `keep_last` in all (0 = all) and removes
 * debris of dead writers (a retention failure is only logged).
 *
 * Returns the same code on every process: 0, or the first failing rank's
 * code with its message (prefixed "rank N:" elsewhere).  On failure nothing
 * trusted changed: `latest` and every committed snapshot stay as they were,
 * and the directories begin created for `dir` (mkdir -p) are removed again
 * while empty, so a failed first snapshot leaves no empty `dir` behind.
 * `out_path` (may be NULL; `out_len` bytes) receives the final step
 * directory.  Frees `w`. */
int mal_snap_writer_finish(mal_snap_writer *w, int local_rc, int keep_last, char *out_path,
                           size_t out_len);

/* Collective over `comm` (NULL: local).  Write the blocks `t` (n of them;
 * this process's share, whole or partial tensors) as one shard file named
 * after the caller's rank, then commit as mal_snap_writer_finish does.
 * With comm NULL this is the one-process snapshot. */
int mal_snapshot_write_sharded(mal_comm *comm, const char *dir, const mal_snap_meta *meta,
                               const mal_snap_tensor *t, int n, int keep_last, char *out_path,
                               size_t out_len);

/* Local.  mal_snapshot_write_sharded(NULL, ...): one process writes every
 * block (whole tensors, or blocks that tile them). */
int mal_snapshot_write(const char *dir, const mal_snap_meta *meta, const mal_snap_tensor *t, int n,
                       int keep_last, char *out_path, size_t out_len);

/* ------------------------------------------------------------------ finding */

/* What a snapshot directory holds (mal_snapshot_scan).  A step_N entry
 * counts only when it is a directory itself (lstat: another run's snapshot
 * linked in is not this directory's); it is *committed* when its COMPLETE
 * marker parses and names step N, and *marked* when it holds a COMPLETE
 * entry at all (committed, damaged, or of a newer format): a marked
 * snapshot is one that no writer may replace and no new run may bury. */
#define MAL_SNAP_SCAN_LIST 8
typedef struct {
    int n_steps;            /* step_N directories, committed or not */
    int n_committed;        /* committed ones */
    int64_t newest;         /* the newest committed step (-1: none) */
    char newest_name[64];   /* its entry name */
    int n_marked;           /* marked ones */
    int64_t newest_marked;  /* -1: none */
    int n_after;            /* marked ones with a step above `after` */
    int64_t newest_after;   /* -1: none */
    char newest_after_name[64];
    int64_t latest;         /* the step `latest` names, when it is a regular file that names
                             * one (-1: absent or unusable); only a hint */
    int n_foreign;          /* step_* / .tmp-* entries that are not what Malleus writes (a
                             * link, a FIFO, a file where a directory belongs): reported on
                             * stderr and left alone */
    int n_foreign_after;    /* of them, step_N names with N above `after`: a writer of step
                             * N cannot write there */
    char foreign_after_name[64]; /* one of them */
    int n_listed;           /* the newest committed steps, descending (for messages) */
    int64_t listed[MAL_SNAP_SCAN_LIST];
} mal_snap_scan;

/* Local.  List `dir` into *sc (`after`: count marked snapshots above this
 * step in n_after; -1: all of them).  Never follows a link below `dir`,
 * never blocks on a FIFO (every file is opened non-blocking and must be
 * regular).  MAL_ENOENT (no message) when `dir` does not exist. */
int mal_snapshot_scan(const char *dir, int64_t after, mal_snap_scan *sc);

/* Local.  The committed snapshot of step `step` in `dir` (step < 0: the
 * newest committed one, found by listing the directory: `latest` is only a
 * hint, and a `latest` that names another step is reported) into `path`
 * (`len` bytes, caller-owned) and its step into *found (may be NULL).
 * MAL_ENOENT if `dir` does not exist or holds no such snapshot (the
 * message lists the committed steps); MAL_ECORRUPT / MAL_EFORMAT when the
 * only snapshots there have unreadable markers. */
int mal_snapshot_find(const char *dir, int64_t step, char *path, size_t len, int64_t *found);

/* Local.  mal_snapshot_find(dir, -1, path, len, NULL). */
int mal_snapshot_find_latest(const char *dir, char *path, size_t len);

/* Local.  `path` is either a step directory or a snapshot directory
 * (holding step directories or `latest`); write the step directory -- for
 * a snapshot directory its newest committed snapshot -- to `out` (`len`
 * bytes).  A step directory without COMPLETE is refused (MAL_ECORRUPT). */
int mal_snapshot_resolve(const char *path, char *out, size_t len);

/* ------------------------------------------------------------------ destination */

/* A snapshot directory a program is about to write into, held for the
 * program's run (library-owned; mal_snap_dest_close frees it). */
typedef struct mal_snap_dest mal_snap_dest;

/* Local: the process that commits (rank 0).  Get `dir` ready to receive
 * snapshots, before any work is done that a bad destination would waste:
 *   - its name leaves room for the paths a writer makes below it
 *     (PATH_MAX);
 *   - it is created (mkdir -p) when missing;
 *   - its lock: an advisory flock(LOCK_EX|LOCK_NB) on dir/.lock, which
 *     the kernel releases when the process dies, however it dies; the
 *     holder writes "<who> pid P on host H since T" into it, so a second
 *     program refused at start names the first one;
 *   - a probe: a file created there (O_EXCL|O_NOFOLLOW, random name),
 *     written, fsynced and removed, which finds a read-only file system,
 *     missing permission or a full disk now rather than at the first
 *     snapshot;
 *   - `latest`, when present, is a regular file (a directory there would
 *     make every commit fail).
 * Each refusal is MAL_EINVAL with a message naming the directory, what is
 * wrong and what to do (a program reports it as bad input: exit 2).  On
 * failure nothing is left behind (directories it created are removed). */
int mal_snap_dest_open(mal_snap_dest **out, const char *dir, const char *who);

/* Local, the holder.  Remove the snapshots of the destination with a step
 * above `after` (-1: every one) -- step directories, committed or not,
 * COMPLETE first -- and point `latest` at step `after` (which must be
 * committed; -1: remove `latest`).  Entries that are not Malleus's are
 * reported and left alone.  *n_removed (may be NULL) counts what went. */
int mal_snap_dest_clear(mal_snap_dest *d, int64_t after, int *n_removed);

/* Local.  Release the lock (and its file); with `undo`, also remove the
 * directories mal_snap_dest_open created while they are empty (a program
 * refused after opening leaves nothing behind).  NULL is fine. */
void mal_snap_dest_close(mal_snap_dest *d, int undo);

/* Local.  1 when `path` names an entry a snapshot directory `dir` manages
 * -- `latest`, the lock, a step directory, a temporary entry, or a file
 * inside a step directory of `dir` -- so that an output written there
 * would be overwritten by snapshots or removed by retention (or would
 * overwrite them).  By identity (device and inode of the directories), so
 * links and other spellings of the same directory count.  0 otherwise,
 * also when `dir` does not exist. */
int mal_snapshot_dir_owns(const char *dir, const char *path);

/* ------------------------------------------------------------------ reading */

/* An open snapshot for reading; library-owned, freed by mal_snapshot_close(). */
typedef struct mal_snapshot mal_snapshot;

/* Local.  Open the step directory `step_dir`: checks the COMPLETE marker
 * (MAL_ECORRUPT if missing), the format and version (MAL_EFORMAT), the
 * index file against the marker's checksum and every shard file against
 * the size the index recorded (MAL_ECORRUPT, naming the file), and reads
 * meta and the block table.  Tensor data is read and verified by
 * mal_snapshot_read_block().  On success *out is owned by the caller until
 * mal_snapshot_close(). */
int mal_snapshot_open(mal_snapshot **out, const char *step_dir);

/* Local.  The snapshot's meta; strings are owned by `s` (valid until close). */
const mal_snap_meta *mal_snapshot_meta(const mal_snapshot *s);

/* Local.  Number of tensors in the snapshot. */
int mal_snapshot_n_tensors(const mal_snapshot *s);

/* Local.  Describe tensor i (0 <= i < n_tensors, in byte-wise name order)
 * into *info: name (owned by `s`), ndim, shape; offset 0 and extent ==
 * shape (the whole tensor); data = NULL.  MAL_EINVAL if i is out of range. */
int mal_snapshot_tensor_info(const mal_snapshot *s, int i, mal_snap_tensor *info);

/* Local.  Number of stored blocks of tensor i (0 if out of range), and the
 * description of its k-th stored block (name owned by `s`, offset and
 * extent of the block, data NULL) with the name of its shard file
 * relative to the step directory (*file owned by `s`; may be NULL). */
int mal_snapshot_n_blocks(const mal_snapshot *s, int i);
int mal_snapshot_block_info(const mal_snapshot *s, int i, int k, mal_snap_tensor *info,
                            const char **file);

/* Local.  Read the block `want` describes (name, ndim, global shape,
 * offset, extent) into want->data (prod(extent) floats, caller-owned).
 * Every stored block the request touches is read whole, in chunks of
 * MAL_SNAP_READ_CHUNK_BYTES, and its CRC-32C verified; a mismatch returns
 * MAL_ECORRUPT naming the shard file and the tensor (want->data is then
 * unspecified).  MAL_ENOENT: no such tensor; MAL_EMISMATCH: the stored
 * global shape differs from want's; MAL_EINVAL: the block does not fit. */
int mal_snapshot_read_block(mal_snapshot *s, const mal_snap_tensor *want);

/* A source of blocks with mal_snapshot_read_block's contract: a snapshot
 * (mal_snapshot_read_fn, ctx the mal_snapshot) or another reader of
 * parameters (a Hugging Face checkpoint, ckpt/hf.h), for code that streams
 * from either. */
typedef int (*mal_snap_read_fn)(void *ctx, const mal_snap_tensor *want);
int mal_snapshot_read_fn(void *snapshot, const mal_snap_tensor *want);

/* Local.  Read the whole tensor `name` into `data` (room for `n` floats,
 * n >= prod(shape)); shape must equal the stored one (see read_block). */
int mal_snapshot_read(mal_snapshot *s, const char *name, int ndim, const int64_t *shape,
                      float *data, size_t n);

/* Local.  1 when the snapshot holds a tensor of state group `group` (a
 * name "GROUP/..."), else 0.  A weights-only snapshot (an import,
 * ckpt/import.h) holds "param" alone: no "adam_m". */
int mal_snapshot_has_group(const mal_snapshot *s, const char *group);

/* Local.  Bytes of tensor data read from shard files so far. */
uint64_t mal_snapshot_bytes_read(const mal_snapshot *s);

/* Local.  Close the files and free everything `s` owns; NULL is a no-op. */
void mal_snapshot_close(mal_snapshot *s);

/* ------------------------------------------------------------------ parsing */

/* A snapshot's files are outside input: a user can point --resume or
 * malleus-reshard at anything.  These parse them from memory -- a clear
 * MAL_EFORMAT / MAL_ECORRUPT for anything that is not a well-formed
 * snapshot, never a crash, and no allocation larger than the input
 * justifies -- and are the fuzz targets for snapshot indexes;
 * mal_snapshot_open runs them on the files' bytes. */

/* The most bytes an index.h5 may have. */
#define MAL_SNAP_MAX_INDEX_BYTES ((size_t)1 << 30)

/* What a COMPLETE marker says. */
typedef struct {
    int64_t step, n_tensors, n_blocks, n_shards;
    int64_t index_bytes;   /* size of index.h5 */
    uint32_t index_crc32c; /* CRC-32C of index.h5 */
} mal_snap_marker;

/* Local.  Parse the text of a COMPLETE marker (`len` bytes at `text`; need
 * not be NUL-terminated) into *out: format, format_version and the counts,
 * each in range (non-negative, index_bytes <= MAL_SNAP_MAX_INDEX_BYTES,
 * n_tensors and n_shards <= INT_MAX).  `what` names
 * the input in messages.  MAL_EFORMAT for anything else. */
int mal_snapshot_parse_marker(const char *text, size_t len, const char *what, mal_snap_marker *out);

/* Local.  Parse the bytes of an index.h5 (`len` bytes at `buf`, read only)
 * into a snapshot description: meta, tensors, blocks.  Every count and size
 * is bounded by `len` before anything is allocated; the table is checked
 * (tensor names valid, sorted and unique; shapes positive; every block
 * inside its tensor and inside its shard's recorded size; the blocks of a
 * tensor in offset order, tiling it exactly; shard names plain file
 * names).  `what` names the input in messages.  On success *out (owned by
 * the caller until mal_snapshot_close) answers mal_snapshot_meta,
 * _n_tensors, _tensor_info, _n_blocks and _block_info; it opened no files,
 * so reading data from it is MAL_EINVAL.  MAL_ECORRUPT if `buf` is not an
 * HDF5 file, MAL_EFORMAT if it is not a valid index. */
int mal_snapshot_parse_index(mal_snapshot **out, const void *buf, size_t len, const char *what);

/* ------------------------------------------------------------------ helpers */

/* Local.  CRC-32C (Castagnoli) of `len` bytes at `buf`, continuing from
 * `crc` (start with 0): the checksum of every stored block and of the
 * index.  SSE4.2 instruction when the CPU has it, slicing-by-8 otherwise
 * (MALLEUS_CRC32C_SOFTWARE=1 forces the latter); both give the same value. */
uint32_t mal_crc32c(uint32_t crc, const void *buf, size_t len);

/* Collective over `comm` (NULL: returns rc).  Agree on failure: if any
 * process passes rc != 0, every process returns the code of the lowest
 * failing rank, and the others record its message prefixed "rank N: ", so
 * whoever prints (rank 0) names the real problem.  Uses sleeping waits. */
int mal_snapshot_agree(mal_comm *comm, int rc);

/* Fault injection for tests (not thread-safe): when set to N > 0, the Nth
 * of this process's own writer I/O steps from now (mkdir, create, write,
 * fsync, rename) fails with EIO, once.  0 = off.
 *
 * Crash injection for tests: the environment variable
 * MALLEUS_TEST_SNAPSHOT_KILL=RANK:STEP:POINT makes the process of that rank
 * kill itself with SIGKILL while writing the snapshot of that step, at
 * POINT: "data" (in mal_snap_writer_put, after the first block it
 * completes), "index" (rank 0, index written, before the rename), "rename"
 * (rank 0, after the rename, before COMPLETE). */
extern int mal_snapshot_fault_nth_io;

#endif /* MAL_SNAPSHOT_H */
