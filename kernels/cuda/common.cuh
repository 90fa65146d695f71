/* Device-side helpers shared by the CUDA kernels (the .cu files of kernels/cuda), written
 * so that the same kernel source compiles two ways:
 *   - by nvcc, for the GPU (the build of the CUDA backend);
 *   - by a host C++ compiler with MAL_CUDA_EMU defined, against
 *     kernels/cuda/emu.h, which runs each block's threads as fibers on the
 *     CPU.  tests/test_cuda_emu.cpp uses that to check the kernels' indexing,
 *     tile edges, fragment layouts and barriers against float64 references
 *     on a machine without a GPU.
 * Kernels therefore launch through MAL_LAUNCH, take dynamic shared memory
 * through MAL_SMEM, use the matrix instruction only through mma_bf16_16816
 * and read warp neighbours only through the shuffles below.
 *
 * The kernel families, one .cu each with its forward and backward
 * (launchers: cuda_ops.h; contracts: kernels.h):
 *   rmsnorm.cu      RMSNorm
 *   rope.cu         RoPE
 *   swiglu.cu       SwiGLU
 *   elementwise.cu  add, accumulate, scale
 *   sumsq.cu        the sum of squares (global gradient norm), in double
 *   embedding.cu    embedding
 *   xent.cu         cross-entropy fused with its gradient, and its
 *                   vocabulary-parallel form (statistics, combination)
 *   adamw.cu        AdamW and the working-copy cast
 *   attention.cu    causal attention, flash style (its own notes at its top)
 *   slow.cu         the straggler emulation's busy kernel (GPU only)
 * NOTHING IN THEM HAS RUN ON A GPU YET; the logic is checked on the CPU
 * through the emulation (tests/test_cuda_emu.cpp).
 *
 * In rmsnorm.cu to adamw.cu, every kernel is a template over the compute
 * dtype T (float or bf16) and computes in fp32.  The arithmetic follows
 * kernels/cpu.c operation by operation (the same expressions in the same
 * order), so the fp32 mode is the CPU backend's up to summation order, FMA
 * contraction and the exponential's last bit.  Memory-bound kernels move
 * 16 bytes per access where the shapes allow (a row length that is a
 * multiple of 16 bytes and 16-byte aligned buffers, which the model's
 * buffers are) and fall back to scalar accesses otherwise.  Reductions over
 * rows (RMSNorm's weight gradient, the squared norm, the embedding
 * gradient) go through fixed partitions and a second pass in a fixed
 * order: deterministic, no atomics on floats. */
#ifndef MAL_CUDA_COMMON_CUH
#define MAL_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

#ifdef MAL_CUDA_EMU
#include "emu.h"
#define MAL_LAUNCH(kern, grid, block, smem, stream) emu::bind((kern), (grid), (block), (smem))
#define MAL_SMEM(name) unsigned char *name = emu::smem()
#define MAL_DEV static inline
#define MAL_GRID_CONST const
#else
#include <cuda_runtime.h>
#define MAL_LAUNCH(kern, grid, block, smem, stream) (kern)<<<(grid), (block), (smem), (stream)>>>
#define MAL_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define MAL_DEV static __device__ __forceinline__
/* A kernel parameter read in place, indexed at run time (the multi-tensor
 * tables): without it the compiler may copy the whole struct to local
 * memory in every thread. */
#define MAL_GRID_CONST const __grid_constant__
#endif

typedef __nv_bfloat16 bf16;

/* ---- element conversions (compute dtype T: float or bf16) ------------- */

MAL_DEV float ldf(const float *p) { return *p; }
MAL_DEV float ldf(const bf16 *p) { return __bfloat162float(*p); }
MAL_DEV void stf(float *p, float x) { *p = x; }
MAL_DEV void stf(bf16 *p, float x) { *p = __float2bfloat16_rn(x); }

/* ---- vectors of 16 bytes: 4 floats or 8 bf16 -------------------------- */

/* Elements of T in one 16-byte access. */
template <typename T> struct vec {
    static const int n = 16 / (int)sizeof(T);
};

/* Vector accesses: V (uint4, float4, uint32_t, ...) at p, which must be
 * aligned to sizeof(V) (the emulation checks it; the GPU faults). */
template <typename V> MAL_DEV V ldv(const void *p)
{
#ifdef MAL_CUDA_EMU
    emu::check_aligned(p, sizeof(V), "vector load");
    V v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return *(const V *)p;
#endif
}
template <typename V> MAL_DEV void stv(void *p, V v)
{
#ifdef MAL_CUDA_EMU
    emu::check_aligned(p, sizeof(V), "vector store");
    memcpy(p, &v, sizeof v);
#else
    *(V *)p = v;
#endif
}

/* Load / store 16 bytes at p (16-byte aligned) as floats. */
MAL_DEV void load16(float out[4], const float *p)
{
    float4 v = ldv<float4>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}
MAL_DEV void load16(float out[8], const bf16 *p)
{
    uint4 v = ldv<uint4>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 h;
        memcpy(&h, &w[i], 4);
        float2 f = __bfloat1622float2(h);
        out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
}
MAL_DEV void store16(float *p, const float in[4])
{
    stv(p, make_float4(in[0], in[1], in[2], in[3]));
}
MAL_DEV void store16(bf16 *p, const float in[8])
{
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
        memcpy(&w[i], &h, 4);
    }
    stv(p, make_uint4(w[0], w[1], w[2], w[3]));
}

/* Two bf16 packed in 32 bits (the low half is the first element), the
 * operand format of the matrix instruction. */
MAL_DEV uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
}

/* ---- warp reductions (all 32 lanes take part) ------------------------ */

MAL_DEV float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
MAL_DEV double warp_sum_d(double x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
MAL_DEV float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* ---- the bf16 matrix instruction ------------------------------------- */

/* D (16x8, fp32) = A (16x16, bf16, row) x B (16x8, bf16, col) + C, one warp.
 * Fragments (PTX ISA, mma.m16n8k16 with .bf16), g = lane / 4, c = lane % 4:
 *   a[0] = A[g][2c, 2c+1]    a[1] = A[g+8][2c, 2c+1]
 *   a[2] = A[g][2c+8, +9]    a[3] = A[g+8][2c+8, +9]
 *   b[0] = B[2c, 2c+1][g]    b[1] = B[2c+8, 2c+9][g]
 *   d[0], d[1] = D[g][2c, 2c+1]    d[2], d[3] = D[g+8][2c, 2c+1]
 * (each 32-bit register holds two bf16, the lower index in the low half). */
MAL_DEV void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef MAL_CUDA_EMU
    emu::mma_bf16_16816(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    /* Built only for sm_80 and newer (configure's NVCC_ARCH_FLAGS); the
     * launchers never select the tensor-core kernels elsewhere. */
    __trap();
#endif
}

/* ---- tiles in shared memory: asynchronous copies and ldmatrix -------- */

/* The shared-memory address of p (the operand form of cp.async and
 * ldmatrix). */
#ifndef MAL_CUDA_EMU
MAL_DEV uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}
#endif

/* 16 bytes from global src to shared dst without passing through
 * registers (cp.async.cg, sm_80+): `bytes` (16 or 0) are read from src, the
 * rest of the 16 is zero -- a row past the end of a tile, or the columns
 * past the head dimension, cost no branch.  The copy lands once its thread
 * has committed its group and waited for it (cp_async_wait); other
 * threads see it after a barrier that follows that wait. */
MAL_DEV void cp_async16(void *dst, const void *src, int bytes)
{
#ifdef MAL_CUDA_EMU
    emu::cp_async16(dst, src, bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
}
/* Close this thread's group of copies issued since the last commit. */
MAL_DEV void cp_async_commit()
{
#ifdef MAL_CUDA_EMU
    emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* Wait until at most N of this thread's committed groups are in flight
 * (the older ones have landed). */
template <int N> MAL_DEV void cp_async_wait()
{
#ifdef MAL_CUDA_EMU
    emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Four 8 x 8 bf16 matrices from shared memory into fragments, one warp
 * (ldmatrix.x4): lane 8 i + j passes the address of row j of matrix i (16
 * bytes, 16-byte aligned); lane l gets in r[i] elements (l/4, 2(l%4)) and
 * (l/4, 2(l%4)+1) of matrix i -- with TRANS, of its transpose.  So the A
 * fragment of mma (16 x 16, row-major tile) is one ldmatrix.x4, and two B
 * fragments (16 x 8 each) are one ldmatrix.x4 from a tile that holds B's
 * columns as rows (no TRANS) or B's rows as rows (TRANS).  The layouts are
 * the PTX ISA's (warp-level matrix load instruction: ldmatrix); the
 * emulation implements them from that text. */
template <bool TRANS> MAL_DEV void ldmatrix_x4(uint32_t r[4], const void *row_addr)
{
#ifdef MAL_CUDA_EMU
    emu::ldmatrix(r, 4, TRANS, row_addr);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_u32(row_addr)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_u32(row_addr)));
#else
    __trap();
#endif
}

/* ---- launch shapes ---------------------------------------------------- */

static inline unsigned mal_blocks(size_t n, unsigned per_block)
{
    size_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b > 0x7fffffffu ? 0x7fffffffu : (b ? b : 1));
}

/* ---- access width (host side, for the launchers) ---------------------- */

static inline bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* A row of C elements can go 16 bytes at a time in all three buffers. */
template <typename T> static bool vec_ok(const void *a, const void *b, const void *c, int C)
{
    return C % vec<T>::n == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

/* The chunk width of an element-wise launch (swiglu.cu, elementwise.cu):
 * 16 bytes when every buffer is 16-byte aligned, else 1 element.  The
 * kernels take chunks of that many elements, and a last, partial chunk
 * element by element. */
template <typename T> static int ew_width(const void *a, const void *b, const void *c,
                                          const void *d = 0, const void *e = 0)
{
    bool ok = aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d) && aligned16(e);
    return ok ? vec<T>::n : 1;
}

#endif /* MAL_CUDA_COMMON_CUH */
