/* The background snapshot writer (trainer layer): the step loop copies the
 * state it snapshots - fp32 master weights, Adam m and v, this rank's
 * blocks of each (ckpt_job.c) - from the device into pinned host staging
 * buffers through the kernel table, hands them to a thread of its own and
 * trains on while that thread writes and commits them with the collective
 * writer of ckpt/ (snapshot.h), exactly as a synchronous save would: the
 * same blocks in the same order, the same files, the same commit protocol,
 * so a snapshot is visible only once complete and a crash mid-write leaves
 * the previous one.
 *
 * What each thread may touch:
 *  - the writer thread reads the staging buffers (host memory) and calls
 *    the snapshot writer, hence HDF5 and the comm table's control plane,
 *    on a duplicate of the world made for it alone (its broadcasts and
 *    gathers never match the step loop's messages).  It never touches
 *    the kernel table, the model or the trainer;
 *  - the step loop does not call HDF5 while a writer runs (HDF5 is built
 *    without thread safety): every other snapshot call of the trainer -
 *    a synchronous save, a plan change, the end of the run - waits for
 *    the writer first, and resume only happens before the first one;
 *  - MPI is called by both at once, so a job of several ranks needs the
 *    thread level MPI_THREAD_MULTIPLE (mal_comm_init_threads); without it
 *    snapshots stay synchronous, with a warning.
 *
 * One snapshot is in flight at a time: the staging buffers are reused, so
 * a second request waits for the first.  The writers of all ranks finish
 * at about the same time (the commit ends with a broadcast), but each
 * rank's loop learns it at its own moment; so the loop asks every step,
 * with a min-reduce over the world while a write is in flight, whether
 * every writer is done, and all ranks collect it at the same step: a
 * failure then comes back on every rank alike, as a synchronous save's
 * would.
 *
 * The writer sits below the trainer's snapshot glue (ckpt.c), which
 * creates it, hands it the snapshots to take in the background and
 * destroys it; it describes and writes them through ckpt_job.c, as the
 * synchronous save does, and never calls ckpt.c. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mal.h"
#include "ckpt/snapshot.h"
#include "src/piece.h"
#include "train_internal.h"

typedef struct mal_ckpt_async {
    mal_comm *comm;      /* the writer's duplicate of the world (NULL: one rank) */
    float *stage;        /* pinned host staging area, kept between snapshots */
    size_t stage_floats; /* its size */
    mal_kern k;          /* whose host_alloc it came from */

    /* the write in flight */
    int busy; /* a writer was started and not collected yet */
    pthread_t thread;
    int threaded; /* 0: pthread_create failed, it was written inline */
    mal_ckpt_job job;
    atomic_int done; /* set by the writer when it returns */
    int rc;          /* its result, and its message (the writer's own) */
    char msg[1024];
    char path[4096];
    double write_s;          /* begin to commit, on the writer */
    double stall_s, stage_s; /* what the request cost the loop, and its copy */
    int polls;               /* steps the loop trained while it was in flight */

    /* test hook MALLEUS_TEST_SNAPSHOT_HOLD=N: the writer starts only after
     * the loop polled N times (or waits for it) */
    int hold;
    atomic_int polled, released;
} mal_ckpt_async;

/* Pinned staging for `floats`, touched once so that the page faults of a
 * fresh allocation are paid here and not inside the loop's stall. */
static int stage_reserve(mal_ckpt_async *a, size_t floats)
{
    if (floats <= a->stage_floats) return 0;
    if (a->stage) mal_kern_host_free(a->k, a->stage);
    a->stage_floats = 0;
    if (!(a->stage = mal_kern_host_alloc(a->k, floats * sizeof(float))))
        return MAL_ERR(MAL_ENOMEM,
                       "snapshot: no pinned host memory for %.1f MiB of staging buffers (the "
                       "background writer's copy of this rank's share of the state); write "
                       "snapshots synchronously (drop --snapshot-async)",
                       (double)floats * 4 / 1048576.0);
    memset(a->stage, 0, floats * sizeof(float)); /* host memory: the staging area's own */
    a->stage_floats = floats;
    return 0;
}

int mal_ckpt_async_create(struct mal_trainer *tr)
{
    if (!tr->o.snapshot_async || !tr->o.snapshot_dir) return 0;
    int multi = tr->world && tr->world_size > 1;
    if (multi && mal_comm_thread_level() != MAL_COMM_THREADS_MANY) {
        if (tr->world_rank == 0)
            mal_log(MAL_LOG_WARN,
                    "--snapshot-async: MPI provides %s, but a background writer that "
                    "communicates while the step loop does needs MPI_THREAD_MULTIPLE; "
                    "snapshots are written synchronously",
                    mal_comm_thread_level_name());
        return 0;
    }
    /* The writer's communicator first: collective, so every rank makes it
     * whatever fails below (the caller agrees on the outcome).  Every rank
     * of the world, suspended ones too, takes part in the commit; control
     * plane only, so the "mpi" backend. */
    mal_comm *comm = NULL;
    int rc = multi ? mal_comm_dup(tr->world, "mpi", &comm) : 0;
    mal_ckpt_async *a = calloc(1, sizeof *a);
    if (!a) {
        mal_comm_destroy(comm);
        return rc ? rc : MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    tr->ckpt.async = a;
    a->comm = comm;
    a->k = tr->k;
    const char *h = getenv("MALLEUS_TEST_SNAPSHOT_HOLD");
    a->hold = h ? atoi(h) : 0;
    /* HDF5 starts on this thread: its start-up registers with MPI */
    if (!rc) rc = mal_snapshot_library_init();
    size_t floats = 0;
    if (!rc && tr->part.model &&
        !(rc = mal_ckpt_staging_floats(&tr->plan, &tr->o.model, tr->world_rank, &floats)))
        rc = stage_reserve(a, floats);
    return rc;
}

void mal_ckpt_async_plan_changed(struct mal_trainer *tr)
{
    mal_ckpt_async *a = tr->ckpt.async;
    size_t floats = 0;
    if (!a || (tr->part.model &&
               mal_ckpt_staging_floats(&tr->plan, &tr->o.model, tr->world_rank, &floats)))
        return;
    if (floats == a->stage_floats) return;
    /* sized for the new plan now, not in the next snapshot's stall; what
     * fails here is tried again (and reported on every rank) then */
    if (a->stage) mal_kern_host_free(a->k, a->stage);
    a->stage = NULL;
    a->stage_floats = 0;
    if (floats && stage_reserve(a, floats))
        mal_log(MAL_LOG_WARN, "rank %d: %s", tr->world_rank, mal_errmsg());
}

static void *writer_main(void *arg)
{
    mal_ckpt_async *a = arg;
    while (a->hold > 0 && atomic_load(&a->polled) < a->hold && !atomic_load(&a->released)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    double t0 = mal_now();
    a->rc = mal_ckpt_job_write(&a->job, a->comm, NULL, a->stage, a->path, sizeof a->path);
    /* the message lives in this thread's error buffer: copy it out */
    if (a->rc) snprintf(a->msg, sizeof a->msg, "%s", mal_errmsg());
    a->write_s = mal_now() - t0;
    atomic_store(&a->done, 1);
    return NULL;
}

/* Collect the finished writer: join it, agree on the outcome over the
 * world (the writers agreed already; this also covers a writer whose own
 * communication failed), record and log it.  Collective. */
static int collect(struct mal_trainer *tr)
{
    mal_ckpt_async *a = tr->ckpt.async;
    if (a->threaded) pthread_join(a->thread, NULL);
    int rc = a->rc ? MAL_ERR(a->rc,
                             "the snapshot of step %lld, written in the background, "
                             "failed: %s",
                             (long long)a->job.meta.step, a->msg)
                   : 0;
    rc = mal_snapshot_agree(tr->world, rc);
    if (!rc) {
        tr->ckpt.stats = (mal_snapshot_stats){
            a->job.meta.step, 1, a->stall_s, a->stage_s, a->write_s, 4.0 * (double)a->job.floats,
            a->polls};
        if (tr->world_rank == 0)
            mal_log(MAL_LOG_INFO,
                    "snapshot written in the background: %s (%.3f s; the loop stalled %.3f s "
                    "and trained %d step%s meanwhile)",
                    a->path, a->write_s, a->stall_s, a->polls, a->polls == 1 ? "" : "s");
    }
    mal_ckpt_job_fini(&a->job);
    a->busy = 0;
    return rc;
}

int mal_trainer_snapshot_poll(mal_trainer *tr, int *busy)
{
    mal_ckpt_async *a = tr->ckpt.async;
    *busy = 0;
    /* every rank knows alike whether a write is in flight: it was started
     * by a collective call */
    if (!a || !a->busy) return 0;
    atomic_fetch_add(&a->polled, 1);
    a->polls++; /* a poll follows a step trained while it was in flight */
    int done = atomic_load(&a->done), rc;
    if (tr->world && tr->world_size > 1 && (rc = mal_comm_allreduce_min_int(tr->world, &done, 1)))
        return rc;
    if (!done) {
        *busy = 1;
        return 0;
    }
    return collect(tr);
}

int mal_trainer_snapshot_wait(mal_trainer *tr)
{
    mal_ckpt_async *a = tr->ckpt.async;
    if (!a || !a->busy) return 0;
    atomic_store(&a->released, 1);
    /* the join sleeps; the writer's own waits sleep too (comm.h) */
    return collect(tr);
}

int mal_ckpt_async_save(mal_trainer *tr)
{
    mal_ckpt_async *a = tr->ckpt.async;
    if (!tr->o.snapshot_dir) return MAL_ERR(MAL_EINVAL, "no --snapshot-dir to save into");
    double t0 = mal_now();
    int rc = mal_trainer_snapshot_wait(tr); /* one in flight at a time */
    if (rc) return rc;
    if (tr->world_rank == 0 && mal_now() - t0 > 1e-3)
        mal_log(MAL_LOG_INFO, "snapshot of step %lld waited %.3f s for the previous one",
                (long long)tr->step, mal_now() - t0);

    /* Stage: this rank's blocks of all groups, device -> pinned host,
     * queued back to back and synchronised once.  A failure here is
     * local; the writer reports it on every rank. */
    mal_ckpt_job *job = &a->job;
    mal_ckpt_job_prepare(tr, tr->o.snapshot_dir, job);
    double s0 = mal_now();
    if (!job->local_rc && job->n_blocks && !(rc = stage_reserve(a, job->floats))) {
        mal_model *m = tr->part.model;
        for (int k = 0; k < job->n_blocks; k++)
            mal_ckpt_job_pack(job, tr, k, a->stage + job->offset[k]);
        rc = mal_kern_sync(m->k);
    }
    if (rc) {
        job->local_rc = rc;
        snprintf(job->local_msg, sizeof job->local_msg, "%s", mal_errmsg());
    }
    a->stage_s = mal_now() - s0;

    /* Start the writer.  Every rank does, whatever happened above: its
     * collectives need all of them. */
    atomic_store(&a->done, 0);
    atomic_store(&a->polled, 0);
    atomic_store(&a->released, 0);
    a->rc = 0;
    a->msg[0] = a->path[0] = '\0';
    a->polls = 0;
    a->busy = 1;
    a->threaded = pthread_create(&a->thread, NULL, writer_main, a) == 0;
    if (!a->threaded) {
        /* no thread to be had: write on this one (the other ranks' writers
         * meet it on the writer's communicator all the same) */
        mal_log(MAL_LOG_WARN,
                "rank %d: cannot start the background snapshot writer; writing "
                "synchronously",
                tr->world_rank);
        atomic_store(&a->released, 1);
        writer_main(a);
    }
    tr->ckpt.saved_step = tr->step;
    a->stall_s = mal_now() - t0;
    if (tr->world_rank == 0)
        mal_log(MAL_LOG_DEBUG, "snapshot of step %lld staged in %.3f s; writing in the background",
                (long long)tr->step, a->stage_s);
    return 0;
}

void mal_ckpt_async_destroy(struct mal_trainer *tr)
{
    mal_ckpt_async *a = tr->ckpt.async;
    if (!a) return;
    /* a write nobody collected (the run ended early on another error):
     * finish it, since its peers' writers wait for this one */
    if (a->busy && mal_trainer_snapshot_wait(tr)) mal_log(MAL_LOG_ERROR, "%s", mal_errmsg());
    if (a->stage) mal_kern_host_free(a->k, a->stage);
    mal_comm_destroy(a->comm);
    free(a);
    tr->ckpt.async = NULL;
}
