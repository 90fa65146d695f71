/* The trainer's snapshot directory at start-up: what to resume, what a
 * run may write over, and the directory held for the run (ckpt_start.h).
 *
 * Everything a snapshot directory can hold that would make the run fail
 * at its first (or only, final) snapshot, or make it destroy another
 * run's snapshots, is found here, before a step is trained, and refused
 * with exit status 2:
 *   - another job writing the directory (its lock, ckpt/snap_dest.c);
 *   - a destination that cannot be written (probed with a file);
 *   - a new run in a directory holding another run's snapshots, which
 *     retention (--keep) would delete and whose steps it would collide
 *     with -- unless --overwrite-snapshots says they may go;
 *   - a resume with snapshots after the step resumed (a rollback with
 *     --resume-from, or newer snapshots this build cannot read), whose
 *     steps the run would write again -- unless --overwrite-snapshots;
 *   - a resume with --steps below the snapshot's step (the state is past
 *     what was asked; at it, the run is complete: train_cli says so).
 * Rank 0 decides (it alone touches the directory) and tells every rank.
 */
#include "ckpt_start.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "ckpt/snapshot.h"
#include "train_internal.h"

/* Rank 0's part of mal_ckpt_start. */
static int start_root(struct mal_trainer *tr, char *path, size_t len)
{
    const mal_train_options *o = &tr->o;
    mal_train_ckpt *c = &tr->ckpt;
    const char *dir = o->snapshot_dir;
    int64_t target = -1;
    int rc;
    /* what to resume, first: a refusal here writes nothing at all */
    if (o->resume) {
        if ((rc = mal_snapshot_find(dir, o->resume_from, path, len, &target))) return rc;
        /* equal: the run is complete (malleus-train says so and exits 0,
         * so that a restart loop that lost its job after the final
         * snapshot finishes); below: the state is past what was asked */
        if (!o->eval_only && o->steps < target)
            return MAL_ERR(MAL_EINVAL,
                           "the snapshot to resume, %s, is at step %lld, past --steps %lld: a "
                           "run cannot train backwards; give --steps %lld or more, or roll back "
                           "with --resume-from STEP",
                           path, (long long)target, (long long)o->steps, (long long)target);
    }
    if (o->eval_only) return 0; /* it only reads: no lock, nothing to clear */
    if ((rc = mal_snap_dest_open(&c->dest, dir, "malleus-train"))) return rc;
    mal_snap_scan sc;
    if ((rc = mal_snapshot_scan(dir, target, &sc))) return rc;
    if (sc.n_foreign_after > 0)
        return MAL_ERR(MAL_EINVAL,
                       "%s/%s is not a snapshot directory (a link, or not a directory: see the "
                       "warning above), and this run may need to write a snapshot of that step "
                       "there; Malleus never removes what it did not write: move it out of %s",
                       dir, sc.foreign_after_name, dir);
    if (sc.n_after > 0 && !o->overwrite_snapshots) {
        if (!o->resume)
            return MAL_ERR(MAL_EINVAL,
                           "--snapshot-dir %s holds the snapshots of another run (%d; the newest "
                           "%s/%s, step %lld): a new run there would write over their steps, and "
                           "--keep would delete them. Continue that run with --resume, start "
                           "over with --overwrite-snapshots (which deletes them first), or give "
                           "another --snapshot-dir",
                           dir, sc.n_after, dir, sc.newest_after_name, (long long)sc.newest_after);
        if (o->resume_from >= 0)
            return MAL_ERR(MAL_EINVAL,
                           "--snapshot-dir %s holds %d snapshot(s) after step %lld, the one "
                           "--resume-from names (the newest %s/%s): this run would write those "
                           "steps again. To roll back to step %lld, add --overwrite-snapshots "
                           "(which deletes them); to continue the newest, drop --resume-from",
                           dir, sc.n_after, (long long)target, dir, sc.newest_after_name,
                           (long long)target);
        return MAL_ERR(MAL_EINVAL,
                       "--snapshot-dir %s holds %d snapshot(s) after step %lld, the newest one "
                       "this build can resume, that cannot be read (the newest %s/%s: damaged, "
                       "or of a newer format); this run would write those steps again. Move "
                       "them away, or pass --overwrite-snapshots to delete them",
                       dir, sc.n_after, (long long)target, dir, sc.newest_after_name);
    }
    c->clear = o->overwrite_snapshots &&
               (sc.n_after > 0 || (!o->resume && (sc.n_steps > 0 || sc.latest >= 0)));
    c->clear_after = target;
    return 0;
}

int mal_ckpt_start(struct mal_trainer *tr, char *path, size_t len)
{
    struct {
        int rc;
        char msg[1024];
        char path[4096];
    } *res = calloc(1, sizeof *res);
    if (!res) return MAL_ERR(MAL_ENOMEM, "out of memory"); /* then peers are doomed alike */
    path[0] = '\0';
    if (tr->world_rank == 0) {
        res->rc = start_root(tr, res->path, sizeof res->path);
        if (res->rc) snprintf(res->msg, sizeof res->msg, "%s", mal_errmsg());
    }
    int rc =
        tr->world && tr->world_size > 1 ? mal_comm_broadcast(tr->world, res, sizeof *res, 0) : 0;
    if (!rc && res->rc) {
        rc = res->rc;
        if (tr->world_rank != 0) MAL_ERR(rc, "%s", res->msg);
    }
    if (!rc && strlen(res->path) >= len) rc = MAL_ERR(MAL_EINVAL, "snapshot path too long");
    if (!rc) strcpy(path, res->path);
    free(res);
    return rc;
}

int mal_ckpt_start_clear(struct mal_trainer *tr)
{
    mal_train_ckpt *c = &tr->ckpt;
    int rc = 0;
    if (tr->world_rank == 0 && c->clear) {
        int n = 0;
        rc = mal_snap_dest_clear(c->dest, c->clear_after, &n);
        if (!rc && n > 0) {
            char after[64] = "";
            if (c->clear_after >= 0)
                snprintf(after, sizeof after, " after step %lld", (long long)c->clear_after);
            mal_log(MAL_LOG_INFO, "removed %d snapshot(s)%s from %s (--overwrite-snapshots)", n,
                    after, tr->o.snapshot_dir);
        }
        c->clear = 0;
    }
    return tr->world && tr->world_size > 1 ? mal_snapshot_agree(tr->world, rc) : rc;
}

void mal_ckpt_start_release(struct mal_trainer *tr, int undo)
{
    mal_snap_dest_close(tr->ckpt.dest, undo);
    tr->ckpt.dest = NULL;
}
