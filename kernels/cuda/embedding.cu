/* The embedding of the CUDA backend, forward and backward
 * (mal_cu_embedding_fwd, mal_cu_embedding_bwd; contracts: kernels.h and
 * cuda_ops.h).  The backward sorts positions by token (a stable counting
 * sort) and adds each vocabulary row's gradients in position order, the CPU
 * backend's exact summation.  Conventions of every kernel family:
 * common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

/* One warp per token: out[n] = wte[tokens[n] - v0] (16 bytes per access
 * where rows are whole vectors) for a token of this table's rows
 * [v0, v0 + Vl); a zero row for another token, and a token outside [0, V)
 * also sets MAL_CU_ERR_TOKEN. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) embedding_fwd_k(T *__restrict__ out,
                                                       const int *__restrict__ tokens,
                                                       const T *__restrict__ wte, int N, int C,
                                                       int V, int v0, int Vl, int *err)
{
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const int tok = tokens[n];
    T *o = out + (size_t)n * C;
    if (tok < 0 || tok >= V || tok < v0 || tok - v0 >= Vl) {
        /* every writer stores a superset bit */
        if (lane == 0 && (tok < 0 || tok >= V)) *err |= MAL_CU_ERR_TOKEN;
        for (int c = lane; c < C; c += 32) stf(o + c, 0.0f);
        return;
    }
    const T *w = wte + (size_t)(tok - v0) * C;
    if (VEC)
        for (int c = lane * vec<T>::n; c < C; c += 32 * vec<T>::n)
            *(uint4 *)(o + c) = *(const uint4 *)(w + c);
    else
        for (int c = lane; c < C; c += 32) o[c] = w[c];
}

/* Stable counting sort of positions by token, then one warp per vocabulary
 * row adds that row's gradients in position order.  Integer atomics only
 * (a histogram: its result does not depend on their order). */
__global__ void emb_hist_k(int *__restrict__ count, const int *__restrict__ tokens, int N, int v0,
                           int V)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int t = tokens[n] - v0;
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
                const int *__restrict__ tokens, int N, int v0, int V)
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
    if (n < N && t - v0 >= 0 && t - v0 < V) order[start[t - v0] + rank] = n;
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
                          int C, int V, int v0, int Vl, int *err)
{
    if (vec_ok<T>(out, wte, out, C))
        MAL_LAUNCH((embedding_fwd_k<T, true>), mal_blocks((size_t)N, 8), 256, 0, s)
        ((T *)out, tokens, (const T *)wte, N, C, V, v0, Vl, err);
    else
        MAL_LAUNCH((embedding_fwd_k<T, false>), mal_blocks((size_t)N, 8), 256, 0, s)
        ((T *)out, tokens, (const T *)wte, N, C, V, v0, Vl, err);
}

extern "C" void mal_cu_embedding_fwd(mal_cu_stream s, int use_bf16, void *out, const int *tokens,
                                     const void *wte, int N, int C, int V, int v0, int Vl,
                                     int *err)
{
    if (N <= 0 || C <= 0) return;
    if (use_bf16)
        embedding_fwd<__nv_bfloat16>(s, out, tokens, wte, N, C, V, v0, Vl, err);
    else
        embedding_fwd<float>(s, out, tokens, wte, N, C, V, v0, Vl, err);
}

static size_t up16(size_t b)
{
    return (b + 15) & ~(size_t)15;
}

extern "C" size_t mal_cu_embedding_bwd_scratch_bytes(int N, int V)
{
    return 2 * up16((size_t)V * sizeof(int)) + up16((size_t)N * sizeof(int));
}

/* The sort runs over this table's rows: V below is Vl, token t's row
 * t - v0. */
extern "C" void mal_cu_embedding_bwd(mal_cu_stream s, int use_bf16, float *dwte, const void *dout,
                                     const int *tokens, int N, int C, int v0, int V, void *scratch)
{
    if (N <= 0 || C <= 0 || V <= 0) return;
    char *p = (char *)scratch;
    int *count = (int *)p;
    int *start = (int *)(p + up16((size_t)V * sizeof(int)));
    int *order = (int *)(p + 2 * up16((size_t)V * sizeof(int)));
#ifdef MAL_CUDA_EMU
    emu::memset_async(count, 0, (size_t)V * sizeof(int));
#else
    cudaMemsetAsync(count, 0, (size_t)V * sizeof(int), s);
#endif
    MAL_LAUNCH(emb_hist_k, mal_blocks((size_t)N, 256), 256, 0, s)(count, tokens, N, v0, V);
    MAL_LAUNCH(emb_scan_k, 1, 1024, 1024 * sizeof(int), s)(start, (const int *)count, V);
    MAL_LAUNCH(emb_place_k, mal_blocks((size_t)N, 256), 256, 256 * sizeof(int), s)
    (order, (const int *)start, tokens, N, v0, V);
    if (use_bf16)
        MAL_LAUNCH((emb_acc_k<__nv_bfloat16>), mal_blocks((size_t)V, 8), 256, 0, s)
        (dwte, (const __nv_bfloat16 *)dout, (const int *)order, (const int *)start,
         (const int *)count, C, V);
    else
        MAL_LAUNCH((emb_acc_k<float>), mal_blocks((size_t)V, 8), 256, 0, s)
        (dwte, (const float *)dout, (const int *)order, (const int *)start, (const int *)count, C,
         V);
}
