/* The paper's experiment, simulated: Malleus's planner against
 * three baselines on the paper's three settings and a grid of straggler
 * situations, every plan's step time by the cost model and by the
 * event-level 1F1B simulator, each against the capacity bound.
 *
 *   settings  32B: 32 GPUs, DP 4 x TP 2 x PP 4;  70B and 110B: 64 GPUs,
 *             DP 2 x TP 8 x PP 4;  8 GPUs per node, 80 GB, global batch 64,
 *             micro-batch 1 (64 micro-batches per step)
 *   grid      1, 2, 4, 8 stragglers at rates 1.5, 2, 4, 8, 12, one per node
 *             (nodes 0, 1, ..., position 3) or packed into node 0
 *   plans     1 static: the nominal uniform plan (what Megatron-LM or
 *               DeepSpeed keep running)
 *             2 drop: the best uniform plan (any TP size, DP x PP) on the
 *               nodes without a straggler (exclude and restart)
 *             3 nominal TP: heterogeneous pipelines, every group of the
 *               nominal TP size (stages, layers, micro-batches free;
 *               Oobleck-style) -- the planner with only that size allowed
 *             4 Malleus: the planner
 *
 * --links: instead of the straggler grid, one slow link (4x, 8x) where the
 * nominal plan puts a TP pair, a stage boundary or two pipelines' first
 * ranks, planned four ways -- static (the nominal plan), schedule-only
 * (its warm-up depths adapted to the links: Adaptra's), compute-only
 * Malleus (the planner blind to links), Malleus with links -- each priced
 * with communication by the cost model and the simulator; and a mixed
 * cluster (every other node 0.6x the speed by a profile of its own, 0.75x
 * the memory): static, Malleus planning all as the slowest, smallest type,
 * Malleus with the types' speeds only (every stage sized for the least
 * memory) and Malleus with each type's memory and profile.
 *
 * --memory-model [bf16|fp32]: the grid planned with the reference system's
 * memory figures (the default mode's) and with the runtime's (ZeRO-1
 * moments sharded, the gradient sum's copy, pipeline buffers,
 * recomputation per stage): plans changed, step and bound, and the uniform
 * depths each setting fits at.  bf16 (the default: the runtime as it runs
 * on a GPU) counts 18 bytes of state per parameter, a bf16 working copy
 * beside the fp32 master, the master sharded with the moments
 * (--zero-master on); fp32 counts 16, the master being the working weights.
 *
 * Usage: bench_paper [--csv FILE] [--widest] [--links] [--memory-model [bf16|fp32]]
 *                    [--settings 32b,70b,110b]
 * Prints one row per scenario and the averages; --csv writes the rows for
 * bench/paper/plot.py; --widest also runs --search exhaustive where at most
 * two nodes have stragglers (beyond, the enumeration does not end in
 * minutes) and reports where the default search differs from it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "replan/replan.h"
#include "replan/sim.h"
#include "src/plan.h"

typedef struct setting {
    const char *name;
    int world, tp, dp, pp;
    int recompute; /* full activation recomputation (else selective) */
} setting;

/* 32B at DP 4 x TP 2 x PP 4 needs 93 GB on its first stage with selective
 * recomputation (16 bytes of state per parameter, no ZeRO): it runs with
 * full recomputation, as one would on 80 GB devices. */
static const setting settings[] = {
    {"32b", 32, 2, 4, 4, 1},
    {"70b", 64, 8, 2, 4, 0},
    {"110b", 64, 8, 2, 4, 0},
};

enum { RPN = 8, M = 64, MBS = 1 };
#define MEM_MB 81920.0

/* A setting's cluster and two copies of its profile (one for each side of
 * a comparison); 1 (with the message printed) when one cannot be made. */
static int setting_inputs(const setting *st, mal_profile *a, mal_profile *b, mal_cluster *cl)
{
    if (mal_profile_preset_tp(a, st->name, MBS, st->tp) ||
        mal_profile_preset_tp(b, st->name, MBS, st->tp) ||
        mal_cluster_regular(cl, st->world, RPN, MEM_MB)) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        return 1;
    }
    return 0;
}

typedef struct result {
    double T;   /* cost model, layer units; INFINITY: no plan */
    double sim; /* simulator */
} result;

/* largest |sim - cost| / cost over the printed plans of each kind, for the
 * closed form and for the shaped bubble */
static double dev_closed[4], dev_shaped[4];

static void eval_plan(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                      const double *rates, int kind, result *r)
{
    mal_cost_eval ev;
    if (mal_cost_eval_plan(plan, p, c, rates, &ev)) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
    if (!ev.memory_ok) {
        fprintf(stderr, "bench_paper: a plan exceeds memory\n");
        exit(1);
    }
    r->T = ev.step_time;
    if (mal_sim_plan_on(plan, p, c, rates, 0.0, &r->sim, NULL)) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
    dev_closed[kind] = MAL_MAX(dev_closed[kind], fabs(r->sim - r->T) / r->T);
    dev_shaped[kind] = MAL_MAX(dev_shaped[kind], fabs(r->sim - ev.shaped) / ev.shaped);
    mal_cost_eval_fini(&ev);
}

/* A uniform plan of dp x tp x pp on `n` ranks listed in ranks[], the other
 * ranks of the world suspended; micro-batches as even as possible. */
static int uniform_on(int dp, int tp, int pp, int L, const int *ranks, int n, int world,
                      mal_plan *out)
{
    int rc = mal_plan_uniform(dp, tp, pp, L, MBS, dp * MBS, out);
    if (rc) return rc;
    for (int i = 0; i < dp; i++) {
        out->pipelines[i].micro_batches = M / dp + (i < M % dp);
        for (int j = 0; j < pp; j++) {
            mal_plan_stage *st = &out->pipelines[i].stages[j];
            for (int k = 0; k < st->n_ranks; k++)
                st->ranks[k] = ranks[st->ranks[k]];
        }
    }
    int ns = 0, *susp = malloc((size_t)world * sizeof *susp);
    char *in = calloc((size_t)world, 1);
    if (!susp || !in) return MAL_ERR(MAL_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        in[ranks[i]] = 1;
    for (int r = 0; r < world; r++)
        if (!in[r]) susp[ns++] = r;
    rc = mal_plan_set_suspended(out, ns, susp);
    free(susp);
    free(in);
    return rc;
}

/* Baseline 2: the best uniform layout on the nodes without a straggler. */
static void drop_nodes(const setting *st, const mal_profile *p, const mal_cluster *c,
                       const double *rates, result *r)
{
    int world = st->world, n = 0;
    int *ranks = malloc((size_t)world * sizeof *ranks);
    for (int node = 0; node < world / RPN; node++) {
        int slow = 0;
        for (int q = 0; q < RPN; q++)
            slow |= mal_cost_floor(rates[node * RPN + q]) > 1.0;
        for (int q = 0; q < RPN && !slow; q++)
            ranks[n++] = node * RPN + q;
    }
    r->T = r->sim = INFINITY;
    mal_plan best;
    mal_plan_init(&best);
    for (int tp = 1; tp <= RPN; tp *= 2) {
        if (mal_profile_alpha(p, tp) <= 0 || p->n_heads % tp || p->ffn_hidden % tp) continue;
        if (n == 0 || n % tp) continue;
        int groups = n / tp;
        for (int dp = 1; dp <= groups; dp++) {
            if (groups % dp) continue;
            int pp = groups / dp;
            if (pp > p->n_layers || dp * pp > M) continue;
            int fits = 1;
            for (int j = 0; j < pp && fits; j++) {
                int l = p->n_layers / pp + (j < p->n_layers % pp);
                fits = mal_cost_layer_cap(p, c->memory_mb, tp, pp, j) >= l;
            }
            if (!fits) continue;
            mal_plan plan;
            if (uniform_on(dp, tp, pp, p->n_layers, ranks, n, world, &plan)) {
                fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
                exit(1);
            }
            mal_cost_eval ev;
            if (mal_cost_eval_plan(&plan, p, c, rates, &ev)) exit(1);
            if (ev.step_time < r->T) {
                r->T = ev.step_time;
                mal_plan_fini(&best);
                mal_plan_copy(&best, &plan);
            }
            mal_cost_eval_fini(&ev);
            mal_plan_fini(&plan);
        }
    }
    if (isfinite(r->T)) eval_plan(&best, p, c, rates, 1, r);
    mal_plan_fini(&best);
    free(ranks);
}

static void planner(const mal_replan_input *in, int search, int kind, result *r, double *seconds)
{
    mal_replan_input i2 = *in;
    i2.search = search;
    mal_plan plan;
    mal_replan_stats stats;
    r->T = r->sim = INFINITY;
    int rc = mal_replan(&i2, &plan, &stats);
    if (rc == MAL_EINVAL) return; /* no plan in this space */
    if (rc) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
    if (seconds) *seconds = stats.seconds;
    eval_plan(&plan, in->profile, in->cluster, in->rates, kind, r);
    if (fabs(r->T - stats.objective) > 1e-9 * r->T) {
        fprintf(stderr, "bench_paper: the plan's cost %g is not the planner's objective %g\n", r->T,
                stats.objective);
        exit(1);
    }
    mal_plan_fini(&plan);
}

/* The reference system's memory figures, which the paper grid is planned
 * with: each layer's state counted whole (16 bytes per parameter) and
 * nothing that depends on the plan -- no copy of the gradients for their
 * sum, no moments sharded over replicas, no pipeline receive buffers (the
 * planner counts these from layer_state_mb, embedding_state_mb and
 * activation_bytes; --memory-model plans with them). */
static void reference_figures(mal_profile *q, int keep_activations)
{
    q->layer_state_mb = q->embed_state_mb = 0;
    if (!keep_activations) q->activation_bytes = 0; /* priced by --links */
}

/* ---- --memory-model: the runtime's memory --------------------------------- */

/* The straggler grid: scenario (count ci, rate xi, packed) into rates[];
 * 0 when the grid skips it, else the number of stragglers. */
static int grid_scenario(const setting *st, int n, double x, int packed, double *rates)
{
    if (packed && n == 1) return 0;               /* the same as one per node */
    if (!packed && n > st->world / RPN) return 0; /* one per node: not enough nodes */
    for (int r = 0; r < st->world; r++)
        rates[r] = 1.0;
    for (int k = 0; k < n; k++)
        rates[packed ? k : k * RPN + 3] = x;
    return n;
}

/* A plan's shape: per pipeline its stages' TP sizes, layers and recompute
 * modes, and its micro-batches (ranks left out: alike ranks may trade
 * places without changing the plan). */
static void plan_shape(const mal_plan *plan, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < plan->n_pipelines && o < len; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        o += (size_t)snprintf(buf + o, len - o, "|%d:", pl->micro_batches);
        for (int j = 0; j < pl->n_stages && o < len; j++) {
            const mal_plan_stage *q = &pl->stages[j];
            o += (size_t)snprintf(buf + o, len - o, " %d/%d/%d", q->n_ranks,
                                  q->layer_end - q->layer_begin, q->recompute);
        }
    }
}

typedef struct mm_plan {
    double T, sim;
    int pipes, smin, smax, n_rc, fits_runtime;
    char shape[4096];
} mm_plan;

static void mm_run(const mal_replan_input *in, const mal_profile *runtime, int assumed, mm_plan *o)
{
    mal_plan plan;
    mal_replan_stats stats;
    memset(o, 0, sizeof *o);
    o->T = o->sim = INFINITY;
    int rc = mal_replan(in, &plan, &stats);
    if (rc == MAL_EINVAL) return;
    if (rc) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
    result r;
    eval_plan(&plan, in->profile, in->cluster, in->rates, 3, &r);
    o->T = r.T;
    o->sim = r.sim;
    o->pipes = plan.n_pipelines;
    o->smin = 1 << 30;
    for (int i = 0; i < plan.n_pipelines; i++) {
        o->smin = MAL_MIN(o->smin, plan.pipelines[i].n_stages);
        o->smax = MAL_MAX(o->smax, plan.pipelines[i].n_stages);
        for (int j = 0; j < plan.pipelines[i].n_stages; j++)
            o->n_rc += plan.pipelines[i].stages[j].recompute != MAL_RECOMPUTE_NONE;
    }
    plan_shape(&plan, o->shape, sizeof o->shape);
    /* does it fit the runtime's memory, in the recompute mode its memory
     * figures assumed (the reference's 32B: full on every stage)? */
    for (int i = 0; i < plan.n_pipelines && assumed; i++)
        for (int j = 0; j < plan.pipelines[i].n_stages; j++)
            plan.pipelines[i].stages[j].recompute = assumed;
    mal_cost_eval ev;
    if (mal_cost_eval_plan(&plan, runtime, in->cluster, in->rates, &ev)) exit(1);
    o->fits_runtime = ev.memory_ok;
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&plan);
}

/* The uniform layouts DP x TP x PP of a setting on the runtime's memory:
 * which depths fit in which recompute mode, and their healthy step. */
static void mm_uniform(const setting *st, const mal_profile *rt, const mal_cluster *cl)
{
    double rates[64];
    for (int r = 0; r < st->world; r++)
        rates[r] = 1.0;
    int groups = st->world / st->tp;
    for (int pp = 1; pp <= groups && pp <= rt->n_layers; pp *= 2) {
        int dp = groups / pp;
        if (M < dp * pp) continue;
        mal_plan plan;
        if (mal_plan_uniform(dp, st->tp, pp, rt->n_layers, MBS, dp * MBS, &plan)) exit(1);
        for (int d = 0; d < dp; d++)
            plan.pipelines[d].micro_batches = M / dp + (d < M % dp);
        printf("  %-5s uniform DP %2d x TP %d x PP %2d:", st->name, dp, st->tp, pp);
        int fit = -1;
        for (int m = MAL_RECOMPUTE_NONE; m <= MAL_RECOMPUTE_FULL; m++) {
            double most = 0;
            for (int i = 0; i < plan.n_pipelines; i++)
                for (int j = 0; j < plan.pipelines[i].n_stages; j++) {
                    plan.pipelines[i].stages[j].recompute = m;
                    mal_cost_memory t;
                    mal_cost_memory_terms(rt, &plan, i, j, &t);
                    most = MAL_MAX(most, t.total);
                }
            printf("  %s %5.1f GB%s", mal_recompute_name(m), most / 1024,
                   most <= MEM_MB ? "" : " (no)");
            if (fit < 0 && most <= MEM_MB) fit = m;
        }
        if (fit >= 0) {
            for (int i = 0; i < plan.n_pipelines; i++)
                for (int j = 0; j < plan.pipelines[i].n_stages; j++)
                    plan.pipelines[i].stages[j].recompute = fit;
            result r;
            eval_plan(&plan, rt, cl, rates, 0, &r);
            printf("   step %.3f s (%s)", r.T * rt->layer_time, mal_recompute_name(fit));
        }
        printf("\n");
        mal_plan_fini(&plan);
    }
}

/* --memory-model: the grid planned twice -- with the reference figures
 * (the default mode's: state whole, no plan-dependent terms, 32B with
 * full recomputation everywhere) and with the runtime's memory (--zero 1
 * moments sharded over each layer's replicas, the gradient sum's copy,
 * pipeline buffers, recomputation chosen per stage: --recompute auto) --
 * how many plans change, the step and its distance from the bound, and the
 * uniform depths each setting fits at.  `bf16`: the runtime computing in
 * bf16, as on a GPU -- 18 bytes of state per parameter (the presets count
 * 16: the reference's bf16 weights and gradients beside the fp32 master
 * and moments; the runtime keeps an fp32 gradient and a bf16 working copy
 * beside the master) and the master sharded with the moments
 * (--zero-master on, the default with --zero 1); else the runtime in fp32,
 * 16 bytes, whose master is its working weights. */
static int memory_model_rows(const char *only, int bf16)
{
    static const int counts[] = {1, 2, 4, 8};
    static const double xs[] = {1.5, 2, 4, 8, 12};
    int n_rows = 0, n_changed = 0, n_unfit = 0, n_fewer = 0, n_faster = 0, n_slower = 0;
    double sum_ratio = 0, min_ratio = INFINITY, max_ratio = 0, sum_fa = 0, sum_fb = 0;
    printf("runtime: %s\n", bf16 ? "bf16 (18 bytes of state per parameter, --zero 1, --zero-master "
                                   "on, --recompute auto)"
                                 : "fp32 (16 bytes of state per parameter, --zero 1, --recompute "
                                   "auto)");
    printf("%-5s %2s %5s %-6s %8s | %-24s %8s %4s | %-24s %8s %4s | %s\n", "model", "n", "rate",
           "place", "bound_s", "reference: pipes x stages", "step_s", "fits",
           "runtime: pipes x stages", "step_s", "rc", "B/A");
    for (size_t si = 0; si < MAL_ARRAY_SIZE(settings); si++) {
        const setting *st = &settings[si];
        if (only && !strstr(only, st->name)) continue;
        mal_profile ref, rt;
        mal_cluster cl;
        if (setting_inputs(st, &ref, &rt, &cl)) return 1;
        if (st->recompute) { /* as the default mode: full everywhere */
            double state = ref.layer_state_mb / ref.tp;
            for (int d = 0; d < ref.n_k; d++)
                ref.k[d] = state + (ref.k[d] - state) * 2.0 / 34.0;
            ref.layer_time *= 4.0 / 3.0;
        }
        reference_figures(&ref, 0);
        rt.zero = 1;
        rt.recompute = MAL_REPLAN_RECOMPUTE_AUTO;
        if (bf16) {
            if (mal_profile_set_state_bytes(&rt, 18.0)) {
                fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
                return 1;
            }
            rt.zero_master = 1;
        }
        double lt = rt.layer_time;
        int s_rows = n_rows, s_changed = n_changed, s_unfit = n_unfit, s_faster = n_faster,
            s_slower = n_slower;
        double s_ratio = sum_ratio, s_fa = sum_fa, s_fb = sum_fb;
        for (size_t ci = 0; ci < MAL_ARRAY_SIZE(counts); ci++)
            for (size_t xi = 0; xi < MAL_ARRAY_SIZE(xs); xi++)
                for (int packed = 0; packed <= 1; packed++) {
                    double rates[64];
                    int n = grid_scenario(st, counts[ci], xs[xi], packed, rates);
                    if (!n) continue;
                    mal_replan_input in = {&cl,    &ref, rates,           MBS, M,
                                           st->dp, NULL, MAL_REPLAN_AUTO, 0,   NULL};
                    mm_plan a, b;
                    mm_run(&in, &rt, st->recompute ? MAL_RECOMPUTE_FULL : 0, &a);
                    in.profile = &rt;
                    mm_run(&in, &rt, 0, &b);
                    double bound = mal_cost_capacity_bound(&rt, st->world, rates, M);
                    /* the reference's times are of its own layer time (32B:
                     * a third more for full recomputation) */
                    double Ta = a.T * ref.layer_time, Tb = b.T * lt;
                    int changed = strcmp(a.shape, b.shape) != 0;
                    char sa[32], sb[32];
                    snprintf(sa, sizeof sa, "%d x %d-%d", a.pipes, a.smin, a.smax);
                    snprintf(sb, sizeof sb, "%d x %d-%d", b.pipes, b.smin, b.smax);
                    printf(
                        "%-5s %2d %5.1f %-6s %8.3f | %-24s %8.3f %4s | %-24s %8.3f %4d | %.3f%s\n",
                        st->name, n, xs[xi], packed ? "packed" : "spread", bound * lt, sa, Ta,
                        a.fits_runtime ? "yes" : "no", sb, Tb, b.n_rc, Tb / Ta,
                        changed ? "  changed" : "");
                    n_rows++;
                    n_changed += changed;
                    n_unfit += !a.fits_runtime;
                    n_fewer += b.smax < a.smax;
                    /* a changed plan at the same step is a tie the search
                     * broke otherwise */
                    n_faster += changed && Tb < Ta * (1 - 1e-6);
                    n_slower += changed && Tb > Ta * (1 + 1e-6);
                    sum_ratio += Tb / Ta;
                    min_ratio = MAL_MIN(min_ratio, Tb / Ta);
                    max_ratio = MAL_MAX(max_ratio, Tb / Ta);
                    sum_fa += bound * lt / Ta;
                    sum_fb += bound * lt / Tb;
                }
        s_rows = n_rows - s_rows;
        printf("  %-5s %d scenarios: %d change plan (%d of them faster, %d slower), %d reference "
               "plans "
               "do not fit the runtime; step runtime/reference mean %.3f; at %.3f of the bound "
               "(reference %.3f)\n",
               st->name, s_rows, n_changed - s_changed, n_faster - s_faster, n_slower - s_slower,
               n_unfit - s_unfit, (sum_ratio - s_ratio) / MAL_MAX(1, s_rows),
               (sum_fb - s_fb) / MAL_MAX(1, s_rows), (sum_fa - s_fa) / MAL_MAX(1, s_rows));
        mm_uniform(st, &rt, &cl);
        mal_profile_fini(&ref);
        mal_profile_fini(&rt);
        mal_cluster_fini(&cl);
    }
    printf("\n%d scenarios: %d change plan with the runtime's memory (%d of them faster, %d "
           "slower, the "
           "rest at the same step; %d with fewer stages in their deepest pipeline); %d reference "
           "plans do not fit the runtime's memory as they stand; step runtime/reference mean "
           "%.3f (%.3f-%.3f); at %.3f of the capacity bound (reference %.3f)\n",
           n_rows, n_changed, n_faster, n_slower, n_fewer, n_unfit, sum_ratio / MAL_MAX(1, n_rows),
           min_ratio, max_ratio, sum_fb / MAL_MAX(1, n_rows), sum_fa / MAL_MAX(1, n_rows));
    return 0;
}

/* ---- --links: slow links and mixed hardware ------------------------------ */

/* A plan's step with communication: cost model and simulator, seconds. */
static void eval_links(const mal_plan *plan, const mal_replan_input *in, double *T, double *sim,
                       double *gap)
{
    double J, s;
    if (mal_cost_plan_links(plan, in->profile, in->cluster, in->rates, in->links, NULL, &J) ||
        mal_sim_plan_links(plan, in->profile, in->cluster, in->rates, in->links, &s, NULL)) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
    *T = J * in->profile->layer_time;
    *sim = s * in->profile->layer_time;
    *gap = MAL_MAX(*gap, fabs(s - J) / J);
}

/* Schedule-only adaptation (Adaptra's): the plan's placement kept, each
 * stage's warm-up depth chosen for the slow links within memory. */
static void schedule_only(mal_plan *plan, const mal_replan_input *in)
{
    for (int i = 0; i < plan->n_pipelines; i++) {
        mal_plan_pipeline *pl = &plan->pipelines[i];
        int warm[64];
        double T;
        if (pl->n_stages > 64 || mal_cost_pipeline_links(pl, in->profile, in->cluster, in->rates,
                                                         in->links, 1, warm, &T, NULL)) {
            fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
            exit(1);
        }
        for (int j = 0; j < pl->n_stages; j++)
            pl->stages[j].warmup = warm[j];
    }
}

static void plan_or_die(const mal_replan_input *in, mal_plan *out)
{
    mal_replan_stats st;
    if (mal_replan(in, out, &st)) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
}

/* One setting's link and mixed-hardware rows: static (the uniform plan),
 * schedule-only (its warm-ups adapted), compute-only Malleus (the planner
 * blind to links) and Malleus with links; step seconds by the cost model
 * (the simulator's in brackets). */
static void mixed_rows(const setting *st, const mal_profile *prof, double frac, double *gap);

static void links_rows(const setting *st, const mal_profile *prof, double *gap, double *sum_x,
                       int *n_x)
{
    mal_cluster cl;
    if (mal_cluster_regular(&cl, st->world, RPN, MEM_MB)) exit(1);
    double rates[64];
    for (int r = 0; r < st->world; r++)
        rates[r] = 1.0;
    mal_replan_input in = {&cl, prof, rates, MBS, M, st->dp, NULL, MAL_REPLAN_AUTO, 0, NULL};
    mal_plan uni;
    if (mal_replan_uniform(&in, &uni)) exit(1);
    /* where the uniform plan's traffic runs: a TP pair, a stage boundary
     * (stage 0's first rank to stage 1's), two pipelines' stage 0 */
    const mal_plan_pipeline *p0 = &uni.pipelines[0], *p1 = &uni.pipelines[1];
    struct {
        const char *where;
        int a, b;
    } cases[3] = {{"TP", p0->stages[0].ranks[0], p0->stages[0].ranks[1 % p0->stages[0].n_ranks]},
                  {"PP", p0->stages[0].ranks[0], p0->stages[1 % p0->n_stages].ranks[0]},
                  {"DP", p0->stages[0].ranks[0], p1->stages[0].ranks[0]}};
    static const double fs[] = {4, 8};
    for (int ci = 0; ci < 3; ci++)
        for (size_t fi = 0; fi < MAL_ARRAY_SIZE(fs); fi++) {
            if (cases[ci].a == cases[ci].b) continue;
            mal_links ln = {0};
            if (mal_links_set(&ln, cases[ci].a, cases[ci].b, fs[fi])) exit(1);
            in.links = &ln;
            mal_plan sched, blind, aware;
            mal_plan_init(&sched);
            if (mal_plan_copy(&sched, &uni)) exit(1);
            schedule_only(&sched, &in);
            mal_replan_input bl = in;
            bl.links = NULL;
            plan_or_die(&bl, &blind);
            plan_or_die(&in, &aware);
            double T[4], S[4];
            const mal_plan *plans[4] = {&uni, &sched, &blind, &aware};
            for (int k = 0; k < 4; k++)
                eval_links(plans[k], &in, &T[k], &S[k], gap);
            printf("%-5s %-2s %3.0fx %5d-%-5d %7.3f (%7.3f) %7.3f (%7.3f) %7.3f (%7.3f) %7.3f "
                   "(%7.3f) %5.2f %5.2f %5.2f\n",
                   st->name, cases[ci].where, fs[fi], cases[ci].a, cases[ci].b, T[0], S[0], T[1],
                   S[1], T[2], S[2], T[3], S[3], T[0] / T[3], T[1] / T[3], T[2] / T[3]);
            for (int k = 0; k < 3; k++)
                sum_x[k] += T[k] / T[3];
            (*n_x)++;
            mal_plan_fini(&sched);
            mal_plan_fini(&blind);
            mal_plan_fini(&aware);
            mal_links_fini(&ln);
        }
    mal_plan_fini(&uni);
    mal_cluster_fini(&cl);

    /* mixed hardware: the odd nodes of a slower type with less memory */
    mixed_rows(st, prof, 0.75, gap);
    mixed_rows(st, prof, 0.5, gap);
}

/* A copy of p for a device at `speed` times its speed (its own profile:
 * the same model's memory per layer, a longer layer_time). */
static mal_profile *slower_profile(const mal_profile *p, double speed)
{
    mal_profile *q = malloc(sizeof *q);
    if (!q) exit(1);
    *q = *p;
    q->k = malloc((size_t)p->n_k * sizeof *q->k);
    if (!q->k) exit(1);
    memcpy(q->k, p->k, (size_t)p->n_k * sizeof *q->k);
    snprintf(q->name, sizeof q->name, "%.20s-slow", p->name);
    q->layer_time = p->layer_time / speed;
    return q;
}

/* A cluster of st's nodes, every other one of type "b": memory mb_a / mb_b;
 * "b" at 0.6x the speed by a profile of its own (with_profile) or at
 * speed_b with --profile's; rates[] the planner's for it. */
static void mixed_cluster(const setting *st, const mal_profile *prof, mal_cluster *cl, double mb_a,
                          double mb_b, double speed_a, double speed_b, int with_profile,
                          double *rates)
{
    char js[1024];
    int n = snprintf(js, sizeof js,
                     "{\"world_size\": %d, \"ranks_per_node\": %d, \"types\": {\"a\": "
                     "{\"memory_mb\": %g, \"speed\": %g}, \"b\": {\"memory_mb\": %g, "
                     "\"speed\": %g}}, \"node_types\": [",
                     st->world, RPN, mb_a, speed_a, mb_b, speed_b);
    for (int k = 0; k < st->world / RPN; k++)
        n += snprintf(js + n, sizeof js - (size_t)n, "%s\"%s\"", k ? ", " : "", k % 2 ? "b" : "a");
    snprintf(js + n, sizeof js - (size_t)n, "]}");
    if (mal_cluster_parse_buffer(cl, js, strlen(js), "mixed cluster")) {
        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
        exit(1);
    }
    /* as mal_cluster_load_profiles sets it: --profile's layer_time over its own */
    for (int t = 0; with_profile && t < cl->n_types; t++)
        if (!strcmp(cl->types[t].name, "b")) {
            cl->types[t].profile = slower_profile(prof, 0.6);
            cl->types[t].speed = prof->layer_time / cl->types[t].profile->layer_time;
        }
    double raw[64];
    for (int r = 0; r < st->world; r++)
        raw[r] = 1.0;
    mal_cluster_effective_rates(cl, raw, rates);
}

/* Mixed hardware, every other node 0.6x the speed and `frac` the memory
 * (its own profile: the model's memory per layer, 1 / 0.6 its layer
 * time).  Four plans, each priced on that cluster (cost model, simulator):
 * static (the nominal uniform plan); Malleus blind to the types, planning
 * every node as the smallest, slowest type; Malleus with the types' speeds
 * only, every stage sized for the least memory (the planner before
 * per-type memory); Malleus with each type's memory and profile. */
static void mixed_rows(const setting *st, const mal_profile *prof, double frac, double *gap)
{
    mal_cluster real, blind, speed_only;
    double rates[64], r_blind[64], r_speed[64];
    mixed_cluster(st, prof, &real, MEM_MB, frac * MEM_MB, 1, 1, 1, rates);
    /* the planner's view without types: every node a "b" (one speed for
     * all: the plan is that of any common speed) */
    if (mal_cluster_regular(&blind, st->world, RPN, frac * MEM_MB)) exit(1);
    for (int r = 0; r < st->world; r++)
        r_blind[r] = 1.0;
    mixed_cluster(st, prof, &speed_only, frac * MEM_MB, frac * MEM_MB, 1, 0.6, 0, r_speed);
    mal_replan_input in = {&real, prof, rates, MBS, M, st->dp, NULL, MAL_REPLAN_AUTO, 0, NULL};
    mal_replan_input in_b = in, in_s = in;
    in_b.cluster = &blind;
    in_b.rates = r_blind;
    in_s.cluster = &speed_only;
    in_s.rates = r_speed;
    const char *name[4] = {"static", "as slowest", "speed only", "Malleus"};
    double T[4], S[4];
    mal_plan plans[4];
    int ok[4] = {0};
    ok[0] = !mal_replan_uniform(&in, &plans[0]);
    ok[1] = !mal_replan(&in_b, &plans[1], NULL);
    ok[2] = !mal_replan(&in_s, &plans[2], NULL);
    ok[3] = !mal_replan(&in, &plans[3], NULL);
    for (int k = 0; k < 4; k++) {
        T[k] = S[k] = INFINITY;
        if (!ok[k]) {
            printf("%-5s mixed %.2fx memory, %s: %s\n", st->name, frac, name[k], mal_errmsg());
            mal_clearerr();
            continue;
        }
        mal_cost_eval ev;
        if (mal_cost_eval_plan(&plans[k], prof, &real, rates, &ev)) exit(1);
        if (!ev.memory_ok)
            printf("%-5s mixed %.2fx memory, %s: does not fit memory\n", st->name, frac, name[k]);
        mal_cost_eval_fini(&ev);
        eval_links(&plans[k], &in, &T[k], &S[k], gap);
        mal_plan_fini(&plans[k]);
    }
    printf("%-5s mixed (half the nodes 0.6x speed by their profile, %.2fx memory): static %.3f "
           "(%.3f), as slowest %.3f (%.3f), speed only %.3f (%.3f), Malleus %.3f (%.3f): %.2fx "
           "static, %.2fx as slowest, %.2fx speed only\n",
           st->name, frac, T[0], S[0], T[1], S[1], T[2], S[2], T[3], S[3], T[0] / T[3], T[1] / T[3],
           T[2] / T[3]);
    mal_cluster_fini(&real);
    mal_cluster_fini(&blind);
    mal_cluster_fini(&speed_only);
}

int main(int argc, char **argv)
{
    const char *csv_path = NULL, *only = NULL;
    int widest = 0, links = 0, memory_model = 0, bf16 = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else if (!strcmp(argv[i], "--settings") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--widest"))
            widest = 1;
        else if (!strcmp(argv[i], "--links"))
            links = 1;
        else if (!strcmp(argv[i], "--memory-model")) {
            memory_model = 1;
            /* its optional value: the runtime's precision */
            if (i + 1 < argc && (!strcmp(argv[i + 1], "bf16") || !strcmp(argv[i + 1], "fp32")))
                bf16 = !strcmp(argv[++i], "bf16");
        } else {
            fprintf(stderr, "usage: bench_paper [--csv FILE] [--widest] [--links] "
                            "[--memory-model [bf16|fp32]] [--settings 32b,70b,110b]\n");
            return 2;
        }
    }
    if (memory_model) return memory_model_rows(only, bf16);
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !csv) {
        perror(csv_path);
        return 1;
    }
    if (csv)
        fprintf(csv, "setting,stragglers,rate,placement,bound,static,drop,nominal_tp,malleus,"
                     "malleus_sim,plan_seconds\n");
    double gap_links = 0, sum_lx[3] = {0};
    int n_lx = 0;
    if (links)
        printf("%-5s %-2s %4s %-11s %-17s %-17s %-17s %-17s %5s %5s %5s\n", "model", "at", "rate",
               "link", "static", "schedule-only", "compute-only", "Malleus+links", "x_st", "x_sch",
               "x_co");
    static const int counts[] = {1, 2, 4, 8};
    static const double xs[] = {1.5, 2, 4, 8, 12};
    if (!links)
        printf("%-5s %2s %5s %-6s %8s %8s %8s %8s %8s %6s %6s %6s %6s %7s\n", "model", "n", "rate",
               "place", "bound_s", "static", "drop", "nomTP", "malleus", "frac", "x_stat", "x_drop",
               "x_nom", "plan_s");
    double sum_frac = 0, min_frac = 1, sum_x[3] = {0}, min_x[3] = {1e9, 1e9, 1e9}, max_x[3] = {0},
           sum_xs[3] = {0};
    int n_rows = 0, n_x[3] = {0}, behind = 0, n_wide = 0, wide_diff = 0;
    double plan_max = 0, wide_max = 0;
    for (size_t si = 0; si < MAL_ARRAY_SIZE(settings); si++) {
        const setting *st = &settings[si];
        if (only && !strstr(only, st->name)) continue;
        mal_profile prof, nomtp;
        mal_cluster cl;
        if (setting_inputs(st, &prof, &nomtp, &cl)) return 1;
        if (st->recompute) {
            /* full activation recomputation: per layer and micro-batch in
             * flight only the layer's input is kept (2 T b C bytes instead of
             * 34 T b C), for a third more compute (one more forward) */
            for (mal_profile *q = &prof; q; q = q == &prof ? &nomtp : NULL) {
                double state = q->layer_state_mb / q->tp;
                for (int d = 0; d < q->n_k; d++)
                    q->k[d] = state + (q->k[d] - state) * 2.0 / 34.0;
                q->layer_time *= 4.0 / 3.0;
            }
        }
        reference_figures(&prof, links);
        reference_figures(&nomtp, links);
        /* baseline 3's space: the nominal TP size only */
        for (int l = 0; l <= MAL_REPLAN_MAX_TP_LOG; l++)
            if ((1 << l) != st->tp) nomtp.alpha[l] = 0;
        if (links) {
            links_rows(st, &prof, &gap_links, sum_lx, &n_lx);
            mal_profile_fini(&prof);
            mal_profile_fini(&nomtp);
            mal_cluster_fini(&cl);
            continue;
        }
        double lt = prof.layer_time;
        for (size_t ci = 0; ci < MAL_ARRAY_SIZE(counts); ci++)
            for (size_t xi = 0; xi < MAL_ARRAY_SIZE(xs); xi++)
                for (int packed = 0; packed <= 1; packed++) {
                    double rates[64];
                    int n = grid_scenario(st, counts[ci], xs[xi], packed, rates);
                    if (!n) continue;
                    mal_replan_input in = {&cl,    &prof, rates,           MBS, M,
                                           st->dp, NULL,  MAL_REPLAN_AUTO, 0,   NULL};
                    result r1, r2, r3, r4;
                    mal_plan uni;
                    if (mal_replan_uniform(&in, &uni)) {
                        fprintf(stderr, "bench_paper: %s\n", mal_errmsg());
                        return 1;
                    }
                    eval_plan(&uni, &prof, &cl, rates, 0, &r1);
                    mal_plan_fini(&uni);
                    drop_nodes(st, &prof, &cl, rates, &r2);
                    mal_replan_input in3 = in;
                    in3.profile = &nomtp;
                    planner(&in3, MAL_REPLAN_AUTO, 2, &r3, NULL);
                    double secs = 0;
                    planner(&in, MAL_REPLAN_AUTO, 3, &r4, &secs);
                    plan_max = MAL_MAX(plan_max, secs);
                    double bound = mal_cost_capacity_bound(&prof, st->world, rates, M);
                    double frac = bound / r4.T;
                    const result *base[3] = {&r1, &r2, &r3};
                    double x[3];
                    for (int b = 0; b < 3; b++) {
                        x[b] = base[b]->T / r4.T;
                        if (!isfinite(x[b])) continue;
                        sum_x[b] += x[b];
                        sum_xs[b] += base[b]->sim / r4.sim;
                        n_x[b]++;
                        min_x[b] = MAL_MIN(min_x[b], x[b]);
                        max_x[b] = MAL_MAX(max_x[b], x[b]);
                    }
                    if (r4.T > r2.T * (1 + 1e-9) || r4.T > r3.T * (1 + 1e-9)) behind++;
                    sum_frac += frac;
                    min_frac = MAL_MIN(min_frac, frac);
                    n_rows++;
                    printf("%-5s %2d %5.1f %-6s %8.3f %8.3f %8.3f %8.3f %8.3f %6.3f %6.2f %6.2f "
                           "%6.2f %7.3f\n",
                           st->name, n, xs[xi], packed ? "packed" : "spread", bound * lt, r1.T * lt,
                           r2.T * lt, r3.T * lt, r4.T * lt, frac, x[0], x[1], x[2], secs);
                    if (csv)
                        fprintf(csv, "%s,%d,%g,%s,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.6f\n", st->name,
                                n, xs[xi], packed ? "packed" : "spread", bound * lt, r1.T * lt,
                                r2.T * lt, r3.T * lt, r4.T * lt, r4.sim * lt, secs);
                    /* the exhaustive search is run where it ends in
                     * reasonable time: up to 2 nodes with stragglers */
                    if (widest && (packed || n <= 2)) {
                        result rw;
                        double ws = 0;
                        planner(&in, MAL_REPLAN_EXHAUSTIVE, 3, &rw, &ws);
                        n_wide++;
                        wide_max = MAL_MAX(wide_max, ws);
                        if (fabs(rw.T - r4.T) > 1e-9 * rw.T) {
                            wide_diff++;
                            printf("      widest search: %.4f s (default %.4f s), %.2f s\n",
                                   rw.T * lt, r4.T * lt, ws);
                        }
                    }
                }
        mal_profile_fini(&prof);
        mal_profile_fini(&nomtp);
        mal_cluster_fini(&cl);
    }
    if (links) {
        static const char *ln[] = {"static", "schedule-only", "compute-only Malleus"};
        printf("\n%d link scenarios: Malleus with links over", n_lx);
        for (int k = 0; k < 3; k++)
            printf(" %s %.2fx%s", ln[k], sum_lx[k] / MAL_MAX(1, n_lx), k < 2 ? "," : "");
        printf(" (mean, cost model); simulator vs cost model, largest gap %.1f%%\n",
               100 * gap_links);
        if (csv) fclose(csv);
        return 0;
    }
    printf("\n%d scenarios: Malleus at %.3f of the capacity bound on average (least %.3f); "
           "behind baseline 2 or 3 in %d\n",
           n_rows, sum_frac / n_rows, min_frac, behind);
    static const char *names[] = {"static uniform", "drop straggler nodes", "nominal TP only"};
    for (int b = 0; b < 3; b++)
        printf("speedup over %-21s mean %.2fx, range %.2f-%.2fx (%d scenarios with a plan); "
               "by the simulator mean %.2fx\n",
               names[b], sum_x[b] / MAL_MAX(1, n_x[b]), min_x[b], max_x[b], n_x[b],
               sum_xs[b] / MAL_MAX(1, n_x[b]));
    static const char *kinds[] = {"static", "drop", "nominal TP", "Malleus"};
    printf("simulator vs cost model, largest gap:");
    for (int k = 0; k < 4; k++)
        printf(" %s %.1f%%%s", kinds[k], 100 * dev_closed[k], k < 3 ? "," : "");
    printf("\n  (vs the shaped bubble:");
    for (int k = 0; k < 4; k++)
        printf(" %s %.1f%%%s", kinds[k], 100 * dev_shaped[k], k < 3 ? "," : ")");
    printf("\nplanning at most %.3f s\n", plan_max);
    if (widest)
        printf("widest search (--search exhaustive): differs from the default in %d of %d "
               "scenarios; at most %.2f s\n",
               wide_diff, n_wide, wide_max);
    if (csv) fclose(csv);
    return 0;
}
