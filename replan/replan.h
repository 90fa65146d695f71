/* The Malleus planner: its inputs (cluster, straggling rates, model profile),
 * the cost model of DESIGN.md ("Cost model and planner"), the two integer
 * programs solved with lp_solve, the plan search and the --explain report.
 * See replan/README.md for the JSON schemas and the algorithm.
 *
 * Units: times inside the planner are in "layer units" -- the time a healthy
 * TP group of the nominal size needs for one layer of one micro-batch
 * (forward + backward); multiply by profile->layer_time for seconds.
 * Memory is in MB (2^20 bytes). */
#ifndef MAL_REPLAN_H
#define MAL_REPLAN_H

#include <stdio.h>

#include "src/plan.h"

/* Rates below this count as healthy (1.0): measurement noise floor. */
#define MAL_REPLAN_NOISE_FLOOR 1.2
/* Largest TP size the profile may describe (2^MAL_REPLAN_MAX_TP_LOG). */
#define MAL_REPLAN_MAX_TP_LOG 10
/* Largest world the planner accepts: a bound on what it allocates for
 * input it has not checked yet (2^20 ranks; 10^9 used to take 19 GB). */
#define MAL_REPLAN_MAX_WORLD (1 << 20)
/* Rates above this count as this: a device a million times slower than a
 * healthy one is as good as stopped (the plan suspends it whenever anything
 * else is possible), and larger numbers only make the programs ill-scaled. */
#define MAL_REPLAN_MAX_RATE 1e6
/* Largest input files: the cluster and the profile (a few KB in practice,
 * a `nodes` list of MAL_REPLAN_MAX_WORLD ranks about 10 MB), and the rates (a
 * whole metrics file of a long run).  Inputs are read whole through the
 * bounded reader (base/fileio.h): a device or FIFO given by mistake is
 * refused instead of read forever. */
#define MAL_REPLAN_MAX_INPUT_BYTES ((size_t)64 << 20)
#define MAL_REPLAN_MAX_RATES_BYTES ((size_t)1 << 30)

/* ---- inputs -------------------------------------------------------------- */

/* A device type of a mixed cluster (README "Mixed hardware"). */
typedef struct mal_device_type {
    char name[32];
    double memory_mb;            /* device memory of each rank of this type */
    double speed;                /* compute speed relative to the --profile's device
                                  * (with a profile of its own: --profile's layer_time
                                  * over its own); the fastest type is the profile's
                                  * device (its layer_time), the others run at
                                  * speed / fastest of it */
    char *profile_src;           /* "profile": a file or a preset name (NULL: none) */
    struct mal_profile *profile; /* its loaded profile (NULL: --profile's) */
} mal_device_type;

/* At most this many device types (the search keeps a few figures per type). */
#define MAL_REPLAN_MAX_TYPES 64

typedef struct mal_cluster {
    int world_size;
    int n_nodes;
    int *node_of;           /* [world_size]: node index of each rank */
    double memory_mb;       /* device memory capacity of every rank (mixed: the
                             * least of the types in use; the search sizes each
                             * stage for its own type's memory) */
    int n_types;            /* 0: homogeneous */
    mal_device_type *types; /* [n_types] */
    int *type_of;           /* [n_nodes] type index of each node (NULL: homogeneous) */
} mal_cluster;

/* Device memory of rank r (its node's type's, else memory_mb).  Local. */
double mal_cluster_rank_memory(const mal_cluster *c, int r);
/* Speed of rank r relative to the fastest type (1.0 homogeneous).  Local. */
double mal_cluster_rank_speed(const mal_cluster *c, int r);
/* Type index of rank r (-1: homogeneous or r outside).  Local. */
int mal_cluster_rank_type(const mal_cluster *c, int r);
/* The profile rank r's stage is priced with: its type's own profile, else
 * p (--profile's).  Local; the result is c's or p. */
const struct mal_profile *mal_cluster_rank_profile(const mal_cluster *c, int r,
                                                   const struct mal_profile *p);
/* Load every type's "profile" (a file, relative to the cluster file's
 * folder `dir` (NULL: the working directory), or a preset name) for
 * micro-batch size mbs, check that it describes p's model (n_layers, tp,
 * n_heads, ffn_hidden) and set the type's speed to p->layer_time over its
 * own; p's `zero` is copied.  With any such profile, the fastest type must
 * run at p's layer_time (--profile is the fastest type's).  MAL_EINVAL /
 * MAL_EFORMAT naming types.NAME.profile.  Local; c owns the profiles. */
int mal_cluster_load_profiles(mal_cluster *c, const char *dir, const struct mal_profile *p,
                              int mbs);
/* The rates the planner plans for on a mixed cluster: each rank's
 * measured rate, or its type's 1 / speed (relative to the fastest type)
 * where that is larger -- a slower type's rank is a straggler by nature,
 * and a rate measured against the cluster's median already includes its
 * type.  out may be rates; a homogeneous cluster copies.  Local. */
void mal_cluster_effective_rates(const mal_cluster *c, const double *rates, double *out);

/* Regular cluster: `ranks_per_node` consecutive ranks per node.  MAL_EINVAL
 * when world_size is not divisible into nodes.  `c` initialised here; fini it.
 * Local. */
int mal_cluster_regular(mal_cluster *c, int world_size, int ranks_per_node, double memory_mb);
/* Parse {"world_size", "ranks_per_node" | "nodes": [[ranks]...], "memory_mb"}
 * from a string / file.  Local; `c` initialised here; fini it even on error. */
int mal_cluster_parse_string(mal_cluster *c, const char *json, const char *what);
/* The same on `len` bytes that need no terminating NUL (fuzzing entry). */
int mal_cluster_parse_buffer(mal_cluster *c, const char *buf, size_t len, const char *what);
int mal_cluster_read(mal_cluster *c, const char *path);
void mal_cluster_fini(mal_cluster *c);

typedef struct mal_profile {
    char name[32];
    int n_layers;
    int tp;                                  /* nominal TP size (power of two) */
    int n_heads;                             /* for TP-size divisibility (0 = unchecked) */
    int ffn_hidden;                          /* idem */
    double alpha[MAL_REPLAN_MAX_TP_LOG + 1]; /* alpha[log2 size]; 0 = size not allowed */
    int n_k;
    double *k;             /* [n_k] per-layer memory by distance d from the last stage (MB) */
    double embed_mb;       /* E: embedding or LM-head memory on a first/last stage (MB) */
    double overhead_mb;    /* X: fixed per-rank overhead (MB) */
    double layer_time;     /* seconds of one layer, one micro-batch, healthy nominal group */
    double layer_state_mb; /* full state (params+grads+optimizer) of one layer, all shards */
    double embed_state_mb; /* full state of the embedding (= that of the LM head) */
    /* Bytes of that state per parameter (0 read as 16: fp32 master, gradient,
     * Adam m and v; more where a working copy is kept apart): of which the
     * fp32 gradient is 4 and the moments 8 (mal_cost_memory_terms). */
    double state_bytes;
    /* Per-rank buffers outside the state and the activations, by TP size
     * (scratch_mb[log2 size], 0 = not measured): the backward pass's
     * scratch, which one layer at a time reuses, and the monitor's probe. */
    double scratch_mb[MAL_REPLAN_MAX_TP_LOG + 1];
    /* Measured per TP size (0 = not measured: k[d] scaled from the nominal
     * size instead): one layer's state per rank and its activations per
     * micro-batch in flight, so a rank of size 2^l holds
     * rank_state_mb[l] + rank_acts_mb[l] x (d + 1) per layer -- what every
     * rank of a group holds whole (norm weights, the residual stream) is
     * not divided as the nominal scaling would. */
    double rank_state_mb[MAL_REPLAN_MAX_TP_LOG + 1];
    double rank_acts_mb[MAL_REPLAN_MAX_TP_LOG + 1];
    /* The run being planned shards the Adam moments over each layer's
     * replicas (the trainer's --zero 1; malleus-replan --zero). */
    int zero;
    /* With zero, the fp32 master too (--zero-master on): counted only where
     * state_bytes holds a working copy apart from the master (more than
     * 16), the only case where the runtime shards it. */
    int zero_master;
    /* Activation recomputation (README "Recomputation"), indexed by
     * mal_recompute: the share of a layer's activations a stage keeps per
     * micro-batch in flight (acts_kept[NONE] = 1), and the time the
     * recomputation adds as a share of the layer's forward + backward time
     * (recompute_time[NONE] = 0).  Presets derive them from the shape; a
     * profile whose acts_kept[NONE] is not 1 (never filled) has the
     * defaults MAL_REPLAN_KEPT_* and MAL_REPLAN_TIME_*. */
    double acts_kept[3];
    double recompute_time[3];
    /* The recomputation the run being planned may use (malleus-replan
     * --recompute; a setting of the run, as `zero` is):
     * MAL_REPLAN_RECOMPUTE_NONE (0: never), _SELECTIVE or _FULL (every stage
     * that one), or _AUTO (per stage, only where it pays). */
    int recompute;
    /* The LM head is the token embedding: a one-stage pipeline holds its
     * state once, and the first and last stages of a deeper one sum its
     * gradient as replicas do. */
    int tied_embeddings;
    double sync_time; /* seconds added to every step for gradient sync */
    /* Links (README "Links"): a healthy link moves a message of n bytes in
     * latency + n / bandwidth seconds, within a node and between nodes;
     * bandwidth 0 = communication not priced (the planner then ignores
     * slow links).  The messages: one micro-batch's activation (B, T, C)
     * sent at a stage boundary (and its gradient back), tp_allreduces
     * all-reduces of that size per layer per micro-batch in a TP group, and
     * one layer's gradient (all TP shards) summed over the pipelines once
     * per step.  comm_in_alpha: alpha and layer_time already include the
     * healthy links' communication (the presets' measured alpha), so only a
     * slow link's excess is charged; else (a profile malleus-train
     * --profile measured) every message is. */
    double link_latency, link_bandwidth;           /* within a node */
    double node_link_latency, node_link_bandwidth; /* between nodes */
    double activation_bytes;
    double tp_allreduces;
    double grad_bytes;
    int comm_in_alpha;
} mal_profile;

/* Every preset of src/config.c (mal_config_presets: the shapes are its),
 * with device assumptions per preset; `p` initialised here.  MAL_EINVAL for
 * an unknown name.  Local. */
int mal_profile_preset(mal_profile *p, const char *name, int micro_batch_size);
/* The same at nominal TP size `tp` (0: the preset's own): memory per layer,
 * embedding memory and layer time are those of a group of tp ranks, alpha
 * relative to it.  MAL_EINVAL when tp does not fit the model.  Local. */
int mal_profile_preset_tp(mal_profile *p, const char *name, int micro_batch_size, int tp);
/* Profile JSON (optionally {"preset": NAME, ...overrides}); see README.
 * `p` initialised here; fini it even on error.  Local. */
int mal_profile_parse_string(mal_profile *p, const char *json, const char *what,
                             int micro_batch_size);
/* The same on `len` bytes that need no terminating NUL (fuzzing entry). */
int mal_profile_parse_buffer(mal_profile *p, const char *buf, size_t len, const char *what,
                             int micro_batch_size);
int mal_profile_read(mal_profile *p, const char *path, int micro_batch_size);
int mal_profile_write(const mal_profile *p, FILE *f);
void mal_profile_fini(mal_profile *p);
/* Re-count p's optimizer state at `bytes` per parameter from its
 * state_bytes (0 read as 16), in every figure that holds it: layer_state_mb,
 * embed_state_mb, rank_state_mb, the state inside each k[d] and inside E
 * (the nominal rank's share of embed_state_mb), and state_bytes itself.
 * 18 is the runtime computing in bf16 (fp32 master, gradient, Adam m and
 * v, and a bf16 working copy: what malleus-train --profile --precision
 * bf16 records), 16 the same without the copy (or a preset's reference
 * mixed precision: bf16 weights and gradients, fp32 master, m and v).
 * k[d] must be state + activations x (d + 1), as the presets' and measured
 * profiles' are: the state is 2 k[0] - k[1] (k[0] alone for n_k = 1).
 * MAL_EINVAL (p unchanged) for bytes under 12 (the gradient and the
 * moments alone) or above 64, or k[d] not of that form.  Local. */
int mal_profile_set_state_bytes(mal_profile *p, double bytes);
/* k[d] with linear extrapolation past the list's end.  Local. */
double mal_profile_k(const mal_profile *p, int d);
/* Memory (MB) of one layer on a rank of a TP group of `size` at distance
 * d: measured for that size (rank_state_mb, rank_acts_mb), else
 * k[d] x tp / size.  Local. */
double mal_profile_k_at(const mal_profile *p, int d, int size);
/* alpha for a TP size, 0 when the size is not allowed.  Local. */
double mal_profile_alpha(const mal_profile *p, int size);

/* Slow links: rank pairs whose messages take `rate` times a healthy
 * link's time (README "Links").  Pairs are unordered (a < b), sorted, each
 * once; links not listed are healthy (1.0). */
typedef struct mal_link {
    int a, b;
    double rate;
} mal_link;
typedef struct mal_links {
    int n;
    mal_link *l; /* [n] */
} mal_links;

/* Read slow links: a JSON object {"links": [{"a": 3, "b": 4, "rate": 8}]}
 * or JSON lines (a metrics file) whose rows carry "link_rates":
 * [[a, b, rate], ...]; then the mean of each pair's last `window`
 * samples.  Rates below the noise floor are dropped (healthy).  Ranks
 * outside the world, a == b, and rates that are not positive numbers are
 * MAL_EINVAL naming the pair.  `ln` initialised here; fini it even on
 * error.  Local. */
int mal_links_read(const char *path, int world_size, int window, mal_links *ln);
int mal_links_parse_buffer(const char *buf, size_t len, const char *what, int world_size,
                           int window, mal_links *ln);
/* Add (or multiply into) the pair's rate; keeps the list sorted.  Local. */
int mal_links_set(mal_links *ln, int a, int b, double rate);
void mal_links_fini(mal_links *ln);
/* The pair's floored rate (1.0 when healthy or ln is NULL).  Local. */
double mal_links_rate(const mal_links *ln, int a, int b);
/* 1 when some link is slower than the noise floor.  Local. */
int mal_links_any(const mal_links *ln);

/* Straggling rates of every rank into rates[world_size] (missing ranks 1.0).
 * The file is either a JSON object {"rank": rate, ...} or JSON lines from
 * malleus-train's metrics file, each {"step": N, "rates": [r0, r1, ...]} or
 * {"step": N, "rank": r, "rate": x}; then the mean of the last `window`
 * samples of each rank is used.  NaN, infinite, zero or negative rates and
 * ranks outside the world are MAL_EINVAL naming the rank.  Local. */
int mal_rates_read(const char *path, int world_size, int window, double *rates);
int mal_rates_parse_string(const char *text, const char *what, int world_size, int window,
                           double *rates);
/* The same on `len` bytes that need no terminating NUL (fuzzing entry); a
 * NUL byte inside is MAL_EFORMAT. */
int mal_rates_parse_buffer(const char *buf, size_t len, const char *what, int world_size,
                           int window, double *rates);

/* ---- cost model ---------------------------------------------------------- */

/* Rate after the noise floor (and the cap MAL_REPLAN_MAX_RATE). */
static inline double mal_cost_floor(double x)
{
    return x < MAL_REPLAN_NOISE_FLOOR ? 1.0 : x > MAL_REPLAN_MAX_RATE ? MAL_REPLAN_MAX_RATE : x;
}

/* Most layers stage j of an S-stage pipeline with a TP group of `size` may
 * hold within memory (0 when it cannot hold one).  Local. */
int mal_cost_layer_cap(const mal_profile *p, double memory_mb, int size, int S, int j);
/* Memory (MB) of a rank on stage j of S holding l layers with TP `size`:
 * the per-stage part only (layers, embedding / LM head, overhead); the
 * whole need is mal_cost_stage_need. */
double mal_cost_stage_memory(const mal_profile *p, int size, int S, int j, int l);

/* The same with `d` + 1 micro-batches of activations in flight (a stage
 * whose 1F1B warm-up is d forwards deep; the default is S - 1 - j). */
double mal_cost_stage_memory_d(const mal_profile *p, int size, int S, int j, int l, int d);

/* The memory of a rank of stage j of pipeline i of a whole plan, term by
 * term (MB): what mal_cost_stage_memory_d counts (layers at k[warm-up
 * depth], embedding / LM head, both scaled from the nominal TP size to the
 * stage's, and the overhead X) and what depends on the plan or is outside
 * the per-layer figure: the scratch buffers at the stage's TP size, the
 * pipeline's gradient buffers (one activation per micro-batch in flight
 * on a stage after the first, one on a stage before the last), the
 * gradient sum's copy of the rank's gradients where its layers have
 * replicas (the other pipelines: every pipeline holds every layer), and
 * with p->zero the moments the rank does not keep (all but 1 / replicas,
 * subtracted; with p->zero_master and a working copy apart, the fp32
 * master's likewise).  total = layers + embed + scratch + p2p + dp_grads -
 * zero_saved + overhead. */
typedef struct {
    double layers, embed, scratch, p2p, dp_grads, zero_saved, overhead, total;
    double embed_tied; /* of embed: the second copy a tied one-stage part does not hold */
    /* recomputation (the stage's mode): the one-layer workspace it
     * regenerates activations into (in total), and the activations it does
     * not keep (already left out of `layers`) */
    double workspace, recompute_saved;
    int depth, replicas, slots, recompute;
    int k_at_size; /* layers from the profile's figures at the stage's TP size */
} mal_cost_memory;
void mal_cost_memory_terms(const mal_profile *p, const mal_plan *plan, int i, int j,
                           mal_cost_memory *out);

/* The profile a plan's stage is priced with on cluster c (its type's
 * own, else p; NULL c: p), and its ranks' least device memory.  Local. */
const mal_profile *mal_cost_stage_profile(const mal_profile *p, const mal_cluster *c,
                                          const mal_plan_stage *st);
double mal_cost_stage_capacity(const mal_cluster *c, const mal_plan_stage *st);
/* The same terms for a stage not yet in a plan: TP `size`, stage j of S,
 * l layers, warm-up depth d (d + 1 micro-batches in flight: the pipeline
 * runs at least that many), `replicas` pipelines holding its layers (<= 0:
 * not known, the most the gradient-sum terms can cost: 1 with p->zero, 2
 * without), recompute mode `mode`.  The search's layer caps and
 * feasibility use this, so a plan it calls feasible fits
 * mal_cost_memory_terms's total.  Local. */
void mal_cost_stage_terms(const mal_profile *p, int size, int S, int j, int l, int d, int replicas,
                          int mode, mal_cost_memory *out);
/* Its total (MB). */
double mal_cost_stage_need(const mal_profile *p, int size, int S, int j, int l, int d, int replicas,
                           int mode);
/* Most layers stage j of S (warm-up depth S - 1 - j) of a group of `size`
 * holds within memory_mb with recompute `mode` and `replicas` as above (0
 * when it cannot hold one).  mal_cost_layer_cap is this with replicas 0
 * and no recomputation.  Local. */
int mal_cost_layer_cap_mode(const mal_profile *p, double memory_mb, int size, int S, int j,
                            int replicas, int mode);
/* One layer's activations per micro-batch on a rank of a group of `size`
 * (MB): rank_acts_mb where measured, else k[1] - k[0] scaled.  Local. */
double mal_cost_layer_acts(const mal_profile *p, int size);
/* Share of a layer's activations kept with recompute `mode` (1 for none),
 * and the time the recomputation adds as a share of the layer's time (0 for
 * none).  Local. */
double mal_cost_acts_kept(const mal_profile *p, int mode);
double mal_cost_recompute_time(const mal_profile *p, int mode);
/* Time of a stage per micro-batch per layer relative to no recomputation:
 * 1 + mal_cost_recompute_time(stage's mode).  Local. */
double mal_cost_stage_factor(const mal_profile *p, const mal_plan_stage *st);

/* Communication terms (README "Links"), layer units, 0 when the profile
 * prices no communication.  Local.
 * TP all-reduces of one layer, one micro-batch, of the group ranks[n]: */
double mal_cost_tp_comm(const mal_profile *p, const mal_cluster *c, const mal_links *ln,
                        const int *ranks, int n);
/* One micro-batch's activation from stage `from` to the next, `to` (the
 * gradient back costs the same): */
double mal_cost_p2p(const mal_profile *p, const mal_cluster *c, const mal_links *ln,
                    const mal_plan_stage *from, const mal_plan_stage *to);
/* The gradient sum over the slow links between pipelines, per step (the
 * slowest such link's excess over a healthy one): */
double mal_cost_dp_comm(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                        const mal_links *ln);
/* A stage's time per micro-batch with communication (layer units): its
 * layers x (y x the recompute factor (its type's profile) + its TP all-reduces, half of them
 * again under full recomputation); y = its rate x alpha.  Local. */
double mal_cost_stage_links_time(const mal_profile *p, const mal_cluster *c, const mal_links *ln,
                                 const mal_plan_stage *st, double y);
/* A pipeline's time with communication (layer units): stage time
 * l (x alpha + TP), boundaries d_j each way, and the period
 * Peff = max(max_j c_j, max_k R_k / (w_k + 1)) where R_k is the round trip
 * from stage k to the last and back; T = (m + S - 1) Peff + 2 sum d_j.
 * With `choose`, warm[S] gets the warm-up depth of each stage that
 * minimises Peff within memory (non-increasing, never below the 1F1B
 * default); else warm (NULL: the defaults) is used.  Local. */
int mal_cost_pipeline_links(const mal_plan_pipeline *pl, const mal_profile *p, const mal_cluster *c,
                            const double *rates, const mal_links *ln, int choose, int *warm,
                            double *T_out, double *Peff_out);
/* A whole plan with communication under its own warm-up depths: time[i]
 * (NULL: not kept) each pipeline's, *J_out the step time (the slowest
 * pipeline plus mal_cost_dp_comm), layer units.  Local. */
int mal_cost_plan_links(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                        const double *rates, const mal_links *ln, double *time, double *J_out);

/* Share of a layer's (forward + backward) time spent in the forward pass
 * (backward computes two matrix products per forward one). */
#define MAL_REPLAN_FORWARD_SHARE (1.0 / 3.0)

/* Recomputation figures of a profile that gives none (README
 * "Recomputation"): the shares of a layer's activations the runtime keeps
 * (measured on `small`: 0.80 selective, 0.18 full), full running the
 * forward pass again (a third of the layer's time), selective redoing the
 * element-wise work (a few per cent). */
#define MAL_REPLAN_KEPT_SELECTIVE 0.8
#define MAL_REPLAN_KEPT_FULL 0.18
#define MAL_REPLAN_TIME_SELECTIVE 0.03
#define MAL_REPLAN_TIME_FULL MAL_REPLAN_FORWARD_SHARE

typedef struct mal_cost_eval {
    double step_time;   /* layer units, max over pipelines: the closed form
                         * (m_i + S_i - 1) * period_i the planner minimises */
    double bubble_free; /* max over pipelines of m_i * period_i */
    double shaped;      /* max over pipelines of the bubble by the stages'
                         * actual times and order (see README, "Cost model"):
                         * a lower bound of the 1F1B schedule, equal to the
                         * closed form when all stages take the period */
    int memory_ok;      /* every stage fits */
    int n_pipelines;
    double *period;      /* [n_pipelines] max_j y_ij * l_ij */
    double *time;        /* [n_pipelines] (m_i + S_i - 1) * period_i */
    double *shaped_time; /* [n_pipelines] */
} mal_cost_eval;

/* Evaluate a plan under the cost model with rates[] (raw; the noise floor is
 * applied here).  `ev` arrays malloc'ed (free with mal_cost_eval_fini).
 * MAL_EINVAL if a TP size has no alpha.  Local. */
int mal_cost_eval_plan(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                       const double *rates, mal_cost_eval *ev);
void mal_cost_eval_fini(mal_cost_eval *ev);

/* Capacity bound (layer units): all work (M micro-batches x L layers) spread
 * perfectly over every rank at its own speed (1 / (tp * floored rate) of a
 * nominal group), no bubble, nominal TP efficiency.  Local. */
double mal_cost_capacity_bound(const mal_profile *p, int world_size, const double *rates,
                               int n_micro_batches);

/* Bytes of model + optimizer state that must move to go from plan `from` to
 * plan `to`: for every rank, what it holds under `to` (its TP shard of its
 * layers, embedding / LM head) minus what it already held under `from`.
 * Local. */
double mal_cost_migration_bytes(const mal_plan *from, const mal_plan *to, const mal_profile *p);

/* ---- the two integer programs (lp_solve) --------------------------------- */

/* Layers per stage: minimise P = max_j y[j] * l[j] subject to sum l = L and
 * 1 <= l[j] <= ub[j], l integer.  *P_out = INFINITY (and 0 returned) when
 * infeasible.  MAL_ELP on a solver failure.  Local. */
int mal_lp_layers(int S, const double *y, const int *ub, int L, int *l_out, double *P_out);

/* Micro-batches: n classes of identical pipelines (count[c] pipelines of
 * S[c] stages and period P[c]); minimise T = max_c (m_c + S_c - 1) * P_c
 * subject to sum_c count[c] * m_c >= M, m_c >= S_c integer.  m_out[c] is the
 * per-pipeline count (the caller trims the excess).  *T_out = INFINITY when
 * infeasible (sum count*S > M).  Local. */
int mal_lp_microbatches(int n, const double *P, const int *S, const int *count, int M, int *m_out,
                        double *T_out);

/* ---- the planner --------------------------------------------------------- */

enum { MAL_REPLAN_AUTO = 0, MAL_REPLAN_EXHAUSTIVE = 1, MAL_REPLAN_HEURISTIC = 2 };

/* Default time limits of the search (seconds): malleus-replan's, and the
 * online re-plan's inside a running job (every rank waits for it).  Within
 * them the planner covers 2^20 ranks with 20 % stragglers; see
 * replan/README.md, "Time and memory". */
#define MAL_REPLAN_TIME_LIMIT 60.0
#define MAL_REPLAN_ONLINE_TIME_LIMIT 5.0

typedef struct mal_replan_input {
    const mal_cluster *cluster;
    const mal_profile *profile;
    const double *rates; /* [world_size], raw (a mixed cluster: through
                          * mal_cluster_effective_rates) */
    int micro_batch_size;
    int n_micro_batches;     /* M: total per step */
    int nominal_dp;          /* pipelines of the uniform plan (0: derived) */
    const mal_plan *current; /* optional: keep ranks' state where possible */
    int search;              /* MAL_REPLAN_AUTO / EXHAUSTIVE / HEURISTIC */
    double time_limit;       /* seconds for the search (0: none): past it the
                              * best plan found so far is returned (the
                              * first plan is always finished) */
    const mal_links *links;  /* slow links (NULL: none) */
} mal_replan_input;

enum {
    MAL_REPLAN_RECOMPUTE_NONE = 0,
    MAL_REPLAN_RECOMPUTE_SELECTIVE = 1,
    MAL_REPLAN_RECOMPUTE_FULL = 2,
    MAL_REPLAN_RECOMPUTE_AUTO = 3
};

/* Why the search ended (mal_replan_stats.stop), in rising order of what a
 * caller should know. */
enum {
    MAL_REPLAN_STOP_OPTIMAL = 0,   /* the whole space enumerated: the plan is optimal */
    MAL_REPLAN_STOP_CONVERGED = 1, /* local search: no move improves */
    MAL_REPLAN_STOP_BUDGET = 2,    /* local search: its evaluation budget spent */
    MAL_REPLAN_STOP_TIME = 3       /* the time limit */
};

typedef struct mal_replan_stats {
    double objective;   /* predicted step time, layer units (cost model) */
    int n_layer_lps;    /* layer integer programs solved with lp_solve */
    int n_candidates;   /* configurations evaluated */
    int n_pruned;       /* configurations cut by the lower bound */
    int exhaustive;     /* 1 when the search was exhaustive */
    double seconds;     /* planning wall time */
    double lower_bound; /* layer units: no plan of the space searched (README,
                         * "Algorithm") is faster; = objective when optimal */
    int stop;           /* MAL_REPLAN_STOP_* */
    double time_limit;  /* the limit it ran under (0: none) */
} mal_replan_stats;

/* Plan for the measured rates.  `out` is initialised here and passes
 * mal_plan_validate() for (world_size, n_layers, n_heads, ffn_hidden,
 * M * micro_batch_size); predicted times are in seconds.  MAL_EINVAL with a
 * message naming the cause for bad inputs or when no plan fits memory.
 * Deterministic: the same input gives the same plan.  Local. */
int mal_replan(const mal_replan_input *in, mal_plan *out, mal_replan_stats *stats);

/* The nominal uniform plan for the input (dp = nominal_dp, tp = profile tp);
 * micro-batches split as evenly as possible (first pipelines get the extra).
 * Local; `out` initialised here. */
int mal_replan_uniform(const mal_replan_input *in, mal_plan *out);
/* The default number of pipelines: the largest dp whose uniform plan fits
 * memory (pp = world / (dp * tp) dividing evenly).  Local. */
int mal_replan_default_dp(const mal_cluster *c, const mal_profile *p, int n_micro_batches);

/* Human-readable report of `plan` for `in` (see --explain).  Local. */
int mal_replan_explain(FILE *f, const mal_replan_input *in, const mal_plan *plan);
/* --simulate --explain: every stage of `plan` with the terms of its memory
 * per rank (its layers at k[warm-up depth], embedding / LM head, overhead;
 * the total is their sum) against its rank's capacity.  Local. */
void mal_replan_explain_memory(FILE *f, const mal_profile *p, const mal_cluster *c,
                               const mal_plan *plan);
/* The search's outcome in one line of `buf` ("best found X s, bound Y s, gap
 * Z %, <why it stopped>"; seconds by the profile's layer_time); returns what
 * snprintf returns.  Local. */
int mal_replan_describe_search(const mal_replan_stats *st, const mal_profile *p, char *buf,
                               size_t len);
/* --explain's lines on the search (the outcome above, evaluations, time).
 * Local. */
void mal_replan_explain_search(FILE *f, const mal_replan_input *in, const mal_replan_stats *st);

#endif /* MAL_REPLAN_H */
