/* The re-plan trigger policy, shared by malleus-train (which feeds it the
 * straggling rates it measures every step) and the tests.
 *
 * Every `check_every` steps (default 3) the policy looks at the last
 * `window` samples (default 2) of every rank, with rates below
 * `noise_floor` (default 1.2) counted as 1.0.  A rank's rate has moved when
 * every sample of its window agrees:
 *   - an active rank: all of them >= its baseline + `gap` (default 0.3),
 *     or all of them <= its baseline - gap (the rate the current plan was
 *     made with);
 *   - a suspended rank: all of them below `threshold` (default 1.2): it
 *     recovered; suspended ranks stay suspended while their rate is >=
 *     threshold, whatever else it does.
 * A move counts once it has been seen at `persist` consecutive checks
 * (default 1); then a re-plan is advised.  Requiring the whole window
 * (rather than its mean) is what keeps one noisy probe sample from
 * counting: a descheduled rank on a shared machine produces single slow
 * samples, a slow device produces slow windows.
 *
 * Whether acting on the advice pays is a second question, answered by
 * mal_policy_pays(): the gain predicted over the steps still to run
 * against what the change costs.
 *
 * After a re-plan (or a decision to keep the plan) the caller sets the new
 * baseline with mal_policy_set_plan().  Local (no communication); not
 * thread-safe. */
#ifndef MAL_POLICY_H
#define MAL_POLICY_H

typedef struct mal_policy_params {
    int check_every;    /* K: steps between checks */
    int window;         /* W: samples that must all agree */
    int persist;        /* P: consecutive checks a move must be seen at */
    double gap;         /* re-plan when an active rank's rate moved by >= gap */
    double threshold;   /* suspended ranks stay suspended while rate >= threshold */
    double noise_floor; /* rates below count as 1.0 */
} mal_policy_params;

typedef struct mal_policy mal_policy;

/* The defaults above. */
void mal_policy_defaults(mal_policy_params *pp);

/* Create a policy for n_ranks ranks (baseline: every rank active at 1.0).
 * *out is owned by the caller; free with mal_policy_destroy.  MAL_EINVAL for
 * bad parameters (K, W or P < 1, negative gap...).  Local. */
int mal_policy_create(const mal_policy_params *pp, int n_ranks, mal_policy **out);
void mal_policy_destroy(mal_policy *pol);

/* New baseline after a (re)plan: the rates the plan was made with
 * (rates[n_ranks], raw) and which ranks it suspends (suspended[n_ranks],
 * nonzero = suspended; NULL = none).  Keeps the sample history; forgets
 * the moves seen so far.  Local. */
int mal_policy_set_plan(mal_policy *pol, const double *rates, const unsigned char *suspended);

/* Record the rates measured at `step` (rates[n_ranks], raw; a NaN entry
 * means "not measured" and is skipped).  Returns 1 when a re-plan is advised
 * at this step, 0 when not, negative MAL_E* on bad input.  Checks happen when
 * step % check_every == 0 and at least one full window was seen.  Local. */
int mal_policy_observe(mal_policy *pol, long step, const double *rates);

/* The windowed, floored means used by the last check (rates[n_ranks]: what
 * a re-plan plans for), and the rank that triggered the last advice (-1 if
 * none).  Local. */
void mal_policy_means(const mal_policy *pol, double *means);
int mal_policy_trigger_rank(const mal_policy *pol);

/* Whether a plan change pays for itself. */
typedef struct mal_policy_change {
    double step_s;        /* measured step time on the current plan now (seconds) */
    double predicted_now; /* predicted step time of the current plan for the measured
                           * rates (any unit) */
    double predicted_new; /* that of the new plan, in the same unit */
    long remaining_steps; /* steps still to run */
    double cost_s;        /* what the change costs (seconds): measured at the last
                           * one, or estimated */
} mal_policy_change;

/* The gain a change promises: the measured step time scaled by the
 * predicted ratio of the two plans (the cost model's relative answer is
 * trusted, its absolute seconds are not: a profile may be another
 * machine's), over the remaining steps, in seconds (*gain_s, may be
 * negative).  Returns 1 when it exceeds the cost, else 0; MAL_EINVAL for
 * inputs that are not numbers or are negative.  Local. */
int mal_policy_pays(const mal_policy_change *c, double *gain_s);

#endif /* MAL_POLICY_H */
