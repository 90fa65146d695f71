/* Internal state of the trainer layer (train/), shared by its files:
 * train.c (set-up, step, run, output), part.c (this rank's share of a
 * plan), pipeline.c (the 1F1B schedule), monitor.c (probe, rates, policy,
 * injection), online.c (online re-planning), ckpt.c (snapshot glue),
 * ckpt_async.c (its background writer) and profile_measure.c.  Calls
 * between them go one way: train -> online -> part -> pipeline -> monitor,
 * train -> ckpt and ckpt_async, which call each other (a synchronous save
 * waits for the background writer; the writer writes through ckpt.c);
 * online waits for a background snapshot.  Not installed. */
#ifndef MAL_TRAIN_INTERNAL_H
#define MAL_TRAIN_INTERNAL_H

#include <stdio.h>

#include "ckpt/reshard.h"
#include "ckpt/snapshot.h"
#include "comm/comm.h"
#include "comm/comm_pool.h"
#include "src/data.h"
#include "src/gradsync.h"
#include "src/model.h"
#include "src/plan.h"
#include "train.h"

/* Time spent per category during one step, seconds. */
typedef struct {
    double compute; /* kernels (synchronised), excluding TP all-reduce inside them */
    double tp;      /* tensor-parallel all-reduce */
    double pp;      /* waiting for pipeline sends / receives */
    double dp;      /* data-parallel gradient sync and step-wide reductions */
    double dp_wait; /* of dp: the gradient sum after the backward pass */
} mal_step_times;

struct mal_trainer {
    mal_train_options o;
    mal_data *data;
    mal_kern k;                /* the kernel instance (owned): every device buffer's */
    const char *comm_name;     /* the data plane's backend */

    /* layout */
    mal_plan plan;
    mal_plan_loc loc;          /* where this rank sits; loc.pipeline < 0: suspended */
    int world_rank, world_size;
    mal_comm *world;           /* the trainer's own duplicate of the caller's world, whose
                                * data plane is comm_name (NULL only for a one-rank run
                                * without MPI) */
    mal_comm *tp;              /* this stage's TP group (NULL when tp_size 1; pool's) */
    mal_comm_pool *pool;       /* every group communicator, kept across plan changes */
    int n_stages, n_micro;     /* of this rank's pipeline */
    int first_sample;          /* global batch position of the pipeline's first sample */
    const int *prev_ranks, *next_ranks; /* neighbouring stages' TP groups (NULL at the ends) */
    int n_prev, n_next;

    /* model and activations (active ranks only) */
    mal_model *model;
    int n_slots;               /* micro-batches in flight on this stage */
    mal_acts **acts;           /* [n_slots] */
    void *grad_recv;           /* (N,C) gradient from the next stage (compute dtype) */
    void **grad_send;          /* [n_slots] (N,C) copies of input gradients in flight */
    mal_comm_req ***send_reqs; /* [n_slots][max fan-out] pending activation sends */
    mal_comm_req ***gsend_reqs;/* [n_slots][max fan-out] pending gradient sends */
    int max_fanout;
    int *inputs, *targets;     /* host staging for one micro-batch */

    /* data-parallel sync */
    mal_gradsync *gsync;      /* (active ranks only) */
    mal_comm *sync_world;     /* all ranks: the sync groups' messages (own) */

    /* progress and output */
    int64_t step;
    int64_t saved_step;
    FILE *metrics;
    mal_step_times times;
    double loss_local;         /* sum of per-token losses computed here this step */
    mal_rank_times *rank_times; /* [world_size] gathered at rank 0 each step */

    /* straggler monitor (monitor.c) */
    int probe_n;
    void *probe_a, *probe_w, *probe_out;
    mal_kern_event *probe_ev[2];
    double inject_now;         /* injection factor of the current step (1: none) */
    double slow_rate;          /* --inject-mode gpu: the device's slowdown now (1: none) */
    int probe_reps;            /* matmuls per probe sample (1; more with --inject-mode gpu) */
    int check_every_all;       /* the policy's cadence, known on every rank */
    char *hostnames;           /* rank 0: [world_size][MAL_HOSTNAME_LEN] */
    double *rates;             /* rank 0: [world_size] latest straggling rates */
    struct mal_policy *policy; /* rank 0 */
    int no_init;               /* build parts without initialising parameters */
    int migrations;            /* online plan changes so far */
    double migrated_bytes;     /* bytes moved by the last one (all ranks together) */
    double kept_bytes;         /* bytes of state the last one left in place */
    mal_migration_times mig_times; /* this rank's breakdown of the last one */

    /* snapshots (ckpt.c, ckpt_async.c) */
    struct mal_ckpt_async *async; /* the background writer (NULL: synchronous only) */
    mal_snapshot_stats snap_stats; /* the last snapshot collected */

    /* validation (eval.c) */
    mal_data *val;             /* validation data (NULL: no evaluation) */
    double best_val;           /* best validation loss of this run so far */
    int64_t best_val_step;     /* its step (-1: none yet) */
};

#define MAL_HOSTNAME_LEN 64

/* pipeline.c: run this rank's part of the 1F1B schedule for step `step`.
 * Collective over the pipeline (and TP groups). */
int mal_pipeline_run(struct mal_trainer *tr, int64_t step, float dscale);

/* What a pass through the pipeline reads: load() fills tr->inputs and
 * tr->targets (B sequences of T tokens) for micro-batch mb of this rank's
 * pipeline (called on its first and last stages). */
typedef struct mal_pass {
    int (*load)(struct mal_trainer *tr, const struct mal_pass *pass, int mb, int B, int T);
    int64_t step;    /* for load: the training step */
    const void *ctx; /* for load */
} mal_pass;

/* pipeline.c: forward passes only (no gradients) of micro-batches
 * 0 .. n_micro-1 of `pass` through this rank's pipeline; the last stage
 * adds each one's per-token loss sum to tr->loss_local and leaves its
 * logits in tr->acts[mb % tr->n_slots].  Collective over the pipeline (and
 * TP groups). */
int mal_pipeline_forward_only(struct mal_trainer *tr, const mal_pass *pass, int n_micro);
int mal_pipeline_setup(struct mal_trainer *tr);
void mal_pipeline_teardown(struct mal_trainer *tr);

/* part.c: (re)building this rank's share of the run for tr->plan. */
int mal_trainer_build_part(struct mal_trainer *tr);   /* local */
int mal_trainer_wire_part(struct mal_trainer *tr);    /* collective */
void mal_trainer_unwire_part(struct mal_trainer *tr); /* local */

/* monitor.c: probe, rates, policy advice, injection. */
int mal_monitor_setup(struct mal_trainer *tr);          /* collective */
int mal_monitor_set_plan(struct mal_trainer *tr, const double *rates); /* rank 0 */
void mal_monitor_teardown(struct mal_trainer *tr);
double mal_monitor_probe(struct mal_trainer *tr);        /* local, seconds */
int mal_monitor_observe(struct mal_trainer *tr, mal_step_stats *st); /* collective */
double mal_inject_factor(const struct mal_trainer *tr, int64_t step);
double mal_inject_stretch(struct mal_trainer *tr, double dt);

/* eval.c: open / release the validation data (local). */
int mal_eval_setup(struct mal_trainer *tr);
void mal_eval_teardown(struct mal_trainer *tr);
/* eval.c, for mal_trainer_run (collective): the validation loss into *st
 * when --eval-every makes it due (or at the last step); a sample printed
 * by rank 0 when --sample-every makes it due; --eval-only's whole run; the
 * end-of-run line on the best validation loss (rank 0, local). */
int mal_eval_after_step(struct mal_trainer *tr, mal_step_stats *st);
int mal_sample_after_step(struct mal_trainer *tr, const mal_step_stats *st);
int mal_eval_only(struct mal_trainer *tr);
void mal_eval_summary(const struct mal_trainer *tr);

/* ckpt.c: write a snapshot of the state now (after waiting for a
 * background write in flight) / restore from the newest one in
 * o.snapshot_dir (collective). */
int mal_train_ckpt_save(struct mal_trainer *tr);
int mal_train_ckpt_restore(struct mal_trainer *tr);

/* ckpt.c: one snapshot as its writer sees it - what this rank writes and
 * the meta, copied out of the trainer so that a thread can write it while
 * the trainer moves on.  Block k is state group k / n_owned of owned piece
 * k % n_owned. */
typedef struct {
    char *dir;                /* the snapshot directory (owned) */
    int keep;                 /* retention (--keep) */
    mal_snap_meta meta;       /* step, progress, config, settings, plan (strings owned) */
    int shard;                /* the shard file's id: the world rank */
    mal_owned_block *owned;   /* [n_owned]: the pieces this rank writes */
    int n_owned;
    int n_blocks;             /* MAL_STATE_N_SAVED x n_owned */
    mal_snap_tensor *blocks;  /* [n_blocks]; names point into `names`, data unused */
    char (*names)[80];
    size_t *offset;           /* [n_blocks]: floats before block k, back to back */
    size_t floats, max_block; /* all blocks' floats, the largest block's */
    int local_rc;             /* a failure while preparing: the write reports it on
                               * every rank (every rank still takes part) */
    char local_msg[1024];
} mal_ckpt_job;

/* Local.  Describe the snapshot of the current state into `dir` (never
 * fails: a failure is kept in job->local_rc). */
void mal_ckpt_job_prepare(const struct mal_trainer *tr, const char *dir, mal_ckpt_job *job);
void mal_ckpt_job_fini(mal_ckpt_job *job);

/* Collective over `comm` (NULL: one process): write and commit `job`.
 * The data of block k is read from `staged` + job->offset[k] (host memory:
 * the background writer, which never touches the kernel table) or, with
 * staged NULL, packed from model m's state through its kernel table one
 * block at a time (synchronous).  out_path receives the step directory. */
int mal_ckpt_job_write(const mal_ckpt_job *job, mal_comm *comm, mal_model *m,
                       const float *staged, char *out_path, size_t out_len);

/* Local.  Floats rank `rank` of a run under `plan` stages for a snapshot
 * (all groups of the blocks it writes). */
int mal_ckpt_staging_floats(const mal_plan *plan, const mal_model_config *cfg, int rank,
                            size_t *floats);

/* ckpt_async.c: the background writer.  setup (collective; when
 * o.snapshot_async and o.snapshot_dir): its duplicate of the world, HDF5
 * started on this thread, the staging buffers allocated and touched.
 * teardown (collective): wait for a write in flight (a failure nobody
 * collected is logged), free everything. */
int mal_ckpt_async_setup(struct mal_trainer *tr);
void mal_ckpt_async_teardown(struct mal_trainer *tr);
/* Local, after a plan change: the staging buffers re-sized for the blocks
 * this rank writes under the new plan (none on a suspended rank). */
void mal_ckpt_async_plan_changed(struct mal_trainer *tr);

/* train_memory.c: collective over the world: MAL_EINVAL, with the
 * numbers, when the largest part of tr->plan needs more memory than a
 * rank's share of its machine (physical memory or cgroup limit / ranks on
 * the node); made before any part is allocated. */
int mal_trainer_check_memory(struct mal_trainer *tr);

/* What the trainer's pooled communicators are for (comm_pool.h). */
enum { MAL_POOL_TP = 1 };

#endif /* MAL_TRAIN_INTERNAL_H */
