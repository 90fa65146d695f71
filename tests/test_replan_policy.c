/* Tests for the re-plan trigger policy: check cadence (every K steps), the
 * window (the last W samples must all agree), persistence over checks, the
 * gap, the noise floor, the hysteresis of suspended ranks, new baselines,
 * tunable parameters; isolated noisy samples against a real straggler
 * (compared with the rule the policy had before: the window's mean); and
 * whether a change pays for itself. */
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

/* The rule the policy had before (a re-plan when the mean of the window
 * moved by >= gap from 1.0, rates below the floor counting as 1): the
 * reference its noise and straggler behaviour is compared with. */
static long mean_rule_first(const double *x, long steps, const mal_policy_params *pp)
{
    for (long s = pp->window; s <= steps; s++) {
        if (s % pp->check_every) continue;
        double m = 0;
        for (int i = 0; i < pp->window; i++)
            m += x[s - 1 - i];
        m /= pp->window;
        if (m < pp->noise_floor) m = 1.0;
        if (fabs(m - 1.0) >= pp->gap) return s;
    }
    return 0;
}

/* The policy's first advice on the series x[steps] of rank 1 (others 1.0). */
static long policy_first(const double *x, long steps, const mal_policy_params *pp)
{
    mal_policy *pol;
    long first = 0;
    CHECK_OK(mal_policy_create(pp, N, &pol));
    for (long s = 1; s <= steps && !first; s++) {
        double rates[N] = {1, x[s - 1], 1, 1};
        int a = mal_policy_observe(pol, s, rates);
        CHECK(a >= 0);
        if (a) first = s;
    }
    mal_policy_destroy(pol);
    return first;
}

enum { NOISE_STEPS = 3000 };

/* An idle run whose probe has isolated noisy samples (a descheduled rank on
 * an oversubscribed machine: one sample of 1.3 to 3x, never two in a row on
 * the rank) makes no re-plan, where the mean rule made several; a real 4x
 * straggler is advised at the same check as the mean rule advised it
 * whenever its window is whole at that check (onset at least W - 1 steps
 * before it), else one check later. */
static void noise_and_straggler(void)
{
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    static double x[NOISE_STEPS];
    unsigned long long seed = 12345;
    int spikes = 0, prev = 0;
    for (long s = 0; s < NOISE_STEPS; s++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(seed >> 11) / 9007199254740992.0;
        int spike = !prev && u < 0.15;
        x[s] = spike ? 1.3 + 1.7 * (u / 0.15) : 1.0;
        spikes += spike;
        prev = spike;
    }
    long old = mean_rule_first(x, NOISE_STEPS, &pp);
    CHECK(old > 0); /* the noise is enough to fool the mean rule */
    CHECK_EQ_INT(policy_first(x, NOISE_STEPS, &pp), 0);
    printf("noise: %d isolated samples of 1.3-3x over %d steps: no advice (the mean rule "
           "advised at step %ld)\n",
           spikes, NOISE_STEPS, old);

    int same = 0, later = 0;
    for (long onset = 1; onset <= 3 * pp.check_every; onset++) {
        double y[40];
        for (long s = 0; s < 40; s++)
            y[s] = s + 1 >= onset ? 4.0 : 1.0;
        long a = policy_first(y, 40, &pp), b = mean_rule_first(y, 40, &pp);
        /* the first check whose window is all straggler */
        long whole = onset + pp.window - 1;
        long expect = (whole + pp.check_every - 1) / pp.check_every * pp.check_every;
        CHECK_EQ_INT(a, expect);
        CHECK(a == b || a == b + pp.check_every);
        if (a == b)
            same++;
        else
            later++;
    }
    printf("4x straggler, onset at each phase of the %d-step check: advised at the mean rule's "
           "check %d times, one check later %d times (onset at the check step itself)\n",
           pp.check_every, same, later);
    CHECK(same == 2 * later);
}

/* persist = 2: the move must be seen at two checks in a row; a check that
 * does not see it starts the count again. */
static void persistence(void)
{
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    pp.persist = 2;
    mal_policy *pol;
    long step = 0;
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    CHECK_EQ_INT(feed(pol, &step, 3, 2, 4.0), 0);  /* seen at 3 */
    CHECK_EQ_INT(feed(pol, &step, 3, 2, 1.0), 0);  /* not at 6: the run ends */
    CHECK_EQ_INT(feed(pol, &step, 3, 2, 4.0), 0);  /* seen at 9 */
    CHECK_EQ_INT(feed(pol, &step, 3, 2, 4.0), 12); /* and at 12 */
    CHECK_EQ_INT(mal_policy_trigger_rank(pol), 2);
    /* a new baseline forgets the run */
    double base[N] = {1, 1, 1, 1};
    CHECK_OK(mal_policy_set_plan(pol, base, NULL));
    CHECK_EQ_INT(feed(pol, &step, 3, 2, 4.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 3, 2, 4.0), 18);
    mal_policy_destroy(pol);
}

static void pays(void)
{
    double gain;
    /* 100 ms steps, the new plan predicted 2x faster, 50 steps left: 2.5 s */
    mal_policy_change c = {0.1, 4.0, 2.0, 50, 2.0};
    CHECK_EQ_INT(mal_policy_pays(&c, &gain), 1);
    CHECK_CLOSE(gain, 2.5, 1e-12, 0);
    c.cost_s = 3.0; /* a change that costs more than it saves */
    CHECK_EQ_INT(mal_policy_pays(&c, &gain), 0);
    c.cost_s = 0;
    c.remaining_steps = 0; /* nothing left to gain */
    CHECK_EQ_INT(mal_policy_pays(&c, &gain), 0);
    c.remaining_steps = 50;
    c.predicted_new = 5.0; /* slower: a loss */
    CHECK_EQ_INT(mal_policy_pays(&c, &gain), 0);
    CHECK(gain < 0);
    c.predicted_new = NAN;
    CHECK_EQ_INT(mal_policy_pays(&c, &gain), MAL_EINVAL);
    c.predicted_new = 2.0;
    c.cost_s = -1;
    CHECK_EQ_INT(mal_policy_pays(&c, &gain), MAL_EINVAL);
}

int main(void)
{
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    CHECK_EQ_INT(pp.check_every, 3);
    CHECK_EQ_INT(pp.window, 2);
    CHECK_CLOSE(pp.gap, 0.3, 0, 0);
    CHECK_CLOSE(pp.threshold, 1.2, 0, 0);
    CHECK_EQ_INT(pp.persist, 1);
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

    /* window: a one-step spike never counts, however large (the mean
     * rule fired on the 1.61 below: mean 1.305, moved 0.305) */
    CHECK_OK(mal_policy_create(&pp, N, &pol));
    step = 0;
    CHECK_EQ_INT(feed(pol, &step, 2, 0, 1.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 1.61), 0);
    CHECK_EQ_INT(feed(pol, &step, 2, 0, 1.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 5.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 1.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 9.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 0, 1.0), 0); /* step 9: the window is {9.0, 1.0} */
    /* a whole window does: steps 11 and 12 */
    CHECK_EQ_INT(feed(pol, &step, 3, 0, 1.61), 12);
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
    /* a window whose samples disagree in direction does not count */
    CHECK_EQ_INT(feed(pol, &step, 2, 1, 3.5), 0);
    CHECK_EQ_INT(feed(pol, &step, 1, 1, 1.0), 0);
    CHECK_EQ_INT(feed(pol, &step, 3, 1, 2.31), 0);
    /* a drop counts as well as a rise */
    CHECK_EQ_INT(feed(pol, &step, 3, 1, 1.0), 30);
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

    noise_and_straggler();
    persistence();
    pays();

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
    pp.window = 1;
    pp.persist = 0;
    CHECK_EQ_INT(mal_policy_create(&pp, N, &pol), MAL_EINVAL);
    printf("test_replan_policy: ok\n");
    return 0;
}
