/* Data-parallel gradient sum over replicas that may shard the same
 * parameter differently (different TP sizes, different stage boundaries),
 * and who counts which gradient element in the global norm.
 *
 * For every tensor this rank holds, the holdings of all pipelines are
 * computed from the plan (no communication), cut into the finest common
 * partition (slices.h), and every piece with two or more distinct
 * gradients among its holders is summed over its holders: per pipeline,
 * the first holder of each `sub` (slices.h) contributes its gradient --
 * one for a norm weight that every rank of a TP group holds a copy of
 * (the other copies contribute zeros), one per rank for a key/value head
 * that several TP ranks share (each has the gradient of its own query
 * heads: Megatron-LM's sum over the replicas), one per stage for a tied
 * embedding (the first stage's input gradient and the last stage's output
 * layer gradient: Megatron's embedding group) -- and every holder
 * receives the sum, its pipeline's share of the global batch.
 * Pieces with the same holder set travel together: packed (tensor pieces,
 * piece.h) into one device buffer and reduced by the comm data plane over
 * the member list (mal_comm_dp_allreduce_list: no communicator of their
 * own, so regrouping the replicas after a plan change creates none), then
 * unpacked.  The same pieces decide who counts which gradient element in
 * the global norm: the first holder overall (pipeline 0's lowest rank).
 *
 * Two ways to run the sum (the trainer's --dp-overlap):
 *  - after the whole backward pass (mal_gradsync_run): one blocking
 *    reduction per holder set, in the order the sets first appear in the
 *    tensor table; the reference;
 *  - overlapped with the backward pass (mal_gradsync_buckets, then every
 *    step mal_gradsync_begin, mal_gradsync_ready from the model's gradient
 *    hook, mal_gradsync_finish): the pieces in the order the backward pass
 *    finishes them (head, final norm, layers from last to first,
 *    embedding), consecutive pieces of one holder set merged into buckets
 *    of about a cap's bytes, each with its own region of one device buffer
 *    (one more copy of the replicated gradients), packed and posted
 *    (mal_comm_dp_iallreduce_list) as soon as its last piece is final on
 *    this rank, and all waited for and unpacked before the norm and the
 *    optimizer.  Buckets are posted in one order on every rank: by the
 *    position of their last piece in the backward order, one total order
 *    over all buckets of the job (comm.h explains why that rules out
 *    deadlock).
 * Both give every replica bitwise the same sum; they may differ from each
 * other in the last bits (a bucket's elements sit at other positions of
 * the ring than its holder set's whole buffer does, so other members add
 * them up in another order).
 *
 * The sharded optimizer (ZeRO-1, mal_gradsync_zero): the Adam moments of
 * every summed piece are kept by one of its holders only.  Each bucket's
 * (overlapped) or holder set's (after the backward pass) packed buffer is
 * cut into a region per member (as equal as the
 * floats allow, in the order of the ranks): the gradients are
 * reduce-scattered (mal_comm_dp_ilist), each member keeps the sum of its
 * region (in the bucket's own region: no buffer beside the buckets; after
 * the backward pass, where the holder sets share one packing buffer, in a
 * shard of its own), counts it in the global norm and updates its region
 * of the parameters in place with its share of the moments, and the
 * updated parameters are packed into the same buffer and all-gathered to
 * every holder (the buckets' gathers in flight together).  The split
 * follows the holder set of each piece, not a uniform data-parallel
 * group, so it holds for replicas in pipelines of any depth and TP size.
 * Pieces no group sums are updated by their holder alone, moments kept
 * compact.  The update being element-wise, a step gives the
 * bits of the unsharded one given the same sums; the reduce-scatter adds
 * in the order the all-reduce does for holder sets of up to 64 KiB of
 * gradients (beyond, the ring's blocks are the regions: last bits may
 * differ).  The fp32 master parameters stay whole on every holder (with
 * fp32 compute they are the working weights the forward pass reads),
 * unless the master is sharded too (mal_gradsync_zero_master, where a
 * separate working copy exists: reduced-precision compute): then each
 * rank keeps the master of its regions and local pieces only (at the
 * moments' offsets) and m->params is freed; the owner's update writes
 * the new working-copy values of its region (the fused cast), and the
 * working copies are all-gathered in the compute dtype (half the bytes
 * of the fp32 gather in bf16) straight into m->work.  Whatever needs the
 * whole master gathers it first (mal_gradsync_zero_gather: an online
 * plan change) or reads it by blocks (snapshots: each rank's blocks of
 * the master shard, as of the moments).
 *
 * Core layer: plan, layout, slices, model, tensor pieces, comm. */
#ifndef MAL_GRADSYNC_H
#define MAL_GRADSYNC_H

#include "comm/comm.h"
#include "model.h"
#include "optim.h"
#include "plan.h"

typedef struct mal_gradsync mal_gradsync;

/* Local.  The sync of `m` (this rank's part, world rank `rank` under
 * `plan`; not owned, must outlive the sync) over `comm`, a communicator
 * of all ranks kept for the sync's messages (not owned; NULL for a one-rank
 * run, which has nothing to sum).  Allocates the norm's accumulator on the
 * model's kernel instance (the blocking path's packing buffer comes with
 * its first use). */
int mal_gradsync_create(mal_gradsync **out, const mal_plan *plan, int rank, mal_model *m,
                        mal_comm *comm);
void mal_gradsync_destroy(mal_gradsync *g);

/* Collective over the holders of each piece (every rank calls it in the
 * same step).  Sum the gradients of m over the replicas, in place. */
int mal_gradsync_run(mal_gradsync *g);

/* Local.  Set up the overlapped sum: cut the replicated pieces into
 * buckets of at least cap_bytes each (0: a bucket per layer and holder
 * set) and allocate their device buffer.  Every rank must pass the same
 * cap.  May be called again (another cap). */
int mal_gradsync_buckets(mal_gradsync *g, size_t cap_bytes);

/* Local.  Buckets made by mal_gradsync_buckets (0 before); *posted_early
 * (may be NULL): how many of them the last step posted from the gradient
 * hook, during the backward pass, rather than in mal_gradsync_finish. */
int mal_gradsync_n_buckets(const mal_gradsync *g, int *posted_early);

/* Collective over the holders of each bucket, before the step's first
 * backward pass: reset the step's buckets; the first time, make the
 * backend's per-list communicators (blocking, in bucket order), so that
 * no post blocks in the middle of a backward pass. */
int mal_gradsync_begin(mal_gradsync *g);

/* Local.  The gradients of model layer `layer` (mal_tensor_info.layer:
 * -1 embedding, n_layers the final norm and head) and of every later one
 * are final and their kernels queued: pack and post every bucket whose
 * pieces are all final now, then progress what is in flight (never
 * waits).  Called by the model's gradient hook in the step's last
 * backward pass. */
int mal_gradsync_ready(mal_gradsync *g, int layer);

/* Collective over the holders of each bucket: post the buckets not posted
 * yet, wait for all of them in order, and unpack the sums into the
 * gradients (kernels queued after it see them; sharded, keep this rank's
 * regions of the sums).  Ends the step's sum. */
int mal_gradsync_finish(mal_gradsync *g);

/* Local.  The sum of squares (double) of the gradient elements this rank
 * counts in the global norm, accumulated on the device over strided runs
 * and read once. */
int mal_gradsync_norm_sumsq(mal_gradsync *g, double *out);

/* Collective like mal_gradsync_run.  *count = elements of parameters and
 * Adam moments this rank holds whose copies on the replicas are not
 * bitwise identical (this rank's count; sum it over the world). */
int mal_gradsync_replica_mismatch(mal_gradsync *g, double *count);

/* Local.  Switch to the sharded optimizer (see the top), after
 * mal_gradsync_buckets if the sum is to be overlapped (the regions are
 * the buckets'; buckets cannot be cut again afterwards): allocates this
 * rank's shards of the moments and of the gradient sums, owned by the
 * sync: zero when `m` was made without moments (MAL_MODEL_NO_MOMENTS),
 * else this rank's share of m's whole moments, which are then freed (an
 * online plan change hands whole moments over).  The gradient sum is then mal_gradsync_begin / _ready / _finish
 * (which reduce-scatter the buckets) or mal_gradsync_zero_reduce, and the
 * update mal_gradsync_zero_step (not mal_optim_update); the norm
 * (mal_gradsync_norm_sumsq) counts the shards; the replica check compares
 * parameters only (the working copies when the master is sharded). */
int mal_gradsync_zero(mal_gradsync *g, int rank);

/* Local.  Shard the fp32 master too (see the top), after
 * mal_gradsync_zero: this rank's share of the whole m->params (regions
 * and local pieces, the moments' layout; attributed to MAL_MEM_MASTER),
 * taken from a copy in the gradient buffer (overwritten: call it between
 * steps) after m->params is freed and NULL (mal_model_state names it
 * missing), so that the whole master and the share never coexist.
 * Nothing when the working weights are the master (fp32 compute) or it is
 * already sharded.  The sync owns the shard: destroy it only after
 * mal_gradsync_zero_gather. */
int mal_gradsync_zero_master(mal_gradsync *g);

/* Local.  1 when the master is sharded (g may be NULL: 0). */
int mal_gradsync_zero_master_sharded(const mal_gradsync *g);

/* Local.  Loading a whole master into a sharded one (a resume, --init-from):
 * _stage points m->params at the gradient buffer (rebuilt every step)
 * and returns it (NULL when the master is not sharded: load m->params as
 * usual); load it whole there (mal_model_state_from_host also refreshes
 * the working copy), then _unstage takes this rank's shard of it and sets
 * m->params back to NULL. */
float *mal_gradsync_zero_master_stage(mal_gradsync *g);
int mal_gradsync_zero_master_unstage(mal_gradsync *g);

/* Collective like mal_gradsync_zero_reduce.  Whole moments again: m's
 * adam_m and adam_v allocated and filled from every holder's shards (an
 * online plan change moves whole moments; the part is retired after);
 * a sharded master likewise (m->params allocated and gathered, its shard
 * freed: the whole master's transient peak).  Nothing when not sharded or
 * already whole. */
int mal_gradsync_zero_gather(mal_gradsync *g);

/* Local.  Floats of Adam moments (each of m and v) this rank keeps under
 * the sharded optimizer (0 when not sharded). */
size_t mal_gradsync_zero_floats(const mal_gradsync *g);

/* Local.  What the sharded optimizer keeps on world rank `rank` holding
 * `part` under `plan` (computed from the plan, nothing allocated): floats
 * of each Adam moment (*moments; a sharded master, mal_gradsync_zero_master,
 * keeps as many floats of parameters) and of the gradient sums of its regions
 * that it keeps apart (*sums: 0 when `overlapped`, where they stay in the
 * buckets' regions), with the holder sets' regions (buckets' regions
 * differ by less than a float per bucket). */
int mal_gradsync_zero_need(const mal_plan *plan, const mal_model_config *cfg, int rank,
                           const mal_model_part *part, int overlapped, size_t *moments,
                           size_t *sums);

/* Local.  Floats of the device buffer the gradient sum of world rank
 * `rank` holding `part` under `plan` keeps (computed from the plan,
 * nothing allocated): the buckets' buffer when `overlapped`
 * (mal_gradsync_buckets), else the packing buffer of the sum after the
 * backward pass; 0 for a part without replicas. */
int mal_gradsync_buffer_need(const mal_plan *plan, const mal_model_config *cfg, int rank,
                             const mal_model_part *part, int overlapped, size_t *floats);

/* Collective over the holders of each piece, after the backward pass
 * (in place of mal_gradsync_run): reduce-scatter the gradients; this rank
 * keeps the sums of its regions. */
int mal_gradsync_zero_reduce(mal_gradsync *g);

/* Collective like mal_gradsync_zero_reduce, after it and the norm: one
 * AdamW update (mal_optim_update's, gradients times grad_scale) of this
 * rank's regions and local pieces, then the parameters all-gathered to
 * every holder and the working weights refreshed. */
int mal_gradsync_zero_step(mal_gradsync *g, const mal_optim_config *oc, int64_t step, float lr,
                           float grad_scale);

/* A block of Adam moments the sharded optimizer keeps: a rectangle of
 * tensor `tensor` (index in the model's table) in global coordinates
 * (rows, columns; a 1-D tensor [0] only), row-major at float `at` of this
 * rank's moment shards, n floats. */
typedef struct {
    int tensor;
    int64_t offset[2], extent[2];
    size_t at, n;
} mal_zero_block;

/* Local.  The blocks of this rank's moments (*out malloc'd, caller frees):
 * its regions, cut into rectangles (a partial row, whole rows, a partial
 * row per piece), and the pieces only it updates -- of those that several
 * ranks hold alike (the copies of a TP group), the first holder's only
 * unless all_local.  Without all_local, the blocks of all ranks tile every
 * tensor once: what a snapshot stores; with it, all this rank reads back. */
int mal_gradsync_zero_blocks(const mal_gradsync *g, int all_local, mal_zero_block **out,
                             int *n_out);

/* Local.  Queue the copy of n floats at `at` of shard `grp`
 * (MAL_STATE_ADAM_M or _V, or MAL_STATE_PARAM of a sharded master) to
 * host memory / from it (kernel queue order; the caller synchronises). */
void mal_gradsync_zero_to_host(const mal_gradsync *g, int grp, size_t at, size_t n, float *dst);
void mal_gradsync_zero_from_host(mal_gradsync *g, int grp, size_t at, size_t n, const float *src);

/* Local.  Floats this rank exchanges per step (all groups). */
size_t mal_gradsync_floats(const mal_gradsync *g);

#endif /* MAL_GRADSYNC_H */
