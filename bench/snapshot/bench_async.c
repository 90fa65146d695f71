/* Asynchronous snapshot benchmark: the stall the training loop sees when a
 * snapshot is written in the background (malleus-train --snapshot-async)
 * against the synchronous write of the same state, measured in the same
 * run, and what the background write costs the steps it overlaps.
 *
 *   bench_async [--dir DIR] [--model CFG] [--tp N] [--reps N] [--steps N]
 *               [--global-batch N] [--micro-batch N] [--threads N] [--device NAME]
 *   mpiexec -n N bench_async ...        (uniform plan: DP N/TP x TP)
 *
 * One trainer trains on; each repetition, on the same trainer:
 *  1. `--steps` steps with no snapshot: the baseline step time;
 *  2. a synchronous snapshot (mal_trainer_save): its wall time over all
 *     ranks is the synchronous write;
 *  3. an asynchronous one (mal_trainer_save_background): the time the call
 *     holds the loop (waiting for nothing, staging device -> pinned host,
 *     starting the writer; the slowest rank's) is the stall; then steps are
 *     trained, each followed by the poll the loop makes, until the write is
 *     collected: their time against the baseline is the slowdown, and the
 *     polls' own time is counted into the stall.
 * 2 and 3 swap places every other repetition, so that a drift of the
 * shared disk or machine does not favour either.  Step times are wall
 * times of the whole step on rank 0 (every step ends in an all-reduce, so
 * all ranks see about the same).  Rank 0 prints a table. */
#include <ftw.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/mal.h"
#include "comm/comm.h"
#include "train/train.h"

#define BENCH_NAME "bench_async"
#include "bench_util.h"

/* The slowest rank's value. */
static double max_all(double x)
{
    DIE_IF(mal_comm_allreduce_max_f64(world, &x, 1));
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One step as the loop takes it: the step, then the poll. */
static double step(mal_trainer *tr, int *busy, double *poll_s)
{
    double t0 = mal_now();
    DIE_IF(mal_trainer_step(tr, NULL));
    double t1 = mal_now();
    DIE_IF(mal_trainer_snapshot_poll(tr, busy));
    if (poll_s) *poll_s += mal_now() - t1;
    return mal_now() - t0;
}

int main(int argc, char **argv)
{
    /* the background writer communicates while the loop does */
    if (mal_comm_init_threads(&argc, &argv, MAL_COMM_THREADS_MANY, &world)) {
        fprintf(stderr, "bench_async: %s\n", mal_errmsg());
        mal_comm_finalize(world);
        return 1;
    }
    const char *dir = "/tmp/malleus-bench-async", *model = NULL, *device = NULL;
    int tp = 1, reps = 3, nsteps = 3, gb = 0, mb = 1, threads = 0, c;
    static const struct option lo[] = {
        {"dir", 1, 0, 'd'},          {"model", 1, 0, 'm'},       {"tp", 1, 0, 't'},
        {"reps", 1, 0, 'r'},         {"steps", 1, 0, 's'},       {"global-batch", 1, 0, 'g'},
        {"micro-batch", 1, 0, 'b'},  {"threads", 1, 0, 'j'},     {"device", 1, 0, 'v'},
        {0, 0, 0, 0}};
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'd': dir = optarg; break;
        case 'm': model = optarg; break;
        case 't': tp = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 's': nsteps = atoi(optarg); break;
        case 'g': gb = atoi(optarg); break;
        case 'b': mb = atoi(optarg); break;
        case 'j': threads = atoi(optarg); break;
        case 'v': device = optarg; break;
        default:
            if (world->rank == 0)
                fprintf(stderr, "usage: bench_async [--dir DIR] [--model CFG] [--tp N] [--reps N] "
                                "[--steps N] [--global-batch N] [--micro-batch N] [--threads N] "
                                "[--device NAME]\n");
            mal_comm_abort(world, 2);
        }
    }
    if (tp < 1 || world->size % tp || reps < 1 || nsteps < 1 || mb < 1) {
        if (world->rank == 0) fprintf(stderr, "bench_async: bad --tp, --reps, --steps or --micro-batch\n");
        mal_comm_abort(world, 2);
    }
    if (mal_comm_thread_level() != MAL_COMM_THREADS_MANY && world->size > 1) {
        if (world->rank == 0)
            fprintf(stderr, "bench_async: MPI provides %s; the background writer needs "
                            "MPI_THREAD_MULTIPLE\n",
                    mal_comm_thread_level_name());
        mal_comm_abort(world, 1);
    }
    mal_log_level = MAL_LOG_WARN;
    char snapdir[4096];
    snprintf(snapdir, sizeof snapdir, "%s/snap", dir);
    if (world->rank == 0) mkdir(dir, 0755);
    rmtree(snapdir);

    mal_train_options o = mal_train_defaults();
    load_model(&o.model, model);
    int dp = world->size / tp;
    o.dp = dp;
    o.tp = tp;
    o.pp = 1;
    o.micro_batch = mb;
    o.global_batch = gb > 0 ? gb : dp * mb;
    o.steps = 1000000;
    o.world = world;
    o.snapshot_dir = snapdir;
    o.snapshot_async = 1;
    o.keep_snapshots = 1; /* the disk holds one snapshot at a time */
    o.log_every = 0;
    o.threads = threads;
    o.device = device;
    /* the 32000-token shapes train on generated tokens (like --data synthetic:V) */
    static char synth[32];
    snprintf(synth, sizeof synth, "synthetic:%d", o.model.vocab);
    if (o.model.vocab > 256) o.data_path = synth;
    mal_trainer *tr;
    DIE_IF(mal_trainer_create(&tr, &o));

    int busy = 0, n_base = 0, n_during = 0, total = 1 << 16;
    double *base = calloc((size_t)reps * (size_t)(nsteps + 1) + 2, sizeof *base);
    double *during = calloc((size_t)total, sizeof *during);
    double *ratio = calloc((size_t)reps, sizeof *ratio);
    if (!base || !during || !ratio) DIE_IF(MAL_ERR(MAL_ENOMEM, "no memory"));
    for (int i = 0; i < 2; i++) /* warm-up: pages, thread pools, caches */
        step(tr, &busy, NULL);
    if (world->rank == 0) {
        printf("model %s: %lld parameters; %d rank(s), DP %d x TP %d; global batch %d, micro-batch "
               "%d; dir %s\n",
               o.model.name, (long long)mal_config_n_params(&o.model), world->size, dp, tp,
               o.global_batch, mb, dir);
        printf("%3s %9s %9s %9s %7s %9s %8s %9s %9s\n", "rep", "sync s", "stall s", "stage s",
               "ratio", "bg write", "steps", "step ms", "base ms");
    }
    double bytes = 0, sum_sync = 0, sum_stall = 0, sum_write = 0;
    for (int r = 0; r < reps; r++) {
        double t_sync = 0, t_stall = 0, t_stage = 0, t_write = 0, poll_s = 0;
        int n_here = 0, first_base = n_base, first_during = n_during;
        for (int i = 0; i < nsteps; i++)
            base[n_base++] = step(tr, &busy, NULL);
        for (int half = 0; half < 2; half++) {
            int do_sync = (half == 0) == (r % 2 == 0);
            DIE_IF(mal_comm_barrier(world));
            double t0 = mal_now();
            if (do_sync) {
                DIE_IF(mal_trainer_save(tr));
                DIE_IF(mal_comm_barrier(world));
                t_sync = max_all(mal_now() - t0);
                mal_snapshot_stats ss;
                mal_trainer_snapshot_stats(tr, &ss);
                bytes = ss.bytes;
                /* a step, so that the next snapshot is of another step */
                base[n_base++] = step(tr, &busy, NULL);
                continue;
            }
            DIE_IF(mal_trainer_save_background(tr));
            double held = mal_now() - t0;
            poll_s = 0;
            do {
                during[n_during++] = step(tr, &busy, &poll_s);
                n_here++;
            } while (busy && n_during < total);
            if (busy) DIE_IF(mal_trainer_snapshot_wait(tr));
            mal_snapshot_stats ss;
            mal_trainer_snapshot_stats(tr, &ss);
            t_stall = max_all(held + poll_s);
            t_stage = max_all(ss.stage_s);
            t_write = max_all(ss.write_s);
        }
        DIE_IF(mal_comm_allreduce_f64(world, &bytes, 1));
        ratio[r] = t_stall / t_sync;
        sum_sync += t_sync;
        sum_stall += t_stall;
        sum_write += t_write;
        double mean_during = 0;
        for (int i = first_during; i < n_during; i++)
            mean_during += during[i] / (n_during - first_during);
        double bcopy[64];
        int nb = MAL_MIN(n_base - first_base, 64);
        memcpy(bcopy, base + first_base, sizeof *bcopy * (size_t)nb);
        if (world->rank == 0)
            printf("%3d %9.3f %9.3f %9.3f %7.3f %9.3f %8d %9.1f %9.1f\n", r, t_sync, t_stall,
                   t_stage, ratio[r], t_write, n_here, 1e3 * mean_during,
                   1e3 * median(bcopy, nb));
    }
    if (world->rank == 0) {
        double mean_during = 0;
        for (int i = 0; i < n_during; i++)
            mean_during += during[i] / n_during;
        double med_base = median(base, n_base);
        double med_ratio = median(ratio, reps);
        printf("state written (params + Adam m + v, fp32): %.3f GB\n", bytes / 1e9);
        printf("synchronous write: mean %.3f s (%.0f MB/s); background write: mean %.3f s\n",
               sum_sync / reps, bytes / (sum_sync / reps) / 1e6, sum_write / reps);
        printf("stall / synchronous write: means %.3f, median of reps %.3f (target <= 0.1)\n",
               sum_stall / sum_sync, med_ratio);
        printf("steps overlapping a background write: %d, mean %.1f ms vs %.1f ms median "
               "without (%.2fx)\n",
               n_during, 1e3 * mean_during, 1e3 * med_base, mean_during / med_base);
        double lost = 0;
        for (int i = 0; i < n_during; i++)
            lost += during[i] - med_base;
        printf("loop time per snapshot: synchronous %.3f s; background %.3f s stall + %.3f s of "
               "slower steps = %.3f s (%.2fx the synchronous)\n",
               sum_sync / reps, sum_stall / reps, lost / reps, sum_stall / reps + lost / reps,
               (sum_stall + lost) / sum_sync);
    }
    free(base);
    free(during);
    free(ratio);
    mal_trainer_destroy(tr);
    rmtree(snapdir);
    mal_comm_finalize(world);
    return 0;
}
