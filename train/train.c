/* The training loop for any plan: set-up (layout, model part, communicators),
 * one step (pipeline schedule, data-parallel gradient sum, global norm and
 * loss, AdamW), snapshots, metrics and the log.  A one-process run is the
 * plan with one pipeline of one stage of TP size 1. */
#include "train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/mal.h"
#include "ckpt/snapshot.h"
#include "kernels/kernels.h"
#include "preempt.h"
#include "src/data.h"
#include "src/layout.h"
#include "src/model.h"
#include "train_internal.h"

mal_train_options mal_train_defaults(void)
{
    mal_train_options o;
    memset(&o, 0, sizeof o);
    o.optim = mal_optim_defaults();
    o.seed = 1234;
    o.steps = 100;
    o.global_batch = 16;
    o.micro_batch = 4;
    o.data_format = MAL_DATA_AUTO;
    o.log_every = 1;
    o.dp_overlap = 1;
    o.dp_bucket_mb = 25; /* PyTorch DDP's default */
    o.zero = -1;         /* 1 where the plan has replicas (make_plan) */
    o.zero_master = -1;  /* as zero (make_plan) */
    o.recompute = -1;    /* each stage's plan field */
    o.change_cost = -1;  /* measured at the last change, else estimated */
    o.resume_from = -1;
    o.link_probe_every = MAL_LINK_PROBE_EVERY_DEFAULT;
    return o;
}

/* The plan in force: the given one, or the uniform dp x tp x pp layout. */
static int make_plan(mal_trainer *tr)
{
    const mal_train_options *o = &tr->o;
    int rc;
    if (o->plan) {
        if ((rc = mal_plan_copy(&tr->plan, o->plan))) return rc;
    } else {
        int dp = o->dp ? o->dp : 1, tp = o->tp ? o->tp : 1, pp = o->pp ? o->pp : 1;
        if (dp * tp * pp != tr->world_size)
            return MAL_ERR(MAL_EINVAL,
                           "--dp %d x --tp %d x --pp %d = %d ranks, but the job has %d: make "
                           "the product equal the number of ranks or give --plan",
                           dp, tp, pp, dp * tp * pp, tr->world_size);
        if ((rc = mal_plan_uniform(dp, tp, pp, o->model.n_layers, o->micro_batch, o->global_batch,
                                   &tr->plan)))
            return rc;
    }
    if ((rc = mal_plan_validate(&tr->plan, tr->world_size, o->model.n_layers, o->model.n_heads,
                                o->model.ffn_hidden, o->global_batch)))
        return rc;
    if (mal_plan_world_size(&tr->plan) != tr->world_size)
        return MAL_ERR(MAL_EINVAL, "the plan is for %d ranks but the job has %d",
                       mal_plan_world_size(&tr->plan), tr->world_size);
    tr->o.micro_batch = tr->plan.micro_batch_size;
    /* --zero by default: sharded wherever the plan replicates its layers
     * (more than one pipeline), where it saves memory; for the run, also
     * after an online change */
    if (tr->o.zero < 0) tr->o.zero = tr->plan.n_pipelines > 1;
    /* the master sharded with the moments by default: the same update, bit
     * for bit, in less memory (with fp32 compute it is the working weights
     * and stays whole whatever the setting) */
    if (tr->o.zero_master < 0) tr->o.zero_master = tr->o.zero;
    return 0;
}

/* Build this rank's share of the run.  Collective over the world. */
static int setup_layout(mal_trainer *tr)
{
    /* a resumed run, or one started from pretrained weights, overwrites
     * every parameter */
    int rc = mal_trainer_part_init(tr, !tr->o.resume && !tr->o.init_from);
    if (rc) return rc;
    if (tr->world_rank == 0) {
        tr->tally.rank_times = calloc((size_t)tr->world_size, sizeof *tr->tally.rank_times);
        if (!tr->tally.rank_times) return MAL_ERR(MAL_ENOMEM, "out of memory");
    }
    if ((rc = mal_monitor_init(tr))) return rc;
    return mal_linkprobe_init(tr);
}

/* The local part of set-up: kernel instance, plan, data and its checks. */
static int load_inputs(mal_trainer *tr)
{
    const mal_train_options *o = &tr->o;
    int rc;
    mal_kern_config kc = mal_kern_config_default();
    kc.threads = o->threads;
    kc.compute = mal_precision_dtype(o->precision);
    if ((rc = mal_kern_create(o->device, &kc, &tr->k))) return rc;
    if (o->inject_mode == MAL_INJECT_GPU && !mal_kern_has_slowdown(tr->k))
        return MAL_ERR(MAL_EINVAL,
                       "--inject-mode gpu needs a kernel backend that can slow its device "
                       "(--device cuda); '%s' cannot: use --inject-mode sleep",
                       tr->k->name);
    tr->comm_name = o->comm ? o->comm : mal_comm_default_name(tr->k->name);
    const mal_comm_backend *cb;
    if ((rc = mal_comm_lookup(tr->comm_name, &cb)) || (rc = mal_comm_check_device(cb, tr->k->name)))
        return rc;
    if ((rc = make_plan(tr))) return rc;
    if (o->data_path) {
        mal_data_options dopt = mal_data_options_default();
        dopt.format = o->data_format;
        dopt.sampling = o->data_sampling;
        dopt.seq_len = o->model.seq_len;
        dopt.batch = o->global_batch;
        dopt.val_fraction = o->val_fraction;
        dopt.part = o->val_fraction > 0 ? MAL_DATA_PART_TRAIN : MAL_DATA_PART_ALL;
        rc = mal_data_open_opts(&tr->data, o->data_path, &dopt);
    } else if (o->val_fraction > 0 || o->data_sampling != MAL_DATA_SAMPLE_DEFAULT) {
        rc = MAL_ERR(MAL_EINVAL,
                     "--val-fraction and --data-sampling are for token files (--data); the "
                     "built-in corpus is sampled at random offsets and has its own held-out "
                     "part");
    } else {
        rc = mal_data_open_default(&tr->data);
    }
    if (rc) return rc;
    if ((rc = mal_data_check_vocab(tr->data, o->model.vocab))) return rc;
    if (mal_data_n_tokens(tr->data) < (uint64_t)o->model.seq_len + 1)
        return MAL_ERR(MAL_EINVAL, "data %s has %llu tokens, fewer than one sequence of %d + 1",
                       mal_data_name(tr->data), (unsigned long long)mal_data_n_tokens(tr->data),
                       o->model.seq_len);
    return mal_eval_init(tr); /* the validation data, the same way */
}

int mal_trainer_fatal(mal_trainer *tr, int rc)
{
    if (!rc || !tr->world || tr->world_size == 1) return rc;
    /* Peers may be blocked in a collective this rank will never join (and
     * device kernels in a data-plane collective): end the whole job through
     * the comm table, with the status the error calls for. */
    mal_log(MAL_LOG_ERROR, "rank %d: %s; aborting the job", tr->world_rank, mal_errmsg());
    mal_comm_abort(tr->world, mal_trainer_exit_status(tr, rc));
    return rc; /* not reached with a real backend */
}

int mal_trainer_create(mal_trainer **out, const mal_train_options *opts)
{
    const mal_train_options *o = opts;
    int rc;
    if ((rc = mal_config_validate(&o->model))) return rc;
    if (o->steps < 0) return MAL_ERR(MAL_EINVAL, "--steps must be >= 0");
    if (o->global_batch < 1 || o->micro_batch < 1)
        return MAL_ERR(MAL_EINVAL, "--global-batch and --micro-batch must be >= 1");
    if (!o->plan && o->global_batch % o->micro_batch)
        return MAL_ERR(MAL_EINVAL,
                       "--global-batch %d is not a multiple of --micro-batch %d (every step "
                       "processes whole micro-batches)",
                       o->global_batch, o->micro_batch);
    if (!(o->optim.lr > 0) || !isfinite(o->optim.lr))
        return MAL_ERR(MAL_EINVAL, "--lr must be a positive number");
    if (o->optim.warmup_steps < 0) return MAL_ERR(MAL_EINVAL, "--warmup must be >= 0");
    if (o->resume && !o->snapshot_dir)
        return MAL_ERR(MAL_EINVAL, "--resume needs --snapshot-dir to find the snapshot");
    if (o->init_from && o->resume)
        return MAL_ERR(MAL_EINVAL,
                       "--init-from starts a new run from a model's weights and --resume "
                       "continues a run from its snapshot: give one of them");
    if (o->init_from && o->snapshot_dir) {
        /* the source must outlive the run's own snapshots: retention and
         * --overwrite-snapshots manage what lies in the directory */
        struct stat a, b;
        if (mal_snapshot_dir_owns(o->snapshot_dir, o->init_from) ||
            (stat(o->init_from, &a) == 0 && stat(o->snapshot_dir, &b) == 0 &&
             a.st_dev == b.st_dev && a.st_ino == b.st_ino))
            return MAL_ERR(MAL_EINVAL,
                           "--init-from %s lies in --snapshot-dir %s, whose snapshots this run "
                           "replaces: write the run's snapshots into another directory",
                           o->init_from, o->snapshot_dir);
    }
    if (o->snapshot_async && !o->snapshot_dir)
        return MAL_ERR(MAL_EINVAL, "--snapshot-async needs --snapshot-dir to write snapshots into");
    if (!(o->dp_bucket_mb >= 0) || o->dp_bucket_mb > 1e6)
        return MAL_ERR(MAL_EINVAL, "--dp-bucket-mb must be a number of MiB between 0 and 1e6");
    if (o->zero < -1 || o->zero > 1) return MAL_ERR(MAL_EINVAL, "--zero must be 0 or 1");
    if (o->zero_master < -1 || o->zero_master > 1)
        return MAL_ERR(MAL_EINVAL, "--zero-master must be on or off");
    if (o->zero_master == 1 && o->zero == 0)
        return MAL_ERR(MAL_EINVAL, "--zero-master on shards the master with the moments: it "
                                   "needs --zero 1, not --zero 0");
    if (o->recompute < -1 || o->recompute >= MAL_RECOMPUTE_COUNT)
        return MAL_ERR(MAL_EINVAL, "--recompute must be none, selective or full");
    if ((rc = mal_train_resume_check_options(o))) return rc;
    int world_size = o->world ? o->world->size : 1;

    mal_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return MAL_ERR(MAL_ENOMEM, "out of memory");
    mal_plan_init(&tr->plan);
    tr->o = *o;
    tr->world_rank = o->world ? o->world->rank : 0;
    tr->world_size = world_size;
    if (tr->o.optim.warmup_steps == 0) tr->o.optim.warmup_steps = 1;
    /* the schedule's length: the run's steps, or on resume the snapshot's
     * run's (resume.c: a resumed run keeps its schedule) */
    if (tr->o.optim.total_steps <= 0 && !o->resume) tr->o.optim.total_steps = (int)o->steps;

    /* Everything up to the first collective is local, and a rank may fail
     * in it alone (a data file missing on its node): agree first, so that
     * no rank runs on into a collective that a failed one never joins;
     * every rank returns the first failing rank's error. */
    rc = load_inputs(tr);
    if (!rc) rc = mal_train_resume_init(tr); /* the data's identity */
    if (o->world && tr->world_size > 1) rc = mal_snapshot_agree(o->world, rc);
    /* The trainer's traffic goes over its own communicator, whose data
     * plane is the chosen backend (collective; every rank got here). */
    if (!rc && o->world) rc = mal_comm_dup(o->world, tr->comm_name, &tr->world);
    if (rc) goto fail;
    if ((rc = mal_trainer_check_memory(tr))) goto fail; /* every rank alike */
    mal_progress_init(tr);
    /* From here a failure may be this rank's alone, inside collectives. */
    if ((rc = setup_layout(tr))) {
        rc = mal_trainer_fatal(tr, rc);
        goto fail;
    }
    /* resume (with o.resume), then the background snapshot writer */
    if ((rc = mal_train_ckpt_init(tr))) goto fail; /* agreed */
    *out = tr;
    return 0;
fail:
    mal_trainer_destroy(tr);
    return rc;
}

void mal_trainer_destroy(mal_trainer *tr)
{
    if (!tr) return;
    /* first: a background snapshot still being written needs the world */
    mal_train_ckpt_fini(tr);
    if (tr->metrics) fclose(tr->metrics);
    mal_trainer_part_fini(tr);
    mal_linkprobe_fini(tr);
    mal_monitor_fini(tr);
    mal_comm_destroy(tr->world);
    mal_data_destroy(tr->data);
    mal_eval_fini(tr);
    mal_train_resume_fini(tr);
    mal_plan_fini(&tr->plan);
    free(tr->tally.rank_times);
    /* last: every device buffer above was the instance's */
    mal_kern_destroy(tr->k);
    free(tr);
}

int64_t mal_trainer_steps_done(const mal_trainer *tr)
{
    return tr->step;
}

int mal_trainer_exit_status(const mal_trainer *tr, int rc)
{
    int status = mal_exit_status(rc);
    /* 2 promises "refused, nothing written": once steps were trained (and
     * metrics and snapshots written), a mistake found only now is a
     * failure of the run */
    return status == 2 && tr && tr->step > tr->ckpt.start_step ? 1 : status;
}
mal_model *mal_trainer_model(mal_trainer *tr)
{
    return tr->part.model;
}
mal_kern mal_trainer_kernels(const mal_trainer *tr)
{
    return tr->k;
}
const mal_plan *mal_trainer_plan(const mal_trainer *tr)
{
    return &tr->plan;
}

int mal_trainer_dp_buckets(const mal_trainer *tr, int *posted_early)
{
    if (posted_early) *posted_early = 0;
    return tr->part.gsync ? mal_gradsync_n_buckets(tr->part.gsync, posted_early) : 0;
}

int mal_trainer_replica_mismatch(mal_trainer *tr, double *count)
{
    int rc = 0;
    *count = 0;
    if (tr->part.gsync && (rc = mal_gradsync_replica_mismatch(tr->part.gsync, count))) return rc;
    return tr->world ? mal_comm_allreduce_f64(tr->world, count, 1) : 0;
}

/* Test hook: MALLEUS_TEST_STEP_FAIL=RANK:STEP makes step STEP (1-based) fail
 * on that rank alone, as a rank-local failure (a device or I/O error) would;
 * tests/test_dying.sh checks that the job then ends promptly. */
static int test_fail_hook(int rank, int64_t step)
{
    const char *e = getenv("MALLEUS_TEST_STEP_FAIL");
    int r;
    long long s;
    return e && sscanf(e, "%d:%lld", &r, &s) == 2 && r == rank && s == step;
}

/* Test hook: MALLEUS_TEST_STEP_STALL=RANK:STEP makes that rank hang at the
 * start of step STEP (1-based), as a rank stuck in a device call would;
 * tests/test_preempt.sh checks that a stop request still ends the job
 * within the stop timeout. */
static void test_stall_hook(int rank, int64_t step)
{
    const char *e = getenv("MALLEUS_TEST_STEP_STALL");
    int r;
    long long s;
    if (e && sscanf(e, "%d:%lld", &r, &s) == 2 && r == rank && s == step)
        for (;;)
            pause();
}

/* Test hook: MALLEUS_TEST_STEP_SLEEP=MS:TO makes every rank sleep MS
 * milliseconds at the start of each step before step TO (1-based): a run
 * whose pace does not depend on the machine's load, for the tests that
 * must catch it in the middle (tests/test_slurm_preempt.sh). */
static void test_sleep_hook(int64_t step)
{
    const char *e = getenv("MALLEUS_TEST_STEP_SLEEP");
    long ms;
    long long to;
    if (e && sscanf(e, "%ld:%lld", &ms, &to) == 2 && ms > 0 && step < to)
        nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000}, NULL);
}

int mal_trainer_step(mal_trainer *tr, mal_step_stats *st)
{
    mal_model *m = tr->part.model;
    mal_gradsync *gs = tr->part.gsync;
    mal_step_tally *tally = &tr->tally;
    const double tokens = (double)tr->o.global_batch * tr->o.model.seq_len;
    /* Every token of the global batch weighs 1/tokens in the loss, whichever
     * micro-batch and whichever pipeline computes it. */
    const float dscale = (float)(1.0 / tokens);
    const int64_t step = tr->step;
    double t0 = mal_now();
    int rc;

    if (test_fail_hook(tr->world_rank, step + 1))
        return MAL_ERR(MAL_EIO, "test hook MALLEUS_TEST_STEP_FAIL: step %lld fails on rank %d",
                       (long long)step + 1, tr->world_rank);
    test_stall_hook(tr->world_rank, step + 1);
    test_sleep_hook(step + 1);
    memset(&tally->times, 0, sizeof tally->times);
    tally->loss_local = 0;
    if ((rc = mal_inject_begin_step(tr, step))) return rc;
    if (m) {
        double c0 = mal_now();
        mal_model_zero_grad(m);
        tally->times.compute += mal_now() - c0;
        double d0 = mal_now();
        if (tr->o.dp_overlap && (rc = mal_gradsync_begin(gs))) return rc;
        tally->times.dp += mal_now() - d0;
        /* with --dp-overlap on, the step's last backward pass packs and
         * posts the buckets from the model's gradient hook (pipeline.c) */
        if ((rc = mal_pipeline_run(tr, step, dscale))) return rc;
        d0 = mal_now();
        /* sharded, the buckets are reduce-scattered (mal_gradsync_finish
         * knows), or after the backward pass the holder sets */
        if ((rc = tr->o.dp_overlap ? mal_gradsync_finish(gs)
                  : tr->o.zero     ? mal_gradsync_zero_reduce(gs)
                                   : mal_gradsync_run(gs)))
            return rc;
        tally->times.dp_wait = mal_now() - d0;
        tally->times.dp += tally->times.dp_wait;
        /* --inject-link: the step's gradient sum over a slow link */
        if (tr->mon.link_dp_now > 1.0)
            tally->times.dp = mal_inject_link_stretch(tr, -2, tally->times.dp);
    }
    /* Global loss and gradient norm: each loss is counted by TP rank 0 of
     * its pipeline's last stage, each gradient element by one holder;
     * suspended ranks add zeros.  The same sum carries the stop requests
     * (preempt.h): the ranks that have one, and those whose is SIGUSR1, so
     * every rank learns of any rank's in this step at no extra cost. */
    double c0 = mal_now();
    const int sig = mal_preempt_signal();
    double red[4] = {m && m->part.has_head && tr->part.loc.tp_rank == 0 ? tally->loss_local : 0.0,
                     0.0, sig != 0, sig == SIGUSR1};
    if (m && (rc = mal_gradsync_norm_sumsq(gs, &red[1]))) return rc;
    tally->times.compute += mal_now() - c0;
    double d0 = mal_now();
    if (tr->world && (rc = mal_comm_allreduce_f64(tr->world, red, 4))) return rc;
    tally->times.dp += mal_now() - d0;
    double norm = sqrt(red[1]);
    float lr = mal_optim_lr(&tr->o.optim, step);
    if (m) {
        c0 = mal_now();
        float scale = mal_optim_clip_scale(&tr->o.optim, norm);
        if (tr->o.zero)
            rc = mal_gradsync_zero_step(gs, &tr->o.optim, step, lr, scale);
        else
            mal_optim_update(m, &tr->o.optim, step, lr, scale);
        if (rc || (rc = mal_kern_sync(m->k))) return rc;
        tally->times.compute += mal_inject_stretch(tr, mal_now() - c0);
    }
    /* The monitor's probe starts on every rank right after the all-reduce
     * above released them together. */
    double pw = mal_now();
    double probe = mal_monitor_probe(tr);
    double link_cost = 0;
    const int link_probe = tr->world && mal_linkprobe_due(tr, step);
    if (link_probe && (rc = mal_linkprobe_run(tr, &link_cost))) return rc;
    double probe_cost = mal_now() - pw;

    double step_s = mal_now() - t0;
    mal_rank_times mine = {.compute_s = tally->times.compute,
                           .tp_s = tally->times.tp,
                           .pp_s = tally->times.pp,
                           .dp_s = tally->times.dp,
                           .step_s = step_s,
                           .dp_wait_s = tally->times.dp_wait,
                           .probe_s = probe,
                           .probe_cost_s = probe_cost,
                           .link_cost_s = link_cost,
                           .mem_bytes = mal_progress_memory(tr),
                           .mem_peak_bytes = mal_progress_memory_peak(tr)};
    mal_progress_record(tr, step_s);
    if (tr->world) {
        if ((rc = mal_comm_gather(tr->world, &mine, tally->rank_times, sizeof mine, 0))) return rc;
    } else {
        tally->rank_times[0] = mine;
    }
    if (st) {
        memset(st, 0, sizeof *st);
        st->step = tr->step + 1;
        st->loss = red[0] / tokens;
        st->lr = lr;
        st->grad_norm = norm;
        st->step_s = step_s;
        st->compute_s = tally->times.compute;
        st->tokens_per_s = tokens / step_s;
        st->stop_signal = red[2] == 0 ? 0 : sig ? sig : red[3] > 0 ? SIGUSR1 : -1;
        st->link_probe = link_probe;
        if (tr->world_rank == 0) {
            st->ranks = tally->rank_times;
            for (int r = 1; r < tr->world_size; r++)
                if (tally->rank_times[r].compute_s > tally->rank_times[st->slowest_rank].compute_s)
                    st->slowest_rank = r;
        }
    }
    if (!isfinite(red[0]))
        return MAL_ERR(MAL_EINVAL, "loss became %f at step %lld: lower --lr", red[0],
                       (long long)step + 1);
    tr->step++;
    return mal_monitor_observe(tr, st);
}

int mal_trainer_save(mal_trainer *tr)
{
    return mal_train_ckpt_save(tr, tr->o.snapshot_dir);
}

int mal_trainer_save_to(mal_trainer *tr, const char *dir)
{
    return mal_train_ckpt_save(tr, dir);
}

void mal_trainer_print_summary(const mal_trainer *tr, FILE *f)
{
    const mal_model_config *c = &tr->o.model;
    const mal_plan *pl = &tr->plan;
    int64_t np = mal_config_n_params(c);
    /* parameters, gradients, Adam m and v in fp32 */
    double state_mb = 16.0 * (double)np / 1048576.0;
    fprintf(f, "malleus-train %s\n", PACKAGE_VERSION);
    fprintf(f, "+----------------------+------------------------------------------+\n");
    fprintf(f, "| model                | %-40.40s |\n", c->name);
    fprintf(f, "| parameters           | %-40lld |\n", (long long)np);
    fprintf(f, "| vocab / d_model      | %6d / %-31d |\n", c->vocab, c->d_model);
    fprintf(f, "| layers / heads / ffn | %4d / %4d / %-27d |\n", c->n_layers, c->n_heads,
            c->ffn_hidden);
    if (c->n_kv_heads != c->n_heads || c->tie_embeddings)
        fprintf(f, "| kv heads / tied emb. | %4d / %-33s |\n", c->n_kv_heads,
                c->tie_embeddings ? "yes" : "no");
    fprintf(f, "| seq_len / rope theta | %6d / %-31g |\n", c->seq_len, (double)c->rope.theta);
    if (c->rope.llama3) {
        char sc[64];
        snprintf(sc, sizeof sc, "llama3: factor %g, %g..%g of %d", (double)c->rope.factor,
                 (double)c->rope.low_freq_factor, (double)c->rope.high_freq_factor,
                 c->rope.original_max_pos);
        fprintf(f, "| rope scaling         | %-40.40s |\n", sc);
    }
    fprintf(f, "| state (p+g+m+v)      | %-36.1f MiB |\n", state_mb);
    if (tr->part.model) {
        size_t shared;
        mal_acts_layer_bytes(tr->part.model, pl->micro_batch_size, tr->part.model->recompute,
                             &shared);
        fprintf(f, "| activations/micro    | %-36.1f MiB |\n",
                (double)mal_acts_bytes(tr->part.model, pl->micro_batch_size) / 1048576.0);
        char line[64];
        /* the mode, where it comes from, and its one-layer buffer */
        snprintf(line, sizeof line, "%s (%s), +%.*f MiB buffer",
                 mal_recompute_name(tr->part.model->recompute),
                 tr->o.recompute >= 0 ? "--recompute" : "plan", shared < 100 << 20 ? 1 : 0,
                 (double)shared / 1048576.0);
        fprintf(f, "| recompute            | %-40.40s |\n", line);
    }
    fprintf(f, "| data                 | %-40.40s |\n", mal_data_name(tr->data));
    if (mal_data_n_tokens(tr->data) == UINT64_MAX) /* synthetic: generated */
        fprintf(f, "| data tokens          | %-40s |\n", "unbounded (generated)");
    else
        fprintf(f, "| data tokens          | %-40llu |\n",
                (unsigned long long)mal_data_n_tokens(tr->data));
    if (mal_data_sampling(tr->data) == MAL_DATA_SAMPLE_EPOCHS) {
        char what[64];
        snprintf(what, sizeof what, "epochs of %llu windows, %d file%s",
                 (unsigned long long)mal_data_n_windows(tr->data), mal_data_n_files(tr->data),
                 mal_data_n_files(tr->data) == 1 ? "" : "s");
        fprintf(f, "| data sampling        | %-40s |\n", what);
    }
    fprintf(f, "| global / micro batch | %4d / %-33d |\n", tr->o.global_batch,
            pl->micro_batch_size);
    fprintf(f, "| ranks / pipelines    | %4d / %-33d |\n", tr->world_size, pl->n_pipelines);
    for (int p = 0; p < pl->n_pipelines && p < 16; p++) {
        char line[256];
        int n = snprintf(line, sizeof line, "m=%d:", pl->pipelines[p].micro_batches);
        for (int s = 0; s < pl->pipelines[p].n_stages && n < (int)sizeof line - 24; s++) {
            const mal_plan_stage *st = &pl->pipelines[p].stages[s];
            /* a deeper 1F1B warm-up than the default: " w" and its depth */
            char w[16] = "";
            if (mal_plan_stage_warmup(&pl->pipelines[p], s) !=
                MAL_MIN(pl->pipelines[p].n_stages - s - 1, pl->pipelines[p].micro_batches))
                snprintf(w, sizeof w, " w%d", mal_plan_stage_warmup(&pl->pipelines[p], s));
            n += snprintf(line + n, sizeof line - (size_t)n, " [L%d-%d tp%d%s]", st->layer_begin,
                          st->layer_end, st->n_ranks, w);
        }
        fprintf(f, "|   pipeline %-9d | %-40.40s |\n", p, line);
    }
    if (pl->n_suspended) fprintf(f, "| suspended ranks      | %-40d |\n", pl->n_suspended);
    if (tr->o.snapshot_dir) {
        char line[128], keep[32] = "all";
        if (tr->o.keep_snapshots > 0) snprintf(keep, sizeof keep, "%d", tr->o.keep_snapshots);
        int n = tr->o.snapshot_every > 0
                    ? snprintf(line, sizeof line, "every %d steps", tr->o.snapshot_every)
                    : snprintf(line, sizeof line, "at the end");
        snprintf(line + n, sizeof line - (size_t)n, ", keep %s, %s", keep,
                 tr->ckpt.async ? "background" : "synchronous");
        fprintf(f, "| snapshots            | %-40.40s |\n", line);
    }
    fprintf(f, "| steps / seed         | %6lld / %-31llu |\n", (long long)tr->o.steps,
            (unsigned long long)tr->o.seed);
    fprintf(f, "| lr / warmup / wd     | %-10g / %5d / %-19g |\n", (double)tr->o.optim.lr,
            tr->o.optim.warmup_steps, (double)tr->o.optim.weight_decay);
    char kname[64];
    snprintf(kname, sizeof kname, "%s (%s)", tr->k->name, mal_dtype_name(tr->k->compute));
    fprintf(f, "| kernels / comm       | %-18s / %-19s |\n", kname,
            tr->world ? tr->comm_name : "none");
    fprintf(f, "| MFU against          | %-40.40s |\n", tr->prog.peak_what);
    fprintf(f, "| Adam moments         | %-40.40s |\n",
            tr->o.zero ? "sharded over the holders (--zero 1)" : "whole on every replica");
    if (tr->o.zero_master)
        fprintf(f, "| fp32 master          | %-40.40s |\n",
                !tr->o.zero                      ? "whole (--zero-master needs --zero 1)"
                : mal_model_separate_work(tr->k) ? "sharded as the moments (--zero-master)"
                                                 : "whole: it is the working weights (fp32)");
    if (tr->world) {
        char line[64];
        if (!tr->o.dp_overlap)
            snprintf(line, sizeof line, "after the backward pass");
        else if (tr->o.dp_bucket_mb > 0)
            snprintf(line, sizeof line, "overlapped, buckets of %g MiB", tr->o.dp_bucket_mb);
        else
            snprintf(line, sizeof line, "overlapped, a bucket per layer");
        fprintf(f, "| dp gradient sum      | %-40.40s |\n", line);
    }
    fprintf(f, "| build: CUDA / NCCL   | %-18s / %-19s |\n",
#ifdef HAVE_CUDA
            "compiled in",
#else
            "not built",
#endif
#ifdef HAVE_NCCL
            "compiled in"
#else
            "not built"
#endif
    );
    fprintf(f, "+----------------------+------------------------------------------+\n");
    fflush(f);
}

/* The link monitor's figures of a probe step: each pair's least round
 * trip and rate (malleus-replan --links reads the rates), and what the
 * probe cost the slowest rank. */
static void write_link_metrics(const mal_trainer *tr, FILE *f)
{
    const mal_linkprobe *lp = &tr->mon.link;
    double cost = 0;
    for (int r = 0; r < tr->world_size; r++)
        cost = MAL_MAX(cost, tr->tally.rank_times[r].link_cost_s);
    fprintf(f, ", \"link_probe_ms\": %.3f, \"link_rtt_us\": [", 1e3 * cost);
    int first = 1;
    for (int i = 0; i < lp->n_pairs; i++)
        if (lp->rtt[i] > 0) {
            fprintf(f, "%s[%d, %d, %.1f]", first ? "" : ", ", lp->pairs[2 * i],
                    lp->pairs[2 * i + 1], 1e6 * lp->rtt[i]);
            first = 0;
        }
    /* the rates as measured, then as the planner should take them: below
     * the link noise floor a link is healthy */
    for (int fl = 0; fl < 2; fl++) {
        fprintf(f, "], \"%s\": [", fl ? "link_rates" : "link_rates_raw");
        first = 1;
        for (int i = 0; i < lp->n_pairs; i++)
            if (lp->rates[i] > 0) {
                double r = fl && lp->rates[i] < lp->noise_floor ? 1.0 : lp->rates[i];
                fprintf(f, "%s[%d, %d, %.4f]", first ? "" : ", ", lp->pairs[2 * i],
                        lp->pairs[2 * i + 1], r);
                first = 0;
            }
    }
    fprintf(f, "]");
    if (lp->advised && lp->trigger_pair >= 0)
        fprintf(f, ", \"link_moved\": [%d, %d]", lp->pairs[2 * lp->trigger_pair],
                lp->pairs[2 * lp->trigger_pair + 1]);
}

static int write_metrics(mal_trainer *tr, const mal_step_stats *st)
{
    if (!tr->metrics) return 0;
    FILE *f = tr->metrics;
    fprintf(f,
            "{\"step\": %lld, \"loss\": %.7g, \"lr\": %.7g, \"grad_norm\": %.7g, "
            "\"tokens_per_s\": %.1f, \"step_ms\": %.3f, \"compute_ms\": %.3f, "
            "\"consumed_samples\": %lld, \"slowest_rank\": %d, \"ranks\": [",
            (long long)st->step, st->loss, (double)st->lr, st->grad_norm, st->tokens_per_s,
            1e3 * st->step_s, 1e3 * st->compute_s, (long long)st->step * tr->o.global_batch,
            st->slowest_rank);
    for (int r = 0; r < tr->world_size; r++) {
        const mal_rank_times *t = &tr->tally.rank_times[r];
        double idle = t->step_s - t->compute_s - t->tp_s - t->pp_s - t->dp_s;
        fprintf(f,
                "%s{\"rank\": %d, \"compute_ms\": %.3f, \"tp_ms\": %.3f, \"pp_ms\": %.3f, "
                "\"dp_ms\": %.3f, \"dp_wait_ms\": %.3f, \"idle_ms\": %.3f, "
                "\"probe_ms\": %.4f, \"monitor_ms\": %.4f, \"mem_peak_mb\": %.3f}",
                r ? ", " : "", r, 1e3 * t->compute_s, 1e3 * t->tp_s, 1e3 * t->pp_s, 1e3 * t->dp_s,
                1e3 * t->dp_wait_s, 1e3 * (idle > 0 ? idle : 0), 1e3 * t->probe_s,
                1e3 * t->probe_cost_s, t->mem_peak_bytes / 1048576.0);
    }
    fprintf(f, "]");
    if (st->rates) {
        fprintf(f, ", \"rates\": [");
        for (int r = 0; r < tr->world_size; r++)
            fprintf(f, "%s%.4f", r ? ", " : "", st->rates[r]);
        fprintf(f, "]");
    }
    if (tr->mon.hostnames && st->step % tr->mon.check_every_all == 0) {
        fprintf(f, ", \"nodes\": [");
        for (int r = 0; r < tr->world_size; r++)
            fprintf(f, "%s\"%s\"", r ? ", " : "", tr->mon.hostnames + (size_t)r * MAL_HOSTNAME_LEN);
        fprintf(f, "]");
    }
    if (st->link_probe) write_link_metrics(tr, f);
    if (st->replan) fprintf(f, ", \"replan\": true, \"trigger_rank\": %d", st->trigger_rank);
    if (st->has_val) fprintf(f, ", \"val_loss\": %.7g", st->val_loss);
    mal_train_resume_metrics(tr, f);
    mal_progress_metrics(tr, f, st);
    fprintf(f, "}\n");
    if (fflush(f) != 0)
        return MAL_ERR(MAL_EIO, "writing metrics file %s: %s", tr->o.metrics_path, strerror(errno));
    return 0;
}

/* Every rank agreed in this step to stop (a signal: preempt.h): the
 * snapshot of this step (after the one in flight), then MAL_TRAIN_STOPPED
 * on every rank; nothing trained is lost.  Collective. */
static int stop_on_request(mal_trainer *tr, int sig)
{
    /* a signal sent to every rank may have reached this one just after
     * it read its flag for the step: by now it has */
    if (sig < 0 && mal_preempt_signal()) sig = mal_preempt_signal();
    const char *why = sig > 0 ? mal_preempt_signal_name(sig) : "a signal to another rank";
    mal_preempt_boundary();
    double t0 = mal_now();
    int rc = 0;
    if (tr->o.snapshot_dir && tr->ckpt.saved_step != tr->step) rc = mal_trainer_save(tr);
    if (!rc) rc = mal_trainer_snapshot_wait(tr);
    if (rc) return rc;
    if (tr->o.snapshot_dir)
        mal_train_event(tr, MAL_LOG_WARN,
                        "stopped by %s after step %lld of %lld: its snapshot is committed in %s "
                        "(%.1f s); --resume continues",
                        why, (long long)tr->step, (long long)tr->o.steps, tr->o.snapshot_dir,
                        mal_now() - t0);
    else
        mal_train_event(tr, MAL_LOG_WARN,
                        "stopped by %s after step %lld of %lld: no --snapshot-dir, nothing saved",
                        why, (long long)tr->step, (long long)tr->o.steps);
    return MAL_TRAIN_STOPPED;
}

int mal_trainer_run(mal_trainer *tr)
{
    int rc = 0;
    const int lead = tr->world_rank == 0;
    if (lead && tr->o.metrics_path && !tr->metrics) rc = mal_train_metrics_open(tr, &tr->metrics);
    /* Every rank must learn about a failure on rank 0 before the first
     * collective, or the others would wait for it forever; all return its
     * code, so all exit with the same status. */
    if (tr->world) {
        double code = -rc;
        int rc2 = mal_comm_allreduce_max_f64(tr->world, &code, 1);
        if (rc2) return rc2;
        if (code != 0)
            return rc ? rc : MAL_ERR((int)-code, "rank 0 could not open the metrics file");
    } else if (rc) {
        return rc;
    }
    if (tr->o.eval_only) return mal_eval_only(tr);
    mal_change_predict(tr);
    mal_progress_begin(tr);
    double longest = 0; /* the longest step so far */
    unsigned bound = 0; /* the step bound from it (preempt.h); 0: none yet */
    int n_timed = 0;    /* steps of this run; the first (mostly setup) is not timed */
    while (tr->step < tr->o.steps) {
        mal_step_stats st;
        double step_t0 = mal_now();
        /* A step's failure (an evaluation's too), or rank 0's alone in
         * writing the metrics, may leave the peers blocked: the fatal path.
         * (Snapshot failures below are agreed by every rank and returned.)
         * The step bound (preempt.h) covers the step alone: evaluations,
         * samples and snapshots have the stop timeout. */
        mal_preempt_step_bound(bound);
        rc = mal_trainer_step(tr, &st);
        mal_preempt_step_bound(0);
        if (!rc && st.stop_signal) mal_preempt_boundary(); /* agreed: every peer is alive */
        if (rc) return mal_trainer_fatal(tr, rc);
        /* A stop request must reach the end of a step within the bound;
         * one that cannot (a peer died: its step never ends) ends the rank
         * instead of waiting for the launcher's kill.  From the second
         * step of the run on: the first one's time is mostly setup. */
        double dt = mal_now() - step_t0;
        if (n_timed++ > 0) {
            longest = dt > longest ? dt : longest;
            bound = (unsigned)(MAL_PREEMPT_STEP_BOUND_BASE +
                               MAL_PREEMPT_STEP_BOUND_STEPS * longest + 0.5);
        }
        if ((rc = mal_eval_after_step(tr, &st))) return mal_trainer_fatal(tr, rc);
        if (lead && (rc = write_metrics(tr, &st))) return mal_trainer_fatal(tr, rc);
        if (lead) mal_progress_step(tr, &st);
        /* A background snapshot is collected at the step where every
         * rank's writer is done; its failure, agreed, ends the run. */
        int busy;
        if ((rc = mal_trainer_snapshot_poll(tr, &busy))) return rc;
        /* a stop request on the last step changes nothing: the run ends */
        if (st.stop_signal && tr->step < tr->o.steps) return stop_on_request(tr, st.stop_signal);
        if ((rc = mal_sample_after_step(tr, &st))) return rc;
        if (st.replan && tr->step < tr->o.steps) {
            int stop;
            if (tr->o.adapt == MAL_ADAPT_ONLINE && (rc = mal_trainer_snapshot_wait(tr)))
                return rc; /* agreed */
            if ((rc = mal_change_on_advice(tr, &st, &stop))) return mal_trainer_fatal(tr, rc);
            if (stop) {
                /* exit 3 promises a committed snapshot of this step */
                if (tr->o.snapshot_dir && tr->ckpt.saved_step != tr->step &&
                    (rc = mal_trainer_save(tr)))
                    return rc;
                if ((rc = mal_trainer_snapshot_wait(tr))) return rc;
                return MAL_TRAIN_REPLAN;
            }
        }
        if (tr->o.snapshot_dir && tr->o.snapshot_every > 0 && st.step % tr->o.snapshot_every == 0 &&
            st.step != tr->o.steps && tr->ckpt.saved_step != tr->step &&
            (rc = tr->o.snapshot_async ? mal_trainer_save_background(tr) : mal_trainer_save(tr)))
            return rc;
    }
    /* The final snapshot is written now (after the one in flight); the
     * run ends only once every snapshot it started is committed. */
    if (tr->o.snapshot_dir && tr->ckpt.saved_step != tr->step && (rc = mal_trainer_save(tr)))
        return rc;
    if ((rc = mal_trainer_snapshot_wait(tr))) return rc;
    mal_eval_summary(tr);
    return mal_progress_memory_summary(tr);
}
