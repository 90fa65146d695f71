/* MPI backend internals that other modules may use: the communicator behind a
 * mal_comm (HDF5's MPI-IO driver, the control plane of the NCCL backend) and
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

/* Local: the MPI communicator of `c`, or MPI_COMM_NULL if `c` is not an MPI
 * backend communicator.  Owned by `c` (never free it); valid until
 * mal_comm_destroy(c). */
MPI_Comm mal_comm_mpi_handle(const mal_comm *c);

/* Local: wait for one request with test + sleep (see above).  `status` may
 * be MPI_STATUS_IGNORE.  `what` names the operation for the error message.
 * Returns 0, or MAL_EMPI with the MPI error string recorded.  The request
 * is MPI_REQUEST_NULL afterwards on success (MPI's own rule). */
int mal_mpi_wait(MPI_Request *req, MPI_Status *status, const char *what);

/* Local: the same for `n` requests (entries may be MPI_REQUEST_NULL). */
int mal_mpi_waitall(int n, MPI_Request *reqs, const char *what);

/* Local: convert an MPI error code into MAL_EMPI, recording "<what> failed:
 * <MPI error string>" at the caller's file:line.  Returns 0 for
 * MPI_SUCCESS so it can wrap every call. */
int mal_mpi_err_at(const char *file, int line, int mpirc, const char *what);
#define MAL_MPI_ERR(mpirc, what) mal_mpi_err_at(__FILE__, __LINE__, (mpirc), (what))

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
