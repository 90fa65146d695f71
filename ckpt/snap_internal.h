/* Internal header of the snapshot layer (ckpt/snap_*.c): what the files
 * that implement ckpt/snapshot.h share.  Nothing outside ckpt/snap_*.c
 * includes it.  Internal names are snap_*; the public API (mal_snapshot_*,
 * mal_snap_*) stays in snapshot.h.
 *
 * Who owns what (one file, one facility), bottom up: a file calls only
 * the files above it in this list, never one below it or beside it on
 * the same line, so the facilities form a DAG without circles:
 *
 *   snap_fault.c   test hooks: fault injection (N-th writer I/O step fails)
 *                  and the kill points of MALLEUS_TEST_SNAPSHOT_KILL
 *   snap_crc32c.c  block checksums: CRC-32C and whole-file checksums
 *   snap_blocks.c  block geometry: names, shapes, counts, tiling checks
 *     (the three above call no other snap_*.c)
 *   snap_fs.c      file system: paths, fsync, temporary names, creation
 *                  relative to a directory descriptor, atomic replacement
 *                  of a small file, removal that never follows links,
 *                  retention and debris, bounded non-blocking reads of
 *                  small files, the COMPLETE marker read and parsed
 *                                                          -> fault
 *   snap_find.c    what a snapshot directory holds, the newest committed
 *                  snapshot (listed; `latest` a hint), a step's, what a
 *                  command-line path names                 -> fs
 *   snap_dest.c    a destination made ready at start (created, locked,
 *                  probed), the old run cleared, what a directory owns
 *                                                          -> fs
 *   snap_h5.c      HDF5 plumbing: quiet error stacks, error conversion,
 *                  attributes, property lists, plain table datasets
 *                                                          -> fault
 *   snap_index.c   the index and the meta: building the block table,
 *                  writing index.h5 (meta, tables, virtual datasets) and
 *                  loading it back; copying and freeing a meta; freeing
 *                  what loading allocated in a mal_snapshot
 *                                                          -> h5, blocks
 *   snap_read.c    the read path: opening a step directory, reading and
 *                  verifying blocks, closing   -> index, fs, h5, blocks, crc
 *   snap_coord.c   coordination between processes (through the comm
 *                  table's control plane): agreement on failure, the block
 *                  descriptors gathered at rank 0              -> fs
 *   snap_commit.c  rank 0's commit: index written, rename, COMPLETE written,
 *                  `latest` moved, retention     -> index, fs, crc, fault
 *   snap_write.c   the write path: the collective writer and shard files;
 *                  rank 0 commits through snap_commit.c
 *                      -> commit, coord, index, fs, h5, blocks, crc, fault
 *
 * Data types are shared through this header (the writer, the gathered
 * table, the open snapshot); only functions follow the arrows.
 *
 * On-disk layout (format "malleus-snapshot", format_version 2):
 *
 *   DIR/latest                 text "step_NNNNNNNN\n": the snapshot committed last
 *                              (a hint: readers list DIR for the newest)
 *   DIR/step_NNNNNNNN/         one directory per snapshot (step zero-padded to 8)
 *       shard_RRRRR.h5         blocks written by one process (usually rank R's)
 *       index.h5               meta, block table, one virtual dataset per tensor
 *       COMPLETE               completion marker, JSON, written last
 *   DIR/.tmp-*.<random>.<pid>@<host>   work in progress of a writer (rank 0's)
 *   DIR/.lock                  flock'ed by the program writing DIR (its pid, host)
 *
 * shard_RRRRR.h5: root attributes format, format_version, step, shard (int32);
 * one float32 little-endian contiguous dataset per block at
 * "<tensor name>/block_<o0>_<o1>..." (o = the block's offset), whose
 * dimensions are the block's extent, with attributes global_shape,
 * block_offset, block_extent (int64[ndim]).  Contiguous, allocated at
 * creation, so every block is one byte range of the file; HDF5 writes only
 * the skeleton and the data goes in with pwrite (see snap_shard_create).
 *
 * index.h5: root attributes format, format_version (int32), step,
 * consumed_samples (int64), seed, rng_counter (uint64), config_json,
 * train_json, plan_json (UTF-8 strings, absent = NULL), n_tensors,
 * n_blocks, n_shards (int64).  Group /_malleus holds the block table:
 *   shards        string[n_shards]   shard file names, relative to the step dir
 *   shard_bytes   uint64[n_shards]   each shard file's size
 *   tensors       string[n_tensors]  tensor names, byte-wise sorted
 *   tensor_ndim   int32[n_tensors]
 *   tensor_shape  int64[n_tensors][4]   (unused dimensions 1)
 *   tensor_first_block, tensor_n_blocks   int64[n_tensors]: blocks of tensor
 *                 i are rows first .. first+n-1 of the block arrays
 *   block_shard   int32[n_blocks]    index into shards
 *   block_offset, block_extent   int64[n_blocks][4]
 *   block_addr    uint64[n_blocks]   byte address of the block's data in its shard
 *   block_crc32c  uint32[n_blocks]   CRC-32C of the block's little-endian bytes
 * Every tensor is also an HDF5 virtual dataset at its own name (float32,
 * the global shape; attributes global_shape and n_blocks) mapping each block
 * to its dataset in its shard file by a *relative* file name, so h5py or
 * h5dump read a whole tensor from index.h5 wherever the directory lives.
 *
 * COMPLETE is a small JSON object:
 *   {"format": "malleus-snapshot", "format_version": 2, "step": S,
 *    "n_tensors": N, "n_blocks": B, "n_shards": K,
 *    "index_bytes": L, "index_crc32c": C}
 * C is the CRC-32C of the whole index.h5, which the reader checks before
 * trusting the table; the table's per-block checksums then cover the data,
 * verified whenever a block is read, and the shard sizes are checked at open.
 */
#ifndef MAL_SNAP_INTERNAL_H
#define MAL_SNAP_INTERNAL_H

#include <hdf5.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/mal.h"
#include "snapshot.h"

#define SNAP_INDEX_FILE "index.h5"
#define SNAP_SHARD_FMT "shard_%05d.h5"
#define SNAP_TABLE "_malleus"
#define SNAP_COMPLETE "COMPLETE"
#define SNAP_LATEST "latest"
#define SNAP_TMP_PREFIX ".tmp-"
#define SNAP_STEP_PREFIX "step_"
#define SNAP_LOCK ".lock"
#define SNAP_MAX_SMALL_FILE 65536
/* Host names in temporary names are cut to this many bytes, so that every
 * name stays within NAME_MAX; the writer id "<pid>@<host>" fits this. */
#define SNAP_HOST_MAX 64
#define SNAP_WRITER_ID_MAX 96
/* The longest path below a snapshot directory that a writer makes:
 * "/.tmp-step_<20 digits>.<16 hex>.<pid>@<host>/shard_<7 digits>.h5" and
 * the temporary names of COMPLETE and latest, with room to spare; a
 * directory whose name leaves less than this below PATH_MAX is refused
 * when a run starts, not at its first snapshot. */
#define SNAP_MAX_REL_PATH 256
/* Removal never goes deeper (Malleus writes two levels). */
#define SNAP_MAX_TREE_DEPTH 8
#define SNAP_MAX_INDEX_BYTES MAL_SNAP_MAX_INDEX_BYTES
/* Bytes every tensor, block and shard takes in the tables of index.h5 (at
 * least: contiguous datasets, no compression in an index Malleus writes):
 * tensor_ndim, tensor_shape, tensor_first_block, tensor_n_blocks; and
 * block_shard, block_offset, block_extent, block_addr, block_crc32c; and
 * shard_bytes.  A count the index's size cannot hold is refused before
 * anything is allocated for it. */
#define SNAP_INDEX_BYTES_PER_TENSOR (4 + 8 * MAL_SNAP_MAXDIM + 8 + 8)
#define SNAP_INDEX_BYTES_PER_BLOCK (4 + 16 * MAL_SNAP_MAXDIM + 8 + 4)
#define SNAP_INDEX_BYTES_PER_SHARD 8
/* The reader checks the blocks of a tensor for overlap pairwise when they
 * are not slabs of one dimension (which need only neighbours compared) up
 * to this many; beyond, by their volume only. */
#define SNAP_MAX_PAIRWISE_BLOCKS 4096
#define SNAP_MSG 1024

/* ---------------------------------------------------------------- shared types */

/* One stored block, as gathered by the committing rank and as read from
 * the index. */
typedef struct {
    char *name; /* not owned: points at the tensor's (reader) or the payload's (writer) name */
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM], offset[MAL_SNAP_MAXDIM], extent[MAL_SNAP_MAXDIM];
    int shard;     /* index into the shard list */
    uint64_t addr; /* byte address of the data in the shard file */
    uint32_t crc;
} snap_block;

/* A shard file: as gathered (id = the writer's id) or as read (id = index). */
typedef struct {
    char *file; /* relative to the step directory */
    int id;
    uint64_t bytes;
} snap_shard;

/* A tensor of the index: its blocks are rows first .. first+n-1. */
typedef struct {
    char *name;
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM];
    int64_t first, n; /* its blocks */
} snap_tinfo;

/* Test hook points of MALLEUS_TEST_SNAPSHOT_KILL (snapshot.h). */
enum { SNAP_KILL_NONE, SNAP_KILL_DATA, SNAP_KILL_INDEX, SNAP_KILL_RENAME };

/* A block being written: its description, progress and checksum so far. */
typedef struct {
    char *name;
    int ndim;
    int64_t shape[MAL_SNAP_MAXDIM], offset[MAL_SNAP_MAXDIM], extent[MAL_SNAP_MAXDIM];
    int64_t count, written; /* floats */
    uint64_t addr;
    uint32_t crc;
} snap_wblock;

/* A shard file being written. */
typedef struct {
    int id;
    char fname[32];      /* in the temporary directory */
    char path[PATH_MAX]; /* for messages */
    int fd;
    int n;
    snap_wblock *b;
    uint64_t bytes; /* file size, known once closed */
} snap_wshard;

/* The directories snap_mkdirs created, outermost first, as lengths of the
 * prefixes of its `dir` that name them. */
#define SNAP_MAX_CREATED 64
typedef struct {
    int n;
    size_t len[SNAP_MAX_CREATED];
} snap_created;

/* The collective writer (snap_write.c; rank 0 commits in snap_commit.c). */
struct mal_snap_writer {
    mal_comm *comm;
    int rank, size;
    char dir[PATH_MAX], tmp[PATH_MAX], final[PATH_MAX], stepname[64];
    char tmpname[NAME_MAX + 1]; /* tmp's last component */
    int dfd;                    /* rank 0: `dir`, where the commit renames and retains */
    int tfd;                    /* the temporary directory (step_S once renamed); every
                                 * file of the snapshot is created relative to it */
    mal_snap_meta meta; /* strings owned (snap_meta_copy / snap_meta_free) */
    int n_sh, cap_sh;
    snap_wshard *sh;
    int kill;
    size_t *counts;    /* rank 0: [size], sizes of the gathered descriptors */
    snap_created made; /* rank 0: directories begin created for `dir` */
    int pending_rc;    /* a local failure inside begin, reported by finish */
    char pending_msg[SNAP_MSG];
};

/* What a process tells the committing rank: a growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} snap_buf;

/* Everything rank 0 collected. */
typedef struct {
    snap_block *b;
    int64_t nb, cap_b;
    snap_shard *s;
    int ns, cap_s;
} snap_table;

/* An open snapshot.  snap_index.c allocates (and snap_index_free frees) the
 * struct, index_path, meta, the tables and the fd array; snap_read.c sets
 * dir, opens the fds and the chunk, and releases those in
 * mal_snapshot_close before handing the rest to snap_index_free. */
struct mal_snapshot {
    char *dir;
    char *index_path;
    mal_snap_meta meta;
    int n_t;
    snap_tinfo *t;
    int64_t n_b;
    snap_block *b;
    int n_s;
    snap_shard *s;
    int *fd; /* [n_s], opened on first use */
    float *chunk;
    uint64_t bytes_read;
};

/* ---------------------------------------------------------------- snap_fault.c */

/* True (with errno = EIO) when the armed fault (mal_snapshot_fault_nth_io)
 * fires at this I/O step.  Every writer I/O step calls it once. */
int snap_fault(void);
/* MALLEUS_TEST_SNAPSHOT_KILL=RANK:STEP:POINT (snapshot.h): the kill point of
 * this rank for this step (SNAP_KILL_*), and the kill itself. */
int snap_kill_point(int rank, int64_t step);
void snap_die(int rank, const char *where);

/* ---------------------------------------------------------------- snap_crc32c.c */

/* CRC-32C and size of a whole file of at most `limit` bytes, opened at
 * `open_path` and named `path` in messages. */
int snap_file_crc(const char *open_path, const char *path, uint64_t *bytes, uint32_t *crc,
                  size_t limit);

/* ---------------------------------------------------------------- snap_blocks.c */

void snap_fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape);
/* A tensor name: an HDF5 path of valid components, not in SNAP_TABLE. */
int snap_check_name(const char *name);
/* Number of elements of a block; -1 on overflow. */
int64_t snap_count(int ndim, const int64_t *ext);
/* A block description (data not looked at): name, ndim, the block inside
 * the shape. */
int snap_check_block(const mal_snap_tensor *t);
int snap_cmp_str(const void *a, const void *b);
/* Names unique and none a group on the path of another; `v` sorted. */
int snap_check_names_disjoint(char *const *v, int n);
/* Blocks by name, then offset. */
int snap_cmp_block(const void *a, const void *b);
/* The n blocks of one tensor (sorted by offset) tile its shape exactly:
 * one global shape, volumes adding up, no two overlapping (blocks that are
 * slabs of one dimension compare neighbours; others compare every pair
 * while n <= max_pairwise, beyond that their volume only). */
int snap_check_tiling(const snap_block *b, int64_t n, int64_t max_pairwise);
/* The dataset of a block inside its shard file: "<tensor>/block_<o0>_<o1>..". */
void snap_block_dset(char *out, size_t len, const char *name, int ndim, const int64_t *offset);

/* ---------------------------------------------------------------- snap_fs.c */

/* Entries of a snapshot directory are looked at without following links
 * and files are created in it relative to a directory descriptor,
 * O_CREAT|O_EXCL|O_NOFOLLOW (see the top of snap_fs.c).  `shown` / `dir`
 * arguments name the descriptor's directory or entry in messages only. */

/* out = a "/" b; MAL_EINVAL if it does not fit `len`. */
int snap_join(char *out, size_t len, const char *a, const char *b);
/* lstat succeeds. */
int snap_exists(const char *path);
/* fsync a file or a directory (EINVAL from a directory is fine). */
int snap_fsync(const char *path, int is_dir);
int snap_fsync_fd(int fd, const char *shown, int is_dir);
/* Open directory dfd/name, not through a link (O_NOFOLLOW); MAL_ENOENT
 * (no message) when it does not exist. */
int snap_open_dir_at(int dfd, const char *name, const char *shown, int *out);
/* 16 random hex digits (len >= 17). */
void snap_random_hex(char *out, size_t len);
/* A temporary name ".tmp-<what>.<random>.<pid>@<host>": unpredictable,
 * and still telling retention whose it is. */
int snap_tmp_name(char *out, size_t len, const char *what);
/* A path that reaches dfd/name through the descriptor (/proc/self/fd/N/name;
 * dir_shown/name where /proc is missing), for libraries that take a path
 * (HDF5). */
int snap_fd_path(char *out, size_t len, int dfd, const char *name, const char *dir_shown);
/* Create dfd/name for writing, O_CREAT|O_EXCL|O_NOFOLLOW (a fault point). */
int snap_create_at(int dfd, const char *name, const char *shown, int *out);
/* mkdir -p, fsyncing the parent of every directory it creates; *made
 * records those (also when it fails half-way). */
int snap_mkdirs(const char *dir, snap_created *made);
/* Remove, innermost first, the directories of `made` (created for `dir`)
 * while they are empty: a snapshot that failed leaves no directory behind
 * that it created itself, and never removes more. */
void snap_unmkdirs(const char *dir, const snap_created *made);
/* rm -rf of dfd/name that never follows a link (a link is removed as a
 * link), never leaves dfd's file system and stops at SNAP_MAX_TREE_DEPTH;
 * a missing entry is fine. */
int snap_rmtree_at(int dfd, const char *name, const char *shown);
/* Remove step directory dfd/name, COMPLETE first (durably). */
int snap_remove_step_at(int dfd, const char *name, const char *shown);
/* dfd/name is a directory (not a link) holding a COMPLETE entry of any kind. */
int snap_has_marker_at(int dfd, const char *name);
/* Log that dir/name, a step_* or .tmp-* name that is not what Malleus
 * writes there (a link, a FIFO, ...), is left alone. */
void snap_report_foreign(const char *dir, const char *name, unsigned mode);
/* Retention after committing step `cur` in dfd (named `dir`): keep it and
 * the newest committed snapshots up to `keep_last` (0: all), remove the
 * debris of dead writers and uncommitted steps older than `cur`; entries
 * that are not Malleus's are reported and left alone. */
int snap_retain(int dfd, const char *dir, int64_t cur, int keep_last);
/* "<pid>@<host>" of this process (the host cut to SNAP_HOST_MAX). */
void snap_writer_id(char *out, size_t len);
/* Write `content` to dfd/name atomically (a temporary file with a random
 * name, O_EXCL|O_NOFOLLOW, fsync, renameat, fsync of dfd); *renamed tells
 * whether dfd/name was replaced. */
int snap_write_atomic(int dfd, const char *dir, const char *name, const char *content,
                      int *renamed);
/* A small text file (at most SNAP_MAX_SMALL_FILE bytes) into a
 * NUL-terminated malloc'ed buffer, opened non-blocking and refused
 * (MAL_EFORMAT) unless a regular file; MAL_ENOENT (no message) if it does
 * not exist.  _at: relative to dfd (links followed: a copy made of links
 * reads like the original). */
int snap_read_small_at(int dfd, const char *name, const char *shown, char **out);
int snap_read_small(const char *path, char **out);
/* "step_<digits>" -> step; -1 if `name` is not exactly that. */
int64_t snap_parse_step_name(const char *name);
/* All of `len` bytes at `off`, or an error naming the file and tensor. */
int snap_pwrite_all(int fd, const void *buf, size_t len, off_t off, const char *fpath,
                    const char *name);
int snap_pread_all(int fd, void *buf, size_t len, off_t off, const char *path, const char *name);
/* Read and parse COMPLETE of `step_dir` (mal_snapshot_parse_marker). */
int snap_read_marker(const char *step_dir, mal_snap_marker *mk);
/* A whole regular file of at most `limit` bytes into a malloc'ed *buf,
 * *len bytes (larger: MAL_ECORRUPT), opened non-blocking. */
int snap_read_file(const char *path, size_t limit, char **buf, size_t *len);

/* ---------------------------------------------------------------- snap_h5.c */

/* HDF5 prints its error stack on stderr by default; every public function
 * silences it for its own duration and restores the caller's setting. */
typedef struct {
    H5E_auto2_t func;
    void *data;
} snap_h5quiet;
void snap_h5quiet_begin(snap_h5quiet *q);
void snap_h5quiet_end(snap_h5quiet *q);
/* Record `fmt` plus the innermost HDF5 reason.  Must be called right after
 * the failing HDF5 call: the next API call clears the error stack. */
int snap_h5err_at(const char *file, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define SNAP_H5ERR(code, ...) snap_h5err_at(__FILE__, __LINE__, (code), __VA_ARGS__)
/* Close file *f (set to -1 whatever happens). */
int snap_h5close(hid_t *f, const char *fpath);
/* File access list: POSIX driver, strong close, no file locking needed. */
hid_t snap_fapl(void);
int snap_attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, hsize_t count,
                    const void *buf, const char *fpath, const char *obj);
int snap_attr_write_str(hid_t loc, const char *name, const char *s, const char *fpath);
int snap_attr_read_int(hid_t loc, const char *name, hid_t mtype, int count, void *buf,
                       const char *fpath, const char *obj);
/* One string (scalar or one element; absent: NULL when `optional`) of at
 * most `max` bytes. */
int snap_attr_read_str(hid_t loc, const char *name, int optional, size_t max, char **out,
                       const char *fpath);
/* format, format_version and step on the root group of an index or shard. */
int snap_write_root_attrs(hid_t f, int64_t step, const char *fpath);
int snap_plists(hid_t *lcpl, hid_t *dcpl, const char *fpath);
/* Create HDF5 file `open_path` (it must not exist: H5F_ACC_EXCL, so no
 * link is followed either), `fpath` naming it in messages. */
int snap_file_create(const char *open_path, const char *fpath, hid_t fapl, hid_t *f);
/* Variable-length UTF-8 string type (caller closes it). */
hid_t snap_vlen_str(void);
/* Plain datasets of the block table (group SNAP_TABLE). */
int snap_table_write(hid_t g, const char *name, hid_t ftype, hid_t mtype, int rank,
                     const hsize_t *dims, const void *buf, const char *fpath);
int snap_table_read(hid_t g, const char *name, hid_t mtype, int64_t count, int width, void *buf,
                    const char *fpath);
int snap_table_read_str(hid_t g, const char *name, int64_t count, char **out, const char *fpath);

/* ---------------------------------------------------------------- snap_index.c */

/* Rank 0: shards of t in id order (unique), blocks grouped by tensor and
 * checked to tile each exactly; *ti (caller-freed, names pointing into t)
 * describes the *nt tensors.  `what` names the snapshot in messages. */
int snap_index_build(snap_table *t, snap_tinfo **ti, int *nt, const char *what);
/* Write index.h5 at `open_path` (named `fpath` in messages): meta, block
 * table, one virtual dataset per tensor. */
int snap_write_index(const mal_snap_meta *meta, const snap_table *t, const snap_tinfo *ti, int nt,
                     const char *open_path, const char *fpath);
/* The meta `src` into `dst`: every field, the strings as malloc'ed copies
 * that `dst` owns (also after a failure, MAL_ENOMEM: free it with
 * snap_meta_free). */
int snap_meta_copy(mal_snap_meta *dst, const mal_snap_meta *src);
/* Free the strings a meta owns (set to NULL). */
void snap_meta_free(mal_snap_meta *m);
/* Free what mal_snapshot_parse_index allocated in s (tables, meta, fd
 * array, index_path) and s itself; the read path's open files and buffers
 * must be released first (mal_snapshot_close).  NULL is fine. */
void snap_index_free(mal_snapshot *s);

/* ---------------------------------------------------------------- snap_coord.c */

void snap_put_i32(snap_buf *b, int32_t v);
void snap_put_str(snap_buf *b, const char *s);
/* This process's descriptor payload: its status (and message), or its
 * shards and blocks. */
int snap_serialize(const mal_snap_writer *w, int status, snap_buf *b);
/* Rank 0: parse the payload of `rank` into t (names point into the
 * payload); a failed rank gives its status and message. */
int snap_parse(snap_table *t, const char *p, size_t len, int rank, int *status, const char **msg);
void snap_table_free(snap_table *t);
/* Collective over w's comm (more than one process): rank 0 receives every
 * process's payload into *all (malloc'ed), back to back, payload r of
 * w->counts[r] bytes. */
int snap_gather(mal_snap_writer *w, const snap_buf *mine, char **all);

/* ---------------------------------------------------------------- snap_commit.c */

/* Rank 0, every process done: build and check the block table, write the
 * index, rename the temporary directory, write COMPLETE, move `latest`,
 * apply retention.  Cleans up after itself on failure. */
int snap_commit_root(mal_snap_writer *w, snap_table *t, int keep_last);

#endif /* MAL_SNAP_INTERNAL_H */
