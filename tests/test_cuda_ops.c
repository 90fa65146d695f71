/* Every operation of the CUDA backend's kernel table against the CPU
 * backend (the oracle), through the table itself: instance, memory and
 * copies, cuBLASLt products, the kernels, deferred errors, events.  Exit 77
 * where no GPU is usable (cudaGetDeviceCount fails with error 35 on a
 * machine without a driver).
 *
 * Inputs are drawn fresh every run (seed printed; MAL_TEST_SEED repeats
 * it); outputs an operation writes are poisoned with NaN before it runs,
 * outputs it accumulates into start from random values.  fp32 instance:
 * within 1e-5 relative (norm-wise) of the CPU backend.  bf16 instance: the
 * same inputs rounded to bf16 go to both; the reference is the CPU
 * backend's fp32 result on them (within ~1e-6 of float64, far inside the
 * tolerance) -- float64 itself for the products, computed here -- and the
 * tolerance is bf16's (2^-8 relative per stored element, more where an
 * operation rounds intermediates).  The kernels' own float64 checks are
 * tests/test_cuda_kernels (GPU) and tests/test_cuda_emu (CPU). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "base/mal.h"
#include "kernels/kernels.h"
#include "mal_test.h"
#include "mal_test_rand.h"

static mal_kern G, C; /* the GPU instance under test, the CPU oracle */
static int bf;        /* G computes in bf16 */
static int failures;

/* n random values (what both instances get: bf16-exact when G is bf16) */
static float *rnd(size_t n, float scale)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    CHECK(x);
    for (size_t i = 0; i < n; i++) {
        x[i] = scale * nrand();
        if (bf) x[i] = bf2f(f2bf(x[i]));
    }
    return x;
}
static float *nans(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    CHECK(x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* Device buffers of n elements of instance k's compute dtype (cd = 1) or
 * fp32 (cd = 0), filled from host floats. */
static void *up(mal_kern k, const float *h, size_t n, int cd)
{
    int half = cd && k->compute == MAL_BF16;
    size_t es = half ? 2 : 4;
    void *d = mal_kern_alloc(k, n * es + 64);
    CHECK(d);
    if (half) {
        uint16_t *t = malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) t[i] = f2bf(h[i]);
        mal_kern_from_host(k, d, t, n * 2);
        CHECK_OK(mal_kern_sync(k));
        free(t);
    } else {
        mal_kern_from_host(k, d, h, n * 4);
        CHECK_OK(mal_kern_sync(k));
    }
    return d;
}
static float *down(mal_kern k, const void *d, size_t n, int cd)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    CHECK(h);
    if (cd && k->compute == MAL_BF16) {
        uint16_t *t = malloc(n * 2 + 2);
        mal_kern_to_host(k, t, d, n * 2);
        CHECK_OK(mal_kern_sync(k));
        for (size_t i = 0; i < n; i++) h[i] = bf2f(t[i]);
        free(t);
    } else {
        mal_kern_to_host(k, h, d, n * 4);
        CHECK_OK(mal_kern_sync(k));
    }
    return h;
}

/* One argument on both instances. */
typedef struct {
    void *g, *c;
    size_t n;
    int cd;
} arg;
static arg A(const float *h, size_t n, int cd)
{
    arg a = {up(G, h, n, cd), up(C, h, n, cd), n, cd};
    return a;
}
static void drop(arg *a)
{
    mal_kern_free(G, a->g);
    mal_kern_free(C, a->c);
}

static void cmp(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double num = 0, den = 0;
    size_t nan_at = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        if (!(got[i] == got[i]) && nan_at == (size_t)-1) nan_at = i;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    double rel = sqrt(num / (den > 0 ? den : 1e-300));
    int ok = nan_at == (size_t)-1 && rel <= tol;
    printf("%-5s %-40s rel err %.3g (tol %.1g)%s\n", bf ? "bf16" : "fp32", what, rel, tol,
           ok ? "" : "   <-- FAIL");
    if (nan_at != (size_t)-1) printf("      element %zu is NaN (not written?)\n", nan_at);
    if (!ok) failures++;
}
/* Compare argument a on both instances. */
static void cmp_arg(const char *what, arg *a, double tol32, double tol16)
{
    CHECK_OK(mal_kern_sync(G));
    float *g = down(G, a->g, a->n, a->cd), *c = down(C, a->c, a->n, a->cd);
    cmp(what, g, c, a->n, bf ? tol16 : tol32);
    free(g);
    free(c);
}

static void test_matmul(int N, int Cc, int OC)
{
    float *x = rnd((size_t)N * Cc, 1), *w = rnd((size_t)OC * Cc, 0.2f);
    float *o0 = nans((size_t)N * OC), *dy = rnd((size_t)N * OC, 1);
    float *dx0 = rnd((size_t)N * Cc, 0.3f), *dw0 = rnd((size_t)OC * Cc, 0.3f);
    arg X = A(x, (size_t)N * Cc, 1), W = A(w, (size_t)OC * Cc, 1), O = A(o0, (size_t)N * OC, 1);
    arg DY = A(dy, (size_t)N * OC, 1), DX = A(dx0, (size_t)N * Cc, 1),
        DW = A(dw0, (size_t)OC * Cc, 0);
    mal_kern_matmul_fwd(G, O.g, X.g, W.g, N, Cc, OC, 0);
    mal_kern_matmul_bwd(G, DX.g, DW.g, DY.g, X.g, W.g, N, Cc, OC);
    CHECK_OK(mal_kern_sync(G));
    /* float64 references */
    double *ro = calloc((size_t)N * OC, sizeof *ro), *rdx = calloc((size_t)N * Cc, sizeof *rdx),
           *rdw = calloc((size_t)OC * Cc, sizeof *rdw);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < Cc; c++) s += (double)x[n * Cc + c] * w[o * Cc + c];
            ro[n * OC + o] = s;
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < Cc; c++) {
            double s = dx0[n * Cc + c];
            for (int o = 0; o < OC; o++) s += (double)dy[n * OC + o] * w[o * Cc + c];
            rdx[n * Cc + c] = s;
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < Cc; c++) {
            double s = dw0[o * Cc + c];
            for (int n = 0; n < N; n++) s += (double)dy[n * OC + o] * x[n * Cc + c];
            rdw[o * Cc + c] = s;
        }
    float *ref = malloc(sizeof(float) * (size_t)(N * OC + N * Cc + OC * Cc));
    char what[80];
    float *go = down(G, O.g, O.n, 1), *gdx = down(G, DX.g, DX.n, 1), *gdw = down(G, DW.g, DW.n, 0);
    for (size_t i = 0; i < O.n; i++) ref[i] = (float)ro[i];
    snprintf(what, sizeof what, "matmul fwd %dx%dx%d (float64 ref)", N, Cc, OC);
    cmp(what, go, ref, O.n, bf ? 6e-3 : 1e-5);
    for (size_t i = 0; i < DX.n; i++) ref[i] = (float)rdx[i];
    cmp("matmul bwd dinp (+=)", gdx, ref, DX.n, bf ? 6e-3 : 1e-5);
    for (size_t i = 0; i < DW.n; i++) ref[i] = (float)rdw[i];
    cmp("matmul bwd dweight (fp32 +=)", gdw, ref, DW.n, bf ? 1e-3 : 1e-5);
    /* accumulate = 1 adds to the output */
    mal_kern_matmul_fwd(G, O.g, X.g, W.g, N, Cc, OC, 1);
    float *go2 = down(G, O.g, O.n, 1);
    for (size_t i = 0; i < O.n; i++) ref[i] = 2.0f * (float)ro[i];
    cmp("matmul fwd accumulate", go2, ref, O.n, bf ? 8e-3 : 1e-5);
    free(go), free(gdx), free(gdw), free(go2), free(ref), free(ro), free(rdx), free(rdw);
    free(x), free(w), free(o0), free(dy), free(dx0), free(dw0);
    drop(&X), drop(&W), drop(&O), drop(&DY), drop(&DX), drop(&DW);
}

static void test_norm_rope_swiglu(void)
{
    const int N = 67, Cc = 96, B = 2, T = 13, H = 4, hd = 24;
    float *x = rnd((size_t)N * Cc, 1), *w = rnd(Cc, 1), *dy = rnd((size_t)N * Cc, 1);
    float *dx0 = rnd((size_t)N * Cc, 0.3f), *dw0 = rnd(Cc, 0.3f), *pn = nans((size_t)N * Cc);
    arg X = A(x, (size_t)N * Cc, 1), W = A(w, Cc, 1), O = A(pn, (size_t)N * Cc, 1);
    arg R = A(pn, N, 0), DY = A(dy, (size_t)N * Cc, 1), DX = A(dx0, (size_t)N * Cc, 1);
    arg DW = A(dw0, Cc, 0);
    mal_kern_rmsnorm_fwd(G, O.g, R.g, X.g, W.g, N, Cc, 1e-5f);
    mal_kern_rmsnorm_fwd(C, O.c, R.c, X.c, W.c, N, Cc, 1e-5f);
    cmp_arg("rmsnorm fwd", &O, 1e-5, 8e-3);
    cmp_arg("rmsnorm rstd", &R, 1e-5, 1e-5);
    mal_kern_rmsnorm_bwd(G, DX.g, DW.g, DY.g, X.g, W.g, R.g, N, Cc);
    mal_kern_rmsnorm_bwd(C, DX.c, DW.c, DY.c, X.c, W.c, R.c, N, Cc);
    cmp_arg("rmsnorm bwd dinp", &DX, 1e-5, 8e-3);
    cmp_arg("rmsnorm bwd dweight", &DW, 1e-5, 2e-3);
    drop(&X), drop(&W), drop(&O), drop(&R), drop(&DY), drop(&DX), drop(&DW);

    size_t n = (size_t)B * T * H * hd;
    float *q = rnd(n, 1);
    arg Q = A(q, n, 1);
    const mal_rope r1 = mal_rope_plain(10000.0f), r2 = mal_rope_plain(500.0f);
    const mal_rope l3 = {500000.0f, 1, 8.0f, 1.0f, 4.0f, 64}; /* llama3, every band */
    mal_kern_rope_fwd(G, Q.g, B, T, H, hd, &r1);
    mal_kern_rope_fwd(C, Q.c, B, T, H, hd, &r1);
    cmp_arg("rope fwd", &Q, 1e-5, 8e-3);
    mal_kern_rope_bwd(G, Q.g, B, T, H, hd, &r2);
    mal_kern_rope_bwd(C, Q.c, B, T, H, hd, &r2);
    cmp_arg("rope bwd (another theta)", &Q, 1e-5, 8e-3);
    mal_kern_rope_fwd(G, Q.g, B, T, H, hd, &l3);
    mal_kern_rope_fwd(C, Q.c, B, T, H, hd, &l3);
    cmp_arg("rope fwd (llama3 scaling)", &Q, 1e-5, 8e-3);
    drop(&Q);

    size_t m = 5003;
    float *g = rnd(m, 2), *u = rnd(m, 1), *d = rnd(m, 1), *dg0 = rnd(m, 0.3f), *du0 = rnd(m, 0.3f);
    float *pm = nans(m);
    arg Gt = A(g, m, 1), U = A(u, m, 1), D = A(d, m, 1), S = A(pm, m, 1), DG = A(dg0, m, 1),
        DU = A(du0, m, 1);
    mal_kern_swiglu_fwd(G, S.g, Gt.g, U.g, m);
    mal_kern_swiglu_fwd(C, S.c, Gt.c, U.c, m);
    cmp_arg("swiglu fwd", &S, 1e-5, 8e-3);
    mal_kern_swiglu_bwd(G, DG.g, DU.g, D.g, Gt.g, U.g, m);
    mal_kern_swiglu_bwd(C, DG.c, DU.c, D.c, Gt.c, U.c, m);
    cmp_arg("swiglu bwd dgate", &DG, 1e-5, 8e-3);
    cmp_arg("swiglu bwd dup", &DU, 1e-5, 8e-3);
    mal_kern_add(G, Gt.g, Gt.g, U.g, m); /* out = a, the residual add */
    mal_kern_add(C, Gt.c, Gt.c, U.c, m);
    cmp_arg("add (out aliases a)", &Gt, 1e-6, 8e-3);
    drop(&Gt), drop(&U), drop(&D), drop(&S), drop(&DG), drop(&DU);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(pn), free(q), free(g), free(u);
    free(d), free(dg0), free(du0), free(pm);
}

static void test_fp32_ops(void)
{
    size_t n = 10007;
    float *y = rnd(n, 1), *x = rnd(n, 1);
    arg Y = A(y, n, 0), X = A(x, n, 0);
    mal_kern_accumulate(G, Y.g, X.g, n);
    mal_kern_accumulate(C, Y.c, X.c, n);
    mal_kern_scale(G, Y.g, n, -0.375f);
    mal_kern_scale(C, Y.c, n, -0.375f);
    cmp_arg("accumulate + scale (fp32 state)", &Y, 1e-7, 1e-7);
    /* sum of squares over a strided view, into a device double */
    double z = 0.5, hg = 0, hc = 0;
    double *ag = mal_kern_alloc(G, 8), *ac = mal_kern_alloc(C, 8);
    mal_kern_from_host(G, ag, &z, 8);
    mal_kern_from_host(C, ac, &z, 8);
    mal_kern_sumsq(G, ag, X.g, 37, 200, 261);
    mal_kern_sumsq(C, ac, X.c, 37, 200, 261);
    mal_kern_sumsq(G, ag, Y.g, 1, n, n);
    mal_kern_sumsq(C, ac, Y.c, 1, n, n);
    mal_kern_to_host(G, &hg, ag, 8);
    mal_kern_to_host(C, &hc, ac, 8);
    CHECK_OK(mal_kern_sync(G));
    CHECK_OK(mal_kern_sync(C));
    float fg = (float)(hg / hc), one = 1.0f;
    cmp("sumsq strided + contiguous (double)", &fg, &one, 1, 1e-12);
    mal_kern_free(G, ag), mal_kern_free(C, ac);
    drop(&Y), drop(&X), free(y), free(x);
}

static void test_embedding_xent(void)
{
    const int N = 300, Cc = 40, V = 50;
    float *wte = rnd((size_t)V * Cc, 1), *dy = rnd((size_t)N * Cc, 1),
          *dw0 = rnd((size_t)V * Cc, 0.3f);
    float *pn = nans((size_t)N * Cc);
    int tok[300];
    for (int i = 0; i < N; i++) tok[i] = (int)(urand() * 9) * 5; /* repeats */
    int *tg = mal_kern_alloc(G, sizeof tok), *tc = mal_kern_alloc(C, sizeof tok);
    mal_kern_from_host(G, tg, tok, sizeof tok);
    mal_kern_from_host(C, tc, tok, sizeof tok);
    arg Wt = A(wte, (size_t)V * Cc, 1), O = A(pn, (size_t)N * Cc, 1),
        DY = A(dy, (size_t)N * Cc, 1), DW = A(dw0, (size_t)V * Cc, 0);
    mal_kern_embedding_fwd(G, O.g, tg, Wt.g, N, Cc, V, 0, V);
    mal_kern_embedding_fwd(C, O.c, tc, Wt.c, N, Cc, V, 0, V);
    cmp_arg("embedding fwd", &O, 0, 0);
    mal_kern_embedding_bwd(G, DW.g, DY.g, tg, N, Cc, 0, V);
    mal_kern_embedding_bwd(C, DW.c, DY.c, tc, N, Cc, 0, V);
    cmp_arg("embedding bwd (CPU's order: exact)", &DW, 0, 0);
    /* a vocabulary-parallel shard: rows [20, 37) of the 50 */
    mal_kern_embedding_fwd(G, O.g, tg, Wt.g, N, Cc, V, 20, 17);
    mal_kern_embedding_fwd(C, O.c, tc, Wt.c, N, Cc, V, 20, 17);
    cmp_arg("embedding fwd (shard)", &O, 0, 0);
    mal_kern_embedding_bwd(G, DW.g, DY.g, tg, N, Cc, 20, 17);
    mal_kern_embedding_bwd(C, DW.c, DY.c, tc, N, Cc, 20, 17);
    cmp_arg("embedding bwd (shard)", &DW, 0, 0);

    const int Nx = 9, Vx = 32000;
    float *lg = rnd((size_t)Nx * Vx, 3), *pl = nans(Nx);
    int tgt[9];
    for (int i = 0; i < Nx; i++) tgt[i] = (int)(urand() * Vx);
    int *xg = mal_kern_alloc(G, sizeof tgt), *xc = mal_kern_alloc(C, sizeof tgt);
    mal_kern_from_host(G, xg, tgt, sizeof tgt);
    mal_kern_from_host(C, xc, tgt, sizeof tgt);
    arg L = A(lg, (size_t)Nx * Vx, 1), LS = A(pl, Nx, 0);
    mal_kern_xent_fwd_bwd(G, LS.g, L.g, L.g, xg, Nx, Vx, 0.125f);
    mal_kern_xent_fwd_bwd(C, LS.c, L.c, L.c, xc, Nx, Vx, 0.125f);
    cmp_arg("cross-entropy losses (V 32000)", &LS, 1e-5, 1e-5);
    cmp_arg("cross-entropy dlogits (in place)", &L, 1e-5, 8e-3);
    /* vocabulary-parallel: the columns [16000, 32000) of fresh logits,
     * their statistics put beside made-up ones of another shard */
    {
        const int Vl = 16000;
        float *sl = rnd((size_t)Nx * Vl, 3), *sn = nans(Nx), *st = rnd((size_t)6 * Nx, 1);
        for (int i = 0; i < Nx; i++) /* shard 0: a positive sum, no target logit */
            st[Nx + i] = fabsf(st[Nx + i]) + 1.0f, st[2 * Nx + i] = 0.0f;
        arg SL = A(sl, (size_t)Nx * Vl, 1), SN = A(sn, Nx, 0), ST = A(st, (size_t)6 * Nx, 0);
        mal_kern_xent_stats(G, (float *)ST.g + 3 * Nx, SL.g, xg, Nx, Vl, Vl);
        mal_kern_xent_stats(C, (float *)ST.c + 3 * Nx, SL.c, xc, Nx, Vl, Vl);
        cmp_arg("cross-entropy statistics (shard)", &ST, 1e-5, 1e-2);
        mal_kern_xent_combine(G, SN.g, SL.g, SL.g, ST.g, 2, xg, Nx, Vl, Vl, Vx, 0.125f);
        mal_kern_xent_combine(C, SN.c, SL.c, SL.c, ST.c, 2, xc, Nx, Vl, Vl, Vx, 0.125f);
        cmp_arg("cross-entropy combined losses", &SN, 1e-4, 1e-2);
        cmp_arg("cross-entropy combined dlogits", &SL, 1e-5, 8e-3);
        drop(&SL), drop(&SN), drop(&ST);
        free(sl), free(sn), free(st);
    }
    /* a target outside the vocabulary: an error from the next sync */
    tgt[4] = Vx + 3;
    mal_kern_from_host(G, xg, tgt, sizeof tgt);
    mal_kern_xent_fwd_bwd(G, LS.g, NULL, L.g, xg, Nx, Vx, 1.0f);
    mal_clearerr();
    int rc = mal_kern_sync(G);
    printf("%-5s %-40s %s\n", bf ? "bf16" : "fp32", "bad target -> sync error",
           rc == MAL_EINVAL && strstr(mal_errmsg(), "target") ? "ok" : "   <-- FAIL");
    if (!(rc == MAL_EINVAL && strstr(mal_errmsg(), "target"))) failures++;
    CHECK_OK(mal_kern_sync(G)); /* reported once */
    mal_kern_free(G, tg), mal_kern_free(C, tc), mal_kern_free(G, xg), mal_kern_free(C, xc);
    drop(&Wt), drop(&O), drop(&DY), drop(&DW), drop(&L), drop(&LS);
    free(wte), free(dy), free(dw0), free(pn), free(lg), free(pl);
}

static void test_attention(int B, int T, mal_attn_heads hs, int hd)
{
    const int H = hs.H;
    size_t n = (size_t)B * T * H * hd, nk = (size_t)B * T * hs.Hkv * hd, sg, xg, sc, xc;
    mal_kern_attention_bytes(G, B, T, H, hd, &sg, &xg);
    mal_kern_attention_bytes(C, B, T, H, hd, &sc, &xc);
    float *q = rnd(n, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *dy = rnd(n, 1), *pn = nans(n);
    float *d0 = rnd(n, 0.1f);
    arg Q = A(q, n, 1), K = A(k, nk, 1), Vv = A(v, nk, 1), O = A(pn, n, 1), DY = A(dy, n, 1);
    arg DQ = A(d0, n, 1), DK = A(d0, nk, 1), DV = A(d0, nk, 1);
    void *svg = mal_kern_alloc(G, sg), *scg = mal_kern_alloc(G, xg);
    void *svc = mal_kern_alloc(C, sc), *scc = mal_kern_alloc(C, xc);
    mal_kern_attention_fwd(G, O.g, svg, Q.g, K.g, Vv.g, B, T, hs, hd);
    mal_kern_attention_fwd(C, O.c, svc, Q.c, K.c, Vv.c, B, T, hs, hd);
    char what[80];
    snprintf(what, sizeof what, "attention fwd B%d T%d H%d/%d hd%d", B, T, H, hs.Hkv, hd);
    cmp_arg(what, &O, 1e-5, 1e-2);
    mal_kern_attention_bwd(G, DQ.g, DK.g, DV.g, scg, DY.g, O.g, Q.g, K.g, Vv.g, svg, B, T, hs, hd);
    mal_kern_attention_bwd(C, DQ.c, DK.c, DV.c, scc, DY.c, O.c, Q.c, K.c, Vv.c, svc, B, T, hs, hd);
    cmp_arg("attention bwd dq (+=)", &DQ, 1e-5, 2e-2);
    cmp_arg("attention bwd dk (+=)", &DK, 1e-5, 2e-2);
    cmp_arg("attention bwd dv (+=)", &DV, 1e-5, 2e-2);
    mal_kern_free(G, svg), mal_kern_free(G, scg), mal_kern_free(C, svc), mal_kern_free(C, scc);
    drop(&Q), drop(&K), drop(&Vv), drop(&O), drop(&DY), drop(&DQ), drop(&DK), drop(&DV);
    free(q), free(k), free(v), free(dy), free(pn), free(d0);
}

/* A head dimension the CUDA kernels do not take: an error naming it from
 * the next sync, the output untouched. */
static void test_attention_refused(int hd)
{
    const int B = 1, T = 4;
    size_t n = (size_t)B * T * hd, sg, xg;
    mal_kern_attention_bytes(G, B, T, 1, hd, &sg, &xg);
    mal_clearerr();
    int rc = mal_kern_sync(G);
    float *q = rnd(n, 1), *pn = nans(n);
    arg Q = A(q, n, 1), O = A(pn, n, 1);
    void *svg = mal_kern_alloc(G, sg);
    mal_kern_attention_fwd(G, O.g, svg, Q.g, Q.g, Q.g, B, T, mal_attn_mha(1), hd);
    int rc2 = mal_kern_sync(G);
    float *got = down(G, O.g, n, 1);
    const int ok = rc == MAL_EINVAL && strstr(mal_errmsg(), "head dimension") &&
                   rc2 == MAL_EINVAL && isnan(got[0]);
    char what[80];
    snprintf(what, sizeof what, "attention head dim %d -> sync error", hd);
    printf("%-5s %-40s %s\n", bf ? "bf16" : "fp32", what, ok ? "ok" : "   <-- FAIL");
    failures += !ok;
    mal_kern_free(G, svg);
    drop(&Q), drop(&O);
    free(q), free(pn), free(got);
}

static void test_adamw(void)
{
    size_t n = 4099;
    int save = bf;
    bf = 0; /* the state is fp32 whatever the instance computes in */
    float *p = rnd(n, 1), *g = rnd(n, 1), *m = rnd(n, 0.1f), *v = rnd(n, 0.1f), *pn = nans(n);
    bf = save;
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    arg P = A(p, n, 0), Gr = A(g, n, 0), M = A(m, n, 0), Vv = A(v, n, 0), W = A(pn, n, 1);
    mal_kern_adamw(G, P.g, W.g, Gr.g, M.g, Vv.g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 5);
    mal_kern_adamw(C, P.c, W.c, Gr.c, M.c, Vv.c, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 5);
    cmp_arg("adamw param", &P, 1e-6, 1e-6);
    cmp_arg("adamw m", &M, 1e-6, 1e-6);
    cmp_arg("adamw v", &Vv, 1e-6, 1e-6);
    cmp_arg("adamw working copy", &W, 1e-6, 4e-3);
    /* the cast alone, from one master copy on both instances (after the
     * step above the two masters differ by the backends' rounding, so the
     * fp32 cast is exact only from equal inputs) */
    bf = 0;
    arg P2 = A(p, n, 0);
    bf = save;
    mal_kern_cast_working(G, W.g, P2.g, n);
    mal_kern_cast_working(C, W.c, P2.c, n);
    cmp_arg("cast_working", &W, 0, 4e-3);
    drop(&P2);
    drop(&P), drop(&Gr), drop(&M), drop(&Vv), drop(&W);
    free(p), free(g), free(m), free(v), free(pn);
}

/* The multi-tensor operations against the per-tensor ones on the same
 * instance: the same bits (AdamW over the spans of one slab, mixed weight
 * decay, gaps, merged neighbours; the sum of squares over whole, strided
 * and empty runs), and AdamW's against the CPU oracle. */
static void test_multi_tensor(void)
{
    enum { NS = 40 };
    mal_kern_span sp[NS];
    size_t off = 0;
    for (int j = 0; j < NS; j++) {
        size_t n = j % 9 == 4 ? 0 : 16 + (size_t)(urand() * (j % 6 == 0 ? 5000 : 300));
        sp[j] = (mal_kern_span){off, n, j % 3 == 0 ? 0.0f : 0.1f};
        off += n;
        if (j % 2) off = (off + 15) & ~(size_t)15;
        if (j % 5 == 1) off += 16;
    }
    const size_t n = off + 16;
    int save = bf;
    bf = 0;
    float *p = rnd(n, 1), *g = rnd(n, 1), *m = rnd(n, 0.1f), *v = rnd(n, 0.1f), *w0 = rnd(n, 1);
    bf = save;
    for (size_t i = 0; i < n; i++)
        v[i] = v[i] * v[i];
    /* two copies on the GPU (multi, per tensor) and one on the CPU */
    arg P = A(p, n, 0), Gr = A(g, n, 0), M = A(m, n, 0), Vv = A(v, n, 0), W = A(w0, n, 1);
    arg P2 = A(p, n, 0), M2 = A(m, n, 0), V2 = A(v, n, 0), W2 = A(w0, n, 1);
    const size_t es = G->compute == MAL_BF16 ? 2 : 4;
    mal_kern_adamw_multi(G, P.g, W.g, Gr.g, M.g, Vv.g, sp, NS, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.7f, 5);
    mal_kern_adamw_multi(C, P.c, W.c, Gr.c, M.c, Vv.c, sp, NS, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.7f, 5);
    for (int j = 0; j < NS; j++) {
        const size_t o = sp[j].offset;
        mal_kern_adamw(G, (float *)P2.g + o, (char *)W2.g + o * es, (float *)Gr.g + o,
                       (float *)M2.g + o, (float *)V2.g + o, sp[j].n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                       sp[j].weight_decay, 0.7f, 5);
    }
    cmp_arg("adamw multi-tensor param (against the CPU)", &P, 1e-6, 1e-6);
    cmp_arg("adamw multi-tensor working copy (against the CPU)", &W, 1e-6, 4e-3);
    const struct {
        const char *what;
        void *a, *b;
        int cd;
    } same[] = {{"param", P.g, P2.g, 0},
                {"m", M.g, M2.g, 0},
                {"v", Vv.g, V2.g, 0},
                {"working copy", W.g, W2.g, 1}};
    for (int i = 0; i < 4; i++) {
        float *a = down(G, same[i].a, n, same[i].cd), *b = down(G, same[i].b, n, same[i].cd);
        const int ok = !memcmp(a, b, n * sizeof *a);
        printf("adamw multi-tensor %-12s the per-tensor bits: %s\n", same[i].what,
               ok ? "same" : "DIFFER   <-- FAIL");
        failures += !ok;
        free(a), free(b);
    }
    /* the norm's runs: every span, a strided view, an empty run */
    mal_kern_run runs[NS + 2];
    int nr = 0;
    for (int j = 0; j < NS; j++)
        runs[nr++] = (mal_kern_run){(float *)Gr.g + sp[j].offset, 1, sp[j].n, sp[j].n};
    runs[nr++] = (mal_kern_run){(const float *)Gr.g + 5, 37, 200, 261};
    runs[nr++] = (mal_kern_run){(const float *)Gr.g, 0, 10, 10};
    double z = 0.25, h1 = 0, h2 = 0;
    double *a1 = mal_kern_alloc(G, 8), *a2 = mal_kern_alloc(G, 8);
    mal_kern_from_host(G, a1, &z, 8);
    mal_kern_from_host(G, a2, &z, 8);
    mal_kern_sumsq_multi(G, a1, runs, nr);
    for (int j = 0; j < nr; j++)
        mal_kern_sumsq(G, a2, runs[j].x, runs[j].rows, runs[j].width, runs[j].pitch);
    mal_kern_to_host(G, &h1, a1, 8);
    mal_kern_to_host(G, &h2, a2, 8);
    CHECK_OK(mal_kern_sync(G));
    const int ok = !memcmp(&h1, &h2, sizeof h1);
    printf("sumsq multi-tensor: %.17g, per run %.17g: %s\n", h1, h2,
           ok ? "the same bits" : "DIFFER   <-- FAIL");
    failures += !ok;
    mal_kern_free(G, a1), mal_kern_free(G, a2);
    /* several buffers zeroed by one operation: views of Gr at odd byte
     * offsets and lengths; the bytes between them untouched */
    {
        float *before = down(G, Gr.g, n, 0), *after;
        void *const zb[] = {(char *)Gr.g + 3, (char *)Gr.g + 1000, (char *)Gr.g + 20000};
        const size_t zn[] = {70, 16385, 7};
        mal_kern_zero_multi(G, zb, zn, 3);
        after = down(G, Gr.g, n, 0);
        unsigned char *b = (unsigned char *)before, *a = (unsigned char *)after;
        for (int i = 0; i < 3; i++)
            memset(b + ((char *)zb[i] - (char *)Gr.g), 0, zn[i]);
        const int zok = !memcmp(a, b, n * sizeof(float));
        printf("zero of several buffers: %s\n", zok ? "ok" : "WRONG BYTES   <-- FAIL");
        failures += !zok;
        free(before), free(after);
    }
    drop(&P), drop(&Gr), drop(&M), drop(&Vv), drop(&W), drop(&P2), drop(&M2), drop(&V2), drop(&W2);
    free(p), free(g), free(m), free(v), free(w0);
}

static void CUDART_CB stall_200ms(void *unused)
{
    (void)unused;
    struct timespec ts = {0, 200000000L};
    nanosleep(&ts, NULL);
}

/* A fresh instance whose first work waits 200 ms behind a stall of its
 * stream: the RoPE table made by its first RoPE (a copy queued on the
 * stream) and the error flag cleared at its creation (a memset queued on
 * the stream) are both in order with the kernels that use them, whatever
 * the legacy default stream does.  The backend queues nothing there
 * (tests/check_streams.sh); this checks the result on the GPU. */
static void test_fresh_stream(mal_kern_config cfg)
{
    mal_kern keep = G;
    CHECK_OK(mal_kern_create("cuda", &cfg, &G));
    const int B = 2, T = 33, H = 3, hd = 16, Nx = 4, Vx = 100;
    size_t n = (size_t)B * T * H * hd;
    float *x = rnd(n, 1);
    arg X = A(x, n, 1);
    int tgt[4] = {1, 2, Vx + 7, 3};
    int *xg = mal_kern_alloc(G, sizeof tgt);
    float *lg = rnd((size_t)Nx * Vx, 1);
    void *L = up(G, lg, (size_t)Nx * Vx, 1);
    float *ls = mal_kern_alloc(G, Nx * sizeof(float));
    CHECK(xg && ls);
    mal_kern_from_host(G, xg, tgt, sizeof tgt);
    CHECK_OK(mal_kern_sync(G));
    CHECK(cudaLaunchHostFunc((cudaStream_t)mal_kern_native_queue(G), stall_200ms, NULL) ==
          cudaSuccess);
    const mal_rope fresh = mal_rope_plain(7777.0f); /* a theta no table has yet */
    mal_kern_rope_fwd(G, X.g, B, T, H, hd, &fresh);
    mal_kern_xent_fwd_bwd(G, ls, NULL, L, xg, Nx, Vx, 1.0f);
    mal_clearerr();
    int rc = mal_kern_sync(G);
    int flagged = rc == MAL_EINVAL && strstr(mal_errmsg(), "target") != NULL;
    printf("%-5s %-40s %s\n", bf ? "bf16" : "fp32", "fresh instance: error flag in order",
           flagged ? "ok" : "   <-- FAIL");
    if (!flagged) failures++;
    mal_kern_rope_fwd(C, X.c, B, T, H, hd, &fresh);
    cmp_arg("fresh instance: rope table in order", &X, 1e-5, 8e-3);
    mal_kern_free(G, xg), mal_kern_free(G, L), mal_kern_free(G, ls);
    drop(&X);
    free(x), free(lg);
    mal_kern_destroy(G);
    G = keep;
}

/* Memory and queue operations of the GPU instance alone. */
static void test_memory(void)
{
    enum { R = 7, Wd = 33, P = 50 };
    float h[R * P], back[R * P];
    for (int i = 0; i < R * P; i++) h[i] = (float)i;
    float *d = mal_kern_alloc(G, sizeof h), *e = mal_kern_alloc(G, sizeof h);
    CHECK(d && e);
    /* alloc is zero-filled */
    mal_kern_to_host(G, back, d, sizeof back);
    CHECK_OK(mal_kern_sync(G));
    for (int i = 0; i < R * P; i++) CHECK(back[i] == 0.0f);
    mal_kern_from_host(G, d, h, sizeof h);
    mal_kern_zero(G, e, sizeof h);
    /* strided device-to-device, then device-to-host with another pitch */
    mal_kern_memcpy2d(G, e, P * 4, d + 3, P * 4, Wd * 4, R, MAL_COPY_D2D);
    float *pin = mal_kern_host_alloc(G, R * Wd * 4);
    CHECK(pin);
    mal_kern_memcpy2d(G, pin, Wd * 4, e, P * 4, Wd * 4, R, MAL_COPY_D2H);
    CHECK_OK(mal_kern_sync(G));
    int ok = 1;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < Wd; c++) ok &= pin[r * Wd + c] == h[r * P + 3 + c];
    /* resize keeps the prefix and zero-fills the rest */
    float *big = mal_kern_resize(G, d, sizeof h, 2 * sizeof h);
    CHECK(big);
    float *b2 = malloc(2 * sizeof h);
    mal_kern_to_host(G, b2, big, 2 * sizeof h);
    CHECK_OK(mal_kern_sync(G));
    for (int i = 0; i < R * P; i++) ok &= b2[i] == h[i] && b2[R * P + i] == 0.0f;
    /* events time device work */
    mal_kern_event *e0 = mal_kern_event_create(G), *e1 = mal_kern_event_create(G);
    CHECK(e0 && e1);
    mal_kern_event_record(G, e0);
    for (int i = 0; i < 50; i++) mal_kern_scale(G, big, 2 * R * P, 1.0f);
    mal_kern_event_record(G, e1);
    double t = mal_kern_event_elapsed(G, e0, e1);
    ok &= t > 0 && t < 10;
    ok &= mal_kern_native_queue(G) != NULL && G->host_addressable == 0;
    printf("%-5s %-40s %s (50 launches: %.1f us)\n", bf ? "bf16" : "fp32",
           "alloc, copies 2-D, resize, events", ok ? "ok" : "   <-- FAIL", t * 1e6);
    if (!ok) failures++;
    mal_kern_event_destroy(G, e0), mal_kern_event_destroy(G, e1);
    mal_kern_host_free(G, pin), mal_kern_free(G, big), mal_kern_free(G, e), free(b2);
}

int main(void)
{
    mal_kern_config cfg = mal_kern_config_default();
    mal_kern probe = NULL;
    int rc = mal_kern_create("cuda", &cfg, &probe);
    if (rc == MAL_EDEVICE || rc == MAL_ENOTSUP) {
        printf("test_cuda_ops: skipped: %s\n", mal_errmsg());
        return MAL_TEST_SKIP;
    }
    CHECK_OK(rc);
    mal_kern_destroy(probe);
    const char *env = getenv("MAL_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    rng = seed * 2654435761u + 7;
    printf("test_cuda_ops: seed %llu (MAL_TEST_SEED repeats it)\n", (unsigned long long)seed);
    CHECK_OK(mal_kern_create("cpu", &cfg, &C));
    for (bf = 0; bf <= 1; bf++) {
        cfg.compute = bf ? MAL_BF16 : MAL_F32;
        CHECK_OK(mal_kern_create("cuda", &cfg, &G));
        test_memory();
        test_fresh_stream(cfg);
        test_matmul(37, 64, 48);
        test_matmul(256, 512, 384);
        test_norm_rope_swiglu();
        test_fp32_ops();
        test_embedding_xent();
        test_attention(2, 37, mal_attn_mha(3), 8);    /* generic kernels (tiny's head size) */
        test_attention(1, 200, mal_attn_mha(2), 64);  /* tensor cores in bf16 (small's) */
        test_attention(1, 130, mal_attn_mha(2), 128); /* tensor cores, the 1b head size */
        /* grouped-query: llama3-1b's 4 query heads per key/value head, and
         * a TP rank's 3 query heads straddling two key/value heads */
        test_attention(1, 130, (mal_attn_heads){8, 2, 4, 0}, 64);
        test_attention(2, 37, (mal_attn_heads){3, 2, 2, 1}, 8);
        test_attention(1, 75, mal_attn_mha(2), 104); /* the 32b preset's: a 128-wide tile */
        test_attention_refused(258);
        test_attention_refused(7);
        test_adamw();
        test_multi_tensor();
        CHECK_OK(mal_kern_sync(G));
        mal_kern_destroy(G);
    }
    mal_kern_destroy(C);
    printf("test_cuda_ops: %s (%d failure%s)\n", failures ? "FAIL" : "ok", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
