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
    double *base;        /* [n] floored rates of the current plan */
    unsigned char *susp; /* [n] */
    double *means;       /* [n] at the last check */
    int trigger;
};

void mal_policy_defaults(mal_policy_params *pp)
{
    pp->check_every = 3;
    pp->window = 2;
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
    if (pp->check_every < 1 || pp->window < 1 || !(pp->gap >= 0) || !(pp->threshold > 0) ||
        !(pp->noise_floor >= 0) || n < 1)
        return MAL_ERR(MAL_EINVAL,
                       "policy: check_every (%d) and window (%d) must be >= 1, gap (%g) >= 0, "
                       "threshold (%g) > 0, ranks (%d) >= 1",
                       pp->check_every, pp->window, pp->gap, pp->threshold, n);
    mal_policy *pol = calloc(1, sizeof *pol);
    if (!pol) return MAL_ERR(MAL_ENOMEM, "policy: out of memory");
    pol->pp = *pp;
    pol->n = n;
    pol->ring = calloc((size_t)n * pp->window, sizeof *pol->ring);
    pol->count = calloc((size_t)n, sizeof *pol->count);
    pol->base = malloc((size_t)n * sizeof *pol->base);
    pol->susp = calloc((size_t)n, 1);
    pol->means = malloc((size_t)n * sizeof *pol->means);
    if (!pol->ring || !pol->count || !pol->base || !pol->susp || !pol->means) {
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
    }
    pol->trigger = -1;
    return 0;
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
        double s = 0;
        for (int i = 0; i < W; i++)
            s += pol->ring[(size_t)r * W + (size_t)i];
        double mean = floor_rate(pol, s / W);
        pol->means[r] = mean;
        int fire;
        if (pol->susp[r])
            fire = mean < pol->pp.threshold; /* recovered */
        else
            fire = fabs(mean - pol->base[r]) >= pol->pp.gap * (1 - 1e-12);
        if (fire && !advise) {
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
