/* An online plan change leaves exactly the state that offline resharding
 * produces for the same change: on 8 ranks, train 3 steps on the uniform
 * dp 2 x tp 2 x pp 2 plan and snapshot (A); move the running job online onto
 * tests/plans/mixed_tp.json and snapshot again (B); reshard A onto the same
 * plan with malleus-reshard's library (C).  Every tensor of B and C -
 * parameters, Adam m and v - must be bitwise identical.
 *   test_online_reshard PLAN.json WORKDIR */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "mal_test.h"
#include "plan.h"
#include "reshard.h"
#include "snapshot.h"
#include "train.h"
#include "train_internal.h"

static void check_equal(const char *b_dir, const char *c_dir)
{
    char pb[4096], pc[4096];
    mal_snapshot *sb, *sc;
    CHECK_OK(mal_snapshot_find_latest(b_dir, pb, sizeof pb));
    CHECK_OK(mal_snapshot_find_latest(c_dir, pc, sizeof pc));
    CHECK_OK(mal_snapshot_open(&sb, pb));
    CHECK_OK(mal_snapshot_open(&sc, pc));
    CHECK_EQ_INT(mal_snapshot_meta(sb)->step, mal_snapshot_meta(sc)->step);
    CHECK_EQ_INT(mal_snapshot_meta(sb)->consumed_samples, mal_snapshot_meta(sc)->consumed_samples);
    int n = mal_snapshot_n_tensors(sb);
    CHECK_EQ_INT(n, mal_snapshot_n_tensors(sc));
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        mal_snap_tensor tb, tc;
        CHECK_OK(mal_snapshot_tensor_info(sb, i, &tb));
        CHECK_OK(mal_snapshot_tensor_info(sc, i, &tc));
        CHECK(!strcmp(tb.name, tc.name));
        size_t count = 1;
        for (int d = 0; d < tb.ndim; d++) count *= (size_t)tb.shape[d];
        float *xb = malloc(count * sizeof(float)), *xc = malloc(count * sizeof(float));
        CHECK_OK(mal_snapshot_read(sb, tb.name, tb.ndim, tb.shape, xb, count));
        CHECK_OK(mal_snapshot_read(sc, tc.name, tc.ndim, tc.shape, xc, count));
        if (memcmp(xb, xc, count * sizeof(float))) {
            fprintf(stderr, "tensor %s differs between the online change and the reshard\n",
                    tb.name);
            exit(1);
        }
        total += count;
        free(xb);
        free(xc);
    }
    printf("PASS: %d tensors (%zu values) bit-identical after the online change and after "
           "malleus-reshard\n",
           n, total);
    mal_snapshot_close(sb);
    mal_snapshot_close(sc);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    mal_comm *world;
    CHECK_OK(mal_comm_mpi_world(&world));
    mal_log_level = MAL_LOG_WARN;
    if (argc != 3 || world->size != 8) {
        if (world->rank == 0) fprintf(stderr, "usage: mpiexec -n 8 %s PLAN.json WORKDIR\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, MAL_TEST_ERROR);
    }
    char a_dir[4096], b_dir[4096], c_dir[4096];
    snprintf(a_dir, sizeof a_dir, "%s/a", argv[2]);
    snprintf(b_dir, sizeof b_dir, "%s/b", argv[2]);
    snprintf(c_dir, sizeof c_dir, "%s/c", argv[2]);

    mal_train_options o = mal_train_defaults();
    CHECK_OK(mal_config_load(&o.model, "tiny"));
    o.steps = 3;
    o.global_batch = 16;
    o.micro_batch = 2;
    o.log_every = 0;
    o.threads = 1;
    o.dp = o.tp = o.pp = 2;
    o.world = world;
    o.snapshot_dir = a_dir;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    for (int s = 0; s < 3; s++) CHECK_OK(mal_trainer_step(tr, NULL));
    CHECK_OK(mal_trainer_save(tr));

    mal_plan next;
    mal_plan_init(&next);
    CHECK_OK(mal_plan_read(&next, argv[1]));
    /* Tiny staging: a wait after every strided piece, staging regrown for
     * pieces larger than it - the paths a large model takes. */
    mal_migrate_stage_bytes = 1024;
    CHECK_OK(mal_trainer_change_plan(tr, &next));
    CHECK_OK(mal_trainer_save_to(tr, b_dir));
    mal_trainer_destroy(tr);

    mal_reshard_options ro;
    memset(&ro, 0, sizeof ro);
    ro.src = a_dir;
    ro.dst_dir = c_dir;
    ro.plan = &next;
    mal_reshard_stats rs;
    CHECK_OK(mal_reshard(world, &ro, &rs));
    if (world->rank == 0) check_equal(b_dir, c_dir);
    mal_plan_fini(&next);
    mal_comm_destroy(world);
    MPI_Finalize();
    return 0;
}
