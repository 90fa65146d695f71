/* MPI backend of comm.h on 8 ranks (run by tests/test_comm.sh through
 * tests/mpirun.sh): every operation on the world communicator, on uneven
 * communicators from split and create_group, and on a one-rank
 * communicator; all-reduce results checked against exact sums and for
 * bitwise identity across ranks; the chunk path; error paths; the data
 * plane on device buffers of the cpu and cpu-opaque kernel backends, the
 * non-blocking member-list all-reduce with several outstanding (bitwise
 * against the documented combination order and the blocking one); and that a
 * waiting rank sleeps instead of burning a core.  Prints the cost of a small
 * all-reduce next to plain blocking MPI_Allreduce.  Rank 0 prints the
 * verdict.
 *
 * Independent references: expected values are computed locally from the
 * members' world ranks; identity across ranks and p2p contents are checked
 * with plain MPI calls, not the code under test.
 */
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "comm/comm.h"
#include "comm/comm_mpi.h"
#include "comm/mpi_bytes.h"
#include "comm/comm_pool.h"
#include "mal_test.h"

#define NPROCS 8

static int world_rank;
static int finished;

/* CHECK() exits with 1 on the failing rank only; the others would wait for
 * it until the launcher's timeout.  MPI_Abort ends the whole job now. */
static void abort_unless_finished(void)
{
    if (!finished) MPI_Abort(MPI_COMM_WORLD, 1);
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every member of mc holds the same `bytes` at buf (plain MPI_Allgather). */
static void check_identical(MPI_Comm mc, const void *buf, size_t bytes, const char *what)
{
    int size;
    MPI_Comm_size(mc, &size);
    if (bytes == 0) return;
    unsigned char *all = malloc(bytes * (size_t)size);
    CHECK(all);
    CHECK(MPI_Allgather(buf, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, mc) == MPI_SUCCESS);
    for (int r = 0; r < size; r++)
        if (memcmp(all + (size_t)r * bytes, buf, bytes) != 0) {
            fprintf(stderr, "world rank %d: %s differs from member %d's bit pattern\n", world_rank,
                    what, r);
            exit(1);
        }
    free(all);
}

/* Integer-valued contributions: every partial sum is exact. */
static double ival(int wr, size_t i)
{
    return (double)((wr + 1) * (int)(i % 17) + (int)(i % 5));
}
/* Contributions whose float sum rounds, spread over many exponents. */
static double fval(int wr, size_t i)
{
    return sin(0.37 * wr + 0.011 * (double)i) * exp2((double)((int)(i % 23) - 11));
}

/* n elements: 100 takes the reduce + broadcast path, 20011 (uneven blocks
 * on every communicator here) the reduce-scatter + all-gather path. */
static void test_allreduce(mal_comm *c, MPI_Comm mc, size_t n, const char *label)
{
    int wr = c->world_ranks[c->rank];
    float *f = malloc(n * sizeof *f);
    double *d = malloc(n * sizeof *d);
    CHECK(f && d);

    /* exact sums */
    for (size_t i = 0; i < n; i++)
        f[i] = (float)ival(wr, i), d[i] = ival(wr, i);
    CHECK_OK(mal_comm_allreduce_f32(c, f, n));
    CHECK_OK(mal_comm_allreduce_f64(c, d, n));
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < c->size; r++)
            want += ival(c->world_ranks[r], i);
        if (f[i] != (float)want || d[i] != want) {
            fprintf(stderr, "%s, n %zu: sum[%zu] = %g (f32) / %g (f64), want %g\n", label, n, i,
                    f[i], d[i], want);
            exit(1);
        }
    }

    /* rounded sums: the same bits everywhere, close to a double reference */
    for (size_t i = 0; i < n; i++)
        f[i] = (float)fval(wr, i), d[i] = fval(wr, i);
    CHECK_OK(mal_comm_allreduce_f32(c, f, n));
    CHECK_OK(mal_comm_allreduce_f64(c, d, n));
    check_identical(mc, f, n * sizeof *f, "float sum");
    check_identical(mc, d, n * sizeof *d, "double sum");
    for (size_t i = 0; i < n; i++) {
        double want = 0, mag = 0;
        for (int r = 0; r < c->size; r++) {
            double v = fval(c->world_ranks[r], i);
            want += (double)(float)v;
            mag += fabs(v);
        }
        CHECK_CLOSE(f[i], want, 0, 1e-6 * mag);
        CHECK_CLOSE(d[i], want, 0, 1e-6 * mag); /* float inputs vs double: same tolerance */
    }

    /* max, with negatives */
    for (size_t i = 0; i < n; i++)
        d[i] = (double)((wr * 31 + (int)i * 7) % 101) - 50.5;
    CHECK_OK(mal_comm_allreduce_max_f64(c, d, n));
    for (size_t i = 0; i < n; i++) {
        double want = -INFINITY;
        for (int r = 0; r < c->size; r++)
            want = fmax(want, (double)((c->world_ranks[r] * 31 + (int)i * 7) % 101) - 50.5);
        if (d[i] != want) {
            fprintf(stderr, "%s, n %zu: max[%zu] = %g, want %g\n", label, n, i, d[i], want);
            exit(1);
        }
    }
    check_identical(mc, d, n * sizeof *d, "max");

    /* sizes 0 and 1 */
    f[0] = 123.0f;
    CHECK_OK(mal_comm_allreduce_f32(c, f, 0));
    CHECK(f[0] == 123.0f);
    CHECK_OK(mal_comm_allreduce_f64(c, NULL, 0));
    CHECK_OK(mal_comm_allreduce_max_f64(c, NULL, 0));
    f[0] = (float)(wr + 1);
    d[0] = -(double)wr;
    CHECK_OK(mal_comm_allreduce_f32(c, f, 1));
    CHECK_OK(mal_comm_allreduce_max_f64(c, d, 1));
    double wsum = 0, wmax = -INFINITY;
    for (int r = 0; r < c->size; r++)
        wsum += c->world_ranks[r] + 1, wmax = fmax(wmax, -(double)c->world_ranks[r]);
    CHECK_EQ_INT(f[0], wsum);
    CHECK(d[0] == wmax);
    free(f);
    free(d);
}

static unsigned char pattern(int wr, size_t i)
{
    return (unsigned char)(wr * 37 + i * 11 + 5);
}

static void test_broadcast_gather(mal_comm *c, const char *label)
{
    int wr = c->world_ranks[c->rank];
    /* broadcast from the last member (non-zero whenever size > 1) */
    int root = c->size - 1, rwr = c->world_ranks[root];
    size_t nb = 4097;
    unsigned char *b = malloc(nb);
    CHECK(b);
    for (size_t i = 0; i < nb; i++)
        b[i] = c->rank == root ? pattern(rwr, i) : 0xEE;
    CHECK_OK(mal_comm_broadcast(c, b, nb, root));
    for (size_t i = 0; i < nb; i++)
        CHECK_EQ_INT(b[i], pattern(rwr, i));
    CHECK_OK(mal_comm_broadcast(c, b, 0, root));
    CHECK_EQ_INT(mal_comm_broadcast(c, b, 1, c->size), MAL_EINVAL);
    free(b);

    /* gather at member 1 (0 for a single rank) */
    root = c->size > 1 ? 1 : 0;
    size_t gb = 37;
    unsigned char send[37], *recv = malloc(gb * (size_t)c->size);
    CHECK(recv);
    for (size_t i = 0; i < gb; i++)
        send[i] = pattern(wr, i);
    memset(recv, 0xEE, gb * (size_t)c->size);
    CHECK_OK(mal_comm_gather(c, send, recv, gb, root));
    if (c->rank == root)
        for (int r = 0; r < c->size; r++)
            for (size_t i = 0; i < gb; i++)
                CHECK_EQ_INT(recv[(size_t)r * gb + i], pattern(c->world_ranks[r], i));
    CHECK_OK(mal_comm_gather(c, send, recv, 0, root));
    CHECK_EQ_INT(mal_comm_gather(c, send, recv, gb, -1), MAL_EINVAL);
    free(recv);
    CHECK_OK(mal_comm_barrier(c));
    (void)label;
}

/* Control plane: min over ints, and gather-v with a different size from
 * every member (member r sends 3r + 1 bytes, member 1 none) at the last
 * member; a total over INT_MAX fails on every member before any data
 * moves, and the communicator works on afterwards. */
static void test_control(mal_comm *c, const char *label)
{
    int wr = c->world_ranks[c->rank];
    /* element 0: the lowest world rank; element 1: the lowest of a value
     * only member size/2 holds; element 2: INT_MIN survives */
    int v[3] = {wr, c->rank == c->size / 2 ? -7 - wr : 1000, c->rank == 0 ? INT32_MIN : 5};
    CHECK_OK(mal_comm_allreduce_min_int(c, v, 3));
    int lowest = c->world_ranks[0];
    for (int r = 1; r < c->size; r++)
        lowest = MAL_MIN(lowest, c->world_ranks[r]);
    CHECK_EQ_INT(v[0], lowest);
    CHECK_EQ_INT(v[1], -7 - c->world_ranks[c->size / 2]);
    CHECK_EQ_INT(v[2], INT32_MIN);
    CHECK_OK(mal_comm_allreduce_min_int(c, v, 0));

    int root = c->size - 1;
    size_t mine = c->rank == 1 ? 0 : 3 * (size_t)c->rank + 1;
    unsigned char send[64];
    for (size_t i = 0; i < mine; i++)
        send[i] = pattern(wr, i);
    size_t *counts = malloc(sizeof *counts * (size_t)c->size);
    void *out = (void *)counts; /* must come back NULL off the root */
    CHECK(counts);
    CHECK_OK(mal_comm_gatherv(c, send, mine, root, &out, counts));
    if (c->rank == root) {
        const unsigned char *p = out;
        CHECK(p != NULL);
        for (int r = 0; r < c->size; r++) {
            size_t want = r == 1 ? 0 : 3 * (size_t)r + 1;
            CHECK_EQ_INT(counts[r], want);
            for (size_t i = 0; i < want; i++)
                CHECK_EQ_INT(*p++, pattern(c->world_ranks[r], i));
        }
    } else {
        CHECK(out == NULL);
    }
    free(out);

    /* a contribution over INT_MAX bytes (member 0's claim; its buffer is
     * never read): MAL_EINVAL everywhere, and nothing is left in flight */
    out = NULL;
    CHECK_EQ_INT(mal_comm_gatherv(c, send, c->rank == 0 ? (size_t)INT32_MAX + 1 : 1, root, &out,
                                  counts),
                 MAL_EINVAL);
    CHECK(out == NULL);
    CHECK_EQ_INT(mal_comm_gatherv(c, send, 1, c->size, &out, counts), MAL_EINVAL);
    int one = 1;
    CHECK_OK(mal_comm_gatherv(c, &one, sizeof one, 0, &out, counts));
    if (c->rank == 0) {
        for (int r = 0; r < c->size; r++)
            CHECK_EQ_INT(counts[r], sizeof one);
        CHECK_EQ_INT(((int *)out)[c->size - 1], 1);
    }
    free(out);
    free(counts);
    CHECK_OK(mal_comm_barrier(c));
    (void)label;
}

/* Ring: every member sends to the next and receives from the previous. */
static void test_ring(mal_comm *c, const char *label)
{
    int wr = c->world_ranks[c->rank];
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    int pwr = c->world_ranks[prev];
    int s11 = wr * 100 + 11, s12 = wr * 100 + 12, r11 = -1, r12 = -1;
    mal_comm_req *q[4];

    /* two tags in flight, received in the opposite order of sending */
    CHECK_OK(mal_comm_isend(c, &s11, sizeof s11, next, 11, &q[0]));
    CHECK_OK(mal_comm_isend(c, &s12, sizeof s12, next, 12, &q[1]));
    CHECK_OK(mal_comm_irecv(c, &r12, sizeof r12, prev, 12, &q[2]));
    CHECK_OK(mal_comm_irecv(c, &r11, sizeof r11, prev, 11, &q[3]));
    for (int k = 3; k >= 0; k--)
        CHECK_OK(mal_comm_wait(c, q[k]));
    CHECK_EQ_INT(r11, pwr * 100 + 11);
    CHECK_EQ_INT(r12, pwr * 100 + 12);

    /* messages sent before the receive exists: a small (eager) one and a
     * large (rendezvous) one; the barrier makes sure the sends come first */
    size_t big = (size_t)1 << 20;
    unsigned char small_s[64], small_r[64], *bs = malloc(big), *br = malloc(big);
    CHECK(bs && br);
    for (size_t i = 0; i < big; i++)
        bs[i] = pattern(wr, i);
    for (size_t i = 0; i < sizeof small_s; i++)
        small_s[i] = pattern(wr + 50, i);
    memset(br, 0, big);
    memset(small_r, 0, sizeof small_r);
    CHECK_OK(mal_comm_isend(c, small_s, sizeof small_s, next, 13, &q[0]));
    CHECK_OK(mal_comm_isend(c, bs, big, next, 14, &q[1]));
    CHECK_OK(mal_comm_barrier(c));
    CHECK_OK(mal_comm_irecv(c, br, big, prev, 14, &q[2]));
    CHECK_OK(mal_comm_irecv(c, small_r, sizeof small_r, prev, 13, &q[3]));
    for (int k = 0; k < 4; k++)
        CHECK_OK(mal_comm_wait(c, q[k]));
    for (size_t i = 0; i < big; i++)
        CHECK_EQ_INT(br[i], pattern(pwr, i));
    for (size_t i = 0; i < sizeof small_r; i++)
        CHECK_EQ_INT(small_r[i], pattern(pwr + 50, i));
    free(bs);
    free(br);

    /* local argument errors */
    CHECK_EQ_INT(mal_comm_isend(c, &s11, 4, c->size, 1, &q[0]), MAL_EINVAL);
    CHECK(q[0] == NULL);
    CHECK_EQ_INT(mal_comm_irecv(c, &r11, (size_t)INT32_MAX + 1, prev, 1, &q[0]), MAL_EINVAL);
    CHECK_EQ_INT(mal_comm_irecv(c, &r11, 4, prev, -3, &q[0]), MAL_EINVAL);
    CHECK_OK(mal_comm_wait(c, NULL));
    (void)label;
}

static void run_ops(mal_comm *c, const char *label)
{
    MPI_Comm mc = mal_comm_mpi_handle(c);
    CHECK(mc != MPI_COMM_NULL);
    CHECK(100 * sizeof(double) < MAL_COMM_MPI_SMALL_BYTES);
    CHECK(20011 * sizeof(float) >= MAL_COMM_MPI_SMALL_BYTES);
    test_allreduce(c, mc, 100, label);
    test_allreduce(c, mc, 20011, label);
    test_broadcast_gather(c, label);
    test_control(c, label);
    test_ring(c, label);
}

/* The data plane on device buffers of kernel instance k (cpu: in place;
 * cpu-opaque: staged through pinned host buffers, since its buffers cannot
 * be read by the host - any slip would crash here).
 *  - reduction over member lists of the world (no communicator of their
 *    own): integer-valued floats sum exactly, so every member must hold
 *    exactly the closed-form sum and max; both paths (first member
 *    combines / ring), counts below the member count and not divisible by
 *    it;
 *  - all-reduce over the world: exact sums;
 *  - grouped sends and receives around the ring of all ranks, a small and
 *    a large message, and a receive that expects more than was sent;
 *  - refusals: a list without the caller, bf16 on the MPI data plane. */
static float *dev_upload(mal_kern k, const float *h, size_t n)
{
    float *d = mal_kern_alloc(k, n * sizeof *d + 4);
    CHECK(d != NULL);
    mal_kern_from_host(k, d, h, n * sizeof *d);
    return d;
}

static void dev_download(mal_kern k, float *h, const float *d, size_t n)
{
    mal_kern_to_host(k, h, d, n * sizeof *h);
    CHECK_OK(mal_kern_sync(k));
}

static void test_data_plane(mal_comm *w, const char *device)
{
    mal_kern k;
    CHECK_OK(mal_kern_create(device, NULL, &k));
    static const int odd[] = {1, 3, 5, 7}, mixed[] = {6, 0, 3}, pair[] = {2, 4};
    const struct {
        const int *m;
        int n;
    } groups[] = {{odd, 4}, {mixed, 3}, {pair, 2}};
    const size_t counts[] = {1, 3, 1000, 100003};
    for (size_t gi = 0; gi < MAL_ARRAY_SIZE(groups); gi++) {
        const int *m = groups[gi].m, n = groups[gi].n;
        int in = 0;
        for (int j = 0; j < n; j++)
            in |= m[j] == w->rank;
        for (size_t ci = 0; in && ci < MAL_ARRAY_SIZE(counts); ci++) {
            size_t count = counts[ci];
            float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
            CHECK(x && y);
            for (size_t i = 0; i < count; i++) {
                x[i] = (float)((i * 7 + (size_t)w->rank * 13) % 101);
                y[i] = (float)((i * 3 + (size_t)w->rank * 5) % 17) - 8.0f;
            }
            float *dx = dev_upload(k, x, count), *dy = dev_upload(k, y, count);
            CHECK_OK(mal_comm_dp_allreduce_list(w, k, m, n, 3, dx, count, MAL_F32, MAL_OP_SUM));
            CHECK_OK(mal_comm_dp_allreduce_list(w, k, m, n, 3, dy, count, MAL_F32, MAL_OP_MAX));
            dev_download(k, x, dx, count);
            dev_download(k, y, dy, count);
            for (size_t i = 0; i < count; i++) {
                double want = 0, want_max = -1e30;
                for (int j = 0; j < n; j++) {
                    want += (double)((i * 7 + (size_t)m[j] * 13) % 101);
                    want_max = MAL_MAX(want_max, (double)((i * 3 + (size_t)m[j] * 5) % 17) - 8.0);
                }
                if ((double)x[i] != want || (double)y[i] != want_max) {
                    fprintf(stderr,
                            "%s: list all-reduce, group %zu, count %zu, element %zu: %g/%g, "
                            "want %g/%g\n",
                            device, gi, count, i, (double)x[i], (double)y[i], want, want_max);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
            mal_kern_free(k, dx);
            mal_kern_free(k, dy);
            free(x);
            free(y);
        }
    }
    float one = 1, *d1 = dev_upload(k, &one, 1);
    static const int others[] = {1}; /* a list without this rank (for rank != 1) */
    if (w->rank != 1)
        CHECK_EQ_INT(mal_comm_dp_allreduce_list(w, k, others, 1, 3, d1, 1, MAL_F32, MAL_OP_SUM),
                     MAL_EINVAL);
    CHECK_EQ_INT(mal_comm_dp_allreduce_list(w, k, others, 1, 3, d1, 1, MAL_BF16, MAL_OP_SUM),
                 MAL_ENOTSUP); /* member lists carry fp32 gradients only */

    /* bf16 all-reduce (a GPU's TP activations): summed in fp32, rounded to
     * nearest even.  Element 4: rank 0 gives 0.046875, the others 1, so on
     * 8 ranks the sum 7.046875 lies 1.5 bf16 ulps above 7: rounding gives
     * 7.0625, truncating would give 7.03125. */
    {
        const float vals[] = {1.0f + 0x1.0p-8f, 3.0f, -0.5f, 1e-3f, 0.0f};
        enum { NV = 5 };
#define BF16_INPUT(i, r) ((i) == 4 ? ((r) == 0 ? 0.046875f : 1.0f) : vals[i] * (float)((r) + 1))
        uint16_t hb[NV];
        for (int i = 0; i < NV; i++)
            hb[i] = mal_bf16_from_f32(BF16_INPUT(i, w->rank));
        uint16_t *db = mal_kern_alloc(k, sizeof hb);
        CHECK(db != NULL);
        mal_kern_from_host(k, db, hb, sizeof hb);
        CHECK_OK(mal_comm_dp_allreduce(w, k, db, NV, MAL_BF16));
        mal_kern_to_host(k, hb, db, sizeof hb);
        CHECK_OK(mal_kern_sync(k));
        for (int i = 0; i < NV; i++) {
            float sum = 0; /* the same fp32 sum of the same bf16 inputs, any order: exact here */
            for (int r = 0; r < w->size; r++)
                sum += mal_f32_from_bf16(mal_bf16_from_f32(BF16_INPUT(i, r)));
            if (hb[i] != mal_bf16_from_f32(sum)) {
                fprintf(stderr, "%s: bf16 all-reduce, element %d: %g, want %g\n", device, i,
                        (double)mal_f32_from_bf16(hb[i]), (double)sum);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        if (w->size == 8) CHECK(mal_f32_from_bf16(hb[4]) == 7.0625f);
#undef BF16_INPUT
        check_identical(mal_comm_mpi_handle(w), hb, sizeof hb, "bf16 all-reduce");
        mal_kern_free(k, db);
    }

    /* all-reduce over the world (both of its paths) */
    for (size_t n = 100; n <= 20011; n += 19911) {
        float *h = malloc(n * sizeof *h);
        CHECK(h != NULL);
        for (size_t i = 0; i < n; i++)
            h[i] = (float)((i + (size_t)w->rank * 31) % 97);
        float *d = dev_upload(k, h, n);
        CHECK_OK(mal_comm_dp_allreduce(w, k, d, n, MAL_F32));
        dev_download(k, h, d, n);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < w->size; r++)
                want += (double)((i + (size_t)r * 31) % 97);
            CHECK((double)h[i] == want);
        }
        check_identical(mal_comm_mpi_handle(w), h, n * sizeof *h, "data-plane all-reduce");
        mal_kern_free(k, d);
        free(h);
    }

    /* grouped sends and receives around the ring: a small and a 4 MiB one */
    int next = (w->rank + 1) % w->size, prev = (w->rank + w->size - 1) % w->size;
    size_t big = (size_t)1 << 20;
    float *hs = malloc(big * sizeof *hs), *hr = malloc(big * sizeof *hr);
    CHECK(hs && hr);
    for (size_t i = 0; i < big; i++)
        hs[i] = (float)((i * 5 + (size_t)w->rank) % 251);
    float *ds = dev_upload(k, hs, big), *dr = mal_kern_alloc(k, big * sizeof *dr);
    float small = (float)w->rank, *dss = dev_upload(k, &small, 1), *dsr = mal_kern_alloc(k, 4);
    CHECK(dr && dsr);
    mal_comm_req *q[4] = {NULL, NULL, NULL, NULL};
    CHECK_OK(mal_comm_dp_group_start(w));
    CHECK_OK(mal_comm_dp_irecv(w, k, dr, big * sizeof *dr, prev, 21, &q[0]));
    CHECK_OK(mal_comm_dp_irecv(w, k, dsr, sizeof(float), prev, 22, &q[1]));
    CHECK_OK(mal_comm_dp_isend(w, k, ds, big * sizeof *ds, next, 21, &q[2]));
    CHECK_OK(mal_comm_dp_isend(w, k, dss, sizeof(float), next, 22, &q[3]));
    CHECK_OK(mal_comm_dp_group_end(w));
    CHECK_OK(mal_comm_dp_waitall(w, 4, q));
    CHECK(q[0] == NULL && q[3] == NULL);
    dev_download(k, hr, dr, big);
    dev_download(k, &small, dsr, 1);
    CHECK_EQ_INT((int)small, prev);
    for (size_t i = 0; i < big; i++)
        CHECK(hr[i] == (float)((i * 5 + (size_t)prev) % 251));
    /* the receiver expects 8 bytes, 4 come: refused, the buffer untouched */
    CHECK_OK(mal_comm_dp_irecv(w, k, dr, 2 * sizeof(float), prev, 23, &q[0]));
    CHECK_OK(mal_comm_dp_isend(w, k, dss, sizeof(float), next, 23, &q[1]));
    int rc = mal_comm_dp_waitall(w, 2, q);
    CHECK_EQ_INT(rc, MAL_EMISMATCH);
    CHECK(q[0] == NULL && q[1] == NULL);
    CHECK_EQ_INT(mal_comm_dp_isend(w, k, dss, 4, w->size, 1, &q[0]), MAL_EINVAL);
    CHECK_EQ_INT(mal_comm_dp_irecv(w, k, dsr, 4, prev, -1, &q[0]), MAL_EINVAL);
    void *bufs[] = {d1, ds, dr, dss, dsr};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(k, bufs[i]);
    free(hs);
    free(hr);
    CHECK_OK(mal_comm_barrier(w));
    mal_kern_destroy(k);
}

/* A duplicate with a backend by name; names this build lacks are refused
 * on every rank alike, before any collective. */
/* ---- non-blocking member-list all-reduce ----------------------------------
 * Contributions with rounding in every add (scaled fractions), so that the
 * order in which a reduction combines them shows in the bits.  The
 * reference is computed here from the algorithm comm_ring.h documents, not
 * by the code under test: up to 64 KiB, the first member adds the others
 * to its own in list order; above, block b of the list's n nearly equal
 * blocks starts at member b and each following member (in ring order)
 * adds its own value to what it received. */
static float nb_val(int wr, size_t i, int which)
{
    uint32_t h = (uint32_t)wr * 2654435761u ^ ((uint32_t)i * 40503u + (uint32_t)which * 977u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 8388608.0f - 1.0f) * (float)(1 << (wr % 5));
}

static float nb_ref(const int *m, int n, size_t count, size_t i, int which, mal_reduce_op op)
{
    if (op == MAL_OP_MAX) {
        float a = nb_val(m[0], i, which);
        for (int j = 1; j < n; j++) {
            float x = nb_val(m[j], i, which);
            a = x > a ? x : a;
        }
        return a;
    }
    if (count * sizeof(float) <= (64 << 10)) {
        float a = nb_val(m[0], i, which);
        for (int j = 1; j < n; j++) a += nb_val(m[j], i, which);
        return a;
    }
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    int b = 0;
    while (b + 1 < n && q * (size_t)(b + 1) + MAL_MIN((size_t)(b + 1), rem) <= i) b++;
    float a = nb_val(m[b], i, which);
    for (int j = 1; j < n; j++) a = nb_val(m[(b + j) % n], i, which) + a;
    return a;
}

/* Lists of 2 .. 8 ranks in one global order; several share ranks. */
static const int nb_l0[] = {0, 1, 2, 3}, nb_l1[] = {2, 3, 4, 5, 6}, nb_l2[] = {5, 1, 7},
                 nb_l3[] = {0, 1, 2, 3, 4, 5, 6, 7}, nb_l4[] = {6, 0, 3}, nb_l5[] = {4, 7},
                 nb_l6[] = {7, 6, 5, 4, 3, 2, 1};
static const struct {
    const int *m;
    int n;
    size_t count;
    mal_reduce_op op;
} nb_lists[] = {
    {nb_l0, 4, 16384, MAL_OP_SUM},  /* exactly 64 KiB: the first member combines */
    {nb_l1, 5, 100003, MAL_OP_SUM}, /* the ring, blocks of unequal length */
    {nb_l2, 3, 7, MAL_OP_SUM},
    {nb_l3, 8, 16385, MAL_OP_SUM},  /* one float over: the ring */
    {nb_l4, 3, 40000, MAL_OP_MAX},
    {nb_l5, 2, 1, MAL_OP_SUM},
    {nb_l6, 7, 30011, MAL_OP_SUM},
    {nb_l0, 4, 50000, MAL_OP_SUM}, /* a list again, behind other lists */
    {nb_l3, 8, 3, MAL_OP_MAX},
};

static void nb_check(const int *m, int n, size_t count, int which, mal_reduce_op op,
                     const float *got, const char *what)
{
    for (size_t i = 0; i < count; i++) {
        float want = nb_ref(m, n, count, i, which, op);
        if (memcmp(&want, &got[i], sizeof want) != 0) {
            fprintf(stderr,
                    "world rank %d: %s: list %d..(%d members), count %zu, element %zu: %.9g, "
                    "want %.9g (bits differ)\n",
                    world_rank, what, m[0], n, count, i, (double)got[i], (double)want);
            exit(1);
        }
    }
}

/* Every list this rank is in, posted non-blocking in the global order
 * (with progress calls between posts, as the gradient sync makes), then
 * waited for in the reverse order; the same lists blocking, one by one;
 * both bitwise equal to the reference and to each other. */
static void test_nonblocking(mal_comm *w, const char *device)
{
    enum { NL = MAL_ARRAY_SIZE(nb_lists) };
    mal_kern k;
    CHECK_OK(mal_kern_create(device, NULL, &k));
    float *dnb[NL] = {0}, *dbl[NL] = {0};
    mal_comm_req *req[NL] = {0};
    int in[NL] = {0};
    for (int li = 0; li < NL; li++) {
        for (int j = 0; j < nb_lists[li].n; j++) in[li] |= nb_lists[li].m[j] == w->rank;
        if (!in[li]) continue;
        size_t count = nb_lists[li].count;
        float *x = malloc(count * sizeof *x);
        CHECK(x);
        for (size_t i = 0; i < count; i++) x[i] = nb_val(w->rank, i, li);
        dnb[li] = dev_upload(k, x, count);
        dbl[li] = dev_upload(k, x, count);
        free(x);
    }
    for (int li = 0; li < NL; li++) {
        if (!in[li]) continue;
        CHECK_OK(mal_comm_dp_iallreduce_list(w, k, nb_lists[li].m, nb_lists[li].n, 5, dnb[li],
                                             nb_lists[li].count, MAL_F32, nb_lists[li].op,
                                             &req[li]));
        CHECK(req[li] != NULL);
        CHECK_OK(mal_comm_dp_progress(w));
    }
    for (int li = NL - 1; li >= 0; li--) CHECK_OK(mal_comm_dp_waitall(w, 1, &req[li]));
    for (int li = 0; li < NL; li++)
        if (in[li])
            CHECK_OK(mal_comm_dp_allreduce_list(w, k, nb_lists[li].m, nb_lists[li].n, 6, dbl[li],
                                                nb_lists[li].count, MAL_F32, nb_lists[li].op));
    for (int li = 0; li < NL; li++) {
        if (!in[li]) continue;
        size_t count = nb_lists[li].count;
        float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
        CHECK(a && b);
        dev_download(k, a, dnb[li], count);
        dev_download(k, b, dbl[li], count);
        nb_check(nb_lists[li].m, nb_lists[li].n, count, li, nb_lists[li].op, a, "non-blocking");
        nb_check(nb_lists[li].m, nb_lists[li].n, count, li, nb_lists[li].op, b, "blocking");
        CHECK(memcmp(a, b, count * sizeof *a) == 0);
        free(a);
        free(b);
        mal_kern_free(k, dnb[li]);
        mal_kern_free(k, dbl[li]);
    }
    /* nothing to combine: no request; a list without the caller: refused
     * at the post */
    float one = 1, *d1 = dev_upload(k, &one, 1);
    mal_comm_req *r = (mal_comm_req *)d1;
    static const int not_me[2] = {0, 1};
    int mine[1] = {w->rank};
    CHECK_OK(mal_comm_dp_iallreduce_list(w, k, mine, 1, 5, d1, 1, MAL_F32, MAL_OP_SUM, &r));
    CHECK(r == NULL);
    CHECK_OK(mal_comm_dp_iallreduce_list(w, k, nb_l3, 8, 5, d1, 0, MAL_F32, MAL_OP_SUM, &r));
    CHECK(r == NULL);
    if (w->rank > 1)
        CHECK_EQ_INT(mal_comm_dp_iallreduce_list(w, k, not_me, 2, 5, d1, 1, MAL_F32, MAL_OP_SUM, &r),
                     MAL_EINVAL);
    mal_kern_free(k, d1);
    mal_kern_destroy(k);
    CHECK_OK(mal_comm_barrier(w));
}

/* ---- member-list collectives with a region per member ----------------
 * The lists above with regions of unequal sizes (some empty): a
 * reduce-scatter then an all-gather of the same buffer leaves every
 * member with every region's sum, whose bits are the reference's: up to
 * 64 KiB the region's member adds the members' values in list order (the
 * small all-reduce's bits), above, region j is block j+1 of the ring (it
 * starts at member j+1, and each following member adds its own value to
 * what it received).  Posted non-blocking in the global order behind the
 * all-reduces' queue, waited for in reverse; and an all-gather of 2-byte
 * elements moves bytes, whatever they are. */
static size_t lc_count(int li, int j, size_t count, int n)
{
    /* member j's share: uneven, every fifth list's second member none */
    if (j == 1 && li % 5 == 0) return 0;
    return count / (size_t)n + (size_t)((j * 7 + li) % 3) * (count / (size_t)(4 * n) + 1);
}

static float lc_ref(const int *m, int n, size_t total, int region, size_t i, int which)
{
    if (total * sizeof(float) <= (64 << 10)) {
        float a = nb_val(m[0], i, which);
        for (int j = 1; j < n; j++) a += nb_val(m[j], i, which);
        return a;
    }
    int b = (region + 1) % n;
    float a = nb_val(m[b], i, which);
    for (int j = 1; j < n; j++) a = nb_val(m[(b + j) % n], i, which) + a;
    return a;
}

static void test_list_coll(mal_comm *w, const char *device)
{
    enum { NL = MAL_ARRAY_SIZE(nb_lists) };
    mal_kern k;
    CHECK_OK(mal_kern_create(device, NULL, &k));
    float *dev[NL] = {0};
    size_t counts[NL][8], total[NL] = {0};
    mal_comm_req *req[2 * NL] = {0};
    int in[NL] = {0};
    for (int li = 0; li < NL; li++) {
        for (int j = 0; j < nb_lists[li].n; j++) {
            in[li] |= nb_lists[li].m[j] == w->rank;
            counts[li][j] = lc_count(li, j, nb_lists[li].count, nb_lists[li].n);
            total[li] += counts[li][j];
        }
        if (!in[li]) continue;
        float *x = malloc(total[li] * sizeof *x + 1);
        CHECK(x);
        for (size_t i = 0; i < total[li]; i++) x[i] = nb_val(w->rank, i, li);
        dev[li] = dev_upload(k, x, total[li]);
        free(x);
    }
    /* the reduce-scatters all in flight at once, waited for in reverse;
     * then the all-gathers alike (a request reads its buffer when it is
     * posted -- staged copies on an opaque device -- so an all-gather
     * posts after the reduce-scatter of its buffer was waited for, as the
     * optimizer's step comes between them) */
    for (int pass = 0; pass < 2; pass++) {
        for (int li = 0; li < NL; li++) {
            if (!in[li]) continue;
            CHECK_OK(mal_comm_dp_ilist(w, k, pass ? MAL_LIST_ALLGATHER : MAL_LIST_REDUCE_SCATTER,
                                       nb_lists[li].m, nb_lists[li].n, 5, dev[li], counts[li],
                                       MAL_F32, &req[pass * NL + li]));
            CHECK_OK(mal_comm_dp_progress(w));
        }
        for (int q = NL - 1; q >= 0; q--) CHECK_OK(mal_comm_dp_waitall(w, 1, &req[pass * NL + q]));
    }
    for (int li = 0; li < NL; li++) {
        if (!in[li]) continue;
        float *got = malloc(total[li] * sizeof *got + 1);
        CHECK(got);
        dev_download(k, got, dev[li], total[li]);
        size_t i = 0;
        for (int j = 0; j < nb_lists[li].n; j++)
            for (size_t e = 0; e < counts[li][j]; e++, i++) {
                float want = lc_ref(nb_lists[li].m, nb_lists[li].n, total[li], j, i, li);
                if (memcmp(&want, &got[i], sizeof want) != 0) {
                    fprintf(stderr,
                            "world rank %d (%s): reduce-scatter + all-gather: list %d, region %d, "
                            "element %zu: %.9g, want %.9g (bits differ)\n",
                            w->rank, device, li, j, i, (double)got[i], (double)want);
                    exit(1);
                }
            }
        free(got);
        mal_kern_free(k, dev[li]);
    }
    /* an all-gather of 2-byte elements (bf16 weights): bytes moved as they are */
    const int *m = nb_l1;
    int n = 5, me = -1;
    for (int j = 0; j < n; j++)
        if (m[j] == w->rank) me = j;
    if (me >= 0) {
        size_t c5[5] = {3, 0, 70001, 12, 40000}, all = 0, off = 0;
        for (int j = 0; j < n; j++) all += c5[j];
        uint16_t *h = malloc(all * sizeof *h);
        CHECK(h);
        for (int j = 0; j < n; j++)
            for (size_t e = 0; e < c5[j]; e++, off++)
                h[off] = j == me ? (uint16_t)(off * 31 + (size_t)j) : 0xffff;
        void *d = mal_kern_alloc(k, all * sizeof *h);
        mal_kern_from_host(k, d, h, all * sizeof *h);
        mal_comm_req *r = NULL;
        CHECK_OK(mal_comm_dp_ilist(w, k, MAL_LIST_ALLGATHER, m, n, 5, d, c5, MAL_BF16, &r));
        CHECK_OK(mal_comm_dp_waitall(w, 1, &r));
        mal_kern_to_host(k, h, d, all * sizeof *h);
        CHECK_OK(mal_kern_sync(k));
        off = 0;
        for (int j = 0; j < n; j++)
            for (size_t e = 0; e < c5[j]; e++, off++)
                CHECK_EQ_INT(h[off], (uint16_t)(off * 31 + (size_t)j));
        free(h);
        mal_kern_free(k, d);
    }
    /* one member, or nothing at all: no request; an unknown kind refused */
    size_t one = 1, none[8] = {0};
    float *d1 = dev_upload(k, (float[]){1.0f}, 1);
    mal_comm_req *r = (mal_comm_req *)d1;
    int mine[1] = {w->rank};
    CHECK_OK(mal_comm_dp_ilist(w, k, MAL_LIST_REDUCE_SCATTER, mine, 1, 5, d1, &one, MAL_F32, &r));
    CHECK(r == NULL);
    CHECK_OK(mal_comm_dp_ilist(w, k, MAL_LIST_ALLGATHER, nb_l3, 8, 5, d1, none, MAL_F32, &r));
    CHECK(r == NULL);
    CHECK_EQ_INT(mal_comm_dp_ilist(w, k, (mal_list_coll)9, mine, 1, 5, d1, &one, MAL_F32, &r),
                 MAL_EINVAL);
    mal_kern_free(k, d1);
    mal_kern_destroy(k);
    CHECK_OK(mal_comm_barrier(w));
}

static void test_dup(mal_comm *w)
{
    mal_comm *d = NULL;
    CHECK_OK(mal_comm_dup(w, "mpi", &d));
    CHECK(d && d->size == w->size && d->rank == w->rank && !strcmp(d->ops->name, "mpi"));
    mal_comm *s = NULL;
    CHECK_OK(mal_comm_split(d, 0, -w->rank, &s));
    CHECK(s->ops == d->ops && s->rank == w->size - 1 - w->rank);
    mal_comm_destroy(s);
    mal_comm_destroy(d);
#ifdef HAVE_NCCL
    /* built in: usable only with a GPU (tests/test_comm_nccl covers it);
     * the lookup alone, so that 8 ranks never share one GPU in NCCL */
    const mal_comm_backend *nb = NULL;
    int nrc = mal_comm_lookup("nccl", &nb);
    CHECK(nrc == 0 || nrc == MAL_EDEVICE);
#else
    CHECK_EQ_INT(mal_comm_dup(w, "nccl", &d), MAL_ENOTSUP);
#endif
    CHECK_EQ_INT(mal_comm_dup(w, "carrier-pigeon", &d), MAL_EINVAL);
    CHECK(d == NULL);
}

static void check_members(const mal_comm *c, const int *want, int n)
{
    CHECK_EQ_INT(c->size, n);
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(c->world_ranks[i], want[i]);
    CHECK_EQ_INT(c->world_ranks[c->rank], world_rank);
}

/* Size mismatches between sender and receiver (world ranks 0 -> 1). */
static void test_mismatch(mal_comm *w)
{
    char buf[16] = "0123456789abcde";
    mal_comm_req *q;
    if (w->rank == 0) {
        CHECK_OK(mal_comm_isend(w, buf, 4, 1, 21, &q)); /* receiver expects 8 */
        CHECK_OK(mal_comm_wait(w, q));
        CHECK_OK(mal_comm_isend(w, buf, 16, 1, 22, &q)); /* receiver expects 8 */
        CHECK_OK(mal_comm_wait(w, q));
    } else if (w->rank == 1) {
        CHECK_OK(mal_comm_irecv(w, buf, 8, 0, 21, &q));
        CHECK_EQ_INT(mal_comm_wait(w, q), MAL_EMISMATCH);
        CHECK(strstr(mal_errmsg(), "disagree") != NULL);
        CHECK_OK(mal_comm_irecv(w, buf, 8, 0, 22, &q));
        CHECK_EQ_INT(mal_comm_wait(w, q), MAL_EMPI); /* truncated by MPI */
        CHECK(strstr(mal_errmsg(), "wait (receive) failed") != NULL);
    }
    CHECK_OK(mal_comm_barrier(w));
}

/* 64 MiB of floats summed over the world, in one call and in odd-sized
 * chunks; integer values so every element has an exact expected sum. */
static void test_large(mal_comm *w, double *t_one, double *t_chunked)
{
    const size_t n = (size_t)16 << 20;
    float *f = malloc(n * sizeof *f);
    CHECK(f);
    for (int pass = 0; pass < 2; pass++) {
        /* pass 1: 1048579 floats (4 MiB + 12 bytes, rounded down) per call:
         * 15 full chunks and a short one */
        mal_comm_mpi_chunk_bytes = pass ? ((size_t)4 << 20) + 14 : MAL_COMM_MPI_CHUNK_BYTES_DEFAULT;
        for (size_t i = 0; i < n; i++)
            f[i] = (float)((i % 1000) + (size_t)world_rank);
        CHECK_OK(mal_comm_barrier(w));
        double t0 = mal_now();
        CHECK_OK(mal_comm_allreduce_f32(w, f, n));
        double t = mal_now() - t0;
        *(pass ? t_chunked : t_one) = t;
        for (size_t i = 0; i < n; i++) {
            float want = (float)(NPROCS * (i % 1000) + NPROCS * (NPROCS - 1) / 2);
            if (f[i] != want) {
                fprintf(stderr, "64 MiB sum pass %d: [%zu] = %g, want %g\n", pass, i, f[i], want);
                exit(1);
            }
        }
    }
    /* the chunked broadcast too, from a non-zero root */
    mal_comm_mpi_chunk_bytes = 1000;
    unsigned char *b = (unsigned char *)f;
    for (size_t i = 0; i < 10007; i++)
        b[i] = w->rank == 3 ? pattern(3, i) : 0;
    CHECK_OK(mal_comm_broadcast(w, b, 10007, 3));
    for (size_t i = 0; i < 10007; i++)
        CHECK_EQ_INT(b[i], pattern(3, i));
    mal_comm_mpi_chunk_bytes = MAL_COMM_MPI_CHUNK_BYTES_DEFAULT;
    free(f);
}

/* Milliseconds per 1-float all-reduce, three ways.  Blocking MPI_Allreduce
 * costs ~35 ms each here, so it gets fewer repetitions. */
static void time_small(mal_comm *w, double ms[3])
{
    MPI_Comm mc = mal_comm_mpi_handle(w);
    float x;
    for (int way = 0; way < 3; way++) {
        const int reps = way < 2 ? 200 : 50;
        CHECK_OK(mal_comm_barrier(w));
        double t0 = mal_now();
        for (int k = 0; k < reps; k++) {
            x = 1.0f;
            if (way == 0) {
                CHECK_OK(mal_comm_allreduce_f32(w, &x, 1));
            } else if (way == 1) {
                MPI_Request rq;
                CHECK(MPI_Iallreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, mc, &rq) ==
                      MPI_SUCCESS);
                CHECK_OK(mal_mpi_wait(&rq, MPI_STATUS_IGNORE, "MPI_Iallreduce"));
            } else {
                CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, mc) == MPI_SUCCESS);
            }
            CHECK(x == (float)NPROCS);
        }
        ms[way] = 1e3 * (mal_now() - t0) / reps;
    }
}

/* Rank 1 waits ~1 s for a message rank 0 sends late, while every other
 * rank sleeps: its CPU time during the wait must stay well below the wall
 * time (under 50%; the sleeping wait measures ~5-10%).  A spinning wait gets
 * what the scheduler gives it, which on a loaded machine can also be little,
 * so the wait must also show that it sleeps: many voluntary context
 * switches (one per nap; a spinning rank is only preempted).  Returns
 * {wall, cpu, voluntary switches} of the sleeping wait and of a blocking
 * MPI_Recv (printed only, to show what the assertions guard against). */
static long nvcsw_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nvcsw;
}

static void test_idle_wait(mal_comm *w, double out[6])
{
    const struct timespec late = {1, 0};
    MPI_Comm mc = mal_comm_mpi_handle(w);
    double msg = 0;
    for (int way = 0; way < 2; way++) {
        CHECK_OK(mal_comm_barrier(w));
        if (w->rank != 1) nanosleep(&late, NULL);
        if (w->rank == 0) {
            msg = 42.0 + way;
            mal_comm_req *q;
            CHECK_OK(mal_comm_isend(w, &msg, sizeof msg, 1, 30 + way, &q));
            CHECK_OK(mal_comm_wait(w, q));
        } else if (w->rank == 1) {
            double t0 = mal_now(), c0 = cpu_now();
            long v0 = nvcsw_now();
            if (way == 0) {
                mal_comm_req *q;
                CHECK_OK(mal_comm_irecv(w, &msg, sizeof msg, 0, 30, &q));
                CHECK_OK(mal_comm_wait(w, q));
            } else {
                CHECK(MPI_Recv(&msg, 1, MPI_DOUBLE, 0, 31, mc, MPI_STATUS_IGNORE) == MPI_SUCCESS);
            }
            out[3 * way] = mal_now() - t0;
            out[3 * way + 1] = cpu_now() - c0;
            out[3 * way + 2] = (double)(nvcsw_now() - v0);
            CHECK(msg == 42.0 + way);
        }
    }
    CHECK_OK(mal_comm_broadcast(w, out, 6 * sizeof *out, 1));
    CHECK(out[0] > 0.5);
    if (!(out[1] < 0.5 * out[0]) || !(out[2] >= 100)) {
        fprintf(stderr,
                "rank 1 used %.3f s of CPU and slept %.0f times while waiting %.3f s: the wait "
                "spins\n",
                out[1], out[2], out[0]);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    atexit(abort_unless_finished);
    int nprocs;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    if (nprocs != NPROCS) {
        if (world_rank == 0)
            fprintf(stderr, "test_comm: needs %d ranks, got %d (run it via tests/mpirun.sh)\n",
                    NPROCS, nprocs);
        MPI_Abort(MPI_COMM_WORLD, MAL_TEST_ERROR);
    }

    mal_comm *w = NULL, *sp = NULL, *grp = NULL, *dummy = NULL;
    CHECK_OK(mal_comm_mpi_world(&w));
    CHECK(strcmp(w->ops->name, "mpi") == 0);
    CHECK_EQ_INT(w->rank, world_rank);
    for (int r = 0; r < NPROCS; r++)
        CHECK_EQ_INT(w->world_ranks[r], r);
    CHECK(mal_comm_mpi_handle(w) != MPI_COMM_WORLD);

    /* split: {0,2,4} and {1,3,5} in reverse order (key = -rank), {6}
     * alone, 7 in none */
    int color = world_rank == 7 ? -1 : world_rank == 6 ? 2 : world_rank % 2;
    CHECK_OK(mal_comm_split(w, color, -world_rank, &sp));
    if (color < 0) {
        CHECK(sp == NULL);
    } else {
        static const int even[] = {4, 2, 0}, odd[] = {5, 3, 1}, six[] = {6};
        if (color == 0) check_members(sp, even, 3);
        if (color == 1) check_members(sp, odd, 3);
        if (color == 2) check_members(sp, six, 1);
    }

    /* create_group over {4,1,6}, in that order; nobody else calls */
    static const int members[] = {4, 1, 6};
    if (world_rank == 4 || world_rank == 1 || world_rank == 6) {
        CHECK_OK(mal_comm_create_group(w, members, 3, &grp));
        check_members(grp, members, 3);
    } else {
        CHECK_EQ_INT(mal_comm_create_group(w, members, 3, &dummy), MAL_EINVAL);
        CHECK(dummy == NULL && strstr(mal_errmsg(), "not in the list") != NULL);
    }
    static const int twice[] = {0, 1, 2, 3, 4, 5, 6, 7, 3};
    CHECK_EQ_INT(mal_comm_create_group(w, twice, 9, &dummy), MAL_EINVAL);
    static const int outside[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_EQ_INT(mal_comm_create_group(w, outside, 9, &dummy), MAL_EINVAL);

    /* The pool: a group asked for again is the same communicator, with no
     * collective (ranks outside it ask for nothing); another purpose gets
     * its own. */
    mal_comm_pool *pool;
    CHECK_OK(mal_comm_pool_create(&pool, w));
    static const int trio[] = {2, 5, 7};
    if (world_rank == 2 || world_rank == 5 || world_rank == 7) {
        mal_comm *a, *b, *c;
        CHECK_OK(mal_comm_pool_get(pool, 1, trio, 3, &a));
        check_members(a, trio, 3);
        CHECK_OK(mal_comm_pool_get(pool, 2, trio, 3, &b));
        CHECK(a != b);
        CHECK_OK(mal_comm_pool_get(pool, 1, trio, 3, &c));
        CHECK(c == a);
        run_ops(c, "pooled {2,5,7}");
        int created, reused;
        mal_comm_pool_counts(pool, &created, &reused);
        CHECK_EQ_INT(created, 2);
        CHECK_EQ_INT(reused, 1);
    }
    mal_comm_pool_destroy(pool);

    test_data_plane(w, "cpu");
    test_data_plane(w, "cpu-opaque");
    test_nonblocking(w, "cpu");
    test_nonblocking(w, "cpu-opaque");
    test_list_coll(w, "cpu");
    test_list_coll(w, "cpu-opaque");
    test_dup(w);

    run_ops(w, "world");
    if (sp) run_ops(sp, "split");
    if (grp) run_ops(grp, "group {4,1,6}");
    CHECK_OK(mal_comm_barrier(w));
    test_mismatch(w);
    /* again with every message over 7 bytes sent as one element of a
     * derived type, the way every build sends those over INT_MAX (MPI-3
     * has no larger counts: comm/mpi_bytes.h) */
    mal_mpi_bytes_split = 7;
    test_data_plane(w, "cpu");
    test_data_plane(w, "cpu-opaque");
    test_mismatch(w);
    mal_mpi_bytes_split = INT_MAX;

    double t_one = 0, t_chunked = 0, ms[3], idle[6] = {0};
    test_large(w, &t_one, &t_chunked);
    time_small(w, ms);
    test_idle_wait(w, idle);

    mal_comm_destroy(grp);
    mal_comm_destroy(sp);
    mal_comm_destroy(w);
    if (world_rank == 0) {
        printf("test_comm: 1-float all-reduce on %d ranks, ms each: mal (reduce+bcast, "
               "sleeping wait) %.3f, MPI_Iallreduce + sleeping wait %.3f (200 each), blocking "
               "MPI_Allreduce %.3f (50)\n",
               NPROCS, ms[0], ms[1], ms[2]);
        printf("test_comm: 64 MiB float all-reduce: %.3f s in one call, %.3f s in 4 MiB chunks\n",
               t_one, t_chunked);
        printf("test_comm: rank 1 waiting %.2f s used %.1f%% CPU, %.0f voluntary context "
               "switches (blocking MPI_Recv: %.1f%%, %.0f)\n",
               idle[0], 100 * idle[1] / idle[0], idle[2], 100 * idle[4] / idle[3], idle[5]);
        printf("test_comm: PASS (%d ranks: world, split {4,2,0} {5,3,1} {6}, group {4,1,6})\n",
               NPROCS);
    }
    finished = 1;
    MPI_Finalize();
    return 0;
}
