/* tests/test_cuda_kernels.cu on the CPU: the CUDA kernels through the
 * emulation of kernels/cuda/emu.h (see that file for what it checks). */
#define MAL_CUDA_EMU 1
#include "test_cuda_kernels.cu"
