/* Point-to-point messages of any number of bytes on an MPI of any standard
 * (MPI-4's large-count calls are not everywhere: Open MPI 4 implements MPI
 * 3.1): up to mal_mpi_bytes_split bytes as that many MPI_BYTEs, beyond as
 * one element of a derived datatype (blocks of up to 1 GiB and the rest).
 * Used by the MPI backend (comm_mpi.c) for its point-to-point and
 * data-plane transfers.  Not installed. */
#ifndef MAL_MPI_BYTES_H
#define MAL_MPI_BYTES_H

#include <mpi.h>
#include <stddef.h>

/* Messages longer than this many bytes go as a derived type (INT_MAX, the
 * most an int count carries; tests lower it to send small messages that
 * way). */
extern size_t mal_mpi_bytes_split;

/* Local.  Post a nonblocking send (is_recv 0) or receive of `bytes` bytes
 * at buf; *type receives the datatype posted (MPI_BYTE, or a derived type
 * that mal_mpi_bytes_done frees: call it once the request completed or
 * failed).  0, or MAL_EMPI. */
int mal_mpi_bytes_post(void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, int is_recv,
                       MPI_Request *req, MPI_Datatype *type);

/* Local.  After the request of mal_mpi_bytes_post completed: with `st`
 * (NULL: the request failed, or was a send: nothing counted), *got = the
 * bytes a receive got; frees a derived *type either way.  0, or
 * MAL_EMPI. */
int mal_mpi_bytes_done(const MPI_Status *st, MPI_Datatype *type, size_t *got);

#endif /* MAL_MPI_BYTES_H */
