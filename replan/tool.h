/* malleus-replan as one library call: the command line's options in a struct
 * and the function that carries them out (read the inputs, plan or simulate,
 * write the plan and the reports).  cmd/replan_main.c is only the option
 * table that fills the struct; tests and other programs call this directly. */
#ifndef MAL_REPLAN_TOOL_H
#define MAL_REPLAN_TOOL_H

#include <stdio.h>

/* What the command line asked for.  Strings are borrowed (not copied); 0 /
 * NULL means "not given".  See `malleus-replan --help` for each field. */
typedef struct mal_replan_opts {
    const char *cluster_path;  /* --cluster */
    int world_size;            /* --world-size */
    int ranks_per_node;        /* --ranks-per-node */
    double memory_mb;          /* --memory-mb */
    const char *profile_path;  /* --profile */
    const char *model;         /* --model */
    const char *rates_path;    /* --rates */
    int window;                /* --window (default 2) */
    const char *links_path;    /* --links */
    int compute_only;          /* --compute-only */
    int micro_batch_size;      /* --micro-batch-size (default 1) */
    int n_micro_batches;       /* --micro-batches */
    int global_batch;          /* --global-batch */
    int pipelines;             /* --pipelines */
    const char *current_path;  /* --current */
    const char *out_path;      /* --output (NULL: the plan goes to `out`) */
    const char *simulate_path; /* --simulate */
    int explain;               /* --explain */
    int uniform;               /* --uniform */
    int summary;               /* --summary */
    int print_profile;         /* --print-profile */
    int search;                /* MAL_REPLAN_AUTO / EXHAUSTIVE / HEURISTIC */
    double time_limit;         /* --time-limit seconds (0: none) */
    int zero;                  /* --zero: the run shards the Adam moments (0 or 1, default 1) */
    int zero_master;           /* --zero-master: and the fp32 master (0 or 1; -1, the
                                * default: as zero) */
    const char *recompute;     /* --recompute none|selective|full|auto (NULL: auto) */
    int precision;             /* --precision: the run's compute, for its state's bytes
                                * (0 fp32: 16 a parameter; 1 bf16: 18, a working copy
                                * apart; -1, the default: the profile's own) */
} mal_replan_opts;

/* The defaults (window 2, micro-batch size 1, automatic search, time limit
 * MAL_REPLAN_TIME_LIMIT, --zero 1).  Local. */
void mal_replan_opts_init(mal_replan_opts *o);

/* Carry out `o`: the plan (or the simulation report, or the profile) goes to
 * `out`, unless --output names a file; --explain and --summary go to `out`
 * when the plan went to a file and to `info` otherwise; a line saying that
 * the time limit stopped the search (best found, bound, gap) always goes to
 * `info`.  Returns 0 or a
 * negative MAL_E* code with the message in mal_errmsg(); user mistakes are
 * MAL_EINVAL / MAL_EFORMAT / MAL_ENOENT naming the option or field.  Local. */
int mal_replan_tool_run(const mal_replan_opts *o, FILE *out, FILE *info);

#endif /* MAL_REPLAN_TOOL_H */
