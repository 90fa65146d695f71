/* One snapshot as its writer sees it (ckpt_job.c): what this rank writes
 * and the meta, copied out of the trainer so that a thread can write it
 * while the trainer moves on; and the write itself.  The synchronous save
 * (ckpt.c) and the background writer (ckpt_async.c) both write through
 * these, so both produce the same files.  Not installed. */
#ifndef MAL_TRAIN_CKPT_JOB_H
#define MAL_TRAIN_CKPT_JOB_H

#include <stddef.h>

#include "ckpt/snapshot.h"
#include "comm/comm.h"
#include "src/config.h"
#include "src/gradsync.h"
#include "src/layout.h"
#include "src/model.h"
#include "src/plan.h"

struct mal_trainer;

/* Block k < n_state_groups * n_owned is state group k / n_owned of owned
 * piece k % n_owned; sharded (--zero 1: n_state_groups 1, the parameters),
 * block n_owned + j is moment group 1 + j / n_zb of the sharded
 * optimizer's block zb[j % n_zb]. */
typedef struct {
    char *dir;              /* the snapshot directory (owned) */
    int keep;               /* retention (--keep) */
    mal_snap_meta meta;     /* step, progress, config, settings, plan (strings owned) */
    int shard;              /* the shard file's id: the world rank */
    mal_owned_block *owned; /* [n_owned]: the pieces this rank writes */
    int n_owned;
    int n_state_groups;     /* groups of the model's state written from owned pieces */
    mal_zero_block *zb;     /* [n_zb]: sharded, the moment blocks this rank keeps */
    int n_zb;
    int n_blocks;            /* MAL_STATE_N_SAVED x n_owned */
    mal_snap_tensor *blocks; /* [n_blocks]; names point into `names`, data unused */
    char (*names)[80];
    size_t *offset;           /* [n_blocks]: floats before block k, back to back */
    size_t floats, max_block; /* all blocks' floats, the largest block's */
    int local_rc;             /* a failure while preparing: the write reports it on
                               * every rank (every rank still takes part) */
    char local_msg[1024];
} mal_ckpt_job;

/* Local.  Describe the snapshot of the current state into `dir` (never
 * fails: a failure is kept in job->local_rc). */
void mal_ckpt_job_prepare(const struct mal_trainer *tr, const char *dir, mal_ckpt_job *job);
void mal_ckpt_job_fini(mal_ckpt_job *job);

/* Collective over `comm` (NULL: one process): write and commit `job`.
 * The data of block k is read from `staged` + job->offset[k] (host memory:
 * the background writer, which never touches the kernel table; tr may be
 * NULL) or, with staged NULL, packed from trainer tr's state through its
 * kernel table one block at a time (synchronous).  out_path receives the
 * step directory. */
int mal_ckpt_job_write(const mal_ckpt_job *job, mal_comm *comm, const struct mal_trainer *tr,
                       const float *staged, char *out_path, size_t out_len);

/* Local.  Queue the copy of block k of `job` from trainer tr's state into
 * host memory dst (the caller synchronises the kernel queue). */
void mal_ckpt_job_pack(const mal_ckpt_job *job, const struct mal_trainer *tr, int k, float *dst);

/* Local.  Floats rank `rank` of a run under `plan` stages for a snapshot
 * (all groups of the blocks it writes). */
int mal_ckpt_staging_floats(const mal_plan *plan, const mal_model_config *cfg, int rank,
                            size_t *floats);

#endif /* MAL_TRAIN_CKPT_JOB_H */
