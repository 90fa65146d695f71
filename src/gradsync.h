/* Data-parallel gradient sum over replicas that may shard the same
 * parameter differently (different TP sizes, different stage boundaries),
 * and who counts which gradient element in the global norm.
 *
 * For every tensor this rank holds, the holdings of all pipelines are
 * computed from the plan (no communication), cut into the finest common
 * partition (slices.h), and every piece held by two or more pipelines is
 * summed over its holders: the first holder of each pipeline contributes its
 * gradient (its pipeline's share), other TP ranks of the same pipeline that
 * hold a replica of it contribute zeros, and every holder receives the sum.
 * Pieces with the same holder set travel together: packed (tensor pieces,
 * piece.h) into one device buffer and reduced by the comm data plane over
 * the member list (mal_comm_dp_allreduce_list: no communicator of their
 * own, so regrouping the replicas after a plan change creates none), then
 * unpacked.  The same pieces decide who counts which gradient element in
 * the global norm: the first holder overall (pipeline 0's lowest rank).
 *
 * Core layer: plan, layout, slices, model, tensor pieces, comm. */
#ifndef MAL_GRADSYNC_H
#define MAL_GRADSYNC_H

#include "comm.h"
#include "model.h"
#include "plan.h"

typedef struct mal_gradsync mal_gradsync;

/* Local.  The sync of `m` (this rank's part, world rank `rank` under
 * `plan`; not owned, must outlive the sync) over `comm`, a communicator
 * of all ranks kept for the sync's messages (not owned; NULL for a one-rank
 * run, which has nothing to sum).  Allocates the packing buffer and the
 * norm's accumulator on the model's kernel instance. */
int mal_gradsync_create(mal_gradsync **out, const mal_plan *plan, int rank, mal_model *m,
                        mal_comm *comm);
void mal_gradsync_destroy(mal_gradsync *g);

/* Collective over the holders of each piece (every rank calls it in the
 * same step).  Sum the gradients of m over the replicas, in place. */
int mal_gradsync_run(mal_gradsync *g);

/* Local.  The sum of squares (double) of the gradient elements this rank
 * counts in the global norm, accumulated on the device over strided runs
 * and read once. */
int mal_gradsync_norm_sumsq(mal_gradsync *g, double *out);

/* Collective like mal_gradsync_run.  *count = elements of parameters and
 * Adam moments this rank holds whose copies on the replicas are not
 * bitwise identical (this rank's count; sum it over the world). */
int mal_gradsync_replica_mismatch(mal_gradsync *g, double *count);

/* Local.  Floats this rank exchanges per step (all groups). */
size_t mal_gradsync_floats(const mal_gradsync *g);

#endif /* MAL_GRADSYNC_H */
