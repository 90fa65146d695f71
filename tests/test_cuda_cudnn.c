/* cuDNN's fused attention (kernels/cuda/cudnn.h) against the hand-written
 * kernels of attention.cu and against float64, on the GPU, at four shapes:
 * small multi-head, grouped-query (group 4, hd 128), the 124m preset's
 * (T 1024, hd 64) and the 1b preset's (T 2048, hd 128; B 1 to keep it
 * short).  Exit 77 without a GPU, and where cuDNN cannot be loaded
 * (mal_cudnn_open's reason printed): bench/gpu/run.sh counts a skip on the
 * GPU machine as a failure, so a run there cannot pass without cuDNN.
 *
 * Per shape, bf16 q, k, v, dout drawn N(0, 1) on the host (seed printed;
 * MAL_TEST_SEED repeats it), the same bits to both implementations:
 *  - mal_cudnn_attention_ok must accept the shape (these are the presets');
 *  - cuDNN's outputs are poisoned (0xFF bytes: NaN) before every call, so an
 *    element it leaves unwritten fails; the hand backward accumulates, so
 *    its gradients start from zero;
 *  - cuDNN against the hand kernels: out and dq/dk/dv norm-wise relative
 *    error <= 1e-2 / 2e-2, lse max |a - b| <= 1e-2, no NaN; the backward
 *    also fed the hand forward's out and lse (the header's promise that the
 *    two lse are the same quantity);
 *  - both against float64 on sampled query rows (t = 0 and T - 1 among
 *    them): out, lse and dq of the row;
 *  - determinism: cuDNN's forward and backward twice, the same bits.
 * Then both are timed (3 warm-ups and 10 calls back to back, CUDA events
 * between them, the median; the hand backward's zeroing of its gradients
 * not counted) and one table printed: ms and TFLOP/s (causal: forward
 * 2 B H T^2 hd, backward 2.5x that) with the errors.  Also: shapes the
 * header says cuDNN refuses (hd 100, a head offset) are refused with a
 * reason.  Expected under ~30 s on an H100 (mostly cuDNN building plans).
 * The float64 row reference (ref_row) was checked against PyTorch's
 * float64 attention and autograd (GQA included): within 1e-15. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda/cudnn.h"
#include "mal_test.h"
#include "mal_test_rand.h"

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
/* a launcher returns nothing: its launch error is the last error */
#define LAUNCHED() CU(cudaGetLastError())

enum { WARM = 3, REPS = 10, NSAMPLE = 4 };

static int failures;
static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p);
    return p;
}
static void *dmalloc(size_t n)
{
    void *p = NULL;
    CU(cudaMalloc(&p, n));
    return p;
}
static void *fetch(const void *d, size_t n)
{
    void *h = xmalloc(n);
    CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    return h;
}

/* the values being compared, as doubles: bf16 (n elements) or float */
typedef struct {
    double *x;
    size_t n;
    size_t nan; /* elements that are NaN or infinite */
} vals;
static vals from_bf(const void *d, size_t n)
{
    uint16_t *h = fetch(d, n * 2);
    vals v = {xmalloc(n * sizeof(double)), n, 0};
    for (size_t i = 0; i < n; i++) {
        v.x[i] = (double)bf2f(h[i]);
        if (!isfinite(v.x[i])) v.nan++;
    }
    free(h);
    return v;
}
static vals from_f(const float *d, size_t n)
{
    float *h = fetch(d, n * 4);
    vals v = {xmalloc(n * sizeof(double)), n, 0};
    for (size_t i = 0; i < n; i++) {
        v.x[i] = h[i];
        if (!isfinite(v.x[i])) v.nan++;
    }
    free(h);
    return v;
}
/* ||a - b|| / ||b||; infinite when either has a NaN */
static double rel(vals a, vals b)
{
    if (a.nan || b.nan) return INFINITY;
    double num = 0, den = 0;
    for (size_t i = 0; i < a.n; i++) {
        num += (a.x[i] - b.x[i]) * (a.x[i] - b.x[i]);
        den += b.x[i] * b.x[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}
static double maxabs(vals a, vals b)
{
    if (a.nan || b.nan) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a.n; i++)
        m = fmax(m, fabs(a.x[i] - b.x[i]));
    return m;
}
static void verdict(const char *shape, const char *what, double err, double tol, size_t nan)
{
    int ok = err <= tol;
    if (!ok) failures++;
    printf("  %-44s %-10s %.3e (tol %.0e)%s %s\n", what, shape, err, tol,
           nan ? " NaN/unwritten elements" : "", ok ? "ok" : "FAIL");
}

typedef struct {
    int B, T, H, Hkv, hd;
} shape;

/* one row of the final table */
typedef struct {
    char shape[48];
    const char *impl;
    double fwd_ms, bwd_ms, flops;
    char errs[160];
} trow;
static trow table[16];
static int nrows;

static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The float64 reference of query row (b, h, t): out row, lse, dq row. */
static void ref_row(const double *q, const double *k, const double *v, const double *dout, shape s,
                    int b, int h, int t, double *out, double *lse, double *dq)
{
    const int hd = s.hd, kh = h / (s.H / s.Hkv);
    const size_t ld = (size_t)s.H * s.hd, ldk = (size_t)s.Hkv * s.hd;
    const double *qr = q + (size_t)b * s.T * ld + (size_t)t * ld + (size_t)h * hd;
    const double *dor = dout + (size_t)b * s.T * ld + (size_t)t * ld + (size_t)h * hd;
    const double *kb = k + (size_t)b * s.T * ldk + (size_t)kh * hd;
    const double *vb = v + (size_t)b * s.T * ldk + (size_t)kh * hd;
    const double sc = 1.0 / sqrt((double)hd);
    double *p = xmalloc((size_t)(t + 1) * sizeof *p), *dp = xmalloc((size_t)(t + 1) * sizeof *dp);
    double m = -1e300, sum = 0, D = 0;
    for (int j = 0; j <= t; j++) {
        double dot = 0, dd = 0;
        for (int d = 0; d < hd; d++) {
            dot += qr[d] * kb[(size_t)j * ldk + d];
            dd += dor[d] * vb[(size_t)j * ldk + d];
        }
        p[j] = dot * sc;
        dp[j] = dd;
        m = fmax(m, p[j]);
    }
    for (int j = 0; j <= t; j++)
        sum += exp(p[j] - m);
    *lse = m + log(sum);
    for (int d = 0; d < hd; d++)
        out[d] = dq[d] = 0;
    for (int j = 0; j <= t; j++) {
        p[j] = exp(p[j] - *lse);
        D += p[j] * dp[j];
        for (int d = 0; d < hd; d++)
            out[d] += p[j] * vb[(size_t)j * ldk + d];
    }
    for (int j = 0; j <= t; j++)
        for (int d = 0; d < hd; d++)
            dq[d] += sc * p[j] * (dp[j] - D) * kb[(size_t)j * ldk + d];
    free(p);
    free(dp);
}

/* The sampled rows of out / lse / dq of one implementation against the
 * reference; the rows' values gathered into `got` (3 vals). */
static void sample_errors(shape s, const int (*rows)[3], const double *q, const double *k,
                          const double *v, const double *dout, vals out, vals lse, vals dq,
                          double err[3], size_t nan[3])
{
    const int hd = s.hd;
    vals ro = {xmalloc(NSAMPLE * hd * sizeof(double)), (size_t)NSAMPLE * hd, 0};
    vals rl = {xmalloc(NSAMPLE * sizeof(double)), NSAMPLE, 0};
    vals rq = {xmalloc(NSAMPLE * hd * sizeof(double)), (size_t)NSAMPLE * hd, 0};
    vals go = {xmalloc(NSAMPLE * hd * sizeof(double)), (size_t)NSAMPLE * hd, 0};
    vals gl = {xmalloc(NSAMPLE * sizeof(double)), NSAMPLE, 0};
    vals gq = {xmalloc(NSAMPLE * hd * sizeof(double)), (size_t)NSAMPLE * hd, 0};
    for (int r = 0; r < NSAMPLE; r++) {
        int b = rows[r][0], h = rows[r][1], t = rows[r][2];
        ref_row(q, k, v, dout, s, b, h, t, ro.x + r * hd, rl.x + r, rq.x + r * hd);
        size_t at = ((size_t)b * s.T + t) * s.H * hd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) {
            go.x[r * hd + d] = out.x[at + d];
            gq.x[r * hd + d] = dq.x[at + d];
            go.nan += !isfinite(go.x[r * hd + d]);
            gq.nan += !isfinite(gq.x[r * hd + d]);
        }
        gl.x[r] = lse.x[((size_t)b * s.H + h) * s.T + t];
        gl.nan += !isfinite(gl.x[r]);
    }
    err[0] = rel(go, ro), err[1] = maxabs(gl, rl), err[2] = rel(gq, rq);
    nan[0] = go.nan, nan[1] = gl.nan, nan[2] = gq.nan;
    free(ro.x), free(rl.x), free(rq.x), free(go.x), free(gl.x), free(gq.x);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_shape(mal_cudnn *c, cudaStream_t st, shape s)
{
    const int B = s.B, T = s.T, H = s.H, Hkv = s.Hkv, hd = s.hd;
    const mal_cu_heads hs = {H, Hkv, H / Hkv, 0};
    const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * Hkv * hd;
    const size_t nl = (size_t)B * H * T;
    char name[48], msg[512];
    snprintf(name, sizeof name, "B%d T%d H%d/%d hd%d", B, T, H, Hkv, hd);
    printf("== %s\n", name);

    msg[0] = 0;
    double t0 = now_s();
    if (!mal_cudnn_attention_ok(c, B, T, hs, hd, msg, sizeof msg)) {
        printf("  FAIL: cuDNN refuses this shape: %s\n", msg);
        failures++;
        return;
    }
    printf("  accepted, plans built in %.2f s\n", now_s() - t0);

    /* inputs: bf16 bits for the GPU, the same values as doubles for float64 */
    uint16_t *hb[4];
    double *hx[4];
    const size_t nin[4] = {nq, nk, nk, nq}; /* q, k, v, dout */
    void *din[4];
    for (int i = 0; i < 4; i++) {
        hb[i] = xmalloc(nin[i] * 2);
        hx[i] = xmalloc(nin[i] * sizeof(double));
        for (size_t j = 0; j < nin[i]; j++) {
            hb[i][j] = f2bf(nrand());
            hx[i][j] = (double)bf2f(hb[i][j]);
        }
        din[i] = dmalloc(nin[i] * 2);
        CU(cudaMemcpy(din[i], hb[i], nin[i] * 2, cudaMemcpyHostToDevice));
    }
    void *q = din[0], *k = din[1], *v = din[2], *dout = din[3];

    /* hand: out, lse, dq, dk, dv, scratch; cuDNN: the same twice (the
     * second set for the determinism and cross-fed runs), dsum */
    void *ho = dmalloc(nq * 2), *hdq = dmalloc(nq * 2), *hdk = dmalloc(nk * 2),
         *hdv = dmalloc(nk * 2);
    float *hl = dmalloc(nl * 4);
    void *scr = dmalloc(mal_cu_attention_bwd_scratch_bytes(B, T, H));
    void *co[2], *cdq[2], *cdk[2], *cdv[2];
    float *cl[2];
    for (int i = 0; i < 2; i++) {
        co[i] = dmalloc(nq * 2), cdq[i] = dmalloc(nq * 2), cdk[i] = dmalloc(nk * 2);
        cdv[i] = dmalloc(nk * 2), cl[i] = dmalloc(nl * 4);
    }
    float *dsum = dmalloc(nl * 4);

#define CUDNN(call)                                                                                \
    do {                                                                                           \
        msg[0] = 0;                                                                                \
        if ((call) != 0) {                                                                         \
            printf("  FAIL: %s: %s\n", #call, msg);                                                \
            failures++;                                                                            \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
#define POISON(p, bytes) CU(cudaMemsetAsync((p), 0xFF, (bytes), st))

    /* the hand kernels: forward, then the backward into zeroed gradients */
    mal_cu_attention_fwd(st, 1, 0, ho, hl, q, k, v, B, T, hs, hd);
    LAUNCHED();
    CU(cudaMemsetAsync(hdq, 0, nq * 2, st));
    CU(cudaMemsetAsync(hdk, 0, nk * 2, st));
    CU(cudaMemsetAsync(hdv, 0, nk * 2, st));
    mal_cu_attention_bwd(st, 1, 0, hdq, hdk, hdv, dout, ho, q, k, v, hl, B, T, hs, hd, scr);
    LAUNCHED();

    /* cuDNN's forward twice, then its backward twice (both from the first
     * forward), every output poisoned first */
    for (int i = 0; i < 2; i++) {
        POISON(co[i], nq * 2);
        POISON(cl[i], nl * 4);
        CUDNN(mal_cudnn_attention_fwd(c, co[i], cl[i], q, k, v, B, T, hs, hd, msg, sizeof msg));
    }
    for (int i = 0; i < 2; i++) {
        POISON(cdq[i], nq * 2);
        POISON(cdk[i], nk * 2);
        POISON(cdv[i], nk * 2);
        POISON(dsum, nl * 4);
        CUDNN(mal_cudnn_attention_bwd(c, cdq[i], cdk[i], cdv[i], dout, co[0], q, k, v, cl[0], dsum,
                                      B, T, hs, hd, msg, sizeof msg));
    }
    CU(cudaStreamSynchronize(st));

    /* determinism: the same bits from the same inputs */
    {
        const void *a[5] = {co[0], cl[0], cdq[0], cdk[0], cdv[0]};
        const void *b[5] = {co[1], cl[1], cdq[1], cdk[1], cdv[1]};
        const size_t by[5] = {nq * 2, nl * 4, nq * 2, nk * 2, nk * 2};
        const char *nm[5] = {"out", "lse", "dq", "dk", "dv"};
        for (int i = 0; i < 5; i++) {
            void *x = fetch(a[i], by[i]), *y = fetch(b[i], by[i]);
            int same = !memcmp(x, y, by[i]);
            printf("  cudnn %s twice: %s\n", nm[i], same ? "identical" : "DIFFERENT: FAIL");
            if (!same) failures++;
            free(x), free(y);
        }
    }

    /* cuDNN against the hand kernels */
    vals Ho = from_bf(ho, nq), Hl = from_f(hl, nl), Hq = from_bf(hdq, nq);
    vals Hk = from_bf(hdk, nk), Hv = from_bf(hdv, nk);
    vals Co = from_bf(co[0], nq), Cl = from_f(cl[0], nl), Cq = from_bf(cdq[0], nq);
    vals Ck = from_bf(cdk[0], nk), Cv = from_bf(cdv[0], nk);
    double e_o = rel(Co, Ho), e_l = maxabs(Cl, Hl), e_q = rel(Cq, Hq), e_k = rel(Ck, Hk),
           e_v = rel(Cv, Hv);
    verdict(name, "cudnn vs hand: out (rel)", e_o, 1e-2, Co.nan + Ho.nan);
    verdict(name, "cudnn vs hand: lse (max abs)", e_l, 1e-2, Cl.nan + Hl.nan);
    verdict(name, "cudnn vs hand: dq (rel)", e_q, 2e-2, Cq.nan + Hq.nan);
    verdict(name, "cudnn vs hand: dk (rel)", e_k, 2e-2, Ck.nan + Hk.nan);
    verdict(name, "cudnn vs hand: dv (rel)", e_v, 2e-2, Cv.nan + Hv.nan);

    /* cuDNN's backward from the hand forward's out and lse */
    POISON(cdq[1], nq * 2);
    POISON(cdk[1], nk * 2);
    POISON(cdv[1], nk * 2);
    CUDNN(mal_cudnn_attention_bwd(c, cdq[1], cdk[1], cdv[1], dout, ho, q, k, v, hl, dsum, B, T, hs,
                                  hd, msg, sizeof msg));
    CU(cudaStreamSynchronize(st));
    {
        vals Xq = from_bf(cdq[1], nq), Xk = from_bf(cdk[1], nk), Xv = from_bf(cdv[1], nk);
        verdict(name, "cudnn bwd from hand fwd vs hand: dq", rel(Xq, Hq), 2e-2, Xq.nan);
        verdict(name, "cudnn bwd from hand fwd vs hand: dk", rel(Xk, Hk), 2e-2, Xk.nan);
        verdict(name, "cudnn bwd from hand fwd vs hand: dv", rel(Xv, Hv), 2e-2, Xv.nan);
        free(Xq.x), free(Xk.x), free(Xv.x);
    }

    /* both against float64 on sampled rows: the first and last positions,
     * a middle one, a random one */
    int rows[NSAMPLE][3] = {{0, 0, 0},
                            {B - 1, H - 1, T - 1},
                            {(int)(urand() * B), (int)(urand() * H), T / 2},
                            {(int)(urand() * B), (int)(urand() * H), (int)(urand() * T)}};
    double eh[3], ec[3];
    size_t nh[3], ncn[3];
    sample_errors(s, (const int(*)[3])rows, hx[0], hx[1], hx[2], hx[3], Ho, Hl, Hq, eh, nh);
    sample_errors(s, (const int(*)[3])rows, hx[0], hx[1], hx[2], hx[3], Co, Cl, Cq, ec, ncn);
    verdict(name, "hand vs float64 rows: out (rel)", eh[0], 1e-2, nh[0]);
    verdict(name, "hand vs float64 rows: lse (max abs)", eh[1], 1e-2, nh[1]);
    verdict(name, "hand vs float64 rows: dq (rel)", eh[2], 2e-2, nh[2]);
    verdict(name, "cudnn vs float64 rows: out (rel)", ec[0], 1e-2, ncn[0]);
    verdict(name, "cudnn vs float64 rows: lse (max abs)", ec[1], 1e-2, ncn[1]);
    verdict(name, "cudnn vs float64 rows: dq (rel)", ec[2], 2e-2, ncn[2]);
    free(Ho.x), free(Hl.x), free(Hq.x), free(Hk.x), free(Hv.x);
    free(Co.x), free(Cl.x), free(Cq.x), free(Ck.x), free(Cv.x);

    /* timing: WARM + REPS calls back to back with an event between each
     * two, so that the host's time to queue a call hides behind the call
     * before it (as in training); the median of the last REPS intervals */
    {
        cudaEvent_t ev[WARM + REPS + 1];
        for (int r = 0; r <= WARM + REPS; r++)
            CU(cudaEventCreate(&ev[r]));
        double ms[4][REPS];
        for (int w = 0; w < 4; w++) {
            CU(cudaEventRecord(ev[0], st));
            for (int r = 0; r < WARM + REPS; r++) {
                switch (w) {
                case 0:
                    mal_cu_attention_fwd(st, 1, 0, ho, hl, q, k, v, B, T, hs, hd);
                    LAUNCHED();
                    break;
                case 1: /* accumulates into the gradients: their values do not matter here */
                    mal_cu_attention_bwd(st, 1, 0, hdq, hdk, hdv, dout, ho, q, k, v, hl, B, T, hs,
                                         hd, scr);
                    LAUNCHED();
                    break;
                case 2:
                    CUDNN(mal_cudnn_attention_fwd(c, co[0], cl[0], q, k, v, B, T, hs, hd, msg,
                                                  sizeof msg));
                    break;
                default:
                    CUDNN(mal_cudnn_attention_bwd(c, cdq[0], cdk[0], cdv[0], dout, co[0], q, k, v,
                                                  cl[0], dsum, B, T, hs, hd, msg, sizeof msg));
                }
                CU(cudaEventRecord(ev[r + 1], st));
            }
            CU(cudaEventSynchronize(ev[WARM + REPS]));
            for (int r = WARM; r < WARM + REPS; r++) {
                float t = 0;
                CU(cudaEventElapsedTime(&t, ev[r], ev[r + 1]));
                ms[w][r - WARM] = t;
            }
        }
        for (int r = 0; r <= WARM + REPS; r++)
            CU(cudaEventDestroy(ev[r]));
        const double fwd_flops = 2.0 * 2.0 * B * H * (double)T * T * hd / 2;
        trow *h = &table[nrows++], *cd = &table[nrows++];
        snprintf(h->shape, sizeof h->shape, "%s", name);
        snprintf(cd->shape, sizeof cd->shape, "%s", name);
        h->impl = "hand", cd->impl = "cudnn";
        h->fwd_ms = median(ms[0], REPS), h->bwd_ms = median(ms[1], REPS);
        cd->fwd_ms = median(ms[2], REPS), cd->bwd_ms = median(ms[3], REPS);
        h->flops = cd->flops = fwd_flops;
        snprintf(h->errs, sizeof h->errs, "vs f64 rows: out %.1e lse %.1e dq %.1e", eh[0], eh[1],
                 eh[2]);
        snprintf(cd->errs, sizeof cd->errs,
                 "vs f64 rows: out %.1e lse %.1e dq %.1e; vs hand: out %.1e lse %.1e dq %.1e "
                 "dk %.1e dv %.1e",
                 ec[0], ec[1], ec[2], e_o, e_l, e_q, e_k, e_v);
    }

done:
    CU(cudaStreamSynchronize(st));
    for (int i = 0; i < 4; i++) {
        free(hb[i]), free(hx[i]);
        CU(cudaFree(din[i]));
    }
    void *dev[] = {ho,     hdq,    hdk,    hdv,    hl,     scr,    dsum,  co[0], co[1],
                   cdq[0], cdq[1], cdk[0], cdk[1], cdv[0], cdv[1], cl[0], cl[1]};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        CU(cudaFree(dev[i]));
#undef CUDNN
#undef POISON
}

/* Shapes cuDNN must refuse (the header's contract): a head dimension not a
 * multiple of 8, and a head layout with an offset. */
static void test_refusals(mal_cudnn *c)
{
    char msg[512];
    const struct {
        const char *what;
        int T, hd;
        mal_cu_heads hs;
    } no[] = {{"hd 100", 128, 100, {4, 4, 1, 0}}, {"q_off 1", 128, 64, {2, 2, 2, 1}}};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        msg[0] = 0;
        int ok = mal_cudnn_attention_ok(c, 1, no[i].T, no[i].hs, no[i].hd, msg, sizeof msg);
        int good = !ok && msg[0];
        printf("  refuses %s: %s (%s)\n", no[i].what, good ? "ok" : "FAIL", ok ? "accepted" : msg);
        if (!good) failures++;
    }
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("test_cuda_cudnn: skipped: no GPU (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return MAL_TEST_SKIP;
    }
    cudaStream_t st;
    CU(cudaStreamCreate(&st));
    mal_cudnn *c = NULL;
    char msg[512] = "";
    if (mal_cudnn_open(&c, st, msg, sizeof msg) != 0) {
        printf("test_cuda_cudnn: skipped: cuDNN cannot be used: %s\n", msg);
        CU(cudaStreamDestroy(st));
        return MAL_TEST_SKIP;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    long ver = mal_cudnn_version(c);
    printf("test_cuda_cudnn: %s, cuDNN %ld.%ld.%ld (%ld)\n", prop.name, ver / 10000,
           ver / 100 % 100, ver % 100, ver);
    const char *env = getenv("MAL_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    rng = seed * 2654435761u + 7;
    printf("test_cuda_cudnn: seed %llu (MAL_TEST_SEED repeats it)\n", (unsigned long long)seed);

    test_refusals(c);
    const shape shapes[] = {{2, 128, 4, 4, 64},
                            {2, 256, 8, 2, 128},     /* grouped-query, group 4 */
                            {2, 1024, 12, 12, 64},   /* the 124m preset's */
                            {1, 2048, 16, 16, 128}}; /* the 1b preset's, B 1 */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_shape(c, st, shapes[i]);

    printf("\n%-22s %-6s %9s %9s %10s %10s  %s\n", "shape", "impl", "fwd ms", "bwd ms", "fwd TF/s",
           "bwd TF/s", "errors");
    for (int i = 0; i < nrows; i++) {
        const trow *r = &table[i];
        printf("%-22s %-6s %9.3f %9.3f %10.1f %10.1f  %s\n", r->shape, r->impl, r->fwd_ms,
               r->bwd_ms, r->flops / (r->fwd_ms * 1e9), 2.5 * r->flops / (r->bwd_ms * 1e9),
               r->errs);
    }
    printf("(median of %d calls back to back after %d warm-ups; causal FLOPs: fwd 2 B H T^2 hd, "
           "bwd 2.5x; the hand "
           "backward's zeroing of its gradients not timed)\n",
           REPS, WARM);
    mal_cudnn_close(c);
    CU(cudaStreamDestroy(st));
    printf("test_cuda_cudnn: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
