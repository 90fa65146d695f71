/* The trainer's snapshot directory at start-up (ckpt_start.c): what a run
 * may resume and overwrite there, decided and refused before training,
 * and the directory held (locked) for the run.  Called by ckpt.c, which
 * restores from what this finds.  Not installed. */
#ifndef MAL_TRAIN_CKPT_START_H
#define MAL_TRAIN_CKPT_START_H

#include <stddef.h>

struct mal_trainer;

/* Collective over the world; every rank returns the same code.  For a run
 * with o.snapshot_dir: with o.resume, the snapshot to resume (the newest
 * committed one, or o.resume_from's) into `path` (`len` bytes; "" when
 * not resuming), refused (MAL_EINVAL) when o.steps is below its step; for a run that writes snapshots, rank 0 opens the directory as
 * its destination (mal_snap_dest_open: created, locked, probed) and
 * refuses it when it holds snapshots the run would bury or write again --
 * another run's (no --resume), or those after the step resumed -- unless
 * o.overwrite_snapshots lets them go (mal_ckpt_start_clear removes them). */
int mal_ckpt_start(struct mal_trainer *tr, char *path, size_t len);

/* Collective.  After a successful restore: remove what
 * o.overwrite_snapshots let go (rank 0), agreed. */
int mal_ckpt_start_clear(struct mal_trainer *tr);

/* Local.  Let go of the directory (its lock); `undo` removes the
 * directories mal_ckpt_start created (a run refused at start leaves
 * nothing behind).  Safe to call twice. */
void mal_ckpt_start_release(struct mal_trainer *tr, int undo);

#endif /* MAL_TRAIN_CKPT_START_H */
