/* What a person watching a run sees (progress.c): the step line's
 * throughput, MFU, memory, elapsed time and ETA; the plan in force (its
 * generation and id) in the log and the metrics; a line at every plan
 * change and, a few steps later, the new plan's measured step time against
 * its prediction; and the step times the re-plan policy weighs a change
 * with.  Not installed. */
#ifndef MAL_TRAIN_PROGRESS_H
#define MAL_TRAIN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#include "src/plan.h"
#include "train.h"

struct mal_trainer;

enum {
    MAL_PROGRESS_RING = 32,  /* step times kept on the plan in force */
    MAL_PROGRESS_SETTLE = 5, /* steps on a new plan before its measured line */
};

/* Owned by progress.c (mal_progress_init; nothing to release). */
typedef struct {
    double flops_per_step;          /* model FLOPs of one step (forward + backward) */
    double peak_flops;              /* one device's peak FLOP/s (0: unknown) */
    char peak_what[128];            /* where it came from, for the start-up table */
    double t0, wall0;               /* mal_now() and the wall clock when the run began */
    int64_t step0;                  /* steps done then */
    double ring[MAL_PROGRESS_RING]; /* rank 0: step times since the plan came into force */
    int64_t n_ring;                 /* steps recorded since then */
    int gen;                        /* plan generation: 0, +1 at every plan change */
    char id[MAL_PLAN_ID_LEN];       /* the plan in force */
    double predicted_s;             /* its predicted step time (seconds; < 0: unknown) */
    int64_t plan_from;              /* the step at which it came into force */
    int settled;                    /* its measured line was printed */
    double change_cost_s;           /* the last plan change's measured cost (s; < 0: none) */
    int change_cost_online;         /* 1: it was an online change, 0: a restart */
} mal_progress;

/* Local.  The FLOP count and the device's peak FLOP rate: --peak-tflops, or
 * the table of known devices (progress.c) by the kernel instance's device
 * name and compute dtype; unknown elsewhere (MFU is then not shown). */
void mal_progress_init(struct mal_trainer *tr);

/* Local (rank 0 reads the metrics file).  The run begins: the clocks
 * start; the plan generation and id in force.  A resumed run takes the
 * generation from the last line of its metrics file (--metrics), and when
 * that line names another plan, this run begins with a plan change made
 * by a restart: its cost, measured from that line's wall-clock time to
 * now (snapshot, re-plan, reshard, restart), is kept for the policy and
 * logged with the old and new plan.  Logs the plan in force. */
void mal_progress_begin(struct mal_trainer *tr);

/* Local, every step, every rank: record the step's wall time (rank 0
 * keeps it for the policy). */
void mal_progress_record(struct mal_trainer *tr, double step_s);

/* Local.  This rank's memory in use, bytes: the device's (a backend with
 * device_info), else the process's resident memory. */
double mal_progress_memory(struct mal_trainer *tr);

/* Local.  The most bytes of the kernel table's buffers this rank held at
 * once so far (the memory accountant). */
double mal_progress_memory_peak(const struct mal_trainer *tr);

/* Collective over the world (the end of a run).  Rank 0 logs every rank's
 * peak of the memory accountant by category (what the rank held when its
 * total peaked). */
int mal_progress_memory_summary(struct mal_trainer *tr);

/* Local, rank 0.  The step line (at --log-every), and the new plan's
 * measured line once it has run MAL_PROGRESS_SETTLE steps. */
void mal_progress_step(struct mal_trainer *tr, const mal_step_stats *st);

/* Local, rank 0.  The fields the metrics line gains (", \"time\": ..."):
 * wall-clock time, plan generation and id, peak memory over the ranks,
 * MFU where the peak is known. */
void mal_progress_metrics(const struct mal_trainer *tr, FILE *f, const mal_step_stats *st);

/* Local, rank 0.  Median of the last n step times on the plan in force
 * (fewer when fewer were recorded; < 0 when none). */
double mal_progress_step_time(const struct mal_trainer *tr, int n);

/* Local, rank 0.  A short description of a plan ("m=4 [0,1:L0-2] [2,3:L2-4]
 * | ...; suspended 3"), cut to len bytes. */
void mal_progress_describe(const mal_plan *plan, char *buf, size_t len);

/* Local, rank 0.  The plan in force changed (tr->plan is the new one) at
 * this step: a new generation, its id and predicted step time
 * (predicted_s < 0: unknown); cost_s (>= 0) is what the change cost, kept
 * for the policy; `online` says how it was made. */
void mal_progress_plan_changed(struct mal_trainer *tr, double predicted_s, double cost_s,
                               int online);

#endif /* MAL_TRAIN_PROGRESS_H */
