/* The CUDA emulation's own checks (kernels/cuda/emu.h): each mode launches
 * one small kernel that breaks one rule the GPU enforces or leaves
 * undefined, and the emulation must stop it naming the rule (abort, the
 * message on stderr); mode "ok" runs correct kernels (atomics, a barrier
 * every thread reaches, an ldmatrix and a cp.async used right) and must
 * pass.  tests/test_emu_checks.sh runs every mode and checks each
 * message.
 *
 *   test_emu_checks MODE   (modes: see `main`) */
#define MAL_CUDA_EMU 1
#include "kernels/cuda/common.cuh"

#include <stdio.h>
#include <string.h>

/* Threads of one block at two different barriers. */
__global__ void two_barriers_k(int *out)
{
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

/* Lanes of one warp at two different shuffles. */
__global__ void two_shuffles_k(int *out)
{
    int v = (int)threadIdx.x;
    if (threadIdx.x < 16)
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    else
        v = __shfl_xor_sync(0xffffffffu, v, 2);
    out[threadIdx.x] = v;
}

/* A 16-byte load at an address that is a multiple of 4 only. */
__global__ void misaligned_k(const float *in, float *out)
{
    float x[4];
    load16(x, in + 1);
    out[threadIdx.x] = x[0];
}

/* ldmatrix from global memory (it reads shared memory only). */
__global__ void ldmatrix_global_k(const bf16 *in, uint32_t *out)
{
    uint32_t r[4];
    ldmatrix_x4<false>(r, in + (threadIdx.x % 8) * 8);
    out[threadIdx.x] = r[0];
}

/* A cp.async its thread never waits for. */
__global__ void cp_pending_k(const bf16 *in)
{
    MAL_SMEM(smem);
    cp_async16(smem + 16 * threadIdx.x, in + 8 * threadIdx.x, 16);
    cp_async_commit();
}

/* Any kernel, for the launch limits. */
__global__ void nothing_k(int *out)
{
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) out[0] = 1;
}

/* Correct use: every thread adds 1 (atomic), copies 16 bytes into shared
 * memory, waits, meets the others at a barrier, and warp 0 reads the tile
 * through ldmatrix: 128 + the matrix's elements. */
__global__ void ok_k(int *count, const bf16 *in, uint32_t *out)
{
    MAL_SMEM(smem);
    atomicAdd(count, 1);
    bf16 *tile = (bf16 *)smem;
    if (threadIdx.x < 32) cp_async16(tile + 8 * threadIdx.x, in + 8 * threadIdx.x, 16);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (threadIdx.x < 32) {
        uint32_t r[4];
        ldmatrix_x4<false>(r, tile + 8 * threadIdx.x);
        for (int i = 0; i < 4; i++)
            out[4 * threadIdx.x + i] = r[i];
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    alignas(16) static int ibuf[1024];
    alignas(16) static float fbuf[1024];
    alignas(16) static bf16 hbuf[1024];
    alignas(16) static uint32_t ubuf[1024];
    for (int i = 0; i < 1024; i++)
        hbuf[i] = __float2bfloat16_rn((float)(i % 256));
    if (!strcmp(mode, "two-barriers")) {
        MAL_LAUNCH(two_barriers_k, 1, 64, 0, 0)(ibuf);
    } else if (!strcmp(mode, "two-shuffles")) {
        MAL_LAUNCH(two_shuffles_k, 1, 32, 0, 0)(ibuf);
    } else if (!strcmp(mode, "misaligned")) {
        MAL_LAUNCH(misaligned_k, 1, 32, 0, 0)(fbuf, fbuf + 512);
    } else if (!strcmp(mode, "ldmatrix-global")) {
        MAL_LAUNCH(ldmatrix_global_k, 1, 32, 0, 0)(hbuf, ubuf);
    } else if (!strcmp(mode, "cp-pending")) {
        MAL_LAUNCH(cp_pending_k, 1, 32, 512, 0)(hbuf);
    } else if (!strcmp(mode, "grid-y")) {
        MAL_LAUNCH(nothing_k, dim3(1, 65536), 32, 0, 0)(ibuf);
    } else if (!strcmp(mode, "block-size")) {
        MAL_LAUNCH(nothing_k, 1, 1056, 0, 0)(ibuf);
    } else if (!strcmp(mode, "smem-optin")) {
        MAL_LAUNCH(nothing_k, 1, 32, 64 * 1024, 0)(ibuf);
    } else if (!strcmp(mode, "smem-max")) {
        if (emu::set_max_dynamic_smem((const void *)nothing_k, 228 * 1024) == 0) {
            fprintf(stderr, "test_emu_checks: an opt-in past 227 KiB was accepted\n");
            return 1;
        }
        fprintf(stderr, "emu: opt-in past the maximum refused\n");
        return 3;
    } else if (!strcmp(mode, "ok")) {
        /* the opt-in makes 64 KiB legal; every order */
        emu::set_max_dynamic_smem((const void *)ok_k, 64 * 1024);
        for (int order : {0, 1, 7}) {
            emu::set_order(order);
            ibuf[0] = 0;
            memset(ubuf, 0, sizeof ubuf);
            MAL_LAUNCH(ok_k, 3, 128, 64 * 1024, 0)(ibuf, hbuf, ubuf);
            emu::synchronize();
            /* lane l, matrix i: row l / 4 (its 8 elements from lane 8 i +
             * l / 4's 16 bytes), columns 2 (l % 4), + 1 */
            int bad = ibuf[0] != 3 * 128;
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) {
                    const int e = (8 * i + l / 4) * 8 + 2 * (l % 4);
                    const uint32_t want = (uint32_t)__bfloat16_as_ushort(hbuf[e]) |
                                          (uint32_t)__bfloat16_as_ushort(hbuf[e + 1]) << 16;
                    bad += ubuf[4 * l + i] != want;
                }
            if (bad) {
                fprintf(stderr, "test_emu_checks: order %d: count %d (want %d), %d wrong words\n",
                        order, ibuf[0], 3 * 128, bad);
                return 1;
            }
        }
        emu::set_order(0);
        printf("test_emu_checks: ok\n");
        return 0;
    } else {
        fprintf(stderr, "usage: test_emu_checks two-barriers|two-shuffles|misaligned|"
                        "ldmatrix-global|cp-pending|grid-y|block-size|smem-optin|smem-max|ok\n");
        return 2;
    }
    emu::synchronize(); /* the queued kernel runs here (emu.h, "The stream") */
    fprintf(stderr, "test_emu_checks: %s: the emulation let it run\n", mode);
    return 1;
}
