/* CUDA backend of the kernel table (kernels.h): one instance = one GPU, one
 * CUDA stream, one cuBLASLt handle and its workspace, and a scratch buffer
 * for the kernels' deterministic reductions.  Run on an H100 (bench/gpu/NOTES.md
 * has the measurements and what has not run yet).
 *
 * Everything is queued on the instance's stream and returns at once; the
 * host waits only in sync() / queue_wait(), in copies to pageable host
 * memory (which CUDA completes before returning), and the first time an
 * operation needs more scratch than it has (a one-off allocation, outside
 * the steady state).  Nothing runs on the legacy default stream: the
 * instance's stream is non-blocking, so work there would not be ordered
 * with it (a RoPE table copied in by cudaMemcpy could still be on its way
 * when the kernel reading it ran); every copy and memset is queued on the
 * instance's stream.  The table's callers read
 * scalars from the device where the algorithm needs them -- the loss and
 * the squared gradient norm for clipping, once per step -- and those reads
 * are the step's only synchronisations.
 *
 * Matrix products go through cuBLASLt: bf16 operands with fp32
 * accumulation, activations out in bf16, weight gradients accumulated in
 * place into the fp32 gradient slab (C = D of type fp32, beta = 1); in the
 * fp32 mode everything is fp32 with CUBLAS_COMPUTE_32F (no TF32: the fp32
 * mode is the CPU backend's arithmetic).  The other kernels live in one
 * .cu per family (listed in common.cuh; launchers: cuda_ops.h).
 *
 * Errors: an operation cannot return one, so the first failure (a CUDA or
 * cuBLASLt error, an invalid token or target flagged by a kernel) is kept
 * with its message and returned by the next sync(), as the CPU backend does.
 */
#include "base/mal.h"
#include "kernels/kernels.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_ops.h"
#include "cudnn.h"

/* cuBLASLt's workspace: 32 MiB is what NVIDIA recommends for Hopper. */
#define LT_WORKSPACE (32u << 20)
#define PLAN_CACHE 64
#define ROPE_CACHE 8

typedef struct {
    /* the key */
    int ta, tb, m, n, k, lda, ldb, ldc, at, ct, accumulate, align;
    /* the plan */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

typedef struct {
    int T, hd;
    mal_rope rope;
    float *cs;   /* device: T rows of hd/2 cosines, then T rows of sines */
    float *host; /* its pinned source, kept until the table goes (the copy
                  * is queued, so the host must not free it before) */
} rope_dev;

typedef struct {
    int device, sm_count;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *ws;
    void *scratch;
    size_t scratch_bytes;
    int *dev_err;  /* kernels' MAL_CU_ERR_* bits */
    int *host_err; /* pinned copy */
    int err;       /* first deferred error since the last sync */
    char msg[512];
    int attn_impl; /* 0 tensor cores where possible, 1 generic kernels */
    /* cuDNN's fused attention (MALLEUS_CUDA_ATTENTION=cudnn; cudnn.h): NULL
     * when not asked for.  Its backward writes the gradients, which the
     * table's contract accumulates: they go through attn_tmp and are
     * added. */
    mal_cudnn *dnn;
    int dnn_auto;  /* default: load cuDNN at the first bf16 attention, keep
                    * the hand kernels where it cannot be loaded */
    int dnn_tried; /* that load was tried */
    void *attn_tmp;
    size_t attn_tmp_bytes;
    char dev_name[96]; /* the device's name (op_device_info; empty until asked) */
    lt_plan plans[PLAN_CACHE];
    int n_plans;
    rope_dev ropes[ROPE_CACHE];
    int n_ropes;
    /* straggler emulation (op_slowdown): a thread that launches the busy
     * kernel on `stream` at a duty cycle */
    struct {
        pthread_t thread;
        int running;
        cudaStream_t stream;  /* its own, of the highest priority */
        size_t smem;          /* the busy blocks' shared memory */
        atomic_llong busy_ns; /* busy part of each period */
        atomic_int stop;      /* 1: the thread returns */
        atomic_int err;       /* the thread's first cudaError_t (it then returns) */
    } slow;
} cu_state;

static cu_state *st_of(mal_kern k)
{
    return k->impl;
}

/* Keep the first failure for sync(); its message is recorded now (the
 * global one may be overwritten before the caller syncs). */
static void fail(cu_state *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(cu_state *st, int code, const char *fmt, ...)
{
    if (st->err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->err = MAL_ERR(code, "%s", st->msg);
}

static int cu_ok(cu_state *st, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 1;
    fail(st, MAL_EDEVICE, "CUDA: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

static int lt_ok(cu_state *st, cublasStatus_t e, const char *what)
{
    if (e == CUBLAS_STATUS_SUCCESS) return 1;
    fail(st, MAL_EDEVICE, "cuBLASLt: %s: status %d", what, (int)e);
    return 0;
}

/* After a launcher: a bad launch configuration shows up here. */
static void launched(cu_state *st, const char *what)
{
    cu_ok(st, cudaGetLastError(), what);
}

/* Scratch of at least `bytes` (device).  Growing waits for the queue (the
 * old buffer may still be in use): it happens the first time an operation
 * meets a larger shape, not in the steady state. */
static void *scratch(cu_state *st, size_t bytes)
{
    if (bytes <= st->scratch_bytes) return st->scratch;
    size_t want = bytes + bytes / 4 + 4096;
    cudaStreamSynchronize(st->stream);
    if (st->scratch) cudaFree(st->scratch);
    st->scratch = NULL;
    st->scratch_bytes = 0;
    if (!cu_ok(st, cudaMalloc(&st->scratch, want), "scratch allocation")) return NULL;
    st->scratch_bytes = want;
    return st->scratch;
}

/* ------------------------------------------------------------------------ */
/* Memory, queue, events                                                      */

static void *op_alloc(mal_kern k, size_t bytes)
{
    cu_state *st = st_of(k);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report */
        return NULL;
    }
    /* zero-filled as the contract says, and finished before anyone else
     * (another stream, NCCL) can see the buffer */
    if (!cu_ok(st, cudaMemsetAsync(p, 0, bytes, st->stream), "zeroing a new buffer") ||
        !cu_ok(st, cudaStreamSynchronize(st->stream), "zeroing a new buffer")) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void op_free(mal_kern k, void *p)
{
    (void)k;
    if (p) cudaFree(p); /* waits for the device: no queued work still uses p */
}

static void *op_resize(mal_kern k, void *p, size_t old_bytes, size_t new_bytes)
{
    cu_state *st = st_of(k);
    void *n = op_alloc(k, new_bytes);
    if (!n) return NULL;
    size_t keep = old_bytes < new_bytes ? old_bytes : new_bytes;
    if (p && keep &&
        !cu_ok(st, cudaMemcpyAsync(n, p, keep, cudaMemcpyDeviceToDevice, st->stream), "resize")) {
        cudaFree(n);
        return NULL;
    }
    op_free(k, p);
    return n;
}

static void *op_host_alloc(mal_kern k, size_t bytes)
{
    (void)k;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 64) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void op_host_free(mal_kern k, void *p)
{
    (void)k;
    if (p) cudaFreeHost(p);
}

static void op_zero(mal_kern k, void *x, size_t bytes)
{
    cu_state *st = st_of(k);
    if (bytes) cu_ok(st, cudaMemsetAsync(x, 0, bytes, st->stream), "zero");
}

static void op_zero_multi(mal_kern k, void *const *bufs, const size_t *bytes, int count)
{
    cu_state *st = st_of(k);
    mal_cu_zero_multi(st->stream, bufs, bytes, count);
    launched(st, "zero (several buffers)");
}

static void op_memcpy2d(mal_kern k, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows, mal_copy_kind kind)
{
    cu_state *st = st_of(k);
    if (!width || !rows || dst == src) return;
    enum cudaMemcpyKind ck = kind == MAL_COPY_D2H   ? cudaMemcpyDeviceToHost
                             : kind == MAL_COPY_H2D ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToDevice;
    if (rows == 1 || (dpitch == width && spitch == width))
        cu_ok(st, cudaMemcpyAsync(dst, src, width * rows, ck, st->stream), "copy");
    else
        cu_ok(st, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, ck, st->stream),
              "strided copy");
}

static void op_queue_wait(mal_kern k)
{
    cu_state *st = st_of(k);
    cu_ok(st, cudaStreamSynchronize(st->stream), "waiting for the stream");
}

/* Wait; turn the kernels' error bits into messages; return and clear the
 * first deferred error. */
static int op_sync(mal_kern k)
{
    cu_state *st = st_of(k);
    if (cu_ok(st, cudaMemcpyAsync(st->host_err, st->dev_err, sizeof(int), cudaMemcpyDeviceToHost,
                                  st->stream),
              "reading the kernels' error flags") &&
        cu_ok(st, cudaStreamSynchronize(st->stream), "waiting for the stream")) {
        int bits = *st->host_err;
        if (bits) {
            cu_ok(st, cudaMemsetAsync(st->dev_err, 0, sizeof(int), st->stream),
                  "clearing the kernels' error flags");
            if (bits & MAL_CU_ERR_TOKEN)
                fail(st, MAL_EINVAL,
                     "embedding: a token id outside the vocabulary; check the data file and the "
                     "model's vocab size");
            if (bits & MAL_CU_ERR_TARGET)
                fail(st, MAL_EINVAL,
                     "cross-entropy: a target outside the vocabulary; check the data file and "
                     "the model's vocab size");
        }
    }
    cu_ok(st, cudaGetLastError(), "a kernel");
    int e = st->err;
    if (e) {
        /* the message of the first failure again, as the current one */
        e = MAL_ERR(e, "%s", st->msg);
        st->err = 0;
    }
    return e;
}

struct mal_kern_event {
    cudaEvent_t e;
};

static mal_kern_event *op_event_create(mal_kern k)
{
    mal_kern_event *ev = calloc(1, sizeof *ev);
    if (!ev) return NULL;
    if (!cu_ok(st_of(k), cudaEventCreate(&ev->e), "event create")) {
        free(ev);
        return NULL;
    }
    return ev;
}

static void op_event_destroy(mal_kern k, mal_kern_event *e)
{
    (void)k;
    cudaEventDestroy(e->e);
    free(e);
}

static void op_event_record(mal_kern k, mal_kern_event *e)
{
    cu_state *st = st_of(k);
    cu_ok(st, cudaEventRecord(e->e, st->stream), "event record");
}

/* Device time between the two events (the probe's device time). */
static double op_event_elapsed(mal_kern k, mal_kern_event *a, mal_kern_event *b)
{
    cu_state *st = st_of(k);
    float ms = 0.0f;
    if (!cu_ok(st, cudaEventSynchronize(b->e), "event wait") ||
        !cu_ok(st, cudaEventElapsedTime(&ms, a->e, b->e), "event time"))
        return 0.0;
    return 1e-3 * (double)ms;
}

static void *op_native_queue(mal_kern k)
{
    return st_of(k)->stream;
}

/* ------------------------------------------------------------------------ */
/* Matrix products (cuBLASLt), column-major views of row-major buffers        */

/* The largest power of two (up to 256) that divides the address: cuBLASLt
 * picks kernels for the alignment it is told, and the model's views are
 * 64-byte aligned, not the 256 its heuristics assume by default. */
static int align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al) al /= 2;
    return al;
}

static void plan_destroy(lt_plan *p)
{
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* D (m x n, col-major, ld ldc, type ct) = op(A) op(B) (+ D when
 * accumulate); A, B of type at.  Plans (descriptors and the heuristic's
 * algorithm) are cached per shape, so the steady state makes no heuristic
 * query. */
static void lt_matmul(cu_state *st, int ta, int tb, int m, int n, int k, const void *A, int lda,
                      const void *B, int ldb, void *C, int ldc, cudaDataType_t at,
                      cudaDataType_t ct, int accumulate)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (!accumulate) /* D = 0: no product of an empty sum */
            cu_ok(st, cudaMemset2DAsync(C, (size_t)ldc * (ct == CUDA_R_32F ? 4 : 2), 0,
                                        (size_t)m * (ct == CUDA_R_32F ? 4 : 2), (size_t)n,
                                        st->stream),
                  "empty product");
        return;
    }
    int al = align_of(A);
    if (align_of(B) < al) al = align_of(B);
    if (align_of(C) < al) al = align_of(C);
    lt_plan *p = NULL;
    for (int i = 0; i < st->n_plans; i++) {
        lt_plan *q = &st->plans[i];
        if (q->ta == ta && q->tb == tb && q->m == m && q->n == n && q->k == k && q->lda == lda &&
            q->ldb == ldb && q->ldc == ldc && q->at == (int)at && q->ct == (int)ct &&
            q->accumulate == accumulate && q->align == al) {
            p = q;
            break;
        }
    }
    if (!p) {
        /* a full cache starts over (a shape change: new plans are few) */
        if (st->n_plans == PLAN_CACHE) {
            for (int i = 0; i < st->n_plans; i++) plan_destroy(&st->plans[i]);
            st->n_plans = 0;
        }
        p = &st->plans[st->n_plans];
        memset(p, 0, sizeof *p);
        cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasLtMatmulPreference_t pref = NULL;
        cublasLtMatmulHeuristicResult_t res;
        int got = 0;
        uint32_t al32 = (uint32_t)al;
        size_t wsb = LT_WORKSPACE;
        int ok = lt_ok(st, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                       "matmul descriptor") &&
                 lt_ok(st,
                       cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa,
                                                      sizeof oa),
                       "transa") &&
                 lt_ok(st,
                       cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob,
                                                      sizeof ob),
                       "transb") &&
                 lt_ok(st,
                       cublasLtMatrixLayoutCreate(&p->a, at, ta ? k : m, ta ? m : k, lda),
                       "layout A") &&
                 lt_ok(st,
                       cublasLtMatrixLayoutCreate(&p->b, at, tb ? n : k, tb ? k : n, ldb),
                       "layout B") &&
                 lt_ok(st, cublasLtMatrixLayoutCreate(&p->c, ct, m, n, ldc), "layout C") &&
                 lt_ok(st, cublasLtMatmulPreferenceCreate(&pref), "preference") &&
                 lt_ok(st,
                       cublasLtMatmulPreferenceSetAttribute(
                           pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb),
                       "workspace preference");
        const cublasLtMatmulPreferenceAttributes_t als[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; ok && i < 4; i++)
            ok = lt_ok(st, cublasLtMatmulPreferenceSetAttribute(pref, als[i], &al32, sizeof al32),
                       "alignment preference");
        ok = ok && lt_ok(st,
                         cublasLtMatmulAlgoGetHeuristic(st->lt, p->op, p->a, p->b, p->c, p->c,
                                                        pref, 1, &res, &got),
                         "heuristic");
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (ok && got < 1) {
            fail(st, MAL_EDEVICE,
                 "cuBLASLt: no algorithm for a %dx%dx%d product (types %d/%d, alignment %d)", m,
                 n, k, (int)at, (int)ct, al);
            ok = 0;
        }
        if (!ok) {
            plan_destroy(p);
            return;
        }
        p->ta = ta, p->tb = tb, p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb;
        p->ldc = ldc, p->at = (int)at, p->ct = (int)ct, p->accumulate = accumulate, p->align = al;
        p->algo = res.algo;
        st->n_plans++;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    lt_ok(st,
          cublasLtMatmul(st->lt, p->op, &one, A, p->a, B, p->b, &beta, C, p->c, C, p->c, &p->algo,
                         st->ws, LT_WORKSPACE, st->stream),
          "matmul");
}

static cudaDataType_t dtype_of(mal_kern k)
{
    return k->compute == MAL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* out (N,OC) = inp (N,C) @ W (OC,C)^T: column-major out^T (OC x N) =
 * op_T(W stored C x OC) x inp^T (C x N). */
static void op_matmul_fwd(mal_kern k, void *out, const void *inp, const void *weight, int N, int C,
                          int OC, int accumulate)
{
    cudaDataType_t t = dtype_of(k);
    lt_matmul(st_of(k), 1, 0, OC, N, C, weight, C, inp, C, out, OC, t, t, accumulate);
}

/* dinp (N,C) += dout (N,OC) @ W (OC,C):   dinp^T (C x N) = W^T (C x OC,
 * stored) x dout^T (OC x N, stored).
 * dW (OC,C) += dout^T @ inp:   dW^T (C x OC) = inp^T (C x N, stored) x
 * op_T(dout^T stored OC x N), into the fp32 gradient. */
static void op_matmul_bwd(mal_kern k, void *dinp, float *dweight, const void *dout,
                          const void *inp, const void *weight, int N, int C, int OC)
{
    cu_state *st = st_of(k);
    cudaDataType_t t = dtype_of(k);
    if (N <= 0 || C <= 0 || OC <= 0) return;
    if (dinp) lt_matmul(st, 0, 0, C, N, OC, weight, C, dout, OC, dinp, C, t, t, 1);
    if (dweight) lt_matmul(st, 0, 1, C, OC, N, inp, C, dout, OC, dweight, C, t, CUDA_R_32F, 1);
}

/* ------------------------------------------------------------------------ */
/* The other operations: launchers of the kernel families (cuda_ops.h)      */

#define BF(k) ((k)->compute == MAL_BF16)

static void op_rmsnorm_fwd(mal_kern k, void *out, float *rstd, const void *inp, const void *weight,
                           int N, int C, float eps)
{
    cu_state *st = st_of(k);
    mal_cu_rmsnorm_fwd(st->stream, BF(k), out, rstd, inp, weight, N, C, eps);
    launched(st, "rmsnorm forward");
}

static void op_rmsnorm_bwd(mal_kern k, void *dinp, float *dweight, const void *dout,
                           const void *inp, const void *weight, const float *rstd, int N, int C)
{
    cu_state *st = st_of(k);
    void *s = scratch(st, mal_cu_rmsnorm_bwd_scratch_bytes(N, C));
    if (!s) return;
    mal_cu_rmsnorm_bwd(st->stream, BF(k), dinp, dweight, dout, inp, weight, rstd, N, C, s);
    launched(st, "rmsnorm backward");
}

static void rope_free(rope_dev *r)
{
    if (r->cs) cudaFree(r->cs);
    if (r->host) cudaFreeHost(r->host);
    r->cs = r->host = NULL;
}

/* The cos/sin table of (T, hd, rope) on the device, built on the host
 * exactly as the CPU backend builds its own (double, then float), in
 * pinned memory, and copied in on the instance's stream, so that the
 * kernel queued after it reads it whole and the host does not wait.  One
 * per exact T (the kernel finds the sines T rows after the cosines); a
 * model has one or two shapes, made at its first step. */
static const float *rope_table(cu_state *st, int T, int hd, const mal_rope *rope)
{
    for (int i = 0; i < st->n_ropes; i++) {
        rope_dev *r = &st->ropes[i];
        if (r->hd == hd && mal_rope_same(&r->rope, rope) && r->T == T) return r->cs;
    }
    if (st->n_ropes == ROPE_CACHE) { /* rare: keep the newest tables */
        if (!cu_ok(st, cudaStreamSynchronize(st->stream), "rope table eviction")) return NULL;
        rope_free(&st->ropes[0]);
        memmove(st->ropes, st->ropes + 1, (ROPE_CACHE - 1) * sizeof *st->ropes);
        st->n_ropes--;
    }
    const int h2 = hd / 2;
    size_t bytes = (size_t)2 * T * h2 * sizeof(float);
    rope_dev made = {T, hd, *rope, NULL, NULL};
    if (!cu_ok(st, cudaMallocHost((void **)&made.host, bytes), "rope table (pinned)")) return NULL;
    float *h = made.host;
    for (int i = 0; i < h2; i++) {
        double freq = mal_rope_inv_freq(rope, hd, i);
        for (int t = 0; t < T; t++) {
            double a = t * freq;
            h[(size_t)t * h2 + i] = (float)cos(a);
            h[(size_t)T * h2 + (size_t)t * h2 + i] = (float)sin(a);
        }
    }
    if (!cu_ok(st, cudaMalloc((void **)&made.cs, bytes), "rope table") ||
        !cu_ok(st, cudaMemcpyAsync(made.cs, h, bytes, cudaMemcpyHostToDevice, st->stream),
               "rope table upload")) {
        /* nothing queued reads it (a failed copy queued nothing) */
        rope_free(&made);
        return NULL;
    }
    st->ropes[st->n_ropes++] = made;
    return made.cs;
}

static void rope(mal_kern k, void *x, int B, int T, int H, int hd, const mal_rope *r, float dir)
{
    cu_state *st = st_of(k);
    if (B <= 0 || T <= 0 || H <= 0 || hd <= 0) return;
    if (hd % 2) {
        fail(st, MAL_EINVAL,
             "rope: head dimension %d is odd; RoPE rotates pairs, use an even head dimension", hd);
        return;
    }
    const float *cs = rope_table(st, T, hd, r);
    if (!cs) return;
    mal_cu_rope(st->stream, BF(k), x, cs, B, T, H, hd, dir);
    launched(st, "rope");
}

static void op_rope_fwd(mal_kern k, void *x, int B, int T, int H, int hd, const mal_rope *r)
{
    rope(k, x, B, T, H, hd, r, 1.0f);
}

static void op_rope_bwd(mal_kern k, void *dx, int B, int T, int H, int hd, const mal_rope *r)
{
    rope(k, dx, B, T, H, hd, r, -1.0f);
}

/* A head dimension the kernels do not take (odd, or past
 * MAL_CU_ATTENTION_MAX_HD) is an error of the next sync, never a
 * silently wrong result: the launchers do nothing for it. */
static int attention_refused(cu_state *st, int hd)
{
    if (mal_cu_attention_supported(hd)) return 0;
    fail(st, MAL_EINVAL,
         "attention: head dimension %d (d_model / n_heads) is not supported by the CUDA backend "
         "(even, 2 to %d); choose d_model and n_heads accordingly or use --backend cpu",
         hd, MAL_CU_ATTENTION_MAX_HD);
    return 1;
}

/* Flash attention keeps one float per query (the log-sum-exp) for the
 * backward, and the backward's scratch holds one float per query. */
static void op_attention_bytes(mal_kern k, int B, int T, int H, int hd, size_t *saved,
                               size_t *scratch_b)
{
    attention_refused(st_of(k), hd);
    size_t b = (size_t)B * (size_t)H * (size_t)T * sizeof(float);
    if (saved) *saved = b;
    if (scratch_b) *scratch_b = b;
}

static mal_cu_heads cu_heads(mal_attn_heads hs)
{
    mal_cu_heads h = {hs.H, hs.Hkv, hs.group, hs.q_off};
    return h;
}

/* cuDNN's attention takes the call when it was asked for, the mode is
 * bf16 and it has plans for the shape (built at the first call of a
 * shape); otherwise the kernels of attention.cu do (fp32, head layouts
 * cuDNN's graphs do not cover). */
/* cuDNN's workspace through the table, counted as scratch */
static void *dnn_ws_alloc(void *ctx, size_t bytes)
{
    return mal_kern_alloc_as(ctx, bytes, MAL_MEM_SCRATCH);
}

static void dnn_ws_free(void *ctx, void *p)
{
    mal_kern_free(ctx, p);
}

static int use_cudnn(cu_state *st, mal_kern k, int B, int T, mal_attn_heads hs, int hd)
{
    char msg[512];
    if (!BF(k)) return 0;
    if (!st->dnn && st->dnn_auto && !st->dnn_tried) {
        st->dnn_tried = 1;
        mal_cudnn_open(&st->dnn, st->stream, msg, sizeof msg); /* NULL: the hand kernels */
        mal_cudnn_set_allocator(st->dnn, dnn_ws_alloc, dnn_ws_free, k);
    }
    return st->dnn && mal_cudnn_attention_ok(st->dnn, B, T, cu_heads(hs), hd, msg, sizeof msg);
}

/* cuDNN writes dq, dk, dv -- the table's contract; a gradient the caller
 * does not want (NULL) goes to attn_tmp (grown once per larger shape). */
static void cudnn_attention_bwd(cu_state *st, void *dq, void *dk, void *dv, void *scr,
                                const void *dout, const void *out, const void *q, const void *kk,
                                const void *v, const void *saved, int B, int T, mal_attn_heads hs,
                                int hd)
{
    size_t nq = (size_t)B * T * hs.H * hd, nk = (size_t)B * T * hs.Hkv * hd;
    if (!dq || !dk || !dv) {
        size_t need = (nq + 2 * nk) * 2; /* bf16 */
        if (need > st->attn_tmp_bytes) {
            /* the old buffer may still be written by queued graphs */
            if (st->attn_tmp && !cu_ok(st, cudaStreamSynchronize(st->stream), "attention scratch"))
                return;
            if (st->attn_tmp) cudaFree(st->attn_tmp);
            st->attn_tmp = NULL;
            st->attn_tmp_bytes = 0;
            if (!cu_ok(st, cudaMalloc(&st->attn_tmp, need), "cuDNN attention's gradient buffers"))
                return;
            st->attn_tmp_bytes = need;
        }
        char *t = st->attn_tmp;
        if (!dq) dq = t;
        if (!dk) dk = t + nq * 2;
        if (!dv) dv = t + (nq + nk) * 2;
    }
    char msg[512];
    if (mal_cudnn_attention_bwd(st->dnn, dq, dk, dv, dout, out, q, kk, v, saved, scr, B, T,
                                cu_heads(hs), hd, msg, sizeof msg))
        fail(st, MAL_EDEVICE, "%s", msg);
    launched(st, "attention backward (cuDNN)");
}

static void op_attention_fwd(mal_kern k, void *out, void *saved, const void *q, const void *kk,
                             const void *v, int B, int T, mal_attn_heads hs, int hd)
{
    cu_state *st = st_of(k);
    if (attention_refused(st, hd)) return;
    if (use_cudnn(st, k, B, T, hs, hd)) {
        char msg[512];
        if (mal_cudnn_attention_fwd(st->dnn, out, saved, q, kk, v, B, T, cu_heads(hs), hd, msg,
                                    sizeof msg))
            fail(st, MAL_EDEVICE, "%s", msg);
        launched(st, "attention forward (cuDNN)");
        return;
    }
    mal_cu_attention_fwd(st->stream, BF(k), st->attn_impl, out, saved, q, kk, v, B, T, cu_heads(hs),
                         hd);
    launched(st, "attention forward");
}

static void op_attention_bwd(mal_kern k, void *dq, void *dk, void *dv, void *scr, const void *dout,
                             const void *out, const void *q, const void *kk, const void *v,
                             const void *saved, int B, int T, mal_attn_heads hs, int hd)
{
    cu_state *st = st_of(k);
    if (attention_refused(st, hd)) return;
    if (use_cudnn(st, k, B, T, hs, hd)) {
        cudnn_attention_bwd(st, dq, dk, dv, scr, dout, out, q, kk, v, saved, B, T, hs, hd);
        return;
    }
    /* attention.cu's kernels accumulate; the contract writes */
    size_t e = BF(k) ? 2 : 4;
    size_t nq = (size_t)B * T * hs.H * hd * e, nk = (size_t)B * T * hs.Hkv * hd * e;
    void *const zb[] = {dq, dk, dv};
    const size_t zn[] = {dq ? nq : 0, dk ? nk : 0, dv ? nk : 0};
    mal_cu_zero_multi(st->stream, zb, zn, 3);
    mal_cu_attention_bwd(st->stream, BF(k), st->attn_impl, dq, dk, dv, dout, out, q, kk, v, saved,
                         B, T, cu_heads(hs), hd, scr);
    launched(st, "attention backward");
}

static void op_swiglu_fwd(mal_kern k, void *out, const void *gate, const void *up, size_t n)
{
    cu_state *st = st_of(k);
    mal_cu_swiglu_fwd(st->stream, BF(k), out, gate, up, n);
    launched(st, "swiglu forward");
}

static void op_swiglu_bwd(mal_kern k, void *dgate, void *dup, const void *dout, const void *gate,
                          const void *up, size_t n)
{
    cu_state *st = st_of(k);
    mal_cu_swiglu_bwd(st->stream, BF(k), dgate, dup, dout, gate, up, n);
    launched(st, "swiglu backward");
}

static void op_add(mal_kern k, void *out, const void *a, const void *b, size_t n)
{
    cu_state *st = st_of(k);
    mal_cu_add(st->stream, BF(k), out, a, b, n);
    launched(st, "add");
}

static void op_accumulate(mal_kern k, float *y, const float *x, size_t n)
{
    cu_state *st = st_of(k);
    mal_cu_accumulate(st->stream, y, x, n);
    launched(st, "accumulate");
}

static void op_scale(mal_kern k, float *x, size_t n, float s)
{
    cu_state *st = st_of(k);
    mal_cu_scale(st->stream, x, n, s);
    launched(st, "scale");
}

static void op_sumsq(mal_kern k, double *acc, const float *x, size_t rows, size_t width,
                     size_t pitch)
{
    cu_state *st = st_of(k);
    void *s = scratch(st, mal_cu_sumsq_scratch_bytes());
    if (!s) return;
    mal_cu_sumsq(st->stream, acc, x, rows, width, pitch, s);
    launched(st, "sum of squares");
}

/* The launcher's table is cuda_ops.h's (no C header of the library in the
 * .cu files): converted a chunk at a time. */
enum { MULTI_CHUNK = 256 };

static void op_sumsq_multi(mal_kern k, double *acc, const mal_kern_run *runs, int count)
{
    cu_state *st = st_of(k);
    void *s = scratch(st, mal_cu_sumsq_multi_scratch_bytes());
    if (!s) return;
    mal_cu_run r[MULTI_CHUNK];
    for (int i = 0; i < count; i += MULTI_CHUNK) {
        const int n = count - i < MULTI_CHUNK ? count - i : MULTI_CHUNK;
        for (int j = 0; j < n; j++)
            r[j] =
                (mal_cu_run){runs[i + j].x, runs[i + j].rows, runs[i + j].width, runs[i + j].pitch};
        mal_cu_sumsq_multi(st->stream, acc, r, n, s);
    }
    launched(st, "sum of squares (multi-tensor)");
}

static void op_embedding_fwd(mal_kern k, void *out, const int *tokens, const void *wte, int N,
                             int C, int V, int v0, int Vl)
{
    cu_state *st = st_of(k);
    mal_cu_embedding_fwd(st->stream, BF(k), out, tokens, wte, N, C, V, v0, Vl, st->dev_err);
    launched(st, "embedding forward");
}

/* The backward sorts the positions by token over this shard's Vl rows. */
static void op_embedding_bwd(mal_kern k, float *dwte, const void *dout, const int *tokens, int N,
                             int C, int v0, int Vl)
{
    cu_state *st = st_of(k);
    void *s = scratch(st, mal_cu_embedding_bwd_scratch_bytes(N, Vl));
    if (!s) return;
    mal_cu_embedding_bwd(st->stream, BF(k), dwte, dout, tokens, N, C, v0, Vl, s);
    launched(st, "embedding backward");
}

static void op_xent_fwd_bwd(mal_kern k, float *losses, void *dlogits, const void *logits,
                            const int *targets, int N, int V, float dscale)
{
    cu_state *st = st_of(k);
    mal_cu_xent(st->stream, BF(k), losses, dlogits, logits, targets, N, V, dscale, st->dev_err);
    launched(st, "cross-entropy");
}

static void op_xent_stats(mal_kern k, float *stats, const void *logits, const int *targets, int N,
                          int Vl, int v0)
{
    cu_state *st = st_of(k);
    mal_cu_xent_stats(st->stream, BF(k), stats, logits, targets, N, Vl, v0);
    launched(st, "cross-entropy statistics");
}

static void op_xent_combine(mal_kern k, float *losses, void *dlogits, const void *logits,
                            const float *all, int P, const int *targets, int N, int Vl, int v0,
                            int V, float dscale)
{
    cu_state *st = st_of(k);
    mal_cu_xent_combine(st->stream, BF(k), losses, dlogits, logits, all, P, targets, N, Vl, v0, V,
                        dscale, st->dev_err);
    launched(st, "cross-entropy");
}

static void op_cast_working(mal_kern k, void *work, const float *master, size_t n)
{
    cu_state *st = st_of(k);
    if (!work || work == (const void *)master || !n) return;
    mal_cu_cast(st->stream, BF(k), work, master, n);
    launched(st, "working-copy cast");
}

/* The bias corrections in double, as the CPU backend computes them. */
static void op_adamw(mal_kern k, float *param, void *work, const float *grad, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t)
{
    cu_state *st = st_of(k);
    const float ibc1 = (float)(1.0 / (1.0 - pow((double)beta1, t)));
    const float ibc2 = (float)(1.0 / (1.0 - pow((double)beta2, t)));
    mal_cu_adamw(st->stream, BF(k), param, work == (void *)param ? NULL : work, grad, m, v, n, lr,
                 beta1, beta2, eps, weight_decay, grad_scale, ibc1, ibc2);
    launched(st, "adamw");
}

/* The bias corrections as op_adamw's, so that every element gets its bits. */
static void op_adamw_multi(mal_kern k, float *param, void *work, const float *grad, float *m,
                           float *v, const mal_kern_span *spans, int count, float lr, float beta1,
                           float beta2, float eps, float grad_scale, int t)
{
    cu_state *st = st_of(k);
    const float ibc1 = (float)(1.0 / (1.0 - pow((double)beta1, t)));
    const float ibc2 = (float)(1.0 / (1.0 - pow((double)beta2, t)));
    mal_cu_span sp[MULTI_CHUNK];
    for (int i = 0; i < count; i += MULTI_CHUNK) {
        const int n = count - i < MULTI_CHUNK ? count - i : MULTI_CHUNK;
        for (int j = 0; j < n; j++)
            sp[j] = (mal_cu_span){spans[i + j].offset, spans[i + j].n, spans[i + j].weight_decay};
        mal_cu_adamw_multi(st->stream, BF(k), param, work == (void *)param ? NULL : work, grad, m,
                           v, sp, n, lr, beta1, beta2, eps, grad_scale, ibc1, ibc2);
    }
    launched(st, "adamw (multi-tensor)");
}

/* ------------------------------------------------------------------------ */
/* Straggler emulation                                                        */

/* A slowdown by `rate` is a duty cycle: every period of
 * MAL_KERN_SLOWDOWN_PERIOD_S the thread below launches the busy kernel
 * (slow.cu: one block per SM holding all of the SM's shared memory, so no
 * other block fits beside it) for the busy part d = 1 - 1/rate of the
 * period and leaves the GPU alone for the rest.  Work on the instance's
 * stream then has the SMs for about 1/rate of the wall time: a step that
 * took t takes about t * rate (rate 3: busy 2/3 of every 2 ms).
 *
 * An approximation, for three reasons.  The GPU's block scheduler shares
 * SMs between streams block by block, not by time slices: a training
 * kernel's blocks already running when the busy kernel is launched finish
 * first (the busy block of that SM starts late and, spinning for a fixed
 * time, ends late), and blocks of both wait for each other at the edges.
 * Memory bandwidth and L2 are shared, and the spin uses neither.  And the
 * launch, the host's wake-up and the stream synchronisation add a few
 * microseconds to each period.  The busy stream has the highest priority
 * so that its blocks go first when SMs free up, which keeps the busy part
 * close to d.  Samples that time the slowdown must span several periods
 * (the monitor's probe does, with --inject-mode gpu): a kernel shorter
 * than a period runs at full speed in the idle part or waits out a busy
 * part, 1 or many times slower, and only the mean is 1/rate. */
static void *slow_loop(void *arg)
{
    cu_state *st = arg;
    const long long period = (long long)(MAL_KERN_SLOWDOWN_PERIOD_S * 1e9);
    cudaError_t e = cudaSetDevice(st->device);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (e == cudaSuccess && !atomic_load(&st->slow.stop)) {
        long long busy = atomic_load(&st->slow.busy_ns);
        mal_cu_spin(st->slow.stream, st->sm_count, st->slow.smem, (unsigned long long)busy);
        if ((e = cudaGetLastError()) != cudaSuccess ||
            (e = cudaStreamSynchronize(st->slow.stream)) != cudaSuccess)
            break;
        /* The idle part: up to the start of the next period.  A period
         * that ran over (the busy blocks waited for SMs) is not caught up
         * by a burst: the next one starts now. */
        long long ns = next.tv_nsec + period;
        next.tv_sec += ns / 1000000000;
        next.tv_nsec = ns % 1000000000;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec >= next.tv_nsec))
            next = now;
        else
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) != 0) {
            }
    }
    if (e != cudaSuccess) atomic_store(&st->slow.err, (int)e);
    return NULL;
}

/* Stop the thread if it runs; MAL_EDEVICE if it had failed, else 0. */
static int slow_stop(cu_state *st)
{
    if (!st->slow.running) return 0;
    atomic_store(&st->slow.stop, 1);
    pthread_join(st->slow.thread, NULL);
    st->slow.running = 0;
    cudaError_t e = (cudaError_t)atomic_load(&st->slow.err);
    if (e == cudaSuccess) return 0;
    return MAL_ERR(MAL_EDEVICE, "CUDA: the straggler emulation's busy kernel failed: %s (%s)",
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

static int op_slowdown(mal_kern k, double rate)
{
    cu_state *st = st_of(k);
    const double period = MAL_KERN_SLOWDOWN_PERIOD_S * 1e9;
    if (st->slow.running && rate > 1.0 && !atomic_load(&st->slow.err)) {
        /* a new rate for the running thread, from its next period on */
        atomic_store(&st->slow.busy_ns, (long long)((1.0 - 1.0 / rate) * period));
        return 0;
    }
    int rc = slow_stop(st);
    if (rc || !(rate > 1.0)) return rc;
    if (!st->slow.stream) {
        int least = 0, greatest = 0;
        st->slow.smem = mal_cu_spin_prepare(st->device);
        if (!st->slow.smem)
            return MAL_ERR(MAL_EDEVICE,
                           "CUDA: cannot give the straggler emulation's busy kernel the shared "
                           "memory of a whole SM: %s",
                           cudaGetErrorString(cudaGetLastError()));
        cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
        if (e == cudaSuccess)
            e = cudaStreamCreateWithPriority(&st->slow.stream, cudaStreamNonBlocking, greatest);
        if (e != cudaSuccess) {
            st->slow.stream = NULL;
            return MAL_ERR(MAL_EDEVICE, "CUDA: straggler emulation stream: %s (%s)",
                           cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    atomic_store(&st->slow.busy_ns, (long long)((1.0 - 1.0 / rate) * period));
    atomic_store(&st->slow.stop, 0);
    atomic_store(&st->slow.err, 0);
    int err = pthread_create(&st->slow.thread, NULL, slow_loop, st);
    if (err)
        return MAL_ERR(MAL_ENOMEM, "cannot start the straggler emulation's thread: %s",
                       strerror(err));
    st->slow.running = 1;
    return 0;
}

static int op_device_info(mal_kern k, mal_kern_device_info *out)
{
    cu_state *st = st_of(k);
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaSuccess;
    /* the properties once (they take a while), the memory every time */
    if (!st->dev_name[0]) {
        struct cudaDeviceProp prop;
        e = cudaGetDeviceProperties(&prop, st->device);
        if (e == cudaSuccess) snprintf(st->dev_name, sizeof st->dev_name, "%.95s", prop.name);
    }
    if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess)
        return MAL_ERR(MAL_EDEVICE, "CUDA: device information: %s (%s)", cudaGetErrorString(e),
                       cudaGetErrorName(e));
    snprintf(out->name, sizeof out->name, "%s", st->dev_name);
    out->used_bytes = (double)(total_b - free_b);
    out->total_bytes = (double)total_b;
    return 0;
}

static const mal_kernels_ops cuda_ops = {
    .alloc = op_alloc,
    .free = op_free,
    .resize = op_resize,
    .host_alloc = op_host_alloc,
    .host_free = op_host_free,
    .zero = op_zero,
    .zero_multi = op_zero_multi,
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
    .sumsq_multi = op_sumsq_multi,
    .embedding_fwd = op_embedding_fwd,
    .embedding_bwd = op_embedding_bwd,
    .xent_fwd_bwd = op_xent_fwd_bwd,
    .xent_stats = op_xent_stats,
    .xent_combine = op_xent_combine,
    .adamw = op_adamw,
    .adamw_multi = op_adamw_multi,
    .cast_working = op_cast_working,
    .slowdown = op_slowdown,
    .device_info = op_device_info,
};

/* ------------------------------------------------------------------------ */
/* Registry entry                                                             */

/* The tensor-core kernels are built for sm_80 and newer (configure's
 * NVCC_ARCH_FLAGS: sm_90a, sm_80, PTX of compute_90 for later GPUs). */
static int cuda_probe(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return MAL_ERR(MAL_EDEVICE, "no usable GPU: %s (%s)", cudaGetErrorString(e),
                       cudaGetErrorName(e));
    }
    if (n < 1) return MAL_ERR(MAL_EDEVICE, "no GPU visible (CUDA sees 0 devices)");
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        major < 8)
        return MAL_ERR(MAL_EDEVICE,
                       "GPU 0 has compute capability %d.x; the CUDA backend needs 8.0 or newer "
                       "(bf16 tensor cores)",
                       major);
    return 0;
}

/* The device of this process when the caller does not name one: the local
 * rank that the launcher exports (MPICH, Open MPI, Slurm), modulo the
 * devices there are; 0 for a single process. */
static int pick_device(int n)
{
    static const char *const vars[] = {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v) % (n > 0 ? n : 1);
    }
    return 0;
}

static void cuda_destroy(mal_kern k);

static int cuda_create(const mal_kern_config *cfg, mal_kern *out)
{
    *out = NULL;
    int rc = cuda_probe();
    if (rc) return rc;
    if (cfg->compute != MAL_F32 && cfg->compute != MAL_BF16)
        return MAL_ERR(MAL_ENOTSUP, "the cuda backend computes in fp32 or bf16, not %s",
                       mal_dtype_name(cfg->compute));
    int n = 0;
    cudaGetDeviceCount(&n);
    int dev = cfg->device >= 0 ? cfg->device : pick_device(n);
    if (dev >= n)
        return MAL_ERR(MAL_EINVAL, "GPU %d requested but this machine has %d", dev, n);
    mal_kern k = calloc(1, sizeof *k);
    cu_state *st = calloc(1, sizeof *st);
    if (!k || !st) {
        free(k);
        free(st);
        return MAL_ERR(MAL_ENOMEM, "out of memory creating a cuda kernel instance");
    }
    k->ops = &cuda_ops;
    k->name = "cuda";
    k->compute = cfg->compute;
    k->host_addressable = 0;
    k->impl = st;
    st->device = dev;
    /* MALLEUS_CUDA_ATTENTION: unset (cuDNN's fused attention where cuDNN
     * loads and covers the call, else attention.cu's tensor-core kernels),
     * cudnn (the same, but a cuDNN that cannot be loaded is an error),
     * hand (attention.cu's tensor-core kernels only), generic
     * (attention.cu's one-warp-per-row kernels, for bisecting a bf16
     * problem) */
    const char *impl = getenv("MALLEUS_CUDA_ATTENTION");
    if (impl && *impl && strcmp(impl, "hand") && strcmp(impl, "generic") && strcmp(impl, "cudnn")) {
        free(k);
        free(st);
        return MAL_ERR(MAL_EINVAL, "MALLEUS_CUDA_ATTENTION=%s: expected hand, generic or cudnn",
                       impl);
    }
    st->attn_impl = impl && !strcmp(impl, "generic");
    int want_cudnn = impl && !strcmp(impl, "cudnn");
    st->dnn_auto = !impl || !*impl;
    int ok =
        cu_ok(st, cudaSetDevice(dev), "selecting the GPU") &&
        cu_ok(st, cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, dev),
              "device attributes") &&
        cu_ok(st, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "stream create") &&
        lt_ok(st, cublasLtCreate(&st->lt), "handle create") &&
        cu_ok(st, cudaMalloc(&st->ws, LT_WORKSPACE), "cuBLASLt workspace") &&
        cu_ok(st, cudaMalloc((void **)&st->dev_err, sizeof(int)), "error flag") &&
        /* on the instance's stream, ahead of every kernel that sets it
         * (cudaMemset would run on the legacy stream, unordered with
         * this non-blocking one) */
        cu_ok(st, cudaMemsetAsync(st->dev_err, 0, sizeof(int), st->stream), "error flag") &&
        cu_ok(st, cudaMallocHost((void **)&st->host_err, sizeof(int)), "error flag");
    if (!ok) {
        rc = MAL_ERR(MAL_EDEVICE, "cannot start the cuda backend on GPU %d: %s", dev, st->msg);
        cuda_destroy(k);
        return rc;
    }
    if (want_cudnn && mal_cudnn_open(&st->dnn, st->stream, st->msg, sizeof st->msg)) {
        rc = MAL_ERR(MAL_EDEVICE, "MALLEUS_CUDA_ATTENTION=cudnn on GPU %d: %s", dev, st->msg);
        cuda_destroy(k);
        return rc;
    }
    mal_cudnn_set_allocator(st->dnn, dnn_ws_alloc, dnn_ws_free, k);
    *out = k;
    return 0;
}

static void cuda_destroy(mal_kern k)
{
    if (!k) return;
    cu_state *st = st_of(k);
    if (st) {
        slow_stop(st);
        if (st->slow.stream) cudaStreamDestroy(st->slow.stream);
        if (st->stream) cudaStreamSynchronize(st->stream);
        for (int i = 0; i < st->n_plans; i++) plan_destroy(&st->plans[i]);
        for (int i = 0; i < st->n_ropes; i++)
            rope_free(&st->ropes[i]);
        mal_cudnn_close(st->dnn);
        if (st->attn_tmp) cudaFree(st->attn_tmp);
        if (st->scratch) cudaFree(st->scratch);
        if (st->ws) cudaFree(st->ws);
        if (st->dev_err) cudaFree(st->dev_err);
        if (st->host_err) cudaFreeHost(st->host_err);
        if (st->lt) cublasLtDestroy(st->lt);
        if (st->stream) cudaStreamDestroy(st->stream);
        free(st);
    }
    free(k);
}

const mal_kern_backend mal_kern_backend_cuda = {
    .reg = {.name = "cuda", .probe = cuda_probe},
    .what = "NVIDIA GPU (sm_80+): cuBLASLt + Malleus kernels, fp32 or bf16",
    .is_default = 1,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .dtypes = 1u << MAL_F32 | 1u << MAL_BF16,
    .default_compute = MAL_BF16,
    .has_slowdown = 1,
};
