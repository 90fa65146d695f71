/* malleus-replan: the standalone planner's command line.  An option table
 * (which also prints --help) that fills a mal_replan_opts, and one call into
 * the library (replan/tool.h); replan/README.md describes the planner. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mal.h"
#include "replan.h"
#include "tool.h"

/* How an option's argument is stored into mal_replan_opts. */
enum { ARG_NONE, ARG_STR, ARG_INT, ARG_MB, ARG_SEARCH, ARG_HELP, ARG_VERSION };

typedef struct opt_row {
    const char *section; /* heading printed before this option, or NULL */
    const char *name;
    int letter; /* short option, or 0 */
    int kind;   /* ARG_* */
    size_t off; /* field of mal_replan_opts */
    const char *metavar;
    const char *help; /* lines after the first are indented under it */
} opt_row;

#define F(field) offsetof(mal_replan_opts, field)
static const opt_row rows[] = {
    {"Cluster (one of)", "cluster", 'c', ARG_STR, F(cluster_path), "FILE",
     "cluster JSON: {\"world_size\", \"ranks_per_node\" | \"nodes\", \"memory_mb\"}"},
    {NULL, "world-size", 0, ARG_INT, F(world_size), "N",
     "number of ranks (with --ranks-per-node and --memory-mb)"},
    {NULL, "ranks-per-node", 0, ARG_INT, F(ranks_per_node), "G",
     "ranks per node (TP groups stay inside a node)"},
    {NULL, "memory-mb", 0, ARG_MB, F(memory_mb), "X", "device memory per rank in MB"},
    {"Model (one of)", "profile", 'p', ARG_STR, F(profile_path), "FILE",
     "model profile JSON (may start from {\"preset\": ...})"},
    {NULL, "model", 'm', ARG_STR, F(model), "NAME", "preset profile: tiny, small, 32b, 70b, 110b"},
    {"Rates", "rates", 'r', ARG_STR, F(rates_path), "FILE",
     "{\"rank\": rate} map, or malleus-train metrics (JSON lines with\n"
     "\"rates\"); missing ranks are healthy (1.0)"},
    {NULL, "window", 'w', ARG_INT, F(window), "W", "metrics: average the last W samples (default 2)"},
    {"Batch", "micro-batch-size", 'b', ARG_INT, F(micro_batch_size), "N",
     "samples per micro-batch (default 1)"},
    {NULL, "micro-batches", 'M', ARG_INT, F(n_micro_batches), "N",
     "micro-batches per step (total over all pipelines)"},
    {NULL, "global-batch", 'g', ARG_INT, F(global_batch), "N",
     "samples per step (alternative to --micro-batches)"},
    {NULL, "pipelines", 'd', ARG_INT, F(pipelines), "DP",
     "nominal number of pipelines (default: the current plan's,\n"
     "else the largest uniform layout that fits memory)"},
    {NULL, "current", 'C', ARG_STR, F(current_path), "PLAN",
     "the plan now running: keep ranks' state where possible"},
    {"Output", "output", 'o', ARG_STR, F(out_path), "PLAN",
     "write the plan here (atomically); default stdout"},
    {NULL, "explain", 'e', ARG_NONE, F(explain), NULL,
     "report groups, stages, predicted times, state to move\n"
     "(stdout, or stderr when the plan goes to stdout)"},
    {NULL, "simulate", 's', ARG_STR, F(simulate_path), "PLAN",
     "do not plan: simulate PLAN event by event (1F1B) and\n"
     "compare with the cost model's closed form"},
    {NULL, "uniform", 'u', ARG_NONE, F(uniform), NULL,
     "output the nominal uniform plan instead of planning"},
    {NULL, "search", 0, ARG_SEARCH, F(search), "MODE", "auto (default), exhaustive or heuristic"},
    {NULL, "summary", 0, ARG_NONE, F(summary), NULL,
     "print one JSON line with times and statistics"},
    {NULL, "print-profile", 0, ARG_NONE, F(print_profile), NULL,
     "print the profile in use as JSON and exit"},
    {NULL, "help", 'h', ARG_HELP, 0, NULL, "this help"},
    {NULL, "version", 'V', ARG_VERSION, 0, NULL, "version"},
};
#undef F
#define N_ROWS ((int)MAL_ARRAY_SIZE(rows))

static void usage(FILE *f)
{
    fputs("Usage: malleus-replan [OPTIONS]\n"
          "Plan a non-uniform hybrid-parallel layout for measured straggling rates.\n",
          f);
    for (int i = 0; i < N_ROWS; i++) {
        const opt_row *r = &rows[i];
        char head[64];
        if (r->section) fprintf(f, "\n%s:\n", r->section);
        int n = r->letter ? snprintf(head, sizeof head, "  -%c, --%s", r->letter, r->name)
                          : snprintf(head, sizeof head, "      --%s", r->name);
        if (r->metavar) snprintf(head + n, sizeof head - (size_t)n, " %s", r->metavar);
        fprintf(f, "%-28s", head);
        for (const char *s = r->help; *s; s++) {
            fputc(*s, f);
            if (*s == '\n') fprintf(f, "%28s", "");
        }
        fputc('\n', f);
    }
    fputs("\nExamples:\n"
          "  malleus-replan --world-size 64 --ranks-per-node 8 --memory-mb 81920 --model 70b \\\n"
          "      --micro-batches 128 --rates rates.json --explain -o plan.json\n"
          "  malleus-replan -c cluster.json -p profile.json -r metrics.jsonl -w 2 -g 256 -b 2 \\\n"
          "      --current plan.json -o new-plan.json\n"
          "  malleus-replan -c cluster.json -m 70b -r rates.json -M 128 --simulate new-plan.json\n"
          "\n"
          "Exit status: 0 success; 2 bad usage or input, including a cluster too small\n"
          "for the model (the message names what to fix); 1 any other failure.\n",
          f);
}

/* Store one option's argument; 0, or -1 after printing why it is bad. */
static int store(const opt_row *r, const char *arg, mal_replan_opts *o)
{
    char *field = (char *)o + r->off, *end;
    switch (r->kind) {
    case ARG_NONE:
        *(int *)field = 1;
        return 0;
    case ARG_STR:
        *(const char **)field = arg;
        return 0;
    case ARG_INT: {
        errno = 0;
        long v = strtol(arg, &end, 10);
        if (errno || end == arg || *end || v < 0 || v > 1000000000) {
            fprintf(stderr, "malleus-replan: --%s expects a non-negative integer, got \"%s\"\n",
                    r->name, arg);
            return -1;
        }
        *(int *)field = (int)v;
        return 0;
    }
    case ARG_MB: {
        double v = strtod(arg, &end);
        if (end == arg || *end || !(v > 0) || isinf(v)) {
            fprintf(stderr, "malleus-replan: --%s expects a positive number, got \"%s\"\n",
                    r->name, arg);
            return -1;
        }
        *(double *)field = v;
        return 0;
    }
    case ARG_SEARCH:
        if (!strcmp(arg, "auto"))
            *(int *)field = MAL_REPLAN_AUTO;
        else if (!strcmp(arg, "exhaustive"))
            *(int *)field = MAL_REPLAN_EXHAUSTIVE;
        else if (!strcmp(arg, "heuristic"))
            *(int *)field = MAL_REPLAN_HEURISTIC;
        else {
            fprintf(stderr, "malleus-replan: --search expects auto, exhaustive or heuristic\n");
            return -1;
        }
        return 0;
    }
    return -1;
}

int main(int argc, char **argv)
{
    struct option longopts[N_ROWS + 1];
    char shortopts[3 * N_ROWS + 1];
    int ns = 0;
    for (int i = 0; i < N_ROWS; i++) {
        int has_arg = rows[i].metavar ? required_argument : no_argument;
        /* long-only options are returned as 256 + their row */
        longopts[i] = (struct option){rows[i].name, has_arg, NULL,
                                      rows[i].letter ? rows[i].letter : 256 + i};
        if (rows[i].letter) {
            shortopts[ns++] = (char)rows[i].letter;
            if (has_arg) shortopts[ns++] = ':';
        }
    }
    longopts[N_ROWS] = (struct option){0, 0, 0, 0};
    shortopts[ns] = '\0';

    mal_replan_opts o;
    mal_replan_opts_init(&o);
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        const opt_row *r = NULL;
        for (int i = 0; i < N_ROWS && !r; i++)
            if (c == (rows[i].letter ? rows[i].letter : 256 + i)) r = &rows[i];
        if (!r) {
            usage(stderr);
            return 2;
        }
        if (r->kind == ARG_HELP) {
            usage(stdout);
            return 0;
        }
        if (r->kind == ARG_VERSION) {
            printf("malleus-replan (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        }
        if (store(r, optarg, &o)) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "malleus-replan: unexpected argument \"%s\" (see --help)\n", argv[optind]);
        return 2;
    }
    int rc = mal_replan_tool_run(&o, stdout, stderr);
    if (rc) fprintf(stderr, "malleus-replan: %s\n", mal_errmsg());
    return mal_replan_exit_status(rc);
}
