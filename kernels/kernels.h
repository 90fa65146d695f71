/* The table of compute operations that the model and optimizer run on.
 *
 * One table per backend (CPU now; CUDA behind the same table later).  All
 * float / int pointers passed to the operations are *device* buffers obtained
 * from mal_kern_alloc() of the same backend; the model never dereferences
 * them on the host.  Host <-> device traffic goes through mal_kern_to_host()
 * and mal_kern_from_host().
 *
 * Operations are void: a backend may queue them asynchronously.  Errors are
 * reported by mal_kern_sync(), which waits for everything queued so far and
 * returns 0 or a negative MAL_E* code.  Compute-time measurement (the
 * straggler monitor) brackets work with mal_kern_sync().
 *
 * Conventions (row-major everywhere):
 *   N = B*T tokens, C = d_model, OC = output channels, V = vocab,
 *   H = heads (local to this TP rank), hd = head dimension.
 *   Backward operations ACCUMULATE (+=) into every gradient they produce; the
 *   caller zeroes gradient buffers when needed.  A NULL gradient pointer means
 *   "not needed" where stated.
 */
#ifndef MAL_KERNELS_H
#define MAL_KERNELS_H

#include <stddef.h>

typedef struct mal_kernels_ops mal_kernels_ops;

struct mal_kernels_ops {
    const char *name; /* "cpu", "cuda" */

    /* --- memory ------------------------------------------------------- */
    void *(*alloc)(size_t bytes);          /* zero-filled; NULL on failure */
    void (*free)(void *p);
    /* Grow or shrink block p (from alloc, `old_bytes` long) to `new_bytes`,
     * keeping the first min(old, new) bytes; what is added is zero.  May
     * move it (p is then invalid); NULL on failure (p is then untouched). */
    void *(*resize)(void *p, size_t old_bytes, size_t new_bytes);
    void (*zero)(float *x, size_t n);
    void (*copy)(float *dst, const float *src, size_t n); /* device to device */
    void (*to_host)(void *host_dst, const void *dev_src, size_t bytes);
    void (*from_host)(void *dev_dst, const void *host_src, size_t bytes);
    int (*sync)(void); /* wait for queued work; 0 or MAL_E* */

    /* --- linear algebra ----------------------------------------------- */
    /* out (N,OC) = inp (N,C) @ weight (OC,C)^T, or += when accumulate != 0 */
    void (*matmul_fwd)(float *out, const float *inp, const float *weight, int N,
                       int C, int OC, int accumulate);
    /* dinp (N,C) += dout (N,OC) @ weight (OC,C);
     * dweight (OC,C) += dout (N,OC)^T @ inp (N,C).
     * dinp or dweight may be NULL (not computed). */
    void (*matmul_bwd)(float *dinp, float *dweight, const float *dout,
                       const float *inp, const float *weight, int N, int C,
                       int OC);

    /* --- normalisation ------------------------------------------------ */
    /* RMSNorm: rstd[n] = 1/sqrt(mean_c(inp[n,c]^2) + eps);
     * out (N,C) = inp * rstd * weight (C). */
    void (*rmsnorm_fwd)(float *out, float *rstd, const float *inp,
                        const float *weight, int N, int C, float eps);
    /* dinp (N,C) += ..., dweight (C) += ... (both required) */
    void (*rmsnorm_bwd)(float *dinp, float *dweight, const float *dout,
                        const float *inp, const float *weight,
                        const float *rstd, int N, int C);

    /* --- rotary position embedding ------------------------------------ */
    /* In place on x (B,T,H,hd), hd even.  Pairs (2i, 2i+1) of each head are
     * rotated by angle t * theta^(-2i/hd), t = position 0..T-1 (the
     * interleaved convention of the original LLaMA code). */
    void (*rope_fwd)(float *x, int B, int T, int H, int hd, float theta);
    /* In place on dx (B,T,H,hd): the transpose (inverse rotation). */
    void (*rope_bwd)(float *dx, int B, int T, int H, int hd, float theta);

    /* --- causal self-attention ---------------------------------------- */
    /* q, k, v, out: (B,T,H,hd).  att (B,H,T,T) receives the softmax
     * probabilities P[b,h,t,s] = softmax_s<=t(q_t . k_s / sqrt(hd)), zero for
     * s > t.  out[b,t,h] = sum_s P[b,h,t,s] v[b,s,h]. */
    void (*attention_fwd)(float *out, float *att, const float *q,
                          const float *k, const float *v, int B, int T, int H,
                          int hd);
    /* dq, dk, dv (B,T,H,hd) +=; scratch: B*H*T*T floats, contents undefined
     * on return. */
    void (*attention_bwd)(float *dq, float *dk, float *dv, float *scratch,
                          const float *dout, const float *q, const float *k,
                          const float *v, const float *att, int B, int T,
                          int H, int hd);

    /* --- elementwise ---------------------------------------------------- */
    /* SwiGLU: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x) */
    void (*swiglu_fwd)(float *out, const float *gate, const float *up,
                       size_t n);
    /* dgate, dup (n) += */
    void (*swiglu_bwd)(float *dgate, float *dup, const float *dout,
                       const float *gate, const float *up, size_t n);
    /* out = a + b (out may alias a or b) */
    void (*add)(float *out, const float *a, const float *b, size_t n);
    /* y += x */
    void (*accumulate)(float *y, const float *x, size_t n);
    /* x *= s */
    void (*scale)(float *x, size_t n, float s);
    /* returns sum_i x[i]^2 in double precision (synchronises) */
    double (*sumsq)(const float *x, size_t n);

    /* --- embedding ------------------------------------------------------ */
    /* out (N,C) = wte[tokens[n]] ; wte (V,C); tokens (N) int32 */
    void (*embedding_fwd)(float *out, const int *tokens, const float *wte,
                          int N, int C);
    /* dwte (V,C) += scatter of dout (N,C) by tokens */
    void (*embedding_bwd)(float *dwte, const float *dout, const int *tokens,
                          int N, int C);

    /* --- loss ----------------------------------------------------------- */
    /* Softmax cross-entropy over V classes, fused with its gradient.
     * losses (N) = logsumexp(logits[n]) - logits[n, targets[n]];
     * if dlogits != NULL: dlogits (N,V) = (softmax(logits[n]) - onehot) *
     * dscale  (written, not accumulated; dlogits may alias logits). */
    void (*xent_fwd_bwd)(float *losses, float *dlogits, const float *logits,
                         const int *targets, int N, int V, float dscale);

    /* --- optimizer ------------------------------------------------------ */
    /* AdamW with decoupled weight decay, over n elements, step t >= 1:
     *   g = grad * grad_scale
     *   m = beta1 m + (1-beta1) g ;  v = beta2 v + (1-beta2) g^2
     *   mhat = m / (1-beta1^t) ;  vhat = v / (1-beta2^t)
     *   param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param) */
    void (*adamw)(float *param, const float *grad, float *m, float *v,
                  size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, int t);
};

/* Backends.  mal_kernels_cpu is always present. */
extern const mal_kernels_ops mal_kernels_cpu;

/* Set the number of threads the CPU backend (and its BLAS) may use. */
void mal_kernels_cpu_set_threads(int n);

/* Inline wrappers so that call sites read like function calls on a backend
 * handle rather than `k->f(...)` everywhere. */
typedef const mal_kernels_ops *mal_kern;

static inline void *mal_kern_alloc(mal_kern kern, size_t bytes) { return kern->alloc(bytes); }
static inline void mal_kern_free(mal_kern kern, void *p) { kern->free(p); }
static inline void *mal_kern_resize(mal_kern kern, void *p, size_t old_bytes, size_t new_bytes)
{
    return kern->resize(p, old_bytes, new_bytes);
}
static inline int mal_kern_sync(mal_kern kern) { return kern->sync(); }

static inline void mal_kern_zero(mal_kern kern, float *x, size_t n)
{
    kern->zero(x, n);
}

static inline void mal_kern_copy(mal_kern kern, float *dst, const float *src, size_t n)
{
    kern->copy(dst, src, n);
}

static inline void mal_kern_to_host(mal_kern kern, void *host_dst, const void *dev_src, size_t bytes)
{
    kern->to_host(host_dst, dev_src, bytes);
}

static inline void mal_kern_from_host(mal_kern kern, void *dev_dst, const void *host_src, size_t bytes)
{
    kern->from_host(dev_dst, host_src, bytes);
}

static inline void mal_kern_matmul_fwd(mal_kern kern, float *out, const float *inp, const float *weight, int N, int C, int OC, int accumulate)
{
    kern->matmul_fwd(out, inp, weight, N, C, OC, accumulate);
}

static inline void mal_kern_matmul_bwd(mal_kern kern, float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, int N, int C, int OC)
{
    kern->matmul_bwd(dinp, dweight, dout, inp, weight, N, C, OC);
}

static inline void mal_kern_rmsnorm_fwd(mal_kern kern, float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps)
{
    kern->rmsnorm_fwd(out, rstd, inp, weight, N, C, eps);
}

static inline void mal_kern_rmsnorm_bwd(mal_kern kern, float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, const float *rstd, int N, int C)
{
    kern->rmsnorm_bwd(dinp, dweight, dout, inp, weight, rstd, N, C);
}

static inline void mal_kern_rope_fwd(mal_kern kern, float *x, int B, int T, int H, int hd, float theta)
{
    kern->rope_fwd(x, B, T, H, hd, theta);
}

static inline void mal_kern_rope_bwd(mal_kern kern, float *dx, int B, int T, int H, int hd, float theta)
{
    kern->rope_bwd(dx, B, T, H, hd, theta);
}

static inline void mal_kern_attention_fwd(mal_kern kern, float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int H, int hd)
{
    kern->attention_fwd(out, att, q, k, v, B, T, H, hd);
}

static inline void mal_kern_attention_bwd(mal_kern kern, float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *q, const float *k, const float *v, const float *att, int B, int T, int H, int hd)
{
    kern->attention_bwd(dq, dk, dv, scratch, dout, q, k, v, att, B, T, H, hd);
}

static inline void mal_kern_swiglu_fwd(mal_kern kern, float *out, const float *gate, const float *up, size_t n)
{
    kern->swiglu_fwd(out, gate, up, n);
}

static inline void mal_kern_swiglu_bwd(mal_kern kern, float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n)
{
    kern->swiglu_bwd(dgate, dup, dout, gate, up, n);
}

static inline void mal_kern_add(mal_kern kern, float *out, const float *a, const float *b, size_t n)
{
    kern->add(out, a, b, n);
}

static inline void mal_kern_accumulate(mal_kern kern, float *y, const float *x, size_t n)
{
    kern->accumulate(y, x, n);
}

static inline void mal_kern_scale(mal_kern kern, float *x, size_t n, float s)
{
    kern->scale(x, n, s);
}

static inline double mal_kern_sumsq(mal_kern kern, const float *x, size_t n)
{
    return kern->sumsq(x, n);
}

static inline void mal_kern_embedding_fwd(mal_kern kern, float *out, const int *tokens, const float *wte, int N, int C)
{
    kern->embedding_fwd(out, tokens, wte, N, C);
}

static inline void mal_kern_embedding_bwd(mal_kern kern, float *dwte, const float *dout, const int *tokens, int N, int C)
{
    kern->embedding_bwd(dwte, dout, tokens, N, C);
}

static inline void mal_kern_xent_fwd_bwd(mal_kern kern, float *losses, float *dlogits, const float *logits, const int *targets, int N, int V, float dscale)
{
    kern->xent_fwd_bwd(losses, dlogits, logits, targets, N, V, dscale);
}

static inline void mal_kern_adamw(mal_kern kern, float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    kern->adamw(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
}

#endif /* MAL_KERNELS_H */
