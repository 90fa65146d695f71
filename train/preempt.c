/* Stop requests by signal: the flag the step loop reads, the second-signal
 * rule and the stop timeout (preempt.h). */
#include "preempt.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/mal.h"

static volatile sig_atomic_t first_signal; /* 0: no request yet */
static volatile sig_atomic_t first_ms;     /* when: monotonic ms, modulo 2^32 */
static unsigned stop_timeout;              /* seconds; 0: none */
static volatile sig_atomic_t step_bound;   /* seconds; 0: none (preempt.h) */
static volatile sig_atomic_t at_boundary;  /* the stop reached a step boundary */
static volatile sig_atomic_t bound_armed;  /* the alarm is the step bound's */

static unsigned now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
    return (unsigned)((unsigned long long)ts.tv_sec * 1000u +
                      (unsigned long long)ts.tv_nsec / 1000000u);
}

/* write(2) of a constant message: all a handler may print. */
static void say(const char *msg)
{
    size_t n = strlen(msg);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, n);
        if (w <= 0) return;
        msg += w;
        n -= (size_t)w;
    }
}

static void on_timeout(int sig)
{
    (void)sig;
    if (!bound_armed)
        say("malleus-train: the stop requested by a signal did not finish within the stop "
            "timeout (--stop-timeout): exiting now with status 1; the newest committed "
            "snapshot is intact\n");
    else
        say("malleus-train: the stop requested by a signal did not reach the end of the step "
            "in several times the longest step so far (a peer gone, or stuck?): exiting now "
            "with status 1; the newest committed snapshot is intact\n");
    _exit(1);
}

/* The alarm of a pending request: the sooner of the stop timeout and
 * `bound` (0: none).  Async-signal-safe. */
static void arm(unsigned bound)
{
    unsigned t = stop_timeout;
    if (bound > 0 && (t == 0 || bound < t)) t = bound;
    bound_armed = t != stop_timeout;
    alarm(t); /* 0 cancels */
}

static void on_stop(int sig)
{
    int saved = errno;
    if (!first_signal) {
        first_ms = (sig_atomic_t)now_ms();
        first_signal = sig;
        arm((unsigned)step_bound);
    } else if (now_ms() - (unsigned)first_ms >= 1000u) {
        /* asked twice: stop now, as the signal would without us */
        say("malleus-train: second stop signal: exiting now\n");
        signal(sig, SIG_DFL);
        raise(sig);
    }
    errno = saved;
}

void mal_preempt_step_bound(unsigned seconds)
{
    step_bound = (sig_atomic_t)seconds;
    /* a request already made waits under the bound of the phase now
     * starting: a step's, or the stop timeout outside steps */
    if (first_signal && !at_boundary) {
        arm(seconds);
    }
}

void mal_preempt_boundary(void)
{
    if (at_boundary) return;
    at_boundary = 1;
    bound_armed = 0;
    alarm(stop_timeout); /* 0 cancels the step bound's alarm */
}

int mal_preempt_signal(void)
{
    return first_signal;
}

void mal_preempt_request(int sig)
{
    if (!first_signal) first_signal = sig;
}

const char *mal_preempt_signal_name(int sig)
{
    switch (sig) {
    case SIGTERM:
        return "SIGTERM";
    case SIGINT:
        return "SIGINT";
    case SIGHUP:
        return "SIGHUP";
    case SIGUSR1:
        return "SIGUSR1";
    default:
        return "a signal";
    }
}

static int install(int sig, void (*fn)(int), int unless_ignored)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    /* restart interrupted system calls: the library's I/O is not written
     * to expect EINTR, and the flag is read at the next step anyway */
    sa.sa_flags = SA_RESTART;
    if (sigaction(sig, NULL, &old) != 0)
        return MAL_ERR(MAL_EINVAL, "sigaction(%s): %s", mal_preempt_signal_name(sig),
                       strerror(errno));
    if (unless_ignored && old.sa_handler == SIG_IGN) return 0;
    if (sigaction(sig, &sa, NULL) != 0)
        return MAL_ERR(MAL_EINVAL, "sigaction(%s): %s", mal_preempt_signal_name(sig),
                       strerror(errno));
    return 0;
}

int mal_preempt_install(unsigned stop_timeout_s)
{
    int rc;
    stop_timeout = stop_timeout_s;
    /* SIGINT and SIGHUP stay ignored where the shell or nohup made them so
     * (a background job must not stop on the terminal's Ctrl-C) */
    if ((rc = install(SIGALRM, on_timeout, 0)) || (rc = install(SIGTERM, on_stop, 0)) ||
        (rc = install(SIGUSR1, on_stop, 0)) || (rc = install(SIGINT, on_stop, 1)) ||
        (rc = install(SIGHUP, on_stop, 1)))
        return rc;
    return 0;
}
