/* malleus-reshard: the option table and a call into the library
 * (mal_reshard_cli_run, reshard.h: reads the plan, reshards on one process
 * or on all processes of an mpiexec/srun job, shows progress on a terminal
 * and prints one summary line).  Exit codes: 0 done, 1 failure (refused
 * snapshot or plan, I/O, checksum), 2 usage error or bad input. */
#include <limits.h>
#include <stdio.h>

#include "base/mal.h"
#include "base/opts.h"
#include "ckpt/reshard.h"
#include "comm/comm.h"

static const char usage[] =
    "Usage: malleus-reshard [OPTIONS] SNAPSHOT PLAN.json DEST\n"
    "Rewrite a committed training snapshot for another parallel plan (any world size,\n"
    "TP sizes, stage counts, layer splits, micro-batches, suspended ranks).  The state\n"
    "is copied bit for bit; `malleus-train --plan PLAN.json --snapshot-dir DEST\n"
    "--resume` then continues the run on the new plan.\n"
    "\n"
    "  SNAPSHOT          a snapshot directory (its newest committed one) or a step dir.\n"
    "  PLAN.json         the new plan (malleus-plan/1); it must fit the model stored in\n"
    "                    the snapshot (layers, heads, FFN size) and its global batch\n"
    "  DEST              directory for the new snapshot (DEST/step_N and DEST/latest);\n"
    "                    never inside the source's snapshot directory (nor above the\n"
    "                    source where writing DEST would remove it): the source is\n"
    "                    only read; a run that fails leaves no directory it created;\n"
    "                    DEST is locked (DEST/.lock) and probed before the source is\n"
    "                    read: a job writing it already is refused, naming its pid\n";

static const char footer[] =
    "\n"
    "Under mpiexec or srun the processes share the work (each writes some of the new\n"
    "shard files):\n"
    "  malleus-reshard snap plan8.json snap-new\n"
    "  mpiexec -n 4 malleus-reshard snap/step_00000300 plan6.json snap-new\n"
    "Exit status: 0 done; 2 bad usage or input (a missing, incomplete or corrupt\n"
    "snapshot, a plan that does not fit it, a DEST inside the source, in use by\n"
    "another job or not writable); 1 any other\n"
    "failure (I/O, memory, MPI).  Nothing is committed unless the status is 0.\n";

/* --help states the default of --mem */
_Static_assert(MAL_RESHARD_MEM_DEFAULT_MIB == 256, "update --mem's help");
static const char mem_help[] = "data buffer per process in MiB (default: 256); memory use\n"
                               "is about this plus 8 MiB and the block tables, whatever the\n"
                               "model size";

int main(int argc, char **argv)
{
    mal_reshard_cli cli = {.progress = -1};
    int mem_mib = MAL_RESHARD_MEM_DEFAULT_MIB, first;
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Options:"},
        {MAL_OPT_INT, "mem", .metavar = "MIB", .target = &mem_mib, .lo = 1, .hi = 1 << 20,
         .help = mem_help},
        {MAL_OPT_INT, "keep", .metavar = "N", .target = &cli.keep_last, .lo = 0, .hi = INT_MAX,
         .help = "retention in DEST: keep the newest N snapshots (default: 0 = all)"},
        {MAL_OPT_FLAG, "progress", .target = &cli.progress, .ival = 1,
         .help = "always draw the progress line (default: only on a terminal)"},
        {MAL_OPT_FLAG, "no-progress", .target = &cli.progress, .ival = 0, .help = "never draw it"},
        {MAL_OPT_FLAG, "quiet", .target = &cli.quiet, .ival = 1,
         .help = "no progress line and no summary (errors only)"},
        {MAL_OPT_HELP, "help", 'h', .label = "-h, --help", .help = "this text"},
        {MAL_OPT_VERSION, "version", .help = "print the version"},
        {.kind = MAL_OPT_END},
    };
    const mal_opts_spec spec = {"malleus-reshard", PACKAGE_VERSION, usage, footer, opts, NULL};
    int status = mal_opts_parse(&spec, argc, argv, &first);
    if (status >= 0) return status;
    if (argc - first != 3) return mal_opts_bad(&spec, "expected SNAPSHOT PLAN.json DEST");
    cli.src = argv[first];
    cli.plan_path = argv[first + 1];
    cli.dst_dir = argv[first + 2];
    cli.mem_bytes = (size_t)mem_mib << 20;

    mal_comm *world = NULL;
    status = 1;
    if (mal_comm_init(&argc, &argv, &world))
        fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
    else
        status = mal_reshard_cli_run(world, &cli);
    mal_comm_finalize(world);
    return status;
}
