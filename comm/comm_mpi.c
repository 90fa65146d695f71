/* MPI backend of the communication table (comm.h), both planes: every
 * operation posted non-blocking and completed by the sleeping wait of
 * comm_mpi.h, so that ranks sharing cores do not starve each other.
 *
 * The data plane takes device buffers of a kernel instance.  When the
 * instance's buffers are host-addressable (the cpu backend) MPI works on
 * them in place, after waiting for the instance's queue (comm.h's ordering
 * rule); otherwise every transfer is staged through a pinned host buffer of
 * the instance: device -> host copy, MPI on the host copy, host -> device
 * copy queued on the instance before the operation (or the wait that
 * completes it) returns.  The staging buffers come from the instance's pool
 * (mal_kern_host_alloc): pinned once, reused by every later transfer of
 * their size, never pinned and unpinned per transfer.  The reduction over
 * member lists is the ring of comm_ring.c on the host buffer: this file
 * drives the ring (handing it the raw MPI_Comm), the ring never calls back
 * here, and both convert MPI errors with mpi_err.c (comm_ring.h gives the
 * order).
 *
 * All-reduce results must be bitwise identical on every member.  MPI does
 * not promise that for MPI_Allreduce (an implementation may let each rank
 * add the contributions in its own order), so no all-reduce here lets more
 * than one rank compute an element: small buffers are reduced to rank 0 and
 * broadcast; larger ones are reduce-scattered (each rank computes its own
 * 1/size block) and all-gathered, which moves the same bytes as MPICH's own
 * large all-reduce (measured: 64 MiB on 8 ranks 0.3 s, as MPI_Iallreduce;
 * reduce + broadcast took 0.7-2 s).  Either way one rank computes each
 * element and everyone receives its bits.
 */
#include "comm_mpi.h"

#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/mal.h"
#include "comm_ring.h"
#include "mpi_bytes.h"
#include "mpi_err.h"
#include "watch.h"

/* Tests that succeed while spinning cost nothing extra when a rank has a
 * core of its own (a 2-rank reduction completes in ~1.5 us); past these the
 * wait sleeps between tests. */
enum { SPIN_TESTS = 64 };
/* Asked-for nap between tests: 1 us.  Linux's default timer slack makes it
 * ~50 us in practice, which is what hands the core to the rank we wait for.
 * A test costs ~15-20 us of CPU, so a long wait at that rate still burns a
 * quarter of a core (measured), which on a shared machine is taken from the
 * ranks doing work; once a wait has lasted 1 ms the nap grows to 1/16 of
 * the time waited so far (at most 50 us: large messages progress only when
 * tested, so a longer nap throttles their bandwidth), adding at most ~6% to
 * the wait. */
enum { NAP_NS = 1000, BACKOFF_AFTER_NS = 1000000, NAP_MAX_NS = 50000 };

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Tag of MPI_Comm_create_group.  MPI keeps it apart from point-to-point
 * tags; it only has to be the same on the members, which it always is. */
enum { CREATE_GROUP_TAG = 4242 };

size_t mal_comm_mpi_chunk_bytes = MAL_COMM_MPI_CHUNK_BYTES_DEFAULT;

struct mal_comm_req {
    MPI_Request req;
    MPI_Datatype type; /* what it was posted as (mpi_bytes.h) */
    int is_recv;       /* receives check the size of what arrived */
    size_t bytes;
    int peer, tag;
    /* a staged data-plane transfer: the pinned host copy (given back to
     * the instance's pool at the wait) and, for a receive or a reduction,
     * the device buffer it is copied into */
    mal_kern k;
    void *stage, *dev;
    /* a non-blocking member-list all-reduce (is_list): queued on its
     * communicator (c; NULL once the communicator was destroyed), started
     * when it reaches the head of the queue */
    int is_list, done, err;
    mal_comm *c;
    int *members, n;
    float *host; /* what the ring reduces: dev itself or the staged copy */
    size_t count;
    mal_reduce_op op;
    /* a collective with a region per member (dp_ilist): its kind (0: the
     * all-reduce), the regions' element counts [n] and element size */
    int kind;
    size_t *counts, es;
    mal_ring *ring;
    mal_comm_req *next;
};

typedef struct {
    MPI_Comm comm;
    int *counts, *displs; /* [size]: blocks of the reduce-scatter path */
    void *ring_scratch;   /* host scratch of the member-list reduction, kept */
    size_t ring_scratch_bytes;
    float *widen; /* bf16 all-reduce: its values as floats, kept (grows) */
    size_t widen_n;
    double dp_s; /* time of the all-reduces since the last dp_elapsed */
    /* outstanding member-list reductions, in the order posted; only the
     * head runs (comm.h) */
    mal_comm_req *q_head, **q_tail;
    int q_failed;    /* an earlier reduction failed: the ring's messages no
                      * longer match, so every later one fails too */
    char q_why[512]; /* its message */
} mpi_impl;

static MPI_Comm comm_of(const mal_comm *c)
{
    return ((const mpi_impl *)c->impl)->comm;
}

/* Between the i-th and the next test of a wait that began spinning: the
 * nap schedule above (t0: when the naps began, kept by the caller). */
static void nap_after(long i, int64_t *t0)
{
    if (i < SPIN_TESTS) return;
    int64_t waited = i == SPIN_TESTS ? 0 : now_ns() - *t0;
    if (i == SPIN_TESTS) *t0 = now_ns();
    int64_t nap = waited < BACKOFF_AFTER_NS ? NAP_NS : MAL_MIN(waited / 16, NAP_MAX_NS);
    struct timespec ts = {0, (long)nap};
    nanosleep(&ts, NULL);
}

/* Tests between two looks at the peer watch (watch.h) during one wait: at
 * least ~13 ms apart (a nap is ~50 us), a negligible cost. */
enum { WATCH_EVERY = 256 };

/* The nap after the i-th test, and now and then the peer watch: MAL_EMPI
 * once a peer has been silent for the watch's timeout. */
static int wait_turn(long i, int64_t *t0, const char *what)
{
    nap_after(i, t0);
    return i > SPIN_TESTS && i % WATCH_EVERY == 0 ? mal_comm_watch_check(what) : 0;
}

int mal_mpi_wait(MPI_Request *req, MPI_Status *status, const char *what)
{
    int64_t t0 = 0;
    for (long i = 0;; i++) {
        int done = 0;
        int rc = MPI_Test(req, &done, status);
        if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, what);
        if (done) return 0;
        /* a peer gone: the request can never complete; MPI has no way to
         * take it back, so it is left to the job's end */
        if ((rc = wait_turn(i, &t0, what))) return rc;
    }
}

int mal_mpi_waitall(int n, MPI_Request *reqs, const char *what)
{
    /* One request at a time, not MPI_Testall: a failure then reports its
     * own error code instead of MPI_ERR_IN_STATUS.  Testing one request
     * drives MPI's whole progress engine, so the others advance too. */
    for (int k = 0; k < n; k++) {
        int err = mal_mpi_wait(&reqs[k], MPI_STATUS_IGNORE, what);
        if (err) return err;
    }
    return 0;
}

MPI_Comm mal_comm_mpi_handle(const mal_comm *c)
{
    /* every table built on MAL_COMM_MPI_CONTROL_PLANE has an MPI_Comm */
    if (!c || c->ops->split != mal_comm_mpi_split) return MPI_COMM_NULL;
    return comm_of(c);
}

/* ---- communicators ---------------------------------------------------- */

/* Wrap `comm` (which becomes owned by the new mal_comm) and fill rank, size
 * and world ranks.  Frees `comm` on failure. */
static int wrap_comm(MPI_Comm comm, const mal_comm_ops *ops, mal_comm **out)
{
    int err = 0, rc;
    mal_comm *c = NULL;
    mpi_impl *impl = NULL;
    int *idx = NULL;
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;

    /* Errors must come back to us as codes, not kill the job from inside
     * MPI; explicit rather than relying on inheritance from the parent. */
    if ((rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS) {
        err = MAL_MPI_ERR(rc, "MPI_Comm_set_errhandler");
        goto fail_comm;
    }
    c = calloc(1, sizeof *c);
    impl = calloc(1, sizeof *impl);
    if (!c || !impl) {
        err = MAL_ERR(MAL_ENOMEM, "out of memory creating a communicator");
        goto fail_alloc;
    }
    impl->comm = comm;
    impl->q_tail = &impl->q_head;
    c->ops = ops;
    c->impl = impl;
    if ((rc = MPI_Comm_rank(comm, &c->rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(comm, &c->size)) != MPI_SUCCESS) {
        err = MAL_MPI_ERR(rc, "MPI_Comm_rank/MPI_Comm_size");
        goto fail_alloc;
    }
    c->world_ranks = malloc((size_t)c->size * sizeof *c->world_ranks);
    idx = malloc((size_t)c->size * sizeof *idx);
    impl->counts = malloc((size_t)c->size * sizeof *impl->counts);
    impl->displs = malloc((size_t)c->size * sizeof *impl->displs);
    if (!c->world_ranks || !idx || !impl->counts || !impl->displs) {
        err = MAL_ERR(MAL_ENOMEM, "out of memory for the world ranks of %d members", c->size);
        goto fail_alloc;
    }
    for (int i = 0; i < c->size; i++)
        idx[i] = i;
    if ((rc = MPI_Comm_group(comm, &group)) != MPI_SUCCESS ||
        (rc = MPI_Comm_group(MPI_COMM_WORLD, &world)) != MPI_SUCCESS ||
        (rc = MPI_Group_translate_ranks(group, c->size, idx, world, c->world_ranks)) !=
            MPI_SUCCESS) {
        err = MAL_MPI_ERR(rc, "translating communicator ranks to world ranks");
        goto fail_groups;
    }
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    free(idx);
    /* A backend with a data plane of its own (NCCL) sets it up now, over
     * the control plane just made; every member of the new communicator
     * is here. */
    if (ops->dp_attach && (err = ops->dp_attach(c))) {
        mal_comm_mpi_destroy(c);
        return err;
    }
    *out = c;
    return 0;

fail_groups:
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
fail_alloc:
    free(idx);
    if (c) free(c->world_ranks);
    free(c);
    if (impl) free(impl->counts), free(impl->displs);
    free(impl);
fail_comm:
    MPI_Comm_free(&comm);
    return err;
}

int mal_comm_mpi_world(mal_comm **out)
{
    int init = 0, fin = 0, rc;
    *out = NULL;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return MAL_ERR(MAL_EINVAL,
                       "MPI is %s: the program's main must call MPI_Init before "
                       "mal_comm_mpi_world and MPI_Finalize only after destroying it",
                       fin ? "already finalised" : "not initialised");
    /* The duplicate is a private context: library messages never match the
     * caller's own traffic on MPI_COMM_WORLD.  Idup so that even this
     * waits by sleeping. */
    /* MPICH reports errors found while completing a request (MPI_Test:
     * truncation, a failed collective) through MPI_COMM_WORLD's handler
     * (MPICH 4.0; MPI_COMM_SELF's from 4.1), not the request's
     * communicator, and the default handler kills the job.  So the library
     * gets its errors back as codes only if those two return them too. */
    if ((rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (rc = MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN)) != MPI_SUCCESS)
        return MAL_MPI_ERR(rc, "MPI_Comm_set_errhandler(MPI_COMM_WORLD/SELF)");
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    if ((rc = MPI_Comm_idup(MPI_COMM_WORLD, &dup, &req)) != MPI_SUCCESS)
        return MAL_MPI_ERR(rc, "MPI_Comm_idup(MPI_COMM_WORLD)");
    int err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, "MPI_Comm_idup(MPI_COMM_WORLD)");
    if (err) return err;
    return wrap_comm(dup, &mal_comm_mpi_ops, out);
}

int mal_comm_init_threads(int *argc, char ***argv, mal_comm_threads want, mal_comm **world)
{
    int init = 0, rc, provided = MPI_THREAD_SINGLE;
    *world = NULL;
    MPI_Initialized(&init);
    /* MPI_Init is MPI_Init_thread(MPI_THREAD_SINGLE): the default keeps
     * MPICH's single-threaded fast path (no lock around every call). */
    if (!init) {
        rc = want == MAL_COMM_THREADS_MANY
                 ? MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided)
                 : MPI_Init(argc, argv);
        if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "MPI_Init");
    }
    (void)provided; /* what was granted: mal_comm_thread_level() */
    return mal_comm_mpi_world(world);
}

int mal_comm_init(int *argc, char ***argv, mal_comm **world)
{
    return mal_comm_init_threads(argc, argv, MAL_COMM_THREADS_ONE, world);
}

/* MPI_Query_thread is the level MPI granted, whoever initialised it. */
static int query_thread(void)
{
    int init = 0, fin = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin || MPI_Query_thread(&level) != MPI_SUCCESS) return -1;
    return level;
}

mal_comm_threads mal_comm_thread_level(void)
{
    return query_thread() == MPI_THREAD_MULTIPLE ? MAL_COMM_THREADS_MANY : MAL_COMM_THREADS_ONE;
}

const char *mal_comm_thread_level_name(void)
{
    switch (query_thread()) {
    case MPI_THREAD_SINGLE:
        return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
        return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
        return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
        return "MPI_THREAD_MULTIPLE";
    default:
        return "MPI not running";
    }
}

void mal_comm_finalize(mal_comm *world)
{
    int init = 0, fin = 0;
    mal_comm_destroy(world);
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    /* MPI_Finalize may wait on the peers (MPICH's does, for connections
     * still open): armed, so that a peer that died since the last checked
     * wait ends this rank instead of hanging it.  The goodbye comes after
     * it: a peer that finished is then no longer watched, and one still in
     * MPI_Finalize is. */
    if (init && !fin) {
        mal_comm_watch_arm("MPI_Finalize", "in MPI_Finalize at the end of the job");
        MPI_Finalize();
        mal_comm_watch_disarm();
    }
    mal_comm_watch_stop(1);
}

int mal_comm_mpi_split(mal_comm *parent, int color, int key, mal_comm **out)
{
    MPI_Comm nc = MPI_COMM_NULL;
    *out = NULL;
    /* MPI_Comm_split has no non-blocking form; it spins, but communicators
     * are made at start-up and on re-plans, not per step.  Armed: a peer
     * that dies meanwhile ends this rank (watch.h). */
    mal_comm_watch_arm("MPI_Comm_split", "in MPI_Comm_split for a new communicator");
    int rc = MPI_Comm_split(comm_of(parent), color < 0 ? MPI_UNDEFINED : color, key, &nc);
    mal_comm_watch_disarm();
    if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "MPI_Comm_split");
    if (nc == MPI_COMM_NULL) return 0;
    return wrap_comm(nc, parent->ops, out);
}

int mal_comm_mpi_create_group(mal_comm *parent, const int *ranks, int n, mal_comm **out)
{
    int err = 0, rc, self = 0;
    MPI_Group pg = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    MPI_Comm nc = MPI_COMM_NULL;
    *out = NULL;

    if (n < 1) return MAL_ERR(MAL_EINVAL, "create_group: %d ranks given; list at least one", n);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return MAL_ERR(MAL_EINVAL,
                           "create_group: rank %d (entry %d) is outside the parent "
                           "communicator of %d ranks",
                           ranks[i], i, parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return MAL_ERR(MAL_EINVAL, "create_group: rank %d is listed twice (entries %d, %d)",
                               ranks[i], j, i);
        self |= ranks[i] == parent->rank;
    }
    if (!self)
        return MAL_ERR(MAL_EINVAL,
                       "create_group: calling rank %d is not in the list of %d ranks; only the "
                       "listed ranks may call it",
                       parent->rank, n);

    if ((rc = MPI_Comm_group(comm_of(parent), &pg)) != MPI_SUCCESS ||
        (rc = MPI_Group_incl(pg, n, ranks, &g)) != MPI_SUCCESS) {
        err = MAL_MPI_ERR(rc, "create_group: building the MPI group");
        goto cleanup;
    }
    /* Collective over the group only, which is what the table promises.
     * No non-blocking form either: armed like the split. */
    mal_comm_watch_arm(
        "MPI_Comm_create_group",
        "in MPI_Comm_create_group for a group of the plan (start-up or a plan change)");
    rc = MPI_Comm_create_group(comm_of(parent), g, CREATE_GROUP_TAG, &nc);
    mal_comm_watch_disarm();
    if (rc != MPI_SUCCESS) {
        err = MAL_MPI_ERR(rc, "MPI_Comm_create_group");
        goto cleanup;
    }
    err = wrap_comm(nc, parent->ops, out);

cleanup:
    if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
    if (pg != MPI_GROUP_NULL) MPI_Group_free(&pg);
    return err;
}

void mal_comm_mpi_destroy(mal_comm *c)
{
    mpi_impl *impl = c->impl;
    /* the data plane's state first: it may still use the control plane's
     * communicator (NCCL finalises its communicator) */
    if (c->dp && c->ops->dp_detach) c->ops->dp_detach(c);
    /* reductions nobody waited for (an error path): stopped, and their
     * waits will say why */
    for (mal_comm_req *r = impl ? impl->q_head : NULL, *nx; r; r = nx) {
        nx = r->next;
        mal_comm_ring_free(r->ring);
        r->ring = NULL;
        r->c = NULL;
        r->next = NULL;
        r->done = 1;
    }
    if (impl && impl->comm != MPI_COMM_NULL) MPI_Comm_free(&impl->comm);
    if (impl) free(impl->counts), free(impl->displs), free(impl->ring_scratch), free(impl->widen);
    free(impl);
    free(c->world_ranks);
    free(c);
}

int mal_comm_mpi_dup(mal_comm *parent, const mal_comm_ops *ops, mal_comm **out)
{
    int rc;
    *out = NULL;
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    if ((rc = MPI_Comm_idup(comm_of(parent), &dup, &req)) != MPI_SUCCESS)
        return MAL_MPI_ERR(rc, "MPI_Comm_idup");
    if ((rc = mal_mpi_wait(&req, MPI_STATUS_IGNORE, "MPI_Comm_idup"))) return rc;
    return wrap_comm(dup, ops ? ops : parent->ops, out);
}

/* ---- collectives ------------------------------------------------------ */

/* Elements per MPI call for elements of `esize` bytes (at least 1). */
static size_t chunk_elems(size_t esize)
{
    size_t n = mal_comm_mpi_chunk_bytes / esize;
    if (n > INT_MAX) n = INT_MAX;
    return n ? n : 1;
}

/* One chunk (cnt elements at p) of an in-place all-reduce, computed by
 * rank 0 alone: fewest messages, for small buffers. */
static int reduce_bcast(mal_comm *c, char *p, int cnt, MPI_Datatype type, MPI_Op op,
                        const char *what)
{
    MPI_Comm comm = comm_of(c);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = c->rank == 0 ? MPI_Ireduce(MPI_IN_PLACE, p, cnt, type, op, 0, comm, &req)
                          : MPI_Ireduce(p, NULL, cnt, type, op, 0, comm, &req);
    if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, what);
    int err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, what);
    if (err) return err;
    if ((rc = MPI_Ibcast(p, cnt, type, 0, comm, &req)) != MPI_SUCCESS) return MAL_MPI_ERR(rc, what);
    return mal_mpi_wait(&req, MPI_STATUS_IGNORE, what);
}

/* The same, each rank computing one contiguous block (sizes differ by at
 * most one element) and all-gathering the blocks. */
static int reduce_scatter_allgather(mal_comm *c, char *p, int cnt, MPI_Datatype type, size_t esize,
                                    MPI_Op op, const char *what)
{
    mpi_impl *im = c->impl;
    for (int r = 0; r < c->size; r++) {
        size_t lo = (size_t)cnt * (size_t)r / (size_t)c->size;
        size_t hi = (size_t)cnt * (size_t)(r + 1) / (size_t)c->size;
        im->counts[r] = (int)(hi - lo);
        im->displs[r] = (int)lo;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    /* Not MPI_IN_PLACE: MPICH 4.0.2's in-place Ireduce_scatter trips its own
     * overlapping-memcpy assertion for some counts (seen with 8 ranks and
     * ~76 KB); a separate block buffer avoids that path. */
    size_t mine = (size_t)im->counts[c->rank] * esize;
    char *blk = malloc(mine ? mine : 1);
    if (!blk) return MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
    int rc = MPI_Ireduce_scatter(p, blk, im->counts, type, op, im->comm, &req);
    if (rc != MPI_SUCCESS) {
        free(blk);
        return MAL_MPI_ERR(rc, what);
    }
    int err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, what);
    if (!err) memcpy(p + (size_t)im->displs[c->rank] * esize, blk, mine);
    free(blk);
    if (err) return err;
    rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, im->counts, im->displs, type,
                         im->comm, &req);
    if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, what);
    return mal_mpi_wait(&req, MPI_STATUS_IGNORE, what);
}

/* In-place all-reduce (see the top of the file), chunk by chunk. */
static int allreduce(mal_comm *c, void *buf, size_t n, MPI_Datatype type, size_t esize, MPI_Op op,
                     const char *what)
{
    if (c->size == 1 || n == 0) return 0;
    size_t step = chunk_elems(esize);
    for (size_t off = 0; off < n; off += step) {
        int cnt = (int)MAL_MIN(step, n - off);
        char *p = (char *)buf + off * esize;
        int err = (size_t)cnt * esize < MAL_COMM_MPI_SMALL_BYTES
                      ? reduce_bcast(c, p, cnt, type, op, what)
                      : reduce_scatter_allgather(c, p, cnt, type, esize, op, what);
        if (err) return err;
    }
    return 0;
}

int mal_comm_mpi_allreduce_f32(mal_comm *c, float *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_FLOAT, sizeof *buf, MPI_SUM, "all-reduce (sum, float)");
}

int mal_comm_mpi_allreduce_f64(mal_comm *c, double *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_DOUBLE, sizeof *buf, MPI_SUM, "all-reduce (sum, double)");
}

/* Max goes the same way: with NaNs or signed zeros the result of a max can
 * depend on the order of comparisons too. */
int mal_comm_mpi_allreduce_max_f64(mal_comm *c, double *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_DOUBLE, sizeof *buf, MPI_MAX, "all-reduce (max, double)");
}

static int check_root(const mal_comm *c, int root, const char *what)
{
    if (root < 0 || root >= c->size)
        return MAL_ERR(MAL_EINVAL, "%s: root %d is not a rank of this communicator of %d ranks",
                       what, root, c->size);
    return 0;
}

int mal_comm_mpi_broadcast(mal_comm *c, void *buf, size_t bytes, int root)
{
    int err = check_root(c, root, "broadcast");
    if (err) return err;
    if (c->size == 1 || bytes == 0) return 0;
    size_t step = chunk_elems(1);
    for (size_t off = 0; off < bytes; off += step) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Ibcast((char *)buf + off, (int)MAL_MIN(step, bytes - off), MPI_BYTE, root,
                            comm_of(c), &req);
        if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "broadcast");
        if ((err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, "broadcast"))) return err;
    }
    return 0;
}

int mal_comm_mpi_gather(mal_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    int err = check_root(c, root, "gather");
    if (err) return err;
    if (bytes > INT_MAX)
        return MAL_ERR(MAL_EINVAL,
                       "gather: %zu bytes per rank is more than one MPI call carries (%d); "
                       "gather it in pieces",
                       bytes, INT_MAX);
    if (bytes == 0) return 0;
    if (c->size == 1) {
        if (recv != send) memmove(recv, send, bytes);
        return 0;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Igather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, comm_of(c), &req);
    if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "gather");
    return mal_mpi_wait(&req, MPI_STATUS_IGNORE, "gather");
}

int mal_comm_mpi_barrier(mal_comm *c)
{
    if (c->size == 1) return 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibarrier(comm_of(c), &req);
    if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "barrier");
    return mal_mpi_wait(&req, MPI_STATUS_IGNORE, "barrier");
}

/* ---- control plane ---------------------------------------------------- */

int mal_comm_mpi_allreduce_min_int(mal_comm *c, int *buf, size_t n)
{
    return allreduce(c, buf, n, MPI_INT, sizeof *buf, MPI_MIN, "all-reduce (min, int)");
}

/* Sizes first, then root's verdict on them (a total it cannot take must
 * not leave the others waiting in a gather nobody receives), then the
 * bytes.  The int arrays of the reduce-scatter path carry MPI's counts and
 * displacements: one collective at a time runs on a communicator. */
int mal_comm_mpi_gatherv(mal_comm *c, const void *send, size_t bytes, int root, void **out,
                       size_t *counts)
{
    const char *what = "gather-v";
    int err = check_root(c, root, what);
    *out = NULL;
    if (err) return err;
    mpi_impl *im = c->impl;
    MPI_Comm comm = comm_of(c);
    MPI_Request req = MPI_REQUEST_NULL;
    int len = bytes > INT_MAX ? -1 : (int)bytes, verdict = 0, rc;
    char *all = NULL;
    if ((rc = MPI_Igather(&len, 1, MPI_INT, im->counts, 1, MPI_INT, root, comm, &req)) !=
        MPI_SUCCESS)
        return MAL_MPI_ERR(rc, what);
    if ((err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, what))) return err;
    if (c->rank == root) {
        int64_t total = 0;
        for (int r = 0; r < c->size; r++) {
            if (im->counts[r] < 0 || total + im->counts[r] > INT_MAX) verdict = MAL_EINVAL;
            im->displs[r] = (int)MAL_MIN(total, INT_MAX);
            total += MAL_MAX(im->counts[r], 0);
        }
        if (!verdict && !(all = malloc((size_t)total + 1))) verdict = MAL_ENOMEM;
    }
    if ((rc = MPI_Ibcast(&verdict, 1, MPI_INT, root, comm, &req)) != MPI_SUCCESS) {
        free(all);
        return MAL_MPI_ERR(rc, what);
    }
    if ((err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, what))) {
        free(all);
        return err;
    }
    if (verdict == MAL_EINVAL)
        return MAL_ERR(verdict,
                       "gather-v: the %d ranks' contributions to rank %d add up to more than "
                       "%d bytes (one MPI call); gather them in pieces",
                       c->size, root, INT_MAX);
    if (verdict)
        return MAL_ERR(verdict, "gather-v: rank %d is out of memory for what %d ranks send", root,
                       c->size);
    rc = MPI_Igatherv(send, len, MPI_BYTE, all, im->counts, im->displs, MPI_BYTE, root, comm, &req);
    if (rc != MPI_SUCCESS) err = MAL_MPI_ERR(rc, what);
    if (!err) err = mal_mpi_wait(&req, MPI_STATUS_IGNORE, what);
    if (err) {
        free(all);
        return err;
    }
    if (c->rank == root) {
        for (int r = 0; r < c->size; r++)
            counts[r] = (size_t)im->counts[r];
        *out = all;
    }
    return 0;
}

/* ---- point to point --------------------------------------------------- */

static int post_p2p(mal_comm *c, void *buf, size_t bytes, int peer, int tag, int is_recv,
                    mal_comm_req **out)
{
    const char *what = is_recv ? "irecv" : "isend";
    *out = NULL;
    if (peer < 0 || peer >= c->size)
        return MAL_ERR(MAL_EINVAL, "%s: peer %d is not a rank of this communicator of %d ranks",
                       what, peer, c->size);
    if (bytes > INT_MAX)
        return MAL_ERR(MAL_EINVAL,
                       "%s: %zu bytes to/from rank %d is more than one message carries (%d); "
                       "send it in pieces",
                       what, bytes, peer, INT_MAX);
    if (tag < 0) return MAL_ERR(MAL_EINVAL, "%s: tag %d is negative", what, tag);
    mal_comm_req *r = malloc(sizeof *r);
    if (!r) return MAL_ERR(MAL_ENOMEM, "%s: out of memory for a request", what);
    *r = (mal_comm_req){.req = MPI_REQUEST_NULL, .is_recv = is_recv, .bytes = bytes,
                        .peer = peer, .tag = tag};
    int rc = mal_mpi_bytes_post(buf, bytes, peer, tag, comm_of(c), is_recv, &r->req, &r->type);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int mal_comm_mpi_isend(mal_comm *c, const void *buf, size_t bytes, int peer, int tag,
                     mal_comm_req **req)
{
    /* MPI_Isend takes a const buffer; the cast only shares post_p2p. */
    return post_p2p(c, (void *)(uintptr_t)buf, bytes, peer, tag, 0, req);
}

int mal_comm_mpi_irecv(mal_comm *c, void *buf, size_t bytes, int peer, int tag, mal_comm_req **req)
{
    return post_p2p(c, buf, bytes, peer, tag, 1, req);
}

/* Frees the request whatever the outcome.  A receive must get exactly the
 * bytes it asked for: a shorter message means the peers disagree about
 * what they exchange, which MPI alone would not report. */
static int list_wait(mal_comm_req *r);

int mal_comm_mpi_wait(mal_comm_req *r)
{
    if (!r) return 0;
    if (r->is_list) return list_wait(r);
    MPI_Status st;
    size_t got = 0;
    int err = mal_mpi_wait(&r->req, &st, r->is_recv ? "wait (receive)" : "wait (send)");
    int rc = mal_mpi_bytes_done(err || !r->is_recv ? NULL : &st, &r->type, &got);
    if (!err && rc) err = rc;
    if (!err && r->is_recv && got != r->bytes)
        err = MAL_ERR(MAL_EMISMATCH,
                      "received %zu bytes from rank %d (tag %d) but %zu were expected: the "
                      "sender and receiver disagree on the message size",
                      got, r->peer, r->tag, r->bytes);
    if (r->stage) {
        /* a staged receive lands in its device buffer, queued on the
         * instance before the wait returns (comm.h, rule 3) */
        if (!err && r->is_recv) mal_kern_from_host(r->k, r->dev, r->stage, r->bytes);
        mal_kern_queue_wait(r->k);
        mal_kern_host_free(r->k, r->stage);
    }
    free(r);
    return err;
}

/* ---- data plane ------------------------------------------------------- */

/* Post a data-plane send or receive of device buffer buf: in place when
 * the instance's buffers are host-addressable, else through a pinned host
 * copy.  Any size (mpi_bytes.h). */
static int dp_post(mal_comm *c, mal_kern k, void *buf, size_t bytes, int peer, int tag,
                   int is_recv, mal_comm_req **out)
{
    const char *what = is_recv ? "data-plane receive" : "data-plane send";
    *out = NULL;
    if (peer < 0 || peer >= c->size)
        return MAL_ERR(MAL_EINVAL, "%s: peer %d is not a rank of this communicator of %d ranks",
                       what, peer, c->size);
    if (tag < 0) return MAL_ERR(MAL_EINVAL, "%s: tag %d is negative", what, tag);
    mal_comm_req *r = calloc(1, sizeof *r);
    if (!r) return MAL_ERR(MAL_ENOMEM, "%s: out of memory for a request", what);
    *r = (mal_comm_req){.req = MPI_REQUEST_NULL, .is_recv = is_recv, .bytes = bytes,
                        .peer = peer, .tag = tag};
    void *mbuf = buf;
    if (!k->host_addressable) {
        if (!(r->stage = mal_kern_host_alloc(k, bytes ? bytes : 1))) {
            free(r);
            return MAL_ERR(MAL_ENOMEM, "%s: no pinned host memory for %zu bytes", what, bytes);
        }
        r->k = k;
        r->dev = buf;
        mbuf = r->stage;
        if (!is_recv) mal_kern_to_host(k, r->stage, buf, bytes);
    }
    /* rule 1: nothing is read or written before the queue passed it */
    mal_kern_queue_wait(k);
    int rc = mal_mpi_bytes_post(mbuf, bytes, peer, tag, comm_of(c), is_recv, &r->req, &r->type);
    if (rc) {
        if (r->stage) mal_kern_host_free(k, r->stage);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

static int mpi_dp_isend(mal_comm *c, mal_kern k, const void *buf, size_t bytes, int peer, int tag,
                        mal_comm_req **req)
{
    /* MPI_Isend takes a const buffer; the cast only shares dp_post. */
    return dp_post(c, k, (void *)(uintptr_t)buf, bytes, peer, tag, 0, req);
}

static int mpi_dp_irecv(mal_comm *c, mal_kern k, void *buf, size_t bytes, int peer, int tag,
                        mal_comm_req **req)
{
    return dp_post(c, k, buf, bytes, peer, tag, 1, req);
}

/* MPI's non-blocking sends and receives progress together already. */
static int mpi_dp_group_start(mal_comm *c)
{
    (void)c;
    return 0;
}

static int mpi_dp_group_end(mal_comm *c)
{
    (void)c;
    return 0;
}

static int mpi_dp_waitall(mal_comm *c, int n, mal_comm_req **reqs)
{
    (void)c;
    int err = 0;
    for (int i = 0; i < n; i++) {
        int rc = mal_comm_mpi_wait(reqs[i]);
        reqs[i] = NULL;
        if (!err) err = rc;
    }
    return err;
}

/* The host memory a reduction of `bytes` of device buffer buf works on:
 * buf itself (host-addressable) or a pinned copy (*stage, to be given to
 * dp_unstage). */
static int dp_stage(mal_kern k, void *buf, size_t bytes, void **host, void **stage)
{
    *stage = NULL;
    *host = buf;
    if (!k->host_addressable) {
        if (!(*stage = mal_kern_host_alloc(k, bytes ? bytes : 1)))
            return MAL_ERR(MAL_ENOMEM, "data plane: no pinned host memory for %zu bytes", bytes);
        mal_kern_to_host(k, *stage, buf, bytes);
        *host = *stage;
    }
    mal_kern_queue_wait(k);
    return 0;
}

/* The result back into the device buffer (rule 2), and the copy freed. */
static void dp_unstage(mal_kern k, void *buf, size_t bytes, void *stage, int ok)
{
    if (!stage) return;
    if (ok) mal_kern_from_host(k, buf, stage, bytes);
    mal_kern_queue_wait(k);
    mal_kern_host_free(k, stage);
}

static int check_f32(mal_dtype dt, const char *what)
{
    if (dt != MAL_F32)
        return MAL_ERR(MAL_ENOTSUP,
                       "%s: the MPI data plane reduces member lists in fp32 only, not %s (use "
                       "the nccl backend or fp32 compute)",
                       what, mal_dtype_name(dt));
    return 0;
}

/* bf16 (a GPU's activations, TP all-reduce): widened to fp32 on the host,
 * summed there like fp32 (each element by one rank), rounded back to
 * nearest-even bf16 - the same bits on every member.  The floats live in a
 * buffer kept with the communicator: a TP all-reduce of the 1b shape's
 * activations is 128 MB of them, twice per layer. */
static int allreduce_bf16(mal_comm *c, uint16_t *h, size_t count)
{
    mpi_impl *im = c->impl;
    if (count > im->widen_n) {
        float *f = realloc(im->widen, count * sizeof *f);
        if (!f)
            return MAL_ERR(MAL_ENOMEM, "all-reduce (bf16): out of memory for %zu values", count);
        im->widen = f, im->widen_n = count;
    }
    float *f = im->widen;
    for (size_t i = 0; i < count; i++)
        f[i] = mal_f32_from_bf16(h[i]);
    int rc = allreduce(c, f, count, MPI_FLOAT, sizeof(float), MPI_SUM, "all-reduce (sum, bf16)");
    if (!rc)
        for (size_t i = 0; i < count; i++)
            h[i] = mal_bf16_from_f32(f[i]);
    return rc;
}

/* Timed from the moment the kernel queue has passed everything before the
 * call (a wait the staging makes anyway): what the all-reduce costs, not
 * the compute it waits for (dp_elapsed). */
static int mpi_dp_allreduce(mal_comm *c, mal_kern k, void *buf, size_t count, mal_dtype dt)
{
    void *host, *stage;
    int rc = dt == MAL_BF16 ? 0 : check_f32(dt, "all-reduce");
    if (rc || c->size == 1 || count == 0) return rc;
    size_t bytes = count * mal_dtype_bytes(dt);
    mal_kern_queue_wait(k);
    double t0 = mal_now();
    if ((rc = dp_stage(k, buf, bytes, &host, &stage))) return rc;
    rc = dt == MAL_BF16 ? allreduce_bf16(c, host, count)
                        : allreduce(c, host, count, MPI_FLOAT, sizeof(float), MPI_SUM,
                                    "all-reduce (sum, float)");
    dp_unstage(k, buf, bytes, stage, rc == 0);
    ((mpi_impl *)c->impl)->dp_s += mal_now() - t0;
    return rc;
}

static int mpi_dp_elapsed(mal_comm *c, double *seconds)
{
    mpi_impl *im = c->impl;
    *seconds = im->dp_s;
    im->dp_s = 0;
    return 0;
}

/* ---- member-list reductions: a queue per communicator ------------------ */

/* Fail r (and, the ring's messages being out of step from here on, every
 * reduction queued behind it). */
static void list_fail(mpi_impl *im, mal_comm_req *r, int err)
{
    r->err = err;
    if (!im->q_failed) {
        im->q_failed = err;
        /* the cause, for the reductions that fail because of it */
        snprintf(im->q_why, sizeof im->q_why, "%s", mal_errmsg());
    }
}

/* Advance the queue of c: start the head's ring when it reaches the head,
 * test it, and go on to the next reduction when it is done.  Never waits.
 * Returns the first error met (which the failed request keeps too). */
static int list_progress(mal_comm *c)
{
    mpi_impl *im = c->impl;
    int first_err = 0;
    while (im->q_head) {
        mal_comm_req *r = im->q_head;
        int rc = 0, done = 0;
        if (im->q_failed && !r->ring) {
            rc = MAL_ERR(im->q_failed,
                         "member-list all-reduce: an earlier reduction on this communicator "
                         "failed, so this one cannot run (%s)",
                         im->q_why);
        } else {
            if (!r->ring) {
                /* the ring's scratch is kept with the communicator (one
                 * reduction runs at a time): a reduction every step must
                 * not allocate every step */
                size_t need = r->kind ? mal_comm_ring_scratch_bytes_v(r->kind, r->counts, r->n,
                                                                      r->es)
                                      : mal_comm_ring_scratch_bytes(r->count, r->n);
                if (need > im->ring_scratch_bytes) {
                    void *p = realloc(im->ring_scratch, need);
                    if (!p)
                        rc = MAL_ERR(MAL_ENOMEM, "member-list all-reduce: out of memory for "
                                                 "scratch");
                    else
                        im->ring_scratch = p, im->ring_scratch_bytes = need;
                }
                if (!rc && r->kind)
                    rc = mal_comm_ring_start_v(im->comm, c->rank, r->members, r->n, r->tag,
                                               r->host, r->es, r->counts, r->kind, r->op,
                                               im->ring_scratch, &r->ring);
                else if (!rc)
                    rc = mal_comm_ring_start(im->comm, c->rank, r->members, r->n, r->tag, r->host,
                                             r->count, r->op, im->ring_scratch, &r->ring);
            }
            if (!rc) rc = mal_comm_ring_progress(r->ring, &done);
        }
        if (rc) {
            list_fail(im, r, rc);
            if (!first_err) first_err = rc;
            done = 1;
        }
        if (!done) break; /* the head is still running: later ones wait */
        mal_comm_ring_free(r->ring);
        r->ring = NULL;
        r->done = 1;
        im->q_head = r->next;
        r->next = NULL;
        if (!im->q_head) im->q_tail = &im->q_head;
    }
    return first_err;
}

/* The wait of a member-list reduction: progress its communicator's queue
 * (sleeping between tests) until it is done, then the result back into
 * the device buffer (rule 2/3) and the request freed. */
static int list_wait(mal_comm_req *r)
{
    int64_t t0 = 0;
    int err = 0;
    for (long i = 0; !r->done && r->c && !err; i++) {
        list_progress(r->c); /* errors land in the requests */
        if (!r->done) err = wait_turn(i, &t0, "member-list all-reduce");
    }
    if (err) {
        /* a peer gone: this reduction and every later one on c fail, and
         * r leaves the queue (whose tail is found again) before it is freed */
        mpi_impl *im = r->c->impl;
        list_fail(im, r, err);
        mal_comm_req **p = &im->q_head;
        while (*p && *p != r)
            p = &(*p)->next;
        if (*p) *p = r->next;
        for (p = &im->q_head; *p; p = &(*p)->next)
            ;
        im->q_tail = p;
        mal_comm_ring_free(r->ring);
        r->ring = NULL;
    }
    err = r->err;
    if (!err && !r->c)
        err = MAL_ERR(MAL_EINVAL, "member-list all-reduce: its communicator was destroyed before "
                                  "the wait");
    if (r->stage) {
        if (!err) mal_kern_from_host(r->k, r->dev, r->stage, r->count * r->es);
        mal_kern_queue_wait(r->k);
        mal_kern_host_free(r->k, r->stage);
    }
    free(r->members);
    free(r->counts);
    free(r);
    return err;
}

/* Queue a member-list collective (an all-reduce, kind 0, or one with a
 * region per member: `counts`) of `count` elements of `es` bytes of device
 * buffer buf; *out NULL when there is nothing to combine. */
static int list_enqueue(mal_comm *c, mal_kern k, const char *what, const int *members, int n,
                        int tag, void *buf, size_t count, size_t es, mal_reduce_op op, int kind,
                        const size_t *counts, mal_comm_req **out)
{
    mpi_impl *im = c->impl;
    int rc, me = -1;
    *out = NULL;
    if (n < 1) return MAL_ERR(MAL_EINVAL, "%s: %d members; list at least one", what, n);
    if (tag < 0) return MAL_ERR(MAL_EINVAL, "%s: tag %d is negative", what, tag);
    for (int i = 0; i < n; i++) {
        if (members[i] < 0 || members[i] >= c->size)
            return MAL_ERR(MAL_EINVAL,
                           "%s: member %d is not a rank of this communicator of %d ranks", what,
                           members[i], c->size);
        if (members[i] == c->rank) me = i;
    }
    if (me < 0)
        return MAL_ERR(MAL_EINVAL, "%s: calling rank %d is not in the list of %d members", what,
                       c->rank, n);
    if (n == 1 || count == 0) return 0; /* nothing to combine: no request */
    mal_comm_req *r = calloc(1, sizeof *r);
    if (!r || !(r->members = malloc((size_t)n * sizeof *members)) ||
        (kind && !(r->counts = malloc((size_t)n * sizeof *counts)))) {
        if (r) free(r->members);
        free(r);
        return MAL_ERR(MAL_ENOMEM, "%s: out of memory for a request", what);
    }
    memcpy(r->members, members, (size_t)n * sizeof *members);
    if (kind) memcpy(r->counts, counts, (size_t)n * sizeof *counts);
    r->req = MPI_REQUEST_NULL;
    r->is_list = 1;
    r->c = c, r->n = n, r->tag = tag, r->count = count, r->op = op;
    r->kind = kind, r->es = es;
    r->k = k, r->dev = buf;
    /* rule 1: staged (device -> pinned host) or used in place after the
     * kernel queue has passed everything queued before this call */
    void *host = NULL;
    if ((rc = dp_stage(k, buf, count * es, &host, &r->stage))) {
        free(r->members);
        free(r->counts);
        free(r);
        return rc;
    }
    r->host = host;
    *im->q_tail = r;
    im->q_tail = &r->next;
    /* its first messages go now when it is the head; errors land in the
     * request, which the wait reports */
    list_progress(c);
    *out = r;
    return 0;
}

static int mpi_dp_iallreduce_list(mal_comm *c, mal_kern k, const int *members, int n, int tag,
                                  void *buf, size_t count, mal_dtype dt, mal_reduce_op op,
                                  mal_comm_req **out)
{
    const char *what = "member-list all-reduce";
    int rc = check_f32(dt, what);
    *out = NULL;
    if (rc) return rc;
    return list_enqueue(c, k, what, members, n, tag, buf, count, sizeof(float), op, 0, NULL, out);
}

static int mpi_dp_ilist(mal_comm *c, mal_kern k, mal_list_coll kind, const int *members, int n,
                        int tag, void *buf, const size_t *counts, mal_dtype dt,
                        mal_comm_req **out)
{
    const char *what =
        kind == MAL_LIST_ALLGATHER ? "member-list all-gather" : "member-list reduce-scatter";
    *out = NULL;
    if (kind != MAL_LIST_REDUCE_SCATTER && kind != MAL_LIST_ALLGATHER)
        return MAL_ERR(MAL_EINVAL, "member-list collective: unknown kind %d", (int)kind);
    int rc = kind == MAL_LIST_REDUCE_SCATTER ? check_f32(dt, what) : 0;
    if (rc) return rc;
    size_t count = 0;
    for (int i = 0; i < n; i++)
        count += counts[i];
    return list_enqueue(c, k, what, members, n, tag, buf, count, mal_dtype_bytes(dt), MAL_OP_SUM,
                        kind, counts, out);
}

static int mpi_dp_progress(mal_comm *c) { return list_progress(c); }

/* The blocking reduction is the non-blocking one waited for: the same
 * machine, the same bits. */
static int mpi_dp_allreduce_list(mal_comm *c, mal_kern k, const int *members, int n, int tag,
                                 void *buf, size_t count, mal_dtype dt, mal_reduce_op op)
{
    mal_comm_req *r = NULL;
    int rc = mpi_dp_iallreduce_list(c, k, members, n, tag, buf, count, dt, op, &r);
    if (rc) return rc;
    return mal_comm_mpi_wait(r);
}

/* MPI keeps no data-plane resources per list: nothing to let go. */
static int mpi_dp_trim(mal_comm *c)
{
    (void)c;
    return 0;
}

/* Seconds a rank waits in MPI_Abort before it ends itself (below). */
enum { ABORT_GRACE_S = 5 };
static volatile sig_atomic_t abort_status = 1;

static void abort_deadline(int sig)
{
    (void)sig;
    _exit(abort_status);
}

/* MPI_COMM_WORLD, not c's communicator: the table promises to end every
 * rank of the job, and MPI only promises "at least the group of comm".
 * MPI_Abort ends the job at once where the launcher acts on it (hydra; srun
 * while the step runs: 0.8 s).  But once srun is already ending the step
 * (a rank was killed, --kill-on-bad-exit), the survivors' aborts are not
 * acted on and MPI_Abort blocks until Slurm's SIGKILL after KillWait (30 s
 * measured; the peer watch had ended their waits at 10 s).  So the rank
 * ends itself ABORT_GRACE_S after asking, with the same status: the
 * launcher sees it fail and ends the rest. */
void mal_comm_mpi_abort(mal_comm *c, int code)
{
    (void)c;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = abort_deadline;
    sigemptyset(&sa.sa_mask);
    abort_status = code;
    sigaction(SIGALRM, &sa, NULL);
    alarm(ABORT_GRACE_S);
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code); /* not reached: MPI_Abort does not return */
}

const mal_comm_ops mal_comm_mpi_ops = {
    .name = "mpi",
    MAL_COMM_MPI_CONTROL_PLANE,
    .abort = mal_comm_mpi_abort,
    .dp_allreduce = mpi_dp_allreduce,
    .dp_allreduce_list = mpi_dp_allreduce_list,
    .dp_iallreduce_list = mpi_dp_iallreduce_list,
    .dp_ilist = mpi_dp_ilist,
    .dp_progress = mpi_dp_progress,
    .dp_isend = mpi_dp_isend,
    .dp_irecv = mpi_dp_irecv,
    .dp_group_start = mpi_dp_group_start,
    .dp_group_end = mpi_dp_group_end,
    .dp_waitall = mpi_dp_waitall,
    .dp_elapsed = mpi_dp_elapsed,
    .dp_trim = mpi_dp_trim,
};
