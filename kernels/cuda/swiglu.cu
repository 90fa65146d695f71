/* SwiGLU of the CUDA backend, forward and backward (mal_cu_swiglu_fwd,
 * mal_cu_swiglu_bwd; contracts: kernels.h and cuda_ops.h): element-wise,
 * in chunks of ew_width (common.cuh).  Conventions of every kernel family:
 * common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

#include <math.h>

/* out = silu(g) * u = g * u / (1 + e^-g) */
template <typename T, int VN>
__global__ void __launch_bounds__(256) swiglu_fwd_k(T *__restrict__ out, const T *__restrict__ g,
                                                    const T *__restrict__ u, size_t n)
{
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VN;
    if (i >= n) return;
    if (VN > 1 && i + VN <= n) {
        float a[VN], b[VN];
        load16(a, g + i);
        load16(b, u + i);
#pragma unroll
        for (int j = 0; j < VN; j++) a[j] = a[j] * b[j] / (1.0f + expf(-a[j]));
        store16(out + i, a);
    } else {
        for (size_t j = i; j < n && j < i + VN; j++) {
            const float a = ldf(g + j), b = ldf(u + j);
            stf(out + j, a * b / (1.0f + expf(-a)));
        }
    }
}

/* sig = 1/(1+e^-g): dg += dy * u * sig * (1 + g (1 - sig)); du += dy * g * sig */
template <typename T, int VN>
__global__ void __launch_bounds__(256)
    swiglu_bwd_k(T *__restrict__ dg, T *__restrict__ du, const T *__restrict__ dy,
                 const T *__restrict__ g, const T *__restrict__ u, size_t n)
{
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VN;
    if (i >= n) return;
    if (VN > 1 && i + VN <= n) {
        float a[VN], b[VN], d[VN], og[VN], ou[VN];
        load16(a, g + i);
        load16(b, u + i);
        load16(d, dy + i);
        load16(og, dg + i);
        load16(ou, du + i);
#pragma unroll
        for (int j = 0; j < VN; j++) {
            const float sig = 1.0f / (1.0f + expf(-a[j]));
            og[j] += d[j] * b[j] * sig * (1.0f + a[j] * (1.0f - sig));
            ou[j] += d[j] * a[j] * sig;
        }
        store16(dg + i, og);
        store16(du + i, ou);
    } else {
        for (size_t j = i; j < n && j < i + VN; j++) {
            const float a = ldf(g + j), b = ldf(u + j), d = ldf(dy + j);
            const float sig = 1.0f / (1.0f + expf(-a));
            stf(dg + j, ldf(dg + j) + d * b * sig * (1.0f + a * (1.0f - sig)));
            stf(du + j, ldf(du + j) + d * a * sig);
        }
    }
}

template <typename T>
static void swiglu_fwd(mal_cu_stream s, void *out, const void *gate, const void *up, size_t n)
{
    if (ew_width<T>(out, gate, up) > 1)
        MAL_LAUNCH((swiglu_fwd_k<T, vec<T>::n>), mal_blocks(n, 256 * vec<T>::n), 256, 0, s)
        ((T *)out, (const T *)gate, (const T *)up, n);
    else
        MAL_LAUNCH((swiglu_fwd_k<T, 1>), mal_blocks(n, 256), 256, 0, s)
        ((T *)out, (const T *)gate, (const T *)up, n);
}

extern "C" void mal_cu_swiglu_fwd(mal_cu_stream s, int use_bf16, void *out, const void *gate,
                                  const void *up, size_t n)
{
    if (!n) return;
    if (use_bf16)
        swiglu_fwd<__nv_bfloat16>(s, out, gate, up, n);
    else
        swiglu_fwd<float>(s, out, gate, up, n);
}

template <typename T>
static void swiglu_bwd(mal_cu_stream s, void *dgate, void *dup, const void *dout,
                       const void *gate, const void *up, size_t n)
{
    if (ew_width<T>(dgate, dup, dout, gate, up) > 1)
        MAL_LAUNCH((swiglu_bwd_k<T, vec<T>::n>), mal_blocks(n, 256 * vec<T>::n), 256, 0, s)
        ((T *)dgate, (T *)dup, (const T *)dout, (const T *)gate, (const T *)up, n);
    else
        MAL_LAUNCH((swiglu_bwd_k<T, 1>), mal_blocks(n, 256), 256, 0, s)
        ((T *)dgate, (T *)dup, (const T *)dout, (const T *)gate, (const T *)up, n);
}

extern "C" void mal_cu_swiglu_bwd(mal_cu_stream s, int use_bf16, void *dgate, void *dup,
                                  const void *dout, const void *gate, const void *up, size_t n)
{
    if (!n) return;
    if (use_bf16)
        swiglu_bwd<__nv_bfloat16>(s, dgate, dup, dout, gate, up, n);
    else
        swiglu_bwd<float>(s, dgate, dup, dout, gate, up, n);
}
