/* The sharded master (--zero 1 --zero-master on) trains the same model as
 * --zero-master off and as one process, and keeps each master element
 * once.
 *
 * Run under mpiexec with the plan's world size; every run computes in
 * bf16 (a bf16 working copy beside the fp32 master, on the CPU bf16
 * storage with fp32 arithmetic, as on a GPU):
 *   test_zero_master [--dp-overlap on|off] [--change PLAN2] PLAN.json ...
 * (options apply to the plans after them; --change: half way the runs move
 * onto PLAN2 online, the master gathered whole, moved and sharded again).
 * Every rank trains `tiny` in one process (the reference); then for each
 * plan the ranks train it with --zero 1, master whole and sharded.
 * Checked: the loss at every step and every working weight bitwise equal
 * between whole and sharded master (the same AdamW arithmetic on the same
 * sums, the same bf16 rounding), near the one-process bf16 reference
 * (LOSS_TOL, WEIGHT_TOL); the replicas' working
 * copies bitwise identical; and by the memory accountant the master each
 * rank holds: whole its part's (4 bytes x its parameters), sharded its
 * share -- lower on every rank that has replicas, exactly the moments'
 * share (the same regions), the shares over all ranks adding up to the
 * one-process model's master once (the plans here replicate every
 * element). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mal_test.h"
#include "src/model.h"
#include "src/plan.h"
#include "tiny_options.h"
#include "train/train.h"
#include "zero_test.h"

enum { STEPS = 4 };

/* How far a plan's bf16 run may be from the one-process bf16 run.  Not
 * bitwise: a TP group sums partial products each rounded to bf16 where
 * one process rounds the whole sum once, and three replicas sum the
 * gradients in another order (which can move a master weight across a
 * bf16 rounding boundary).  Measured on the plans here: losses at most
 * 3.4e-5 apart (relative), the weights 1.5e-2 (the root-mean-square
 * difference of a tensor over its root mean square, the largest tensor's;
 * three_replicas.json 8.7e-4).  The weights are compared by RMS, not by
 * their largest difference as test_zero does in fp32: in its first steps
 * Adam moves every weight by about the learning rate whatever its
 * gradient's size, so an element whose gradient is near 0 steps the other
 * way after any rounding differs -- a few elements per tensor 3e-3 apart,
 * up to 15 % of a small tensor's largest value, as far as one process in
 * bf16 is from one process in fp32 (losses 9e-5, weights 2.7e-2 by RMS).
 * The bounds leave 15x and 3x margin; a working copy the owner's update
 * did not refresh for one piece per region is 4.4e-3 and 0.13 away. */
#define LOSS_TOL 5e-4
#define WEIGHT_TOL 5e-2

/* The bf16 working weights of tr's part widened to fp32 (exactly), back to
 * back in table order (malloc'd): what the forward pass reads, whole on
 * every holder whether the master is sharded or not. */
static float *work_of(mal_trainer *tr, size_t *n)
{
    mal_model *m = mal_trainer_model(tr);
    *n = m ? m->n_params : 0;
    float *x = malloc((*n + 1) * sizeof *x);
    uint16_t *b = malloc((*n + 1) * sizeof *b);
    CHECK(x && b);
    if (m) {
        CHECK(m->esz == sizeof(uint16_t) && m->work);
        mal_kern_to_host(m->k, b, m->work, *n * sizeof(uint16_t));
        CHECK_OK(mal_kern_sync(m->k));
    }
    for (size_t i = 0; i < *n; i++)
        x[i] = mal_f32_from_bf16(b[i]);
    free(b);
    return x;
}

/* The tests' `tiny` options, computing in bf16. */
static mal_train_options bf16_options(void)
{
    mal_train_options o = mal_test_tiny_options(STEPS, 2);
    o.precision = MAL_PRECISION_BF16;
    return o;
}

static double held(mal_trainer *tr, int cat)
{
    mal_kern_mem_stats ms;
    mal_kern_mem_get(mal_trainer_kernels(tr), &ms);
    return (double)ms.now[cat];
}

/* The root-mean-square difference between tensor t's shard and the same
 * elements of the reference, relative to those elements' root mean square
 * (0 for an empty shard). */
static double rms_err(const mal_tensor_info *t, const float *local, const mal_model *rm,
                      const float *rwork)
{
    const mal_tensor_info *rt = mal_model_find(rm, t->name);
    CHECK(rt != NULL);
    double d[3];
    mal_test_shard_diff(t, local, rwork + rt->offset, d);
    return d[2] > 0 ? sqrt(d[1] / d[2]) : 0;
}

int main(int argc, char **argv)
{
    mal_comm *world;
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    if (argc < 2) {
        if (world->rank == 0) fprintf(stderr, "usage: test_zero_master PLAN.json...\n");
        mal_comm_abort(world, MAL_TEST_ERROR);
    }
    mal_log_level = MAL_LOG_WARN;
    int failed = 0, overlap = 1;
    const char *change_path = NULL;
    mal_plan change;
    mal_plan_init(&change);
    double ref_loss[STEPS];
    mal_train_options o0 = bf16_options();
    o0.zero = 0;
    mal_trainer *ref = mal_test_train(&o0, NULL, STEPS, ref_loss);
    size_t rn;
    float *rwork = work_of(ref, &rn);
    mal_model *rm = mal_trainer_model(ref);
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--dp-overlap") && a + 1 < argc) {
            overlap = !strcmp(argv[++a], "on");
            continue;
        }
        if (!strcmp(argv[a], "--change") && a + 1 < argc) {
            change_path = argv[++a];
            mal_plan_fini(&change);
            mal_plan_init(&change);
            CHECK_OK(mal_plan_read(&change, change_path));
            continue;
        }
        mal_plan plan;
        mal_plan_init(&plan);
        CHECK_OK(mal_plan_read(&plan, argv[a]));
        double loss[2][STEPS], master[2], moments[2], worst[2] = {0, 0}, mismatch = 0;
        float *w[2];
        size_t n = 0;
        for (int zm = 0; zm < 2; zm++) {
            mal_train_options o = bf16_options();
            o.zero = 1;
            o.zero_master = zm;
            o.plan = &plan;
            o.world = world;
            o.dp_overlap = overlap;
            mal_trainer *tr = mal_test_train(&o, change_path ? &change : NULL, STEPS, loss[zm]);
            w[zm] = work_of(tr, &n);
            master[zm] = held(tr, MAL_MEM_MASTER);
            moments[zm] = held(tr, MAL_MEM_MOMENTS);
            for (int s = 0; s < STEPS; s++)
                worst[0] = fmax(worst[0], fabs(loss[zm][s] - ref_loss[s]) / fabs(ref_loss[s]));
            mal_model *m = mal_trainer_model(tr);
            for (int i = 0; m && i < m->n_tensors; i++)
                worst[1] = fmax(worst[1], rms_err(&m->tensors[i], w[zm], rm, rwork));
            if (zm == 1) {
                /* sharded, the master is gone from the part: NULL */
                CHECK(!m || mal_model_state(m, MAL_STATE_PARAM) == NULL);
                CHECK_OK(mal_trainer_replica_mismatch(tr, &mismatch));
            }
            mal_trainer_destroy(tr);
        }
        double diff = memcmp(loss[0], loss[1], sizeof loss[0]) != 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&w[0][i], &w[1][i], sizeof(float)) != 0;
        /* whole: 4 bytes x the part; sharded: the moments' share, lower */
        int own_ok = master[0] == 4.0 * (double)n && 2.0 * master[1] == moments[1] &&
                     (master[1] < master[0] || n == 0);
        double mx[2] = {worst[0], worst[1]};
        CHECK_OK(mal_comm_allreduce_max_f64(world, mx, 2));
        double tot[5] = {diff, mismatch, master[0], master[1], !own_ok};
        CHECK_OK(mal_comm_allreduce_f64(world, tot, 5));
        double whole = 4.0 * (double)rm->n_params;
        int ok = mx[0] <= LOSS_TOL && mx[1] <= WEIGHT_TOL && tot[0] == 0 && tot[1] == 0 &&
                 tot[3] == whole && tot[4] == 0;
        failed |= !ok;
        if (world->rank == 0)
            printf("%s %s%s%s (dp overlap %s): master sharded vs whole: %g values differ "
                   "(bitwise); vs one process: losses %.2e, weights %.2e (rms) apart; %g replica "
                   "working "
                   "weights differ; master over %d ranks: whole %.0f bytes, sharded %.0f bytes "
                   "(model's master once: %.0f), rank 0 %.0f -> %.0f bytes (%g ranks not "
                   "holding the moments' share)\n",
                   ok ? "PASS" : "FAIL", argv[a], change_path ? ", online onto " : "",
                   change_path ? change_path : "", overlap ? "on" : "off", tot[0], mx[0], mx[1],
                   tot[1], world->size, tot[2], tot[3], whole, master[0], master[1], tot[4]);
        free(w[0]);
        free(w[1]);
        mal_plan_fini(&plan);
    }
    free(rwork);
    mal_trainer_destroy(ref);
    mal_plan_fini(&change);
    mal_comm_finalize(world);
    return failed ? 1 : 0;
}
