/* The online fast path in the trainer: move the model state onto a new
 * layout inside the running job, without touching disk or restarting MPI
 * (the new plan comes from change.c, which plans for the measured rates and
 * decides whether the change pays).
 *
 * Every rank takes its old part out of service, builds its new one,
 * hands its state buffers over where the new part begins with the old one,
 * and the state mover (src/migrate.h) moves the rest rank to rank; the new
 * part is wired (communicators, pipeline buffers, gradient sync) and
 * training continues at the next step.  Progress (step, consumed samples)
 * and the counter-based RNG carry over unchanged.
 *
 * A failure part-way returns an error; malleus-train then stops and the job
 * script falls back to the last complete snapshot (the restart path). */
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "src/migrate.h"
#include "train_internal.h"

/* Rank 0 logs the change: its total and, per phase, the slowest rank's
 * time (and at debug level every rank's).  Collective (a gather after the
 * change is complete, outside its timing). */
static int log_times(struct mal_trainer *tr)
{
    enum { K = 10, STARTED = 8, HANDED = 9 };
    mal_online *on = &tr->online;
    const mal_migration_times *t = &on->times;
    double mine[K] = {t->total,      t->build,          t->move,       t->wait,    t->wire,
                      t->bytes_sent, t->bytes_received, t->bytes_kept, t->started, t->handed_over};
    double *all = NULL;
    int n = tr->world_size, rc;
    if (tr->world_rank == 0 && !(all = malloc(sizeof *all * K * (size_t)n)))
        return MAL_ERR(MAL_ENOMEM, "migration: out of memory");
    if ((rc = mal_comm_gather(tr->world, mine, all, sizeof mine, 0)) || tr->world_rank) {
        free(all);
        return rc;
    }
    double mx[K] = {0}, first = all[STARTED];
    int slowest = 0;
    for (int r = 1; r < n; r++)
        first = MAL_MIN(first, all[K * r + STARTED]);
    for (int r = 0; r < n; r++) {
        for (int k = 0; k < K; k++)
            mx[k] = MAL_MAX(mx[k], all[K * r + k]);
        if (all[K * r] > all[K * slowest]) slowest = r;
        mal_log(MAL_LOG_DEBUG,
                "  rank %d: %.3f s (started %.3f s after the first rank; new part %.3f, state "
                "%.3f, waiting %.3f, communicators %.3f); sent %.1f MiB, received %.1f MiB, kept "
                "%.1f MiB%s",
                r, all[K * r], all[K * r + STARTED] - first, all[K * r + 1], all[K * r + 2],
                all[K * r + 3], all[K * r + 4], all[K * r + 5] / 1048576.0,
                all[K * r + 6] / 1048576.0, all[K * r + 7] / 1048576.0,
                all[K * r + HANDED] ? " (state buffers handed over, not copied)" : "");
    }
    mal_log(MAL_LOG_INFO,
            "online migration %d at step %lld: %.1f MiB moved, %.1f MiB kept in place, %.3f s "
            "(slowest rank %d; per phase, slowest rank: new part %.3f s, state %.3f s, waiting "
            "%.3f s, communicators and buffers %.3f s; most sent by one rank %.1f MiB, received "
            "%.1f MiB)",
            on->migrations, (long long)tr->step, on->migrated_bytes / 1048576.0,
            on->kept_bytes / 1048576.0, mx[0], slowest, mx[1], mx[2], mx[3], mx[4],
            mx[5] / 1048576.0, mx[6] / 1048576.0);
    on->slowest_s = mx[0];
    free(all);
    return 0;
}

/* Move the running job onto `next` (validated here; same on every rank).
 * Collective. */
int mal_trainer_change_plan(struct mal_trainer *tr, const mal_plan *next_in)
{
    mal_online *on = &tr->online;
    mal_plan next, old_plan;
    double t0 = mal_now();
    int rc;
    if (!tr->world) return MAL_ERR(MAL_EINVAL, "a plan change needs MPI");
    /* A background snapshot (of the old plan's blocks, in staging sized
     * for them) is finished first: one snapshot in flight, never across a
     * change. */
    if ((rc = mal_trainer_snapshot_wait(tr))) return rc;
    if ((rc = mal_plan_copy(&next, next_in))) return rc;
    if ((rc = mal_plan_validate(&next, tr->world_size, tr->o.model.n_layers, tr->o.model.n_heads,
                                tr->o.model.ffn_hidden, tr->o.global_batch))) {
        mal_plan_fini(&next);
        return rc;
    }
    /* Sharded (--zero 1), the moments are made whole on the old part first
     * (collective over its holder sets) and moved whole; the new part's
     * gradient sync keeps this rank's share of them (wire_part).  The
     * change's peak holds whole moments, as without --zero 1; a sharded
     * master (--zero-master on) is gathered whole likewise, and sharded
     * again by the new part's wire_part. */
    if (tr->part.gsync && (rc = mal_gradsync_zero_gather(tr->part.gsync))) {
        mal_plan_fini(&next);
        return rc;
    }
    /* Take the old part out of service, build the new one, move the state. */
    mal_model *old = mal_trainer_retire_part(tr);
    /* The old part is only read from now: its gradients and scratch go
     * first, so the peak is old state + new part, and the new part can
     * reuse memory just given back instead of fresh pages. */
    mal_model_release_work(old);
    old_plan = tr->plan;
    tr->plan = next;
    mal_migrate_stats ms;
    int handed = 0; /* this rank's state buffers went to the new part */
    memset(&on->times, 0, sizeof on->times);
    /* every parameter is overwritten by the state moved in */
    if ((rc = mal_trainer_build_part(tr, 0, 1))) goto out;
    /* A rank whose new part begins with its old one - the same part (a
     * pipeline the change leaves alone) or one extended by later layers -
     * hands its state buffers over instead of copying them. */
    if ((rc = mal_migrate_hand_over(old, tr->part.model, &handed))) goto out;
    on->times.handed_over = handed;
    double t_build = mal_now() - t0, t_move = mal_now();
    if ((rc = mal_migrate_state(tr->world, tr->k, &tr->o.model, &old_plan, old, &tr->plan,
                                tr->part.model, tr->o.ranks_per_node, handed, &ms)))
        goto out;
    t_move = mal_now() - t_move;
    /* Timed separately so the log tells this rank's own copying from waiting
     * for the slowest rank to finish receiving. */
    double t_wait = mal_now();
    if ((rc = mal_comm_barrier(tr->world))) goto out;
    t_wait = mal_now() - t_wait;
    double t_wire = mal_now();
    /* The old plan's gradient sync is gone and the new one's not made: no
     * reduction on a member list is in flight, and every rank is here, so
     * the data plane may let go of the lists least recently used (NCCL
     * keeps a communicator per list: without this a long elastic run would
     * accumulate them without bound). */
    if ((rc = mal_comm_dp_trim(tr->part.sync_world))) goto out;
    if ((rc = mal_trainer_wire_part(tr))) goto out;
    t_wire = mal_now() - t_wire;
    on->migrations++;
    on->times.total = mal_now() - t0;
    on->times.started = t0;
    on->times.build = t_build;
    on->times.move = t_move;
    on->times.wait = t_wait;
    on->times.wire = t_wire;
    on->times.bytes_sent = ms.sent;
    on->times.bytes_received = ms.received;
    on->times.bytes_kept = ms.kept_here;
    on->migrated_bytes = ms.moved;
    on->kept_bytes = ms.kept;
    mal_ckpt_async_plan_changed(tr);
    rc = log_times(tr);
    /* the run's record: a new generation, costing the slowest rank's time */
    mal_progress_plan_changed(tr, tr->plan.predicted_step_time,
                              tr->world_rank == 0 ? on->slowest_s : on->times.total, 1);
out:
    mal_model_destroy(old);
    mal_plan_fini(&old_plan);
    return rc;
}

int mal_trainer_migrations(const mal_trainer *tr, double *moved, double *kept)
{
    if (moved) *moved = tr->online.migrated_bytes;
    if (kept) *kept = tr->online.kept_bytes;
    return tr->online.migrations;
}

void mal_trainer_migration_times(const mal_trainer *tr, mal_migration_times *out)
{
    *out = tr->online.times;
}
