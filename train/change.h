/* Acting on the monitor's advice (change.c): rank 0 plans for the measured
 * rates, weighs the gain the new plan promises over the remaining steps
 * against what the change costs, and every rank follows its verdict: stop
 * for a re-plan (--adapt restart), change plan in the job (--adapt online),
 * or stay and take the measured rates as the policy's new baseline.  Also
 * the predicted step time of the plan a run begins with.  Its public
 * function is mal_trainer_replan_online (train.h).  Not installed. */
#ifndef MAL_TRAIN_CHANGE_H
#define MAL_TRAIN_CHANGE_H

#include "train.h"

struct mal_trainer;

/* Local, rank 0 (a no-op elsewhere).  When the plan in force carries no
 * predicted step time (a plan file without one, or --dp/--tp/--pp), the
 * cost model's for the rates the plan was made with, where a planner
 * profile can be had (--planner-profile, or a preset model); else it stays
 * unknown. */
void mal_change_predict(struct mal_trainer *tr);

/* Collective, at a step whose stats advise a re-plan (st->replan).  0
 * with *stop = 0: the run goes on (on a new plan after an online change,
 * or on the same one); 0 with *stop = 1: the run must stop for a re-plan
 * (--adapt restart: the caller commits a snapshot of this step first).  A
 * negative MAL_E* error may be this rank's alone (the caller takes the
 * fatal path).  With --adapt online, the caller waits for a background
 * snapshot first (one in flight never crosses a plan change). */
int mal_change_on_advice(struct mal_trainer *tr, const mal_step_stats *st, int *stop);

#endif /* MAL_TRAIN_CHANGE_H */
