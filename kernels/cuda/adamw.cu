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

/* Elements [i0, i0 + 4) of an n-element slab, 16-byte accesses where the
 * slab is aligned (vec4: it is; tensors start at 16-float offsets) and
 * the chunk is whole; work[i] = param[i] in T when work is given.  The
 * partial chunk goes element by element without arrays (a loop bound
 * known only at run time would put arrays in local memory: seen in the
 * SASS of a first version). */
template <typename T>
MAL_DEV void adamw_chunk(float *__restrict__ param, T *__restrict__ work,
                         const float *__restrict__ grad, float *__restrict__ m,
                         float *__restrict__ v, size_t n, size_t i0, float lr, float beta1,
                         float beta2, float eps, float wd, float gs, float ibc1, float ibc2,
                         int vec4)
{
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

/* 4 elements per thread, 256 threads: 1024 elements per block. */
enum { ADAMW_PER_BLOCK = 1024 };

template <typename T>
__global__ void __launch_bounds__(256)
    adamw_k(float *__restrict__ param, T *__restrict__ work, const float *__restrict__ grad,
            float *__restrict__ m, float *__restrict__ v, size_t n, float lr, float beta1,
            float beta2, float eps, float wd, float gs, float ibc1, float ibc2, int vec4)
{
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    adamw_chunk(param, work, grad, m, v, n, i0, lr, beta1, beta2, eps, wd, gs, ibc1, ibc2, vec4);
}

/* The spans of one multi-tensor launch (kernel parameters, under the 4 KiB
 * that every CUDA version takes): span j covers blocks [first[j],
 * first[j + 1]) of the grid, each of them adamw_k's block of the span. */
struct adamw_table {
    unsigned long long off[MAL_CU_ADAMW_MT], n[MAL_CU_ADAMW_MT];
    float wd[MAL_CU_ADAMW_MT];
    unsigned first[MAL_CU_ADAMW_MT + 1];
    unsigned char vec4[MAL_CU_ADAMW_MT];
    int count;
};

template <typename T>
/* (256, 4): without the minimum, ptxas spilled 12 bytes in the fp32
 * instance at 38 registers (-Xptxas -v, CUDA 13) */
__global__ void __launch_bounds__(256, 4)
    adamw_multi_k(MAL_GRID_CONST adamw_table tab, float *__restrict__ param, T *__restrict__ work,
                  const float *__restrict__ grad, float *__restrict__ m, float *__restrict__ v,
                  float lr, float beta1, float beta2, float eps, float gs, float ibc1, float ibc2)
{
    /* the span of this block: the last j with first[j] <= blockIdx.x */
    int lo = 0, hi = tab.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tab.first[mid] <= blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const size_t off = tab.off[lo], n = tab.n[lo];
    const float wd = tab.wd[lo];
    const int vec4 = tab.vec4[lo];
    const size_t i0 = ((size_t)(blockIdx.x - tab.first[lo]) * blockDim.x + threadIdx.x) * 4;
    adamw_chunk(param + off, work ? work + off : work, grad + off, m + off, v + off, n, i0, lr,
                beta1, beta2, eps, wd, gs, ibc1, ibc2, vec4);
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
    const unsigned blocks = mal_blocks(n, ADAMW_PER_BLOCK);
    if (use_bf16)
        MAL_LAUNCH((adamw_k<__nv_bfloat16>), blocks, 256, 0, s)
        (param, (__nv_bfloat16 *)work, grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
         grad_scale, ibc1, ibc2, vec4);
    else
        MAL_LAUNCH((adamw_k<float>), blocks, 256, 0, s)
        (param, (float *)work, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, ibc1,
         ibc2, vec4);
}

static unsigned long long adamw_blocks(unsigned long long n)
{
    return (n + ADAMW_PER_BLOCK - 1) / ADAMW_PER_BLOCK;
}

extern "C" int mal_cu_adamw_multi(mal_cu_stream s, int use_bf16, float *param, void *work,
                                  const float *grad, float *m, float *v, const mal_cu_span *spans,
                                  int count, float lr, float beta1, float beta2, float eps,
                                  float grad_scale, float ibc1, float ibc2)
{
    const unsigned long long max_blocks = 0x7fffffffull; /* the grid's x limit */
    adamw_table tab;
    int launches = 0, i = 0;
    while (i < count) {
        /* One table: spans that touch and share a weight decay become one
         * (the arithmetic is per element: the same bits, fewer entries). */
        tab.count = 0;
        for (; i < count; i++) {
            const mal_cu_span *sp = &spans[i];
            const int c = tab.count;
            if (!sp->n) continue;
            if (c && tab.off[c - 1] + tab.n[c - 1] == sp->off &&
                tab.wd[c - 1] == sp->weight_decay &&
                tab.first[c - 1] + adamw_blocks(tab.n[c - 1] + sp->n) <= max_blocks) {
                tab.n[c - 1] += sp->n;
                continue;
            }
            const unsigned long long start = c ? tab.first[c - 1] + adamw_blocks(tab.n[c - 1]) : 0;
            if (c == MAL_CU_ADAMW_MT || (c && start + adamw_blocks(sp->n) > max_blocks)) break;
            tab.off[c] = sp->off, tab.n[c] = sp->n, tab.wd[c] = sp->weight_decay;
            tab.first[c] = (unsigned)start;
            tab.count = c + 1;
        }
        if (!tab.count) break; /* only empty spans were left */
        const int c = tab.count;
        unsigned long long blocks = tab.first[c - 1] + adamw_blocks(tab.n[c - 1]);
        if (blocks > max_blocks) blocks = max_blocks; /* one span of over 2^41 elements */
        tab.first[c] = (unsigned)blocks;
        for (int j = 0; j < c; j++) {
            const size_t o = tab.off[j];
            tab.vec4[j] = aligned16(param + o) && aligned16(grad + o) && aligned16(m + o) &&
                          aligned16(v + o);
        }
        if (use_bf16)
            MAL_LAUNCH((adamw_multi_k<__nv_bfloat16>), (unsigned)blocks, 256, 0, s)
            (tab, param, (__nv_bfloat16 *)work, grad, m, v, lr, beta1, beta2, eps, grad_scale, ibc1,
             ibc2);
        else
            MAL_LAUNCH((adamw_multi_k<float>), (unsigned)blocks, 256, 0, s)
            (tab, param, (float *)work, grad, m, v, lr, beta1, beta2, eps, grad_scale, ibc1, ibc2);
        launches++;
    }
    return launches;
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
