/* MPI error codes into the library's errors: the boundary where a failed
 * MPI call becomes MAL_EMPI with MPI's own message.  The lowest file of
 * the MPI side of comm/: it knows nothing of mal_comm; the ring
 * (comm_ring.c) and the MPI backend (comm_mpi.c) use it. */
#ifndef MAL_MPI_ERR_H
#define MAL_MPI_ERR_H

/* Local: convert an MPI error code into MAL_EMPI, recording "<what> failed:
 * <MPI error string>" at the caller's file:line.  Returns 0 for
 * MPI_SUCCESS so it can wrap every call. */
int mal_mpi_err_at(const char *file, int line, int mpirc, const char *what);
#define MAL_MPI_ERR(mpirc, what) mal_mpi_err_at(__FILE__, __LINE__, (mpirc), (what))

#endif /* MAL_MPI_ERR_H */
