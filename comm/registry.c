/* The communication backends of this build by name (comm.h), one entry per
 * backend, each guarded by the configure macro that builds it.  The name
 * picks the data plane; the control plane is MPI whichever is chosen.
 * Finding a name, the messages and the list for --help are
 * base/registry.c's; this file holds the list and the typed wrappers. */
#include <stddef.h>
#include <string.h>

#include "base/mal.h"
#include "comm.h"

static int mpi_probe(void)
{
    return 0;
}

static const mal_comm_backend comm_mpi = {
    .reg = {.name = "mpi", .probe = mpi_probe},
    .what = "MPI for both planes (device buffers staged through pinned host memory)",
    .ops = &mal_comm_mpi_ops,
    .device = NULL,
};

#ifdef HAVE_NCCL
extern const mal_comm_backend mal_comm_backend_nccl; /* comm/comm_nccl.c */
#endif

/* The entries (mal_comm_backend.reg) of this build's backends, in the
 * order the default is chosen. */
static const mal_registry_entry *const entries[] = {
#ifdef HAVE_NCCL
    &mal_comm_backend_nccl.reg,
#endif
    &comm_mpi.reg,
    NULL,
};

/* Backends some build has, for the message when this one lacks them. */
static const mal_registry_known known[] = {
    {"nccl", "a build with CUDA and NCCL (configure --with-cuda --with-nccl) and a GPU"},
};

static const mal_registry registry = {"comm backend", entries, known, MAL_ARRAY_SIZE(known)};

/* The backend whose entry is `e` (its first member), or NULL. */
_Static_assert(offsetof(mal_comm_backend, reg) == 0, "the entry starts the backend's table");
static const mal_comm_backend *backend_of(const mal_registry_entry *e)
{
    return (const mal_comm_backend *)e;
}

void mal_comm_names(char *buf, size_t len, const char *sep)
{
    mal_registry_names(&registry, buf, len, sep);
}

int mal_comm_lookup(const char *name, const mal_comm_backend **out)
{
    const mal_registry_entry *e;
    int rc = mal_registry_lookup(&registry, name, &e);
    *out = backend_of(e);
    return rc;
}

int mal_comm_dup(mal_comm *parent, const char *backend, mal_comm **out)
{
    const mal_comm_backend *b = NULL;
    int rc;
    *out = NULL;
    /* the name is resolved here, above the backends, so that no backend
     * needs the registry that lists it */
    if (backend && (rc = mal_comm_lookup(backend, &b))) return rc;
    return mal_comm_mpi_dup(parent, b ? b->ops : NULL, out);
}

int mal_comm_check_device(const mal_comm_backend *b, const char *device)
{
    if (!b->device || (device && !strcmp(b->device, device))) return 0;
    return MAL_ERR(MAL_EINVAL,
                   "comm backend '%s' moves buffers of the '%s' device, not of '%s': use "
                   "--device %s, or --comm mpi",
                   b->reg.name, b->device, device ? device : "(none)", b->device);
}

/* Default candidates for kernel backend `device`: the backends made for
 * its buffers (NCCL for "cuda"). */
static int moves_device(const mal_registry_entry *e, const void *device)
{
    const char *mine = backend_of(e)->device;
    return mine && device && !strcmp(mine, device);
}

const char *mal_comm_default_name(const char *device)
{
    /* NCCL moves device buffers of a GPU backend where it is built and
     * usable; everything else goes over MPI. */
    const mal_registry_entry *e = mal_registry_first(&registry, moves_device, device);
    return e ? e->name : "mpi";
}
