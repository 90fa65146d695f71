/* Slow links and mixed hardware in the planner (replan/README.md "Links",
 * "Mixed hardware"):
 *   - the communication terms against hand-worked numbers;
 *   - a slow link inside a TP group, or across a stage boundary, is moved
 *     to where it carries the least traffic (between pipelines, or a pair
 *     that exchanges nothing), and the step is faster than the
 *     compute-only plan's with the same link;
 *   - a slow boundary that no exchange avoids gets a deeper warm-up, which
 *     the simulator confirms;
 *   - exact reference: on 40 random 8-rank instances the planner's step
 *     time with links equals the optimum that an independent enumeration
 *     finds over every placement of alike ranks (same node, same rate)
 *     into the compute search's plan, every micro-batch split and every
 *     warm-up depth, priced by its own implementation of the terms
 *     (`--long N`: N instances, the share at the optimum reported -- the
 *     placement is a local search, 393 of 400 at this commit);
 *   - a mixed cluster: types parsed and refused with the field named, TP
 *     groups within one type, every stage within its ranks' memory, the
 *     slower type planned as stragglers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mal_test.h"
#include "replan/replan.h"
#include "replan/sim.h"
#include "replan_test.h"
#include "src/plan.h"

#define W 8

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static int plan_for(const mal_cluster *c, const mal_profile *p, const double *rates, int M, int dp,
                    const mal_links *ln, mal_plan *out, mal_replan_stats *st)
{
    mal_replan_input in = mal_test_replan_input(c, p, rates, 1, M);
    in.nominal_dp = dp;
    in.search = MAL_REPLAN_AUTO;
    in.links = ln;
    return mal_replan(&in, out, st);
}

static double plan_cost(const mal_plan *pl, const mal_profile *p, const mal_cluster *c,
                        const double *rates, const mal_links *ln)
{
    double J;
    CHECK_OK(mal_cost_plan_links(pl, p, c, rates, ln, NULL, &J));
    return J;
}

/* ---- the reference: its own terms ---------------------------------------- */

typedef struct ref {
    const mal_profile *p;
    const mal_cluster *c;
    const double *rates;
    double f[W][W]; /* link rate factor (1 healthy) */
} ref;

static double ref_msg(const ref *R, int a, int b, double bytes)
{
    const mal_profile *p = R->p;
    int intra = R->c->node_of[a] == R->c->node_of[b];
    double lat = intra ? p->link_latency : p->node_link_latency;
    double bw = intra ? p->link_bandwidth : p->node_link_bandwidth;
    double base = lat + bytes / bw;
    /* the presets' alpha holds a healthy link's time: only the excess */
    return (p->comm_in_alpha ? R->f[a][b] - 1 : R->f[a][b]) * base / p->layer_time;
}

/* one pipeline's best time over warm-up depths at m micro-batches */
static double ref_pipe(const ref *R, const mal_plan_pipeline *pl, int m)
{
    int S = pl->n_stages;
    double c[8], d[8], P = 0;
    for (int j = 0; j < S; j++) {
        const mal_plan_stage *st = &pl->stages[j];
        int g = st->n_ranks, l = st->layer_end - st->layer_begin;
        double x = 1;
        for (int k = 0; k < g; k++)
            x = fmax(x, mal_cost_floor(R->rates[st->ranks[k]]));
        double tp = 0; /* ring: 2 (g-1) chunks of 1/g, the slowest hop paces */
        for (int k = 0; g > 1 && k < g; k++)
            tp = fmax(tp, 2.0 * (g - 1) *
                              ref_msg(R, st->ranks[k], st->ranks[(k + 1) % g],
                                      R->p->activation_bytes / g));
        c[j] = l * (x * mal_profile_alpha(R->p, g) + R->p->tp_allreduces * tp);
        d[j] = 0;
        if (j + 1 < S) /* receiver r from sender r mod |from| */
            for (int r = 0; r < pl->stages[j + 1].n_ranks; r++)
                d[j] = fmax(d[j], ref_msg(R, st->ranks[r % g], pl->stages[j + 1].ranks[r],
                                          R->p->activation_bytes));
        P = fmax(P, c[j]);
    }
    double sd = 0;
    for (int j = 0; j < S; j++)
        sd += d[j];
    /* every warm-up vector: w_j in [min(S-j-1, m), m-1], non-increasing,
     * within the stage's memory (S <= 4 here: a few hundred at most) */
    int w[8], lo[8], hi[8];
    for (int j = 0; j < S; j++) {
        lo[j] = S - j - 1 < m ? S - j - 1 : m;
        hi[j] = m - 1 > lo[j] ? m - 1 : lo[j];
        w[j] = lo[j];
    }
    double best = INFINITY;
    for (;;) {
        int ok = 1;
        for (int j = 0; j < S && ok; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            if (j > 0 && w[j] > w[j - 1]) ok = 0;
            if (w[j] > lo[j]) /* the default depth fits: the search checked it */
                for (int k = 0; k < st->n_ranks; k++)
                    if (mal_cost_stage_memory_d(R->p, st->n_ranks, S, j,
                                                st->layer_end - st->layer_begin, w[j]) >
                        mal_cluster_rank_memory(R->c, st->ranks[k]) * (1 + 1e-12))
                        ok = 0;
        }
        if (ok) {
            double Pe = P, Rt = 0;
            for (int k = S - 1; k >= 0; k--) {
                Rt += c[k] + (k + 1 < S ? 2 * d[k] : 0);
                Pe = fmax(Pe, Rt / ((w[k] < m - 1 ? w[k] : m - 1) + 1));
            }
            best = fmin(best, (m + S - 1) * Pe + 2 * sd);
        }
        int j = 0;
        while (j < S && w[j] == hi[j])
            w[j] = lo[j], j++;
        if (j == S) break;
        w[j]++;
    }
    return best;
}

static double ref_dp(const ref *R, const mal_plan *pl)
{
    double worst = 0;
    for (int a = 0; a < W; a++)
        for (int b = a + 1; b < W; b++) {
            mal_plan_loc la, lb;
            if (R->f[a][b] <= 1 || mal_plan_locate(pl, a, &la) || mal_plan_locate(pl, b, &lb) ||
                la.pipeline < 0 || lb.pipeline < 0 || la.pipeline == lb.pipeline)
                continue;
            const mal_plan_stage *sa = &pl->pipelines[la.pipeline].stages[la.stage];
            const mal_plan_stage *sb = &pl->pipelines[lb.pipeline].stages[lb.stage];
            int lo = sa->layer_begin > sb->layer_begin ? sa->layer_begin : sb->layer_begin;
            int hi = sa->layer_end < sb->layer_end ? sa->layer_end : sb->layer_end;
            if (hi <= lo) continue;
            int g = sa->n_ranks < sb->n_ranks ? sa->n_ranks : sb->n_ranks;
            int intra = R->c->node_of[a] == R->c->node_of[b];
            double lat = intra ? R->p->link_latency : R->p->node_link_latency;
            double bw = intra ? R->p->link_bandwidth : R->p->node_link_bandwidth;
            double base = 2 * (lat + R->p->grad_bytes * (hi - lo) / g / bw);
            worst = fmax(worst, (R->f[a][b] - 1) * base / R->p->layer_time);
        }
    return worst;
}

/* min over micro-batch splits (m_i >= S_i, sum M) of max_i T_i(m_i) */
static double ref_split(const ref *R, const mal_plan *pl, int i, int left, double sofar)
{
    const mal_plan_pipeline *p = &pl->pipelines[i];
    if (i == pl->n_pipelines - 1)
        return left >= p->n_stages ? fmax(sofar, ref_pipe(R, p, left)) : INFINITY;
    int rest = 0;
    for (int q = i + 1; q < pl->n_pipelines; q++)
        rest += pl->pipelines[q].n_stages;
    double best = INFINITY;
    for (int m = p->n_stages; m <= left - rest; m++)
        best = fmin(best, ref_split(R, pl, i + 1, left - m, fmax(sofar, ref_pipe(R, p, m))));
    return best;
}

/* every placement of alike ranks: per class, every permutation */
static int next_perm(int *a, int n)
{
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0) return 0;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int x = i + 1, y = n - 1; x < y; x++, y--)
        t = a[x], a[x] = a[y], a[y] = t;
    return 1;
}

static double ref_optimum(const ref *R, const mal_plan *base, int M)
{
    int cls[W], n_cls = 0, members[W][W], n_mem[W], perm[W][W];
    for (int r = 0; r < W; r++) {
        int k = 0;
        for (; k < n_cls; k++) {
            int q = members[k][0];
            if (R->c->node_of[q] == R->c->node_of[r] &&
                mal_cost_floor(R->rates[q]) == mal_cost_floor(R->rates[r]))
                break;
        }
        if (k == n_cls) n_mem[n_cls++] = 0;
        members[k][n_mem[k]++] = r;
        cls[r] = k;
    }
    (void)cls;
    for (int k = 0; k < n_cls; k++)
        for (int q = 0; q < n_mem[k]; q++)
            perm[k][q] = q;
    mal_plan pl;
    mal_plan_init(&pl);
    CHECK_OK(mal_plan_copy(&pl, base));
    double best = INFINITY;
    for (;;) {
        int to[W];
        for (int k = 0; k < n_cls; k++)
            for (int q = 0; q < n_mem[k]; q++)
                to[members[k][q]] = members[k][perm[k][q]];
        for (int i = 0; i < base->n_pipelines; i++)
            for (int j = 0; j < base->pipelines[i].n_stages; j++)
                for (int q = 0; q < base->pipelines[i].stages[j].n_ranks; q++)
                    pl.pipelines[i].stages[j].ranks[q] = to[base->pipelines[i].stages[j].ranks[q]];
        best = fmin(best, ref_split(R, &pl, 0, M, 0) + ref_dp(R, &pl));
        int k = 0;
        while (k < n_cls && !next_perm(perm[k], n_mem[k])) {
            for (int q = 0; q < n_mem[k]; q++)
                perm[k][q] = q;
            k++;
        }
        if (k == n_cls) break;
    }
    mal_plan_fini(&pl);
    return best;
}

/* ---- the planner's behaviour --------------------------------------------- */

static void check_terms(void)
{
    mal_profile p = {0};
    mal_cluster c = {0};
    mal_links ln = {0};
    CHECK_OK(mal_profile_preset(&p, "tiny", 1));
    CHECK_OK(mal_cluster_regular(&c, 4, 2, 1000));
    CHECK_OK(mal_links_set(&ln, 1, 0, 5.0));
    CHECK_EQ_INT(ln.l[0].a, 0);
    CHECK_CLOSE(mal_links_rate(&ln, 1, 0), 5.0, 0, 0);
    CHECK_CLOSE(mal_links_rate(&ln, 2, 3), 1.0, 0, 0);
    /* TP 2 over 0-1, same node: 4 all-reduces x 2 (g-1) chunks of A/2 at
     * 4x the healthy link's time (the excess over alpha's) */
    double A = p.activation_bytes, lt = p.layer_time;
    int g[2] = {0, 1};
    double chunk = p.link_latency + A / 2 / p.link_bandwidth;
    CHECK_CLOSE(mal_cost_tp_comm(&p, &c, &ln, g, 2), 4 * 2 * chunk * 4.0 / lt, 1e-12, 0);
    int h[2] = {2, 3};
    CHECK_CLOSE(mal_cost_tp_comm(&p, &c, &ln, h, 2), 0.0, 0, 0);
    /* activation 0 -> 2 across nodes over a link made slow */
    CHECK_OK(mal_links_set(&ln, 0, 2, 3.0));
    mal_plan_stage s0 = {.n_ranks = 2, .ranks = g}, s1 = {.n_ranks = 2, .ranks = h};
    double hop = p.node_link_latency + A / p.node_link_bandwidth;
    CHECK_CLOSE(mal_cost_p2p(&p, &c, &ln, &s0, &s1), 2.0 * hop / lt, 1e-12, 0);
    /* a profile that does not fold communication into alpha pays all of it */
    mal_profile q = p;
    q.comm_in_alpha = 0;
    CHECK_CLOSE(mal_cost_p2p(&q, &c, &ln, &s0, &s1), 3.0 * hop / lt, 1e-12, 0);
    mal_links_fini(&ln);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* slow link inside a TP group: moved between pipelines */
static void check_tp_link(void)
{
    mal_profile p = {0};
    mal_cluster c = {0};
    mal_links ln = {0};
    double rates[W];
    for (int r = 0; r < W; r++)
        rates[r] = 1.0;
    CHECK_OK(mal_profile_preset(&p, "tiny", 1));
    CHECK_OK(mal_cluster_regular(&c, W, 4, 1000));
    CHECK_OK(mal_links_set(&ln, 0, 1, 8.0));
    mal_plan blind, aware;
    mal_replan_stats st;
    CHECK_OK(plan_for(&c, &p, rates, 8, 0, NULL, &blind, &st));
    mal_plan_loc a, b;
    CHECK_OK(mal_plan_locate(&blind, 0, &a));
    CHECK_OK(mal_plan_locate(&blind, 1, &b));
    CHECK(a.pipeline == b.pipeline && a.stage == b.stage); /* the premise */
    CHECK_OK(plan_for(&c, &p, rates, 8, 0, &ln, &aware, &st));
    CHECK_OK(mal_plan_validate(&aware, W, p.n_layers, p.n_heads, p.ffn_hidden, 8));
    CHECK_OK(mal_plan_locate(&aware, 0, &a));
    CHECK_OK(mal_plan_locate(&aware, 1, &b));
    CHECK(a.pipeline >= 0 && b.pipeline >= 0 && a.pipeline != b.pipeline);
    double Jb = plan_cost(&blind, &p, &c, rates, &ln), Ja = plan_cost(&aware, &p, &c, rates, &ln);
    CHECK_CLOSE(st.objective, Ja, 1e-12, 0);
    printf("TP link 0-1 x8: compute-only plan %.4f s, link-aware %.4f s (%.2fx)\n",
           Jb * p.layer_time, Ja * p.layer_time, Jb / Ja);
    CHECK(Ja < Jb * 0.9);
    mal_plan_fini(&blind);
    mal_plan_fini(&aware);
    mal_links_fini(&ln);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* slow link across a stage boundary: off the boundary; and a boundary no
 * exchange can avoid: a deeper warm-up */
static void check_boundary_link(void)
{
    mal_profile p = {0};
    mal_cluster c = {0};
    mal_links ln = {0};
    double rates[W];
    for (int r = 0; r < W; r++)
        rates[r] = 1.0;
    CHECK_OK(mal_profile_preset(&p, "small", 1));
    p.link_bandwidth /= 64; /* a slow interconnect: a hop near a stage's time */
    p.zero = 1;             /* the run's default: two replicas' moments sharded */
    CHECK_OK(mal_cluster_regular(&c, W, W, 200)); /* 200 MB: two stages */
    mal_plan blind, aware;
    mal_replan_stats st;
    CHECK_OK(plan_for(&c, &p, rates, 8, 0, NULL, &blind, &st));
    const mal_plan_pipeline *b0 = &blind.pipelines[0];
    CHECK(b0->n_stages == 2); /* the premise */
    int a = b0->stages[0].ranks[0], b = b0->stages[1].ranks[0];
    CHECK_OK(mal_links_set(&ln, a, b, 8.0));
    CHECK_OK(plan_for(&c, &p, rates, 8, 0, &ln, &aware, &st));
    CHECK_OK(mal_plan_validate(&aware, W, p.n_layers, p.n_heads, p.ffn_hidden, 8));
    double Jb = plan_cost(&blind, &p, &c, rates, &ln), Ja = plan_cost(&aware, &p, &c, rates, &ln);
    printf("boundary link %d-%d x8: compute-only plan %.4f s, link-aware %.4f s (%.2fx)\n", a, b,
           Jb * p.layer_time, Ja * p.layer_time, Jb / Ja);
    CHECK(Ja < Jb * 0.95);
    /* the link carries no activation and no all-reduce any more */
    for (int i = 0; i < aware.n_pipelines; i++)
        for (int j = 0; j < aware.pipelines[i].n_stages; j++) {
            const mal_plan_stage *s = &aware.pipelines[i].stages[j];
            CHECK(mal_cost_tp_comm(&p, &c, &ln, s->ranks, s->n_ranks) == 0);
            if (j + 1 < aware.pipelines[i].n_stages)
                CHECK(mal_cost_p2p(&p, &c, &ln, s, &aware.pipelines[i].stages[j + 1]) == 0);
        }
    mal_plan_fini(&blind);
    mal_plan_fini(&aware);
    mal_links_fini(&ln);
    mal_cluster_fini(&c);

    /* 4 ranks on 2 nodes, one pipeline of two stages across them, every
     * cross pair slow: the boundary stays slow, stage 0 warms up deeper */
    CHECK_OK(mal_cluster_regular(&c, 4, 2, 1000));
    for (int x = 0; x < 2; x++)
        for (int y = 2; y < 4; y++)
            CHECK_OK(mal_links_set(&ln, x, y, 6.0));
    mal_profile q = p;
    q.node_link_bandwidth = p.node_link_bandwidth / 64; /* a hop near a stage's time */
    mal_plan_init(&blind);
    CHECK_OK(mal_plan_parse_string(&blind,
                                   "{\"format\": \"malleus-plan/1\", \"micro_batch_size\": 1, "
                                   "\"pipelines\": [{\"micro_batches\": 8, \"stages\": ["
                                   "{\"ranks\": [0, 1], \"layers\": [0, 2]},"
                                   "{\"ranks\": [2, 3], \"layers\": [2, 4]}]}]}",
                                   "test plan"));
    int warm[2];
    double T0, T1, s0, s1;
    CHECK_OK(mal_cost_pipeline_links(&blind.pipelines[0], &q, &c, rates, &ln, 0, NULL, &T0, NULL));
    CHECK_OK(mal_sim_plan_links(&blind, &q, &c, rates, &ln, &s0, NULL));
    CHECK_OK(mal_cost_pipeline_links(&blind.pipelines[0], &q, &c, rates, &ln, 1, warm, &T1, NULL));
    CHECK(warm[0] > 1 && warm[1] == 0);
    blind.pipelines[0].stages[0].warmup = warm[0];
    CHECK_OK(mal_sim_plan_links(&blind, &q, &c, rates, &ln, &s1, NULL));
    printf("slow boundary: warm-up %d: closed form %.3f -> %.3f, simulated %.3f -> %.3f "
           "(layer units)\n",
           warm[0], T0, T1, s0, s1);
    CHECK(T1 < T0 * 0.95 && s1 < s0 * 0.95);
    /* the closed form is the schedule's time within a few per cent */
    CHECK_CLOSE(s1, T1, 0.1, 0);
    mal_plan_fini(&blind);
    mal_links_fini(&ln);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* ---- exact reference ----------------------------------------------------- */

static void check_exact(int n, int strict)
{
    uint64_t seed = 28;
    int done = 0, at_opt = 0;
    double worst = 1.0;
    for (int it = 0; it < n; it++) {
        mal_profile p = {0};
        mal_cluster c = {0};
        mal_links ln = {0};
        ref R = {0};
        double rates[W];
        /* tiny: one stage per pipeline; small at 200 MB: two */
        int two = (int)(lcg(&seed) % 2);
        CHECK_OK(mal_profile_preset(&p, two ? "small" : "tiny", 1));
        /* communication from a fraction of a layer's time to several */
        p.link_bandwidth /= 1 << (lcg(&seed) % 9);
        p.node_link_bandwidth /= 1 << (lcg(&seed) % 9);
        p.comm_in_alpha = (int)(lcg(&seed) % 4 != 0);
        static const int rpn[] = {2, 4, 8};
        double mem = two ? 200 : 1000;
        CHECK_OK(mal_cluster_regular(&c, W, rpn[lcg(&seed) % 3], mem));
        for (int r = 0; r < W; r++)
            rates[r] = lcg(&seed) % 6 == 0 ? 2.0 + (double)(lcg(&seed) % 4) : 1.0;
        for (int a = 0; a < W; a++)
            for (int b = 0; b < W; b++)
                R.f[a][b] = 1.0;
        int nl = 1 + (int)(lcg(&seed) % 3);
        for (int k = 0; k < nl; k++) {
            int a = (int)(lcg(&seed) % W), b = (int)(lcg(&seed) % W);
            double f = 2.0 + (double)(lcg(&seed) % 11);
            if (a == b) continue;
            CHECK_OK(mal_links_set(&ln, a, b, f));
            R.f[a][b] = R.f[b][a] = f;
        }
        int M = 4 + (int)(lcg(&seed) % 5), dp = (int)(lcg(&seed) % 3);
        R.p = &p;
        R.c = &c;
        R.rates = rates;
        mal_plan blind, aware;
        mal_replan_stats st;
        int rc = plan_for(&c, &p, rates, M, dp, NULL, &blind, &st);
        if (rc) { /* no plan for this batch: the same for both */
            mal_clearerr();
            CHECK(plan_for(&c, &p, rates, M, dp, &ln, &aware, &st) == rc);
            mal_clearerr();
        } else {
            CHECK_OK(plan_for(&c, &p, rates, M, dp, &ln, &aware, &st));
            CHECK_OK(mal_plan_validate(&aware, W, p.n_layers, p.n_heads, p.ffn_hidden, M));
            double opt = ref_optimum(&R, &blind, M);
            double got = plan_cost(&aware, &p, &c, rates, &ln);
            if (fabs(got - opt) > 1e-9 * opt && strict) {
                char *a = NULL, *b = NULL;
                mal_plan_to_string(&blind, &a);
                mal_plan_to_string(&aware, &b);
                fprintf(stderr, "instance %d (%s, %d per node, M %d): planner %.9g, optimum %.9g\n",
                        it, p.name, c.n_nodes ? W / c.n_nodes : 0, M, got, opt);
                for (int k = 0; k < ln.n; k++)
                    fprintf(stderr, "link %d-%d x%g\n", ln.l[k].a, ln.l[k].b, ln.l[k].rate);
                for (int r = 0; r < W; r++)
                    fprintf(stderr, "rate[%d] %g\n", r, rates[r]);
                fprintf(stderr, "compute plan %s\nlink-aware plan %s\n", a, b);
                free(a);
                free(b);
            }
            CHECK(got >= opt * (1 - 1e-9)); /* the reference is the optimum */
            if (strict) CHECK_CLOSE(got, opt, 1e-9, 0);
            at_opt += got <= opt * (1 + 1e-9);
            worst = fmax(worst, got / opt);
            CHECK_CLOSE(st.objective, got, 1e-9, 0);
            mal_plan_fini(&blind);
            mal_plan_fini(&aware);
            done++;
        }
        mal_links_fini(&ln);
        mal_cluster_fini(&c);
        mal_profile_fini(&p);
    }
    printf("exact: %d of %d instances planned, %d at the optimum, worst %.3fx it\n", done, n,
           at_opt, worst);
    CHECK(done >= n / 2);
}

/* ---- mixed hardware ------------------------------------------------------ */

static void check_mixed(void)
{
    mal_cluster c = {0};
    mal_profile p = {0};
    CHECK_OK(mal_profile_preset(&p, "small", 1));
    p.zero = 1; /* the run's default: replicas' moments sharded */
    /* refusals name the field */
    static const char *const bad[] = {
        "{\"world_size\": 8, \"ranks_per_node\": 4, \"memory_mb\": 100, \"types\": {\"a\": "
        "{\"memory_mb\": 1}}, \"node_types\": [\"a\", \"a\"]}",
        "{\"world_size\": 8, \"ranks_per_node\": 4, \"types\": {\"a\": {\"memory_mb\": 1}}, "
        "\"node_types\": [\"a\", \"b\"]}",
        "{\"world_size\": 8, \"ranks_per_node\": 4, \"types\": {\"a\": {\"memory_mb\": 1}}, "
        "\"node_types\": [\"a\"]}",
        "{\"world_size\": 8, \"ranks_per_node\": 4, \"types\": {\"a\": {\"memory_mb\": 1, "
        "\"sped\": 2}}, \"node_types\": [\"a\", \"a\"]}",
        "{\"world_size\": 8, \"ranks_per_node\": 4, \"types\": {\"a\": {\"memory_mb\": 1, "
        "\"speed\": 0}}, \"node_types\": [\"a\", \"a\"]}",
        "{\"world_size\": 8, \"ranks_per_node\": 4, \"types\": {\"a\": {\"memory_mb\": 1}}}"};
    static const char *const says[] = {"per type", "node_types[1]", "2 nodes",
                                       "sped",     "speed",         "node_types"};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bad); i++) {
        int rc = mal_cluster_parse_buffer(&c, bad[i], strlen(bad[i]), "cluster.json");
        CHECK(rc == MAL_EINVAL || rc == MAL_EFORMAT);
        if (!strstr(mal_errmsg(), says[i])) fprintf(stderr, "%s\n", mal_errmsg());
        CHECK(strstr(mal_errmsg(), says[i]) != NULL);
        mal_clearerr();
        mal_cluster_fini(&c);
    }
    /* half the nodes with less memory and 0.5x the speed */
    const char *js = "{\"nodes\": [[0, 1, 2, 3], [4, 5, 6, 7]], \"types\": {"
                     "\"big\": {\"memory_mb\": 400, \"speed\": 1.0},"
                     "\"small\": {\"memory_mb\": 200, \"speed\": 0.5}},"
                     "\"node_types\": [\"small\", \"big\"]}";
    CHECK_OK(mal_cluster_parse_buffer(&c, js, strlen(js), "cluster.json"));
    CHECK_EQ_INT(c.n_types, 2);
    CHECK_CLOSE(c.memory_mb, 200, 0, 0);
    CHECK_CLOSE(mal_cluster_rank_memory(&c, 0), 200, 0, 0);
    CHECK_CLOSE(mal_cluster_rank_memory(&c, 5), 400, 0, 0);
    double raw[W], rates[W];
    for (int r = 0; r < W; r++)
        raw[r] = 1.0;
    raw[6] = 3.0; /* a straggler of the fast type: its own rate counts */
    mal_cluster_effective_rates(&c, raw, rates);
    CHECK_CLOSE(rates[0], 2.0, 1e-12, 0);
    CHECK_CLOSE(rates[4], 1.0, 0, 0);
    CHECK_CLOSE(rates[6], 3.0, 0, 0);
    mal_plan pl;
    mal_replan_stats st;
    CHECK_OK(plan_for(&c, &p, rates, 8, 0, NULL, &pl, &st));
    CHECK_OK(mal_plan_validate(&pl, W, p.n_layers, p.n_heads, p.ffn_hidden, 8));
    double slow_share = 0, fast_share = 0;
    for (int i = 0; i < pl.n_pipelines; i++)
        for (int j = 0; j < pl.pipelines[i].n_stages; j++) {
            const mal_plan_stage *s = &pl.pipelines[i].stages[j];
            int t0 = c.type_of[c.node_of[s->ranks[0]]], l = s->layer_end - s->layer_begin;
            for (int k = 0; k < s->n_ranks; k++) {
                /* TP groups within one type; every stage within memory */
                CHECK_EQ_INT(c.type_of[c.node_of[s->ranks[k]]], t0);
                CHECK(mal_cost_stage_memory_d(&p, s->n_ranks, pl.pipelines[i].n_stages, j, l,
                                              mal_plan_stage_warmup(&pl.pipelines[i], j)) <=
                      mal_cluster_rank_memory(&c, s->ranks[k]));
            }
            double w = (double)l * pl.pipelines[i].micro_batches * s->n_ranks;
            if (!strcmp(c.types[t0].name, "small"))
                slow_share += w;
            else
                fast_share += w;
        }
    /* the slow type does less of the work than its half of the ranks */
    printf("mixed: %d pipelines, work on the slow type %.0f, on the fast %.0f\n", pl.n_pipelines,
           slow_share, fast_share);
    CHECK(slow_share < fast_share);
    mal_plan_fini(&pl);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

int main(int argc, char **argv)
{
    /* --long N: N instances, how often the placement is optimal (reported:
     * it is a local search); by default 40 that it must solve exactly */
    int lng = argc > 2 && !strcmp(argv[1], "--long");
    int n = lng ? atoi(argv[2]) : 40;
    check_terms();
    check_tp_link();
    check_boundary_link();
    check_mixed();
    check_exact(n, !lng);
    return 0;
}
