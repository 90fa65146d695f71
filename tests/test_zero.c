/* The sharded optimizer (--zero 1) trains the same model as the unsharded
 * one and as one process, and keeps each Adam moment once.
 *
 * Run under mpiexec with the plan's world size:
 *   test_zero [--model NAME] [--dp-overlap on|off] [--dp-bucket-mb X]
 *             [--change PLAN2] [--bitwise on|off] PLAN.json ...
 * (options apply to the plans after them; the sum overlapped in buckets of
 * the default size unless they say otherwise: sharded, the regions are
 * the buckets'; --change: half way the runs move onto PLAN2 online, the
 * sharded moments made whole, moved and shared out again; --bitwise off:
 * zero 1 is not required to equal zero 0 bitwise, for plans whose holder
 * sets of 3 or more ranks reduce more than 64 KiB, around the ring).
 * For each model (`tiny` until --model says otherwise) every rank trains it
 * in one process with --zero 0 (the reference) and --zero 1 (every piece
 * its own: the update of pieces no group sums); then, for each plan, the
 * ranks train it with --zero 0 and --zero 1.  Checked: one-process zero 1
 * bitwise equal to zero 0; on the plan, the loss at every step and every
 * parameter within 1e-4 of the one-process reference (relative, as
 * test_parallel), the parameters of zero 1 bitwise equal to zero 0's (the
 * plans here sum over 2 holders, where the order of the add does not
 * change its bits, or over 3 holders of less than 64 KiB, which the
 * reduce-scatter adds in the all-reduce's order; holder sets of 3 or more
 * with more would differ in the last bits), the replicas' parameters
 * bitwise identical, and by the memory accountant the moments each rank
 * holds: zero 0 the whole of its part (2 x 4 bytes x its parameters),
 * zero 1 its share, the shares over all ranks adding up to exactly the
 * moments of the pieces each held once (the plans here replicate every
 * element: the one-process model's 2 x 4 bytes x parameters; a plan with
 * TP groups outside any replica would count their copies of the norm
 * weights, which every copy's holder updates alone, once per copy); and
 * with the sum overlapped (no --change) every rank's peak (the
 * accountant's most held at once) under zero 1 at least 0.9 x the moments
 * it saves under zero 0's. */
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

static mal_train_options options(const char *model, int zero)
{
    mal_train_options o = mal_test_tiny_options(STEPS, 2);
    CHECK_OK(mal_config_load(&o.model, model));
    if (strcmp(model, "tiny")) o.optim.eps = 1e-6f; /* test_parallel.c says why */
    o.zero = zero;
    return o;
}

/* Every parameter of tr's part, back to back in table order (malloc'd). */
static float *params_of(mal_trainer *tr, size_t *n)
{
    mal_model *m = mal_trainer_model(tr);
    *n = m ? m->n_params : 0;
    float *x = malloc((*n + 1) * sizeof *x);
    CHECK(x);
    for (int i = 0; m && i < m->n_tensors; i++)
        CHECK_OK(
            mal_model_state_to_host(m, MAL_STATE_PARAM, &m->tensors[i], x + m->tensors[i].offset));
    return x;
}

/* Largest |local - reference| over tensor t's shard relative to the
 * reference tensor's largest value. */
static double rel_err(const mal_tensor_info *t, const float *local, const mal_model *rm)
{
    const mal_tensor_info *rt = mal_model_find(rm, t->name);
    CHECK(rt != NULL);
    float *ref = malloc(rt->n * sizeof *ref);
    CHECK(ref);
    CHECK_OK(mal_model_state_to_host(rm, MAL_STATE_PARAM, rt, ref));
    double e = mal_test_shard_err(t, local, ref, rt->n);
    free(ref);
    return e;
}

static double moment_bytes(mal_trainer *tr)
{
    mal_kern_mem_stats ms;
    mal_kern_mem_get(mal_trainer_kernels(tr), &ms);
    return (double)ms.now[MAL_MEM_MOMENTS];
}

/* The most the accountant saw held at once (all categories). */
static double peak_bytes(mal_trainer *tr)
{
    mal_kern_mem_stats ms;
    mal_kern_mem_get(mal_trainer_kernels(tr), &ms);
    return (double)ms.total_peak;
}

int main(int argc, char **argv)
{
    mal_comm *world;
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    if (argc < 2) {
        if (world->rank == 0) fprintf(stderr, "usage: test_zero PLAN.json...\n");
        mal_comm_abort(world, MAL_TEST_ERROR);
    }
    mal_log_level = MAL_LOG_WARN;
    int failed = 0;
    const char *model = "tiny";
    int overlap = 1;
    double bucket_mb = -1;
    const char *change_path = NULL;
    int bitwise = 1;
    mal_plan change;
    mal_plan_init(&change);
    mal_trainer *ref = NULL;
    double ref_loss[STEPS];
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--model") && a + 1 < argc) {
            model = argv[++a];
            mal_trainer_destroy(ref);
            ref = NULL;
            continue;
        }
        if (!strcmp(argv[a], "--dp-overlap") && a + 1 < argc) {
            overlap = !strcmp(argv[++a], "on");
            continue;
        }
        if (!strcmp(argv[a], "--dp-bucket-mb") && a + 1 < argc) {
            bucket_mb = atof(argv[++a]);
            continue;
        }
        if (!strcmp(argv[a], "--bitwise") && a + 1 < argc) {
            bitwise = !strcmp(argv[++a], "on");
            continue;
        }
        if (!strcmp(argv[a], "--change") && a + 1 < argc) {
            change_path = argv[++a];
            mal_plan_fini(&change);
            mal_plan_init(&change);
            CHECK_OK(mal_plan_read(&change, change_path));
            continue;
        }
        if (!ref) {
            /* one process: zero 1 updates every piece alone, bitwise as zero 0 */
            mal_train_options o0 = options(model, 0), o1 = options(model, 1);
            double l1[STEPS];
            ref = mal_test_train(&o0, NULL, STEPS, ref_loss);
            mal_trainer *one = mal_test_train(&o1, NULL, STEPS, l1);
            size_t n0, n1, diff = 0;
            float *p0 = params_of(ref, &n0), *p1 = params_of(one, &n1);
            CHECK(n0 == n1);
            diff += memcmp(ref_loss, l1, sizeof l1) != 0;
            for (size_t i = 0; i < n0; i++)
                diff += memcmp(&p0[i], &p1[i], sizeof *p0) != 0;
            double mom[2] = {moment_bytes(ref), moment_bytes(one)};
            int ok = diff == 0 && mom[0] == mom[1] && mom[0] == 8.0 * (double)n0;
            failed |= !ok;
            if (world->rank == 0)
                printf("%s %s one process, zero 1 vs zero 0: %zu values differ (bitwise), "
                       "moments %.0f vs %.0f bytes\n",
                       ok ? "PASS" : "FAIL", model, diff, mom[1], mom[0]);
            free(p0);
            free(p1);
            mal_trainer_destroy(one);
        }
        mal_model *rm = mal_trainer_model(ref);
        mal_plan plan;
        mal_plan_init(&plan);
        CHECK_OK(mal_plan_read(&plan, argv[a]));
        double loss[2][STEPS], mom[2], peak[2];
        float *par[2];
        size_t n = 0;
        double worst[2] = {0, 0}, mismatch = 0;
        int early = 0;
        for (int z = 0; z < 2; z++) {
            mal_train_options o = options(model, z);
            o.plan = &plan;
            o.world = world;
            o.dp_overlap = overlap;
            if (bucket_mb >= 0) o.dp_bucket_mb = bucket_mb;
            mal_trainer *tr = mal_test_train(&o, change_path ? &change : NULL, STEPS, loss[z]);
            par[z] = params_of(tr, &n);
            mom[z] = moment_bytes(tr);
            peak[z] = peak_bytes(tr); /* before the replica check's buffer */
            for (int s = 0; s < STEPS; s++)
                worst[0] = fmax(worst[0], fabs(loss[z][s] - ref_loss[s]) / fabs(ref_loss[s]));
            mal_model *m = mal_trainer_model(tr);
            for (int i = 0; m && i < m->n_tensors; i++)
                worst[1] = fmax(worst[1], rel_err(&m->tensors[i], par[z], rm));
            if (z == 1) {
                CHECK_OK(mal_trainer_replica_mismatch(tr, &mismatch));
                mal_trainer_dp_buckets(tr, &early);
            }
            mal_trainer_destroy(tr);
        }
        double diff = memcmp(loss[0], loss[1], sizeof loss[0]) != 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&par[0][i], &par[1][i], sizeof(float)) != 0;
        /* moments: this rank's whole part under zero 0; the shares' sum */
        /* (a suspended rank holds nothing either way) */
        double own_ok = mom[0] == 8.0 * (double)n && (mom[1] < mom[0] || n == 0);
        /* the peak falls by about the moments saved: the sums stay in the
         * buckets' regions, nothing is allocated beside them (overlapped;
         * after the backward pass the sums take a shard of their own, and
         * an online change holds whole moments for the move) */
        int peak_ok = !overlap || change_path || peak[1] + 0.9 * (mom[0] - mom[1]) <= peak[0];
        double sums[6] = {worst[0], worst[1], 0, 0, 0, 0};
        CHECK_OK(mal_comm_allreduce_max_f64(world, sums, 2));
        double tot[7] = {diff, mismatch, mom[0], mom[1], !own_ok, early, !peak_ok};
        CHECK_OK(mal_comm_allreduce_f64(world, tot, 7));
        /* a bucket per layer: some reduce-scatter was posted from the
         * gradient hook, during the backward pass */
        int hooked = !overlap || bucket_mb != 0 || tot[5] > 0;
        double whole = 8.0 * (double)rm->n_params;
        int ok = sums[0] <= 1e-4 && sums[1] <= 1e-4 && (tot[0] == 0 || !bitwise) && tot[1] == 0 &&
                 tot[3] == whole && tot[4] == 0 && hooked && tot[6] == 0;
        failed |= !ok;
        if (world->rank == 0)
            printf(
                "%s %s %s%s%s (dp overlap %s, buckets %g MiB): max loss rel diff %.2e, max param "
                "rel diff %.2e (vs one process); "
                "zero 1 vs zero 0: %g values differ (bitwise%s), %g replica parameters differ; "
                "moments over %d ranks: zero 0 %.0f bytes, zero 1 %.0f bytes (model's "
                "moments once: %.0f), rank 0 %.0f -> %.0f bytes, its peak %.0f -> %.0f bytes "
                "(%g ranks' peaks not lower by the moments saved); %g reduce-scatters posted "
                "during the backward pass\n",
                ok ? "PASS" : "FAIL", model, argv[a], change_path ? ", online onto " : "",
                change_path ? change_path : "", overlap ? "on" : "off",
                bucket_mb >= 0 ? bucket_mb : 25.0, sums[0], sums[1], tot[0],
                bitwise ? "" : ": not required, the ring adds in another order", tot[1],
                world->size, tot[2], tot[3], whole, mom[0], mom[1], peak[0], peak[1], tot[6],
                tot[5]);
        free(par[0]);
        free(par[1]);
        mal_plan_fini(&plan);
    }
    mal_trainer_destroy(ref);
    mal_plan_fini(&change);
    mal_comm_finalize(world);
    return failed ? 1 : 0;
}
