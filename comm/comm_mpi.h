/* MPI backend internals that other modules may use: the communicator behind a
 * mal_comm, the control-plane functions the NCCL backend's table reuses, and
 * the sleeping wait for raw MPI requests.
 *
 * Why a sleeping wait: MPICH's blocking calls busy-poll.  With more ranks
 * than cores (8 ranks on 2 cores in the tests) a spinning rank holds a core
 * the rank it waits for needs, so a blocking collective costs a scheduler
 * time slice (~30 ms).  Testing the request a few times and then sleeping
 * ~1 us between tests gives the core away and is ~30x faster there, while a
 * rank with a core of its own still sees the first, spinning tests succeed.
 * Waits longer than 1 ms sleep longer (up to 250 us) so that idle ranks use
 * ~7% of a core instead of ~25%.
 * Every wait in Malleus code goes through mal_mpi_wait / mal_mpi_waitall.
 *
 * Side effect of mal_comm_mpi_world(): MPI_COMM_WORLD and MPI_COMM_SELF get
 * MPI_ERRORS_RETURN, because MPICH raises errors found while completing a
 * request on one of those (not on the request's communicator); with the
 * default handler a truncated message would kill the job instead of
 * returning MAL_EMPI.  Mains must therefore check the codes of the MPI
 * calls they make themselves on MPI_COMM_WORLD.
 */
#ifndef MAL_COMM_MPI_H
#define MAL_COMM_MPI_H

#include <mpi.h>
#include <stddef.h>

#include "comm.h"

/* Local: the MPI communicator of `c` (the control plane of every backend),
 * or MPI_COMM_NULL if `c` is NULL or its backend has no MPI control plane.
 * Owned by `c` (never free it); valid until mal_comm_destroy(c). */
MPI_Comm mal_comm_mpi_handle(const mal_comm *c);

/* The MPI control plane, which every backend's table reuses (comm.h: MPI
 * serves the control plane whatever the data plane).  Contracts as the
 * table's entries in comm.h.  Communicators made by split, create_group
 * and mal_comm_dup get the parent's (or the named) table and, where it has
 * one, its dp_attach; mal_comm_mpi_destroy calls dp_detach. */
int mal_comm_mpi_split(mal_comm *parent, int color, int key, mal_comm **out);
int mal_comm_mpi_create_group(mal_comm *parent, const int *ranks, int n, mal_comm **out);
void mal_comm_mpi_destroy(mal_comm *c);
int mal_comm_mpi_allreduce_f32(mal_comm *c, float *buf, size_t n);
int mal_comm_mpi_allreduce_f64(mal_comm *c, double *buf, size_t n);
int mal_comm_mpi_allreduce_max_f64(mal_comm *c, double *buf, size_t n);
int mal_comm_mpi_allreduce_min_int(mal_comm *c, int *buf, size_t n);
int mal_comm_mpi_broadcast(mal_comm *c, void *buf, size_t bytes, int root);
int mal_comm_mpi_gather(mal_comm *c, const void *send, void *recv, size_t bytes, int root);
int mal_comm_mpi_gatherv(mal_comm *c, const void *send, size_t bytes, int root, void **out,
                         size_t *counts);
int mal_comm_mpi_barrier(mal_comm *c);
int mal_comm_mpi_isend(mal_comm *c, const void *buf, size_t bytes, int peer, int tag,
                       mal_comm_req **req);
int mal_comm_mpi_irecv(mal_comm *c, void *buf, size_t bytes, int peer, int tag,
                       mal_comm_req **req);
int mal_comm_mpi_wait(mal_comm_req *req);
void mal_comm_mpi_abort(mal_comm *c, int code);

/* The control-plane entries of a backend's table (designated
 * initialisers): `.name`, `.abort` and the data plane are the backend's. */
#define MAL_COMM_MPI_CONTROL_PLANE                                                                 \
    .split = mal_comm_mpi_split, .create_group = mal_comm_mpi_create_group,                        \
    .destroy = mal_comm_mpi_destroy, .allreduce_f32 = mal_comm_mpi_allreduce_f32,                  \
    .allreduce_f64 = mal_comm_mpi_allreduce_f64,                                                   \
    .allreduce_max_f64 = mal_comm_mpi_allreduce_max_f64,                                           \
    .allreduce_min_int = mal_comm_mpi_allreduce_min_int, .broadcast = mal_comm_mpi_broadcast,      \
    .gather = mal_comm_mpi_gather, .gatherv = mal_comm_mpi_gatherv,                                \
    .barrier = mal_comm_mpi_barrier, .isend = mal_comm_mpi_isend, .irecv = mal_comm_mpi_irecv,     \
    .wait = mal_comm_mpi_wait

/* Local: wait for one request with test + sleep (see above).  `status` may
 * be MPI_STATUS_IGNORE.  `what` names the operation for the error message.
 * Returns 0, or MAL_EMPI with the MPI error string recorded.  The request
 * is MPI_REQUEST_NULL afterwards on success (MPI's own rule). */
int mal_mpi_wait(MPI_Request *req, MPI_Status *status, const char *what);

/* Local: the same for `n` requests (entries may be MPI_REQUEST_NULL). */
int mal_mpi_waitall(int n, MPI_Request *reqs, const char *what);

/* Test hook: the most bytes one MPI call of a collective moves; larger
 * buffers are cut into chunks of at most this many bytes (rounded down to
 * whole elements).  The default, 1 GiB, keeps every count far below
 * INT_MAX elements and every call below 2^31 bytes.  Tests lower it to
 * exercise the chunk path with small buffers; it must be the same on every
 * rank of a collective. */
extern size_t mal_comm_mpi_chunk_bytes;
#define MAL_COMM_MPI_CHUNK_BYTES_DEFAULT ((size_t)1 << 30)

/* All-reduces (per chunk) of fewer bytes than this go as reduce to rank 0
 * + broadcast, larger ones as reduce-scatter + all-gather; both leave the
 * same bits on every rank.  4 KiB is where the second became as fast as
 * the first (8 ranks on 2 cores). */
#define MAL_COMM_MPI_SMALL_BYTES ((size_t)4096)

#endif /* MAL_COMM_MPI_H */
