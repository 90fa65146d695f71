/* The trainer's snapshots (trainer layer; the snapshot files are ckpt/'s):
 * what was saved last, the synchronous save, and how a run is restored
 * from one, for any plan and world size; it starts, feeds and stops the
 * background writer (ckpt_async.c).  A snapshot is described and written
 * by ckpt_job.c, which both use.
 *
 * Restoring reads, on every active rank, exactly the local shard of every
 * tensor it holds, from whatever blocks the snapshot stores: the snapshot
 * may come from any plan and any world size (a resharded one reads
 * locally; any other one still loads, with more of it read per rank).
 * Each restored shard is copied in from the host through the kernel
 * table. */
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "ckpt/load.h"
#include "ckpt/snapshot.h"
#include "ckpt_start.h"
#include "init_from.h"
#include "src/data.h"
#include "train_internal.h"

int mal_train_ckpt_save(struct mal_trainer *tr, const char *dir)
{
    if (!dir) return MAL_ERR(MAL_EINVAL, "no --snapshot-dir to save into");
    /* one snapshot at a time, and HDF5 on one thread at a time */
    int rc = mal_trainer_snapshot_wait(tr);
    if (rc) return rc;
    double t0 = mal_now();
    mal_ckpt_job job;
    char path[4096];
    mal_ckpt_job_prepare(tr, dir, &job);
    rc = mal_ckpt_job_write(&job, tr->world, tr, NULL, path, sizeof path);
    if (!rc) {
        double dt = mal_now() - t0;
        tr->ckpt.saved_step = tr->step;
        tr->ckpt.stats = (mal_snapshot_stats){tr->step, 0, dt, 0, dt, 4.0 * (double)job.floats, 0};
        /* finish is collective and commits after every rank is done: rank
         * 0's time is the snapshot's */
        if (tr->world_rank == 0) mal_log(MAL_LOG_INFO, "snapshot written: %s (%.3f s)", path, dt);
    }
    mal_ckpt_job_fini(&job);
    return rc;
}

/* Sharded (--zero 1): both moments of every block this rank keeps, read
 * from snapshot s whatever wrote it (blocks are read as any rectangle). */
static int load_zero_moments(struct mal_trainer *tr, mal_snapshot *s)
{
    mal_model *m = tr->part.model;
    mal_zero_block *zb = NULL;
    int n = 0, rc = mal_gradsync_zero_blocks(tr->part.gsync, 1, &zb, &n);
    size_t most = 0;
    for (int i = 0; i < n; i++)
        most = MAL_MAX(most, zb[i].n);
    float *host = rc ? NULL : malloc((most + 1) * sizeof *host);
    if (!rc && !host) rc = MAL_ERR(MAL_ENOMEM, "resume: out of memory");
    for (int g = MAL_STATE_ADAM_M; g <= MAL_STATE_ADAM_V && !rc; g++)
        for (int i = 0; i < n && !rc; i++) {
            const mal_tensor_info *t = &m->tensors[zb[i].tensor];
            char name[96];
            snprintf(name, sizeof name, "%s/%s", mal_model_state_name(g), t->name);
            mal_snap_tensor want = {.name = name, .ndim = t->ndim, .data = host};
            for (int d = 0; d < t->ndim; d++) {
                want.shape[d] = t->shape[d];
                want.offset[d] = zb[i].offset[d];
                want.extent[d] = zb[i].extent[d];
            }
            if (!(rc = mal_snapshot_read_block(s, &want))) {
                mal_gradsync_zero_from_host(tr->part.gsync, g, zb[i].at, zb[i].n, host);
                rc = mal_kern_sync(m->k); /* host is reused */
            }
        }
    free(host);
    free(zb);
    return rc;
}

/* Restore the state from step directory `path` (mal_ckpt_start's).
 * Collective; every rank returns the same code. */
static int restore(struct mal_trainer *tr, const char *path)
{
    mal_snapshot *s = NULL;
    int rc = mal_snapshot_open(&s, path);
    /* the run is the snapshot's run, unless told otherwise (resume.c) */
    if (!rc) rc = mal_train_resume_check(tr, mal_snapshot_meta(s), path);
    if (!rc && tr->part.model) {
        /* a sharded master is loaded whole into the gradient buffer, then
         * this rank's shard taken from it (no memory beside the part's) */
        mal_gradsync_zero_master_stage(tr->part.gsync);
        rc = tr->o.zero ? mal_load_state(s, tr->part.model, 1) : /* the parameters */
                 mal_load_state(s, tr->part.model, MAL_STATE_N_SAVED);
        int rc2 = mal_gradsync_zero_master_unstage(tr->part.gsync);
        if (!rc) rc = rc2;
    }
    if (!rc && tr->part.model && tr->o.zero) rc = load_zero_moments(tr, s);
    /* A rank that failed (a corrupt block only it reads) must stop all:
     * every rank returns the first failure, so nothing trains on a
     * partly loaded state. */
    rc = mal_snapshot_agree(tr->world, rc);
    if (!rc) {
        const mal_snap_meta *meta = mal_snapshot_meta(s);
        tr->step = meta->step;
        tr->ckpt.saved_step = meta->step;
        if (tr->world_rank == 0) {
            mal_plan was;
            mal_plan_init(&was);
            int same = meta->plan_json && !mal_plan_parse_string(&was, meta->plan_json, path) &&
                       mal_plan_same_layout(&was, &tr->plan);
            mal_plan_fini(&was);
            mal_log(MAL_LOG_INFO, "resumed from %s at step %lld (%lld samples consumed)%s", path,
                    (long long)meta->step, (long long)meta->consumed_samples,
                    same ? "" : " written under another plan");
        }
    }
    mal_snapshot_close(s);
    return rc;
}

int mal_train_ckpt_init(struct mal_trainer *tr)
{
    mal_train_ckpt *c = &tr->ckpt;
    int rc;
    char path[4096] = "";
    c->saved_step = -1;
    c->stats.step = -1;
    /* the directory first (refusals before anything is loaded), then the
     * state (resumed, or the parameters a new run starts from), then what
     * --overwrite-snapshots lets go: only once the state has loaded */
    if ((tr->o.snapshot_dir && (rc = mal_ckpt_start(tr, path, sizeof path))) ||
        (tr->o.resume && (rc = restore(tr, path))) ||
        (tr->o.init_from && (rc = mal_train_init_from(tr))) || (rc = mal_ckpt_start_clear(tr))) {
        mal_ckpt_start_release(tr, 1);
        return rc; /* agreed */
    }
    c->start_step = tr->step;
    /* the background snapshot writer, after resume: HDF5 stays on this
     * thread until a writer starts */
    rc = mal_ckpt_async_create(tr);
    if (tr->world && tr->world_size > 1) rc = mal_snapshot_agree(tr->world, rc);
    return rc;
}

void mal_train_ckpt_fini(struct mal_trainer *tr)
{
    /* a background snapshot still being written needs the world */
    mal_ckpt_async_destroy(tr);
    /* then the directory's lock: the last snapshot is committed */
    mal_ckpt_start_release(tr, 0);
}

int mal_trainer_save_background(mal_trainer *tr)
{
    /* without a writer (none asked for, or MPI without the thread level
     * it needs), the snapshot is written now */
    if (!tr->ckpt.async) return mal_train_ckpt_save(tr, tr->o.snapshot_dir);
    return mal_ckpt_async_save(tr);
}

void mal_trainer_snapshot_stats(const mal_trainer *tr, mal_snapshot_stats *out)
{
    *out = tr->ckpt.stats;
}
