/* Rank 0's commit of a snapshot, once every process wrote its shards: the
 * block table built and checked, index.h5 written, the temporary directory
 * renamed to step_S, the COMPLETE marker written last, `latest` moved and
 * retention applied.  The last steps of the write path (snap_write.c calls
 * it from mal_snap_writer_finish); the pieces it puts together live below
 * it: the index (snap_index.c), durable file operations and retention
 * (snap_fs.c), the index checksum (snap_crc32c.c), the test hooks
 * (snap_fault.c).
 *
 * Commit protocol (crash-safe on a POSIX file system): rank 0 creates
 * .tmp-step_S.<random>.<pid>@<host> and broadcasts its name; every process writes
 * and fsyncs its shard files there; rank 0 gathers the block descriptors
 * (which also tells it that every process finished), checks that the blocks
 * tile every tensor exactly once, writes and fsyncs index.h5 and the
 * directory, renames it to step_S, fsyncs DIR, writes COMPLETE through a
 * temporary file (fsync, rename, fsync the step directory), then moves
 * `latest` the same way.  A directory without COMPLETE is never trusted;
 * `latest` only ever names a directory that had COMPLETE first.  Removal
 * goes in the opposite order: COMPLETE is unlinked before anything else.
 */
#include "snap_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Rank 0, every process done: check the gathered blocks, write the index,
 * commit.  Cleans up after itself on failure. */
int snap_commit_root(mal_snap_writer *w, snap_table *t, int keep_last)
{
    int rc = 0, nt = 0;
    enum { TMPDIR, RENAMED, COMMITTED } stage = TMPDIR;
    snap_tinfo *ti = NULL;
    char ipath[PATH_MAX], marker[PATH_MAX];

    if ((rc = snap_index_build(t, &ti, &nt, w->final))) goto done;

    /* index.h5 is created through the temporary directory's descriptor
     * (HDF5 takes a path: /proc/self/fd/N/index.h5), O_EXCL */
    char iopen[PATH_MAX];
    if ((rc = snap_join(ipath, sizeof ipath, w->tmp, SNAP_INDEX_FILE)) ||
        (rc = snap_fd_path(iopen, sizeof iopen, w->tfd, SNAP_INDEX_FILE, w->tmp)) ||
        (rc = snap_join(marker, sizeof marker, w->final, SNAP_COMPLETE)) ||
        (rc = snap_write_index(&w->meta, t, ti, nt, iopen, ipath)) || (rc = snap_fsync(iopen, 0)))
        goto done;
    uint64_t ibytes;
    uint32_t icrc;
    if ((rc = snap_file_crc(iopen, ipath, &ibytes, &icrc, SNAP_MAX_INDEX_BYTES)) ||
        (rc = snap_fsync_fd(w->tfd, w->tmp, 1)))
        goto done;
    if (w->kill == SNAP_KILL_INDEX) snap_die(w->rank, "after writing the index");

    if (snap_fault() || renameat(w->dfd, w->tmpname, w->dfd, w->stepname) != 0) {
        rc = MAL_ERR(MAL_EIO, "cannot rename %s to %s: %s", w->tmp, w->final, strerror(errno));
        goto done;
    }
    stage = RENAMED;
    if ((rc = snap_fsync_fd(w->dfd, w->dir, 1))) goto done;
    if (w->kill == SNAP_KILL_RENAME) snap_die(w->rank, "after renaming, before COMPLETE");

    /* COMPLETE, last: from here on the snapshot is trusted. */
    json_t *j =
        json_pack("{s:s, s:i, s:I, s:i, s:I, s:i, s:I, s:I}", "format", MAL_SNAP_FORMAT,
                  "format_version", MAL_SNAP_FORMAT_VERSION, "step", (json_int_t)w->meta.step,
                  "n_tensors", nt, "n_blocks", (json_int_t)t->nb, "n_shards", t->ns, "index_bytes",
                  (json_int_t)ibytes, "index_crc32c", (json_int_t)icrc);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    char *line = text ? malloc(strlen(text) + 2) : NULL;
    if (!line) {
        free(text);
        rc = MAL_ERR(MAL_ENOMEM, "out of memory writing %s", marker);
        goto done;
    }
    sprintf(line, "%s\n", text);
    free(text);
    int renamed;
    /* w->tfd is the step directory now (the rename kept it) */
    rc = snap_write_atomic(w->tfd, w->final, SNAP_COMPLETE, line, &renamed);
    free(line);
    if (rc) goto done;
    stage = COMMITTED;

    char pointer[80];
    snprintf(pointer, sizeof pointer, "%s\n", w->stepname);
    if ((rc = snap_write_atomic(w->dfd, w->dir, SNAP_LATEST, pointer, &renamed))) {
        if (!renamed) goto done;
        /* `latest` already names the new, committed snapshot; whether the
         * old or the new name survives a crash, it names a trusted one. */
        mal_log(MAL_LOG_WARN, "snapshot %s committed and named by %s/%s, but: %s", w->final, w->dir,
                SNAP_LATEST, mal_errmsg());
        rc = 0;
    }
    if (snap_retain(w->dfd, w->dir, w->meta.step, keep_last) != 0)
        mal_log(MAL_LOG_WARN, "snapshot %s committed, but retention failed: %s", w->final,
                mal_errmsg());
done:
    if (rc) {
        /* Undo what is not trusted.  COMMITTED (only `latest` failed): a
         * complete snapshot that `latest` does not name is harmless, and
         * retention treats it like any other. */
        char msg[SNAP_MSG];
        snprintf(msg, sizeof msg, "%s", mal_errmsg());
        int r = 0;
        if (stage == TMPDIR)
            r = snap_rmtree_at(w->dfd, w->tmpname, w->tmp);
        else if (stage == RENAMED)
            r = snap_remove_step_at(w->dfd, w->stepname, w->final);
        if (r)
            mal_seterr_at(__FILE__, __LINE__, rc, "%s; cleaning up also failed: %s", msg,
                          mal_errmsg());
    }
    free(ti);
    return rc;
}
