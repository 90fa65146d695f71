/* The online fast path's state mover: the parameters and Adam moments of
 * this rank's part under one plan moved, rank to rank, into its part under
 * another (src/migrate.c says how).  The trainer's online re-planning
 * (train/online.c) calls it between building the new part and wiring
 * it.
 *
 * Core layer: plan, layout, slices, model, tensor pieces, comm. */
#ifndef MAL_MIGRATE_H
#define MAL_MIGRATE_H

#include "comm/comm.h"
#include "config.h"
#include "model.h"
#include "plan.h"

/* Bytes of state (parameters and both Adam moments, fp32). */
typedef struct {
    double moved, kept;               /* the whole job: between ranks, left in place */
    double sent, received, kept_here; /* this rank's own */
} mal_migrate_stats;

/* The staging area for strided pieces (default 64 MiB; grown to one piece
 * when a piece is larger; pieces are waited for whenever it is full).
 * Tests set it small to exercise the waits. */
extern size_t mal_migrate_stage_bytes;

/* Local.  When part `next` begins with part `old` (mal_model_extends: the
 * same part, or one extended by later layers), hand old's state buffers
 * over instead of copying them: grown to next's size (the CPU backend
 * remaps the pages, no copy), they become next's, and next's fresh ones
 * go to old; *handed = 1.  Otherwise nothing (*handed = 0).  Either part
 * may be NULL. */
int mal_migrate_hand_over(mal_model *old, mal_model *next, int *handed);

/* Collective over `comm` (all ranks of both plans, comm ranks = plan
 * ranks).  Move the state from `old` (this rank's part under old_plan,
 * NULL if it had none) into `next` (its part under new_plan, NULL if it
 * has none), both on kernel instance k, through the comm data plane;
 * `handed`: mal_migrate_hand_over gave old's buffers to next.  Consecutive
 * groups of ranks_per_node ranks share a node (0: one node), and a sender
 * on the receiver's node is preferred.  *ms: bytes moved and kept. */
int mal_migrate_state(mal_comm *comm, mal_kern k, const mal_model_config *cfg,
                      const mal_plan *old_plan, mal_model *old, const mal_plan *new_plan,
                      mal_model *next, int ranks_per_node, int handed, mal_migrate_stats *ms);

/* Local.  Bytes of state (parameters and both Adam moments, fp32) that a
 * change from plan `from` to plan `to` moves between ranks and keeps in
 * place, with ranks_per_node consecutive ranks per node (0: one node). */
int mal_migration_bytes(const mal_plan *from, const mal_plan *to, const mal_model_config *cfg,
                        int ranks_per_node, double *moved, double *kept);

#endif /* MAL_MIGRATE_H */
