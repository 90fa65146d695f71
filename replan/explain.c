/* The --explain report: TP groups and their rates, suspended ranks, every
 * pipeline's stages, layers and micro-batches, and the predicted step time of
 * the new plan against the current plan, the uniform plan and the capacity
 * bound (cost model and 1F1B simulation), why the new plan is above the
 * bound, plus the state that must move.  Every time is in seconds (the
 * planner's layer units times the profile's layer_time). */
#include <math.h>
#include <stdlib.h>

#include "base/mal.h"
#include "replan.h"
#include "sim.h"

static void print_times(FILE *f, const char *what, const mal_plan *plan, const mal_replan_input *in,
                        double bound)
{
    const mal_profile *p = in->profile;
    mal_cost_eval ev;
    double sim = NAN;
    if (mal_cost_eval_plan(plan, p, in->cluster, in->rates, &ev)) {
        fprintf(f, "  %-8s  cannot evaluate: %s\n", what, mal_errmsg());
        return;
    }
    mal_sim_plan_on(plan, p, in->cluster, in->rates, 0.0, &sim, NULL);
    double lt = p->layer_time;
    fprintf(f, "  %-8s  %10.4f s  %10.4f s  %7.3fx%s\n", what, ev.step_time * lt + p->sync_time,
            sim * lt + p->sync_time, ev.step_time / bound,
            ev.memory_ok ? "" : "  (exceeds memory!)");
    mal_cost_eval_fini(&ev);
}

/* Why `plan` (evaluated in *ev) is above the capacity bound: the gap
 * between them, in seconds, split into what the bound leaves out, each
 * term the step from one idealisation to the next (they add up to the
 * gap; a term may be negative, e.g. TP groups smaller than the nominal
 * size are more efficient per rank than the bound assumes):
 *   suspended ranks   the bound counts their speed; the plan uses none;
 *   TP groups         each group computes at its slowest member's rate
 *                     and at its size's alpha, not at nominal efficiency;
 *   whole units       micro-batches and layers are whole: pipelines and
 *                     stages cannot all carry exactly their share;
 *   bubble            1F1B's fill and drain of the slowest pipeline. */
static void explain_gap(FILE *f, const mal_replan_input *in, const mal_plan *plan,
                        const mal_cost_eval *ev, double bound)
{
    const mal_profile *p = in->profile;
    const int world = in->cluster->world_size;
    const double lt = p->layer_time, work = (double)p->n_layers * in->n_micro_batches;
    if (!(ev->step_time > bound * (1 + 1e-9)) || !isfinite(bound)) {
        fprintf(f, "the new plan reaches the bound\n");
        return;
    }
    /* the bound over the active ranks only */
    unsigned char *susp = calloc((size_t)world, 1);
    if (!susp) return;
    for (int i = 0; i < plan->n_suspended; i++)
        if (plan->suspended[i] >= 0 && plan->suspended[i] < world) susp[plan->suspended[i]] = 1;
    double active = 0, groups = 0;
    for (int r = 0; r < world; r++)
        if (!susp[r]) active += 1.0 / (p->tp * mal_cost_floor(in->rates[r]));
    free(susp);
    /* every group's layer speed, all layers spread over them */
    for (int i = 0; i < plan->n_pipelines; i++)
        for (int j = 0; j < plan->pipelines[i].n_stages; j++) {
            const mal_plan_stage *st = &plan->pipelines[i].stages[j];
            double x = 1.0;
            for (int k = 0; k < st->n_ranks; k++)
                if (st->ranks[k] >= 0 && st->ranks[k] < world)
                    x = MAL_MAX(x, mal_cost_floor(in->rates[st->ranks[k]]));
            double a = mal_profile_alpha(mal_cost_stage_profile(p, in->cluster, st), st->n_ranks);
            if (a > 0) groups += 1.0 / (x * a);
        }
    double f_active = active > 0 ? work / active : INFINITY;
    double f_groups = groups > 0 ? work / groups : INFINITY;
    fprintf(f,
            "why the new plan is %.4f s (%.1f%%) above the bound, which spreads all work over "
            "every rank at its own speed:\n",
            (ev->step_time - bound) * lt, 100 * (ev->step_time / bound - 1));
    fprintf(f,
            "  suspended ranks     %+10.4f s  (their speed is in the bound, the plan uses none)\n",
            (f_active - bound) * lt);
    fprintf(f,
            "  TP groups           %+10.4f s  (a group at its slowest member's rate and its size's "
            "efficiency)\n",
            (f_groups - f_active) * lt);
    fprintf(f,
            "  whole units         %+10.4f s  (whole micro-batches per pipeline, whole layers per "
            "stage)\n",
            (ev->bubble_free - f_groups) * lt);
    fprintf(f, "  pipeline bubble     %+10.4f s  (1F1B fill and drain)\n",
            (ev->step_time - ev->bubble_free) * lt);
}

/* Where a slow link sits in the plan and what it costs there. */
static int explain_links(FILE *f, const mal_replan_input *in, const mal_plan *plan)
{
    const mal_profile *p = in->profile;
    const mal_links *ln = in->links;
    if (!mal_links_any(ln)) return 0;
    double lt = p->layer_time;
    if (!(p->link_bandwidth > 0)) {
        fprintf(f, "slow links: the profile prices no communication (link_bandwidth): ignored\n");
        return 0;
    }
    int n = 0;
    for (int i = 0; i < ln->n; i++)
        n += mal_cost_floor(ln->l[i].rate) > 1.0;
    fprintf(f,
            "slow links: %d (a slow link should carry the least traffic: best between "
            "pipelines, worst inside a TP group)\n",
            n);
    double J;
    int rc = mal_cost_plan_links(plan, p, in->cluster, in->rates, ln, NULL, &J);
    if (rc) return rc;
    fprintf(f,
            "  step time with communication: %.4f s (cost model; the table above is compute "
            "alone)\n",
            J * lt + p->sync_time);
    for (int i = 0, shown = 0; i < ln->n && shown < 32; i++) {
        int a = ln->l[i].a, b = ln->l[i].b;
        double r = mal_cost_floor(ln->l[i].rate);
        if (r <= 1.0) continue;
        shown++;
        mal_plan_loc la, lb;
        int ka = mal_plan_locate(plan, a, &la), kb = mal_plan_locate(plan, b, &lb);
        fprintf(f, "  link %d-%d (rate %.2f): ", a, b, r);
        if (ka || kb || la.pipeline < 0 || lb.pipeline < 0) {
            fprintf(f, "unused (a rank is suspended)\n");
        } else if (la.pipeline == lb.pipeline && la.stage == lb.stage) {
            const mal_plan_stage *st = &plan->pipelines[la.pipeline].stages[la.stage];
            fprintf(f,
                    "inside the TP group of pipeline %d stage %d: all-reduces %.4f s per layer\n",
                    la.pipeline, la.stage,
                    mal_cost_tp_comm(p, in->cluster, ln, st->ranks, st->n_ranks) * lt);
        } else if (la.pipeline == lb.pipeline && abs(la.stage - lb.stage) == 1) {
            int j = MAL_MIN(la.stage, lb.stage);
            const mal_plan_pipeline *pl = &plan->pipelines[la.pipeline];
            fprintf(f,
                    "stage boundary %d-%d of pipeline %d: %.4f s per activation (warm-up depth %d "
                    "on stage %d)\n",
                    j, j + 1, la.pipeline,
                    mal_cost_p2p(p, in->cluster, ln, &pl->stages[j], &pl->stages[j + 1]) * lt,
                    mal_plan_stage_warmup(pl, j), j);
        } else if (la.pipeline != lb.pipeline) {
            fprintf(f, "between pipelines %d and %d (gradient sum only)\n", la.pipeline,
                    lb.pipeline);
        } else {
            fprintf(f, "unused (no message between these stages)\n");
        }
    }
    if (mal_cost_dp_comm(plan, p, in->cluster, ln) > 0)
        fprintf(f, "  gradient sum over slow links: %.4f s per step\n",
                mal_cost_dp_comm(plan, p, in->cluster, ln) * lt);
    return 0;
}

/* A mixed cluster: each type's ranks, where they went and why. */
static void explain_types(FILE *f, const mal_replan_input *in, const mal_plan *plan)
{
    const mal_cluster *c = in->cluster;
    if (!c->type_of) return;
    fprintf(f, "device types (a type's speed is a rate of 1/speed; TP groups never span nodes, "
               "so each is of one type; each stage is sized for its type's memory and profile):\n");
    double top = 0;
    for (int t = 0; t < c->n_types; t++)
        top = MAL_MAX(top, c->types[t].speed);
    for (int t = 0; t < c->n_types; t++) {
        int ranks = 0, active = 0, layers = 0, stages = 0;
        for (int r = 0; r < c->world_size; r++)
            ranks += c->type_of[c->node_of[r]] == t;
        for (int i = 0; i < plan->n_pipelines; i++)
            for (int j = 0; j < plan->pipelines[i].n_stages; j++) {
                const mal_plan_stage *st = &plan->pipelines[i].stages[j];
                if (c->type_of[c->node_of[st->ranks[0]]] != t) continue;
                stages++;
                active += st->n_ranks;
                layers += st->layer_end - st->layer_begin;
            }
        fprintf(f,
                "  %s: %d ranks, speed %.2f (rate %.2f), %.0f MB, profile %s: %d active in %d "
                "stages holding %.2f layers each on average\n",
                c->types[t].name, ranks, c->types[t].speed, top / c->types[t].speed,
                c->types[t].memory_mb,
                c->types[t].profile ? c->types[t].profile_src : in->profile->name, active, stages,
                stages ? (double)layers / stages : 0.0);
    }
}

/* The terms of one stage's memory per rank, as mal_cost_memory_terms adds
 * them: its layers at the per-layer memory k[d] of its warm-up depth d
 * (state and d + 1 micro-batches of activations in flight), the embedding
 * and/or LM head of a first/last stage, both scaled from the nominal TP
 * size to the stage's, the scratch buffers, the pipeline's gradient
 * buffers, the gradient sum's copy of the gradients, less the moments a
 * --zero 1 rank does not keep, plus the fixed per-rank overhead X.  The
 * printed total is the sum of the printed terms
 * (tests/test_replan_memory.sh checks it). */
static void explain_stage_memory(FILE *f, const mal_profile *p, const mal_cluster *c,
                                 const mal_plan *plan, int i, int j)
{
    const mal_plan_pipeline *pl = &plan->pipelines[i];
    const mal_plan_stage *st = &pl->stages[j];
    int l = st->layer_end - st->layer_begin;
    int ne = (j == 0) + (j == pl->n_stages - 1);
    int nb = j < pl->n_stages - 1;
    p = mal_cost_stage_profile(p, c, st); /* a mixed cluster: its type's */
    mal_cost_memory t;
    mal_cost_memory_terms(p, plan, i, j, &t);
    nb += (j > 0) * t.slots;
    /* a layer measured at the stage's TP size, or scaled from the nominal */
    fprintf(f, "    memory terms (MB per rank): layers %d x ", l);
    if (!t.k_at_size)
        fprintf(f, "%.3f (k[%d]) x TP %d/%d", mal_profile_k(p, t.depth), t.depth, p->tp,
                st->n_ranks);
    else
        fprintf(f, "%.3f (k[%d] of TP %d) x TP 1/1", mal_profile_k_at(p, t.depth, st->n_ranks),
                t.depth, st->n_ranks);
    /* the layers' term as without recomputation; what it does not keep is
     * a term of its own */
    fprintf(f, " = %.3f + embedding/head %d x %.3f x TP %d/%d", t.layers + t.recompute_saved, ne,
            p->embed_mb, p->tp, st->n_ranks);
    if (t.embed_tied > 0) fprintf(f, " - tied %.3f", t.embed_tied);
    fprintf(f,
            " = %.3f + scratch %.3f + pipeline buffers %d x %.3f = %.3f + gradient sum %.3f - "
            "moments not kept %.3f (%s, %d replicas%s)",
            t.embed, t.scratch, nb, p->activation_bytes / 1048576.0, t.p2p, t.dp_grads,
            t.zero_saved, p->zero ? "--zero 1" : "--zero 0", t.replicas,
            p->zero && p->zero_master && p->state_bytes > 16.0 ? ", and the master's" : "");
    if (t.recompute != MAL_RECOMPUTE_NONE)
        fprintf(f, " - recompute %s %.3f + workspace %.3f", mal_recompute_name(t.recompute),
                t.recompute_saved, t.workspace);
    fprintf(f, " + overhead %.3f = total %.3f of %.0f\n", t.overhead, t.total,
            mal_cost_stage_capacity(c, st));
}

/* The total of those terms (with the stage's type's profile). */
static double stage_total(const mal_profile *p, const mal_cluster *c, const mal_plan *plan, int i,
                          int j)
{
    mal_cost_memory t;
    mal_cost_memory_terms(mal_cost_stage_profile(p, c, &plan->pipelines[i].stages[j]), plan, i, j,
                          &t);
    return t.total;
}

/* A stage of a mixed cluster: its type, and what limits its layers -- its
 * type's memory at this position (the search's cap, with the type's
 * profile) or its speed (the layers its rate fits into the period). */
static void explain_stage_type(FILE *f, const mal_profile *p, const mal_cluster *c,
                               const mal_plan *plan, int i, int j, double period, double y)
{
    const mal_plan_pipeline *pl = &plan->pipelines[i];
    const mal_plan_stage *st = &pl->stages[j];
    int ty = mal_cluster_rank_type(c, st->ranks[0]);
    if (ty < 0) return;
    const mal_profile *ps = mal_cost_stage_profile(p, c, st);
    double mem = mal_cost_stage_capacity(c, st);
    int l = st->layer_end - st->layer_begin;
    /* the cap with the stage's recompute mode and the plan's replicas */
    int cap = mal_cost_layer_cap_mode(ps, mem, st->n_ranks, pl->n_stages, j, plan->n_pipelines,
                                      st->recompute);
    int by_speed = y > 0 ? (int)floor(period / y * (1 + 1e-12) + 1e-9) : l;
    fprintf(f, "    type %s (speed %.2f, %.0f MB, profile %s): memory %.1f of %.0f MB; %d layers: ",
            c->types[ty].name, mal_cluster_rank_speed(c, st->ranks[0]), mem, ps->name,
            stage_total(p, c, plan, i, j), mem, l);
    if (l >= cap && cap < by_speed)
        fprintf(f, "memory binds (at most %d fit here; its speed would take %d)\n", cap, by_speed);
    else if (l >= cap && cap == by_speed)
        fprintf(f, "speed and memory bind (both allow %d)\n", cap);
    else
        fprintf(f, "speed binds (%d fit the period at its rate; memory would allow %d)\n", by_speed,
                cap);
}

void mal_replan_explain_memory(FILE *f, const mal_profile *p, const mal_cluster *c,
                               const mal_plan *plan)
{
    fprintf(f, "memory per rank of every stage (the planner's model):\n");
    for (int i = 0; i < plan->n_pipelines; i++)
        for (int j = 0; j < plan->pipelines[i].n_stages; j++) {
            const mal_plan_stage *st = &plan->pipelines[i].stages[j];
            fprintf(f, "  pipeline %d stage %d: TP %d ranks [", i, j, st->n_ranks);
            for (int k = 0; k < st->n_ranks; k++)
                fprintf(f, "%s%d", k ? " " : "", st->ranks[k]);
            fprintf(f, "]  layers [%d, %d)\n", st->layer_begin, st->layer_end);
            explain_stage_memory(f, p, c, plan, i, j);
        }
}

int mal_replan_explain(FILE *f, const mal_replan_input *in, const mal_plan *plan)
{
    const mal_profile *p = in->profile;
    const mal_cluster *c = in->cluster;
    int world = c->world_size;
    mal_cost_eval ev;
    int rc = mal_cost_eval_plan(plan, p, c, in->rates, &ev);
    if (rc) return rc;
    double lt = p->layer_time;
    char mem[96];
    snprintf(mem, sizeof mem, "%.0f MB each", c->memory_mb);
    if (c->type_of) { /* a mixed cluster: each type's (device types, below) */
        double hi = 0;
        for (int n = 0; n < c->n_nodes; n++)
            hi = MAL_MAX(hi, c->types[c->type_of[n]].memory_mb);
        snprintf(mem, sizeof mem, "%d device types, %.0f-%.0f MB", c->n_types, c->memory_mb, hi);
    }
    fprintf(f,
            "malleus-replan: %d ranks on %d nodes (%s), model %s (%d layers, TP %d), %d "
            "micro-batches of %d per step\n",
            world, c->n_nodes, mem, p->name, p->n_layers, p->tp, in->n_micro_batches,
            in->micro_batch_size);
    int n_strag = 0;
    for (int r = 0; r < world; r++)
        n_strag += in->rates[r] >= MAL_REPLAN_NOISE_FLOOR;
    fprintf(f, "stragglers (rate >= %.1f): %d", MAL_REPLAN_NOISE_FLOOR, n_strag);
    int shown = 0;
    for (int r = 0; r < world && shown < 32; r++)
        if (in->rates[r] >= MAL_REPLAN_NOISE_FLOOR)
            fprintf(f, "%s%d:%.2f", shown++ ? ", " : "  ", r, in->rates[r]);
    fprintf(f, "%s\n", n_strag > 32 ? ", ..." : "");
    fprintf(f, "suspended ranks: %d", plan->n_suspended);
    for (int i = 0; i < plan->n_suspended && i < 32; i++)
        fprintf(f, "%s%d (rate %.2f)", i ? ", " : "  ", plan->suspended[i],
                in->rates[plan->suspended[i]]);
    fprintf(f, "%s\n", plan->n_suspended > 32 ? ", ..." : "");
    int limit = plan->n_pipelines > 64 ? 16 : plan->n_pipelines;
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        if (i == limit) {
            fprintf(f, "... %d more pipelines\n", plan->n_pipelines - limit);
            break;
        }
        fprintf(f,
                "pipeline %d: %d stages, %d micro-batches, period %.4f s, time %.4f s (incl. "
                "bubble %.4f s)\n",
                i, pl->n_stages, pl->micro_batches, ev.period[i] * lt, ev.time[i] * lt,
                (pl->n_stages - 1) * ev.period[i] * lt);
        for (int j = 0; j < pl->n_stages; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            double x = 1.0;
            for (int k = 0; k < st->n_ranks; k++)
                x = MAL_MAX(x, mal_cost_floor(in->rates[st->ranks[k]]));
            int l = st->layer_end - st->layer_begin;
            const mal_profile *ps = mal_cost_stage_profile(p, c, st); /* its type's */
            double y = x * mal_profile_alpha(ps, st->n_ranks);
            fprintf(f, "  stage %d: TP %d ranks [", j, st->n_ranks);
            for (int k = 0; k < st->n_ranks; k++)
                fprintf(f, "%s%d", k ? " " : "", st->ranks[k]);
            double fct = mal_cost_stage_factor(ps, st);
            fprintf(f,
                    "]  rate %.2f  %.4f s per layer  layers [%d, %d) = %d  stage time %.4f s  "
                    "memory %.0f / %.0f MB",
                    x, y * lt, st->layer_begin, st->layer_end, l, y * l * fct * lt,
                    stage_total(p, c, plan, i, j), mal_cost_stage_capacity(c, st));
            if (st->recompute != MAL_RECOMPUTE_NONE) {
                /* what the mode buys and costs: activations not kept,
                 * time added per micro-batch */
                mal_cost_memory t;
                mal_cost_memory_terms(ps, plan, i, j, &t);
                fprintf(f, "  recompute %s: saves %.0f MB, adds %.4f s",
                        mal_recompute_name(st->recompute), t.recompute_saved - t.workspace,
                        y * l * (fct - 1) * lt);
            }
            fputc('\n', f);
            explain_stage_type(f, p, c, plan, i, j, ev.period[i], y * fct);
            explain_stage_memory(f, p, c, plan, i, j);
        }
    }
    double bound = mal_cost_capacity_bound(p, world, in->rates, in->n_micro_batches);
    fprintf(f, "predicted step time   cost model   1F1B sim   vs bound\n");
    print_times(f, "new", plan, in, bound);
    mal_plan uni;
    if (in->current) print_times(f, "current", in->current, in, bound);
    if (mal_replan_uniform(in, &uni) == 0) {
        print_times(f, "uniform", &uni, in, bound);
        mal_plan_fini(&uni);
    } else {
        fprintf(f, "  uniform   (none: %s)\n", mal_errmsg());
    }
    fprintf(f, "  %-8s  %10.4f s  (all work over every rank at its speed, no bubble)\n", "bound",
            bound * lt + p->sync_time);
    explain_gap(f, in, plan, &ev, bound);
    if (in->current) {
        double bytes = mal_cost_migration_bytes(in->current, plan, p);
        fprintf(f, "state to move from the current plan: %.3f GiB (%.0f bytes)\n",
                bytes / 1073741824.0, bytes);
    }
    rc = explain_links(f, in, plan);
    explain_types(f, in, plan);
    mal_cost_eval_fini(&ev);
    return rc;
}

void mal_replan_explain_search(FILE *f, const mal_replan_input *in, const mal_replan_stats *st)
{
    char line[256];
    mal_replan_describe_search(st, in->profile, line, sizeof line);
    fprintf(f, "search: %s\n", line);
    fprintf(f, "search: %d configurations evaluated, %d pruned, %.3f s", st->n_candidates,
            st->n_pruned, st->seconds);
    if (st->time_limit > 0)
        fprintf(f, " of a %g s limit\n", st->time_limit);
    else
        fprintf(f, ", no time limit\n");
}
