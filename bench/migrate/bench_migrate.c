/* Online migration benchmark (not part of `make check`; bench/migrate/run.sh):
 * on N ranks, train one step of MODEL on plan A, then move the running job
 * A -> B -> A ... REPS times and report every change's time (slowest rank)
 * with the per-rank breakdown, beside the in-process parts of the restart
 * path for the same change: writing a snapshot, resharding it onto B and
 * loading it into a trainer built on B.  (The restart path also pays a job
 * restart - process start-up, MPI initialisation, data - which bench/adapt/run.py
 * measures with whole processes.)
 *   mpiexec -n N bench_migrate --model small --plan-a A.json --plan-b B.json
 *       [--global-batch 16] [--micro-batch 2] [--steps 1] [--inject RANK:FACTOR]
 *       [--reps 3] [--dir DIR] [--online-only] [--warm-mb N] [--device NAME] [--comm NAME]
 * --warm-mb N: before every timed operation each rank touches and frees N
 * MiB, so that neither path pays for memory the host has not backed yet
 * (bench/README.md).  --device / --comm: the kernel and communication
 * backends by name (as malleus-train's). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/mal.h"
#include "ckpt/reshard.h"
#include "comm/comm.h"
#include "src/plan.h"
#include "train/train.h"

static mal_comm *world;

/* A whole number >= lo from option `opt`, or the run stops with status 2. */
static long number(const char *opt, const char *arg, long lo)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || v < lo) {
        if (!world->rank)
            fprintf(stderr, "bench_migrate: %s expects a whole number >= %ld, not '%s'\n", opt, lo,
                    arg);
        mal_comm_abort(world, 2);
    }
    return v;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_migrate: %s: %s\n", what, mal_errmsg());
    if (world) mal_comm_abort(world, 1);
    exit(1);
}

/* Memory the host backs lazily (VMs with free page reporting): touch
 * `mb` MiB and give it back, so that the next allocations find pages that
 * are backed already and every timed operation starts alike; then line the
 * ranks up.  Collective. */
static size_t warm_mb;
static void ready(void)
{
    if (warm_mb) {
        size_t n = warm_mb << 20;
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
            madvise(p, n, MADV_HUGEPAGE);
#endif
            for (size_t i = 0; i < n; i += 4096)
                p[i] = 1;
            munmap(p, n);
        }
    }
    if (mal_comm_barrier(world)) die("barrier");
}

/* Slowest rank's value of x (collective). */
static double max_all(double x)
{
    if (mal_comm_allreduce_max_f64(world, &x, 1)) die("all-reduce");
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, const mal_migration_times *t)
{
    int n = world->size;
    double mine[8] = {t->total,
                      t->build,
                      t->move,
                      t->wait,
                      t->wire,
                      t->bytes_sent / 1048576.0,
                      t->bytes_received / 1048576.0,
                      t->bytes_kept / 1048576.0};
    double *all = world->rank == 0 ? malloc(sizeof *all * 8 * (size_t)n) : NULL;
    if (mal_comm_gather(world, mine, all, sizeof mine, 0)) die("gather");
    if (world->rank) return;
    double worst = 0;
    for (int r = 0; r < n; r++)
        worst = MAL_MAX(worst, all[8 * r]);
    printf("%s: %.3f s (slowest rank)\n", what, worst);
    printf("  rank   total   build    move    wait    wire   sent MiB  recv MiB  kept MiB\n");
    for (int r = 0; r < n; r++) {
        double *a = all + 8 * r;
        printf("  %4d %7.3f %7.3f %7.3f %7.3f %7.3f %10.1f %9.1f %9.1f\n", r, a[0], a[1], a[2],
               a[3], a[4], a[5], a[6], a[7]);
    }
    free(all);
}

int main(int argc, char **argv)
{
    if (mal_comm_init(&argc, &argv, &world)) die("MPI");
    mal_log_level = MAL_LOG_WARN;
    const char *model = "small", *pa = NULL, *pb = NULL, *dir = "/tmp/malleus-bench-migrate";
    const char *device = NULL, *comm = NULL;
    int reps = 3, gb = 16, mb = 2, steps = 1, online_only = 0, c;
    mal_inject inj = {-1, 1.0, 0, -1};
    static const struct option lo[] = {
        {"model", 1, 0, 'm'},       {"plan-a", 1, 0, 'a'},       {"plan-b", 1, 0, 'b'},
        {"reps", 1, 0, 'r'},        {"global-batch", 1, 0, 'g'}, {"micro-batch", 1, 0, 'u'},
        {"dir", 1, 0, 'd'},         {"steps", 1, 0, 's'},        {"inject", 1, 0, 'i'},
        {"online-only", 0, 0, 'o'}, {"warm-mb", 1, 0, 'w'},      {"device", 1, 0, 'v'},
        {"comm", 1, 0, 'c'},        {0, 0, 0, 0}};
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1)
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'a':
            pa = optarg;
            break;
        case 'b':
            pb = optarg;
            break;
        case 'r':
            reps = (int)number("--reps", optarg, 1);
            break;
        case 'g':
            gb = (int)number("--global-batch", optarg, 1);
            break;
        case 'u':
            mb = (int)number("--micro-batch", optarg, 1);
            break;
        case 'd':
            dir = optarg;
            break;
        case 's':
            steps = (int)number("--steps", optarg, 0);
            break;
        case 'o':
            online_only = 1;
            break;
        case 'v':
            device = optarg;
            break;
        case 'c':
            comm = optarg;
            break;
        case 'w':
            warm_mb = (size_t)number("--warm-mb", optarg, 0);
            break;
        case 'i':
            if (sscanf(optarg, "%d:%lf", &inj.rank, &inj.factor) != 2 || inj.rank < 0 ||
                !(inj.factor >= 1.0)) {
                if (!world->rank)
                    fprintf(stderr,
                            "bench_migrate: --inject expects RANK:FACTOR (factor >= 1), "
                            "not '%s'\n",
                            optarg);
                mal_comm_abort(world, 2);
            }
            break;
        default:
            mal_comm_abort(world, 2);
        }
    if (!pa || !pb) {
        if (!world->rank) fprintf(stderr, "bench_migrate: --plan-a and --plan-b are needed\n");
        mal_comm_abort(world, 2);
    }
    mal_plan plan[2];
    mal_plan_init(&plan[0]);
    mal_plan_init(&plan[1]);
    if (mal_plan_read(&plan[0], pa) || mal_plan_read(&plan[1], pb)) die("plan");

    char snap_a[4096], snap_b[4096];
    snprintf(snap_a, sizeof snap_a, "%s/a", dir);
    snprintf(snap_b, sizeof snap_b, "%s/b", dir);
    mal_train_options o = mal_train_defaults();
    if (mal_config_load(&o.model, model)) die("model");
    o.steps = steps;
    if (inj.rank >= 0) {
        o.inject = &inj;
        o.n_inject = 1;
    }
    o.global_batch = gb;
    o.micro_batch = mb;
    o.log_every = 0;
    o.threads = 1;
    o.device = device;
    o.comm = comm;
    o.ranks_per_node = 4;
    o.plan = &plan[0];
    o.world = world;
    o.snapshot_dir = snap_a;
    mal_trainer *tr;
    if (mal_trainer_create(&tr, &o)) die("trainer");
    for (int i = 0; i < steps; i++)
        if (mal_trainer_step(tr, NULL)) die("step");

    /* The restart path's in-process parts, for the change A -> B. */
    double t_save = 0, t_reshard = 0, t_load = 0;
    if (online_only) goto online;
    ready();
    double t = mal_now();
    if (mal_trainer_save(tr)) die("save");
    t_save = max_all(mal_now() - t);
    mal_reshard_options ro;
    memset(&ro, 0, sizeof ro);
    ro.src = snap_a;
    ro.dst_dir = snap_b;
    ro.plan = &plan[1];
    mal_reshard_stats rs;
    ready();
    t = mal_now();
    if (mal_reshard(world, &ro, &rs)) die("reshard");
    t_reshard = max_all(mal_now() - t);
    mal_train_options ob = o;
    ob.plan = &plan[1];
    ob.snapshot_dir = snap_b;
    ob.resume = 1;
    mal_trainer *tb;
    ready();
    t = mal_now();
    if (mal_trainer_create(&tb, &ob)) die("resume");
    t_load = max_all(mal_now() - t);
    mal_trainer_destroy(tb);

online:;
    double *ab = calloc((size_t)reps, sizeof *ab);
    for (int i = 0; i < 2 * reps; i++) {
        ready();
        if (mal_trainer_change_plan(tr, &plan[(i + 1) % 2])) die("change");
        mal_migration_times mt;
        mal_trainer_migration_times(tr, &mt);
        char what[64];
        snprintf(what, sizeof what, "online change %d (%s)", i + 1, i % 2 ? "B -> A" : "A -> B");
        report(what, &mt);
        double worst = max_all(mt.total);
        if (i % 2 == 0) ab[i / 2] = worst;
    }
    if (world->rank == 0) {
        double first = ab[0];
        qsort(ab, (size_t)reps, sizeof *ab, cmp_double);
        double med = reps % 2 ? ab[reps / 2] : 0.5 * (ab[reps / 2 - 1] + ab[reps / 2]);
        printf("online A -> B: first %.3f s, median of %d %.3f s\n", first, reps, med);
        if (!online_only) {
            double restart = t_save + t_reshard + t_load;
            printf("restart path in process (A -> B): snapshot %.3f s + reshard %.3f s + load "
                   "%.3f s = %.3f s\n",
                   t_save, t_reshard, t_load, restart);
            printf("online / restart path: first %.3fx, median %.3fx\n", first / restart,
                   med / restart);
        }
    }
    free(ab);
    mal_trainer_destroy(tr);
    if (world->rank == 0) {
        char cmd[8300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", snap_a, snap_b);
        if (system(cmd)) fprintf(stderr, "bench_migrate: could not remove %s\n", dir);
    }
    mal_plan_fini(&plan[0]);
    mal_plan_fini(&plan[1]);
    mal_comm_finalize(world);
    return 0;
}
