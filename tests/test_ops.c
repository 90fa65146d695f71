/* Tests every operation of the CPU kernel table (kernels/cpu.c), the
 * registry (kernels/registry.c) and the cpu-opaque backend:
 *   forward results against naive double-precision references written out
 *   here (triple-loop matmul, explicit attention loops, formulas);
 *   backward results against central finite differences of
 *   L = sum(out * R) for a fixed random R (L summed in double from the float
 *   forward);
 *   the accumulate (+=) convention of every backward, NULL gradients of
 *   matmul_bwd, attention causality and its probability rows, in-place
 *   cross-entropy, the RoPE table cache under changing shapes, and errors
 *   reported through sync();
 *   strided 2-D copies in every direction, the strided sum of squares into
 *   a device accumulator, events, pinned host buffers, the working-copy
 *   cast and the optimizer's refresh of a separate working copy;
 *   backends by name: unknown, not built, the default, bf16 refused by
 *   the CPU backends;
 *   cpu-opaque: bit-identical results to cpu through staged copies, not
 *   host-addressable, and a host dereference of its buffer kills a child
 *   process with SIGSEGV.
 * Shapes are small and odd so that the vectorised blocks and the scalar
 * tails of every loop both run.  One line per check; exit 1 on any failure. */
#include "base/mal.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "mal_test.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static mal_kern K;
static int n_failed;

/* Finite-difference step (absolute; inputs are O(1)). */
#define FD_H 1e-3
/* FD error bound, relative to the largest analytic gradient: float rounding
 * of L divided by 2h leaves ~1e-4; a wrong term is O(1). */
#define FD_TOL 2e-3

static void report(const char *op, const char *what, double err, double tol)
{
    int ok = err <= tol; /* NaN fails */
    printf("%-14s %-34s max err %.3e (tol %.0e) %s\n", op, what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) n_failed++;
}

static float *fbuf(size_t n)
{
    float *p = mal_kern_alloc(K, (n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(MAL_TEST_ERROR);
    }
    return p;
}

static void fill(float *x, size_t n, uint64_t stream, double scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * mal_rng_normal(42, stream, i));
}

/* max |a - b| / max(1, max |b|) */
static double max_rel(const float *a, const double *b, size_t n)
{
    double e = 0.0, s = 1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        e = d > e || isnan(d) ? d : e;
        s = fabs(b[i]) > s ? fabs(b[i]) : s;
    }
    return e / s;
}

static double max_rel_f(const float *a, const float *b, size_t n)
{
    double e = 0.0, s = 1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        e = d > e || isnan(d) ? d : e;
        s = fabs(b[i]) > s ? fabs(b[i]) : s;
    }
    return e / s;
}

/* sum(out * R) in double */
static double dot_d(const float *out, const float *R, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * R[i];
    return s;
}

/* Central differences of loss() with respect to each x[i], compared with
 * grad[i]: max |fd - grad| / max |grad|.  The actual float perturbation is
 * used as the denominator. */
static double fd_check(double (*loss)(void), float *x, size_t n, const float *grad)
{
    double err = 0.0, scale = 1e-6;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(grad[i]));
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        float xp = (float)(x0 + FD_H), xm = (float)(x0 - FD_H);
        x[i] = xp;
        double lp = loss();
        x[i] = xm;
        double lm = loss();
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double d = fabs(fd - grad[i]);
        err = d > err || isnan(d) ? d : err;
    }
    return err / scale;
}

/* pre + g0 == g (the backward accumulated onto pre-filled gradients) */
static double acc_err(const float *g, const float *pre, const float *g0, size_t n)
{
    double e = 0.0, s = 1.0;
    for (size_t i = 0; i < n; i++) {
        double want = (double)pre[i] + g0[i];
        double d = fabs(g[i] - want);
        e = d > e || isnan(d) ? d : e;
        s = fmax(s, fabs(want));
    }
    return e / s;
}

/* ------------------------------------------------------------------------ */
/* memory */

static void test_memory(void)
{
    size_t n = 1000;
    float *a = mal_kern_alloc(K, n * sizeof(float));
    void *z = mal_kern_alloc(K, 0);
    CHECK(a != NULL && z != NULL);
    int nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += a[i] != 0.0f;
    CHECK_EQ_INT(nonzero, 0);
    CHECK_EQ_INT((uintptr_t)a % 64, 0);
    float host[1000], back[1000];
    fill(host, n, 1, 1.0);
    mal_kern_from_host(K, a, host, n * sizeof(float));
    float *b = fbuf(n);
    mal_kern_copy(K, b, a, n * sizeof(float));
    mal_kern_to_host(K, back, b, n * sizeof(float));
    CHECK(memcmp(host, back, sizeof host) == 0);
    mal_kern_zero(K, b, (n - 1) * sizeof(float));
    CHECK(b[0] == 0.0f && b[n - 2] == 0.0f && b[n - 1] == host[n - 1]);
    CHECK_EQ_INT(mal_kern_sync(K), 0);
    mal_kern_free(K, a);
    mal_kern_free(K, b);
    mal_kern_free(K, z);
    printf("%-14s %-34s ok\n", "memory", "alloc/zero/copy/to/from_host/sync");

    /* resize keeps the prefix and adds zeros: small blocks (copied),
     * mapped ones (remapped), growing across the mapping threshold and
     * shrinking */
    const size_t sizes[][2] = {
        {1000, 3000}, {1000, 1 << 20}, {1 << 20, 3 << 20}, {3 << 20, 1 << 19}};
    for (size_t k = 0; k < MAL_ARRAY_SIZE(sizes); k++) {
        size_t from = sizes[k][0], to = sizes[k][1];
        float *r = mal_kern_alloc(K, from * sizeof(float));
        CHECK(r != NULL);
        for (size_t i = 0; i < from; i++)
            r[i] = (float)(i % 9973) + 0.5f;
        r = mal_kern_resize(K, r, from * sizeof(float), to * sizeof(float));
        CHECK(r != NULL);
        CHECK_EQ_INT((uintptr_t)r % 64, 0);
        size_t bad = 0;
        for (size_t i = 0; i < to; i++)
            bad += r[i] != (i < from ? (float)(i % 9973) + 0.5f : 0.0f);
        CHECK_EQ_INT(bad, 0);
        mal_kern_free(K, r);
    }
    printf("%-14s %-34s ok\n", "memory", "resize (copy and remap paths)");
}

/* ------------------------------------------------------------------------ */
/* matmul */

static struct {
    int N, C, OC;
    float *inp, *w, *out, *R;
} mm;

static double mm_loss(void)
{
    mal_kern_matmul_fwd(K, mm.out, mm.inp, mm.w, mm.N, mm.C, mm.OC, 0);
    return dot_d(mm.out, mm.R, (size_t)mm.N * mm.OC);
}

static void test_matmul(int N, int C, int OC)
{
    char what[64];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    mm.N = N, mm.C = C, mm.OC = OC;
    mm.inp = fbuf(ni), mm.w = fbuf(nw), mm.out = fbuf(no), mm.R = fbuf(no);
    fill(mm.inp, ni, 10, 1.0);
    fill(mm.w, nw, 11, 0.5);
    fill(mm.R, no, 12, 1.0);

    double *ref = malloc(no * sizeof *ref);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += (double)mm.inp[n * C + c] * mm.w[o * C + c];
            ref[n * OC + o] = s;
        }
    mal_kern_matmul_fwd(K, mm.out, mm.inp, mm.w, N, C, OC, 0);
    snprintf(what, sizeof what, "fwd N=%d C=%d OC=%d", N, C, OC);
    report("matmul", what, max_rel(mm.out, ref, no), 1e-5);

    /* accumulate = 1 adds to what is there */
    for (size_t i = 0; i < no; i++) {
        mm.out[i] = (float)(0.5 * i);
        ref[i] += 0.5 * i;
    }
    mal_kern_matmul_fwd(K, mm.out, mm.inp, mm.w, N, C, OC, 1);
    report("matmul", "fwd accumulate=1", max_rel(mm.out, ref, no), 1e-5);

    /* backward with dout = R */
    float *dinp = fbuf(ni), *dw = fbuf(nw);
    mal_kern_matmul_bwd(K, dinp, dw, mm.R, mm.inp, mm.w, N, C, OC);
    report("matmul", "bwd dinp vs FD", fd_check(mm_loss, mm.inp, ni, dinp), FD_TOL);
    report("matmul", "bwd dweight vs FD", fd_check(mm_loss, mm.w, nw, dw), FD_TOL);

    /* accumulate and NULL gradients */
    float *pi = fbuf(ni), *pw = fbuf(nw), *gi = fbuf(ni), *gw = fbuf(nw);
    fill(pi, ni, 13, 1.0);
    fill(pw, nw, 14, 1.0);
    memcpy(gi, pi, ni * sizeof *gi);
    memcpy(gw, pw, nw * sizeof *gw);
    mal_kern_matmul_bwd(K, gi, gw, mm.R, mm.inp, mm.w, N, C, OC);
    report("matmul", "bwd accumulates (dinp)", acc_err(gi, pi, dinp, ni), 1e-6);
    report("matmul", "bwd accumulates (dweight)", acc_err(gw, pw, dw, nw), 1e-6);
    memcpy(gi, pi, ni * sizeof *gi);
    mal_kern_matmul_bwd(K, gi, NULL, mm.R, mm.inp, mm.w, N, C, OC);
    report("matmul", "bwd dweight=NULL", acc_err(gi, pi, dinp, ni), 1e-6);
    memcpy(gw, pw, nw * sizeof *gw);
    mal_kern_matmul_bwd(K, NULL, gw, mm.R, mm.inp, mm.w, N, C, OC);
    report("matmul", "bwd dinp=NULL", acc_err(gw, pw, dw, nw), 1e-6);

    free(ref);
    float *bufs[] = {mm.inp, mm.w, mm.out, mm.R, dinp, dw, pi, pw, gi, gw};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* rmsnorm */

static struct {
    int N, C;
    float eps;
    float *inp, *w, *out, *rstd, *R;
} rn;

static double rn_loss(void)
{
    mal_kern_rmsnorm_fwd(K, rn.out, rn.rstd, rn.inp, rn.w, rn.N, rn.C, rn.eps);
    return dot_d(rn.out, rn.R, (size_t)rn.N * rn.C);
}

static void test_rmsnorm(int N, int C)
{
    char what[64];
    size_t nx = (size_t)N * C;
    /* a large eps and one row of small values, so that eps matters while
     * the FD step stays small against the values */
    rn.N = N, rn.C = C, rn.eps = 1e-2f;
    rn.inp = fbuf(nx), rn.w = fbuf(C), rn.out = fbuf(nx), rn.rstd = fbuf(N), rn.R = fbuf(nx);
    fill(rn.inp, nx, 20, 1.0);
    fill(rn.w, C, 21, 1.0);
    fill(rn.R, nx, 22, 1.0);
    for (int c = 0; c < C; c++)
        rn.inp[c] *= 0.1f;

    double *ref = malloc(nx * sizeof *ref), *rref = malloc(N * sizeof *rref);
    for (int n = 0; n < N; n++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)rn.inp[n * C + c] * rn.inp[n * C + c];
        rref[n] = 1.0 / sqrt(ss / C + rn.eps);
        for (int c = 0; c < C; c++)
            ref[n * C + c] = rn.inp[n * C + c] * rref[n] * rn.w[c];
    }
    mal_kern_rmsnorm_fwd(K, rn.out, rn.rstd, rn.inp, rn.w, N, C, rn.eps);
    snprintf(what, sizeof what, "fwd out N=%d C=%d", N, C);
    report("rmsnorm", what, max_rel(rn.out, ref, nx), 1e-5);
    report("rmsnorm", "fwd rstd", max_rel(rn.rstd, rref, N), 1e-5);

    float *dx = fbuf(nx), *dw = fbuf(C);
    mal_kern_rmsnorm_fwd(K, rn.out, rn.rstd, rn.inp, rn.w, N, C, rn.eps);
    mal_kern_rmsnorm_bwd(K, dx, dw, rn.R, rn.inp, rn.w, rn.rstd, N, C);
    /* the loss re-runs the forward, which rewrites rstd: keep a copy */
    float *rstd0 = fbuf(N);
    memcpy(rstd0, rn.rstd, N * sizeof *rstd0);
    report("rmsnorm", "bwd dinp vs FD", fd_check(rn_loss, rn.inp, nx, dx), FD_TOL);
    report("rmsnorm", "bwd dweight vs FD", fd_check(rn_loss, rn.w, C, dw), FD_TOL);

    float *pi = fbuf(nx), *pw = fbuf(C), *gi = fbuf(nx), *gw = fbuf(C);
    fill(pi, nx, 23, 1.0);
    fill(pw, C, 24, 1.0);
    memcpy(gi, pi, nx * sizeof *gi);
    memcpy(gw, pw, C * sizeof *gw);
    mal_kern_rmsnorm_bwd(K, gi, gw, rn.R, rn.inp, rn.w, rstd0, N, C);
    report("rmsnorm", "bwd accumulates (dinp)", acc_err(gi, pi, dx, nx), 1e-6);
    report("rmsnorm", "bwd accumulates (dweight)", acc_err(gw, pw, dw, C), 1e-6);

    free(ref);
    free(rref);
    float *bufs[] = {rn.inp, rn.w, rn.out, rn.rstd, rn.R, dx, dw, rstd0, pi, pw, gi, gw};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* rope */

static struct {
    int B, T, H, hd;
    mal_rope rope;
    float *x, *work, *R;
} rp;

static double rp_loss(void)
{
    size_t n = (size_t)rp.B * rp.T * rp.H * rp.hd;
    memcpy(rp.work, rp.x, n * sizeof *rp.work);
    mal_kern_rope_fwd(K, rp.work, rp.B, rp.T, rp.H, rp.hd, &rp.rope);
    return dot_d(rp.work, rp.R, n);
}

/* The rotary frequency of pair i: theta^(-2i/hd), and with the llama3
 * scaling Hugging Face's _compute_llama3_parameters (transformers 4.44)
 * spelled out as it is written there: the low-frequency rule first
 * (wavelen > low_freq_wavelen: divided by factor), then the smoothed
 * value for the band that is neither shorter than high_freq_wavelen nor
 * longer than low_freq_wavelen. */
static double ref_inv_freq(const mal_rope *r, int hd, int i)
{
    double inv = 1.0 / pow(r->theta, 2.0 * i / hd);
    if (!r->llama3) return inv;
    double low_wl = r->original_max_pos / (double)r->low_freq_factor;
    double high_wl = r->original_max_pos / (double)r->high_freq_factor;
    double wl = 2 * M_PI / inv;
    double llama = wl > low_wl ? inv / r->factor : inv;
    double smooth = (r->original_max_pos / wl - r->low_freq_factor) /
                    (r->high_freq_factor - r->low_freq_factor);
    double smoothed = (1 - smooth) * llama / r->factor + smooth * llama;
    int medium = !(wl < high_wl) && !(wl > low_wl);
    return medium ? smoothed : llama;
}

/* rope_fwd against explicit cos/sin; returns the max relative error */
static double rope_fwd_err(int B, int T, int H, int hd, mal_rope rope, uint64_t stream)
{
    size_t n = (size_t)B * T * H * hd;
    float *x = fbuf(n);
    double *ref = malloc(n * sizeof *ref);
    fill(x, n, stream, 1.0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < hd / 2; i++) {
                    size_t o = (((size_t)b * T + t) * H + h) * hd + 2 * i;
                    double ang = t * ref_inv_freq(&rope, hd, i);
                    ref[o] = x[o] * cos(ang) - x[o + 1] * sin(ang);
                    ref[o + 1] = x[o] * sin(ang) + x[o + 1] * cos(ang);
                }
    mal_kern_rope_fwd(K, x, B, T, H, hd, &rope);
    double e = max_rel(x, ref, n);
    free(ref);
    mal_kern_free(K, x);
    return e;
}

/* LLaMA 3's scaling with a short original context, so that the pairs of
 * head dimension 16 at theta 500000 fall in all three bands: kept (pairs
 * 0-1), interpolated (2-3), divided (4-7). */
static mal_rope llama3_rope(void)
{
    mal_rope r = {500000.0f, 1, 8.0f, 1.0f, 4.0f, 64};
    return r;
}

static void test_rope(void)
{
    rp.B = 2, rp.T = 5, rp.H = 3, rp.hd = 4, rp.rope = mal_rope_plain(10000.0f);
    size_t n = (size_t)rp.B * rp.T * rp.H * rp.hd;
    report("rope", "fwd B=2 T=5 H=3 hd=4",
           rope_fwd_err(2, 5, 3, 4, mal_rope_plain(10000.0f), 30), 1e-6);
    /* the table cache: longer T, other hd, other theta, shorter T again,
     * then more distinct keys than the cache holds */
    double e = 0.0;
    e = fmax(e, rope_fwd_err(1, 40, 2, 4, mal_rope_plain(10000.0f), 31));
    e = fmax(e, rope_fwd_err(2, 7, 1, 6, mal_rope_plain(10000.0f), 32));
    e = fmax(e, rope_fwd_err(1, 9, 2, 4, mal_rope_plain(500.0f), 33));
    e = fmax(e, rope_fwd_err(2, 3, 2, 4, mal_rope_plain(10000.0f), 34));
    for (int i = 0; i < 12; i++)
        e = fmax(e, rope_fwd_err(1, 6 + i, 1, 2 * (1 + i % 4), mal_rope_plain(100.0f + i), 35 + i));
    report("rope", "fwd, 16 shape/theta changes", e, 1e-5);

    /* llama3 scaling: every band, and a table of the same theta but
     * unscaled must not be served for it from the cache (nor the other
     * way round) */
    mal_rope l3 = llama3_rope(), plain = mal_rope_plain(500000.0f);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) {
        double wl = 2 * M_PI / ref_inv_freq(&plain, 16, i);
        bands[wl < 64 / 4.0 ? 0 : wl > 64 ? 2 : 1]++;
    }
    CHECK(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
    e = rope_fwd_err(1, 33, 2, 16, mal_rope_plain(500000.0f), 36);
    e = fmax(e, rope_fwd_err(1, 33, 2, 16, l3, 37));
    e = fmax(e, rope_fwd_err(1, 33, 2, 16, mal_rope_plain(500000.0f), 38));
    report("rope", "fwd llama3 scaling (3 bands), cache", e, 1e-5);
    double fe = 0.0;
    for (int i = 0; i < 8; i++)
        fe = fmax(fe, fabs(mal_rope_inv_freq(&l3, 16, i) / ref_inv_freq(&l3, 16, i) - 1.0));
    report("rope", "llama3 inv_freq vs HF formula", fe, 1e-12);

    rp.x = fbuf(n), rp.work = fbuf(n), rp.R = fbuf(n);
    fill(rp.x, n, 50, 1.0);
    fill(rp.R, n, 51, 1.0);
    float *g = fbuf(n);
    memcpy(g, rp.R, n * sizeof *g);
    mal_kern_rope_bwd(K, g, rp.B, rp.T, rp.H, rp.hd, &rp.rope);
    report("rope", "bwd vs FD", fd_check(rp_loss, rp.x, n, g), FD_TOL);

    /* bwd(fwd(x)) == x */
    memcpy(rp.work, rp.x, n * sizeof *rp.work);
    mal_kern_rope_fwd(K, rp.work, rp.B, rp.T, rp.H, rp.hd, &rp.rope);
    mal_kern_rope_bwd(K, rp.work, rp.B, rp.T, rp.H, rp.hd, &rp.rope);
    report("rope", "bwd(fwd(x)) == x", max_rel_f(rp.work, rp.x, n), 1e-6);

    /* the scaled backward against finite differences */
    rp.rope = l3;
    memcpy(g, rp.R, n * sizeof *g);
    mal_kern_rope_bwd(K, g, rp.B, rp.T, rp.H, rp.hd, &rp.rope);
    report("rope", "bwd llama3 vs FD", fd_check(rp_loss, rp.x, n, g), FD_TOL);

    /* an odd head dimension is an error reported by sync */
    mal_kern_rope_fwd(K, rp.work, 1, 1, 1, 3, &rp.rope);
    CHECK_EQ_INT(mal_kern_sync(K), MAL_EINVAL);
    CHECK_EQ_INT(mal_kern_sync(K), 0);

    float *bufs[] = {rp.x, rp.work, rp.R, g};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* attention */

static struct {
    int B, T, hd;
    mal_attn_heads hs;
    float *q, *k, *v, *out, *att, *R;
} at;

static double at_loss(void)
{
    mal_kern_attention_fwd(K, at.out, at.att, at.q, at.k, at.v, at.B, at.T, at.hs, at.hd);
    return dot_d(at.out, at.R, (size_t)at.B * at.T * at.hs.H * at.hd);
}

/* Grouped-query attention with heads hs (H query heads; k and v with Hkv
 * heads, query head h reading (h + q_off) / group).  {H, H, 1, 0} is
 * multi-head attention. */
static void test_attention(int B, int T, mal_attn_heads hs, int hd)
{
    char what[80];
    const int H = hs.H, Hk = hs.Hkv;
    at.B = B, at.T = T, at.hs = hs, at.hd = hd;
    size_t n = (size_t)B * T * H * hd, nk = (size_t)B * T * Hk * hd, na = (size_t)B * H * T * T;
    at.q = fbuf(n), at.k = fbuf(nk), at.v = fbuf(nk), at.out = fbuf(n), at.att = fbuf(na);
    at.R = fbuf(n);
    fill(at.q, n, 60, 1.0);
    fill(at.k, nk, 61, 1.0);
    fill(at.v, nk, 62, 1.0);
    fill(at.R, n, 63, 1.0);
    /* every key/value head is read by some query head */
    int *read = calloc((size_t)Hk, sizeof *read);
    for (int h = 0; h < H; h++) {
        int j = (h + hs.q_off) / hs.group;
        CHECK(j >= 0 && j < Hk);
        read[j] = 1;
    }
    for (int j = 0; j < Hk; j++)
        CHECK(read[j]);
    free(read);

    /* naive reference: query head h reads key/value head (h + q_off) /
     * group, written out here */
    double *ref = malloc(n * sizeof *ref), *pref = calloc(na, sizeof *pref);
    double *srow = malloc(T * sizeof *srow);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int j = (h + hs.q_off) / hs.group;
            for (int t = 0; t < T; t++) {
                const float *qt = at.q + (((size_t)b * T + t) * H + h) * hd;
                double mx = -INFINITY, sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    const float *ks = at.k + (((size_t)b * T + s) * Hk + j) * hd;
                    double d = 0.0;
                    for (int i = 0; i < hd; i++)
                        d += (double)qt[i] * ks[i];
                    srow[s] = d / sqrt((double)hd);
                    mx = fmax(mx, srow[s]);
                }
                for (int s = 0; s <= t; s++)
                    sum += exp(srow[s] - mx);
                double *P = pref + (((size_t)b * H + h) * T + t) * T;
                for (int s = 0; s <= t; s++)
                    P[s] = exp(srow[s] - mx) / sum;
                for (int i = 0; i < hd; i++) {
                    double o = 0.0;
                    for (int s = 0; s <= t; s++)
                        o += P[s] * at.v[(((size_t)b * T + s) * Hk + j) * hd + i];
                    ref[(((size_t)b * T + t) * H + h) * hd + i] = o;
                }
            }
        }
    mal_kern_attention_fwd(K, at.out, at.att, at.q, at.k, at.v, B, T, hs, hd);
    snprintf(what, sizeof what, "fwd out B=%d T=%d H=%d/%d g%d+%d hd=%d", B, T, H, Hk, hs.group,
             hs.q_off, hd);
    report("attention", what, max_rel(at.out, ref, n), 1e-5);
    report("attention", "fwd att probabilities", max_rel(at.att, pref, na), 1e-6);

    /* rows sum to 1, exact zeros above the diagonal */
    double rowerr = 0.0;
    int above = 0;
    for (size_t r = 0; r < (size_t)B * H * T; r++) {
        int t = (int)(r % T);
        double s = 0.0;
        for (int c = 0; c < T; c++) {
            s += at.att[r * T + c];
            if (c > t && at.att[r * T + c] != 0.0f) above++;
        }
        rowerr = fmax(rowerr, fabs(s - 1.0));
    }
    report("attention", "att rows sum to 1", rowerr, 1e-5);
    CHECK_EQ_INT(above, 0);

    /* causality: changing the last position's k and v must not change any
     * earlier output, and must change the last one */
    float *out0 = fbuf(n);
    memcpy(out0, at.out, n * sizeof *out0);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Hk; j++)
            for (int i = 0; i < hd; i++) {
                size_t o = (((size_t)b * T + T - 1) * Hk + j) * hd + i;
                at.k[o] += 1.0f;
                at.v[o] -= 2.0f;
            }
    mal_kern_attention_fwd(K, at.out, at.att, at.q, at.k, at.v, B, T, hs, hd);
    double past = 0.0, last = 0.0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < H * hd; j++) {
                size_t o = ((size_t)b * T + t) * H * hd + j;
                double d = fabs(at.out[o] - out0[o]);
                if (t < T - 1)
                    past = fmax(past, d);
                else
                    last = fmax(last, d);
            }
    report("attention", "causal: future k,v leave past alone", past, 0.0);
    CHECK(last > 1e-3);
    fill(at.k, nk, 61, 1.0);
    fill(at.v, nk, 62, 1.0);

    /* backward: scratch is documented as undefined, so poison it; a
     * key/value head shared by query heads gets all their gradients */
    float *dq = fbuf(n), *dk = fbuf(nk), *dv = fbuf(nk), *scratch = fbuf(na);
    for (size_t i = 0; i < na; i++)
        scratch[i] = NAN;
    mal_kern_attention_fwd(K, at.out, at.att, at.q, at.k, at.v, B, T, hs, hd);
    float *att0 = fbuf(na);
    memcpy(att0, at.att, na * sizeof *att0);
    mal_kern_attention_bwd(K, dq, dk, dv, scratch, at.R, at.out, at.q, at.k, at.v, at.att, B, T, hs,
                           hd);
    report("attention", "bwd dq vs FD", fd_check(at_loss, at.q, n, dq), FD_TOL);
    report("attention", "bwd dk vs FD", fd_check(at_loss, at.k, nk, dk), FD_TOL);
    report("attention", "bwd dv vs FD", fd_check(at_loss, at.v, nk, dv), FD_TOL);

    float *pq = fbuf(n), *pk = fbuf(nk), *pv = fbuf(nk), *gq = fbuf(n), *gk = fbuf(nk);
    float *gv = fbuf(nk);
    fill(pq, n, 64, 1.0);
    fill(pk, nk, 65, 1.0);
    fill(pv, nk, 66, 1.0);
    memcpy(gq, pq, n * sizeof *gq);
    memcpy(gk, pk, nk * sizeof *gk);
    memcpy(gv, pv, nk * sizeof *gv);
    for (size_t i = 0; i < na; i++)
        scratch[i] = NAN;
    mal_kern_attention_bwd(K, gq, gk, gv, scratch, at.R, at.out, at.q, at.k, at.v, att0, B, T, hs,
                           hd);
    /* the contract writes the gradients: what the buffers held before
     * (pq, pk, pv) must not show */
    double e = fmax(max_rel_f(gq, dq, n), fmax(max_rel_f(gk, dk, nk), max_rel_f(gv, dv, nk)));
    report("attention", "bwd writes (dq, dk, dv) over old contents", e, 0);

    free(ref);
    free(pref);
    free(srow);
    float *bufs[] = {at.q, at.k,    at.v, at.out, at.att, at.R, out0, dq, dk,
                     dv,   scratch, att0, pq,     pk,     pv,   gq,   gk, gv};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* swiglu */

static struct {
    size_t n;
    float *gate, *up, *out, *R;
} sw;

static double sw_loss(void)
{
    mal_kern_swiglu_fwd(K, sw.out, sw.gate, sw.up, sw.n);
    return dot_d(sw.out, sw.R, sw.n);
}

static void test_swiglu(size_t n)
{
    char what[64];
    sw.n = n;
    sw.gate = fbuf(n), sw.up = fbuf(n), sw.out = fbuf(n), sw.R = fbuf(n);
    fill(sw.gate, n, 70, 2.0);
    fill(sw.up, n, 71, 1.0);
    fill(sw.R, n, 72, 1.0);
    /* saturated gates */
    sw.gate[0] = 30.0f, sw.gate[1] = -30.0f, sw.gate[n - 1] = 100.0f, sw.gate[n - 2] = -100.0f;

    double *ref = malloc(n * sizeof *ref);
    for (size_t i = 0; i < n; i++) {
        double g = sw.gate[i];
        ref[i] = g / (1.0 + exp(-g)) * sw.up[i];
    }
    mal_kern_swiglu_fwd(K, sw.out, sw.gate, sw.up, n);
    snprintf(what, sizeof what, "fwd n=%zu", n);
    report("swiglu", what, max_rel(sw.out, ref, n), 1e-6);

    float *dg = fbuf(n), *du = fbuf(n);
    mal_kern_swiglu_bwd(K, dg, du, sw.R, sw.gate, sw.up, n);
    report("swiglu", "bwd dgate vs FD", fd_check(sw_loss, sw.gate, n, dg), FD_TOL);
    report("swiglu", "bwd dup vs FD", fd_check(sw_loss, sw.up, n, du), FD_TOL);

    float *pg = fbuf(n), *pu = fbuf(n), *gg = fbuf(n), *gu = fbuf(n);
    fill(pg, n, 73, 1.0);
    fill(pu, n, 74, 1.0);
    memcpy(gg, pg, n * sizeof *gg);
    memcpy(gu, pu, n * sizeof *gu);
    mal_kern_swiglu_bwd(K, gg, gu, sw.R, sw.gate, sw.up, n);
    report("swiglu", "bwd accumulates (dgate, dup)",
           fmax(acc_err(gg, pg, dg, n), acc_err(gu, pu, du, n)), 1e-6);

    free(ref);
    float *bufs[] = {sw.gate, sw.up, sw.out, sw.R, dg, du, pg, pu, gg, gu};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* add, accumulate, scale, sumsq */

static void test_elementwise(size_t n)
{
    float *a = fbuf(n), *b = fbuf(n), *o = fbuf(n), *a0 = fbuf(n);
    double *ref = malloc(n * sizeof *ref);
    fill(a0, n, 80, 1.0);
    fill(b, n, 81, 1.0);
    double e = 0.0;

    for (size_t i = 0; i < n; i++)
        ref[i] = (double)a0[i] + b[i];
    memcpy(a, a0, n * sizeof *a);
    mal_kern_add(K, o, a, b, n);
    e = fmax(e, max_rel(o, ref, n));
    mal_kern_add(K, a, a, b, n); /* out aliases a */
    e = fmax(e, max_rel(a, ref, n));
    memcpy(a, a0, n * sizeof *a);
    memcpy(o, b, n * sizeof *o);
    mal_kern_add(K, o, a, o, n); /* out aliases b */
    e = fmax(e, max_rel(o, ref, n));
    for (size_t i = 0; i < n; i++)
        ref[i] = 2.0 * a0[i];
    mal_kern_add(K, a, a, a, n); /* all three */
    e = fmax(e, max_rel(a, ref, n));
    report("add", "out=a+b incl. aliasing", e, 1e-7);

    memcpy(a, a0, n * sizeof *a);
    for (size_t i = 0; i < n; i++)
        ref[i] = (double)a0[i] + b[i];
    mal_kern_accumulate(K, a, b, n);
    e = max_rel(a, ref, n);
    report("accumulate", "y += x", e, 1e-7);

    memcpy(a, a0, n * sizeof *a);
    for (size_t i = 0; i < n; i++)
        ref[i] = (double)a0[i] * -0.37f;
    mal_kern_scale(K, a, n, -0.37f);
    report("scale", "x *= s", max_rel(a, ref, n), 1e-7);

    /* into a device-side accumulator: one contiguous run, then the odd
     * columns [2, 2+w) of a (rows x cols) matrix as strided runs, added on */
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a0[i] * a0[i];
    double *acc = mal_kern_alloc(K, sizeof(double)), got;
    mal_kern_zero(K, acc, sizeof(double));
    mal_kern_sumsq(K, acc, a0, 1, n, n);
    mal_kern_to_host(K, &got, acc, sizeof got);
    CHECK_OK(mal_kern_sync(K));
    report("sumsq", "sum x^2 (double)", fabs(got - s) / s, 1e-12);
    const size_t rows = 5, cols = 10, w = 3;
    CHECK(rows * cols <= n);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 2; c < 2 + w; c++)
            s += (double)a0[r * cols + c] * a0[r * cols + c];
    mal_kern_sumsq(K, acc, a0 + 2, rows, w, cols);
    mal_kern_to_host(K, &got, acc, sizeof got);
    CHECK_OK(mal_kern_sync(K));
    report("sumsq", "+ strided runs, one read", fabs(got - s) / s, 1e-12);
    mal_kern_free(K, acc);

    free(ref);
    float *bufs[] = {a, b, o, a0};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* embedding */

static struct {
    int N, C, V, v0, Vl;
    int *tok;
    float *wte, *out, *R;
} em;

static double em_loss(void)
{
    mal_kern_embedding_fwd(K, em.out, em.tok, em.wte, em.N, em.C, em.V, em.v0, em.Vl);
    return dot_d(em.out, em.R, (size_t)em.N * em.C);
}

/* The table of rows [v0, v0 + Vl) of a vocabulary of V (all of it: v0 0,
 * Vl V; a vocabulary-parallel shard otherwise). */
static void test_embedding(int N, int C, int V, int v0, int Vl)
{
    char what[64];
    em.N = N, em.C = C, em.V = V, em.v0 = v0, em.Vl = Vl;
    em.tok = mal_kern_alloc(K, N * sizeof(int));
    em.wte = fbuf((size_t)Vl * C), em.out = fbuf((size_t)N * C), em.R = fbuf((size_t)N * C);
    CHECK(em.tok != NULL);
    /* duplicates on purpose: token v0 + 3 appears several times, V-1 and
     * 0 once (outside a shard's rows unless it holds them) */
    for (int n = 0; n < N; n++)
        em.tok[n] = n % 3 == 0 ? v0 + 3 % Vl : (int)(mal_rng_below(42, 90, n, V));
    em.tok[N - 1] = V - 1;
    em.tok[N - 2] = 0;
    fill(em.wte, (size_t)Vl * C, 91, 1.0);
    fill(em.R, (size_t)N * C, 92, 1.0);

    mal_kern_embedding_fwd(K, em.out, em.tok, em.wte, N, C, V, v0, Vl);
    double e = 0.0;
    for (int n = 0; n < N; n++) {
        int own = em.tok[n] >= v0 && em.tok[n] < v0 + Vl;
        for (int c = 0; c < C; c++)
            e = fmax(e, fabs(em.out[n * C + c] -
                             (own ? em.wte[(size_t)(em.tok[n] - v0) * C + c] : 0.0f)));
    }
    snprintf(what, sizeof what, "fwd gather V=%d rows [%d, %d)", V, v0, v0 + Vl);
    report("embedding", what, e, 0.0);
    CHECK_EQ_INT(mal_kern_sync(K), 0); /* other shards' tokens are no error */

    float *dw = fbuf((size_t)Vl * C);
    mal_kern_embedding_bwd(K, dw, em.R, em.tok, N, C, v0, Vl);
    report("embedding", "bwd vs FD (duplicate tokens)",
           fd_check(em_loss, em.wte, (size_t)Vl * C, dw), FD_TOL);

    float *pw = fbuf((size_t)Vl * C), *gw = fbuf((size_t)Vl * C);
    fill(pw, (size_t)Vl * C, 93, 1.0);
    memcpy(gw, pw, (size_t)Vl * C * sizeof *gw);
    mal_kern_embedding_bwd(K, gw, em.R, em.tok, N, C, v0, Vl);
    report("embedding", "bwd accumulates", acc_err(gw, pw, dw, (size_t)Vl * C), 1e-6);

    /* a token outside the vocabulary is reported by sync */
    em.tok[1] = -1;
    mal_kern_embedding_fwd(K, em.out, em.tok, em.wte, N, C, V, v0, Vl);
    CHECK_EQ_INT(mal_kern_sync(K), MAL_EINVAL);
    CHECK_EQ_INT(mal_kern_sync(K), 0);
    em.tok[1] = V;
    mal_kern_embedding_fwd(K, em.out, em.tok, em.wte, N, C, V, v0, Vl);
    CHECK_EQ_INT(mal_kern_sync(K), MAL_EINVAL);
    CHECK_EQ_INT(mal_kern_sync(K), 0);

    mal_kern_free(K, em.tok);
    float *bufs[] = {em.wte, em.out, em.R, dw, pw, gw};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* cross-entropy */

static struct {
    int N, V;
    float dscale;
    int *tgt;
    float *logits, *losses;
} xe;

/* L = dscale * sum_n loss_n, whose gradient is dlogits */
static double xe_loss(void)
{
    mal_kern_xent_fwd_bwd(K, xe.losses, NULL, xe.logits, xe.tgt, xe.N, xe.V, xe.dscale);
    double s = 0.0;
    for (int n = 0; n < xe.N; n++)
        s += xe.losses[n];
    return xe.dscale * s;
}

static void test_xent(int N, int V, float offset)
{
    char what[64];
    size_t nl = (size_t)N * V;
    xe.N = N, xe.V = V, xe.dscale = 0.7f;
    xe.tgt = mal_kern_alloc(K, N * sizeof(int));
    xe.logits = fbuf(nl), xe.losses = fbuf(N);
    CHECK(xe.tgt != NULL);
    fill(xe.logits, nl, 100, 2.0);
    for (size_t i = 0; i < nl; i++)
        xe.logits[i] += offset;
    /* one logit far above the rest of its row, at the row's end (the scalar
     * tail of the vectorised max): without the right max, e^x overflows */
    xe.logits[(size_t)2 * V - 1] += 200.0f;
    for (int n = 0; n < N; n++)
        xe.tgt[n] = (int)mal_rng_below(42, 101, n, V);
    xe.tgt[0] = 0, xe.tgt[N - 1] = V - 1;

    double *lref = malloc(N * sizeof *lref), *dref = malloc(nl * sizeof *dref);
    for (int n = 0; n < N; n++) {
        const float *x = xe.logits + (size_t)n * V;
        double mx = -INFINITY, s = 0.0;
        for (int i = 0; i < V; i++)
            mx = fmax(mx, x[i]);
        for (int i = 0; i < V; i++)
            s += exp(x[i] - mx);
        lref[n] = mx + log(s) - x[xe.tgt[n]];
        for (int i = 0; i < V; i++)
            dref[(size_t)n * V + i] = xe.dscale * (exp(x[i] - mx) / s - (i == xe.tgt[n]));
    }
    float *d = fbuf(nl);
    mal_kern_xent_fwd_bwd(K, xe.losses, d, xe.logits, xe.tgt, N, V, xe.dscale);
    snprintf(what, sizeof what, "fwd losses N=%d V=%d offset %g", N, V, offset);
    report("xent", what, max_rel(xe.losses, lref, N), 1e-6);
    report("xent", "dlogits vs reference", max_rel(d, dref, nl), 1e-6);
    if (offset == 0.0f) {
        report("xent", "dlogits vs FD", fd_check(xe_loss, xe.logits, nl, d), FD_TOL);
        /* the FD loop left losses of perturbed logits behind */
        mal_kern_xent_fwd_bwd(K, xe.losses, d, xe.logits, xe.tgt, N, V, xe.dscale);
    }

    /* dlogits == logits (in place) gives the same as out of place */
    float *inpl = fbuf(nl), *l2 = fbuf(N);
    memcpy(inpl, xe.logits, nl * sizeof *inpl);
    mal_kern_xent_fwd_bwd(K, l2, inpl, inpl, xe.tgt, N, V, xe.dscale);
    report("xent", "in place == out of place (dlogits)", max_rel_f(inpl, d, nl), 0.0);
    report("xent", "in place == out of place (losses)", max_rel_f(l2, xe.losses, N), 0.0);
    /* no dlogits: losses only */
    mal_kern_zero(K, l2, N * sizeof(float));
    mal_kern_xent_fwd_bwd(K, l2, NULL, xe.logits, xe.tgt, N, V, xe.dscale);
    report("xent", "dlogits=NULL losses", max_rel_f(l2, xe.losses, N), 0.0);

    /* a target outside the vocabulary is reported by sync */
    xe.tgt[1] = V;
    mal_kern_xent_fwd_bwd(K, l2, NULL, xe.logits, xe.tgt, N, V, xe.dscale);
    CHECK(isnan(l2[1]));
    CHECK_EQ_INT(mal_kern_sync(K), MAL_EINVAL);
    CHECK_EQ_INT(mal_kern_sync(K), 0);

    free(lref);
    free(dref);
    mal_kern_free(K, xe.tgt);
    float *bufs[] = {xe.logits, xe.losses, d, inpl, l2};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* The vocabulary-parallel cross-entropy: the logits (N,V) cut into P
 * column shards of uneven widths ([V p / P, V (p+1) / P)); each shard's
 * xent_stats into its slot of the exchange, then xent_combine on every
 * shard must give xent_fwd_bwd's losses and, side by side, its gradient
 * (to float rounding: the sum of exponentials is split), every shard the
 * same loss bits, and with P = 1 exactly xent_fwd_bwd's bits. */
static void test_xent_vp(int N, int V, int P)
{
    char what[80];
    size_t nl = (size_t)N * V, slot = 3 * (size_t)N;
    int *tgt = mal_kern_alloc(K, N * sizeof(int));
    float *logits = fbuf(nl), *loss = fbuf(N), *d = fbuf(nl), *all = fbuf((size_t)P * slot);
    CHECK(tgt != NULL);
    fill(logits, nl, 110, 3.0);
    logits[(size_t)2 * V - 1] += 200.0f; /* the row's max in the last shard */
    for (int n = 0; n < N; n++)
        tgt[n] = (int)mal_rng_below(42, 111, n, V);
    tgt[0] = 0, tgt[N - 1] = V - 1;
    mal_kern_xent_fwd_bwd(K, loss, d, logits, tgt, N, V, 0.7f);

    float **sh = malloc((size_t)P * sizeof *sh), *sl = fbuf((size_t)P * N);
    mal_kern_zero(K, all, (size_t)P * slot * sizeof(float));
    for (int p = 0; p < P; p++) {
        int v0 = (int)((int64_t)V * p / P), Vl = (int)((int64_t)V * (p + 1) / P) - v0;
        sh[p] = fbuf((size_t)N * Vl);
        for (int n = 0; n < N; n++)
            memcpy(sh[p] + (size_t)n * Vl, logits + (size_t)n * V + v0, Vl * sizeof(float));
        mal_kern_xent_stats(K, all + (size_t)p * slot, sh[p], tgt, N, Vl, v0);
    }
    double le = 0.0, de = 0.0, same = 0.0;
    for (int p = 0; p < P; p++) {
        int v0 = (int)((int64_t)V * p / P), Vl = (int)((int64_t)V * (p + 1) / P) - v0;
        /* in place, as the model calls it */
        mal_kern_xent_combine(K, sl + (size_t)p * N, sh[p], sh[p], all, P, tgt, N, Vl, v0, V,
                              0.7f);
        le = fmax(le, max_rel_f(sl + (size_t)p * N, loss, N));
        same = fmax(same, max_rel_f(sl + (size_t)p * N, sl, N));
        for (int n = 0; n < N; n++)
            for (int i = 0; i < Vl; i++)
                de = fmax(de, fabs(sh[p][(size_t)n * Vl + i] - d[(size_t)n * V + v0 + i]));
    }
    snprintf(what, sizeof what, "vp losses N=%d V=%d P=%d", N, V, P);
    report("xent", what, le, P == 1 ? 0.0 : 1e-6);
    report("xent", "vp dlogits vs fused", de, P == 1 ? 0.0 : 1e-6);
    report("xent", "vp: every shard the same loss bits", same, 0.0);

    /* a target outside the vocabulary: NaN loss, zero gradient, an error */
    tgt[1] = V;
    mal_kern_xent_combine(K, sl, sh[0], sh[0], all, P, tgt, N, (int)((int64_t)V / P), 0, V, 0.7f);
    CHECK(isnan(sl[1]));
    CHECK_EQ_INT(mal_kern_sync(K), MAL_EINVAL);
    CHECK_EQ_INT(mal_kern_sync(K), 0);

    for (int p = 0; p < P; p++)
        mal_kern_free(K, sh[p]);
    free(sh);
    mal_kern_free(K, tgt);
    float *bufs[] = {logits, loss, d, all, sl};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* adamw */

static void test_adamw(size_t n)
{
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-3f, wd = 0.1f, gs = 0.5f;
    float *p = fbuf(n), *g = fbuf(n), *m = fbuf(n), *v = fbuf(n);
    double *rp_ = malloc(n * sizeof *rp_), *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
    fill(p, n, 110, 1.0);
    for (size_t i = 0; i < n; i++)
        rp_[i] = p[i];
    double ep = 0.0, em_ = 0.0, ev = 0.0;
    for (int t = 1; t <= 3; t++) {
        fill(g, n, 111 + t, 1.0);
        g[0] = 0.0f; /* eps alone in the denominator at step 1 */
        for (size_t i = 0; i < n; i++) {
            double gg = (double)g[i] * gs;
            rm[i] = b1 * rm[i] + (1.0 - b1) * gg;
            rv[i] = b2 * rv[i] + (1.0 - b2) * gg * gg;
            double mh = rm[i] / (1.0 - pow(b1, t)), vh = rv[i] / (1.0 - pow(b2, t));
            rp_[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rp_[i]);
        }
        mal_kern_adamw(K, p, p, g, m, v, n, lr, b1, b2, eps, wd, gs, t);
        ep = fmax(ep, max_rel(p, rp_, n));
        em_ = fmax(em_, max_rel(m, rm, n));
        ev = fmax(ev, max_rel(v, rv, n));
    }
    report("adamw", "3 steps: param", ep, 1e-6);
    report("adamw", "3 steps: m", em_, 1e-6);
    report("adamw", "3 steps: v", ev, 1e-6);
    /* a separate working copy is refreshed in the same pass */
    float *work = fbuf(n);
    mal_kern_adamw(K, p, work, g, m, v, n, lr, b1, b2, eps, wd, gs, 4);
    report("adamw", "refreshes a separate working copy", max_rel_f(work, p, n), 0.0);
    mal_kern_zero(K, work, n * sizeof(float));
    mal_kern_cast_working(K, work, p, n);
    report("cast_working", "fp32 working copy", max_rel_f(work, p, n), 0.0);
    mal_kern_free(K, work);
    free(rp_);
    free(rm);
    free(rv);
    float *bufs[] = {p, g, m, v};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
        mal_kern_free(K, bufs[i]);
}

/* ------------------------------------------------------------------------ */
/* strided copies, pinned buffers, events */

/* A (rows x cols) block of floats at column c0 of a (rows x pitch) matrix,
 * moved every way memcpy2d goes: host -> device into a pitched layout,
 * device -> device between pitches, device -> host back to a dense block. */
static void test_memcpy2d(void)
{
    enum { ROWS = 7, COLS = 5, SP = 13, DP = 9 };
    float host[ROWS * SP], back[ROWS * COLS];
    fill(host, ROWS * SP, 120, 1.0);
    float *a = fbuf(ROWS * SP), *b = fbuf(ROWS * DP);
    float *pin = mal_kern_host_alloc(K, ROWS * SP * sizeof(float));
    CHECK(pin != NULL);
    memcpy(pin, host, sizeof host);
    /* H2D: the whole pitched matrix from pinned memory */
    mal_kern_memcpy2d(K, a, SP * sizeof(float), pin, SP * sizeof(float), SP * sizeof(float), ROWS,
                      MAL_COPY_H2D);
    /* D2D: columns [3, 3+COLS) of a into columns [2, 2+COLS) of b */
    mal_kern_memcpy2d(K, b + 2, DP * sizeof(float), a + 3, SP * sizeof(float),
                      COLS * sizeof(float), ROWS, MAL_COPY_D2D);
    /* D2H: back to a dense block */
    mal_kern_memcpy2d(K, back, COLS * sizeof(float), b + 2, DP * sizeof(float),
                      COLS * sizeof(float), ROWS, MAL_COPY_D2H);
    CHECK_OK(mal_kern_sync(K));
    int bad = 0;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            bad += back[r * COLS + c] != host[r * SP + 3 + c];
    /* nothing outside the copied columns of b was written */
    float bh[ROWS * DP];
    mal_kern_to_host(K, bh, b, sizeof bh);
    CHECK_OK(mal_kern_sync(K));
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < DP; c++)
            bad += (c < 2 || c >= 2 + COLS) && bh[r * DP + c] != 0.0f;
    CHECK_EQ_INT(bad, 0);
    mal_kern_host_free(K, pin);
    mal_kern_free(K, a);
    mal_kern_free(K, b);
    printf("%-14s %-34s ok\n", "memcpy2d", "H2D, D2D, D2H with pitches");
}

/* An event pair around a matrix product measures device (CPU) time > 0. */
static void test_events(void)
{
    int n = 96;
    float *a = fbuf((size_t)n * n), *o = fbuf((size_t)n * n);
    mal_kern_event *e0 = mal_kern_event_create(K), *e1 = mal_kern_event_create(K);
    CHECK(e0 && e1);
    mal_kern_event_record(K, e0);
    for (int i = 0; i < 20; i++)
        mal_kern_matmul_fwd(K, o, a, a, n, n, n, 0);
    mal_kern_event_record(K, e1);
    double t = mal_kern_event_elapsed(K, e0, e1);
    mal_kern_queue_wait(K);
    CHECK(t > 0 && t < 60);
    CHECK(mal_kern_native_queue(K) == NULL);
    mal_kern_event_destroy(K, e0);
    mal_kern_event_destroy(K, e1);
    mal_kern_free(K, a);
    mal_kern_free(K, o);
    printf("%-14s %-34s ok (%.2e s)\n", "events", "record/elapsed around 20 matmuls", t);
}

/* ------------------------------------------------------------------------ */
/* the registry */

static void test_registry(void)
{
    const mal_kern_backend *b;
    CHECK_OK(mal_kern_lookup("cpu", &b));
    CHECK(!strcmp(b->reg.name, "cpu"));
    CHECK_OK(mal_kern_lookup("cpu-opaque", &b));
    CHECK_EQ_INT(mal_kern_lookup("nosuch", &b), MAL_EINVAL);
    CHECK(b == NULL && strstr(mal_errmsg(), "cpu, cpu-opaque"));
    char names[128];
    mal_kern_names(names, sizeof names, " ");
    /* the default: $MALLEUS_DEVICE, else the first backend whose probe
     * finds its device */
    const char *env = getenv("MALLEUS_DEVICE");
    char saved[64] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("MALLEUS_DEVICE");
#ifdef HAVE_CUDA
    int rc = mal_kern_lookup("cuda", &b);
    CHECK(rc == 0 || (rc == MAL_EDEVICE && strstr(mal_errmsg(), "cannot be used on this machine")));
    CHECK(!strcmp(mal_kern_default_name(), rc == 0 ? "cuda" : "cpu"));
    CHECK(!strcmp(names, "cuda cpu cpu-opaque"));
#else
    CHECK_EQ_INT(mal_kern_lookup("cuda", &b), MAL_ENOTSUP);
    CHECK(strstr(mal_errmsg(), "not compiled into this build"));
    CHECK(!strcmp(mal_kern_default_name(), "cpu"));
    CHECK(!strcmp(names, "cpu cpu-opaque"));
#endif
    setenv("MALLEUS_DEVICE", "cpu-opaque", 1);
    CHECK(!strcmp(mal_kern_default_name(), "cpu-opaque"));
    if (saved[0])
        setenv("MALLEUS_DEVICE", saved, 1);
    else
        unsetenv("MALLEUS_DEVICE");
    /* MAL_DTYPE_AUTO is the backend's default: fp32 for the CPU */
    mal_kern_config ca = mal_kern_config_default();
    ca.compute = MAL_DTYPE_AUTO;
    mal_kern ka = NULL;
    CHECK_OK(mal_kern_create("cpu", &ca, &ka));
    CHECK(ka->compute == MAL_F32);
    mal_kern_destroy(ka);
    /* bf16 is offered (bf16 storage, fp32 arithmetic: tests/test_ops_bf16) */
    mal_kern_config c = mal_kern_config_default();
    c.compute = MAL_BF16;
    const char *both[] = {"cpu", "cpu-opaque"};
    for (int i = 0; i < 2; i++) {
        mal_kern k = NULL;
        const mal_kern_backend *kb = NULL;
        CHECK_OK(mal_kern_lookup(both[i], &kb));
        CHECK(kb->dtypes & (1u << MAL_BF16) && kb->default_compute == MAL_F32);
        CHECK_OK(mal_kern_create(both[i], &c, &k));
        CHECK(k->compute == MAL_BF16);
        mal_kern_destroy(k);
    }
    c.compute = (mal_dtype)7;
    mal_kern k = NULL;
    CHECK_EQ_INT(mal_kern_create("cpu", &c, &k), MAL_EINVAL);
    CHECK(k == NULL);
    CHECK(K->host_addressable == 1 && K->compute == MAL_F32);
    printf("%-14s %-34s ok\n", "registry", "names, default, not built, bf16");
}

/* ------------------------------------------------------------------------ */
/* cpu-opaque */

/* Copy n host floats into a new device buffer of instance k. */
static float *upload(mal_kern k, const float *host, size_t n)
{
    float *d = mal_kern_alloc(k, n * sizeof(float));
    CHECK(d != NULL);
    mal_kern_from_host(k, d, host, n * sizeof(float));
    return d;
}

/* n floats of device buffer d of k, into host memory (caller frees). */
static float *download(mal_kern k, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    CHECK(h != NULL);
    mal_kern_to_host(k, h, d, n * sizeof(float));
    CHECK_OK(mal_kern_sync(k));
    return h;
}

/* The same few operations on cpu and cpu-opaque from the same host inputs:
 * identical bits, with every byte moved by the copy operations. */
static void opaque_same(mal_kern O)
{
    enum { N = 6, C = 37, OC = 11 };
    float x[N * C], w[OC * C], ln[C];
    fill(x, N * C, 130, 1.0);
    fill(w, OC * C, 131, 1.0);
    fill(ln, C, 132, 1.0);
    mal_kern ks[2] = {K, O};
    float *res[2][5];
    double ss[2];
    for (int b = 0; b < 2; b++) {
        mal_kern k = ks[b];
        float *dx = upload(k, x, N * C), *dw = upload(k, w, OC * C), *dl = upload(k, ln, C);
        float *out = mal_kern_alloc(k, N * OC * sizeof(float));
        float *h = mal_kern_alloc(k, N * C * sizeof(float)), *rstd = mal_kern_alloc(k, N * 4);
        float *g = mal_kern_alloc(k, OC * C * 4), *m = mal_kern_alloc(k, OC * C * 4);
        float *v = mal_kern_alloc(k, OC * C * 4);
        double *acc = mal_kern_alloc(k, sizeof(double));
        mal_kern_matmul_fwd(k, out, dx, dw, N, C, OC, 0);
        mal_kern_rmsnorm_fwd(k, h, rstd, dx, dl, N, C, 1e-5f);
        mal_kern_matmul_bwd(k, NULL, g, out, dx, dw, N, C, OC);
        mal_kern_adamw(k, dw, dw, g, m, v, OC * C, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1);
        mal_kern_zero(k, acc, sizeof(double));
        mal_kern_sumsq(k, acc, g + 1, OC, 5, C);
        mal_kern_to_host(k, &ss[b], acc, sizeof(double));
        res[b][0] = download(k, out, N * OC);
        res[b][1] = download(k, h, N * C);
        res[b][2] = download(k, rstd, N);
        res[b][3] = download(k, dw, OC * C);
        res[b][4] = download(k, m, OC * C);
        void *bufs[] = {dx, dw, dl, out, h, rstd, g, m, v, acc};
        for (size_t i = 0; i < MAL_ARRAY_SIZE(bufs); i++)
            mal_kern_free(k, bufs[i]);
    }
    const size_t n[5] = {N * OC, N * C, N, OC * C, OC * C};
    int same = ss[0] == ss[1];
    for (int i = 0; i < 5; i++) {
        same &= memcmp(res[0][i], res[1][i], n[i] * sizeof(float)) == 0;
        free(res[0][i]);
        free(res[1][i]);
    }
    CHECK(same);
}

/* A host dereference of a cpu-opaque buffer must kill the process at once:
 * tried in a child, which must die of SIGSEGV (or SIGBUS). */
static void opaque_faults(mal_kern O)
{
    float *d = mal_kern_alloc(O, 64 * sizeof(float));
    CHECK(d != NULL);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* the kernel's own verdict, not a sanitizer's handler (which
         * reports the fault and exits with a status instead) */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        volatile float *p = d;
        float x = p[3]; /* must fault */
        printf("host read a cpu-opaque buffer: %g\n", (double)x);
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS));
    mal_kern_free(O, d);
}

static void test_opaque(void)
{
    mal_kern O = NULL;
    mal_kern_config c = mal_kern_config_default();
    c.threads = 1;
    CHECK_OK(mal_kern_create("cpu-opaque", &c, &O));
    CHECK(O->host_addressable == 0 && !strcmp(O->name, "cpu-opaque"));
    opaque_same(O);
    opaque_faults(O);
    mal_kern_destroy(O);
    printf("%-14s %-34s ok\n", "cpu-opaque", "same bits as cpu; host access faults");
}

int main(void)
{
    mal_kern_config kc = mal_kern_config_default();
    kc.threads = 1;
    CHECK_OK(mal_kern_create("cpu", &kc, &K));
    CHECK(strcmp(K->name, "cpu") == 0);
    test_registry();
    test_memory();
    test_memcpy2d();
    test_events();
    test_matmul(10, 6, 7);
    test_matmul(5, 37, 19);
    test_rmsnorm(10, 6);
    test_rmsnorm(4, 37);
    test_rope();
    test_attention(2, 5, mal_attn_mha(3), 4);
    test_attention(1, 70, mal_attn_mha(2), 6); /* more rows than one attention block */
    /* grouped-query attention: 3 query heads per key/value head; a TP
     * rank's share where the group size divides n_kv_heads; one holding
     * 2 query heads of a key/value head's 4 (q_off 2: replicated); one
     * whose 3 query heads straddle two key/value heads (q_off 1) */
    test_attention(2, 5, (mal_attn_heads){6, 2, 3, 0}, 4);
    test_attention(1, 70, (mal_attn_heads){4, 1, 4, 0}, 6);
    test_attention(2, 7, (mal_attn_heads){2, 1, 4, 2}, 4);
    test_attention(2, 6, (mal_attn_heads){3, 2, 2, 1}, 4);
    test_swiglu(53);
    test_elementwise(53);
    test_embedding(10, 6, 11, 0, 11);
    test_embedding(7, 37, 5, 0, 5);
    test_embedding(12, 6, 11, 4, 4); /* a vocabulary-parallel shard */
    test_xent(10, 11, 0.0f);
    test_xent(6, 37, 0.0f);
    test_xent(3, 37, 1000.0f); /* stability: large logits */
    test_xent_vp(6, 37, 1);
    test_xent_vp(6, 37, 3);  /* uneven shards: 12, 12, 13 */
    test_xent_vp(5, 259, 8); /* tiny-llama3's vocabulary over TP 8 */
    test_adamw(53);
    test_opaque();
    mal_kern_destroy(K);
    if (n_failed) {
        printf("%d check(s) FAILED\n", n_failed);
        return 1;
    }
    printf("all kernel checks passed\n");
    return 0;
}
