/* Tests for the re-plan trigger policy: check cadence (every K steps),
 * windowed means (last W samples), the gap, the noise floor, the hysteresis
 * of suspended ranks, new baselines, and tunable parameters. */
#include <math.h>
#include <stdio.h>

#include "mal_test.h"
#include "replan/policy.h"

#define N 4

/* feed `steps` steps with rank r at rate x (others 1.0); return the first
 * step that advised a re-plan, or 0 */
static long feed(mal_policy *pol, long *step, int steps, int r, double x)
{
    double rates[N] = {1, 1, 1, 1};
    rates[r] = x;
    long first = 0;
    for (int i = 0; i < steps; i++) {
        ++*step;
        int a = mal_policy_observe(pol, *step, rates);
        CHECK(a >= 0);
        if (a && !first) first = *step;
    }
    return first;
}

int main(void)
{
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    CHECK_EQ_INT(pp.check_every, 3);
    CHECK_EQ_INT(pp.window, 2);
    CHECK_CLOSE(pp.gap, 0.3, 0, 0);
    CHECK_CLOSE(pp.threshold, 1.2, 0, 0);
    mal_policy *pol;
    long step = 0;

    /* cadence: a slowdown from step 1 is acted on at step 3, not before */
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    CHECK_EQ_INT(feed(pol, &step, 2, 1, 2.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 1, 2.0), 3);
    CHECK_EQ_INT(mal_policy_trigger_rank(pol), 1);
    double means[N];
    mal_policy_means(pol, means);
    CHECK_CLOSE(means[1], 2.0, 1e-12, 0);
    mal_policy_destroy(pol);

    /* window: a one-step spike is averaged with the step before */
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    step = 0;
    CHECK_EQ_INT(feed(pol, &step, 2, 0, 1.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 1.5), 0); /* mean 1.25: moved 0.25 < 0.3 */
    CHECK_EQ_INT(feed(pol, &step, 2, 0, 1.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 1.7), 6); /* mean 1.35: moved 0.35 */
    mal_policy_destroy(pol);

    /* noise floor: wobbling below 1.2 never triggers */
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    step = 0;
    CHECK_EQ_INT(feed(pol, &step, 30, 2, 1.19), 0);
    mal_policy_destroy(pol);

    /* gap measured from the plan's baseline */
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    double base[N] = {1, 2.0, 1, 1};
    CHECK_OK(mal_policy_set_plan(pol, base, NULL));
    step = 0;
    CHECK_EQ_INT(feed(pol, &step, 9, 1, 2.29), 0);
    CHECK_EQ_INT(feed(pol, &step, 3, 1, 2.31), 12);
    /* after re-planning at the new rate, quiet again */
    base[1] = 2.31;
    CHECK_OK(mal_policy_set_plan(pol, base, NULL));
    CHECK_EQ_INT(feed(pol, &step, 9, 1, 2.31), 0);
    /* a drop counts as well as a rise */
    CHECK_EQ_INT(feed(pol, &step, 3, 1, 1.0), 24);
    mal_policy_destroy(pol);

    /* hysteresis: a suspended rank stays suspended while its rate >= 1.2,
     * however much it moves; recovery below 1.2 triggers */
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    double b2[N] = {1, 1, 1, 5.0};
    unsigned char susp[N] = {0, 0, 0, 1};
    CHECK_OK(mal_policy_set_plan(pol, b2, susp));
    step = 0;
    CHECK_EQ_INT(feed(pol, &step, 6, 3, 1.5), 0);
    CHECK_EQ_INT(feed(pol, &step, 6, 3, 9.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 6, 3, 1.25), 0);
    CHECK_EQ_INT(feed(pol, &step, 6, 3, 1.0), 21); /* window needs 2 samples below */
    CHECK_EQ_INT(mal_policy_trigger_rank(pol), 3);
    mal_policy_destroy(pol);

    /* tunable: K = 1, W = 1, gap 1.0, threshold 2.0 */
    pp.check_every = 1;
    pp.window = 1;
    pp.gap = 1.0;
    pp.threshold = 2.0;
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    step = 0;
    CHECK_EQ_INT(feed(pol, &step, 3, 0, 1.9), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 2.0), 4);
    unsigned char s2[N] = {0, 1, 0, 0};
    double b3[N] = {1, 3.0, 1, 1};
    CHECK_OK(mal_policy_set_plan(pol, b3, s2));
    CHECK_EQ_INT(feed(pol, &step, 1, 1, 2.1), 0); /* still >= threshold 2.0 */
    CHECK_EQ_INT(feed(pol, &step, 1, 1, 1.9), 6);
    /* unmeasured (NaN) entries are skipped, bad rates rejected */
    double r[N] = {NAN, 1, 1, 1};
    CHECK(mal_policy_observe(pol, 7, r) >= 0);
    r[0] = -1;
    CHECK_EQ_INT(mal_policy_observe(pol, 8, r), MAL_EINVAL);
    mal_policy_destroy(pol);
    pp.window = 0;
    CHECK_EQ_INT(mal_policy_create(&pp, N, &pol), MAL_EINVAL);
    printf("test_replan_policy: ok\n");
    return 0;
}
