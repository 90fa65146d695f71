/* Tests for src/data_synth.c (--data synthetic:V): the spec parser, the
 * sampling contract of data.h (a pure function of seed, step and position;
 * targets are the inputs shifted by one; tokens inside the vocabulary), and
 * the documented stream: read back from the samples alone, each token's most
 * frequent successor must be an affine map of it, taken 3/4 of the time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "mal_test.h"
#include "src/data.h"
#include "src/data_synth.h"

static void test_spec(void)
{
    int v = 0;
    CHECK_EQ_INT(mal_data_synth_spec("synthetic:32000", &v), 1);
    CHECK_EQ_INT(v, 32000);
    CHECK_EQ_INT(mal_data_synth_spec("synthetic:2", &v), 1);
    CHECK_EQ_INT(v, 2);
    CHECK_EQ_INT(mal_data_synth_spec("synthetic:65536", &v), 1);
    CHECK_EQ_INT(v, 65536);
    /* Paths, not specs. */
    CHECK_EQ_INT(mal_data_synth_spec("synthetic.bin", &v), 0);
    CHECK_EQ_INT(mal_data_synth_spec("./synthetic:5", &v), 0);
    CHECK_EQ_INT(mal_data_synth_spec("data/synthetic:5", &v), 0);
    /* Specs without a usable vocabulary: refused with a message. */
    const char *bad[] = {"synthetic", "synthetic:", "synthetic:1", "synthetic:65537",
                         "synthetic:12x", "synthetic:-5", "synthetic:99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mal_clearerr();
        CHECK_EQ_INT(mal_data_synth_spec(bad[i], &v), MAL_EINVAL);
        CHECK(strstr(mal_errmsg(), "synthetic:V") != NULL);
        mal_data *d = NULL;
        CHECK_EQ_INT(mal_data_open(&d, bad[i], MAL_DATA_AUTO), MAL_EINVAL);
        CHECK(d == NULL);
    }
    CHECK_CLOSE(mal_data_synth_entropy(32000), 3.156, 0, 0.001);
}

static void test_contract(void)
{
    enum { V = 1000, T = 64, STEPS = 20, POS = 16 };
    mal_data *a, *b;
    CHECK_OK(mal_data_open(&a, "synthetic:1000", MAL_DATA_AUTO));
    CHECK_OK(mal_data_open(&b, "synthetic:1000", MAL_DATA_LLMC)); /* format is ignored */
    CHECK(strcmp(mal_data_name(a), "synthetic:1000") == 0);
    CHECK_EQ_INT(mal_data_max_token(a), V - 1);
    CHECK(mal_data_n_tokens(a) == UINT64_MAX);

    static int first[STEPS][POS][T + 1];
    int in[T], tg[T], in2[T], tg2[T];
    for (int s = 0; s < STEPS; s++)
        for (int p = 0; p < POS; p++) {
            CHECK_OK(mal_data_sample(a, 42, s, p, T, in, tg));
            for (int i = 0; i < T; i++) {
                CHECK(in[i] >= 0 && in[i] < V);
                CHECK(tg[i] >= 0 && tg[i] < V);
                if (i + 1 < T) CHECK_EQ_INT(tg[i], in[i + 1]);
                first[s][p][i] = in[i];
            }
            first[s][p][T] = tg[T - 1];
        }
    /* Reverse order, another object, interleaved with another seed: the
     * same windows. */
    int same_seed = 0;
    for (int s = STEPS - 1; s >= 0; s--)
        for (int p = POS - 1; p >= 0; p--) {
            CHECK_OK(mal_data_sample(b, 7, s, p, T, in2, tg2));
            CHECK_OK(mal_data_sample(b, 42, s, p, T, in, tg));
            CHECK(memcmp(in, first[s][p], sizeof in) == 0);
            CHECK_EQ_INT(tg[T - 1], first[s][p][T]);
            same_seed += memcmp(in, in2, sizeof in) == 0;
        }
    CHECK_EQ_INT(same_seed, 0);
    /* A shorter window is the prefix of the longer one. */
    CHECK_OK(mal_data_sample(a, 42, 3, 5, 10, in, tg));
    CHECK(memcmp(in, first[3][5], 10 * sizeof *in) == 0);
    /* Different steps or positions give different windows. */
    int same = 0;
    for (int s = 0; s + 1 < STEPS; s++)
        for (int p = 0; p + 1 < POS; p++)
            same += !memcmp(first[s][p], first[s + 1][p], sizeof first[s][p]) +
                    !memcmp(first[s][p], first[s][p + 1], sizeof first[s][p]);
    CHECK_EQ_INT(same, 0);
    /* Bad arguments are refused as for files. */
    CHECK_EQ_INT(mal_data_sample(a, 1, 0, 0, 0, in, tg), MAL_EINVAL);
    CHECK_EQ_INT(mal_data_sample(a, 1, -1, 0, T, in, tg), MAL_EINVAL);
    CHECK_EQ_INT(mal_data_sample(a, 1, 0, -1, T, in, tg), MAL_EINVAL);
    mal_data_destroy(a);
    mal_data_destroy(b);
}

/* The stream's statistics, recovered from samples: count successor pairs,
 * take each token's most frequent successor f(prev), check that f is affine
 * (f(p) = f(0) + p (f(1) - f(0)) mod V) and is taken 3/4 + 1/(4V) of the
 * time, and that the first token of windows is uniform. */
static void test_stream(void)
{
    enum { V = 37, T = 256, WINDOWS = 4000 };
    mal_data *d;
    CHECK_OK(mal_data_open(&d, "synthetic:37", MAL_DATA_AUTO));
    static int count[V][V];
    int first[V] = {0};
    int in[T], tg[T];
    for (int w = 0; w < WINDOWS; w++) {
        CHECK_OK(mal_data_sample(d, 5, w / 50, w % 50, T, in, tg));
        first[in[0]]++;
        for (int i = 0; i < T; i++)
            count[in[i]][tg[i]]++;
    }
    int f[V];
    long follow = 0, total = 0;
    for (int p = 0; p < V; p++) {
        f[p] = 0;
        for (int q = 0; q < V; q++) {
            if (count[p][q] > count[p][f[p]]) f[p] = q;
            total += count[p][q];
        }
        follow += count[p][f[p]];
    }
    int a = ((f[1] - f[0]) % V + V) % V, c = f[0];
    CHECK(a != 0);
    for (int p = 0; p < V; p++)
        CHECK_EQ_INT(f[p], (a * p + c) % V);
    /* 1,024,000 transitions: the fraction's sd is ~4e-4. */
    CHECK_CLOSE((double)follow / total, 0.75 + 0.25 / V, 0, 0.003);
    /* First tokens: expected 108 per token (sd ~10). */
    for (int p = 0; p < V; p++)
        CHECK(first[p] > 60 && first[p] < 160);
    /* Another seed, another rule (with overwhelming probability). */
    CHECK_OK(mal_data_sample(d, 6, 0, 0, T, in, tg));
    int kept = 0;
    for (int i = 0; i < T; i++)
        kept += tg[i] == (a * in[i] + c) % V;
    CHECK(kept < T / 2);
    mal_data_destroy(d);
}

int main(void)
{
    test_spec();
    test_contract();
    test_stream();
    printf("test_data_synth: ok\n");
    return 0;
}
