/* The training loop as a library: options, set-up (fresh or resumed from a
 * snapshot), one optimizer step at a time, snapshots, metrics and the
 * human-readable log.  malleus-train is a thin shell over this; tests drive
 * it directly.
 *
 * The mathematics follows DESIGN.md's invariant: the global batch of step t
 * is the set of samples (seed, t, position 0..global_batch-1) whatever the
 * micro-batching; the loss and gradient are means over all its tokens. */
#ifndef MAL_TRAIN_H
#define MAL_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "src/config.h"
#include "src/migrate.h"
#include "src/optim.h"
#include "src/plan.h"

/* Straggler injection (tests, demos, benchmarks): rank `rank` is slowed by
 * `factor` during steps [from, to) (0-based; to < 0: forever), in the way
 * mal_train_options.inject_mode says. */
typedef struct {
    int rank;
    double factor;
    int64_t from, to;
} mal_inject;

/* Link injection (tests, benchmarks): every message between ranks a and b
 * takes `factor` times its measured time during steps [from, to) (to < 0:
 * forever), by sleeping (README "Slow links").  The messages: the
 * activations and gradients a stage boundary carries between them, the
 * TP all-reduces of a group holding both, the gradient sum of two
 * pipelines' ranks that hold the same layers, and the link monitor's
 * probe between them (linkprobe.h). */
typedef struct {
    int a, b;
    double factor;
    int64_t from, to;
} mal_inject_link;

/* How injection slows a rank.  SLEEP (the default): its measured compute is
 * stretched by extra sleep proportional to it, so on a shared machine (or
 * a GPU shared by several ranks) the slowed rank takes nothing from the
 * others.  GPU: its device is slowed for real by a co-running busy load at
 * a duty cycle (the kernel table's slowdown; only backends that have one,
 * for machines with a GPU per rank: on a shared GPU it slows every rank
 * there); the monitor's probe then times batches of matmuls that span
 * several periods of the duty cycle. */
enum { MAL_INJECT_SLEEP = 0, MAL_INJECT_GPU = 1 };

/* What a run does when the monitor advises a re-plan. */
enum { MAL_ADAPT_OFF = 0, MAL_ADAPT_RESTART = 1, MAL_ADAPT_ONLINE = 2 };
enum { MAL_PRECISION_AUTO = 0, MAL_PRECISION_FP32 = 1, MAL_PRECISION_BF16 = 2 };

/* The kernel dtype of a MAL_PRECISION_* (MAL_DTYPE_AUTO for AUTO). */
static inline mal_dtype mal_precision_dtype(int precision)
{
    return precision == MAL_PRECISION_FP32   ? MAL_F32
           : precision == MAL_PRECISION_BF16 ? MAL_BF16
                                             : MAL_DTYPE_AUTO;
}

/* mal_trainer_run's positive returns: stopped with a snapshot because the
 * monitor advised a re-plan (--adapt restart); stopped at a step boundary
 * because a signal asked for it (train/preempt.h), with a snapshot of that
 * step when there is a snapshot_dir. */
#define MAL_TRAIN_REPLAN 1
#define MAL_TRAIN_STOPPED 2

typedef struct {
    mal_model_config model;
    mal_optim_config optim;
    uint64_t seed;
    int64_t steps;          /* train until this many steps are done */
    int global_batch;       /* sequences per optimizer step */
    int micro_batch;        /* sequences per forward/backward (a plan's own
                             * micro_batch_size wins; see plan) */
    const mal_plan *plan;   /* layout; NULL: uniform dp x tp x pp below */
    int dp, tp, pp;         /* uniform layout when plan is NULL (0 means 1) */
    mal_comm *world;        /* all ranks; NULL: one process without MPI */
    const char *data_path;  /* NULL: the built-in corpus */
    int data_format;        /* MAL_DATA_AUTO / LLMC / RAW16 / RAW32 / MEGATRON */
    int data_sampling;      /* MAL_DATA_SAMPLE_*: DEFAULT = epochs for token files */
    double val_fraction;    /* > 0: this share of every --data file is held out for
                             * validation (never trained on) and is the validation data */
    const char *snapshot_dir;  /* NULL: no snapshots */
    int snapshot_every;     /* steps between snapshots (0: only at the end) */
    int keep_snapshots;     /* retention: newest N kept (0: all) */
    int snapshot_async;     /* periodic snapshots written in the background while
                             * training goes on (mal_trainer_save_background) */
    int resume;             /* continue from the newest committed snapshot in snapshot_dir */
    int64_t resume_from;    /* with resume: from the snapshot of this step instead (a
                             * rollback; -1, the default: the newest) */
    const char *init_from;  /* a new run whose parameters are read from this snapshot or
                             * Hugging Face checkpoint directory (train/init_from.h: the
                             * fine-tuning path; not with resume); NULL: drawn at random */
    int overwrite_snapshots; /* snapshots in snapshot_dir that the run would bury or write
                              * again (another run's; with resume_from, those after it) are
                              * removed at start instead of refusing the run */
    const char *overrides;  /* KEY[,KEY]: settings a resume may change from the
                             * snapshot's (train/resume.h); NULL: none */
    int decay_steps_given;  /* optim.total_steps was asked for: with resume, more steps
                             * than the snapshot's keep that schedule */
    const char *events_path; /* rank 0 appends resumes, overrides and stops (NULL: none) */
    const char *metrics_path;  /* JSON lines, one per step; NULL: none */
    int threads;            /* BLAS threads (0: leave the default) */
    const char *device;     /* kernel backend by name (kernels.h registry; NULL: the
                             * default for this build and machine) */
    int precision;          /* MAL_PRECISION_*: compute dtype of activations and working
                             * weights (AUTO: the backend's default, bf16 on GPUs) */
    const char *comm;       /* communication backend by name, the data plane (comm.h
                             * registry; NULL: the default for the device) */
    int dp_overlap;         /* data-parallel gradient sum overlapped with the backward
                             * pass in buckets (1, the default) or after it (0) */
    double dp_bucket_mb;    /* bucket size in MiB (default 25; 0: a bucket per layer) */
    int zero;               /* 1: the sharded optimizer (ZeRO-1, gradsync.h): each rank
                             * keeps the Adam moments of its region of every holder
                             * set only; the gradients are reduce-scattered (in the
                             * buckets of dp_overlap, or after the backward pass);
                             * snapshots write each rank's share; an online plan
                             * change gathers the moments whole.  0: every holder
                             * keeps whole moments.  -1 (the default): 1 where the
                             * plan has more than one pipeline, else 0 */
    int zero_master;        /* 1 (--zero-master on): with zero, the fp32 master is
                             * sharded too where a separate working copy exists
                             * (gradsync.h, mal_gradsync_zero_master); 0: whole on
                             * every holder; -1 (the default): as zero */
    int recompute;          /* activation recomputation (mal_recompute, plan.h) for
                             * every stage, overriding the plan's; -1 (the
                             * default): each stage's plan field (none unless the
                             * plan says) */
    int log_every;          /* print a step line every N steps (0: never) */
    double peak_tflops;     /* one device's peak TFLOP/s for MFU (0: the table of known
                             * devices, else no MFU) */

    /* straggler monitor and adaptation */
    const mal_inject *inject;  /* [n_inject] */
    int n_inject;
    int inject_mode;           /* MAL_INJECT_*: how (SLEEP) */
    const mal_inject_link *inject_links; /* [n_inject_links] */
    int n_inject_links;
    int adapt;                 /* MAL_ADAPT_* */
    int check_every, window;   /* policy cadence K and window W (0: defaults 3, 2) */
    int persist;               /* checks a move must be seen at (0: default 1) */
    double change_cost;        /* what a plan change costs, seconds (< 0: measured at the
                                * last change, else estimated; 0: every change pays) */
    double gap, threshold, noise_floor; /* policy (0: defaults 0.3, 1.2, 1.2) */
    int probe_n;               /* probe matmul size (0: default 192) */
    int link_probe_every;      /* the link monitor's ping-pong every N steps (0: never;
                                * mal_train_defaults: 20) */
    int link_probe_bytes;      /* its message size (0: 64 KiB) */
    double link_noise_floor;   /* link rates below count as 1.0 (0: default 2.0) */
    double link_gap;           /* a link rate moved by 2^gap times (0: default 1) */
    int ranks_per_node;        /* for the planner (0: all ranks on one node) */
    double device_memory_mb;   /* for the planner (0: 16384) */
    const char *profile;       /* planner profile: preset name or JSON file (NULL: derived) */
    double planner_time_limit; /* seconds the online planner searches (0: default 5,
                                * MAL_REPLAN_ONLINE_TIME_LIMIT; < 0: no limit) */
    const double *plan_rates;  /* [world] rates the given plan was made with (NULL: all 1) */

    /* validation and samples (train/eval.c) */
    const char *val_data_path; /* NULL: the built-in corpus's held-out part (only when
                                * training on the built-in corpus) */
    int val_data_format;       /* as data_format */
    int eval_every;            /* validation loss every N steps and at the end (0: never) */
    int eval_batches;          /* validation batches of global_batch sequences (0: 4) */
    int eval_only;             /* mal_trainer_run reports the validation loss, trains nothing */
    int sample_every;          /* rank 0 prints a sample every N steps (0: never) */
    const char *sample_prompt; /* its prompt (NULL: "\n"; token ids when not byte-level) */
} mal_train_options;

enum { MAL_EVAL_BATCHES_DEFAULT = 4, MAL_SAMPLE_EVERY_TOKENS = 64 };

/* Defaults for everything but the model (which the caller loads). */
mal_train_options mal_train_defaults(void);

typedef struct mal_trainer mal_trainer;

/* A rank's times of one step (README "--metrics" says what each is on a
 * GPU): compute_s the synchronised passes and optimizer less their TP time;
 * tp_s the TP all-reduces as the data plane measures them
 * (mal_comm_dp_elapsed: device time with NCCL); pp_s, dp_s host time in
 * pipeline transfers and the gradient sum. */
typedef struct {
    double compute_s, tp_s, pp_s, dp_s, step_s;
    double dp_wait_s;    /* of dp_s: the gradient sum's time after the backward pass
                          * (the whole sum with --dp-overlap off; the waits for the
                          * buckets still in flight with it on) */
    double probe_s;      /* the monitor's probe: device time (the rate's numerator) */
    double probe_cost_s; /* wall time the monitor cost this step */
    double link_cost_s;  /* of it, the link monitor's ping-pongs (0: none this step) */
    double mem_bytes;    /* memory in use after the step: the device's, or the
                          * process's resident memory on CPU backends */
    double mem_peak_bytes; /* the most bytes of the kernel table's buffers this rank
                            * held at once so far (the memory accountant, kernels.h) */
} mal_rank_times;

typedef struct {
    int64_t step;      /* steps completed after this one (1-based) */
    double loss;       /* mean loss over the global batch */
    float lr;
    double grad_norm;  /* before clipping */
    double step_s;     /* wall time of the step */
    double compute_s;  /* this rank's time in kernels (synchronised) */
    double tokens_per_s;
    mal_rank_times *ranks; /* per-rank times (rank 0 only; else NULL), owned by the trainer */
    int slowest_rank;      /* rank with the most compute time (rank 0 only) */
    const double *rates;   /* straggling rate of every rank (rank 0 only) */
    int link_probe;        /* the link monitor probed at this step (all ranks) */
    int replan;            /* the monitor advised a re-plan at this step (all ranks) */
    int trigger_rank;      /* the rank that triggered it (-1: none) */
    int has_val;           /* val_loss was measured after this step (mal_trainer_run) */
    double val_loss;       /* validation loss of the parameters after this step */
    int stop_signal;       /* a stop request reached every rank in this step (all ranks):
                            * the signal of this rank's request, else SIGUSR1 when some
                            * rank's was SIGUSR1, else -1; 0: none (train/preempt.h) */
} mal_step_stats;

/* Collective over opts->world.  Validate options and the plan, load data,
 * build this rank's part of the model, its communicators, pipeline buffers
 * and gradient-sync groups; with opts->resume,
 * restore the full state from the newest snapshot in opts->snapshot_dir
 * (refusing one written for another model, seed or global batch).  Nothing
 * on disk is written or truncated here.
 *
 * Failures: the checks of options, plan, data and memory are agreed among
 * the ranks (a rank that fails alone makes every rank return its error), so
 * the caller may simply exit with mal_exit_status(rc) on every rank; a
 * failure while building the part, inside collectives, takes the fatal
 * path (mal_trainer_fatal). */
int mal_trainer_create(mal_trainer **out, const mal_train_options *opts);
void mal_trainer_destroy(mal_trainer *tr);

/* Collective over the world.  One optimizer step over the global batch;
 * the loss and gradient norm in *st are global (same on every rank). */
int mal_trainer_step(mal_trainer *tr, mal_step_stats *st);

/* Local.  The fatal path of a job of several ranks: after an error that
 * may be this rank's alone (peers may be blocked in a collective it will
 * never join), log it with the rank and end the whole job through the comm
 * table's abort (mal_comm_abort: MPI_Abort now; a data-plane backend also
 * aborts its device communicators) with exit status mal_exit_status(rc).
 * Does not return then.  A one-rank run (or rc 0) returns rc. */
int mal_trainer_fatal(mal_trainer *tr, int rc);

/* Collective over the world.  Write a snapshot of the full state now
 * (needs snapshot_dir) and return once it is committed: every rank writes
 * the blocks it owns.  A background write in flight is waited for first
 * (its failure is returned instead). */
int mal_trainer_save(mal_trainer *tr);
/* The same into another directory. */
int mal_trainer_save_to(mal_trainer *tr, const char *dir);

/* Collective over the world.  An asynchronous snapshot: wait for a
 * background write in flight (one at a time), copy this rank's blocks of
 * the state from the device into pinned host staging buffers through the
 * kernel table, start a thread that writes and commits them exactly as
 * mal_trainer_save would (the same files, the same commit protocol; its
 * collective parts on the trainer's own duplicate of the world), and
 * return: the caller trains on.  The write's outcome comes back from
 * mal_trainer_snapshot_poll or _wait, which every rank must call until it
 * is collected (mal_trainer_run polls after every step; a plan change,
 * mal_trainer_save and mal_trainer_destroy wait).
 *
 * The writer thread calls MPI, so a job of several ranks needs the
 * communication layer started with MAL_COMM_THREADS_MANY
 * (mal_comm_init_threads); without it, and in a trainer created without
 * opts->snapshot_async, this is mal_trainer_save (with a warning in the
 * first case).  Returns a failure of the write in flight or of staging,
 * the same on every rank. */
int mal_trainer_save_background(mal_trainer *tr);

/* Collective over the world, at the same point on every rank (e.g. after
 * each step).  With no background write in flight: *busy = 0, returns 0.
 * While any rank's writer is still at work: *busy = 1, returns 0.  Once
 * every rank's writer has finished: collects it (*busy = 0) and returns
 * its result, the same code on every rank (a failure carries the failing
 * rank's message). */
int mal_trainer_snapshot_poll(mal_trainer *tr, int *busy);

/* Collective over the world.  Wait for the background write in flight, if
 * any, and return its result as mal_trainer_snapshot_poll does. */
int mal_trainer_snapshot_wait(mal_trainer *tr);

/* What the last snapshot collected cost this rank. */
typedef struct {
    int64_t step;          /* its step (-1: none yet) */
    int background;        /* 1: written by the background writer */
    double stall_s;        /* time the caller was held: the whole write when
                            * synchronous; else waiting for the previous
                            * one, staging and starting the writer */
    double stage_s;        /* of which the device -> pinned host copy */
    double write_s;        /* the write itself, begin to commit */
    double bytes;          /* this rank's bytes of state written */
    int steps_overlapped;  /* polls that found it still in flight */
} mal_snapshot_stats;
/* Local. */
void mal_trainer_snapshot_stats(const mal_trainer *tr, mal_snapshot_stats *out);

/* Local.  Print the start-up table to `f`. */
void mal_trainer_print_summary(const mal_trainer *tr, FILE *f);

/* Collective.  Train until opts->steps: log lines and metrics (rank 0),
 * periodic and final snapshots.  A failure that every rank agrees on (a
 * snapshot that cannot be written, the metrics file rank 0 cannot open) is
 * returned on every rank; any other (a step failing on one rank) takes the
 * fatal path (mal_trainer_fatal). */
int mal_trainer_run(mal_trainer *tr);

int64_t mal_trainer_steps_done(const mal_trainer *tr);
/* Local.  The exit status for error `rc` of this trainer (tr may be NULL):
 * mal_exit_status(rc), except that bad input found after steps were
 * trained is 1, not 2 (which promises that nothing was written). */
int mal_trainer_exit_status(const mal_trainer *tr, int rc);
/* This rank's part of the model (NULL on a suspended rank). */
struct mal_model *mal_trainer_model(mal_trainer *tr);
/* The plan in force. */
const mal_plan *mal_trainer_plan(const mal_trainer *tr);

/* Collective.  Plan anew for the rates the monitor measured and move the
 * state onto the new plan inside the job (what --adapt online does when the
 * monitor advises it).  No change when the planner keeps the layout, or
 * when the gain it predicts over the remaining steps does not exceed what
 * the change costs (train/change.c); either way the measured rates become
 * the monitor's new baseline. */
int mal_trainer_replan_online(mal_trainer *tr);

/* Collective.  Move the running job onto plan `next` (same on every rank):
 * state migrates rank to rank, training continues at the next step. */
int mal_trainer_change_plan(mal_trainer *tr, const mal_plan *next);

/* Online plan changes so far, and the bytes of state the last one moved
 * between ranks and left in place (whole job). */
int mal_trainer_migrations(const mal_trainer *tr, double *moved, double *kept);

/* Where the last online plan change spent its time, on this rank (seconds). */
typedef struct {
    double total;  /* the whole change, as this rank saw it */
    double build;  /* allocating the new part */
    double move;   /* posting, packing, copying and receiving this rank's pieces */
    double wait;   /* waiting for the other ranks to finish theirs */
    double wire;   /* communicators and buffers of the new plan */
    double bytes_sent, bytes_received, bytes_kept; /* this rank's own */
    double started; /* mal_now() when this rank entered the change */
    int handed_over; /* 1: the part kept its layout and its state buffers (no copy) */
} mal_migration_times;
/* Local.  Zeroes when there was none. */
void mal_trainer_migration_times(const mal_trainer *tr, mal_migration_times *out);

/* Collective.  Number of elements of parameters and Adam moments whose
 * copies on different data-parallel replicas are not bitwise identical. */
int mal_trainer_replica_mismatch(mal_trainer *tr, double *count);

/* Local.  Buckets of this rank's overlapped gradient sum (0 with
 * --dp-overlap off, on a suspended rank, or where nothing is replicated);
 * *posted_early (may be NULL): how many the last step posted during its
 * backward pass. */
int mal_trainer_dp_buckets(const mal_trainer *tr, int *posted_early);


/* Collective.  Validation loss of the current parameters: the mean
 * per-token loss over the first eval_batches x global_batch sequences of
 * the validation data's fixed stream (data.h, MAL_DATA_VAL_SEED), computed
 * by forward passes through this plan's pipelines; the same for every plan
 * and rank count up to float summation order.  Needs validation data (set
 * up when eval_every, eval_only or val_data_path is given). */
int mal_trainer_evaluate(mal_trainer *tr, double *loss);
int mal_trainer_eval_batches(const mal_trainer *tr);

struct mal_sample_options;
/* Collective.  Generate n_new tokens after prompt[0..n_prompt) with the
 * current parameters (forward passes on pipeline 0; sample.h's choice of
 * each token); every rank receives the same out[0 .. n_prompt+n_new). */
int mal_trainer_sample(mal_trainer *tr, const int *prompt, int n_prompt, int n_new,
                       const struct mal_sample_options *so, int *out);

struct mal_link_figures;
/* Local.  Measure a planner profile of `cfg` on kernel instance k (one
 * layer's forward + backward per TP size up to nominal_tp, memory from the
 * runtime's own layout) and write it as JSON to f (replan/README.md), with
 * the job's link figures `links` measured before (linkprobe.h; NULL or
 * no pairs: none). */
int mal_profile_measure(mal_kern k, const mal_model_config *cfg, int micro_batch, int nominal_tp,
                        const struct mal_link_figures *links, FILE *f);

/* Local.  The kernel instance the trainer computes on (owned by it). */
mal_kern mal_trainer_kernels(const mal_trainer *tr);

#endif /* MAL_TRAIN_H */
