/* The planner's parsers of outside input (cluster, model profile, rates and
 * metrics lines, and the plan through the planner) against hostile but
 * realistic input (a review of the planner's inputs): each case must be refused with
 * a message naming the field, or give a correct plan -- never read freed
 * memory, overflow, allocate without bound or fail inside lp_solve.  The
 * byte-buffer entry points (no terminating NUL, embedded NULs) are the ones
 * the fuzz harnesses call. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mal_test.h"
#include "replan/replan.h"
#include "src/plan.h"

/* the call failed with `code` and its message contains `what` */
#define CHECK_REFUSED(call, code, what)                                                            \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != (code) || !strstr(mal_errmsg(), (what))) {                                      \
            fprintf(stderr, "%s:%d: %s gave %d (%s), wanted %d with \"%s\"\n", __FILE__, __LINE__, \
                    #call, rc_, mal_errmsg(), (code), (what));                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A metrics line with more rates than the world: the message says how many
 * (the rates reader used to read the array's size after freeing it). */
static void test_metrics_too_many_rates(void)
{
    double rates[8];
    const char *line = "{\"step\": 1, \"rates\": [1, 1, 1, 9, 1, 1, 1, 1, 1, 1]}\n";
    CHECK_REFUSED(mal_rates_parse_string(line, "m.jsonl", 8, 2, rates), MAL_EINVAL,
                  "rates for 10 ranks");
}

/* A world too large to plan is refused before anything is allocated. */
static void test_world_too_large(void)
{
    mal_cluster c;
    CHECK_REFUSED(mal_cluster_regular(&c, MAL_REPLAN_MAX_WORLD * 2, 8, 100.0), MAL_EINVAL,
                  "world_size");
    mal_cluster_fini(&c);
    CHECK_REFUSED(mal_cluster_regular(&c, 1000000000, 8, 100.0), MAL_EINVAL, "world_size");
    mal_cluster_fini(&c);
    /* a world_size past 2^31 is reported as written, not wrapped */
    CHECK_REFUSED(mal_cluster_parse_string(
                      &c, "{\"world_size\": 2147483648, \"ranks_per_node\": 8, \"memory_mb\": 100}",
                      "cl.json"),
                  MAL_EINVAL, "world_size");
    CHECK(strstr(mal_errmsg(), "2147483648") && !strstr(mal_errmsg(), "-2147483648"));
    mal_cluster_fini(&c);
    CHECK_REFUSED(mal_cluster_parse_string(
                      &c, "{\"world_size\": 64, \"ranks_per_node\": 4294967304, \"memory_mb\": 100}",
                      "cl.json"),
                  MAL_EINVAL, "ranks_per_node");
    mal_cluster_fini(&c);
}

/* `nodes` and `world_size` together: one of them is ignored or both must
 * agree -- refuse and say so. */
static void test_cluster_both_forms(void)
{
    mal_cluster c;
    CHECK_REFUSED(mal_cluster_parse_string(&c,
                                           "{\"world_size\": 8, \"ranks_per_node\": 4, "
                                           "\"memory_mb\": 100, \"nodes\": [[0,1,2,3],[4,5,6,7]]}",
                                           "cl.json"),
                  MAL_EINVAL, "nodes");
    mal_cluster_fini(&c);
    CHECK_REFUSED(
        mal_cluster_parse_string(
            &c, "{\"world_size\": 8, \"memory_mb\": 100, \"nodes\": [[0,1,2,3],[4,5,6,7]]}",
            "cl.json"),
        MAL_EINVAL, "world_size");
    mal_cluster_fini(&c);
    /* each form alone is fine */
    CHECK_OK(mal_cluster_parse_string(&c, "{\"memory_mb\": 100, \"nodes\": [[0,1,2,3],[4,5,6,7]]}",
                                      "cl.json"));
    CHECK_EQ_INT(c.world_size, 8);
    mal_cluster_fini(&c);
}

/* n_heads that the nominal TP size does not divide: the profile is refused
 * (it used to end in "internal error: the plan fails validation"). */
static void test_profile_heads(void)
{
    mal_profile p;
    CHECK_REFUSED(mal_profile_parse_string(&p, "{\"preset\": \"tiny\", \"n_heads\": 3}", "p.json", 1),
                  MAL_EINVAL, "n_heads");
    mal_profile_fini(&p);
    CHECK_REFUSED(
        mal_profile_parse_string(&p, "{\"preset\": \"tiny\", \"ffn_hidden\": 33}", "p.json", 1),
        MAL_EINVAL, "ffn_hidden");
    mal_profile_fini(&p);
}

/* A rank a trillion times slower than a healthy one: a plan that suspends
 * it (it used to end in "lp_solve ... status 25"). */
static void test_huge_rate(void)
{
    mal_cluster c;
    mal_profile p;
    mal_plan out;
    double rates[8];
    CHECK_OK(mal_cluster_regular(&c, 8, 4, 100.0));
    CHECK_OK(mal_profile_preset(&p, "tiny", 1));
    CHECK_OK(mal_rates_parse_string("{\"3\": 1e12}", "r.json", 8, 2, rates));
    mal_replan_input in = {&c, &p, rates, 1, 8, 0, NULL, MAL_REPLAN_AUTO, 0, NULL};
    CHECK_OK(mal_replan(&in, &out, NULL));
    CHECK_EQ_INT(out.n_suspended, 1);
    CHECK_EQ_INT(out.suspended[0], 3);
    mal_plan_fini(&out);
    mal_profile_fini(&p);
    mal_cluster_fini(&c);
}

/* A mutated plan whose global batch does not fit an int: the counts say so
 * instead of overflowing (src/plan.c:741), and validation names the field. */
static void test_plan_batch_overflow(void)
{
    mal_plan plan;
    const char *text = "{\"format\": \"malleus-plan/1\", \"micro_batch_size\": 2147483647,"
                       " \"pipelines\": [{\"micro_batches\": 2, \"stages\": [{\"ranks\": [0],"
                       " \"layers\": [0, 2]}]}]}";
    CHECK_OK(mal_plan_parse_string(&plan, text, "plan.json"));
    CHECK_EQ_INT(mal_plan_global_batch(&plan), -1);
    CHECK_REFUSED(mal_plan_validate(&plan, 1, 2, 8, 8, 4), MAL_EINVAL, "micro_batch_size");
    mal_plan_fini(&plan);
    const char *text2 = "{\"format\": \"malleus-plan/1\", \"micro_batch_size\": 1,"
                        " \"pipelines\": [{\"micro_batches\": 2147483647, \"stages\": [{\"ranks\":"
                        " [0], \"layers\": [0, 2]}]}, {\"micro_batches\": 2147483647, \"stages\":"
                        " [{\"ranks\": [1], \"layers\": [0, 2]}]}]}";
    CHECK_OK(mal_plan_parse_string(&plan, text2, "plan.json"));
    CHECK_EQ_INT(mal_plan_n_micro_batches(&plan), -1);
    CHECK_EQ_INT(mal_plan_global_batch(&plan), -1);
    CHECK_REFUSED(mal_plan_validate(&plan, 2, 2, 8, 8, 4), MAL_EINVAL, "micro_batches");
    mal_plan_fini(&plan);
}

/* Grouped-query attention in the preset profiles: tiny-llama3 is tiny with
 * 2 key/value heads for 8 query heads (and vocabulary 259), so per layer
 * it keeps the same query, output and MLP state and activations but only
 * its own key/value heads' -- one head (8 rows of 64) per rank at TP 2,
 * and still one at TP 8, where they are replicated (as many rows as a
 * rank of tiny holds there: no saving left): its memory per layer and its
 * layer time are tiny's less exactly the key/value difference, written
 * out here from the shapes (micro-batch 2, T 32, C 64). */
static void test_profile_gqa(void)
{
    const double MB = 1048576.0, C = 64, T = 32, b = 2, hd = 8;
    for (int tp = 2; tp <= 8; tp *= 4) {
        mal_profile mha, gqa;
        CHECK_OK(mal_profile_preset_tp(&mha, "tiny", 2, tp));
        CHECK_OK(mal_profile_preset_tp(&gqa, "tiny-llama3", 2, tp));
        /* key/value width per rank: tiny's C / tp, tiny-llama3's one head */
        const double kv_mha = C / tp, kv_gqa = hd;
        for (int d = 0; d < 3; d++) {
            double want = mal_profile_k(&mha, d) -
                          (16 * 2 * C * (kv_mha - kv_gqa) + 4 * T * b * (kv_mha - kv_gqa) * (d + 1)) /
                              MB;
            CHECK_CLOSE(mal_profile_k(&gqa, d), want, 1e-12, 0);
        }
        CHECK_CLOSE(gqa.layer_time, mha.layer_time - 6 * 2 * C * (kv_mha - kv_gqa) * T * b / 2e9,
                    1e-12, 0);
        /* 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64 parameters for tiny, the
         * key/value projections 2 * 64 * 16 instead of 2 * 64 * 64 */
        CHECK_CLOSE(mha.layer_state_mb - gqa.layer_state_mb, 16.0 * 2 * 64 * 48 / MB, 1e-12, 0);
        mal_profile_fini(&mha);
        mal_profile_fini(&gqa);
    }
}

/* Every case, or only the one named on the command line. */
int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"metrics_too_many_rates", test_metrics_too_many_rates},
        {"world_too_large", test_world_too_large},
        {"cluster_both_forms", test_cluster_both_forms},
        {"profile_heads", test_profile_heads},
        {"profile_gqa", test_profile_gqa},
        {"huge_rate", test_huge_rate},
        {"plan_batch_overflow", test_plan_batch_overflow},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || !strcmp(argv[1], cases[i].name)) {
            cases[i].fn();
            printf("test_replan_inputs: %s ok\n", cases[i].name);
        }
    return 0;
}
