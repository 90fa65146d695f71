/* The job's own watchdog over its peers: a heartbeat between the ranks on
 * a channel of its own, so that a rank blocked in a wait learns within
 * seconds that a peer's node died or stopped answering, instead of waiting
 * for the launcher (Slurm marks a silent node down only after
 * SlurmdTimeout, 300 s by default, and until then every survivor stays
 * blocked in its collective).
 *
 * Each rank runs one thread that sends a small UDP datagram to every other
 * rank once a period (a tenth of the timeout, at most 1 s) and records when
 * it last heard from each.  The thread runs whatever the rank's main thread
 * does (a long step, a snapshot being written, MPI_Comm_split), so a slow
 * peer still beats; a peer whose processes were all killed or stopped
 * (SIGSTOP: its thread stops too) falls silent.  The waits of the MPI
 * backend (comm_mpi.c, mal_mpi_wait and the member-list reduction) and the
 * NCCL host waits call mal_comm_watch_check while they wait: once a peer
 * has been silent for the timeout the wait returns MAL_EMPI naming the
 * peer's rank and host, and the trainer's fatal path ends the job (exit 1).
 * A wait that makes no progress while every peer beats is never ended by
 * the watchdog (a straggler is not a failure).
 *
 * Silence is measured on the watcher's own thread: a rank that was itself
 * stopped or starved of CPU counts the time since its thread last ran, so
 * waking up never makes every peer look dead.  A rank that ends normally
 * says goodbye (mal_comm_watch_stop(1), which mal_comm_finalize calls
 * after MPI_Finalize) and is no longer watched; one that
 * ends by the fatal path or is killed does not, and its peers end within
 * the timeout.
 *
 * Blocking MPI calls that no wait can check (MPI_Comm_split,
 * MPI_Comm_create_group, MPI_Finalize: MPI-3 has no non-blocking form of
 * them) are armed instead (mal_comm_watch_arm): while the main thread is
 * inside one, the heartbeat thread itself checks the peers once a period
 * and, when one has been silent for the timeout, prints the same message
 * and ends this rank with _exit(1).  So no MPI call of the library waits
 * on a dead or stopped peer past the timeout plus a period.
 *
 * Addresses: every rank's up IPv4 interface addresses (loopback included)
 * and the port of its socket, exchanged once with an all-gather; beats go
 * to each address of each peer, and carry a job token (rank 0's) and the
 * sender's rank, so a beat that lands on another process of this host is
 * dropped and a wrong address only costs a datagram.  A peer never heard
 * from at all (UDP blocked between the hosts) is not watched, with one
 * warning, rather than ending every job after the timeout.  The traffic is
 * (ranks - 1) x addresses datagrams of 24 bytes per rank per period: for
 * jobs of up to a few hundred ranks. */
#ifndef MAL_COMM_WATCH_H
#define MAL_COMM_WATCH_H

#include "comm.h"

/* Default timeout (seconds) of --peer-timeout: long enough that a peer's
 * thread starved on an oversubscribed machine (8 ranks on 2 shared cores in
 * the tests) never looks dead, short enough that a dead node ends the job
 * step in seconds. */
#define MAL_COMM_WATCH_TIMEOUT_DEFAULT 10.0

/* Collective over `world` (one rank: nothing to watch, returns 0).  Start the heartbeat thread with
 * `timeout_s` (> 0) of silence before a peer counts as gone.  One watch per process; the waits of
 * every communicator check it.  0, or MAL_EIO (no socket or thread) / the exchange's error /
 * MAL_EINVAL (already running, or a bad timeout). */
int mal_comm_watch_start(mal_comm *world, double timeout_s);

/* Local.  Stop the thread (no-op if none); with `goodbye`, first tell the
 * peers this rank ends normally so that they stop watching it. */
void mal_comm_watch_stop(int goodbye);

/* Local, cheap (reads one clock and the peers' times; called from the
 * waits' loops).  0 while no watch runs or every peer not yet gone has been
 * heard from within the timeout; otherwise MAL_EMPI with a message naming
 * the silent peer, its host and `what` (the operation that waits). */
int mal_comm_watch_check(const char *what);

/* Local, main thread.  Arm the watch around a blocking MPI call `call`
 * (its name, e.g. "MPI_Comm_split") that no checked wait covers; `what`
 * (a string literal: kept) says what this rank is doing, for the message.
 * While armed, a peer silent for the timeout ends this process: the
 * heartbeat thread prints the message and calls _exit(1) (watch.c says why
 * that is the one place the library exits).  One armed call at a time;
 * no-op while no watch runs.  Test feature: MALLEUS_TEST_STOP=CALL:RANK[:NTH]
 * stops world rank RANK (SIGSTOP) right before its NTH (default first) CALL. */
void mal_comm_watch_arm(const char *call, const char *what);

/* Local.  The armed call returned. */
void mal_comm_watch_disarm(void);

#endif /* MAL_COMM_WATCH_H */
