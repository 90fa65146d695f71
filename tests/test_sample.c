/* Tests of the next-token choice and the prompt/text helpers (src/sample.c):
 * greedy is the argmax (lowest id on ties); draws follow softmax(l / temp)
 * restricted to the top k, measured over many draws against the exact
 * probabilities; the same draw index gives the same token; prompts parse
 * as bytes or as ids, and bad ids are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "mal_test.h"
#include "src/sample.h"

enum { V = 6, DRAWS = 40000 };

/* Observed frequencies of each token over DRAWS draws vs the exact
 * softmax(l / temp) over the top k (k = 0: all): |f - p| <= 0.012. */
static void check_distribution(const float *l, float temp, int k)
{
    mal_sample_options o = {temp, k, 7};
    int count[V] = {0};
    for (int d = 0; d < DRAWS; d++) {
        int t = mal_sample_pick(l, V, &o, (uint64_t)d);
        CHECK(t >= 0 && t < V);
        count[t]++;
        CHECK_EQ_INT(mal_sample_pick(l, V, &o, (uint64_t)d), t); /* a pure function */
    }
    /* the exact distribution: rank tokens by logit (ties: lower id) */
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (l[order[j]] > l[order[i]] || (l[order[j]] == l[order[i]] && order[j] < order[i])) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    const int kk = k > 0 && k < V ? k : V;
    double p[V] = {0}, sum = 0;
    for (int i = 0; i < kk; i++) sum += p[order[i]] = exp(l[order[i]] / temp);
    printf("temp %.2f top-k %d:", (double)temp, k);
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / DRAWS;
        printf(" %d:%.3f/%.3f", i, f, p[i] / sum);
        CHECK(fabs(f - p[i] / sum) <= 0.012);
    }
    printf("\n");
}

int main(void)
{
    const float l[V] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f};
    mal_sample_options greedy = {0, 0, 1};
    CHECK_EQ_INT(mal_sample_pick(l, V, &greedy, 0), 1); /* tie 1 vs 3: the lower id */
    mal_sample_options top1 = {1.0f, 1, 3};
    for (int d = 0; d < 100; d++) CHECK_EQ_INT(mal_sample_pick(l, V, &top1, (uint64_t)d), 1);
    check_distribution(l, 1.0f, 0);
    check_distribution(l, 0.5f, 0);
    check_distribution(l, 2.0f, 3);
    /* another seed draws another sequence */
    mal_sample_options a = {1.0f, 0, 1}, b = {1.0f, 0, 2};
    int same = 0;
    for (int d = 0; d < 200; d++)
        same += mal_sample_pick(l, V, &a, (uint64_t)d) == mal_sample_pick(l, V, &b, (uint64_t)d);
    CHECK(same < 150);

    int *t, n;
    CHECK_OK(mal_sample_parse_prompt("Hi!", 256, &t, &n));
    CHECK(n == 3 && t[0] == 'H' && t[2] == '!');
    free(t);
    CHECK_OK(mal_sample_parse_prompt("", 256, &t, &n));
    CHECK(n == 1 && t[0] == '\n');
    free(t);
    CHECK_OK(mal_sample_parse_prompt(" 12, 7 0 ", 1000, &t, &n));
    CHECK(n == 3 && t[0] == 12 && t[1] == 7 && t[2] == 0);
    free(t);
    CHECK(mal_sample_parse_prompt("12 1000", 1000, &t, &n) == MAL_EINVAL);
    CHECK(mal_sample_parse_prompt("12x", 1000, &t, &n) == MAL_EINVAL);
    printf("test_sample: ok\n");
    return 0;
}
