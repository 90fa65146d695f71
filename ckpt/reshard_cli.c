/* malleus-reshard's run, behind its option table (cmd/reshard_main.c):
 * read the plan, reshard, report.  A library function so that the main
 * stays an option table and one call (reshard.h). */
#include <stdio.h>
#include <unistd.h>

#include "base/mal.h"
#include "reshard.h"
#include "snapshot.h"
#include "src/plan.h"

int mal_reshard_cli_run(mal_comm *world, const mal_reshard_cli *cli)
{
    const int lead = world->rank == 0;
    int status = 1, rc;
    mal_snap_dest *dest = NULL;
    mal_plan plan;
    mal_plan_init(&plan);
    if (!lead) mal_log_level = MAL_LOG_ERROR;
    /* every process reads the plan: the same file gives the same answer */
    if ((rc = mal_plan_read(&plan, cli->plan_path))) {
        if (lead) fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
        status = 2;
        goto out;
    }
    /* DEST inside the source is bad input (status 2); every process
     * checks and all agree, so none runs on alone into the collectives.
     * A source that cannot be resolved is mal_reshard's to report. */
    char step_dir[4096];
    rc = mal_snapshot_resolve(cli->src, step_dir, sizeof step_dir) == 0
             ? mal_reshard_check_dest(step_dir, cli->dst_dir)
             : 0;
    /* PLAN.json must not be a file the snapshot in DEST would replace */
    if (!rc && mal_snapshot_dir_owns(cli->dst_dir, cli->plan_path))
        rc = MAL_ERR(MAL_EINVAL,
                     "PLAN.json %s is an entry of the destination %s, which the new snapshot "
                     "would replace: keep the plan outside DEST",
                     cli->plan_path, cli->dst_dir);
    /* DEST held for the run: locked against a second writer (a trainer on
     * it, another reshard) and probed, before the source is read */
    if (!rc && lead) rc = mal_snap_dest_open(&dest, cli->dst_dir, "malleus-reshard");
    if ((rc = mal_snapshot_agree(world, rc))) {
        if (lead) fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
        status = 2;
        goto out;
    }
    mal_reshard_options o = {.src = cli->src,
                             .dst_dir = cli->dst_dir,
                             .plan = &plan,
                             .mem_bytes = cli->mem_bytes,
                             .keep_last = cli->keep_last};
    int progress = cli->progress < 0 ? isatty(STDOUT_FILENO) : cli->progress;
    if (lead && progress && !cli->quiet) o.progress = stdout;
    mal_reshard_stats st;
    if ((rc = mal_reshard(world, &o, &st))) {
        if (lead) fprintf(stderr, "malleus-reshard: %s\n", mal_errmsg());
        /* a missing, incomplete or corrupt snapshot or a plan that does not
         * fit it is bad input (2); I/O, memory, MPI failures are 1 */
        status = mal_exit_status(rc);
        goto out;
    }
    if (lead && !cli->quiet) {
        char line[4096 + 512];
        mal_reshard_summary(&st, line, sizeof line);
        printf("malleus-reshard: %s\n", line);
    }
    status = 0;
out:
    /* a reshard that committed nothing leaves no directory it created */
    mal_snap_dest_close(dest, status != 0);
    mal_plan_fini(&plan);
    return status;
}
