/* All-reduce over a member list by a ring of point-to-point messages
 * (comm_ring.h). */
#include <stdint.h>
#include <stdlib.h>

#include "comm_ring.h"
#include "mal.h"

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

/* Send `sbytes` at s to `next` while receiving `rbytes` into r from `prev`,
 * in messages of at most MSG_MAX bytes (both sides cut alike). */
static int exchange(mal_comm *c, const char *s, size_t sbytes, int next, char *r, size_t rbytes,
                    int prev, int tag)
{
    int rc = 0;
    while ((sbytes || rbytes) && !rc) {
        size_t sn = MAL_MIN(sbytes, (size_t)MSG_MAX), rn = MAL_MIN(rbytes, (size_t)MSG_MAX);
        mal_comm_req *rq = NULL, *sq = NULL;
        if (rn) rc = mal_comm_irecv(c, r, rn, prev, tag, &rq);
        if (!rc && sn) rc = mal_comm_isend(c, s, sn, next, tag, &sq);
        int rc2 = mal_comm_wait(c, rq), rc3 = mal_comm_wait(c, sq);
        if (!rc) rc = rc2 ? rc2 : rc3;
        s += sn, sbytes -= sn;
        r += rn, rbytes -= rn;
    }
    return rc;
}

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

/* Small buffers: every member sends its buffer to the first, which
 * combines them in member order and sends the result back - two rounds of
 * latency whatever n, where the ring takes 2(n-1). */
static int via_first(mal_comm *c, const int *members, int n, int i, int tag, char *b, size_t bytes,
                     size_t count, mal_reduce_op op, char *scratch)
{
    int rc = 0;
    if (i > 0) {
        if ((rc = exchange(c, b, bytes, members[0], NULL, 0, members[0], tag))) return rc;
        return exchange(c, NULL, 0, members[0], b, bytes, members[0], tag);
    }
    mal_comm_req **rq = calloc((size_t)n, sizeof *rq);
    if (!rq) return MAL_ERR(MAL_ENOMEM, "all-reduce: out of memory");
    /* scratch holds n-1 buffers here (mal_comm_ring_scratch_bytes) */
    for (int k = 1; k < n && !rc; k++)
        rc = mal_comm_irecv(c, scratch + (size_t)(k - 1) * bytes, bytes, members[k], tag, &rq[k]);
    for (int k = 1; k < n; k++) {
        int rc2 = mal_comm_wait(c, rq[k]);
        if (!rc) rc = rc2;
    }
    for (int k = 1; k < n && !rc; k++)
        combine(b, scratch + (size_t)(k - 1) * bytes, count, op);
    for (int k = 1; k < n && !rc; k++)
        rc = mal_comm_isend(c, b, bytes, members[k], tag, &rq[k]);
    for (int k = 1; k < n; k++) {
        int rc2 = mal_comm_wait(c, rq[k]);
        if (!rc) rc = rc2;
    }
    free(rq);
    return rc;
}

int mal_comm_ring_allreduce(mal_comm *c, const int *members, int n, int tag, float *buf,
                            size_t count, mal_reduce_op op, void *scratch)
{
    int i = -1;
    for (int k = 0; k < n; k++)
        if (members[k] == c->rank) i = k;
    if (i < 0)
        return MAL_ERR(MAL_EINVAL, "ring all-reduce: rank %d is not among the %d members", c->rank,
                       n);
    if (n == 1 || count == 0) return 0;
    const size_t es = ES;
    if (count * es <= SMALL_BYTES)
        return via_first(c, members, n, i, tag, (char *)buf, count * es, count, op, scratch);
    const int next = members[(i + 1) % n], prev = members[(i + n - 1) % n];
    char *b = (char *)buf;
    int rc;
    /* Reduce-scatter: at step s, pass block i-s on and add block i-s-1 in;
     * after n-1 steps this member holds the whole of block i+1. */
    for (int s = 0; s < n - 1; s++) {
        int sb = ((i - s) % n + n) % n, rb = ((i - s - 1) % n + n) % n;
        size_t rl = blk_len(count, n, rb);
        if ((rc = exchange(c, b + blk_off(count, n, sb) * es, blk_len(count, n, sb) * es, next,
                           scratch, rl * es, prev, tag)))
            return rc;
        combine(b + blk_off(count, n, rb) * es, scratch, rl, op);
    }
    /* All-gather: at step s, pass block i+1-s on, receive block i-s. */
    for (int s = 0; s < n - 1; s++) {
        int sb = ((i + 1 - s) % n + n) % n, rb = ((i - s) % n + n) % n;
        if ((rc = exchange(c, b + blk_off(count, n, sb) * es, blk_len(count, n, sb) * es, next,
                           b + blk_off(count, n, rb) * es, blk_len(count, n, rb) * es, prev, tag)))
            return rc;
    }
    return 0;
}
