/* Who holds and who owns which piece of the model state under a plan.
 *
 * Every pipeline holds every tensor once (split over its stage's TP group,
 * replicated in it, or - key/value heads of a group larger than their
 * number - in ranges that overlap; a tied embedding on its first and last
 * stage).  The gradient norm (gradsync.c) counts each element at
 * its first holder in (pipeline, rank) order; snapshots (ckpt/reshard.c)
 * store each element once.  Pure functions of plan and config: every process
 * computes the same answer without communication. */
#ifndef MAL_LAYOUT_H
#define MAL_LAYOUT_H

#include "config.h"
#include "model.h"
#include "plan.h"
#include "slices.h"

/* Local.  The model part `rank` holds under `plan` (MAL_ENOENT if the plan
 * does not mention it; *active = 0 for a suspended rank). */
int mal_layout_part(const mal_plan *plan, const mal_model_config *cfg, int rank,
                    mal_model_part *part, int *active);

/* Local.  Every holding of tensor `t` (as described by any holder's tensor
 * info) of a model of config cfg across the plan's pipelines, along
 * t->axis: h must have room for the plan's active rank count.  group =
 * pipeline index; sub (slices.h) = the stage's index in its pipeline (a
 * tied embedding is held by the first and the last stage), or the rank
 * for key/value heads that TP ranks share.  Returns the count. */
int mal_layout_holdings(const mal_plan *plan, const mal_model_config *cfg, const mal_tensor_info *t,
                        mal_slice_holding *h);

/* One block of a tensor along its axis that a rank owns (see
 * mal_reshard_rank_blocks for who writes what into a snapshot). */
typedef struct {
    int tensor;          /* index into the rank's tensor table */
    int64_t begin, end;  /* global coordinates along the tensor's axis */
} mal_owned_block;

#endif /* MAL_LAYOUT_H */
