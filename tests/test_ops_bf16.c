/* The CPU backends' bf16 compute (kernels/cpu.c, "bf16 storage") against
 * their fp32 compute, operation by operation, through the kernel table.
 *
 * The contract (kernels.h): a bf16 instance computes each operation in
 * fp32 on its bf16 operands widened exactly and rounds each stored bf16
 * result once, to nearest even.  So, with inputs that are bf16 values
 * (the same numbers given to both), every result must be EXACTLY:
 *   - an fp32 output (gradients of the parameters, RMSNorm statistics,
 *     losses, the probabilities attention keeps, the master, the
 *     moments): the fp32 instance's bits;
 *   - a bf16 output (activations, their gradients, the working copy):
 *     the fp32 instance's result rounded to nearest even, by this test's
 *     own rounding (tests/mal_test_rand.h's f2bf, not the library's).
 * Outputs an operation writes are poisoned with NaN first (an unwritten
 * element cannot pass); outputs it accumulates into start from random
 * bf16 values.  Every case also runs on cpu-opaque in bf16, whose bits
 * must be cpu's.  Covered: both matrix products (accumulate, NULL
 * operands), RMSNorm, RoPE, grouped-query attention, SwiGLU, add (out
 * aliasing an input), the embedding (and a token out of range), the fused
 * and vocabulary-parallel cross-entropy (dlogits aliasing logits), AdamW
 * with its working copy, cast_working; and the trivial: the fp32-only
 * operations are not affected by the compute dtype. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "kernels/kernels.h"
#include "mal_test.h"
#include "mal_test_rand.h"

/* How a case's buffer starts, and whether it is compared. */
/* RAW_BITS: any 32-bit pattern (NaNs, infinities, subnormals, the
 * largest floats that round up to infinity), a quarter of them a tie
 * (low half 0x8000): the rounding itself. */
enum { IN_RAND, OUT_NAN, ACC_RAND, POS_RAND, TOKENS, ZERO, RAW_BITS };

typedef struct {
    size_t n;    /* elements */
    int cd;      /* 1: the compute dtype; 0: fp32 (or int32 for TOKENS) */
    int init;    /* IN_RAND ... */
    float scale; /* random values' scale; TOKENS: the range [0, scale) */
    int compare; /* 1: an output compared after the run */
} buf_spec;

enum { MAXB = 12 };

typedef struct {
    const char *name;
    int nb;
    buf_spec b[MAXB];
    /* the operation on instance k with device buffers d[0..nb-1] */
    void (*run)(mal_kern k, void *const *d);
    int want_err; /* 1: sync() must report an error (and only that) */
} op_case;

static mal_kern K32, KB, KO; /* cpu fp32, cpu bf16, cpu-opaque bf16 */
static int checked;

/* The host values of buffer s, as floats (bf16 values where cd or where
 * fp32 inputs meet bf16 arithmetic: they are the same numbers either way). */
static float *host_init(const buf_spec *s)
{
    float *h = malloc((s->n ? s->n : 1) * sizeof *h);
    CHECK(h);
    for (size_t i = 0; i < s->n; i++) {
        switch (s->init) {
        case OUT_NAN:
            h[i] = NAN;
            break;
        case ZERO:
            h[i] = 0.0f;
            break;
        case TOKENS:
            h[i] = (float)(int)(urand() * s->scale);
            break;
        case RAW_BITS: {
            uint32_t u = (uint32_t)(urand() * 4294967296.0);
            if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;
            memcpy(&h[i], &u, sizeof u);
            break;
        }
        case POS_RAND:
            h[i] = bf2f(f2bf(s->scale * (0.25f + fabsf(nrand()))));
            break;
        default:
            h[i] = bf2f(f2bf(s->scale * nrand()));
        }
    }
    return h;
}

static int is_half(mal_kern k, const buf_spec *s)
{
    return s->cd && k->compute == MAL_BF16;
}

static void *upload(mal_kern k, const buf_spec *s, const float *h)
{
    size_t es = s->init == TOKENS ? sizeof(int) : is_half(k, s) ? 2 : 4;
    void *d = mal_kern_alloc(k, s->n * es + 64);
    CHECK(d);
    void *t = malloc(s->n * es + 1);
    CHECK(t);
    for (size_t i = 0; i < s->n; i++) {
        if (s->init == TOKENS)
            ((int *)t)[i] = (int)h[i];
        else if (es == 2)
            ((uint16_t *)t)[i] = f2bf(h[i]);
        else
            ((float *)t)[i] = h[i];
    }
    mal_kern_from_host(k, d, t, s->n * es);
    free(t);
    return d;
}

/* Buffer d back as raw bits: uint16 for bf16 buffers, uint32 for fp32. */
static void *download(mal_kern k, const buf_spec *s, const void *d)
{
    size_t es = is_half(k, s) ? 2 : 4;
    void *h = malloc(s->n * es + 1);
    CHECK(h);
    mal_kern_to_host(k, h, d, s->n * es);
    return h;
}

/* Run case c on instance k; the outputs' raw bits in out[i] (NULL for
 * buffers not compared).  Returns sync()'s code. */
static int run_on(mal_kern k, const op_case *c, float *const *init, void **out)
{
    void *d[MAXB];
    for (int i = 0; i < c->nb; i++)
        d[i] = upload(k, &c->b[i], init[i]);
    CHECK_OK(mal_kern_sync(k));
    c->run(k, d);
    int rc = mal_kern_sync(k);
    for (int i = 0; i < c->nb; i++) {
        out[i] = c->b[i].compare ? download(k, &c->b[i], d[i]) : NULL;
        mal_kern_free(k, d[i]);
    }
    CHECK_OK(mal_kern_sync(k));
    return rc;
}

static void run_case(const op_case *c)
{
    float *init[MAXB];
    void *r32[MAXB], *rb[MAXB], *ro[MAXB];
    for (int i = 0; i < c->nb; i++)
        init[i] = host_init(&c->b[i]);
    int e32 = run_on(K32, c, init, r32), eb = run_on(KB, c, init, rb), eo = run_on(KO, c, init, ro);
    if (c->want_err)
        CHECK(e32 == MAL_EINVAL && eb == MAL_EINVAL && eo == MAL_EINVAL);
    else
        CHECK(e32 == 0 && eb == 0 && eo == 0);
    size_t n_out = 0, n_half = 0;
    for (int i = 0; i < c->nb; i++) {
        const buf_spec *s = &c->b[i];
        if (!s->compare) continue;
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < s->n; j++) {
            uint32_t want;
            uint32_t got;
            if (s->cd) {
                float ref;
                memcpy(&ref, (const uint32_t *)r32[i] + j, 4);
                want = f2bf(ref);
                got = ((const uint16_t *)rb[i])[j];
            } else {
                want = ((const uint32_t *)r32[i])[j];
                got = ((const uint32_t *)rb[i])[j];
            }
            if (got != want && !bad++) first = j;
        }
        if (bad) {
            fprintf(stderr,
                    "FAIL %s: buffer %d (%s): %zu of %zu elements not the fp32 result%s "
                    "(first at %zu)\n",
                    c->name, i, s->cd ? "bf16" : "fp32", bad, s->n,
                    s->cd ? " rounded to nearest even" : "", first);
            exit(1);
        }
        /* cpu-opaque: the same bits */
        CHECK(memcmp(rb[i], ro[i], s->n * (s->cd ? 2 : 4)) == 0);
        n_out += s->n;
        if (s->cd) n_half += s->n;
    }
    for (int i = 0; i < c->nb; i++) {
        free(init[i]);
        free(r32[i]);
        free(rb[i]);
        free(ro[i]);
    }
    checked++;
    printf("%-28s %7zu results (%zu bf16) exact%s\n", c->name, n_out, n_half,
           c->want_err ? ", error reported" : "");
}

/* ---- the cases ------------------------------------------------------------ */

enum { N = 9, C = 40, OC = 24, B = 2, T = 7, H = 4, HKV = 2, HD = 8, V = 53 };

#define IN(n, cd)                                                                                  \
    {                                                                                              \
        (n), (cd), IN_RAND, 1.0f, 0                                                                \
    }
#define OUT(n, cd)                                                                                 \
    {                                                                                              \
        (n), (cd), OUT_NAN, 0.0f, 1                                                                \
    }
#define ACC(n, cd)                                                                                 \
    {                                                                                              \
        (n), (cd), ACC_RAND, 0.5f, 1                                                               \
    }

static void r_matmul_fwd(mal_kern k, void *const *d)
{
    mal_kern_matmul_fwd(k, d[0], d[1], d[2], N, C, OC, 0);
}
static void r_matmul_fwd_acc(mal_kern k, void *const *d)
{
    mal_kern_matmul_fwd(k, d[0], d[1], d[2], N, C, OC, 1);
}
static void r_matmul_bwd(mal_kern k, void *const *d)
{
    mal_kern_matmul_bwd(k, d[0], d[1], d[2], d[3], d[4], N, C, OC);
}
static void r_matmul_bwd_dinp(mal_kern k, void *const *d)
{
    mal_kern_matmul_bwd(k, d[0], NULL, d[1], d[2], d[3], N, C, OC);
}
static void r_matmul_bwd_dw(mal_kern k, void *const *d)
{
    mal_kern_matmul_bwd(k, NULL, d[0], d[1], d[2], d[3], N, C, OC);
}
static void r_rmsnorm_fwd(mal_kern k, void *const *d)
{
    mal_kern_rmsnorm_fwd(k, d[0], d[1], d[2], d[3], N, C, 1e-5f);
}
static void r_rmsnorm_bwd(mal_kern k, void *const *d)
{
    mal_kern_rmsnorm_bwd(k, d[0], d[1], d[2], d[3], d[4], d[5], N, C);
}
static void r_rope(mal_kern k, void *const *d)
{
    mal_rope rope = mal_rope_plain(10000.0f);
    mal_kern_rope_fwd(k, d[0], B, T, H, HD, &rope);
    mal_kern_rope_bwd(k, d[1], B, T, H, HD, &rope);
}
static mal_attn_heads gqa(void)
{
    mal_attn_heads hs = {H, HKV, H / HKV, 0};
    return hs;
}
static void r_attention_fwd(mal_kern k, void *const *d)
{
    mal_kern_attention_fwd(k, d[0], d[1], d[2], d[3], d[4], B, T, gqa(), HD);
}
/* dq dk dv scratch dout out q k v saved: the forward first (out, saved),
 * then the backward (dk NULL where `dk` is 0: skipped) */
static void attention_fwd_bwd(mal_kern k, void *const *d, int dk)
{
    mal_kern_attention_fwd(k, d[5], d[9], d[6], d[7], d[8], B, T, gqa(), HD);
    mal_kern_attention_bwd(k, d[0], dk ? d[1] : NULL, d[2], d[3], d[4], d[5], d[6], d[7], d[8],
                           d[9], B, T, gqa(), HD);
}
static void r_attention_bwd(mal_kern k, void *const *d)
{
    attention_fwd_bwd(k, d, 1);
}
static void r_attention_bwd_nodk(mal_kern k, void *const *d)
{
    attention_fwd_bwd(k, d, 0);
}
static void r_swiglu_fwd(mal_kern k, void *const *d)
{
    mal_kern_swiglu_fwd(k, d[0], d[1], d[2], (size_t)N * C);
}
static void r_swiglu_bwd(mal_kern k, void *const *d)
{
    mal_kern_swiglu_bwd(k, d[0], d[1], d[2], d[3], d[4], (size_t)N * C);
}
static void r_add(mal_kern k, void *const *d)
{
    mal_kern_add(k, d[0], d[1], d[2], (size_t)N * C);
    mal_kern_add(k, d[1], d[1], d[2], (size_t)N * C); /* out aliases a */
    mal_kern_add(k, d[2], d[3], d[3], (size_t)N * C); /* a == b */
}
static void r_embedding(mal_kern k, void *const *d)
{
    /* a vocabulary-parallel shard: rows [11, 11 + 30) of V */
    mal_kern_embedding_fwd(k, d[0], d[1], d[2], N, C, V, 11, 30);
    mal_kern_embedding_bwd(k, d[3], d[4], d[1], N, C, 11, 30);
}
static void r_embedding_bad(mal_kern k, void *const *d)
{
    mal_kern_embedding_fwd(k, d[0], d[1], d[2], N, C, 5, 0, 5); /* tokens up to V > 5 */
}
static void r_xent(mal_kern k, void *const *d)
{
    mal_kern_xent_fwd_bwd(k, d[0], d[1], d[2], d[3], N, V, 0.25f);
    mal_kern_xent_fwd_bwd(k, d[4], d[5], d[5], d[3], N, V, 0.25f); /* in place */
}
static void r_xent_parallel(mal_kern k, void *const *d)
{
    /* one shard of one: stats then combine, in place */
    mal_kern_xent_stats(k, d[0], d[1], d[2], N, V, 0);
    mal_kern_xent_combine(k, d[3], d[1], d[1], d[0], 1, d[2], N, V, 0, V, 0.5f);
}
static void r_adamw(mal_kern k, void *const *d)
{
    /* param work grad m v: two steps, the working copy refreshed by each */
    for (int t = 1; t <= 2; t++)
        mal_kern_adamw(k, d[0], d[1], d[2], d[3], d[4], (size_t)OC * C, 1e-2f, 0.9f, 0.95f, 1e-8f,
                       0.1f, 0.7f, t);
}
static void r_cast(mal_kern k, void *const *d)
{
    mal_kern_cast_working(k, d[1], d[0], (size_t)OC * C);
}
static void r_fp32_ops(mal_kern k, void *const *d)
{
    mal_kern_accumulate(k, d[0], d[1], (size_t)N * C);
    mal_kern_scale(k, d[1], (size_t)N * C, 0.37f);
    mal_kern_zero(k, d[2], sizeof(double)); /* d[2]: one double, as two words */
    mal_kern_sumsq(k, d[2], d[0], N, C - 3, C);
}

static const size_t NQ = (size_t)B * T * H * HD, NK = (size_t)B * T * HKV * HD;
#define P_N ((size_t)B * H * T * T)
/* attention_fwd_bwd's buffers, dk's given: written (compared), or left
 * alone when skipped (it must keep its values) */
#define ATT_BWD(dk)                                                                                \
    {                                                                                              \
        OUT(NQ, 1), dk, OUT(NK, 1), {P_N, 0, ZERO, 0, 0}, IN(NQ, 1), OUT(NQ, 1), IN(NQ, 1),        \
            IN(NK, 1), IN(NK, 1), OUT(P_N, 0)                                                      \
    }

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the lines in order with a failure's */
    rng = 0x6a09e667f3bcc908ull;
    mal_kern_config kc = mal_kern_config_default();
    kc.threads = 1;
    CHECK_OK(mal_kern_create("cpu", &kc, &K32));
    kc.compute = MAL_BF16;
    CHECK_OK(mal_kern_create("cpu", &kc, &KB));
    CHECK_OK(mal_kern_create("cpu-opaque", &kc, &KO));
    CHECK(K32->compute == MAL_F32 && KB->compute == MAL_BF16 && KO->compute == MAL_BF16);

    const size_t NC = (size_t)N * C, NO = (size_t)N * OC, WC = (size_t)OC * C, NV = (size_t)N * V;
    const op_case cases[] = {
        {"matmul_fwd", 3, {OUT(NO, 1), IN(NC, 1), IN(WC, 1)}, r_matmul_fwd, 0},
        {"matmul_fwd accumulate", 3, {ACC(NO, 1), IN(NC, 1), IN(WC, 1)}, r_matmul_fwd_acc, 0},
        {"matmul_bwd",
         5,
         {ACC(NC, 1), ACC(WC, 0), IN(NO, 1), IN(NC, 1), IN(WC, 1)},
         r_matmul_bwd,
         0},
        {"matmul_bwd dinp only",
         4,
         {ACC(NC, 1), IN(NO, 1), IN(NC, 1), IN(WC, 1)},
         r_matmul_bwd_dinp,
         0},
        {"matmul_bwd dweight only",
         4,
         {ACC(WC, 0), IN(NO, 1), IN(NC, 1), IN(WC, 1)},
         r_matmul_bwd_dw,
         0},
        {"rmsnorm_fwd", 4, {OUT(NC, 1), OUT(N, 0), IN(NC, 1), IN(C, 1)}, r_rmsnorm_fwd, 0},
        {"rmsnorm_bwd",
         6,
         {ACC(NC, 1), ACC(C, 0), IN(NC, 1), IN(NC, 1), IN(C, 1), {N, 0, POS_RAND, 1.0f, 0}},
         r_rmsnorm_bwd,
         0},
        {"rope fwd, bwd", 2, {ACC(NQ, 1), ACC(NQ, 1)}, r_rope, 0},
        {"attention_fwd (GQA)",
         5,
         {OUT(NQ, 1), OUT(P_N, 0), IN(NQ, 1), IN(NK, 1), IN(NK, 1)},
         r_attention_fwd,
         0},
        {"attention_bwd (GQA)", 10, ATT_BWD(OUT(NK, 1)), r_attention_bwd, 0},
        {"attention_bwd, dk NULL", 10, ATT_BWD(ACC(NK, 1)), r_attention_bwd_nodk, 0},
        {"swiglu_fwd", 3, {OUT(NC, 1), IN(NC, 1), IN(NC, 1)}, r_swiglu_fwd, 0},
        {"swiglu_bwd",
         5,
         {ACC(NC, 1), ACC(NC, 1), IN(NC, 1), IN(NC, 1), IN(NC, 1)},
         r_swiglu_bwd,
         0},
        {"add (aliases)", 4, {OUT(NC, 1), ACC(NC, 1), ACC(NC, 1), IN(NC, 1)}, r_add, 0},
        {"embedding fwd, bwd (shard)",
         5,
         {OUT(NC, 1),
          {N, 0, TOKENS, (float)V, 0},
          IN((size_t)30 * C, 1),
          ACC((size_t)30 * C, 0),
          IN(NC, 1)},
         r_embedding,
         0},
        {"embedding token out of range",
         3,
         {OUT(NC, 1), {N, 0, TOKENS, (float)V, 0}, IN((size_t)5 * C, 1)},
         r_embedding_bad,
         1},
        {"xent_fwd_bwd (and in place)",
         6,
         {OUT(N, 0),
          OUT(NV, 1),
          {NV, 1, IN_RAND, 3.0f, 0},
          {N, 0, TOKENS, (float)V, 0},
          OUT(N, 0),
          {NV, 1, ACC_RAND, 3.0f, 1}},
         r_xent,
         0},
        {"xent_stats, combine",
         4,
         {OUT((size_t)3 * N, 0),
          {NV, 1, ACC_RAND, 3.0f, 1},
          {N, 0, TOKENS, (float)V, 0},
          OUT(N, 0)},
         r_xent_parallel,
         0},
        {"adamw + working copy",
         5,
         {ACC(WC, 0), OUT(WC, 1), IN(WC, 0), ACC(WC, 0), {WC, 0, POS_RAND, 0.1f, 1}},
         r_adamw,
         0},
        {"cast_working", 2, {IN(WC, 0), OUT(WC, 1)}, r_cast, 0},
        {"cast_working, any bits", 2, {{WC, 0, RAW_BITS, 0, 0}, OUT(WC, 1)}, r_cast, 0},
        {"fp32 ops (dtype-blind)", 3, {ACC(NC, 0), ACC(NC, 0), {2, 0, ZERO, 0, 1}}, r_fp32_ops, 0},
    };
    for (size_t i = 0; i < MAL_ARRAY_SIZE(cases); i++)
        run_case(&cases[i]);
    mal_kern_destroy(KO);
    mal_kern_destroy(KB);
    mal_kern_destroy(K32);
    printf("all %d bf16 cases exact\n", checked);
    return 0;
}
