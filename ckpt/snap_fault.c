/* Test hooks that break a snapshot write on purpose: fault injection of
 * the N-th writer I/O step (mal_snapshot_fault_nth_io, snapshot.h) and the
 * kill points of MALLEUS_TEST_SNAPSHOT_KILL.  The bottom of the snapshot
 * layer: the file-system helpers, the HDF5 plumbing, the commit and the
 * writer all ask snap_fault() before each I/O step, and this file calls
 * none of them.
 */
#include "snap_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- fault injection */

int mal_snapshot_fault_nth_io = 0;

/* True (with errno = EIO) when the armed fault fires at this I/O step. */
int snap_fault(void)
{
    if (mal_snapshot_fault_nth_io <= 0 || --mal_snapshot_fault_nth_io > 0) return 0;
    errno = EIO;
    return 1;
}

/* ---------------------------------------------------------------- kill points */

/* MALLEUS_TEST_SNAPSHOT_KILL=RANK:STEP:POINT (see snapshot.h). */
int snap_kill_point(int rank, int64_t step)
{
    const char *e = getenv("MALLEUS_TEST_SNAPSHOT_KILL");
    int r;
    long long s;
    char what[16];
    if (!e || sscanf(e, "%d:%lld:%15s", &r, &s, what) != 3 || r != rank || s != step)
        return SNAP_KILL_NONE;
    if (!strcmp(what, "data")) return SNAP_KILL_DATA;
    if (!strcmp(what, "index")) return SNAP_KILL_INDEX;
    if (!strcmp(what, "rename")) return SNAP_KILL_RENAME;
    return SNAP_KILL_NONE;
}

void snap_die(int rank, const char *where)
{
    fprintf(stderr, "malleus: test hook: rank %d kills itself (SIGKILL) %s\n", rank, where);
    fflush(NULL);
    raise(SIGKILL);
}
