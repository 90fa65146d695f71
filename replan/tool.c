/* malleus-replan's work as a library function (see tool.h): check that the
 * options make sense together, read the profile, cluster, rates and current
 * plan, then plan (or simulate a given plan) and write the plan and reports. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "replan.h"
#include "sim.h"
#include "src/plan.h"
#include "tool.h"

/* A number for a JSON line: JSON has no inf or NaN, so a time that
 * overflowed or does not exist is null. */
static const char *json_num(char *buf, size_t len, double x)
{
    if (!isfinite(x)) return "null";
    snprintf(buf, len, "%.9g", x);
    return buf;
}

void mal_replan_opts_init(mal_replan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->window = 2;
    o->micro_batch_size = 1;
    o->search = MAL_REPLAN_AUTO;
    o->time_limit = MAL_REPLAN_TIME_LIMIT;
    /* malleus-train's default: sharded wherever a plan has replicas (a
     * plan without them has no moments to share out either way) */
    o->zero = 1;
    o->zero_master = -1; /* as zero, as malleus-train's */
    o->precision = -1;   /* the profile's state bytes */
}

/* n_heads / ffn_hidden for mal_plan_validate(): a profile without them
 * checks nothing there. */
static int heads_or_any(int n)
{
    return n > 0 ? n : 1 << 20;
}

/* --simulate: the plan in `path`, event by event, next to the closed form. */
static int simulate(const mal_replan_opts *o, const mal_profile *prof, const mal_cluster *cl,
                    const double *rates, const mal_links *ln, FILE *out)
{
    mal_plan simp;
    mal_cost_eval ev = {0};
    double *pipe = NULL, sim;
    int rc;
    mal_plan_init(&simp);
    if ((rc = mal_plan_read(&simp, o->simulate_path))) goto done;
    /* the global batch is whatever the plan says, but it must fit an int */
    long long gb = (long long)simp.micro_batch_size * mal_plan_n_micro_batches(&simp);
    if ((rc = mal_plan_validate(&simp, cl->world_size, prof->n_layers, heads_or_any(prof->n_heads),
                                heads_or_any(prof->ffn_hidden), (int)MAL_MIN(gb, 0x7fffffff))))
        goto done;
    pipe = malloc((size_t)simp.n_pipelines * sizeof *pipe);
    if (!pipe) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = mal_sim_plan_on(&simp, prof, cl, rates, 0.0, &sim, pipe)) ||
        (rc = mal_cost_eval_plan(&simp, prof, cl, rates, &ev)))
        goto done;
    /* with communication priced: the simulation and the closed form with
     * the links' terms and the plan's warm-up depths */
    if (prof->link_bandwidth > 0 && (mal_links_any(ln) || !prof->comm_in_alpha)) {
        double simc;
        if ((rc = mal_sim_plan_links(&simp, prof, cl, rates, ln, &simc, pipe)) ||
            (rc = mal_cost_plan_links(&simp, prof, cl, rates, ln, ev.time, &ev.step_time)))
            goto done;
        sim = simc;
        fprintf(out, "with communication (slow links, warm-up depths):\n");
    }
    double lt = prof->layer_time;
    for (int i = 0; i < simp.n_pipelines; i++)
        fprintf(out,
                "pipeline %d: %d stages, %d micro-batches: simulated %.6f s, closed form %.6f s, "
                "bubble-free %.6f s\n",
                i, simp.pipelines[i].n_stages, simp.pipelines[i].micro_batches, pipe[i] * lt,
                ev.time[i] * lt, simp.pipelines[i].micro_batches * ev.period[i] * lt);
    fprintf(out, "step: simulated %.6f s, closed form %.6f s, shaped bubble %.6f s%s\n",
            sim * lt + prof->sync_time, ev.step_time * lt + prof->sync_time,
            ev.shaped * lt + prof->sync_time, ev.memory_ok ? "" : " (plan exceeds memory)");
    if (o->explain) mal_replan_explain_memory(out, prof, cl, &simp);
    if (o->summary) {
        char a[32], b[32], c[32], d[32];
        fprintf(out,
                "{\"simulated\": %s, \"closed_form\": %s, \"shaped\": %s, \"bubble_free\": %s}\n",
                json_num(a, sizeof a, sim * lt + prof->sync_time),
                json_num(b, sizeof b, ev.step_time * lt + prof->sync_time),
                json_num(c, sizeof c, ev.shaped * lt + prof->sync_time),
                json_num(d, sizeof d, ev.bubble_free * lt + prof->sync_time));
    }
done:
    free(pipe);
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&simp);
    return rc;
}

/* --summary's names of mal_replan_stats.stop */
static const char *const stop_names[] = {[MAL_REPLAN_STOP_OPTIMAL] = "optimal",
                                         [MAL_REPLAN_STOP_CONVERGED] = "converged",
                                         [MAL_REPLAN_STOP_BUDGET] = "budget",
                                         [MAL_REPLAN_STOP_TIME] = "time_limit"};

/* --summary: one JSON line with the plan's times against the uniform plan
 * and the capacity bound, and the search's statistics. */
static void summary(const mal_replan_input *in, const mal_plan *plan, const mal_replan_stats *st,
                    FILE *f)
{
    const mal_profile *p = in->profile;
    const mal_cluster *cl = in->cluster;
    mal_plan uni;
    mal_cost_eval eu = {0};
    double tu = NAN, sim = NAN, simu = NAN;
    if (mal_replan_uniform(in, &uni) == 0) {
        if (mal_cost_eval_plan(&uni, p, cl, in->rates, &eu) == 0) tu = eu.step_time;
        mal_sim_plan_on(&uni, p, cl, in->rates, 0.0, &simu, NULL);
        mal_cost_eval_fini(&eu);
        mal_plan_fini(&uni);
    }
    mal_clearerr();
    mal_sim_plan_on(plan, p, cl, in->rates, 0.0, &sim, NULL);
    double bound = mal_cost_capacity_bound(p, cl->world_size, in->rates, in->n_micro_batches);
    double lt = p->layer_time, sy = p->sync_time;
    int n_strag = 0;
    for (int r = 0; r < cl->world_size; r++)
        n_strag += in->rates[r] >= MAL_REPLAN_NOISE_FLOOR;
    /* JSON has no NaN or inf: a time that does not exist (no uniform plan
     * for these pipelines) or overflowed (a huge layer time) is null */
    char us[32], uss[32], ps[32], ss[32], bs[32], lbs[32];
    fprintf(f,
            "{\"ranks\": %d, \"stragglers\": %d, \"suspended\": %d, \"pipelines\": %d, "
            "\"plan_seconds\": %.6f, \"step\": %s, \"simulated\": %s, \"uniform\": %s, "
            "\"uniform_simulated\": %s, \"bound\": %s, \"layer_lps\": %d, \"candidates\": %d, "
            "\"pruned\": %d, \"exhaustive\": %d, \"lower_bound\": %s, \"gap\": %.6f, "
            "\"stop\": \"%s\", \"time_limit\": %g}\n",
            cl->world_size, n_strag, plan->n_suspended, plan->n_pipelines, st->seconds,
            json_num(ps, sizeof ps, plan->predicted_step_time),
            json_num(ss, sizeof ss, sim * lt + sy), json_num(us, sizeof us, tu * lt + sy),
            json_num(uss, sizeof uss, simu * lt + sy), json_num(bs, sizeof bs, bound * lt + sy),
            st->n_layer_lps, st->n_candidates, st->n_pruned, st->exhaustive,
            json_num(lbs, sizeof lbs, st->lower_bound * lt + sy),
            st->objective > 0 ? MAL_MAX(0.0, 1 - st->lower_bound / st->objective) : 0.0,
            stop_names[st->stop >= 0 && st->stop <= MAL_REPLAN_STOP_TIME ? st->stop : 0],
            st->time_limit);
}

int mal_replan_tool_run(const mal_replan_opts *o, FILE *out, FILE *info)
{
    int rc = 0;
    mal_cluster cl = {0};
    mal_profile prof = {0};
    mal_links links = {0};
    mal_plan cur, plan;
    double *rates = NULL;
    mal_plan_init(&cur);
    mal_plan_init(&plan);

    /* options that exclude or need each other */
    if (o->micro_batch_size < 1) {
        rc = MAL_ERR(MAL_EINVAL, "--micro-batch-size must be >= 1");
        goto done;
    }
    /* -o replaces its file: never one of the inputs (read before it is) */
    const mal_input_ref inputs[] = {
        {"--cluster", o->cluster_path}, {"--profile", o->profile_path},
        {"--rates", o->rates_path},     {"--links", o->links_path},
        {"--current", o->current_path}, {"--simulate", o->simulate_path}};
    if ((rc =
             mal_output_check_inputs("--output", o->out_path, inputs, (int)MAL_ARRAY_SIZE(inputs))))
        goto done;
    if (!!o->profile_path + !!o->model != 1) {
        rc = MAL_ERR(MAL_EINVAL, "give exactly one of --profile FILE or --model NAME (see --help)");
        goto done;
    }
    if (o->cluster_path && (o->world_size || o->ranks_per_node || o->memory_mb > 0)) {
        rc = MAL_ERR(MAL_EINVAL,
                     "--cluster and --world-size/--ranks-per-node/--memory-mb exclude each other");
        goto done;
    }
    if (o->global_batch && o->n_micro_batches) {
        rc = MAL_ERR(MAL_EINVAL, "give --micro-batches or --global-batch, not both");
        goto done;
    }
    if (o->zero_master == 1 && !o->zero) {
        rc = MAL_ERR(MAL_EINVAL, "--zero-master on shards the master with the moments: it needs "
                                 "--zero 1, not --zero 0");
        goto done;
    }

    /* model profile */
    rc = o->profile_path ? mal_profile_read(&prof, o->profile_path, o->micro_batch_size)
                         : mal_profile_preset(&prof, o->model, o->micro_batch_size);
    if (rc) goto done;
    /* the run's state: fp32 master, gradient and moments, and in bf16 a
     * working copy beside them (a preset counts 16 bytes a parameter) */
    if (o->precision >= 0 && (rc = mal_profile_set_state_bytes(&prof, o->precision ? 18.0 : 16.0)))
        goto done;
    prof.zero = o->zero;
    prof.zero_master = o->zero && o->zero_master != 0; /* -1: as --zero */
    prof.recompute = MAL_REPLAN_RECOMPUTE_AUTO;
    if (o->recompute && strcmp(o->recompute, "auto")) {
        int m;
        if (mal_recompute_parse(o->recompute, &m)) {
            rc =
                MAL_ERR(MAL_EINVAL, "--recompute: \"%s\" is not one of none, selective, full, auto",
                        o->recompute);
            goto done;
        }
        prof.recompute = m; /* MAL_REPLAN_RECOMPUTE_* are the plan's modes */
    }
    if (o->print_profile) {
        rc = mal_profile_write(&prof, out);
        goto done;
    }
    /* cluster */
    if (o->cluster_path) {
        rc = mal_cluster_read(&cl, o->cluster_path);
    } else if (o->world_size && o->ranks_per_node && o->memory_mb > 0) {
        rc = mal_cluster_regular(&cl, o->world_size, o->ranks_per_node, o->memory_mb);
    } else {
        rc = MAL_ERR(MAL_EINVAL,
                     "give --cluster FILE, or --world-size, --ranks-per-node and --memory-mb");
    }
    if (rc) goto done;
    if (cl.n_types) {
        /* a type's "profile" file is relative to the cluster file */
        char dir[4096] = "";
        const char *slash = o->cluster_path ? strrchr(o->cluster_path, '/') : NULL;
        if (slash)
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - o->cluster_path), o->cluster_path);
        if (slash && slash == o->cluster_path) snprintf(dir, sizeof dir, "/");
        if ((rc = mal_cluster_load_profiles(&cl, dir, &prof, o->micro_batch_size))) goto done;
    }
    /* rates: missing ranks are healthy */
    rates = malloc((size_t)cl.world_size * sizeof *rates);
    if (!rates) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto done;
    }
    for (int r = 0; r < cl.world_size; r++)
        rates[r] = 1.0;
    if (o->rates_path && (rc = mal_rates_read(o->rates_path, cl.world_size, o->window, rates)))
        goto done;
    /* a mixed cluster: a slower type's ranks are stragglers by nature */
    mal_cluster_effective_rates(&cl, rates, rates);
    if (o->links_path && (rc = mal_links_read(o->links_path, cl.world_size, o->window, &links)))
        goto done;
    if (o->current_path && (rc = mal_plan_read(&cur, o->current_path))) goto done;
    /* batch: micro-batches from the options, else from the current plan */
    int n_mb = o->n_micro_batches, dp = o->pipelines;
    if (o->global_batch) {
        if (o->global_batch % o->micro_batch_size) {
            rc = MAL_ERR(MAL_EINVAL, "global batch %d is not a multiple of the micro-batch size %d",
                         o->global_batch, o->micro_batch_size);
            goto done;
        }
        n_mb = o->global_batch / o->micro_batch_size;
    }
    if (!n_mb && o->current_path) n_mb = mal_plan_n_micro_batches(&cur);
    if (n_mb < 1) {
        rc = MAL_ERR(MAL_EINVAL, "give --micro-batches or --global-batch (or --current)");
        goto done;
    }
    if (!dp && o->current_path) dp = cur.n_pipelines;

    mal_replan_input in = {0};
    in.cluster = &cl;
    in.profile = &prof;
    in.rates = rates;
    in.micro_batch_size = o->micro_batch_size;
    in.n_micro_batches = n_mb;
    in.nominal_dp = dp;
    in.current = o->current_path ? &cur : NULL;
    in.search = o->search;
    in.time_limit = o->time_limit;
    in.links = &links;

    if (o->simulate_path) {
        rc = simulate(o, &prof, &cl, rates, &links, out);
        goto done;
    }

    /* plan (or the nominal uniform plan with its predicted time) */
    mal_replan_stats st = {0};
    if (o->uniform) {
        rc = mal_replan_uniform(&in, &plan);
        mal_cost_eval ev;
        if (!rc && !(rc = mal_cost_eval_plan(&plan, &prof, &cl, rates, &ev))) {
            plan.predicted_step_time = ev.step_time * prof.layer_time + prof.sync_time;
            mal_cost_eval_fini(&ev);
        }
    } else {
        /* --compute-only: the search and placement of a planner blind to
         * links; the reports below still price them */
        mal_replan_input blind = in;
        if (o->compute_only) blind.links = NULL;
        rc = mal_replan(&blind, &plan, &st);
        if (!rc && st.stop == MAL_REPLAN_STOP_TIME) {
            /* what the limit cost, whatever else was asked for */
            char line[256];
            mal_replan_describe_search(&st, &prof, line, sizeof line);
            fprintf(info, "malleus-replan: %s; %.2f s spent\n", line, st.seconds);
        }
    }
    if (rc) goto done;
    if (o->out_path) {
        if ((rc = mal_plan_write(&plan, o->out_path))) goto done;
    } else {
        char *s = NULL;
        if ((rc = mal_plan_to_string(&plan, &s))) goto done;
        fputs(s, out);
        free(s);
    }
    FILE *rep = o->out_path ? out : info;
    if (o->explain && (rc = mal_replan_explain(rep, &in, &plan))) goto done;
    if (o->explain && !o->uniform) mal_replan_explain_search(rep, &in, &st);
    if (o->summary) summary(&in, &plan, &st, rep);
done:
    free(rates);
    mal_links_fini(&links);
    mal_plan_fini(&cur);
    mal_plan_fini(&plan);
    mal_cluster_fini(&cl);
    mal_profile_fini(&prof);
    return rc;
}
