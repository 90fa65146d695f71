/* Cross-entropy of the CUDA backend fused with its gradient (mal_cu_xent;
 * contracts: kernels.h and cuda_ops.h): one block per row, online max and
 * sum; and the vocabulary-parallel cross-entropy's two parts
 * (mal_cu_xent_stats, mal_cu_xent_combine) from the same pieces.  The
 * output projection before it is a matrix product (cuda.c).  Conventions
 * of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

#include <math.h>

enum { XENT_THREADS = 512 };

/* One block per row.  Pass 1: each thread keeps a running max and a sum of
 * e^(x - max) rescaled when the max grows (online softmax); the block
 * combines them in a fixed tree.  Pass 2 writes (e^(x - m) / sum) * dscale
 * and subtracts dscale at the target.  loss = log(sum) + (m - x[target]).
 * VN elements per access (16 bytes when V is a multiple of it and the
 * buffers are aligned: the 32000-token vocabulary is). */
MAL_DEV void online_add(float &m, float &sum, float x)
{
    if (x > m) {
        sum = sum * expf(m - x) + 1.0f;
        m = x;
    } else {
        sum += expf(x - m);
    }
}

/* Pass 1 over row x (V elements) by the whole block: rm[0], rs[0] (shared,
 * blockDim.x floats each) end as the row's max and sum of e^(x - max);
 * every thread may read them on return. */
template <typename T, int VN>
MAL_DEV void row_max_sum(const T *x, int V, float *rm, float *rs)
{
    float m = -INFINITY, sum = 0.0f;
    for (int i = threadIdx.x * VN; i < V; i += blockDim.x * VN) {
        if (VN > 1) {
            float a[VN];
            load16(a, x + i);
#pragma unroll
            for (int j = 0; j < VN; j++) online_add(m, sum, a[j]);
        } else {
            online_add(m, sum, ldf(x + i));
        }
    }
    rm[threadIdx.x] = m;
    rs[threadIdx.x] = sum;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            const float m1 = rm[threadIdx.x], m2 = rm[threadIdx.x + o];
            const float s1 = rs[threadIdx.x], s2 = rs[threadIdx.x + o];
            const float mm = fmaxf(m1, m2);
            /* a side with no elements has m = -inf and s = 0 */
            rs[threadIdx.x] = (s1 > 0.0f ? s1 * expf(m1 - mm) : 0.0f) +
                              (s2 > 0.0f ? s2 * expf(m2 - mm) : 0.0f);
            rm[threadIdx.x] = mm;
        }
        __syncthreads();
    }
}

/* Pass 2: d[i] = e^(x[i] - M) * f, less dscale at column t (none when t
 * is outside [0, V)); d may be x. */
template <typename T, int VN>
MAL_DEV void write_grad(T *d, const T *x, int V, float M, float f, int t, float dscale)
{
    for (int i = threadIdx.x * VN; i < V; i += blockDim.x * VN) {
        if (VN > 1) {
            float a[VN];
            load16(a, x + i);
#pragma unroll
            for (int j = 0; j < VN; j++) a[j] = expf(a[j] - M) * f - (i + j == t ? dscale : 0.0f);
            store16(d + i, a);
        } else {
            float g = expf(ldf(x + i) - M) * f;
            if (i == t) g -= dscale;
            stf(d + i, g);
        }
    }
}

template <typename T, int VN>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_k(float *__restrict__ losses, T *dlogits, const T *logits, const int *__restrict__ targets,
           int V, float dscale, int *err)
{
    MAL_SMEM(smem);
    float *rm = (float *)smem, *rs = rm + XENT_THREADS, *xt_s = rs + XENT_THREADS;
    const int n = blockIdx.x;
    const T *x = logits + (size_t)n * V;
    T *d = dlogits ? dlogits + (size_t)n * V : (T *)0;
    const int tgt = targets[n];
    const bool bad = tgt < 0 || tgt >= V;
    if (threadIdx.x == 0) xt_s[0] = bad ? 0.0f : ldf(x + tgt); /* before pass 2 overwrites it */
    row_max_sum<T, VN>(x, V, rm, rs);
    const float M = rm[0], S = rs[0], xt = xt_s[0];
    if (bad) {
        if (threadIdx.x == 0) {
            *err |= MAL_CU_ERR_TARGET;
            if (losses) losses[n] = NAN;
        }
        if (d)
            for (int i = threadIdx.x; i < V; i += blockDim.x) stf(d + i, 0.0f);
        return;
    }
    if (threadIdx.x == 0 && losses) losses[n] = logf(S) + (M - xt);
    if (d) write_grad<T, VN>(d, x, V, M, dscale / S, tgt, dscale);
}

template <typename T>
static void xent(mal_cu_stream s, float *losses, void *dlogits, const void *logits,
                 const int *targets, int N, int V, float dscale, int *err)
{
    const size_t smem = (2 * XENT_THREADS + 1) * sizeof(float);
    if (V % vec<T>::n == 0 && aligned16(logits) && aligned16(dlogits))
        MAL_LAUNCH((xent_k<T, vec<T>::n>), (unsigned)N, XENT_THREADS, smem, s)
        (losses, (T *)dlogits, (const T *)logits, targets, V, dscale, err);
    else
        MAL_LAUNCH((xent_k<T, 1>), (unsigned)N, XENT_THREADS, smem, s)
        (losses, (T *)dlogits, (const T *)logits, targets, V, dscale, err);
}

extern "C" void mal_cu_xent(mal_cu_stream s, int use_bf16, float *losses, void *dlogits,
                            const void *logits, const int *targets, int N, int V, float dscale,
                            int *err)
{
    if (N <= 0 || V <= 0) return;
    if (use_bf16)
        xent<__nv_bfloat16>(s, losses, dlogits, logits, targets, N, V, dscale, err);
    else
        xent<float>(s, losses, dlogits, logits, targets, N, V, dscale, err);
}

/* ---- vocabulary-parallel cross-entropy --------------------------------- */

/* One block per row of this shard's logits (N,Vl): the online max and sum
 * of xent_k, then stats[n] = max, stats[N + n] = sum e^(x - max),
 * stats[2N + n] = the target's logit where it is one of columns
 * [v0, v0 + Vl) (else 0). */
template <typename T, int VN>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_stats_k(float *__restrict__ stats, const T *__restrict__ logits,
                 const int *__restrict__ targets, int N, int Vl, int v0)
{
    MAL_SMEM(smem);
    float *rm = (float *)smem, *rs = rm + XENT_THREADS;
    const int n = blockIdx.x;
    const T *x = logits + (size_t)n * Vl;
    row_max_sum<T, VN>(x, Vl, rm, rs);
    if (threadIdx.x == 0) {
        const int t = targets[n] - v0;
        stats[n] = rm[0];
        stats[N + n] = rs[0];
        stats[2 * (size_t)N + n] = t >= 0 && t < Vl ? ldf(x + t) : 0.0f;
    }
}

/* One block per row: thread 0 combines the P shards' statistics in shard
 * order (M, S, the target's logit) and writes the loss; then every thread
 * writes its columns of (e^(x - M) / S - onehot) * dscale. */
template <typename T, int VN>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_combine_k(float *__restrict__ losses, T *dlogits, const T *logits,
                   const float *__restrict__ all, int P, const int *__restrict__ targets, int N,
                   int Vl, int v0, int V, float dscale, int *err)
{
    MAL_SMEM(smem);
    float *ms = (float *)smem; /* M, S */
    const int n = blockIdx.x;
    const T *x = logits + (size_t)n * Vl;
    T *d = dlogits ? dlogits + (size_t)n * Vl : (T *)0;
    const int tgt = targets[n];
    const bool bad = tgt < 0 || tgt >= V;
    const size_t stride = 3 * (size_t)N;
    if (threadIdx.x == 0) {
        float M = all[n], xt = 0.0f, S = 0.0f;
        for (int p = 1; p < P; p++) M = fmaxf(M, all[p * stride + n]);
        for (int p = 0; p < P; p++) {
            S += all[p * stride + N + n] * expf(all[p * stride + n] - M);
            xt += all[p * stride + 2 * (size_t)N + n];
        }
        ms[0] = M;
        ms[1] = S;
        if (bad) *err |= MAL_CU_ERR_TARGET;
        if (losses) losses[n] = bad ? NAN : logf(S) + (M - xt);
    }
    __syncthreads();
    if (!d) return;
    if (bad) {
        for (int i = threadIdx.x; i < Vl; i += blockDim.x) stf(d + i, 0.0f);
        return;
    }
    write_grad<T, VN>(d, x, Vl, ms[0], dscale / ms[1], tgt - v0, dscale);
}

extern "C" void mal_cu_xent_stats(mal_cu_stream s, int use_bf16, float *stats, const void *logits,
                                  const int *targets, int N, int Vl, int v0)
{
    if (N <= 0 || Vl <= 0) return;
    const size_t smem = 2 * XENT_THREADS * sizeof(float);
    if (use_bf16) {
        typedef __nv_bfloat16 T;
        if (Vl % vec<T>::n == 0 && aligned16(logits))
            MAL_LAUNCH((xent_stats_k<T, vec<T>::n>), (unsigned)N, XENT_THREADS, smem, s)
            (stats, (const T *)logits, targets, N, Vl, v0);
        else
            MAL_LAUNCH((xent_stats_k<T, 1>), (unsigned)N, XENT_THREADS, smem, s)
            (stats, (const T *)logits, targets, N, Vl, v0);
    } else {
        if (Vl % vec<float>::n == 0 && aligned16(logits))
            MAL_LAUNCH((xent_stats_k<float, vec<float>::n>), (unsigned)N, XENT_THREADS, smem, s)
            (stats, (const float *)logits, targets, N, Vl, v0);
        else
            MAL_LAUNCH((xent_stats_k<float, 1>), (unsigned)N, XENT_THREADS, smem, s)
            (stats, (const float *)logits, targets, N, Vl, v0);
    }
}

template <typename T>
static void xent_combine(mal_cu_stream s, float *losses, void *dlogits, const void *logits,
                         const float *all, int P, const int *targets, int N, int Vl, int v0, int V,
                         float dscale, int *err)
{
    const size_t smem = 2 * sizeof(float);
    if (Vl % vec<T>::n == 0 && aligned16(logits) && aligned16(dlogits))
        MAL_LAUNCH((xent_combine_k<T, vec<T>::n>), (unsigned)N, XENT_THREADS, smem, s)
        (losses, (T *)dlogits, (const T *)logits, all, P, targets, N, Vl, v0, V, dscale, err);
    else
        MAL_LAUNCH((xent_combine_k<T, 1>), (unsigned)N, XENT_THREADS, smem, s)
        (losses, (T *)dlogits, (const T *)logits, all, P, targets, N, Vl, v0, V, dscale, err);
}

extern "C" void mal_cu_xent_combine(mal_cu_stream s, int use_bf16, float *losses, void *dlogits,
                                    const void *logits, const float *all, int P,
                                    const int *targets, int N, int Vl, int v0, int V, float dscale,
                                    int *err)
{
    if (N <= 0 || Vl <= 0 || P <= 0) return;
    if (use_bf16)
        xent_combine<__nv_bfloat16>(s, losses, dlogits, logits, all, P, targets, N, Vl, v0, V,
                                    dscale, err);
    else
        xent_combine<float>(s, losses, dlogits, logits, all, P, targets, N, Vl, v0, V, dscale,
                            err);
}
