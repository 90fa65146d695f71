/* The heartbeat between the ranks and the check the waits make (watch.h). */
#define _DEFAULT_SOURCE /* getifaddrs, gethostname */
#include "watch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/mal.h"

enum { MAX_ADDRS = 8, HOST_LEN = 64 };
enum { BEAT = 1, BYE = 2 };
#define MAGIC 0x4d4c5742u /* "MLWB" */

/* What each rank tells the others at the start (one all-gather). */
typedef struct {
    uint64_t token;           /* rank 0's is the job's */
    uint32_t addr[MAX_ADDRS]; /* network order */
    uint32_t n_addr;
    uint32_t ok;   /* 0: this rank could not set up its side */
    uint16_t port; /* network order */
    char host[HOST_LEN];
} card;

/* One datagram. */
typedef struct {
    uint32_t magic, kind;
    uint64_t token;
    int32_t rank, pad;
} beat;

static struct {
    int on, fd, wake[2], me, n;
    uint64_t token;
    double timeout_s, period_s;
    card *cards;
    _Atomic int64_t *heard_ns; /* [n]: when each peer's last beat was read; 0 never */
    _Atomic int *gone;         /* [n]: the peer said goodbye */
    _Atomic int64_t ran_ns;    /* when the thread last read its socket */
    _Atomic int stop;
    int64_t start_ns;
    _Atomic int warned;          /* the warning about a peer never heard from was given */
    _Atomic(const char *) armed; /* what the armed blocking call does; NULL: none */
    char stop_at[64];            /* MALLEUS_TEST_STOP's call name ("" none) ... */
    int stop_rank, stop_nth;     /* ... rank and which of its calls (from 1) */
    pthread_t thread;
} W = {.fd = -1, .wake = {-1, -1}};

static int silent_peer(int64_t *quiet);
static void end_armed(const char *what, int r, int64_t quiet);

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void send_all(uint32_t kind)
{
    beat b = {MAGIC, kind, W.token, W.me, 0};
    for (int r = 0; r < W.n; r++) {
        if (r == W.me) continue;
        const card *c = &W.cards[r];
        for (uint32_t a = 0; a < c->n_addr; a++) {
            struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = c->port};
            to.sin_addr.s_addr = c->addr[a];
            /* best effort: an address that does not reach the peer from
             * here (its loopback, seen from another host) costs nothing */
            (void)sendto(W.fd, &b, sizeof b, MSG_DONTWAIT, (struct sockaddr *)&to, sizeof to);
        }
    }
}

static void drain(void)
{
    beat b;
    ssize_t got;
    while ((got = recv(W.fd, &b, sizeof b, MSG_DONTWAIT)) >= 0) {
        /* another job's beat, or junk that found our port: dropped */
        if (got != (ssize_t)sizeof b || b.magic != MAGIC || b.token != W.token || b.rank < 0 ||
            b.rank >= W.n)
            continue;
        atomic_store(&W.heard_ns[b.rank], now_ns());
        if (b.kind == BYE) atomic_store(&W.gone[b.rank], 1);
    }
    atomic_store(&W.ran_ns, now_ns());
}

/* The thread: read what arrived, beat once a period, until told to stop
 * (a byte on the wake pipe, so that stopping does not wait a period). */
static void *run(void *arg)
{
    (void)arg;
    int64_t period = (int64_t)(W.period_s * 1e9), next = 0;
    struct pollfd p[2] = {{.fd = W.fd, .events = POLLIN}, {.fd = W.wake[0], .events = POLLIN}};
    while (!atomic_load(&W.stop)) {
        int64_t t = now_ns();
        if (t >= next) {
            send_all(BEAT);
            next = t + period;
        }
        (void)poll(p, 2, (int)((next - t) / 1000000 + 1));
        drain();
        /* The main thread is blocked inside an MPI call that cannot be
         * waited on (mal_comm_watch_arm): this thread is the only one that
         * can still act. */
        const char *what = atomic_load(&W.armed);
        int64_t quiet;
        int r;
        if (what && (r = silent_peer(&quiet)) >= 0) end_armed(what, r, quiet);
    }
    return NULL;
}

/* This rank's card (zeroed, its host named): its up IPv4 addresses (loopback last), the port. */
static int make_card(card *c, uint16_t port)
{
    struct ifaddrs *ifs = NULL;
    c->port = port;
    if (getifaddrs(&ifs)) return MAL_ERR(MAL_EIO, "peer watch: getifaddrs: %s", strerror(errno));
    uint32_t lo = 0;
    for (struct ifaddrs *i = ifs; i && c->n_addr < MAX_ADDRS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        if (i->ifa_flags & IFF_LOOPBACK)
            lo = a;
        else
            c->addr[c->n_addr++] = a;
    }
    freeifaddrs(ifs);
    if (lo && c->n_addr < MAX_ADDRS) c->addr[c->n_addr++] = lo;
    return 0;
}

static void release(void)
{
    if (W.fd >= 0) close(W.fd);
    for (int k = 0; k < 2; k++)
        if (W.wake[k] >= 0) close(W.wake[k]);
    free(W.cards);
    free((void *)W.heard_ns);
    free((void *)W.gone);
    W.fd = W.wake[0] = W.wake[1] = -1;
    W.cards = NULL;
    W.heard_ns = NULL;
    W.gone = NULL;
}

int mal_comm_watch_start(mal_comm *world, double timeout_s)
{
    int err = 0, rc;
    if (W.on) return MAL_ERR(MAL_EINVAL, "peer watch: already running in this process");
    if (!(timeout_s > 0))
        return MAL_ERR(MAL_EINVAL, "peer watch: timeout %g s; give a positive number", timeout_s);
    if (world->size < 2) return 0;
    W.me = world->rank;
    W.n = world->size;
    W.timeout_s = timeout_s;
    W.period_s = MAL_MIN(timeout_s / 10, 1.0);
    W.cards = calloc((size_t)W.n, sizeof *W.cards);
    W.heard_ns = calloc((size_t)W.n, sizeof *W.heard_ns);
    W.gone = calloc((size_t)W.n, sizeof *W.gone);
    if (!W.cards || !W.heard_ns || !W.gone) {
        err = MAL_ERR(MAL_ENOMEM, "peer watch: out of memory for %d ranks", W.n);
        goto fail;
    }
    /* A failure here is one rank's: it still joins the exchange (with a
     * card that says so) so that the others are not left waiting in it. */
    card mine;
    memset(&mine, 0, sizeof mine);
    if (gethostname(mine.host, HOST_LEN - 1)) snprintf(mine.host, HOST_LEN, "?");
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof me;
    if ((W.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(W.fd, (struct sockaddr *)&me, sizeof me) ||
        getsockname(W.fd, (struct sockaddr *)&me, &len) || pipe(W.wake) ||
        fcntl(W.wake[0], F_SETFD, FD_CLOEXEC) || fcntl(W.wake[1], F_SETFD, FD_CLOEXEC))
        err = MAL_ERR(MAL_EIO, "peer watch: a UDP socket for the heartbeat: %s", strerror(errno));
    else
        err = make_card(&mine, me.sin_port);
    mine.ok = !err;
    /* rank 0's token names the job: beats of another job (or of an
     * earlier run on a reused port) are dropped */
    mine.token = ((uint64_t)getpid() << 32) ^ (uint64_t)now_ns();
    /* through the table (gather, then broadcast): every control plane
     * has them, and this file stays below the MPI backend's waits */
    int xerr = mal_comm_gather(world, &mine, W.cards, sizeof mine, 0);
    if (!xerr) xerr = mal_comm_broadcast(world, W.cards, (size_t)W.n * sizeof mine, 0);
    if (xerr) err = xerr;
    if (err) goto fail;
    for (int r = 0; r < W.n; r++)
        if (!W.cards[r].ok) {
            err = MAL_ERR(MAL_EIO,
                          "peer watch: rank %d (host %s) could not open its heartbeat "
                          "socket (its own message says why); --peer-timeout 0 runs "
                          "without the watch",
                          r, W.cards[r].host);
            goto fail;
        }
    W.token = W.cards[0].token;
    /* A test feature (tests/test_peer_watch.sh):
     * MALLEUS_TEST_STOP=CALL:RANK[:NTH] makes world rank RANK stop itself
     * (SIGSTOP, as a node that stops answering) right before its NTH
     * (default first) armed call CALL, e.g. MPI_Comm_split:2. */
    const char *ts = getenv("MALLEUS_TEST_STOP"), *colon = ts ? strchr(ts, ':') : NULL;
    W.stop_at[0] = 0;
    if (colon && (size_t)(colon - ts) < sizeof W.stop_at) {
        char *end;
        snprintf(W.stop_at, sizeof W.stop_at, "%.*s", (int)(colon - ts), ts);
        W.stop_rank = (int)strtol(colon + 1, &end, 10);
        W.stop_nth = *end == ':' ? (int)strtol(end + 1, NULL, 10) : 1;
    }
    atomic_store(&W.armed, NULL);
    W.start_ns = now_ns();
    atomic_store(&W.warned, 0);
    atomic_store(&W.ran_ns, W.start_ns);
    atomic_store(&W.stop, 0);
    if ((rc = pthread_create(&W.thread, NULL, run, NULL))) {
        err = MAL_ERR(MAL_EIO, "peer watch: starting its thread: %s", strerror(rc));
        goto fail;
    }
    W.on = 1;
    return 0;
fail:
    release();
    return err;
}

void mal_comm_watch_stop(int goodbye)
{
    if (!W.on) return;
    if (goodbye) send_all(BYE);
    atomic_store(&W.stop, 1);
    char b = 0;
    (void)!write(W.wake[1], &b, 1);
    pthread_join(W.thread, NULL);
    W.on = 0;
    release();
}

/* The first peer, not gone, that has been silent for the timeout (its
 * silence in *quiet), or -1.  Either thread. */
static int silent_peer(int64_t *quiet)
{
    /* silence as of the thread's last read: a rank that was itself stopped
     * or starved has not yet read the beats that wait in its socket */
    int64_t ran = atomic_load(&W.ran_ns), limit = (int64_t)(W.timeout_s * 1e9);
    for (int r = 0; r < W.n; r++) {
        if (r == W.me || atomic_load(&W.gone[r])) continue;
        int64_t heard = atomic_load(&W.heard_ns[r]);
        if (!heard) {
            /* Never heard from: the datagrams do not get through (a
             * firewall between the nodes), not a peer that died; watching
             * it would end every job after the timeout.  Said once,
             * whichever thread waits (the snapshot writer's too). */
            if (ran - W.start_ns > limit && !atomic_exchange(&W.warned, 1)) {
                mal_log(MAL_LOG_WARN,
                        "peer watch: rank %d (host %s) has sent no heartbeat in %g s: UDP "
                        "between the ranks' hosts seems blocked; ranks never heard from are not "
                        "watched (a dead node then waits for the launcher)",
                        r, W.cards[r].host, W.timeout_s);
            }
            continue;
        }
        if (ran - heard > limit) {
            *quiet = ran - heard;
            return r;
        }
    }
    return -1;
}

static int silent_err(const char *what, int r, int64_t quiet)
{
    return MAL_ERR(MAL_EMPI,
                   "%s: rank %d (host %s) has not been heard from for %.1f s "
                   "(--peer-timeout %g): its node is down or stopped; this rank gives up "
                   "waiting",
                   what, r, W.cards[r].host, (double)quiet * 1e-9, W.timeout_s);
}

/* The one place the library ends the process itself.  The main thread is
 * blocked inside an MPI call that has no non-blocking form (or none that
 * MPI can cancel): it cannot return an error, MPI_Abort is not allowed
 * from this thread (MPI_THREAD_SINGLE) and may block behind the main
 * thread's call anyway.  So: the same message as a checked wait and the
 * fatal path's, then _exit(1); the launcher (mpiexec, srun) sees a rank
 * fail and ends the others. */
static void end_armed(const char *what, int r, int64_t quiet)
{
    silent_err(what, r, quiet);
    mal_log(MAL_LOG_ERROR, "rank %d: %s; ending this rank (exit 1)", W.me, mal_errmsg());
    fflush(NULL);
    _exit(1);
}

int mal_comm_watch_check(const char *what)
{
    if (!W.on) return 0;
    int64_t quiet;
    int r = silent_peer(&quiet);
    return r < 0 ? 0 : silent_err(what, r, quiet);
}

void mal_comm_watch_arm(const char *call, const char *what)
{
    if (!W.on) return;
    if (W.stop_at[0] && W.me == W.stop_rank && !strcmp(W.stop_at, call) && --W.stop_nth == 0) {
        mal_log(MAL_LOG_WARN, "rank %d: MALLEUS_TEST_STOP: stopping before %s", W.me, call);
        raise(SIGSTOP);
    }
    atomic_store(&W.armed, what);
}

void mal_comm_watch_disarm(void)
{
    if (W.on) atomic_store(&W.armed, NULL);
}
