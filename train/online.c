/* The online fast path in the trainer: plan anew for the measured rates
 * inside the running job and move the model state onto the new layout,
 * without touching disk or restarting MPI.
 *
 * Rank 0 runs the planner (replan/replan.h) on the policy's windowed rates
 * with the current plan as the starting point (so ranks keep as much state as
 * possible) and broadcasts the plan text; every rank parses and validates it.
 * Then every rank takes its old part out of service, builds its new one,
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
#include "replan/replan.h"
#include "src/migrate.h"
#include "train_internal.h"

/* Rank 0: the new plan as JSON text (NULL when planning failed). */
static char *plan_on_rank0(struct mal_trainer *tr)
{
    const mal_train_options *o = &tr->o;
    mal_cluster cl;
    mal_profile prof;
    mal_plan out;
    char *text = NULL;
    int rc;
    double *rates = malloc(sizeof *rates * (size_t)tr->world_size);
    memset(&cl, 0, sizeof cl);
    memset(&prof, 0, sizeof prof);
    mal_plan_init(&out);
    if (!rates) goto done;
    mal_monitor_mean_rates(tr, rates);
    int rpn = o->ranks_per_node > 0 ? o->ranks_per_node : tr->world_size;
    if ((rc = mal_cluster_regular(&cl, tr->world_size, rpn,
                                  o->device_memory_mb > 0 ? o->device_memory_mb : 16384.0)))
        goto fail;
    if (o->profile && strchr(o->profile, '.'))
        rc = mal_profile_read(&prof, o->profile, tr->plan.micro_batch_size);
    else
        rc = mal_profile_preset(&prof, o->profile ? o->profile : o->model.name,
                                tr->plan.micro_batch_size);
    if (rc) goto fail;
    /* every rank waits for this plan: the search stops at the time limit
     * with the best plan found so far */
    double limit = o->planner_time_limit > 0   ? o->planner_time_limit
                   : o->planner_time_limit < 0 ? 0
                                               : MAL_REPLAN_ONLINE_TIME_LIMIT;
    mal_replan_input in = {&cl,
                           &prof,
                           rates,
                           tr->plan.micro_batch_size,
                           mal_plan_n_micro_batches(&tr->plan),
                           0,
                           &tr->plan,
                           MAL_REPLAN_AUTO,
                           limit};
    mal_replan_stats stats;
    if ((rc = mal_replan(&in, &out, &stats))) goto fail;
    if ((rc = mal_plan_to_string(&out, &text))) goto fail;
    mal_log(MAL_LOG_INFO, "replan: new plan in %.3f s (%d pipelines, %d suspended)", stats.seconds,
            out.n_pipelines, out.n_suspended);
    if (stats.stop == MAL_REPLAN_STOP_TIME) {
        char line[256];
        mal_replan_describe_search(&stats, &prof, line, sizeof line);
        mal_log(MAL_LOG_INFO, "replan: %s", line);
    }
    goto done;
fail:
    mal_log(MAL_LOG_WARN, "replan failed, keeping the current plan: %s", mal_errmsg());
done:
    mal_plan_fini(&out);
    mal_profile_fini(&prof);
    mal_cluster_fini(&cl);
    free(rates);
    return text;
}

/* Agree on the new plan: rank 0 plans, everybody parses the same text.
 * *changed = 0 when planning failed or the layout is the same. */
static int agree_on_plan(struct mal_trainer *tr, mal_plan *next, int *changed)
{
    char *text = tr->world_rank == 0 ? plan_on_rank0(tr) : NULL;
    int64_t len = text ? (int64_t)strlen(text) + 1 : 0;
    int rc;
    *changed = 0;
    if ((rc = mal_comm_broadcast(tr->world, &len, sizeof len, 0))) goto out;
    if (len == 0) goto out;
    if (!text && !(text = malloc((size_t)len))) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto out;
    }
    if ((rc = mal_comm_broadcast(tr->world, text, (size_t)len, 0))) goto out;
    if ((rc = mal_plan_parse_string(next, text, "the new plan"))) goto out;
    if ((rc = mal_plan_validate(next, tr->world_size, tr->o.model.n_layers, tr->o.model.n_heads,
                                tr->o.model.ffn_hidden, tr->o.global_batch)))
        goto out;
    *changed = !mal_plan_same_layout(next, &tr->plan);
out:
    free(text);
    return rc;
}


/* Rank 0 logs the change: its total and, per phase, the slowest rank's
 * time (and at debug level every rank's).  Collective (a gather after the
 * change is complete, outside its timing). */
static int log_times(struct mal_trainer *tr)
{
    enum { K = 10, STARTED = 8, HANDED = 9 };
    const mal_online *on = &tr->online;
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
    if ((rc = mal_trainer_build_part(tr, 0))) goto out;
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
out:
    mal_model_destroy(old);
    mal_plan_fini(&old_plan);
    return rc;
}

int mal_trainer_replan_online(struct mal_trainer *tr)
{
    mal_plan next;
    int changed = 0, rc;
    if (!tr->world) return 0; /* one rank: nothing to re-plan */
    mal_plan_init(&next);
    if (!(rc = agree_on_plan(tr, &next, &changed)) && changed)
        rc = mal_trainer_change_plan(tr, &next);
    mal_plan_fini(&next);
    /* The rates the (new or kept) plan stands for become the baseline. */
    if (!rc && tr->world_rank == 0) {
        double *means = malloc(sizeof *means * (size_t)tr->world_size);
        if (!means) return MAL_ERR(MAL_ENOMEM, "re-plan: out of memory");
        mal_monitor_mean_rates(tr, means);
        rc = mal_monitor_set_plan(tr, means);
        free(means);
    }
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
