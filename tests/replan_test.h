/* What the planner's tests share: the input of a search. */
#ifndef MAL_REPLAN_TEST_H
#define MAL_REPLAN_TEST_H

#include "replan/replan.h"

/* A search of `cluster` for `profile` at `rates`: micro-batches of mb
 * sequences, M of them per step; every other field zero (the automatic
 * search, no links, no nominal data-parallel width). */
static inline mal_replan_input mal_test_replan_input(const mal_cluster *cluster,
                                                     const mal_profile *profile,
                                                     const double *rates, int mb, int M)
{
    mal_replan_input in = {0};
    in.cluster = cluster;
    in.profile = profile;
    in.rates = rates;
    in.micro_batch_size = mb;
    in.n_micro_batches = M;
    return in;
}

#endif /* MAL_REPLAN_TEST_H */
