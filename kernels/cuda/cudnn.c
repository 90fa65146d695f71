/* cuDNN's fused attention behind the CUDA backend's attention op
 * (cudnn.h says what and why).  The graphs are the ones cuDNN's own
 * frontend library builds for causal scaled dot-product attention, written
 * here against the backend API (cudnn_graph.h) so that the project needs
 * no C++ library: cuDNN recognises the pattern -- a product, pointwise
 * operations, two reductions, a product -- and compiles one fused kernel
 * for it.  Every tensor of the graph has a unique id; the non-virtual ones
 * (inputs, outputs, the log-sum-exp, the backward's row sums) are bound to
 * device pointers at each execution through a variant pack, the scalars
 * (the scale, -inf, 1) by value from host memory.
 *
 * The library is loaded with dlopen: nothing links it, and a machine
 * without it (or without a GPU) gets -1 and a message from
 * mal_cudnn_open, never a failure to start. */
#include "base/mal.h"

#include "cudnn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef HAVE_CUDNN_H

struct mal_cudnn {
    int unused;
};

int mal_cudnn_open(mal_cudnn **out, mal_cu_stream stream, char *msg, size_t n)
{
    (void)stream;
    *out = NULL;
    snprintf(msg, n,
             "cuDNN attention: this build has no cuDNN headers (configure found no "
             "cudnn_graph.h; set CUDNN_CFLAGS=-I<dir> and reconfigure)");
    return -1;
}
void mal_cudnn_close(mal_cudnn *c)
{
    (void)c;
}
long mal_cudnn_version(const mal_cudnn *c)
{
    (void)c;
    return 0;
}
void mal_cudnn_set_allocator(mal_cudnn *c, void *(*alloc)(void *ctx, size_t bytes),
                             void (*release)(void *ctx, void *p), void *ctx)
{
    (void)c, (void)alloc, (void)release, (void)ctx;
}
int mal_cudnn_attention_ok(mal_cudnn *c, int B, int T, mal_cu_heads hs, int hd, char *msg, size_t n)
{
    (void)c, (void)B, (void)T, (void)hs, (void)hd;
    snprintf(msg, n, "cuDNN attention: not built");
    return 0;
}
int mal_cudnn_attention_fwd(mal_cudnn *c, void *out, float *lse, const void *q, const void *k,
                            const void *v, int B, int T, mal_cu_heads hs, int hd, char *msg,
                            size_t n)
{
    (void)c, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)B, (void)T, (void)hs, (void)hd;
    snprintf(msg, n, "cuDNN attention: not built");
    return -1;
}
int mal_cudnn_check_offline(int B, int T, mal_cu_heads hs, int hd, const char *device_json,
                            int *fwd_engines, int *bwd_engines, char *msg, size_t n)
{
    (void)B, (void)T, (void)hs, (void)hd, (void)device_json;
    *fwd_engines = *bwd_engines = 0;
    snprintf(msg, n, "cuDNN attention: not built");
    return -1;
}
int mal_cudnn_attention_bwd(mal_cudnn *c, void *dq, void *dk, void *dv, const void *dout,
                            const void *out, const void *q, const void *k, const void *v,
                            const float *lse, float *dsum, int B, int T, mal_cu_heads hs, int hd,
                            char *msg, size_t n)
{
    (void)c, (void)dq, (void)dk, (void)dv, (void)dout, (void)out, (void)q, (void)k, (void)v;
    (void)lse, (void)dsum, (void)B, (void)T, (void)hs, (void)hd;
    snprintf(msg, n, "cuDNN attention: not built");
    return -1;
}

#else /* HAVE_CUDNN_H */

#include <cuda_runtime_api.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* The handle attributes of the operation graph and the execution plan are
 * marked deprecated in cuDNN 9.x headers but are still what its frontend
 * sets; their replacement (device properties) is newer than 9.0. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define PLAN_CACHE 8
#define MAX_DESCS 160
#define MAX_OPS 40

typedef struct {
    void *dl;
    size_t (*getVersion)(void);
    const char *(*getErrorString)(cudnnStatus_t);
    void (*getLastErrorString)(char *, size_t);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*setStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*bCreate)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*bDestroy)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*bFinalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*bSet)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                          cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*bGet)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                          cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*bExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} cudnn_fns;

/* One built graph: its plan, and every descriptor it was made of (kept
 * until the cache goes: the plan may refer to them). */
typedef struct {
    cudnnBackendDescriptor_t descs[MAX_DESCS];
    int nd;
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
} built;

typedef struct {
    int B, T, H, Hkv, hd;
    int ok; /* 1 both plans built; 0 refused (msg kept) */
    built fwd, bwd;
    char why[256];
} plan_entry;

struct mal_cudnn {
    cudnn_fns f;
    cudnnHandle_t h;
    cudaStream_t stream;
    long version;
    void *ws; /* device workspace, the largest any cached plan needs */
    size_t ws_bytes;
    void *(*ws_alloc)(void *ctx, size_t bytes); /* NULL: cudaMalloc */
    void (*ws_free)(void *ctx, void *p);
    void *ws_ctx;
    plan_entry plans[PLAN_CACHE];
    int n_plans;
    /* the by-value scalars' host copies (read when a graph is queued) */
    float scale_val, neginf_val, one_val;
    /* mal_cudnn_check_offline: a described device instead of a handle */
    cudnnBackendDescriptor_t devprop;
    int64_t offline_engines;
};

/* ---- errors -------------------------------------------------------- */

static int failed(mal_cudnn *c, cudnnStatus_t s, const char *what, char *msg, size_t n)
{
    char last[384] = "";
    if (c && c->f.getLastErrorString) c->f.getLastErrorString(last, sizeof last);
    snprintf(msg, n, "cuDNN attention: %s: %s%s%s", what,
             c && c->f.getErrorString ? c->f.getErrorString(s) : "error", last[0] ? ": " : "",
             last);
    return -1;
}

/* ---- the graph builder ---------------------------------------------
 * Calls record the first failure and do nothing after it, so that a
 * graph reads as a list of operations; gb_done reports it. */

typedef struct {
    mal_cudnn *c;
    built *b;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    int64_t next_uid; /* virtual tensors' ids */
    cudnnStatus_t st;
    char what[96];
} gb;

static int gb_ok(gb *g)
{
    return g->st == CUDNN_STATUS_SUCCESS;
}

static void gb_fail(gb *g, cudnnStatus_t s, const char *what)
{
    if (!gb_ok(g)) return;
    g->st = s;
    snprintf(g->what, sizeof g->what, "%s", what);
}

static cudnnBackendDescriptor_t gb_new(gb *g, cudnnBackendDescriptorType_t type, const char *what)
{
    if (!gb_ok(g)) return NULL;
    if (g->b->nd >= MAX_DESCS) {
        gb_fail(g, CUDNN_STATUS_BAD_PARAM, "too many descriptors");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t s = g->c->f.bCreate(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, s, what);
        return NULL;
    }
    g->b->descs[g->b->nd++] = d;
    return d;
}

static void gb_set(gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                   cudnnBackendAttributeType_t t, int64_t count, const void *val, const char *what)
{
    if (!gb_ok(g)) return;
    cudnnStatus_t s = g->c->f.bSet(d, a, t, count, val);
    if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, what);
}

static void gb_fin(gb *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (!gb_ok(g)) return;
    cudnnStatus_t s = g->c->f.bFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, what);
}

static void gb_setd(gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                    cudnnBackendDescriptor_t v, const char *what)
{
    gb_set(g, d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

/* A tensor: 4 dimensions, its strides, id; virtual (an intermediate that
 * never reaches memory) or by value (a scalar from host memory). */
static cudnnBackendDescriptor_t tensor(gb *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                       const int64_t str[4], int virt, int byval)
{
    cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    int64_t align = 16;
    bool v = virt != 0, bv = byval != 0;
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor type");
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "tensor strides");
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor virtual");
    if (bv)
        gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by value");
    gb_fin(g, t, "tensor finalize");
    return t;
}

static cudnnBackendDescriptor_t vtensor(gb *g, cudnnDataType_t dt, const int64_t dim[4],
                                        const int64_t str[4])
{
    return tensor(g, g->next_uid++, dt, dim, str, 1, 0);
}

static cudnnBackendDescriptor_t scalar(gb *g, int64_t uid)
{
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, uid, CUDNN_DATA_FLOAT, one, one, 0, 1);
}

static void add_op(gb *g, cudnnBackendDescriptor_t op)
{
    if (!gb_ok(g)) return;
    if (g->nops >= MAX_OPS) {
        gb_fail(g, CUDNN_STATUS_BAD_PARAM, "too many operations");
        return;
    }
    g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX */
static void pointwise(gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis)
{
    cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
    if (axis >= 0)
        gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    gb_fin(g, pw, "pointwise finalize");
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op desc");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b) gb_setd(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) gb_setd(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    gb_fin(g, op, "pointwise operation finalize");
    add_op(g, op);
}

/* c = a b (batched over the two leading dimensions, fp32 accumulation) */
static void matmul(gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c)
{
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul type");
    gb_fin(g, mm, "matmul finalize");
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "matmul desc");
    gb_fin(g, op, "matmul operation finalize");
    add_op(g, op);
}

/* y = reduce(x) over the dimensions where y has extent 1 (or fewer heads) */
static void reduction(gb *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y)
{
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
           "reduction mode");
    gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction type");
    gb_fin(g, r, "reduction finalize");
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r, "reduction desc");
    gb_fin(g, op, "reduction operation finalize");
    add_op(g, op);
}

/* y = x seen through other dimensions/strides (a transpose of a virtual) */
static void reshape(gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    gb_setd(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    gb_fin(g, op, "reshape operation finalize");
    add_op(g, op);
}

/* The causal mask on scores s (B,H,T,T): keep s where row >= column,
 * -inf elsewhere (the top-left-aligned diagonal). */
static cudnnBackendDescriptor_t causal(gb *g, cudnnBackendDescriptor_t s,
                                       cudnnBackendDescriptor_t ninf, const int64_t sd[4],
                                       const int64_t ss[4])
{
    cudnnBackendDescriptor_t row = vtensor(g, CUDNN_DATA_INT32, sd, ss);
    cudnnBackendDescriptor_t col = vtensor(g, CUDNN_DATA_INT32, sd, ss);
    cudnnBackendDescriptor_t keep = vtensor(g, CUDNN_DATA_BOOLEAN, sd, ss);
    cudnnBackendDescriptor_t out = vtensor(g, CUDNN_DATA_FLOAT, sd, ss);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, ninf, keep, out, -1);
    return out;
}

/* Ids of the non-virtual tensors (the variant packs use them). */
enum {
    U_Q = 1,
    U_K,
    U_V,
    U_O,
    U_STATS,
    U_SCALE,
    U_NINF, /* forward */
    U_DO = 11,
    U_ONE,
    U_DSUM,
    U_DQ,
    U_DK,
    U_DV, /* backward adds */
    U_VIRTUAL = 100
};

typedef struct {
    int64_t b, h, hk, s, d;
} shape;

static void layout_q(const shape *p, int64_t heads, int64_t dim[4], int64_t str[4])
{
    /* (B,T,heads,hd) in memory, seen as [B, heads, T, hd] */
    dim[0] = p->b, dim[1] = heads, dim[2] = p->s, dim[3] = p->d;
    str[0] = p->s * heads * p->d, str[1] = p->d, str[2] = heads * p->d, str[3] = 1;
}

static void layout_t(const shape *p, int64_t heads, int64_t dim[4], int64_t str[4])
{
    /* the same memory seen transposed: [B, heads, hd, T] */
    dim[0] = p->b, dim[1] = heads, dim[2] = p->d, dim[3] = p->s;
    str[0] = p->s * heads * p->d, str[1] = p->d, str[2] = 1, str[3] = heads * p->d;
}

static void build_forward(gb *g, const shape *p)
{
    int64_t qd[4], qs[4], ktd[4], kts[4], vd[4], vs[4];
    layout_q(p, p->h, qd, qs);
    layout_t(p, p->hk, ktd, kts);
    layout_q(p, p->hk, vd, vs);
    int64_t sd[4] = {p->b, p->h, p->s, p->s};
    int64_t ss[4] = {p->h * p->s * p->s, p->s * p->s, p->s, 1};
    int64_t rd[4] = {p->b, p->h, p->s, 1};
    int64_t rs[4] = {p->h * p->s, p->s, 1, 1};
    cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;

    cudnnBackendDescriptor_t Q = tensor(g, U_Q, bf, qd, qs, 0, 0);
    cudnnBackendDescriptor_t KT = tensor(g, U_K, bf, ktd, kts, 0, 0);
    cudnnBackendDescriptor_t V = tensor(g, U_V, bf, vd, vs, 0, 0);
    cudnnBackendDescriptor_t O = tensor(g, U_O, bf, qd, qs, 0, 0);
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, f32, rd, rs, 0, 0);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE);
    cudnnBackendDescriptor_t ninf = scalar(g, U_NINF);

    cudnnBackendDescriptor_t s = vtensor(g, f32, sd, ss);
    matmul(g, Q, KT, s);
    cudnnBackendDescriptor_t s1 = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_MUL, f32, s, scale, NULL, s1, -1);
    cudnnBackendDescriptor_t s2 = causal(g, s1, ninf, sd, ss);
    /* softmax, and its log-sum-exp max + log(sum exp(s - max)) */
    cudnnBackendDescriptor_t mx = vtensor(g, f32, rd, rs);
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, s2, mx);
    cudnnBackendDescriptor_t s3 = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_SUB, f32, s2, mx, NULL, s3, -1);
    cudnnBackendDescriptor_t e = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_EXP, f32, s3, NULL, NULL, e, -1);
    cudnnBackendDescriptor_t z = vtensor(g, f32, rd, rs);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    cudnnBackendDescriptor_t lz = vtensor(g, f32, rd, rs);
    pointwise(g, CUDNN_POINTWISE_LOG, f32, z, NULL, NULL, lz, -1);
    pointwise(g, CUDNN_POINTWISE_ADD, f32, mx, lz, NULL, stats, -1);
    cudnnBackendDescriptor_t pr = vtensor(g, bf, sd, ss);
    pointwise(g, CUDNN_POINTWISE_DIV, f32, e, z, NULL, pr, -1);
    matmul(g, pr, V, O);
}

/* out = a b for a key/value head's gradient: with grouped-query heads the
 * product has a row block per query head (fd, fs), summed over each
 * head's group into out */
static void kv_product(gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                       cudnnBackendDescriptor_t out, int gqa, const int64_t fd[4],
                       const int64_t fs[4])
{
    if (!gqa) {
        matmul(g, a, b, out);
        return;
    }
    cudnnBackendDescriptor_t full = vtensor(g, CUDNN_DATA_BFLOAT16, fd, fs);
    matmul(g, a, b, full);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

static void build_backward(gb *g, const shape *p)
{
    int64_t qd[4], qs[4], kd[4], ks[4], ktd[4], kts[4];
    layout_q(p, p->h, qd, qs);
    layout_q(p, p->hk, kd, ks);
    layout_t(p, p->hk, ktd, kts);
    int64_t sd[4] = {p->b, p->h, p->s, p->s};
    int64_t ss[4] = {p->h * p->s * p->s, p->s * p->s, p->s, 1};
    int64_t std_[4] = {p->b, p->h, p->s, p->s}; /* transposed: [B,H,key,query] */
    int64_t sts[4] = {p->h * p->s * p->s, p->s * p->s, 1, p->s};
    int64_t rd[4] = {p->b, p->h, p->s, 1};
    int64_t rs[4] = {p->h * p->s, p->s, 1, 1};
    int64_t od[4] = {p->b, p->h, p->s, p->d};
    int64_t os[4] = {p->h * p->s * p->d, p->s * p->d, p->h * p->d, 1};
    int64_t fd[4] = {p->b, p->h, p->s, p->d}; /* gradients of every query head */
    int64_t fs[4] = {p->h * p->s * p->d, p->s * p->d, p->d, 1};
    cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    int gqa = p->h != p->hk;

    cudnnBackendDescriptor_t Q = tensor(g, U_Q, bf, qd, qs, 0, 0);
    cudnnBackendDescriptor_t KT = tensor(g, U_K, bf, ktd, kts, 0, 0);
    cudnnBackendDescriptor_t VT = tensor(g, U_V, bf, ktd, kts, 0, 0);
    cudnnBackendDescriptor_t O = tensor(g, U_O, bf, qd, qs, 0, 0);
    cudnnBackendDescriptor_t dO = tensor(g, U_DO, bf, qd, qs, 0, 0);
    cudnnBackendDescriptor_t stats = tensor(g, U_STATS, f32, rd, rs, 0, 0);
    cudnnBackendDescriptor_t scale = scalar(g, U_SCALE);
    cudnnBackendDescriptor_t ninf = scalar(g, U_NINF);
    cudnnBackendDescriptor_t one = scalar(g, U_ONE);
    cudnnBackendDescriptor_t dsum = tensor(g, U_DSUM, f32, rd, rs, 0, 0);
    cudnnBackendDescriptor_t dQ = tensor(g, U_DQ, bf, qd, qs, 0, 0);
    cudnnBackendDescriptor_t dK = tensor(g, U_DK, bf, kd, ks, 0, 0);
    cudnnBackendDescriptor_t dV = tensor(g, U_DV, bf, kd, ks, 0, 0);

    /* D = rowsum(dO * O) */
    cudnnBackendDescriptor_t t1 = vtensor(g, f32, od, os);
    pointwise(g, CUDNN_POINTWISE_MUL, f32, dO, O, NULL, t1, -1);
    cudnnBackendDescriptor_t t2 = vtensor(g, f32, rd, rs);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, t1, t2);
    pointwise(g, CUDNN_POINTWISE_MUL, f32, t2, one, NULL, dsum, -1);
    /* P = exp(scale * Q K^T - lse), masked */
    cudnnBackendDescriptor_t s = vtensor(g, f32, sd, ss);
    matmul(g, Q, KT, s);
    cudnnBackendDescriptor_t s1 = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_MUL, f32, s, scale, NULL, s1, -1);
    cudnnBackendDescriptor_t s2 = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_SUB, f32, s1, stats, NULL, s2, -1);
    cudnnBackendDescriptor_t s3 = causal(g, s2, ninf, sd, ss);
    cudnnBackendDescriptor_t e = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_EXP, f32, s3, NULL, NULL, e, -1);
    /* dV = P^T dO */
    cudnnBackendDescriptor_t pt = vtensor(g, bf, std_, sts);
    reshape(g, e, pt);
    kv_product(g, pt, dO, dV, gqa, fd, fs);
    /* dS = scale * P * (dO V^T - D) */
    cudnnBackendDescriptor_t dp = vtensor(g, f32, sd, ss);
    matmul(g, dO, VT, dp);
    cudnnBackendDescriptor_t t3 = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_SUB, f32, dp, dsum, NULL, t3, -1);
    cudnnBackendDescriptor_t t4 = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_MUL, f32, t3, e, NULL, t4, -1);
    cudnnBackendDescriptor_t ds = vtensor(g, f32, sd, ss);
    pointwise(g, CUDNN_POINTWISE_MUL, f32, t4, scale, NULL, ds, -1);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = vtensor(g, bf, std_, sts);
    reshape(g, ds, dst);
    kv_product(g, dst, Q, dK, gqa, fd, fs);
    /* dQ = dS K, written by the product itself: the deterministic form
     * (no fp32 accumulator that thread blocks add into) */
    cudnnBackendDescriptor_t k = vtensor(g, f32, kd, ks);
    reshape(g, KT, k);
    matmul(g, ds, k, dQ);
}

static void built_free(mal_cudnn *c, built *b)
{
    if (b->plan) c->f.bDestroy(b->plan);
    for (int i = b->nd - 1; i >= 0; i--)
        c->f.bDestroy(b->descs[i]);
    memset(b, 0, sizeof *b);
}

/* Build one graph and the first execution plan cuDNN's heuristics offer
 * that finalizes. */
static int build(mal_cudnn *c, built *b, const shape *p, int backward, char *msg, size_t n)
{
    gb g = {.c = c, .b = b, .next_uid = U_VIRTUAL, .st = CUDNN_STATUS_SUCCESS};
    if (backward)
        build_backward(&g, p);
    else
        build_forward(&g, p);
    cudnnBackendDescriptor_t graph =
        gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops,
           "graph operations");
    if (c->h)
        gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->h,
               "graph handle");
    gb_fin(&g, graph, "operation graph finalize");
    cudnnBackendDescriptor_t heur =
        gb_new(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    gb_setd(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
    gb_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    if (!c->h) gb_setd(&g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, c->devprop, "heuristics device");
    gb_fin(&g, heur, "heuristics finalize");
    if (!gb_ok(&g)) {
        char what[128];
        snprintf(what, sizeof what, "%s graph: %s", backward ? "backward" : "forward", g.what);
        return failed(c, g.st, what, msg, n);
    }
    int64_t count = 0;
    cudnnStatus_t s = c->f.bGet(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                0, &count, NULL);
    if (s != CUDNN_STATUS_SUCCESS) return failed(c, s, "heuristics results", msg, n);
    if (count <= 0) {
        snprintf(msg, n, "cuDNN attention: no engine for the %s graph (cuDNN %ld)",
                 backward ? "backward" : "forward", c->version);
        return -1;
    }
    if (count > 16) count = 16;
    cudnnBackendDescriptor_t cfg[16];
    int64_t made = 0;
    for (int64_t i = 0; i < count; i++) {
        cfg[i] = gb_new(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        if (!gb_ok(&g)) return failed(c, g.st, g.what, msg, n);
    }
    s = c->f.bGet(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &made,
                  cfg);
    if (s != CUDNN_STATUS_SUCCESS) return failed(c, s, "heuristics results", msg, n);
    if (!c->h) {
        /* offline: the configurations offered are those whose engines
         * accepted the graph; a plan would need the device itself */
        c->offline_engines = made;
        return 0;
    }
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < made; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if ((last = c->f.bCreate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan)) !=
            CUDNN_STATUS_SUCCESS)
            break;
        if ((last = c->f.bSet(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                              &c->h)) == CUDNN_STATUS_SUCCESS &&
            (last = c->f.bSet(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i])) == CUDNN_STATUS_SUCCESS &&
            (last = c->f.bFinalize(plan)) == CUDNN_STATUS_SUCCESS) {
            int64_t ws = 0, got = 0;
            last = c->f.bGet(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                             &got, &ws);
            if (last == CUDNN_STATUS_SUCCESS) {
                b->plan = plan;
                b->workspace = ws;
                return 0;
            }
        }
        c->f.bDestroy(plan);
    }
    char what[96];
    snprintf(what, sizeof what, "no %s plan finalized (%ld engine configs tried)",
             backward ? "backward" : "forward", (long)made);
    return failed(c, last, what, msg, n);
}

/* ---- the public functions ------------------------------------------ */

static void *sym(void *dl, const char *name, int *missing)
{
    void *p = dlsym(dl, name);
    if (!p) *missing = 1;
    return p;
}

/* Load the library and its entry points into a new mal_cudnn (no
 * handle yet). */
static mal_cudnn *load(char *msg, size_t n)
{
    const char *path = getenv("MALLEUS_CUDNN_LIB");
    void *dl = dlopen(path && *path ? path : "libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!dl && !(path && *path)) dl = dlopen("libcudnn.so", RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        snprintf(msg, n,
                 "cuDNN attention: cannot load %s (%s); set MALLEUS_CUDNN_LIB to the path of "
                 "libcudnn.so.9, or LD_LIBRARY_PATH",
                 path && *path ? path : "libcudnn.so.9", dlerror());
        return NULL;
    }
    mal_cudnn *c = calloc(1, sizeof *c);
    if (!c) {
        dlclose(dl);
        snprintf(msg, n, "cuDNN attention: out of memory");
        return NULL;
    }
    int missing = 0;
    c->f.dl = dl;
    *(void **)&c->f.getVersion = sym(dl, "cudnnGetVersion", &missing);
    *(void **)&c->f.getErrorString = sym(dl, "cudnnGetErrorString", &missing);
    *(void **)&c->f.getLastErrorString = sym(dl, "cudnnGetLastErrorString", &missing);
    *(void **)&c->f.create = sym(dl, "cudnnCreate", &missing);
    *(void **)&c->f.destroy = sym(dl, "cudnnDestroy", &missing);
    *(void **)&c->f.setStream = sym(dl, "cudnnSetStream", &missing);
    *(void **)&c->f.bCreate = sym(dl, "cudnnBackendCreateDescriptor", &missing);
    *(void **)&c->f.bDestroy = sym(dl, "cudnnBackendDestroyDescriptor", &missing);
    *(void **)&c->f.bFinalize = sym(dl, "cudnnBackendFinalize", &missing);
    *(void **)&c->f.bSet = sym(dl, "cudnnBackendSetAttribute", &missing);
    *(void **)&c->f.bGet = sym(dl, "cudnnBackendGetAttribute", &missing);
    *(void **)&c->f.bExecute = sym(dl, "cudnnBackendExecute", &missing);
    if (missing) {
        snprintf(msg, n, "cuDNN attention: %s lacks the backend API (cuDNN 9 needed)",
                 path && *path ? path : "libcudnn.so.9");
        mal_cudnn_close(c);
        return NULL;
    }
    c->version = (long)c->f.getVersion();
    if (c->version < 90000) {
        snprintf(msg, n, "cuDNN attention: cuDNN %ld is too old (9.0 or later needed)", c->version);
        mal_cudnn_close(c);
        return NULL;
    }
    return c;
}

int mal_cudnn_open(mal_cudnn **out, mal_cu_stream stream, char *msg, size_t n)
{
    *out = NULL;
    mal_cudnn *c = load(msg, n);
    if (!c) return -1;
    cudnnStatus_t s = c->f.create(&c->h);
    if (s != CUDNN_STATUS_SUCCESS) {
        failed(c, s, "cudnnCreate", msg, n);
        c->h = NULL;
        goto fail;
    }
    if ((s = c->f.setStream(c->h, stream)) != CUDNN_STATUS_SUCCESS) {
        failed(c, s, "cudnnSetStream", msg, n);
        goto fail;
    }
    c->stream = stream;
    c->neginf_val = -INFINITY;
    c->one_val = 1.0f;
    *out = c;
    return 0;
fail:
    mal_cudnn_close(c);
    return -1;
}

static void ws_free(mal_cudnn *c)
{
    if (!c->ws) return;
    if (c->ws_free)
        c->ws_free(c->ws_ctx, c->ws);
    else
        cudaFree(c->ws);
    c->ws = NULL;
    c->ws_bytes = 0;
}

void mal_cudnn_close(mal_cudnn *c)
{
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (int i = 0; i < c->n_plans; i++) {
        built_free(c, &c->plans[i].fwd);
        built_free(c, &c->plans[i].bwd);
    }
    ws_free(c);
    if (c->h) c->f.destroy(c->h);
    if (c->f.dl) dlclose(c->f.dl);
    free(c);
}

long mal_cudnn_version(const mal_cudnn *c)
{
    return c ? c->version : 0;
}

static plan_entry *lookup(mal_cudnn *c, int B, int T, mal_cu_heads hs, int hd)
{
    for (int i = 0; i < c->n_plans; i++) {
        plan_entry *e = &c->plans[i];
        if (e->B == B && e->T == T && e->H == hs.H && e->Hkv == hs.Hkv && e->hd == hd) return e;
    }
    return NULL;
}

static int grow_workspace(mal_cudnn *c, size_t need, char *msg, size_t n)
{
    if (need <= c->ws_bytes) return 0;
    /* the old workspace may still be read by queued graphs */
    cudaStreamSynchronize(c->stream);
    ws_free(c);
    void *p = NULL;
    if (c->ws_alloc) {
        p = c->ws_alloc(c->ws_ctx, need);
    } else if (cudaMalloc(&p, need) != cudaSuccess) {
        p = NULL;
    }
    if (!p) {
        snprintf(msg, n, "cuDNN attention: no device memory for its workspace of %zu bytes", need);
        return -1;
    }
    c->ws = p;
    c->ws_bytes = need;
    return 0;
}

void mal_cudnn_set_allocator(mal_cudnn *c, void *(*alloc)(void *ctx, size_t bytes),
                             void (*release)(void *ctx, void *p), void *ctx)
{
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    ws_free(c);
    c->ws_alloc = alloc;
    c->ws_free = release;
    c->ws_ctx = ctx;
}

int mal_cudnn_attention_ok(mal_cudnn *c, int B, int T, mal_cu_heads hs, int hd, char *msg, size_t n)
{
    if (!c) {
        snprintf(msg, n, "cuDNN attention: not loaded");
        return 0;
    }
    plan_entry *e = lookup(c, B, T, hs, hd);
    if (e) {
        if (!e->ok) snprintf(msg, n, "%s", e->why);
        return e->ok;
    }
    /* a full cache drops its oldest shape */
    if (c->n_plans == PLAN_CACHE) {
        cudaStreamSynchronize(c->stream);
        built_free(c, &c->plans[0].fwd);
        built_free(c, &c->plans[0].bwd);
        memmove(&c->plans[0], &c->plans[1], (PLAN_CACHE - 1) * sizeof c->plans[0]);
        c->n_plans--;
    }
    e = &c->plans[c->n_plans++];
    memset(e, 0, sizeof *e);
    e->B = B, e->T = T, e->H = hs.H, e->Hkv = hs.Hkv, e->hd = hd;
    if (hs.Hkv <= 0 || hs.H != hs.Hkv * hs.group || hs.q_off != 0) {
        snprintf(e->why, sizeof e->why,
                 "cuDNN attention: query head h must read key/value head h / (H / Hkv) "
                 "(H %d, Hkv %d, group %d, offset %d)",
                 hs.H, hs.Hkv, hs.group, hs.q_off);
    } else if (hd % 8 || hd > 256 || hd < 8) {
        snprintf(e->why, sizeof e->why,
                 "cuDNN attention: head dimension %d (a multiple of 8 up to 256 needed)", hd);
    } else {
        shape p = {B, hs.H, hs.Hkv, T, hd};
        if (build(c, &e->fwd, &p, 0, e->why, sizeof e->why) == 0 &&
            build(c, &e->bwd, &p, 1, e->why, sizeof e->why) == 0) {
            size_t need =
                (size_t)(e->fwd.workspace > e->bwd.workspace ? e->fwd.workspace : e->bwd.workspace);
            e->ok = grow_workspace(c, need, e->why, sizeof e->why) == 0;
        }
    }
    if (!e->ok) {
        built_free(c, &e->fwd);
        built_free(c, &e->bwd);
        snprintf(msg, n, "%s", e->why);
    }
    return e->ok;
}

/* Queue a built plan with these (id, pointer) pairs. */
static int execute(mal_cudnn *c, built *b, const int64_t *uids, void **ptrs, int count, char *msg,
                   size_t n, const char *what)
{
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t s = c->f.bCreate(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (s != CUDNN_STATUS_SUCCESS) return failed(c, s, what, msg, n);
    void *ws = c->ws;
    if ((s = c->f.bSet(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids)) ==
            CUDNN_STATUS_SUCCESS &&
        (s = c->f.bSet(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count,
                       ptrs)) == CUDNN_STATUS_SUCCESS &&
        (s = c->f.bSet(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) ==
            CUDNN_STATUS_SUCCESS &&
        (s = c->f.bFinalize(pack)) == CUDNN_STATUS_SUCCESS)
        s = c->f.bExecute(c->h, b->plan, pack);
    c->f.bDestroy(pack);
    return s == CUDNN_STATUS_SUCCESS ? 0 : failed(c, s, what, msg, n);
}

int mal_cudnn_attention_fwd(mal_cudnn *c, void *out, float *lse, const void *q, const void *k,
                            const void *v, int B, int T, mal_cu_heads hs, int hd, char *msg,
                            size_t n)
{
    plan_entry *e = c ? lookup(c, B, T, hs, hd) : NULL;
    if (!e || !e->ok) {
        snprintf(msg, n, "cuDNN attention: forward of a shape without a plan (B %d T %d H %d)", B,
                 T, hs.H);
        return -1;
    }
    c->scale_val = 1.0f / sqrtf((float)hd);
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NINF};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &c->scale_val, &c->neginf_val};
    return execute(c, &e->fwd, uids, ptrs, 7, msg, n, "forward");
}

int mal_cudnn_attention_bwd(mal_cudnn *c, void *dq, void *dk, void *dv, const void *dout,
                            const void *out, const void *q, const void *k, const void *v,
                            const float *lse, float *dsum, int B, int T, mal_cu_heads hs, int hd,
                            char *msg, size_t n)
{
    plan_entry *e = c ? lookup(c, B, T, hs, hd) : NULL;
    if (!e || !e->ok) {
        snprintf(msg, n, "cuDNN attention: backward of a shape without a plan (B %d T %d H %d)", B,
                 T, hs.H);
        return -1;
    }
    c->scale_val = 1.0f / sqrtf((float)hd);
    int64_t uids[] = {U_Q,    U_K,   U_V,    U_O,  U_DO, U_STATS, U_SCALE,
                      U_NINF, U_ONE, U_DSUM, U_DQ, U_DK, U_DV};
    void *ptrs[] = {(void *)q,
                    (void *)k,
                    (void *)v,
                    (void *)out,
                    (void *)dout,
                    (void *)lse,
                    &c->scale_val,
                    &c->neginf_val,
                    &c->one_val,
                    dsum,
                    dq,
                    dk,
                    dv};
    return execute(c, &e->bwd, uids, ptrs, 13, msg, n, "backward");
}

int mal_cudnn_check_offline(int B, int T, mal_cu_heads hs, int hd, const char *device_json,
                            int *fwd_engines, int *bwd_engines, char *msg, size_t n)
{
    *fwd_engines = *bwd_engines = 0;
    mal_cudnn *c = load(msg, n);
    if (!c) return -1;
    int rc = -1;
    built fb = {0}, bb = {0};
    if (c->version < 90800) {
        snprintf(msg, n, "cuDNN %ld cannot describe a device without one (9.8 or later needed)",
                 c->version);
        goto done;
    }
    cudnnStatus_t s = c->f.bCreate(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &c->devprop);
    if (s == CUDNN_STATUS_SUCCESS)
        s = c->f.bSet(c->devprop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                      (int64_t)strlen(device_json) + 1, device_json);
    if (s == CUDNN_STATUS_SUCCESS) s = c->f.bFinalize(c->devprop);
    if (s != CUDNN_STATUS_SUCCESS) {
        failed(c, s, "the described device", msg, n);
        goto done;
    }
    shape p = {B, hs.H, hs.Hkv, T, hd};
    if (build(c, &fb, &p, 0, msg, n)) goto done;
    *fwd_engines = (int)c->offline_engines;
    if (build(c, &bb, &p, 1, msg, n)) goto done;
    *bwd_engines = (int)c->offline_engines;
    rc = 0;
done:
    built_free(c, &fb);
    built_free(c, &bb);
    if (c->devprop) c->f.bDestroy(c->devprop);
    mal_cudnn_close(c);
    return rc;
}

#endif /* HAVE_CUDNN_H */
