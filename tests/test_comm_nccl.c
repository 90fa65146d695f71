/* The NCCL data plane (comm/comm_nccl.c) against the MPI data plane, on device
 * buffers of the cuda kernel backend: every data-plane operation of comm.h,
 * run on NCCL and on MPI (staged through pinned host memory) with the same
 * inputs.  Run by tests/test_comm_nccl.sh on one rank (communicators of one
 * rank: what a one-GPU machine can run) and on as many ranks as there are
 * GPUs where there are two or more.  Exit 77 without a GPU, or with fewer
 * GPUs than ranks (NCCL before 2.30 refuses two ranks on one GPU).
 *
 *  - all-reduce: integer-valued floats (sums exact in any order) bitwise
 *    equal to MPI's and to the closed form; random floats within 1e-6 of
 *    MPI's and bitwise identical on every rank; bf16; counts 0 to 2^20+3;
 *  - member-list all-reduce (sum, max) over several lists, each against
 *    MPI's ring, and a list seen before creates no NCCL communicator;
 *  - the non-blocking member-list all-reduce: every list posted at once
 *    (in one order on every rank, progress between posts), each buffer
 *    doubled by a kernel queued right before its post (rule 1) and read
 *    by a kernel queued right after its wait (rule 3), waited for in the
 *    reverse order, against MPI's non-blocking one on the same inputs;
 *  - sends and receives: grouped (a 16 MiB and a small message), a held
 *    send completed by a later receive, and on two or more ranks the 1F1B
 *    exchange in opposite orders that an eager launch would deadlock;
 *  - the ordering rules: a kernel queued right before a send or all-reduce
 *    is seen by it (rule 1), one queued right after sees its result
 *    (rules 2 and 3);
 *  - the all-reduce is stream-ordered: behind a 300 ms stall of the kernel
 *    queue it returns at once, dp_elapsed waits for it and reports its own
 *    device time, not the stall's;
 *  - split and create_group make NCCL communicators (the attach path);
 *  - a control-plane request completes through dp_waitall;
 *  - member lists past MALLEUS_NCCL_MAX_LISTS are let go at dp_trim (with
 *    two or more ranks; on one rank the one list it can make is kept), not
 *    while a reduction on one is in flight, and made again when used;
 *  - a receive posted in an open group whose communicator is destroyed
 *    before the group ends fails at its wait (and launches nothing);
 *  - failure: an all-reduce behind a stall of the kernel queue that
 *    outlasts MALLEUS_NCCL_TIMEOUT=2: dp_elapsed fails with MAL_EDEVICE
 *    after about 2 s and the communicator refuses further work; a bad
 *    MALLEUS_NCCL_TIMEOUT or MALLEUS_NCCL_MAX_LISTS, a cpu kernel
 *    instance, a bad peer or tag are refused.
 * Inputs are drawn fresh each run (the seed is printed).  Rank 0 prints the
 * verdict.
 *
 * `test_comm_nccl --nccl-version` (no MPI, no GPU needed) prints the version
 * code of the NCCL library it runs with (ncclGetVersion: 22803 for 2.28.3)
 * and exits: tests/test_cuda_multirank.sh asks it whether ranks may share
 * a GPU (2.30 and newer, with NCCL_MULTI_RANK_GPU_ENABLE=1).
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"
#include "kernels/kernels.h"
#include "mal_test.h"

static int finished;
static uint64_t rng_state;
static size_t run_off; /* the same on every rank, new each run */

static void abort_unless_finished(void)
{
    if (!finished) MPI_Abort(MPI_COMM_WORLD, 1);
}

static uint64_t next_u64(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* uniform in [-1, 1) */
static float next_f(void)
{
    return (float)((double)(next_u64() >> 11) * 0x1.0p-52 - 1.0);
}

static void *upload(mal_kern k, const void *h, size_t bytes)
{
    void *d = mal_kern_alloc(k, bytes + 16);
    CHECK(d != NULL);
    mal_kern_from_host(k, d, h, bytes);
    return d;
}

static void download(mal_kern k, void *h, const void *d, size_t bytes)
{
    mal_kern_to_host(k, h, d, bytes);
    CHECK_OK(mal_kern_sync(k));
}

/* Every rank of w holds the same bytes (plain MPI). */
static void check_identical(mal_comm *w, const void *buf, size_t bytes, const char *what)
{
    if (!bytes || w->size == 1) return;
    unsigned char *all = malloc(bytes * (size_t)w->size);
    CHECK(all);
    CHECK(MPI_Allgather(buf, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                        mal_comm_mpi_handle(w)) == MPI_SUCCESS);
    for (int r = 0; r < w->size; r++)
        if (memcmp(all + (size_t)r * bytes, buf, bytes)) {
            fprintf(stderr, "rank %d: %s differs from rank %d's bits\n", w->rank, what, r);
            exit(1);
        }
    free(all);
}

/* The same all-reduce on the NCCL and the MPI data plane; the results come
 * back in out_nccl / out_mpi (host). */
static void allreduce_both(mal_comm *nc, mal_comm *mc, mal_kern k, const float *in, size_t n,
                           float *out_nccl, float *out_mpi)
{
    size_t bytes = n * sizeof(float);
    float *a = upload(k, in, bytes), *b = upload(k, in, bytes);
    CHECK_OK(mal_comm_dp_allreduce(nc, k, a, n, MAL_F32));
    CHECK_OK(mal_comm_dp_allreduce(mc, k, b, n, MAL_F32));
    download(k, out_nccl, a, bytes);
    download(k, out_mpi, b, bytes);
    mal_kern_free(k, a);
    mal_kern_free(k, b);
}

static void test_allreduce(mal_comm *nc, mal_comm *mc, mal_kern k)
{
    const size_t counts[] = {0, 1, 100, 4099, ((size_t)1 << 20) + 3};
    for (size_t ci = 0; ci < MAL_ARRAY_SIZE(counts); ci++) {
        size_t n = counts[ci];
        float *in = malloc(n * sizeof *in + 4), *x = malloc(n * sizeof *x + 4),
              *y = malloc(n * sizeof *y + 4);
        CHECK(in && x && y);
        /* integer-valued: every order of summation gives the same bits */
        for (size_t i = 0; i < n; i++)
            in[i] = (float)((i * 7 + (size_t)nc->rank * 13 + run_off) % 101);
        allreduce_both(nc, mc, k, in, n, x, y);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < nc->size; r++)
                want += (double)((i * 7 + (size_t)r * 13 + run_off) % 101);
            if ((double)x[i] != want || memcmp(&x[i], &y[i], sizeof x[i])) {
                fprintf(stderr, "all-reduce of %zu, element %zu: nccl %g, mpi %g, want %g\n", n,
                        i, (double)x[i], (double)y[i], want);
                exit(1);
            }
        }
        /* random values: within float rounding of MPI's, identical on every
         * rank */
        for (size_t i = 0; i < n; i++)
            in[i] = next_f();
        allreduce_both(nc, mc, k, in, n, x, y);
        for (size_t i = 0; i < n; i++)
            CHECK_CLOSE(x[i], y[i], 1e-6, 1e-6 * nc->size);
        check_identical(nc, x, n * sizeof *x, "nccl all-reduce");
        free(in);
        free(x);
        free(y);
    }

    /* bf16 (MPI's data plane reduces fp32 only): small integers, exact */
    size_t n = 1000;
    uint16_t *h = malloc(n * sizeof *h);
    CHECK(h);
    for (size_t i = 0; i < n; i++) {
        float f = (float)((i + (size_t)nc->rank) % 8);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        h[i] = (uint16_t)(u >> 16); /* exact: 0..7 have no low mantissa bits */
    }
    void *d = upload(k, h, n * sizeof *h);
    CHECK_OK(mal_comm_dp_allreduce(nc, k, d, n, MAL_BF16));
    download(k, h, d, n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        double want = 0;
        for (int r = 0; r < nc->size; r++)
            want += (double)((i + (size_t)r) % 8);
        if ((double)f != want) {
            fprintf(stderr, "bf16 all-reduce, element %zu: %g, want %g\n", i, (double)f, want);
            exit(1);
        }
    }
    mal_kern_free(k, d);
    free(h);
}

/* Lists: everyone in order, reversed, this rank alone, and (with 3 or more
 * ranks) the odd ranks and a pair.  Sum and max against MPI's ring. */
static void test_lists(mal_comm *nc, mal_comm *mc, mal_kern k)
{
    int P = nc->size;
    int *all = malloc((size_t)P * sizeof *all), *rev = malloc((size_t)P * sizeof *rev);
    int odd[4], n_odd = 0, pair[2] = {0, P - 1}, self[1] = {nc->rank};
    CHECK(all && rev);
    for (int r = 0; r < P; r++) {
        all[r] = r;
        rev[r] = P - 1 - r;
        if (r % 2 && n_odd < 4) odd[n_odd++] = r;
    }
    const struct {
        const int *m;
        int n;
    } lists[] = {{all, P}, {rev, P}, {self, 1}, {odd, n_odd}, {pair, P >= 2 ? 2 : 0}};
    const size_t counts[] = {1, 3, 100003};
    for (int again = 0; again < 2; again++) {
        int made0 = mal_comm_nccl_created;
        for (size_t li = 0; li < MAL_ARRAY_SIZE(lists); li++) {
            int in = 0;
            for (int j = 0; j < lists[li].n; j++)
                in |= lists[li].m[j] == nc->rank;
            for (size_t ci = 0; in && ci < MAL_ARRAY_SIZE(counts); ci++) {
                size_t n = counts[ci], bytes = n * sizeof(float);
                for (int op = 0; op < 2; op++) {
                    float *h = malloc(bytes), *x = malloc(bytes), *y = malloc(bytes);
                    CHECK(h && x && y);
                    for (size_t i = 0; i < n; i++)
                        h[i] = op ? next_f() : (float)((i * 3 + (size_t)nc->rank * 5) % 17);
                    float *a = upload(k, h, bytes), *b = upload(k, h, bytes);
                    mal_reduce_op o = op ? MAL_OP_MAX : MAL_OP_SUM;
                    CHECK_OK(mal_comm_dp_allreduce_list(nc, k, lists[li].m, lists[li].n, 5, a, n,
                                                        MAL_F32, o));
                    CHECK_OK(mal_comm_dp_allreduce_list(mc, k, lists[li].m, lists[li].n, 5, b, n,
                                                        MAL_F32, o));
                    download(k, x, a, bytes);
                    download(k, y, b, bytes);
                    /* integer sums and maxima are exact: bitwise equal */
                    if (memcmp(x, y, bytes)) {
                        fprintf(stderr, "list %zu, count %zu, %s: nccl and mpi differ\n", li, n,
                                op ? "max" : "sum");
                        exit(1);
                    }
                    mal_kern_free(k, a);
                    mal_kern_free(k, b);
                    free(h);
                    free(x);
                    free(y);
                }
            }
        }
        /* the second round finds every list's communicator made */
        if (again) CHECK_EQ_INT(mal_comm_nccl_created, made0);
    }
    free(all);
    free(rev);
}

/* The non-blocking member-list all-reduce on NCCL against MPI's, several
 * lists in flight at once.  Integer-valued inputs: sums and maxima exact
 * in any order, so the two backends must agree bit for bit. */
static void test_ilists(mal_comm *nc, mal_comm *mc, mal_kern k)
{
    int P = nc->size;
    int *all = malloc((size_t)P * sizeof *all), self[1] = {nc->rank}, pair[2] = {0, P - 1};
    CHECK(all);
    for (int r = 0; r < P; r++) all[r] = r;
    const struct {
        const int *m;
        int n;
        size_t count;
        mal_reduce_op op;
    } lists[] = {{all, P, 100003, MAL_OP_SUM},
                 {self, 1, 1000, MAL_OP_SUM},
                 {pair, P >= 2 ? 2 : 1, 7, MAL_OP_MAX},
                 {all, P, 5, MAL_OP_MAX}};
    enum { NL = MAL_ARRAY_SIZE(lists) };
    float *dn[NL] = {0}, *dm[NL] = {0};
    mal_comm_req *rn[NL] = {0}, *rm[NL] = {0};
    for (int be = 0; be < 2; be++) {
        mal_comm *c = be ? mc : nc;
        float **d = be ? dm : dn;
        mal_comm_req **rq = be ? rm : rn;
        for (int li = 0; li < NL; li++) {
            size_t n = lists[li].count, bytes = n * sizeof(float);
            int in = 0;
            for (int j = 0; j < lists[li].n; j++) in |= lists[li].m[j] == nc->rank;
            if (!in) continue;
            float *h = malloc(bytes);
            CHECK(h);
            for (size_t i = 0; i < n; i++) h[i] = (float)((i * 3 + (size_t)nc->rank * 5) % 17);
            d[li] = upload(k, h, bytes);
            free(h);
            mal_kern_scale(k, d[li], n, 2.0f); /* rule 1: the post must see it */
            CHECK_OK(mal_comm_dp_iallreduce_list(c, k, lists[li].m, lists[li].n, 7, d[li], n,
                                                 MAL_F32, lists[li].op, &rq[li]));
            CHECK_OK(mal_comm_dp_progress(c));
        }
        for (int li = NL - 1; li >= 0; li--) {
            if (!d[li]) continue;
            CHECK_OK(mal_comm_dp_waitall(c, 1, &rq[li]));
            /* rule 3: queued after the wait, it reads the result */
            mal_kern_scale(k, d[li], lists[li].count, 0.5f);
        }
    }
    for (int li = 0; li < NL; li++) {
        if (!dn[li]) continue;
        size_t n = lists[li].count, bytes = n * sizeof(float);
        float *x = malloc(bytes), *y = malloc(bytes);
        CHECK(x && y);
        download(k, x, dn[li], bytes);
        download(k, y, dm[li], bytes);
        for (size_t i = 0; i < n; i++) {
            double want = lists[li].op == MAL_OP_MAX ? -1 : 0;
            for (int j = 0; j < lists[li].n; j++) {
                double v = (double)((i * 3 + (size_t)lists[li].m[j] * 5) % 17);
                want = lists[li].op == MAL_OP_MAX ? (v > want ? v : want) : want + v;
            }
            if ((double)x[i] != want || (double)y[i] != want) {
                fprintf(stderr, "non-blocking list %d, element %zu: nccl %g, mpi %g, want %g\n",
                        li, i, (double)x[i], (double)y[i], want);
                exit(1);
            }
        }
        mal_kern_free(k, dn[li]);
        mal_kern_free(k, dm[li]);
        free(x);
        free(y);
    }
    free(all);
}

/* Grouped sends and receives around the ring (to itself on one rank); a
 * held send completed by a later receive; rule 1 and 3 by kernels queued
 * right before the send and right after the wait. */
static void test_p2p(mal_comm *nc, mal_kern k)
{
    int next = (nc->rank + 1) % nc->size, prev = (nc->rank + nc->size - 1) % nc->size;
    size_t big = (size_t)4 << 20; /* 16 MiB: larger than NCCL's buffers */
    float *hs = malloc(big * sizeof *hs), *hr = malloc(big * sizeof *hr);
    CHECK(hs && hr);
    for (size_t i = 0; i < big; i++)
        hs[i] = (float)((i * 5 + (size_t)nc->rank) % 251);
    float *ds = upload(k, hs, big * sizeof *hs), *dr = mal_kern_alloc(k, big * sizeof *dr);
    float small = (float)nc->rank, *dss = upload(k, &small, sizeof small),
          *dsr = mal_kern_alloc(k, sizeof(float));
    CHECK(dr && dsr);
    /* rule 1: the send must see this scaling, queued just before it */
    mal_kern_scale(k, ds, big, 2.0f);
    mal_comm_req *q[4] = {NULL, NULL, NULL, NULL};
    CHECK_OK(mal_comm_dp_group_start(nc));
    CHECK_OK(mal_comm_dp_irecv(nc, k, dr, big * sizeof *dr, prev, 21, &q[0]));
    CHECK_OK(mal_comm_dp_irecv(nc, k, dsr, sizeof(float), prev, 22, &q[1]));
    CHECK_OK(mal_comm_dp_isend(nc, k, ds, big * sizeof *ds, next, 21, &q[2]));
    CHECK_OK(mal_comm_dp_isend(nc, k, dss, sizeof(float), next, 22, &q[3]));
    CHECK_OK(mal_comm_dp_group_end(nc));
    CHECK_OK(mal_comm_dp_waitall(nc, 4, q));
    CHECK(q[0] == NULL && q[3] == NULL);
    /* rule 3: queued after the wait, this sees the received data */
    mal_kern_scale(k, dr, big, 3.0f);
    download(k, hr, dr, big * sizeof *hr);
    download(k, &small, dsr, sizeof small);
    CHECK_EQ_INT((int)small, prev);
    for (size_t i = 0; i < big; i++)
        if (hr[i] != 6.0f * (float)((i * 5 + (size_t)prev) % 251)) {
            fprintf(stderr, "grouped transfer, element %zu: %g, want %g\n", i, (double)hr[i],
                    6.0 * (double)((i * 5 + (size_t)prev) % 251));
            exit(1);
        }

    /* a send outside any group is held; the receive launches both */
    small = (float)(100 + nc->rank);
    mal_kern_from_host(k, dss, &small, sizeof small);
    CHECK_OK(mal_comm_dp_isend(nc, k, dss, sizeof(float), next, 23, &q[0]));
    CHECK_OK(mal_comm_dp_irecv(nc, k, dsr, sizeof(float), prev, 23, &q[1]));
    CHECK_OK(mal_comm_dp_waitall(nc, 2, q));
    download(k, &small, dsr, sizeof small);
    CHECK_EQ_INT((int)small, 100 + prev);

    /* 1F1B on two or more ranks: rank 0 sends activations 0 and 1, then
     * receives gradient 0; rank 1 receives activation 0, sends gradient 0,
     * receives activation 1.  Launched eagerly, 16 MiB sends deadlock. */
    if (nc->size >= 2 && nc->rank < 2) {
        mal_comm_req *a[3] = {NULL, NULL, NULL};
        float *act1 = mal_kern_alloc(k, big * sizeof *act1);
        CHECK(act1);
        if (nc->rank == 0) {
            CHECK_OK(mal_comm_dp_isend(nc, k, ds, big * sizeof *ds, 1, 30, &a[0]));
            CHECK_OK(mal_comm_dp_isend(nc, k, ds, big * sizeof *ds, 1, 31, &a[1]));
            CHECK_OK(mal_comm_dp_irecv(nc, k, dr, big * sizeof *dr, 1, 40, &a[2]));
            CHECK_OK(mal_comm_dp_waitall(nc, 1, &a[2]));
            CHECK_OK(mal_comm_dp_waitall(nc, 2, a));
        } else {
            CHECK_OK(mal_comm_dp_irecv(nc, k, dr, big * sizeof *dr, 0, 30, &a[0]));
            CHECK_OK(mal_comm_dp_waitall(nc, 1, &a[0]));
            CHECK_OK(mal_comm_dp_isend(nc, k, ds, big * sizeof *ds, 0, 40, &a[1]));
            CHECK_OK(mal_comm_dp_irecv(nc, k, act1, big * sizeof *act1, 0, 31, &a[2]));
            CHECK_OK(mal_comm_dp_waitall(nc, 1, &a[2]));
            CHECK_OK(mal_comm_dp_waitall(nc, 1, &a[1]));
        }
        download(k, hr, dr, big * sizeof *hr);
        int peer = 1 - nc->rank;
        for (size_t i = 0; i < big; i++)
            CHECK(hr[i] == 2.0f * (float)((i * 5 + (size_t)peer) % 251));
        mal_kern_free(k, act1);
    }

    /* a control-plane request completes through dp_waitall too */
    int sent = 7 + nc->rank, got = -1;
    CHECK_OK(mal_comm_irecv(nc, &got, sizeof got, prev, 50, &q[0]));
    CHECK_OK(mal_comm_isend(nc, &sent, sizeof sent, next, 50, &q[1]));
    CHECK_OK(mal_comm_dp_waitall(nc, 2, q));
    CHECK_EQ_INT(got, 7 + prev);

    /* refusals */
    CHECK_EQ_INT(mal_comm_dp_isend(nc, k, dss, 4, nc->size, 1, &q[0]), MAL_EINVAL);
    CHECK_EQ_INT(mal_comm_dp_irecv(nc, k, dsr, 4, prev, -1, &q[0]), MAL_EINVAL);
    void *bufs[] = {ds, dr, dss, dsr};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(k, bufs[i]);
    free(hs);
    free(hr);
}

/* A stand-in for compute the all-reduce must wait for (rule 1): the
 * kernel queue stalls for arg milliseconds (a host function on its
 * stream). */
static void CUDART_CB stall_ms(void *arg)
{
    long ms = (long)(intptr_t)arg;
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
    nanosleep(&ts, NULL);
}

/* Rule 1 and 2 for the all-reduce: scaled just before, scaled just after;
 * and stream order: the host does not wait for it, dp_elapsed does. */
static void test_order(mal_comm *nc, mal_kern k)
{
    size_t n = (size_t)8 << 20;
    float *h = malloc(n * sizeof *h);
    CHECK(h);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i % 13);
    float *d = upload(k, h, n * sizeof *h);
    CHECK_OK(mal_kern_sync(k));
    mal_kern_scale(k, d, n, 2.0f);
    CHECK(cudaLaunchHostFunc((cudaStream_t)mal_kern_native_queue(k), stall_ms, (void *)300) ==
          cudaSuccess);
    double t0 = mal_now();
    CHECK_OK(mal_comm_dp_allreduce(nc, k, d, n, MAL_F32));
    double queued = mal_now() - t0, dev = -1;
    mal_kern_scale(k, d, n, 3.0f);
    CHECK_OK(mal_comm_dp_elapsed(nc, &dev));
    double waited = mal_now() - t0;
    printf("rank %d: an all-reduce of %zu floats behind a 300 ms stall: queued in %.3f ms, "
           "done after %.1f ms, its device time %.3f ms\n",
           nc->rank, n, 1e3 * queued, 1e3 * waited, 1e3 * dev);
    CHECK(queued < 0.1);          /* the host did not wait for the stall */
    CHECK(waited >= 0.29);        /* dp_elapsed did */
    CHECK(dev > 0 && dev < 0.25); /* the reduction's own time, not the stall */
    CHECK_OK(mal_comm_dp_elapsed(nc, &dev));
    CHECK(dev == 0); /* read once */
    download(k, h, d, n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        if (h[i] != 6.0f * (float)nc->size * (float)(i % 13)) {
            fprintf(stderr, "ordering, element %zu: %g, want %g\n", i, (double)h[i],
                    6.0 * nc->size * (double)(i % 13));
            exit(1);
        }
    mal_kern_free(k, d);
    free(h);
}

/* split and create_group on the NCCL communicator make NCCL communicators
 * of their own (the attach path), which all-reduce within the group. */
static void test_groups(mal_comm *nc, mal_kern k)
{
    mal_comm *s = NULL, *g = NULL;
    int made = mal_comm_nccl_created;
    CHECK_OK(mal_comm_split(nc, nc->rank % 2, -nc->rank, &s));
    CHECK(s && !strcmp(s->ops->name, "nccl") && s->dp != NULL);
    CHECK_EQ_INT(mal_comm_nccl_created, made + 1);
    float v = 1.0f + (float)nc->rank, *d = upload(k, &v, sizeof v);
    CHECK_OK(mal_comm_dp_allreduce(s, k, d, 1, MAL_F32));
    download(k, &v, d, sizeof v);
    double want = 0;
    for (int r = nc->rank % 2; r < nc->size; r += 2)
        want += 1.0 + r;
    CHECK((double)v == want);
    int me[1] = {nc->rank};
    CHECK_OK(mal_comm_create_group(nc, me, 1, &g));
    CHECK(g && g->size == 1 && g->dp != NULL);
    v = 5.0f;
    mal_kern_from_host(k, d, &v, sizeof v);
    CHECK_OK(mal_comm_dp_allreduce(g, k, d, 1, MAL_F32));
    download(k, &v, d, sizeof v);
    CHECK(v == 5.0f);
    mal_kern_free(k, d);
    mal_comm_destroy(g);
    mal_comm_destroy(s);
}

/* Member lists past the cap (1) are let go at dp_trim, never while a
 * reduction on one is in flight, and made again when used after. */
static void test_trim(mal_comm *w, mal_kern k)
{
    CHECK(setenv("MALLEUS_NCCL_MAX_LISTS", "1", 1) == 0);
    mal_comm *t = NULL;
    CHECK_OK(mal_comm_dup(w, "nccl", &t)); /* the lookup reads the variable */
    int P = t->size, self[1] = {t->rank}, *all = malloc((size_t)P * sizeof *all);
    CHECK(all);
    for (int r = 0; r < P; r++)
        all[r] = r;
    float one = 1.0f, *d = upload(k, &one, sizeof one);
    int made = mal_comm_nccl_created;
    CHECK_OK(mal_comm_dp_allreduce_list(t, k, self, 1, 9, d, 1, MAL_F32, MAL_OP_SUM));
    CHECK_OK(mal_comm_dp_allreduce_list(t, k, all, P, 9, d, 1, MAL_F32, MAL_OP_SUM));
    int lists = P == 1 ? 1 : 2;
    CHECK_EQ_INT(mal_comm_nccl_created, made + lists);
    mal_comm_req *q = NULL;
    CHECK_OK(mal_comm_dp_iallreduce_list(t, k, all, P, 9, d, 1, MAL_F32, MAL_OP_SUM, &q));
    if (q) CHECK_EQ_INT(mal_comm_dp_trim(t), MAL_EINVAL); /* in flight: refused */
    CHECK_OK(mal_comm_dp_waitall(t, 1, &q));
    CHECK_OK(mal_comm_dp_trim(t));
    /* one list (one rank) stays within the cap; two go */
    CHECK_OK(mal_comm_dp_allreduce_list(t, k, all, P, 9, d, 1, MAL_F32, MAL_OP_SUM));
    CHECK_EQ_INT(mal_comm_nccl_created, made + lists + (P == 1 ? 0 : 1));
    download(k, &one, d, sizeof one);
    double want = (double)P * P * P; /* three sums over all (and one over self) */
    CHECK((double)one == want);
    CHECK_OK(mal_comm_dp_trim(t));
    mal_comm_destroy(t);
    mal_kern_free(k, d);
    free(all);
    CHECK(setenv("MALLEUS_NCCL_MAX_LISTS", "0", 1) == 0);
    const mal_comm_backend *b = NULL;
    CHECK_EQ_INT(mal_comm_lookup("nccl", &b), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "MALLEUS_NCCL_MAX_LISTS") != NULL);
    CHECK(unsetenv("MALLEUS_NCCL_MAX_LISTS") == 0);
    CHECK_OK(mal_comm_lookup("nccl", &b));
}

/* A receive posted in an open group, its communicator destroyed before the
 * group ends: the group's end launches nothing on the freed channel, and
 * the wait says why the receive never happened. */
static void test_group_destroyed(mal_comm *w, mal_comm *nc, mal_kern k)
{
    mal_comm *t = NULL;
    CHECK_OK(mal_comm_dup(w, "nccl", &t));
    void *d = mal_kern_alloc(k, 64);
    CHECK(d);
    mal_comm_req *q = NULL;
    CHECK_OK(mal_comm_dp_group_start(nc));
    CHECK_OK(mal_comm_dp_irecv(t, k, d, 64, t->rank, 3, &q));
    mal_comm_destroy(t);
    CHECK_OK(mal_comm_dp_group_end(nc)); /* the group's state is the process's */
    CHECK_EQ_INT(mal_comm_dp_waitall(nc, 1, &q), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "destroyed before the wait") != NULL);
    CHECK(q == NULL);
    mal_kern_free(k, d);
}

/* An all-reduce that cannot finish (the kernel queue it waits for stalls
 * 5 s, longer than the 2 s timeout): queued at once (stream order), then
 * dp_elapsed gives up after the timeout with MAL_EDEVICE, and the
 * communicator refuses more work.  Then a bad timeout value, and a kernel
 * instance NCCL cannot move. */
static void test_failures(mal_comm *w, mal_kern k)
{
    CHECK(setenv("MALLEUS_NCCL_TIMEOUT", "2", 1) == 0);
    mal_comm *t = NULL;
    CHECK_OK(mal_comm_dup(w, "nccl", &t)); /* the lookup reads the variable */
    float *d = mal_kern_alloc(k, 64);
    CHECK(d);
    CHECK(cudaLaunchHostFunc((cudaStream_t)mal_kern_native_queue(k), stall_ms, (void *)5000) ==
          cudaSuccess);
    double t0 = mal_now(), dev = 0;
    CHECK_OK(mal_comm_dp_allreduce(t, k, d, 16, MAL_F32));
    CHECK(mal_now() - t0 < 1.0);
    int rc = mal_comm_dp_elapsed(t, &dev);
    double took = mal_now() - t0;
    CHECK_EQ_INT(rc, MAL_EDEVICE);
    CHECK(strstr(mal_errmsg(), "did not finish in 2 s") != NULL);
    CHECK(took >= 1.9 && took < 30.0);
    printf("rank %d: an all-reduce that could not finish failed after %.2f s: %s\n", w->rank,
           took, mal_errmsg());
    CHECK_EQ_INT(mal_comm_dp_allreduce(t, k, d, 4, MAL_F32), MAL_EDEVICE);
    CHECK(strstr(mal_errmsg(), "aborted") != NULL);
    mal_comm_destroy(t);
    mal_kern_free(k, d);
    /* the kernel queue is usable after the abort */
    CHECK_OK(mal_kern_sync(k));

    const mal_comm_backend *b = NULL;
    CHECK(setenv("MALLEUS_NCCL_TIMEOUT", "soon", 1) == 0);
    CHECK_EQ_INT(mal_comm_lookup("nccl", &b), MAL_EINVAL);
    CHECK(unsetenv("MALLEUS_NCCL_TIMEOUT") == 0);
    CHECK_OK(mal_comm_lookup("nccl", &b)); /* back to the default */
    CHECK_EQ_INT(mal_comm_check_device(b, "cpu"), MAL_EINVAL);

    mal_kern cpu = NULL;
    CHECK_OK(mal_kern_create("cpu", NULL, &cpu));
    float one = 1.0f;
    mal_comm *nc = NULL;
    CHECK_OK(mal_comm_dup(w, "nccl", &nc));
    CHECK_EQ_INT(mal_comm_dp_allreduce(nc, cpu, &one, 1, MAL_F32), MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "--device cuda") != NULL);
    mal_comm_destroy(nc);
    mal_kern_destroy(cpu);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--nccl-version")) {
        int v = 0;
        ncclResult_t r = ncclGetVersion(&v);
        if (r != ncclSuccess) {
            fprintf(stderr, "ncclGetVersion: %s\n", ncclGetErrorString(r));
            return MAL_TEST_ERROR;
        }
        printf("%d\n", v);
        return 0;
    }
    mal_comm *w = NULL;
    CHECK_OK(mal_comm_init(&argc, &argv, &w));
    atexit(abort_unless_finished);

    /* skip alike on every rank: no GPU, NCCL unusable, too few GPUs */
    const mal_comm_backend *b = NULL;
    mal_kern k = NULL;
    mal_kern_config kc = mal_kern_config_default();
    int ok = mal_comm_lookup("nccl", &b) == 0 && mal_kern_create("cuda", &kc, &k) == 0;
    char why[256];
    snprintf(why, sizeof why, "%s", ok ? "" : mal_errmsg());
    if (ok) {
        int n = 0;
        cudaGetDeviceCount(&n);
        if (n < w->size) {
            ok = 0;
            snprintf(why, sizeof why, "%d ranks but %d GPUs (NCCL refuses two ranks on one GPU)",
                     w->size, n);
        }
    }
    int all_ok = ok;
    CHECK_OK(mal_comm_allreduce_min_int(w, &all_ok, 1));
    if (!all_ok) {
        if (w->rank == 0) printf("SKIP: %s\n", ok ? "another rank has no GPU" : why);
        finished = 1;
        if (k) mal_kern_destroy(k);
        mal_comm_finalize(w);
        return MAL_TEST_SKIP;
    }

    uint64_t seed = (uint64_t)time(NULL) * 2654435761u + 12345;
    CHECK_OK(mal_comm_broadcast(w, &seed, sizeof seed, 0));
    rng_state = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(w->rank + 1));
    run_off = (size_t)(seed % 97);
    if (w->rank == 0) printf("seed %llu, %d rank(s)\n", (unsigned long long)seed, w->size);

    mal_comm *nc = NULL, *mc = NULL;
    CHECK_OK(mal_comm_dup(w, "nccl", &nc));
    CHECK_OK(mal_comm_dup(w, "mpi", &mc));
    CHECK(!strcmp(nc->ops->name, "nccl") && nc->dp != NULL && mc->dp == NULL);
    CHECK(mal_comm_mpi_handle(nc) != MPI_COMM_NULL); /* the control plane is MPI's */

    test_allreduce(nc, mc, k);
    test_lists(nc, mc, k);
    test_ilists(nc, mc, k);
    test_p2p(nc, k);
    test_order(nc, k);
    test_groups(nc, k);
    test_trim(w, k);
    test_group_destroyed(w, nc, k);
    CHECK_OK(mal_comm_barrier(w));
    test_failures(w, k);

    mal_comm_destroy(nc);
    mal_comm_destroy(mc);
    CHECK_OK(mal_kern_sync(k));
    mal_kern_destroy(k);
    CHECK_OK(mal_comm_barrier(w));
    if (w->rank == 0) printf("PASS: every NCCL data-plane operation on %d rank(s)\n", w->size);
    finished = 1;
    mal_comm_finalize(w);
    return 0;
}
