/* A CPU emulation of the CUDA execution model, for checking the kernels of
 * kernels/cuda/ on a machine without a GPU (tests/test_cuda_emu.cpp).
 *
 * A kernel compiled with MAL_CUDA_EMU is an ordinary C++ function.  A launch
 * (MAL_LAUNCH in common.cuh) runs the grid one block at a time; the threads
 * of a block run as fibers (ucontext) on the calling thread, each until it
 * reaches a barrier (__syncthreads), a warp-level exchange (shuffles, the
 * matrix instructions), an atomic operation or its end.  A block barrier
 * opens when every live thread of the block waits at it; a warp exchange
 * when all 32 lanes of the warp arrived.  Consequences that make this a
 * checker, not only a simulator:
 *   - threads run in a configurable order (forward, reverse, shuffled:
 *     emu::set_order), so a missing barrier between a shared-memory write
 *     and another thread's read reads memory not yet written (or already
 *     overwritten) in one order or the other: results that differ between
 *     orders are a race.  Atomic operations are atomic and are scheduling
 *     points, so a result that depends on the order of atomics differs too;
 *   - dynamic shared memory is filled with 0xff bytes (NaN in float and bf16)
 *     before each block, so reading what no thread wrote poisons the result;
 *   - asynchronous copies (cp.async) land at one end or the other of the
 *     time the GPU may take (cp_async16 below): at their issue in the
 *     reversed order, else only at the first block barrier after their
 *     thread waited for them -- a tile read without a wait and a barrier
 *     before, or overwritten by the next tile's copy while another warp
 *     still reads it, gives wrong or order-dependent results;
 *   - the matrix instructions (mma.m16n8k16, ldmatrix with and without
 *     .trans) exchange the 32 lanes' fragments with the documented layouts,
 *     so a wrong fragment index or row address gives a wrong product;
 *   - these are errors that stop the program (undefined behaviour or a
 *     launch failure on the GPU): threads of a block waiting at different
 *     barriers (__syncthreads at two places) or some of them at a barrier
 *     while the others exited; lanes of a warp at different warp exchanges
 *     or some of them gone; a vector access (8 or 16 bytes, and the 4-byte
 *     words of the fragments) at an address not a multiple of its size; an
 *     ldmatrix row or cp.async target outside the block's shared memory; a
 *     grid or block over sm_90's limits (grid y and z at most 65535, blocks
 *     of at most 1024 threads); dynamic shared memory over 48 KiB without
 *     the kernel's cudaFuncSetAttribute opt-in, or over the 227 KiB opt-in
 *     maximum; copies still pending when a thread ends.
 * What it cannot show: timing, occupancy, register limits, memory-model
 * subtleties beyond barriers, and anything of the real compiler.
 * Single-threaded; one launch at a time. */
#ifndef MAL_CUDA_EMU_H
#define MAL_CUDA_EMU_H

#include <cuda_bf16.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <functional>
#include <map>
#include <vector>

namespace emu {

enum { RUN = 0, BAR = 1, WARP = 2, DONE = 3 };

/* sm_90's limits (CUDA programming guide, compute capability 9.0). */
enum : size_t {
    SMEM_DEFAULT = 48 * 1024,   /* dynamic shared memory without opt-in */
    SMEM_OPTIN_MAX = 232448,    /* cudaDevAttrMaxSharedMemoryPerBlockOptin */
    GRID_YZ_MAX = 65535,
    GRID_X_MAX = 2147483647,
};

/* One pending asynchronous copy: 16 bytes, of which `bytes` from src and
 * the rest zero (cp.async's src-size). */
struct copy16 {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;
};

struct fiber {
    ucontext_t ctx; /* first entry only */
    jmp_buf jb;     /* where the fiber continues */
    char *stack;
    uint3 tid;
    int state, started;
    /* where it waits (a barrier or warp exchange): file and line */
    const char *wfile;
    int wline;
    std::vector<copy16> open;                /* cp.async since its last commit */
    std::vector<std::vector<copy16>> groups; /* committed, oldest first */
    std::vector<copy16> waited;              /* waited for, visible at the next barrier */
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
/* The dynamic shared memory of the running block and its size. */
inline size_t &smem_size()
{
    static size_t n;
    return n;
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
/* The dynamic shared memory each kernel was allowed above 48 KiB
 * (cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize). */
inline std::map<const void *, size_t> &smem_optin()
{
    static std::map<const void *, size_t> m;
    return m;
}
/* Which blocks of a launch run (all when empty): a test of a large shape
 * runs a sample of the blocks of the kernels it names and checks only what
 * those blocks write. */
typedef std::function<bool(const void *kern, uint3 block, dim3 grid)> block_filter_fn;
inline block_filter_fn &block_filter()
{
    static block_filter_fn f;
    return f;
}

[[noreturn]] inline void die(const char *what)
{
    fprintf(stderr, "emu: %s (block %u,%u,%u thread %u,%u,%u)\n", what, block_idx().x,
            block_idx().y, block_idx().z, thread_idx().x, thread_idx().y, thread_idx().z);
    abort();
}

/* cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
 * bytes): 0, or 1 (cudaErrorInvalidValue) past the device's opt-in
 * maximum. */
inline int set_max_dynamic_smem(const void *kern, size_t bytes)
{
    if (bytes > SMEM_OPTIN_MAX) return 1;
    smem_optin()[kern] = bytes;
    return 0;
}

/* An access of `size` bytes at p: aligned to its size, as the GPU needs. */
inline void check_aligned(const void *p, size_t size, const char *what)
{
    if ((uintptr_t)p % size) {
        char m[160];
        snprintf(m, sizeof m, "misaligned %zu-byte %s at %p", size, what, p);
        die(m);
    }
}

/* [p, p + n) inside the block's dynamic shared memory. */
inline void check_smem(const void *p, size_t n, const char *what)
{
    const unsigned char *b = smem(), *q = (const unsigned char *)p;
    if (q < b || q + n > b + smem_size()) {
        char m[160];
        snprintf(m, sizeof m, "%s outside the block's %zu bytes of shared memory (offset %td)",
                 what, smem_size(), q - b);
        die(m);
    }
}

inline int lane_id()
{
    const block_state *b = blk();
    return b->cur % 32;
}

inline fiber &self()
{
    block_state *b = blk();
    return b->f[b->cur];
}

/* Give control back to the scheduler in state s, waiting at (file, line)
 * for BAR and WARP.  Switches are _setjmp/_longjmp between the fibers'
 * stacks (ucontext only starts a fiber): swapcontext would cost a system
 * call per switch for the signal mask.  (Built without _FORTIFY_SOURCE,
 * whose longjmp check refuses to jump between stacks.) */
inline void yield(int s, const char *file = "", int line = 0)
{
    block_state *b = blk();
    fiber &f = b->f[b->cur];
    f.state = s;
    f.wfile = file;
    f.wline = line;
    if (!_setjmp(f.jb)) _longjmp(b->sched, 1);
}

inline void syncthreads(const char *file, int line)
{
    yield(BAR, file, line);
}
inline void syncwarp(const char *file, int line)
{
    yield(WARP, file, line);
}
/* An atomic operation: a scheduling point (other threads run before it in
 * an order that depends on the thread order), then the read-modify-write
 * without interruption. */
inline void atomic_point()
{
    if (blk()) yield(RUN);
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

template <typename V> V shfl(V v, int src_lane, const char *file, int line)
{
    static_assert(sizeof(V) <= 8, "shuffle of more than 8 bytes");
    uint64_t w = 0;
    memcpy(&w, &v, sizeof v);
    warp_slots(lane_id())[0] = w;
    syncwarp(file, line);
    uint64_t r = warp_slots(src_lane & 31)[0];
    syncwarp(file, line);
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
    syncwarp("mma", 0);
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
    syncwarp("mma", 0);
    int g = lane_id() / 4, c = lane_id() % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * c + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[i] = acc;
    }
}

/* ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: lane 8 i + j
 * gives the address of row j of 8 x 8 matrix i (16 bytes, 16-byte aligned,
 * in shared memory); lane l receives in r[i] the elements (l / 4,
 * 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix i, or with .trans those
 * of its transpose: (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4). */
inline void ldmatrix(uint32_t *r, int nmat, bool trans, const void *row_addr)
{
    warp_slots(lane_id())[0] = (uint64_t)(uintptr_t)row_addr;
    syncwarp("ldmatrix", 0);
    const int l = lane_id(), g = l / 4, c = l % 4;
    for (int i = 0; i < nmat; i++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            const int src = trans ? 8 * i + 2 * c + h : 8 * i + g;
            const int col = trans ? g : 2 * c + h;
            const unsigned char *row = (const unsigned char *)(uintptr_t)warp_slots(src)[0];
            check_aligned(row, 16, "ldmatrix row");
            check_smem(row, 16, "ldmatrix row");
            memcpy(&e[h], row + 2 * col, 2);
        }
        r[i] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    syncwarp("ldmatrix", 0);
}

inline void land(const copy16 &c)
{
    if (c.bytes) memcpy(c.dst, c.src, (size_t)c.bytes);
    memset(c.dst + c.bytes, 0, (size_t)(16 - c.bytes));
}

/* cp.async.cg.shared.global [dst], [src], 16, bytes: queued in the
 * thread's open group.  On the GPU a copy lands at some time between its
 * issue and the wait that covers its group; the emulation takes the two
 * ends, one per thread order, so that both kinds of missing barrier show
 * as results that differ between orders (or from the reference):
 *   - reversed order (1): at the issue -- a copy into a buffer that
 *     another warp still reads (no barrier between that read and the
 *     issue) overwrites it under the reader;
 *   - the other orders: at the first block barrier after the thread's
 *     wait, for every thread (its own thread included, which is stricter
 *     than the GPU: there a thread sees its own copies right after its
 *     wait) -- a read of the tile between the wait and a barrier reads
 *     what was there before (0xff bytes, NaN, in a fresh block). */
inline void cp_async16(void *dst, const void *src, int bytes)
{
    check_aligned(dst, 16, "cp.async target");
    check_smem(dst, 16, "cp.async target");
    if (bytes) check_aligned(src, 16, "cp.async source");
    if (bytes != 0 && bytes != 16) die("cp.async of other than 0 or 16 source bytes");
    const copy16 c = {(unsigned char *)dst, (const unsigned char *)src, bytes};
    if (order() == 1) land(c);
    self().open.push_back(c);
}
inline void cp_async_commit()
{
    fiber &f = self();
    f.groups.push_back(f.open);
    f.open.clear();
}
/* cp.async.wait_group n: every committed group but the newest n is
 * complete (visible at the next barrier, or already landed at its issue
 * in the reversed order). */
inline void cp_async_wait(int n)
{
    fiber &f = self();
    while ((int)f.groups.size() > n) {
        if (order() != 1)
            f.waited.insert(f.waited.end(), f.groups.front().begin(), f.groups.front().end());
        f.groups.erase(f.groups.begin());
    }
}

/* A block barrier opens: every copy waited for becomes visible. */
inline void land_waited(std::vector<fiber> &fs)
{
    for (fiber &f : fs) {
        for (const copy16 &c : f.waited) land(c);
        f.waited.clear();
    }
}

inline void trampoline()
{
    block_state *b = blk();
    b->body();
    fiber &f = b->f[b->cur];
    size_t pending = f.open.size();
    for (const auto &g : f.groups) pending += g.size();
    if (pending) die("a thread ended with cp.async copies it never waited for");
    f.state = DONE;
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

[[noreturn]] inline void die_sites(const char *what, const fiber &a, const fiber &b)
{
    char m[400];
    snprintf(m, sizeof m, "%s: %s:%d and %s:%d", what, a.wfile, a.wline, b.wfile, b.wline);
    die(m);
}

inline bool same_site(const fiber &a, const fiber &b)
{
    return a.wline == b.wline && !strcmp(a.wfile, b.wfile);
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
        f.wfile = "";
        f.wline = 0;
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
        int live = 0, at_bar = 0, released = 0, first_bar = -1;
        for (int i = 0; i < n; i++) {
            live += b.f[i].state != DONE;
            if (b.f[i].state == BAR) {
                at_bar++;
                if (first_bar < 0) first_bar = i;
            }
        }
        if (!live) break;
        /* warps whose live lanes all wait at a warp exchange go on: all of
         * them at once in order 0 (warps in lockstep), else one warp at a
         * time, the first ready one in this launch's thread order, so that
         * a warp runs ahead of the others as far as barriers allow */
        for (int k = 0; k < n && !(released && order() != 0); k++) {
            const int w = seq[k] / 32;
            if (seq[k] % 32 != 0 && order() == 0) continue;
            int lanes = 0, waiting = 0, done = 0, first = -1;
            for (int i = w * 32; i < n && i < w * 32 + 32; i++) {
                lanes++;
                if (b.f[i].state == WARP) {
                    waiting++;
                    if (first < 0) first = i;
                    else if (!same_site(b.f[first], b.f[i]))
                        die_sites("lanes of a warp at different warp exchanges", b.f[first],
                                  b.f[i]);
                }
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
                if (b.f[i].state == BAR && !same_site(b.f[first_bar], b.f[i]))
                    die_sites("deadlock: threads wait at different barriers", b.f[first_bar],
                              b.f[i]);
            land_waited(b.f);
            for (int i = 0; i < n; i++)
                if (b.f[i].state == BAR) b.f[i].state = RUN;
            continue;
        }
        if (at_bar && at_bar + 0 < live) {
            /* some wait at a barrier, the others at warp exchanges that
             * cannot open (part of their warp is at the barrier) */
            for (int i = 0; i < n; i++)
                if (b.f[i].state == WARP)
                    die_sites("deadlock: a barrier and a warp exchange", b.f[first_bar], b.f[i]);
        }
        die("deadlock: threads wait at different barriers or warp exchanges");
    }
}

/* The stream: launches (and the emulated cudaMemsetAsync) are queued and
 * run in order when the host synchronizes (emu::synchronize(), which the
 * tests' settle() calls), as on a GPU, where a kernel may not have run when
 * its launch returns: a host read of a kernel's output without a
 * synchronize sees what was there before (measured on an H100: a test that
 * read managed memory right after a launch failed 38 checks that passed
 * here while the emulation ran each kernel inside its launch). */
inline std::vector<std::function<void()>> &stream_queue()
{
    static std::vector<std::function<void()>> q;
    return q;
}
inline void synchronize()
{
    std::vector<std::function<void()>> q;
    q.swap(stream_queue());
    for (auto &f : q) f();
}
inline void memset_async(void *p, int v, size_t n)
{
    stream_queue().push_back([=]() { memset(p, v, n); });
}

/* A bound launch: emu::bind(kernel, grid, block, smem)(args...).  The
 * launch's own errors (block, grid, shared memory) stop the program at the
 * launch; the kernel runs at the next synchronize, under the thread order
 * and block filter in force at the launch. */
template <typename... P> struct launch {
    void (*kern)(P...);
    dim3 grid, blk_dim;
    size_t smem_bytes;
    template <typename... A> void operator()(A... args)
    {
        const void *kp = (const void *)kern;
        const size_t threads = (size_t)blk_dim.x * blk_dim.y * blk_dim.z;
        if (!threads || threads > 1024 || blk_dim.x > 1024 || blk_dim.y > 1024 || blk_dim.z > 64)
            die("block of more than 1024 threads (or dimensions over 1024, 1024, 64)");
        if (!grid.x || !grid.y || !grid.z || grid.x > GRID_X_MAX || grid.y > GRID_YZ_MAX ||
            grid.z > GRID_YZ_MAX)
            die("grid dimension 0 or over sm_90's limits (x < 2^31, y and z <= 65535)");
        if (smem_bytes > SMEM_DEFAULT) {
            auto it = smem_optin().find(kp);
            if (it == smem_optin().end() || it->second < smem_bytes)
                die("more than 48 KiB of dynamic shared memory without the kernel's "
                    "cudaFuncSetAttribute opt-in");
        }
        const launch self = *this;
        const int ord = order();
        const block_filter_fn filt = block_filter();
        stream_queue().push_back([=]() {
            const int ord0 = order();
            const block_filter_fn filt0 = block_filter();
            order() = ord, block_filter() = filt;
            self.run(args...);
            order() = ord0, block_filter() = filt0;
        });
    }
    template <typename... A> void run(A... args) const
    {
        n_launches()++;
        const void *kp = (const void *)kern;
        block_state b;
        blk() = &b;
        block_dim() = blk_dim;
        grid_dim() = grid;
        b.body = [&]() { kern(args...); };
        smem_size() = smem_bytes;
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    block_idx() = make_uint3(x, y, z);
                    if (block_filter() && !block_filter()(kp, block_idx(), grid)) continue;
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

/* Device functions the kernels use that host C++ lacks. */
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
    emu::check_aligned(p, sizeof *p, "atomic");
    emu::atomic_point();
    int old = *p;
    *p = old + v;
    return old;
}
static inline int atomicOr(int *p, int v)
{
    emu::check_aligned(p, sizeof *p, "atomic");
    emu::atomic_point();
    int old = *p;
    *p = old | v;
    return old;
}

/* The CUDA built-ins the kernels use. */
#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())
#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) emu::syncwarp(__FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, o) emu::shfl((v), emu::lane_id() ^ (o), __FILE__, __LINE__)
#define __shfl_sync(mask, v, src) emu::shfl((v), (src), __FILE__, __LINE__)
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
