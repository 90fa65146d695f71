/* Mixed hardware in the planner's search (replan/README.md, "Mixed
 * hardware"): each device type's own memory and profile, on small
 * clusters whose optimum is worked out by hand below.
 *
 * The model: 8 layers, nominal TP 2 (alpha 1 at TP 2, 1.9 at TP 1), a
 * layer holds 10 MB per rank at any depth at TP 2 (20 MB at TP 1: the
 * nominal scaling), no embedding or overhead, so a group of two ranks of
 * memory m holds floor(m / 10) layers anywhere and a single rank
 * floor(m / 20).  Two nodes of two ranks: one node of type "big", one of
 * type "small"; 8 micro-batches; step time T = (m + S - 1) P in layer
 * units (layer_time 1 s). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mal_test.h"
#include "replan/replan.h"
#include "replan_test.h"
#include "src/plan.h"

#define PROFILE                                                                                    \
    "{\"name\": \"%s\", \"n_layers\": 8, \"tp\": 2, \"n_heads\": 8, \"ffn_hidden\": 64, "          \
    "\"alpha\": {\"2\": 1.0, \"1\": 1.9}, \"layer_memory_mb\": [%g, %g], "                         \
    "\"embedding_memory_mb\": 0, \"overhead_mb\": 0, \"layer_time\": %g}"

static void profile(mal_profile *p, const char *name, double k, double lt)
{
    char js[512];
    snprintf(js, sizeof js, PROFILE, name, k, k, lt);
    CHECK_OK(mal_profile_parse_string(p, js, "profile", 1));
}

static void cluster(mal_cluster *c, double big_mb, double small_mb, const char *small_extra)
{
    char js[1024];
    snprintf(js, sizeof js,
             "{\"nodes\": [[0, 1], [2, 3]], \"types\": {\"big\": {\"memory_mb\": %g}, "
             "\"small\": {\"memory_mb\": %g%s}}, \"node_types\": [\"big\", \"small\"]}",
             big_mb, small_mb, small_extra);
    CHECK_OK(mal_cluster_parse_string(c, js, "cluster.json"));
}

static int plan(const mal_cluster *c, const mal_profile *p, mal_plan *out, mal_replan_stats *st)
{
    static double rates[4];
    for (int r = 0; r < 4; r++)
        rates[r] = 1.0;
    mal_cluster_effective_rates(c, rates, rates);
    mal_replan_input in = mal_test_replan_input(c, p, rates, 1, 8);
    in.search = MAL_REPLAN_AUTO;
    int rc = mal_replan(&in, out, st);
    if (rc) return rc;
    /* whatever the plan: every stage within one type and within its
     * type's memory, and the written plan is what the cost model says */
    mal_cost_eval ev;
    CHECK_OK(mal_plan_validate(out, 4, 8, 8, 64, 8));
    CHECK_OK(mal_cost_eval_plan(out, p, c, rates, &ev));
    CHECK(ev.memory_ok);
    CHECK_CLOSE(ev.step_time * p->layer_time, out->predicted_step_time, 1e-9, 0);
    mal_cost_eval_fini(&ev);
    for (int i = 0; i < out->n_pipelines; i++)
        for (int j = 0; j < out->pipelines[i].n_stages; j++) {
            const mal_plan_stage *s = &out->pipelines[i].stages[j];
            for (int k = 0; k < s->n_ranks; k++)
                CHECK_EQ_INT(mal_cluster_rank_type(c, s->ranks[k]),
                             mal_cluster_rank_type(c, s->ranks[0]));
        }
    return 0;
}

/* layers the stages of type `name` hold, and how many such stages */
static int layers_on(const mal_cluster *c, const mal_plan *pl, const char *name, int *most)
{
    int n = 0;
    *most = 0;
    for (int i = 0; i < pl->n_pipelines; i++)
        for (int j = 0; j < pl->pipelines[i].n_stages; j++) {
            const mal_plan_stage *s = &pl->pipelines[i].stages[j];
            if (strcmp(c->types[mal_cluster_rank_type(c, s->ranks[0])].name, name)) continue;
            n++;
            if (s->layer_end - s->layer_begin > *most) *most = s->layer_end - s->layer_begin;
        }
    return n;
}

/* Both types at speed 1; "small" holds 2 layers (25 MB), "big" all 8
 * (1000 MB).  Sized for the least memory no plan would exist (2 + 2 < 8).
 * With each type's own memory: [big 6, small 2] in one pipeline, P = 6,
 * T = (8 + 1) 6 = 54; the alternatives are slower: big alone, P = 8, T =
 * 64; [big as two TP-1 groups 3 + 3, small 2], P = 5.7, S = 3, T = 57;
 * [big 3 + 3, small as two TP-1 groups 1 + 1], T = (8 + 3) 5.7 = 62.7;
 * [big TP 1 alone] and [big TP 1 6, small 2] as two pipelines: 60.8. */
static void check_memory_cap(void)
{
    mal_cluster c;
    mal_profile p;
    mal_plan pl;
    mal_replan_stats st;
    profile(&p, "main", 10, 1.0);
    cluster(&c, 1000, 25, "");
    CHECK_OK(plan(&c, &p, &pl, &st));
    int most, n_small = layers_on(&c, &pl, "small", &most);
    printf("memory cap: step %.3f s, %d stages on the small type, at most %d layers there\n",
           pl.predicted_step_time, n_small, most);
    CHECK_CLOSE(pl.predicted_step_time, 54.0, 1e-9, 0);
    CHECK_EQ_INT(n_small, 1);
    CHECK(most <= 2);
    layers_on(&c, &pl, "big", &most);
    CHECK_EQ_INT(most, 6);
    mal_plan_fini(&pl);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* No type holds enough: big 30 MB (3 layers), small 25 MB (2); 5 < 8
 * layers.  The refusal names each type, its memory and the need (two
 * stages of TP 2: 4 layers of 10 MB on the first). */
static void check_no_plan(void)
{
    mal_cluster c;
    mal_profile p;
    mal_plan pl;
    mal_replan_stats st;
    profile(&p, "main", 10, 1.0);
    cluster(&c, 30, 25, "");
    CHECK_EQ_INT(plan(&c, &p, &pl, &st), MAL_EINVAL);
    const char *m = mal_errmsg();
    printf("no plan: %s\n", m);
    CHECK(strstr(m, "type big: memory_mb = 30, need 40.0 MB") != NULL);
    CHECK(strstr(m, "type small: memory_mb = 25, need 40.0 MB") != NULL);
    mal_clearerr();
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

/* The small type's profile file `path` holding `json` is refused, the
 * message saying `a` and `b`. */
static void refuse_profile(const char *dir, const char *path, const mal_profile *p,
                           const char *json, const char *a, const char *b)
{
    mal_cluster c;
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(json, f);
    fclose(f);
    cluster(&c, 1000, 85, ", \"profile\": \"small.json\"");
    CHECK(mal_cluster_load_profiles(&c, dir, p, 1) == MAL_EINVAL);
    printf("refused: %s\n", mal_errmsg());
    CHECK(strstr(mal_errmsg(), a) && strstr(mal_errmsg(), b));
    mal_clearerr();
    mal_cluster_fini(&c);
}

/* "small" has a profile of its own: 40 MB per layer and layer_time 1.25
 * (speed 0.8: rate 1.25).  In 85 MB it holds 2 layers (with --profile's
 * 10 MB it would hold 8).  Its speed alone would give [big 4, small 4]
 * or [big 5, small 3], P = 5, T = 45; its memory allows 2: [big 6, small
 * 2], P = max(6, 2.5) = 6, T = 54 (big alone: 64). */
static void check_type_profile(void)
{
    char dir[] = "/tmp/test_replan_types.XXXXXX", path[256];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/small.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, PROFILE, "small-hw", 40.0, 40.0, 1.25);
    fclose(f);
    mal_cluster c;
    mal_profile p;
    mal_plan pl;
    mal_replan_stats st;
    profile(&p, "main", 10, 1.0);
    cluster(&c, 1000, 85, ", \"profile\": \"small.json\"");
    /* relative to the cluster file's folder */
    CHECK_OK(mal_cluster_load_profiles(&c, dir, &p, 1));
    CHECK_CLOSE(c.types[1].speed, 0.8, 1e-12, 0);
    CHECK(mal_cluster_rank_profile(&c, 2, &p) == c.types[1].profile);
    CHECK(mal_cluster_rank_profile(&c, 0, &p) == &p);
    CHECK_OK(plan(&c, &p, &pl, &st));
    int most, n_small = layers_on(&c, &pl, "small", &most);
    printf("type profile: step %.3f s, %d stages on the small type, at most %d layers there\n",
           pl.predicted_step_time, n_small, most);
    CHECK_CLOSE(pl.predicted_step_time, 54.0, 1e-9, 0);
    CHECK(n_small == 1 && most == 2);
    mal_plan_fini(&pl);
    mal_cluster_fini(&c);

    /* refusals name the field */
    cluster(&c, 1000, 85, ", \"profile\": \"missing.json\"");
    CHECK(mal_cluster_load_profiles(&c, dir, &p, 1) != 0);
    CHECK(strstr(mal_errmsg(), "types.small.profile") != NULL);
    mal_clearerr();
    mal_cluster_fini(&c);
    refuse_profile(dir, path, &p,
                   "{\"name\": \"other\", \"n_layers\": 6, \"tp\": 2, \"alpha\": {\"2\": 1.0}, "
                   "\"layer_memory_mb\": [1], \"embedding_memory_mb\": 0, \"overhead_mb\": 0, "
                   "\"layer_time\": 1}",
                   "types.small.profile", "n_layers");
    /* a type faster than --profile: times would be priced at the wrong
     * layer_time */
    char fast[512];
    snprintf(fast, sizeof fast, PROFILE, "fast-hw", 10.0, 10.0, 0.5);
    refuse_profile(dir, path, &p, fast, "types.small", "fastest");
    /* a preset name: the model's other presets describe other models */
    cluster(&c, 1000, 85, ", \"profile\": \"tiny\"");
    CHECK(mal_cluster_load_profiles(&c, dir, &p, 1) == MAL_EINVAL);
    mal_clearerr();
    mal_cluster_fini(&c);
    /* speed and profile: two figures that could disagree */
    CHECK(mal_cluster_parse_string(&c,
                                   "{\"world_size\": 4, \"ranks_per_node\": 2, \"types\": {\"a\": "
                                   "{\"memory_mb\": 1, \"speed\": 0.5, \"profile\": \"tiny\"}}, "
                                   "\"node_types\": [\"a\", \"a\"]}",
                                   "cluster.json") == MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "types.a") && strstr(mal_errmsg(), "not both"));
    mal_clearerr();
    mal_cluster_fini(&c);
    CHECK(mal_cluster_parse_string(&c,
                                   "{\"world_size\": 4, \"ranks_per_node\": 2, \"types\": {\"a\": "
                                   "{\"memory_mb\": 1, \"profile\": 3}}, "
                                   "\"node_types\": [\"a\", \"a\"]}",
                                   "cluster.json") == MAL_EINVAL);
    CHECK(strstr(mal_errmsg(), "types.a.profile") != NULL);
    mal_clearerr();
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
    unlink(path);
    rmdir(dir);
}

/* The local search's start on a mixed cluster where no construction fits:
 * 4 nodes of 4 ranks, TP 4 only; node 0 of type "a" (a straggler at 2.62:
 * no healthy group), nodes 1-3 of type "b", whose groups hold at most one
 * layer and none on a first stage.  A group of "a" holds 5 layers alone, 6
 * as a last stage: the only plans are one pipeline [b, a] (1 + 6 = 7
 * layers) with the other two "b" nodes suspended -- one node of a
 * situation in, the others out, which the heuristic search used to miss
 * ("no plan fits").  It must find the exhaustive search's plan. */
static void check_grow(void)
{
    static const char *const prof[2] = {
        "{\"name\": \"a\", \"n_layers\": 7, \"tp\": 4, \"alpha\": {\"4\": 1.0}, "
        "\"layer_memory_mb\": [1.0, 1.2256135], \"embedding_memory_mb\": 0.181008, "
        "\"overhead_mb\": 1.0, \"layer_time\": 0.01}",
        "{\"name\": \"b\", \"n_layers\": 7, \"tp\": 4, \"alpha\": {\"4\": 1.01542}, "
        "\"layer_memory_mb\": [1.5464, 1.67789], \"embedding_memory_mb\": 0.434045, "
        "\"overhead_mb\": 1.0, \"layer_time\": 0.01}"};
    mal_profile p;
    mal_cluster c;
    CHECK_OK(mal_profile_parse_string(&p, prof[0], "a", 1));
    CHECK_OK(
        mal_cluster_parse_string(&c,
                                 "{\"world_size\": 16, \"ranks_per_node\": 4, \"types\": "
                                 "{\"a\": {\"memory_mb\": 7.3190755}, \"b\": {\"memory_mb\": "
                                 "3.1219386729675}}, \"node_types\": [\"a\", \"b\", \"b\", \"b\"]}",
                                 "cluster.json"));
    for (int t = 0; t < c.n_types; t++)
        if (!strcmp(c.types[t].name, "b")) {
            CHECK((c.types[t].profile = calloc(1, sizeof *c.types[t].profile)) != NULL);
            CHECK_OK(mal_profile_parse_string(c.types[t].profile, prof[1], "b", 1));
        }
    double rates[16];
    for (int r = 0; r < 16; r++)
        rates[r] = 1.0;
    rates[3] = 2.621;
    mal_replan_input in = mal_test_replan_input(&c, &p, rates, 1, 6);
    mal_plan full, heur;
    mal_replan_stats st;
    in.search = MAL_REPLAN_EXHAUSTIVE;
    CHECK_OK(mal_replan(&in, &full, &st));
    in.search = MAL_REPLAN_HEURISTIC;
    CHECK_OK(mal_replan(&in, &heur, &st));
    printf("grow: exhaustive %.5f s, heuristic %.5f s, %d pipeline(s), %d suspended\n",
           full.predicted_step_time, heur.predicted_step_time, heur.n_pipelines, heur.n_suspended);
    CHECK_CLOSE(heur.predicted_step_time, full.predicted_step_time, 1e-12, 0);
    CHECK(heur.n_pipelines == 1 && heur.pipelines[0].n_stages == 2 && heur.n_suspended == 8);
    mal_plan_fini(&full);
    mal_plan_fini(&heur);
    mal_cluster_fini(&c);
    mal_profile_fini(&p);
}

int main(void)
{
    check_memory_cap();
    check_no_plan();
    check_type_profile();
    check_grow();
    return 0;
}
