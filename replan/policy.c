/* The re-plan trigger policy (see policy.h). */
#include "policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"

struct mal_policy {
    mal_policy_params pp;
    int n;
    double *ring;        /* [n * window] last samples per rank */
    int *count;          /* [n] samples seen per rank */
    int *seen;           /* [n] consecutive checks that saw the rank's rate moved */
    double *base;        /* [n] floored rates of the current plan */
    unsigned char *susp; /* [n] */
    double *means;       /* [n] at the last check */
    int trigger;
};

void mal_policy_defaults(mal_policy_params *pp)
{
    pp->check_every = 3;
    pp->window = 2;
    pp->persist = 1;
    pp->gap = 0.3;
    pp->threshold = 1.2;
    pp->noise_floor = 1.2;
}

static double floor_rate(const mal_policy *pol, double x)
{
    return x < pol->pp.noise_floor ? 1.0 : x;
}

int mal_policy_create(const mal_policy_params *pp, int n, mal_policy **out)
{
    *out = NULL;
    if (pp->check_every < 1 || pp->window < 1 || pp->persist < 1 || !(pp->gap >= 0) ||
        !(pp->threshold > 0) || !(pp->noise_floor >= 0) || n < 1)
        return MAL_ERR(MAL_EINVAL,
                       "policy: check_every (%d), window (%d) and persist (%d) must be >= 1, gap "
                       "(%g) >= 0, threshold (%g) > 0, ranks (%d) >= 1",
                       pp->check_every, pp->window, pp->persist, pp->gap, pp->threshold, n);
    mal_policy *pol = calloc(1, sizeof *pol);
    if (!pol) return MAL_ERR(MAL_ENOMEM, "policy: out of memory");
    pol->pp = *pp;
    pol->n = n;
    pol->ring = calloc((size_t)n * pp->window, sizeof *pol->ring);
    pol->count = calloc((size_t)n, sizeof *pol->count);
    pol->seen = calloc((size_t)n, sizeof *pol->seen);
    pol->base = malloc((size_t)n * sizeof *pol->base);
    pol->susp = calloc((size_t)n, 1);
    pol->means = malloc((size_t)n * sizeof *pol->means);
    if (!pol->ring || !pol->count || !pol->seen || !pol->base || !pol->susp || !pol->means) {
        mal_policy_destroy(pol);
        return MAL_ERR(MAL_ENOMEM, "policy: out of memory");
    }
    for (int r = 0; r < n; r++)
        pol->base[r] = pol->means[r] = 1.0;
    pol->trigger = -1;
    *out = pol;
    return 0;
}

void mal_policy_destroy(mal_policy *pol)
{
    if (!pol) return;
    free(pol->ring);
    free(pol->count);
    free(pol->seen);
    free(pol->base);
    free(pol->susp);
    free(pol->means);
    free(pol);
}

int mal_policy_set_plan(mal_policy *pol, const double *rates, const unsigned char *suspended)
{
    for (int r = 0; r < pol->n; r++) {
        if (!(rates[r] > 0) || isinf(rates[r]))
            return MAL_ERR(MAL_EINVAL, "policy: rank %d has rate %g in the plan's baseline", r,
                           rates[r]);
        pol->base[r] = floor_rate(pol, rates[r]);
        pol->susp[r] = suspended ? (suspended[r] != 0) : 0;
        pol->seen[r] = 0;
    }
    pol->trigger = -1;
    return 0;
}

/* Whether every sample of rank r's window says its rate moved: the
 * smallest sample far enough above the baseline, or the largest far
 * enough below it (for a suspended rank: below the threshold). */
static int window_moved(const mal_policy *pol, int r, double *mean)
{
    int W = pol->pp.window;
    const double *w = pol->ring + (size_t)r * W;
    double s = 0, lo = INFINITY, hi = 0;
    for (int i = 0; i < W; i++) {
        double x = floor_rate(pol, w[i]);
        s += w[i];
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    *mean = floor_rate(pol, s / W);
    if (pol->susp[r]) return hi < pol->pp.threshold; /* recovered */
    double g = pol->pp.gap * (1 - 1e-12);
    return lo - pol->base[r] >= g || pol->base[r] - hi >= g;
}

int mal_policy_observe(mal_policy *pol, long step, const double *rates)
{
    int W = pol->pp.window;
    for (int r = 0; r < pol->n; r++) {
        double x = rates[r];
        if (isnan(x)) continue; /* not measured */
        if (!(x > 0) || isinf(x))
            return MAL_ERR(MAL_EINVAL, "policy: step %ld: rank %d has rate %g", step, r, x);
        pol->ring[(size_t)r * W + (size_t)(pol->count[r] % W)] = x;
        pol->count[r]++;
    }
    pol->trigger = -1;
    if (step % pol->pp.check_every != 0) return 0;
    int advise = 0;
    for (int r = 0; r < pol->n; r++) {
        if (pol->count[r] < W) continue; /* not a full window yet: no opinion */
        /* a move seen at this check extends the rank's run of checks that
         * saw one; a check that does not see it ends the run */
        pol->seen[r] = window_moved(pol, r, &pol->means[r]) ? pol->seen[r] + 1 : 0;
        if (pol->seen[r] >= pol->pp.persist && !advise) {
            advise = 1;
            pol->trigger = r;
        }
    }
    return advise;
}

void mal_policy_means(const mal_policy *pol, double *means)
{
    memcpy(means, pol->means, (size_t)pol->n * sizeof *means);
}

int mal_policy_trigger_rank(const mal_policy *pol)
{
    return pol->trigger;
}

int mal_policy_pays(const mal_policy_change *c, double *gain_s)
{
    *gain_s = 0;
    if (!(c->step_s >= 0) || !(c->predicted_now > 0) || !(c->predicted_new > 0) ||
        c->remaining_steps < 0 || !(c->cost_s >= 0) || isinf(c->step_s) ||
        isinf(c->predicted_now) || isinf(c->predicted_new) || isinf(c->cost_s))
        return MAL_ERR(MAL_EINVAL,
                       "policy: cannot weigh a change with step time %g s, predicted times %g "
                       "and %g, %ld remaining steps, cost %g s",
                       c->step_s, c->predicted_now, c->predicted_new, c->remaining_steps,
                       c->cost_s);
    /* Measured time times the predicted relative saving: the profile's
     * seconds may be another machine's, its ratios hold on any. */
    *gain_s = c->step_s * (1.0 - c->predicted_new / c->predicted_now) * (double)c->remaining_steps;
    return *gain_s > c->cost_s;
}
