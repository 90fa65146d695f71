/* Tests for the planner:
 *  - lp_solve's two integer programs agree with exact combinatorial solvers
 *    on random instances;
 *  - on small clusters (8-16 ranks, memory loose and binding) every output
 *    plan validates, fits memory and is the reported objective; output is
 *    deterministic; the heuristic search is never better than the
 *    exhaustive one (tests/test_replan_exact.c checks the exhaustive one
 *    against an independent enumeration of the whole problem);
 *  - migration-aware mapping: re-planning from its own output moves nothing;
 *  - a 256-rank instance plans quickly with the restricted search. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mal_test.h"
#include "replan/replan.h"
#include "replan/sim.h"
#include "replan_ref.h"
#include "replan_test.h"
#include "src/plan.h"

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void test_lp_vs_exact(void)
{
    uint64_t seed = 12345;
    static const double ys[] = {1.0, 1.0, 1.0, 1.9, 3.66, 7.22, 2.5, 1.5, 12.0, 4.75};
    for (int it = 0; it < 300; it++) {
        int S = 1 + (int)(lcg(&seed) % 9);
        int L = S + (int)(lcg(&seed) % 40);
        double y[16];
        int ub[16], l[16];
        for (int j = 0; j < S; j++) {
            y[j] = ys[lcg(&seed) % 10];
            ub[j] = (lcg(&seed) % 4 == 0) ? 1 + (int)(lcg(&seed) % 8) : L;
        }
        double P;
        CHECK_OK(mal_lp_layers(S, y, ub, L, l, &P));
        double ex = exact_layers(S, y, ub, L);
        if (isinf(ex)) {
            CHECK(isinf(P));
        } else {
            CHECK_CLOSE(P, ex, 1e-9, 1e-9);
            int sum = 0;
            for (int j = 0; j < S; j++) {
                CHECK(l[j] >= 1 && l[j] <= ub[j]);
                sum += l[j];
            }
            CHECK_EQ_INT(sum, L);
        }
    }
    for (int it = 0; it < 200; it++) {
        int n = 1 + (int)(lcg(&seed) % 5);
        double P[8];
        int S[8], cnt[8], m[8], one[64], Sx[64];
        double Px[64];
        int np = 0, M = 0;
        for (int c = 0; c < n; c++) {
            P[c] = 5 + (double)(lcg(&seed) % 300) / 10;
            S[c] = 1 + (int)(lcg(&seed) % 6);
            cnt[c] = 1 + (int)(lcg(&seed) % 3);
            for (int k = 0; k < cnt[c]; k++) {
                Px[np] = P[c];
                Sx[np] = S[c];
                one[np++] = 1;
            }
        }
        (void)one;
        M = (int)(lcg(&seed) % 80) + 1;
        double T;
        CHECK_OK(mal_lp_microbatches(n, P, S, cnt, M, m, &T));
        double ex = exact_mb(np, Px, Sx, M);
        if (isinf(ex)) {
            CHECK(isinf(T));
        } else {
            CHECK_CLOSE(T, ex, 1e-9, 1e-9);
            long tot = 0;
            for (int c = 0; c < n; c++) {
                CHECK(m[c] >= S[c]);
                tot += (long)cnt[c] * m[c];
            }
            CHECK(tot >= M);
        }
    }
}

/* k[d] with the profile's linear extrapolation, re-derived here */
static double kd(const mal_profile *p, int d)
{
    if (d < p->n_k) return p->k[d];
    return p->k[p->n_k - 1] + (p->k[p->n_k - 1] - p->k[p->n_k - 2]) * (d - p->n_k + 1);
}

/* ---- checks on planner output --------------------------------------------- */

static void check_plan(const mal_plan *plan, const mal_cluster *c, const mal_profile *p, int M,
                       int mbs, const double *rates, double objective)
{
    CHECK_OK(
        mal_plan_validate(plan, c->world_size, p->n_layers, p->n_heads, p->ffn_hidden, M * mbs));
    /* memory of every stage, TP groups inside one node */
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        for (int j = 0; j < pl->n_stages; j++) {
            const mal_plan_stage *st = &pl->stages[j];
            int l = st->layer_end - st->layer_begin, ne = (j == 0) + (j == pl->n_stages - 1);
            double mem = (kd(p, pl->n_stages - 1 - j) * l + p->embed_mb * ne) *
                             ((double)p->tp / st->n_ranks) +
                         p->overhead_mb;
            CHECK(mem <= c->memory_mb * (1 + 1e-12));
            for (int k = 1; k < st->n_ranks; k++)
                CHECK_EQ_INT(c->node_of[st->ranks[k]], c->node_of[st->ranks[0]]);
        }
    }
    /* the cost model of the written plan is the objective */
    mal_cost_eval ev;
    CHECK_OK(mal_cost_eval_plan(plan, p, c, rates, &ev));
    CHECK_CLOSE(ev.step_time, objective, 1e-9, 1e-9);
    CHECK(ev.memory_ok);
    CHECK_CLOSE(plan->predicted_step_time, objective * p->layer_time + p->sync_time, 1e-9, 1e-12);
    /* the simulator never exceeds the closed form (monotone max-plus) */
    double sim;
    CHECK_OK(mal_sim_plan(plan, p, rates, c->world_size, 0.0, &sim, NULL));
    CHECK(sim <= ev.step_time * (1 + 1e-9));
    CHECK(sim >= ev.shaped * (1 - 1e-9));
    CHECK(sim >= ev.bubble_free * (1 - 1e-9));
    mal_cost_eval_fini(&ev);
}

/* a small custom profile: TP 2 or 4, linear k */
static void small_profile(mal_profile *p, int tp, int L)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "test");
    p->n_layers = L;
    p->tp = tp;
    p->n_heads = 8;
    p->ffn_hidden = 64;
    p->alpha[0] = tp == 2 ? 1.9 : 3.66;
    p->alpha[1] = tp == 2 ? 1.0 : 1.9;
    if (tp == 4) p->alpha[2] = 1.0;
    p->n_k = 2;
    p->k = malloc(2 * sizeof *p->k);
    p->k[0] = 1.0;
    p->k[1] = 1.25;
    p->embed_mb = 0.5;
    p->overhead_mb = 1.0;
    p->layer_time = 0.01;
    p->layer_state_mb = 4;
    p->embed_state_mb = 2;
}

typedef struct inst {
    int world, rpn, tp, L, M;
    double mem;
    int n_r;
    int rr[6];
    double rx[6];
} inst;

static void test_fixed_cases(void)
{
    static const inst cases[] = {
        {8, 4, 2, 8, 8, 1000, 1, {1}, {2.5}},
        {8, 4, 2, 8, 12, 1000, 2, {0, 6}, {1.5, 4.0}},
        {8, 8, 2, 6, 8, 1000, 3, {2, 3, 5}, {3.0, 1.3, 12.0}},
        {16, 8, 4, 8, 16, 1000, 3, {1, 9, 10}, {2.0, 1.6, 7.0}},
        {8, 4, 2, 8, 8, 5.0, 1, {1}, {2.5}},          /* memory binds: <= 3 layers per TP-2 stage */
        {8, 4, 2, 9, 10, 6.5, 2, {2, 5}, {1.8, 3.0}}, /* memory binds */
        {16, 8, 4, 8, 12, 7.0, 2, {3, 12}, {2.2, 5.0}}, /* memory binds, TP 4 */
        {8, 4, 2, 8, 8, 1000, 0, {0}, {1.0}},           /* healthy */
        {8, 4, 2, 6, 4, 1000, 1, {7}, {1.7}},           /* few micro-batches: M = 4 groups */
    };
    for (size_t ci = 0; ci < MAL_ARRAY_SIZE(cases); ci++) {
        const inst *I = &cases[ci];
        mal_cluster c;
        mal_profile p;
        CHECK_OK(mal_cluster_regular(&c, I->world, I->rpn, I->mem));
        small_profile(&p, I->tp, I->L);
        double rates[64];
        for (int r = 0; r < I->world; r++)
            rates[r] = 1.0 + 0.01 * (r % 3); /* noise below the floor */
        for (int k = 0; k < I->n_r; k++)
            rates[I->rr[k]] = I->rx[k];
        mal_replan_input in = mal_test_replan_input(&c, &p, rates, 2, I->M);
        in.nominal_dp = 2;
        in.search = MAL_REPLAN_EXHAUSTIVE;
        mal_plan plan;
        mal_replan_stats st;
        double t0 = mal_now();
        CHECK_OK(mal_replan(&in, &plan, &st));
        double tp = mal_now() - t0;
        CHECK(st.exhaustive == 1);
        fprintf(stderr, "case %zu: planner %.6g (%.3f s, %d layer programs)\n", ci, st.objective,
                tp, st.n_layer_lps);
        check_plan(&plan, &c, &p, I->M, 2, rates, st.objective);
        /* deterministic bytes */
        mal_plan again;
        char *s1, *s2;
        CHECK_OK(mal_replan(&in, &again, NULL));
        CHECK_OK(mal_plan_to_string(&plan, &s1));
        CHECK_OK(mal_plan_to_string(&again, &s2));
        CHECK(!strcmp(s1, s2));
        free(s1);
        free(s2);
        mal_plan_fini(&again);
        /* the restricted search is never better than the exhaustive one */
        in.search = MAL_REPLAN_HEURISTIC;
        mal_replan_stats sh;
        CHECK_OK(mal_replan(&in, &again, &sh));
        CHECK(sh.objective >= st.objective * (1 - 1e-9));
        check_plan(&again, &c, &p, I->M, 2, rates, sh.objective);
        mal_plan_fini(&again);
        /* re-planning from its own output with the same rates keeps every
         * rank's state: nothing moves */
        in.search = MAL_REPLAN_EXHAUSTIVE;
        in.current = &plan;
        CHECK_OK(mal_replan(&in, &again, &sh));
        CHECK_CLOSE(sh.objective, st.objective, 1e-9, 1e-9);
        CHECK_CLOSE(mal_cost_migration_bytes(&plan, &again, &p), 0.0, 0, 1e-6);
        mal_plan_fini(&again);
        mal_plan_fini(&plan);
        mal_cluster_fini(&c);
        mal_profile_fini(&p);
    }
}

/* Memory too small for any plan, NaN rate, bad cluster. */
static void test_errors(void)
{
    mal_cluster c;
    mal_profile p;
    small_profile(&p, 2, 8);
    CHECK_EQ_INT(mal_cluster_regular(&c, 10, 4, 100), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "world_size 10 is not divisible into nodes of 4 ranks"));
    mal_cluster_fini(&c);
    CHECK_OK(mal_cluster_regular(&c, 8, 4, 1.5));
    double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    mal_replan_input in = mal_test_replan_input(&c, &p, rates, 1, 8);
    mal_plan plan;
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "no plan fits in memory"));
    c.memory_mb = 100;
    rates[3] = NAN;
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "rank 3 has rate nan"));
    rates[3] = -1;
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "rank 3 has rate -1"));
    rates[3] = 1;
    /* the time limit: seconds >= 0, finite */
    in.time_limit = -1;
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "time limit must be >= 0 seconds"));
    in.time_limit = NAN;
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    in.time_limit = 0;
    in.n_micro_batches = 3; /* fewer micro-batches than TP groups */
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "micro-batches"));
    /* nodes not a multiple of TP */
    mal_cluster_fini(&c);
    CHECK_OK(mal_cluster_parse_string(&c, "{\"nodes\": [[0,1,2],[3,4,5,6,7]], \"memory_mb\": 100}",
                                      "t"));
    in.n_micro_batches = 8;
    CHECK_EQ_INT(mal_replan(&in, &plan, NULL), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "node 0 has 3 ranks, not a multiple of the nominal TP size 2"));
    mal_cluster_fini(&c);
    /* rates parser */
    double r8[8];
    CHECK_EQ_INT(mal_rates_parse_string("{\"9\": 2.0}", "r", 8, 2, r8), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "rank 9 is not in the cluster"));
    CHECK_EQ_INT(mal_rates_parse_string("{\"2\": \"nan\"}", "r", 8, 2, r8), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "rank 2 has rate nan"));
    CHECK_EQ_INT(mal_rates_parse_string("{\"2\": -0.5}", "r", 8, 2, r8), MAL_EINVAL);
    CHECK_OK(mal_rates_parse_string("{\"2\": 3.5}", "r", 8, 2, r8));
    CHECK_CLOSE(r8[2], 3.5, 0, 0);
    CHECK_CLOSE(r8[5], 1.0, 0, 0);
    /* metrics lines: mean of the last 2 samples per rank, other lines skipped */
    const char *metrics = "{\"step\": 1, \"loss\": 3.2}\n"
                          "{\"step\": 1, \"rates\": [1.0, 5.0, 1.0]}\n"
                          "{\"step\": 2, \"rates\": [1.0, 3.0, null]}\n"
                          "{\"step\": 3, \"rates\": [1.0, 2.0, 1.4]}\n"
                          "{\"step\": 3, \"rank\": 7, \"rate\": 2.5}\n";
    CHECK_OK(mal_rates_parse_string(metrics, "m", 8, 2, r8));
    CHECK_CLOSE(r8[1], 2.5, 1e-12, 0);
    CHECK_CLOSE(r8[2], 1.2, 1e-12, 0);
    CHECK_CLOSE(r8[7], 2.5, 1e-12, 0);
    CHECK_EQ_INT(
        mal_rates_parse_string("{\"step\": 1, \"rates\": [1,1,1,1,1,1,1,1,1]}\n", "m", 8, 2, r8),
        MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "rank 8 is not in the cluster"));
    mal_profile_fini(&p);
}

/* A mid-size instance through the restricted search: valid, deterministic,
 * better than the uniform plan, never below the capacity bound. */
static void test_scale(void)
{
    mal_cluster c;
    mal_profile p;
    CHECK_OK(mal_cluster_regular(&c, 256, 8, 81920));
    CHECK_OK(mal_profile_preset(&p, "70b", 1));
    double rates[256];
    uint64_t seed = 7;
    for (int r = 0; r < 256; r++)
        rates[r] = 1.0 + 0.15 * (double)(lcg(&seed) % 100) / 100;
    for (int k = 0; k < 8; k++)
        rates[lcg(&seed) % 256] = 1.5 + (double)(lcg(&seed) % 1050) / 100;
    mal_replan_input in = mal_test_replan_input(&c, &p, rates, 1, 512);
    mal_plan plan, again, uni;
    mal_replan_stats st;
    CHECK_OK(mal_replan(&in, &plan, &st));
    fprintf(stderr, "256 ranks: %.3f s, %d LPs, objective %.1f\n", st.seconds, st.n_layer_lps,
            st.objective);
    /* Only a guard against a blow-up (0.3 s here; the planner's speed is
     * bench/replan's to measure): the sanitizer build runs it ~50x slower. */
    if (!MAL_TEST_ASAN) CHECK(st.seconds < 10);
    check_plan(&plan, &c, &p, 512, 1, rates, st.objective);
    CHECK_OK(mal_replan(&in, &again, NULL));
    CHECK(mal_plan_same_layout(&plan, &again));
    CHECK_OK(mal_replan_uniform(&in, &uni));
    mal_cost_eval ev;
    CHECK_OK(mal_cost_eval_plan(&uni, &p, &c, rates, &ev));
    CHECK(st.objective < ev.step_time);
    CHECK(st.objective >= mal_cost_capacity_bound(&p, 256, rates, 512));
    mal_cost_eval_fini(&ev);
    /* migration-aware: planning from the uniform plan moves less state than
     * planning from nothing */
    in.current = &uni;
    in.nominal_dp = uni.n_pipelines;
    mal_plan mig;
    mal_replan_stats sm;
    CHECK_OK(mal_replan(&in, &mig, &sm));
    CHECK_CLOSE(sm.objective, st.objective, 1e-9, 1e-9);
    double b_aware = mal_cost_migration_bytes(&uni, &mig, &p),
           b_blind = mal_cost_migration_bytes(&uni, &plan, &p);
    fprintf(stderr, "state to move from uniform: %.1f GiB aware, %.1f GiB blind\n",
            b_aware / 1073741824.0, b_blind / 1073741824.0);
    CHECK(b_aware <= b_blind);
    mal_plan_fini(&mig);
    mal_plan_fini(&uni);
    mal_plan_fini(&plan);
    mal_plan_fini(&again);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

int main(void)
{
    test_lp_vs_exact();
    test_errors();
    test_fixed_cases();
    test_scale();
    printf("test_replan: ok\n");
    return 0;
}
