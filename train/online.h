/* The online re-plan's record (online.c): how many plan changes the run
 * made inside the job and what the last one moved.  Its functions are
 * public (train.h: mal_trainer_change_plan, _migrations, _migration_times;
 * mal_trainer_replan_online is change.c's).  Not installed. */
#ifndef MAL_TRAIN_ONLINE_H
#define MAL_TRAIN_ONLINE_H

#include "train.h"

/* Owned by online.c; all zero before the first change (the trainer is
 * allocated zeroed), nothing to release. */
typedef struct {
    int migrations;            /* online plan changes so far */
    double migrated_bytes;     /* bytes moved by the last one (all ranks together) */
    double kept_bytes;         /* bytes of state the last one left in place */
    mal_migration_times times; /* this rank's breakdown of the last one */
    double slowest_s;          /* rank 0: the slowest rank's time in the last one */
} mal_online;

#endif /* MAL_TRAIN_ONLINE_H */
