/* malleus-replan: the standalone planner.  Reads the cluster, the straggling
 * rates and the model profile, writes a plan (or simulates one).  A thin
 * shell over replan/ (see replan/README.md). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mal.h"
#include "plan.h"
#include "replan.h"
#include "sim.h"

static void usage(FILE *f)
{
    fprintf(
        f, "Usage: malleus-replan [OPTIONS]\n"
           "Plan a non-uniform hybrid-parallel layout for measured straggling rates.\n"
           "\n"
           "Cluster (one of):\n"
           "  -c, --cluster FILE        cluster JSON: {\"world_size\", \"ranks_per_node\" | "
           "\"nodes\", \"memory_mb\"}\n"
           "      --world-size N        number of ranks (with --ranks-per-node and --memory-mb)\n"
           "      --ranks-per-node G    ranks per node (TP groups stay inside a node)\n"
           "      --memory-mb X         device memory per rank in MB\n"
           "Model (one of):\n"
           "  -p, --profile FILE        model profile JSON (may start from {\"preset\": ...})\n"
           "  -m, --model NAME          preset profile: tiny, small, 32b, 70b, 110b\n"
           "Rates:\n"
           "  -r, --rates FILE          {\"rank\": rate} map, or malleus-train metrics (JSON lines "
           "with\n"
           "                            \"rates\"); missing ranks are healthy (1.0)\n"
           "  -w, --window W            metrics: average the last W samples (default 2)\n"
           "Batch:\n"
           "  -b, --micro-batch-size N  samples per micro-batch (default 1)\n"
           "  -M, --micro-batches N     micro-batches per step (total over all pipelines)\n"
           "  -g, --global-batch N      samples per step (alternative to --micro-batches)\n"
           "  -d, --pipelines DP        nominal number of pipelines (default: the current plan's,\n"
           "                            else the largest uniform layout that fits memory)\n"
           "  -C, --current PLAN        the plan now running: keep ranks' state where possible\n"
           "Output:\n"
           "  -o, --output PLAN         write the plan here (atomically); default stdout\n"
           "  -e, --explain             report groups, stages, predicted times, state to move\n"
           "                            (stdout, or stderr when the plan goes to stdout)\n"
           "  -s, --simulate PLAN       do not plan: simulate PLAN event by event (1F1B) and\n"
           "                            compare with the cost model's closed form\n"
           "  -u, --uniform             output the nominal uniform plan instead of planning\n"
           "      --search MODE         auto (default), exhaustive or heuristic\n"
           "      --summary             print one JSON line with times and statistics\n"
           "      --print-profile       print the profile in use as JSON and exit\n"
           "  -h, --help                this help\n"
           "  -V, --version             version\n"
           "\n"
           "Examples:\n"
           "  malleus-replan --world-size 64 --ranks-per-node 8 --memory-mb 81920 --model 70b \\\n"
           "      --micro-batches 128 --rates rates.json --explain -o plan.json\n"
           "  malleus-replan -c cluster.json -p profile.json -r metrics.jsonl -w 2 -g 256 -b 2 \\\n"
           "      --current plan.json -o new-plan.json\n"
           "  malleus-replan -c cluster.json -m 70b -r rates.json -M 128 --simulate new-plan.json\n"
           "\n"
           "Exit status: 0 success, 1 bad input or no feasible plan, 2 usage error.\n");
}

static int parse_int(const char *s, const char *opt, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 1000000000) {
        fprintf(stderr, "malleus-replan: %s expects a non-negative integer, got \"%s\"\n", opt, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

enum { OPT_WORLD = 256, OPT_RPN, OPT_MEM, OPT_SEARCH, OPT_SUMMARY, OPT_PRINT_PROFILE };

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"cluster", required_argument, 0, 'c'},
        {"world-size", required_argument, 0, OPT_WORLD},
        {"ranks-per-node", required_argument, 0, OPT_RPN},
        {"memory-mb", required_argument, 0, OPT_MEM},
        {"profile", required_argument, 0, 'p'},
        {"model", required_argument, 0, 'm'},
        {"rates", required_argument, 0, 'r'},
        {"window", required_argument, 0, 'w'},
        {"micro-batch-size", required_argument, 0, 'b'},
        {"micro-batches", required_argument, 0, 'M'},
        {"global-batch", required_argument, 0, 'g'},
        {"pipelines", required_argument, 0, 'd'},
        {"current", required_argument, 0, 'C'},
        {"output", required_argument, 0, 'o'},
        {"explain", no_argument, 0, 'e'},
        {"simulate", required_argument, 0, 's'},
        {"uniform", no_argument, 0, 'u'},
        {"search", required_argument, 0, OPT_SEARCH},
        {"summary", no_argument, 0, OPT_SUMMARY},
        {"print-profile", no_argument, 0, OPT_PRINT_PROFILE},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    const char *cluster_path = NULL, *profile_path = NULL, *model = NULL, *rates_path = NULL;
    const char *current_path = NULL, *out_path = NULL, *sim_path = NULL;
    int world = 0, rpn = 0, window = 2, mbs = 1, n_mb = 0, gbatch = 0, dp = 0;
    int explain = 0, uniform = 0, summary = 0, print_profile = 0, search = MAL_REPLAN_AUTO;
    double mem = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:p:m:r:w:b:M:g:d:C:o:es:uhV", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            cluster_path = optarg;
            break;
        case OPT_WORLD:
            if (parse_int(optarg, "--world-size", &world)) return 2;
            break;
        case OPT_RPN:
            if (parse_int(optarg, "--ranks-per-node", &rpn)) return 2;
            break;
        case OPT_MEM: {
            char *end;
            mem = strtod(optarg, &end);
            if (end == optarg || *end || !(mem > 0) || isinf(mem)) {
                fprintf(stderr,
                        "malleus-replan: --memory-mb expects a positive number, got \"%s\"\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'p':
            profile_path = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case 'r':
            rates_path = optarg;
            break;
        case 'w':
            if (parse_int(optarg, "--window", &window)) return 2;
            break;
        case 'b':
            if (parse_int(optarg, "--micro-batch-size", &mbs)) return 2;
            break;
        case 'M':
            if (parse_int(optarg, "--micro-batches", &n_mb)) return 2;
            break;
        case 'g':
            if (parse_int(optarg, "--global-batch", &gbatch)) return 2;
            break;
        case 'd':
            if (parse_int(optarg, "--pipelines", &dp)) return 2;
            break;
        case 'C':
            current_path = optarg;
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'e':
            explain = 1;
            break;
        case 's':
            sim_path = optarg;
            break;
        case 'u':
            uniform = 1;
            break;
        case OPT_SEARCH:
            if (!strcmp(optarg, "auto"))
                search = MAL_REPLAN_AUTO;
            else if (!strcmp(optarg, "exhaustive"))
                search = MAL_REPLAN_EXHAUSTIVE;
            else if (!strcmp(optarg, "heuristic"))
                search = MAL_REPLAN_HEURISTIC;
            else {
                fprintf(stderr, "malleus-replan: --search expects auto, exhaustive or heuristic\n");
                return 2;
            }
            break;
        case OPT_SUMMARY:
            summary = 1;
            break;
        case OPT_PRINT_PROFILE:
            print_profile = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("malleus-replan (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "malleus-replan: unexpected argument \"%s\" (see --help)\n", argv[optind]);
        return 2;
    }
    if (mbs < 1) {
        fprintf(stderr, "malleus-replan: --micro-batch-size must be >= 1\n");
        return 2;
    }

    int rc = 0, status = 1;
    mal_cluster cl = {0};
    mal_profile prof = {0};
    mal_plan cur, out, simp;
    double *rates = NULL;
    mal_plan_init(&cur);
    mal_plan_init(&out);
    mal_plan_init(&simp);

    /* model profile */
    if (!!profile_path + !!model != 1) {
        fprintf(
            stderr,
            "malleus-replan: give exactly one of --profile FILE or --model NAME (see --help)\n");
        status = 2;
        goto cleanup;
    }
    rc = profile_path ? mal_profile_read(&prof, profile_path, mbs)
                      : mal_profile_preset(&prof, model, mbs);
    if (rc) goto fail;
    if (print_profile) {
        rc = mal_profile_write(&prof, stdout);
        status = rc ? 1 : 0;
        goto cleanup;
    }
    /* cluster */
    if (cluster_path) {
        if (world || rpn || mem > 0) {
            fprintf(stderr, "malleus-replan: --cluster and "
                            "--world-size/--ranks-per-node/--memory-mb exclude each other\n");
            status = 2;
            goto cleanup;
        }
        rc = mal_cluster_read(&cl, cluster_path);
    } else if (world && rpn && mem > 0) {
        rc = mal_cluster_regular(&cl, world, rpn, mem);
    } else {
        fprintf(stderr, "malleus-replan: give --cluster FILE, or --world-size, --ranks-per-node "
                        "and --memory-mb\n");
        status = 2;
        goto cleanup;
    }
    if (rc) goto fail;
    /* rates */
    rates = malloc((size_t)cl.world_size * sizeof *rates);
    if (!rates) {
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        goto fail;
    }
    for (int r = 0; r < cl.world_size; r++)
        rates[r] = 1.0;
    if (rates_path && (rc = mal_rates_read(rates_path, cl.world_size, window, rates))) goto fail;
    /* current plan */
    if (current_path && (rc = mal_plan_read(&cur, current_path))) goto fail;
    /* batch */
    if (gbatch && n_mb) {
        fprintf(stderr, "malleus-replan: give --micro-batches or --global-batch, not both\n");
        status = 2;
        goto cleanup;
    }
    if (gbatch) {
        if (gbatch % mbs) {
            fprintf(
                stderr,
                "malleus-replan: global batch %d is not a multiple of the micro-batch size %d\n",
                gbatch, mbs);
            goto cleanup;
        }
        n_mb = gbatch / mbs;
    }
    if (!n_mb && current_path) n_mb = mal_plan_n_micro_batches(&cur);
    if (n_mb < 1) {
        fprintf(stderr, "malleus-replan: give --micro-batches or --global-batch (or --current)\n");
        status = 2;
        goto cleanup;
    }
    if (!dp && current_path) dp = cur.n_pipelines;

    mal_replan_input in = {0};
    in.cluster = &cl;
    in.profile = &prof;
    in.rates = rates;
    in.micro_batch_size = mbs;
    in.n_micro_batches = n_mb;
    in.nominal_dp = dp;
    in.current = current_path ? &cur : NULL;
    in.search = search;

    if (sim_path) {
        if ((rc = mal_plan_read(&simp, sim_path))) goto fail;
        if ((rc = mal_plan_validate(
                 &simp, cl.world_size, prof.n_layers, prof.n_heads ? prof.n_heads : 1 << 20,
                 prof.ffn_hidden ? prof.ffn_hidden : 1 << 20, mal_plan_global_batch(&simp))))
            goto fail;
        double sim;
        double *pipe = malloc((size_t)simp.n_pipelines * sizeof *pipe);
        mal_cost_eval ev;
        if (!pipe) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory");
            goto fail;
        }
        if ((rc = mal_sim_plan(&simp, &prof, rates, cl.world_size, 0.0, &sim, pipe)) ||
            (rc = mal_cost_eval_plan(&simp, &prof, &cl, rates, &ev))) {
            free(pipe);
            goto fail;
        }
        double lt = prof.layer_time;
        for (int i = 0; i < simp.n_pipelines; i++)
            printf(
                "pipeline %d: %d stages, %d micro-batches: simulated %.6f s, closed form %.6f s, "
                "bubble-free %.6f s\n",
                i, simp.pipelines[i].n_stages, simp.pipelines[i].micro_batches, pipe[i] * lt,
                ev.time[i] * lt, simp.pipelines[i].micro_batches * ev.period[i] * lt);
        printf("step: simulated %.6f s, closed form %.6f s%s\n", sim * lt + prof.sync_time,
               ev.step_time * lt + prof.sync_time, ev.memory_ok ? "" : " (plan exceeds memory)");
        if (summary)
            printf("{\"simulated\": %.9g, \"closed_form\": %.9g, \"bubble_free\": %.9g}\n",
                   sim * lt + prof.sync_time, ev.step_time * lt + prof.sync_time,
                   ev.bubble_free * lt + prof.sync_time);
        free(pipe);
        mal_cost_eval_fini(&ev);
        status = 0;
        goto cleanup;
    }

    mal_replan_stats st = {0};
    if (uniform) {
        rc = mal_replan_uniform(&in, &out);
        if (!rc) {
            mal_cost_eval ev;
            if (!(rc = mal_cost_eval_plan(&out, &prof, &cl, rates, &ev))) {
                out.predicted_step_time = ev.step_time * prof.layer_time + prof.sync_time;
                mal_cost_eval_fini(&ev);
            }
        }
    } else {
        rc = mal_replan(&in, &out, &st);
    }
    if (rc) goto fail;
    if (out_path) {
        if ((rc = mal_plan_write(&out, out_path))) goto fail;
    } else {
        char *s = NULL;
        if ((rc = mal_plan_to_string(&out, &s))) goto fail;
        fputs(s, stdout);
        free(s);
    }
    if (explain && (rc = mal_replan_explain(out_path ? stdout : stderr, &in, &out))) goto fail;
    if (summary) {
        mal_plan uni;
        mal_cost_eval eu = {0};
        double tu = NAN, sim = NAN, simu = NAN;
        if (mal_replan_uniform(&in, &uni) == 0) {
            if (mal_cost_eval_plan(&uni, &prof, &cl, rates, &eu) == 0) tu = eu.step_time;
            mal_sim_plan(&uni, &prof, rates, cl.world_size, 0.0, &simu, NULL);
            mal_cost_eval_fini(&eu);
            mal_plan_fini(&uni);
        }
        mal_sim_plan(&out, &prof, rates, cl.world_size, 0.0, &sim, NULL);
        double bound = mal_cost_capacity_bound(&prof, cl.world_size, rates, n_mb);
        double lt = prof.layer_time;
        int n_strag = 0;
        for (int r = 0; r < cl.world_size; r++)
            n_strag += rates[r] >= MAL_REPLAN_NOISE_FLOOR;
        FILE *sf = out_path ? stdout : stderr;
        fprintf(
            sf,
            "{\"ranks\": %d, \"stragglers\": %d, \"suspended\": %d, \"pipelines\": %d, "
            "\"plan_seconds\": %.6f, \"step\": %.9g, \"simulated\": %.9g, \"uniform\": %.9g, "
            "\"uniform_simulated\": %.9g, \"bound\": %.9g, \"layer_lps\": %d, \"candidates\": %d, "
            "\"pruned\": %d, \"exhaustive\": %d}\n",
            cl.world_size, n_strag, out.n_suspended, out.n_pipelines, st.seconds,
            out.predicted_step_time, sim * lt + prof.sync_time, tu * lt + prof.sync_time,
            simu * lt + prof.sync_time, bound * lt + prof.sync_time, st.n_layer_lps,
            st.n_candidates, st.n_pruned, st.exhaustive);
    }
    status = 0;
    goto cleanup;
fail:
    fprintf(stderr, "malleus-replan: %s\n", mal_errmsg());
    status = 1;
cleanup:
    free(rates);
    mal_plan_fini(&cur);
    mal_plan_fini(&out);
    mal_plan_fini(&simp);
    mal_cluster_fini(&cl);
    mal_profile_fini(&prof);
    return status;
}
