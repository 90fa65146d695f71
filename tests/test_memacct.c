/* The memory accountant (kernels/memacct.c): every buffer of the kernel
 * table counted under its category from alloc to free, the total's peak
 * and the categories at that peak; and the model's buffers under the
 * categories they are (what the memory model and the end-of-run summary
 * rest on).
 *
 *  1. 4000 buffers of random sizes and categories allocated, resized and
 *     freed in random order against a count kept here: now, each
 *     category's peak, the total's peak and the categories at it agree
 *     after every operation (the table's deletion must find every buffer
 *     again after the buffers around it went);
 *  2. a `tiny` part (fp32 and, where the backend offers it, bf16 compute)
 *     with two sets of activations: weights, master, moments, gradients,
 *     scratch and activations are the layout's bytes, and their sum is
 *     what mal_model_bytes promised before allocating. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "mal_test.h"
#include "src/config.h"
#include "src/model.h"

typedef struct {
    void *p;
    size_t bytes;
    int cat;
} held;

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The counts kept by the test, compared with the accountant's. */
static size_t now[MAL_MEM_N], peak[MAL_MEM_N], at_peak[MAL_MEM_N], total, total_peak;

static void count(int cat, long long delta)
{
    now[cat] = (size_t)((long long)now[cat] + delta);
    total = (size_t)((long long)total + delta);
    if (now[cat] > peak[cat]) peak[cat] = now[cat];
    if (total > total_peak) {
        total_peak = total;
        memcpy(at_peak, now, sizeof now);
    }
}

static void agree(mal_kern k, size_t n_held)
{
    mal_kern_mem_stats s;
    mal_kern_mem_get(k, &s);
    CHECK_EQ_INT(s.total, total);
    CHECK_EQ_INT(s.total_peak, total_peak);
    CHECK_EQ_INT(s.n_buffers, n_held);
    for (int c = 0; c < MAL_MEM_N; c++) {
        CHECK_EQ_INT(s.now[c], now[c]);
        CHECK_EQ_INT(s.peak[c], peak[c]);
        CHECK_EQ_INT(s.at_peak[c], at_peak[c]);
    }
}

static void random_buffers(void)
{
    mal_kern k;
    CHECK_OK(mal_kern_create("cpu", NULL, &k));
    enum { N = 4000 };
    held *h = calloc(N, sizeof *h);
    CHECK(h != NULL);
    size_t n = 0;
    mal_kern_free(k, NULL); /* nothing */
    for (int op = 0; op < 5 * N; op++) {
        uint64_t r = next();
        if (n < N && (n == 0 || r % 3 != 0)) { /* grow the set two times in three */
            size_t bytes = 1 + (size_t)(next() % 4096);
            int cat = (int)(next() % MAL_MEM_N);
            void *p = mal_kern_alloc_as(k, bytes, (mal_mem_cat)cat);
            CHECK(p != NULL);
            h[n++] = (held){p, bytes, cat};
            count(cat, (long long)bytes);
        } else if (r % 7 == 0) { /* resize one: it keeps its category */
            held *x = &h[next() % n];
            size_t nb = 1 + (size_t)(next() % 8192);
            void *q = mal_kern_resize(k, x->p, x->bytes, nb);
            CHECK(q != NULL);
            count(x->cat, (long long)nb - (long long)x->bytes);
            x->p = q, x->bytes = nb;
        } else { /* free one at random */
            size_t i = next() % n;
            mal_kern_free(k, h[i].p);
            count(h[i].cat, -(long long)h[i].bytes);
            h[i] = h[--n];
        }
        agree(k, n);
    }
    /* a phase's peak: from what is held now */
    mal_kern_mem_reset_peak(k);
    memcpy(peak, now, sizeof now);
    memcpy(at_peak, now, sizeof now);
    total_peak = total;
    agree(k, n);
    while (n) {
        mal_kern_free(k, h[n - 1].p);
        count(h[n - 1].cat, -(long long)h[n - 1].bytes);
        n--;
        agree(k, n);
    }
    CHECK_EQ_INT(total, 0);
    free(h);
    mal_kern_destroy(k);
    printf("PASS accountant: 20000 allocations, resizes and frees counted exactly\n");
}

static void model_buffers(mal_dtype dt)
{
    mal_kern_config kc = mal_kern_config_default();
    kc.compute = dt;
    mal_kern k;
    CHECK_OK(mal_kern_create("cpu", &kc, &k));
    mal_model_config cfg;
    CHECK_OK(mal_config_load(&cfg, "tiny"));
    mal_model_part part = {1, 3, 0, 1, 2, 1}; /* layers 1-2 and the head, TP rank 1 of 2 */
    size_t promised;
    CHECK_OK(mal_model_bytes(&cfg, &part, 2, k, 2, MAL_RECOMPUTE_NONE, &promised));
    mal_model *m;
    CHECK_OK(mal_model_create(&m, &cfg, &part, 2, k, 7));
    mal_acts *a[2];
    for (int i = 0; i < 2; i++)
        CHECK_OK(mal_acts_create(&a[i], m, 2));
    mal_kern_mem_stats s;
    mal_kern_mem_get(k, &s);
    const size_t state = m->n_params * sizeof(float);
    const int separate = m->work != m->params;
    CHECK_EQ_INT(s.now[MAL_MEM_GRADIENTS], state);
    CHECK_EQ_INT(s.now[MAL_MEM_MOMENTS], 2 * state);
    CHECK_EQ_INT(s.now[MAL_MEM_MASTER], separate ? state : 0);
    CHECK_EQ_INT(s.now[MAL_MEM_WEIGHTS], separate ? (m->n_params + 1) * m->esz : state);
    CHECK_EQ_INT(s.now[MAL_MEM_ACTIVATIONS], 2 * mal_acts_bytes(m, 2));
    CHECK(s.now[MAL_MEM_SCRATCH] > 0);
    CHECK_EQ_INT(s.now[MAL_MEM_OTHER], 0);
    CHECK_EQ_INT(s.total, promised);
    for (int i = 0; i < 2; i++)
        mal_acts_destroy(m, a[i]);
    mal_model_destroy(m);
    mal_kern_mem_get(k, &s);
    CHECK_EQ_INT(s.total, 0);
    CHECK_EQ_INT(s.total_peak, promised);
    mal_kern_destroy(k);
    printf("PASS model buffers (%s): %zu bytes as promised, by category\n", mal_dtype_name(dt),
           promised);
}

int main(void)
{
    mal_log_level = MAL_LOG_WARN;
    random_buffers();
    model_buffers(MAL_F32);
    model_buffers(MAL_BF16);
    return 0;
}
