/* The online fast path (--adapt online) on 8 ranks.
 *
 * Starting from the uniform dp 2 x tp 2 x pp 2 plan, rank 3 is slowed 6x by
 * injection from step 4 to step 16 and then recovers.  The monitor must
 * notice, the job must change plan online at least twice (away from the
 * straggler, and back after it recovered), every replica must hold bitwise
 * identical parameters and Adam moments after every change, and the loss
 * must follow the one-process run without any straggler within 1e-4 at
 * every step.
 *
 * Also (rank 0, no communication): a plan change that moves one layer of
 * one pipeline to a neighbour moves exactly that layer's state and keeps
 * the rest in place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mal_test.h"
#include "src/model.h"
#include "src/plan.h"
#include "tiny_options.h"
#include "train/train.h"

enum { STEPS = 30 };

static mal_train_options options(void)
{
    mal_train_options o = mal_test_tiny_options(STEPS, 3);
    return o;
}

static void check_migration_bytes(void)
{
    mal_model_config cfg;
    CHECK_OK(mal_config_load(&cfg, "tiny"));
    const char *a = "{\"format\": \"malleus-plan/1\", \"micro_batch_size\": 2, \"pipelines\": ["
                    "{\"micro_batches\": 4, \"stages\": [{\"ranks\": [0], \"layers\": [0, 2]},"
                    " {\"ranks\": [1], \"layers\": [2, 4]}]},"
                    "{\"micro_batches\": 4, \"stages\": [{\"ranks\": [2], \"layers\": [0, 2]},"
                    " {\"ranks\": [3], \"layers\": [2, 4]}]}], \"suspended\": []}";
    const char *b = "{\"format\": \"malleus-plan/1\", \"micro_batch_size\": 2, \"pipelines\": ["
                    "{\"micro_batches\": 4, \"stages\": [{\"ranks\": [0], \"layers\": [0, 3]},"
                    " {\"ranks\": [1], \"layers\": [3, 4]}]},"
                    "{\"micro_batches\": 4, \"stages\": [{\"ranks\": [2], \"layers\": [0, 2]},"
                    " {\"ranks\": [3], \"layers\": [2, 4]}]}], \"suspended\": []}";
    mal_plan pa, pb;
    mal_plan_init(&pa);
    mal_plan_init(&pb);
    CHECK_OK(mal_plan_parse_string(&pa, a, "plan a"));
    CHECK_OK(mal_plan_parse_string(&pb, b, "plan b"));
    double moved, kept;
    CHECK_OK(mal_migration_bytes(&pa, &pb, &cfg, 0, &moved, &kept));
    /* independent count: one layer's parameters, x3 for Adam m and v, fp32 */
    double C = cfg.d_model, F = cfg.ffn_hidden, V = cfg.vocab;
    double layer = 12.0 * (4 * C * C + 3 * C * F + 2 * C);
    double total_one_copy = 12.0 * (cfg.n_layers * (4 * C * C + 3 * C * F + 2 * C) + 2 * V * C + C);
    printf("moving layer 2 of one pipeline: %.0f bytes moved (one layer: %.0f), %.0f kept\n", moved,
           layer, kept);
    CHECK_CLOSE(moved, layer, 0, 0.5);
    CHECK_CLOSE(moved + kept, 2 * total_one_copy, 0, 0.5); /* two pipelines' copies */
    CHECK_OK(mal_migration_bytes(&pa, &pa, &cfg, 0, &moved, &kept));
    CHECK_CLOSE(moved, 0, 0, 0.5);
    mal_plan_fini(&pa);
    mal_plan_fini(&pb);
}

int main(int argc, char **argv)
{
    mal_comm *world;
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    mal_log_level = MAL_LOG_WARN;
    if (world->size != 8) {
        if (world->rank == 0) fprintf(stderr, "test_online needs 8 ranks\n");
        mal_comm_abort(world, MAL_TEST_ERROR);
    }
    if (world->rank == 0) check_migration_bytes();

    double ref_loss[STEPS];
    mal_train_options o = options();
    mal_trainer *ref;
    CHECK_OK(mal_trainer_create(&ref, &o));
    for (int s = 0; s < STEPS; s++) {
        mal_step_stats st;
        CHECK_OK(mal_trainer_step(ref, &st));
        ref_loss[s] = st.loss;
    }
    mal_trainer_destroy(ref);

    mal_inject inj = {3, 6.0, 4, 16};
    mal_train_options po = options();
    po.world = world;
    po.dp = po.tp = po.pp = 2;
    po.inject = &inj;
    po.n_inject = 1;
    po.adapt = MAL_ADAPT_ONLINE;
    /* robust to the timing noise of 8 ranks on 2 shared cores */
    po.window = 3;
    po.gap = 1.5;
    po.noise_floor = 2.0;
    po.threshold = 2.0;
    po.ranks_per_node = 4;
    /* the change's mechanics are under test, not whether it pays (on a
     * GPU the tiny model's steps are short; tests/test_policy_run.sh) */
    po.change_cost = 0;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &po));
    int changes = 0, away = 0, back = 0, failed = 0;
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        mal_step_stats st;
        CHECK_OK(mal_trainer_step(tr, &st));
        worst = fmax(worst, fabs(st.loss - ref_loss[s]) / fabs(ref_loss[s]));
        /* what mal_trainer_run does on advice */
        if (st.replan && s + 1 < STEPS) CHECK_OK(mal_trainer_replan_online(tr));
        double moved, kept;
        int n = mal_trainer_migrations(tr, &moved, &kept);
        if (n > changes) {
            changes = n;
            double bad;
            CHECK_OK(mal_trainer_replica_mismatch(tr, &bad));
            const mal_plan *pl = mal_trainer_plan(tr);
            int r3_suspended = 0;
            for (int i = 0; i < pl->n_suspended; i++) r3_suspended |= pl->suspended[i] == 3;
            /* rank 3's share: its stage's layers x its pipeline's micro-batches / TP */
            double share3 = 0;
            for (int p = 0; p < pl->n_pipelines; p++)
                for (int j = 0; j < pl->pipelines[p].n_stages; j++)
                    for (int r = 0; r < pl->pipelines[p].stages[j].n_ranks; r++)
                        if (pl->pipelines[p].stages[j].ranks[r] == 3)
                            share3 = (double)(pl->pipelines[p].stages[j].layer_end -
                                              pl->pipelines[p].stages[j].layer_begin) *
                                     pl->pipelines[p].micro_batches /
                                     pl->pipelines[p].stages[j].n_ranks;
            /* uniform: 2 layers x 4 micro-batches / TP 2 = 4 */
            if (s < 16 && (r3_suspended || share3 < 4)) away = 1;
            if (s >= 16 && !r3_suspended) back = 1;
            if (world->rank == 0)
                printf("step %d: plan change %d, %.2f MiB moved, %.2f MiB kept, rank 3 %s "
                       "(work share %.1f), replica mismatches %.0f\n",
                       s + 1, n, moved / 1048576, kept / 1048576,
                       r3_suspended ? "suspended" : "active", share3, bad);
            if (bad != 0) failed = 1;
        }
    }
    double w = worst;
    CHECK_OK(mal_comm_allreduce_max_f64(world, &w, 1));
    if (world->rank == 0) {
        int ok = !failed && changes >= 2 && away && back && w <= 1e-4;
        printf("%s: %d online plan changes, straggler avoided %s, recovered rank back %s, max "
               "loss rel diff %.2e\n",
               ok ? "PASS" : "FAIL", changes, away ? "yes" : "no", back ? "yes" : "no", w);
        failed = !ok;
    }
    mal_trainer_destroy(tr);
    int f = failed;
    CHECK_OK(mal_comm_broadcast(world, &f, sizeof f, 0));
    mal_comm_finalize(world);
    return f ? 1 : 0;
}
