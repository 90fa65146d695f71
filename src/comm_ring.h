/* All-reduce over any list of members of a communicator, by a ring of
 * point-to-point messages on that communicator: the MPI data plane's
 * dp_allreduce_list (comm_mpi.c), on host memory.  Internal to the MPI
 * backend; everyone else calls mal_comm_dp_allreduce_list.
 *
 * It needs no communicator of the members' own, so forming a group costs
 * nothing: an online plan change regroups the data-parallel replicas, and
 * creating their communicators (a collective each, tens of milliseconds on
 * a busy machine, far more with NCCL) used to be most of a small change.
 *
 * Reduce-scatter then all-gather around the ring (members in list order):
 * each block is combined on exactly one member and copied to the others, so
 * every member ends with bitwise the same result, and the combination
 * order depends only on the list, so reruns are bitwise reproducible. */
#ifndef MAL_COMM_RING_H
#define MAL_COMM_RING_H

#include <stddef.h>

#include "comm.h"

/* Bytes of scratch mal_comm_ring_allreduce needs for `count` fp32
 * elements over `n` members. */
size_t mal_comm_ring_scratch_bytes(size_t count, int n);

/* Collective over the `n` listed ranks of `c` (others need not call; the
 * calling rank must be listed).  In-place reduction (sum or max) of
 * `count` floats of host memory `buf`.  Members must call their groups in
 * the same order, as messages between two ranks on `tag` match in the
 * order posted. */
int mal_comm_ring_allreduce(mal_comm *c, const int *members, int n, int tag, float *buf,
                            size_t count, mal_reduce_op op, void *scratch);

#endif /* MAL_COMM_RING_H */
