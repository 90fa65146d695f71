/* An online plan change leaves exactly the state that offline resharding
 * produces for the same change: on 8 ranks, train 3 steps on the uniform
 * dp 2 x tp 2 x pp 2 plan and snapshot (A); move the running job online onto
 * tests/plans/mixed_tp.json and snapshot again (B); reshard A onto the same
 * plan with malleus-reshard's library (C).  Every tensor of B and C -
 * parameters, Adam m and v - must be bitwise identical.
 * Then one more step both ways - the online trainer, and a trainer resumed
 * from C on the same plan (D) - must give bitwise the same loss and norm.
 *   test_online_reshard [--model NAME] PLAN.json WORKDIR
 * (NAME: tiny by default; tiny-llama3 moves key/value heads between split,
 * replicated and single-rank holders, a tied embedding held by two stages
 * and vocabulary shards of uneven sizes.) */
#include <stdlib.h>
#include <string.h>

#include "ckpt/reshard.h"
#include "ckpt/snapshot.h"
#include "comm/comm.h"
#include "mal_test.h"
#include "src/plan.h"
#include "tiny_options.h"
#include "train/train.h"

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
        for (int d = 0; d < tb.ndim; d++)
            count *= (size_t)tb.shape[d];
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
    mal_comm *world;
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    mal_log_level = MAL_LOG_WARN;
    const char *model = "tiny";
    if (argc == 5 && !strcmp(argv[1], "--model")) {
        model = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc != 3 || world->size != 8) {
        if (world->rank == 0)
            fprintf(stderr, "usage: mpiexec -n 8 %s [--model NAME] PLAN.json WORKDIR\n",
                    argv[0]);
        mal_comm_abort(world, MAL_TEST_ERROR);
    }
    char a_dir[4096], b_dir[4096], c_dir[4096];
    snprintf(a_dir, sizeof a_dir, "%s/a", argv[2]);
    snprintf(b_dir, sizeof b_dir, "%s/b", argv[2]);
    snprintf(c_dir, sizeof c_dir, "%s/c", argv[2]);

    mal_train_options o = mal_test_tiny_options(3, 2);
    CHECK_OK(mal_config_load(&o.model, model));
    o.dp = o.tp = o.pp = 2;
    o.world = world;
    o.snapshot_dir = a_dir;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    for (int s = 0; s < 3; s++)
        CHECK_OK(mal_trainer_step(tr, NULL));
    CHECK_OK(mal_trainer_save(tr));

    mal_plan next;
    mal_plan_init(&next);
    CHECK_OK(mal_plan_read(&next, argv[1]));
    /* Tiny staging: a wait after every strided piece, staging regrown for
     * pieces larger than it - the paths a large model takes. */
    mal_migrate_stage_bytes = 1024;
    const mal_plan *before = mal_trainer_plan(tr);
    /* Does this rank's new part begin with its old one?  Same TP position
     * and first layer, and the same layers or more of them where the old
     * part did not end with the final norm and LM head; with tied
     * embeddings also the embedding held by both or neither (a last stage
     * holds it first in its table). */
    int keeps = 0;
    {
        mal_plan_loc a, b;
        mal_plan_locate(before, world->rank, &a);
        mal_plan_locate(&next, world->rank, &b);
        if (a.pipeline >= 0 && b.pipeline >= 0) {
            const mal_plan_pipeline *pa = &before->pipelines[a.pipeline],
                                    *pb = &next.pipelines[b.pipeline];
            const mal_plan_stage *sa = &pa->stages[a.stage], *sb = &pb->stages[b.stage];
            int last_a = a.stage == pa->n_stages - 1, last_b = b.stage == pb->n_stages - 1;
            const int tied = o.model.tie_embeddings;
            keeps = a.tp_size == b.tp_size && a.tp_rank == b.tp_rank &&
                    sa->layer_begin == sb->layer_begin &&
                    ((sa->layer_end == sb->layer_end && last_a == last_b) ||
                     (sa->layer_end < sb->layer_end && !last_a)) &&
                    (sa->layer_begin == 0 || !tied || last_a == last_b);
        }
    }
    CHECK_OK(mal_trainer_change_plan(tr, &next));
    /* A rank whose part is kept or extended hands its state buffers over
     * instead of copying: the path must be taken exactly there. */
    mal_migration_times mt;
    mal_trainer_migration_times(tr, &mt);
    CHECK_EQ_INT(mt.handed_over, keeps);
    int n_kept_parts = keeps;
    {
        double sum = keeps;
        CHECK_OK(mal_comm_allreduce_f64(world, &sum, 1));
        n_kept_parts = (int)sum;
    }
    CHECK_OK(mal_trainer_save_to(tr, b_dir));
    /* ... and trains on: one more step, to compare with a run resumed from
     * the resharded snapshot (D) below. */
    mal_step_stats after_b;
    CHECK_OK(mal_trainer_step(tr, &after_b));
    mal_trainer_destroy(tr);

    mal_reshard_options ro;
    memset(&ro, 0, sizeof ro);
    ro.src = a_dir;
    ro.dst_dir = c_dir;
    ro.plan = &next;
    mal_reshard_stats rs;
    CHECK_OK(mal_reshard(world, &ro, &rs));
    mal_train_options od = o;
    od.plan = &next;
    od.snapshot_dir = c_dir;
    od.resume = 1;
    od.steps = 4; /* one more than the snapshot's run, on its schedule */
    od.overrides = "steps";
    mal_trainer *td;
    mal_step_stats after_d;
    CHECK_OK(mal_trainer_create(&td, &od));
    CHECK_OK(mal_trainer_step(td, &after_d));
    mal_trainer_destroy(td);
    /* the same plan, state and batch: the same bits */
    if (after_b.loss != after_d.loss || after_b.grad_norm != after_d.grad_norm) {
        fprintf(stderr,
                "step after the change: online loss %.17g norm %.17g, resumed from the "
                "reshard loss %.17g norm %.17g\n",
                after_b.loss, after_b.grad_norm, after_d.loss, after_d.grad_norm);
        mal_comm_abort(world, 1);
    }
    if (world->rank == 0) {
        check_equal(b_dir, c_dir);
        printf("(%d of 8 ranks kept or extended their part and handed their state over)\n",
               n_kept_parts);
    }
    mal_plan_fini(&next);
    mal_comm_finalize(world);
    return 0;
}
