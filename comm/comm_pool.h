/* Communicators kept for reuse across plan changes.
 *
 * Creating a communicator is a collective that costs tens of milliseconds
 * on an oversubscribed machine (MPI's own blocking progress inside it) and
 * far more with NCCL.  An online plan change often needs groups it had
 * before - the same TP groups, the gradient-sync groups of a plan it left
 * earlier - so the trainer takes them from a pool that keeps every
 * communicator it ever created until the trainer ends.
 *
 * Why lookups agree: a group is created by all its members together, each
 * of which adds it to its own pool, and nothing is ever evicted; so for any
 * group either every member finds it or none does, and a miss is a
 * collective creation that all members make. */
#ifndef MAL_COMM_POOL_H
#define MAL_COMM_POOL_H

#include "comm.h"

typedef struct mal_comm_pool mal_comm_pool;

/* Local.  An empty pool of groups of `parent` (not owned). */
int mal_comm_pool_create(mal_comm_pool **out, mal_comm *parent);
/* Local.  Destroys every communicator the pool holds. */
void mal_comm_pool_destroy(mal_comm_pool *p);

/* A communicator of exactly `ranks` (parent ranks, in this order) for use
 * `purpose` (groups used for different purposes are kept apart, so their
 * traffic never mixes).  Collective over the listed ranks when the pool
 * does not hold it yet (the same as mal_comm_create_group); local
 * otherwise.  The pool keeps ownership: never destroy *out. */
int mal_comm_pool_get(mal_comm_pool *p, int purpose, const int *ranks, int n, mal_comm **out);

/* Local.  How many communicators the pool created, and how many requests
 * it answered from what it held. */
void mal_comm_pool_counts(const mal_comm_pool *p, int *created, int *reused);

#endif /* MAL_COMM_POOL_H */
