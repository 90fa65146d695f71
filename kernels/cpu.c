/* CPU backend of the kernel table (kernels.h): the reference oracle every
 * other backend is tested against, and the compute path of CPU "devices".
 *
 * Matrix products (including the two products of attention) go through
 * OpenBLAS cblas_sgemm, whose pthread pool is the only parallelism here: an
 * OpenMP pool next to it would fight it for the same cores.  Everything else
 * is plain C written so that gcc -O2 vectorises it.  GCC 12 at -O2 uses the
 * "very cheap" vectoriser cost model, which refuses any loop that needs a
 * scalar epilogue or a runtime alias check, and float ternaries inside a
 * loop body count as control flow.  Hence the shape of the hot loops below:
 * an outer loop over blocks of CPU_VW elements whose inner loop has a
 * compile-time trip count (fully vectorised), then a scalar tail, with
 * restrict pointers and branch-free element functions (cpu_expf, cpu_sel).
 *
 * Operations run synchronously on the calling thread, so the instance's
 * queue is trivially in order and events read the process's CPU clock.  A
 * problem that a void operation cannot return (a token or target out of
 * range, no memory for a RoPE table) is recorded with MAL_ERR and returned
 * by the instance's next sync().
 *
 * Two backends share this code (the registry entries at the end): "cpu",
 * whose device buffers are plain host memory (host_addressable), and
 * "cpu-opaque", a test backend whose buffer handles are the real address
 * plus OPAQUE_OFFSET (1 << 62).  Such an address is non-canonical on
 * x86-64 (bits 47-63 differ), so any dereference outside this file faults
 * at once; the instance layer at the end of the file translates handles
 * back (dev()) before calling the implementations above it, which only
 * ever see real addresses.  Everything else - the arithmetic, the
 * allocator - is the same, so the two give bit-identical results and
 * cpu-opaque proves that no code outside the backends touches device
 * memory.
 */
#include "base/mal.h"
#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* Elements per vectorised block: a multiple of every SIMD width (4, 8, 16
 * floats) the compiler may choose. */
#define CPU_VW 16

/* The default x86-64 target has only SSE2 (4 floats per vector).  With GCC
 * on x86-64 Linux, the element-wise loops are also compiled for AVX2 and
 * AVX-512 and the best version is picked at load time (ifunc), which makes
 * the exp-heavy loops 3-5x faster on current Xeons.  The clones run the same
 * IEEE operations in the same order (ISO C mode does not contract a*b+c into
 * an FMA), so results are bit-for-bit the same whichever clone runs. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) &&           \
    defined(__linux__)
#define CPU_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_SIMD
#endif

/* ------------------------------------------------------------------------ */
/* Deferred errors                                                            */

/* An instance: the handle offset (0 for cpu) and the sticky error for
 * sync(): the first failure since the last sync wins.  Operations of one
 * instance are issued from one thread (as on a GPU stream); the atomic only
 * keeps a stray second thread well-defined. */
/* bf16 compute: the slots of operands widened to fp32 (the "bf16
 * storage" section below). */
enum { W_A, W_B, W_C, W_D, W_E, W_F, W_G, W_N };

typedef struct {
    float *p[W_N];
    size_t n[W_N];
} cpu_wide;

typedef struct {
    uintptr_t off;
    _Atomic int err;
    cpu_wide wide;
} cpu_state;

static void cpu_fail(cpu_state *st, int err)
{
    int expected = 0;
    atomic_compare_exchange_strong(&st->err, &expected, err);
}

/* ------------------------------------------------------------------------ */
/* Branch-free element helpers                                                */

/* mask ? a : b on float bits; a float ternary would stop vectorisation. */
static inline float cpu_sel(int cond, float a, float b)
{
    uint32_t m = (uint32_t)0 - (uint32_t)(cond != 0), ua, ub, ur;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    ur = (ua & m) | (ub & ~m);
    float r;
    memcpy(&r, &ur, sizeof r);
    return r;
}

/* e^x in float, vectorisable (libm's expf is an opaque call).  Cephes
 * polynomial on the reduced argument r = x - k ln2, |r| <= ln2/2; error
 * below 1 ulp (checked against double exp for every float in [-87, 88]).
 * The argument is clamped to [-87, 88], so the result saturates at ~1.6e-38
 * and ~1.65e38 instead of 0 and inf (harmless for softmax, where arguments
 * are <= 0, and for silu); NaN propagates. */
static inline float cpu_expf(float x)
{
    float xc = cpu_sel(x < -87.0f, -87.0f, x);
    xc = cpu_sel(xc > 88.0f, 88.0f, xc);
    /* NaN must not reach the float->int conversion (undefined in C); its
     * result still becomes NaN through r below. */
    float xi = cpu_sel(xc != xc, 0.0f, xc);
    /* k = round(x / ln2); the +126.5 keeps the truncated value positive
     * (x >= -87), so truncation is floor. */
    int32_t k = (int32_t)(xi * 1.44269504088896341f + 126.5f) - 126;
    float kf = (float)k;
    float r = xc - kf * 0.693359375f - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)(k + 127) << 23; /* 2^k, k in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                     */

/* Every block starts with a 64-byte header (so the data stays 64-byte
 * aligned) saying how it was obtained.  Blocks of 1 MiB and more come from
 * mmap: the kernel hands out zero pages lazily, so a large allocation costs
 * nothing until it is used, instead of a memset pass over memory that the
 * kernel has just zeroed anyway (model state and activations are hundreds
 * of MB; an online plan change allocates a whole new part). */
enum { HDR = 64, MMAP_MIN = 1 << 20, HUGE_MIN = 4 << 20 };
typedef struct {
    size_t total; /* bytes mapped or allocated, header included */
    int mapped;
} blk_hdr;

static void *blk_alloc(size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || rounded > SIZE_MAX - HDR) return NULL; /* overflow */
    size_t total = rounded + HDR;
    char *p;
    int mapped = total >= MMAP_MIN;
    if (mapped) {
        p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
        /* Transparent huge pages where the system offers them on request:
         * one fault per 2 MiB instead of per 4 KiB.  First touches of a
         * fresh part (an online plan change writes a whole new one) cost
         * mostly page faults otherwise.  Advice only: failure is harmless. */
        if (total >= HUGE_MIN) (void)madvise(p, total, MADV_HUGEPAGE);
#endif
    } else {
        p = aligned_alloc(64, total);
        if (!p) return NULL;
        memset(p, 0, total);
    }
    ((blk_hdr *)p)->total = total;
    ((blk_hdr *)p)->mapped = mapped;
    return p + HDR;
}

static void blk_free(void *ptr)
{
    if (!ptr) return;
    char *p = (char *)ptr - HDR;
    const blk_hdr *h = (const blk_hdr *)p;
    if (h->mapped)
        munmap(p, h->total);
    else
        free(p);
}

/* A mapped block grows by remapping its pages (no copy: mremap moves page
 * table entries if it has to move at all), so an online plan change that
 * extends a part keeps the old state where it is. */
static void *blk_resize(void *ptr, size_t old_bytes, size_t new_bytes)
{
    if (!ptr) return blk_alloc(new_bytes);
    char *p = (char *)ptr - HDR;
    blk_hdr *h = (blk_hdr *)p;
    size_t rounded = (new_bytes + 63) & ~(size_t)63;
    if (rounded < new_bytes || rounded > SIZE_MAX - HDR) return NULL;
    size_t total = rounded + HDR;
    if (h->mapped && total >= MMAP_MIN) {
        char *q = mremap(p, h->total, total, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) return NULL;
        ((blk_hdr *)q)->total = total; /* pages added by mremap read as zero */
        return q + HDR;
    }
    char *n = blk_alloc(new_bytes);
    if (!n) return NULL;
    memcpy(n, ptr, MAL_MIN(old_bytes, new_bytes));
    blk_free(ptr);
    return n;
}

static void cpu_zero(float *x, size_t n)
{
    if (n) memset(x, 0, n * sizeof *x);
}

static void cpu_copy(float *dst, const float *src, size_t n)
{
    if (n && dst != src) memmove(dst, src, n * sizeof *dst);
}


/* ------------------------------------------------------------------------ */
/* Element-wise building blocks (restrict: callers resolve aliasing)         */

/* y += x */
CPU_SIMD static void vec_acc(float *restrict y, const float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            y[i + j] += x[i + j];
    for (; i < n; i++)
        y[i] += x[i];
}

/* x *= s */
CPU_SIMD static void vec_scale(float *restrict x, size_t n, float s)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            x[i + j] *= s;
    for (; i < n; i++)
        x[i] *= s;
}

/* max_i x[i] (n >= 1).  NaN is not propagated here; it is by the exp. */
CPU_SIMD static float vec_max(const float *restrict x, size_t n)
{
    float m[CPU_VW];
    size_t i = 0;
    for (int j = 0; j < CPU_VW; j++)
        m[j] = x[0];
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            m[j] = cpu_sel(x[i + j] > m[j], x[i + j], m[j]);
    float r = m[0];
    for (int j = 1; j < CPU_VW; j++)
        r = m[j] > r ? m[j] : r;
    for (; i < n; i++)
        r = x[i] > r ? x[i] : r;
    return r;
}

/* x[i] = e^(x[i] - shift), returns the sum (lane-wise partial sums). */
CPU_SIMD static float vec_exp_sum_inplace(float *restrict x, size_t n, float shift)
{
    float acc[CPU_VW] = {0};
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++) {
            float e = cpu_expf(x[i + j] - shift);
            x[i + j] = e;
            acc[j] += e;
        }
    float s = 0.0f;
    for (; i < n; i++) {
        float e = cpu_expf(x[i] - shift);
        x[i] = e;
        s += e;
    }
    for (int j = 0; j < CPU_VW; j++)
        s += acc[j];
    return s;
}

/* y[i] = e^(x[i] - shift) (y may be NULL: sum only), returns the sum. */
CPU_SIMD static float vec_exp_sum(float *restrict y, const float *restrict x, size_t n, float shift)
{
    float acc[CPU_VW] = {0};
    size_t i = 0;
    if (y) {
        for (; i + CPU_VW <= n; i += CPU_VW)
            for (int j = 0; j < CPU_VW; j++) {
                float e = cpu_expf(x[i + j] - shift);
                y[i + j] = e;
                acc[j] += e;
            }
    } else {
        for (; i + CPU_VW <= n; i += CPU_VW)
            for (int j = 0; j < CPU_VW; j++)
                acc[j] += cpu_expf(x[i + j] - shift);
    }
    float s = 0.0f;
    for (; i < n; i++) {
        float e = cpu_expf(x[i] - shift);
        if (y) y[i] = e;
        s += e;
    }
    for (int j = 0; j < CPU_VW; j++)
        s += acc[j];
    return s;
}

/* ------------------------------------------------------------------------ */
/* Linear algebra                                                             */

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T  (+= if accumulate) */
static void cpu_matmul_fwd(float *out, const float *inp, const float *weight, int N, int C, int OC,
                           int accumulate)
{
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) {
        if (!accumulate) cpu_zero(out, (size_t)N * OC);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                accumulate ? 1.0f : 0.0f, out, OC);
}

/* dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp */
static void cpu_matmul_bwd(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, int N, int C, int OC)
{
    if (N <= 0 || C <= 0 || OC <= 0) return;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                    1.0f, dinp, C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                    dweight, C);
}

/* ------------------------------------------------------------------------ */
/* RMSNorm                                                                    */

/* rstd[n] = 1/sqrt(mean(x^2) + eps); out = x * rstd * weight.  rstd may be
 * NULL (inference). */
CPU_SIMD static void cpu_rmsnorm_fwd(float *restrict out, float *restrict rstd,
                                     const float *restrict inp, const float *restrict weight, int N,
                                     int C, float eps)
{
    if (C <= 0) return;
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        float acc[CPU_VW] = {0}, ss = 0.0f;
        int i = 0;
        for (; i + CPU_VW <= C; i += CPU_VW)
            for (int j = 0; j < CPU_VW; j++)
                acc[j] += x[i + j] * x[i + j];
        for (; i < C; i++)
            ss += x[i] * x[i];
        for (int j = 0; j < CPU_VW; j++)
            ss += acc[j];
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        if (rstd) rstd[n] = r;
        i = 0;
        for (; i + CPU_VW <= C; i += CPU_VW)
            for (int j = 0; j < CPU_VW; j++)
                o[i + j] = x[i + j] * r * weight[i + j];
        for (; i < C; i++)
            o[i] = x[i] * r * weight[i];
    }
}

/* With g = dout * weight and r = rstd:
 *   dinp += r * (g - x * r^2 * mean(g * x)),  dweight += dout * x * r. */
CPU_SIMD static void cpu_rmsnorm_bwd(float *restrict dinp, float *restrict dweight,
                                     const float *restrict dout, const float *restrict inp,
                                     const float *restrict weight, const float *restrict rstd,
                                     int N, int C)
{
    if (C <= 0) return;
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        const float *restrict dy = dout + (size_t)n * C;
        float *restrict dx = dinp + (size_t)n * C;
        float r = rstd[n];
        float acc[CPU_VW] = {0}, dot = 0.0f;
        int i = 0;
        for (; i + CPU_VW <= C; i += CPU_VW)
            for (int j = 0; j < CPU_VW; j++)
                acc[j] += dy[i + j] * weight[i + j] * x[i + j];
        for (; i < C; i++)
            dot += dy[i] * weight[i] * x[i];
        for (int j = 0; j < CPU_VW; j++)
            dot += acc[j];
        float c = r * r * r * dot / (float)C;
        i = 0;
        for (; i + CPU_VW <= C; i += CPU_VW)
            for (int j = 0; j < CPU_VW; j++) {
                dx[i + j] += r * dy[i + j] * weight[i + j] - c * x[i + j];
                dweight[i + j] += dy[i + j] * x[i + j] * r;
            }
        for (; i < C; i++) {
            dx[i] += r * dy[i] * weight[i] - c * x[i];
            dweight[i] += dy[i] * x[i] * r;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Rotary position embedding                                                  */

/* cos/sin of t * inv_freq(i) (mal_rope_inv_freq) for t < T, i < hd/2:
 * table[t][i] in `cs` (cos) and `cs + T*hd/2` (sin).  Rows do not depend on
 * T, so a table built for a longer sequence serves shorter ones.  Tables
 * are immutable once published and live until the process exits (a handful
 * of KiB each), so a reader never races with a writer freeing one. */
typedef struct {
    int T, hd;
    mal_rope rope;
    const float *cs;
} rope_table;

#define ROPE_CACHE 8
static rope_table rope_cache[ROPE_CACHE];
static int rope_cache_n;
static pthread_mutex_t rope_lock = PTHREAD_MUTEX_INITIALIZER;

static float *rope_build(int T, int hd, const mal_rope *rope)
{
    int h2 = hd / 2;
    float *cs = malloc((size_t)2 * T * h2 * sizeof *cs);
    if (!cs) return NULL;
    for (int i = 0; i < h2; i++) {
        /* double, so the angle of late positions keeps full float accuracy */
        double freq = mal_rope_inv_freq(rope, hd, i);
        for (int t = 0; t < T; t++) {
            double a = t * freq;
            cs[(size_t)t * h2 + i] = (float)cos(a);
            cs[(size_t)T * h2 + (size_t)t * h2 + i] = (float)sin(a);
        }
    }
    return cs;
}

/* Table with at least T rows for (hd, rope): *rows receives its row count
 * (the sin part starts at rows*hd/2).  *owned is set when the cache is full
 * and the caller must free the result.  NULL: out of memory. */
static const float *rope_get(int T, int hd, const mal_rope *rope, int *rows, int *owned)
{
    const float *cs = NULL;
    *owned = 0;
    pthread_mutex_lock(&rope_lock);
    for (int i = 0; i < rope_cache_n; i++) {
        rope_table *e = &rope_cache[i];
        if (e->hd == hd && mal_rope_same(&e->rope, rope) && e->T >= T) {
            cs = e->cs;
            *rows = e->T;
            break;
        }
    }
    if (!cs) {
        float *built = rope_build(T, hd, rope);
        if (built && rope_cache_n < ROPE_CACHE) {
            rope_cache[rope_cache_n++] = (rope_table){T, hd, *rope, built};
        } else if (built) {
            *owned = 1;
        }
        cs = built;
        *rows = T;
    }
    pthread_mutex_unlock(&rope_lock);
    return cs;
}

/* One head vector v (2*h2): (v[2i], v[2i+1]) rotated by the angle with
 * cosine c[i] and sine dir*s[i]. */
CPU_SIMD static void rope_rotate(float *restrict v, const float *restrict c,
                                 const float *restrict s, int h2, float dir)
{
    for (int i = 0; i < h2; i++) {
        float x0 = v[2 * i], x1 = v[2 * i + 1], si = dir * s[i];
        v[2 * i] = x0 * c[i] - x1 * si;
        v[2 * i + 1] = x0 * si + x1 * c[i];
    }
}

/* Rotate pairs (2i, 2i+1) of every head by +angle (dir = 1) or -angle. */
static void rope_apply(cpu_state *st, float *x, int B, int T, int H, int hd, const mal_rope *rope,
                       float dir)
{
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0) return;
    if (hd % 2) {
        cpu_fail(st, MAL_ERR(MAL_EINVAL,
                         "rope: head dimension %d is odd; RoPE rotates pairs, "
                         "use an even head dimension",
                         hd));
        return;
    }
    int rows, owned, h2 = hd / 2;
    const float *cs = rope_get(T, hd, rope, &rows, &owned);
    if (!cs) {
        cpu_fail(st, MAL_ERR(MAL_ENOMEM, "rope: no memory for a %d x %d cos/sin table", T, h2));
        return;
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *restrict c = cs + (size_t)t * h2;
            const float *restrict s = cs + (size_t)rows * h2 + (size_t)t * h2;
            for (int h = 0; h < H; h++)
                rope_rotate(x + (((size_t)b * T + t) * H + h) * hd, c, s, h2, dir);
        }
    if (owned) free((void *)cs);
}

static void cpu_rope_fwd(cpu_state *st, float *x, int B, int T, int H, int hd,
                         const mal_rope *rope)
{
    rope_apply(st, x, B, T, H, hd, rope, 1.0f);
}

/* The rotation is orthogonal, so its transpose is the inverse rotation. */
static void cpu_rope_bwd(cpu_state *st, float *dx, int B, int T, int H, int hd,
                         const mal_rope *rope)
{
    rope_apply(st, dx, B, T, H, hd, rope, -1.0f);
}

/* ------------------------------------------------------------------------ */
/* Causal self-attention                                                      */

/* Query rows are processed in blocks of this many: block [t0, t1) only needs
 * keys 0..t1-1, so the products skip most of the masked upper triangle. */
#ifndef ATT_BLOCK
#define ATT_BLOCK 64
#endif

/* q, out (B,T,H,hd), k, v (B,T,Hkv,hd); per (b,h) the (T,hd) slices have
 * leading dimension H*hd (queries) and Hkv*hd (keys, values: the head
 * j = mal_attn_kv_head(h)).  P = att[b,h] (T,T): S = Q K^T / sqrt(hd) by
 * sgemm, then a max-subtracted softmax over s <= t, zeros above the
 * diagonal; O = P V. */
static void cpu_attention_fwd(float *out, float *att, const float *q, const float *k,
                              const float *v, int B, int T, mal_attn_heads hs, int hd)
{
    const int H = hs.H;
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0) return;
    const int ld = H * hd, ldk = hs.Hkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t off = (size_t)b * T * ld + (size_t)h * hd;
            size_t koff = (size_t)b * T * ldk + (size_t)mal_attn_kv_head(&hs, h) * hd;
            const float *qh = q + off, *kh = k + koff, *vh = v + koff;
            float *oh = out + off;
            float *P = att + ((size_t)b * H + h) * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                int t1 = MAL_MIN(t0 + ATT_BLOCK, T), rows = t1 - t0;
                float *Pb = P + (size_t)t0 * T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hd, scale,
                            qh + (size_t)t0 * ld, ld, kh, ldk, 0.0f, Pb, T);
                for (int t = t0; t < t1; t++) {
                    float *restrict row = P + (size_t)t * T;
                    float m = vec_max(row, (size_t)t + 1);
                    float sum = vec_exp_sum_inplace(row, (size_t)t + 1, m);
                    vec_scale(row, (size_t)t + 1, 1.0f / sum);
                    cpu_zero(row + t + 1, (size_t)(T - t - 1));
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, t1, 1.0f, Pb, T,
                            vh, ldk, 0.0f, oh + (size_t)t0 * ld, ld);
            }
        }
}

/* Softmax backward on one row of n = t+1 live entries: d holds dP on entry
 * and dS = p * (dP - sum(p * dP)) on return. */
CPU_SIMD static void softmax_bwd_row(float *restrict d, const float *restrict p, size_t n)
{
    float acc[CPU_VW] = {0}, dot = 0.0f;
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            acc[j] += p[i + j] * d[i + j];
    for (; i < n; i++)
        dot += p[i] * d[i];
    for (int j = 0; j < CPU_VW; j++)
        dot += acc[j];
    i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            d[i + j] = p[i + j] * (d[i + j] - dot);
    for (; i < n; i++)
        d[i] = p[i] * (d[i] - dot);
}

/* dP = dO V^T; dS = P * (dP - rowsum(dP * P)); dQ += dS K / sqrt(hd);
 * dK += dS^T Q / sqrt(hd); dV += P^T dO.  dP/dS live in the first T*T
 * floats of scratch (reused for every head, so they stay in cache).  A NULL
 * dq, dk or dv is skipped.  A key/value head shared by several query heads
 * gathers their gradients in query-head order (a fixed summation order). */
static void cpu_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                              const float *q, const float *k, const float *v, const float *att,
                              int B, int T, mal_attn_heads hs, int hd)
{
    const int H = hs.H;
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0) return;
    const int ld = H * hd, ldk = hs.Hkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *S = scratch;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t off = (size_t)b * T * ld + (size_t)h * hd;
            size_t koff = (size_t)b * T * ldk + (size_t)mal_attn_kv_head(&hs, h) * hd;
            const float *qh = q + off, *kh = k + koff, *vh = v + koff, *doh = dout + off;
            const float *P = att + ((size_t)b * H + h) * T * T;
            for (int t0 = 0; t0 < T; t0 += ATT_BLOCK) {
                int t1 = MAL_MIN(t0 + ATT_BLOCK, T), rows = t1 - t0;
                const float *Pb = P + (size_t)t0 * T;
                float *Sb = S + (size_t)t0 * T;
                if (dv)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hd, rows, 1.0f, Pb, T,
                                doh + (size_t)t0 * ld, ld, 1.0f, dv + koff, ldk);
                if (!dq && !dk) continue;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t1, hd, 1.0f,
                            doh + (size_t)t0 * ld, ld, vh, ldk, 0.0f, Sb, T);
                for (int t = t0; t < t1; t++) {
                    softmax_bwd_row(S + (size_t)t * T, P + (size_t)t * T, (size_t)t + 1);
                    /* columns t+1 .. t1-1 of this block enter the products */
                    cpu_zero(S + (size_t)t * T + t + 1, (size_t)(t1 - t - 1));
                }
                if (dq)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, t1, scale, Sb,
                                T, kh, ldk, 1.0f, dq + off + (size_t)t0 * ld, ld);
                if (dk)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hd, rows, scale, Sb, T,
                                qh + (size_t)t0 * ld, ld, 1.0f, dk + koff, ldk);
            }
        }
}

/* ------------------------------------------------------------------------ */
/* Element-wise                                                               */

/* out = silu(gate) * up = gate * up / (1 + e^-gate) */
CPU_SIMD static void cpu_swiglu_fwd(float *restrict out, const float *restrict gate,
                                    const float *restrict up, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            out[i + j] = gate[i + j] * up[i + j] / (1.0f + cpu_expf(-gate[i + j]));
    for (; i < n; i++)
        out[i] = gate[i] * up[i] / (1.0f + cpu_expf(-gate[i]));
}

/* sig = 1/(1+e^-g): dgate += dout * up * sig * (1 + g (1 - sig));
 * dup += dout * g * sig */
static inline void swiglu_grad(float *restrict dg, float *restrict du, float dy, float g, float u)
{
    float sig = 1.0f / (1.0f + cpu_expf(-g));
    *dg += dy * u * sig * (1.0f + g * (1.0f - sig));
    *du += dy * g * sig;
}

CPU_SIMD static void cpu_swiglu_bwd(float *restrict dgate, float *restrict dup,
                                    const float *restrict dout, const float *restrict gate,
                                    const float *restrict up, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            swiglu_grad(&dgate[i + j], &dup[i + j], dout[i + j], gate[i + j], up[i + j]);
    for (; i < n; i++)
        swiglu_grad(&dgate[i], &dup[i], dout[i], gate[i], up[i]);
}

/* out = a + b; out may alias a or b (the residual adds do that). */
CPU_SIMD static void add3(float *restrict out, const float *restrict a, const float *restrict b,
                          size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW)
        for (int j = 0; j < CPU_VW; j++)
            out[i + j] = a[i + j] + b[i + j];
    for (; i < n; i++)
        out[i] = a[i] + b[i];
}

static void cpu_add(float *out, const float *a, const float *b, size_t n)
{
    if (a == b) {
        if (out != a) cpu_copy(out, a, n);
        vec_scale(out, n, 2.0f);
    } else if (out == a) {
        vec_acc(out, b, n);
    } else if (out == b) {
        vec_acc(out, a, n);
    } else {
        add3(out, a, b, n);
    }
}

static void cpu_accumulate(float *y, const float *x, size_t n)
{
    if (y == x)
        vec_scale(y, n, 2.0f);
    else
        vec_acc(y, x, n);
}

static void cpu_scale(float *x, size_t n, float s)
{
    vec_scale(x, n, s);
}

CPU_SIMD static double sumsq_run(const float *restrict x, size_t n)
{
    double acc[8] = {0}, s = 0.0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += (double)x[i + j] * x[i + j];
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    for (int j = 0; j < 8; j++)
        s += acc[j];
    return s;
}

/* ------------------------------------------------------------------------ */
/* Embedding                                                                  */

/* out (N,C) = wte[tokens[n] - v0] for the tokens of rows [v0, v0 + Vl);
 * zero rows for the others (another shard's, or outside [0, V): an
 * error).  Elements of `esz` bytes (the compute dtype's). */
static void cpu_embedding_fwd(cpu_state *st, void *out, const int *tokens, const void *wte, int N,
                              int C, int V, int v0, int Vl, size_t esz)
{
    /* a row is copied, not computed: the same code serves both dtypes */
    const size_t row = (size_t)C * esz;
    for (int n = 0; n < N; n++) {
        char *o = (char *)out + (size_t)n * row;
        const int tok = tokens[n];
        if (tok < 0 || tok >= V) {
            cpu_fail(st, MAL_ERR(MAL_EINVAL,
                             "embedding: token %d at position %d is outside the vocabulary "
                             "[0, %d); check the data file and the vocabulary size",
                             tok, n, V));
            memset(o, 0, row);
            continue;
        }
        if (tok < v0 || tok >= v0 + Vl)
            memset(o, 0, row);
        else
            memcpy(o, (const char *)wte + (size_t)(tok - v0) * row, row);
    }
}

/* dwte[tokens[n] - v0] += dout[n] for the tokens of rows [v0, v0 + Vl);
 * repeated tokens add up. */
static void cpu_embedding_bwd(float *dwte, const float *dout, const int *tokens, int N, int C,
                              int v0, int Vl)
{
    for (int n = 0; n < N; n++) {
        if (tokens[n] < v0 || tokens[n] >= v0 + Vl) continue; /* not this shard's row */
        vec_acc(dwte + (size_t)(tokens[n] - v0) * C, dout + (size_t)n * C, (size_t)C);
    }
}

/* ------------------------------------------------------------------------ */
/* Loss                                                                       */

/* A target outside [0, V) at row n: a NaN loss, a zero gradient row (of
 * `width` columns) and an error from sync(). */
static void bad_target(cpu_state *st, float *losses, float *d, int n, int tgt, int V, int width)
{
    cpu_fail(st, MAL_ERR(MAL_EINVAL,
                         "cross-entropy: target %d at position %d is outside "
                         "the vocabulary [0, %d); check the data file and "
                         "the model's vocab size",
                         tgt, n, V));
    if (losses) losses[n] = NAN;
    if (d) cpu_zero(d, (size_t)width);
}

/* Per row: max (pass 1), e^(x - max) and its sum (pass 2, written straight
 * into dlogits when wanted), then dlogits *= dscale / sum and the one-hot
 * term (pass 3).  The target logit is read before pass 2 because dlogits may
 * be logits.  A target outside [0, V): bad_target. */
static void cpu_xent_fwd_bwd(cpu_state *st, float *losses, float *dlogits, const float *logits,
                             const int *targets, int N, int V, float dscale)
{
    if (V <= 0) return;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float *d = dlogits ? dlogits + (size_t)n * V : NULL;
        int tgt = targets[n];
        if (tgt < 0 || tgt >= V) {
            bad_target(st, losses, d, n, tgt, V, V);
            continue;
        }
        float xt = x[tgt];
        float m = vec_max(x, (size_t)V);
        float sum = d == x ? vec_exp_sum_inplace(d, (size_t)V, m) : vec_exp_sum(d, x, (size_t)V, m);
        /* m - xt is exact (both large when logits are), logf(sum) small */
        if (losses) losses[n] = logf(sum) + (m - xt);
        if (d) {
            vec_scale(d, (size_t)V, dscale / sum);
            d[tgt] -= dscale;
        }
    }
}

/* Per row of this shard's logits (N,Vl): max, sum e^(x - max), and the
 * target's logit where the target is one of columns [v0, v0 + Vl). */
static void cpu_xent_stats(float *stats, const float *logits, const int *targets, int N, int Vl,
                           int v0)
{
    if (Vl <= 0) return;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vl;
        const int t = targets[n] - v0;
        const float m = vec_max(x, (size_t)Vl);
        stats[n] = m;
        stats[N + n] = vec_exp_sum(NULL, x, (size_t)Vl, m);
        stats[2 * N + n] = t >= 0 && t < Vl ? x[t] : 0.0f;
    }
}

/* The shards' statistics `all` (P,3,N) combined in shard order (the sum
 * in double), then the loss and this shard's gradient columns.  With one
 * shard, M is the row max, S its sum (times e^0 = 1) and the gradient
 * e^(x - M) * (dscale / S): xent_fwd_bwd's operations, the same bits. */
static void cpu_xent_combine(cpu_state *st, float *losses, float *dlogits, const float *logits,
                             const float *all, int P, const int *targets, int N, int Vl, int v0,
                             int V, float dscale)
{
    const size_t stride = 3 * (size_t)N;
    for (int n = 0; n < N; n++) {
        const int tgt = targets[n];
        float *d = dlogits ? dlogits + (size_t)n * Vl : NULL;
        if (tgt < 0 || tgt >= V) {
            bad_target(st, losses, d, n, tgt, V, Vl);
            continue;
        }
        float M = all[n], xt = 0.0f;
        for (int p = 1; p < P; p++)
            M = all[p * stride + n] > M ? all[p * stride + n] : M;
        double Sd = 0.0;
        for (int p = 0; p < P; p++) {
            Sd += (double)all[p * stride + N + n] * (double)cpu_expf(all[p * stride + n] - M);
            xt += all[p * stride + 2 * (size_t)N + n];
        }
        const float S = (float)Sd;
        if (losses) losses[n] = logf(S) + (M - xt);
        if (d) {
            const float *x = logits + (size_t)n * Vl;
            if (d == x)
                vec_exp_sum_inplace(d, (size_t)Vl, M);
            else
                vec_exp_sum(d, x, (size_t)Vl, M);
            vec_scale(d, (size_t)Vl, dscale / S);
            if (tgt >= v0 && tgt < v0 + Vl) d[tgt - v0] -= dscale;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Optimizer                                                                  */

/* AdamW, decoupled weight decay (see kernels.h for the formula).  The bias
 * corrections are computed once in double.  (sqrtf keeps this loop scalar
 * unless the build uses -fno-math-errno; it is one pass per step.) */
CPU_SIMD static void cpu_adamw(float *restrict param, const float *restrict grad, float *restrict m,
                               float *restrict v, size_t n, float lr, float beta1, float beta2,
                               float eps, float weight_decay, float grad_scale, int t)
{
    const float ibc1 = (float)(1.0 / (1.0 - pow((double)beta1, t)));
    const float ibc2 = (float)(1.0 / (1.0 - pow((double)beta2, t)));
    const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + a1 * g;
        float vi = beta2 * v[i] + a2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] -= lr * (mi * ibc1 / (sqrtf(vi * ibc2) + eps) + weight_decay * param[i]);
    }
}

/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Instances: handles, memory, queue, events                                 */

/* cpu-opaque's handle offset: real address + 2^62 is non-canonical on
 * x86-64 (user addresses are below 2^47), so the host faults on it. */
#define OPAQUE_OFFSET ((uintptr_t)1 << 62)

static cpu_state *st_of(mal_kern k)
{
    return k->impl;
}

/* The real address behind a device buffer handle (NULL stays NULL). */
static inline void *dev(mal_kern k, const void *p)
{
    return p ? (void *)((uintptr_t)p - st_of(k)->off) : NULL;
}
#define F(p) ((float *)dev(k, (p)))
#define CF(p) ((const float *)dev(k, (p)))

static void *handle(mal_kern k, void *real)
{
    return real ? (void *)((uintptr_t)real + st_of(k)->off) : NULL;
}

static void *op_alloc(mal_kern k, size_t bytes)
{
    return handle(k, blk_alloc(bytes));
}

static void op_free(mal_kern k, void *p)
{
    blk_free(dev(k, p));
}

static void *op_resize(mal_kern k, void *p, size_t old_bytes, size_t new_bytes)
{
    return handle(k, blk_resize(dev(k, p), old_bytes, new_bytes));
}

/* Host memory is never paged out by this backend's own doing; plain
 * aligned memory serves as "pinned". */
static void *op_host_alloc(mal_kern k, size_t bytes)
{
    (void)k;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void op_host_free(mal_kern k, void *p)
{
    (void)k;
    free(p);
}

static void op_zero(mal_kern k, void *x, size_t bytes)
{
    if (bytes) memset(dev(k, x), 0, bytes);
}

static void op_memcpy2d(mal_kern k, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows, mal_copy_kind kind)
{
    char *d = kind == MAL_COPY_D2H ? dst : dev(k, dst);
    const char *s = kind == MAL_COPY_H2D ? src : dev(k, src);
    if (!width || !rows || d == s) return;
    if (rows == 1 || (dpitch == width && spitch == width)) {
        memmove(d, s, width * rows);
        return;
    }
    for (size_t r = 0; r < rows; r++)
        memcpy(d + r * dpitch, s + r * spitch, width);
}

/* Everything already ran; report (and clear) a deferred error. */
static int op_sync(mal_kern k)
{
    return atomic_exchange(&st_of(k)->err, 0);
}

static void op_queue_wait(mal_kern k)
{
    (void)k;
}

/* An event is the process's CPU time when it was recorded: with more ranks
 * than cores (tests, workstations) a rank descheduled by the OS for a few
 * milliseconds is not a slow device, and wall time would say it is. */
struct mal_kern_event {
    double t;
};

static mal_kern_event *op_event_create(mal_kern k)
{
    (void)k;
    return calloc(1, sizeof(mal_kern_event));
}

static void op_event_destroy(mal_kern k, mal_kern_event *e)
{
    (void)k;
    free(e);
}

static void op_event_record(mal_kern k, mal_kern_event *e)
{
    (void)k;
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double op_event_elapsed(mal_kern k, mal_kern_event *a, mal_kern_event *b)
{
    (void)k;
    return b->t - a->t;
}

static void *op_native_queue(mal_kern k)
{
    (void)k;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* bf16 storage                                                               */

/* With compute bf16 the activations and working weights are stored as
 * bf16, as on a GPU, and each operation computes as the GPU kernels do:
 * its bf16 operands widened to fp32 (exactly), the arithmetic in fp32
 * (the fp32 implementations above, unchanged), its bf16 results rounded
 * once to nearest even (mal_bf16_from_f32) when they are stored.  An
 * accumulating output (+=) is widened, added to in fp32 and rounded, as
 * a GPU kernel that reads, adds and stores it.  fp32 operands (rstd,
 * gradients of the parameters, the master, the optimizer's moments, the
 * probabilities attention keeps) stay fp32.  This is what lets the bf16
 * paths of the runtime outside the kernels - the working copy beside the
 * master, its gather in the compute dtype, bf16 messages and reductions
 * on the data plane - run and be tested on machines without a GPU.
 *
 * The fp32 operands live in per-instance buffers that grow to the
 * largest call and are kept (the instance's own memory, like a GPU
 * backend's workspace: not device buffers, not counted by the accountant).
 * No allocation: the operation is skipped and sync() returns MAL_ENOMEM. */

/* x rounded to bf16 bits, mal_bf16_from_f32's arithmetic without its
 * branch (a NaN chosen by mask), so that the loop below vectorises. */
static inline uint16_t bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    uint32_t r = (u + 0x7fffu + (u >> 16 & 1u)) >> 16, q = u >> 16 | 0x0040u;
    return (uint16_t)((q & nan) | (r & ~nan));
}

CPU_SIMD static void narrow_run(uint16_t *restrict b, const float *restrict f, size_t n)
{
    size_t j = 0;
    for (; j + CPU_VW <= n; j += CPU_VW)
        for (size_t e = 0; e < CPU_VW; e++)
            b[j + e] = bf16_round(f[j + e]);
    for (; j < n; j++)
        b[j] = bf16_round(f[j]);
}

CPU_SIMD static void widen_run(float *restrict f, const uint16_t *restrict b, size_t n)
{
    size_t j = 0;
    for (; j + CPU_VW <= n; j += CPU_VW)
        for (size_t e = 0; e < CPU_VW; e++) {
            uint32_t u = (uint32_t)b[j + e] << 16;
            memcpy(&f[j + e], &u, sizeof u);
        }
    for (; j < n; j++)
        f[j] = mal_f32_from_bf16(b[j]);
}

static inline int is_bf16(mal_kern k)
{
    return k->compute == MAL_BF16;
}

/* Slot `i` of the instance, at least n floats; NULL (error recorded) when
 * it cannot grow. */
static float *slot(mal_kern k, int i, size_t n)
{
    cpu_wide *w = &st_of(k)->wide;
    if (!n) n = 1; /* an empty operand still gets a buffer of its own */
    if (n > w->n[i]) {
        float *p = realloc(w->p[i], n * sizeof *p);
        if (!p) {
            cpu_fail(st_of(k), MAL_ERR(MAL_ENOMEM,
                                       "cpu (bf16): out of memory for %zu floats of an "
                                       "operand widened to fp32",
                                       n));
            return NULL;
        }
        w->p[i] = p, w->n[i] = n;
    }
    return w->p[i];
}

/* bf16 buffer h (a handle, n elements) widened into slot i; NULL for a
 * NULL h or no memory (*bad set then). */
static float *widen(mal_kern k, int i, const void *h, size_t n, int *bad)
{
    if (!h) return NULL;
    float *f = slot(k, i, n);
    if (!f) {
        *bad = 1;
        return NULL;
    }
    widen_run(f, dev(k, h), n);
    return f;
}

/* Slot i uninitialised, for an output that is written, not added to. */
static float *outbuf(mal_kern k, int i, const void *h, size_t n, int *bad)
{
    if (!h) return NULL;
    float *f = slot(k, i, n);
    if (!f) *bad = 1;
    return f;
}

/* f (n floats) rounded into bf16 buffer h (a handle; nothing for NULL). */
static void narrow(mal_kern k, void *h, const float *f, size_t n)
{
    if (!h || !f) return;
    narrow_run(dev(k, h), f, n);
}

static void wide_fini(cpu_wide *w)
{
    for (int i = 0; i < W_N; i++)
        free(w->p[i]);
}

/* ------------------------------------------------------------------------ */
/* Instances: operations (translate handles, call the implementations)      */

static void op_matmul_fwd(mal_kern k, void *out, const void *inp, const void *weight, int N, int C,
                          int OC, int accumulate)
{
    if (!is_bf16(k)) {
        cpu_matmul_fwd(F(out), CF(inp), CF(weight), N, C, OC, accumulate);
        return;
    }
    const size_t no = (size_t)N * OC;
    int bad = 0;
    float *i = widen(k, W_A, inp, (size_t)N * C, &bad), *w = widen(k, W_B, weight, (size_t)OC * C, &bad);
    float *o = accumulate ? widen(k, W_C, out, no, &bad) : outbuf(k, W_C, out, no, &bad);
    if (bad) return;
    cpu_matmul_fwd(o, i, w, N, C, OC, accumulate);
    narrow(k, out, o, no);
}

static void op_matmul_bwd(mal_kern k, void *dinp, float *dweight, const void *dout,
                          const void *inp, const void *weight, int N, int C, int OC)
{
    if (!is_bf16(k)) {
        cpu_matmul_bwd(F(dinp), F(dweight), CF(dout), CF(inp), CF(weight), N, C, OC);
        return;
    }
    const size_t ni = (size_t)N * C;
    int bad = 0;
    float *d = widen(k, W_A, dout, (size_t)N * OC, &bad);
    float *i = dweight ? widen(k, W_B, inp, ni, &bad) : NULL;
    float *w = dinp ? widen(k, W_C, weight, (size_t)OC * C, &bad) : NULL;
    float *di = widen(k, W_D, dinp, ni, &bad);
    if (bad) return;
    cpu_matmul_bwd(di, F(dweight), d, i, w, N, C, OC);
    narrow(k, dinp, di, ni);
}

static void op_rmsnorm_fwd(mal_kern k, void *out, float *rstd, const void *inp, const void *weight,
                           int N, int C, float eps)
{
    if (!is_bf16(k)) {
        cpu_rmsnorm_fwd(F(out), F(rstd), CF(inp), CF(weight), N, C, eps);
        return;
    }
    const size_t n = (size_t)N * C;
    int bad = 0;
    float *i = widen(k, W_A, inp, n, &bad), *w = widen(k, W_B, weight, (size_t)C, &bad);
    float *o = outbuf(k, W_C, out, n, &bad);
    if (bad) return;
    cpu_rmsnorm_fwd(o, F(rstd), i, w, N, C, eps);
    narrow(k, out, o, n);
}

static void op_rmsnorm_bwd(mal_kern k, void *dinp, float *dweight, const void *dout,
                           const void *inp, const void *weight, const float *rstd, int N, int C)
{
    if (!is_bf16(k)) {
        cpu_rmsnorm_bwd(F(dinp), F(dweight), CF(dout), CF(inp), CF(weight), CF(rstd), N, C);
        return;
    }
    const size_t n = (size_t)N * C;
    int bad = 0;
    float *d = widen(k, W_A, dout, n, &bad), *i = widen(k, W_B, inp, n, &bad);
    float *w = widen(k, W_C, weight, (size_t)C, &bad), *di = widen(k, W_D, dinp, n, &bad);
    if (bad) return;
    cpu_rmsnorm_bwd(di, F(dweight), d, i, w, CF(rstd), N, C);
    narrow(k, dinp, di, n);
}

static void op_rope(mal_kern k, void *x, int B, int T, int H, int hd, const mal_rope *rope,
                    int inverse)
{
    void (*fn)(cpu_state *, float *, int, int, int, int, const mal_rope *) =
        inverse ? cpu_rope_bwd : cpu_rope_fwd;
    if (!is_bf16(k)) {
        fn(st_of(k), F(x), B, T, H, hd, rope);
        return;
    }
    const size_t n = (size_t)B * T * H * hd;
    int bad = 0;
    float *f = widen(k, W_A, x, n, &bad);
    if (bad) return;
    fn(st_of(k), f, B, T, H, hd, rope);
    narrow(k, x, f, n);
}

static void op_rope_fwd(mal_kern k, void *x, int B, int T, int H, int hd, const mal_rope *rope)
{
    op_rope(k, x, B, T, H, hd, rope, 0);
}

static void op_rope_bwd(mal_kern k, void *dx, int B, int T, int H, int hd, const mal_rope *rope)
{
    op_rope(k, dx, B, T, H, hd, rope, 1);
}

/* The probabilities (B,H,T,T) are kept, in fp32 whatever the compute
 * dtype; the backward reuses T*T floats of its scratch per head, but
 * takes the same size so that a caller may share one buffer for every
 * micro-batch. */
static void op_attention_bytes(mal_kern k, int B, int T, int H, int hd, size_t *saved,
                               size_t *scratch)
{
    (void)k, (void)hd;
    int ovf = 0; /* SIZE_MAX when the size does not fit (kernels.h) */
    size_t bytes = mal_size_mul(mal_size_mul((size_t)B * (size_t)H, (size_t)T * (size_t)T, &ovf),
                                sizeof(float), &ovf);
    if (saved) *saved = bytes;
    if (scratch) *scratch = bytes;
}

static void op_attention_fwd(mal_kern k, void *out, void *saved, const void *q, const void *kk,
                             const void *v, int B, int T, mal_attn_heads hs, int hd)
{
    if (!is_bf16(k)) {
        cpu_attention_fwd(F(out), F(saved), CF(q), CF(kk), CF(v), B, T, hs, hd);
        return;
    }
    const size_t nq = (size_t)B * T * hs.H * hd, nk = (size_t)B * T * hs.Hkv * hd;
    int bad = 0;
    float *fq = widen(k, W_A, q, nq, &bad), *fk = widen(k, W_B, kk, nk, &bad);
    float *fv = widen(k, W_C, v, nk, &bad), *fo = outbuf(k, W_D, out, nq, &bad);
    if (bad) return;
    cpu_attention_fwd(fo, F(saved), fq, fk, fv, B, T, hs, hd);
    narrow(k, out, fo, nq);
}

static void op_attention_bwd(mal_kern k, void *dq, void *dk, void *dv, void *scratch,
                             const void *dout, const void *out, const void *q, const void *kk,
                             const void *v, const void *saved, int B, int T, mal_attn_heads hs,
                             int hd)
{
    (void)out; /* P is kept: the CPU backward needs no rowsum(dout * out) */
    const size_t nq = (size_t)B * T * hs.H * hd, nk = (size_t)B * T * hs.Hkv * hd;
    int bad = 0;
    const float *fdo = CF(dout), *fq = CF(q), *fk = CF(kk), *fv = CF(v);
    float *fdq = F(dq), *fdk = F(dk), *fdv = F(dv);
    if (is_bf16(k)) {
        fdo = widen(k, W_A, dout, nq, &bad), fq = widen(k, W_B, q, nq, &bad);
        fk = widen(k, W_C, kk, nk, &bad), fv = widen(k, W_D, v, nk, &bad);
        fdq = outbuf(k, W_E, dq, nq, &bad), fdk = outbuf(k, W_F, dk, nk, &bad);
        fdv = outbuf(k, W_G, dv, nk, &bad);
        if (bad) return;
    }
    /* the table's contract writes the gradients; the loops accumulate */
    if (fdq) memset(fdq, 0, nq * sizeof(float));
    if (fdk) memset(fdk, 0, nk * sizeof(float));
    if (fdv) memset(fdv, 0, nk * sizeof(float));
    cpu_attention_bwd(fdq, fdk, fdv, F(scratch), fdo, fq, fk, fv, CF(saved), B, T, hs, hd);
    if (is_bf16(k)) {
        narrow(k, dq, fdq, nq);
        narrow(k, dk, fdk, nk);
        narrow(k, dv, fdv, nk);
    }
}

static void op_swiglu_fwd(mal_kern k, void *out, const void *gate, const void *up, size_t n)
{
    if (!is_bf16(k)) {
        cpu_swiglu_fwd(F(out), CF(gate), CF(up), n);
        return;
    }
    int bad = 0;
    float *g = widen(k, W_A, gate, n, &bad), *u = widen(k, W_B, up, n, &bad);
    float *o = outbuf(k, W_C, out, n, &bad);
    if (bad) return;
    cpu_swiglu_fwd(o, g, u, n);
    narrow(k, out, o, n);
}

static void op_swiglu_bwd(mal_kern k, void *dgate, void *dup, const void *dout, const void *gate,
                          const void *up, size_t n)
{
    if (!is_bf16(k)) {
        cpu_swiglu_bwd(F(dgate), F(dup), CF(dout), CF(gate), CF(up), n);
        return;
    }
    int bad = 0;
    float *d = widen(k, W_A, dout, n, &bad), *g = widen(k, W_B, gate, n, &bad);
    float *u = widen(k, W_C, up, n, &bad);
    float *dg = widen(k, W_D, dgate, n, &bad), *du = widen(k, W_E, dup, n, &bad);
    if (bad) return;
    cpu_swiglu_bwd(dg, du, d, g, u, n);
    narrow(k, dgate, dg, n);
    narrow(k, dup, du, n);
}

static void op_add(mal_kern k, void *out, const void *a, const void *b, size_t n)
{
    if (!is_bf16(k)) {
        cpu_add(F(out), CF(a), CF(b), n);
        return;
    }
    int bad = 0;
    float *fa = widen(k, W_A, a, n, &bad), *fb = widen(k, W_B, b, n, &bad);
    if (bad) return;
    cpu_add(fa, fa, fb, n); /* in the first slot: out may alias a or b */
    narrow(k, out, fa, n);
}

static void op_accumulate(mal_kern k, float *y, const float *x, size_t n)
{
    cpu_accumulate(F(y), CF(x), n);
}

static void op_scale(mal_kern k, float *x, size_t n, float s)
{
    cpu_scale(F(x), n, s);
}

/* Run by run into the device-side accumulator, in order: the same sums as
 * adding one sumsq per run on the host. */
static void op_sumsq(mal_kern k, double *acc, const float *x, size_t rows, size_t width,
                     size_t pitch)
{
    double *a = dev(k, acc);
    const float *p = CF(x);
    for (size_t r = 0; r < rows; r++)
        *a += sumsq_run(p + r * pitch, width);
}

static void op_embedding_fwd(mal_kern k, void *out, const int *tokens, const void *wte, int N,
                             int C, int V, int v0, int Vl)
{
    cpu_embedding_fwd(st_of(k), dev(k, out), dev(k, tokens), dev(k, wte), N, C, V, v0, Vl,
                      mal_dtype_bytes(k->compute));
}

static void op_embedding_bwd(mal_kern k, float *dwte, const void *dout, const int *tokens, int N,
                             int C, int v0, int Vl)
{
    int bad = 0;
    const float *d = is_bf16(k) ? widen(k, W_A, dout, (size_t)N * C, &bad) : CF(dout);
    if (bad) return;
    cpu_embedding_bwd(F(dwte), d, dev(k, tokens), N, C, v0, Vl);
}

/* The logits of a bf16 instance: widened into one slot, in which the
 * gradient is then computed in place (the contract lets dlogits alias
 * logits) and rounded into dlogits. */
static float *logits_of(mal_kern k, const void *logits, size_t n, int *bad)
{
    return is_bf16(k) ? widen(k, W_A, logits, n, bad) : (float *)CF(logits);
}

static void op_xent_fwd_bwd(mal_kern k, float *losses, void *dlogits, const void *logits,
                            const int *targets, int N, int V, float dscale)
{
    const size_t n = (size_t)N * V;
    int bad = 0;
    float *x = logits_of(k, logits, n, &bad);
    if (bad) return;
    float *d = !dlogits ? NULL : is_bf16(k) ? x : F(dlogits);
    cpu_xent_fwd_bwd(st_of(k), F(losses), d, x, dev(k, targets), N, V, dscale);
    if (is_bf16(k)) narrow(k, dlogits, d, n);
}

static void op_xent_stats(mal_kern k, float *stats, const void *logits, const int *targets, int N,
                          int Vl, int v0)
{
    int bad = 0;
    float *x = logits_of(k, logits, (size_t)N * Vl, &bad);
    if (bad) return;
    cpu_xent_stats(F(stats), x, dev(k, targets), N, Vl, v0);
}

static void op_xent_combine(mal_kern k, float *losses, void *dlogits, const void *logits,
                            const float *all, int P, const int *targets, int N, int Vl, int v0,
                            int V, float dscale)
{
    const size_t n = (size_t)N * Vl;
    int bad = 0;
    float *x = logits_of(k, logits, n, &bad);
    if (bad) return;
    float *d = !dlogits ? NULL : is_bf16(k) ? x : F(dlogits);
    cpu_xent_combine(st_of(k), F(losses), d, x, CF(all), P, dev(k, targets), N, Vl, v0, V,
                     dscale);
    if (is_bf16(k)) narrow(k, dlogits, d, n);
}

/* work (compute dtype) = master: rounded to bf16, or in fp32 a copy
 * (nothing when the working copy is the master itself). */
static void op_cast_working(mal_kern k, void *work, const float *master, size_t n)
{
    const float *p = CF(master);
    if (!work || !n) return;
    if (is_bf16(k)) {
        narrow(k, work, p, n);
        return;
    }
    float *w = F(work);
    if (w != p) memmove(w, p, n * sizeof *w);
}

static void op_adamw(mal_kern k, float *param, void *work, const float *grad, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t)
{
    cpu_adamw(F(param), CF(grad), F(m), F(v), n, lr, beta1, beta2, eps, weight_decay, grad_scale,
              t);
    op_cast_working(k, work, param, n);
}

static const mal_kernels_ops cpu_ops = {
    .alloc = op_alloc,
    .free = op_free,
    .resize = op_resize,
    .host_alloc = op_host_alloc,
    .host_free = op_host_free,
    .zero = op_zero,
    .memcpy2d = op_memcpy2d,
    .sync = op_sync,
    .queue_wait = op_queue_wait,
    .event_create = op_event_create,
    .event_destroy = op_event_destroy,
    .event_record = op_event_record,
    .event_elapsed = op_event_elapsed,
    .native_queue = op_native_queue,
    .matmul_fwd = op_matmul_fwd,
    .matmul_bwd = op_matmul_bwd,
    .rmsnorm_fwd = op_rmsnorm_fwd,
    .rmsnorm_bwd = op_rmsnorm_bwd,
    .rope_fwd = op_rope_fwd,
    .rope_bwd = op_rope_bwd,
    .attention_bytes = op_attention_bytes,
    .attention_fwd = op_attention_fwd,
    .attention_bwd = op_attention_bwd,
    .swiglu_fwd = op_swiglu_fwd,
    .swiglu_bwd = op_swiglu_bwd,
    .add = op_add,
    .accumulate = op_accumulate,
    .scale = op_scale,
    .sumsq = op_sumsq,
    .embedding_fwd = op_embedding_fwd,
    .embedding_bwd = op_embedding_bwd,
    .xent_fwd_bwd = op_xent_fwd_bwd,
    .xent_stats = op_xent_stats,
    .xent_combine = op_xent_combine,
    .adamw = op_adamw,
    .cast_working = op_cast_working,
};

/* ------------------------------------------------------------------------ */
/* Registry entries                                                           */

static int cpu_probe(void)
{
    return 0;
}

static int create(const char *name, uintptr_t off, const mal_kern_config *cfg, mal_kern *out)
{
    *out = NULL;
    if (cfg->compute != MAL_F32 && cfg->compute != MAL_BF16)
        return MAL_ERR(MAL_EINVAL, "the %s backend computes in fp32 or bf16, not dtype %d", name,
                       (int)cfg->compute);
    mal_kern k = calloc(1, sizeof *k);
    cpu_state *st = calloc(1, sizeof *st);
    if (!k || !st) {
        free(k);
        free(st);
        return MAL_ERR(MAL_ENOMEM, "out of memory creating a %s kernel instance", name);
    }
    st->off = off;
    atomic_init(&st->err, 0);
    k->ops = &cpu_ops;
    k->name = name;
    k->compute = cfg->compute;
    k->host_addressable = off == 0;
    k->impl = st;
    /* OpenBLAS's thread count is per process, as is the machine's set of
     * cores this instance computes on. */
    if (cfg->threads > 0) openblas_set_num_threads(cfg->threads);
    *out = k;
    return 0;
}

static int cpu_create(const mal_kern_config *cfg, mal_kern *out)
{
    return create("cpu", 0, cfg, out);
}

static int opaque_create(const mal_kern_config *cfg, mal_kern *out)
{
    return create("cpu-opaque", OPAQUE_OFFSET, cfg, out);
}

static void cpu_destroy(mal_kern k)
{
    if (!k) return;
    cpu_state *st = k->impl;
    if (st) wide_fini(&st->wide);
    free(st);
    free(k);
}

const mal_kern_backend mal_kern_backend_cpu = {
    .reg = {.name = "cpu", .probe = cpu_probe},
    .what = "CPU cores, OpenBLAS (fp32; bf16 storage with fp32 arithmetic)",
    .is_default = 1,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .dtypes = 1u << MAL_F32 | 1u << MAL_BF16,
    .default_compute = MAL_F32,
};

const mal_kern_backend mal_kern_backend_cpu_opaque = {
    .reg = {.name = "cpu-opaque", .probe = cpu_probe},
    .what = "test backend: cpu whose buffers the host cannot dereference",
    .is_default = 0,
    .create = opaque_create,
    .destroy = cpu_destroy,
    .dtypes = 1u << MAL_F32 | 1u << MAL_BF16,
    .default_compute = MAL_F32,
};
