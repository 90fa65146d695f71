/* Activation recomputation changes memory and time, never a number.
 *
 * Run under mpiexec with the world size the plans name:
 *   test_recompute PLAN.json [PLAN.json ...]
 * Every rank first trains `tiny` for STEPS steps in one process (no MPI)
 * with --recompute none, selective and full: the losses of every step and
 * every parameter must be bitwise those of none, and each mode must keep
 * less activation memory than the one before it.  Then, for each plan, the
 * ranks train under it with --recompute none (every stage, the
 * baseline), selective, full and, where the plan names modes of its own
 * ("recompute" per stage: a mixed plan), the plan's, from the start and
 * moved onto online half way from the plan without them: every step's loss
 * and every parameter shard every rank holds bitwise those of the
 * baseline, and within 1e-4 of one process.  Every run's activation
 * memory (the memory accountant's MAL_MEM_ACTIVATIONS) must be what the
 * model promises before allocating: the micro-batches its stage keeps in
 * flight times mal_acts_bytes, plus the mode's one-layer buffer.  Rank 0
 * prints one verdict line per run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mal_test.h"
#include "src/model.h"
#include "src/plan.h"
#include "tiny_options.h"
#include "train/train.h"

enum { STEPS = 6 };

/* The outcome of one run: its losses, this rank's parameters (the whole
 * state buffer, host copy), its activation bytes and whether the
 * accountant agreed with the promise. */
typedef struct {
    double loss[STEPS];
    float *params;
    size_t n_params;
    size_t acts;
    int acts_ok;
    int mode; /* the mode this rank's part ran in */
} run_result;

/* Train a run of options o; keep what it did in *r.  With `then`, the
 * run moves onto that plan online half way (the new part made in its
 * stage's mode). */
static void train(mal_train_options o, const mal_plan *then, run_result *r)
{
    mal_trainer *tr;
    memset(r, 0, sizeof *r);
    CHECK_OK(mal_trainer_create(&tr, &o));
    for (int s = 0; s < STEPS; s++) {
        if (then && s == STEPS / 2) CHECK_OK(mal_trainer_change_plan(tr, then));
        mal_step_stats st;
        CHECK_OK(mal_trainer_step(tr, &st));
        r->loss[s] = st.loss;
    }
    mal_model *m = mal_trainer_model(tr);
    r->acts_ok = 1;
    r->mode = -1;
    if (m) {
        r->mode = m->recompute;
        r->n_params = m->n_params;
        r->params = malloc(m->n_params * sizeof(float));
        CHECK(r->params);
        for (int i = 0; i < m->n_tensors; i++) {
            const mal_tensor_info *t = &m->tensors[i];
            CHECK_OK(mal_model_state_to_host(m, MAL_STATE_PARAM, t, r->params + t->offset));
        }
        /* the micro-batches in flight on this rank's stage (1F1B) */
        const mal_plan *plan = mal_trainer_plan(tr);
        mal_plan_loc loc;
        CHECK_OK(mal_plan_locate(plan, o.world ? o.world->rank : 0, &loc));
        const mal_plan_pipeline *pl = &plan->pipelines[loc.pipeline];
        int in_flight = MAL_MIN(pl->micro_batches, mal_plan_stage_warmup(pl, loc.stage) + 1);
        size_t shared;
        mal_acts_layer_bytes(m, plan->micro_batch_size, m->recompute, &shared);
        size_t promised = in_flight * mal_acts_bytes(m, plan->micro_batch_size) + shared;
        mal_kern_mem_stats ms;
        mal_kern_mem_get(mal_trainer_kernels(tr), &ms);
        r->acts = ms.now[MAL_MEM_ACTIVATIONS];
        r->acts_ok = r->acts == promised;
        if (!r->acts_ok)
            fprintf(stderr, "activations: the accountant holds %zu bytes, the model promised %zu\n",
                    r->acts, promised);
    }
    mal_trainer_destroy(tr);
}

/* Bitwise: every loss and every parameter element. */
static int same_bits(const run_result *a, const run_result *b)
{
    if (memcmp(a->loss, b->loss, sizeof a->loss)) return 0;
    if (a->n_params != b->n_params) return 0;
    return !a->n_params || !memcmp(a->params, b->params, a->n_params * sizeof(float));
}

static const char *mode_name(int mode)
{
    return mode < 0 ? "plan's" : mal_recompute_name(mode);
}

int main(int argc, char **argv)
{
    mal_comm *world;
    CHECK_OK(mal_comm_init(&argc, &argv, &world));
    mal_log_level = MAL_LOG_WARN;
    int failed = 0;

    /* One process, each mode against none. */
    run_result one[MAL_RECOMPUTE_COUNT];
    for (int mode = 0; mode < MAL_RECOMPUTE_COUNT; mode++) {
        mal_train_options o = mal_test_tiny_options(STEPS, 3);
        o.recompute = mode;
        train(o, NULL, &one[mode]);
        int ok = same_bits(&one[mode], &one[0]) && one[mode].acts_ok &&
                 (mode == 0 || one[mode].acts < one[mode - 1].acts);
        failed |= !ok;
        if (world->rank == 0)
            printf("%s one process, --recompute %s: losses and parameters %s those of none; "
                   "activations %zu bytes (%.2f of none)\n",
                   ok ? "PASS" : "FAIL", mode_name(mode),
                   same_bits(&one[mode], &one[0]) ? "bitwise" : "NOT bitwise", one[mode].acts,
                   (double)one[mode].acts / (double)one[0].acts);
    }

    for (int a = 1; a < argc; a++) {
        mal_plan plan;
        mal_plan_init(&plan);
        CHECK_OK(mal_plan_read(&plan, argv[a]));
        int has_own = 0;
        for (int p = 0; p < plan.n_pipelines; p++)
            for (int s = 0; s < plan.pipelines[p].n_stages; s++)
                has_own |= plan.pipelines[p].stages[s].recompute != MAL_RECOMPUTE_NONE;
        run_result base;
        /* the plan without its modes: where it has any, a run starts on
         * it and moves onto the plan online half way */
        mal_plan bare;
        mal_plan_init(&bare);
        CHECK_OK(mal_plan_copy(&bare, &plan));
        for (int p = 0; p < bare.n_pipelines; p++)
            for (int s = 0; s < bare.pipelines[p].n_stages; s++)
                bare.pipelines[p].stages[s].recompute = MAL_RECOMPUTE_NONE;
        /* the modes: none (the baseline) first, then the others, then the
         * plan's own (-1) where it has any, from the start and after an
         * online change */
        for (int mode = 0; mode < MAL_RECOMPUTE_COUNT + 2 * has_own; mode++) {
            int rmode = mode < MAL_RECOMPUTE_COUNT ? mode : -1;
            int online = mode == MAL_RECOMPUTE_COUNT + 1;
            mal_train_options o = mal_test_tiny_options(STEPS, 3);
            o.plan = online ? &bare : &plan;
            o.world = world;
            o.recompute = rmode;
            run_result r;
            double t0 = mal_now();
            train(o, online ? &plan : NULL, &r);
            double secs = mal_now() - t0;
            if (mode == 0) base = r;
            double worst = 0;
            for (int s = 0; s < STEPS; s++)
                worst = fmax(worst, fabs(r.loss[s] - one[0].loss[s]) / fabs(one[0].loss[s]));
            /* the mode in force: --recompute's, else this rank's stage's */
            mal_plan_loc loc;
            CHECK_OK(mal_plan_locate(&plan, world->rank, &loc));
            int want =
                rmode >= 0 ? rmode : plan.pipelines[loc.pipeline].stages[loc.stage].recompute;
            double bad[4] = {!same_bits(&r, &base), !r.acts_ok, worst, r.mode != want};
            CHECK_OK(mal_comm_allreduce_max_f64(world, bad, 4));
            int ok = bad[0] == 0 && bad[1] == 0 && bad[2] <= 1e-4 && bad[3] == 0;
            failed |= !ok;
            if (world->rank == 0)
                printf("%s %s, --recompute %s%s: %d steps in %.2f s, losses and parameters %s "
                       "those of none on every rank, max loss rel diff to one process %.2e, "
                       "activation memory %s the promise%s\n",
                       ok ? "PASS" : "FAIL", argv[a], mode_name(rmode),
                       online ? " (moved onto it online at step 3)" : "", STEPS, secs,
                       bad[0] ? "NOT bitwise" : "bitwise", bad[2],
                       bad[1] ? "DIFFERS FROM" : "equal to",
                       bad[3] ? "; a rank ran in another mode than its stage's" : "");
            if (mode) free(r.params);
        }
        free(base.params);
        mal_plan_fini(&bare);
        mal_plan_fini(&plan);
    }
    for (int mode = 0; mode < MAL_RECOMPUTE_COUNT; mode++)
        free(one[mode].params);
    mal_comm_finalize(world);
    return failed ? 1 : 0;
}
