/* The CUDA backend's kernels (every kernel family of kernels/cuda/ but the
 * straggler emulation's, included below) against float64 references
 * written here from kernels.h's contracts.  One source, two programs:
 *   tests/test_cuda_emu     (tests/test_cuda_emu.cpp: this file built by the
 *                            host C++ compiler with MAL_CUDA_EMU) runs the
 *                            kernels on the CPU through kernels/cuda/emu.h:
 *                            the check of indexing, tile edges, masks,
 *                            tensor-core fragment layouts, reductions and
 *                            barriers that a machine without a GPU can make;
 *   tests/test_cuda_kernels (this file built by nvcc) runs them on the GPU,
 *                            compiled by the real compiler; exit 77 where no
 *                            GPU is usable.
 *
 * Inputs are drawn fresh every run (the seed is printed; MAL_TEST_SEED
 * repeats a run).  Outputs that an operation writes are poisoned with NaN
 * first, so an element it fails to write fails the comparison; outputs it
 * accumulates into start from random values.  fp32 storage must match the
 * reference within 1e-5 relative (norm-wise; tighter per op where the
 * arithmetic allows), bf16 storage within bf16's error (the reference
 * computes in float64 on the same bf16 inputs).  Under the emulation every
 * kernel also runs in a reversed thread order, and attention in a shuffled
 * one too, and must give the same bits: a difference is a race (on the GPU
 * the second and third runs check run-to-run determinism instead).  The
 * tensor-core attention also runs at the presets' shapes (T up to 2048),
 * the first and last tiles under the emulation.  Exit 0 pass, 1 fail, 77
 * no GPU. */
#include "kernels/cuda/adamw.cu"
#include "kernels/cuda/attention.cu"
#include "kernels/cuda/elementwise.cu"
#include "kernels/cuda/embedding.cu"
#include "kernels/cuda/rmsnorm.cu"
#include "kernels/cuda/rope.cu"
#include "kernels/cuda/sumsq.cu"
#include "kernels/cuda/swiglu.cu"
#include "kernels/cuda/xent.cu"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

#ifdef MAL_CUDA_EMU
#define PROG "test_cuda_emu"
static void settle(void) { emu::synchronize(); }
static void set_order(int o) { emu::set_order(o); }
template <typename T> using mvec = std::vector<T>;
#else
/* Buffers the kernels read and the host fills and checks: managed memory
 * (the test's buffers are a few MB at most), read only after settle(). */
template <typename T> struct managed {
    typedef T value_type;
    managed() {}
    template <typename U> managed(const managed<U> &) {}
    T *allocate(size_t n)
    {
        void *p = NULL;
        if (cudaMallocManaged(&p, n * sizeof(T) + 16) != cudaSuccess) {
            fprintf(stderr, "cudaMallocManaged of %zu bytes failed\n", n * sizeof(T));
            exit(99);
        }
        return (T *)p;
    }
    void deallocate(T *p, size_t) { cudaFree(p); }
    template <typename U> bool operator==(const managed<U> &) const { return true; }
    template <typename U> bool operator!=(const managed<U> &) const { return false; }
};
template <typename T> using mvec = std::vector<T, managed<T>>;
#define PROG "test_cuda_kernels"
static void settle(void)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error: %s (%s)\n", cudaGetErrorString(e), cudaGetErrorName(e));
        exit(1);
    }
}
static void set_order(int o) { (void)o; }
#endif

typedef mvec<double> dvec;

static int failures;
static uint64_t rng_state;

static double urand(void) /* (0, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double nrand(void)
{
    return sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand());
}

/* A buffer of the compute dtype with its values as doubles (what the
 * kernel sees: bf16-rounded when bf16). */
struct buf {
    int bf;
    mvec<float> f;
    mvec<bf16> h;
    buf(size_t n, int bf16_) : bf(bf16_), f(bf16_ ? 0 : n), h(bf16_ ? n : 0) {}
    void *p() { return bf ? (void *)h.data() : (void *)f.data(); }
    size_t n() const { return bf ? h.size() : f.size(); }
    double get(size_t i) const { return bf ? (double)__bfloat162float(h[i]) : (double)f[i]; }
    void set(size_t i, double x)
    {
        if (bf)
            h[i] = __float2bfloat16_rn((float)x);
        else
            f[i] = (float)x;
    }
    void randn(double scale)
    {
        for (size_t i = 0; i < n(); i++) set(i, scale * nrand());
    }
    void poison()
    {
        for (size_t i = 0; i < n(); i++) set(i, NAN);
    }
    dvec d() const
    {
        settle();
        dvec o(n());
        for (size_t i = 0; i < n(); i++) o[i] = get(i);
        return o;
    }
};

static mvec<float> frand(size_t n, double scale)
{
    mvec<float> v(n);
    for (auto &x : v) x = (float)(scale * nrand());
    return v;
}

/* The suite runs three times with the same inputs (pass 0, 1, 2): under
 * the emulation in three thread orders (forward, reverse, shuffled), on
 * the GPU as a run-to-run check; every kernel in passes 0 and 1, attention
 * in all three, the presets' shapes in pass 0 only.  Every checked result must have the
 * same bits in all three: a difference is a race (or, on the GPU, a
 * nondeterministic kernel).  Only pass 0 prints, unless something fails. */
static int pass;
static std::vector<uint64_t> pass0_hash;
static size_t n_checked;

static uint64_t hash_of(const dvec &v)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)v.data();
    for (size_t i = 0; i < v.size() * sizeof(double); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ||got - want|| / ||want|| <= tol, and no NaN anywhere. */
static void check(const char *what, const dvec &got, const dvec &want, double tol)
{
    double num = 0, den = 0;
    size_t bad = (size_t)-1;
    for (size_t i = 0; i < got.size(); i++) {
        if (!(got[i] == got[i]) && bad == (size_t)-1) bad = i;
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    double rel = sqrt(num / (den > 0 ? den : 1e-300));
    int ok = bad == (size_t)-1 && rel <= tol && got.size() == want.size();
    if (pass == 0 || !ok)
        printf("%-44s rel err %.3g (tol %.1g)%s\n", what, rel, tol, ok ? "" : "   <-- FAIL");
    if (bad != (size_t)-1) printf("    element %zu is NaN (not written?)\n", bad);
    if (!ok) failures++;
    const uint64_t h = hash_of(got);
    if (pass == 0) {
        pass0_hash.push_back(h);
    } else if (n_checked >= pass0_hash.size() || pass0_hash[n_checked] != h) {
        printf("%s: the bits differ from pass 0's (pass %d: %s): a race   <-- FAIL\n", what, pass,
               pass == 1 ? "reversed thread order" : "shuffled thread order");
        failures++;
    }
    n_checked++;
}
static dvec tod(const mvec<float> &v)
{
    settle();
    return dvec(v.begin(), v.end());
}

static const char *dt(int bf)
{
    return bf ? "bf16" : "fp32";
}

/* tolerance of a stored result: bf16 output rounding dominates */
static double tol_of(int bf, double fp32_tol)
{
    return bf ? 8e-3 : fp32_tol;
}

/* ---- RMSNorm --------------------------------------------------------- */

static void test_rmsnorm(int bf, int N, int C)
{
    const float eps = 1e-5f;
    buf x(N * (size_t)C, bf), w(C, bf), out(N * (size_t)C, bf), dy(N * (size_t)C, bf),
        dx(N * (size_t)C, bf);
    x.randn(1.0);
    w.randn(1.0);
    dy.randn(1.0);
    dx.randn(0.5);
    out.poison();
    mvec<float> rstd(N, NAN), dw = frand(C, 0.5);
    const dvec X = x.d(), W = w.d(), DY = dy.d(), DX0 = dx.d(), DW0 = tod(dw);
    mal_cu_rmsnorm_fwd(0, bf, out.p(), rstd.data(), x.p(), w.p(), N, C, eps);
    mvec<char> scratch(mal_cu_rmsnorm_bwd_scratch_bytes(N, C));
    mal_cu_rmsnorm_bwd(0, bf, dx.p(), dw.data(), dy.p(), x.p(), w.p(), rstd.data(), N, C,
                       scratch.data());
    dvec ro(X.size()), rr(N), rdx = DX0, rdw = DW0;
    for (int n = 0; n < N; n++) {
        double ss = 0, dot = 0;
        for (int c = 0; c < C; c++) ss += X[n * C + c] * X[n * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        rr[n] = r;
        for (int c = 0; c < C; c++) {
            ro[n * C + c] = X[n * C + c] * r * W[c];
            dot += DY[n * C + c] * W[c] * X[n * C + c];
        }
        /* the kernel uses its own fp32 rstd; the reference recomputes it */
        for (int c = 0; c < C; c++) {
            rdx[n * C + c] += r * DY[n * C + c] * W[c] - r * r * r * dot / C * X[n * C + c];
            rdw[c] += DY[n * C + c] * X[n * C + c] * r;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "rmsnorm fwd %s N=%d C=%d", dt(bf), N, C);
    check(what, out.d(), ro, tol_of(bf, 1e-6));
    snprintf(what, sizeof what, "rmsnorm rstd %s", dt(bf));
    check(what, tod(rstd), rr, 1e-6);
    snprintf(what, sizeof what, "rmsnorm bwd dx %s", dt(bf));
    check(what, dx.d(), rdx, tol_of(bf, 1e-5));
    snprintf(what, sizeof what, "rmsnorm bwd dweight %s", dt(bf));
    check(what, tod(dw), rdw, bf ? 2e-3 : 1e-5);
}

/* ---- RoPE -------------------------------------------------------------- */

static void test_rope(int bf, int B, int T, int H, int hd)
{
    const float theta = 10000.0f;
    const int h2 = hd / 2;
    mvec<float> cs((size_t)2 * T * h2);
    for (int i = 0; i < h2; i++) {
        double freq = pow((double)theta, -2.0 * i / hd);
        for (int t = 0; t < T; t++) {
            cs[(size_t)t * h2 + i] = (float)cos(t * freq);
            cs[(size_t)T * h2 + (size_t)t * h2 + i] = (float)sin(t * freq);
        }
    }
    size_t n = (size_t)B * T * H * hd;
    buf x(n, bf);
    x.randn(1.0);
    const dvec X = x.d();
    mal_cu_rope(0, bf, x.p(), cs.data(), B, T, H, hd, 1.0f);
    dvec ref(n);
    for (size_t e = 0; e < n; e += 2) {
        int t = (int)((e / ((size_t)H * hd)) % T), i = (int)(e % hd) / 2;
        double a = t * pow((double)theta, -2.0 * i / hd);
        ref[e] = X[e] * cos(a) - X[e + 1] * sin(a);
        ref[e + 1] = X[e] * sin(a) + X[e + 1] * cos(a);
    }
    char what[96];
    snprintf(what, sizeof what, "rope fwd %s B=%d T=%d H=%d hd=%d", dt(bf), B, T, H, hd);
    check(what, x.d(), ref, tol_of(bf, 1e-6));
    mal_cu_rope(0, bf, x.p(), cs.data(), B, T, H, hd, -1.0f);
    snprintf(what, sizeof what, "rope bwd(fwd(x)) = x %s", dt(bf));
    check(what, x.d(), X, tol_of(bf, 1e-6));
}

/* ---- element-wise ------------------------------------------------------ */

static void test_elementwise(int bf, size_t n, int offset)
{
    /* offset > 0 makes the views unaligned: the scalar paths */
    buf g(n + offset, bf), u(n + offset, bf), out(n + offset, bf), dy(n + offset, bf),
        dg(n + offset, bf), du(n + offset, bf);
    g.randn(2.0), u.randn(1.0), dy.randn(1.0), dg.randn(0.5), du.randn(0.5);
    out.poison();
    const dvec G = g.d(), U = u.d(), DY = dy.d(), DG = dg.d(), DU = du.d();
    const size_t es = bf ? 2 : 4;
    char *pg = (char *)g.p() + offset * es, *pu = (char *)u.p() + offset * es;
    char *po = (char *)out.p() + offset * es, *pdy = (char *)dy.p() + offset * es;
    mal_cu_swiglu_fwd(0, bf, po, pg, pu, n);
    mal_cu_swiglu_bwd(0, bf, (char *)dg.p() + offset * es, (char *)du.p() + offset * es, pdy, pg,
                      pu, n);
    settle(); /* buf::get reads managed memory: the kernels must have finished */
    dvec ro(n), rdg(n), rdu(n), go(n), gdg(n), gdu(n);
    for (size_t i = 0; i < n; i++) {
        double a = G[i + offset], b = U[i + offset], d = DY[i + offset];
        double sig = 1.0 / (1.0 + exp(-a));
        ro[i] = a * b * sig;
        rdg[i] = DG[i + offset] + d * b * sig * (1.0 + a * (1.0 - sig));
        rdu[i] = DU[i + offset] + d * a * sig;
        go[i] = out.get(i + offset), gdg[i] = dg.get(i + offset), gdu[i] = du.get(i + offset);
    }
    char what[96];
    snprintf(what, sizeof what, "swiglu fwd %s n=%zu off=%d", dt(bf), n, offset);
    check(what, go, ro, tol_of(bf, 1e-6));
    snprintf(what, sizeof what, "swiglu bwd dgate %s", dt(bf));
    check(what, gdg, rdg, tol_of(bf, 1e-6));
    snprintf(what, sizeof what, "swiglu bwd dup %s", dt(bf));
    check(what, gdu, rdu, tol_of(bf, 1e-6));
    /* add, in place on a (the residual adds) */
    mal_cu_add(0, bf, pg, pg, pu, n);
    settle();
    dvec ra(n), ga(n);
    for (size_t i = 0; i < n; i++) ra[i] = G[i + offset] + U[i + offset], ga[i] = g.get(i + offset);
    snprintf(what, sizeof what, "add (out = a) %s", dt(bf));
    check(what, ga, ra, tol_of(bf, 1e-7));
}

static void test_fp32_vec(size_t n, int offset)
{
    mvec<float> y = frand(n + offset, 1), x = frand(n + offset, 1);
    dvec Y = tod(y), X = tod(x);
    mal_cu_accumulate(0, y.data() + offset, x.data() + offset, n);
    mal_cu_scale(0, y.data() + offset, n, 0.75f);
    settle();
    dvec r(n), got(n);
    for (size_t i = 0; i < n; i++)
        r[i] = (Y[i + offset] + X[i + offset]) * 0.75, got[i] = y[i + offset];
    char what[96];
    snprintf(what, sizeof what, "accumulate + scale n=%zu off=%d", n, offset);
    check(what, got, r, 1e-7);
    /* sum of squares over a strided view: rows x width, pitch */
    size_t rows = 7, width = n / 9 + 1, pitch = width + 5;
    mvec<float> m = frand(rows * pitch, 1);
    mvec<double> acc(1, 1.25);
    mvec<char> scratch(mal_cu_sumsq_scratch_bytes());
    mal_cu_sumsq(0, acc.data(), m.data(), rows, width, pitch, scratch.data());
    mal_cu_sumsq(0, acc.data(), x.data(), 1, n, n, scratch.data());
    settle();
    double want = 1.25;
    for (size_t r_ = 0; r_ < rows; r_++)
        for (size_t c = 0; c < width; c++) want += (double)m[r_ * pitch + c] * m[r_ * pitch + c];
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    check("sumsq (strided + contiguous, in double)", dvec(1, acc[0]), dvec(1, want), 1e-13);
}

/* ---- embedding --------------------------------------------------------- */

/* The table of rows [v0, v0 + Vl) of a vocabulary of V (all of it, or a
 * vocabulary-parallel shard: other shards' tokens give zero rows and no
 * gradient). */
static void test_embedding(int bf, int N, int C, int V, int v0, int Vl)
{
    buf wte((size_t)Vl * C, bf), out((size_t)N * C, bf), dout((size_t)N * C, bf);
    wte.randn(1), dout.randn(1);
    out.poison();
    mvec<int> tok(N);
    /* few distinct tokens, so rows repeat many times */
    for (int n = 0; n < N; n++) tok[n] = (int)(urand() * (V < 13 ? V : 13));
    tok[N - 1] = V - 1;
    tok[N - 2] = v0;
    mvec<float> dw = frand((size_t)Vl * C, 0.5);
    const dvec WTE = wte.d(), DO = dout.d();
    dvec rdw = tod(dw);
    mvec<int> err(1, 0);
    mal_cu_embedding_fwd(0, bf, out.p(), tok.data(), wte.p(), N, C, V, v0, Vl, err.data());
    mvec<char> scratch(mal_cu_embedding_bwd_scratch_bytes(N, Vl));
    memset(scratch.data(), 0x5a, scratch.size());
    mal_cu_embedding_bwd(0, bf, dw.data(), dout.p(), tok.data(), N, C, v0, Vl, scratch.data());
    dvec ro((size_t)N * C);
    for (int n = 0; n < N; n++) {
        const int r = tok[n] - v0, own = r >= 0 && r < Vl;
        for (int c = 0; c < C; c++) {
            ro[(size_t)n * C + c] = own ? WTE[(size_t)r * C + c] : 0.0;
            if (own) rdw[(size_t)r * C + c] += DO[(size_t)n * C + c];
        }
    }
    char what[96];
    snprintf(what, sizeof what, "embedding fwd %s N=%d C=%d V=%d rows [%d, %d)", dt(bf), N, C, V,
             v0, v0 + Vl);
    check(what, out.d(), ro, 0);
    snprintf(what, sizeof what, "embedding bwd %s", dt(bf));
    check(what, tod(dw), rdw, 1e-6);
    settle();
    if (err[0]) printf("embedding: error flag %d on valid tokens   <-- FAIL\n", err[0]), failures++;
    /* the CPU backend's order: dwte[v] += dout[n] for n ascending, in
     * float: the result must be exactly that */
    mvec<float> seq = frand((size_t)Vl * C, 0.5), par = seq;
    for (int n = 0; n < N; n++)
        if (tok[n] >= v0 && tok[n] < v0 + Vl)
            for (int c = 0; c < C; c++)
                seq[(size_t)(tok[n] - v0) * C + c] += (float)DO[(size_t)n * C + c];
    mal_cu_embedding_bwd(0, bf, par.data(), dout.p(), tok.data(), N, C, v0, Vl, scratch.data());
    settle();
    if (memcmp(seq.data(), par.data(), seq.size() * sizeof(float)))
        printf("embedding bwd: not the CPU backend's summation order   <-- FAIL\n"), failures++;
    tok[3] = V; /* out of range */
    mal_cu_embedding_fwd(0, bf, out.p(), tok.data(), wte.p(), N, C, V, v0, Vl, err.data());
    settle();
    if (!(err[0] & MAL_CU_ERR_TOKEN))
        printf("embedding: token out of range not flagged   <-- FAIL\n"), failures++;
}

/* ---- cross-entropy ----------------------------------------------------- */

/* float64 softmax cross-entropy of logits L (N,V): losses rl (N) and
 * gradients rd (N,V) scaled by dscale. */
static void xent_ref(const dvec &L, const mvec<int> &tgt, int N, int V, double dscale, dvec &rl,
                     dvec &rd)
{
    rl.assign(N, 0), rd.assign((size_t)N * V, 0);
    for (int n = 0; n < N; n++) {
        double m = -1e300, s = 0;
        for (int i = 0; i < V; i++) m = fmax(m, L[(size_t)n * V + i]);
        for (int i = 0; i < V; i++) s += exp(L[(size_t)n * V + i] - m);
        rl[n] = log(s) + m - L[(size_t)n * V + tgt[n]];
        for (int i = 0; i < V; i++)
            rd[(size_t)n * V + i] = (exp(L[(size_t)n * V + i] - m) / s - (i == tgt[n])) * dscale;
    }
}

static void test_xent(int bf, int N, int V, int alias)
{
    buf lg((size_t)N * V, bf), dl((size_t)N * V, bf);
    lg.randn(3);
    dl.poison();
    mvec<int> tgt(N);
    for (int n = 0; n < N; n++) tgt[n] = (int)(urand() * V);
    mvec<float> loss(N, NAN);
    const dvec L = lg.d();
    const float dscale = 1.0f / 37;
    mvec<int> err(1, 0);
    mal_cu_xent(0, bf, loss.data(), alias ? lg.p() : dl.p(), lg.p(), tgt.data(), N, V, dscale,
                err.data());
    dvec rl, rd;
    xent_ref(L, tgt, N, V, dscale, rl, rd);
    char what[96];
    snprintf(what, sizeof what, "xent losses %s N=%d V=%d%s", dt(bf), N, V, alias ? " aliased" : "");
    check(what, tod(loss), rl, 1e-6);
    snprintf(what, sizeof what, "xent dlogits %s", dt(bf));
    check(what, alias ? lg.d() : dl.d(), rd, tol_of(bf, 1e-6));
    settle();
    if (err[0]) printf("xent: error flag on valid targets   <-- FAIL\n"), failures++;
}

/* The vocabulary-parallel cross-entropy: P uneven column shards of the
 * logits, each shard's statistics into its slot of the exchange, then the
 * combination on every shard against the float64 softmax of whole rows;
 * every shard must write the same loss bits. */
static void test_xent_vp(int bf, int N, int V, int P)
{
    buf lg((size_t)N * V, bf);
    lg.randn(3);
    mvec<int> tgt(N);
    for (int n = 0; n < N; n++) tgt[n] = (int)(urand() * V);
    tgt[0] = V - 1;
    const dvec L = lg.d();
    const float dscale = 1.0f / 37;
    const size_t slot = 3 * (size_t)N;
    mvec<float> all((size_t)P * slot, 0.0f);
    mvec<int> err(1, 0);
    std::vector<buf> sh;
    sh.reserve((size_t)P);
    for (int p = 0; p < P; p++) {
        const int v0 = (int)((long)V * p / P), Vl = (int)((long)V * (p + 1) / P) - v0;
        sh.emplace_back((size_t)N * Vl, bf);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < Vl; i++) sh[p].set((size_t)n * Vl + i, L[(size_t)n * V + v0 + i]);
        mal_cu_xent_stats(0, bf, all.data() + p * slot, sh[p].p(), tgt.data(), N, Vl, v0);
    }
    settle();
    dvec rl, rd, got((size_t)N * V);
    xent_ref(L, tgt, N, V, dscale, rl, rd);
    mvec<float> loss0(N, NAN);
    int same = 1;
    for (int p = 0; p < P; p++) {
        const int v0 = (int)((long)V * p / P), Vl = (int)((long)V * (p + 1) / P) - v0;
        mvec<float> loss(N, NAN);
        mal_cu_xent_combine(0, bf, loss.data(), sh[p].p(), sh[p].p(), all.data(), P, tgt.data(), N,
                            Vl, v0, V, dscale, err.data());
        settle();
        if (p == 0) loss0 = loss;
        same &= !memcmp(loss.data(), loss0.data(), (size_t)N * sizeof(float));
        const dvec D = sh[p].d();
        for (int n = 0; n < N; n++)
            for (int i = 0; i < Vl; i++) got[(size_t)n * V + v0 + i] = D[(size_t)n * Vl + i];
    }
    char what[96];
    snprintf(what, sizeof what, "xent vp losses %s N=%d V=%d P=%d", dt(bf), N, V, P);
    check(what, tod(loss0), rl, 1e-6);
    snprintf(what, sizeof what, "xent vp dlogits %s", dt(bf));
    check(what, got, rd, tol_of(bf, 1e-6));
    if (!same) printf("xent vp: shards disagree on the loss bits   <-- FAIL\n"), failures++;
    if (err[0]) printf("xent vp: error flag on valid targets   <-- FAIL\n"), failures++;
}

/* ---- AdamW ------------------------------------------------------------- */

static void test_adamw(int bf, size_t n)
{
    mvec<float> p = frand(n, 1), g = frand(n, 1), m = frand(n, 0.1), v(n);
    for (auto &x : v) x = (float)(0.01 * urand());
    buf work(n, bf);
    work.poison();
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    const int t = 3;
    const float ibc1 = (float)(1.0 / (1.0 - pow(0.9f, t))), ibc2 = (float)(1.0 / (1.0 - pow(0.95f, t)));
    dvec P = tod(p), G = tod(g), M = tod(m), Vv = tod(v);
    mal_cu_adamw(0, bf, p.data(), work.p(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd,
                 gs, ibc1, ibc2);
    dvec rp(n), rm(n), rv(n);
    for (size_t i = 0; i < n; i++) {
        double gi = G[i] * gs;
        rm[i] = b1 * M[i] + (1 - (double)b1) * gi;
        rv[i] = b2 * Vv[i] + (1 - (double)b2) * gi * gi;
        rp[i] = P[i] - lr * (rm[i] * ibc1 / (sqrt(rv[i] * ibc2) + eps) + wd * P[i]);
    }
    char what[96];
    snprintf(what, sizeof what, "adamw param %s n=%zu", dt(bf), n);
    check(what, tod(p), rp, 1e-6);
    check("adamw m", tod(m), rm, 1e-6);
    check("adamw v", tod(v), rv, 1e-6);
    snprintf(what, sizeof what, "adamw working copy %s", dt(bf));
    check(what, work.d(), tod(p), bf ? 4e-3 : 0);
}

/* ---- multi-tensor AdamW and sum of squares ------------------------------ */

/* got's bits are want's (memcmp), reported through check() with tolerance
 * 0 so that the passes' bit comparison sees them too. */
template <typename V> static void check_bits(const char *what, const V &got, const V &want)
{
    const int same = got.size() == want.size() &&
                     !memcmp(got.data(), want.data(), got.size() * sizeof(got[0]));
    if (!same) {
        printf("%s: the bits differ from the per-tensor kernels'   <-- FAIL\n", what);
        failures++;
    }
}

/* Spans of one slab as the optimizer passes them: tensors at 16-float
 * offsets with and without decay, some touching (merged by the launcher),
 * some apart, an empty one, one at an odd offset (no 16-byte path), more
 * than a launch's table holds.  mal_cu_adamw_multi must give the bits of
 * mal_cu_adamw on each span, and leave the gaps alone. */
static void test_adamw_multi(int bf)
{
    std::vector<mal_cu_span> sp;
    size_t off = 0;
    for (int j = 0; j < 2 * MAL_CU_ADAMW_MT + 37; j++) {
        const size_t n = j % 7 == 3 ? 0 : j % 5 == 0 ? 1 + (size_t)(urand() * 3000) : 16 + j % 41;
        const float wd = j % 3 == 0 ? 0.0f : 0.1f;
        if (j % 4 == 1) off += 16;      /* a gap */
        if (j == 11) off += 3;          /* an odd offset */
        sp.push_back({off, n, wd});
        off += n;
        if (j % 2) off = (off + 15) & ~(size_t)15; /* the model's 16-float start */
    }
    const size_t total = off + 16;
    mvec<float> p = frand(total, 1), g = frand(total, 1), m = frand(total, 0.1), v(total);
    for (auto &x : v) x = (float)(0.01 * urand());
    mvec<float> p2 = p, g2 = g, m2 = m, v2 = v;
    buf w(total, bf), w2(total, bf);
    w.randn(1);
    w2 = w;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gs = 0.7f;
    const float ibc1 = (float)(1.0 / (1.0 - pow(0.9, 5))), ibc2 = (float)(1.0 / (1.0 - pow(0.95, 5)));
    for (const mal_cu_span &x : sp)
        mal_cu_adamw(0, bf, p.data() + x.off,
                     bf ? (void *)(w.h.data() + x.off) : (void *)(w.f.data() + x.off),
                     g.data() + x.off, m.data() + x.off, v.data() + x.off, x.n, lr, b1, b2, eps,
                     x.weight_decay, gs, ibc1, ibc2);
    const int launches = mal_cu_adamw_multi(0, bf, p2.data(), w2.p(), g2.data(), m2.data(),
                                            v2.data(), sp.data(), (int)sp.size(), lr, b1, b2, eps,
                                            gs, ibc1, ibc2);
    settle();
    char what[96];
    snprintf(what, sizeof what, "adamw multi-tensor param %s (%zu spans)", dt(bf), sp.size());
    check(what, tod(p2), tod(p), 0);
    check_bits(what, p2, p);
    check_bits("adamw multi-tensor m", m2, m);
    check_bits("adamw multi-tensor v", v2, v);
    check_bits("adamw multi-tensor grad (read only)", g2, g);
    if (bf) check_bits("adamw multi-tensor working copy", w2.h, w.h);
    else check_bits("adamw multi-tensor working copy", w2.f, w.f);
    /* the spans that cannot merge, MAL_CU_ADAMW_MT to a launch */
    int entries = 0;
    const mal_cu_span *last = NULL;
    for (const mal_cu_span &x : sp) {
        if (!x.n) continue;
        if (!last || last->off + last->n != x.off || last->weight_decay != x.weight_decay) entries++;
        last = &x;
    }
    const int want = (entries + MAL_CU_ADAMW_MT - 1) / MAL_CU_ADAMW_MT;
    if (launches != want) {
        printf("adamw multi-tensor: %d launches for %d spans, expected %d   <-- FAIL\n", launches,
               entries, want);
        failures++;
    }
    if (pass == 0) printf("adamw multi-tensor: %zu spans (%d after merging) in %d launches\n",
                          sp.size(), entries, launches);
    /* no working copy (fp32 aliasing the master) */
    mal_cu_adamw_multi(0, bf, p2.data(), NULL, g2.data(), m2.data(), v2.data(), sp.data(),
                       (int)sp.size(), lr, b1, b2, eps, gs, ibc1, ibc2);
    for (const mal_cu_span &x : sp)
        mal_cu_adamw(0, bf, p.data() + x.off, NULL, g.data() + x.off, m.data() + x.off,
                     v.data() + x.off, x.n, lr, b1, b2, eps, x.weight_decay, gs, ibc1, ibc2);
    settle();
    check_bits("adamw multi-tensor param, no working copy", p2, p);
}

/* Several buffers zeroed by one launch (the backward's activation
 * gradients): every byte of each buffer zero, every byte around them
 * untouched, at any alignment and length (the 16-byte stores start at the
 * first boundary), more buffers than a launch's table holds. */
static void test_zero_multi(void)
{
    const int nb = MAL_CU_ZERO_MT + 9;
    std::vector<size_t> off(nb), len(nb);
    size_t at = 16;
    for (int j = 0; j < nb; j++) {
        const size_t sizes[] = {0, 1, 15, 16, 17, 255, 4096, 16383, 16384, 16385, 40000};
        len[j] = sizes[j % 11] + (j % 4 == 3 ? (size_t)(urand() * 100) : 0);
        off[j] = at + (j % 5); /* 0..4 bytes past a 16-byte boundary */
        at = (off[j] + len[j] + 16 + 15) & ~(size_t)15;
    }
    mvec<unsigned char> mem(at + 16, 0xab);
    std::vector<unsigned char> want(mem.begin(), mem.end());
    std::vector<void *> bufs(nb);
    for (int j = 0; j < nb; j++) {
        bufs[j] = mem.data() + off[j];
        memset(want.data() + off[j], 0, len[j]);
    }
    const int launches = mal_cu_zero_multi(0, bufs.data(), len.data(), nb);
    settle();
    size_t bad = 0;
    for (size_t i = 0; i < mem.size(); i++) bad += mem[i] != want[i];
    int nonzero = 0;
    for (int j = 0; j < nb; j++) nonzero += len[j] > 0;
    const int wl = (nonzero + MAL_CU_ZERO_MT - 1) / MAL_CU_ZERO_MT;
    dvec got(1, (double)bad);
    check("zero multi-buffer: bytes not as expected", got, dvec(1, 0.0), 0);
    if (launches != wl) {
        printf("zero multi-buffer: %d launches for %d buffers, expected %d   <-- FAIL\n", launches,
               nonzero, wl);
        failures++;
    }
    if (pass == 0) printf("zero multi-buffer: %d buffers in %d launches\n", nb, launches);
}

/* The runs of the gradient norm (whole tensors, column shards of
 * row-major matrices, empty ones) in tables of `cap` runs (the launcher's
 * own capacity, or a small one that takes several tables: the emulation
 * runs every block of every run, so the count stays small):
 * mal_cu_sumsq_multi must give acc the bits of mal_cu_sumsq on each run
 * in turn. */
static void test_sumsq_multi(int count, unsigned cap)
{
    const size_t total = 60000;
    mvec<float> x = frand(total, 1);
    std::vector<mal_cu_run> runs;
    for (int j = 0; j < count; j++) {
        mal_cu_run r;
        r.rows = j % 9 == 4 ? 0 : j % 3 == 0 ? 1 + j % 13 : 1;
        r.width = 1 + (size_t)(urand() * (j % 7 == 0 ? 3000 : 200));
        r.pitch = r.rows > 1 && j % 2 ? r.width + 1 + j % 5 : r.width;
        const size_t span = r.rows ? (r.rows - 1) * r.pitch + r.width : 0;
        r.x = x.data() + (size_t)(urand() * (double)(total - span - 1));
        runs.push_back(r);
    }
    mvec<double> a1(1, 1.25), a2(1, 1.25);
    mvec<char> s1(mal_cu_sumsq_scratch_bytes()), s2(mal_cu_sumsq_multi_scratch_bytes());
    for (const mal_cu_run &r : runs)
        mal_cu_sumsq(0, a1.data(), r.x, r.rows, r.width, r.pitch, s1.data());
    const int launches = sumsq_multi_cap(0, a2.data(), runs.data(), count, s2.data(), cap);
    settle();
    double want = 1.25;
    for (const mal_cu_run &r : runs)
        for (size_t i = 0; i < r.rows; i++)
            for (size_t c = 0; c < r.width; c++) want += (double)r.x[i * r.pitch + c] * r.x[i * r.pitch + c];
    char what[96];
    snprintf(what, sizeof what, "sumsq multi-tensor, %d runs by %u (float64)", count, cap);
    check(what, dvec(1, a2[0]), dvec(1, want), 1e-12);
    check_bits("sumsq multi-tensor (against the per-run kernels)", a2, a1);
    int nonempty = 0;
    for (const mal_cu_run &r : runs) nonempty += r.rows && r.width;
    const int wl = 2 * (int)((nonempty + cap - 1) / cap);
    if (launches != wl) {
        printf("sumsq multi-tensor: %d launches for %d runs, expected %d   <-- FAIL\n", launches,
               nonempty, wl);
        failures++;
    }
    if (pass == 0) printf("sumsq multi-tensor: %d runs in %d launches (per run: %d)\n", count,
                          launches, 2 * nonempty);
}

/* The run sums are added to acc in run order: from 0, four runs of
 * 2^-54 then one of 1 give 1 + 2^-52; 1 first would swallow each 2^-54
 * (under half an ulp of 1) and give 1. */
static void test_sumsq_multi_order(void)
{
    mvec<float> x(5, 0x1p-27f);
    x[4] = 1.0f;
    std::vector<mal_cu_run> runs;
    for (int j = 0; j < 5; j++) runs.push_back({x.data() + j, 1, 1, 1});
    mvec<double> acc(1, 0.0);
    mvec<char> scr(mal_cu_sumsq_multi_scratch_bytes());
    mal_cu_sumsq_multi(0, acc.data(), runs.data(), 5, scr.data());
    settle();
    check("sumsq multi-tensor adds the runs in order", dvec(1, acc[0]), dvec(1, 1.0 + 0x1p-52), 0);
}

/* ---- attention --------------------------------------------------------- */

struct att_ref {
    dvec out, lse, dq, dk, dv;
};

/* Grouped-query: query head h reads key/value head (h + q_off) / group. */
static att_ref attention_ref(const dvec &Q, const dvec &K, const dvec &Vv, const dvec &DO, int B,
                             int T, mal_cu_heads hs, int hd)
{
    att_ref r;
    const int H = hs.H;
    size_t n = (size_t)B * T * H * hd, ld = (size_t)H * hd;
    size_t nk = (size_t)B * T * hs.Hkv * hd, ldk = (size_t)hs.Hkv * hd;
    r.out.assign(n, 0), r.dq.assign(n, 0), r.dk.assign(nk, 0), r.dv.assign(nk, 0);
    r.lse.assign((size_t)B * H * T, 0);
    const double sc = 1.0 / sqrt((double)hd);
    dvec P((size_t)T * T), dP((size_t)T * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t base = (size_t)b * T * ld + (size_t)h * hd;
            size_t kbase = (size_t)b * T * ldk + (size_t)((h + hs.q_off) / hs.group) * hd;
#define AT(X, t, d) X[base + (size_t)(t) * ld + (d)]
#define KV(X, t, d) X[kbase + (size_t)(t) * ldk + (d)]
            for (int t = 0; t < T; t++) {
                double m = -1e300;
                for (int s = 0; s <= t; s++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += AT(Q, t, d) * KV(K, s, d);
                    P[(size_t)t * T + s] = dot * sc;
                    m = fmax(m, dot * sc);
                }
                double sum = 0;
                for (int s = 0; s <= t; s++) sum += exp(P[(size_t)t * T + s] - m);
                r.lse[((size_t)b * H + h) * T + t] = m + log(sum);
                for (int s = 0; s <= t; s++) P[(size_t)t * T + s] = exp(P[(size_t)t * T + s] - m) / sum;
                for (int d = 0; d < hd; d++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++) o += P[(size_t)t * T + s] * KV(Vv, s, d);
                    AT(r.out, t, d) = o;
                }
            }
            for (int t = 0; t < T; t++) {
                double Dt = 0;
                for (int s = 0; s <= t; s++) {
                    double dp = 0;
                    for (int d = 0; d < hd; d++) dp += AT(DO, t, d) * KV(Vv, s, d);
                    dP[(size_t)t * T + s] = dp;
                    Dt += P[(size_t)t * T + s] * dp;
                }
                for (int s = 0; s <= t; s++) {
                    double p = P[(size_t)t * T + s], ds = p * (dP[(size_t)t * T + s] - Dt);
                    for (int d = 0; d < hd; d++) {
                        KV(r.dv, s, d) += p * AT(DO, t, d);
                        AT(r.dq, t, d) += sc * ds * KV(K, s, d);
                        KV(r.dk, s, d) += sc * ds * AT(Q, t, d);
                    }
                }
            }
#undef AT
#undef KV
        }
    return r;
}

/* Multi-head attention over H heads. */
static mal_cu_heads mha(int H)
{
    mal_cu_heads h = {H, H, 1, 0};
    return h;
}

static void test_attention(int bf, int impl, int B, int T, mal_cu_heads hs, int hd)
{
    const int H = hs.H;
    size_t n = (size_t)B * T * H * hd, nk = (size_t)B * T * hs.Hkv * hd;
    buf q(n, bf), k(nk, bf), v(nk, bf), out(n, bf), dout(n, bf), dq(n, bf), dk(nk, bf), dv(nk, bf);
    q.randn(1), k.randn(1), v.randn(1), dout.randn(1);
    dq.randn(0.1), dk.randn(0.1), dv.randn(0.1);
    out.poison();
    const dvec DQ0 = dq.d(), DK0 = dk.d(), DV0 = dv.d();
    mvec<float> lse((size_t)B * H * T, NAN);
    mvec<char> scratch(mal_cu_attention_bwd_scratch_bytes(B, T, H));
    mal_cu_attention_fwd(0, bf, impl, out.p(), lse.data(), q.p(), k.p(), v.p(), B, T, hs, hd);
    mal_cu_attention_bwd(0, bf, impl, dq.p(), dk.p(), dv.p(), dout.p(), out.p(), q.p(), k.p(),
                         v.p(), lse.data(), B, T, hs, hd, scratch.data());
    /* the reference backward uses the kernel's own (rounded) output only
     * through D; recompute everything from the inputs */
    att_ref r = attention_ref(q.d(), k.d(), v.d(), dout.d(), B, T, hs, hd);
    for (size_t i = 0; i < n; i++) r.dq[i] += DQ0[i];
    for (size_t i = 0; i < nk; i++) r.dk[i] += DK0[i], r.dv[i] += DV0[i];
    const char *kind = mma_width(bf, impl, hd, q.p(), k.p(), v.p()) ? "mma" : "generic";
    char what[128];
    /* bf16 on tensor cores: P and dS are rounded to bf16 before their
     * products (FlashAttention's practice), so the backward is looser */
    double tf = bf ? 1e-2 : 2e-6, tb = bf ? 2e-2 : 1e-5;
    snprintf(what, sizeof what, "attention %s %s out B%d T%d H%d/%d g%d+%d hd%d", kind, dt(bf), B,
             T, H, hs.Hkv, hs.group, hs.q_off, hd);
    check(what, out.d(), r.out, tf);
    check("   lse", tod(lse), r.lse, bf ? 1e-3 : 1e-6);
    check("   dq", dq.d(), r.dq, tb);
    check("   dk", dk.d(), r.dk, tb);
    check("   dv", dv.d(), r.dv, tb);

}

/* A dO that is not 16-byte aligned (a bf16 view 2 bytes into a buffer):
 * the tensor-core backward copies dO tiles with cp.async, so the backward
 * must take the generic kernels then (the emulation stops a misaligned
 * cp.async; the GPU faults). */
static void test_attention_dout_misaligned(void)
{
    const int B = 1, T = 40, hd = 64;
    const mal_cu_heads hs = mha(2);
    const size_t n = (size_t)B * T * hs.H * hd;
    buf q(n, 1), k(n, 1), v(n, 1), out(n, 1), dq(n, 1), dk(n, 1), dv(n, 1), dbig(n + 1, 1);
    q.randn(1), k.randn(1), v.randn(1), dbig.randn(1);
    dq.randn(0.1), dk.randn(0.1), dv.randn(0.1);
    out.poison();
    const dvec DQ0 = dq.d(), DK0 = dk.d(), DV0 = dv.d(), DB = dbig.d();
    const dvec DO(DB.begin() + 1, DB.end());
    const bf16 *dout = (const bf16 *)dbig.p() + 1;
    mvec<float> lse((size_t)B * hs.H * T, NAN);
    mvec<char> scratch(mal_cu_attention_bwd_scratch_bytes(B, T, hs.H));
    mal_cu_attention_fwd(0, 1, 0, out.p(), lse.data(), q.p(), k.p(), v.p(), B, T, hs, hd);
    mal_cu_attention_bwd(0, 1, 0, dq.p(), dk.p(), dv.p(), dout, out.p(), q.p(), k.p(), v.p(),
                         lse.data(), B, T, hs, hd, scratch.data());
    att_ref r = attention_ref(q.d(), k.d(), v.d(), DO, B, T, hs, hd);
    for (size_t i = 0; i < n; i++)
        r.dq[i] += DQ0[i], r.dk[i] += DK0[i], r.dv[i] += DV0[i];
    check("attention bf16 bwd, dO 2 bytes off 16: dq", dq.d(), r.dq, 2e-2);
    check("   dk", dk.d(), r.dk, 2e-2);
    check("   dv", dv.d(), r.dv, 2e-2);
}

/* ---- attention at the presets' shapes, sampled -------------------------- */

/* The float64 attention of the query rows t in `rows` of query head h
 * (out, lse, dq) and of the key rows s in `rows` of key/value head j
 * (dk, dv, from every query head that reads j), plus lse and D = rowsum(dO
 * O) of every row of every head (what the backward kernels read).  O(T^2
 * hd) per head: seconds at T = 2048, where attention_ref's full
 * gradients would take minutes. */
struct att_rows {
    dvec out, lse, dq, dk, dv; /* full-size arrays, sampled rows filled */
    mvec<float> lse_f, D_f;   /* every row, for the backward kernels */
};
static att_rows attention_ref_rows(const dvec &Q, const dvec &K, const dvec &Vv, const dvec &DO,
                                   int B, int T, mal_cu_heads hs, int hd,
                                   const std::vector<int> &rows)
{
    att_rows r;
    const int H = hs.H;
    const size_t n = (size_t)B * T * H * hd, nk = (size_t)B * T * hs.Hkv * hd;
    const size_t ld = (size_t)H * hd, ldk = (size_t)hs.Hkv * hd;
    r.out.assign(n, 0), r.dq.assign(n, 0), r.dk.assign(nk, 0), r.dv.assign(nk, 0);
    r.lse.assign((size_t)B * H * T, 0);
    r.lse_f.assign((size_t)B * H * T, 0.0f), r.D_f.assign((size_t)B * H * T, 0.0f);
    const double sc = 1.0 / sqrt((double)hd);
    std::vector<double> S((size_t)T), o((size_t)hd);
    std::vector<char> want((size_t)T, 0);
    for (int t : rows) want[t] = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t base = (size_t)b * T * ld + (size_t)h * hd;
            const size_t kbase = (size_t)b * T * ldk + (size_t)((h + hs.q_off) / hs.group) * hd;
            const size_t st = ((size_t)b * H + h) * T;
#define AT(X, t, d) X[base + (size_t)(t) * ld + (d)]
#define KV(X, t, d) X[kbase + (size_t)(t) * ldk + (d)]
            /* every row: lse and D */
            std::vector<double> L((size_t)T), Dt((size_t)T);
            for (int t = 0; t < T; t++) {
                double m = -1e300;
                for (int s2 = 0; s2 <= t; s2++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += AT(Q, t, d) * KV(K, s2, d);
                    S[s2] = dot * sc;
                    m = fmax(m, S[s2]);
                }
                double sum = 0;
                for (int s2 = 0; s2 <= t; s2++) sum += exp(S[s2] - m);
                L[t] = m + log(sum);
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int s2 = 0; s2 <= t; s2++) {
                    const double p = exp(S[s2] - L[t]);
                    for (int d = 0; d < hd; d++) o[d] += p * KV(Vv, s2, d);
                }
                double dd = 0;
                for (int d = 0; d < hd; d++) dd += AT(DO, t, d) * o[d];
                Dt[t] = dd;
                r.lse[st + t] = L[t];
                r.lse_f[st + t] = (float)L[t], r.D_f[st + t] = (float)dd;
                if (!want[t]) continue;
                for (int d = 0; d < hd; d++) AT(r.out, t, d) = o[d];
                /* dq of the sampled row */
                for (int s2 = 0; s2 <= t; s2++) {
                    double dp = 0;
                    for (int d = 0; d < hd; d++) dp += AT(DO, t, d) * KV(Vv, s2, d);
                    const double ds = exp(S[s2] - L[t]) * (dp - dd);
                    for (int d = 0; d < hd; d++) AT(r.dq, t, d) += sc * ds * KV(K, s2, d);
                }
            }
            /* dk, dv of the sampled key rows (this head's share) */
            for (int s2 : rows)
                for (int t = s2; t < T; t++) {
                    double dot = 0, dp = 0;
                    for (int d = 0; d < hd; d++)
                        dot += AT(Q, t, d) * KV(K, s2, d), dp += AT(DO, t, d) * KV(Vv, s2, d);
                    const double p = exp(dot * sc - L[t]), ds = p * (dp - Dt[t]);
                    for (int d = 0; d < hd; d++) {
                        KV(r.dv, s2, d) += p * AT(DO, t, d);
                        KV(r.dk, s2, d) += sc * ds * AT(Q, t, d);
                    }
                }
#undef AT
#undef KV
        }
    return r;
}

/* The elements of rows `rows` (of T per sequence) of a (B,T,heads,hd)
 * array, for comparing a sample. */
static dvec rows_of(const dvec &x, int B, int T, int heads, int hd, const std::vector<int> &rows)
{
    dvec o;
    for (int b = 0; b < B; b++)
        for (int t : rows)
            for (int e = 0; e < heads * hd; e++)
                o.push_back(x[((size_t)b * T + t) * heads * hd + e]);
    return o;
}

#ifdef MAL_CUDA_EMU
/* Run only the blocks of the tensor-core kernels whose tile is the first
 * or the last of the sequence: the last query tile has every key tile
 * before it, the first key tile every query tile after it. */
static void sample_tiles(bool on)
{
    if (!on) {
        emu::block_filter() = nullptr;
        return;
    }
    emu::block_filter() = [](const void *, uint3 b, dim3 g) { return b.x == 0 || b.x == g.x - 1; };
}
#else
static void sample_tiles(bool) {}
#endif

/* bf16 tensor-core attention at a preset's shape (T = 2048, the head
 * dimensions of the 1b and llama3-1b presets, one key/value head's query
 * heads): the kernels called directly with the reference's lse and D; under
 * the emulation only the first and last tiles run (all of them on a GPU)
 * and their rows are checked. */
static void test_attention_sampled(int T, mal_cu_heads hs, int hd)
{
    const int H = hs.H, B = 1;
    const size_t n = (size_t)B * T * H * hd, nk = (size_t)B * T * hs.Hkv * hd;
    buf q(n, 1), k(nk, 1), v(nk, 1), out(n, 1), dout(n, 1), dq(n, 1), dk(nk, 1), dv(nk, 1);
    q.randn(1), k.randn(1), v.randn(1), dout.randn(1);
    dq.randn(0.1), dk.randn(0.1), dv.randn(0.1);
    out.poison();
    const dvec DQ0 = dq.d(), DK0 = dk.d(), DV0 = dv.d();
    std::vector<int> rows;
    for (int t = 0; t < T; t++)
        if (t < 64 || t >= (T - 1) / 64 * 64) rows.push_back(t); /* the first and last tiles */
    att_rows r = attention_ref_rows(q.d(), k.d(), v.d(), dout.d(), B, T, hs, hd, rows);
    mvec<float> lse((size_t)B * H * T, NAN);
    mvec<float> lse_in(r.lse_f.begin(), r.lse_f.end()), Dk(r.D_f.begin(), r.D_f.end());
    const int w = mma_width(1, 0, hd, q.p(), k.p(), v.p());
    sample_tiles(true);
    if (w == 64) {
        mma_fwd<64>(0, out.p(), lse.data(), q.p(), k.p(), v.p(), B, T, hs, hd);
        mma_bwd<64>(0, dq.p(), dk.p(), dv.p(), dout.p(), q.p(), k.p(), v.p(), lse_in.data(),
                    Dk.data(), B, T, hs, hd);
    } else {
        mma_fwd<128>(0, out.p(), lse.data(), q.p(), k.p(), v.p(), B, T, hs, hd);
        mma_bwd<128>(0, dq.p(), dk.p(), dv.p(), dout.p(), q.p(), k.p(), v.p(), lse_in.data(),
                     Dk.data(), B, T, hs, hd);
    }
    sample_tiles(false);
    settle();
    for (size_t i = 0; i < n; i++) r.dq[i] += DQ0[i];
    for (size_t i = 0; i < nk; i++) r.dk[i] += DK0[i], r.dv[i] += DV0[i];
    char what[128];
    snprintf(what, sizeof what, "attention mma bf16 out T%d H%d/%d hd%d, tiles sampled", T, H,
             hs.Hkv, hd);
    check(what, rows_of(out.d(), B, T, H, hd, rows), rows_of(r.out, B, T, H, hd, rows), 1e-2);
    dvec gl, wl;
    for (int h = 0; h < H; h++)
        for (int t : rows) {
            gl.push_back(lse[(size_t)h * T + t]);
            wl.push_back(r.lse[(size_t)h * T + t]);
        }
    check("   lse", gl, wl, 1e-3);
    check("   dq", rows_of(dq.d(), B, T, H, hd, rows), rows_of(r.dq, B, T, H, hd, rows), 2e-2);
    check("   dk", rows_of(dk.d(), B, T, hs.Hkv, hd, rows), rows_of(r.dk, B, T, hs.Hkv, hd, rows),
          2e-2);
    check("   dv", rows_of(dv.d(), B, T, hs.Hkv, hd, rows), rows_of(r.dv, B, T, hs.Hkv, hd, rows),
          2e-2);
}

/* More head slices (B H) than a grid's 65535 rows: the tensor-core
 * forward spills them into blockIdx.z.  T = 1, so each output row is its
 * value row; slices 0, 1, 65534, 65535 and the last run (the emulation's
 * filter) and are checked. */
static void test_attention_grid_z(void)
{
    const int B = 65537, T = 1, hd = 8;
    const size_t n = (size_t)B * T * hd;
    buf q(n, 1), k(n, 1), v(n, 1), out(n, 1);
    q.randn(1), k.randn(1), v.randn(1);
    out.poison();
    mvec<float> lse((size_t)B * T, NAN);
#ifdef MAL_CUDA_EMU
    emu::block_filter() = [](const void *, uint3 b, dim3 g) {
        const unsigned slice = b.z * g.y + b.y;
        return slice < 2 || slice == 65534 || slice == 65535 || slice == (unsigned)B - 1;
    };
#endif
    mma_fwd<64>(0, out.p(), lse.data(), q.p(), k.p(), v.p(), B, T, mha(1), hd);
#ifdef MAL_CUDA_EMU
    emu::block_filter() = nullptr;
#endif
    settle();
    dvec got, want, gl, wl;
    for (int b : {0, 1, 65534, 65535, B - 1})
        for (int d = 0; d < hd; d++) {
            got.push_back(out.get((size_t)b * hd + d));
            want.push_back(v.get((size_t)b * hd + d));
            double dot = 0;
            for (int e = 0; e < hd; e++) dot += q.get((size_t)b * hd + e) * k.get((size_t)b * hd + e);
            if (d == 0) gl.push_back(lse[b]), wl.push_back(dot / sqrt((double)hd));
        }
    check("attention mma bf16 out, 65537 head slices (grid z)", got, want, 1e-2);
    check("   lse", gl, wl, 1e-5);
}

/* The head dimensions the backend takes: even, up to 256 (the generic
 * kernels' 8 elements per lane); the launchers write nothing for others
 * (the table's operation refuses them, kernels/cuda/cuda.c). */
static void test_attention_limits(void)
{
    int bad = 0;
    for (int hd = -2; hd <= 300; hd++) {
        const int want = hd > 0 && hd % 2 == 0 && hd <= 256;
        if (mal_cu_attention_supported(hd) != want) bad++;
    }
    if (pass == 0 || bad)
        printf("attention: head dimensions 2..256 even, others refused%s\n",
               bad ? "   <-- FAIL" : "");
    failures += bad != 0;
    /* an unsupported one leaves the output alone (nothing half-written) */
    buf q(258, 1), out(258, 1);
    q.randn(1);
    out.poison();
    mvec<float> lse(1, 7.0f);
    mal_cu_attention_fwd(0, 1, 0, out.p(), lse.data(), q.p(), q.p(), q.p(), 1, 1, mha(1), 258);
    settle();
    if (lse[0] != 7.0f || out.get(0) == out.get(0)) {
        printf("attention: head dimension 258 was computed   <-- FAIL\n");
        failures++;
    }
}

/* Attention first, so that a pass that runs only it (pass 2) checks the
 * same results in the same order as the others. */
static void run_attention(void)
{
    /* generic attention (the fp32 mode's kernels), then the tensor-core
     * kernels at both tile widths with ragged tiles, and head dimensions
     * below a tile's width (40 and 104: the 32b preset's) */
    test_attention(0, 0, 2, 21, mha(3), 8);
    test_attention(0, 0, 1, 37, mha(2), 64);
    test_attention(1, 1, 1, 19, mha(2), 16);
    test_attention(1, 0, 1, 70, mha(2), 64);
    test_attention(1, 0, 2, 130, mha(1), 128);
    test_attention(1, 0, 1, 64, mha(1), 64);
    test_attention(1, 0, 1, 75, mha(2), 104);
    test_attention(1, 0, 2, 33, mha(1), 40);
    test_attention(1, 0, 1, 20, mha(1), 136); /* bf16 past 128: the generic kernels */
    /* grouped-query attention, generic and tensor-core kernels: 3 query
     * heads per key/value head; a TP rank's 2 of a head's 4 (q_off 2);
     * 3 query heads straddling two key/value heads (q_off 1) */
    const mal_cu_heads gqa = {6, 2, 3, 0}, repl = {2, 1, 4, 2}, straddle = {3, 2, 2, 1};
    test_attention(0, 0, 2, 21, gqa, 8);
    test_attention(0, 0, 1, 23, straddle, 8);
    test_attention(1, 1, 1, 19, repl, 16);
    test_attention(1, 0, 1, 70, gqa, 64);
    test_attention(1, 0, 2, 40, straddle, 64);
    test_attention(1, 0, 1, 66, repl, 128);
    test_attention_dout_misaligned();
}

static void run_kernels(void)
{
    for (int bf = 0; bf <= 1; bf++) {
        test_rmsnorm(bf, 37, 64);
        test_rmsnorm(bf, 9, 40);  /* rows that are no whole number of 16-byte vectors (bf16) */
        test_rope(bf, 2, 5, 3, 16);
        test_rope(bf, 1, 4, 2, 6); /* hd not a multiple of the vector: the pair path */
        test_elementwise(bf, 1000, 0);
        test_elementwise(bf, 997, 1);
        test_embedding(bf, 300, 48, 20, 0, 20);
        test_embedding(bf, 300, 48, 20, 5, 8); /* a vocabulary-parallel shard */
        test_xent(bf, 5, 1000, 0);
        test_xent(bf, 4, 77, 1);
        test_xent_vp(bf, 5, 1000, 1);
        test_xent_vp(bf, 4, 259, 8); /* uneven shards */
        test_adamw(bf, 1001);
        test_adamw_multi(bf);
    }
    test_zero_multi();
    test_fp32_vec(4099, 0);
    test_fp32_vec(1000, 3);
    test_attention_limits();
}

/* The presets' shapes: once (pass 0), they take most of the time. */
static void run_big(void)
{
    const mal_cu_heads l3 = {4, 1, 4, 0}; /* llama3-1b: one key/value head's 4 query heads */
    test_attention_sampled(2048, mha(1), 128); /* 1b */
    test_attention_sampled(1024, l3, 64);      /* llama3-1b (T 1024: 4 heads) */
    test_attention_sampled(640, mha(1), 104);  /* the 32b preset's head dimension */
    test_attention_grid_z();
    /* every block of every run under the emulation: once (the reduction's
     * thread orders are sumsq_k's, checked in both passes) */
    test_sumsq_multi(13, 4);
    test_sumsq_multi(12, MAL_CU_SUMSQ_MT);
    test_sumsq_multi_order();
}

int main(void)
{
#ifndef MAL_CUDA_EMU
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1) {
        printf("test_cuda_kernels: skipped: no usable GPU (%s)\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 77;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("test_cuda_kernels: %s, compute capability %d.%d, %d SMs\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount);
#endif
    const char *env = getenv("MAL_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("%s: seed %llu (MAL_TEST_SEED=%llu repeats this run)\n",
           PROG, (unsigned long long)seed, (unsigned long long)seed);
    for (pass = 0; pass < 3; pass++) {
        /* the same inputs every pass, in another thread order */
        rng_state = seed * 2654435761u + 1;
        n_checked = 0;
        set_order(pass == 0 ? 0 : pass == 1 ? 1 : 7);
        run_attention(); /* the kernels with the most barriers: every pass */
        if (pass < 2) run_kernels();
        if (pass == 0) run_big();
    }
    set_order(0);
    printf("%s: %s (%d failure%s)\n", PROG, failures ? "FAIL" : "ok", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
