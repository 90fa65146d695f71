/* malleus-train after its flags are parsed (train_cli.h). */
#include "train_cli.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "ckpt/snapshot.h"
#include "comm/comm.h"
#include "comm/watch.h"
#include "init_from.h"
#include "kernels/kernels.h"
#include "linkprobe.h"
#include "preempt.h"
#include "replan/replan.h"
#include "resume.h"
#include "src/plan.h"

void mal_train_cli_init(mal_train_cli *cli)
{
    memset(cli, 0, sizeof *cli);
    cli->o = mal_train_defaults();
    cli->model = "tiny";
    cli->stop_timeout = MAL_TRAIN_STOP_TIMEOUT_DEFAULT;
    cli->peer_timeout = MAL_COMM_WATCH_TIMEOUT_DEFAULT;
}

/* RANK at `s` (up to ':'), into *r; the end in *end.  0, 1 (not a rank)
 * or 2 (out of range). */
static int parse_rank(const char *s, char **end, int *r)
{
    errno = 0;
    long v = strtol(s, end, 10);
    if (*end == s || **end != ':' || v < 0) return 1;
    /* a rank past int is out of range, never wrapped onto another rank */
    if (errno == ERANGE || v > INT_MAX) return 2;
    *r = (int)v;
    return 0;
}

/* FACTOR[:FROM[:TO]] at `s`.  0, 1 (malformed) or 2 (a step out of range). */
static int parse_factor_steps(const char *s, double *f, long long *from, long long *to)
{
    char *end;
    *f = strtod(s, &end);
    if (!(*f >= 1.0 && *f <= 1000.0) || (*end && *end != ':')) return 1;
    *from = 0;
    *to = -1;
    if (*end == ':') {
        errno = 0;
        *from = strtoll(end + 1, &end, 10);
        if (errno == ERANGE) return 2;
        if (*from < 0 || (*end && *end != ':')) return 1;
        if (*end == ':') {
            *to = strtoll(end + 1, &end, 10);
            if (errno == ERANGE) return 2;
            if (*end || *to <= *from) return 1;
        }
    }
    return 0;
}

int mal_train_cli_inject(const mal_opts_spec *spec, const char *arg)
{
    mal_train_cli *cli = spec->ctx;
    char *end;
    int r, rc;
    double f;
    long long from, to;
    if (cli->o.n_inject == MAL_TRAIN_CLI_MAX_INJECT)
        return mal_opts_bad(spec, "at most %d --inject flags", MAL_TRAIN_CLI_MAX_INJECT);
    if ((rc = parse_rank(arg, &end, &r)) == 2)
        return mal_opts_bad(spec, "--inject %s: rank %.*s is out of range (at most %d)", arg,
                            (int)(end - arg), arg, INT_MAX);
    if (rc || (rc = parse_factor_steps(end + 1, &f, &from, &to)) == 1)
        return mal_opts_bad(spec,
                            "--inject expects RANK:FACTOR[:FROM_STEP[:TO_STEP]] with FACTOR in "
                            "[1, 1000] and FROM < TO, got '%s'",
                            arg);
    if (rc)
        return mal_opts_bad(spec, "--inject '%s': a step is out of range (at most %lld)", arg,
                            (long long)LLONG_MAX);
    cli->injects[cli->o.n_inject++] = (mal_inject){r, f, from, to};
    cli->o.inject = cli->injects;
    return 0;
}

int mal_train_cli_inject_link(const mal_opts_spec *spec, const char *arg)
{
    mal_train_cli *cli = spec->ctx;
    char *end;
    int a, b, rc;
    double f;
    long long from, to;
    if (cli->o.n_inject_links == MAL_TRAIN_CLI_MAX_INJECT)
        return mal_opts_bad(spec, "at most %d --inject-link flags", MAL_TRAIN_CLI_MAX_INJECT);
    if ((rc = parse_rank(arg, &end, &a)) == 0) rc = parse_rank(end + 1, &end, &b);
    if (rc == 2)
        return mal_opts_bad(spec, "--inject-link %s: a rank is out of range (at most %d)", arg,
                            INT_MAX);
    if (rc || (rc = parse_factor_steps(end + 1, &f, &from, &to)) == 1 || (!rc && a == b))
        return mal_opts_bad(spec,
                            "--inject-link expects A:B:FACTOR[:FROM_STEP[:TO_STEP]] with two "
                            "different ranks, FACTOR in [1, 1000] and FROM < TO, got '%s'",
                            arg);
    if (rc)
        return mal_opts_bad(spec, "--inject-link '%s': a step is out of range (at most %lld)", arg,
                            (long long)LLONG_MAX);
    cli->inject_links[cli->o.n_inject_links++] = (mal_inject_link){a, b, f, from, to};
    cli->o.inject_links = cli->inject_links;
    return 0;
}

/* Outputs that are inputs: --metrics (or --profile FILE) the same file as
 * a file the run reads, or an entry of --snapshot-dir that snapshots
 * replace and retention removes.  0, or MAL_EINVAL with the message. */
static int check_outputs(const mal_train_cli *cli)
{
    const mal_train_options *o = &cli->o;
    const mal_input_ref in[] = {
        {"--data", o->data_path},
        {"--val-data", o->val_data_path},
        {"--plan", cli->plan_path},
        {"--model", mal_config_is_preset(cli->model) ? NULL : cli->model},
        {"--baseline-rates", cli->baseline_rates},
        /* a planner profile is a file when its name has a dot (check_inputs) */
        {"--planner-profile", o->profile && strchr(o->profile, '.') ? o->profile : NULL},
    };
    const char *out = cli->measure_path ? cli->measure_path : o->metrics_path;
    const char *what = cli->measure_path ? "--profile" : "--metrics";
    int rc = mal_output_check_inputs(what, out, in, (int)MAL_ARRAY_SIZE(in));
    if (!rc && out && o->snapshot_dir && mal_snapshot_dir_owns(o->snapshot_dir, out))
        rc = MAL_ERR(MAL_EINVAL,
                     "%s %s is an entry of --snapshot-dir %s that snapshots replace or "
                     "retention removes: write it outside the snapshot directory (or under "
                     "another name)",
                     what, out, o->snapshot_dir);
    return rc;
}

/* The kernel instance --profile measures on (*k owned by the caller). */
static int profile_kern(const mal_train_options *o, mal_kern *k)
{
    mal_kern_config kc = mal_kern_config_default();
    kc.threads = o->threads;
    kc.compute = mal_precision_dtype(o->precision);
    return mal_kern_create(o->device, &kc, k);
}

/* --profile FILE on this process's device, no communication.  Through
 * mal_output: a failure leaves an existing regular file untouched, a
 * device (/dev/null) is written into, never replaced.  Returns an exit
 * status; prints why it failed. */
static int measure_here(mal_train_cli *cli, int n_ranks, const mal_link_figures *links)
{
    mal_train_options *o = &cli->o;
    const char *path = cli->measure_path;
    int rc;
    if ((rc = mal_config_load(&o->model, cli->model)) || (rc = check_outputs(cli))) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return 2;
    }
    mal_kern k = NULL;
    if ((rc = profile_kern(o, &k))) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return 2;
    }
    mal_output out;
    FILE *f = NULL;
    if ((rc = mal_output_open(&out, path)) || !(f = mal_output_stream(&out))) {
        if (!rc) mal_output_discard(&out);
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        mal_kern_destroy(k);
        return 1;
    }
    rc = mal_profile_measure(k, &o->model, o->micro_batch, o->tp ? o->tp : 1, links, f);
    mal_kern_destroy(k);
    if (rc)
        mal_output_discard(&out);
    else
        rc = mal_output_commit(&out);
    if (rc) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return mal_exit_status(rc);
    }
    if (n_ranks > 1)
        printf("malleus-train: profile of %s written to %s: the device's figures by rank 0 "
               "alone, the links' (latency %.3g s, bandwidth %.3g B/s within a node) by all %d "
               "ranks\n",
               o->model.name, path, links->latency, links->bandwidth, n_ranks);
    else
        printf("malleus-train: profile of %s written to %s\n", o->model.name, path);
    return 0;
}

/* --profile under a launcher: every rank's part of the link figures
 * (linkprobe.h), before rank 0 measures its device.  Collective; 0, or an
 * exit status agreed by all ranks (rank 0 printed why). */
static int measure_links(mal_train_cli *cli, mal_comm *world, mal_link_figures *links)
{
    mal_train_options *o = &cli->o;
    mal_kern k = NULL;
    int rc = profile_kern(o, &k);
    if (rc) fprintf(stderr, "malleus-train: rank %d: %s\n", world->rank, mal_errmsg());
    /* no rank probes unless every rank has its buffers' device (a bad
     * --device: a usage error, 2); then every rank learns of a failure */
    double bad = rc ? 2 : 0;
    if ((rc = mal_comm_allreduce_max_f64(world, &bad, 1))) bad = 1;
    if (bad == 0 && (rc = mal_linkprobe_figures(world, k, links))) {
        fprintf(stderr, "malleus-train: rank %d: link figures: %s\n", world->rank, mal_errmsg());
        bad = 1;
    }
    if (k) mal_kern_destroy(k);
    if (mal_comm_allreduce_max_f64(world, &bad, 1)) bad = 1;
    return (int)bad;
}

/* --profile FILE: a profile describes one device, so one process measures
 * it.  Under a launcher (mpiexec, srun) every rank runs this: rank 0
 * measures and writes the file, the others wait in a barrier that sleeps
 * between its tests (so that they take no core or device time from the
 * measurement), and all exit with rank 0's status. */
static int measure(mal_train_cli *cli, int *argc, char ***argv)
{
    mal_comm *world = NULL;
    int rc = mal_comm_init(argc, argv, &world);
    if (rc) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return 1;
    }
    mal_link_figures links = {0};
    int status = world->size > 1 ? measure_links(cli, world, &links) : 0;
    if (world->rank == 0 && !status) status = measure_here(cli, world->size, &links);
    mal_link_figures_fini(&links);
    if (world->size > 1) {
        double st = status;
        if ((rc = mal_comm_barrier(world)) || (rc = mal_comm_broadcast(world, &st, sizeof st, 0))) {
            fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
            status = 1;
        } else {
            status = (int)st;
        }
    }
    mal_comm_finalize(world);
    return status;
}

/* The checks of the loaded inputs that need the job (its size); every
 * rank makes them alike.  0, or an exit status (rank 0 printed why). */
static int check_inputs(mal_train_cli *cli, mal_comm *world, mal_plan *plan)
{
    mal_train_options *o = &cli->o;
    const int lead = world->rank == 0;
    int rc;
    if ((!cli->model_from_snapshot && (rc = mal_config_load(&o->model, cli->model))) ||
        (rc = check_outputs(cli))) {
        if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return 2;
    }
    /* Backends by name: one this build lacks, or that has no device here,
     * is a usage error like any other. */
    const mal_kern_backend *kb;
    const mal_comm_backend *cb;
    if ((rc = mal_kern_lookup(o->device ? o->device : mal_kern_default_name(), &kb)) ||
        (rc = mal_comm_lookup(o->comm ? o->comm : mal_comm_default_name(kb->reg.name), &cb)) ||
        (rc = mal_comm_check_device(cb, kb->reg.name))) {
        if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return 2;
    }
    mal_dtype want = mal_precision_dtype(o->precision);
    if (want != MAL_DTYPE_AUTO && !(kb->dtypes & (1u << want))) {
        if (lead)
            fprintf(stderr,
                    "malleus-train: device '%s' does not compute in %s; use --precision %s or a "
                    "device that does\n",
                    kb->reg.name, mal_dtype_name(want), mal_dtype_name(kb->default_compute));
        return 2;
    }
    if (cli->plan_path) {
        if ((rc = mal_plan_read(plan, cli->plan_path))) {
            if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
            return 2;
        }
        if (cli->micro_given && o->micro_batch != plan->micro_batch_size) {
            if (lead)
                fprintf(stderr,
                        "malleus-train: --micro-batch %d disagrees with the plan's "
                        "micro_batch_size %d; drop the flag\n",
                        o->micro_batch, plan->micro_batch_size);
            return 2;
        }
        o->plan = plan;
    }
    struct stat st;
    if (o->snapshot_dir && stat(o->snapshot_dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        if (lead)
            fprintf(stderr,
                    "malleus-train: --snapshot-dir %s exists and is %s, not a directory: name a "
                    "directory (it is created when missing)\n",
                    o->snapshot_dir, mal_file_kind(st.st_mode));
        return 2;
    }
    if (o->adapt == MAL_ADAPT_ONLINE) {
        /* The planner's profile is needed only at the first re-plan: check
         * it now rather than fail then. */
        mal_profile prof;
        const char *pp = o->profile ? o->profile : o->model.name;
        rc = o->profile && strchr(o->profile, '.') ? mal_profile_read(&prof, pp, o->micro_batch)
                                                   : mal_profile_preset(&prof, pp, o->micro_batch);
        mal_profile_fini(&prof);
        if (rc) {
            if (lead)
                fprintf(stderr,
                        "malleus-train: --adapt online needs a planner profile: %s (give "
                        "--planner-profile PRESET|FILE)\n",
                        mal_errmsg());
            return 2;
        }
    }
    if (o->inject_mode == MAL_INJECT_GPU && !kb->has_slowdown) {
        if (lead)
            fprintf(stderr,
                    "malleus-train: --inject-mode gpu slows a GPU for real, and device '%s' has "
                    "none: use --device cuda on a machine with a GPU per rank, or --inject-mode "
                    "sleep\n",
                    kb->reg.name);
        return 2;
    }
    for (int i = 0; i < o->n_inject; i++)
        if (o->inject[i].rank >= world->size) {
            if (lead)
                fprintf(stderr, "malleus-train: --inject names rank %d but the job has %d ranks\n",
                        o->inject[i].rank, world->size);
            return 2;
        }
    for (int i = 0; i < o->n_inject_links; i++)
        if (MAL_MAX(o->inject_links[i].a, o->inject_links[i].b) >= world->size) {
            if (lead)
                fprintf(stderr,
                        "malleus-train: --inject-link names rank %d but the job has %d ranks\n",
                        MAL_MAX(o->inject_links[i].a, o->inject_links[i].b), world->size);
            return 2;
        }
    if (cli->baseline_rates) {
        double *base = malloc(sizeof *base * (size_t)world->size);
        if (!base || (rc = mal_rates_read(cli->baseline_rates, world->size, 2, base))) {
            if (lead) fprintf(stderr, "malleus-train: %s\n", base ? mal_errmsg() : "out of memory");
            free(base);
            return 2;
        }
        o->plan_rates = base;
    }
    return 0;
}

static int flag_given(void *spec, const char *flag)
{
    const mal_opts_spec *sp = spec;
    /* a caller that does not say which flags it was given gave them all */
    return sp->given ? mal_opts_given(sp, flag) : 1;
}

/* --resume: the flags the command line left out take the values of the
 * snapshot's run (resume.h), which the trainer then checks the run
 * against.  0, or an exit status (rank 0 printed why). */
static int resume_defaults(mal_train_cli *cli, const mal_opts_spec *spec, mal_comm *world,
                           mal_resume_source *rs)
{
    mal_train_options *o = &cli->o;
    char taken[512];
    if (!o->resume || !o->snapshot_dir) return 0; /* the trainer says what is missing */
    int rc = mal_resume_source_read(rs, o->snapshot_dir, o->resume_from, world);
    if (!rc) rc = mal_resume_apply_defaults(rs, o, flag_given, (void *)spec, taken, sizeof taken);
    if (rc) {
        if (world->rank == 0) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return mal_exit_status(rc);
    }
    cli->model_from_snapshot = !flag_given((void *)spec, "model");
    o->decay_steps_given = flag_given((void *)spec, "decay-steps");
    if (world->rank == 0 && taken[0] && cli->quiet <= 0)
        mal_log(MAL_LOG_INFO, "resuming the run of %s (step %lld); from its settings: %s", rs->path,
                (long long)rs->step, taken);
    return 0;
}

/* --init-from: without --model the run's model is the source's; with it,
 * the tensors' shapes must be the source's (checked after --model is
 * loaded, init_check).  0, or an exit status (rank 0 printed why). */
static int init_defaults(mal_train_cli *cli, const mal_opts_spec *spec, mal_comm *world)
{
    mal_train_options *o = &cli->o;
    if (!o->init_from || flag_given((void *)spec, "model")) return 0;
    mal_init_source src;
    int rc = mal_init_source_read(o->init_from, 0, &src);
    if (rc) {
        if (world->rank == 0) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        return mal_exit_status(rc);
    }
    o->model = src.model;
    cli->model_from_snapshot = 1;
    return 0;
}

static int init_check(mal_train_cli *cli, mal_comm *world)
{
    mal_train_options *o = &cli->o;
    if (!o->init_from || cli->model_from_snapshot) return 0;
    mal_init_source src;
    char notes[512];
    int rc = mal_init_source_read(o->init_from, o->model.seq_len, &src);
    if (!rc) rc = mal_init_source_check_model(&src, &o->model, notes, sizeof notes);
    if (rc && world->rank == 0) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
    return rc ? mal_exit_status(rc) : 0;
}

void mal_train_cli_backends_help(char *dev, size_t dev_len, char *comm, size_t comm_len)
{
    char names[256];
    mal_kern_names(names, sizeof names, ", ");
    snprintf(dev, dev_len,
             "kernel backend: %s in this build (default:\n"
             "$MALLEUS_DEVICE if set, else a GPU backend where a GPU\n"
             "is present, else cpu; cpu-opaque is the test backend\n"
             "whose buffers the host cannot read)",
             names);
    mal_comm_names(names, sizeof names, ", ");
    snprintf(comm, comm_len,
             "communication backend of the data plane: %s in this\n"
             "build (default: nccl with a GPU backend where built,\n"
             "else mpi; the control plane is always MPI; ranks that\n"
             "share a GPU need mpi; nccl gives up on a peer after\n"
             "$MALLEUS_NCCL_TIMEOUT seconds, default 600, and keeps\n"
             "$MALLEUS_NCCL_MAX_LISTS member-list communicators\n"
             "across plan changes, default 32)",
             names);
}

int mal_train_cli_run(mal_train_cli *cli, const mal_opts_spec *spec, int *argc, char ***argv)
{
    mal_train_options *o = &cli->o;
    if (cli->plan_path && (o->dp || o->tp || o->pp))
        return mal_opts_bad(spec, "give either --plan or --dp/--tp/--pp, not both");
    if (cli->resume_from_given) o->resume = 1;
    if (o->init_from && o->resume)
        return mal_opts_bad(spec, "--init-from starts a new run from a model's weights; --resume "
                                  "continues a run: give one of them");
    if (cli->measure_path) return measure(cli, argc, argv);

    int status = 1, rc;
    mal_comm *world = NULL;
    mal_trainer *tr = NULL;
    mal_plan plan;
    mal_resume_source rs = {.settings = NULL};
    mal_plan_init(&plan);
    /* a background snapshot writer communicates while the step loop does */
    if ((rc = mal_comm_init_threads(
             argc, argv, o->snapshot_async ? MAL_COMM_THREADS_MANY : MAL_COMM_THREADS_ONE,
             &world))) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        goto out;
    }
    const int lead = world->rank == 0;
    /* After MPI_Init, which installs a SIGUSR1 handler of its own (and UCX
     * one for SIGHUP): from here a stop signal is a request to stop at a
     * step boundary with a snapshot. */
    if ((rc = mal_preempt_install((unsigned)cli->stop_timeout))) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        goto out;
    }
    /* From here a wait that cannot end because a peer's node died or
     * stopped ends within --peer-timeout, whatever the launcher does. */
    if (cli->peer_timeout > 0 && (rc = mal_comm_watch_start(world, cli->peer_timeout))) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        goto out;
    }
    /* Only rank 0 speaks for user mistakes, which every rank detects alike. */
    if (!lead) mal_log_level = MAL_LOG_ERROR;
    if ((status = resume_defaults(cli, spec, world, &rs)) ||
        (status = init_defaults(cli, spec, world)) || (status = check_inputs(cli, world, &plan)) ||
        (status = init_check(cli, world)))
        goto out;
    status = 1;
    o->world = world;
    if (cli->quiet > 0) mal_log_level = MAL_LOG_WARN;
    if (cli->quiet < 0 && lead) mal_log_level = MAL_LOG_DEBUG;
    if ((rc = mal_trainer_create(&tr, o))) {
        if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        status = mal_exit_status(rc);
        goto out;
    }
    if (cli->quiet <= 0 && lead) mal_trainer_print_summary(tr, stdout);
    const int64_t start = mal_trainer_steps_done(tr);
    rc = mal_trainer_run(tr);
    if (rc == MAL_TRAIN_REPLAN) {
        if (lead)
            printf("malleus-train: stopped at step %lld for a re-plan (exit status %d)\n",
                   (long long)mal_trainer_steps_done(tr), MAL_TRAIN_EXIT_REPLAN);
        status = MAL_TRAIN_EXIT_REPLAN;
        goto out;
    }
    if (rc == MAL_TRAIN_STOPPED) {
        /* the trainer said why and where; without snapshots the run is lost */
        status = o->snapshot_dir ? MAL_TRAIN_EXIT_STOPPED : 1;
        goto out;
    }
    if (rc) {
        /* Only errors every rank agrees on come back here (the others took
         * the library's fatal path): rank 0 speaks for all. */
        if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        status = mal_trainer_exit_status(tr, rc);
        goto out;
    }
    /* not a silent success: a resumed run that had nothing to do says so */
    if (lead && o->resume && !o->eval_only && start >= o->steps)
        printf("malleus-train: the snapshot resumed is at step %lld = --steps: the run is "
               "complete, nothing to train\n",
               (long long)start);
    status = 0;
out:
    mal_trainer_destroy(tr);
    free((void *)o->plan_rates);
    o->plan_rates = NULL;
    mal_plan_fini(&plan);
    mal_resume_source_fini(&rs);
    /* every rank comes here in agreement (the fatal path aborts instead):
     * MPI_Finalize is watched, then the peers stop watching this one */
    mal_comm_finalize(world);
    return status;
}
