/* Synthetic token stream for benchmarks; see data_synth.h. */
#include "data_synth.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "base/rng.h"
#include "data.h"

static const char prefix[] = "synthetic";

int mal_data_synth_spec(const char *spec, int *vocab)
{
    size_t n = sizeof prefix - 1;
    if (strncmp(spec, prefix, n) != 0 || (spec[n] != '\0' && spec[n] != ':')) return 0;
    /* "synthetic" alone is refused rather than read as a file name: the
     * vocabulary must match the model's, and guessing it would train a
     * different model than the benchmark's peer. */
    const char *num = spec[n] == ':' ? spec + n + 1 : "";
    char *end = NULL;
    errno = 0;
    long v = strtol(num, &end, 10);
    if (!*num || *end || errno || v < 2 || v > 65536)
        return MAL_ERR(MAL_EINVAL,
                       "data \"%s\": synthetic data needs its vocabulary, 2..65536, as "
                       "synthetic:V with V the model's vocab (e.g. synthetic:32000); a file "
                       "with that name can be given as ./%s",
                       spec, spec);
    *vocab = (int)v;
    return 1;
}

void mal_data_synth_window(uint64_t seed, int vocab, int64_t step, int64_t pos, int T, int *inputs,
                           int *targets)
{
    const uint64_t s = seed ^ MAL_DATA_SALT ^ MAL_DATA_SYNTH_SALT;
    const uint64_t V = (uint64_t)vocab;
    /* The affine rule of this seed: a in [1, V), c in [0, V). */
    const uint64_t a = 1 + mal_rng_below(s, 0, 0, V - 1);
    const uint64_t c = mal_rng_below(s, 0, 1, V);
    /* One key per window; token i draws from (key, i). */
    const uint64_t key = mal_rng_u64(s, (uint64_t)step + 1, (uint64_t)pos);
    uint64_t prev = 0;
    for (int i = 0; i <= T; i++) {
        uint64_t u = mal_rng_u64(key, 0, (uint64_t)i);
        uint64_t tok;
        if (i > 0 && (u & 3) != 0)
            tok = (a * prev + c) % V;
        else
            tok = (uint64_t)(((unsigned __int128)(u >> 2) * V) >> 62);
        if (i < T) inputs[i] = (int)tok;
        if (i > 0) targets[i - 1] = (int)tok;
        prev = tok;
    }
}

double mal_data_synth_entropy(int vocab)
{
    /* The next token is the rule's with probability 3/4 + 1/(4V) and each
     * other token with probability 1/(4V). */
    double V = vocab, p = 0.75 + 0.25 / V, q = 0.25 / V;
    return -p * log(p) - (V - 1) * q * log(q);
}
