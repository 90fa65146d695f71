/* Stop requests by signal (preempt.c): SIGTERM, SIGINT, SIGHUP and SIGUSR1
 * ask a run to stop at a step boundary, write a snapshot of that step and
 * exit (malleus-train: exit status 4), so that a job that is preempted, hits
 * its time limit (Slurm's --signal warning) or is stopped by hand loses no
 * step.  A signal only sets a flag; the ranks agree on it through the
 * step's existing all-reduce (train.c), so every rank stops after the same
 * step and no collective is added.
 *
 * Bounds: a second signal more than a second after the first ends the
 * process at once by that signal's default action (the same request
 * delivered twice, by a launcher that forwards it and to the process group,
 * arrives within milliseconds and counts once); once a stop has been
 * requested, a process that does not reach the end of its step within the
 * step bound (set by the step loop from the longest step so far) ends with
 * status 1 -- a peer is gone (a rank that died under srun
 * --kill-on-bad-exit: slurmstepd sends the others SIGTERM, and their step
 * can never end) or stuck where the agreement cannot reach it, and the
 * launcher takes down the others; from the step's end the snapshot has the
 * stop timeout, after which a process still alive ends with status 1.
 *
 * The handlers are the program's, installed by malleus-train once its
 * communication layer is up: MPICH's MPI_Init installs a SIGUSR1 handler of
 * its own and UCX one for SIGHUP (which raises UCX's log level to trace), and
 * both are replaced.  A library user that installs nothing gets no stop
 * requests (mal_preempt_request asks for one by hand).  Not installed. */
#ifndef MAL_TRAIN_PREEMPT_H
#define MAL_TRAIN_PREEMPT_H

/* Local, process-wide.  Install the handlers of SIGTERM, SIGUSR1, and of
 * SIGINT and SIGHUP unless they are ignored (a background job, nohup).
 * stop_timeout_s > 0: a process still alive that many seconds after the
 * first request ends with status 1.  0, or MAL_EINVAL from sigaction. */
int mal_preempt_install(unsigned stop_timeout_s);

/* Local.  The longest a step may still take once a stop is requested
 * (seconds, 0: no bound but the stop timeout): the step loop sets it from
 * the steps it has timed before each step and 0 after it; a request
 * already made is re-armed with the new bound. */
void mal_preempt_step_bound(unsigned seconds);
/* The bound the step loop sets: BASE + STEPS x the longest step so far. */
#define MAL_PREEMPT_STEP_BOUND_BASE 10
#define MAL_PREEMPT_STEP_BOUND_STEPS 3
/* Local.  The stop reached the end of a step (every rank agreed on it):
 * from now the stop timeout alone bounds the snapshot. */
void mal_preempt_boundary(void);
/* Local, async-signal-safe.  The signal of this process's first stop
 * request, or 0. */
int mal_preempt_signal(void);

/* Local, async-signal-safe.  Request a stop as signal `sig` would (its
 * first request counts; no timeout or second-signal rule). */
void mal_preempt_request(int sig);

/* Local.  "SIGTERM", ... for the signals above ("a signal" otherwise). */
const char *mal_preempt_signal_name(int sig);

#endif /* MAL_TRAIN_PREEMPT_H */
