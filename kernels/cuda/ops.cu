/* The CUDA backend's kernels other than attention and the matrix products:
 * RMSNorm, RoPE, SwiGLU, element-wise sums, the squared-norm reduction,
 * embedding, cross-entropy, AdamW and the working-copy cast.  Contracts:
 * kernels.h and cuda_ops.h.  NOTHING HERE HAS RUN ON A GPU YET; the logic
 * is checked on the CPU through the emulation (tests/test_cuda_emu.cpp).
 *
 * Every kernel is a template over the compute dtype T (float or bf16) and
 * computes in fp32.  The arithmetic follows kernels/cpu.c operation by
 * operation (the same expressions in the same order), so the fp32 mode is
 * the CPU backend's up to summation order, FMA contraction and the
 * exponential's last bit.  Memory-bound kernels move 16 bytes per access
 * where the shapes allow (a row length that is a multiple of 16 bytes and
 * 16-byte aligned buffers, which the model's buffers are) and fall back to
 * scalar accesses otherwise.  Reductions over rows (RMSNorm's weight
 * gradient, the squared norm, the embedding gradient) go through fixed
 * partitions and a second pass in a fixed order: deterministic, no atomics
 * on floats. */
#include "common.cuh"
#include "cuda_ops.h"

#include <math.h>

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* ======================================================================== */
/* RMSNorm                                                                  */

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

template <typename T> static bool vec_ok(const void *a, const void *b, const void *c, int C)
{
    return C % vec<T>::n == 0 && aligned16(a) && aligned16(b) && aligned16(c);
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

/* ======================================================================== */
/* RoPE                                                                     */

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

/* ======================================================================== */
/* Element-wise                                                             */

/* Element-wise kernels work on chunks of VN elements; the last, partial
 * chunk (and everything, when a buffer is not 16-byte aligned) element by
 * element.  `f` is called as f(j_in_chunk_count, float arrays...). */

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

/* The chunk width of an element-wise launch: 16 bytes when every buffer is
 * 16-byte aligned, else 1 element. */
template <typename T> static int ew_width(const void *a, const void *b, const void *c,
                                          const void *d = 0, const void *e = 0)
{
    bool ok = aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d) && aligned16(e);
    return ok ? vec<T>::n : 1;
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

/* ======================================================================== */
/* Sum of squares (global gradient norm), in double                         */

enum { SUMSQ_BLOCKS = 264, SUMSQ_THREADS = 256 };

/* Block b sums elements e = b * THREADS + t + k * BLOCKS * THREADS of the
 * rows x width view (row r = e / width at r * pitch), tree-reduces in a
 * fixed order, and writes partial[b]. */
__global__ void __launch_bounds__(SUMSQ_THREADS)
    sumsq_k(double *__restrict__ partial, const float *__restrict__ x, size_t rows, size_t width,
            size_t pitch)
{
    MAL_SMEM(smem);
    double *red = (double *)smem;
    const size_t total = rows * width, step = (size_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    if (rows == 1 || pitch == width) {
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step)
            acc += (double)x[e] * x[e];
    } else {
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
            const float v = x[(e / width) * pitch + e % width];
            acc += (double)v * v;
        }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

/* acc[0] += sum of partial[0 .. n) in order (one thread: n is small). */
__global__ void sumsq_final_k(double *acc, const double *partial, int n)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += partial[i];
    acc[0] += s;
}

extern "C" size_t mal_cu_sumsq_scratch_bytes(void)
{
    return SUMSQ_BLOCKS * sizeof(double);
}

extern "C" void mal_cu_sumsq(mal_cu_stream s, double *acc, const float *x, size_t rows,
                             size_t width, size_t pitch, void *scratch)
{
    if (!rows || !width) return;
    double *partial = (double *)scratch;
    MAL_LAUNCH(sumsq_k, SUMSQ_BLOCKS, SUMSQ_THREADS, SUMSQ_THREADS * sizeof(double), s)
    (partial, x, rows, width, pitch);
    MAL_LAUNCH(sumsq_final_k, 1, 32, 0, s)(acc, (const double *)partial, (int)SUMSQ_BLOCKS);
}

/* ======================================================================== */
/* Embedding                                                                */

/* One warp per token: out[n] = wte[tokens[n]] (16 bytes per access where
 * rows are whole vectors); a token outside [0, V) gives a zero row and
 * sets MAL_CU_ERR_TOKEN. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) embedding_fwd_k(T *__restrict__ out,
                                                       const int *__restrict__ tokens,
                                                       const T *__restrict__ wte, int N, int C,
                                                       int V, int *err)
{
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const int tok = tokens[n];
    T *o = out + (size_t)n * C;
    if (tok < 0 || tok >= V) {
        if (lane == 0) *err |= MAL_CU_ERR_TOKEN; /* every writer stores a superset bit */
        for (int c = lane; c < C; c += 32) stf(o + c, 0.0f);
        return;
    }
    const T *w = wte + (size_t)tok * C;
    if (VEC)
        for (int c = lane * vec<T>::n; c < C; c += 32 * vec<T>::n)
            *(uint4 *)(o + c) = *(const uint4 *)(w + c);
    else
        for (int c = lane; c < C; c += 32) o[c] = w[c];
}

/* Stable counting sort of positions by token, then one warp per vocabulary
 * row adds that row's gradients in position order.  Integer atomics only
 * (a histogram: its result does not depend on their order). */
__global__ void emb_hist_k(int *__restrict__ count, const int *__restrict__ tokens, int N, int V)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int t = tokens[n];
    if (t >= 0 && t < V) atomicAdd(&count[t], 1);
}

/* Exclusive prefix sum of count (V) into start (V), one block of 1024
 * threads: each thread scans a contiguous chunk, the chunk totals are
 * scanned in shared memory, then added back. */
__global__ void __launch_bounds__(1024)
    emb_scan_k(int *__restrict__ start, const int *__restrict__ count, int V)
{
    MAL_SMEM(smem);
    int *tot = (int *)smem; /* [blockDim.x] */
    const int per = (V + blockDim.x - 1) / blockDim.x;
    const int b = threadIdx.x * per, e = min(b + per, V);
    int s = 0;
    for (int i = b; i < e; i++) s += count[i];
    tot[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int i = 0; i < (int)blockDim.x; i++) {
            const int t = tot[i];
            tot[i] = run;
            run += t;
        }
    }
    __syncthreads();
    int run = tot[threadIdx.x];
    for (int i = b; i < e; i++) {
        start[i] = run;
        run += count[i];
    }
}

/* order[start[t] + #{m < n : tokens[m] == t}] = n for t = tokens[n]: the
 * rank among equal tokens counted over tiles of the token array in shared
 * memory (N^2 / 2 integer compares: 0.13 G at N = 16 k, microseconds). */
__global__ void __launch_bounds__(256)
    emb_place_k(int *__restrict__ order, const int *__restrict__ start,
                const int *__restrict__ tokens, int N, int V)
{
    MAL_SMEM(smem);
    int *tile = (int *)smem; /* [blockDim.x] */
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = n < N ? tokens[n] : -1;
    int rank = 0;
    const int last = min(N, (int)((blockIdx.x + 1) * blockDim.x)); /* positions < last matter */
    for (int base = 0; base < last; base += blockDim.x) {
        __syncthreads();
        const int m = base + threadIdx.x;
        tile[threadIdx.x] = m < N ? tokens[m] : -1;
        __syncthreads();
        const int lim = min((int)blockDim.x, n - base); /* m < n */
        for (int j = 0; j < lim; j++) rank += tile[j] == t;
    }
    if (n < N && t >= 0 && t < V) order[start[t] + rank] = n;
}

/* One warp per vocabulary row v (skipped when no position has it):
 * dwte[v] += dout[order[j]] for j over v's positions in order, added one
 * position at a time onto dwte[v] itself, as the CPU backend does. */
template <typename T>
__global__ void __launch_bounds__(256)
    emb_acc_k(float *__restrict__ dwte, const T *__restrict__ dout, const int *__restrict__ order,
              const int *__restrict__ start, const int *__restrict__ count, int C, int V)
{
    const int lane = threadIdx.x % 32;
    const int v = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (v >= V) return;
    const int cnt = count[v];
    if (!cnt) return;
    const int *pos = order + start[v];
    float *row = dwte + (size_t)v * C;
    for (int c = lane; c < C; c += 32) {
        float acc = row[c];
        for (int j = 0; j < cnt; j++) acc += ldf(dout + (size_t)pos[j] * C + c);
        row[c] = acc;
    }
}

template <typename T>
static void embedding_fwd(mal_cu_stream s, void *out, const int *tokens, const void *wte, int N,
                          int C, int V, int *err)
{
    if (vec_ok<T>(out, wte, out, C))
        MAL_LAUNCH((embedding_fwd_k<T, true>), mal_blocks((size_t)N, 8), 256, 0, s)
        ((T *)out, tokens, (const T *)wte, N, C, V, err);
    else
        MAL_LAUNCH((embedding_fwd_k<T, false>), mal_blocks((size_t)N, 8), 256, 0, s)
        ((T *)out, tokens, (const T *)wte, N, C, V, err);
}

extern "C" void mal_cu_embedding_fwd(mal_cu_stream s, int use_bf16, void *out, const int *tokens,
                                     const void *wte, int N, int C, int V, int *err)
{
    if (N <= 0 || C <= 0) return;
    if (use_bf16)
        embedding_fwd<__nv_bfloat16>(s, out, tokens, wte, N, C, V, err);
    else
        embedding_fwd<float>(s, out, tokens, wte, N, C, V, err);
}

static size_t up16(size_t b)
{
    return (b + 15) & ~(size_t)15;
}

extern "C" size_t mal_cu_embedding_bwd_scratch_bytes(int N, int V)
{
    return 2 * up16((size_t)V * sizeof(int)) + up16((size_t)N * sizeof(int));
}

extern "C" void mal_cu_embedding_bwd(mal_cu_stream s, int use_bf16, float *dwte, const void *dout,
                                     const int *tokens, int N, int C, int V, void *scratch)
{
    if (N <= 0 || C <= 0 || V <= 0) return;
    char *p = (char *)scratch;
    int *count = (int *)p;
    int *start = (int *)(p + up16((size_t)V * sizeof(int)));
    int *order = (int *)(p + 2 * up16((size_t)V * sizeof(int)));
#ifdef MAL_CUDA_EMU
    memset(count, 0, (size_t)V * sizeof(int));
#else
    cudaMemsetAsync(count, 0, (size_t)V * sizeof(int), s);
#endif
    MAL_LAUNCH(emb_hist_k, mal_blocks((size_t)N, 256), 256, 0, s)(count, tokens, N, V);
    MAL_LAUNCH(emb_scan_k, 1, 1024, 1024 * sizeof(int), s)(start, (const int *)count, V);
    MAL_LAUNCH(emb_place_k, mal_blocks((size_t)N, 256), 256, 256 * sizeof(int), s)
    (order, (const int *)start, tokens, N, V);
    if (use_bf16)
        MAL_LAUNCH((emb_acc_k<__nv_bfloat16>), mal_blocks((size_t)V, 8), 256, 0, s)
        (dwte, (const __nv_bfloat16 *)dout, (const int *)order, (const int *)start,
         (const int *)count, C, V);
    else
        MAL_LAUNCH((emb_acc_k<float>), mal_blocks((size_t)V, 8), 256, 0, s)
        (dwte, (const float *)dout, (const int *)order, (const int *)start, (const int *)count, C,
         V);
}

/* ======================================================================== */
/* Cross-entropy fused with its gradient                                    */

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
    if (!d) return;
    const float f = dscale / S;
    for (int i = threadIdx.x * VN; i < V; i += blockDim.x * VN) {
        if (VN > 1) {
            float a[VN];
            load16(a, x + i);
#pragma unroll
            for (int j = 0; j < VN; j++) a[j] = expf(a[j] - M) * f - (i + j == tgt ? dscale : 0.0f);
            store16(d + i, a);
        } else {
            float g = expf(ldf(x + i) - M) * f;
            if (i == tgt) g -= dscale;
            stf(d + i, g);
        }
    }
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

/* ======================================================================== */
/* AdamW and the working copy                                               */

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
