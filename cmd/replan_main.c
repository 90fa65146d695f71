/* malleus-replan: the option table (base/opts.h, which also prints --help)
 * and one call into the library (replan/tool.h carries out what the flags
 * describe); replan/README.md describes the planner.  A new flag is a line
 * below and a field of mal_replan_opts. */
#include "base/mal.h"
#include "base/opts.h"
#include "replan/replan.h"
#include "replan/tool.h"

static const char *const search_modes[] = {"auto", "exhaustive", "heuristic", NULL};
static const int search_values[] = {MAL_REPLAN_AUTO, MAL_REPLAN_EXHAUSTIVE, MAL_REPLAN_HEURISTIC};
static const char *const on_off[] = {"on", "off", NULL};
static const int on_off_values[] = {1, 0};
static const char *const precisions[] = {"fp32", "bf16", NULL};
static const int precision_values[] = {0, 1};

int main(int argc, char **argv)
{
    static mal_replan_opts o;
    mal_replan_opts_init(&o);
    const mal_opt opts[] = {
        {MAL_OPT_SECTION, .help = "Cluster (one of):"},
        {MAL_OPT_STRING, "cluster", 'c', "FILE", .target = &o.cluster_path,
         .help = "cluster JSON: {\"world_size\", \"ranks_per_node\" | \"nodes\", \"memory_mb\"};\n"
                 "mixed hardware: \"types\": {NAME: {\"memory_mb\", \"speed\" | \"profile\"}}\n"
                 "and \"node_types\": [NAME per node] instead of \"memory_mb\"; a type's\n"
                 "\"profile\" (a file beside the cluster file, or a preset) gives its\n"
                 "memory per layer and its speed; --profile is the fastest type's"},
        {MAL_OPT_INT, "world-size", 0, "N", .target = &o.world_size, .lo = 1, .hi = 1000000000,
         .help = "number of ranks (with --ranks-per-node and --memory-mb)"},
        {MAL_OPT_INT, "ranks-per-node", 0, "G", .target = &o.ranks_per_node, .lo = 1,
         .hi = 1000000000, .help = "ranks per node (TP groups stay inside a node)"},
        {MAL_OPT_DOUBLE, "memory-mb", 0, "X", .target = &o.memory_mb, .flo = 1e-300, .fhi = 1e300,
         .help = "device memory per rank in MB"},
        {MAL_OPT_SECTION, .help = "Model (one of):"},
        {MAL_OPT_STRING, "profile", 'p', "FILE", .target = &o.profile_path,
         .help = "model profile JSON (may start from {\"preset\": ...})"},
        {MAL_OPT_STRING, "model", 'm', "NAME", .target = &o.model,
         .help = "preset profile, every model preset of malleus-train:\n"
                 "tiny, tiny-llama3, small, 124m, 1b, llama3-1b, llama2-7b,\n"
                 "32b, 70b, 110b"},
        {MAL_OPT_SECTION, .help = "Rates:"},
        {MAL_OPT_STRING, "rates", 'r', "FILE", .target = &o.rates_path,
         .help = "{\"rank\": rate} map, or malleus-train metrics (JSON lines with\n"
                 "\"rates\"); missing ranks are healthy (1.0)"},
        {MAL_OPT_INT, "window", 'w', "W", .target = &o.window, .lo = 1, .hi = 1000000000,
         .help = "metrics: average the last W samples (default 2)"},
        {MAL_OPT_STRING, "links", 'l', "FILE", .target = &o.links_path,
         .help = "slow links: {\"links\": [{\"a\", \"b\", \"rate\"}]} (rate: times a healthy\n"
                 "link's time), or JSON lines with \"link_rates\": [[a, b, rate]];\n"
                 "the plan keeps traffic off them (replan/README.md \"Links\")"},
        {MAL_OPT_FLAG, "compute-only", 0, .target = &o.compute_only, .ival = 1,
         .help = "plan for compute alone: the slow links are priced in the\n"
                 "reports (--explain, --simulate) but not placed around"},
        {MAL_OPT_INT, "zero", 0, "0|1", .target = &o.zero, .lo = 0, .hi = 1,
         .help = "the run's Adam moments: 0 whole on every replica, 1\n"
                 "sharded over each layer's replicas (the default, as\n"
                 "malleus-train's where a plan has replicas): a stage's\n"
                 "memory then depends on the plan's pipelines"},
        {MAL_OPT_CHOICE, "zero-master", 0, "on|off", .target = &o.zero_master, .choices = on_off,
         .values = on_off_values,
         .help = "with --zero 1: the run shards the fp32 master too\n"
                 "(malleus-train --zero-master; counted only where the\n"
                 "profile's state_bytes holds a working copy apart, as\n"
                 "bf16's). Default: as --zero, as malleus-train's"},
        {MAL_OPT_CHOICE, "precision", 0, "fp32|bf16", .target = &o.precision, .choices = precisions,
         .values = precision_values,
         .help = "the run's compute (malleus-train --precision), for\n"
                 "the bytes of its state: bf16 keeps a bf16 working copy\n"
                 "beside the fp32 master, gradient and moments (18 bytes\n"
                 "a parameter), fp32 does not (16); the profile's figures\n"
                 "are re-counted. Default: the profile's own (a preset's\n"
                 "16; a measured profile's as measured)"},
        {MAL_OPT_STRING, "recompute", 0, "MODE", .target = &o.recompute,
         .help = "activation recomputation the plan may use: auto (the\n"
                 "default: per stage, only where a stage would not fit\n"
                 "otherwise or the plan is faster with it), none, or\n"
                 "selective / full on every stage (replan/README.md\n"
                 "\"Recomputation\")"},
        {MAL_OPT_SECTION, .help = "Batch:"},
        {MAL_OPT_INT, "micro-batch-size", 'b', "N", .target = &o.micro_batch_size, .lo = 1,
         .hi = 1000000000, .help = "samples per micro-batch (default 1)"},
        {MAL_OPT_INT, "micro-batches", 'M', "N", .target = &o.n_micro_batches, .lo = 1,
         .hi = 1000000000, .help = "micro-batches per step (total over all pipelines)"},
        {MAL_OPT_INT, "global-batch", 'g', "N", .target = &o.global_batch, .lo = 1,
         .hi = 1000000000, .help = "samples per step (alternative to --micro-batches)"},
        {MAL_OPT_INT, "pipelines", 'd', "DP", .target = &o.pipelines, .lo = 1, .hi = 1000000000,
         .help = "nominal number of pipelines (default: the current plan's,\n"
                 "else the largest uniform layout that fits memory)"},
        {MAL_OPT_STRING, "current", 'C', "PLAN", .target = &o.current_path,
         .help = "the plan now running: keep ranks' state where possible"},
        {MAL_OPT_SECTION, .help = "Output:"},
        {MAL_OPT_STRING, "output", 'o', "PLAN", .target = &o.out_path,
         .help = "write the plan here (atomically); default stdout"},
        {MAL_OPT_FLAG, "explain", 'e', .target = &o.explain, .ival = 1,
         .help = "report groups, stages, predicted times, each stage's\n"
                 "memory terms, state to move (stdout, or stderr when the\n"
                 "plan goes to stdout; with --simulate: the memory terms)"},
        {MAL_OPT_STRING, "simulate", 's', "PLAN", .target = &o.simulate_path,
         .help = "do not plan: simulate PLAN event by event (1F1B) and\n"
                 "compare with the cost model's closed form"},
        {MAL_OPT_FLAG, "uniform", 'u', .target = &o.uniform, .ival = 1,
         .help = "output the nominal uniform plan instead of planning"},
        {MAL_OPT_CHOICE, "search", 0, "MODE", .target = &o.search, .choices = search_modes,
         .values = search_values, .help = "auto (default), exhaustive or heuristic"},
        {MAL_OPT_DOUBLE, "time-limit", 0, "SECONDS", .target = &o.time_limit, .flo = 0, .fhi = 1e9,
         .help = "stop searching after SECONDS and write the best plan\n"
                 "found, with its gap to the lower bound (--explain;\n"
                 "stderr when the limit stops it); 0: no limit (default 60)"},
        {MAL_OPT_FLAG, "summary", 0, .target = &o.summary, .ival = 1,
         .help = "print one JSON line with times and statistics"},
        {MAL_OPT_FLAG, "print-profile", 0, .target = &o.print_profile, .ival = 1,
         .help = "print the profile in use as JSON and exit"},
        {MAL_OPT_HELP, "help", 'h', .help = "this help"},
        {MAL_OPT_VERSION, "version", 'V', .help = "version"},
        {.kind = MAL_OPT_END},
    };
    const mal_opts_spec spec = {
        "malleus-replan", PACKAGE_VERSION,
        "Usage: malleus-replan [OPTIONS]\n"
        "Plan a non-uniform hybrid-parallel layout for measured straggling rates.\n",
        "\nExamples:\n"
        "  malleus-replan --world-size 64 --ranks-per-node 8 --memory-mb 81920 --model 70b \\\n"
        "      --micro-batches 128 --rates rates.json --explain -o plan.json\n"
        "  malleus-replan -c cluster.json -p profile.json -r metrics.jsonl -w 2 -g 256 -b 2 \\\n"
        "      --current plan.json -o new-plan.json\n"
        "  malleus-replan -c cluster.json -m 70b -r rates.json -M 128 --simulate new-plan.json\n"
        "\n"
        "Exit status: 0 success; 2 bad usage or input, including a cluster too small\n"
        "for the model (the message names what to fix); 1 any other failure.\n",
        opts, NULL, NULL};
    int status = mal_opts_parse(&spec, argc, argv, NULL);
    if (status >= 0) return status;
    int rc = mal_replan_tool_run(&o, stdout, stderr);
    if (rc) fprintf(stderr, "malleus-replan: %s\n", mal_errmsg());
    return mal_exit_status(rc); /* the rule every command follows (mal.h) */
}
