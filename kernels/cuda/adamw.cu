/* AdamW of the CUDA backend and the working copy (mal_cu_adamw, which also
 * refreshes the working copy, and mal_cu_cast; contracts: kernels.h and
 * cuda_ops.h).  Conventions of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

#include <math.h>

/* cpu.c's update of one element (the same expressions in the same order). */
MAL_DEV void adam1(float &p, float g, float &m, float &v, float lr, float beta1, float beta2,
                   float eps, float wd, float gs, float ibc1, float ibc2)
{
    const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
    const float gj = g * gs;
    const float mi = beta1 * m + a1 * gj;
    const float vi = beta2 * v + a2 * gj * gj;
    m = mi;
    v = vi;
    p -= lr * (mi * ibc1 / (sqrtf(vi * ibc2) + eps) + wd * p);
}

/* 4 elements per thread, 16-byte accesses where the slab is aligned (it
 * is: tensors start at 16-float offsets) and the chunk is whole; work[i] =
 * param[i] in T when work is given.  The partial chunk goes element by
 * element without arrays (a loop bound known only at run time would put
 * arrays in local memory: seen in the SASS of a first version). */
template <typename T>
__global__ void __launch_bounds__(256)
    adamw_k(float *__restrict__ param, T *__restrict__ work, const float *__restrict__ grad,
            float *__restrict__ m, float *__restrict__ v, size_t n, float lr, float beta1,
            float beta2, float eps, float wd, float gs, float ibc1, float ibc2, int vec4)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    if (vec4 && i0 + 4 <= n) {
        float p[4], g[4], mm[4], vv[4];
        load16(p, param + i0);
        load16(g, grad + i0);
        load16(mm, m + i0);
        load16(vv, v + i0);
#pragma unroll
        for (int j = 0; j < 4; j++) adam1(p[j], g[j], mm[j], vv[j], lr, beta1, beta2, eps, wd, gs, ibc1, ibc2);
        store16(param + i0, p);
        store16(m + i0, mm);
        store16(v + i0, vv);
        if (work)
#pragma unroll
            for (int j = 0; j < 4; j++) stf(work + i0 + j, p[j]);
        return;
    }
    for (size_t i = i0; i < n && i < i0 + 4; i++) {
        float p = param[i], mi = m[i], vi = v[i];
        adam1(p, grad[i], mi, vi, lr, beta1, beta2, eps, wd, gs, ibc1, ibc2);
        param[i] = p, m[i] = mi, v[i] = vi;
        if (work) stf(work + i, p);
    }
}

template <typename T>
__global__ void __launch_bounds__(256) cast_k(T *__restrict__ work, const float *__restrict__ src,
                                              size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) stf(work + i, src[i]);
}

extern "C" void mal_cu_adamw(mal_cu_stream s, int use_bf16, float *param, void *work,
                             const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float grad_scale,
                             float ibc1, float ibc2)
{
    if (!n) return;
    const int vec4 = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v);
    const unsigned blocks = mal_blocks(n, 1024);
    if (use_bf16)
        MAL_LAUNCH((adamw_k<__nv_bfloat16>), blocks, 256, 0, s)
        (param, (__nv_bfloat16 *)work, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
         grad_scale, ibc1, ibc2, vec4);
    else
        MAL_LAUNCH((adamw_k<float>), blocks, 256, 0, s)
        (param, (float *)work, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, ibc1,
         ibc2, vec4);
}

extern "C" void mal_cu_cast(mal_cu_stream s, int use_bf16, void *work, const float *master, size_t n)
{
    if (!n || !work || work == (const void *)master) return;
    if (use_bf16)
        MAL_LAUNCH((cast_k<__nv_bfloat16>), mal_blocks(n, 256), 256, 0, s)
        ((__nv_bfloat16 *)work, master, n);
    else
        MAL_LAUNCH((cast_k<float>), mal_blocks(n, 256), 256, 0, s)((float *)work, master, n);
}
