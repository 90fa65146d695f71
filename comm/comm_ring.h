/* All-reduce over any list of members of a communicator, by a ring of
 * point-to-point messages on that communicator: the MPI data plane's
 * member-list reductions (dp_allreduce_list and dp_iallreduce_list,
 * comm_mpi.c), on host memory.  Internal to the MPI backend; everyone else
 * calls mal_comm_dp_allreduce_list / mal_comm_dp_iallreduce_list.
 *
 * It needs no communicator of the members' own, so forming a group costs
 * nothing: an online plan change regroups the data-parallel replicas, and
 * creating their communicators (a collective each, tens of milliseconds on
 * a busy machine, far more with NCCL) used to be most of a small change.
 *
 * Reduce-scatter then all-gather around the ring (members in list order):
 * each block is combined on exactly one member and copied to the others, so
 * every member ends with bitwise the same result, and the combination
 * order depends only on the list, so reruns are bitwise reproducible.
 * Small buffers (<= 64 KiB) go to the first member, which combines them in
 * list order and sends the result back (two rounds of latency instead of
 * 2(n-1)).  Messages are cut at 1 GiB.  The same machine runs the two
 * halves alone with a region per member (mal_comm_ring_start_v): the
 * reduce-scatter and all-gather of the sharded optimizer.
 *
 * The reduction is a state machine (mal_ring): start posts the first
 * step's messages, progress tests them without waiting and, when a step's
 * messages are all complete, combines what arrived and posts the next
 * step.  The blocking and the non-blocking reduction of comm_mpi.c are the
 * same machine (the blocking one progresses it until it is done), so their
 * results are bitwise the same.
 *
 * Order of the MPI side of comm/, bottom up: mpi_err (MPI errors into
 * MAL_EMPI), this ring (takes a raw MPI_Comm and the caller's rank, knows
 * nothing of the MPI backend), comm_mpi (the backend, which runs the ring);
 * none calls a file above it. */
#ifndef MAL_COMM_RING_H
#define MAL_COMM_RING_H

#include <mpi.h>
#include <stddef.h>

#include "comm.h"

typedef struct mal_ring mal_ring;

/* Bytes of scratch a reduction of `count` fp32 elements over `n` members
 * needs (the first member of a small reduction keeps n-1 copies). */
size_t mal_comm_ring_scratch_bytes(size_t count, int n);

/* Bytes of scratch a collective of kind `kind` (mal_list_coll: reduce-
 * scatter or all-gather) over `n` members with regions of counts[0..n)
 * elements of `es` bytes needs. */
size_t mal_comm_ring_scratch_bytes_v(int kind, const size_t *counts, int n, size_t es);

/* Local (the members' reductions of one list form a collective).  Start
 * the in-place reduction (sum or max) of `count` floats of host memory
 * `buf` over the `n` listed ranks of MPI communicator `comm`, of which the
 * calling rank is `rank` (it must be listed): its first messages are
 * posted on `tag`.  comm stays the caller's and must outlive the machine.  buf and
 * `scratch` (mal_comm_ring_scratch_bytes) are the machine's until it is
 * done or freed; members is copied.  Members must run the reductions of
 * lists they share in the same order, one at a time per communicator
 * (messages between two ranks on a tag match in the order posted). */
int mal_comm_ring_start(MPI_Comm comm, int rank, const int *members, int n, int tag, float *buf,
                        size_t count, mal_reduce_op op, void *scratch, mal_ring **out);

/* Local (the members' collectives of one list form a collective).  Start
 * a collective with a region per member (comm.h, dp_ilist): `buf` holds n
 * regions back to back, region i of counts[i] elements of `es` bytes.
 * MAL_LIST_REDUCE_SCATTER (fp32, es 4, `op`): member i ends with the
 * combination of every member's region i in its region i; the rest of buf
 * is left undefined.  MAL_LIST_ALLGATHER (any es): every member ends with
 * member i's region i, for every i.  The same state machine as the
 * all-reduce: small buffers (all regions <= 64 KiB) go straight from
 * member to member in one step, each region combined by its member in list
 * order; larger ones around the ring, whose blocks are the regions (block
 * b is region b-1, so that the reduce-scatter half of the ring leaves each
 * member with its own).  counts is copied. */
int mal_comm_ring_start_v(MPI_Comm comm, int rank, const int *members, int n, int tag, void *buf,
                          size_t es, const size_t *counts, int kind, mal_reduce_op op,
                          void *scratch, mal_ring **out);

/* Local.  Test the current step's messages (never waits); when they are
 * complete, combine and post the next step, as long as steps complete.
 * *done = 1 once the result is in buf.  0, or MAL_EMPI / MAL_EMISMATCH
 * (a peer sent another size) with the message recorded. */
int mal_comm_ring_progress(mal_ring *r, int *done);

/* Local.  Free the machine; messages still in flight (after an error) are
 * cancelled. */
void mal_comm_ring_free(mal_ring *r);

#endif /* MAL_COMM_RING_H */
