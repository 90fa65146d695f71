/* cuDNN's fused attention (flash attention on sm_80+, FlashAttention-3
 * class kernels on Hopper) behind the CUDA backend's attention op, as an
 * alternative to the kernels of attention.cu.
 *
 * The library is loaded at run time (dlopen of libcudnn.so.9, or of the
 * file MALLEUS_CUDNN_LIB names), so no build and no run depends on it:
 * where it is missing, too old, or refuses a shape, the caller keeps the
 * hand-written kernels.  The graphs are built through cuDNN's backend API
 * (cudnn_graph.h): the composite pattern cuDNN recognises as scaled
 * dot-product attention -- Q K^T, scale, causal mask, softmax with its
 * log-sum-exp, P V -- and its backward in the deterministic form (dQ
 * written by its own product, no atomics), one plan per shape, cached.
 *
 * Layouts are the kernel table's (kernels.h): q, out, dq (B,T,H,hd); k, v,
 * dk, dv (B,T,Hkv,hd); lse (B,H,T) floats, the natural-log log-sum-exp of
 * each query's scaled scores -- the same quantity attention.cu keeps, so a
 * forward of one implementation can feed a backward of the other.
 * bf16 only (the fp32 mode keeps the generic kernels).  Multi-head and
 * grouped-query heads where every query head h reads key/value head
 * h / (H / Hkv) (q_off 0); other head layouts are refused (the caller
 * falls back).
 *
 * Errors: every function returns 0 or -1 and then writes a message naming
 * the cuDNN call and cuDNN's own text into msg (n bytes). */
#ifndef MAL_CUDA_CUDNN_H
#define MAL_CUDA_CUDNN_H

#include <stddef.h>

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mal_cudnn mal_cudnn;

/* Local.  Load cuDNN and make a handle bound to `stream`.  -1 (with the
 * reason: not built with cuDNN's headers, library not found, version
 * below 9, no GPU) leaves *out NULL.  The caller owns *out
 * (mal_cudnn_close). */
int mal_cudnn_open(mal_cudnn **out, mal_cu_stream stream, char *msg, size_t n);
void mal_cudnn_close(mal_cudnn *c);

/* Local.  Where cuDNN's workspace (the largest any cached plan needs:
 * ~1 GiB for the deterministic backward at B 8, T 2048, 16 heads) comes
 * from: alloc(ctx, bytes) / release(ctx, p) instead of cudaMalloc /
 * cudaFree, so that the owner can count it (the CUDA backend's memory
 * accountant).  Frees the current workspace (after the stream drains). */
void mal_cudnn_set_allocator(mal_cudnn *c, void *(*alloc)(void *ctx, size_t bytes),
                             void (*release)(void *ctx, void *p), void *ctx);

/* Local, pure.  cuDNN's version as a number (9.19.0 -> 91900). */
long mal_cudnn_version(const mal_cudnn *c);

/* Local.  1 when the attention of this shape runs through cuDNN: bf16,
 * heads as above, hd a multiple of 8 up to 256, and both plans (forward
 * and backward) built -- the first call per shape builds them (cuDNN
 * compiles its kernels then: ~0.1-1 s); 0 when it does not (msg says
 * why). */
int mal_cudnn_attention_ok(mal_cudnn *c, int B, int T, mal_cu_heads hs, int hd, char *msg,
                           size_t n);

/* Local.  Queue the forward on the handle's stream: out (B,T,H,hd) and lse
 * (B,H,T) written.  The shape must have passed mal_cudnn_attention_ok. */
int mal_cudnn_attention_fwd(mal_cudnn *c, void *out, float *lse, const void *q, const void *k,
                            const void *v, int B, int T, mal_cu_heads hs, int hd, char *msg,
                            size_t n);

/* Local.  Queue the backward: dq (B,T,H,hd), dk, dv (B,T,Hkv,hd) are
 * WRITTEN (not accumulated: the caller adds them where its contract
 * accumulates); `dsum` is B*H*T floats of scratch (rowsum(dout * out)).
 * Deterministic: the same inputs give the same bits. */
int mal_cudnn_attention_bwd(mal_cudnn *c, void *dq, void *dk, void *dv, const void *dout,
                            const void *out, const void *q, const void *k, const void *v,
                            const float *lse, float *dsum, int B, int T, mal_cu_heads hs, int hd,
                            char *msg, size_t n);

/* Local.  Build the forward and backward graphs of one shape for a
 * described device instead of a present one (device_json: cuDNN's JSON
 * form of the device's properties, cuDNN 9.8 or later) and count, in
 * *fwd_engines and *bwd_engines, the engine configurations cuDNN's
 * heuristics offer for each -- those whose engines accept the graph.  No
 * GPU needed; cuDNN's runtime-compiled engines (the ones that take
 * attention) check support only once libcuda.so.1 is loaded, which the
 * CUDA toolkit's stub library satisfies (the caller loads it).  The tests
 * keep the graphs in the pattern cuDNN recognises with it.  -1 when cuDNN
 * cannot be loaded or a graph cannot be built. */
int mal_cudnn_check_offline(int B, int T, mal_cu_heads hs, int hd, const char *device_json,
                            int *fwd_engines, int *bwd_engines, char *msg, size_t n);

#ifdef __cplusplus
}
#endif

#endif
