/* Text generation: choosing the next token from logits (greedy,
 * temperature, top-k) deterministically for a seed, the one-process
 * generation loop over a whole model, and the byte-level text on both ends
 * (prompt in, text out).  malleus-sample (cmd/sample_main.c) uses all of
 * it; the trainer's --sample-every (train/eval.c) runs the same choice over
 * its pipeline.
 *
 * Generation recomputes the forward pass over the last seq_len tokens for
 * every new token (no key/value cache): O(T) forwards of T tokens, which is
 * what CPU-sized models afford; the logits of the last position decide. */
#ifndef MAL_SAMPLE_H
#define MAL_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "model.h"

/* RNG stream of the draws (rng.h): draw i is mal_rng_uniform(seed,
 * MAL_SAMPLE_STREAM, i). */
#define MAL_SAMPLE_STREAM 0x73616D706C65ull

typedef struct mal_sample_options {
    float temperature; /* 0: greedy (argmax) */
    int top_k;         /* keep the k most likely tokens (0: all) */
    uint64_t seed;
} mal_sample_options;

/* Local, pure.  The next token for logits[0..V) (host): with temperature 0
 * the argmax (the lowest id among equal values); otherwise the token
 * drawn from softmax(logits / temperature) over the top_k largest logits
 * (ties: lower id first) by u = mal_rng_uniform(seed, MAL_SAMPLE_STREAM,
 * draw) on the cumulative distribution in order of decreasing logit.
 * `draw` is the position of the token being generated, so a sequence is a
 * pure function of (seed, prompt, model).  Returns the id, or a negative
 * MAL_E* code (MAL_ENOMEM, MAL_EINVAL for V < 1). */
int mal_sample_pick(const float *logits, int V, const mal_sample_options *o, uint64_t draw);

/* Local.  Generate n_new tokens after prompt[0..n_prompt) (n_prompt >= 1)
 * with model m (a whole model: embedding and head, TP 1) in activations a
 * (any micro-batch size; its first sequence is used), into out (caller's,
 * n_prompt + n_new ints: the prompt, then the new tokens).  Each new token
 * sees the last seq_len tokens before it.  on_token (may be NULL) is called
 * with every new token as it comes (for streaming output). */
int mal_sample_generate(mal_model *m, mal_acts *a, const int *prompt, int n_prompt, int n_new,
                        const mal_sample_options *o, int *out,
                        void (*on_token)(void *ctx, int token), void *ctx);

/* Local.  The window of seq_len T a new token at position n sees: the
 * tokens [start, n) with start = max(0, n - T). */
static inline int mal_sample_window_start(int n, int T) { return n > T ? n - T : 0; }

/* Local.  Tokens of a prompt: with the byte-level vocabulary (vocab 256)
 * the bytes of `text` (empty: one '\n', a paragraph start); with any other
 * the ids written in `text`, separated by spaces or commas (empty: token
 * 0).  *tokens is malloc'ed (caller frees); MAL_EINVAL for an id that is
 * not a number in [0, vocab). */
int mal_sample_parse_prompt(const char *text, int vocab, int **tokens, int *n);

/* Local.  Write tokens to f: as text with the byte-level vocabulary
 * (bytes outside printable ASCII, newline and tab as \xNN, so a terminal
 * never receives control sequences or broken UTF-8), else as ids separated
 * by spaces. */
void mal_sample_print(FILE *f, const int *tokens, int n, int vocab);

#endif /* MAL_SAMPLE_H */
