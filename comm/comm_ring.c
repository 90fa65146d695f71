/* All-reduce over a member list by a ring of point-to-point messages, as
 * a state machine that never waits (comm_ring.h). */
#include "comm_ring.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "mpi_err.h"

/* Messages stay under the table's INT_MAX-byte limit. */
enum { MSG_MAX = 1 << 30 };
/* Up to this size the first member combines everything (via_first). */
enum { SMALL_BYTES = 64 << 10 };

enum { ES = sizeof(float) };

/* Block b of `count` elements cut into n nearly equal blocks. */
static size_t blk_off(size_t count, int n, int b)
{
    return count / (size_t)n * (size_t)b + MAL_MIN((size_t)b, count % (size_t)n);
}
static size_t blk_len(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n);
}

size_t mal_comm_ring_scratch_bytes(size_t count, int n)
{
    size_t bytes = count * ES;
    if (n < 1) n = 1;
    if (bytes <= SMALL_BYTES) return (size_t)n * bytes + 16; /* the first member's n-1 copies */
    return blk_len(count, n, 0) * ES + 16;
}

size_t mal_comm_ring_scratch_bytes_v(int kind, const size_t *counts, int n, size_t es)
{
    size_t total = 0, most = 0;
    for (int i = 0; i < n; i++)
        total += counts[i], most = MAL_MAX(most, counts[i]);
    /* an all-gather copies in place; a small reduce-scatter keeps a copy
     * of its region from each member, a ring one the block in transit */
    if (kind == MAL_LIST_ALLGATHER) return 16;
    return (total * es <= SMALL_BYTES ? (size_t)n : 1) * most * es + 16;
}

struct mal_ring {
    MPI_Comm comm;
    int *members, n, i, tag; /* i: this rank's index in the list */
    char *b, *scratch;
    size_t count;        /* elements in all */
    size_t es;           /* bytes per element */
    int kind;            /* 0 all-reduce, else a mal_list_coll */
    size_t *boff, *blen; /* [n]: ring block b (elements) */
    mal_reduce_op op;
    int small;         /* small buffers: via the first member (all-reduce),
                        * straight between the members (the others) */
    int step, n_steps; /* the step whose messages are in flight */
    /* the step's messages: requests, and for receives the bytes expected
     * (0 for sends) */
    MPI_Request *rq;
    size_t *expect;
    int n_rq, cap_rq;
};

static void combine(void *dst, const void *src, size_t n, mal_reduce_op op)
{
    float *d = dst;
    const float *x = src;
    if (op == MAL_OP_SUM)
        for (size_t i = 0; i < n; i++)
            d[i] += x[i];
    else
        for (size_t i = 0; i < n; i++)
            d[i] = x[i] > d[i] ? x[i] : d[i];
}

/* Post one message (a receive when `recv`), cut into pieces of at most
 * MSG_MAX bytes; both sides cut alike, and pieces between two ranks on one
 * tag match in the order posted. */
static int post(mal_ring *r, char *p, size_t bytes, int peer, int recv)
{
    while (bytes) {
        size_t nb = MAL_MIN(bytes, (size_t)MSG_MAX);
        if (r->n_rq == r->cap_rq) {
            int cap = r->cap_rq ? 2 * r->cap_rq : 8;
            MPI_Request *rq = realloc(r->rq, (size_t)cap * sizeof *rq);
            if (rq) r->rq = rq;
            size_t *ex = rq ? realloc(r->expect, (size_t)cap * sizeof *ex) : NULL;
            if (ex) r->expect = ex;
            if (!rq || !ex) return MAL_ERR(MAL_ENOMEM, "member-list all-reduce: out of memory");
            r->cap_rq = cap;
        }
        MPI_Request *q = &r->rq[r->n_rq];
        int rc = recv ? MPI_Irecv(p, (int)nb, MPI_BYTE, peer, r->tag, r->comm, q)
                      : MPI_Isend(p, (int)nb, MPI_BYTE, peer, r->tag, r->comm, q);
        if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, recv ? "MPI_Irecv" : "MPI_Isend");
        r->expect[r->n_rq++] = recv ? nb : 0;
        p += nb, bytes -= nb;
    }
    return 0;
}

/* Where region (= member) j of a collective with a region per member lies:
 * block j + 1 of the ring. */
static char *region(const mal_ring *r, int j, size_t *bytes)
{
    int b = (j + 1) % r->n;
    *bytes = r->blen[b] * r->es;
    return r->b + r->boff[b] * r->es;
}

/* The one step of a small collective with a region per member: a
 * reduce-scatter sends region k to member k and receives its own region
 * from every member into slot k of the scratch; an all-gather sends its
 * region to every member and receives theirs in place. */
static int post_direct(mal_ring *r)
{
    int rc = 0;
    size_t mine;
    char *own = region(r, r->i, &mine);
    for (int k = 0; k < r->n && !rc; k++) {
        if (k == r->i) continue;
        size_t bytes;
        char *p = region(r, k, &bytes);
        if (r->kind == MAL_LIST_REDUCE_SCATTER)
            rc = post(r, r->scratch + (size_t)k * mine, mine, r->members[k], 1);
        else
            rc = post(r, p, bytes, r->members[k], 1);
    }
    for (int k = 0; k < r->n && !rc; k++) {
        if (k == r->i) continue;
        size_t bytes;
        char *p = region(r, k, &bytes);
        rc = r->kind == MAL_LIST_REDUCE_SCATTER ? post(r, p, bytes, r->members[k], 0)
                                                : post(r, own, mine, r->members[k], 0);
    }
    return rc;
}

/* Post the messages of step r->step.
 * Small all-reduce (via the first member): step 0 every other member
 * sends its buffer to the first, which receives them into scratch; step 1
 * the first sends the combined result back.  Small collectives with a
 * region per member: one step (post_direct).
 * Ring: steps 0 .. n-2 reduce-scatter (pass block i-s on, receive block
 * i-s-1 into scratch, add it in: after n-1 steps this member holds the
 * whole of block i+1); steps n-1 .. 2n-3 all-gather (pass block i+1-t on,
 * receive block i-t in place). */
static int post_step(mal_ring *r)
{
    const int n = r->n, i = r->i, s = r->step;
    const size_t bytes = r->count * r->es;
    int rc = 0;
    r->n_rq = 0;
    if (r->small && r->kind) return post_direct(r);
    if (r->small) {
        if (i > 0) return post(r, r->b, bytes, r->members[0], s == 1);
        for (int k = 1; k < n && !rc; k++)
            rc = s == 0 ? post(r, r->scratch + (size_t)(k - 1) * bytes, bytes, r->members[k], 1)
                        : post(r, r->b, bytes, r->members[k], 0);
        return rc;
    }
    const int next = r->members[(i + 1) % n], prev = r->members[(i + n - 1) % n];
    int sb, rb;
    char *rp;
    if (s < n - 1) {
        sb = ((i - s) % n + n) % n, rb = ((i - s - 1) % n + n) % n;
        rp = r->scratch;
    } else {
        int t = s - (n - 1);
        sb = ((i + 1 - t) % n + n) % n, rb = ((i - t) % n + n) % n;
        rp = r->b + r->boff[rb] * r->es;
    }
    /* the receive first, so that the peer's send finds it posted */
    if ((rc = post(r, rp, r->blen[rb] * r->es, prev, 1))) return rc;
    return post(r, r->b + r->boff[sb] * r->es, r->blen[sb] * r->es, next, 0);
}

/* What a completed step leaves to do: the adds. */
static void finish_step(mal_ring *r)
{
    const int n = r->n, i = r->i, s = r->step;
    if (r->small && r->kind == MAL_LIST_REDUCE_SCATTER) {
        /* this member's region, combined in list order (slot k holds
         * member k's copy, its own is in place): the same bits as the
         * small all-reduce gives for every element */
        size_t bytes;
        char *own = region(r, i, &bytes);
        const size_t cnt = bytes / r->es;
        char *acc = i == 0 ? own : r->scratch;
        for (int k = 1; k < n; k++)
            combine(acc, k == i ? own : r->scratch + (size_t)k * bytes, cnt, r->op);
        if (acc != own) memcpy(own, acc, bytes);
        return;
    }
    if (r->small && r->kind) return; /* an all-gather: received in place */
    if (r->small) {
        if (i == 0 && s == 0) /* in list order: the same bits on every run */
            for (int k = 1; k < n; k++)
                combine(r->b, r->scratch + (size_t)(k - 1) * r->count * ES, r->count, r->op);
        return;
    }
    if (s < n - 1) {
        int rb = ((i - s - 1) % n + n) % n;
        combine(r->b + r->boff[rb] * r->es, r->scratch, r->blen[rb], r->op);
    }
}

/* The machine for a list (no messages yet). */
static int ring_new(MPI_Comm comm, int rank, const int *members, int n, int tag, void *buf,
                    mal_ring **out)
{
    *out = NULL;
    int i = -1;
    for (int k = 0; k < n; k++)
        if (members[k] == rank) i = k;
    if (i < 0)
        return MAL_ERR(MAL_EINVAL, "member-list collective: rank %d is not among the %d members",
                       rank, n);
    mal_ring *r = calloc(1, sizeof *r);
    if (!r || !(r->members = malloc((size_t)n * sizeof *r->members)) ||
        !(r->boff = malloc((size_t)n * sizeof *r->boff)) ||
        !(r->blen = malloc((size_t)n * sizeof *r->blen))) {
        mal_comm_ring_free(r);
        return MAL_ERR(MAL_ENOMEM, "member-list collective: out of memory");
    }
    memcpy(r->members, members, (size_t)n * sizeof *members);
    r->comm = comm;
    r->n = n, r->i = i, r->tag = tag;
    r->b = (char *)buf;
    *out = r;
    return 0;
}

/* Post the first step (none when there is nothing to do). */
static int ring_go(mal_ring *r, mal_ring **out)
{
    int rc = r->n_steps ? post_step(r) : 0;
    if (rc) {
        mal_comm_ring_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int mal_comm_ring_start(MPI_Comm comm, int rank, const int *members, int n, int tag, float *buf,
                        size_t count, mal_reduce_op op, void *scratch, mal_ring **out)
{
    mal_ring *r;
    int rc = ring_new(comm, rank, members, n, tag, buf, &r);
    if (rc) return rc;
    r->scratch = scratch;
    r->count = count, r->es = ES, r->op = op;
    for (int b = 0; b < n; b++)
        r->boff[b] = blk_off(count, n, b), r->blen[b] = blk_len(count, n, b);
    r->small = count * ES <= SMALL_BYTES;
    /* one member or nothing to add: done before it starts */
    r->n_steps = n == 1 || count == 0 ? 0 : r->small ? 2 : 2 * (n - 1);
    return ring_go(r, out);
}

int mal_comm_ring_start_v(MPI_Comm comm, int rank, const int *members, int n, int tag, void *buf,
                          size_t es, const size_t *counts, int kind, mal_reduce_op op,
                          void *scratch, mal_ring **out)
{
    if (kind != MAL_LIST_REDUCE_SCATTER && kind != MAL_LIST_ALLGATHER)
        return MAL_ERR(MAL_EINVAL, "member-list collective: unknown kind %d", kind);
    if (kind == MAL_LIST_REDUCE_SCATTER && es != ES)
        return MAL_ERR(MAL_EINVAL, "member-list reduce-scatter: combines floats only");
    mal_ring *r;
    int rc = ring_new(comm, rank, members, n, tag, buf, &r);
    if (rc) return rc;
    r->scratch = scratch;
    r->es = es, r->kind = kind, r->op = op;
    /* block b of the ring is region b - 1 */
    size_t off = 0;
    for (int j = 0; j < n; j++) {
        r->boff[(j + 1) % n] = off, r->blen[(j + 1) % n] = counts[j];
        off += counts[j];
    }
    r->count = off;
    r->small = off * es <= SMALL_BYTES;
    /* the reduce-scatter half of the ring, or the all-gather half */
    if (n == 1 || off == 0)
        r->n_steps = 0;
    else if (r->small)
        r->n_steps = 1;
    else if (kind == MAL_LIST_REDUCE_SCATTER)
        r->n_steps = n - 1;
    else
        r->step = n - 1, r->n_steps = 2 * (n - 1);
    return ring_go(r, out);
}

int mal_comm_ring_progress(mal_ring *r, int *done)
{
    *done = 0;
    while (r->step < r->n_steps) {
        for (int k = 0; k < r->n_rq; k++) {
            if (r->rq[k] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            MPI_Status st;
            int rc = MPI_Test(&r->rq[k], &flag, &st);
            if (rc != MPI_SUCCESS) return MAL_MPI_ERR(rc, "member-list all-reduce");
            if (!flag) return 0; /* the step is not complete: come back later */
            if (!r->expect[k]) continue;
            /* a receive: exactly the bytes expected, or the peers disagree
             * about the reduction (MPI alone would not report a shorter
             * message) */
            int got = 0; /* messages stay under INT_MAX bytes (above) */
            if ((rc = MPI_Get_count(&st, MPI_BYTE, &got)) != MPI_SUCCESS)
                return MAL_MPI_ERR(rc, "MPI_Get_count");
            if (got < 0 || (size_t)got != r->expect[k])
                return MAL_ERR(MAL_EMISMATCH,
                               "member-list all-reduce: received %lld bytes from a member (tag %d) "
                               "but %zu were expected: the members disagree on what they reduce",
                               (long long)got, r->tag, r->expect[k]);
        }
        finish_step(r);
        r->n_rq = 0;
        if (++r->step < r->n_steps) {
            int rc = post_step(r);
            if (rc) return rc;
        }
    }
    *done = 1;
    return 0;
}

void mal_comm_ring_free(mal_ring *r)
{
    if (!r) return;
    free(r->boff);
    free(r->blen);
    for (int k = 0; k < r->n_rq; k++)
        if (r->rq[k] != MPI_REQUEST_NULL) {
            MPI_Cancel(&r->rq[k]);
            MPI_Request_free(&r->rq[k]);
        }
    free(r->rq);
    free(r->expect);
    free(r->members);
    free(r);
}
