/* Text generation: next-token choice, the one-process loop, prompt and
 * text.  See sample.h for the contracts. */
#include "sample.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "base/rng.h"
#include "data.h"

/* Decreasing logit, then increasing id (qsort_r: no shared state). */
static int by_logit(const void *a, const void *b, void *ctx)
{
    const float *key = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (key[i] != key[j]) return key[i] > key[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int mal_sample_pick(const float *logits, int V, const mal_sample_options *o, uint64_t draw)
{
    if (V < 1) return MAL_ERR(MAL_EINVAL, "sample: vocabulary of %d tokens", V);
    if (!(o->temperature > 0)) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    int *idx = malloc((size_t)V * sizeof *idx);
    if (!idx) return MAL_ERR(MAL_ENOMEM, "sample: out of memory");
    for (int i = 0; i < V; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)V, sizeof *idx, by_logit, (void *)logits);
    const int k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    const double top = logits[idx[0]], inv_t = 1.0 / o->temperature;
    double sum = 0;
    for (int i = 0; i < k; i++)
        sum += exp((logits[idx[i]] - top) * inv_t);
    const double u = mal_rng_uniform(o->seed, MAL_SAMPLE_STREAM, draw) * sum;
    double acc = 0;
    int pick = idx[k - 1]; /* rounding left u past the last step: the last kept token */
    for (int i = 0; i < k; i++) {
        acc += exp((logits[idx[i]] - top) * inv_t);
        if (u < acc) {
            pick = idx[i];
            break;
        }
    }
    free(idx);
    return pick;
}

int mal_sample_generate(mal_model *m, mal_acts *a, const int *prompt, int n_prompt, int n_new,
                        const mal_sample_options *o, int *out,
                        void (*on_token)(void *ctx, int token), void *ctx)
{
    const int T = a->T, B = a->B, V = m->cfg.vocab;
    if (!m->part.has_embed || !m->part.has_head || m->part.tp_size != 1)
        return MAL_ERR(MAL_EINVAL, "sample: one process generates with the whole model");
    if (n_prompt < 1 || n_new < 0) return MAL_ERR(MAL_EINVAL, "sample: empty prompt");
    int *inputs = calloc((size_t)B * T, sizeof *inputs);
    int *targets = calloc((size_t)B * T, sizeof *targets);
    float *row = malloc((size_t)V * sizeof *row);
    int rc = 0;
    if (!inputs || !targets || !row) {
        rc = MAL_ERR(MAL_ENOMEM, "sample: out of memory");
        goto out;
    }
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    for (int n = n_prompt; n < n_prompt + n_new; n++) {
        /* Sequence 0 holds the window, the rest of the micro-batch stays
         * zero: causal attention keeps every position blind to what
         * follows it, so only the window decides the last logits. */
        const int start = mal_sample_window_start(n, T), len = n - start;
        memcpy(inputs, out + start, (size_t)len * sizeof *inputs);
        mal_acts_set_batch(m, a, inputs, targets);
        if ((rc = mal_model_forward(m, a, NULL, 0.0f))) goto out;
        if ((rc = mal_model_logits_row(m, a, len - 1, row))) goto out;
        int next = mal_sample_pick(row, V, o, (uint64_t)n);
        if (next < 0) {
            rc = next;
            goto out;
        }
        out[n] = next;
        if (on_token) on_token(ctx, next);
    }
out:
    free(inputs);
    free(targets);
    free(row);
    return rc;
}

int mal_sample_parse_prompt(const char *text, int vocab, int **tokens, int *n)
{
    size_t len = strlen(text);
    int *t = malloc((len + 1) * sizeof *t), k = 0;
    if (!t) return MAL_ERR(MAL_ENOMEM, "sample: out of memory");
    if (vocab == MAL_DATA_BYTE_VOCAB) {
        for (size_t i = 0; i < len; i++)
            t[k++] = (unsigned char)text[i];
        if (!k) t[k++] = '\n';
    } else {
        const char *p = text;
        for (;;) {
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
                p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= vocab || (*end && !strchr(" ,\t\n", *end))) {
                free(t);
                return MAL_ERR(MAL_EINVAL,
                               "the vocabulary has %d tokens and is not byte-level: give the "
                               "prompt as token ids in [0, %d) separated by spaces or commas "
                               "(at '%.20s')",
                               vocab, vocab, p);
            }
            t[k++] = (int)v;
            p = end;
        }
        if (!k) t[k++] = 0;
    }
    *tokens = t;
    *n = k;
    return 0;
}

void mal_sample_print(FILE *f, const int *tokens, int n, int vocab)
{
    for (int i = 0; i < n; i++) {
        int c = tokens[i];
        if (vocab != MAL_DATA_BYTE_VOCAB)
            fprintf(f, "%s%d", i ? " " : "", c);
        else if (c == '\n' || c == '\t' || (c >= 32 && c < 127))
            fputc(c, f);
        else
            fprintf(f, "\\x%02x", c);
    }
}
