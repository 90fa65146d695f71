/* The background snapshot writer (ckpt_async.c), below the trainer's
 * snapshot glue (ckpt.c), which starts it, stops it and hands it the
 * snapshots to write; it writes through ckpt_job.c and never calls ckpt.c.
 * Its public face is train.h's mal_trainer_snapshot_poll and _wait.  Not
 * installed. */
#ifndef MAL_TRAIN_CKPT_ASYNC_H
#define MAL_TRAIN_CKPT_ASYNC_H

struct mal_trainer;

/* Collective; when o.snapshot_async and o.snapshot_dir: the writer, into
 * tr->ckpt.async - its duplicate of the world, HDF5 started on this thread,
 * the staging buffers allocated and touched (with MPI short of
 * MPI_THREAD_MULTIPLE, none: a warning).  A failure leaves what was made
 * for _destroy. */
int mal_ckpt_async_create(struct mal_trainer *tr);
/* Collective: wait for a write in flight (a failure nobody collected is
 * logged), free everything. */
void mal_ckpt_async_destroy(struct mal_trainer *tr);

/* Collective over the world, with a writer: wait for the write in flight,
 * stage this rank's blocks of the state into host memory and start the
 * writer on them (mal_trainer_save_background). */
int mal_ckpt_async_save(struct mal_trainer *tr);

/* Local, after a plan change: the staging buffers re-sized for the blocks
 * this rank writes under the new plan (none on a suspended rank). */
void mal_ckpt_async_plan_changed(struct mal_trainer *tr);

#endif /* MAL_TRAIN_CKPT_ASYNC_H */
