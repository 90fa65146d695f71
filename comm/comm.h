/* Communication behind one table of operations, in two planes.
 *
 * A mal_comm is a group of ranks (a communicator).  Point-to-point peers and
 * broadcast roots are ranks *within* the communicator.  Backends are chosen
 * by name (the registry below): "mpi" and, in builds with NCCL, "nccl".
 *
 * Control plane: small host messages - plan broadcast, rates and times,
 * barriers, snapshot coordination, agreement on failure, and the bootstrap
 * of other communicators (NCCL's unique id).  Buffers are host memory.  MPI
 * serves it in every backend (a backend's table reuses the MPI functions).
 *
 * Data plane: device buffers of a kernel instance (kernels.h) - the TP
 * all-reduce, pipeline sends and receives, the data-parallel reduction over
 * member lists, online-migration transfers.  The chosen backend serves it.
 * The MPI data plane works on the buffers in place when the instance's
 * buffers are host-addressable (the cpu backend: zero copies, as before the
 * planes were split) and otherwise stages every transfer through pinned host
 * buffers of the instance (mal_kern_host_alloc: pooled, pinned once and
 * reused), which is what a GPU over MPI needs; the reductions are done by
 * the backend (on the host for MPI, on the device for NCCL), never by the
 * caller.  The NCCL data plane (comm/comm_nccl.c) works on buffers of a GPU
 * instance only (its registry entry names the device), device to device,
 * never through the host.
 *
 * Ordering of the data plane against the kernel queue - one rule for every
 * backend:
 *  1. An operation reads or writes a device buffer only after all kernel
 *     work queued on the instance before the call has completed: the MPI
 *     backend waits for the queue (mal_kern_queue_wait) before it copies or
 *     passes the buffer to MPI; NCCL makes its stream wait for an event
 *     recorded on the kernel queue (mal_kern_native_queue).  The caller
 *     never synchronises for the data plane.
 *  2. A collective (dp_allreduce, dp_allreduce_list) returns with its
 *     result ordered before any kernel work queued after it: the MPI
 *     backend has written it (or queued its copy back on the kernel queue);
 *     NCCL makes the kernel queue wait for an event after the collective.
 *  3. A receive's buffer may be used by kernels queued after the wait
 *     (dp_waitall) that completes it returns, not before; a send's buffer
 *     must not be written until that wait.  Completion is the same event
 *     ordering as in 2.
 *
 * The NCCL backend's streams and events, in order (comm_nccl.c):
 *  - every NCCL communicator (one per mal_comm, one per distinct member
 *    list) has a stream of its own; NCCL kernels never run on the kernel
 *    queue, so a pipeline transfer does not wait behind compute it does not
 *    depend on;
 *  - post (any op): event `ready` recorded on the kernel queue, the
 *    communicator's stream waits for it (rule 1; no host wait);
 *  - dp_allreduce (the TP all-reduce) is stream-ordered: two timing events
 *    around the NCCL call on the communicator's stream, then event `done`
 *    recorded there and the kernel queue made to wait for it (rule 2), and
 *    the call returns: the host never waits for the reduction, nor for the
 *    kernels before it, and the GPU goes from the layer's kernels to the
 *    reduction to the next kernels without the host in between.  The host
 *    waits only where it must read: dp_elapsed (below), which the trainer
 *    calls where it waits for the kernel queue anyway, polls the last
 *    `done` with the timeout, and a communicator's destroy does the same;
 *  - dp_allreduce_list (blocking): the same launch, then the host polls
 *    `done` (sleeping between polls) until it completes, NCCL reports an
 *    error, or the timeout passes;
 *  - sends are *held* (nothing launched) until the process's next receive,
 *    wait or collective on any NCCL communicator; then every held send and
 *    the receives of a group are launched together, one NCCL group per
 *    communicator.  NCCL runs a communicator's operations in launch order,
 *    and a send of a large message cannot finish before its receiver
 *    launches the receive; launching sends eagerly would let two ranks that
 *    exchange in opposite orders (1F1B: stage 0 sends activation 1 while
 *    stage 1 sends gradient 0) block each other's stream for good.
 *    Each request has an event recorded after its launch;
 *  - dp_waitall launches what is held, polls each request's event (timeout
 *    as above) and makes the kernel queue wait for it (rule 3).
 *  - non-blocking member-list all-reduce (dp_iallreduce_list): post =
 *    `ready` on the kernel queue, the list's stream waits for it (rule 1),
 *    ncclAllReduce on the list's stream, then a `done` event of the
 *    request's own recorded there; nothing waits on the host.  The kernel
 *    queue goes on with the backward pass meanwhile: the reduction runs on
 *    its own stream, concurrently, on the bucket's region of the packing
 *    buffer, which no kernel touches until the wait.  dp_waitall polls
 *    `done` (timeout and abort as above) and makes the kernel queue wait
 *    for it (rule 3), so the unpacking kernels queued after the wait read
 *    the result.  dp_progress has nothing to do on NCCL (the GPU runs what
 *    was launched; held sends stay held, for the reason above).  Lists
 *    posted in one global order by all their members also keep NCCL's own
 *    rule: kernels of different communicators launched in different orders
 *    on different ranks can wait on each other on the GPU;
 *  - a list's communicator is created by the first reduction on that list
 *    (blocking, collective over the members): a caller that posts
 *    non-blocking reductions in the middle of other work makes the lists it
 *    will use first, with a blocking reduction of count 0 at a point where
 *    every member can reach it (the gradient sync does so before the first
 *    backward pass).
 * The watchdog of a stream-ordered all-reduce is its host wait: a peer that
 * died or hung leaves the reduction (and the kernel queue behind it)
 * unfinished, dp_elapsed gives up after the timeout and aborts the
 * communicator (its kernels stop, the kernel queue drains), and returns
 * MAL_EDEVICE; a caller that waits for the kernel queue after stream-ordered
 * all-reduces calls dp_elapsed first, or a dead peer leaves it waiting
 * without end.  An NCCL error reported by the time of a later call on the
 * communicator fails that call.
 * Consequences for callers: complete data-plane sends (dp_waitall) before
 * a control-plane operation that their receiver may be waiting behind
 * (held sends are launched by data-plane calls only); messages between two
 * ranks match in the order they are posted, whatever their tags (NCCL has
 * none); the NCCL backend cannot see a receive of a different size than
 * its send (MPI reports it).  Each blocking operation but dp_allreduce is
 * complete on the host when its call (collectives) or wait (point to
 * point) returns; dp_allreduce is, on NCCL, once dp_elapsed returns.  The
 * timeout needs a host that waits: for a non-blocking reduction that is
 * its dp_waitall, for dp_allreduce dp_elapsed.
 *
 * Non-blocking member-list all-reduce (dp_iallreduce_list, dp_progress,
 * dp_waitall), the rules for every backend:
 *  - a rank's outstanding non-blocking list reductions on one communicator
 *    run in the order it posted them, one after the other (MPI: a FIFO per
 *    communicator, only its head has messages in flight; NCCL: launch
 *    order on the list's stream, and the lists posted in one order);
 *  - members post the lists they share in one global order - for the
 *    gradient sync, its bucket order, which every rank derives from the
 *    plan alone.  That order is total over all buckets of the step, so no
 *    cycle of waits can form across lists: a rank runs its queue serially
 *    and waits for bucket X only while X is its head, i.e. only behind
 *    buckets earlier than X in the total order; the earliest unfinished
 *    bucket of the whole job is at the head of every member's queue once
 *    each member has posted it, so it finishes, and by induction so does
 *    every bucket.  (Posting is never held back by a reduction: a rank
 *    posts as its backward pass finishes the bucket's gradients and only
 *    progresses - never waits - until it has posted everything);
 *  - no blocking list reduction on c while non-blocking ones are
 *    outstanding there (on MPI it would queue behind them; on NCCL it
 *    would break the global order), and a distinct tag for the
 *    non-blocking ones where both kinds are used on one communicator;
 *  - the buffer is not read or written by the caller (host or kernels)
 *    from the post until the wait returns;
 *  - the result is bitwise the same on every member, and the same bits as
 *    the blocking dp_allreduce_list of the same buffer gives (MPI: the
 *    blocking one is the non-blocking one waited for; NCCL: the same
 *    ncclAllReduce on the same communicator);
 *  - progress happens only inside dp_iallreduce_list, dp_progress and
 *    dp_waitall calls on c (MPI runs no thread of its own here), so a
 *    caller with long work between its posts calls dp_progress now and
 *    then; dp_progress never waits;
 *  - every request is waited for before c is destroyed (a request left
 *    behind fails at its wait).
 *
 * Failures (NCCL): communicators are created non-blocking
 * (ncclConfig_t.blocking = 0) and every wait - creation included - gives
 * up after $MALLEUS_NCCL_TIMEOUT seconds (default 600): the communicator
 * is aborted (ncclCommAbort, so no kernel is left spinning on the GPU),
 * the operation returns MAL_EDEVICE with a message naming the operation,
 * the communicator's size and the peer or members, and the trainer's fatal
 * path ends the job with status 1, after which jobs/adaptive-loop.sh
 * resumes from the newest snapshot.  An aborted communicator refuses every
 * later operation (MAL_EDEVICE).  abort() aborts every NCCL communicator
 * of the process before MPI_Abort.
 *
 * Waiting never busy-polls: on an oversubscribed machine MPICH's blocking
 * calls spin and starve the very rank they wait for (ENVIRONMENT.md), so
 * every wait tests the request and sleeps ~1 us between tests.
 *
 * Results of all-reduce are bitwise identical on every member (replicas and
 * TP ranks must stay identical): the MPI backend computes every element on
 * exactly one rank (reduce + broadcast for small buffers, reduce-scatter +
 * all-gather for large ones; reduce-scatter + all-gather around a ring of
 * the list for member lists).
 *
 * Further contract details:
 *  - wait frees the request even when it fails; wait(NULL) returns 0;
 *  - a receive must get exactly the requested size: a shorter message is
 *    MAL_EMISMATCH, a longer one MAL_EMPI;
 *  - bad peers, roots, negative tags and control-plane messages over
 *    INT_MAX bytes are MAL_EINVAL (the data plane takes any size);
 *  - abort ends the whole job (MPI_Abort on the world);
 *  - mal_comm_mpi_world() sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
 *    MPI_COMM_SELF (MPICH reports request errors there).
 */
#ifndef MAL_COMM_H
#define MAL_COMM_H

#include <stddef.h>

#include "base/registry.h"
#include "kernels/kernels.h"

typedef struct mal_comm mal_comm;
typedef struct mal_comm_req mal_comm_req;
typedef struct mal_comm_ops mal_comm_ops;

/* Reductions of the data plane. */
typedef enum { MAL_OP_SUM = 0, MAL_OP_MAX = 1 } mal_reduce_op;

/* Member-list collectives with a region per member (dp_ilist): the two
 * halves of an all-reduce, as the sharded optimizer uses them. */
typedef enum { MAL_LIST_REDUCE_SCATTER = 1, MAL_LIST_ALLGATHER = 2 } mal_list_coll;

struct mal_comm_ops {
    const char *name; /* "mpi", "nccl" */

    /* ---- control plane: communicators and small host messages; MPI
     * serves these whatever the data plane. */
    /* Collective over `parent`: ranks with the same color form a new
     * communicator (of the parent's backend), ordered by key then parent
     * rank.  color < 0: *out = NULL. */
    int (*split)(mal_comm *parent, int color, int key, mal_comm **out);
    /* Collective over the listed parent ranks only (others need not call):
     * a communicator of exactly those ranks in that order. */
    int (*create_group)(mal_comm *parent, const int *ranks, int n, mal_comm **out);
    void (*destroy)(mal_comm *c);
    /* Collective: in-place sum (host memory). */
    int (*allreduce_f32)(mal_comm *c, float *buf, size_t n);
    int (*allreduce_f64)(mal_comm *c, double *buf, size_t n);
    /* Collective: max over doubles (in place). */
    int (*allreduce_max_f64)(mal_comm *c, double *buf, size_t n);
    /* Collective: in-place minimum of n ints, the same on every rank. */
    int (*allreduce_min_int)(mal_comm *c, int *buf, size_t n);
    /* Collective. */
    int (*broadcast)(mal_comm *c, void *buf, size_t bytes, int root);
    /* Collective: gather `bytes` from every rank into recv (rank order) at root. */
    int (*gather)(mal_comm *c, const void *send, void *recv, size_t bytes, int root);
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
    int (*barrier)(mal_comm *c);
    /* Local: post a send / receive of host memory; the request is owned by
     * the caller until waited on (wait frees it). */
    int (*isend)(mal_comm *c, const void *buf, size_t bytes, int peer, int tag, mal_comm_req **req);
    int (*irecv)(mal_comm *c, void *buf, size_t bytes, int peer, int tag, mal_comm_req **req);
    /* Local: complete a request of either plane. */
    int (*wait)(mal_comm_req *req);
    /* Local: terminate every rank of the job (last resort after an error
     * that leaves peers blocked). */
    void (*abort)(mal_comm *c, int code);

    /* ---- data plane: device buffers of a kernel instance (TP all-reduce,
     * pipeline send/receive, the data-parallel reduction over member
     * lists, migration transfers).  The chosen backend serves these (MPI
     * or NCCL); ordering against the kernel queue: see the top of the
     * file. */
    /* Collective: in-place sum of `count` elements of type dt in device
     * buffer buf; bitwise the same result on every member. */
    int (*dp_allreduce)(mal_comm *c, mal_kern k, void *buf, size_t count, mal_dtype dt);
    /* Collective over the `n` listed ranks of c (others need not call; the
     * calling rank must be listed): in-place reduction (op) of `count`
     * elements of device buffer buf over the members, the combination done
     * by the backend, bitwise the same on every member and independent of
     * anything but the list's order.  Members must call their lists in the
     * same order (messages between two ranks on `tag` match in the order
     * posted).  MPI creates no communicator of the members (a ring on c);
     * NCCL creates one per distinct list the first time the list is used
     * (bootstrapped over c's control plane with `tag`) and keeps it until c
     * is destroyed or dp_trim lets it go (the least recently used past a
     * cap), so a list seen before - the same replicas after an online plan
     * change - costs nothing. */
    int (*dp_allreduce_list)(mal_comm *c, mal_kern k, const int *members, int n, int tag,
                             void *buf, size_t count, mal_dtype dt, mal_reduce_op op);
    /* Local (each member's part of the collective of the blocking one):
     * post the same reduction without waiting; *req (owned by the caller
     * until dp_waitall frees it; NULL when there is nothing to combine: one
     * member or count 0) completes it.  Ordering, progress and the rules
     * that keep members from deadlocking: the top of the file. */
    int (*dp_iallreduce_list)(mal_comm *c, mal_kern k, const int *members, int n, int tag,
                              void *buf, size_t count, mal_dtype dt, mal_reduce_op op,
                              mal_comm_req **req);
    /* Local (each member's part of a collective over the `n` listed ranks
     * of c, as dp_iallreduce_list): `buf` (device) holds n regions back to
     * back, region i of counts[i] elements of dt being member i's (counts
     * the same on every member; any may be 0).
     *  - MAL_LIST_REDUCE_SCATTER (fp32, sum): member i ends with the sum
     *    over the members of their region i in its region i (the sharded
     *    optimizer's gradient: each owner receives its pieces summed); the
     *    rest of buf is undefined afterwards.
     *  - MAL_LIST_ALLGATHER (any dt): every member ends with member i's
     *    region i in its region i, for every i (each owner's updated
     *    weights to every holder).
     * The same queue, ordering, progress and deadlock rules as
     * dp_iallreduce_list (one FIFO per communicator shared with it, waited
     * for by dp_waitall); bitwise the same result on every run.  How a
     * region's sum is combined: MPI, small buffers (<= 64 KiB in all)
     * straight from every member to the region's owner, added in list
     * order (the bits the small all-reduce gives), larger ones around the
     * ring of the list whose blocks are the regions; NCCL, one ncclReduce
     * (ncclBroadcast) per region rooted at its member, in one group.
     * The buffer is read as it stands when the call is posted (in kernel
     * queue order) and written at the wait: a second collective on the
     * same buffer is posted after the first was waited for.
     * *req NULL when there is nothing to exchange. */
    int (*dp_ilist)(mal_comm *c, mal_kern k, mal_list_coll kind, const int *members, int n,
                    int tag, void *buf, const size_t *counts, mal_dtype dt, mal_comm_req **req);
    /* Local: advance the non-blocking reductions outstanding on c (MPI:
     * test the head's messages, combine, post its next step, start the
     * next reduction); never waits.  0, or the first error met (the failed
     * request reports it again at its wait). */
    int (*dp_progress)(mal_comm *c);
    /* Local: post a send / receive of `bytes` of device buffer buf (any
     * size); the request is owned by the caller until waited on. */
    int (*dp_isend)(mal_comm *c, mal_kern k, const void *buf, size_t bytes, int peer, int tag,
                    mal_comm_req **req);
    int (*dp_irecv)(mal_comm *c, mal_kern k, void *buf, size_t bytes, int peer, int tag,
                    mal_comm_req **req);
    /* Local: sends and receives posted between group_start and group_end
     * progress together (NCCL's ncclGroupStart/End: a peer pair may post
     * both directions without deadlock); group_end returns once they are
     * posted, not complete. */
    int (*dp_group_start)(mal_comm *c);
    int (*dp_group_end)(mal_comm *c);
    /* Local: wait for n requests (NULL entries are skipped) of either
     * plane; every request is freed whatever the outcome; the first error
     * is returned. */
    int (*dp_waitall)(mal_comm *c, int n, mal_comm_req **reqs);

    /* ---- data-plane state of a communicator (NULL where the data plane
     * needs none, as MPI's) */
    /* Collective over the new communicator c: set up c->dp (NCCL: a
     * communicator of c's ranks, its id broadcast over c's control plane).
     * Called by split, create_group and mal_comm_dup once c's control plane
     * exists; on failure c is destroyed and the error returned. */
    int (*dp_attach)(mal_comm *c);
    /* Local: free c->dp (called by destroy when c->dp is set). */
    void (*dp_detach)(mal_comm *c);

    /* ---- time and resources of the data plane */
    /* Local: *seconds = the time the all-reduces (dp_allreduce) on c took
     * since the previous call (or since c was made), and the count starts
     * again.  What that time is: MPI, the host time of each all-reduce
     * from the moment the kernel queue had passed everything queued before
     * it (its staging, MPI, the copy back), so not the compute it waited
     * for; NCCL, device time between two events around each reduction on
     * the communicator's stream: from the moment its stream reached it
     * (the kernels before it done) to its end, waiting for the slowest
     * member included.  NCCL: the host first waits (polling, with the
     * timeout) for the last all-reduce queued on c; on timeout or an NCCL
     * error the communicator is aborted and MAL_EDEVICE returned (comm.h,
     * "Failures").  Call it where the host waits for the kernel queue
     * anyway, and before that wait. */
    int (*dp_elapsed)(mal_comm *c, double *seconds);
    /* Collective over c, at a point where no data-plane operation on c is
     * in flight (every request waited for): let go of data-plane resources
     * the backend keeps for c that were not used lately.  NCCL: the
     * member-list communicators of c beyond the cap
     * ($MALLEUS_NCCL_MAX_LISTS, default 32), least recently used first
     * (comm_nccl.c says how the members agree); MPI: nothing.  MAL_EINVAL
     * while an operation is in flight. */
    int (*dp_trim)(mal_comm *c);
};

struct mal_comm {
    const mal_comm_ops *ops;
    int rank, size;
    int *world_ranks; /* [size]: world rank of each member */
    void *impl;       /* control-plane state (the MPI_Comm) */
    void *dp;         /* data-plane state (NCCL's communicators); NULL for MPI */
};

/* The MPI backend.  MPI must be initialised first (mal_comm_init, or the
 * caller's own MPI_Init).
 * Local: wrap MPI_COMM_WORLD (duplicated, so library traffic never matches
 * the caller's). */
extern const mal_comm_ops mal_comm_mpi_ops;
int mal_comm_mpi_world(mal_comm **out);
/* Collective over `parent`: its duplicate (MPI_Comm_idup) with the data
 * plane `ops` (NULL: the parent's).  mal_comm_dup resolves a backend's name
 * and calls it. */
int mal_comm_mpi_dup(mal_comm *parent, const mal_comm_ops *ops, mal_comm **out);

/* Collective over `parent`: a communicator of the same ranks in the same
 * order whose backend (the data plane) is the one called `backend` (NULL:
 * the parent's), for a component's own traffic; communicators split or
 * created from it inherit the backend.  Errors as mal_comm_lookup. */
int mal_comm_dup(mal_comm *parent, const char *backend, mal_comm **out);

/* Collective over the job (every process calls it once, first): start the
 * communication layer (MPI_Init with the program's arguments) and return
 * the communicator of all processes in *world, owned by the caller until
 * mal_comm_finalize.  Programs call this instead of MPI themselves.  Only
 * the thread that called it may use the layer (mal_comm_init_threads). */
int mal_comm_init(int *argc, char ***argv, mal_comm **world);

/* Which threads of a process may call the control plane. */
typedef enum {
    /* only the thread that started the layer (MPI_THREAD_SINGLE .. SERIALIZED) */
    MAL_COMM_THREADS_ONE = 0,
    /* any thread, at the same time as the others, each on communicators no
     * other thread uses at that time (MPI_THREAD_MULTIPLE): e.g. a
     * background snapshot writer on a duplicate (mal_comm_dup) of the
     * world while the step loop runs on its own */
    MAL_COMM_THREADS_MANY = 1,
} mal_comm_threads;

/* Collective over the job: mal_comm_init asking MPI for the thread level
 * `want` (MPI_Init_thread).  MPI may grant less (MPICH 4.0.2 as Debian
 * builds it grants MPI_THREAD_MULTIPLE): callers check
 * mal_comm_thread_level() before starting threads that communicate.  If
 * the layer was already started (the caller's own MPI_Init), its level
 * stays what it is. */
int mal_comm_init_threads(int *argc, char ***argv, mal_comm_threads want, mal_comm **world);

/* Local.  The thread level the running layer provides (MPI_Query_thread;
 * MAL_COMM_THREADS_ONE when it is not running), and MPI's name for it
 * ("MPI_THREAD_MULTIPLE", ...; "MPI not running"). */
mal_comm_threads mal_comm_thread_level(void);
const char *mal_comm_thread_level_name(void);
/* Collective: destroy `world` (may be NULL, e.g. after a failed init) and
 * shut the communication layer down if mal_comm_init started it.  With the
 * peer watch running (watch.h), MPI_Finalize is watched, then this rank
 * says goodbye to its peers and the watch stops: the normal end only. */
void mal_comm_finalize(mal_comm *world);

/* ---- registry ---------------------------------------------------------- */

/* One communication backend by name (comm/registry.c). */
typedef struct {
    /* first (base/registry.h): reg.name "mpi", "nccl"; reg.probe 0 when
     * usable on this machine, else MAL_E* with the reason recorded */
    mal_registry_entry reg;
    const char *what; /* one line for --help */
    const mal_comm_ops *ops;
    /* the kernel backend whose buffers its data plane moves ("cuda" for
     * NCCL); NULL: any (MPI stages what the host cannot address) */
    const char *device;
} mal_comm_backend;

/* Local.  The backend called `name`: 0, or MAL_EINVAL for a name no build
 * knows, MAL_ENOTSUP for one this build lacks, MAL_EDEVICE for one unusable
 * here, with a message that lists what this build has. */
int mal_comm_lookup(const char *name, const mal_comm_backend **out);

/* Local.  0 when backend b's data plane can move buffers of kernel
 * backend `device` (by name), else MAL_EINVAL with a message naming both. */
int mal_comm_check_device(const mal_comm_backend *b, const char *device);

/* Local.  The default backend for kernel backend `device`: "nccl" for a
 * GPU backend where NCCL is built and usable, else "mpi".  (Ranks sharing
 * one GPU need "mpi": NCCL before 2.30 refuses two ranks on one GPU.) */
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


/* Data plane (device buffers of kernel instance k). */
static inline int mal_comm_dp_allreduce(mal_comm *c, mal_kern k, void *buf, size_t count,
                                        mal_dtype dt)
{
    return c->ops->dp_allreduce(c, k, buf, count, dt);
}
static inline int mal_comm_dp_allreduce_list(mal_comm *c, mal_kern k, const int *members, int n,
                                             int tag, void *buf, size_t count, mal_dtype dt,
                                             mal_reduce_op op)
{
    return c->ops->dp_allreduce_list(c, k, members, n, tag, buf, count, dt, op);
}
static inline int mal_comm_dp_iallreduce_list(mal_comm *c, mal_kern k, const int *members, int n,
                                              int tag, void *buf, size_t count, mal_dtype dt,
                                              mal_reduce_op op, mal_comm_req **req)
{
    return c->ops->dp_iallreduce_list(c, k, members, n, tag, buf, count, dt, op, req);
}
static inline int mal_comm_dp_progress(mal_comm *c) { return c->ops->dp_progress(c); }
static inline int mal_comm_dp_ilist(mal_comm *c, mal_kern k, mal_list_coll kind,
                                    const int *members, int n, int tag, void *buf,
                                    const size_t *counts, mal_dtype dt, mal_comm_req **req)
{
    return c->ops->dp_ilist(c, k, kind, members, n, tag, buf, counts, dt, req);
}
static inline int mal_comm_dp_isend(mal_comm *c, mal_kern k, const void *buf, size_t bytes,
                                    int peer, int tag, mal_comm_req **req)
{
    return c->ops->dp_isend(c, k, buf, bytes, peer, tag, req);
}
static inline int mal_comm_dp_irecv(mal_comm *c, mal_kern k, void *buf, size_t bytes, int peer,
                                    int tag, mal_comm_req **req)
{
    return c->ops->dp_irecv(c, k, buf, bytes, peer, tag, req);
}
static inline int mal_comm_dp_group_start(mal_comm *c) { return c->ops->dp_group_start(c); }
static inline int mal_comm_dp_group_end(mal_comm *c) { return c->ops->dp_group_end(c); }
static inline int mal_comm_dp_waitall(mal_comm *c, int n, mal_comm_req **reqs)
{
    return c->ops->dp_waitall(c, n, reqs);
}
static inline int mal_comm_dp_elapsed(mal_comm *c, double *seconds)
{
    return c->ops->dp_elapsed(c, seconds);
}
static inline int mal_comm_dp_trim(mal_comm *c)
{
    return c->ops->dp_trim(c);
}

#endif /* MAL_COMM_H */
