/* Internal state of the trainer layer (train/): the trainer assembled from
 * its components.  Each declares its state and functions in a header of its
 * own, next to its code, and initialises and finalises that state itself
 * (_init / _fini):
 *
 *   part.h        this rank's share of the plan: its place, model part,
 *                 communicators, gradient sync (part.c)
 *   pipeline.h    the 1F1B schedule's buffers and a pass through them (pipeline.c)
 *   monitor.h     probe, rates, the policy's advice, injection (monitor.c)
 *   online.h      the record of online plan changes (online.c)
 *   eval.h        validation data and the best loss so far (eval.c)
 *   ckpt.h        snapshots: the last one taken, save, resume (ckpt.c),
 *   ckpt_async.h    over the background writer (ckpt_async.c),
 *   ckpt_job.h      both over one snapshot described and written (ckpt_job.c)
 *   resume.h      what a snapshot says about its run, the check of a resumed run
 *                 against it, the metrics and events files of a run (resume.c)
 *   progress.h    the step line, the plan in force and its changes (progress.c)
 *   change.h      whether a plan change pays, and acting on the monitor's
 *                 advice (change.c)
 *
 * What is left here is train.c's: options, data, kernels, plan, world,
 * progress, the metrics file and the step's tally, which the files that
 * spend the step's time add to.  A file reads another component's fields
 * where a function would say no more (the model part and this rank's
 * place, the pipeline's staging, the monitor's rates and node names) and
 * changes them only through that component's functions; online.c replaces
 * the plan in force.
 *
 * Calls go one way (a -> b: a calls b):
 *   train -> online -> part -> pipeline -> monitor
 *   train -> eval -> pipeline;  train, online -> monitor
 *   train -> ckpt -> ckpt_async -> ckpt_job;  ckpt -> ckpt_job
 *   train, online -> ckpt_async (waiting for a background write, and its
 *   staging re-sized after a plan change);  train_memory -> ckpt_job
 *   train, ckpt -> resume;  ckpt_job -> resume (the settings a snapshot
 *   stores);  train -> preempt (the stop requests, process-wide)
 *   train -> change -> online;  train, change, online -> progress
 * Not installed. */
#ifndef MAL_TRAIN_INTERNAL_H
#define MAL_TRAIN_INTERNAL_H

#include <stdio.h>

#include "change.h"
#include "ckpt.h"
#include "ckpt_async.h"
#include "ckpt_job.h"
#include "comm/comm.h"
#include "eval.h"
#include "monitor.h"
#include "online.h"
#include "part.h"
#include "pipeline.h"
#include "resume.h"
#include "progress.h"
#include "src/data.h"
#include "src/plan.h"
#include "train.h"

/* Time spent per category during one step, seconds. */
typedef struct {
    double compute; /* kernels (synchronised), excluding TP all-reduce inside them */
    double tp;      /* tensor-parallel all-reduce: the data plane's measure
                     * (mal_comm_dp_elapsed; device time on NCCL) */
    double pp;      /* waiting for pipeline sends / receives */
    double dp;      /* data-parallel gradient sync and step-wide reductions */
    double dp_wait; /* of dp: the gradient sum after the backward pass */
} mal_step_times;

/* What the step in progress adds up (train.c resets it at the start of
 * each step; part.c, pipeline.c and eval.c add to it), and every rank's
 * times of the last one. */
typedef struct {
    mal_step_times times;
    double loss_local;          /* sum of per-token losses computed here this step */
    mal_rank_times *rank_times; /* rank 0: [world_size] gathered each step */
} mal_step_tally;

struct mal_trainer {
    mal_train_options o;
    mal_data *data;
    mal_kern k;            /* the kernel instance (owned): every device buffer's */
    const char *comm_name; /* the data plane's backend */

    /* layout */
    mal_plan plan;
    int world_rank, world_size;
    mal_comm *world; /* the trainer's own duplicate of the caller's world, whose
                      * data plane is comm_name (NULL only for a one-rank run
                      * without MPI) */

    /* progress and output */
    int64_t step;
    FILE *metrics;
    mal_step_tally tally;

    /* the components */
    mal_train_part part;
    mal_pipeline pipe;
    mal_monitor mon;
    mal_online online;
    mal_train_ckpt ckpt;
    mal_eval eval;
    mal_train_resume resume;
    mal_progress prog;
};

/* train_memory.c: collective over the world: MAL_EINVAL, with the
 * numbers, when the largest part of tr->plan needs more memory than a
 * rank's share of its machine (physical memory or cgroup limit / ranks on
 * the node); made before any part is allocated. */
int mal_trainer_check_memory(struct mal_trainer *tr);

/* The recompute mode (mal_recompute) of stage `stage` of pipeline `pipe`
 * of `plan`: --recompute where given, else the stage's plan field. */
static inline int mal_trainer_recompute(const struct mal_trainer *tr, const mal_plan *plan,
                                        int pipe, int stage)
{
    return tr->o.recompute >= 0 ? tr->o.recompute : plan->pipelines[pipe].stages[stage].recompute;
}

/* What the trainer's pooled communicators are for (comm_pool.h). */
enum { MAL_POOL_TP = 1 };

#endif /* MAL_TRAIN_INTERNAL_H */
