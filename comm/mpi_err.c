/* MPI error codes into MAL_EMPI (mpi_err.h). */
#include "mpi_err.h"

#include <mpi.h>

#include "base/mal.h"

int mal_mpi_err_at(const char *file, int line, int mpirc, const char *what)
{
    if (mpirc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(mpirc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    return mal_seterr_at(file, line, MAL_EMPI, "%s failed: %s (MPI error %d)", what,
                         len ? msg : "no MPI error string", mpirc);
}
