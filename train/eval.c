/* Validation loss and text samples of the running model, for any plan:
 * forward-only passes through the same pipelines and TP groups as
 * training (pipeline.c), never a gradient.
 *
 * The validation set is the first K x G sequences of the validation file's
 * fixed stream (data.h: sequence j is mal_data_sample(val,
 * MAL_DATA_VAL_SEED, 0, j)), K = --eval-batches, G = the global batch.
 * Batch k is laid over the pipelines exactly like a training step's global
 * batch: pipeline p's micro-batch mb holds sequences k*G + first_sample +
 * mb*B + i.  Every sequence is evaluated once, by one pipeline; TP rank 0
 * of each last stage adds its per-token losses (fp32, summed in double per
 * micro-batch) and one all-reduce over the world adds those sums, so every
 * plan and rank count computes the same mean up to float summation order.
 *
 * Samples run on pipeline 0 only: for every new token its stages compute
 * one micro-batch whose first sequence is the window of the last seq_len
 * tokens, TP rank 0 of its last stage picks the token (sample.h) and
 * broadcasts it to every rank, so all ranks hold the same text. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "src/data.h"
#include "src/sample.h"
#include "train_internal.h"

int mal_eval_init(mal_trainer *tr)
{
    const mal_train_options *o = &tr->o;
    mal_eval *ev = &tr->eval;
    int rc;
    if (o->eval_every < 0 || o->eval_batches < 0 || o->sample_every < 0)
        return MAL_ERR(MAL_EINVAL, "--eval-every, --eval-batches and --sample-every must be >= 0");
    if (!o->val_data_path && !o->eval_every && !o->eval_only) return 0;
    if (o->val_data_path && o->val_fraction > 0)
        return MAL_ERR(MAL_EINVAL,
                       "--val-data and --val-fraction both name validation data: give one "
                       "(--val-fraction holds out part of --data)");
    if (!o->val_data_path && o->data_path && !(o->val_fraction > 0))
        return MAL_ERR(MAL_EINVAL,
                       "validation needs --val-data FILE or --val-fraction F when training on "
                       "--data %s (the default validation data, the built-in corpus's "
                       "held-out part, goes with the built-in corpus)",
                       o->data_path);
    /* Validation windows are read without replacement like training ones
     * (epochs of the validation stream), except for the built-in corpus's
     * held-out part, which keeps its random offsets. */
    mal_data_options dopt = mal_data_options_default();
    dopt.sampling = o->data_sampling;
    dopt.seq_len = o->model.seq_len;
    dopt.batch = o->global_batch;
    if (o->val_data_path) {
        dopt.format = o->val_data_format;
        rc = mal_data_open_opts(&ev->val, o->val_data_path, &dopt);
    } else if (o->data_path) {
        dopt.format = o->data_format;
        dopt.val_fraction = o->val_fraction;
        dopt.part = MAL_DATA_PART_HELDOUT;
        rc = mal_data_open_opts(&ev->val, o->data_path, &dopt);
    } else {
        rc = mal_data_open_heldout(&ev->val);
    }
    if (rc) return rc;
    if ((rc = mal_data_check_vocab(ev->val, o->model.vocab))) return rc;
    if (mal_data_n_tokens(ev->val) < (uint64_t)o->model.seq_len + 1)
        return MAL_ERR(MAL_EINVAL,
                       "validation data %s has %llu tokens, fewer than one sequence of %d + 1",
                       mal_data_name(ev->val), (unsigned long long)mal_data_n_tokens(ev->val),
                       o->model.seq_len);
    ev->best_val = INFINITY;
    ev->best_val_step = -1;
    return 0;
}

void mal_eval_fini(mal_trainer *tr)
{
    mal_data_destroy(tr->eval.val);
    tr->eval.val = NULL;
    mal_tokenizer_destroy(tr->eval.tok);
    tr->eval.tok = NULL;
}

/* Rank 0: the decoder of the tokenizer the training data names, for the
 * samples; a tokenizer that is gone or changed only costs the text (the
 * samples print ids, with a warning), never the run. */
static void load_tokenizer(mal_trainer *tr)
{
    mal_eval *ev = &tr->eval;
    ev->tok_tried = 1;
    const char *text = mal_data_tokenizer(tr->data);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    mal_tokenizer_ref r;
    if (!j) return;
    int rc = mal_tokenizer_ref_parse(&r, j, mal_data_name(tr->data));
    json_decref(j);
    if (!rc) {
        rc = mal_tokenizer_ref_check(&r);
        if (!rc) rc = mal_tokenizer_load(&ev->tok, r.file);
        mal_tokenizer_ref_fini(&r);
    }
    if (rc) mal_log(MAL_LOG_WARN, "samples print token ids: %s", mal_errmsg());
}

int mal_trainer_eval_batches(const mal_trainer *tr)
{
    return tr->o.eval_batches > 0 ? tr->o.eval_batches : MAL_EVAL_BATCHES_DEFAULT;
}

/* Validation batch pass->step, micro-batch mb of this pipeline. */
static int load_val(mal_trainer *tr, const mal_pass *pass, int mb, int B, int T)
{
    const mal_pipeline *p = &tr->pipe;
    for (int i = 0; i < B; i++) {
        int64_t j = pass->step * tr->o.global_batch + p->first_sample + (int64_t)mb * B + i;
        int rc = mal_data_sample(tr->eval.val, MAL_DATA_VAL_SEED, 0, j, T,
                                 p->inputs + (size_t)i * T, p->targets + (size_t)i * T);
        if (rc) return rc;
    }
    return 0;
}

int mal_trainer_evaluate(mal_trainer *tr, double *loss)
{
    if (!tr->eval.val)
        return MAL_ERR(MAL_EINVAL, "no validation data: the run was set up without evaluation");
    const int K = mal_trainer_eval_batches(tr);
    const double keep = tr->tally.loss_local;
    int rc = 0;
    tr->tally.loss_local = 0;
    /* One pass per validation batch, so micro-batch numbers (message tags)
     * stay those of a training step. */
    for (int k = 0; k < K && tr->part.model && !rc; k++) {
        const mal_pass pass = {load_val, k, NULL};
        rc = mal_pipeline_forward_only(tr, &pass, tr->pipe.n_micro);
    }
    const mal_model *m = tr->part.model;
    double sum = m && m->part.has_head && tr->part.loc.tp_rank == 0 ? tr->tally.loss_local : 0;
    tr->tally.loss_local = keep;
    if (rc) return rc;
    if (tr->world && (rc = mal_comm_allreduce_f64(tr->world, &sum, 1))) return rc;
    *loss = sum / ((double)K * tr->o.global_batch * tr->o.model.seq_len);
    return 0;
}

/* The context of a sample: sequence 0 is the window, the others zero. */
typedef struct {
    const int *window;
    int len;
} sample_ctx;

static int load_window(mal_trainer *tr, const mal_pass *pass, int mb, int B, int T)
{
    const sample_ctx *c = pass->ctx;
    (void)mb;
    memset(tr->pipe.inputs, 0, (size_t)B * T * sizeof *tr->pipe.inputs);
    memset(tr->pipe.targets, 0, (size_t)B * T * sizeof *tr->pipe.targets);
    memcpy(tr->pipe.inputs, c->window, (size_t)c->len * sizeof *tr->pipe.inputs);
    return 0;
}

int mal_trainer_sample(mal_trainer *tr, const int *prompt, int n_prompt, int n_new,
                       const mal_sample_options *so, int *out)
{
    const mal_plan_pipeline *p0 = &tr->plan.pipelines[0];
    const int root = p0->stages[p0->n_stages - 1].ranks[0];
    const int T = tr->o.model.seq_len, V = tr->o.model.vocab;
    const double keep = tr->tally.loss_local;
    float *row = NULL;
    int rc = 0;
    const int on_last = tr->part.loc.pipeline == 0 && tr->part.loc.stage == p0->n_stages - 1;
    if (n_prompt < 1) return MAL_ERR(MAL_EINVAL, "sample: empty prompt");
    if (on_last && !(row = malloc((size_t)V * sizeof *row)))
        return MAL_ERR(MAL_ENOMEM, "sample: out of memory");
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    for (int n = n_prompt; n < n_prompt + n_new && !rc; n++) {
        const int start = mal_sample_window_start(n, T);
        const sample_ctx c = {out + start, n - start};
        const mal_pass pass = {load_window, 0, &c};
        int next = 0, lrc = 0;
        if (tr->part.loc.pipeline == 0) rc = mal_pipeline_forward_only(tr, &pass, 1);
        /* the row's logits, gathered over the last stage's TP group (its
         * vocabulary shards): every rank of that group takes part */
        if (!rc && on_last)
            lrc = mal_model_logits_row(tr->part.model, tr->pipe.acts[0], c.len - 1, row);
        if (!rc && tr->world_rank == root)
            next = lrc ? lrc : mal_sample_pick(row, V, so, (uint64_t)n);
        /* The root's choice (or its failure, as a negative code) reaches
         * every rank, so all stop together. */
        if (!rc && tr->world) rc = mal_comm_broadcast(tr->world, &next, sizeof next, root);
        if (!rc && next < 0)
            rc = tr->world_rank == root ? next
                                        : MAL_ERR(next, "sample: rank %d failed to pick a token",
                                                  root);
        if (!rc) out[n] = next;
    }
    tr->tally.loss_local = keep;
    free(row);
    return rc;
}

int mal_eval_after_step(mal_trainer *tr, mal_step_stats *st)
{
    const int every = tr->o.eval_every;
    st->has_val = 0;
    if (every <= 0 || (st->step % every != 0 && st->step != tr->o.steps)) return 0;
    int rc = mal_trainer_evaluate(tr, &st->val_loss);
    if (rc) return rc;
    st->has_val = 1;
    if (st->val_loss < tr->eval.best_val) {
        tr->eval.best_val = st->val_loss;
        tr->eval.best_val_step = st->step;
    }
    return 0;
}

/* Collective: a sample of MAL_SAMPLE_EVERY_TOKENS tokens, printed by rank 0. */
static int print_sample(mal_trainer *tr, int64_t step, int always)
{
    const int V = tr->o.model.vocab;
    int *prompt = NULL, n_prompt = 0, *out = NULL;
    int rc = mal_sample_parse_prompt(tr->o.sample_prompt ? tr->o.sample_prompt : "", V, &prompt,
                                     &n_prompt);
    if (rc) return rc;
    if (!(out = malloc((size_t)(n_prompt + MAL_SAMPLE_EVERY_TOKENS) * sizeof *out))) {
        free(prompt);
        return MAL_ERR(MAL_ENOMEM, "sample: out of memory");
    }
    /* The same draws at every sampled step: what changes is the model. */
    const mal_sample_options so = {0.8f, 40, tr->o.seed};
    rc = mal_trainer_sample(tr, prompt, n_prompt, MAL_SAMPLE_EVERY_TOKENS, &so, out);
    if (!rc && tr->world_rank == 0 && (always || mal_log_level >= MAL_LOG_INFO)) {
        if (!tr->eval.tok_tried) load_tokenizer(tr);
        printf("sample at step %lld: ", (long long)step);
        if (!tr->eval.tok ||
            mal_tokenizer_print(tr->eval.tok, stdout, out, n_prompt + MAL_SAMPLE_EVERY_TOKENS, 0))
            mal_sample_print(stdout, out, n_prompt + MAL_SAMPLE_EVERY_TOKENS, V);
        printf("\n");
        fflush(stdout);
    }
    free(prompt);
    free(out);
    return rc;
}

int mal_sample_after_step(mal_trainer *tr, const mal_step_stats *st)
{
    const int every = tr->o.sample_every;
    if (every <= 0 || st->step % every != 0) return 0;
    return print_sample(tr, st->step, 0);
}

int mal_eval_only(mal_trainer *tr)
{
    double loss;
    double t0 = mal_now();
    int rc = mal_trainer_evaluate(tr, &loss);
    if (rc) return rc;
    if (tr->world_rank == 0)
        printf("malleus-train: validation loss %.10f at step %lld (%d batches of %d sequences of "
               "%s, %.2f s)\n",
               loss, (long long)tr->step, mal_trainer_eval_batches(tr), tr->o.global_batch,
               mal_data_name(tr->eval.val), mal_now() - t0);
    return tr->o.sample_every > 0 ? print_sample(tr, tr->step, 1) : 0;
}

void mal_eval_summary(const mal_trainer *tr)
{
    if (tr->world_rank == 0 && tr->eval.val && tr->eval.best_val_step >= 0)
        mal_log(MAL_LOG_INFO, "best validation loss %.4f at step %lld", tr->eval.best_val,
                (long long)tr->eval.best_val_step);
}
