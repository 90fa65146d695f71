/* Coordination of the processes that write a snapshot together: the
 * agreement on failure (every process returns the first failing rank's
 * code and message) and the block descriptors every process sends rank 0 when its
 * shards are written (a byte payload: serialized here, gathered to rank 0,
 * parsed there into the block table that snap_index.c checks and writes).
 */
#include "snap_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- agreement */

/* Through the comm table's control plane (comm.h): small host messages,
 * sleeping waits, whatever backend carries the data plane. */
int mal_snapshot_agree(mal_comm *comm, int rc)
{
    if (!comm || comm->size <= 1) return rc;
    int first = rc ? comm->rank : comm->size, r;
    if ((r = mal_comm_allreduce_min_int(comm, &first, 1))) return r;
    if (first >= comm->size) return 0;
    struct {
        int rc;
        char msg[SNAP_MSG];
    } e;
    memset(&e, 0, sizeof e);
    if (comm->rank == first) {
        e.rc = rc;
        snprintf(e.msg, sizeof e.msg, "%s", mal_errmsg());
    }
    if ((r = mal_comm_broadcast(comm, &e, sizeof e, first))) return r;
    if (comm->rank != first) return MAL_ERR(e.rc, "rank %d: %s", first, e.msg);
    return rc;
}

/* ---------------------------------------------------------------- descriptors */

static void snap_put_bytes(snap_buf *b, const void *x, size_t n)
{
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, x, n);
    b->len += n;
}

void snap_put_i32(snap_buf *b, int32_t v)
{
    snap_put_bytes(b, &v, sizeof v);
}
static void snap_put_u64(snap_buf *b, uint64_t v)
{
    snap_put_bytes(b, &v, sizeof v);
}
void snap_put_str(snap_buf *b, const char *s)
{
    snap_put_bytes(b, s, strlen(s) + 1);
}

/* Payload: int32 status; on failure the message; else int32 n_shards,
 * {int32 id, uint64 bytes}*, int32 n_blocks, {int32 shard (index into
 * this payload's shards), int32 ndim, int64 shape/offset/extent [4],
 * uint64 addr, uint32 crc, name NUL}*. */
int snap_serialize(const mal_snap_writer *w, int status, snap_buf *b)
{
    snap_put_i32(b, status);
    if (status) {
        snap_put_str(b, mal_errmsg());
    } else {
        snap_put_i32(b, w->n_sh);
        int32_t nb = 0;
        for (int i = 0; i < w->n_sh; i++) {
            snap_put_i32(b, w->sh[i].id);
            snap_put_u64(b, w->sh[i].bytes);
            nb += w->sh[i].n;
        }
        snap_put_i32(b, nb);
        for (int i = 0; i < w->n_sh; i++)
            for (int k = 0; k < w->sh[i].n; k++) {
                const snap_wblock *x = &w->sh[i].b[k];
                snap_put_i32(b, i);
                snap_put_i32(b, x->ndim);
                snap_put_bytes(b, x->shape, sizeof x->shape);
                snap_put_bytes(b, x->offset, sizeof x->offset);
                snap_put_bytes(b, x->extent, sizeof x->extent);
                snap_put_u64(b, x->addr);
                snap_put_bytes(b, &x->crc, sizeof x->crc);
                snap_put_str(b, x->name);
            }
    }
    return b->oom ? MAL_ERR(MAL_ENOMEM, "out of memory describing the shards") : 0;
}

typedef struct {
    const char *p, *end;
    int bad;
} snap_rd;

static void snap_get(snap_rd *r, void *x, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        memset(x, 0, n);
        return;
    }
    memcpy(x, r->p, n);
    r->p += n;
}

static char *snap_get_str(snap_rd *r)
{
    const char *z = r->bad ? NULL : memchr(r->p, '\0', (size_t)(r->end - r->p));
    if (!z) {
        r->bad = 1;
        return NULL;
    }
    char *s = (char *)r->p;
    r->p = z + 1;
    return s;
}

void snap_table_free(snap_table *t)
{
    free(t->b);
    for (int i = 0; i < t->ns; i++)
        free(t->s[i].file);
    free(t->s);
    memset(t, 0, sizeof *t);
}

/* Parse the payload of `rank` into t (names point into the payload).  A
 * failed rank gives its status and message. */
int snap_parse(snap_table *t, const char *p, size_t len, int rank, int *status, const char **msg)
{
    snap_rd r = {p, p + len, 0};
    int32_t st = 0, ns = 0, nb = 0;
    snap_get(&r, &st, sizeof st);
    *status = st;
    if (st) {
        *msg = snap_get_str(&r);
        if (!*msg) *msg = "(no message)";
        return 0;
    }
    snap_get(&r, &ns, sizeof ns);
    int base = t->ns;
    for (int32_t i = 0; i < ns && !r.bad; i++) {
        int32_t id = 0;
        uint64_t bytes = 0;
        snap_get(&r, &id, sizeof id);
        snap_get(&r, &bytes, sizeof bytes);
        if (mal_grow(&t->s, &t->cap_s, t->ns, sizeof *t->s, 16))
            return MAL_ERR(MAL_ENOMEM, "out of memory gathering shards");
        char fname[64];
        snprintf(fname, sizeof fname, SNAP_SHARD_FMT, id);
        t->s[t->ns] = (snap_shard){strdup(fname), id, bytes};
        if (!t->s[t->ns].file) return MAL_ERR(MAL_ENOMEM, "out of memory gathering shards");
        t->ns++;
    }
    snap_get(&r, &nb, sizeof nb);
    for (int32_t i = 0; i < nb && !r.bad; i++) {
        snap_block x;
        int32_t sh = 0, nd = 0;
        snap_get(&r, &sh, sizeof sh);
        snap_get(&r, &nd, sizeof nd);
        snap_get(&r, x.shape, sizeof x.shape);
        snap_get(&r, x.offset, sizeof x.offset);
        snap_get(&r, x.extent, sizeof x.extent);
        snap_get(&r, &x.addr, sizeof x.addr);
        snap_get(&r, &x.crc, sizeof x.crc);
        x.name = snap_get_str(&r);
        x.ndim = nd;
        x.shard = base + sh;
        if (r.bad || sh < 0 || sh >= ns) {
            r.bad = 1;
            break;
        }
        if (t->nb == t->cap_b) {
            int64_t cap = t->cap_b ? 2 * t->cap_b : 64;
            snap_block *nv = realloc(t->b, sizeof *nv * (size_t)cap);
            if (!nv) return MAL_ERR(MAL_ENOMEM, "out of memory gathering blocks");
            t->b = nv;
            t->cap_b = cap;
        }
        t->b[t->nb++] = x;
    }
    if (r.bad || r.p != r.end)
        return MAL_ERR(MAL_EFORMAT, "malformed block descriptors from rank %d", rank);
    return 0;
}

/* ---------------------------------------------------------------- gathering */

/* One gather-v (comm.h) brings every payload to rank 0; it fails on every
 * process alike when rank 0 cannot take them, so nobody waits for a
 * gather that never happens.  Rank 0 then removes its temporary
 * directory: nothing will be committed from it. */
int snap_gather(mal_snap_writer *w, const snap_buf *mine, char **all)
{
    void *got = NULL;
    int rc = mal_comm_gatherv(w->comm, mine->p, mine->len, 0, &got, w->counts);
    *all = got;
    if (!rc) return 0;
    if (w->rank == 0) snap_rmtree_at(w->dfd, w->tmpname, w->tmp);
    return MAL_ERR(rc, "gathering the block descriptors of %d processes at rank 0: %s", w->size,
                   mal_errmsg());
}
