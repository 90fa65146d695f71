/* Per-kernel harness of the CUDA backend, in the manner of llm.c's dev/cuda/:
 * every kernel family of kernels/cuda/ (through its launcher in cuda_ops.h)
 * and the matrix products (through the cuda kernel table, cuBLASLt) at the
 * two benchmark shapes, bf16, each
 *  - checked against a float64 reference computed here on sampled rows
 *    (tests/test_cuda_kernels checks every element at small shapes; here
 *    the shapes are the real ones, so the reference takes samples: rows of
 *    row-wise kernels, elements of element-wise ones, one head of
 *    attention -- its whole backward for dK/dV);
 *  - timed with CUDA events (the mean of enough runs to fill ~50 ms, after
 *    two warm-up runs);
 *  - set against its floor: max(FLOPs / the measured GEMM rate, bytes / the
 *    measured memory bandwidth), both ceilings measured first in the same
 *    run (a 8192^3 bf16 product through the table; a 1 GiB device-to-device
 *    copy, bytes read plus written).  FLOPs count matrix products only (2
 *    per multiply-add; attention's causal half, its backward as 5 products
 *    of T x T x hd: S recomputed once, as a flash backward must); bytes
 *    count each input read once and each output written once (accumulated
 *    outputs read and written; scratch not counted).
 * One line per kernel and shape: time, floor, the floor as a share of the
 * time ("% floor": 100 means at the floor), achieved GB/s and TFLOP/s, the
 * reference's relative error (norm-wise over the samples) and its
 * tolerance.
 *
 *   kernel_bench [--shape 124m|1b]... [--attention] [--tsv FILE]
 *
 * Where cuDNN loads (kernels/cuda/cudnn.h), rows "(cudnn)" time its fused
 * attention on the same inputs, against the same reference.
 *
 * --attention: the attention rows only.  kernel_bench_prev (built by
 * bench/gpu/run.sh's attcmp stage) adds rows "(previous)" for the
 * attention kernels of an earlier version, timed on the same inputs.
 *
 * Inputs are a hash of (seed, index) made on the device, so the host
 * regenerates exactly the values it needs for a sample without copying
 * buffers back.  Exit 0 when every sample is within tolerance, 1 when one
 * is not, 77 without a GPU (or where the cuda backend cannot start). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "base/mal.h"
#include "kernels/kernels.h"
}
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cudnn.h"

#ifdef MAL_ATTN_PREV
/* kernel_bench_prev (bench/gpu/local.mk): the attention kernels of an
 * earlier version (MAL_ATTN_PREV names its attention.cu, exported from
 * git by bench/gpu/fetch-debs.sh) compiled beside the current ones, in a
 * namespace of their own with their launchers renamed, so that one run
 * times both on the same buffers. */
#define mal_cu_attention_fwd mal_cu_attention_prev_fwd
#define mal_cu_attention_bwd mal_cu_attention_prev_bwd
#define mal_cu_attention_bwd_scratch_bytes mal_cu_attention_prev_bwd_scratch_bytes
namespace prev {
#include MAL_ATTN_PREV
}
#undef mal_cu_attention_fwd
#undef mal_cu_attention_bwd
#undef mal_cu_attention_bwd_scratch_bytes
#endif

typedef __nv_bfloat16 bf16;

struct shape {
    const char *name;
    int B, T, C, H, hd, F, V, L;
};
/* bench/presets.py's 124m and 1b at their benchmark batches */
static const shape SHAPES[] = {{"124m", 16, 1024, 768, 12, 64, 2048, 32000, 12},
                               {"1b", 8, 2048, 2048, 16, 128, 5632, 32000, 16}};

static int only_attention;   /* --attention */
static mal_kern K;           /* the cuda instance (bf16) */
static cudaStream_t S;       /* its stream: every launch and copy here */
static double GEMM_RATE, BW; /* measured: FLOP/s, bytes/s */
static int failures;
static FILE *tsv;
static mal_cudnn *CD; /* cuDNN's attention on S; NULL where it cannot load */

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- inputs: a hash of (seed, index), the same on host and device ------ */

__host__ __device__ static inline uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
/* Uniform in [-scale, scale): a 24-bit integer times a constant, one
 * rounding, the same float on host and device. */
__host__ __device__ static inline float val(uint32_t seed, size_t i, float scale)
{
    uint32_t h = mix(seed ^ mix((uint32_t)i) ^ mix((uint32_t)(i >> 32) + 0x9e3779b9U));
    return (float)((int)(h >> 8) - 8388608) * (scale / 8388608.0f);
}
__global__ void fill_kernel(void *p, size_t n, uint32_t seed, float scale, int bf)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = val(seed, i, scale);
        if (bf)
            ((bf16 *)p)[i] = __float2bfloat16_rn(x);
        else
            ((float *)p)[i] = x;
    }
}
__global__ void tokens_kernel(int *p, size_t n, uint32_t seed, int V)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (int)(mix(seed ^ mix((uint32_t)i)) % (uint32_t)V);
}
static int host_token(uint32_t seed, size_t i, int V)
{
    return (int)(mix(seed ^ mix((uint32_t)i)) % (uint32_t)V);
}

/* A device buffer of n elements (bf16 or fp32) filled from seed. */
struct dbuf {
    void *d = NULL;
    size_t n = 0;
    int bf = 0;
    uint32_t seed = 0;
    float scale = 0;
    /* the value the kernel saw at element i (bf16-rounded where bf16) */
    double at(size_t i) const
    {
        float x = val(seed, i, scale);
        return bf ? (double)__bfloat162float(__float2bfloat16_rn(x)) : (double)x;
    }
};
static dbuf make(size_t n, int bf, uint32_t seed, float scale)
{
    dbuf b;
    b.n = n, b.bf = bf, b.seed = seed, b.scale = scale;
    b.d = mal_kern_alloc(K, n * (bf ? 2 : 4) + 64);
    if (!b.d) {
        fprintf(stderr, "kernel_bench: no device memory for %zu elements\n", n);
        exit(1);
    }
    if (scale != 0) fill_kernel<<<1024, 256, 0, S>>>(b.d, n, seed, scale, bf);
    CU(cudaGetLastError());
    return b;
}
static void drop(dbuf &b)
{
    mal_kern_free(K, b.d);
    b.d = NULL;
}
/* Refill (a kernel that writes in place ran since). */
static void refill(const dbuf &b)
{
    fill_kernel<<<1024, 256, 0, S>>>(b.d, b.n, b.seed, b.scale, b.bf);
    CU(cudaGetLastError());
}
/* Elements [i, i + n) of b as doubles (waits for the stream). */
static std::vector<double> get(const dbuf &b, size_t i, size_t n)
{
    std::vector<double> out(n);
    if (b.bf) {
        std::vector<bf16> h(n);
        CU(cudaMemcpyAsync(h.data(), (bf16 *)b.d + i, n * 2, cudaMemcpyDeviceToHost, S));
        CU(cudaStreamSynchronize(S));
        for (size_t j = 0; j < n; j++)
            out[j] = (double)__bfloat162float(h[j]);
    } else {
        std::vector<float> h(n);
        CU(cudaMemcpyAsync(h.data(), (float *)b.d + i, n * 4, cudaMemcpyDeviceToHost, S));
        CU(cudaStreamSynchronize(S));
        for (size_t j = 0; j < n; j++)
            out[j] = (double)h[j];
    }
    return out;
}
static uint64_t pick_state = 88172645463325252ull;
static size_t pick(size_t n) /* a sample index in [0, n) */
{
    pick_state ^= pick_state << 13, pick_state ^= pick_state >> 7, pick_state ^= pick_state << 17;
    return (size_t)(pick_state % n);
}

/* ---- the check and the line of the table ------------------------------- */

/* Norm-wise relative error of got against want, accumulated per kernel. */
struct errs {
    double num = 0, den = 0;
    int nan = 0;
    void add(double got, double want)
    {
        if (!(got == got)) nan = 1;
        num += (got - want) * (got - want);
        den += want * want;
    }
    void add(const std::vector<double> &got, const std::vector<double> &want)
    {
        for (size_t i = 0; i < got.size(); i++)
            add(got[i], want[i]);
    }
    double rel() const { return nan ? NAN : sqrt(num / (den > 0 ? den : 1e-300)); }
};

/* Mean device time of f() in microseconds. */
template <typename Fn> static double time_us(Fn f)
{
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    f(), f();
    CU(cudaEventRecord(a, S));
    f();
    CU(cudaEventRecord(b, S));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    int reps = ms > 0 ? (int)std::min(200.0, std::max(3.0, 50.0 / ms)) : 50;
    CU(cudaEventRecord(a, S));
    for (int r = 0; r < reps; r++)
        f();
    CU(cudaEventRecord(b, S));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&ms, a, b));
    CU(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1e3 * ms / reps;
}

static void row(const char *kernel, const shape &s, double us, double flops, double bytes,
                const errs &e, double tol)
{
    double floor_us = 1e6 * std::max(flops / GEMM_RATE, bytes / BW);
    double rel = e.rel();
    int ok = rel <= tol;
    if (!ok) failures++;
    printf("%-26s %-5s %10.1f %10.1f %6.1f%% %8.0f %7.1f  %8.2e (%.0e)%s\n", kernel, s.name, us,
           floor_us, 100 * floor_us / us, bytes / us * 1e-3, flops / us * 1e-6, rel, tol,
           ok ? "" : "  <-- FAIL");
    fflush(stdout);
    if (tsv)
        fprintf(tsv, "%s\t%s\t%.3f\t%.3f\t%.4g\t%.4g\t%.3g\t%.0g\n", kernel, s.name, us, floor_us,
                bytes, flops, rel, tol);
}

/* ---- the ceilings -------------------------------------------------------- */

static void ceilings(void)
{
    size_t bytes = (size_t)1 << 30;
    void *a = mal_kern_alloc(K, bytes), *b = mal_kern_alloc(K, bytes);
    if (!a || !b) exit(1);
    double us = time_us([&] { CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, S)); });
    BW = 2.0 * bytes / (us * 1e-6);
    mal_kern_free(K, a), mal_kern_free(K, b);
    const int n = 8192;
    dbuf x = make((size_t)n * n, 1, 1, 1.0f), w = make((size_t)n * n, 1, 2, 1.0f),
         o = make((size_t)n * n, 1, 3, 0);
    us = time_us([&] { mal_kern_matmul_fwd(K, o.d, x.d, w.d, n, n, n, 0); });
    GEMM_RATE = 2.0 * n * (double)n * n / (us * 1e-6);
    drop(x), drop(w), drop(o);
    CU(cudaStreamSynchronize(S));
    int rc = mal_kern_sync(K);
    if (rc) {
        fprintf(stderr, "kernel_bench: the ceiling product failed: %s\n", mal_errmsg());
        exit(1);
    }
    printf("ceilings: device-to-device copy %.2f TB/s (bytes read + written), bf16 GEMM "
           "8192^3 through cuBLASLt %.0f TFLOP/s\n",
           BW * 1e-12, GEMM_RATE * 1e-12);
    if (tsv)
        fprintf(tsv, "ceiling\tcopy_TBps\t%.4f\nceiling\tgemm_TFLOPps\t%.2f\n", BW * 1e-12,
                GEMM_RATE * 1e-12);
}

/* ---- the kernels ---------------------------------------------------------- */

enum { SAMPLES = 24 };

static void bench_matmul(const shape &s, const char *name, int N, int C, int OC)
{
    dbuf inp = make((size_t)N * C, 1, 11, 1.0f), w = make((size_t)OC * C, 1, 12, 0.05f),
         out = make((size_t)N * OC, 1, 13, 0), dout = make((size_t)N * OC, 1, 14, 1.0f),
         dinp = make((size_t)N * C, 1, 15, 0.5f), dw = make((size_t)OC * C, 0, 16, 0.5f);
    mal_kern_matmul_fwd(K, out.d, inp.d, w.d, N, C, OC, 0);
    mal_kern_matmul_bwd(K, dinp.d, (float *)dw.d, dout.d, inp.d, w.d, N, C, OC);
    if (mal_kern_sync(K)) fprintf(stderr, "%s: %s\n", name, mal_errmsg()), exit(1);
    errs ef, ex, ew;
    for (int k = 0; k < SAMPLES; k++) {
        size_t n = pick(N), o = pick(OC), c = pick(C);
        double acc = 0;
        for (int j = 0; j < C; j++)
            acc += inp.at(n * C + j) * w.at(o * C + j);
        ef.add(get(out, n * OC + o, 1)[0], acc);
        acc = dinp.at(n * C + c);
        for (int j = 0; j < OC; j++)
            acc += dout.at(n * OC + j) * w.at((size_t)j * C + c);
        ex.add(get(dinp, n * C + c, 1)[0], acc);
        acc = dw.at(o * C + c);
        for (int j = 0; j < N; j++)
            acc += dout.at((size_t)j * OC + o) * inp.at((size_t)j * C + c);
        ew.add(get(dw, o * C + c, 1)[0], acc);
    }
    double fl = 2.0 * N * C * OC;
    char what[64];
    snprintf(what, sizeof what, "matmul %s fwd", name);
    row(what, s, time_us([&] { mal_kern_matmul_fwd(K, out.d, inp.d, w.d, N, C, OC, 0); }), fl,
        2.0 * ((double)N * C + (double)OC * C + (double)N * OC), ef, 1e-2);
    snprintf(what, sizeof what, "matmul %s dX", name);
    row(what, s,
        time_us([&] { mal_kern_matmul_bwd(K, dinp.d, NULL, dout.d, inp.d, w.d, N, C, OC); }), fl,
        2.0 * ((double)N * OC + (double)OC * C + 2.0 * N * C), ex, 1e-2);
    snprintf(what, sizeof what, "matmul %s dW", name);
    row(what, s,
        time_us([&] { mal_kern_matmul_bwd(K, NULL, (float *)dw.d, dout.d, inp.d, w.d, N, C, OC); }),
        fl, 2.0 * ((double)N * OC + (double)N * C) + 8.0 * OC * C, ew, 1e-3);
    drop(inp), drop(w), drop(out), drop(dout), drop(dinp), drop(dw);
}

static void bench_rmsnorm(const shape &s)
{
    const int N = s.B * s.T, C = s.C;
    const float eps = 1e-5f;
    dbuf x = make((size_t)N * C, 1, 21, 1.0f), w = make(C, 1, 22, 1.0f),
         out = make((size_t)N * C, 1, 23, 0), rstd = make(N, 0, 24, 0),
         dy = make((size_t)N * C, 1, 25, 1.0f), dx = make((size_t)N * C, 1, 26, 0.5f),
         dw = make(C, 0, 27, 0.5f);
    void *scr = mal_kern_alloc(K, mal_cu_rmsnorm_bwd_scratch_bytes(N, C));
    mal_cu_rmsnorm_fwd(S, 1, out.d, (float *)rstd.d, x.d, w.d, N, C, eps);
    mal_cu_rmsnorm_bwd(S, 1, dx.d, (float *)dw.d, dy.d, x.d, w.d, (const float *)rstd.d, N, C, scr);
    errs ef, eb, ew;
    std::vector<double> rdw(C);
    for (int c = 0; c < C; c++)
        rdw[c] = dw.at(c);
    std::vector<char> sampled(N, 0);
    for (int k = 0; k < SAMPLES; k++)
        sampled[pick(N)] = 1;
    /* dweight sums over every row: the reference walks them all */
    std::vector<double> xr(C), yr(C), wr(C);
    for (int c = 0; c < C; c++)
        wr[c] = w.at(c);
    for (int n = 0; n < N; n++) {
        double ss = 0, dot = 0;
        for (int c = 0; c < C; c++) {
            xr[c] = x.at((size_t)n * C + c), yr[c] = dy.at((size_t)n * C + c);
            ss += xr[c] * xr[c];
        }
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++)
            rdw[c] += yr[c] * xr[c] * r;
        if (!sampled[n]) continue;
        std::vector<double> o = get(out, (size_t)n * C, C), g = get(dx, (size_t)n * C, C);
        for (int c = 0; c < C; c++)
            dot += yr[c] * wr[c] * xr[c];
        for (int c = 0; c < C; c++) {
            ef.add(o[c], xr[c] * r * wr[c]);
            eb.add(g[c],
                   dx.at((size_t)n * C + c) + r * yr[c] * wr[c] - r * r * r * dot / C * xr[c]);
        }
    }
    ew.add(get(dw, 0, C), rdw);
    double act = 2.0 * N * C;
    row("rmsnorm fwd", s,
        time_us([&] { mal_cu_rmsnorm_fwd(S, 1, out.d, (float *)rstd.d, x.d, w.d, N, C, eps); }), 0,
        2 * act + 4.0 * N + 2.0 * C, ef, 1e-2);
    errs both = eb;
    both.num += ew.num, both.den += ew.den;
    row("rmsnorm bwd", s, time_us([&] {
            mal_cu_rmsnorm_bwd(S, 1, dx.d, (float *)dw.d, dy.d, x.d, w.d, (const float *)rstd.d, N,
                               C, scr);
        }),
        0, 4 * act + 4.0 * N + 2.0 * C + 8.0 * C, both, 1e-2);
    mal_kern_free(K, scr);
    drop(x), drop(w), drop(out), drop(rstd), drop(dy), drop(dx), drop(dw);
}

static void bench_rope(const shape &s)
{
    const int B = s.B, T = s.T, H = s.H, hd = s.hd, h2 = hd / 2;
    const float theta = 10000.0f;
    size_t n = (size_t)B * T * H * hd;
    dbuf x = make(n, 1, 31, 1.0f);
    /* the table as the backend builds it (cuda.c) */
    std::vector<float> cs((size_t)2 * T * h2);
    for (int i = 0; i < h2; i++) {
        double freq = pow((double)theta, -2.0 * i / hd);
        for (int t = 0; t < T; t++) {
            cs[(size_t)t * h2 + i] = (float)cos(t * freq);
            cs[(size_t)T * h2 + (size_t)t * h2 + i] = (float)sin(t * freq);
        }
    }
    float *dcs = (float *)mal_kern_alloc(K, cs.size() * 4);
    CU(cudaMemcpyAsync(dcs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice, S));
    mal_cu_rope(S, 1, x.d, dcs, B, T, H, hd, 1.0f);
    errs e;
    for (int k = 0; k < SAMPLES; k++) {
        size_t r = pick((size_t)B * T * H), base = r * hd; /* one (b, t, h) row */
        int t = (int)((r / H) % T);
        std::vector<double> got = get(x, base, hd);
        for (int i = 0; i < h2; i++) {
            double a = t * pow((double)theta, -2.0 * i / hd), x0 = x.at(base + 2 * i),
                   x1 = x.at(base + 2 * i + 1);
            e.add(got[2 * i], x0 * cos(a) - x1 * sin(a));
            e.add(got[2 * i + 1], x0 * sin(a) + x1 * cos(a));
        }
    }
    row("rope fwd (one of q, k)", s,
        time_us([&] { mal_cu_rope(S, 1, x.d, dcs, B, T, H, hd, 1.0f); }), 0,
        4.0 * n + 4.0 * cs.size(), e, 1e-2);
    mal_kern_free(K, dcs);
    drop(x);
}

static void bench_swiglu(const shape &s)
{
    size_t n = (size_t)s.B * s.T * s.F;
    dbuf g = make(n, 1, 41, 2.0f), u = make(n, 1, 42, 1.0f), out = make(n, 1, 43, 0),
         dy = make(n, 1, 44, 1.0f), dg = make(n, 1, 45, 0.5f), du = make(n, 1, 46, 0.5f);
    mal_cu_swiglu_fwd(S, 1, out.d, g.d, u.d, n);
    mal_cu_swiglu_bwd(S, 1, dg.d, du.d, dy.d, g.d, u.d, n);
    errs ef, eb;
    for (int k = 0; k < 64 * SAMPLES; k++) {
        size_t i = pick(n);
        double a = g.at(i), b = u.at(i), d = dy.at(i), sig = 1.0 / (1.0 + exp(-a));
        ef.add(get(out, i, 1)[0], a * b * sig);
        eb.add(get(dg, i, 1)[0], dg.at(i) + d * b * sig * (1.0 + a * (1.0 - sig)));
        eb.add(get(du, i, 1)[0], du.at(i) + d * a * sig);
    }
    row("swiglu fwd", s, time_us([&] { mal_cu_swiglu_fwd(S, 1, out.d, g.d, u.d, n); }), 0, 6.0 * n,
        ef, 1e-2);
    row("swiglu bwd", s, time_us([&] { mal_cu_swiglu_bwd(S, 1, dg.d, du.d, dy.d, g.d, u.d, n); }),
        0, 14.0 * n, eb, 1e-2);
    drop(g), drop(u), drop(out), drop(dy), drop(dg), drop(du);
}

/* add (activations), and the fp32 element-wise kernels over one layer's
 * parameters: accumulate, scale, sum of squares, the working-copy cast,
 * AdamW */
static void bench_elementwise(const shape &s)
{
    size_t na = (size_t)s.B * s.T * s.C;
    size_t np = 4 * (size_t)s.C * s.C + 3 * (size_t)s.C * s.F;
    {
        dbuf a = make(na, 1, 51, 1.0f), b = make(na, 1, 52, 1.0f), o = make(na, 1, 53, 0);
        mal_cu_add(S, 1, o.d, a.d, b.d, na);
        errs e;
        for (int k = 0; k < 64 * SAMPLES; k++) {
            size_t i = pick(na);
            e.add(get(o, i, 1)[0], a.at(i) + b.at(i));
        }
        row("add (residual)", s, time_us([&] { mal_cu_add(S, 1, o.d, a.d, b.d, na); }), 0, 6.0 * na,
            e, 1e-2);
        drop(a), drop(b), drop(o);
    }
    dbuf y = make(np, 0, 54, 1.0f), x = make(np, 0, 55, 1.0f);
    mal_cu_accumulate(S, (float *)y.d, (const float *)x.d, np);
    errs ea;
    for (int k = 0; k < 64 * SAMPLES; k++) {
        size_t i = pick(np);
        ea.add(get(y, i, 1)[0], y.at(i) + x.at(i));
    }
    row("accumulate (fp32)", s,
        time_us([&] { mal_cu_accumulate(S, (float *)y.d, (const float *)x.d, np); }), 0, 12.0 * np,
        ea, 1e-6);
    refill(y);
    mal_cu_scale(S, (float *)y.d, np, 0.75f);
    errs es;
    for (int k = 0; k < 64 * SAMPLES; k++) {
        size_t i = pick(np);
        es.add(get(y, i, 1)[0], y.at(i) * 0.75);
    }
    row("scale (fp32)", s, time_us([&] { mal_cu_scale(S, (float *)y.d, np, 1.0f); }), 0, 8.0 * np,
        es, 1e-6);
    /* sum of squares of x, in double, against every element */
    double *acc = (double *)mal_kern_alloc(K, sizeof(double));
    void *scr = mal_kern_alloc(K, mal_cu_sumsq_scratch_bytes());
    mal_cu_sumsq(S, acc, (const float *)x.d, 1, np, np, scr);
    double got = 0, want = 0;
    CU(cudaMemcpyAsync(&got, acc, sizeof got, cudaMemcpyDeviceToHost, S));
    CU(cudaStreamSynchronize(S));
    for (size_t i = 0; i < np; i++)
        want += x.at(i) * x.at(i);
    errs eq;
    eq.add(got, want);
    row("sumsq (grad norm)", s,
        time_us([&] { mal_cu_sumsq(S, acc, (const float *)x.d, 1, np, np, scr); }), 0, 4.0 * np, eq,
        1e-8);
    /* cast, then AdamW writing the working copy */
    dbuf w = make(np, 1, 56, 0);
    mal_cu_cast(S, 1, w.d, (const float *)x.d, np);
    errs ec;
    for (int k = 0; k < 64 * SAMPLES; k++) {
        size_t i = pick(np);
        ec.add(get(w, i, 1)[0], (double)__bfloat162float(__float2bfloat16_rn((float)x.at(i))));
    }
    row("cast to working copy", s, time_us([&] { mal_cu_cast(S, 1, w.d, (const float *)x.d, np); }),
        0, 6.0 * np, ec, 0);
    dbuf p = make(np, 0, 57, 1.0f), g = make(np, 0, 58, 1.0f), m = make(np, 0, 59, 0.1f),
         v = make(np, 0, 60, 0); /* v starts at 0 (zero-filled) */
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    const float ibc1 = (float)(1.0 / (1.0 - pow(0.9, 1))),
                ibc2 = (float)(1.0 / (1.0 - pow(0.95, 1)));
    auto adamw = [&] {
        mal_cu_adamw(S, 1, (float *)p.d, w.d, (const float *)g.d, (float *)m.d, (float *)v.d, np,
                     lr, b1, b2, eps, wd, gs, ibc1, ibc2);
    };
    adamw();
    errs ew;
    for (int k = 0; k < 64 * SAMPLES; k++) {
        size_t i = pick(np);
        double gi = g.at(i) * gs, mi = b1 * m.at(i) + (1 - (double)b1) * gi,
               vi = (1 - (double)b2) * gi * gi;
        ew.add(get(p, i, 1)[0],
               p.at(i) - lr * (mi * ibc1 / (sqrt(vi * ibc2) + eps) + wd * p.at(i)));
        ew.add(get(m, i, 1)[0], mi);
    }
    row("adamw + working copy", s, time_us(adamw), 0, 30.0 * np, ew, 1e-5);
    mal_kern_free(K, acc), mal_kern_free(K, scr);
    drop(y), drop(x), drop(w), drop(p), drop(g), drop(m), drop(v);
}

/* The optimizer and the gradient norm over the model's whole tensor list
 * (the preset's tensors at 16-float offsets of one slab, as src/model.c
 * lays them out): one kernel per tensor, as the step ran them first,
 * against the multi-tensor kernels that replace them; the same bits
 * (sampled for AdamW: every element of the two results is computed by
 * the same expressions, so the samples compare with tolerance 0). */
static void bench_optimizer(const shape &s)
{
    std::vector<mal_cu_span> sp;
    size_t off = 0;
    auto add = [&](size_t n, float wd) {
        sp.push_back({off, n, wd});
        off = (off + n + 15) & ~(size_t)15;
    };
    const size_t C = s.C, F = s.F, V = s.V;
    add(V * C, 0.1f); /* token embedding */
    for (int l = 0; l < s.L; l++) {
        add(C, 0.0f);
        for (int j = 0; j < 4; j++) add(C * C, 0.1f); /* wq wk wv wo */
        add(C, 0.0f);
        for (int j = 0; j < 3; j++) add(C * F, 0.1f); /* w1 w2 w3 */
    }
    add(C, 0.0f);     /* final norm */
    add(V * C, 0.1f); /* lm head */
    const size_t np = off;
    std::vector<mal_cu_run> runs;
    for (const mal_cu_span &x : sp) runs.push_back({nullptr, 1, x.n, x.n});
    dbuf g = make(np, 0, 61, 1.0f);
    for (size_t j = 0; j < runs.size(); j++) runs[j].x = (const float *)g.d + sp[j].off;
    double *acc = (double *)mal_kern_alloc(K, 2 * sizeof(double));
    void *scr = mal_kern_alloc(K, mal_cu_sumsq_multi_scratch_bytes());
    auto per_tensor = [&] {
        for (const mal_cu_run &r : runs) mal_cu_sumsq(S, acc, r.x, 1, r.width, r.width, scr);
    };
    auto multi = [&] { mal_cu_sumsq_multi(S, acc + 1, runs.data(), (int)runs.size(), scr); };
    CU(cudaMemsetAsync(acc, 0, 2 * sizeof(double), S));
    per_tensor();
    multi();
    double got[2];
    CU(cudaMemcpyAsync(got, acc, sizeof got, cudaMemcpyDeviceToHost, S));
    CU(cudaStreamSynchronize(S));
    errs eq;
    eq.add(got[1], got[0]);
    char name[64];
    snprintf(name, sizeof name, "sumsq x%zu tensors", runs.size());
    row(name, s, time_us(per_tensor), 0, 4.0 * np, eq, 0);
    row("sumsq multi-tensor", s, time_us(multi), 0, 4.0 * np, eq, 0);
    mal_kern_free(K, acc), mal_kern_free(K, scr);
    /* AdamW: two copies of the state, one stepped per tensor, one by the
     * multi-tensor kernel, then the timing (on the first copy) */
    dbuf p1 = make(np, 0, 62, 1.0f), m1 = make(np, 0, 63, 0.1f), v1 = make(np, 0, 64, 0),
         w1 = make(np, 1, 65, 0);
    dbuf p2 = make(np, 0, 62, 1.0f), m2 = make(np, 0, 63, 0.1f), v2 = make(np, 0, 64, 0),
         w2 = make(np, 1, 65, 0);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.5f;
    const float ibc1 = (float)(1.0 / (1.0 - pow(0.9, 1))),
                ibc2 = (float)(1.0 / (1.0 - pow(0.95, 1)));
    auto adamw_each = [&] {
        for (const mal_cu_span &x : sp)
            mal_cu_adamw(S, 1, (float *)p1.d + x.off, (bf16 *)w1.d + x.off,
                         (const float *)g.d + x.off, (float *)m1.d + x.off, (float *)v1.d + x.off,
                         x.n, lr, b1, b2, eps, x.weight_decay, gs, ibc1, ibc2);
    };
    auto adamw_multi = [&] {
        mal_cu_adamw_multi(S, 1, (float *)p2.d, w2.d, (const float *)g.d, (float *)m2.d,
                           (float *)v2.d, sp.data(), (int)sp.size(), lr, b1, b2, eps, gs, ibc1,
                           ibc2);
    };
    adamw_each();
    adamw_multi();
    errs ea;
    for (int k = 0; k < 64 * SAMPLES; k++) {
        size_t i = pick(np);
        ea.add(get(p2, i, 1)[0], get(p1, i, 1)[0]);
        ea.add(get(m2, i, 1)[0], get(m1, i, 1)[0]);
        ea.add(get(w2, i, 1)[0], get(w1, i, 1)[0]);
    }
    snprintf(name, sizeof name, "adamw x%zu tensors", sp.size());
    row(name, s, time_us(adamw_each), 0, 30.0 * np, ea, 0);
    row("adamw multi-tensor", s, time_us(adamw_multi), 0, 30.0 * np, ea, 0);
    drop(g), drop(p1), drop(m1), drop(v1), drop(w1), drop(p2), drop(m2), drop(v2), drop(w2);
}

/* The MLP block's zeroing in the backward (d_s, d_g, d_u, d_h, bf16): a
 * memset each, as the step did first, against one multi-buffer launch. */
static void bench_zero(const shape &s)
{
    const size_t NF = (size_t)s.B * s.T * s.F * 2, NC = (size_t)s.B * s.T * s.C * 2;
    void *b[4];
    const size_t n[4] = {NF, NF, NF, NC};
    for (int i = 0; i < 4; i++) b[i] = mal_kern_alloc(K, n[i]);
    auto each = [&] {
        for (int i = 0; i < 4; i++) CU(cudaMemsetAsync(b[i], 0, n[i], S));
    };
    auto multi = [&] { mal_cu_zero_multi(S, b, n, 4); };
    /* filled with ones, then zeroed: sampled bytes (the last of each too) */
    for (int i = 0; i < 4; i++) CU(cudaMemsetAsync(b[i], 0xff, n[i], S));
    multi();
    errs ez;
    for (int i = 0; i < 4; i++)
        for (int k = 0; k <= SAMPLES; k++) {
            unsigned char h = 1;
            const size_t at = k == SAMPLES ? n[i] - 1 : pick(n[i]);
            CU(cudaMemcpyAsync(&h, (unsigned char *)b[i] + at, 1, cudaMemcpyDeviceToHost, S));
            CU(cudaStreamSynchronize(S));
            ez.add(h, 0);
        }
    const double bytes = 3.0 * NF + NC;
    row("zero MLP grads x4 memset", s, time_us(each), 0, bytes, ez, 0);
    row("zero MLP grads, one kernel", s, time_us(multi), 0, bytes, ez, 0);
    for (int i = 0; i < 4; i++) mal_kern_free(K, b[i]);
}

static void bench_embedding(const shape &s)
{
    const int N = s.B * s.T, C = s.C, V = s.V;
    dbuf wte = make((size_t)V * C, 1, 61, 1.0f), out = make((size_t)N * C, 1, 62, 0),
         dy = make((size_t)N * C, 1, 63, 1.0f), dw = make((size_t)V * C, 0, 64, 0.5f);
    int *tok = (int *)mal_kern_alloc(K, (size_t)N * 4), *err = (int *)mal_kern_alloc(K, 4);
    tokens_kernel<<<256, 256, 0, S>>>(tok, N, 65, V);
    void *scr = mal_kern_alloc(K, mal_cu_embedding_bwd_scratch_bytes(N, V));
    mal_cu_embedding_fwd(S, 1, out.d, tok, wte.d, N, C, V, 0, V, err);
    mal_cu_embedding_bwd(S, 1, (float *)dw.d, dy.d, tok, N, C, 0, V, scr);
    errs ef, eb;
    for (int k = 0; k < SAMPLES; k++) {
        size_t n = pick(N);
        int t = host_token(65, n, V);
        std::vector<double> o = get(out, n * C, C);
        for (int c = 0; c < C; c++)
            ef.add(o[c], wte.at((size_t)t * C + c));
        /* the gradient row of this token: every position holding it */
        std::vector<double> want(C);
        for (int c = 0; c < C; c++)
            want[c] = dw.at((size_t)t * C + c);
        for (int j = 0; j < N; j++)
            if (host_token(65, j, V) == t)
                for (int c = 0; c < C; c++)
                    want[c] += dy.at((size_t)j * C + c);
        eb.add(get(dw, (size_t)t * C, C), want);
    }
    row("embedding fwd", s,
        time_us([&] { mal_cu_embedding_fwd(S, 1, out.d, tok, wte.d, N, C, V, 0, V, err); }), 0,
        4.0 * N * C + 4.0 * N, ef, 0);
    row("embedding bwd", s,
        time_us([&] { mal_cu_embedding_bwd(S, 1, (float *)dw.d, dy.d, tok, N, C, 0, V, scr); }), 0,
        2.0 * N * C + 8.0 * N * C + 4.0 * N, eb, 1e-6);
    mal_kern_free(K, tok), mal_kern_free(K, err), mal_kern_free(K, scr);
    drop(wte), drop(out), drop(dy), drop(dw);
}

static void bench_xent(const shape &s)
{
    const int N = s.B * s.T, V = s.V;
    const float dscale = 1.0f / N;
    dbuf lg = make((size_t)N * V, 1, 71, 3.0f), loss = make(N, 0, 72, 0);
    int *tgt = (int *)mal_kern_alloc(K, (size_t)N * 4), *err = (int *)mal_kern_alloc(K, 4);
    tokens_kernel<<<256, 256, 0, S>>>(tgt, N, 73, V);
    /* in place, as the model calls it: the logits become their gradient */
    mal_cu_xent(S, 1, (float *)loss.d, lg.d, lg.d, tgt, N, V, dscale, err);
    errs el, ed;
    for (int k = 0; k < 8; k++) {
        size_t n = pick(N);
        int t = host_token(73, n, V);
        double m = -1e300, sum = 0;
        for (int i = 0; i < V; i++)
            m = fmax(m, lg.at(n * V + i));
        for (int i = 0; i < V; i++)
            sum += exp(lg.at(n * V + i) - m);
        el.add(get(loss, n, 1)[0], log(sum) + m - lg.at(n * V + t));
        std::vector<double> d = get(lg, n * V, V);
        for (int i = 0; i < V; i++)
            ed.add(d[i], (exp(lg.at(n * V + i) - m) / sum - (i == t)) * dscale);
    }
    errs both = el;
    both.num += ed.num, both.den += ed.den;
    refill(lg);
    row("cross-entropy fwd+bwd", s,
        time_us([&] { mal_cu_xent(S, 1, (float *)loss.d, lg.d, lg.d, tgt, N, V, dscale, err); }), 0,
        4.0 * N * V + 12.0 * N, both, 1e-2);
    mal_kern_free(K, tgt), mal_kern_free(K, err);
    drop(lg), drop(loss);
}

/* Attention: the whole reference of one head (batch 0, the last head) --
 * every query's log-sum-exp and D, which dK and dV of a key need from all
 * later queries -- and samples of it. */
static void bench_attention(const shape &s)
{
    const int B = s.B, T = s.T, H = s.H, hd = s.hd;
    size_t n = (size_t)B * T * H * hd, ld = (size_t)H * hd;
    dbuf q = make(n, 1, 81, 1.0f), k = make(n, 1, 82, 1.0f), v = make(n, 1, 83, 1.0f),
         out = make(n, 1, 84, 0), dout = make(n, 1, 85, 1.0f), dq = make(n, 1, 86, 0.1f),
         dk = make(n, 1, 87, 0.1f), dv = make(n, 1, 88, 0.1f),
         lse = make((size_t)B * H * T, 0, 89, 0);
    /* every query head its own key/value head (the benchmark shapes' MHA) */
    const mal_cu_heads hs = {H, H, 1, 0};
    printf("(attention at hd %d: %s)\n", hd, mal_cu_attention_kind(1, 0, hd));
    void *scr = mal_kern_alloc(K, mal_cu_attention_bwd_scratch_bytes(B, T, H));
    auto fwd = [&] {
        mal_cu_attention_fwd(S, 1, 0, out.d, (float *)lse.d, q.d, k.d, v.d, B, T, hs, hd);
    };
    auto bwd = [&] {
        mal_cu_attention_bwd(S, 1, 0, dq.d, dk.d, dv.d, dout.d, out.d, q.d, k.d, v.d,
                             (const float *)lse.d, B, T, hs, hd, scr);
    };
    fwd();
    bwd();
    const int h = H - 1;
    const double sc = 1.0 / sqrt((double)hd);
    /* the head's inputs as doubles, [t][d] */
    auto load = [&](const dbuf &b) {
        std::vector<double> x((size_t)T * hd);
        for (int t = 0; t < T; t++)
            for (int d = 0; d < hd; d++)
                x[(size_t)t * hd + d] = b.at((size_t)t * ld + (size_t)h * hd + d);
        return x;
    };
    std::vector<double> Q = load(q), Kk = load(k), Vv = load(v), DO = load(dout);
    std::vector<double> L(T), D(T), O((size_t)T * hd), srow(T);
    for (int t = 0; t < T; t++) {
        double m = -1e300, sum = 0;
        for (int u = 0; u <= t; u++) {
            double dot = 0;
            for (int d = 0; d < hd; d++)
                dot += Q[(size_t)t * hd + d] * Kk[(size_t)u * hd + d];
            srow[u] = dot * sc;
            m = fmax(m, srow[u]);
        }
        for (int u = 0; u <= t; u++)
            sum += exp(srow[u] - m);
        L[t] = m + log(sum);
        double dsum = 0;
        for (int d = 0; d < hd; d++)
            O[(size_t)t * hd + d] = 0;
        for (int u = 0; u <= t; u++) {
            double p = exp(srow[u] - L[t]);
            for (int d = 0; d < hd; d++)
                O[(size_t)t * hd + d] += p * Vv[(size_t)u * hd + d];
        }
        for (int d = 0; d < hd; d++)
            dsum += DO[(size_t)t * hd + d] * O[(size_t)t * hd + d];
        D[t] = dsum;
    }
    auto P = [&](int t, int u) {
        double dot = 0;
        for (int d = 0; d < hd; d++)
            dot += Q[(size_t)t * hd + d] * Kk[(size_t)u * hd + d];
        return exp(dot * sc - L[t]);
    };
    auto dP = [&](int t, int u) {
        double dot = 0;
        for (int d = 0; d < hd; d++)
            dot += DO[(size_t)t * hd + d] * Vv[(size_t)u * hd + d];
        return dot;
    };
    /* samples of one forward and one backward run (on freshly filled
     * outputs) against the reference */
    auto sample = [&](errs &ef, errs &eb) {
    std::vector<double> glse = get(lse, (size_t)h * T, T); /* batch 0, head h */
    for (int kk = 0; kk < 8; kk++) {
        int t = (int)pick(T);
        size_t base = (size_t)t * ld + (size_t)h * hd;
        std::vector<double> o = get(out, base, hd), gq = get(dq, base, hd);
        for (int d = 0; d < hd; d++)
            ef.add(o[d], O[(size_t)t * hd + d]);
        ef.add(glse[t], L[t]);
        std::vector<double> rq(hd);
        for (int d = 0; d < hd; d++)
            rq[d] = dq.at(base + d);
        for (int u = 0; u <= t; u++) {
            double ds = P(t, u) * (dP(t, u) - D[t]);
            for (int d = 0; d < hd; d++)
                rq[d] += sc * ds * Kk[(size_t)u * hd + d];
        }
        eb.add(gq, rq);
        /* a key's dK and dV gather every later query */
        int u = (int)pick(T);
        size_t kb = (size_t)u * ld + (size_t)h * hd;
        std::vector<double> rk(hd), rv(hd), gk = get(dk, kb, hd), gv = get(dv, kb, hd);
        for (int d = 0; d < hd; d++)
            rk[d] = dk.at(kb + d), rv[d] = dv.at(kb + d);
        for (int t2 = u; t2 < T; t2++) {
            double p = P(t2, u), ds = p * (dP(t2, u) - D[t2]);
            for (int d = 0; d < hd; d++) {
                rv[d] += p * DO[(size_t)t2 * hd + d];
                rk[d] += sc * ds * Q[(size_t)t2 * hd + d];
            }
        }
        eb.add(gk, rk);
        eb.add(gv, rv);
    }
    };
    errs ef, eb;
    sample(ef, eb);
    double unit = (double)B * H * ((double)T * T / 2) * hd * 2; /* one causal product */
    double act = 2.0 * n;                                       /* one (B,T,H,hd) in bf16 */
    row("attention fwd", s, time_us(fwd), 2 * unit, 4 * act + 4.0 * B * H * T, ef, 1e-2);
    row("attention bwd", s, time_us(bwd), 5 * unit, 5 * act + 6 * act + 4.0 * B * H * T, eb, 2e-2);
#ifdef MAL_ATTN_PREV
    /* the same on the previous kernels, from the same inputs */
    auto pfwd = [&] {
        prev::mal_cu_attention_prev_fwd(S, 1, 0, out.d, (float *)lse.d, q.d, k.d, v.d, B, T, hs,
                                        hd);
    };
    auto pbwd = [&] {
        prev::mal_cu_attention_prev_bwd(S, 1, 0, dq.d, dk.d, dv.d, dout.d, out.d, q.d, k.d, v.d,
                                        (const float *)lse.d, B, T, hs, hd, scr);
    };
    refill(out), refill(lse), refill(dq), refill(dk), refill(dv);
    pfwd();
    pbwd();
    errs pf, pb;
    sample(pf, pb);
    row("attention fwd (previous)", s, time_us(pfwd), 2 * unit, 4 * act + 4.0 * B * H * T, pf,
        1e-2);
    row("attention bwd (previous)", s, time_us(pbwd), 5 * unit,
        5 * act + 6 * act + 4.0 * B * H * T, pb, 2e-2);
#endif
    if (CD) {
        char msg[512] = "";
        float *dsum = (float *)mal_kern_alloc(K, (size_t)B * H * T * sizeof(float));
        if (!dsum) {
            fprintf(stderr, "kernel_bench: no device memory for cuDNN's row sums\n");
            exit(1);
        }
        auto cfwd = [&] {
            if (mal_cudnn_attention_fwd(CD, out.d, (float *)lse.d, q.d, k.d, v.d, B, T, hs, hd, msg,
                                        sizeof msg)) {
                fprintf(stderr, "kernel_bench: %s\n", msg);
                exit(1);
            }
        };
        auto cbwd = [&] {
            if (mal_cudnn_attention_bwd(CD, dq.d, dk.d, dv.d, dout.d, out.d, q.d, k.d, v.d,
                                        (const float *)lse.d, dsum, B, T, hs, hd, msg,
                                        sizeof msg)) {
                fprintf(stderr, "kernel_bench: %s\n", msg);
                exit(1);
            }
        };
        if (!mal_cudnn_attention_ok(CD, B, T, hs, hd, msg, sizeof msg)) {
            printf("attention (cudnn) %-5s refused: %s  <-- FAIL\n", s.name, msg);
            failures++;
        } else {
            /* cuDNN writes the gradients (the hand kernels add to them):
             * the reference starts from zero, and every output is poisoned
             * (0xFF bytes: NaN) so that an element left unwritten fails */
            dq.scale = dk.scale = dv.scale = 0;
            CU(cudaMemsetAsync(out.d, 0xFF, n * 2, S));
            CU(cudaMemsetAsync(lse.d, 0xFF, (size_t)B * H * T * 4, S));
            CU(cudaMemsetAsync(dq.d, 0xFF, n * 2, S));
            CU(cudaMemsetAsync(dk.d, 0xFF, n * 2, S));
            CU(cudaMemsetAsync(dv.d, 0xFF, n * 2, S));
            cfwd();
            cbwd();
            errs cf, cb;
            sample(cf, cb);
            row("attention fwd (cudnn)", s, time_us(cfwd), 2 * unit, 4 * act + 4.0 * B * H * T, cf,
                1e-2);
            row("attention bwd (cudnn)", s, time_us(cbwd), 5 * unit,
                5 * act + 6 * act + 4.0 * B * H * T, cb, 2e-2);
        }
        mal_kern_free(K, dsum);
    }
    mal_kern_free(K, scr);
    drop(q), drop(k), drop(v), drop(out), drop(dout), drop(dq), drop(dk), drop(dv), drop(lse);
}

static void bench_shape(const shape &s)
{
    const int N = s.B * s.T;
    printf("\n== %s: B %d x T %d, d_model %d, %d heads of %d, ffn %d, vocab %d (bf16)\n", s.name,
           s.B, s.T, s.C, s.H, s.hd, s.F, s.V);
    printf("%-26s %-5s %10s %10s %7s %8s %7s  %s\n", "kernel", "shape", "time us", "floor us",
           "% floor", "GB/s", "TFLOP/s", "rel err (tol)");
    if (only_attention) {
        bench_attention(s);
    } else {
    bench_embedding(s);
    bench_rmsnorm(s);
    bench_matmul(s, "qkv (one)", N, s.C, s.H * s.hd);
    bench_rope(s);
    bench_attention(s);
    bench_elementwise(s);
    bench_optimizer(s);
    bench_zero(s);
    bench_matmul(s, "w1/w3 (one)", N, s.C, s.F);
    bench_swiglu(s);
    bench_matmul(s, "w2", N, s.F, s.C);
    bench_matmul(s, "lm head", N, s.C, s.V);
    bench_xent(s);
    }
    int rc = mal_kern_sync(K);
    if (rc) {
        fprintf(stderr, "kernel_bench: %s: %s\n", s.name, mal_errmsg());
        failures++;
    }
}

int main(int argc, char **argv)
{
    std::vector<const shape *> want;
    const char *tsv_path = NULL;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--tsv") && a + 1 < argc) {
            tsv_path = argv[++a];
            continue;
        }
        if (!strcmp(argv[a], "--attention")) {
            only_attention = 1;
            continue;
        }
        const shape *found = NULL;
        if (!strcmp(argv[a], "--shape") && a + 1 < argc) {
            ++a;
            for (const shape &s : SHAPES)
                if (!strcmp(s.name, argv[a])) found = &s;
        }
        if (!found) {
            fprintf(stderr, "usage: kernel_bench [--shape 124m|1b]... [--attention] [--tsv FILE]\n");
            return 2;
        }
        want.push_back(found);
    }
    if (want.empty())
        for (const shape &s : SHAPES)
            want.push_back(&s);
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1) {
        printf("kernel_bench: skipped: no usable GPU (%s)\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 77;
    }
    mal_kern_config cfg = mal_kern_config_default();
    cfg.compute = MAL_BF16;
    if (mal_kern_create("cuda", &cfg, &K)) {
        printf("kernel_bench: skipped: %s\n", mal_errmsg());
        return 77;
    }
    S = (cudaStream_t)mal_kern_native_queue(K);
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("kernel_bench: %s, %d SMs, %.0f GiB\n", prop.name, prop.multiProcessorCount,
           prop.totalGlobalMem / 1073741824.0);
    if (tsv_path && !(tsv = fopen(tsv_path, "w"))) {
        fprintf(stderr, "kernel_bench: cannot write %s\n", tsv_path);
        return 1;
    }
    char cmsg[512] = "";
    if (mal_cudnn_open(&CD, S, cmsg, sizeof cmsg) == 0)
        printf("kernel_bench: cuDNN %ld: rows \"(cudnn)\" for attention\n", mal_cudnn_version(CD));
    else
        printf("kernel_bench: no cuDNN rows: %s\n", cmsg);
    if (tsv) fprintf(tsv, "kernel\tshape\ttime_us\tfloor_us\tbytes\tflops\trel_err\ttol\n");
    ceilings();
    for (const shape *s : want)
        bench_shape(*s);
    if (tsv) fclose(tsv);
    mal_cudnn_close(CD);
    mal_kern_destroy(K);
    printf("\nkernel_bench: %s (%d check%s out of tolerance)\n", failures ? "FAIL" : "ok", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
