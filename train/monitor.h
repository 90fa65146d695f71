/* The straggler monitor and straggler injection (monitor.c): the probe
 * every rank times each step, the straggling rates and the re-plan
 * policy's advice on rank 0, and the injected slowdown of this rank.  Not
 * installed. */
#ifndef MAL_TRAIN_MONITOR_H
#define MAL_TRAIN_MONITOR_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "linkprobe.h"
#include "train.h"

struct mal_trainer;
struct mal_policy;

#define MAL_HOSTNAME_LEN 64

/* Owned by monitor.c (mal_monitor_init / _fini). */
typedef struct {
    int probe_n;                         /* the probe's matrix size */
    void *probe_a, *probe_w, *probe_out; /* its operands and product (device, compute dtype) */
    mal_kern_event *probe_ev[2];         /* around a sample */
    int probe_reps;            /* matmuls per probe sample (1; more with --inject-mode gpu) */
    double inject_now;         /* injection factor of the current step (1: none) */
    double link_tp_now;        /* --inject-link: this step's factor of the TP group's
                                * all-reduces (1: none) */
    double link_dp_now;        /* ... of this rank's gradient sum (1: none) */
    int64_t link_step;         /* the step the link factors are for */
    double link_min[3];        /* least time seen of a TP pass's all-reduces, a step's
                                * gradient sum, a stage-boundary receive (0: none yet) */
    double slow_rate;          /* --inject-mode gpu: the device's slowdown now (1: none) */
    int check_every_all;       /* the policy's cadence, known on every rank */
    char *hostnames;           /* rank 0: [world_size][MAL_HOSTNAME_LEN] */
    double *rates;             /* rank 0: [world_size] latest straggling rates */
    struct mal_policy *policy; /* rank 0 */
    mal_linkprobe link;        /* the per-link monitor (linkprobe.h) */
} mal_monitor;

/* Collective over the world: the probe, the node names (rank 0) and the
 * policy (rank 0), for the plan in force.  _fini (local) frees them and
 * stops an injected device slowdown; after a failed _init too. */
int mal_monitor_init(struct mal_trainer *tr);
void mal_monitor_fini(struct mal_trainer *tr);
/* Local; rank 0 (a no-op elsewhere): the policy's baseline from now on:
 * the plan in force, made for `rates` (NULL: all 1). */
int mal_monitor_set_plan(struct mal_trainer *tr, const double *rates);
/* Local; rank 0 only: the policy's windowed mean rate of every rank, into
 * rates[world_size] (what a re-plan plans for). */
void mal_monitor_mean_rates(const struct mal_trainer *tr, double *rates);

/* Local, at the start of step `step`: this rank's injection for it (a
 * stretch factor, or with --inject-mode gpu the device's slowdown). */
int mal_inject_begin_step(struct mal_trainer *tr, int64_t step);
/* Local: stretch `dt` seconds of compute just measured by the step's
 * injection factor (sleeping the difference); returns the stretched time. */
double mal_inject_stretch(struct mal_trainer *tr, double dt);
/* Local.  --inject-link: a message with rank `peer` that took `dt`
 * seconds (or, peer < 0, the TP all-reduces when `peer` is -1, the
 * gradient sum when -2) is made to take this step's factor times that:
 * sleeps the difference; returns the stretched time. */
double mal_inject_link_stretch(struct mal_trainer *tr, int peer, double dt);
/* Local.  --inject-link: a round trip of the link monitor's probe with
 * rank `peer` (two messages over the link) that took `dt` seconds is made
 * to take this step's factor of the link times that (sleeping the
 * difference); returns the stretched time. */
double mal_inject_link_probe(struct mal_trainer *tr, int peer, double dt);

/* Local: the probe's device time, seconds. */
double mal_monitor_probe(struct mal_trainer *tr);
/* Collective: rates from the step's gathered probe times (rank 0), the
 * policy's advice, broadcast on check steps, into *st (may be NULL). */
int mal_monitor_observe(struct mal_trainer *tr, mal_step_stats *st);

#endif /* MAL_TRAIN_MONITOR_H */
