/* Event-by-event simulator of the 1F1B pipeline schedule: predicts the step
 * time of a plan from per-stage forward/backward times, without the closed
 * form, so that benchmarks at the paper's scale can check the planner's cost
 * model (which is an upper bound of the simulation: op times are max-plus
 * expressions, monotone in every duration). */
#ifndef MAL_SIM_H
#define MAL_SIM_H

#include "replan.h"
#include "src/plan.h"

/* Fraction of a layer's (forward + backward) time spent in the forward pass
 * (backward computes two matrix products per forward one). */
#define MAL_SIM_FORWARD_SHARE MAL_REPLAN_FORWARD_SHARE

/* The largest stages x micro-batches of one pipeline the simulator takes
 * (its tables: 24 bytes per stage and micro-batch, 400 MB here); 128 stages
 * of 32,768 micro-batches each fit. */
#define MAL_SIM_MAX_OPS (1 << 24)

/* Simulate one pipeline: S stages, stage j takes fwd[j] per forward and
 * bwd[j] per backward of one micro-batch, m micro-batches under 1F1B
 * (stage j runs min(S - j - 1, m) warm-up forwards, then alternates one
 * forward and one backward, then drains backwards); `p2p` is added to every
 * activation/gradient hand-over between stages.  Returns the time the last
 * backward finishes (>= 0) or a negative MAL_E* code (MAL_EINVAL beyond
 * MAL_SIM_MAX_OPS).  Local. */
double mal_sim_pipeline(int S, const double *fwd, const double *bwd, int m, double p2p);

/* The same with `hop[S - 1]` added to the hand-over at each boundary (j to
 * j + 1, both ways; NULL: none) and stage j running `warm[j]` warm-up
 * forwards (capped at m; non-increasing; NULL: the 1F1B default). */
double mal_sim_pipeline_ex(int S, const double *fwd, const double *bwd, int m, double p2p,
                           const double *hop, const int *warm);

/* Simulate a plan with communication (README "Links"): stage time
 * l (x alpha + TP all-reduces), each boundary's activation send
 * (mal_cost_p2p), the plan's warm-up depths; the slowest gradient sum over
 * a slow link added to the step.  Layer units.  Local. */
int mal_sim_plan_links(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                       const double *rates, const mal_links *ln, double *step_out,
                       double *pipe_out);

/* Simulate a plan under rates[] (raw; noise floor applied) and a profile:
 * stage time per micro-batch = y * layers (layer units), split by
 * MAL_SIM_FORWARD_SHARE.  *step_out = max over pipelines (layer units);
 * pipe_out[n_pipelines] optional.  Local. */
int mal_sim_plan(const mal_plan *plan, const mal_profile *p, const double *rates, int world_size,
                 double p2p, double *step_out, double *pipe_out);

/* The same on cluster c: a stage of a mixed cluster at its type's alpha
 * (mal_cost_stage_profile).  Local. */
int mal_sim_plan_on(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                    const double *rates, double p2p, double *step_out, double *pipe_out);

#endif /* MAL_SIM_H */
