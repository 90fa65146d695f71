/* RMSNorm of the CUDA backend, forward and backward (mal_cu_rmsnorm_fwd,
 * mal_cu_rmsnorm_bwd; contracts: kernels.h and cuda_ops.h).  One warp per
 * row; the backward's weight gradient goes through per-block partial rows
 * and a column sum over the blocks in order: deterministic, no float
 * atomics.  Conventions of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

#include <math.h>

/* One warp per row.  rstd = 1/sqrt(mean(x^2) + eps); out = x * rstd * w. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) rmsnorm_fwd_k(T *__restrict__ out, float *__restrict__ rstd,
                                                     const T *__restrict__ inp,
                                                     const T *__restrict__ w, int N, int C,
                                                     float eps)
{
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return; /* whole warps leave together: no warp exchange after */
    const T *x = inp + (size_t)row * C;
    T *o = out + (size_t)row * C;
    const int VN = VEC ? vec<T>::n : 1;
    float ss = 0.0f;
    for (int c = lane * VN; c < C; c += 32 * VN) {
        if (VEC) {
            float a[vec<T>::n];
            load16(a, x + c);
#pragma unroll
            for (int j = 0; j < vec<T>::n; j++) ss += a[j] * a[j];
        } else {
            float a = ldf(x + c);
            ss += a * a;
        }
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0 && rstd) rstd[row] = r;
    for (int c = lane * VN; c < C; c += 32 * VN) {
        if (VEC) {
            float a[vec<T>::n], g[vec<T>::n];
            load16(a, x + c);
            load16(g, w + c);
#pragma unroll
            for (int j = 0; j < vec<T>::n; j++) a[j] = a[j] * r * g[j];
            store16(o + c, a);
        } else {
            stf(o + c, ldf(x + c) * r * ldf(w + c));
        }
    }
}

/* Rows per block and blocks of the backward: fixed, so that the weight
 * gradient's summation order depends on N alone. */
enum { RMS_BWD_WARPS = 4, RMS_BWD_MAX_BLOCKS = 512 };

static int rms_bwd_blocks(int N)
{
    int b = (N + RMS_BWD_WARPS - 1) / RMS_BWD_WARPS;
    return b < 1 ? 1 : (b > RMS_BWD_MAX_BLOCKS ? RMS_BWD_MAX_BLOCKS : b);
}

/* With g = dy * w, r = rstd:  dx += r * dy * w - (r^3 * mean(dy * w * x)) x
 * (cpu.c's expression), and the weight gradient dw = sum over rows of
 * dy * x * r: each warp adds its rows into its own shared-memory row, the
 * block adds its warps in order into partial[block] (fp32). */
template <typename T, bool VEC>
__global__ void __launch_bounds__(RMS_BWD_WARPS * 32)
    rmsnorm_bwd_k(T *__restrict__ dinp, float *__restrict__ partial, const T *__restrict__ dout,
                  const T *__restrict__ inp, const T *__restrict__ w,
                  const float *__restrict__ rstd, int N, int C)
{
    MAL_SMEM(smem);
    float *acc = (float *)smem; /* [RMS_BWD_WARPS][C] */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int VN = VEC ? vec<T>::n : 1;
    float *mine = acc + (size_t)warp * C;
    for (int c = lane; c < C; c += 32) mine[c] = 0.0f;
    /* each lane only ever touches its own columns of `mine` below (the same
     * c = lane * VN + 32 * VN * i pattern), so no barrier is needed before
     * the row loop; columns were zeroed with a different pattern, hence: */
    __syncwarp();
    const int stride = gridDim.x * RMS_BWD_WARPS;
    for (int row = blockIdx.x * RMS_BWD_WARPS + warp; row < N; row += stride) {
        const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
        T *dx = dinp + (size_t)row * C;
        const float r = rstd[row];
        float dot = 0.0f;
        for (int c = lane * VN; c < C; c += 32 * VN) {
            if (VEC) {
                float a[vec<T>::n], g[vec<T>::n], d[vec<T>::n];
                load16(a, x + c);
                load16(g, w + c);
                load16(d, dy + c);
#pragma unroll
                for (int j = 0; j < vec<T>::n; j++) dot += d[j] * g[j] * a[j];
            } else {
                dot += ldf(dy + c) * ldf(w + c) * ldf(x + c);
            }
        }
        dot = warp_sum(dot);
        const float k = r * r * r * dot / (float)C;
        for (int c = lane * VN; c < C; c += 32 * VN) {
            if (VEC) {
                float a[vec<T>::n], g[vec<T>::n], d[vec<T>::n], o[vec<T>::n];
                load16(a, x + c);
                load16(g, w + c);
                load16(d, dy + c);
                load16(o, dx + c);
#pragma unroll
                for (int j = 0; j < vec<T>::n; j++) {
                    o[j] += r * d[j] * g[j] - k * a[j];
                    mine[c + j] += d[j] * a[j] * r;
                }
                store16(dx + c, o);
            } else {
                float a = ldf(x + c), d = ldf(dy + c);
                stf(dx + c, ldf(dx + c) + (r * d * ldf(w + c) - k * a));
                mine[c] += d * a * r;
            }
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < RMS_BWD_WARPS; i++) s += acc[(size_t)i * C + c];
        partial[(size_t)blockIdx.x * C + c] = s;
    }
}

/* dweight[c] += sum over blocks b (in order) of partial[b][c]. */
__global__ void __launch_bounds__(256)
    colsum_acc_k(float *__restrict__ dweight, const float *__restrict__ partial, int rows, int C)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int b = 0; b < rows; b++) s += partial[(size_t)b * C + c];
    dweight[c] += s;
}

template <typename T>
static void rmsnorm_fwd(mal_cu_stream s, void *out, float *rstd, const void *inp,
                        const void *weight, int N, int C, float eps)
{
    const unsigned blocks = mal_blocks((size_t)N, 8);
    if (vec_ok<T>(out, inp, weight, C))
        MAL_LAUNCH((rmsnorm_fwd_k<T, true>), blocks, 256, 0, s)
        ((T *)out, rstd, (const T *)inp, (const T *)weight, N, C, eps);
    else
        MAL_LAUNCH((rmsnorm_fwd_k<T, false>), blocks, 256, 0, s)
        ((T *)out, rstd, (const T *)inp, (const T *)weight, N, C, eps);
}

extern "C" void mal_cu_rmsnorm_fwd(mal_cu_stream s, int use_bf16, void *out, float *rstd,
                                   const void *inp, const void *weight, int N, int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    if (use_bf16)
        rmsnorm_fwd<__nv_bfloat16>(s, out, rstd, inp, weight, N, C, eps);
    else
        rmsnorm_fwd<float>(s, out, rstd, inp, weight, N, C, eps);
}

extern "C" size_t mal_cu_rmsnorm_bwd_scratch_bytes(int N, int C)
{
    return (size_t)rms_bwd_blocks(N) * (size_t)(C > 0 ? C : 0) * sizeof(float);
}

template <typename T, bool VEC> static void set_smem_limit(size_t bytes)
{
#ifndef MAL_CUDA_EMU
    /* above 48 KiB a kernel must opt in (HOPPER.md) */
    if (bytes > 48 * 1024)
        cudaFuncSetAttribute(rmsnorm_bwd_k<T, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes);
#else
    (void)bytes;
#endif
}

template <typename T>
static void rmsnorm_bwd(mal_cu_stream s, void *dinp, float *dweight, const void *dout,
                        const void *inp, const void *weight, const float *rstd, int N, int C,
                        void *scratch)
{
    const int blocks = rms_bwd_blocks(N);
    const size_t smem = (size_t)RMS_BWD_WARPS * C * sizeof(float);
    float *partial = (float *)scratch;
    if (vec_ok<T>(dinp, dout, inp, C) && aligned16(weight)) {
        set_smem_limit<T, true>(smem);
        MAL_LAUNCH((rmsnorm_bwd_k<T, true>), blocks, RMS_BWD_WARPS * 32, smem, s)
        ((T *)dinp, partial, (const T *)dout, (const T *)inp, (const T *)weight, rstd, N, C);
    } else {
        set_smem_limit<T, false>(smem);
        MAL_LAUNCH((rmsnorm_bwd_k<T, false>), blocks, RMS_BWD_WARPS * 32, smem, s)
        ((T *)dinp, partial, (const T *)dout, (const T *)inp, (const T *)weight, rstd, N, C);
    }
    MAL_LAUNCH(colsum_acc_k, mal_blocks((size_t)C, 256), 256, 0, s)(dweight, partial, blocks, C);
}

extern "C" void mal_cu_rmsnorm_bwd(mal_cu_stream s, int use_bf16, void *dinp, float *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *rstd, int N, int C, void *scratch)
{
    if (N <= 0 || C <= 0) return;
    if (use_bf16)
        rmsnorm_bwd<__nv_bfloat16>(s, dinp, dweight, dout, inp, weight, rstd, N, C, scratch);
    else
        rmsnorm_bwd<float>(s, dinp, dweight, dout, inp, weight, rstd, N, C, scratch);
}
