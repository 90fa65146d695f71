/* The control plane used by two threads at once (what the background
 * snapshot writer does, train/ckpt_async.c): mal_comm_init_threads
 * asks MPI for MPI_THREAD_MULTIPLE and mal_comm_thread_level reports what
 * was granted; then on every rank a second thread runs all-reduces,
 * broadcasts and gather-vs on its own duplicate of the world while the
 * main thread runs the same operations, with other values, on the world.
 * Every result is checked: a message that crossed into the other thread's
 * communicator gives a wrong value (or a hang, which the launcher's time
 * limit turns into a failure).  4 ranks (tests/test_comm_threads.sh). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mal_test.h"

enum { ROUNDS = 300 };

typedef struct {
    mal_comm *c;
    int salt; /* tells the two threads' values apart */
    int rc;
} worker;

/* ROUNDS rounds of three collectives on w->c, each result checked. */
static void *rounds(void *arg)
{
    worker *w = arg;
    mal_comm *c = w->c;
    int n = c->size, me = c->rank;
    for (int i = 0; i < ROUNDS && !w->rc; i++) {
        double v[2] = {me + w->salt + i, 1.0};
        if ((w->rc = mal_comm_allreduce_f64(c, v, 2))) break;
        double want = (double)n * (n - 1) / 2 + (double)n * (w->salt + i);
        if (v[0] != want || v[1] != n) w->rc = MAL_ERR(MAL_EMISMATCH, "all-reduce %g, want %g", v[0], want);
        int root = i % n, b[3] = {me == root ? w->salt : -1, i, me == root ? root : -1};
        if (!w->rc && (w->rc = mal_comm_broadcast(c, b, sizeof b, root))) break;
        if (!w->rc && (b[0] != w->salt || b[2] != root))
            w->rc = MAL_ERR(MAL_EMISMATCH, "broadcast got salt %d root %d", b[0], b[2]);
        /* rank r sends r + 1 ints of salt + r */
        int mine[16];
        for (int k = 0; k <= me; k++)
            mine[k] = w->salt + me;
        void *all = NULL;
        size_t counts[16];
        if (!w->rc && (w->rc = mal_comm_gatherv(c, mine, sizeof(int) * (size_t)(me + 1), 0, &all,
                                                counts)))
            break;
        if (!w->rc && me == 0) {
            const int *p = all;
            for (int r = 0; r < n && !w->rc; r++) {
                if (counts[r] != sizeof(int) * (size_t)(r + 1))
                    w->rc = MAL_ERR(MAL_EMISMATCH, "gather-v: %zu bytes from rank %d", counts[r], r);
                for (int k = 0; k <= r && !w->rc; k++, p++)
                    if (*p != w->salt + r)
                        w->rc = MAL_ERR(MAL_EMISMATCH, "gather-v: %d from rank %d", *p, r);
            }
        }
        free(all);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    /* before the layer runs: nothing may be assumed */
    CHECK_EQ_INT(mal_comm_thread_level(), MAL_COMM_THREADS_ONE);
    CHECK(strcmp(mal_comm_thread_level_name(), "MPI not running") == 0);
    mal_comm *w = NULL, *d = NULL;
    CHECK_OK(mal_comm_init_threads(&argc, &argv, MAL_COMM_THREADS_MANY, &w));
    /* MPICH 4.0.2 (Debian 12) grants MPI_THREAD_MULTIPLE; the snapshot
     * writer depends on it, so an MPI without it fails here */
    CHECK_EQ_INT(mal_comm_thread_level(), MAL_COMM_THREADS_MANY);
    CHECK(strcmp(mal_comm_thread_level_name(), "MPI_THREAD_MULTIPLE") == 0);
    CHECK(w->size == 4 && w->size <= 16);
    CHECK_OK(mal_comm_dup(w, "mpi", &d));

    worker bg = {d, 1000, 0}, fg = {w, 5000000, 0};
    pthread_t t;
    CHECK_EQ_INT(pthread_create(&t, NULL, rounds, &bg), 0);
    rounds(&fg);
    pthread_join(t, NULL);
    CHECK_OK(fg.rc);
    CHECK_OK(bg.rc);
    CHECK_OK(mal_comm_barrier(w));
    if (w->rank == 0)
        printf("test_comm_threads: PASS (%d ranks, %d rounds of all-reduce, broadcast and gather-v "
               "on the world and on a duplicate, two threads at once)\n",
               w->size, ROUNDS);
    mal_comm_destroy(d);
    mal_comm_finalize(w);
    return 0;
}
