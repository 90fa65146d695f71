/* NCCL data plane of the communication table (comm.h): device buffers of a
 * GPU kernel instance moved device to device by NCCL; the control plane is
 * MPI's (MAL_COMM_MPI_CONTROL_PLANE).  Built when configure finds NCCL.
 * Streams and events come through the device-runtime shim
 * (kernels/cuda/runtime.h), so that no CUDA header is included here.
 * Run on one H100 with communicators of one rank (tests/test_comm_nccl,
 * which checks every operation against the MPI data plane, on as many ranks
 * as there are GPUs); NOT YET RUN ACROSS SEVERAL GPUS.
 *
 * NCCL communicators ("channels" below, each with its own stream and
 * events):
 *  - one per mal_comm of this backend, made when the mal_comm is (split,
 *    create_group, mal_comm_dup call dp_attach): rank 0 asks NCCL for a
 *    unique id, broadcasts it over the mal_comm's MPI control plane, and
 *    every member calls ncclCommInitRankConfig.  No ncclCommSplit: groups
 *    are made by their members only (create_group), which a split of a
 *    parent NCCL communicator cannot do.  The trainer keeps its groups in a
 *    pool (comm_pool.h), so an online plan change reuses the channels of
 *    groups it had before;
 *  - one per distinct member list of dp_allreduce_list, made the first
 *    time the list is used (the first member sends the id to the others
 *    over the parent's control plane) and kept until the parent is
 *    destroyed or dp_trim evicts it.  Each holds GPU buffers and a proxy
 *    thread, so over a long elastic run (every online plan change may bring
 *    new replica sets) they are bounded: dp_trim, which the trainer calls
 *    at every plan change, keeps at most $MALLEUS_NCCL_MAX_LISTS (32) of
 *    them, evicting the least recently used.  Evicting is safe only if all
 *    members of a list evict it at the same point (a member that kept it
 *    would wait on the old communicator while the others make a new one),
 *    so "recently" is counted in trims, which every rank of the parent
 *    passes together, and a list's last use is the same trim count on all
 *    its members (a reduction is collective over them).  Each rank works
 *    out the smallest age A such that keeping only the lists younger than
 *    A leaves it at most the cap, the ranks take the minimum A over the
 *    parent, and every rank evicts its lists of age A or more: the same
 *    lists on every member.  A plan whose step itself uses more lists than
 *    the cap keeps them (the cap is checked at trims only), so the cap
 *    costs at most a re-creation, never a wrong result.
 * Stream and event order, held sends, timeouts and aborts: comm.h.
 */
#include "comm_nccl.h"

#include <errno.h>
#include <limits.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mal.h"
#include "comm_mpi.h"
#include "kernels/cuda/runtime.h"
#include "watch.h"

int mal_comm_nccl_created;

/* Default of $MALLEUS_NCCL_TIMEOUT (seconds): PyTorch's default too; long
 * enough for a peer that writes a snapshot or evaluates while this rank
 * waits, short enough that a hung job ends within the hour. */
#define TIMEOUT_DEFAULT_S 600.0
/* Default of $MALLEUS_NCCL_MAX_LISTS: member-list communicators kept per
 * parent across plan changes (a plan uses a few per rank: the holder sets
 * of its pieces). */
#define MAX_LISTS_DEFAULT 32

enum { REQ_MAGIC = 0x4e43434c }; /* "NCCL": tells our requests from MPI's */

typedef struct channel channel;
struct channel {
    ncclComm_t comm; /* NULL once aborted or destroyed */
    mal_gpu_stream stream;
    mal_gpu_event ready, done; /* rule 1 / collectives' completion */
    int pending;               /* a stream-ordered all-reduce not yet waited for */
    /* timing events of the stream-ordered all-reduces since the last
     * dp_elapsed: a start and an end each (made as needed, kept) */
    mal_gpu_event *tev;
    int n_timed, cap_tev;
    double banked_s; /* time of earlier pairs, read to bound their number */
    int size, rank;
    int dead;       /* aborted: every later operation fails */
    char what[160]; /* "communicator of 4 ranks (world ranks 0 1 2 3)" */
    channel *next;  /* the process's live channels (abort) */
};

typedef struct {
    int n;
    int *members; /* ranks of the parent, in list order */
    channel *ch;
    long long last_trim; /* the parent's trim count at its last use */
} list_channel;

/* c->dp */
typedef struct {
    channel *main;
    list_channel *lists;
    int n_lists, cap_lists;
    long long trims; /* dp_trim calls so far (the lists' clock) */
} nccl_dp;

typedef struct nccl_req nccl_req;
struct nccl_req {
    uint32_t magic;
    int is_recv, launched, err;
    int is_coll; /* a non-blocking member-list all-reduce (bytes: its size) */
    channel *ch; /* NULL: its communicator was destroyed before the wait */
    mal_kern k;
    void *buf;
    size_t bytes;
    int peer, world_peer;
    mal_gpu_event done;
    nccl_req *next;                   /* held sends, or receives of an open group */
    nccl_req *live_next, **live_prev; /* every request not yet waited for */
};

/* The process's NCCL state: live channels, every request not yet waited
 * for, sends held until the next blocking data-plane call, receives of an
 * open group, the timeout and the cap on member lists. */
static struct {
    channel *live;
    nccl_req *reqs;
    nccl_req *held, **held_tail;
    nccl_req *grouped, **grouped_tail;
    int depth; /* dp_group_start nesting */
    double timeout_s;
    int max_lists;
} G = {NULL, NULL, NULL, &G.held, NULL, &G.grouped, 0, TIMEOUT_DEFAULT_S, MAX_LISTS_DEFAULT};

static int cuda_err(int e, const char *what)
{
    return MAL_ERR(MAL_EDEVICE, "NCCL data plane: CUDA: %s: %s (%s)", what, mal_gpu_error_string(e),
                   mal_gpu_error_name(e));
}

static int nccl_err(channel *ch, ncclResult_t r, const char *what)
{
    const char *last = ch && ch->comm ? ncclGetLastError(ch->comm) : ncclGetLastError(NULL);
    return MAL_ERR(MAL_EDEVICE, "NCCL: %s on %s failed: %s%s%s", what,
                   ch ? ch->what : "a new communicator", ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

/* ---- timeout, waits, abort -------------------------------------------- */

/* $MALLEUS_NCCL_TIMEOUT, checked by the probe (a bad value is a usage
 * error before anything starts). */
static int read_timeout(void)
{
    const char *s = getenv("MALLEUS_NCCL_TIMEOUT");
    G.timeout_s = TIMEOUT_DEFAULT_S;
    if (!s || !*s) return 0;
    char *end = NULL;
    errno = 0;
    double t = strtod(s, &end);
    if (errno || end == s || *end || !(t > 0) || t > 1e7)
        return MAL_ERR(MAL_EINVAL,
                       "MALLEUS_NCCL_TIMEOUT='%s' is not a number of seconds between 0 and 1e7 "
                       "(unset it for the default, %g s)",
                       s, TIMEOUT_DEFAULT_S);
    G.timeout_s = t;
    return 0;
}

/* $MALLEUS_NCCL_MAX_LISTS, checked by the probe. */
static int read_max_lists(void)
{
    const char *s = getenv("MALLEUS_NCCL_MAX_LISTS");
    G.max_lists = MAX_LISTS_DEFAULT;
    if (!s || !*s) return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1000000)
        return MAL_ERR(MAL_EINVAL,
                       "MALLEUS_NCCL_MAX_LISTS='%s' is not a number of communicators between 1 "
                       "and 1000000 (unset it for the default, %d)",
                       s, MAX_LISTS_DEFAULT);
    G.max_lists = (int)v;
    return 0;
}

static void unlink_live(channel *ch)
{
    for (channel **p = &G.live; *p; p = &(*p)->next)
        if (*p == ch) {
            *p = ch->next;
            return;
        }
}

/* ncclCommAbort: NCCL's kernels of this communicator stop, so the streams
 * waiting behind them (the kernel queue included) can drain. */
static void channel_abort(channel *ch)
{
    if (ch->comm) ncclCommAbort(ch->comm);
    ch->comm = NULL;
    ch->dead = 1;
    unlink_live(ch);
}

/* Sleep between polls: none for the first 200 us (a TP all-reduce of a
 * healthy job finishes in tens of microseconds and must not pay a timer's
 * slack), then 20 us, then 1 ms once the wait has lasted 10 ms (a rank
 * waiting for a straggler or a snapshot writer should not burn its core). */
static void nap(double waited_s)
{
    if (waited_s < 200e-6) return;
    struct timespec ts = {0, waited_s < 10e-3 ? 20000 : 1000000};
    nanosleep(&ts, NULL);
}

static int timed_out(channel *ch, double t0, const char *what)
{
    double waited = mal_now() - t0;
    char me[sizeof ch->what];
    /* a peer's node gone (watch.h): no need to sit out the NCCL timeout */
    if (mal_comm_watch_check(what)) {
        char why[512];
        snprintf(why, sizeof why, "%s", mal_errmsg());
        snprintf(me, sizeof me, "%s", ch->what);
        channel_abort(ch);
        return MAL_ERR(MAL_EDEVICE, "NCCL: %s on %s: %s; the communicator was aborted", what, me,
                       why);
    }
    if (waited <= G.timeout_s) return 0;
    snprintf(me, sizeof me, "%s", ch->what);
    channel_abort(ch);
    return MAL_ERR(MAL_EDEVICE,
                   "NCCL: %s on %s did not finish in %g s (MALLEUS_NCCL_TIMEOUT): a peer is "
                   "dead, hung, or never posted its side; the communicator was aborted and the "
                   "run stops here (the restart loop resumes from the newest snapshot)",
                   what, me, G.timeout_s);
}

static int alive(channel *ch, const char *what);

/* Host wait for event ev recorded on ch's stream or, with ev NULL, for ch's
 * state to settle after a non-blocking call (ncclInProgress while NCCL sets
 * up or enqueues); watching NCCL's errors and the timeout either way. */
static int wait_on(channel *ch, mal_gpu_event ev, const char *what)
{
    double t0 = mal_now();
    for (;;) {
        if (ev) {
            int done = 0, q = mal_gpu_event_query(ev, &done);
            if (q) {
                mal_gpu_clear_error();
                return cuda_err(q, what);
            }
            if (done) return 0;
        }
        if (!ch->comm) return alive(ch, what);
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(ch->comm, &st);
        if (r != ncclSuccess) st = r;
        if (!ev && st == ncclSuccess) return 0;
        if (st != ncclSuccess && st != ncclInProgress) {
            int rc = nccl_err(ch, st, what);
            channel_abort(ch);
            return rc;
        }
        int rc = timed_out(ch, t0, what);
        if (rc) return rc;
        nap(mal_now() - t0);
    }
}

/* After an NCCL call: its result, then the settled state. */
static int called(channel *ch, ncclResult_t r, const char *what)
{
    if (r != ncclSuccess && r != ncclInProgress) {
        int rc = nccl_err(ch, r, what);
        channel_abort(ch);
        return rc;
    }
    return wait_on(ch, NULL, what);
}

static int alive(channel *ch, const char *what)
{
    if (!ch->dead) return 0;
    return MAL_ERR(MAL_EDEVICE,
                   "NCCL: %s on %s: the communicator was aborted after an earlier failure; "
                   "nothing more can run on it",
                   what, ch->what);
}

/* ---- channels ---------------------------------------------------------- */

/* Take q out of the list at *head (held sends or grouped receives), if it
 * is there, and put the list's tail right. */
static void unqueue(nccl_req **head, nccl_req ***tail, nccl_req *q)
{
    for (nccl_req **p = head; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            q->next = NULL;
            break;
        }
    *tail = head;
    while (**tail)
        *tail = &(**tail)->next;
}

/* A request leaves every list of the process (its wait frees it, or its
 * channel goes). */
static void forget(nccl_req *q)
{
    unqueue(&G.held, &G.held_tail, q);
    unqueue(&G.grouped, &G.grouped_tail, q);
}

/* Host wait, with the timeout, for everything queued on ch's stream so
 * far: a stream-ordered all-reduce or a transfer nobody waited for.  On
 * timeout or an NCCL error ch is aborted (wait_on). */
static int settle(channel *ch, const char *what)
{
    if (!ch->comm) return alive(ch, what);
    int e = mal_gpu_event_record(ch->done, ch->stream);
    if (e) return cuda_err(e, what);
    ch->pending = 0;
    return wait_on(ch, ch->done, what);
}

static void channel_destroy(channel *ch)
{
    if (!ch) return;
    /* Requests that still name it - held sends, receives of a group not
     * ended yet, transfers and reductions launched but not waited for -
     * can never complete now: they leave the held and grouped lists (which
     * would otherwise launch them on a freed channel) and their waits say
     * that the communicator went. */
    for (nccl_req *q = G.reqs; q; q = q->live_next)
        if (q->ch == ch) {
            forget(q);
            q->ch = NULL;
        }
    if (ch->comm) {
        /* Its queued work finishes first, within the timeout; Finalize
         * flushes what NCCL still has; a failure (or a timeout) in either
         * aborts instead. */
        if (settle(ch, "finishing its work before it is destroyed") == 0 &&
            called(ch, ncclCommFinalize(ch->comm), "finalising") == 0) {
            ncclCommDestroy(ch->comm);
            ch->comm = NULL;
            unlink_live(ch);
        }
    }
    for (int i = 0; i < ch->cap_tev; i++)
        mal_gpu_event_destroy(ch->tev[i]);
    free(ch->tev);
    if (ch->ready) mal_gpu_event_destroy(ch->ready);
    if (ch->done) mal_gpu_event_destroy(ch->done);
    if (ch->stream) mal_gpu_stream_destroy(ch->stream);
    free(ch);
}

/* A channel of `size` ranks in which this process is `rank`, from `id`.
 * Collective over the members.  The communicator is made on the current
 * CUDA device (the cuda kernel instance selects it when created). */
static int channel_create(const ncclUniqueId *id, int size, int rank, const char *what,
                          channel **out)
{
    *out = NULL;
    channel *ch = calloc(1, sizeof *ch);
    if (!ch) return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory for a communicator");
    ch->size = size;
    ch->rank = rank;
    snprintf(ch->what, sizeof ch->what, "%s", what);
    int e;
    if ((e = mal_gpu_stream_create(&ch->stream)) || (e = mal_gpu_event_create(&ch->ready)) ||
        (e = mal_gpu_event_create(&ch->done))) {
        int rc = cuda_err(e, "creating a communicator's stream and events");
        channel_destroy(ch);
        return rc;
    }
    /* non-blocking: creation and every operation can be waited on with a
     * timeout and aborted (comm.h, "Failures") */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&ch->comm, size, *id, rank, &cfg);
    int rc = 0;
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_err(ch, r, "creating the communicator");
        if (ch->comm) ncclCommAbort(ch->comm);
        ch->comm = NULL;
    } else {
        ch->next = G.live;
        G.live = ch;
        rc = wait_on(ch, NULL, "creating the communicator"); /* aborts it on failure */
    }
    if (rc) {
        channel_destroy(ch);
        /* NCCL (before 2.30) refuses ranks sharing a GPU, at once or while
         * it sets up: say what to do */
        if (r == ncclInvalidUsage || strstr(mal_errmsg(), "Duplicate GPU")) {
            char why[512]; /* MAL_ERR writes the buffer mal_errmsg() points at */
            snprintf(why, sizeof why, "%s", mal_errmsg());
            rc = MAL_ERR(rc,
                         "%s (two ranks on one GPU? NCCL before 2.30 refuses that: use --comm mpi "
                         "for ranks sharing a GPU)",
                         why);
        }
        return rc;
    }
    mal_comm_nccl_created++;
    *out = ch;
    return 0;
}

/* "communicator of N ranks (world ranks a b c ...)" for messages. */
static void describe(char *buf, size_t len, const mal_comm *c, const int *members, int n)
{
    size_t at = (size_t)snprintf(buf, len, "communicator of %d rank%s (world rank%s", n,
                                 n == 1 ? "" : "s", n == 1 ? "" : "s");
    for (int i = 0; i < n && at < len; i++) {
        int r = members ? members[i] : i;
        at += (size_t)snprintf(buf + at, len - at, " %d", c->world_ranks[r]);
    }
    if (at < len) snprintf(buf + at, len - at, ")");
}

/* Rank 0's id to every member, with its verdict, so that a rank 0 that
 * cannot make one does not leave the others waiting. */
typedef struct {
    int ok;
    ncclUniqueId id;
} id_msg;

static int nccl_attach(mal_comm *c)
{
    nccl_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory");
    id_msg m = {0};
    int rc = 0;
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&m.id);
        m.ok = r == ncclSuccess;
        if (!m.ok) rc = nccl_err(NULL, r, "ncclGetUniqueId");
    }
    int brc = mal_comm_mpi_broadcast(c, &m, sizeof m, 0);
    if (!rc && brc) rc = brc;
    if (!rc && !m.ok)
        rc = MAL_ERR(MAL_EDEVICE, "NCCL: rank 0 could not make a communicator id (see its log)");
    char what[160];
    describe(what, sizeof what, c, NULL, c->size);
    if (!rc) rc = channel_create(&m.id, c->size, c->rank, what, &dp->main);
    if (rc) {
        free(dp);
        return rc;
    }
    c->dp = dp;
    return 0;
}

/* One order of member lists, the same on every rank (by size, then
 * members).  Finalising an NCCL communicator waits until all its members
 * finalise it ("globally quiescent"), so ranks that let several lists go
 * at once must do so in one global order: in another, two ranks sharing
 * two lists could each wait in the other's. */
static int list_cmp(const void *pa, const void *pb)
{
    const list_channel *a = pa, *b = pb;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    for (int i = 0; i < a->n; i++)
        if (a->members[i] != b->members[i]) return a->members[i] < b->members[i] ? -1 : 1;
    return 0;
}

static void nccl_detach(mal_comm *c)
{
    nccl_dp *dp = c->dp;
    if (!dp) return;
    if (dp->n_lists > 1) qsort(dp->lists, (size_t)dp->n_lists, sizeof *dp->lists, list_cmp);
    for (int i = 0; i < dp->n_lists; i++) {
        channel_destroy(dp->lists[i].ch);
        free(dp->lists[i].members);
    }
    free(dp->lists);
    channel_destroy(dp->main);
    free(dp);
    c->dp = NULL;
}

/* The channel of member list `members` when it exists already (marked as
 * used now), else NULL. */
static channel *list_channel_cached(mal_comm *c, const int *members, int n)
{
    nccl_dp *dp = c->dp;
    for (int i = 0; i < dp->n_lists; i++)
        if (dp->lists[i].n == n &&
            !memcmp(dp->lists[i].members, members, (size_t)n * sizeof(int))) {
            dp->lists[i].last_trim = dp->trims;
            return dp->lists[i].ch;
        }
    return NULL;
}

/* The channel of member list `members` (this rank's index in it: *index),
 * made on first use: collective over the members. */
static int list_channel_get(mal_comm *c, const int *members, int n, int tag, channel **out)
{
    nccl_dp *dp = c->dp;
    int me = -1;
    *out = NULL;
    if (n < 1) return MAL_ERR(MAL_EINVAL, "member-list all-reduce: %d members; list at least one", n);
    for (int i = 0; i < n; i++) {
        if (members[i] < 0 || members[i] >= c->size)
            return MAL_ERR(MAL_EINVAL,
                           "member-list all-reduce: member %d is not a rank of this communicator "
                           "of %d ranks",
                           members[i], c->size);
        for (int j = 0; j < i; j++)
            if (members[j] == members[i])
                return MAL_ERR(MAL_EINVAL, "member-list all-reduce: rank %d is listed twice",
                               members[i]);
        if (members[i] == c->rank) me = i;
    }
    if (me < 0)
        return MAL_ERR(MAL_EINVAL,
                       "member-list all-reduce: calling rank %d is not in the list of %d members",
                       c->rank, n);
    if ((*out = list_channel_cached(c, members, n))) return 0;
    if (mal_grow(&dp->lists, &dp->cap_lists, dp->n_lists, sizeof *dp->lists, 8))
        return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory");
    int *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory");
    memcpy(copy, members, (size_t)n * sizeof *copy);

    /* the id from the first member to the others, point to point on the
     * parent's control plane (only the members take part) */
    id_msg m = {0};
    int rc = 0;
    if (me == 0) {
        ncclResult_t r = ncclGetUniqueId(&m.id);
        m.ok = r == ncclSuccess;
        if (!m.ok) rc = nccl_err(NULL, r, "ncclGetUniqueId");
        for (int i = 1; i < n; i++) {
            mal_comm_req *q = NULL;
            int rc2 = mal_comm_mpi_isend(c, &m, sizeof m, members[i], tag, &q);
            if (!rc2) rc2 = mal_comm_mpi_wait(q);
            if (!rc) rc = rc2;
        }
    } else {
        mal_comm_req *q = NULL;
        rc = mal_comm_mpi_irecv(c, &m, sizeof m, members[0], tag, &q);
        if (!rc) rc = mal_comm_mpi_wait(q);
        if (!rc && !m.ok)
            rc = MAL_ERR(MAL_EDEVICE, "NCCL: the list's first member (rank %d) could not make a "
                                      "communicator id (see its log)",
                         members[0]);
    }
    char what[160];
    describe(what, sizeof what, c, members, n);
    channel *ch = NULL;
    if (!rc) rc = channel_create(&m.id, n, me, what, &ch);
    if (rc) {
        free(copy);
        return rc;
    }
    dp->lists[dp->n_lists++] = (list_channel){n, copy, ch, dp->trims};
    *out = ch;
    return 0;
}

/* ---- launching ------------------------------------------------------------ */

static mal_gpu_stream queue_of(mal_kern k)
{
    return mal_kern_native_queue(k);
}

static int gpu_instance(mal_kern k, const char *what)
{
    if (queue_of(k)) return 0;
    return MAL_ERR(MAL_EINVAL,
                   "%s: the nccl data plane moves buffers of a GPU device (--device cuda), not of "
                   "'%s'; use --comm mpi",
                   what, k->name);
}

/* Rule 1: ch's stream waits for everything queued on k so far. */
static int after_queue(channel *ch, mal_kern k, const char *what)
{
    int e;
    if ((e = mal_gpu_event_record(ch->ready, queue_of(k))) ||
        (e = mal_gpu_stream_wait_event(ch->stream, ch->ready)))
        return cuda_err(e, what);
    return 0;
}

/* Launch the requests of list `reqs` (all on channel ch) as one NCCL group
 * and record their events; on failure each request keeps the error. */
static int launch_group(channel *ch, nccl_req **reqs, int n)
{
    const char *what = "sends and receives";
    int rc = alive(ch, what);
    if (!rc) {
        ncclResult_t r = ncclGroupStart();
        for (int i = 0; i < n && r == ncclSuccess; i++) {
            nccl_req *q = reqs[i];
            r = q->is_recv ? ncclRecv(q->buf, q->bytes, ncclUint8, q->peer, ch->comm, ch->stream)
                           : ncclSend(q->buf, q->bytes, ncclUint8, q->peer, ch->comm, ch->stream);
        }
        ncclResult_t r2 = ncclGroupEnd();
        rc = called(ch, r != ncclSuccess ? r : r2, what);
    }
    for (int i = 0; i < n; i++) {
        nccl_req *q = reqs[i];
        q->launched = 1;
        if (!rc) {
            int e = mal_gpu_event_record(q->done, ch->stream);
            if (e) q->err = cuda_err(e, "recording a transfer's completion");
        } else
            q->err = rc;
        if (!rc && q->err) rc = q->err;
    }
    return rc;
}

/* Launch every held send and the receives of `recvs` (a linked list), one
 * group per channel, in the order the channels first appear. */
static int launch_all(nccl_req *recvs)
{
    /* one list of everything, sends first (their order per peer is the
     * order posted, as is the receives') */
    int n = 0, cap = 0, rc = 0;
    nccl_req **all = NULL;
    for (int pass = 0; pass < 2; pass++)
        for (nccl_req *q = pass ? recvs : G.held; q; q = q->next) {
            if (mal_grow(&all, &cap, n, sizeof *all, 16)) {
                free(all);
                return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory launching transfers");
            }
            all[n++] = q;
        }
    G.held = NULL;
    G.held_tail = &G.held;
    nccl_req **grp = n ? malloc((size_t)n * sizeof *grp) : NULL;
    if (n && !grp) {
        free(all);
        return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory launching transfers");
    }
    for (int i = 0; i < n; i++) {
        if (!all[i]) continue;
        channel *ch = all[i]->ch;
        int m = 0;
        for (int j = i; j < n; j++)
            if (all[j] && all[j]->ch == ch) {
                grp[m++] = all[j];
                all[j]->next = NULL;
                all[j] = NULL;
            }
        int rc2 = ch ? launch_group(ch, grp, m) : 0;
        if (!rc) rc = rc2;
    }
    free(grp);
    free(all);
    return rc;
}

/* Before anything that blocks the host: launch every held send. */
static int launch_held(void)
{
    return G.held ? launch_all(NULL) : 0;
}

/* ---- data plane --------------------------------------------------------- */

static int dtype_of(mal_dtype dt, ncclDataType_t *out, const char *what)
{
    if (dt == MAL_F32) *out = ncclFloat32;
    else if (dt == MAL_BF16) *out = ncclBfloat16;
    else return MAL_ERR(MAL_EINVAL, "%s: unknown element type %d", what, (int)dt);
    return 0;
}

/* The host's wait for the stream-ordered all-reduces on ch (the watchdog:
 * the timeout and NCCL's errors), then the device time between each one's
 * timing events added to ch->banked_s; the pairs are free again. */
static int read_timed(channel *ch, const char *what)
{
    int rc;
    if (ch->pending) {
        ch->pending = 0;
        if ((rc = alive(ch, what)) || (rc = wait_on(ch, ch->done, what))) {
            ch->n_timed = 0;
            return rc;
        }
    }
    for (int i = 0; i < ch->n_timed; i++) {
        float ms = 0;
        int e = mal_gpu_event_elapsed(&ms, ch->tev[2 * i], ch->tev[2 * i + 1]);
        if (e) {
            ch->n_timed = 0;
            mal_gpu_clear_error();
            return cuda_err(e, "reading an all-reduce's time");
        }
        ch->banked_s += 1e-3 * (double)ms;
    }
    ch->n_timed = 0;
    return 0;
}

/* Timing pairs a channel keeps at most: a caller that never reads them
 * (dp_elapsed) makes the host wait once per this many all-reduces. */
enum { MAX_TIMED = 1024 };

/* The next pair of timing events of ch (made the first time a step needs
 * that many), or an error. */
static int timing_pair(channel *ch, mal_gpu_event *start, mal_gpu_event *end, const char *what)
{
    int rc;
    if (ch->n_timed == MAX_TIMED && (rc = read_timed(ch, what))) return rc;
    if (2 * ch->n_timed + 2 > ch->cap_tev) {
        int cap = ch->cap_tev ? 2 * ch->cap_tev : 16;
        mal_gpu_event *t = realloc(ch->tev, (size_t)cap * sizeof *t);
        if (!t) return MAL_ERR(MAL_ENOMEM, "NCCL: %s: out of memory for timing events", what);
        ch->tev = t;
        for (; ch->cap_tev < cap; ch->cap_tev++) {
            int e = mal_gpu_event_create_timed(&ch->tev[ch->cap_tev]);
            if (e) return cuda_err(e, "creating timing events");
        }
    }
    *start = ch->tev[2 * ch->n_timed];
    *end = ch->tev[2 * ch->n_timed + 1];
    return 0;
}

/* The all-reduce of both collectives on channel ch: after the kernel queue
 * (rule 1), then rule 2.  Stream-ordered (dp_allreduce): between two timing
 * events, and the host does not wait (dp_elapsed does); with host_wait
 * (dp_allreduce_list, blocking) the host polls its end with the timeout. */
static int allreduce_on(channel *ch, mal_kern k, void *buf, size_t count, mal_dtype dt,
                        mal_reduce_op op, int host_wait, const char *what)
{
    ncclDataType_t t = ncclFloat32;
    mal_gpu_event start = NULL, end = NULL;
    int rc, e;
    if ((rc = gpu_instance(k, what)) || (rc = dtype_of(dt, &t, what)) || (rc = launch_held()) ||
        (rc = alive(ch, what)))
        return rc;
    if (count == 0) return 0;
    if (!host_wait && (rc = timing_pair(ch, &start, &end, what))) return rc;
    if ((rc = after_queue(ch, k, what))) return rc;
    if (start && (e = mal_gpu_event_record(start, ch->stream))) return cuda_err(e, what);
    /* called() waits for NCCL to settle the launch (a non-blocking
     * communicator may still be enqueueing when ncclAllReduce returns), not
     * for the reduction: `done` must come after NCCL's kernel on the
     * stream */
    rc = called(ch,
                ncclAllReduce(buf, buf, count, t, op == MAL_OP_MAX ? ncclMax : ncclSum, ch->comm,
                              ch->stream),
                what);
    if (rc) return rc;
    if (end && (e = mal_gpu_event_record(end, ch->stream))) return cuda_err(e, what);
    if (end) ch->n_timed++;
    if ((e = mal_gpu_event_record(ch->done, ch->stream))) return cuda_err(e, what);
    if (host_wait && (rc = wait_on(ch, ch->done, what))) return rc;
    /* rule 2: kernels queued after this call wait for the reduction on the
     * GPU.  With the host wait, after the poll: a timed-out operation then
     * leaves no wait behind on the kernel queue.  Stream-ordered, a timeout
     * found later (dp_elapsed) aborts the communicator, whose kernels then
     * end, so the kernel queue drains. */
    if ((e = mal_gpu_stream_wait_event(queue_of(k), ch->done))) return cuda_err(e, what);
    if (!host_wait) ch->pending = 1;
    return 0;
}

static int nccl_dp_allreduce(mal_comm *c, mal_kern k, void *buf, size_t count, mal_dtype dt)
{
    nccl_dp *dp = c->dp;
    return allreduce_on(dp->main, k, buf, count, dt, MAL_OP_SUM, 0, "all-reduce");
}

static int nccl_dp_elapsed(mal_comm *c, double *seconds)
{
    nccl_dp *dp = c->dp;
    channel *ch = dp->main;
    int rc = read_timed(ch, "all-reduce");
    *seconds = rc ? 0 : ch->banked_s;
    ch->banked_s = 0;
    return rc;
}

/* LRU eviction of member lists past the cap; collective over c (how the
 * members agree: the top of the file). */
static int nccl_dp_trim(mal_comm *c)
{
    nccl_dp *dp = c->dp;
    /* nothing in flight on a list: every request waited for (agreed below,
     * so that every rank refuses alike instead of some waiting for the
     * others in the collective) */
    const char *busy = NULL;
    for (nccl_req *q = G.reqs; q && !busy; q = q->live_next)
        for (int i = 0; i < dp->n_lists; i++)
            if (q->ch == dp->lists[i].ch) busy = q->ch->what;
    /* ages count trims since the last use: at least 1 after this one.
     * This rank's smallest age that keeps at most the cap: the cap-th
     * smallest age (none past the cap: keep all) */
    long long now = dp->trims + 1;
    int n = dp->n_lists, v[2] = {INT_MAX, !busy};
    if (n > G.max_lists) {
        long long *age = malloc((size_t)n * sizeof *age);
        if (!age) return MAL_ERR(MAL_ENOMEM, "NCCL: out of memory");
        for (int i = 0; i < n; i++)
            age[i] = now - dp->lists[i].last_trim;
        /* a few dozen entries: insertion sort */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && age[j - 1] > age[j]; j--) {
                long long t = age[j];
                age[j] = age[j - 1], age[j - 1] = t;
            }
        v[0] = (int)MAL_MIN(age[G.max_lists], (long long)INT_MAX);
        free(age);
    }
    int rc = mal_comm_mpi_allreduce_min_int(c, v, 2);
    if (rc) return rc;
    if (!v[1])
        return MAL_ERR(MAL_EINVAL,
                       "NCCL: letting go of member-list communicators while a reduction on %s "
                       "is not waited for",
                       busy ? busy : "another rank's list");
    dp->trims = now;
    int keep_below = v[0];
    /* the lists that go, in the global order (list_cmp) */
    if (n > 1) qsort(dp->lists, (size_t)n, sizeof *dp->lists, list_cmp);
    int kept = 0, evicted = 0;
    for (int i = 0; i < n; i++) {
        list_channel *l = &dp->lists[i];
        if (dp->trims - l->last_trim >= keep_below) {
            channel_destroy(l->ch);
            free(l->members);
            evicted++;
        } else
            dp->lists[kept++] = *l;
    }
    dp->n_lists = kept;
    if (evicted)
        mal_log(MAL_LOG_DEBUG,
                "NCCL: %d member-list communicator(s) let go (unused for %d plan change(s) or "
                "more), %d kept (MALLEUS_NCCL_MAX_LISTS %d)",
                evicted, keep_below, kept, G.max_lists);
    return 0;
}

static int nccl_dp_allreduce_list(mal_comm *c, mal_kern k, const int *members, int n, int tag,
                                  void *buf, size_t count, mal_dtype dt, mal_reduce_op op)
{
    channel *ch = NULL;
    int rc;
    /* held sends go first: the list's creation blocks on its members */
    if ((rc = launch_held()) || (rc = list_channel_get(c, members, n, tag, &ch))) return rc;
    return allreduce_on(ch, k, buf, count, dt, op, 1, "member-list all-reduce");
}

/* A request like *tmpl, with its `done` event, and its channel's stream
 * made to wait for the kernel queue (rule 1). */
static int req_new(const nccl_req *tmpl, const char *what, nccl_req **out)
{
    *out = NULL;
    nccl_req *q = malloc(sizeof *q);
    if (!q) return MAL_ERR(MAL_ENOMEM, "%s: out of memory for a request", what);
    *q = *tmpl;
    int e = mal_gpu_event_create(&q->done);
    if (e) {
        free(q);
        return cuda_err(e, what);
    }
    int rc = after_queue(q->ch, q->k, what);
    if (rc) {
        mal_gpu_event_destroy(q->done);
        free(q);
        return rc;
    }
    /* on the process's list until its wait frees it (req_free) */
    q->live_next = G.reqs;
    q->live_prev = &G.reqs;
    if (G.reqs) G.reqs->live_prev = &q->live_next;
    G.reqs = q;
    *out = q;
    return 0;
}

/* Off every list, its event destroyed, freed. */
static void req_free(nccl_req *q)
{
    forget(q);
    *q->live_prev = q->live_next;
    if (q->live_next) q->live_next->live_prev = q->live_prev;
    mal_gpu_event_destroy(q->done);
    q->magic = 0;
    free(q);
}

/* Post the member-list all-reduce without waiting (comm.h, "non-blocking
 * member-list all-reduce"): the list's stream waits for the kernel queue
 * (rule 1), ncclAllReduce goes on it, and the request's own `done` event
 * after it, which dp_waitall polls and makes the kernel queue wait for
 * (rule 3).  The host does not wait for the reduction; it waits only for
 * NCCL to settle the launch (ncclInProgress, non-blocking communicators),
 * and for the list's communicator where this is the list's first use. */
static int nccl_dp_iallreduce_list(mal_comm *c, mal_kern k, const int *members, int n, int tag,
                                   void *buf, size_t count, mal_dtype dt, mal_reduce_op op,
                                   mal_comm_req **out)
{
    const char *what = "member-list all-reduce (non-blocking)";
    ncclDataType_t t = ncclFloat32;
    channel *ch = NULL;
    int rc;
    *out = NULL;
    if ((rc = gpu_instance(k, what)) || (rc = dtype_of(dt, &t, what))) return rc;
    if (!(ch = list_channel_cached(c, members, n)) &&
        /* creating it blocks on the members: held sends go first */
        ((rc = launch_held()) || (rc = list_channel_get(c, members, n, tag, &ch))))
        return rc;
    if ((rc = alive(ch, what))) return rc;
    if (count == 0) return 0;
    nccl_req *q = NULL;
    nccl_req tmpl = {.magic = REQ_MAGIC,
                     .is_coll = 1,
                     .ch = ch,
                     .k = k,
                     .buf = buf,
                     .bytes = count * mal_dtype_bytes(dt),
                     .peer = -1,
                     .world_peer = -1};
    if ((rc = req_new(&tmpl, what, &q))) return rc;
    rc = called(ch,
                ncclAllReduce(buf, buf, count, t, op == MAL_OP_MAX ? ncclMax : ncclSum, ch->comm,
                              ch->stream),
                what);
    int e;
    if (!rc && (e = mal_gpu_event_record(q->done, ch->stream))) rc = cuda_err(e, what);
    if (rc) {
        req_free(q);
        return rc;
    }
    q->launched = 1;
    *out = (mal_comm_req *)(void *)q;
    return 0;
}

/* The collectives with a region per member (comm.h, dp_ilist), posted
 * like the non-blocking all-reduce above: one ncclReduce (reduce-scatter)
 * or ncclBroadcast (all-gather) per non-empty region, rooted at the
 * region's member (its index in the list is its rank in the list's
 * communicator), in one NCCL group on the list's stream, then the
 * request's `done` event. */
static int nccl_dp_ilist(mal_comm *c, mal_kern k, mal_list_coll kind, const int *members, int n,
                         int tag, void *buf, const size_t *counts, mal_dtype dt,
                         mal_comm_req **out)
{
    const char *what = kind == MAL_LIST_ALLGATHER ? "member-list all-gather (non-blocking)"
                                                  : "member-list reduce-scatter (non-blocking)";
    ncclDataType_t t = ncclFloat32;
    channel *ch = NULL;
    int rc;
    *out = NULL;
    if (kind != MAL_LIST_REDUCE_SCATTER && kind != MAL_LIST_ALLGATHER)
        return MAL_ERR(MAL_EINVAL, "member-list collective: unknown kind %d", (int)kind);
    if ((rc = gpu_instance(k, what)) || (rc = dtype_of(dt, &t, what))) return rc;
    if (!(ch = list_channel_cached(c, members, n)) &&
        /* creating it blocks on the members: held sends go first */
        ((rc = launch_held()) || (rc = list_channel_get(c, members, n, tag, &ch))))
        return rc;
    if ((rc = alive(ch, what))) return rc;
    size_t total = 0, es = mal_dtype_bytes(dt);
    for (int j = 0; j < n; j++)
        total += counts[j];
    if (n == 1 || total == 0) return 0;
    nccl_req *q = NULL;
    nccl_req tmpl = {.magic = REQ_MAGIC,
                     .is_coll = 1,
                     .ch = ch,
                     .k = k,
                     .buf = buf,
                     .bytes = total * es,
                     .peer = -1,
                     .world_peer = -1};
    if ((rc = req_new(&tmpl, what, &q))) return rc;
    ncclResult_t r = ncclGroupStart();
    size_t off = 0;
    for (int j = 0; j < n && r == ncclSuccess; off += counts[j], j++) {
        if (!counts[j]) continue;
        char *p = (char *)buf + off * es;
        r = kind == MAL_LIST_REDUCE_SCATTER
                ? ncclReduce(p, p, counts[j], t, ncclSum, j, ch->comm, ch->stream)
                : ncclBroadcast(p, p, counts[j], t, j, ch->comm, ch->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    rc = called(ch, r != ncclSuccess ? r : r2, what);
    int e;
    if (!rc && (e = mal_gpu_event_record(q->done, ch->stream))) rc = cuda_err(e, what);
    if (rc) {
        req_free(q);
        return rc;
    }
    q->launched = 1;
    *out = (mal_comm_req *)(void *)q;
    return 0;
}

/* Nothing to advance: the GPU runs what was launched, and held sends stay
 * held until a call that may block (comm.h). */
static int nccl_dp_progress(mal_comm *c)
{
    (void)c;
    return 0;
}

static int post(mal_comm *c, mal_kern k, void *buf, size_t bytes, int peer, int tag, int is_recv,
                mal_comm_req **out)
{
    const char *what = is_recv ? "data-plane receive" : "data-plane send";
    nccl_dp *dp = c->dp;
    channel *ch = dp->main;
    int rc;
    *out = NULL;
    if (peer < 0 || peer >= c->size)
        return MAL_ERR(MAL_EINVAL, "%s: peer %d is not a rank of this communicator of %d ranks",
                       what, peer, c->size);
    if (tag < 0) return MAL_ERR(MAL_EINVAL, "%s: tag %d is negative", what, tag);
    if ((rc = gpu_instance(k, what)) || (rc = alive(ch, what))) return rc;
    nccl_req *q = NULL;
    nccl_req tmpl = {.magic = REQ_MAGIC,
                     .is_recv = is_recv,
                     .ch = ch,
                     .k = k,
                     .buf = buf,
                     .bytes = bytes,
                     .peer = peer,
                     .world_peer = c->world_ranks[peer]};
    if ((rc = req_new(&tmpl, what, &q))) return rc;
    if (!is_recv) {
        /* held until the next blocking call (comm.h) */
        *G.held_tail = q;
        G.held_tail = &q->next;
    } else if (G.depth > 0) {
        *G.grouped_tail = q;
        G.grouped_tail = &q->next;
    } else if ((rc = launch_all(q))) {
        /* nothing to wait for: the caller gets the error now */
        req_free(q);
        return rc;
    }
    *out = (mal_comm_req *)(void *)q;
    return 0;
}

static int nccl_dp_isend(mal_comm *c, mal_kern k, const void *buf, size_t bytes, int peer,
                         int tag, mal_comm_req **req)
{
    /* ncclSend takes a const buffer; the cast only shares post() */
    return post(c, k, (void *)(uintptr_t)buf, bytes, peer, tag, 0, req);
}

static int nccl_dp_irecv(mal_comm *c, mal_kern k, void *buf, size_t bytes, int peer, int tag,
                         mal_comm_req **req)
{
    return post(c, k, buf, bytes, peer, tag, 1, req);
}

static int nccl_dp_group_start(mal_comm *c)
{
    (void)c;
    G.depth++;
    return 0;
}

/* Receives of the group go now, with every held send; a group of sends
 * alone stays held (comm.h). */
static int nccl_dp_group_end(mal_comm *c)
{
    (void)c;
    if (G.depth == 0)
        return MAL_ERR(MAL_EINVAL, "data-plane group end without a group start");
    if (--G.depth > 0 || !G.grouped) return 0;
    nccl_req *recvs = G.grouped;
    G.grouped = NULL;
    G.grouped_tail = &G.grouped;
    return launch_all(recvs);
}

static int nccl_dp_waitall(mal_comm *c, int n, mal_comm_req **reqs)
{
    (void)c;
    int err = 0;
    /* anything of these still held goes now (and every other held send:
     * waiting blocks the host) */
    for (int i = 0; i < n; i++) {
        nccl_req *q = (nccl_req *)(void *)reqs[i];
        if (q && q->magic == REQ_MAGIC && !q->launched && q->ch) {
            err = launch_held();
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        nccl_req *q = (nccl_req *)(void *)reqs[i];
        reqs[i] = NULL;
        if (!q) continue;
        int rc = 0;
        if (q->magic != REQ_MAGIC) {
            /* a control-plane (MPI) request: MPI's wait completes and
             * frees it */
            rc = mal_comm_mpi_wait((mal_comm_req *)(void *)q);
            if (!err) err = rc;
            continue;
        }
        const char *what = q->is_recv ? "receive" : "send";
        char desc[96];
        if (q->is_coll)
            snprintf(desc, sizeof desc, "member-list collective of %zu bytes", q->bytes);
        else
            snprintf(desc, sizeof desc, "%s of %zu bytes %s world rank %d", what, q->bytes,
                     q->is_recv ? "from" : "to", q->world_peer);
        if (q->err)
            rc = q->err;
        else if (!q->ch)
            rc = MAL_ERR(MAL_EINVAL, "NCCL: %s: its communicator was destroyed before the wait",
                         desc);
        else if (!q->launched)
            rc = MAL_ERR(MAL_EINVAL, "NCCL: %s was never launched (a receive posted in a group "
                                     "that was not ended?)",
                         desc);
        else if (!(rc = alive(q->ch, desc)) && !(rc = wait_on(q->ch, q->done, desc))) {
            int e = mal_gpu_stream_wait_event(queue_of(q->k), q->done); /* rule 3 */
            if (e) rc = cuda_err(e, desc);
        }
        if (!err) err = rc;
        req_free(q);
    }
    return err;
}

/* Every NCCL communicator of the process first, so that no kernel is left
 * spinning on the GPU, then the job through MPI. */
static void nccl_abort(mal_comm *c, int code)
{
    while (G.live) channel_abort(G.live);
    mal_comm_mpi_abort(c, code);
}

static const mal_comm_ops nccl_ops = {
    .name = "nccl",
    MAL_COMM_MPI_CONTROL_PLANE,
    .abort = nccl_abort,
    .dp_allreduce = nccl_dp_allreduce,
    .dp_allreduce_list = nccl_dp_allreduce_list,
    .dp_iallreduce_list = nccl_dp_iallreduce_list,
    .dp_ilist = nccl_dp_ilist,
    .dp_progress = nccl_dp_progress,
    .dp_isend = nccl_dp_isend,
    .dp_irecv = nccl_dp_irecv,
    .dp_group_start = nccl_dp_group_start,
    .dp_group_end = nccl_dp_group_end,
    .dp_waitall = nccl_dp_waitall,
    .dp_attach = nccl_attach,
    .dp_detach = nccl_detach,
    .dp_elapsed = nccl_dp_elapsed,
    .dp_trim = nccl_dp_trim,
};

/* Usable where a GPU is (ncclGetUniqueId succeeds without one, so it is no
 * test) and the timeout variable, if set, makes sense. */
static int nccl_probe(void)
{
    int rc = read_timeout();
    if (!rc) rc = read_max_lists();
    if (rc) return rc;
    int n = 0;
    int e = mal_gpu_device_count(&n);
    if (e) {
        mal_gpu_clear_error();
        return MAL_ERR(MAL_EDEVICE, "NCCL moves GPU buffers and there is no usable GPU here: %s (%s)",
                       mal_gpu_error_string(e), mal_gpu_error_name(e));
    }
    if (n < 1) return MAL_ERR(MAL_EDEVICE, "NCCL moves GPU buffers and CUDA sees no GPU here");
    return 0;
}

const mal_comm_backend mal_comm_backend_nccl = {
    .reg = {.name = "nccl", .probe = nccl_probe},
    .what = "NCCL for the data plane (GPU buffers, device to device), MPI for the control plane",
    .ops = &nccl_ops,
    .device = "cuda",
};
