/* The table of compute operations that the model and optimizer run on, and
 * the registry of its backends by name.
 *
 * A backend (kernels/cpu.c, later kernels/cuda/) exports one
 * mal_kern_backend; mal_kern_create() looks it up by name ("cpu",
 * "cpu-opaque", "cuda") and returns an *instance* (mal_kern): the ops table
 * plus the backend's state for one device - on a GPU its stream, its
 * cuBLASLt handle and workspace.  Every operation receives the instance;
 * call sites use the inline mal_kern_* wrappers below.
 *
 * Buffers.  Pointers passed to operations are *device buffers* obtained
 * from mal_kern_alloc() of the same instance, except where an argument is
 * named host_*.  Host code never dereferences a device buffer, memcpy()s or
 * memset()s it: bytes move only through the copy operations (memcpy2d and
 * its wrappers), so the same code runs whether buffers live in host or in
 * device memory.  `host_addressable` says whether the host may dereference
 * this instance's device buffers; consumers that take a zero-copy path
 * (the MPI data plane) check it and stage through pinned host buffers
 * (mal_kern_host_alloc) where it is 0.  Pointer arithmetic on device
 * buffers (views at an offset) is allowed; dereferencing is not.  The
 * cpu-opaque backend enforces this: its buffer handles fault on any host
 * access.
 *
 * Element types (DESIGN.md, "Precision").  The model's *state* is fp32
 * whatever the backend computes in: master parameters, gradients (fp32
 * accumulation: a bf16 matrix product's backward adds into fp32 gradients,
 * as Megatron's main_grad) and both Adam moments, so snapshots and
 * gradient sync never depend on the compute type.  The instance's
 * `compute` dtype (mal_dtype) is what activations, backward scratch and
 * the *working copy* of the weights hold; with MAL_F32 the working copy is
 * the master parameters themselves (same memory, no copy).  In the
 * signatures below:
 *   void *       - compute dtype of the instance (activations, working
 *                  weights, activation gradients), n = element count;
 *   float *      - fp32 always (master parameters, gradients, Adam
 *                  moments, RMSNorm statistics, per-token losses);
 *   int *        - int32 token ids.
 * The optimizer updates the fp32 master and refreshes the working copy in
 * the same pass (a fused cast; nothing when they alias).  The CPU backends
 * compute in fp32 (the default) or store bf16 and compute in fp32 as a
 * GPU's kernels do (each operand widened, each result rounded once): the
 * runtime's bf16 paths run without a GPU.
 *
 * Execution queue.  Operations are void and may run asynchronously, in
 * issue order, on the instance's queue (a CUDA stream; the CPU backends run
 * each operation to completion on the calling thread before returning, so
 * their queue is trivially in order).  Host memory named in a copy may be
 * read or written until the queue has passed that copy: wait with
 * queue_wait() or sync() before touching it.  Errors an operation cannot
 * return are kept and reported by the next sync(), which also waits for
 * everything queued; queue_wait() waits without taking the error.  Device
 * time is measured with events (event_record / event_elapsed) on the queue,
 * never by host clocks around asynchronous work.
 *
 * Shapes (row-major everywhere): N = B*T tokens, C = d_model,
 * OC = output channels, V = vocab, H = heads (local to this TP rank),
 * hd = head dimension.  Backward operations ACCUMULATE (+=) into every
 * gradient they produce; the caller zeroes gradient buffers when needed.
 * A NULL gradient pointer means "not needed" where stated.
 */
#ifndef MAL_KERNELS_H
#define MAL_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/mal.h"
#include "base/registry.h"

/* Element types of compute buffers.  State buffers are always MAL_F32.
 * MAL_DTYPE_AUTO, in a mal_kern_config only, asks for the backend's
 * default (mal_kern_backend.default_compute: bf16 on GPUs, fp32 on CPUs). */
typedef enum { MAL_DTYPE_AUTO = -1, MAL_F32 = 0, MAL_BF16 = 1 } mal_dtype;

/* Bytes per element of dtype t. */
static inline size_t mal_dtype_bytes(mal_dtype t) { return t == MAL_BF16 ? 2 : 4; }
/* "fp32", "bf16". */
static inline const char *mal_dtype_name(mal_dtype t) { return t == MAL_BF16 ? "bf16" : "fp32"; }

/* Local, pure.  The bf16 bits of x, rounded to nearest, ties to even (as
 * torch's x.to(torch.bfloat16)); NaN stays a quiet NaN of the same sign.
 * (Host code: malleus-export's bf16 files, the MPI data plane's bf16
 * reductions.) */
static inline uint16_t mal_bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x0040u); /* quiet NaN */
    /* Round to nearest, ties to even: add just under half an ulp of bf16,
     * plus one when the bit that stays lowest is odd.  Overflow carries
     * into the exponent and gives infinity, as it should. */
    u += 0x7fffu + (u >> 16 & 1u);
    return (uint16_t)(u >> 16);
}

/* Local, pure.  The float of bf16 bits b (exact). */
static inline float mal_f32_from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Rotary position embedding: pair i of a head of dimension hd turns by
 * angle t * inv_freq(i) at position t, inv_freq(i) = theta^(-2i/hd), or
 * with `llama3` set rescaled as Hugging Face's LlamaForCausalLM does for
 * rope_type "llama3" (transformers 4.44, _compute_llama3_parameters):
 * with wavelength w = 2 pi / inv_freq and the thresholds
 * original_max_pos / high_freq_factor < original_max_pos / low_freq_factor,
 * a short wavelength (w < the first) keeps its frequency, a long one
 * (w > the second) is divided by `factor`, and one between is
 * interpolated: (1 - s) inv_freq / factor + s inv_freq with
 * s = (original_max_pos / w - low_freq_factor) / (high_freq_factor -
 * low_freq_factor). */
typedef struct {
    float theta;           /* base (rope_theta) */
    int llama3;            /* 1: the llama3 frequency scaling below */
    float factor;          /* long wavelengths are divided by it (>= 1) */
    float low_freq_factor; /* thresholds, 0 < low < high */
    float high_freq_factor;
    int original_max_pos; /* context length the frequencies were trained for */
} mal_rope;

/* Local, pure.  The unscaled rotary parameters of base theta. */
static inline mal_rope mal_rope_plain(float theta)
{
    mal_rope r = {theta, 0, 1.0f, 1.0f, 1.0f, 0};
    return r;
}

/* Local, pure.  inv_freq(i) of pair i < hd/2, in double (every backend
 * builds its cos/sin tables from it). */
static inline double mal_rope_inv_freq(const mal_rope *r, int hd, int i)
{
    double inv = pow((double)r->theta, -2.0 * i / hd);
    if (!r->llama3) return inv;
    const double pi = 3.14159265358979323846, orig = r->original_max_pos;
    const double low = r->low_freq_factor, high = r->high_freq_factor, f = r->factor;
    const double wavelen = 2.0 * pi / inv;
    if (wavelen < orig / high) return inv;    /* high frequency: kept */
    if (wavelen > orig / low) return inv / f; /* low frequency: divided */
    const double s = (orig / wavelen - low) / (high - low);
    return (1.0 - s) * inv / f + s * inv;
}

/* Local, pure.  1 when a and b rotate alike. */
static inline int mal_rope_same(const mal_rope *a, const mal_rope *b)
{
    return a->theta == b->theta && a->llama3 == b->llama3 &&
           (!a->llama3 || (a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
                           a->high_freq_factor == b->high_freq_factor &&
                           a->original_max_pos == b->original_max_pos));
}

/* Heads of one attention call (grouped-query attention).  H query heads
 * read Hkv key/value heads: query head h (0 <= h < H) reads key/value head
 * (h + q_off) / group.  Multi-head attention is {H, H, 1, 0}.  A TP rank
 * holding query heads [h0, h0 + H) of a model whose key/value heads each
 * serve `group` query heads holds the key/value heads h0 / group ..
 * (h0 + H - 1) / group, and q_off = h0 mod group (src/model.c). */
typedef struct {
    int H, Hkv, group, q_off;
} mal_attn_heads;

/* Local, pure.  Multi-head attention over H heads. */
static inline mal_attn_heads mal_attn_mha(int H)
{
    mal_attn_heads a = {H, H, 1, 0};
    return a;
}

/* Local, pure.  The key/value head query head h reads. */
static inline int mal_attn_kv_head(const mal_attn_heads *a, int h)
{
    return (h + a->q_off) / a->group;
}

/* Directions of memcpy2d (cudaMemcpy2DAsync's, without host to host). */
typedef enum {
    MAL_COPY_D2D = 0, /* device buffer to device buffer of the same instance */
    MAL_COPY_D2H = 1, /* device buffer to host memory (pinned or not) */
    MAL_COPY_H2D = 2, /* host memory to device buffer */
} mal_copy_kind;

typedef struct mal_kernels mal_kernels;
typedef mal_kernels *mal_kern;
typedef struct mal_kernels_ops mal_kernels_ops;
typedef struct mal_kern_event mal_kern_event;
struct mal_kern_host_pool;
struct mal_kern_mem;

/* What ops->device_info reports. */
typedef struct {
    char name[96];     /* e.g. "NVIDIA H100 80GB HBM3" */
    double used_bytes; /* device memory in use now (every process's) */
    double total_bytes;
} mal_kern_device_info;

/* One tensor of a multi-tensor AdamW (ops->adamw_multi): elements
 * [offset, offset + n) of each of the call's buffers, with its own weight
 * decay (0 for the tensors that take none). */
typedef struct {
    size_t offset, n;
    float weight_decay;
} mal_kern_span;

/* One run of a multi-tensor sum of squares (ops->sumsq_multi): sumsq's x,
 * rows, width, pitch. */
typedef struct {
    const float *x;
    size_t rows, width, pitch;
} mal_kern_run;

/* What the call-site wrappers below count, per instance: the operations
 * the callers asked of the table (mal_kern_counts_get).  A backend turns
 * each into its own work: on a GPU a compute operation is one or a few
 * kernel launches, zero a memset, sync and queue_wait a full wait for the
 * queue (a drain), event_elapsed a wait for one event. */
typedef enum {
    MAL_KOP_ZERO, /* zero, or zero_multi of several buffers */
    MAL_KOP_COPY, /* memcpy2d and its wrappers, any direction */
    MAL_KOP_SYNC,
    MAL_KOP_QUEUE_WAIT,
    MAL_KOP_EVENT_WAIT, /* event_elapsed */
    MAL_KOP_MATMUL_FWD,
    MAL_KOP_MATMUL_BWD,
    MAL_KOP_RMSNORM_FWD,
    MAL_KOP_RMSNORM_BWD,
    MAL_KOP_ROPE, /* forward or backward */
    MAL_KOP_ATTENTION_FWD,
    MAL_KOP_ATTENTION_BWD,
    MAL_KOP_SWIGLU_FWD,
    MAL_KOP_SWIGLU_BWD,
    MAL_KOP_ELEMENTWISE, /* add, accumulate, scale */
    MAL_KOP_EMBEDDING_FWD,
    MAL_KOP_EMBEDDING_BWD,
    MAL_KOP_XENT, /* xent_fwd_bwd, xent_stats, xent_combine */
    MAL_KOP_SUMSQ,
    MAL_KOP_SUMSQ_MULTI,
    MAL_KOP_ADAMW,
    MAL_KOP_ADAMW_MULTI,
    MAL_KOP_CAST, /* cast_working */
    MAL_KOP_N
} mal_kern_op;

/* What to create an instance with. */
typedef struct {
    mal_dtype compute; /* compute dtype (MAL_F32) */
    int threads;       /* CPU backends: BLAS threads (0: leave the library's choice) */
    int device;        /* GPU backends: device ordinal (-1: the backend's choice) */
} mal_kern_config;

/* MAL_F32, threads 0, device -1. */
mal_kern_config mal_kern_config_default(void);

/* One instance of a backend.  Created and destroyed by the registry
 * (mal_kern_create / mal_kern_destroy); the fields are read-only to
 * everyone but the backend. */
struct mal_kernels {
    const mal_kernels_ops *ops;
    const char *name;     /* the backend's registry name */
    mal_dtype compute;    /* element type of activations and working weights */
    int host_addressable; /* 1: the host may dereference device buffers */
    void *impl;           /* backend state (queue, handles, workspace) */
    struct mal_kern_host_pool *host_pool; /* pinned buffers (kernels/hostpool.c) */
    struct mal_kern_mem *mem;             /* the memory accountant (kernels/memacct.c) */
    unsigned long long counts[MAL_KOP_N]; /* the wrappers' counts (mal_kern_counts_get) */
};

struct mal_kernels_ops {
    /* --- memory ------------------------------------------------------- */
    /* Device buffer of `bytes`, zero-filled; NULL on failure. */
    void *(*alloc)(mal_kern k, size_t bytes);
    void (*free)(mal_kern k, void *p);
    /* Grow or shrink device buffer p (from alloc, `old_bytes` long) to
     * `new_bytes`, keeping the first min(old, new) bytes; what is added is
     * zero.  May move it (p is then invalid); NULL on failure (p is then
     * untouched). */
    void *(*resize)(mal_kern k, void *p, size_t old_bytes, size_t new_bytes);
    /* Pinned (page-locked) host memory for staging transfers: host
     * addressable whatever the backend, uninitialised; NULL on failure.
     * The backend's own pinning and unpinning, called by the pool of
     * pinned buffers (mal_kern_host_alloc below) only: callers never call
     * these directly. */
    void *(*host_alloc)(mal_kern k, size_t bytes);
    void (*host_free)(mal_kern k, void *p);
    /* bytes of device buffer x = 0 (queued). */
    void (*zero)(mal_kern k, void *x, size_t bytes);
    /* Optional (NULL: mal_kern_zero_multi calls zero per buffer).  bytes[i]
     * of device buffer bufs[i] = 0 for each of `count` buffers (queued),
     * in as few launches as the backend can. */
    void (*zero_multi)(mal_kern k, void *const *bufs, const size_t *bytes, int count);
    /* Strided 2-D copy (queued), cudaMemcpy2DAsync's semantics: `rows` runs
     * of `width` bytes, the i-th from src + i*spitch to dst + i*dpitch
     * (pitches >= width when rows > 1).  `kind` says which side is device
     * memory.  Runs must not overlap unless dst == src. */
    void (*memcpy2d)(mal_kern k, void *dst, size_t dpitch, const void *src, size_t spitch,
                     size_t width, size_t rows, mal_copy_kind kind);

    /* --- queue and time ----------------------------------------------- */
    /* Wait for everything queued; return the first deferred error since
     * the last sync (and clear it), or 0. */
    int (*sync)(mal_kern k);
    /* Wait for everything queued; deferred errors stay for sync(). */
    void (*queue_wait)(mal_kern k);
    /* Events mark a point of the queue.  create: NULL on failure. */
    mal_kern_event *(*event_create)(mal_kern k);
    void (*event_destroy)(mal_kern k, mal_kern_event *e);
    /* Record e at the current end of the queue (queued). */
    void (*event_record)(mal_kern k, mal_kern_event *e);
    /* Device seconds between two recorded events; waits for `b`.  For the
     * CPU backends this is the process's CPU time between the two records
     * (a rank descheduled by the OS is not a slow device). */
    double (*event_elapsed)(mal_kern k, mal_kern_event *a, mal_kern_event *b);
    /* The native queue (a cudaStream_t for CUDA) for other libraries that
     * must order their work against this instance (NCCL); NULL for CPU. */
    void *(*native_queue)(mal_kern k);

    /* --- linear algebra ----------------------------------------------- */
    /* out (N,OC) = inp (N,C) @ weight (OC,C)^T, or += when accumulate != 0 */
    void (*matmul_fwd)(mal_kern k, void *out, const void *inp, const void *weight, int N, int C,
                       int OC, int accumulate);
    /* dinp (N,C) += dout (N,OC) @ weight (OC,C);
     * dweight (OC,C, fp32) += dout (N,OC)^T @ inp (N,C).
     * dinp or dweight may be NULL (not computed). */
    void (*matmul_bwd)(mal_kern k, void *dinp, float *dweight, const void *dout, const void *inp,
                       const void *weight, int N, int C, int OC);

    /* --- normalisation ------------------------------------------------ */
    /* RMSNorm: rstd[n] = 1/sqrt(mean_c(inp[n,c]^2) + eps) (fp32);
     * out (N,C) = inp * rstd * weight (C, working weights). */
    void (*rmsnorm_fwd)(mal_kern k, void *out, float *rstd, const void *inp, const void *weight,
                        int N, int C, float eps);
    /* dinp (N,C) += ..., dweight (C, fp32) += ... (both required) */
    void (*rmsnorm_bwd)(mal_kern k, void *dinp, float *dweight, const void *dout, const void *inp,
                        const void *weight, const float *rstd, int N, int C);

    /* --- rotary position embedding ------------------------------------ */
    /* In place on x (B,T,H,hd), hd even.  Pairs (2i, 2i+1) of each head are
     * rotated by angle t * mal_rope_inv_freq(rope, hd, i), t = position
     * 0..T-1 (the interleaved convention of the original LLaMA code). */
    void (*rope_fwd)(mal_kern k, void *x, int B, int T, int H, int hd, const mal_rope *rope);
    /* In place on dx (B,T,H,hd): the transpose (inverse rotation). */
    void (*rope_bwd)(mal_kern k, void *dx, int B, int T, int H, int hd, const mal_rope *rope);

    /* --- causal self-attention ---------------------------------------- */
    /* Bytes the forward pass keeps for the backward (`saved`) and the
     * backward's scratch needs, for one call of shape (B, T, H, hd), H
     * query heads.  The CPU backend keeps the probabilities (B,H,T,T) in
     * both; a fused (flash) backend keeps a row statistic per query
     * instead.  SIZE_MAX when a size does not fit a size_t. */
    void (*attention_bytes)(mal_kern k, int B, int T, int H, int hd, size_t *saved,
                            size_t *scratch);
    /* Grouped-query attention with the heads `hs` (mal_attn_heads): q, out
     * (B,T,H,hd); k, v (B,T,Hkv,hd).  For query head h reading key/value
     * head j = mal_attn_kv_head(&hs, h):
     * out[b,t,h] = sum_{s<=t} P[b,h,t,s] v[b,s,j] with
     * P = softmax_s<=t(q[b,t,h] . k[b,s,j] / sqrt(hd)); `saved`
     * (attention_bytes) receives what the backward needs (CPU: P, zero
     * for s > t). */
    void (*attention_fwd)(mal_kern k, void *out, void *saved, const void *q, const void *kk,
                          const void *v, int B, int T, mal_attn_heads hs, int hd);
    /* dq (B,T,H,hd), dk, dv (B,T,Hkv,hd) are WRITTEN (a key/value head
     * gathers the gradients of every query head that reads it; the
     * backend zeroes first where its kernels accumulate, so that a fused
     * backward that writes them needs no zeroing or extra pass); scratch:
     * attention_bytes' scratch, contents undefined on return.  A NULL dq,
     * dk or dv is skipped.  `out` is the forward's output (a fused
     * backward needs rowsum(dout * out) per query; the CPU backend, which
     * keeps P, does not read it). */
    void (*attention_bwd)(mal_kern k, void *dq, void *dk, void *dv, void *scratch,
                          const void *dout, const void *out, const void *q, const void *kk,
                          const void *v, const void *saved, int B, int T, mal_attn_heads hs,
                          int hd);

    /* --- elementwise ---------------------------------------------------- */
    /* SwiGLU: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x) */
    void (*swiglu_fwd)(mal_kern k, void *out, const void *gate, const void *up, size_t n);
    /* dgate, dup (n) += */
    void (*swiglu_bwd)(mal_kern k, void *dgate, void *dup, const void *dout, const void *gate,
                       const void *up, size_t n);
    /* out = a + b, compute dtype (out may alias a or b) */
    void (*add)(mal_kern k, void *out, const void *a, const void *b, size_t n);
    /* y += x (fp32) */
    void (*accumulate)(mal_kern k, float *y, const float *x, size_t n);
    /* x *= s (fp32) */
    void (*scale)(mal_kern k, float *x, size_t n, float s);
    /* acc[0] (one double, device) += sum over `rows` runs of `width`
     * floats, `pitch` floats apart, of x^2 (accumulated in double; queued:
     * no host sync).  The caller reads acc once, after all its runs. */
    void (*sumsq)(mal_kern k, double *acc, const float *x, size_t rows, size_t width,
                  size_t pitch);
    /* Optional (NULL: mal_kern_sumsq_multi calls sumsq per run).  sumsq
     * of each of `count` runs in turn, in as few launches as the backend
     * can: acc gets the same bits as from those sumsq calls. */
    void (*sumsq_multi)(mal_kern k, double *acc, const mal_kern_run *runs, int count);

    /* --- embedding ------------------------------------------------------ */
    /* The table holds rows [v0, v0 + Vl) of a vocabulary of V tokens (all
     * of it: v0 = 0, Vl = V; a vocabulary-parallel shard otherwise).
     * out (N,C) = wte[tokens[n] - v0] for a token in [v0, v0 + Vl), a zero
     * row for another token of [0, V) (its row is another shard's); a
     * token outside [0, V) gives a zero row and an error from sync().
     * wte (Vl,C) working weights; tokens (N). */
    void (*embedding_fwd)(mal_kern k, void *out, const int *tokens, const void *wte, int N, int C,
                          int V, int v0, int Vl);
    /* dwte (Vl,C, fp32) += scatter of dout (N,C) by tokens, the rows of
     * tokens in [v0, v0 + Vl) only; repeated tokens add up in position
     * order. */
    void (*embedding_bwd)(mal_kern k, float *dwte, const void *dout, const int *tokens, int N,
                          int C, int v0, int Vl);

    /* --- loss ----------------------------------------------------------- */
    /* Softmax cross-entropy over V classes, fused with its gradient.
     * losses (N, fp32) = logsumexp(logits[n]) - logits[n, targets[n]];
     * if dlogits != NULL: dlogits (N,V) = (softmax(logits[n]) - onehot) *
     * dscale  (written, not accumulated; dlogits may alias logits). */
    void (*xent_fwd_bwd)(mal_kern k, float *losses, void *dlogits, const void *logits,
                         const int *targets, int N, int V, float dscale);
    /* Vocabulary-parallel cross-entropy (Megatron's), in two parts around
     * an exchange of row statistics: the logits (N,Vl) are this shard's
     * columns [v0, v0 + Vl) of a vocabulary of V classes, split over P
     * shards.  xent_stats writes stats (3,N, fp32): per row the max m of
     * its logits, s = sum e^(x - m), and the target's logit where the
     * target is in this shard's range (else 0).  After every shard's stats
     * are gathered into all (P,3,N) in shard order (the caller's
     * exchange), xent_combine computes M = max_p m_p,
     * S = sum_p s_p e^(m_p - M) (p in order, so every shard gets the same
     * bits), losses (N) = log S + M - sum_p target_p, and when dlogits !=
     * NULL dlogits (N,Vl) = (e^(x - M) / S - onehot) * dscale (written;
     * may alias logits).  A target outside [0, V) gives a NaN loss, a zero
     * gradient row and an error from sync().  With P = 1 the losses and
     * gradients are xent_fwd_bwd's. */
    void (*xent_stats)(mal_kern k, float *stats, const void *logits, const int *targets, int N,
                       int Vl, int v0);
    void (*xent_combine)(mal_kern k, float *losses, void *dlogits, const void *logits,
                         const float *all, int P, const int *targets, int N, int Vl, int v0,
                         int V, float dscale);

    /* --- optimizer ------------------------------------------------------ */
    /* AdamW with decoupled weight decay over n fp32 elements, step t >= 1:
     *   g = grad * grad_scale
     *   m = beta1 m + (1-beta1) g ;  v = beta2 v + (1-beta2) g^2
     *   mhat = m / (1-beta1^t) ;  vhat = v / (1-beta2^t)
     *   param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param)
     * then work[i] = param[i] in the compute dtype (`work`: the working
     * copy; NULL or == param when it aliases the master). */
    void (*adamw)(mal_kern k, float *param, void *work, const float *grad, float *m, float *v,
                  size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t);
    /* Optional (NULL: mal_kern_adamw_multi calls adamw per span).  adamw
     * on each of `count` disjoint spans of the same buffers (span j:
     * param + off, work + off (compute dtype), grad + off, m + off,
     * v + off, n elements, its weight decay; off = spans[j].offset), in as
     * few launches as the backend can: the same bits as those adamw
     * calls. */
    void (*adamw_multi)(mal_kern k, float *param, void *work, const float *grad, float *m, float *v,
                        const mal_kern_span *spans, int count, float lr, float beta1, float beta2,
                        float eps, float grad_scale, int t);
    /* work (n, compute dtype) = master (n, fp32): refresh a working copy
     * after the master changed outside the optimizer (initialisation,
     * restore, migration).  Nothing when they alias. */
    void (*cast_working)(mal_kern k, void *work, const float *master, size_t n);

    /* --- straggler emulation (optional: NULL where the backend has none) */
    /* Slow this instance's device to about 1/rate of its speed for the
     * work on its queue, for real (--inject-mode gpu): a co-running load on
     * the same device, in the background, until the next call.  rate <= 1
     * stops it; a new rate replaces the old one.  Returns 0, or MAL_E* (the
     * load could not start, or failed since the last call; it is then
     * stopped).  The destroy of the instance stops it too.  The CPU
     * backends leave it NULL: a busy thread would take cores from the other
     * ranks of a shared machine, which the sleep mode does not. */
    int (*slowdown)(mal_kern k, double rate);

    /* --- what the device is (optional: NULL where the backend has no
     * device of its own; the CPU backends compute in host memory) ------ */
    /* The device's name (for a table of peak FLOP rates) and the device
     * memory in use now and in all, bytes (the device's, whoever uses
     * it).  Returns 0, or MAL_EDEVICE. */
    int (*device_info)(mal_kern k, mal_kern_device_info *out);
};

/* The longest period of a backend's slowdown duty cycle (seconds): a
 * measurement that must see the mean slowdown spans several. */
#define MAL_KERN_SLOWDOWN_PERIOD_S 0.002

/* ---- registry ----------------------------------------------------------- */

/* One kernel backend, registered by name in kernels/registry.c (one line
 * per backend, guarded by the configure macro that builds it). */
typedef struct {
    /* first (base/registry.h): reg.name "cpu", "cpu-opaque", "cuda";
     * reg.probe 0 when an instance can be created on this machine, else
     * MAL_E* with the reason recorded (no GPU, no driver) */
    mal_registry_entry reg;
    const char *what; /* one line for --help */
    int is_default;   /* a candidate for the default (not test backends) */
    int (*create)(const mal_kern_config *cfg, mal_kern *out);
    void (*destroy)(mal_kern k);
    unsigned dtypes;           /* compute dtypes it offers: bit 1 << mal_dtype */
    int has_slowdown;          /* 1: its instances have ops->slowdown */
    mal_dtype default_compute; /* what MAL_DTYPE_AUTO means for it */
} mal_kern_backend;

/* Local.  *out = the backend called `name` and 0, or *out = NULL and
 * MAL_EINVAL for a name no build knows, MAL_ENOTSUP for one this build was
 * configured without, MAL_EDEVICE for one that has no device here, with a
 * message that lists what this build has. */
int mal_kern_lookup(const char *name, const mal_kern_backend **out);

/* Local.  The default backend's name: $MALLEUS_DEVICE when set (the test
 * suite sets it to "cpu", so that a GPU machine runs the CPU tests on the
 * CPU and the GPU tests ask for --device cuda), else the first registered
 * default candidate whose probe succeeds ("cuda" where a GPU is present,
 * else "cpu"). */
const char *mal_kern_default_name(void);

/* Local.  "cpu, cpu-opaque" (the names of this build, `sep` between them)
 * into buf. */
void mal_kern_names(char *buf, size_t len, const char *sep);

/* Local.  Create an instance of backend `name` (NULL: the default) with
 * `cfg` (NULL: defaults; compute MAL_DTYPE_AUTO: the backend's default).
 * Errors as mal_kern_lookup, and MAL_ENOTSUP when the backend cannot
 * compute in cfg->compute.  The caller owns *out and
 * frees it with mal_kern_destroy after every buffer of it. */
int mal_kern_create(const char *name, const mal_kern_config *cfg, mal_kern *out);
void mal_kern_destroy(mal_kern k);

/* ---- pinned staging buffers ------------------------------------------- */

/* Pinned host buffers for staging transfers (the MPI data plane, the
 * background snapshot's copy), pooled per instance for every backend
 * (kernels/hostpool.c): pinning and unpinning cost far more than a copy of
 * a few megabytes (cudaFreeHost waits for the whole device), and a
 * training step asks for the same sizes every step, so a buffer given back
 * is kept and handed out again to a later request it holds at least once
 * and at most twice.  Bounded: the pool's buffers come to at most twice the
 * most bytes the instance ever had handed out at once, and the least
 * recently given back free ones are unpinned past that; all of them when
 * the instance is destroyed.  Local and thread-safe.
 * mal_kern_host_alloc: NULL on failure (after unpinning the free buffers
 * and trying again).  mal_kern_host_free: only once no queued copy uses
 * the buffer any more (queue_wait() after the last copy that names it):
 * the next holder may write it at once. */
void *mal_kern_host_alloc(mal_kern k, size_t bytes);
void mal_kern_host_free(mal_kern k, void *p);

/* What the pool has done, for tests and logs. */
typedef struct {
    size_t pins;         /* buffers the backend pinned (host_alloc calls) */
    size_t unpins;       /* buffers it unpinned again (host_free calls) */
    size_t reuses;       /* requests served by a buffer given back before */
    size_t pinned_bytes; /* pinned now, handed out or free */
    size_t in_use_bytes; /* handed out now */
    size_t peak_bytes;   /* the most ever handed out at once */
} mal_kern_host_stats;
/* Local.  The pool's counts of instance k (all 0 for an instance made
 * outside the registry, which has no pool). */
void mal_kern_host_stats_get(mal_kern k, mal_kern_host_stats *out);

/* The registry's (registry.c): the pool of a new instance (0 or
 * MAL_ENOMEM), and unpinning everything before the backend destroys it. */
int mal_kern_host_pool_create(mal_kern k);
void mal_kern_host_pool_destroy(mal_kern k);

/* ---- the memory accountant ------------------------------------------- */

/* What a device buffer holds.  Every buffer allocated through the table
 * (mal_kern_alloc_as) is counted under one category until it is freed, so
 * that a run's peak memory per rank can be reported by what it is made of
 * and compared with the planner's memory model (replan/README.md, "Memory
 * model").  The instance's own workspaces (a backend's cuBLASLt workspace,
 * a CUDA context) are not allocations of the table and are not counted. */
typedef enum {
    MAL_MEM_OTHER = 0,   /* not classified: tests, tools, the monitor's probe */
    MAL_MEM_WEIGHTS,     /* working weights (fp32 compute: the parameters themselves) */
    MAL_MEM_MASTER,      /* fp32 master weights kept apart from the working ones */
    MAL_MEM_MOMENTS,     /* Adam m and v */
    MAL_MEM_GRADIENTS,   /* fp32 gradients */
    MAL_MEM_ACTIVATIONS, /* activations of the micro-batches in flight, and the
                          * recomputation workspace */
    MAL_MEM_SCRATCH,     /* the backward pass's scratch, the loss exchange */
    MAL_MEM_COMM,        /* communication buffers: gradient buckets, pipeline
                          * gradient buffers, the norm's accumulator */
    MAL_MEM_STAGING,     /* device staging copies: migration, optimizer packing */
    MAL_MEM_N
} mal_mem_cat;

/* Local, pure.  "weights", "master", ...: the categories' names in metrics
 * and summaries ("?" out of range). */
const char *mal_mem_cat_name(int cat);

/* What an instance's buffers held (bytes). */
typedef struct {
    size_t now[MAL_MEM_N];     /* held now, per category */
    size_t peak[MAL_MEM_N];    /* each category's own peak */
    size_t at_peak[MAL_MEM_N]; /* the categories at the moment the total peaked */
    size_t total;              /* held now, all categories */
    size_t total_peak;         /* the most ever held at once */
    size_t n_buffers;          /* buffers held now */
} mal_kern_mem_stats;

/* Local, thread-safe.  A device buffer of `bytes` (as ops->alloc: zeroed;
 * NULL on failure), counted under `cat` until mal_kern_free. */
void *mal_kern_alloc_as(mal_kern k, size_t bytes, mal_mem_cat cat);
/* Local, thread-safe.  Free a buffer of the table (NULL: nothing). */
void mal_kern_free(mal_kern k, void *p);
/* Local, thread-safe.  ops->resize, the buffer keeping its category. */
void *mal_kern_resize(mal_kern k, void *p, size_t old_bytes, size_t new_bytes);
/* Local, thread-safe.  The accountant's counts of instance k (all 0 for an
 * instance made outside the registry, which has none). */
void mal_kern_mem_get(mal_kern k, mal_kern_mem_stats *out);
/* Local, thread-safe.  Start the peaks again from what is held now (a
 * measurement of one phase: the training steps, not the set-up). */
void mal_kern_mem_reset_peak(mal_kern k);

/* The registry's (registry.c): the accountant of a new instance (0 or
 * MAL_ENOMEM), and its end (buffers still held are reported at debug
 * level: they are the caller's leak, freed by the backend's destroy). */
int mal_kern_mem_create(mal_kern k);
void mal_kern_mem_destroy(mal_kern k);

/* ---- operation counts -------------------------------------------------- */

/* Local, thread-safe.  out[i] = the operations of kind i (mal_kern_op)
 * that the wrappers below passed to instance k since it was created or
 * since the last reset; names: mal_kern_op_name. */
void mal_kern_counts_get(mal_kern k, unsigned long long out[MAL_KOP_N]);
void mal_kern_counts_reset(mal_kern k);
/* Local, pure.  "zero", "copy", "sync", ... ("?" out of range). */
const char *mal_kern_op_name(int op);

/* Relaxed: a count, not an ordering (the MPI data plane's progress thread
 * waits on the queue too). */
static inline void mal_kern_count(mal_kern k, mal_kern_op op)
{
    __atomic_fetch_add(&k->counts[op], 1ull, __ATOMIC_RELAXED);
}

/* ---- call-site wrappers ------------------------------------------------- */

static inline void *mal_kern_alloc(mal_kern k, size_t bytes)
{
    return mal_kern_alloc_as(k, bytes, MAL_MEM_OTHER);
}
static inline void mal_kern_zero(mal_kern k, void *x, size_t bytes)
{
    mal_kern_count(k, MAL_KOP_ZERO);
    k->ops->zero(k, x, bytes);
}
/* Several buffers zeroed by one operation (counted as one zero): one
 * launch on a GPU instead of a memset each. */
static inline void mal_kern_zero_multi(mal_kern k, void *const *bufs, const size_t *bytes,
                                       int count)
{
    mal_kern_count(k, MAL_KOP_ZERO);
    if (k->ops->zero_multi) {
        k->ops->zero_multi(k, bufs, bytes, count);
        return;
    }
    for (int i = 0; i < count; i++)
        k->ops->zero(k, bufs[i], bytes[i]);
}
static inline void mal_kern_memcpy2d(mal_kern k, void *dst, size_t dpitch, const void *src,
                                     size_t spitch, size_t width, size_t rows, mal_copy_kind kind)
{
    mal_kern_count(k, MAL_KOP_COPY);
    k->ops->memcpy2d(k, dst, dpitch, src, spitch, width, rows, kind);
}
/* Contiguous copies: device to device, device to host, host to device. */
static inline void mal_kern_copy(mal_kern k, void *dst, const void *src, size_t bytes)
{
    mal_kern_count(k, MAL_KOP_COPY);
    k->ops->memcpy2d(k, dst, bytes, src, bytes, bytes, 1, MAL_COPY_D2D);
}
static inline void mal_kern_to_host(mal_kern k, void *host_dst, const void *src, size_t bytes)
{
    mal_kern_count(k, MAL_KOP_COPY);
    k->ops->memcpy2d(k, host_dst, bytes, src, bytes, bytes, 1, MAL_COPY_D2H);
}
static inline void mal_kern_from_host(mal_kern k, void *dst, const void *host_src, size_t bytes)
{
    mal_kern_count(k, MAL_KOP_COPY);
    k->ops->memcpy2d(k, dst, bytes, host_src, bytes, bytes, 1, MAL_COPY_H2D);
}
static inline int mal_kern_sync(mal_kern k)
{
    mal_kern_count(k, MAL_KOP_SYNC);
    return k->ops->sync(k);
}
static inline void mal_kern_queue_wait(mal_kern k)
{
    mal_kern_count(k, MAL_KOP_QUEUE_WAIT);
    k->ops->queue_wait(k);
}
static inline mal_kern_event *mal_kern_event_create(mal_kern k) { return k->ops->event_create(k); }
static inline void mal_kern_event_destroy(mal_kern k, mal_kern_event *e)
{
    if (e) k->ops->event_destroy(k, e);
}
static inline void mal_kern_event_record(mal_kern k, mal_kern_event *e)
{
    k->ops->event_record(k, e);
}
static inline double mal_kern_event_elapsed(mal_kern k, mal_kern_event *a, mal_kern_event *b)
{
    mal_kern_count(k, MAL_KOP_EVENT_WAIT);
    return k->ops->event_elapsed(k, a, b);
}
static inline void *mal_kern_native_queue(mal_kern k) { return k->ops->native_queue(k); }
/* MAL_ENOTSUP (nothing recorded) where the backend has no device_info. */
static inline int mal_kern_query_device(mal_kern k, mal_kern_device_info *out)
{
    return k->ops->device_info ? k->ops->device_info(k, out) : MAL_ENOTSUP;
}

static inline void mal_kern_matmul_fwd(mal_kern k, void *out, const void *inp, const void *weight,
                                       int N, int C, int OC, int accumulate)
{
    mal_kern_count(k, MAL_KOP_MATMUL_FWD);
    k->ops->matmul_fwd(k, out, inp, weight, N, C, OC, accumulate);
}
static inline void mal_kern_matmul_bwd(mal_kern k, void *dinp, float *dweight, const void *dout,
                                       const void *inp, const void *weight, int N, int C, int OC)
{
    mal_kern_count(k, MAL_KOP_MATMUL_BWD);
    k->ops->matmul_bwd(k, dinp, dweight, dout, inp, weight, N, C, OC);
}
static inline void mal_kern_rmsnorm_fwd(mal_kern k, void *out, float *rstd, const void *inp,
                                        const void *weight, int N, int C, float eps)
{
    mal_kern_count(k, MAL_KOP_RMSNORM_FWD);
    k->ops->rmsnorm_fwd(k, out, rstd, inp, weight, N, C, eps);
}
static inline void mal_kern_rmsnorm_bwd(mal_kern k, void *dinp, float *dweight, const void *dout,
                                        const void *inp, const void *weight, const float *rstd,
                                        int N, int C)
{
    mal_kern_count(k, MAL_KOP_RMSNORM_BWD);
    k->ops->rmsnorm_bwd(k, dinp, dweight, dout, inp, weight, rstd, N, C);
}
static inline void mal_kern_rope_fwd(mal_kern k, void *x, int B, int T, int H, int hd,
                                     const mal_rope *rope)
{
    mal_kern_count(k, MAL_KOP_ROPE);
    k->ops->rope_fwd(k, x, B, T, H, hd, rope);
}
static inline void mal_kern_rope_bwd(mal_kern k, void *dx, int B, int T, int H, int hd,
                                     const mal_rope *rope)
{
    mal_kern_count(k, MAL_KOP_ROPE);
    k->ops->rope_bwd(k, dx, B, T, H, hd, rope);
}
static inline void mal_kern_attention_bytes(mal_kern k, int B, int T, int H, int hd,
                                            size_t *saved, size_t *scratch)
{
    k->ops->attention_bytes(k, B, T, H, hd, saved, scratch);
}
static inline void mal_kern_attention_fwd(mal_kern k, void *out, void *saved, const void *q,
                                          const void *kk, const void *v, int B, int T,
                                          mal_attn_heads hs, int hd)
{
    mal_kern_count(k, MAL_KOP_ATTENTION_FWD);
    k->ops->attention_fwd(k, out, saved, q, kk, v, B, T, hs, hd);
}
static inline void mal_kern_attention_bwd(mal_kern k, void *dq, void *dk, void *dv, void *scratch,
                                          const void *dout, const void *out, const void *q,
                                          const void *kk, const void *v, const void *saved, int B,
                                          int T, mal_attn_heads hs, int hd)
{
    mal_kern_count(k, MAL_KOP_ATTENTION_BWD);
    k->ops->attention_bwd(k, dq, dk, dv, scratch, dout, out, q, kk, v, saved, B, T, hs, hd);
}
static inline void mal_kern_swiglu_fwd(mal_kern k, void *out, const void *gate, const void *up,
                                       size_t n)
{
    mal_kern_count(k, MAL_KOP_SWIGLU_FWD);
    k->ops->swiglu_fwd(k, out, gate, up, n);
}
static inline void mal_kern_swiglu_bwd(mal_kern k, void *dgate, void *dup, const void *dout,
                                       const void *gate, const void *up, size_t n)
{
    mal_kern_count(k, MAL_KOP_SWIGLU_BWD);
    k->ops->swiglu_bwd(k, dgate, dup, dout, gate, up, n);
}
static inline void mal_kern_add(mal_kern k, void *out, const void *a, const void *b, size_t n)
{
    mal_kern_count(k, MAL_KOP_ELEMENTWISE);
    k->ops->add(k, out, a, b, n);
}
static inline void mal_kern_accumulate(mal_kern k, float *y, const float *x, size_t n)
{
    mal_kern_count(k, MAL_KOP_ELEMENTWISE);
    k->ops->accumulate(k, y, x, n);
}
static inline void mal_kern_scale(mal_kern k, float *x, size_t n, float s)
{
    mal_kern_count(k, MAL_KOP_ELEMENTWISE);
    k->ops->scale(k, x, n, s);
}
static inline void mal_kern_sumsq(mal_kern k, double *acc, const float *x, size_t rows,
                                  size_t width, size_t pitch)
{
    mal_kern_count(k, MAL_KOP_SUMSQ);
    k->ops->sumsq(k, acc, x, rows, width, pitch);
}
/* The runs in as few launches as the backend can, else sumsq per run
 * (the same bits either way; counted as one operation). */
static inline void mal_kern_sumsq_multi(mal_kern k, double *acc, const mal_kern_run *runs,
                                        int count)
{
    mal_kern_count(k, MAL_KOP_SUMSQ_MULTI);
    if (k->ops->sumsq_multi) {
        k->ops->sumsq_multi(k, acc, runs, count);
        return;
    }
    for (int i = 0; i < count; i++)
        k->ops->sumsq(k, acc, runs[i].x, runs[i].rows, runs[i].width, runs[i].pitch);
}
static inline void mal_kern_embedding_fwd(mal_kern k, void *out, const int *tokens,
                                          const void *wte, int N, int C, int V, int v0, int Vl)
{
    mal_kern_count(k, MAL_KOP_EMBEDDING_FWD);
    k->ops->embedding_fwd(k, out, tokens, wte, N, C, V, v0, Vl);
}
static inline void mal_kern_embedding_bwd(mal_kern k, float *dwte, const void *dout,
                                          const int *tokens, int N, int C, int v0, int Vl)
{
    mal_kern_count(k, MAL_KOP_EMBEDDING_BWD);
    k->ops->embedding_bwd(k, dwte, dout, tokens, N, C, v0, Vl);
}
static inline void mal_kern_xent_fwd_bwd(mal_kern k, float *losses, void *dlogits,
                                         const void *logits, const int *targets, int N, int V,
                                         float dscale)
{
    mal_kern_count(k, MAL_KOP_XENT);
    k->ops->xent_fwd_bwd(k, losses, dlogits, logits, targets, N, V, dscale);
}
static inline void mal_kern_xent_stats(mal_kern k, float *stats, const void *logits,
                                       const int *targets, int N, int Vl, int v0)
{
    mal_kern_count(k, MAL_KOP_XENT);
    k->ops->xent_stats(k, stats, logits, targets, N, Vl, v0);
}
static inline void mal_kern_xent_combine(mal_kern k, float *losses, void *dlogits,
                                         const void *logits, const float *all, int P,
                                         const int *targets, int N, int Vl, int v0, int V,
                                         float dscale)
{
    mal_kern_count(k, MAL_KOP_XENT);
    k->ops->xent_combine(k, losses, dlogits, logits, all, P, targets, N, Vl, v0, V, dscale);
}
static inline void mal_kern_adamw(mal_kern k, float *param, void *work, const float *grad,
                                  float *m, float *v, size_t n, float lr, float beta1, float beta2,
                                  float eps, float weight_decay, float grad_scale, int t)
{
    mal_kern_count(k, MAL_KOP_ADAMW);
    k->ops->adamw(k, param, work, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale,
                  t);
}
/* AdamW on each span in as few launches as the backend can, else adamw
 * per span (the same bits either way; counted as one operation).  `work`:
 * the working copy, whose element size is the instance's compute dtype
 * (NULL or == param when it aliases the master). */
static inline void mal_kern_adamw_multi(mal_kern k, float *param, void *work, const float *grad,
                                        float *m, float *v, const mal_kern_span *spans, int count,
                                        float lr, float beta1, float beta2, float eps,
                                        float grad_scale, int t)
{
    mal_kern_count(k, MAL_KOP_ADAMW_MULTI);
    if (k->ops->adamw_multi) {
        k->ops->adamw_multi(k, param, work, grad, m, v, spans, count, lr, beta1, beta2, eps,
                            grad_scale, t);
        return;
    }
    const size_t esz = mal_dtype_bytes(k->compute);
    for (int i = 0; i < count; i++) {
        const size_t o = spans[i].offset;
        void *w = !work                   ? NULL
                  : work == (void *)param ? (void *)(param + o)
                                          : (void *)((char *)work + o * esz);
        k->ops->adamw(k, param + o, w, grad + o, m + o, v + o, spans[i].n, lr, beta1, beta2, eps,
                      spans[i].weight_decay, grad_scale, t);
    }
}
/* ops->slowdown where the backend has it (mal_kern_has_slowdown). */
static inline int mal_kern_has_slowdown(mal_kern k) { return k->ops->slowdown != NULL; }
static inline int mal_kern_slowdown(mal_kern k, double rate) { return k->ops->slowdown(k, rate); }
static inline void mal_kern_cast_working(mal_kern k, void *work, const float *master, size_t n)
{
    mal_kern_count(k, MAL_KOP_CAST);
    k->ops->cast_working(k, work, master, n);
}

#endif /* MAL_KERNELS_H */
