/* The trainer's snapshots (ckpt.c): what was saved last, the synchronous
 * save, resume, and the background writer (ckpt_async.c) started and
 * stopped with them.  Calls go down: ckpt.c -> ckpt_async.c ->
 * ckpt_job.c, and ckpt.c -> ckpt_job.c.  Not installed. */
#ifndef MAL_TRAIN_CKPT_H
#define MAL_TRAIN_CKPT_H

#include <stdint.h>

#include "train.h"

struct mal_trainer;
struct mal_ckpt_async;
struct mal_snap_dest;

/* Owned by ckpt.c (mal_train_ckpt_init / _fini); ckpt_async.c records in
 * it the snapshots its writer starts and commits. */
typedef struct {
    int64_t saved_step;           /* the step of the last snapshot taken (-1: none) */
    mal_snapshot_stats stats;     /* the last snapshot collected */
    struct mal_ckpt_async *async; /* the background writer (NULL: synchronous only) */
    /* the snapshot directory, held for the run (ckpt_start.c) */
    struct mal_snap_dest *dest;   /* rank 0 of a run that writes snapshots: locked */
    int clear;                    /* --overwrite-snapshots: snapshots to remove after restore */
    int64_t clear_after;          /* ... those above this step (-1: all) */
    int64_t start_step;           /* the step training starts from (0, or the one resumed) */
} mal_train_ckpt;

/* Collective over the world.  The run's snapshot state at start-up: the
 * snapshot directory checked and held (ckpt_start.h: what may be resumed
 * and overwritten, refused before training); with o.resume, the state
 * restored from the newest committed snapshot in o.snapshot_dir (or
 * o.resume_from's); then the background writer, when asked for.  Every
 * rank returns the same code.  _fini (collective) waits for a write in
 * flight, stops the writer and lets go of the directory; after a failed
 * _init too. */
int mal_train_ckpt_init(struct mal_trainer *tr);
void mal_train_ckpt_fini(struct mal_trainer *tr);

/* Collective over the world.  Write a snapshot of the state now into `dir`
 * (NULL: an error), after waiting for a background write in flight. */
int mal_train_ckpt_save(struct mal_trainer *tr, const char *dir);

#endif /* MAL_TRAIN_CKPT_H */
