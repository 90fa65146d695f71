/* Tests for the event-by-event 1F1B simulator: equals the closed form
 * (m + S - 1) * (f + b) for uniform stages, matches hand-worked schedules,
 * stays between the cost model's shaped bound (and the bottleneck bounds)
 * and the planner's closed form for non-uniform stages, and agrees with the
 * cost model on plans. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "mal_test.h"
#include "replan/replan.h"
#include "replan/sim.h"
#include "src/plan.h"

int main(void)
{
    /* uniform stages: exact closed form */
    for (int S = 1; S <= 9; S++)
        for (int m = 1; m <= 20; m++) {
            double f[16], b[16];
            for (int j = 0; j < S; j++) {
                f[j] = 1.5;
                b[j] = 3.0;
            }
            double t = mal_sim_pipeline(S, f, b, m, 0.0);
            CHECK_CLOSE(t, (m + S - 1) * 4.5, 1e-12, 1e-12);
        }
    /* a plan may name two billion micro-batches: refused, nothing allocated
     * (the plan fuzzer found the simulator asking for 5 GB) */
    {
        double f[2] = {1, 2}, b[2] = {2, 4};
        CHECK(mal_sim_pipeline(2, f, b, 214748647, 0.0) == MAL_EINVAL);
        CHECK(mal_sim_pipeline(1, f, b, MAL_SIM_MAX_OPS + 1, 0.0) == MAL_EINVAL);
        mal_clearerr();
        CHECK(mal_sim_pipeline(1, f, b, 4096, 0.0) > 0);
    }
    /* hand-worked: S = 2, m = 2, f = (1, 2), b = (2, 4) -> 15 (see README) */
    {
        double f[2] = {1, 2}, b[2] = {2, 4};
        CHECK_CLOSE(mal_sim_pipeline(2, f, b, 2, 0.0), 15.0, 1e-12, 0);
        /* a hand-over latency of 0.5 on each of the 4 dependent transfers on the
         * critical path: F0 s0->s1, B0 s1->s0 ... = 15 + 4 * 0.5 - 1 (overlap) */
        double t = mal_sim_pipeline(2, f, b, 2, 0.5);
        CHECK(t > 15.0 && t <= 17.0);
    }
    /* non-uniform stages: bottleneck bound <= sim <= closed form */
    unsigned s = 99;
    for (int it = 0; it < 500; it++) {
        int S = 1 + (int)((s = s * 1103515245u + 12345u) >> 16) % 8;
        int m = S + (int)((s = s * 1103515245u + 12345u) >> 16) % 12;
        double f[16], b[16], cmax = 0;
        for (int j = 0; j < S; j++) {
            double c = 1 + ((s = s * 1103515245u + 12345u) >> 16) % 50;
            f[j] = c / 3;
            b[j] = c - f[j];
            cmax = fmax(cmax, c);
        }
        double t = mal_sim_pipeline(S, f, b, m, 0.0);
        CHECK(t <= (m + S - 1) * cmax * (1 + 1e-12));
        double before = 0;
        for (int j = 0; j < S; j++) {
            /* stage j does m * c_j of work; the first micro-batch reaches it
             * after the forwards of the stages before, and the last gradient
             * leaves through their backwards */
            CHECK(t >= (m * (f[j] + b[j]) + before) * (1 - 1e-12));
            before += f[j] + b[j];
        }
        /* at least the bubble-free time of the slowest stage (equal to it
         * when the slowest stage is the first: its warm-up hides the bubble) */
        CHECK(t >= m * cmax * (1 - 1e-12));
        /* the cost model's shaped bubble (README "Cost model"), computed
         * here from its definition: a lower bound */
        double shaped = 0, total = 0;
        for (int j = 0; j < S; j++)
            total += f[j] + b[j];
        before = 0;
        for (int k = 0; k < S; k++) {
            double ck = f[k] + b[k], wait = total - before - ck - (S - k - 1) * f[k];
            shaped = fmax(shaped, before + m * ck + fmax(wait, 0));
            before += ck;
        }
        CHECK(t >= shaped * (1 - 1e-12));
    }
    /* plans: uniform plan equals the cost model; a straggler only makes it
     * no faster than bubble-free, no slower than the closed form */
    mal_profile p;
    mal_cluster c;
    CHECK_OK(mal_profile_preset(&p, "tiny", 1));
    CHECK_OK(mal_cluster_regular(&c, 8, 4, 1000));
    mal_plan u;
    CHECK_OK(mal_plan_uniform(2, 2, 2, p.n_layers, 1, 8, &u));
    double rates[8] = {1, 1, 1, 1, 1, 1, 1, 1}, sim, pipe[2];
    mal_cost_eval ev;
    CHECK_OK(mal_sim_plan(&u, &p, rates, 8, 0.0, &sim, pipe));
    CHECK_OK(mal_cost_eval_plan(&u, &p, &c, rates, &ev));
    CHECK_CLOSE(sim, ev.step_time, 1e-12, 0);
    /* m = 4 micro-batches, 2 stages of n_layers / 2 layers each */
    CHECK_CLOSE(sim, (4 + 2 - 1) * (p.n_layers / 2.0), 1e-12, 0);
    mal_cost_eval_fini(&ev);
    rates[7] = 3.0; /* last stage: its bubble cannot hide behind a warm-up */
    CHECK_OK(mal_sim_plan(&u, &p, rates, 8, 0.0, &sim, pipe));
    CHECK_OK(mal_cost_eval_plan(&u, &p, &c, rates, &ev));
    CHECK(sim <= ev.step_time + 1e-12 && sim > ev.bubble_free);
    /* pipeline 1: stages of 2 layers at 1.0 and 3.0, m = 4: the slow last
     * stage runs 4 x 6 after the first stage's 2 (closed form 5 x 6) */
    CHECK_CLOSE(ev.shaped_time[1], 2 + 4 * 6.0, 1e-12, 0);
    CHECK_CLOSE(ev.time[1], 5 * 6.0, 1e-12, 0);
    CHECK(ev.shaped <= sim + 1e-12);
    CHECK_CLOSE(pipe[0], (4 + 2 - 1) * (p.n_layers / 2.0), 1e-12, 0); /* healthy pipeline untouched */
    mal_cost_eval_fini(&ev);
    /* the slow stage first: its warm-up forward (a third of 6) covers the
     * round trip through the fast stage (2), so its 4 x 6 is all there is
     * of the bubble by shape (closed form 5 x 6) */
    rates[7] = 1;
    rates[1] = 3.0;
    CHECK_OK(mal_sim_plan(&u, &p, rates, 8, 0.0, &sim, pipe));
    CHECK_OK(mal_cost_eval_plan(&u, &p, &c, rates, &ev));
    CHECK_CLOSE(ev.shaped_time[0], 4 * 6.0, 1e-12, 0);
    CHECK(ev.shaped_time[0] <= pipe[0] + 1e-12 && pipe[0] < ev.time[0]);
    fprintf(stderr, "slow first stage: shaped %g, simulated %g, closed form %g\n",
            ev.shaped_time[0], pipe[0], ev.time[0]);
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&u);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
    printf("test_replan_sim: ok\n");
    return 0;
}
