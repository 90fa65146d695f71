/* Plan files: the parallel layout of one training run (which ranks form which
 * TP group, which layers each pipeline stage holds, how many micro-batches each
 * pipeline processes, which ranks are suspended).  This is the contract
 * between malleus-train (runs a plan), malleus-replan (writes one) and
 * malleus-reshard (moves a snapshot from one plan to another).
 *
 * JSON schema ("malleus-plan/1"):
 *
 *   { "format": "malleus-plan/1",
 *     "micro_batch_size": 2,
 *     "pipelines": [
 *       { "micro_batches": 6,
 *         "stages": [ { "ranks": [0, 1], "layers": [0, 3] },
 *                     { "ranks": [2],    "layers": [3, 8] } ] },
 *       { "micro_batches": 10,
 *         "stages": [ { "ranks": [3, 4, 5, 6], "layers": [0, 8] } ] } ],
 *     "suspended": [7],
 *     "predicted_step_time": 1.25,          (optional, seconds)
 *     "comment": "free text" }              (optional)
 *
 * "layers" is half-open [start, end) over transformer layers.  A pipeline's
 * first stage also holds the embedding, its last stage the final norm, output
 * projection and loss.  The "ranks" of a stage form its TP group in TP order.
 * A stage may carry "warmup": W, the forwards it runs before its first
 * backward in the 1F1B schedule (default S - j - 1 for stage j of S; an
 * explicit W must be at least that, and no stage may warm up less than the
 * one after it); a deeper warm-up keeps W + 1 micro-batches of
 * activations in flight and hides a slow stage boundary.  The planner
 * writes it only where it differs from the default.
 * A stage may carry "recompute": "none" | "selective" | "full", how it keeps
 * activations for the backward pass (default "none": everything the
 * backward reads is kept; "selective": the norms' outputs and the SwiGLU
 * product are recomputed from the kept matrix products; "full": only each
 * layer's input is kept and the layer's forward runs again before its
 * backward).  The numbers are the same in every mode; memory and time are
 * not.  The planner writes it only where it is not "none".
 * Global batch = micro_batch_size x sum of micro_batches.  A pipeline may
 * carry an optional "predicted_time" (seconds) written by the planner.
 * Unknown keys are rejected so that a misspelt key is not silently ignored.
 */
#ifndef MAL_PLAN_H
#define MAL_PLAN_H

#include <stddef.h>

#define MAL_PLAN_FORMAT "malleus-plan/1"

typedef struct mal_plan_stage {
    int n_ranks;     /* TP size */
    int *ranks;      /* [n_ranks], TP order */
    int layer_begin; /* first layer held */
    int layer_end;   /* one past the last layer held */
    int warmup;      /* 1F1B warm-up forwards; 0: the default S - j - 1 */
    int recompute;   /* mal_recompute: MAL_RECOMPUTE_NONE (0) unless given */
} mal_plan_stage;

/* How a stage keeps activations for its backward pass (see "recompute"
 * above); ordered by memory kept, most first. */
typedef enum mal_recompute {
    MAL_RECOMPUTE_NONE = 0,
    MAL_RECOMPUTE_SELECTIVE = 1,
    MAL_RECOMPUTE_FULL = 2,
} mal_recompute;
#define MAL_RECOMPUTE_COUNT 3

/* The plan-file name of a mode ("none", "selective", "full").  Local. */
const char *mal_recompute_name(int mode);

/* Local.  The mode named `name` into *mode; MAL_EINVAL (message listing the
 * names) otherwise. */
int mal_recompute_parse(const char *name, int *mode);

typedef struct mal_plan_pipeline {
    int micro_batches;
    int n_stages;
    mal_plan_stage *stages; /* [n_stages], in pipeline order */
    double predicted_time;  /* seconds; < 0 when unknown */
} mal_plan_pipeline;

typedef struct mal_plan {
    int micro_batch_size;
    int n_pipelines;
    mal_plan_pipeline *pipelines; /* [n_pipelines] */
    int n_suspended;
    int *suspended;             /* [n_suspended] */
    double predicted_step_time; /* seconds; < 0 when unknown */
    char *comment;              /* optional, NULL when absent */
} mal_plan;

/* Warm-up forwards stage `j` of pipeline `pl` runs before its first
 * backward: its "warmup" or the default S - j - 1, at most its
 * micro-batches.  Local. */
int mal_plan_stage_warmup(const mal_plan_pipeline *pl, int j);

/* Where a rank sits in a plan (see mal_plan_locate). */
typedef struct mal_plan_loc {
    int pipeline; /* -1 when suspended */
    int stage;    /* -1 when suspended */
    int tp_rank;  /* position in the stage's TP group; -1 when suspended */
    int tp_size;  /* 0 when suspended */
} mal_plan_loc;

/* Caller-owned storage.  mal_plan_init() makes an empty plan (no pipelines,
 * unknown predicted times); mal_plan_fini() frees everything the plan owns and
 * leaves it empty.  Local. */
void mal_plan_init(mal_plan *plan);
void mal_plan_fini(mal_plan *plan);

/* Allocate `n_pipelines` empty pipelines (replacing any present) / `n_stages`
 * empty stages of pipeline `p` / the rank array of one stage.  Arrays are
 * zero-filled and owned by the plan.  Local. */
int mal_plan_alloc_pipelines(mal_plan *plan, int n_pipelines);
int mal_plan_alloc_stages(mal_plan *plan, int p, int n_stages);
int mal_plan_set_stage(mal_plan *plan, int p, int s, int n_ranks, const int *ranks, int layer_begin,
                       int layer_end);
int mal_plan_set_suspended(mal_plan *plan, int n, const int *ranks);

/* Deep copy of `src` into `dst` (which is initialised here; fini it later).
 * Local. */
int mal_plan_copy(mal_plan *dst, const mal_plan *src);

/* Parse a plan from a JSON string / file into `plan` (initialised here; the
 * caller fini's it, also after a failure).  `what` names the source in error
 * messages (e.g. a path).  Checks the structure and types only; call
 * mal_plan_validate() for the layout rules.  Local. */
int mal_plan_parse_string(mal_plan *plan, const char *json, const char *what);
/* The same on `len` bytes that need no terminating NUL (fuzzing entry). */
int mal_plan_parse_buffer(mal_plan *plan, const char *buf, size_t len, const char *what);
/* The file is read whole through the bounded reader (base/json.h): a
 * directory, a device or a FIFO is MAL_EINVAL, a missing file MAL_ENOENT. */
int mal_plan_read(mal_plan *plan, const char *path);

/* Serialise a plan.  mal_plan_to_string() returns a malloc'ed, NUL-terminated
 * string (caller frees) in a stable layout: the same plan always gives the same
 * bytes.  mal_plan_write() writes the file through mal_output (fileio.h):
 * atomically for a regular file (temporary file, fsync, rename, fsync of the
 * directory), directly into a device, FIFO or socket.  Local. */
int mal_plan_to_string(const mal_plan *plan, char **out);
int mal_plan_write(const mal_plan *plan, const char *path);

/* Check every layout rule; returns 0, or MAL_EINVAL with a message naming the
 * offending field (e.g. "pipelines[1].stages[0].ranks: TP size 3 is not a
 * power of two"):
 *   - micro_batch_size >= 1; at least one pipeline; every pipeline has stages;
 *   - every rank in [0, world_size) appears exactly once, in one stage or in
 *     "suspended"; no rank outside that range;
 *   - every TP size is a power of two that divides n_heads and ffn_hidden;
 *   - each pipeline covers layers [0, n_layers) contiguously with non-empty
 *     stages;
 *   - micro_batches >= the pipeline's stage count;
 *   - a stage's "warmup", where given, >= S - j - 1 and >= the next stage's;
 *   - micro_batch_size x sum(micro_batches) == global_batch.
 * Comparing world_size with the MPI world is the caller's job.  Local. */
int mal_plan_validate(const mal_plan *plan, int world_size, int n_layers, int n_heads,
                      int ffn_hidden, int global_batch);

/* The Megatron-style uniform plan: dp pipelines of pp stages of TP size tp;
 * ranks numbered tp fastest, then pp, then dp (rank = (d*pp + s)*tp + t);
 * layers split as evenly as possible (earlier stages get the extra layers);
 * global_batch / micro_batch_size micro-batches split evenly across the dp
 * pipelines (MAL_EINVAL if not divisible).  `out` is initialised here.  Local. */
int mal_plan_uniform(int dp, int tp, int pp, int n_layers, int micro_batch_size, int global_batch,
                     mal_plan *out);

/* Where `rank` sits: 0 and *loc filled when it holds a stage or is suspended
 * (loc->pipeline == -1), MAL_ENOENT when the plan does not mention it.  Linear
 * in the plan size.  Local. */
int mal_plan_locate(const mal_plan *plan, int rank, mal_plan_loc *loc);

/* Counts.  Local. */
int mal_plan_n_active(const mal_plan *plan);        /* ranks holding a stage */
int mal_plan_world_size(const mal_plan *plan);      /* 1 + largest rank mentioned */
int mal_plan_n_micro_batches(const mal_plan *plan); /* sum of micro_batches */
int mal_plan_global_batch(const mal_plan *plan);    /* micro_batch_size x the above */
/* (these two return -1 when the count does not fit an int, as in a plan
 * read from outside that mal_plan_validate() would refuse) */

/* 1 when two plans describe the same layout (same pipelines, stages, ranks in
 * the same order, micro-batches and suspended set; predicted times and
 * comments ignored), else 0.  Local. */
int mal_plan_same_layout(const mal_plan *a, const mal_plan *b);

/* A short name of a plan's layout, for logs and metrics: 8 hex digits of
 * a hash of what mal_plan_same_layout compares (predicted times and
 * comments left out), so plans with the same layout have the same id.
 * Local. */
#define MAL_PLAN_ID_LEN 9
void mal_plan_id(const mal_plan *plan, char out[MAL_PLAN_ID_LEN]);

#endif /* MAL_PLAN_H */
