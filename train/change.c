/* Acting on the monitor's advice: a plan change only when it pays.
 *
 * The policy (replan/policy.h) says a rate has moved for good; whether to
 * act is a second question.  Rank 0 plans for the policy's windowed rates
 * with the current plan as the starting point (so ranks keep as much state
 * as possible), and the cost model predicts the step time of both plans
 * for those rates.  The gain is the measured step time scaled by that
 * ratio over the steps still to run; the cost is what the last change of
 * the same kind measured (an online change: its slowest rank's migration;
 * a restart: from the last step before it to the first after it, through
 * the snapshot, the planner, the reshard and the start of the job), else
 * an estimate, or --change-cost.  The change goes ahead only when the gain
 * exceeds the cost.  Every rank learns the verdict (and, online, the new
 * plan's text) from rank 0.  When the change does not pay, or the planner
 * keeps the plan, the measured rates become the policy's baseline: it
 * advises again only when they move once more.
 *
 * When rank 0 cannot plan (no planner profile for a model given as a file,
 * or the planner fails), an online change is not made; a restart goes
 * ahead as advised (the job script's malleus-replan may still plan). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mal.h"
#include "replan/policy.h"
#include "replan/replan.h"
#include "train_internal.h"

/* An online change's cost before the first is measured: the planner's
 * time and the state to move at this rate (bytes per second). */
#define FIRST_MOVE_RATE 1e9

/* The planner profile the run plans with: --planner-profile (a preset or
 * a JSON file), else the model's preset; its state counted at this run's
 * bytes a parameter (fp32 master, gradient and moments, and a working
 * copy where the compute dtype keeps one apart: 18 in bf16), whatever the
 * profile assumed (a preset 16). */
static int load_profile(const struct mal_trainer *tr, mal_profile *prof)
{
    const mal_train_options *o = &tr->o;
    int rc = o->profile && strchr(o->profile, '.')
                 ? mal_profile_read(prof, o->profile, tr->plan.micro_batch_size)
                 : mal_profile_preset(prof, o->profile ? o->profile : o->model.name,
                                      tr->plan.micro_batch_size);
    const double want = 16.0 + (mal_model_separate_work(tr->k)
                                    ? (double)mal_dtype_bytes(tr->k->compute)
                                    : 0.0),
                 has = prof->state_bytes > 0 ? prof->state_bytes : 16.0;
    if (!rc && has != want && mal_profile_set_state_bytes(prof, want)) {
        /* a hand-written profile whose layer memory is not state plus
         * activations per micro-batch in flight: planned as it says */
        if (tr->world_rank == 0)
            mal_log(MAL_LOG_WARN,
                    "online planner: %s (planning with %g bytes of state a parameter, not this "
                    "run's %g)",
                    mal_errmsg(), has, want);
        mal_clearerr();
    }
    /* the run's moments, sharded or whole, in the memory of every plan */
    prof->zero = o->zero;
    prof->zero_master = o->zero && o->zero_master;
    return rc;
}

static int load_cluster(const struct mal_trainer *tr, mal_cluster *cl)
{
    const mal_train_options *o = &tr->o;
    int rpn = o->ranks_per_node > 0 ? o->ranks_per_node : tr->world_size;
    return mal_cluster_regular(cl, tr->world_size, rpn,
                               o->device_memory_mb > 0 ? o->device_memory_mb : 16384.0);
}

/* The cost model's step time of `plan` for `rates`, seconds (< 0: none);
 * with slow links `ln` (NULL: none) their communication too, as the
 * planner's plan was predicted. */
static double predict(const mal_plan *plan, const mal_profile *prof, const mal_cluster *cl,
                      const double *rates, const mal_links *ln)
{
    mal_cost_eval ev;
    if (ln && ln->n) {
        double J;
        if (mal_cost_plan_links(plan, prof, cl, rates, ln, NULL, &J) != 0) {
            mal_clearerr();
            return -1;
        }
        return J * prof->layer_time + prof->sync_time;
    }
    if (mal_cost_eval_plan(plan, prof, cl, rates, &ev) != 0) {
        mal_clearerr();
        return -1;
    }
    double t = ev.step_time * prof->layer_time + prof->sync_time;
    mal_cost_eval_fini(&ev);
    return t;
}

void mal_change_predict(struct mal_trainer *tr)
{
    if (tr->world_rank != 0 || tr->plan.predicted_step_time >= 0) return;
    mal_profile prof;
    mal_cluster cl;
    memset(&prof, 0, sizeof prof);
    memset(&cl, 0, sizeof cl);
    double *ones = malloc(sizeof *ones * (size_t)tr->world_size);
    if (ones && !load_profile(tr, &prof) && !load_cluster(tr, &cl)) {
        for (int r = 0; r < tr->world_size; r++)
            ones[r] = tr->o.plan_rates ? tr->o.plan_rates[r] : 1.0;
        tr->plan.predicted_step_time = predict(&tr->plan, &prof, &cl, ones, NULL);
    }
    mal_clearerr(); /* no profile: the prediction stays unknown */
    free(ones);
    mal_profile_fini(&prof);
    mal_cluster_fini(&cl);
}

/* Seconds since this process started (Linux: /proc), or -1. */
static double process_age(void)
{
    char buf[1024];
    double up = -1;
    unsigned long long start = 0;
    FILE *f = fopen("/proc/uptime", "r");
    if (f) {
        if (fscanf(f, "%lf", &up) != 1) up = -1;
        fclose(f);
    }
    f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* field 22, starttime in clock ticks; the command name (field 2) may
     * hold spaces, so count from its closing parenthesis (field 3 on) */
    char *p = strrchr(buf, ')');
    if (!p || up < 0) return -1;
    for (int field = 2; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p, " %llu", &start) != 1) return -1;
    double age = up - (double)start / (double)sysconf(_SC_CLK_TCK);
    return age >= 0 ? age : -1;
}

/* What the change would cost, seconds, and how that is known. */
static double change_cost(const struct mal_trainer *tr, int online, double plan_s,
                          double move_bytes, char *how, size_t len)
{
    const mal_progress *pg = &tr->prog;
    if (tr->o.change_cost >= 0) {
        snprintf(how, len, "--change-cost");
        return tr->o.change_cost;
    }
    if (pg->change_cost_s >= 0 && pg->change_cost_online == online) {
        snprintf(how, len, "measured at the last change");
        return pg->change_cost_s;
    }
    if (online) {
        snprintf(how, len, "estimated: planning %.3f s + %.1f MiB at %.0f MB/s", plan_s,
                 move_bytes / 1048576.0, FIRST_MOVE_RATE / 1e6);
        return plan_s + move_bytes / FIRST_MOVE_RATE;
    }
    /* A restart: this job's own start-up again (launch, MPI, build,
     * resume), a snapshot written, resharded (read and written again),
     * and the planner. */
    double age = process_age();
    double startup = age >= 0 ? age - (mal_now() - pg->t0) : mal_now() - pg->t0;
    double snap = tr->ckpt.stats.step >= 0 ? tr->ckpt.stats.write_s : 0;
    snprintf(how, len, "estimated: start-up %.2f s + 3 x snapshot %.2f s + planning %.3f s",
             startup, snap, plan_s);
    return startup + 3 * snap + plan_s;
}

enum { STAY = 0, GO = 1 };

/* Rank 0: plan for the measured rates and weigh the change.  GO with
 * *text the new plan (online), or GO without one (a restart whose gain
 * cannot be weighed); STAY otherwise. */

/* The planner's time budget for a re-plan the whole job waits on: the
 * search stops at it with the best plan found so far (--planner-time-limit;
 * negative: none). */
static double planner_time_limit(const mal_train_options *o)
{
    return o->planner_time_limit > 0   ? o->planner_time_limit
           : o->planner_time_limit < 0 ? 0
                                       : MAL_REPLAN_ONLINE_TIME_LIMIT;
}

static int weigh_on_rank0(struct mal_trainer *tr, long step, char **text)
{
    const mal_train_options *o = &tr->o;
    const int online = o->adapt == MAL_ADAPT_ONLINE;
    mal_cluster cl;
    mal_profile prof;
    mal_plan out;
    mal_links ln = {0};
    int verdict = online ? STAY : GO, rc;
    double *rates = malloc(sizeof *rates * (size_t)tr->world_size);
    memset(&cl, 0, sizeof cl);
    memset(&prof, 0, sizeof prof);
    mal_plan_init(&out);
    *text = NULL;
    if (!rates) {
        rc = MAL_ERR(MAL_ENOMEM, "re-plan: out of memory");
        goto fail;
    }
    mal_monitor_mean_rates(tr, rates);
    if ((rc = load_cluster(tr, &cl)) || (rc = load_profile(tr, &prof)) ||
        (rc = mal_linkprobe_links(tr, &ln)))
        goto fail;
    for (int i = 0; i < ln.n; i++)
        mal_log(MAL_LOG_INFO, "re-plan: link %d-%d measured %.2fx a healthy link's time",
                ln.l[i].a, ln.l[i].b, ln.l[i].rate);
    mal_replan_input in = {&cl,
                           &prof,
                           rates,
                           tr->plan.micro_batch_size,
                           mal_plan_n_micro_batches(&tr->plan),
                           0,
                           &tr->plan,
                           MAL_REPLAN_AUTO,
                           planner_time_limit(&tr->o),
                           ln.n ? &ln : NULL};
    mal_replan_stats stats;
    if ((rc = mal_replan(&in, &out, &stats))) goto fail;
    mal_log(MAL_LOG_INFO, "replan: new plan in %.3f s (%d pipelines, %d suspended)", stats.seconds,
            out.n_pipelines, out.n_suspended);
    if (stats.stop == MAL_REPLAN_STOP_TIME) {
        char line[256];
        mal_replan_describe_search(&stats, &prof, line, sizeof line);
        mal_log(MAL_LOG_INFO, "replan: %s", line);
    }
    if (mal_plan_same_layout(&out, &tr->plan)) {
        mal_log(MAL_LOG_INFO,
                "re-plan: the planner keeps the plan in force for the measured rates");
        verdict = STAY;
        goto done;
    }
    /* the gain: the measured step time over the policy's window, scaled
     * by the predicted ratio, over the remaining steps */
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    int window = o->window > 0 ? o->window : pp.window;
    mal_policy_change c = {mal_progress_step_time(tr, window),
                           predict(&tr->plan, &prof, &cl, rates, &ln), out.predicted_step_time,
                           (long)(o->steps - tr->step), 0};
    char how[160], old_desc[256], new_desc[256], id[MAL_PLAN_ID_LEN];
    c.cost_s = change_cost(tr, online, stats.seconds,
                           mal_cost_migration_bytes(&tr->plan, &out, &prof), how, sizeof how);
    mal_progress_describe(&tr->plan, old_desc, sizeof old_desc);
    mal_progress_describe(&out, new_desc, sizeof new_desc);
    mal_plan_id(&out, id);
    double gain;
    int pays = c.step_s >= 0 ? mal_policy_pays(&c, &gain) : -1;
    if (pays < 0) {
        /* nothing measured to weigh with (a change at the first step) */
        mal_clearerr();
        gain = NAN;
    }
    mal_log(MAL_LOG_INFO,
            "re-plan at step %ld: plan %s (generation %d) measured %.1f ms/step, predicted %.1f ms "
            "for the measured rates: %s; the planner's plan %s predicted %.1f ms: %s; gain %.2f s "
            "over %ld steps, cost %.2f s (%s): %s",
            step, tr->prog.id, tr->prog.gen, 1e3 * c.step_s, 1e3 * c.predicted_now, old_desc, id,
            1e3 * c.predicted_new, new_desc, gain, c.remaining_steps, c.cost_s, how,
            pays == 0 ? "not worth it, staying on the plan in force"
            : online  ? "changing plan in the job"
                      : "stopping for a re-plan");
    verdict = pays == 0 ? STAY : GO;
    if (verdict == GO && online && (rc = mal_plan_to_string(&out, text))) goto fail;
    goto done;
fail:
    /* Without a plan there is nothing to weigh: online, nothing to change
     * to; a restart goes ahead as advised, for the job script's planner. */
    mal_log(MAL_LOG_WARN, "re-plan: cannot plan for the measured rates (%s): %s", mal_errmsg(),
            online ? "keeping the current plan" : "stopping for the re-plan as advised");
    free(*text);
    *text = NULL;
    verdict = online ? STAY : GO;
done:
    mal_links_fini(&ln);
    mal_plan_fini(&out);
    mal_profile_fini(&prof);
    mal_cluster_fini(&cl);
    free(rates);
    return verdict;
}

/* Collective: rank 0's verdict, and the new plan (online) parsed and
 * validated on every rank into *next (initialised by the caller). */
static int agree(struct mal_trainer *tr, long step, mal_plan *next, int *verdict)
{
    char *text = NULL;
    int64_t msg[2] = {STAY, 0}; /* verdict, length of the plan's text */
    int rc = 0;
    if (tr->world_rank == 0) {
        msg[0] = weigh_on_rank0(tr, step, &text);
        msg[1] = text ? (int64_t)strlen(text) + 1 : 0;
    }
    if (tr->world && (rc = mal_comm_broadcast(tr->world, msg, sizeof msg, 0))) goto out;
    *verdict = (int)msg[0];
    if (msg[1] == 0) goto out;
    if (!text && !(text = malloc((size_t)msg[1]))) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto out;
    }
    if ((rc = mal_comm_broadcast(tr->world, text, (size_t)msg[1], 0))) goto out;
    if ((rc = mal_plan_parse_string(next, text, "the new plan"))) goto out;
    rc = mal_plan_validate(next, tr->world_size, tr->o.model.n_layers, tr->o.model.n_heads,
                           tr->o.model.ffn_hidden, tr->o.global_batch);
out:
    free(text);
    return rc;
}

/* Rank 0: the rates measured now become the policy's baseline. */
static int rebase(struct mal_trainer *tr)
{
    if (tr->world_rank != 0) return 0;
    double *means = malloc(sizeof *means * (size_t)tr->world_size);
    if (!means) return MAL_ERR(MAL_ENOMEM, "re-plan: out of memory");
    mal_monitor_mean_rates(tr, means);
    int rc = mal_monitor_set_plan(tr, means);
    free(means);
    return rc ? rc : mal_linkprobe_rebase(tr);
}

int mal_trainer_replan_online(struct mal_trainer *tr)
{
    mal_plan next;
    int verdict = STAY, rc;
    if (!tr->world) return 0; /* one rank: nothing to re-plan */
    mal_plan_init(&next);
    char old_id[MAL_PLAN_ID_LEN];
    int old_gen = tr->prog.gen;
    double old_ms = 1e3 * mal_progress_step_time(tr, MAL_PROGRESS_RING);
    memcpy(old_id, tr->prog.id, sizeof old_id);
    if (!(rc = agree(tr, (long)tr->step, &next, &verdict)) && verdict == GO && next.n_pipelines) {
        rc = mal_trainer_change_plan(tr, &next);
        if (!rc && tr->world_rank == 0) {
            char desc[256];
            mal_progress_describe(&tr->plan, desc, sizeof desc);
            mal_log(MAL_LOG_INFO,
                    "plan change (online) at step %lld: generation %d -> %d; old plan %s: measured "
                    "%.1f ms/step; new plan %s: %s, predicted %.1f ms/step; the change took %.3f s",
                    (long long)tr->step, old_gen, tr->prog.gen, old_id, old_ms, tr->prog.id, desc,
                    1e3 * tr->prog.predicted_s, tr->online.slowest_s);
        }
    }
    mal_plan_fini(&next);
    /* The rates the (new or kept) plan stands for become the baseline. */
    return rc ? rc : rebase(tr);
}

int mal_change_on_advice(struct mal_trainer *tr, const mal_step_stats *st, int *stop)
{
    int rc;
    *stop = 0;
    if (tr->world_rank == 0)
    {
        const mal_linkprobe *lp = &tr->mon.link;
        if (st->trigger_rank >= 0 || lp->trigger_pair < 0)
            mal_log(MAL_LOG_INFO, "monitor: re-plan advised at step %lld (rank %d, rate %.2f)",
                    (long long)st->step, st->trigger_rank,
                    st->trigger_rank >= 0 ? tr->mon.rates[st->trigger_rank] : 0.0);
        else
            mal_log(MAL_LOG_INFO, "monitor: re-plan advised at step %lld (link %d-%d, rate %.2f)",
                    (long long)st->step, lp->pairs[2 * lp->trigger_pair],
                    lp->pairs[2 * lp->trigger_pair + 1], lp->rates[lp->trigger_pair]);
    }
    if (tr->o.adapt == MAL_ADAPT_ONLINE) return mal_trainer_replan_online(tr);
    if (tr->o.adapt != MAL_ADAPT_RESTART) return 0;
    mal_plan next;
    int verdict = GO;
    mal_plan_init(&next);
    rc = agree(tr, (long)st->step, &next, &verdict);
    mal_plan_fini(&next);
    if (rc) return rc;
    if (verdict == STAY) return rebase(tr);
    *stop = 1;
    return 0;
}
