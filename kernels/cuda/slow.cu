/* The busy kernel of the CUDA backend's straggler emulation (cuda.c,
 * op_slowdown): a co-running load that takes the whole GPU for a set time,
 * launched by cuda.c at a duty cycle on a stream of its own.
 *
 * One block per SM, each asking for all the shared memory a block may have
 * (the opt-in maximum, 227 KiB of an H100 SM's 228 KiB; the last KiB is
 * what the hardware reserves for every block), so that while a busy block
 * holds an SM no block of any other kernel fits beside it: the training
 * kernels queued meanwhile wait for the SMs, as on a GPU that runs slower.
 * One warp per block spins; the shared memory does the occupying.
 *
 * The spin reads %globaltimer (nanoseconds of wall time) rather than
 * clock64(): the SM clock boosts and throttles, and a duty cycle is a
 * fraction of wall time. */
#include <cuda_runtime.h>

#include "cuda_ops.h"

static __device__ __forceinline__ unsigned long long global_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Spin for `ns` nanoseconds from the moment the block starts.  `hog` is
 * never touched: holding it is the point. */
__global__ void mal_spin_kernel(unsigned long long ns)
{
    extern __shared__ unsigned char hog[];
    (void)hog;
    const unsigned long long t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
}

extern "C" size_t mal_cu_spin_prepare(int device)
{
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess ||
        optin <= 0)
        return 0;
    if (cudaFuncSetAttribute(mal_spin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             optin) != cudaSuccess)
        return 0;
    return (size_t)optin;
}

extern "C" void mal_cu_spin(mal_cu_stream s, int blocks, size_t smem, unsigned long long ns)
{
    mal_spin_kernel<<<blocks, 32, smem, s>>>(ns);
}
