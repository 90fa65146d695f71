/* Messages of any size on MPI-3 and MPI-4 (see mpi_bytes.h).  One way for
 * both standards, rather than MPI-4's MPI_Isend_c where it exists: the
 * path an MPI-3 build takes is then the path every build tests. */
#include "mpi_bytes.h"

#include <limits.h>

#include "base/mal.h"
#include "mpi_err.h"

size_t mal_mpi_bytes_split = INT_MAX;

/* `bytes` (more than the split) as one element: n blocks, then the rest. */
static int big_type(size_t bytes, MPI_Datatype *out)
{
    const size_t G = (size_t)1 << 30;
    size_t b = mal_mpi_bytes_split < G ? (mal_mpi_bytes_split ? mal_mpi_bytes_split : 1) : G;
    if (bytes / b > INT_MAX)
        return MAL_ERR(MAL_EINVAL, "a message of %zu bytes is more than %d blocks of %zu", bytes,
                       INT_MAX, b);
    MPI_Datatype blk;
    int rc = MPI_Type_contiguous((int)b, MPI_BYTE, &blk);
    if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "MPI_Type_contiguous");
    int lens[2] = {(int)(bytes / b), (int)(bytes % b)};
    MPI_Aint disp[2] = {0, (MPI_Aint)(bytes / b * b)};
    MPI_Datatype types[2] = {blk, MPI_BYTE};
    rc = MPI_Type_create_struct(2, lens, disp, types, out);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(out);
    MPI_Type_free(&blk);
    return rc == MPI_SUCCESS ? 0 : MAL_MPI_ERR(rc, "MPI_Type_create_struct");
}

int mal_mpi_bytes_post(void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, int is_recv,
                       MPI_Request *req, MPI_Datatype *type)
{
    int rc, count = (int)bytes;
    *type = MPI_BYTE;
    if (bytes > mal_mpi_bytes_split || bytes > INT_MAX) {
        if ((rc = big_type(bytes, type))) return rc;
        count = 1;
    }
    rc = is_recv ? MPI_Irecv(buf, count, *type, peer, tag, comm, req)
                 : MPI_Isend(buf, count, *type, peer, tag, comm, req);
    if (rc != MPI_SUCCESS && *type != MPI_BYTE) MPI_Type_free(type);
    return rc == MPI_SUCCESS ? 0 : MAL_MPI_ERR(rc, is_recv ? "MPI_Irecv" : "MPI_Isend");
}

int mal_mpi_bytes_done(const MPI_Status *st, MPI_Datatype *type, size_t *got)
{
    int rc = MPI_SUCCESS;
    *got = 0;
    if (st) {
        /* basic elements: bytes, whether posted as MPI_BYTE or the struct
         * (a partial struct counts the bytes that arrived) */
        MPI_Count n = 0;
        rc = MPI_Get_elements_x(st, *type, &n);
        *got = rc == MPI_SUCCESS && n > 0 ? (size_t)n : 0;
    }
    if (*type != MPI_BYTE) MPI_Type_free(type);
    return rc == MPI_SUCCESS ? 0 : MAL_MPI_ERR(rc, "MPI_Get_elements_x");
}
