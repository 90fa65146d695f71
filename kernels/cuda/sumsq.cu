/* The sum of squares of the CUDA backend (mal_cu_sumsq: the global
 * gradient norm), in double: a fixed partition into blocks, each reduced
 * in a fixed tree, then the block sums added in order.  Contracts:
 * kernels.h and cuda_ops.h; conventions of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

enum { SUMSQ_BLOCKS = 264, SUMSQ_THREADS = 256 };

/* Block b of nb sums elements e = b * THREADS + t + k * nb * THREADS of
 * the rows x width view (row r = e / width at r * pitch), tree-reduces in
 * a fixed order, and returns the block's sum (in thread 0). */
MAL_DEV double sumsq_block(double *red, const float *__restrict__ x, size_t rows, size_t width,
                           size_t pitch, unsigned b, unsigned nb)
{
    const size_t total = rows * width, step = (size_t)nb * blockDim.x;
    double acc = 0.0;
    if (rows == 1 || pitch == width) {
        for (size_t e = (size_t)b * blockDim.x + threadIdx.x; e < total; e += step)
            acc += (double)x[e] * x[e];
    } else {
        for (size_t e = (size_t)b * blockDim.x + threadIdx.x; e < total; e += step) {
            const float v = x[(e / width) * pitch + e % width];
            acc += (double)v * v;
        }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    return red[0];
}

/* partial[b] = block b's sum of x. */
__global__ void __launch_bounds__(SUMSQ_THREADS)
    sumsq_k(double *__restrict__ partial, const float *__restrict__ x, size_t rows, size_t width,
            size_t pitch)
{
    MAL_SMEM(smem);
    const double s = sumsq_block((double *)smem, x, rows, width, pitch, blockIdx.x, gridDim.x);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* The runs of one multi-tensor launch (kernel parameters, under the 4 KiB
 * every CUDA version takes: 32-bit shapes; a run with a larger one goes
 * through sumsq_k on its own). */
struct sumsq_table {
    const float *x[MAL_CU_SUMSQ_MT];
    unsigned rows[MAL_CU_SUMSQ_MT], width[MAL_CU_SUMSQ_MT], pitch[MAL_CU_SUMSQ_MT];
};

/* Grid (SUMSQ_BLOCKS, runs): block (b, j) is sumsq_k's block b on run j,
 * into partial[j * SUMSQ_BLOCKS + b]. */
__global__ void __launch_bounds__(SUMSQ_THREADS)
    sumsq_multi_k(MAL_GRID_CONST sumsq_table tab, double *__restrict__ partial)
{
    MAL_SMEM(smem);
    const unsigned j = blockIdx.y;
    const double s = sumsq_block((double *)smem, tab.x[j], tab.rows[j], tab.width[j], tab.pitch[j],
                                 blockIdx.x, gridDim.x);
    if (threadIdx.x == 0) partial[(size_t)j * SUMSQ_BLOCKS + blockIdx.x] = s;
}

/* Thread j < count sums run j's block sums in order (sumsq_final_k's
 * sum); thread 0 then adds the run sums to acc[0] in run order, each
 * rounded as sumsq_final_k's acc[0] += s. */
__global__ void __launch_bounds__(128) sumsq_multi_final_k(double *acc, const double *partial,
                                                           int count)
{
    MAL_SMEM(smem);
    double *run = (double *)smem;
    for (int j = threadIdx.x; j < count; j += blockDim.x) {
        double s = 0.0;
        for (int i = 0; i < SUMSQ_BLOCKS; i++) s += partial[(size_t)j * SUMSQ_BLOCKS + i];
        run[j] = s;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    double a = acc[0];
    for (int j = 0; j < count; j++) a += run[j];
    acc[0] = a;
}

/* acc[0] += sum of partial[0 .. n) in order (one thread: n is small). */
__global__ void sumsq_final_k(double *acc, const double *partial, int n)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += partial[i];
    acc[0] += s;
}

extern "C" size_t mal_cu_sumsq_scratch_bytes(void)
{
    return SUMSQ_BLOCKS * sizeof(double);
}

extern "C" size_t mal_cu_sumsq_multi_scratch_bytes(void)
{
    return (size_t)MAL_CU_SUMSQ_MT * SUMSQ_BLOCKS * sizeof(double);
}

static int sumsq_flush(mal_cu_stream s, double *acc, const sumsq_table &tab, unsigned n,
                       double *partial)
{
    if (!n) return 0;
    MAL_LAUNCH(sumsq_multi_k, dim3(SUMSQ_BLOCKS, n), SUMSQ_THREADS, SUMSQ_THREADS * sizeof(double),
               s)
    (tab, partial);
    MAL_LAUNCH(sumsq_multi_final_k, 1, 128, MAL_CU_SUMSQ_MT * sizeof(double), s)
    (acc, (const double *)partial, (int)n);
    return 2;
}

/* mal_cu_sumsq_multi with tables of at most `cap` runs (the tests take
 * small ones: the emulation runs every block of every run). */
static int sumsq_multi_cap(mal_cu_stream s, double *acc, const mal_cu_run *runs, int count,
                           void *scratch, unsigned cap)
{
    double *partial = (double *)scratch;
    sumsq_table tab;
    int launches = 0;
    unsigned n = 0;
    for (int i = 0; i < count; i++) {
        const mal_cu_run *r = &runs[i];
        /* empty runs leave acc as mal_cu_sumsq does: untouched (not +0.0) */
        if (!r->rows || !r->width) continue;
        if (r->rows > 0xffffffffu || r->width > 0xffffffffu || r->pitch > 0xffffffffu) {
            /* in order: the table's runs first */
            launches += sumsq_flush(s, acc, tab, n, partial);
            n = 0;
            mal_cu_sumsq(s, acc, r->x, r->rows, r->width, r->pitch, scratch);
            launches += 2;
            continue;
        }
        tab.x[n] = r->x, tab.rows[n] = (unsigned)r->rows, tab.width[n] = (unsigned)r->width;
        tab.pitch[n] = (unsigned)r->pitch;
        if (++n == cap) {
            launches += sumsq_flush(s, acc, tab, n, partial);
            n = 0;
        }
    }
    return launches + sumsq_flush(s, acc, tab, n, partial);
}

extern "C" int mal_cu_sumsq_multi(mal_cu_stream s, double *acc, const mal_cu_run *runs, int count,
                                  void *scratch)
{
    return sumsq_multi_cap(s, acc, runs, count, scratch, MAL_CU_SUMSQ_MT);
}

extern "C" void mal_cu_sumsq(mal_cu_stream s, double *acc, const float *x, size_t rows,
                             size_t width, size_t pitch, void *scratch)
{
    if (!rows || !width) return;
    double *partial = (double *)scratch;
    MAL_LAUNCH(sumsq_k, SUMSQ_BLOCKS, SUMSQ_THREADS, SUMSQ_THREADS * sizeof(double), s)
    (partial, x, rows, width, pitch);
    MAL_LAUNCH(sumsq_final_k, 1, 32, 0, s)(acc, (const double *)partial, (int)SUMSQ_BLOCKS);
}
