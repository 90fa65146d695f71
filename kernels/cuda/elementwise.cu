/* The element-wise sums of the CUDA backend (mal_cu_add, mal_cu_accumulate,
 * mal_cu_scale; contracts: kernels.h and cuda_ops.h), in chunks of ew_width
 * (common.cuh), and the zeroing of several buffers in one launch
 * (mal_cu_zero_multi).  Conventions of every kernel family: common.cuh. */
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

/* ---- several buffers zeroed in one launch ------------------------------ */

enum { ZERO_CHUNK = 16384 }; /* bytes per block: 256 threads x 4 x 16 */

/* The buffers of one launch (kernel parameters, under 4 KiB): buffer j
 * covers blocks [first[j], first[j + 1]), ZERO_CHUNK bytes each. */
struct zero_table {
    unsigned char *p[MAL_CU_ZERO_MT];
    unsigned long long n[MAL_CU_ZERO_MT];
    unsigned first[MAL_CU_ZERO_MT + 1];
    int count;
};

/* A block's chunk: 16-byte stores from the first 16-byte boundary, single
 * bytes before it and after the last one. */
__global__ void __launch_bounds__(256) zero_multi_k(MAL_GRID_CONST zero_table tab)
{
    int lo = 0, hi = tab.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tab.first[mid] <= blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    unsigned char *p = tab.p[lo];
    const size_t c0 = (size_t)(blockIdx.x - tab.first[lo]) * ZERO_CHUNK;
    const size_t len = tab.n[lo] - c0 < ZERO_CHUNK ? tab.n[lo] - c0 : ZERO_CHUNK;
    unsigned char *q = p + c0;
    size_t head = (16 - ((uintptr_t)q & 15)) & 15;
    if (head > len) head = len;
    const size_t body = (len - head) & ~(size_t)15, tail = len - head - body;
    if (threadIdx.x < head) q[threadIdx.x] = 0;
    uint4 *v = (uint4 *)(q + head);
    const uint4 z = make_uint4(0, 0, 0, 0);
    for (size_t k = threadIdx.x; k < body / 16; k += blockDim.x) v[k] = z;
    if (threadIdx.x < tail) q[head + body + threadIdx.x] = 0;
}

extern "C" int mal_cu_zero_multi(mal_cu_stream s, void *const *bufs, const size_t *bytes, int count)
{
    const unsigned long long max_blocks = 0x7fffffffull; /* the grid's x limit */
    zero_table tab;
    int launches = 0, i = 0;
    while (i < count) {
        unsigned long long blocks = 0;
        tab.count = 0;
        for (; i < count && tab.count < MAL_CU_ZERO_MT; i++) {
            if (!bytes[i]) continue;
            const unsigned long long nb = (bytes[i] + ZERO_CHUNK - 1) / ZERO_CHUNK;
            if (tab.count && blocks + nb > max_blocks) break;
            tab.p[tab.count] = (unsigned char *)bufs[i];
            tab.n[tab.count] = bytes[i];
            tab.first[tab.count] = (unsigned)blocks;
            blocks += nb;
            tab.count++;
        }
        if (!tab.count) break;
        if (blocks > max_blocks) blocks = max_blocks; /* one buffer of over 32 TiB */
        tab.first[tab.count] = (unsigned)blocks;
        MAL_LAUNCH(zero_multi_k, (unsigned)blocks, 256, 0, s)(tab);
        launches++;
    }
    return launches;
}
