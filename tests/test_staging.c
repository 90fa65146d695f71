/* The MPI data plane on device buffers the host cannot address (the
 * cpu-opaque backend, which stages every transfer as a GPU does), run by
 * tests/test_staging.sh on 4 ranks:
 *
 *  1. the pool of pinned buffers (kernels/hostpool.c) by itself: a buffer
 *     given back serves the next request of its size, a small request does
 *     not take a large buffer, what stays pinned is at most twice the peak
 *     handed out, two threads sharing an instance leave it consistent;
 *  2. training under tests/plans/four.json (a TP-2 replica beside a
 *     two-stage pipeline: staged TP all-reduces, pipeline sends and
 *     receives, member-list gradient sums): after the first WARM steps the
 *     pool pins nothing more on any rank while the next STEPS steps stage
 *     hundreds of transfers through it -- staging costs O(1) pinnings, not
 *     one per transfer;
 *  3. the step's time split there: the TP ranks report TP time (the data
 *     plane's own measure of its collectives, mal_comm_dp_elapsed) and
 *     compute time beside it, the ranks without a TP group none.
 * Rank 0 prints the verdict. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "mal_test.h"
#include "src/plan.h"
#include "tiny_options.h"
#include "train/train.h"

enum { WARM = 2, STEPS = 4 };

static void *churn(void *arg)
{
    mal_kern k = arg;
    for (int i = 0; i < 2000; i++) {
        void *p = mal_kern_host_alloc(k, (size_t)(i % 7 + 1) * 1000);
        CHECK(p != NULL);
        memset(p, i, 1000);
        mal_kern_host_free(k, p);
    }
    return NULL;
}

static void test_pool(void)
{
    mal_kern k = NULL;
    mal_kern_config kc = mal_kern_config_default();
    CHECK_OK(mal_kern_create("cpu-opaque", &kc, &k));
    mal_kern_host_stats s;

    void *a = mal_kern_host_alloc(k, 1 << 20);
    CHECK(a != NULL);
    mal_kern_host_free(k, a);
    void *b = mal_kern_host_alloc(k, (1 << 20) - 100); /* the same size class */
    mal_kern_host_stats_get(k, &s);
    CHECK(b == a);
    CHECK_EQ_INT(s.pins, 1);
    CHECK_EQ_INT(s.reuses, 1);
    /* a small request does not take the free large buffer */
    mal_kern_host_free(k, b);
    void *c = mal_kern_host_alloc(k, 1000);
    CHECK(c != a);
    mal_kern_host_stats_get(k, &s);
    CHECK_EQ_INT(s.pins, 2);
    mal_kern_host_free(k, c);

    /* the bound: growing requests one at a time leave at most twice the
     * peak pinned */
    for (size_t sz = 4096; sz <= (size_t)8 << 20; sz += sz / 4) {
        void *p = mal_kern_host_alloc(k, sz);
        CHECK(p != NULL);
        mal_kern_host_free(k, p);
        mal_kern_host_stats_get(k, &s);
        CHECK(s.pinned_bytes <= 2 * s.peak_bytes);
        CHECK_EQ_INT(s.in_use_bytes, 0);
    }
    CHECK(s.unpins > 0);

    /* two threads at once */
    pthread_t t1, t2;
    CHECK(pthread_create(&t1, NULL, churn, k) == 0);
    CHECK(pthread_create(&t2, NULL, churn, k) == 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    mal_kern_host_stats_get(k, &s);
    CHECK_EQ_INT(s.in_use_bytes, 0);
    CHECK(s.pinned_bytes <= 2 * s.peak_bytes);
    CHECK(s.reuses > 3000); /* nearly every one of the 4000 from the pool */

    /* a buffer still handed out when the instance goes is unpinned with it
     * (the sanitizer build would report a leak) */
    CHECK(mal_kern_host_alloc(k, 12345) != NULL);
    mal_kern_destroy(k);
}

int main(int argc, char **argv)
{
    mal_comm *world;
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    if (argc != 2 || world->size != 4) {
        if (world->rank == 0) fprintf(stderr, "usage: mpiexec -n 4 test_staging PLAN.json\n");
        mal_comm_abort(world, MAL_TEST_ERROR);
    }
    mal_log_level = MAL_LOG_WARN;
    test_pool();

    mal_plan plan;
    mal_plan_init(&plan);
    CHECK_OK(mal_plan_read(&plan, argv[1]));
    mal_train_options o = mal_test_tiny_options(WARM + STEPS, 1);
    o.device = "cpu-opaque";
    o.comm = "mpi";
    o.plan = &plan;
    o.world = world;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    mal_kern k = mal_trainer_kernels(tr);
    CHECK(!k->host_addressable);
    mal_step_stats st;
    for (int s = 0; s < WARM; s++)
        CHECK_OK(mal_trainer_step(tr, &st));
    mal_kern_host_stats warm, end;
    mal_kern_host_stats_get(k, &warm);
    /* rank 0 keeps every rank's times of the last step */
    double tp[4] = {0}, compute[4] = {0};
    for (int s = 0; s < STEPS; s++) {
        CHECK_OK(mal_trainer_step(tr, &st));
        if (world->rank == 0)
            for (int r = 0; r < 4; r++)
                tp[r] += st.ranks[r].tp_s, compute[r] += st.ranks[r].compute_s;
    }
    mal_kern_host_stats_get(k, &end);
    double mine[3] = {(double)(end.pins - warm.pins), (double)(end.reuses - warm.reuses),
                      (double)end.pins};
    double all[4][3];
    CHECK_OK(mal_comm_gather(world, mine, all, sizeof mine, 0));
    int ok = 1;
    if (world->rank == 0) {
        for (int r = 0; r < 4; r++) {
            /* every rank stages something every step: a TP all-reduce, a
             * pipeline send or receive, or a gradient sum */
            int good = all[r][0] == 0 && all[r][1] >= STEPS;
            printf("rank %d: %g buffers pinned in all, %g of them in the last %d steps, %g "
                   "transfers there served from the pool%s\n",
                   r, all[r][2], all[r][0], STEPS, all[r][1], good ? "" : "   <-- FAIL");
            ok &= good;
        }
        /* ranks 0 and 1 form the TP group; 2 and 3 have none */
        for (int r = 0; r < 4; r++) {
            int good = r < 2 ? tp[r] > 0 && compute[r] > 0 : tp[r] == 0 && compute[r] > 0;
            printf("rank %d: %.2f ms TP, %.2f ms compute over %d steps%s\n", r, 1e3 * tp[r],
                   1e3 * compute[r], STEPS, good ? "" : "   <-- FAIL");
            ok &= good;
        }
        printf("%s: staging through the pinned pool on %d ranks\n", ok ? "PASS" : "FAIL",
               world->size);
    }
    CHECK_OK(mal_comm_broadcast(world, &ok, sizeof ok, 0));
    mal_trainer_destroy(tr);
    mal_plan_fini(&plan);
    mal_comm_finalize(world);
    return ok ? 0 : 1;
}
