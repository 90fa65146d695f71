/* malleus-train: command-line shell over the training library (train.h).
 * Parses flags, loads the model config, runs, and turns library errors into
 * messages and exit codes: 0 done, 1 failure, 2 usage error, 3 stopped with
 * a snapshot because the monitor advised a re-plan (--adapt restart). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "data.h"
#include "mal.h"
#include "plan.h"
#include "replan.h"
#include "train.h"

enum { EXIT_REPLAN = 3, MAX_INJECT = 64 };

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: malleus-train [OPTIONS]\n"
            "Train a LLaMA-style transformer language model.\n"
            "\n"
            "Model and data:\n"
            "  --model PRESET|FILE    model config: tiny, small, 32b, 70b, 110b, or a JSON file\n"
            "                         with vocab, d_model, n_layers, n_heads, ffn_hidden,\n"
            "                         seq_len [, rope_theta, norm_eps]   (default: tiny)\n"
            "  --data FILE            token file (llm.c format or headerless uint16);\n"
            "                         default: the built-in corpus (byte-level, vocab 256)\n"
            "  --data-format F        auto, llmc or raw16 (default: auto)\n"
            "\n"
            "Parallel layout (run under mpiexec or srun, one rank per device):\n"
            "  --plan FILE            a plan file (malleus-plan/1: pipelines, stages, TP groups,\n"
            "                         micro-batches per pipeline, suspended ranks)\n"
            "  --dp N --tp N --pp N   or the uniform Megatron-style layout (default: 1 1 1)\n"
            "\n"
            "Training:\n"
            "  --steps N              train until N optimizer steps are done (default: 100)\n"
            "  --seed S               seed of initialisation and data order (default: 1234)\n"
            "  --global-batch N       sequences per step (default: 16)\n"
            "  --micro-batch N        sequences per forward/backward (default: 4; a --plan\n"
            "                         sets its own micro_batch_size)\n"
            "  --lr X                 peak learning rate (default: 1e-3)\n"
            "  --min-lr-ratio X       cosine floor as a fraction of --lr (default: 0.1)\n"
            "  --warmup N             linear warmup steps (default: 10)\n"
            "  --decay-steps N        length of the schedule (default: --steps)\n"
            "  --weight-decay X       AdamW decoupled weight decay on matrices (default: 0.1)\n"
            "  --beta1 X, --beta2 X   Adam moments (default: 0.9, 0.95)\n"
            "  --adam-eps X           Adam epsilon (default: 1e-8)\n"
            "  --clip X               global gradient-norm clip, 0 = off (default: 1.0)\n"
            "  --threads N            BLAS threads (default: OpenBLAS's choice)\n"
            "\n"
            "Straggler monitor and adaptation:\n"
            "  --adapt MODE           off, restart or online (default: off).  restart: on a\n"
            "                         re-plan advice write a snapshot and exit with status 3;\n"
            "                         online: plan anew and migrate the state in the job\n"
            "  --check-every K        steps between policy checks (default: 3)\n"
            "  --window W             samples averaged per check (default: 2)\n"
            "  --gap X                re-plan when a rate moved by >= X (default: 0.3)\n"
            "  --threshold X          suspended ranks stay so while rate >= X (default: 1.2)\n"
            "  --noise-floor X        rates below X count as 1.0 (default: 1.2)\n"
            "  --baseline-rates FILE  rates the plan was made with ({\"rank\": rate} or a\n"
            "                         metrics file; default: all 1.0)\n"
            "  --probe-size N         size of the monitor's probe matmul (default: 128)\n"
            "  --ranks-per-node N     node size for the online planner (default: all ranks)\n"
            "  --device-memory-mb X   device memory for the online planner (default: 16384)\n"
            "  --planner-profile P    planner profile: preset or JSON file (default: --model)\n"
            "  --inject R:F[:FROM[:TO]]  TEST FEATURE: stretch rank R's compute by factor F\n"
            "                         from step FROM to step TO (0-based, TO exclusive) with\n"
            "                         sleeps; repeatable\n"
            "\n"
            "Profiling:\n"
            "  --profile FILE         measure a planner profile of --model on this machine\n"
            "                         (layer time per TP size up to --tp, memory) into FILE\n"
            "                         and exit; use it with malleus-replan --profile\n"
            "\n"
            "Snapshots and output:\n"
            "  --snapshot-dir DIR     where snapshots go (a final one is written at the end)\n"
            "  --snapshot-every N     also snapshot every N steps (default: 0 = end only)\n"
            "  --keep N               keep the newest N snapshots (default: 0 = all)\n"
            "  --resume               continue from the newest snapshot in --snapshot-dir\n"
            "  --metrics FILE         one JSON object per step (appended to when resuming)\n"
            "  --log-every N          print a step line every N steps (default: 1)\n"
            "  --quiet                no start-up table or step lines\n"
            "  --verbose              also debug detail (every rank's share of an online\n"
            "                         migration)\n"
            "  -h, --help             this text\n"
            "  --version              print the version\n"
            "\n"
            "Examples:\n"
            "  malleus-train --model tiny --steps 200 --snapshot-dir snap --metrics m.jsonl\n"
            "  mpiexec -n 8 malleus-train --model tiny --dp 2 --tp 2 --pp 2 --steps 50\n"
            "  mpiexec -n 8 malleus-train --model tiny --plan plan.json --metrics m.jsonl\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "malleus-train: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry 'malleus-train --help'.\n");
    return 2;
}

/* Strict integer parse: the whole argument, within [lo, hi]. */
static int parse_long(const char *flag, const char *arg, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        char range[96];
        snprintf(range, sizeof range, "an integer in [%lld, %lld]", lo, hi);
        fprintf(stderr, "malleus-train: %s expects %s, got '%s'\nTry 'malleus-train --help'.\n",
                flag, range, arg);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *arg, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr,
                "malleus-train: %s expects a number in [%g, %g], got '%s'\nTry 'malleus-train "
                "--help'.\n",
                flag, lo, hi, arg);
        return -1;
    }
    *out = (float)v;
    return 0;
}

enum {
    O_MODEL = 256, O_DATA, O_DATA_FORMAT, O_STEPS, O_SEED, O_GB, O_MB, O_LR, O_MINLR, O_WARMUP,
    O_DECAY, O_WD, O_B1, O_B2, O_EPS, O_CLIP, O_THREADS, O_SNAPDIR, O_SNAPEVERY, O_KEEP,
    O_RESUME, O_METRICS, O_LOGEVERY, O_QUIET, O_VERBOSE, O_VERSION, O_PLAN, O_DP, O_TP, O_PP,
    O_ADAPT, O_CHECK, O_WINDOW, O_GAP, O_THRESH, O_FLOOR, O_BASE, O_PROBE, O_RPN, O_MEM,
    O_PROFILE, O_INJECT, O_MEASURE
};

static const struct option longopts[] = {
    {"model", required_argument, 0, O_MODEL},
    {"data", required_argument, 0, O_DATA},
    {"data-format", required_argument, 0, O_DATA_FORMAT},
    {"steps", required_argument, 0, O_STEPS},
    {"seed", required_argument, 0, O_SEED},
    {"global-batch", required_argument, 0, O_GB},
    {"micro-batch", required_argument, 0, O_MB},
    {"lr", required_argument, 0, O_LR},
    {"min-lr-ratio", required_argument, 0, O_MINLR},
    {"warmup", required_argument, 0, O_WARMUP},
    {"decay-steps", required_argument, 0, O_DECAY},
    {"weight-decay", required_argument, 0, O_WD},
    {"beta1", required_argument, 0, O_B1},
    {"beta2", required_argument, 0, O_B2},
    {"adam-eps", required_argument, 0, O_EPS},
    {"clip", required_argument, 0, O_CLIP},
    {"threads", required_argument, 0, O_THREADS},
    {"snapshot-dir", required_argument, 0, O_SNAPDIR},
    {"snapshot-every", required_argument, 0, O_SNAPEVERY},
    {"keep", required_argument, 0, O_KEEP},
    {"resume", no_argument, 0, O_RESUME},
    {"metrics", required_argument, 0, O_METRICS},
    {"log-every", required_argument, 0, O_LOGEVERY},
    {"quiet", no_argument, 0, O_QUIET},
    {"verbose", no_argument, 0, O_VERBOSE},
    {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, O_VERSION},
    {"plan", required_argument, 0, O_PLAN},
    {"dp", required_argument, 0, O_DP},
    {"tp", required_argument, 0, O_TP},
    {"pp", required_argument, 0, O_PP},
    {"adapt", required_argument, 0, O_ADAPT},
    {"check-every", required_argument, 0, O_CHECK},
    {"window", required_argument, 0, O_WINDOW},
    {"gap", required_argument, 0, O_GAP},
    {"threshold", required_argument, 0, O_THRESH},
    {"noise-floor", required_argument, 0, O_FLOOR},
    {"baseline-rates", required_argument, 0, O_BASE},
    {"probe-size", required_argument, 0, O_PROBE},
    {"ranks-per-node", required_argument, 0, O_RPN},
    {"device-memory-mb", required_argument, 0, O_MEM},
    {"planner-profile", required_argument, 0, O_PROFILE},
    {"profile", required_argument, 0, O_MEASURE},
    {"inject", required_argument, 0, O_INJECT},
    {0, 0, 0, 0},
};

/* Parse argv into opts; returns -1 to continue, else an exit code. */
/* RANK:FACTOR[:FROM[:TO]] */
static int parse_inject(const char *arg, mal_inject *in)
{
    char *end;
    errno = 0;
    long r = strtol(arg, &end, 10);
    if (errno || end == arg || *end != ':' || r < 0) goto bad;
    double f = strtod(end + 1, &end);
    if (!(f >= 1.0 && f <= 1000.0) || (*end && *end != ':')) goto bad;
    long long from = 0, to = -1;
    if (*end == ':') {
        from = strtoll(end + 1, &end, 10);
        if (from < 0 || (*end && *end != ':')) goto bad;
        if (*end == ':') {
            to = strtoll(end + 1, &end, 10);
            if (*end || to <= from) goto bad;
        }
    }
    *in = (mal_inject){(int)r, f, from, to};
    return 0;
bad:
    fprintf(stderr,
            "malleus-train: --inject expects RANK:FACTOR[:FROM_STEP[:TO_STEP]] with FACTOR in "
            "[1, 1000] and FROM < TO, got '%s'\nTry 'malleus-train --help'.\n",
            arg);
    return -1;
}

static mal_inject injects[MAX_INJECT];
static const char *baseline_rates_path, *measure_path;

static int parse_args(int argc, char **argv, mal_train_options *o, const char **model, int *quiet,
                      const char **plan, int *micro_given)
{
    long long v;
    float x;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: *model = optarg; break;
        case O_DATA: o->data_path = optarg; break;
        case O_DATA_FORMAT:
            if (!strcmp(optarg, "auto")) o->data_format = MAL_DATA_AUTO;
            else if (!strcmp(optarg, "llmc")) o->data_format = MAL_DATA_LLMC;
            else if (!strcmp(optarg, "raw16")) o->data_format = MAL_DATA_RAW16;
            else return bad("--data-format must be auto, llmc or raw16, got '%s'%s", optarg, "");
            break;
#define INT(flag, field, lo, hi)                                                \
    if (parse_long(flag, optarg, lo, hi, &v)) return 2;                          \
    field = v;                                                                  \
    break
        case O_STEPS: INT("--steps", o->steps, 0, LLONG_MAX / 65536);
        case O_SEED: INT("--seed", o->seed, 0, LLONG_MAX);
        case O_GB: INT("--global-batch", o->global_batch, 1, 1 << 20);
        case O_MB: *micro_given = 1; INT("--micro-batch", o->micro_batch, 1, 1 << 20);
        case O_DP: INT("--dp", o->dp, 1, 1 << 20);
        case O_TP: INT("--tp", o->tp, 1, 1 << 20);
        case O_PP: INT("--pp", o->pp, 1, 1 << 20);
        case O_WARMUP: INT("--warmup", o->optim.warmup_steps, 0, INT_MAX);
        case O_DECAY: INT("--decay-steps", o->optim.total_steps, 1, INT_MAX);
        case O_THREADS: INT("--threads", o->threads, 1, 1024);
        case O_SNAPEVERY: INT("--snapshot-every", o->snapshot_every, 0, INT_MAX);
        case O_KEEP: INT("--keep", o->keep_snapshots, 0, INT_MAX);
        case O_LOGEVERY: INT("--log-every", o->log_every, 0, INT_MAX);
#undef INT
        case O_LR: if (parse_float("--lr", optarg, 1e-12, 10, &o->optim.lr)) return 2; break;
        case O_MINLR:
            if (parse_float("--min-lr-ratio", optarg, 0, 1, &o->optim.min_lr_ratio)) return 2;
            break;
        case O_WD:
            if (parse_float("--weight-decay", optarg, 0, 10, &o->optim.weight_decay)) return 2;
            break;
        case O_B1: if (parse_float("--beta1", optarg, 0, 0.999999, &o->optim.beta1)) return 2; break;
        case O_B2: if (parse_float("--beta2", optarg, 0, 0.999999, &o->optim.beta2)) return 2; break;
        case O_EPS: if (parse_float("--adam-eps", optarg, 1e-30, 1, &o->optim.eps)) return 2; break;
        case O_CLIP: if (parse_float("--clip", optarg, 0, 1e30, &o->optim.grad_clip)) return 2; break;
        case O_SNAPDIR: o->snapshot_dir = optarg; break;
        case O_PLAN: *plan = optarg; break;
        case O_ADAPT:
            if (!strcmp(optarg, "off")) o->adapt = MAL_ADAPT_OFF;
            else if (!strcmp(optarg, "restart")) o->adapt = MAL_ADAPT_RESTART;
            else if (!strcmp(optarg, "online")) o->adapt = MAL_ADAPT_ONLINE;
            else return bad("--adapt must be off, restart or online, got '%s'%s", optarg, "");
            break;
        case O_CHECK: if (parse_long("--check-every", optarg, 1, 1000000, &v)) return 2; o->check_every = (int)v; break;
        case O_WINDOW: if (parse_long("--window", optarg, 1, 1000, &v)) return 2; o->window = (int)v; break;
        case O_PROBE: if (parse_long("--probe-size", optarg, 8, 4096, &v)) return 2; o->probe_n = (int)v; break;
        case O_RPN: if (parse_long("--ranks-per-node", optarg, 1, 1 << 20, &v)) return 2; o->ranks_per_node = (int)v; break;
        case O_GAP: if (parse_float("--gap", optarg, 1e-6, 1000, &x)) return 2; o->gap = x; break;
        case O_THRESH: if (parse_float("--threshold", optarg, 1, 1000, &x)) return 2; o->threshold = x; break;
        case O_FLOOR: if (parse_float("--noise-floor", optarg, 1, 1000, &x)) return 2; o->noise_floor = x; break;
        case O_MEM: if (parse_float("--device-memory-mb", optarg, 1, 1e9, &x)) return 2; o->device_memory_mb = x; break;
        case O_PROFILE: o->profile = optarg; break;
        case O_BASE: baseline_rates_path = optarg; break;
        case O_MEASURE: measure_path = optarg; break;
        case O_INJECT:
            if (o->n_inject == MAX_INJECT) return bad("at most %s --inject flags%s", "64", "");
            if (parse_inject(optarg, &injects[o->n_inject])) return 2;
            o->n_inject++;
            o->inject = injects;
            break;
        case O_RESUME: o->resume = 1; break;
        case O_METRICS: o->metrics_path = optarg; break;
        case O_QUIET: *quiet = 1; break;
        case O_VERBOSE: *quiet = -1; break;
        case 'h': usage(stdout); return 0;
        case O_VERSION: printf("malleus-train %s\n", PACKAGE_VERSION); return 0;
        case ':': return bad("option '%s' needs a value%s", argv[optind - 1], "");
        default: return bad("unknown option '%s'%s", argv[optind - 1], "");
        }
    }
    if (optind < argc) return bad("unexpected argument '%s'%s", argv[optind], "");
    if (*plan && (o->dp || o->tp || o->pp))
        return bad("give either --plan or --dp/--tp/--pp, not both%s%s", "", "");
    return -1;
}

int main(int argc, char **argv)
{
    mal_train_options o = mal_train_defaults();
    const char *model = "tiny", *plan_path = NULL;
    int quiet = 0, status = 1, micro_given = 0;
    int rc = parse_args(argc, argv, &o, &model, &quiet, &plan_path, &micro_given);
    if (rc >= 0) return rc;
    if (measure_path) {
        if ((rc = mal_config_load(&o.model, model))) {
            fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
            return 2;
        }
        if (o.threads > 0) mal_kernels_cpu_set_threads(o.threads);
        /* Written beside the target and renamed: a failure leaves an
         * existing file untouched. */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", measure_path, (long)getpid());
        FILE *f = fopen(tmp, "w");
        if (!f) {
            fprintf(stderr, "malleus-train: cannot write %s: %s\n", measure_path, strerror(errno));
            return 1;
        }
        rc = mal_profile_measure(&o.model, o.micro_batch, o.tp ? o.tp : 1, f);
        if (fclose(f) != 0 && !rc) rc = MAL_ERR(MAL_EIO, "writing %s failed", measure_path);
        if (!rc && rename(tmp, measure_path) != 0)
            rc = MAL_ERR(MAL_EIO, "cannot write %s: %s", measure_path, strerror(errno));
        if (rc) {
            fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
            remove(tmp);
            return 1;
        }
        printf("malleus-train: profile of %s written to %s\n", o.model.name, measure_path);
        return 0;
    }

    MPI_Init(&argc, &argv);
    mal_comm *world = NULL;
    mal_trainer *tr = NULL;
    mal_plan plan;
    mal_plan_init(&plan);
    if ((rc = mal_comm_mpi_world(&world))) {
        fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        goto out;
    }
    const int lead = world->rank == 0;
    /* Only rank 0 speaks for user mistakes, which every rank detects alike. */
    if (!lead) mal_log_level = MAL_LOG_ERROR;
    if ((rc = mal_config_load(&o.model, model))) {
        if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        status = 2;
        goto out;
    }
    if (plan_path) {
        if ((rc = mal_plan_read(&plan, plan_path))) {
            if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
            status = 2;
            goto out;
        }
        if (micro_given && o.micro_batch != plan.micro_batch_size) {
            if (lead)
                fprintf(stderr,
                        "malleus-train: --micro-batch %d disagrees with the plan's "
                        "micro_batch_size %d; drop the flag\n",
                        o.micro_batch, plan.micro_batch_size);
            status = 2;
            goto out;
        }
        o.plan = &plan;
    }
    o.world = world;
    if (o.adapt == MAL_ADAPT_ONLINE) {
        /* The planner's profile is needed only at the first re-plan: check
         * it now rather than fail then. */
        mal_profile prof;
        const char *pp = o.profile ? o.profile : o.model.name;
        rc = o.profile && strchr(o.profile, '.') ? mal_profile_read(&prof, pp, o.micro_batch)
                                                 : mal_profile_preset(&prof, pp, o.micro_batch);
        mal_profile_fini(&prof);
        if (rc) {
            if (lead)
                fprintf(stderr,
                        "malleus-train: --adapt online needs a planner profile: %s (give "
                        "--planner-profile PRESET|FILE)\n",
                        mal_errmsg());
            status = 2;
            goto out;
        }
    }
    for (int i = 0; i < o.n_inject; i++)
        if (o.inject[i].rank >= world->size) {
            if (lead)
                fprintf(stderr, "malleus-train: --inject names rank %d but the job has %d ranks\n",
                        o.inject[i].rank, world->size);
            status = 2;
            goto out;
        }
    double *base = NULL;
    if (baseline_rates_path) {
        base = malloc(sizeof *base * (size_t)world->size);
        if (!base || (rc = mal_rates_read(baseline_rates_path, world->size, 2, base))) {
            if (lead) fprintf(stderr, "malleus-train: %s\n", base ? mal_errmsg() : "out of memory");
            free(base);
            status = 2;
            goto out;
        }
        o.plan_rates = base;
    }
    if (quiet > 0) mal_log_level = MAL_LOG_WARN;
    if (quiet < 0 && lead) mal_log_level = MAL_LOG_DEBUG;
    if ((rc = mal_trainer_create(&tr, &o))) {
        if (lead) fprintf(stderr, "malleus-train: %s\n", mal_errmsg());
        status = rc == MAL_EINVAL || rc == MAL_ENOTSUP ? 2 : 1;
        goto out;
    }
    if (quiet <= 0 && lead) mal_trainer_print_summary(tr, stdout);
    rc = mal_trainer_run(tr);
    if (rc == MAL_TRAIN_REPLAN) {
        if (lead)
            printf("malleus-train: stopped at step %lld for a re-plan (exit status %d)\n",
                   (long long)mal_trainer_steps_done(tr), EXIT_REPLAN);
        status = EXIT_REPLAN;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "malleus-train: rank %d: %s\n", world->rank, mal_errmsg());
        /* Peers may be blocked waiting for this rank: take the job down. */
        if (world->size > 1) mal_comm_abort(world, 1);
        goto out;
    }
    status = 0;
out:
    mal_trainer_destroy(tr);
    free((void *)o.plan_rates);
    mal_plan_fini(&plan);
    mal_comm_destroy(world);
    MPI_Finalize();
    return status;
}
