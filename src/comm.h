/* Communication behind one table of operations.
 *
 * A mal_comm is a group of ranks (a communicator).  Backends: MPI (CPU
 * buffers) now; NCCL (device buffers, with MPI carrying the control plane)
 * later, behind the same table.  Point-to-point peers and broadcast roots are
 * ranks *within* the communicator.
 *
 * Waiting never busy-polls: on an oversubscribed machine MPICH's blocking
 * calls spin and starve the very rank they wait for (ENVIRONMENT.md), so
 * every wait tests the request and sleeps ~1 us between tests.
 *
 * Results of all-reduce are bitwise identical on every member (replicas and
 * TP ranks must stay identical): the MPI backend computes every element on
 * exactly one rank (reduce + broadcast for small buffers, reduce-scatter +
 * all-gather for large ones).
 *
 * Further contract details:
 *  - wait frees the request even when it fails; wait(NULL) returns 0;
 *  - a receive must get exactly the requested size: a shorter message is
 *    MAL_EMISMATCH, a longer one MAL_EMPI;
 *  - bad peers, roots, negative tags and messages over INT_MAX bytes are
 *    MAL_EINVAL;
 *  - abort ends the whole job (MPI_Abort on the world);
 *  - mal_comm_mpi_world() sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
 *    MPI_COMM_SELF (MPICH reports request errors there), so code that calls
 *    MPI directly on the world must check return codes.
 */
#ifndef MAL_COMM_H
#define MAL_COMM_H

#include <stddef.h>

typedef struct mal_comm mal_comm;
typedef struct mal_comm_req mal_comm_req;
typedef struct mal_comm_ops mal_comm_ops;

struct mal_comm_ops {
    const char *name; /* "mpi", "nccl" */
    /* Collective over `parent`: ranks with the same color form a new
     * communicator, ordered by key then parent rank.  color < 0: *out = NULL. */
    int (*split)(mal_comm *parent, int color, int key, mal_comm **out);
    /* Collective over the listed parent ranks only (others need not call):
     * a communicator of exactly those ranks in that order. */
    int (*create_group)(mal_comm *parent, const int *ranks, int n, mal_comm **out);
    void (*destroy)(mal_comm *c);
    /* Collective: in-place sum. */
    int (*allreduce_f32)(mal_comm *c, float *buf, size_t n);
    int (*allreduce_f64)(mal_comm *c, double *buf, size_t n);
    /* Collective: max over doubles (in place). */
    int (*allreduce_max_f64)(mal_comm *c, double *buf, size_t n);
    /* Collective. */
    int (*broadcast)(mal_comm *c, void *buf, size_t bytes, int root);
    /* Collective: gather `bytes` from every rank into recv (rank order) at root. */
    int (*gather)(mal_comm *c, const void *send, void *recv, size_t bytes, int root);
    int (*barrier)(mal_comm *c);
    /* Local: post a send / receive; the request is owned by the caller until
     * waited on (wait frees it). */
    int (*isend)(mal_comm *c, const void *buf, size_t bytes, int peer, int tag, mal_comm_req **req);
    int (*irecv)(mal_comm *c, void *buf, size_t bytes, int peer, int tag, mal_comm_req **req);
    int (*wait)(mal_comm_req *req);
    /* Local: terminate every rank of the job (last resort after an error
     * that leaves peers blocked). */
    void (*abort)(mal_comm *c, int code);

    /* ---- control plane: small host messages (snapshot coordination,
     * agreement on failure); MPI serves these whatever the data plane. */
    /* Collective: in-place minimum of n ints, the same on every rank. */
    int (*allreduce_min_int)(mal_comm *c, int *buf, size_t n);
    /* Collective: gather a different number of bytes from every rank at
     * root.  Each rank passes its own `bytes` at `send`.  At root, *out
     * (malloc'ed, the caller frees it) holds them back to back in rank
     * order and counts[0 .. size-1] (caller-owned, read at root only) how
     * many came from each rank; elsewhere *out is NULL.  A total root
     * cannot take -- over INT_MAX bytes (MAL_EINVAL) or out of memory
     * (MAL_ENOMEM) -- fails on every rank alike before any data moves, so
     * no rank is left waiting. */
    int (*gatherv)(mal_comm *c, const void *send, size_t bytes, int root, void **out,
                   size_t *counts);
};

struct mal_comm {
    const mal_comm_ops *ops;
    int rank, size;
    int *world_ranks; /* [size]: world rank of each member */
    void *impl;       /* backend state (e.g. the MPI_Comm) */
};

/* The MPI backend.  MPI must be initialised first (mal_comm_init, or the
 * caller's own MPI_Init).
 * Local: wrap MPI_COMM_WORLD (duplicated, so library traffic never matches
 * the caller's). */
extern const mal_comm_ops mal_comm_mpi_ops;
int mal_comm_mpi_world(mal_comm **out);

/* Collective over the job (every process calls it once, first): start the
 * communication layer (MPI_Init with the program's arguments) and return
 * the communicator of all processes in *world, owned by the caller until
 * mal_comm_finalize.  Programs call this instead of MPI themselves. */
int mal_comm_init(int *argc, char ***argv, mal_comm **world);
/* Collective: destroy `world` (may be NULL, e.g. after a failed init) and
 * shut the communication layer down if mal_comm_init started it. */
void mal_comm_finalize(mal_comm *world);

/* ---- registry ---------------------------------------------------------- */

/* One communication backend by name (src/comm_registry.c). */
typedef struct {
    const char *name; /* "mpi", "nccl" */
    const char *what; /* one line for --help */
    /* 0 when usable on this machine, else MAL_E* with the reason recorded */
    int (*probe)(void);
    const mal_comm_ops *ops;
} mal_comm_backend;

/* Local.  The backends of this build, NULL-terminated. */
extern const mal_comm_backend *const mal_comm_backends[];

/* Local.  The backend called `name`: 0, or MAL_EINVAL for a name no build
 * knows, MAL_ENOTSUP for one this build lacks, MAL_EDEVICE for one unusable
 * here, with a message that lists what this build has. */
int mal_comm_lookup(const char *name, const mal_comm_backend **out);

/* Local.  The default backend for kernel backend `device`: "nccl" for a
 * GPU backend where NCCL is built, else "mpi". */
const char *mal_comm_default_name(const char *device);

/* Local.  "mpi" (the names of this build, `sep` between them) into buf. */
void mal_comm_names(char *buf, size_t len, const char *sep);

/* Call-site wrappers. */
static inline int mal_comm_split(mal_comm *p, int color, int key, mal_comm **out)
{
    return p->ops->split(p, color, key, out);
}
static inline int mal_comm_create_group(mal_comm *p, const int *ranks, int n, mal_comm **out)
{
    return p->ops->create_group(p, ranks, n, out);
}
static inline void mal_comm_destroy(mal_comm *c)
{
    if (c) c->ops->destroy(c);
}
static inline int mal_comm_allreduce_f32(mal_comm *c, float *buf, size_t n)
{
    return c->ops->allreduce_f32(c, buf, n);
}
static inline int mal_comm_allreduce_f64(mal_comm *c, double *buf, size_t n)
{
    return c->ops->allreduce_f64(c, buf, n);
}
static inline int mal_comm_allreduce_max_f64(mal_comm *c, double *buf, size_t n)
{
    return c->ops->allreduce_max_f64(c, buf, n);
}
static inline int mal_comm_broadcast(mal_comm *c, void *buf, size_t bytes, int root)
{
    return c->ops->broadcast(c, buf, bytes, root);
}
static inline int mal_comm_gather(mal_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    return c->ops->gather(c, send, recv, bytes, root);
}
static inline int mal_comm_barrier(mal_comm *c) { return c->ops->barrier(c); }
static inline int mal_comm_isend(mal_comm *c, const void *buf, size_t bytes, int peer, int tag,
                                 mal_comm_req **req)
{
    return c->ops->isend(c, buf, bytes, peer, tag, req);
}
static inline int mal_comm_irecv(mal_comm *c, void *buf, size_t bytes, int peer, int tag,
                                 mal_comm_req **req)
{
    return c->ops->irecv(c, buf, bytes, peer, tag, req);
}
static inline int mal_comm_wait(mal_comm *c, mal_comm_req *req) { return c->ops->wait(req); }
static inline void mal_comm_abort(mal_comm *c, int code) { c->ops->abort(c, code); }
static inline int mal_comm_allreduce_min_int(mal_comm *c, int *buf, size_t n)
{
    return c->ops->allreduce_min_int(c, buf, n);
}
static inline int mal_comm_gatherv(mal_comm *c, const void *send, size_t bytes, int root,
                                   void **out, size_t *counts)
{
    return c->ops->gatherv(c, send, bytes, root, out, counts);
}

#endif /* MAL_COMM_H */
