/* RoPE of the CUDA backend, forward and backward in one kernel (dir +1 or
 * -1; mal_cu_rope, contracts: kernels.h and cuda_ops.h).  The cos/sin table
 * is built on the host, as the CPU backend builds it (cuda.c).  Conventions
 * of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

/* Thread i rotates the VN consecutive elements i*VN.. of x (B,T,H,hd): VN
 * is even and divides hd, so they are VN/2 whole pairs of one head of one
 * position t.  (x0, x1) -> (x0 c - x1 s', x0 s' + x1 c), s' = dir * s. */
template <typename T, int VN>
__global__ void __launch_bounds__(256) rope_k(T *__restrict__ x, const float *__restrict__ cs,
                                              size_t n_chunks, int T_, int H, int hd, float dir)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_chunks) return;
    const size_t e0 = i * VN;
    const size_t token = e0 / ((size_t)H * hd);
    const int t = (int)(token % (size_t)T_);
    const int p0 = (int)(e0 % (size_t)hd) / 2; /* first pair */
    const int h2 = hd / 2;
    const float *c = cs + (size_t)t * h2 + p0;
    const float *sn = cs + (size_t)T_ * h2 + (size_t)t * h2 + p0;
    float a[VN];
    if (VN * sizeof(T) == 16) {
        load16(a, x + e0);
    } else {
#pragma unroll
        for (int j = 0; j < VN; j++) a[j] = ldf(x + e0 + j);
    }
#pragma unroll
    for (int j = 0; j < VN / 2; j++) {
        const float x0 = a[2 * j], x1 = a[2 * j + 1], si = dir * sn[j], co = c[j];
        a[2 * j] = x0 * co - x1 * si;
        a[2 * j + 1] = x0 * si + x1 * co;
    }
    if (VN * sizeof(T) == 16) {
        store16(x + e0, a);
    } else {
#pragma unroll
        for (int j = 0; j < VN; j++) stf(x + e0 + j, a[j]);
    }
}

template <typename T>
static void rope(mal_cu_stream s, void *x, const float *cs, int B, int T_, int H, int hd, float dir)
{
    const size_t n = (size_t)B * T_ * H * hd;
    const int VN = vec<T>::n;
    if (hd % VN == 0 && aligned16(x)) {
        MAL_LAUNCH((rope_k<T, vec<T>::n>), mal_blocks(n / VN, 256), 256, 0, s)
        ((T *)x, cs, n / VN, T_, H, hd, dir);
    } else {
        MAL_LAUNCH((rope_k<T, 2>), mal_blocks(n / 2, 256), 256, 0, s)
        ((T *)x, cs, n / 2, T_, H, hd, dir);
    }
}

extern "C" void mal_cu_rope(mal_cu_stream s, int use_bf16, void *x, const float *cs, int B, int T,
                            int H, int hd, float dir)
{
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0 || hd % 2) return;
    if (use_bf16)
        rope<__nv_bfloat16>(s, x, cs, B, T, H, hd, dir);
    else
        rope<float>(s, x, cs, B, T, H, hd, dir);
}
