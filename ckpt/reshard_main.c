/* malleus-reshard: command-line shell over mal_reshard (reshard.h).
 * Parses flags, reads the plan, runs on one process or on all processes of
 * an mpiexec/srun job, shows progress on a terminal and prints one summary
 * line.  Exit codes: 0 done, 1 failure (refused snapshot or plan, I/O,
 * checksum), 2 usage error. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "mal.h"
#include "plan.h"
#include "reshard.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: malleus-reshard [OPTIONS] SNAPSHOT PLAN.json DEST\n"
        "Rewrite a committed training snapshot for another parallel plan (any world size,\n"
        "TP sizes, stage counts, layer splits, micro-batches, suspended ranks).  The state\n"
        "is copied bit for bit; `malleus-train --plan PLAN.json --snapshot-dir DEST\n"
        "--resume` then continues the run on the new plan.\n"
        "\n"
        "  SNAPSHOT          a snapshot directory (its `latest` is used) or a step directory\n"
        "  PLAN.json         the new plan (malleus-plan/1); it must fit the model stored in\n"
        "                    the snapshot (layers, heads, FFN size) and its global batch\n"
        "  DEST              directory for the new snapshot (DEST/step_N and DEST/latest);\n"
        "                    never the snapshot's own directory: the source is only read\n"
        "\n"
        "Options:\n"
        "  --mem MIB         data buffer per process in MiB (default: %zu); memory use is\n"
        "                    about this plus 8 MiB and the block tables, whatever the\n"
        "                    model size\n"
        "  --keep N          retention in DEST: keep the newest N snapshots (default: 0 = all)\n"
        "  --progress        always draw the progress line (default: only on a terminal)\n"
        "  --no-progress     never draw it\n"
        "  --quiet           no progress line and no summary (errors only)\n"
        "  -h, --help        this text\n"
        "  --version         print the version\n"
        "\n"
        "Under mpiexec or srun the processes share the work (each writes some of the new\n"
        "shard files):\n"
        "  malleus-reshard snap plan8.json snap-new\n"
        "  mpiexec -n 4 malleus-reshard snap/step_00000300 plan6.json snap-new\n"
        "Exit status: 0 done, 1 refused or failed (nothing committed), 2 usage error.\n",
        MAL_RESHARD_MEM_DEFAULT >> 20);
}

static int bad(const char *msg, const char *arg)
{
    fprintf(stderr, "malleus-reshard: %s%s\nTry 'malleus-reshard --help'.\n", msg, arg);
    return 2;
}

enum { O_MEM = 256, O_KEEP, O_PROGRESS, O_NOPROGRESS, O_QUIET, O_VERSION };
static const struct option longopts[] = {
    {"mem", required_argument, 0, O_MEM},     {"keep", required_argument, 0, O_KEEP},
    {"progress", no_argument, 0, O_PROGRESS}, {"no-progress", no_argument, 0, O_NOPROGRESS},
    {"quiet", no_argument, 0, O_QUIET},       {"help", no_argument, 0, 'h'},
    {"version", no_argument, 0, O_VERSION},   {0, 0, 0, 0},
};

static int parse_int(const char *flag, const char *arg, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr,
                "malleus-reshard: %s expects an integer in [%ld, %ld], got '%s'\nTry "
                "'malleus-reshard --help'.\n",
                flag, lo, hi, arg);
        return -1;
    }
    *out = v;
    return 0;
}

static void human(char *out, size_t len, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    while (b >= 1024 && k < 4)
        b /= 1024, k++;
    snprintf(out, len, "%.*f %s", k ? 2 : 0, b, u[k]);
}

int main(int argc, char **argv)
{
    mal_reshard_options o = {0};
    int progress = -1, quiet = 0, c;
    long v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case O_MEM:
            if (parse_int("--mem", optarg, 1, 1L << 20, &v)) return 2;
            o.mem_bytes = (size_t)v << 20;
            break;
        case O_KEEP:
            if (parse_int("--keep", optarg, 0, INT_MAX, &v)) return 2;
            o.keep_last = (int)v;
            break;
        case O_PROGRESS:
            progress = 1;
            break;
        case O_NOPROGRESS:
            progress = 0;
            break;
        case O_QUIET:
            quiet = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case O_VERSION:
            printf("malleus-reshard %s\n", PACKAGE_VERSION);
            return 0;
        case ':':
            return bad("option needs a value: ", argv[optind - 1]);
        default:
            return bad("unknown option ", argv[optind - 1]);
        }
    }
    if (argc - optind != 3) return bad("expected SNAPSHOT PLAN.json DEST", "");
    o.src = argv[optind];
    const char *plan_path = argv[optind + 1];
    o.dst_dir = argv[optind + 2];

    MPI_Init(&argc, &argv);
    int status = 1, rc;
    mal_comm *world = NULL;
    mal_plan plan;
    mal_plan_init(&plan);
    if ((rc = mal_comm_mpi_world(&world))) {
        fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
        goto out;
    }
    const int lead = world->rank == 0;
    if (!lead) mal_log_level = MAL_LOG_ERROR;
    /* every process reads the plan: the same file gives the same answer */
    if ((rc = mal_plan_read(&plan, plan_path))) {
        if (lead) fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
        status = 2;
        goto out;
    }
    o.plan = &plan;
    if (progress < 0) progress = isatty(STDOUT_FILENO);
    if (lead && progress && !quiet) o.progress = stdout;
    mal_reshard_stats st;
    if ((rc = mal_reshard(world, &o, &st))) {
        if (lead) fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
        goto out;
    }
    if (lead && !quiet) {
        char r[32], wr[32], rate[32];
        human(r, sizeof r, (double)st.bytes_read);
        human(wr, sizeof wr, (double)st.bytes_written);
        human(rate, sizeof rate, st.seconds > 0 ? (double)st.bytes_written / st.seconds : 0);
        printf("malleus-reshard: step %lld: %d tensors into %d shard files, %s read, %s written "
               "in %.2f s (%s/s, %d process%s) -> %s\n",
               (long long)st.step, st.n_tensors, st.n_shards, r, wr, st.seconds, rate, st.n_procs,
               st.n_procs == 1 ? "" : "es", st.out_path);
    }
    status = 0;
out:
    mal_plan_fini(&plan);
    mal_comm_destroy(world);
    MPI_Finalize();
    return status;
}
