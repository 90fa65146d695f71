/* The communication backends of this build by name (comm.h), one entry per
 * backend, each guarded by the configure macro that builds it.  The name
 * picks the data plane; the control plane is MPI whichever is chosen. */
#include <stdio.h>
#include <string.h>

#include "base/mal.h"
#include "comm.h"

static int mpi_probe(void)
{
    return 0;
}

static const mal_comm_backend comm_mpi = {
    .name = "mpi",
    .what = "MPI for both planes (device buffers staged through pinned host memory)",
    .probe = mpi_probe,
    .ops = &mal_comm_mpi_ops,
    .device = NULL,
};

#ifdef HAVE_NCCL
extern const mal_comm_backend mal_comm_backend_nccl; /* comm/comm_nccl.c */
#endif

const mal_comm_backend *const mal_comm_backends[] = {
#ifdef HAVE_NCCL
    &mal_comm_backend_nccl,
#endif
    &comm_mpi,
    NULL,
};

/* Backends some build has, for the message when this one lacks them. */
static const struct {
    const char *name, *needs;
} known[] = {
    {"nccl", "a build with CUDA and NCCL (configure --with-cuda --with-nccl) and a GPU"},
};

void mal_comm_names(char *buf, size_t len, const char *sep)
{
    size_t n = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; mal_comm_backends[i] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? sep : "", mal_comm_backends[i]->name);
}

int mal_comm_lookup(const char *name, const mal_comm_backend **out)
{
    char names[256];
    *out = NULL;
    mal_comm_names(names, sizeof names, ", ");
    for (int i = 0; mal_comm_backends[i]; i++)
        if (!strcmp(mal_comm_backends[i]->name, name)) {
            int rc = mal_comm_backends[i]->probe();
            if (rc) {
                /* the probe's reason, copied: MAL_ERR writes the buffer
                 * mal_errmsg() points at */
                char why[512];
                snprintf(why, sizeof why, "%s", mal_errmsg());
                /* a bad setting is the user's to fix (MAL_EINVAL); anything
                 * else means no device here */
                return MAL_ERR(rc == MAL_EINVAL ? MAL_EINVAL : MAL_EDEVICE,
                               "comm backend '%s' cannot be used on this machine: %s", name, why);
            }
            *out = mal_comm_backends[i];
            return 0;
        }
    for (size_t i = 0; i < MAL_ARRAY_SIZE(known); i++)
        if (!strcmp(known[i].name, name))
            return MAL_ERR(MAL_ENOTSUP,
                           "comm backend '%s' is not compiled into this build (it needs %s); this "
                           "build has: %s",
                           name, known[i].needs, names);
    return MAL_ERR(MAL_EINVAL, "unknown comm backend '%s': this build has %s", name, names);
}

int mal_comm_check_device(const mal_comm_backend *b, const char *device)
{
    if (!b->device || (device && !strcmp(b->device, device))) return 0;
    return MAL_ERR(MAL_EINVAL,
                   "comm backend '%s' moves buffers of the '%s' device, not of '%s': use "
                   "--device %s, or --comm mpi",
                   b->name, b->device, device ? device : "(none)", b->device);
}

const char *mal_comm_default_name(const char *device)
{
    /* NCCL moves device buffers of a GPU backend; everything else goes
     * over MPI. */
    const mal_comm_backend *b;
    if (device && strcmp(device, "cuda") == 0 && mal_comm_lookup("nccl", &b) == 0) return "nccl";
    return "mpi";
}
