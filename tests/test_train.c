/* Trainer tests on `tiny`, single process:
 *  1. the untrained loss is ln(vocab) within a few percent;
 *  2. micro-batching does not change the mathematics: one step with the
 *     global batch in 1, 2 or 8 micro-batches gives the same loss and the
 *     same parameters (up to float summation order);
 *  3. overfitting one fixed sequence drives the loss near zero;
 *  4. a run stopped at a snapshot and resumed reproduces the uninterrupted
 *     run bit for bit (losses, parameters, Adam moments). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "mal_test.h"
#include "src/data.h"
#include "src/model.h"
#include "train/train.h"

static mal_train_options base_options(void)
{
    mal_train_options o = mal_train_defaults();
    CHECK_OK(mal_config_load(&o.model, "tiny"));
    o.log_every = 0;
    o.threads = 1;
    return o;
}

static void test_initial_loss(void)
{
    mal_train_options o = base_options();
    o.eval_only = 1;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    double loss;
    CHECK_OK(mal_trainer_evaluate(tr, &loss));
    printf("untrained validation loss %.4f, ln(vocab) %.4f\n", loss, log(o.model.vocab));
    CHECK_CLOSE(loss, log(o.model.vocab), 0.02, 0.0);
    mal_trainer_destroy(tr);
}

static void test_micro_batching(void)
{
    float *params[3];
    double losses[3];
    const int micro[3] = {8, 2, 1};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        mal_train_options o = base_options();
        o.global_batch = 8;
        o.micro_batch = micro[i];
        o.optim.lr = 1e-2f;
        mal_trainer *tr;
        CHECK_OK(mal_trainer_create(&tr, &o));
        mal_step_stats st;
        for (int s = 0; s < 3; s++) CHECK_OK(mal_trainer_step(tr, &st));
        losses[i] = st.loss;
        mal_model *m = mal_trainer_model(tr);
        n = m->n_params;
        params[i] = malloc(n * sizeof(float));
        memcpy(params[i], m->params, n * sizeof(float));
        mal_trainer_destroy(tr);
    }
    for (int i = 1; i < 3; i++) {
        printf("micro-batch %d vs %d: loss %.9f vs %.9f\n", micro[i], micro[0], losses[i], losses[0]);
        CHECK_CLOSE(losses[i], losses[0], 1e-5, 0);
        double worst = 0, scale = 0;
        for (size_t j = 0; j < n; j++) {
            worst = fmax(worst, fabs((double)params[i][j] - params[0][j]));
            scale = fmax(scale, fabs((double)params[0][j]));
        }
        printf("  max parameter difference %.3g (max |p| %.3g)\n", worst, scale);
        CHECK(worst <= 1e-4 * scale);
    }
    for (int i = 0; i < 3; i++) free(params[i]);
}

static void test_overfit(const char *dir)
{
    /* A file of exactly seq_len + 1 tokens has one window: every sample of
     * every step is the same sequence. */
    mal_train_options o = base_options();
    int n = o.model.seq_len + 1;
    uint16_t *tok = malloc(sizeof(uint16_t) * (size_t)n);
    for (int i = 0; i < n; i++) tok[i] = (uint16_t)mal_rng_below(99, 0, (uint64_t)i, 256);
    char path[512];
    snprintf(path, sizeof path, "%s/one.bin", dir);
    CHECK_OK(mal_data_write(path, MAL_DATA_LLMC, tok, (size_t)n));
    o.data_path = path;
    o.global_batch = 2;
    o.micro_batch = 2;
    o.steps = 150;
    o.optim.lr = 1e-2f;
    o.optim.warmup_steps = 5;
    o.optim.weight_decay = 0;
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    mal_step_stats st = {0};
    double first = 0;
    for (int s = 0; s < o.steps; s++) {
        CHECK_OK(mal_trainer_step(tr, &st));
        if (s == 0) first = st.loss;
    }
    printf("overfit one sequence: loss %.4f -> %.4f after %lld steps\n", first, st.loss,
           (long long)o.steps);
    CHECK(st.loss < 0.05);
    mal_trainer_destroy(tr);
    free(tok);
}

static void run_steps(mal_trainer *tr, int n, double *losses)
{
    mal_step_stats st;
    for (int i = 0; i < n; i++) {
        CHECK_OK(mal_trainer_step(tr, &st));
        losses[i] = st.loss;
    }
}

static void test_resume(const char *dir)
{
    enum { TOTAL = 12, CUT = 5 };
    double ref[TOTAL], got[TOTAL];
    mal_train_options o = base_options();
    o.steps = TOTAL;
    o.global_batch = 4;
    o.micro_batch = 2;
    o.optim.lr = 3e-3f;
    o.optim.warmup_steps = 3;

    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    run_steps(tr, TOTAL, ref);
    mal_model *m = mal_trainer_model(tr);
    size_t n = m->n_params;
    float *state = malloc(3 * n * sizeof(float));
    memcpy(state, m->params, n * sizeof(float));
    memcpy(state + n, m->adam_m, n * sizeof(float));
    memcpy(state + 2 * n, m->adam_v, n * sizeof(float));
    mal_trainer_destroy(tr);

    char snapdir[512];
    snprintf(snapdir, sizeof snapdir, "%s/snap", dir);
    o.snapshot_dir = snapdir;
    CHECK_OK(mal_trainer_create(&tr, &o));
    run_steps(tr, CUT, got);
    CHECK_OK(mal_trainer_save(tr));
    mal_trainer_destroy(tr);

    o.resume = 1;
    CHECK_OK(mal_trainer_create(&tr, &o));
    CHECK_EQ_INT(mal_trainer_steps_done(tr), CUT);
    run_steps(tr, TOTAL - CUT, got + CUT);
    m = mal_trainer_model(tr);
    for (int i = 0; i < TOTAL; i++) {
        if (memcmp(&ref[i], &got[i], sizeof(double))) {
            fprintf(stderr, "step %d: loss %.17g (uninterrupted) vs %.17g (resumed)\n", i + 1,
                    ref[i], got[i]);
            exit(1);
        }
    }
    CHECK(!memcmp(state, m->params, n * sizeof(float)));
    CHECK(!memcmp(state + n, m->adam_m, n * sizeof(float)));
    CHECK(!memcmp(state + 2 * n, m->adam_v, n * sizeof(float)));
    printf("resume at step %d: %d losses and all %zu x 3 state values bit-identical\n", CUT,
           TOTAL, n);
    mal_trainer_destroy(tr);
    free(state);
}

int main(void)
{
    char dir[] = "/tmp/malleus-test-train-XXXXXX";
    if (!mkdtemp(dir)) return MAL_TEST_ERROR;
    test_initial_loss();
    test_micro_batching();
    test_overfit(dir);
    test_resume(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return MAL_TEST_ERROR;
    return 0;
}
