/* Synthetic token data for benchmarks (the role of Megatron's mock data):
 * `--data synthetic:V` trains on tokens 0..V-1 that are generated, not read,
 * so a model with a real vocabulary (the 124m and 1b presets, V = 32000)
 * can be benchmarked without a tokenized corpus.
 *
 * The sampling contract of data.h holds unchanged: the window of (seed,
 * step, pos) is a pure function of those three and V, never of a cursor, so
 * every plan and every resume sees the same global batch.  The stream is
 * learnable, so a loss curve says something: each token follows its
 * predecessor by a fixed affine map (next = (a * prev + c) mod V, a and c
 * drawn from the seed) with probability 3/4 and is uniform otherwise.  The
 * best achievable loss is therefore about
 *     -(3/4 + 1/(4V)) ln(3/4 + 1/(4V)) - (V-1)/(4V) ln(1/(4V))
 * (3.16 nats for V = 32000, against ln V = 10.37 at initialisation).
 *
 * data.c calls in here: mal_data_open recognises the spec, mal_data_sample
 * delegates the window. */
#ifndef MAL_DATA_SYNTH_H
#define MAL_DATA_SYNTH_H

#include <stdint.h>

/* Salt of the synthetic stream (xor-ed with the seed and MAL_DATA_SALT).
 * Part of the contract: changing it changes every synthetic run. */
#define MAL_DATA_SYNTH_SALT 0x53594E5448455449ull

/* Local, pure.  1 when `spec` is a synthetic-data spec ("synthetic:V",
 * 2 <= V <= 65536; *vocab = V), 0 when it is not one (a path), or
 * MAL_EINVAL with a message for "synthetic" / "synthetic:" followed by
 * anything but such a V. */
int mal_data_synth_spec(const char *spec, int *vocab);

/* Local, pure.  The window of sample `pos` of step `step`: inputs[i] =
 * s[i], targets[i] = s[i+1] for i < T, where s (T+1 tokens) is the
 * synthetic stream of (seed, step, pos) over vocabulary `vocab`.  Arguments
 * are checked by the caller (mal_data_sample). */
void mal_data_synth_window(uint64_t seed, int vocab, int64_t step, int64_t pos, int T, int *inputs,
                           int *targets);

/* Local, pure.  The lowest expected cross-entropy (nats) of a predictor
 * that knows the rule: the figure loss curves on this data approach. */
double mal_data_synth_entropy(int vocab);

#endif /* MAL_DATA_SYNTH_H */
