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
 * arrives within milliseconds and counts once); and once a stop has been
 * requested, a process still alive after the stop timeout ends with status
 * 1 (a rank stuck where the agreement cannot reach it, which the launcher
 * then takes down with the others).
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

/* Local, async-signal-safe.  The signal of this process's first stop
 * request, or 0. */
int mal_preempt_signal(void);

/* Local, async-signal-safe.  Request a stop as signal `sig` would (its
 * first request counts; no timeout or second-signal rule). */
void mal_preempt_request(int sig);

/* Local.  "SIGTERM", ... for the signals above ("a signal" otherwise). */
const char *mal_preempt_signal_name(int sig);

#endif /* MAL_TRAIN_PREEMPT_H */
