/* The sum of squares of the CUDA backend (mal_cu_sumsq: the global
 * gradient norm), in double: a fixed partition into blocks, each reduced
 * in a fixed tree, then the block sums added in order.  Contracts:
 * kernels.h and cuda_ops.h; conventions of every kernel family: common.cuh. */
#include "common.cuh"
#include "cuda_ops.h"

enum { SUMSQ_BLOCKS = 264, SUMSQ_THREADS = 256 };

/* Block b sums elements e = b * THREADS + t + k * BLOCKS * THREADS of the
 * rows x width view (row r = e / width at r * pitch), tree-reduces in a
 * fixed order, and writes partial[b]. */
__global__ void __launch_bounds__(SUMSQ_THREADS)
    sumsq_k(double *__restrict__ partial, const float *__restrict__ x, size_t rows, size_t width,
            size_t pitch)
{
    MAL_SMEM(smem);
    double *red = (double *)smem;
    const size_t total = rows * width, step = (size_t)gridDim.x * blockDim.x;
    double acc = 0.0;
    if (rows == 1 || pitch == width) {
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step)
            acc += (double)x[e] * x[e];
    } else {
        for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
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
    if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
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

extern "C" void mal_cu_sumsq(mal_cu_stream s, double *acc, const float *x, size_t rows,
                             size_t width, size_t pitch, void *scratch)
{
    if (!rows || !width) return;
    double *partial = (double *)scratch;
    MAL_LAUNCH(sumsq_k, SUMSQ_BLOCKS, SUMSQ_THREADS, SUMSQ_THREADS * sizeof(double), s)
    (partial, x, rows, width, pitch);
    MAL_LAUNCH(sumsq_final_k, 1, 32, 0, s)(acc, (const double *)partial, (int)SUMSQ_BLOCKS);
}
