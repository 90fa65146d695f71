/* Launchers of the CUDA backend's kernels (one .cu per kernel family in
 * kernels/cuda/, listed in common.cuh), callable from C:
 * kernels/cuda/cuda.c calls them from the kernel table's operations,
 * tests/test_cuda_emu.cpp calls them on the CPU emulation
 * (kernels/cuda/emu.h).
 *
 * Every launcher queues its kernels on `stream` and returns without
 * waiting.  `bf16` selects the compute dtype of the void * buffers (0:
 * float, 1: bf16); float * buffers are fp32 always (kernels.h's element
 * types).  Shapes and contracts are kernels.h's; what is added here is the
 * scratch some operations need for a deterministic reduction (a device
 * buffer of at least the *_scratch_bytes the launcher names, contents
 * undefined on return) and `err`, a device int that a kernel ORs a
 * MAL_CU_ERR_* bit into when its input is invalid (a token or target out of
 * range) -- the backend reads it at its next sync.
 *
 * Determinism: no launcher uses a floating-point atomic, and every
 * reduction sums in an order fixed by the shapes alone, so the same inputs
 * give the same bits on the same GPU. */
#ifndef MAL_CUDA_OPS_H
#define MAL_CUDA_OPS_H

#include <stddef.h>

#ifdef MAL_CUDA_EMU
typedef void *mal_cu_stream;
#else
#include <cuda_runtime_api.h>
typedef cudaStream_t mal_cu_stream;
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { MAL_CU_ERR_TOKEN = 1, MAL_CU_ERR_TARGET = 2 };

/* RMSNorm (kernels.h).  The backward's weight gradient is reduced through
 * `scratch` (mal_cu_rmsnorm_bwd_scratch_bytes(N, C)). */
void mal_cu_rmsnorm_fwd(mal_cu_stream s, int bf16, void *out, float *rstd, const void *inp,
                        const void *weight, int N, int C, float eps);
size_t mal_cu_rmsnorm_bwd_scratch_bytes(int N, int C);
void mal_cu_rmsnorm_bwd(mal_cu_stream s, int bf16, void *dinp, float *dweight, const void *dout,
                        const void *inp, const void *weight, const float *rstd, int N, int C,
                        void *scratch);

/* RoPE with a cos/sin table `cs` (float, T rows of hd/2 cosines, then T
 * rows of hd/2 sines, the CPU backend's table), dir +1 forward, -1 back. */
void mal_cu_rope(mal_cu_stream s, int bf16, void *x, const float *cs, int B, int T, int H, int hd,
                 float dir);

void mal_cu_swiglu_fwd(mal_cu_stream s, int bf16, void *out, const void *gate, const void *up,
                       size_t n);
void mal_cu_swiglu_bwd(mal_cu_stream s, int bf16, void *dgate, void *dup, const void *dout,
                       const void *gate, const void *up, size_t n);
void mal_cu_add(mal_cu_stream s, int bf16, void *out, const void *a, const void *b, size_t n);
void mal_cu_accumulate(mal_cu_stream s, float *y, const float *x, size_t n);
void mal_cu_scale(mal_cu_stream s, float *x, size_t n, float f);
/* bytes[i] of bufs[i] = 0 for each of `count` buffers, in one launch per
 * MAL_CU_ZERO_MT of them (the table in the kernel's parameters) instead
 * of a memset each; returns the launches it queued. */
enum { MAL_CU_ZERO_MT = 64 };
int mal_cu_zero_multi(mal_cu_stream s, void *const *bufs, const size_t *bytes, int count);

/* acc[0] (device double) += sum of squares of `rows` runs of `width`
 * floats `pitch` apart; scratch: mal_cu_sumsq_scratch_bytes(). */
size_t mal_cu_sumsq_scratch_bytes(void);
void mal_cu_sumsq(mal_cu_stream s, double *acc, const float *x, size_t rows, size_t width,
                  size_t pitch, void *scratch);

/* The same over `count` runs at once (multi-tensor, in the manner of
 * apex's multi_tensor_apply: the runs' table travels in the kernel's
 * parameters, MAL_CU_SUMSQ_MT runs per launch): acc[0] gets the bits that
 * mal_cu_sumsq on each run in turn gives it (each run's blocks and their
 * order are mal_cu_sumsq's; the run sums are added to acc in run order).
 * Two launches per MAL_CU_SUMSQ_MT runs instead of two per run (a run
 * with a dimension over 2^32 - 1 takes mal_cu_sumsq's two, in its turn);
 * returns the launches it queued; scratch:
 * mal_cu_sumsq_multi_scratch_bytes(). */
typedef struct {
    const float *x;
    size_t rows, width, pitch;
} mal_cu_run;
enum { MAL_CU_SUMSQ_MT = 192 };
size_t mal_cu_sumsq_multi_scratch_bytes(void);
int mal_cu_sumsq_multi(mal_cu_stream s, double *acc, const mal_cu_run *runs, int count,
                       void *scratch);

/* Embedding of the table's rows [v0, v0 + Vl) of a vocabulary of V tokens
 * (kernels.h); the backward sorts positions by token (stably) through
 * `scratch` (mal_cu_embedding_bwd_scratch_bytes(N, Vl)) and adds each
 * vocabulary row's gradients in position order, as the CPU backend does. */
void mal_cu_embedding_fwd(mal_cu_stream s, int bf16, void *out, const int *tokens, const void *wte,
                          int N, int C, int V, int v0, int Vl, int *err);
size_t mal_cu_embedding_bwd_scratch_bytes(int N, int Vl);
void mal_cu_embedding_bwd(mal_cu_stream s, int bf16, float *dwte, const void *dout,
                          const int *tokens, int N, int C, int v0, int Vl, void *scratch);

void mal_cu_xent(mal_cu_stream s, int bf16, float *losses, void *dlogits, const void *logits,
                 const int *targets, int N, int V, float dscale, int *err);
/* The vocabulary-parallel cross-entropy's two parts (kernels.h's
 * xent_stats and xent_combine). */
void mal_cu_xent_stats(mal_cu_stream s, int bf16, float *stats, const void *logits,
                       const int *targets, int N, int Vl, int v0);
void mal_cu_xent_combine(mal_cu_stream s, int bf16, float *losses, void *dlogits,
                         const void *logits, const float *all, int P, const int *targets, int N,
                         int Vl, int v0, int V, float dscale, int *err);

/* AdamW over n elements; ibc1, ibc2 = 1 / (1 - beta^t) computed by the
 * caller in double, as the CPU backend does.  work (compute dtype) is
 * written when not NULL. */
void mal_cu_adamw(mal_cu_stream s, int bf16, float *param, void *work, const float *grad, float *m,
                  float *v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, float grad_scale, float ibc1, float ibc2);
/* AdamW over `count` disjoint spans of the same five buffers, in one
 * launch per MAL_CU_ADAMW_MT spans (after merging spans that touch and
 * share a weight decay): element i of span j is param[off + i], work[off
 * + i] (compute dtype; NULL: none), grad, m, v[off + i], off =
 * spans[j].off, with spans[j].weight_decay.  Every element gets
 * mal_cu_adamw's arithmetic, so the bits are those of mal_cu_adamw called
 * on each span.  Returns the launches it queued. */
typedef struct {
    size_t off, n;
    float weight_decay;
} mal_cu_span;
enum { MAL_CU_ADAMW_MT = 128 };
int mal_cu_adamw_multi(mal_cu_stream s, int bf16, float *param, void *work, const float *grad,
                       float *m, float *v, const mal_cu_span *spans, int count, float lr,
                       float beta1, float beta2, float eps, float grad_scale, float ibc1,
                       float ibc2);
void mal_cu_cast(mal_cu_stream s, int bf16, void *work, const float *master, size_t n);

/* The heads of an attention call: kernels.h's mal_attn_heads (query head
 * h reads key/value head (h + q_off) / group), repeated here so that the
 * .cu files need no C header of the library. */
typedef struct {
    int H, Hkv, group, q_off;
} mal_cu_heads;

/* Causal attention (kernels.h), flash style: never a T x T matrix in
 * memory.  `lse` (B,H,T floats) is what the forward keeps for the
 * backward: the log-sum-exp of each query's scaled scores.  The backward
 * recomputes the probabilities; `scratch` (mal_cu_attention_bwd_scratch_bytes)
 * holds D = rowsum(dO * O) per query.  impl: 0 picks the tensor-core
 * kernels where the shape allows (bf16, hd a multiple of 8 up to 128), 1
 * forces the generic kernels (fp32 arithmetic, one warp per query row; the
 * fp32 mode always uses them).  Head dimensions: even, 2 to
 * MAL_CU_ATTENTION_MAX_HD (mal_cu_attention_supported); the launchers do
 * nothing for others (the caller refuses them first).
 * mal_cu_attention_kind names the kernels a call of (bf16, impl, hd) takes
 * (for the start-up line; 16-byte aligned buffers assumed). */
enum { MAL_CU_ATTENTION_MAX_HD = 256 };
int mal_cu_attention_supported(int hd);
const char *mal_cu_attention_kind(int bf16, int impl, int hd);
size_t mal_cu_attention_bwd_scratch_bytes(int B, int T, int H);
void mal_cu_attention_fwd(mal_cu_stream s, int bf16, int impl, void *out, float *lse,
                          const void *q, const void *k, const void *v, int B, int T,
                          mal_cu_heads hs, int hd);
void mal_cu_attention_bwd(mal_cu_stream s, int bf16, int impl, void *dq, void *dk, void *dv,
                          const void *dout, const void *out, const void *q, const void *k,
                          const void *v, const float *lse, int B, int T, mal_cu_heads hs, int hd,
                          void *scratch);

/* Straggler emulation (kernels/cuda/slow.cu; cuda.c's slowdown).
 * mal_cu_spin_prepare lets the busy kernel have the largest shared memory
 * a block of `device` may have and returns those bytes (0 on failure:
 * cudaGetLastError says why); call it with `device` current.  mal_cu_spin
 * queues `blocks` busy blocks (one per SM) holding `smem` bytes each
 * (prepare's answer), so that no other kernel's block fits beside them,
 * spinning for `ns` nanoseconds of wall time each. */
size_t mal_cu_spin_prepare(int device);
void mal_cu_spin(mal_cu_stream s, int blocks, size_t smem, unsigned long long ns);

#ifdef __cplusplus
}
#endif

#endif /* MAL_CUDA_OPS_H */
