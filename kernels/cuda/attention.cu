/* Causal self-attention for the CUDA backend, flash style: the T x T scores
 * are never stored; the forward keeps one log-sum-exp per query (lse), the
 * backward recomputes the probabilities.  NOTHING HERE HAS RUN ON A GPU
 * YET; the kernels are checked on the CPU through the emulation
 * (tests/test_cuda_emu.cpp) against a float64 reference.
 *
 * Shapes (kernels.h): q, out, dq are (B,T,H,hd) row-major, so the (T,hd)
 * slice of query head h of sequence b starts at (b*T*H + h)*hd with a row
 * stride of ld = H*hd; k, v, dk, dv are (B,T,Hkv,hd) (grouped-query
 * attention: query head h reads key/value head j = (h + q_off) / group,
 * whose slice starts at (b*T*Hkv + j)*hd, row stride ldk = Hkv*hd).  lse is
 * (B,H,T) floats, natural log:
 *   lse[t] = log sum_{s<=t} exp(q_t . k_s / sqrt(hd)),  P[t][s] = exp(S - lse).
 * dK, dV of a key/value head gather the contributions of its query heads
 * in query-head order inside one block or warp (no atomics).
 *
 * Two implementations behind mal_cu_attention_fwd/bwd:
 *   generic - one warp per query (forward, dQ) or key (dK, dV) row, fp32
 *             arithmetic, any even hd up to 256, float or bf16 storage.  The
 *             fp32 mode's kernels (the CPU oracle's arithmetic up to
 *             summation order) and the fallback for other head sizes.
 *   mma     - bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation),
 *             hd a multiple of 8 up to 128 (tiles 64 or 128 wide):
 *             FlashAttention-2's forward (a warp owns 16 queries, online
 *             softmax in registers, P reused from the accumulators as the
 *             A operand of P V) and a deterministic backward in two
 *             kernels -- dK/dV with a block per key tile looping over
 *             queries (warp pairs: one P and dV, the other dS and dK), dQ
 *             with a block per query tile looping over keys -- so no float
 *             atomics (FlashAttention-2 adds dQ with atomics, whose order
 *             varies).  The price: S and dP are computed in both kernels
 *             (7 products of T x T x hd per head instead of 5).  Tiles are
 *             row-major in shared memory, double-buffered through cp.async,
 *             read through ldmatrix (notes before tile_async).
 * Other head dimensions are refused (mal_cu_attention_supported).
 * Why written here and not cuDNN's fused SDPA: bench/gpu/NOTES.md
 * ("Attention: written here or cuDNN"). */
#include "common.cuh"
#include "cuda_ops.h"

#include <math.h>

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* ======================================================================== */
/* Generic kernels                                                          */

enum { GEN_MAXJ = 8 }; /* hd <= 32 * 8 */

/* One warp per query row (b, h, t): online softmax over s <= t; lane owns
 * elements d = lane + 32 j. */
/* Where query head h of sequence b and its key/value head start, and the
 * row strides (queries, keys). */
struct heads_at {
    size_t ld, ldk, base, kbase;
};
MAL_DEV heads_at heads_of(const mal_cu_heads &hs, int b, int h, int T_, int hd)
{
    heads_at a;
    a.ld = (size_t)hs.H * hd;
    a.ldk = (size_t)hs.Hkv * hd;
    a.base = (size_t)b * T_ * a.ld + (size_t)h * hd;
    a.kbase = (size_t)b * T_ * a.ldk + (size_t)((h + hs.q_off) / hs.group) * hd;
    return a;
}

template <typename T>
__global__ void __launch_bounds__(128)
    gen_fwd_k(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ q,
              const T *__restrict__ k, const T *__restrict__ v, int B, int T_, mal_cu_heads hs,
              int hd)
{
    const int lane = threadIdx.x % 32, H = hs.H;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (long)B * H * T_) return;
    const int t = (int)(row % T_), h = (int)((row / T_) % H), b = (int)(row / ((long)T_ * H));
    const heads_at at = heads_of(hs, b, h, T_, hd);
    const size_t ld = at.ld, ldk = at.ldk, base = at.base, kbase = at.kbase;
    const float scale = 1.0f / sqrtf((float)hd);
    float qr[GEN_MAXJ], o[GEN_MAXJ];
#pragma unroll
    for (int j = 0; j < GEN_MAXJ; j++) {
        const int d = lane + 32 * j;
        qr[j] = d < hd ? ldf(q + base + (size_t)t * ld + d) : 0.0f;
        o[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int s = 0; s <= t; s++) {
        const T *kr = k + kbase + (size_t)s * ldk, *vr = v + kbase + (size_t)s * ldk;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < GEN_MAXJ; j++) {
            const int d = lane + 32 * j;
            if (d < hd) dot += qr[j] * ldf(kr + d);
        }
        const float sc = warp_sum(dot) * scale;
        const float mn = fmaxf(m, sc);
        const float corr = expf(m - mn), p = expf(sc - mn); /* m = -inf first: corr = 0 */
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < GEN_MAXJ; j++) {
            const int d = lane + 32 * j;
            if (d < hd) o[j] = o[j] * corr + p * ldf(vr + d);
        }
        m = mn;
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < GEN_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < hd) stf(out + base + (size_t)t * ld + d, o[j] * inv);
    }
    if (lane == 0) lse[((size_t)b * H + h) * T_ + t] = m + logf(l);
}

/* D[b,h,t] = sum_d dO[t][d] * O[t][d], one warp per row (both backward
 * implementations use it). */
template <typename T>
__global__ void __launch_bounds__(128)
    rowdot_k(float *__restrict__ D, const T *__restrict__ dout, const T *__restrict__ out, int B,
             int T_, int H, int hd)
{
    const int lane = threadIdx.x % 32;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (long)B * H * T_) return;
    const int t = (int)(row % T_), h = (int)((row / T_) % H), b = (int)(row / ((long)T_ * H));
    const size_t ld = (size_t)H * hd, off = (size_t)b * T_ * ld + (size_t)h * hd + (size_t)t * ld;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s += ldf(dout + off + d) * ldf(out + off + d);
    s = warp_sum(s);
    if (lane == 0) D[((size_t)b * H + h) * T_ + t] = s;
}

/* dQ: one warp per query row t; for s <= t: P = exp(scale q.k_s - lse),
 * dP = dO_t . v_s, dS = P (dP - D_t), dq += scale dS k_s. */
template <typename T>
__global__ void __launch_bounds__(128)
    gen_dq_k(T *__restrict__ dq, const T *__restrict__ dout, const T *__restrict__ q,
             const T *__restrict__ k, const T *__restrict__ v, const float *__restrict__ lse,
             const float *__restrict__ D, int B, int T_, mal_cu_heads hs, int hd)
{
    const int lane = threadIdx.x % 32, H = hs.H;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (long)B * H * T_) return;
    const int t = (int)(row % T_), h = (int)((row / T_) % H), b = (int)(row / ((long)T_ * H));
    const heads_at at = heads_of(hs, b, h, T_, hd);
    const size_t ld = at.ld, ldk = at.ldk, base = at.base, kbase = at.kbase;
    const size_t stat = ((size_t)b * H + h) * T_ + t;
    const float scale = 1.0f / sqrtf((float)hd), L = lse[stat], Dt = D[stat];
    float qr[GEN_MAXJ], dor[GEN_MAXJ], acc[GEN_MAXJ];
#pragma unroll
    for (int j = 0; j < GEN_MAXJ; j++) {
        const int d = lane + 32 * j;
        qr[j] = d < hd ? ldf(q + base + (size_t)t * ld + d) : 0.0f;
        dor[j] = d < hd ? ldf(dout + base + (size_t)t * ld + d) : 0.0f;
        acc[j] = 0.0f;
    }
    for (int s = 0; s <= t; s++) {
        const T *kr = k + kbase + (size_t)s * ldk, *vr = v + kbase + (size_t)s * ldk;
        float a = 0.0f, c = 0.0f;
#pragma unroll
        for (int j = 0; j < GEN_MAXJ; j++) {
            const int d = lane + 32 * j;
            if (d < hd) a += qr[j] * ldf(kr + d), c += dor[j] * ldf(vr + d);
        }
        const float p = expf(warp_sum(a) * scale - L);
        const float ds = p * (warp_sum(c) - Dt);
#pragma unroll
        for (int j = 0; j < GEN_MAXJ; j++) {
            const int d = lane + 32 * j;
            if (d < hd) acc[j] += ds * ldf(kr + d);
        }
    }
#pragma unroll
    for (int j = 0; j < GEN_MAXJ; j++) {
        const int d = lane + 32 * j;
        T *p = dq + base + (size_t)t * ld + d;
        if (d < hd) stf(p, ldf(p) + scale * acc[j]);
    }
}

/* The query heads [*h0, *h1) that read key/value head j. */
MAL_DEV void readers_of(const mal_cu_heads &hs, int j, int *h0, int *h1)
{
    *h0 = max(0, j * hs.group - hs.q_off);
    *h1 = min(hs.H, (j + 1) * hs.group - hs.q_off);
}

/* dK, dV: one warp per key row s of key/value head j; for every query head
 * h that reads j, in order, and t >= s: dv += P dO_t, dk += scale dS q_t. */
template <typename T>
__global__ void __launch_bounds__(128)
    gen_dkv_k(T *__restrict__ dk, T *__restrict__ dv, const T *__restrict__ dout,
              const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
              const float *__restrict__ lse, const float *__restrict__ D, int B, int T_,
              mal_cu_heads hs, int hd)
{
    const int lane = threadIdx.x % 32, H = hs.H, Hkv = hs.Hkv;
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (long)B * Hkv * T_) return;
    const int s = (int)(row % T_), kh = (int)((row / T_) % Hkv),
              b = (int)(row / ((long)T_ * Hkv));
    const size_t ld = (size_t)H * hd, ldk = (size_t)Hkv * hd;
    const size_t kbase = (size_t)b * T_ * ldk + (size_t)kh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float kr[GEN_MAXJ], vr[GEN_MAXJ], ak[GEN_MAXJ], av[GEN_MAXJ];
#pragma unroll
    for (int j = 0; j < GEN_MAXJ; j++) {
        const int d = lane + 32 * j;
        kr[j] = d < hd ? ldf(k + kbase + (size_t)s * ldk + d) : 0.0f;
        vr[j] = d < hd ? ldf(v + kbase + (size_t)s * ldk + d) : 0.0f;
        ak[j] = av[j] = 0.0f;
    }
    int h0, h1;
    readers_of(hs, kh, &h0, &h1);
    for (int h = h0; h < h1; h++) {
        const size_t base = (size_t)b * T_ * ld + (size_t)h * hd;
        const size_t stat0 = ((size_t)b * H + h) * T_;
        for (int t = s; t < T_; t++) {
            const T *qr = q + base + (size_t)t * ld, *dor = dout + base + (size_t)t * ld;
            float a = 0.0f, c = 0.0f;
#pragma unroll
            for (int j = 0; j < GEN_MAXJ; j++) {
                const int d = lane + 32 * j;
                if (d < hd) a += ldf(qr + d) * kr[j], c += ldf(dor + d) * vr[j];
            }
            const float p = expf(warp_sum(a) * scale - lse[stat0 + t]);
            const float ds = p * (warp_sum(c) - D[stat0 + t]);
#pragma unroll
            for (int j = 0; j < GEN_MAXJ; j++) {
                const int d = lane + 32 * j;
                if (d < hd) av[j] += p * ldf(dor + d), ak[j] += ds * ldf(qr + d);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < GEN_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d >= hd) continue;
        if (dk) {
            T *p = dk + kbase + (size_t)s * ldk + d;
            stf(p, ldf(p) + scale * ak[j]);
        }
        if (dv) {
            T *p = dv + kbase + (size_t)s * ldk + d;
            stf(p, ldf(p) + av[j]);
        }
    }
}

/* ======================================================================== */
/* Tensor-core kernels (bf16; hd a multiple of 8 up to 128)                  */

/* The kernels work on tiles of HD = 64 or 128 columns (a template
 * parameter); a head dimension hd below HD (104 in a 128 tile, say) leaves
 * columns hd .. HD - 1 of every tile zero: they add nothing to a dot
 * product, the products that would only fill them are skipped, and the
 * results are stored for the first hd columns.
 *
 * Every tile is kept row-major in shared memory, as it lies in global
 * memory, copied there with cp.async (16 bytes per thread and copy, no
 * registers on the way) in double buffers: the next key (or query) tile
 * is in flight while the current one is used.  Rows are padded by 8
 * elements (16 bytes): the 8 rows one ldmatrix phase reads then start in
 * 8 different 16-byte bank groups, and so do the 16-byte writes of the
 * copies.  The matrix operands come from the tiles through ldmatrix: A
 * fragments and the B fragments of products with a transposed operand
 * (S = Q K^T: K's rows are B's columns) as they lie, and the B fragments
 * of products with a row-major operand (O = P V, dV = P^T dO, dK = dS^T Q,
 * dQ = dS K) through ldmatrix.trans -- no tile is ever stored transposed. */
#define PAD 8

/* Queue (cp.async, this thread's open group) the copy of `rows` rows of hd
 * bf16 (global, row stride ld, 16-byte aligned rows) into a shared tile of
 * stride HD + PAD.  Rows at or past `valid` and columns at or past hd are
 * zero-filled: a zero key or value contributes nothing once its
 * probability is masked to zero, and zero never turns into NaN the way
 * memory nobody wrote can. */
template <int HD>
MAL_DEV void tile_async(bf16 *dst, const bf16 *src, size_t ld, int rows, int valid, int hd,
                        int tid, int nthreads)
{
    const int per_row = HD / 8;
    for (int i = tid; i < rows * per_row; i += nthreads) {
        const int r = i / per_row, c = (i % per_row) * 8;
        const bool ok = r < valid && c < hd;
        cp_async16(dst + r * (HD + PAD) + c, ok ? src + (size_t)r * ld + c : src, ok ? 16 : 0);
    }
}

/* Fragments through ldmatrix.x4 (layouts: common.cuh).  Lane l addresses
 * row l % 8 of matrix l / 8.
 * frag_a: the A fragment (16 x 16) at (m0, k0) of a row-major tile X:
 *   matrices (rows m0, cols k0), (m0 + 8, k0), (m0, k0 + 8), (m0 + 8, k0 + 8).
 * frag_bt: the B fragments of the two n tiles n0 and n0 + 8 at k0 for
 *   B[k][n] = Y[n][k] (Y holds B's columns as rows: K in S = Q K^T):
 *   matrices (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8).
 * frag_bn: the same for B[k][n] = Y[k][n] (Y holds B's rows: V in P V),
 *   through .trans: matrices (k0, n0), (k0 + 8, n0), (k0, n0 + 8),
 *   (k0 + 8, n0 + 8).
 * b[0], b[1] feed the n tile n0, b[2], b[3] the n tile n0 + 8. */
template <int HD> MAL_DEV void frag_a(uint32_t a[4], const bf16 *X, int m0, int k0, int lane)
{
    const int j = lane / 8;
    ldmatrix_x4<false>(a, X + (m0 + lane % 8 + 8 * (j % 2)) * (HD + PAD) + k0 + 8 * (j / 2));
}
template <int HD> MAL_DEV void frag_bt(uint32_t b[4], const bf16 *Y, int n0, int k0, int lane)
{
    const int j = lane / 8;
    ldmatrix_x4<false>(b, Y + (n0 + lane % 8 + 8 * (j / 2)) * (HD + PAD) + k0 + 8 * (j % 2));
}
template <int HD> MAL_DEV void frag_bn(uint32_t b[4], const bf16 *Y, int k0, int n0, int lane)
{
    const int j = lane / 8;
    ldmatrix_x4<true>(b, Y + (k0 + lane % 8 + 8 * (j % 2)) * (HD + PAD) + n0 + 8 * (j / 2));
}

/* The A operand (16 x 16 of the k slice ks) from two accumulator tiles
 * (16 x 8 each: columns 16 ks .. 16 ks + 7 and + 8 .. + 15), rounded to
 * bf16: FlashAttention-2's register reuse. */
MAL_DEV void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4])
{
    a[0] = pack_bf16x2(lo[0], lo[1]);
    a[1] = pack_bf16x2(lo[2], lo[3]);
    a[2] = pack_bf16x2(hi[0], hi[1]);
    a[3] = pack_bf16x2(hi[2], hi[3]);
}

/* acc (16 x HD) += P (16 x K, the warp's accumulator tiles, rounded to
 * bf16) x Y (K x HD, a row-major tile): P V in the forward, P^T dO and
 * dS^T Q in dK/dV, dS K in dQ.  Column pairs at or past hd are skipped. */
template <int HD, int K>
MAL_DEV void acc_product(float acc[HD / 8][4], float p[K / 8][4], const bf16 *Y, int hd, int lane)
{
#pragma unroll
    for (int ks = 0; ks < K / 16; ks++) {
        uint32_t a[4];
        acc_to_a(a, p[2 * ks], p[2 * ks + 1]);
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
            if (np * 16 >= hd) continue;
            uint32_t b[4];
            frag_bn<HD>(b, Y, ks * 16, np * 16, lane);
            mma_bf16_16816(acc[2 * np], a, b);
            mma_bf16_16816(acc[2 * np + 1], a, b + 2);
        }
    }
}

/* x (16 x N) = X_w Y^T for the warp's 16 rows of a row-major tile X
 * (from row m0) and the N rows of a row-major tile Y: S = Q K^T, dP =
 * dO V^T, and their transposes in dK/dV. */
template <int HD, int N>
MAL_DEV void product_t(float x[N / 8][4], const bf16 *X, const bf16 *Y, int m0, int hd, int lane)
{
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) x[nt][i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        if (kk * 16 >= hd) continue;
        uint32_t a[4];
        frag_a<HD>(a, X, m0, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t b[4];
            frag_bt<HD>(b, Y, np * 16, kk * 16, lane);
            mma_bf16_16816(x[2 * np], a, b);
            mma_bf16_16816(x[2 * np + 1], a, b + 2);
        }
    }
}

/* Where a tensor-core block works: its thread and lane numbers, its tile
 * (the last tiles, with the most work under the causal mask, start first)
 * and the head slice (b, h) of blockIdx.y: a query head (forward, dQ: bh
 * = b*H + h, base its queries', kbase its key/value head's) or, for dK/dV,
 * a key/value head (bh = b*Hkv + j, kbase its keys', base unused). */
struct geom {
    int tid, lane, warp, g, c, tile, bh;
    size_t ld, ldk, base, kbase;
};
MAL_DEV geom geom_of(int T_, const mal_cu_heads &hs, int hd, bool per_kv)
{
    geom o;
    o.tid = threadIdx.x, o.lane = o.tid % 32, o.warp = o.tid / 32;
    o.g = o.lane / 4, o.c = o.lane % 4;
    o.tile = gridDim.x - 1 - blockIdx.x, o.bh = blockIdx.z * gridDim.y + blockIdx.y;
    o.ld = (size_t)hs.H * hd;
    o.ldk = (size_t)hs.Hkv * hd;
    if (per_kv) {
        o.base = 0;
        o.kbase = (size_t)(o.bh / hs.Hkv) * T_ * o.ldk + (size_t)(o.bh % hs.Hkv) * hd;
    } else {
        const int b = o.bh / hs.H, h = o.bh % hs.H;
        o.base = (size_t)b * T_ * o.ld + (size_t)h * hd;
        o.kbase = (size_t)b * T_ * o.ldk + (size_t)((h + hs.q_off) / hs.group) * hd;
    }
    return o;
}

enum { FWD_BQ = 64, FWD_BK = 64, FWD_THREADS = 128 };

template <int HD> static size_t fwd_smem()
{
    /* Q; K and V, two buffers each */
    return (size_t)(FWD_BQ + 4 * FWD_BK) * (HD + PAD) * sizeof(bf16);
}

/* Block: 64 queries of one (b, h), 4 warps of 16 queries each.  Key tiles
 * of 64 from the first to the diagonal one, each copied in while the one
 * before is used; the warp's Q fragments stay in registers. */
template <int HD>
__global__ void __launch_bounds__(FWD_THREADS)
    mma_fwd_k(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
              const bf16 *__restrict__ k, const bf16 *__restrict__ v, int T_, mal_cu_heads hs,
              int hd, int slices)
{
    if ((int)(blockIdx.z * gridDim.y + blockIdx.y) >= slices) return; /* mma_grid's spill */
    MAL_SMEM(smem);
    const int TS = FWD_BK * (HD + PAD); /* elements of one K or V buffer */
    bf16 *Qs = (bf16 *)smem;
    bf16 *Ks = Qs + FWD_BQ * (HD + PAD);
    bf16 *Vs = Ks + 2 * TS;
    const geom G = geom_of(T_, hs, hd, false);
    const int tid = G.tid, lane = G.lane, warp = G.warp, g = G.g, c = G.c, qt = G.tile, bh = G.bh;
    const size_t ld = G.ld, ldk = G.ldk, base = G.base, kbase = G.kbase;
    const int q0 = qt * FWD_BQ;
    const float sl2 = LOG2E / sqrtf((float)hd); /* scores in log2 units */

    tile_async<HD>(Qs, q + base + (size_t)q0 * ld, ld, FWD_BQ, T_ - q0, hd, tid, FWD_THREADS);
    tile_async<HD>(Ks, k + kbase, ldk, FWD_BK, T_, hd, tid, FWD_THREADS);
    tile_async<HD>(Vs, v + kbase, ldk, FWD_BK, T_, hd, tid, FWD_THREADS);
    cp_async_commit();
    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows g, g + 8 */
    const int row0 = q0 + warp * 16 + g;                     /* this thread's first query */

    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * FWD_BK, buf = kt & 1;
        if (kt < qt) { /* the next tile into the other buffer (free since the last barrier) */
            const int k1 = k0 + FWD_BK;
            tile_async<HD>(Ks + (buf ^ 1) * TS, k + kbase + (size_t)k1 * ldk, ldk, FWD_BK, T_ - k1,
                           hd, tid, FWD_THREADS);
            tile_async<HD>(Vs + (buf ^ 1) * TS, v + kbase + (size_t)k1 * ldk, ldk, FWD_BK, T_ - k1,
                           hd, tid, FWD_THREADS);
        }
        cp_async_commit(); /* (empty in the last round: the wait below stays the same) */
        cp_async_wait<1>();
        __syncthreads(); /* every thread's copies of this round's tiles have landed */
        if (kt == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) frag_a<HD>(qf[kk], Qs, warp * 16, kk * 16, lane);
        }
        const bf16 *Kb = Ks + buf * TS, *Vb = Vs + buf * TS;
        /* S (16 x 64) = Q_w K^T */
        float s[FWD_BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < FWD_BK / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            if (kk * 16 >= hd) continue;
#pragma unroll
            for (int np = 0; np < FWD_BK / 16; np++) {
                uint32_t bb[4];
                frag_bt<HD>(bb, Kb, np * 16, kk * 16, lane);
                mma_bf16_16816(s[2 * np], qf[kk], bb);
                mma_bf16_16816(s[2 * np + 1], qf[kk], bb + 2);
            }
        }
        /* scale, mask (key > query, key >= T), online softmax per row */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < FWD_BK / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = k0 + nt * 8 + 2 * c + (i & 1), qry = row0 + (i >= 2 ? 8 : 0);
                float x = s[nt][i] * sl2;
                if (key > qry || key >= T_) x = -INFINITY;
                s[nt][i] = x;
                mx[i >> 1] = fmaxf(mx[i >> 1], x);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            /* a row with every key so far masked keeps m = -inf: use 0 as
             * the shift so that no -inf - -inf turns into NaN */
            const float sh = mn == -INFINITY ? 0.0f : mn;
            alpha[r] = exp2f(m[r] - sh);
            m[r] = mn;
            mx[r] = sh;
        }
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < FWD_BK / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = exp2f(s[nt][i] - mx[i >> 1]);
                s[nt][i] = p;
                rs[i >> 1] += p;
            }
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            o[i][0] *= alpha[0], o[i][1] *= alpha[0];
            o[i][2] *= alpha[1], o[i][3] *= alpha[1];
        }
        acc_product<HD, FWD_BK>(o, s, Vb, hd, lane); /* O += P V */
        __syncthreads(); /* buf is refilled two rounds on */
    }
    /* the row sums were kept per thread: add the 4 threads of each row */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = row0 + 8 * r;
        if (t >= T_) continue;
        const float inv = 1.0f / l[r];
        bf16 *orow = out + base + (size_t)t * ld;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++)
            if (nt * 8 < hd)
                stv(orow + nt * 8 + 2 * c, pack_bf16x2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv));
        if (c == 0) lse[(size_t)bh * T_ + t] = (m[r] + log2f(l[r])) * LN2;
    }
}

/* dst[0..1] += f * (a0, a1): the accumulating bf16 store of the backward
 * kernels' results (kernels.h: gradients are added to). */
MAL_DEV void add_store2(bf16 *dst, float f, float a0, float a1)
{
    float2 old = __bfloat1622float2(ldv<__nv_bfloat162>(dst));
    stv(dst, pack_bf16x2(old.x + f * a0, old.y + f * a1));
}

enum { BWD_THREADS = 128, DKV_THREADS = 256, DKV_BK = 64, DKV_BQ = 32, DQ_BQ = 64, DQ_BK = 32 };

template <int HD> static size_t dkv_smem()
{
    /* K, V (64 keys); Q, dO (32 queries), two buffers each; lse and D of
     * the 32 queries, two buffers each; P^T of the round (64 x 32 floats,
     * in the accumulators' thread layout) */
    return (size_t)(2 * DKV_BK + 4 * DKV_BQ) * (HD + PAD) * sizeof(bf16) +
           4 * DKV_BQ * sizeof(float) + (size_t)DKV_BK * DKV_BQ * sizeof(float);
}

/* Queue query tile `it` of a dK/dV block into buffer `buf`: the tiles run
 * over the query heads h0, h0 + 1, ... that read the block's key/value
 * head, and for each over the queries from the block's first key on, 32 at
 * a time (nqt tiles per head).  Q and dO by cp.async, lse and D by plain
 * stores (the buffer is free: its last reader passed a barrier since). */
template <int HD>
MAL_DEV void dkv_issue(bf16 *Qb, bf16 *Ob, float *Lb, float *Db, const bf16 *q, const bf16 *dout,
                       const float *lse, const float *D, int it, int nqt, int h0, int b, int k0,
                       int T_, const mal_cu_heads &hs, int hd, int tid)
{
    const int h = h0 + it / nqt, q0 = k0 + (it % nqt) * DKV_BQ, nq = T_ - q0;
    const size_t ld = (size_t)hs.H * hd, base = (size_t)b * T_ * ld + (size_t)h * hd;
    const size_t stat = ((size_t)b * hs.H + h) * T_ + q0;
    tile_async<HD>(Qb, q + base + (size_t)q0 * ld, ld, DKV_BQ, nq, hd, tid, DKV_THREADS);
    tile_async<HD>(Ob, dout + base + (size_t)q0 * ld, ld, DKV_BQ, nq, hd, tid, DKV_THREADS);
    if (tid < DKV_BQ) {
        const bool ok = tid < nq;
        Lb[tid] = ok ? lse[stat + tid] * LOG2E : 0.0f;
        Db[tid] = ok ? D[stat + tid] : 0.0f;
    }
}

/* dK, dV of 64 keys of one (b, key/value head j); for every query head h
 * that reads j, in order, query tiles of 32 from the diagonal on, each
 * copied in while the one before is used.  8 warps in two roles, a pair
 * per 16 keys (warps w and w + 4), so that each holds one 16 x hd
 * accumulator (64 registers at hd 128) instead of both (the 4-warp form
 * needed ~244 registers: 2 blocks of 4 warps per SM).  Per round,
 * transposed products (keys are the rows):
 *   P warp (w < 4):  S^T = K_w Q^T, P^T = exp(S^T - lse), P^T to shared
 *                    memory | barrier | dV_w += P^T dO;
 *   dS warp (w >= 4): dP^T = V_w dO^T | barrier | P^T from shared memory,
 *                    dS^T = P^T (dP^T - D), dK_w += scale dS^T Q.
 * Each does two products per round; P^T passes in fp32, so the results
 * are those of one warp doing both. */
template <int HD>
__global__ void __launch_bounds__(DKV_THREADS, 2) /* 2 blocks per SM: at most 128 registers */
    mma_dkv_k(bf16 *__restrict__ dk, bf16 *__restrict__ dv, const bf16 *__restrict__ dout,
              const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
              const float *__restrict__ lse, const float *__restrict__ D, int T_, mal_cu_heads hs,
              int hd, int slices)
{
    if ((int)(blockIdx.z * gridDim.y + blockIdx.y) >= slices) return; /* mma_grid's spill */
    MAL_SMEM(smem);
    const int QS = DKV_BQ * (HD + PAD); /* elements of one Q or dO buffer */
    bf16 *Ks = (bf16 *)smem;
    bf16 *Vs = Ks + DKV_BK * (HD + PAD);
    bf16 *Qs = Vs + DKV_BK * (HD + PAD);
    bf16 *Os = Qs + 2 * QS; /* dO rows */
    float *Ls = (float *)(Os + 2 * QS);
    float *Ds = Ls + 2 * DKV_BQ;
    float *Ps = Ds + 2 * DKV_BQ; /* [key group][nt][i][lane] */
    const geom G = geom_of(T_, hs, hd, true);
    const int tid = G.tid, lane = G.lane, g = G.g, c = G.c;
    const int kg = G.warp % 4, role = G.warp / 4; /* 16-key group; 0: P and dV, 1: dS and dK */
    const size_t ldk = G.ldk, kbase = G.kbase;
    const int b = G.bh / hs.Hkv, kvh = G.bh % hs.Hkv;
    const int k0 = G.tile * DKV_BK;
    const float scale = 1.0f / sqrtf((float)hd), sl2 = scale * LOG2E;
    int h0, h1;
    readers_of(hs, kvh, &h0, &h1);
    const int nqt = (T_ - k0 + DKV_BQ - 1) / DKV_BQ, tiles = (h1 - h0) * nqt;
    float *Pw = Ps + kg * (DKV_BQ / 8) * 4 * 32; /* this pair's P^T */

    tile_async<HD>(Ks, k + kbase + (size_t)k0 * ldk, ldk, DKV_BK, T_ - k0, hd, tid, DKV_THREADS);
    tile_async<HD>(Vs, v + kbase + (size_t)k0 * ldk, ldk, DKV_BK, T_ - k0, hd, tid, DKV_THREADS);
    if (tiles > 0)
        dkv_issue<HD>(Qs, Os, Ls, Ds, q, dout, lse, D, 0, nqt, h0, b, k0, T_, hs, hd, tid);
    cp_async_commit();
    float acc[HD / 8][4]; /* dV_w (role 0) or dK_w / scale (role 1) */
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    const int key0 = k0 + kg * 16 + g; /* this thread's first key (rows g, g + 8) */

    for (int it = 0; it < tiles; it++) {
        const int buf = it & 1;
        if (it + 1 < tiles)
            dkv_issue<HD>(Qs + (buf ^ 1) * QS, Os + (buf ^ 1) * QS, Ls + (buf ^ 1) * DKV_BQ,
                          Ds + (buf ^ 1) * DKV_BQ, q, dout, lse, D, it + 1, nqt, h0, b, k0, T_, hs,
                          hd, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads(); /* every thread's copies of this round's tiles have landed */
        const bf16 *Qb = Qs + buf * QS, *Ob = Os + buf * QS;
        const float *Lb = Ls + buf * DKV_BQ, *Db = Ds + buf * DKV_BQ;
        const int q0 = k0 + (it % nqt) * DKV_BQ;
        float x[DKV_BQ / 8][4]; /* S^T then P^T (role 0), dP^T then dS^T (role 1) */
        if (role == 0) {
            product_t<HD, DKV_BQ>(x, Ks, Qb, kg * 16, hd, lane);
#pragma unroll
            for (int nt = 0; nt < DKV_BQ / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int qi = nt * 8 + 2 * c + (i & 1), key = key0 + (i >= 2 ? 8 : 0);
                    const int qry = q0 + qi;
                    float p = exp2f(x[nt][i] * sl2 - Lb[qi]);
                    if (key > qry || qry >= T_ || key >= T_) p = 0.0f;
                    x[nt][i] = p;
                    Pw[(nt * 4 + i) * 32 + lane] = p;
                }
        } else {
            product_t<HD, DKV_BQ>(x, Vs, Ob, kg * 16, hd, lane);
        }
        __syncthreads(); /* P^T of every pair written */
        if (role == 0) {
            acc_product<HD, DKV_BQ>(acc, x, Ob, hd, lane); /* dV_w += P^T dO */
        } else {
#pragma unroll
            for (int nt = 0; nt < DKV_BQ / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int qi = nt * 8 + 2 * c + (i & 1);
                    x[nt][i] = Pw[(nt * 4 + i) * 32 + lane] * (x[nt][i] - Db[qi]);
                }
            acc_product<HD, DKV_BQ>(acc, x, Qb, hd, lane); /* dK_w += dS^T Q */
        }
        __syncthreads(); /* buf is refilled two rounds on, P^T rewritten next round */
    }
    cp_async_wait<0>(); /* no tiles: the K, V copies */
    /* accumulate into dk or dv (+=, as kernels.h says) */
    bf16 *dst = role == 0 ? dv : dk;
    const float f = role == 0 ? 1.0f : scale;
    if (!dst) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= T_) continue;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            if (nt * 8 >= hd) continue;
            add_store2(dst + kbase + (size_t)key * ldk + nt * 8 + 2 * c, f, acc[nt][2 * r],
                       acc[nt][2 * r + 1]);
        }
    }
}

template <int HD> static size_t dq_smem()
{
    /* Q, dO (64 queries); K, V (32 keys), two buffers each */
    return (size_t)(2 * DQ_BQ + 4 * DQ_BK) * (HD + PAD) * sizeof(bf16);
}

/* dQ of 64 queries (4 warps x 16) of one (b, h); key tiles of 32 up to the
 * diagonal, each copied in while the one before is used.  Per warp: S =
 * Q_w K^T, P = exp(S - lse), dP = dO_w V^T, dS = P (dP - D), dQ_w +=
 * scale dS K. */
template <int HD>
__global__ void __launch_bounds__(BWD_THREADS)
    mma_dq_k(bf16 *__restrict__ dq, const bf16 *__restrict__ dout, const bf16 *__restrict__ q,
             const bf16 *__restrict__ k, const bf16 *__restrict__ v, const float *__restrict__ lse,
             const float *__restrict__ D, int T_, mal_cu_heads hs, int hd, int slices)
{
    if ((int)(blockIdx.z * gridDim.y + blockIdx.y) >= slices) return; /* mma_grid's spill */
    MAL_SMEM(smem);
    const int KS = DQ_BK * (HD + PAD); /* elements of one K or V buffer */
    bf16 *Qs = (bf16 *)smem;
    bf16 *Os = Qs + DQ_BQ * (HD + PAD);
    bf16 *Ks = Os + DQ_BQ * (HD + PAD);
    bf16 *Vs = Ks + 2 * KS;
    const geom G = geom_of(T_, hs, hd, false);
    const int tid = G.tid, lane = G.lane, warp = G.warp, g = G.g, c = G.c, bh = G.bh;
    const size_t ld = G.ld, ldk = G.ldk, base = G.base, kbase = G.kbase;
    const int q0 = G.tile * DQ_BQ;
    const float scale = 1.0f / sqrtf((float)hd), sl2 = scale * LOG2E;
    const int kend = min(T_, q0 + DQ_BQ); /* keys past the tile's last query are masked */
    const int nkt = (kend + DQ_BK - 1) / DQ_BK;
    tile_async<HD>(Qs, q + base + (size_t)q0 * ld, ld, DQ_BQ, T_ - q0, hd, tid, BWD_THREADS);
    tile_async<HD>(Os, dout + base + (size_t)q0 * ld, ld, DQ_BQ, T_ - q0, hd, tid, BWD_THREADS);
    tile_async<HD>(Ks, k + kbase, ldk, DQ_BK, T_, hd, tid, BWD_THREADS);
    tile_async<HD>(Vs, v + kbase, ldk, DQ_BK, T_, hd, tid, BWD_THREADS);
    cp_async_commit();
    const int row0 = q0 + warp * 16 + g;
    float L[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = row0 + 8 * r;
        L[r] = t < T_ ? lse[(size_t)bh * T_ + t] * LOG2E : 0.0f;
        Dr[r] = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
    }
    float adq[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) adq[i][0] = adq[i][1] = adq[i][2] = adq[i][3] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * DQ_BK, buf = kt & 1;
        if (kt + 1 < nkt) {
            const int k1 = k0 + DQ_BK;
            tile_async<HD>(Ks + (buf ^ 1) * KS, k + kbase + (size_t)k1 * ldk, ldk, DQ_BK, T_ - k1,
                           hd, tid, BWD_THREADS);
            tile_async<HD>(Vs + (buf ^ 1) * KS, v + kbase + (size_t)k1 * ldk, ldk, DQ_BK, T_ - k1,
                           hd, tid, BWD_THREADS);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *Kb = Ks + buf * KS, *Vb = Vs + buf * KS;
        float s[DQ_BK / 8][4], dp[DQ_BK / 8][4];
        product_t<HD, DQ_BK>(s, Qs, Kb, warp * 16, hd, lane);
        product_t<HD, DQ_BK>(dp, Os, Vb, warp * 16, hd, lane);
#pragma unroll
        for (int nt = 0; nt < DQ_BK / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = k0 + nt * 8 + 2 * c + (i & 1), r = i >> 1;
                const int qry = row0 + 8 * r;
                float p = exp2f(s[nt][i] * sl2 - L[r]);
                if (key > qry || key >= T_ || qry >= T_) p = 0.0f;
                s[nt][i] = p * (dp[nt][i] - Dr[r]); /* dS */
            }
        acc_product<HD, DQ_BK>(adq, s, Kb, hd, lane); /* dQ_w += dS K */
        __syncthreads(); /* buf is refilled two rounds on */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = row0 + 8 * r;
        if (t >= T_) continue;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            if (nt * 8 >= hd) continue;
            add_store2(dq + base + (size_t)t * ld + nt * 8 + 2 * c, scale, adq[nt][2 * r],
                       adq[nt][2 * r + 1]);
        }
    }
}

/* ======================================================================== */
/* Launchers                                                                */

template <typename K> static void allow_smem(K kern, size_t bytes)
{
    if (bytes <= 48 * 1024) return;
#ifndef MAL_CUDA_EMU
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
#else
    emu::set_max_dynamic_smem((const void *)kern, bytes);
#endif
}

/* The tile width of the tensor-core kernels for head dimension hd, or 0
 * where they do not apply: bf16, the tensor cores not turned off (impl),
 * hd a multiple of 8 (16-byte rows for cp.async) up to 128, every buffer
 * 16-byte aligned (rows then are: ld = H*hd bf16 is a multiple of 8
 * elements).  The backend runs only on sm_80+ devices. */
static int mma_width(int use_bf16, int impl, int hd, const void *q, const void *k, const void *v)
{
    if (!use_bf16 || impl != 0 || hd % 8 || hd > 128 || !aligned16(q) || !aligned16(k) ||
        !aligned16(v))
        return 0;
    return hd <= 64 ? 64 : 128;
}

/* The head slices as grid rows: blockIdx.y, spilling into blockIdx.z past
 * the 65535 rows a grid may have (geom_of and the kernels' early return
 * put them together again). */
static dim3 mma_grid(int tiles, int slices)
{
    const int y = slices < 65535 ? slices : 65535;
    return dim3((unsigned)tiles, (unsigned)y, (unsigned)((slices + y - 1) / y));
}

template <int HD>
static void mma_fwd(mal_cu_stream s, void *out, float *lse, const void *q, const void *k,
                    const void *v, int B, int T, mal_cu_heads hs, int hd)
{
    allow_smem(mma_fwd_k<HD>, fwd_smem<HD>());
    MAL_LAUNCH(mma_fwd_k<HD>, mma_grid((T + FWD_BQ - 1) / FWD_BQ, B * hs.H), FWD_THREADS,
               fwd_smem<HD>(), s)
    ((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, T, hs, hd, B * hs.H);
}

extern "C" int mal_cu_attention_supported(int hd)
{
    return hd > 0 && hd % 2 == 0 && hd <= MAL_CU_ATTENTION_MAX_HD;
}

extern "C" const char *mal_cu_attention_kind(int use_bf16, int impl, int hd)
{
    if (!mal_cu_attention_supported(hd)) return "none (unsupported head dimension)";
    if (!use_bf16) return "generic kernels (fp32: one warp per query row)";
    if (impl != 0) return "generic kernels (forced: one warp per query row, fp32 arithmetic)";
    if (hd % 8 || hd > 128)
        return "generic kernels (bf16 storage, one warp per query row: slow; the tensor-core "
               "kernels take head dimensions that are multiples of 8 up to 128)";
    if (hd == 64 || hd == 128) return "tensor cores (mma.sync bf16, cp.async, ldmatrix)";
    return hd < 64 ? "tensor cores (mma.sync bf16, cp.async, ldmatrix; tiles of 64 columns)"
                   : "tensor cores (mma.sync bf16, cp.async, ldmatrix; tiles of 128 columns)";
}

extern "C" void mal_cu_attention_fwd(mal_cu_stream s, int use_bf16, int impl, void *out, float *lse,
                                     const void *q, const void *k, const void *v, int B, int T,
                                     mal_cu_heads hs, int hd)
{
    const int H = hs.H;
    if (B <= 0 || T <= 0 || H <= 0 || !mal_cu_attention_supported(hd)) return;
    /* out is stored in pairs (4-byte accesses) */
    switch (aligned16(out) ? mma_width(use_bf16, impl, hd, q, k, v) : 0) {
    case 64: mma_fwd<64>(s, out, lse, q, k, v, B, T, hs, hd); return;
    case 128: mma_fwd<128>(s, out, lse, q, k, v, B, T, hs, hd); return;
    }
    const unsigned blocks = mal_blocks((size_t)B * H * T, 4);
    if (use_bf16)
        MAL_LAUNCH(gen_fwd_k<bf16>, blocks, 128, 0, s)
        ((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, B, T, hs, hd);
    else
        MAL_LAUNCH(gen_fwd_k<float>, blocks, 128, 0, s)
        ((float *)out, lse, (const float *)q, (const float *)k, (const float *)v, B, T, hs, hd);
}

extern "C" size_t mal_cu_attention_bwd_scratch_bytes(int B, int T, int H)
{
    return (size_t)B * H * T * sizeof(float);
}

template <int HD>
static void mma_bwd(mal_cu_stream s, void *dq, void *dk, void *dv, const void *dout,
                    const void *q, const void *k, const void *v, const float *lse, const float *D,
                    int B, int T, mal_cu_heads hs, int hd)
{
    if (dk || dv) {
        allow_smem(mma_dkv_k<HD>, dkv_smem<HD>());
        MAL_LAUNCH(mma_dkv_k<HD>, mma_grid((T + DKV_BK - 1) / DKV_BK, B * hs.Hkv), DKV_THREADS,
                   dkv_smem<HD>(), s)
        ((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k,
         (const bf16 *)v, lse, D, T, hs, hd, B * hs.Hkv);
    }
    if (dq) {
        allow_smem(mma_dq_k<HD>, dq_smem<HD>());
        MAL_LAUNCH(mma_dq_k<HD>, mma_grid((T + DQ_BQ - 1) / DQ_BQ, B * hs.H), BWD_THREADS,
                   dq_smem<HD>(), s)
        ((bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, D,
         T, hs, hd, B * hs.H);
    }
}

template <typename T_>
static void gen_bwd(mal_cu_stream s, void *dq, void *dk, void *dv, const void *dout,
                    const void *q, const void *k, const void *v, const float *lse, const float *D,
                    int B, int T, mal_cu_heads hs, int hd)
{
    if (dq)
        MAL_LAUNCH(gen_dq_k<T_>, mal_blocks((size_t)B * hs.H * T, 4), 128, 0, s)
        ((T_ *)dq, (const T_ *)dout, (const T_ *)q, (const T_ *)k, (const T_ *)v, lse, D, B, T, hs,
         hd);
    if (dk || dv)
        MAL_LAUNCH(gen_dkv_k<T_>, mal_blocks((size_t)B * hs.Hkv * T, 4), 128, 0, s)
        ((T_ *)dk, (T_ *)dv, (const T_ *)dout, (const T_ *)q, (const T_ *)k, (const T_ *)v, lse, D,
         B, T, hs, hd);
}

extern "C" void mal_cu_attention_bwd(mal_cu_stream s, int use_bf16, int impl, void *dq, void *dk,
                                     void *dv, const void *dout, const void *out, const void *q,
                                     const void *k, const void *v, const float *lse, int B, int T,
                                     mal_cu_heads hs, int hd, void *scratch)
{
    const int H = hs.H;
    if (B <= 0 || T <= 0 || H <= 0 || !mal_cu_attention_supported(hd) || (!dq && !dk && !dv))
        return;
    float *D = (float *)scratch;
    const unsigned rows = mal_blocks((size_t)B * H * T, 4);
    if (use_bf16)
        MAL_LAUNCH(rowdot_k<bf16>, rows, 128, 0, s)
        (D, (const bf16 *)dout, (const bf16 *)out, B, T, H, hd);
    else
        MAL_LAUNCH(rowdot_k<float>, rows, 128, 0, s)
        (D, (const float *)dout, (const float *)out, B, T, H, hd);
    /* dO is copied into tiles by cp.async too, and dq, dk, dv are added
     * to in pairs (4-byte accesses): all aligned as well (NULL is) */
    const bool al = aligned16(dout) && aligned16(dq) && aligned16(dk) && aligned16(dv);
    switch (al ? mma_width(use_bf16, impl, hd, q, k, v) : 0) {
    case 64: mma_bwd<64>(s, dq, dk, dv, dout, q, k, v, lse, D, B, T, hs, hd); return;
    case 128: mma_bwd<128>(s, dq, dk, dv, dout, q, k, v, lse, D, B, T, hs, hd); return;
    }
    if (use_bf16)
        gen_bwd<bf16>(s, dq, dk, dv, dout, q, k, v, lse, D, B, T, hs, hd);
    else
        gen_bwd<float>(s, dq, dk, dv, dout, q, k, v, lse, D, B, T, hs, hd);
}
