/* The NCCL backend's test hook (comm/comm_nccl.c; the contract of its data
 * plane, streams, events and timeouts is in comm.h).  Exists in builds with
 * NCCL only. */
#ifndef MAL_COMM_NCCL_H
#define MAL_COMM_NCCL_H

/* NCCL communicators this process has created so far: one per mal_comm of
 * the backend and one per distinct member list of dp_allreduce_list.  Tests
 * check that a list seen before creates none. */
extern int mal_comm_nccl_created;

#endif /* MAL_COMM_NCCL_H */
