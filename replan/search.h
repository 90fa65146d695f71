/* Internals shared by the planner's files (not for other callers): the
 * search context, node situations and their TP-grouping options
 * (options.c), pipeline compositions and the order-aware layer solver
 * (layers.c), and the evaluation of one grouping of special TP groups into
 * pipelines (eval.c).  planner.c searches with these and builds the plan.
 *
 * Vocabulary (replan/README.md, "Algorithm"): a node's *healthy full groups*
 * are nominal TP groups of healthy ranks, identical everywhere; its other
 * ranks are grouped by one of its *options*, whose groups are *specials*.
 * A *block* is the set of specials that share one pipeline; eval.c shares
 * the healthy full groups out among the blocks' pipelines and pipelines of
 * their own.  Nodes whose ranks have the same sorted rates form a *class*
 * and share one list of options (positions, not ranks), so the search costs
 * grow with the number of distinct node situations, not with the ranks. */
#ifndef MAL_REPLAN_SEARCH_H
#define MAL_REPLAN_SEARCH_H

#include <stdint.h>

#include "replan.h"

#define RP_TOL 1e-9

/* A TP group as the cost model sees it: its size, its rate y and its
 * device type (the index into ctx's per-type memory and profile; 0 on a
 * homogeneous cluster). */
typedef struct sgrp {
    int size;
    double y;
    int ty;
} sgrp;

/* Total order on groups: larger first, then faster, then by type. */
int rp_cmp_sgrp(const void *a, const void *b);

/* One way to group the R non-full positions of a node (sorted by rate,
 * healthy leftovers first, slowest last): the first `n_active` positions are
 * cut into consecutive blocks of g[0].size, g[1].size, ... ranks; the others
 * are suspended. */
typedef struct nopt {
    int n_groups;
    int n_active;
    sgrp *g;     /* [n_groups] in position order (in the class's pool) */
    double cap;  /* sum 1 / y */
    double ymax; /* max y (0: no groups) */
    double room; /* sum over the groups of lmax - L (lmax: rp_layer_cap_max) */
} nopt;

/* A node situation: its options (shared by every node of the class). */
typedef struct nclass {
    int ty; /* the device type of its nodes */
    int n_nodes;
    int rep; /* first node of the class */
    int R;   /* non-full positions */
    int n_opts;
    nopt *opts;
    sgrp *pool; /* the options' groups, one array */
} nclass;

typedef struct nodeinfo {
    int n_ranks;
    int n_healthy_groups; /* full nominal groups of healthy ranks */
    int *healthy;         /* [n_healthy_groups * tp], chunked by tp (in node_ranks) */
    int R;
    int *rest; /* [R] the other ranks by position (rate order; in node_ranks) */
    int cls;
} nodeinfo;

/* A memoised pipeline composition: h healthy full groups plus specials. */
typedef struct centry {
    char *key;
    int S;
    double P;            /* period; INFINITY when no order and split fits memory */
    int *kind;           /* [S] stage order: -1 healthy full group, else index into the
                          * composition's sorted specials */
    int *l;              /* [S] layers per stage */
    unsigned char *mode; /* [S] recompute mode per stage (mal_recompute) */
} centry;

typedef struct ctx {
    const mal_replan_input *in;
    const mal_profile *p;
    int t, L, M, world; /* t: the profile's nominal TP size */
    int th;             /* size of the healthy full groups (t, or larger) */
    double yh;          /* their rate: alpha[th] (1.0 at the nominal size) */
    double mem;         /* memory of the healthy full groups' type */
    /* Device types (README "Mixed hardware"): each group's layer caps use
     * its type's memory and profile; a homogeneous cluster is one type.
     * The healthy full groups are all of type `hty`: nodes of other types
     * have no healthy full groups (their groups are specials). */
    int n_ty, hty;
    double tmem[MAL_REPLAN_MAX_TYPES];
    const mal_profile *tprof[MAL_REPLAN_MAX_TYPES];
    const int *node_ty; /* [n_nodes] type of each node (NULL: all type 0) */
    /* Recomputation modes a stage may take (README "Recomputation"), by
     * rising time: mode[0..n_modes), each type's time factors 1 + its
     * profile's recompute share; and the replicas the memory caps assume
     * (0: the worst case, mal_cost_stage_terms) */
    int n_modes;
    int mode[3];
    double mode_rt[MAL_REPLAN_MAX_TYPES][3];
    int replicas;
    int recompute; /* MAL_REPLAN_RECOMPUTE_* this search may use */
    double *x;     /* [world] floored rates */
    int n_nodes;
    nodeinfo *nodes;
    int *node_ranks; /* [world] the ranks node by node; nodes point into it */
    int n_classes;
    nclass *classes;
    int H; /* healthy full groups in the cluster */
    int pp_nom, dp_nom;
    /* composition cache (open addressing) */
    size_t cache_cap, cache_n;
    centry *cache;
    int n_layer_solves;
    unsigned char *scratch; /* the layer solver's arrays (layers.c), reused */
    size_t scratch_cap;
    double *hp_P; /* [L + 1] period of h healthy groups alone (NAN: not yet) */
    /* rp_layer_cap_max by type and log2 size (0: not yet) */
    int capmax[MAL_REPLAN_MAX_TYPES][MAL_REPLAN_MAX_TP_LOG + 2];
    long n_evals; /* block evaluations (statistics) */
    double work;  /* operations spent in evaluations (bounds the local search) */
    /* the time limit: past `deadline` (mal_now() seconds; INFINITY: none)
     * the search stops -- but only once it has a plan (`have_plan`), which
     * it then returns; `timed_out` records that the limit cut it short */
    double deadline;
    int have_plan;
    int timed_out;
} ctx;

/* Is the search out of time?  Never before the first plan: a plan late is
 * better than none.  Sets c->timed_out.  Local. */
int rp_out_of_time(ctx *c);

/* ---- options.c ---- */

/* Nodes, their classes and options (README "A").  Local. */
int rp_build_nodes(ctx *c);
void rp_free_nodes(ctx *c);
/* alpha of type ty's profile for a size the model allows (divides
 * n_heads, ffn_hidden), else 0 */
double rp_alpha(const ctx *c, int size, int ty);

/* ---- layers.c ---- */

/* The composition of h healthy full groups and ns specials (sorted with
 * rp_cmp_sgrp), memoised: best stage order and layer split (README "C").
 * *out points into the cache until rp_cache_free.  Local. */
int rp_composition(ctx *c, int h, const sgrp *sg, int ns, const centry **out);
void rp_cache_free(ctx *c);
/* Empty the cache when it holds more than RP_CACHE_MAX compositions (a
 * bound on the planner's memory; the results are the same, recomputed).
 * Only where no pointer into the cache is held.  Local. */
void rp_cache_trim(ctx *c);
/* Most layers a group of `size` and type ty can hold anywhere in any
 * pipeline, in any mode (an upper bound used by the pruning). */
int rp_layer_cap_max(const ctx *c, int size, int ty);
/* Most layers a group of `size` and type ty (its memory and profile) holds
 * at stage j of S with the search's mode index m (c->mode[m]).  Local. */
int rp_layer_cap(const ctx *c, int size, int ty, int S, int j, int m);
/* The modes the search may use (c->recompute), and each type's time
 * factors (c->tprof, c->n_ty set), into c.  Local. */
void rp_set_modes(ctx *c);

/* ---- eval.c ---- */

/* The pipelines of one evaluation: mixed ones (a block plus h healthy full
 * groups) and healthy-only ones. */
typedef struct rp_eval {
    double T; /* step time, layer units; INFINITY when infeasible / not better */
    int k;    /* blocks */
    int *h;   /* [k] healthy full groups joining each block */
    int n_hp; /* healthy-only pipelines */
    int *hp;  /* [n_hp] their healthy full groups */
} rp_eval;
void rp_eval_fini(rp_eval *e);

/* Best step time when block i holds the ns[i] specials sg[i] (sorted with
 * rp_cmp_sgrp), the H healthy full groups are shared out freely (any number
 * to each block's pipeline, the rest in pipelines of their own of any
 * length) and the micro-batches are optimal.  `window` < 0: every healthy
 * count for every block (exact); else each block's count stays within
 * +-window of its price-optimal value (README, restricted search).  With
 * `T_ub` finite, *T = INFINITY as soon as the blocks cannot beat T_ub.
 * `out` may be NULL.  Local. */
int rp_eval_blocks(ctx *c, int k, sgrp *const *sg, const int *ns, int window, double T_ub,
                   double *T, rp_eval *out);

/* Micro-batches a pipeline of period P and S stages runs within T (capped
 * at M); -1 when fewer than S (1F1B).  Local. */
int rp_runs(double T, double P, int S, int M);

/* Trim the micro-batches m[D] of pipelines (period P, S stages) down to M in
 * total (*total on entry and exit), one at a time from the pipeline that
 * finishes last and never below S; returns the step time max (m + S - 1) P.
 * Local. */
double rp_trim(int D, const double *P, const int *S, int *m, int M, long *total);

/* ---- place.c ---- */

/* Whether the plan needs the link-aware pass (communication priced, and a
 * slow link or every message charged).  Local. */
int rp_place_needed(const mal_replan_input *in);
/* The pass on the search's plan: exchanges of alike ranks, warm-up depths,
 * micro-batches; predicted times with communication; *J the step time
 * (layer units) it reaches.  Local. */
int rp_place(const mal_replan_input *in, mal_plan *plan, double *J);

#endif /* MAL_REPLAN_SEARCH_H */
