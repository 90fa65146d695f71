/* A CPU emulation of the CUDA execution model, for checking the kernels of
 * kernels/cuda/ on a machine without a GPU (tests/test_cuda_emu.cpp).
 *
 * A kernel compiled with MAL_CUDA_EMU is an ordinary C++ function.  A launch
 * (MAL_LAUNCH in common.cuh) runs the grid one block at a time; the threads
 * of a block run as fibers (ucontext) on the calling thread, each until it
 * reaches a barrier (__syncthreads), a warp-level exchange (shuffles, the
 * matrix instruction) or its end.  A block barrier opens when every live
 * thread of the block waits at it; a warp exchange when all 32 lanes of the
 * warp arrived.  Consequences that make this a checker, not only a
 * simulator:
 *   - threads run in a configurable order (forward, reverse, shuffled:
 *     emu::set_order), so a missing barrier between a shared-memory write
 *     and another thread's read reads memory not yet written (or already
 *     overwritten) in one order or the other: results that differ between
 *     orders are a race;
 *   - dynamic shared memory is filled with 0xff bytes (NaN in float and bf16)
 *     before each block, so reading what no thread wrote poisons the result;
 *   - a warp exchange that some lane of the warp never reaches (it returned
 *     early) and a block whose threads wait at different barriers are
 *     reported as deadlocks (undefined behaviour on the GPU);
 *   - mma.m16n8k16 is computed from the 32 lanes' fragments with the
 *     documented layout, so a wrong fragment index gives a wrong product.
 * What it cannot show: timing, occupancy, register or shared-memory limits,
 * memory-model subtleties beyond barriers, and anything of the real
 * compiler.  Single-threaded; one launch at a time. */
#ifndef MAL_CUDA_EMU_H
#define MAL_CUDA_EMU_H

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <functional>
#include <vector>

namespace emu {

enum { RUN = 0, BAR = 1, WARP = 2, DONE = 3 };

struct fiber {
    ucontext_t ctx; /* first entry only */
    jmp_buf jb;     /* where the fiber continues */
    char *stack;
    uint3 tid;
    int state, started;
};

struct block_state {
    std::vector<fiber> f;
    ucontext_t sched_uc;
    jmp_buf sched;
    int cur;
    std::function<void()> body;
    /* per-warp exchange slots: 8 bytes x 8 words per lane */
    std::vector<uint64_t> slots;
};

inline block_state *&blk()
{
    static block_state *b;
    return b;
}
/* The built-in variables of the thread that runs now. */
struct builtins {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
inline builtins &cur()
{
    static builtins b;
    return b;
}
inline uint3 &thread_idx()
{
    return cur().thread;
}
inline uint3 &block_idx()
{
    return cur().block;
}
inline dim3 &block_dim()
{
    return cur().block_dim;
}
inline dim3 &grid_dim()
{
    return cur().grid_dim;
}
inline std::vector<unsigned char> &smem_buf()
{
    static std::vector<unsigned char> b;
    return b;
}
inline unsigned char *smem()
{
    return smem_buf().data();
}
/* Thread order of a block: 0 forward with warps in lockstep; 1 reverse
 * and >= 2 shuffled (seeded), each with one warp released at a time. */
inline int &order()
{
    static int o;
    return o;
}
inline void set_order(int o)
{
    order() = o;
}
inline long &n_launches()
{
    static long n;
    return n;
}

[[noreturn]] inline void die(const char *what)
{
    fprintf(stderr, "emu: %s (block %u,%u,%u)\n", what, block_idx().x, block_idx().y,
            block_idx().z);
    abort();
}

inline int lane_id()
{
    const block_state *b = blk();
    return b->cur % 32;
}

/* Give control back to the scheduler in state s.  Switches are
 * _setjmp/_longjmp between the fibers' stacks (ucontext only starts a
 * fiber): swapcontext would cost a system call per switch for the signal
 * mask.  (Built without _FORTIFY_SOURCE, whose longjmp check refuses to
 * jump between stacks.) */
inline void yield(int s)
{
    block_state *b = blk();
    fiber &f = b->f[b->cur];
    f.state = s;
    if (!_setjmp(f.jb)) _longjmp(b->sched, 1);
}

inline void syncthreads()
{
    yield(BAR);
}
inline void syncwarp()
{
    yield(WARP);
}

/* Lane-to-lane exchange: every lane writes `words` 64-bit words, the warp
 * meets, every lane reads what it wants, the warp meets again (so nobody
 * overwrites a slot before all have read it). */
inline uint64_t *warp_slots(int lane)
{
    block_state *b = blk();
    int warp = b->cur / 32;
    return &b->slots[((size_t)warp * 32 + lane) * 8];
}

template <typename V> V shfl(V v, int src_lane)
{
    static_assert(sizeof(V) <= 8, "shuffle of more than 8 bytes");
    uint64_t w = 0;
    memcpy(&w, &v, sizeof v);
    warp_slots(lane_id())[0] = w;
    syncwarp();
    uint64_t r = warp_slots(src_lane & 31)[0];
    syncwarp();
    V out;
    memcpy(&out, &r, sizeof out);
    return out;
}

inline float bf16_lo(uint32_t w)
{
    uint32_t f = w << 16;
    float x;
    memcpy(&x, &f, 4);
    return x;
}
inline float bf16_hi(uint32_t w)
{
    uint32_t f = w & 0xffff0000u;
    float x;
    memcpy(&x, &f, 4);
    return x;
}

/* D += A B for m16n8k16 bf16 fragments (common.cuh states the layout). */
inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    uint64_t *s = warp_slots(lane_id());
    for (int i = 0; i < 4; i++) s[i] = a[i];
    for (int i = 0; i < 2; i++) s[4 + i] = b[i];
    syncwarp();
    float A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ln++) {
        const uint64_t *t = warp_slots(ln);
        int g = ln / 4, c = ln % 4;
        uint32_t r[6];
        for (int i = 0; i < 6; i++) r[i] = (uint32_t)t[i];
        A[g][2 * c] = bf16_lo(r[0]), A[g][2 * c + 1] = bf16_hi(r[0]);
        A[g + 8][2 * c] = bf16_lo(r[1]), A[g + 8][2 * c + 1] = bf16_hi(r[1]);
        A[g][2 * c + 8] = bf16_lo(r[2]), A[g][2 * c + 9] = bf16_hi(r[2]);
        A[g + 8][2 * c + 8] = bf16_lo(r[3]), A[g + 8][2 * c + 9] = bf16_hi(r[3]);
        B[2 * c][g] = bf16_lo(r[4]), B[2 * c + 1][g] = bf16_hi(r[4]);
        B[2 * c + 8][g] = bf16_lo(r[5]), B[2 * c + 9][g] = bf16_hi(r[5]);
    }
    syncwarp();
    int g = lane_id() / 4, c = lane_id() % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * c + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[i] = acc;
    }
}

inline void trampoline()
{
    block_state *b = blk();
    b->body();
    b->f[b->cur].state = DONE;
    _longjmp(b->sched, 1);
}

/* Fiber stacks, allocated once and reused by every block. */
enum { STACK_BYTES = 128 * 1024 };
inline char *stack_of(int i)
{
    static std::vector<char *> pool;
    while ((int)pool.size() <= i) {
        char *p = (char *)malloc(STACK_BYTES);
        if (!p) die("no memory for fiber stacks");
        pool.push_back(p);
    }
    return pool[i];
}

/* Run one block of `threads` fibers to completion. */
inline void run_block(block_state &b, dim3 bd)
{
    const int n = (int)(bd.x * bd.y * bd.z);
    b.f.assign((size_t)n, fiber());
    b.slots.assign((size_t)((n + 31) / 32) * 32 * 8, 0);
    for (int i = 0; i < n; i++) {
        fiber &f = b.f[i];
        f.stack = stack_of(i);
        f.tid = make_uint3(i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y));
        f.state = RUN;
        f.started = 0;
    }
    std::vector<int> seq((size_t)n);
    for (int i = 0; i < n; i++) seq[i] = order() == 1 ? n - 1 - i : i;
    if (order() >= 2) {
        uint64_t s = (uint64_t)order() * 0x9E3779B97F4A7C15ull + n_launches();
        for (int i = n - 1; i > 0; i--) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int j = (int)((s >> 33) % (uint64_t)(i + 1));
            int t = seq[i];
            seq[i] = seq[j], seq[j] = t;
        }
    }
    for (;;) {
        int ran = 0;
        for (int k = 0; k < n; k++) {
            int i = seq[k];
            if (b.f[i].state != RUN) continue;
            b.cur = i;
            thread_idx() = b.f[i].tid;
            if (!_setjmp(b.sched)) {
                fiber &f = b.f[i];
                if (f.started) _longjmp(f.jb, 1);
                f.started = 1;
                getcontext(&f.ctx);
                f.ctx.uc_stack.ss_sp = f.stack;
                f.ctx.uc_stack.ss_size = STACK_BYTES;
                f.ctx.uc_link = NULL;
                makecontext(&f.ctx, trampoline, 0);
                swapcontext(&b.sched_uc, &f.ctx); /* returns only by _longjmp above */
            }
            ran = 1;
        }
        if (ran) continue;
        int live = 0, at_bar = 0, released = 0;
        for (int i = 0; i < n; i++) {
            live += b.f[i].state != DONE;
            at_bar += b.f[i].state == BAR;
        }
        if (!live) break;
        /* warps whose live lanes all wait at a warp exchange go on: all of
         * them at once in order 0 (warps in lockstep), else one warp at a
         * time, the first ready one in this launch's thread order, so that
         * a warp runs ahead of the others as far as barriers allow */
        for (int k = 0; k < n && !(released && order() != 0); k++) {
            const int w = seq[k] / 32;
            if (seq[k] % 32 != 0 && order() == 0) continue;
            int lanes = 0, waiting = 0, done = 0;
            for (int i = w * 32; i < n && i < w * 32 + 32; i++) {
                lanes++;
                waiting += b.f[i].state == WARP;
                done += b.f[i].state == DONE;
            }
            if (waiting && waiting + done == lanes && done)
                die("warp exchange that some lane of the warp never reaches (it returned)");
            if (waiting && waiting == lanes) {
                for (int i = w * 32; i < w * 32 + lanes; i++) b.f[i].state = RUN;
                released = 1;
            }
        }
        if (released) continue;
        if (at_bar == live) {
            for (int i = 0; i < n; i++)
                if (b.f[i].state == BAR) b.f[i].state = RUN;
            continue;
        }
        die("deadlock: threads wait at different barriers or warp exchanges");
    }
}

/* A bound launch: emu::bind(kernel, grid, block, smem)(args...). */
template <typename... P> struct launch {
    void (*kern)(P...);
    dim3 grid, blk_dim;
    size_t smem_bytes;
    template <typename... A> void operator()(A... args)
    {
        n_launches()++;
        if (blk_dim.x * blk_dim.y * blk_dim.z > 1024) die("block of more than 1024 threads");
        if (smem_bytes > 227 * 1024) die("more than 227 KiB of dynamic shared memory");
        block_state b;
        blk() = &b;
        block_dim() = blk_dim;
        grid_dim() = grid;
        b.body = [&]() { kern(args...); };
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    block_idx() = make_uint3(x, y, z);
                    smem_buf().assign(smem_bytes + 16, 0xff);
                    run_block(b, blk_dim);
                }
        blk() = NULL;
    }
};

template <typename... P> launch<P...> bind(void (*kern)(P...), dim3 grid, dim3 block, size_t smem)
{
    launch<P...> l;
    l.kern = kern;
    l.grid = grid;
    l.blk_dim = block;
    l.smem_bytes = smem;
    return l;
}

} /* namespace emu */

/* Device functions the kernels use that host C++ lacks.  Fibers switch only
 * at barriers and warp exchanges, so a read-modify-write is atomic here. */
static inline int min(int a, int b)
{
    return a < b ? a : b;
}
static inline int max(int a, int b)
{
    return a > b ? a : b;
}
static inline int atomicAdd(int *p, int v)
{
    int old = *p;
    *p = old + v;
    return old;
}

/* The CUDA built-ins the kernels use. */
#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())
#define __syncthreads() emu::syncthreads()
#define __syncwarp(...) emu::syncwarp()
#define __shfl_xor_sync(mask, v, o) emu::shfl((v), emu::lane_id() ^ (o))
#define __shfl_sync(mask, v, src) emu::shfl((v), (src))
#define __trap() emu::die("__trap()")
#define __expf expf
#define __logf logf
#define __fdividef(a, b) ((a) / (b))
#define rsqrtf(x) (1.0f / sqrtf(x))
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

#endif /* MAL_CUDA_EMU_H */
