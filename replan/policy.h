/* The re-plan trigger policy, shared by malleus-train (which feeds it the
 * straggling rates it measures every step) and the tests.
 *
 * Every `check_every` steps (default 3) the policy looks at the mean of the
 * last `window` samples (default 2) of every rank, with rates below
 * `noise_floor` (default 1.2) counted as 1.0, and advises a re-plan when
 *   - some active rank's mean moved by >= `gap` (default 0.3) from the rate
 *     the current plan was made with, or
 *   - some suspended rank's mean dropped below `threshold` (default 1.2):
 *     it recovered; suspended ranks stay suspended while their rate is >=
 *     threshold, whatever else it does.
 * After a re-plan the caller sets the new baseline with
 * mal_policy_set_plan().  Local (no communication); not thread-safe. */
#ifndef MAL_POLICY_H
#define MAL_POLICY_H

typedef struct mal_policy_params {
    int check_every;    /* K: steps between checks */
    int window;         /* W: samples averaged */
    double gap;         /* re-plan when an active rank's rate moved by >= gap */
    double threshold;   /* suspended ranks stay suspended while rate >= threshold */
    double noise_floor; /* rates below count as 1.0 */
} mal_policy_params;

typedef struct mal_policy mal_policy;

/* The defaults above. */
void mal_policy_defaults(mal_policy_params *pp);

/* Create a policy for n_ranks ranks (baseline: every rank active at 1.0).
 * *out is owned by the caller; free with mal_policy_destroy.  MAL_EINVAL for
 * bad parameters (K or W < 1, negative gap...).  Local. */
int mal_policy_create(const mal_policy_params *pp, int n_ranks, mal_policy **out);
void mal_policy_destroy(mal_policy *pol);

/* New baseline after a (re)plan: the rates the plan was made with
 * (rates[n_ranks], raw) and which ranks it suspends (suspended[n_ranks],
 * nonzero = suspended; NULL = none).  Keeps the sample history.  Local. */
int mal_policy_set_plan(mal_policy *pol, const double *rates, const unsigned char *suspended);

/* Record the rates measured at `step` (rates[n_ranks], raw; a NaN entry
 * means "not measured" and is skipped).  Returns 1 when a re-plan is advised
 * at this step, 0 when not, negative MAL_E* on bad input.  Checks happen when
 * step % check_every == 0 and at least one full window was seen.  Local. */
int mal_policy_observe(mal_policy *pol, long step, const double *rates);

/* The windowed, floored means used by the last check (rates[n_ranks]), and
 * the rank that triggered the last advice (-1 if none).  Local. */
void mal_policy_means(const mal_policy *pol, double *means);
int mal_policy_trigger_rank(const mal_policy *pol);

#endif /* MAL_POLICY_H */
