/* This rank's share of the run under the plan in force (part.c): where it
 * sits, its model part and the communicators around it.  Built at start-up
 * and again by every online plan change (online.c).  Not installed. */
#ifndef MAL_TRAIN_PART_H
#define MAL_TRAIN_PART_H

#include "comm/comm.h"
#include "comm/comm_pool.h"
#include "src/gradsync.h"
#include "src/model.h"
#include "src/plan.h"

struct mal_trainer;

/* Owned by part.c (mal_trainer_part_init / _fini). */
typedef struct {
    mal_plan_loc loc;     /* where this rank sits; loc.pipeline < 0: suspended */
    mal_model *model;     /* this rank's part (NULL when suspended) */
    mal_comm *tp;         /* this stage's TP group (NULL when tp_size 1; pool's) */
    mal_comm_pool *pool;  /* every group communicator, kept across plan changes */
    mal_gradsync *gsync;  /* data-parallel gradient sync (active ranks only) */
    mal_comm *sync_world; /* all ranks: the sync groups' messages (own) */
} mal_train_part;

/* Collective over the world.  The communicator of the gradient sync's
 * messages, then this rank's part for tr->plan, built and wired;
 * init_params 0: parameters left uninitialised (a resumed run overwrites
 * every one). */
int mal_trainer_part_init(struct mal_trainer *tr, int init_params);
/* Local.  Everything mal_trainer_part_init made, the model included. */
void mal_trainer_part_fini(struct mal_trainer *tr);

/* Local.  This rank's model part for tr->plan (none when suspended);
 * init_params as above; with whole_moments the part has whole Adam
 * moments even under --zero 1 (an online plan change moves whole moments
 * into it; mal_trainer_wire_part keeps this rank's share of them). */
int mal_trainer_build_part(struct mal_trainer *tr, int init_params, int whole_moments);
/* Collective over the world.  Everything around the part: TP group,
 * pipeline (pipeline.c), gradient-sync groups. */
int mal_trainer_wire_part(struct mal_trainer *tr);
/* Local.  Undo mal_trainer_wire_part (the model itself stays). */
void mal_trainer_unwire_part(struct mal_trainer *tr);
/* Local.  Take the part out of service: unwired, its model (NULL when
 * suspended) handed to the caller, who destroys it; the rank holds no part
 * until mal_trainer_build_part. */
mal_model *mal_trainer_retire_part(struct mal_trainer *tr);

#endif /* MAL_TRAIN_PART_H */
