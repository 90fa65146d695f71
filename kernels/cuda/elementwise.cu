/* The element-wise sums of the CUDA backend (mal_cu_add, mal_cu_accumulate,
 * mal_cu_scale; contracts: kernels.h and cuda_ops.h), in chunks of ew_width
 * (common.cuh).  Conventions of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

/* out = a + b; out may be a or b (each element is read before it is
 * written, by the same thread). */
template <typename T, int VN>
__global__ void __launch_bounds__(256) add_k(T *out, const T *a, const T *b, size_t n)
{
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VN;
    if (i >= n) return;
    if (VN > 1 && i + VN <= n) {
        float x[VN], y[VN];
        load16(x, a + i);
        load16(y, b + i);
#pragma unroll
        for (int j = 0; j < VN; j++) x[j] += y[j];
        store16(out + i, x);
    } else {
        for (size_t j = i; j < n && j < i + VN; j++) stf(out + j, ldf(a + j) + ldf(b + j));
    }
}

/* x *= f */
template <int VN>
__global__ void __launch_bounds__(256) scale_k(float *__restrict__ x, size_t n, float f)
{
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VN;
    if (i >= n) return;
    if (VN > 1 && i + VN <= n) {
        float a[VN];
        load16(a, x + i);
#pragma unroll
        for (int j = 0; j < VN; j++) a[j] *= f;
        store16(x + i, a);
    } else {
        for (size_t j = i; j < n && j < i + VN; j++) x[j] *= f;
    }
}

template <typename T>
static void add(mal_cu_stream s, void *out, const void *a, const void *b, size_t n)
{
    if (ew_width<T>(out, a, b) > 1)
        MAL_LAUNCH((add_k<T, vec<T>::n>), mal_blocks(n, 256 * vec<T>::n), 256, 0, s)
        ((T *)out, (const T *)a, (const T *)b, n);
    else
        MAL_LAUNCH((add_k<T, 1>), mal_blocks(n, 256), 256, 0, s)
        ((T *)out, (const T *)a, (const T *)b, n);
}

extern "C" void mal_cu_add(mal_cu_stream s, int use_bf16, void *out, const void *a, const void *b,
                           size_t n)
{
    if (!n) return;
    if (use_bf16)
        add<__nv_bfloat16>(s, out, a, b, n);
    else
        add<float>(s, out, a, b, n);
}

extern "C" void mal_cu_accumulate(mal_cu_stream s, float *y, const float *x, size_t n)
{
    if (!n) return;
    if (ew_width<float>(y, x, y) > 1)
        MAL_LAUNCH((add_k<float, 4>), mal_blocks(n, 1024), 256, 0, s)(y, (const float *)y, x, n);
    else
        MAL_LAUNCH((add_k<float, 1>), mal_blocks(n, 256), 256, 0, s)(y, (const float *)y, x, n);
}

extern "C" void mal_cu_scale(mal_cu_stream s, float *x, size_t n, float f)
{
    if (!n) return;
    if (aligned16(x))
        MAL_LAUNCH(scale_k<4>, mal_blocks(n, 1024), 256, 0, s)(x, n, f);
    else
        MAL_LAUNCH(scale_k<1>, mal_blocks(n, 256), 256, 0, s)(x, n, f);
}
