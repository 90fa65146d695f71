/* Offline resharding: rewrite a snapshot for another plan (any world size,
 * TP sizes, stage counts, layer splits, micro-batches, suspended ranks).
 * malleus-reshard (cmd/reshard_main.c) is a thin shell over this.
 *
 * The new snapshot stores, for every rank of the new plan, the blocks that
 * rank would write itself (mal_reshard_rank_blocks) in shard_<rank>.h5, so
 * a run resumed on the new plan reads locally.  The work is split by
 * destination shard files among the processes of `comm`; each process
 * streams tensor by tensor: the bounding box of its destination blocks of
 * a tensor is read from the source once when it fits the buffer (else each
 * block, in slabs), every stored block touched verified against its
 * CRC-32C, and appended block by block to its shard files.  Memory per
 * process: a buffer of mem_bytes, the reader's chunk
 * (MAL_SNAP_READ_CHUNK_BYTES) and the block tables of both snapshots,
 * never a whole model.  The source is only read.
 */
#ifndef MAL_RESHARD_H
#define MAL_RESHARD_H

#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "snapshot.h"
#include "src/config.h"
#include "src/layout.h"
#include "src/model.h"
#include "src/plan.h"

#define MAL_RESHARD_MEM_DEFAULT_MIB 256
#define MAL_RESHARD_MEM_DEFAULT ((size_t)MAL_RESHARD_MEM_DEFAULT_MIB << 20)

/* Local.  The blocks `rank` writes into a snapshot of a run under `plan`,
 * with the tensor table of its part (both caller-freed; empty for a
 * suspended rank; blocks are along each tensor's axis, as in layout.h).
 *
 * Every element is written exactly once.  Each piece of the finest common
 * partition of a tensor's holdings is held by one or more pipelines
 * (replicas); instead of letting its owner (the first holder) write all of
 * it, the piece is cut along the axis into up to one part per replica, the
 * i-th written by the i-th replica's first holder, so that data-parallel
 * replicas share the writing.  Parts are at least
 * mal_reshard_min_block_bytes (small tensors stay whole).  A pure function
 * of plan and config: the trainer's snapshots and malleus-reshard's output
 * agree, so a run resumed on the plan a snapshot was written for reads
 * only its own blocks where it holds them. */
int mal_reshard_rank_blocks(const mal_plan *plan, const mal_model_config *cfg, int rank,
                            mal_tensor_info **tensors, int *n_tensors, mal_owned_block **blocks,
                            int *n_blocks);

/* Local.  Put block `b` -- block `index` of the writer's shard handle
 * `h` -- into `w`, read from `read`/`ctx` in slabs that fit `buf` (`cap`
 * floats, cap >= 1): whole rows of the block's first dimension, or, for
 * 2-D blocks whose single row is larger, pieces of one row; both are
 * contiguous in the block's row-major order.  The streaming copy of
 * malleus-reshard and malleus-import. */
int mal_reshard_stream_block(mal_snap_writer *w, int h, int index, const mal_snap_tensor *b,
                             mal_snap_read_fn read, void *ctx, float *buf, size_t cap);

/* The smallest part a piece is cut into for sharing the writing (bytes;
 * default 1 MiB).  A tuning knob and a test hook: it changes how the
 * state is split into blocks, never what is stored. */
extern size_t mal_reshard_min_block_bytes;

typedef struct {
    const char *src;      /* snapshot directory (uses its `latest`) or a step directory */
    const char *dst_dir;  /* destination snapshot directory (created if needed) */
    const mal_plan *plan; /* the new plan, validated here against the snapshot's model */
    size_t mem_bytes;     /* data buffer per process; 0: MAL_RESHARD_MEM_DEFAULT */
    FILE *progress;       /* rank 0 redraws a progress line here (NULL: none) */
    int keep_last;        /* retention in dst_dir (0: keep all) */
} mal_reshard_options;

typedef struct {
    int64_t step;           /* the snapshot's step (unchanged) */
    int n_tensors;          /* tensors rewritten (model and optimizer state) */
    int n_shards;           /* shard files written */
    int n_procs;            /* processes that shared the work */
    uint64_t bytes_read;    /* tensor data read from the source, all processes */
    uint64_t bytes_written; /* tensor data written, all processes */
    double seconds;         /* wall time */
    char out_path[4096];    /* the new step directory */
} mal_reshard_stats;

/* Collective over `comm` (NULL: this process does everything).  Rewrite
 * o->src for o->plan into o->dst_dir as described above.  Refuses, with a
 * message that says what to do and before writing anything: a source that
 * is missing or not committed (MAL_ENOENT / MAL_ECORRUPT), a plan that does
 * not fit the snapshot's model or global batch (MAL_EINVAL: mal_plan_validate
 * against the stored config), a snapshot whose tensors are not those of its
 * model (MAL_EMISMATCH), a destination inside the source
 * (mal_reshard_check_dest: MAL_EINVAL).  A run that fails leaves no
 * directory it created (the snapshot writer's rule).  A checksum failure while reading fails the whole run
 * (MAL_ECORRUPT, naming the file and tensor) and commits nothing.  Returns
 * the same code on every process; *st (may be NULL) is filled on success,
 * the same on every process. */
int mal_reshard(mal_comm *comm, const mal_reshard_options *o, mal_reshard_stats *st);

/* Local.  Refuse (MAL_EINVAL, with a message saying what to do) a
 * destination `dst` that would write into the source snapshot
 * `step_dir` (a step directory, as mal_snapshot_resolve gives it), compared
 * as resolved paths (symbolic links, "." and ".."; for a `dst` that does
 * not exist yet, its longest existing prefix): `dst` inside the step
 * directory or inside the snapshot directory that holds it (its `latest`
 * and retention govern the source), and `dst` above the source when the
 * source lies in an entry a writer of `dst` removes or replaces (step_*,
 * .tmp-*, latest).  MAL_ENOENT if `step_dir` cannot be resolved. */
int mal_reshard_check_dest(const char *step_dir, const char *dst);

/* Local.  The one-line summary of a run, as malleus-reshard prints it
 * after "malleus-reshard: " ("step 300: 117 tensors into 7 shard files,
 * 1.20 GiB read, 1.20 GiB written in 3.10 s (396.00 MiB/s, 2 processes)
 * -> DEST/step_00000300"), into `out` (`len` bytes, caller-owned). */
void mal_reshard_summary(const mal_reshard_stats *st, char *out, size_t len);

/* What malleus-reshard's command line asks for (cmd/reshard_main.c fills
 * it from its option table). */
typedef struct {
    const char *src;       /* SNAPSHOT */
    const char *plan_path; /* PLAN.json */
    const char *dst_dir;   /* DEST */
    size_t mem_bytes;      /* --mem (0: default) */
    int keep_last;         /* --keep */
    int progress;          /* --progress 1, --no-progress 0, neither -1 (on a terminal) */
    int quiet;             /* --quiet: no progress, no summary */
} mal_reshard_cli;

/* Collective over `world`: run malleus-reshard as `cli` describes.  Every
 * process reads the plan; rank 0 draws progress (when asked, or on a
 * terminal) and prints the summary to stdout and any error to stderr
 * ("malleus-reshard: <message>").  Returns the program's exit status, the
 * same on every process: 0 done, 1 refused or failed (nothing committed),
 * 2 bad input (the plan file cannot be read or is not a valid plan, or
 * DEST lies inside the source: mal_reshard_check_dest). */
int mal_reshard_cli_run(mal_comm *world, const mal_reshard_cli *cli);

#endif /* MAL_RESHARD_H */
