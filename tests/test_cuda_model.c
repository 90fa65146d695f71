/* The whole model on the CUDA backend (exit 77 without a usable GPU):
 *   1. fp32 on the GPU against the CPU backend from the same parameters and
 *      batch: the loss within 1e-5 and every tensor's gradient within 1e-4
 *      relative (norm-wise; summation orders differ);
 *   2. a whole-model gradient check in fp32 on the GPU: per tensor, the
 *      analytic g.d against the central difference of the loss along a
 *      random direction and along the gradient (tests/test_model_grad.c's
 *      check, through the kernel table instead of host pointers);
 *   3. bf16 on the GPU against the CPU's fp32 gradients within bf16's error
 *      (5e-2 relative per tensor), and bit-identical on a second pass
 *      (determinism: no atomics in any kernel).
 * Four shapes: tiny (head size 8: the generic attention kernels), a small
 * model with head size 64 (bf16 runs the tensor-core kernels), and both
 * again with grouped-query attention, tied embeddings and the llama3
 * rotary scaling (tiny-llama3, and 2 query heads of size 64 on one
 * key/value head). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "mal_test.h"
#include "src/model.h"

static int failures;
/* the backend under test: cuda; MAL_TEST_DEVICE=cpu-opaque runs this test's
 * own logic on the CPU, fp32 and bf16 (tests/test_cuda_model_cpu.sh) */
static const char *dev = "cuda";

/* Every tensor's values <-> one host array of n_params floats. */
static void get_state(mal_model *m, int g, float *h)
{
    for (int t = 0; t < m->n_tensors; t++)
        CHECK_OK(mal_model_state_to_host(m, g, &m->tensors[t], h + m->tensors[t].offset));
}
static void set_params(mal_model *m, const float *h)
{
    for (int t = 0; t < m->n_tensors; t++)
        CHECK_OK(mal_model_state_from_host(m, MAL_STATE_PARAM, &m->tensors[t],
                                           h + m->tensors[t].offset));
}

typedef struct {
    mal_kern k;
    mal_model *m;
    mal_acts *a;
} run;

static run make(const char *dev, mal_dtype dt, const mal_model_config *cfg, int B, const float *p,
                const int *in, const int *tg)
{
    run r;
    mal_kern_config kc = mal_kern_config_default();
    kc.compute = dt;
    CHECK_OK(mal_kern_create(dev, &kc, &r.k));
    mal_model_part part = mal_model_part_full(cfg);
    CHECK_OK(mal_model_create(&r.m, cfg, &part, B, r.k, 7));
    CHECK_OK(mal_acts_create(&r.a, r.m, B));
    set_params(r.m, p);
    mal_acts_set_batch(r.m, r.a, in, tg);
    return r;
}
static void unmake(run *r)
{
    mal_acts_destroy(r->m, r->a);
    mal_model_destroy(r->m);
    mal_kern_destroy(r->k);
}

/* Loss (mean) and gradients (into g, host) of one forward + backward. */
static double loss_grad(run *r, double scale, float *g)
{
    mal_model_zero_grad(r->m);
    CHECK_OK(mal_model_forward(r->m, r->a, NULL, (float)scale));
    CHECK_OK(mal_model_backward(r->m, r->a, NULL, NULL));
    double l = mal_acts_loss_sum(r->m, r->a) * scale;
    CHECK_OK(mal_kern_sync(r->k));
    if (g) get_state(r->m, MAL_STATE_GRAD, g);
    return l;
}
static double loss_only(run *r, double scale)
{
    CHECK_OK(mal_model_forward(r->m, r->a, NULL, 0.0f));
    double l = mal_acts_loss_sum(r->m, r->a) * scale;
    CHECK_OK(mal_kern_sync(r->k));
    return l;
}

static void rel(const char *what, const char *name, const float *a, const float *b, size_t n,
                double tol)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    double e = sqrt(num / (den > 0 ? den : 1e-300));
    int ok = e <= tol && e == e;
    printf("  %-10s %-22s rel err %.2e (tol %.0e)%s\n", what, name, e, tol, ok ? "" : "  <-- FAIL");
    failures += !ok;
}

static void check_shape(const mal_model_config *cfg, int B)
{
    const int T = cfg->seq_len, N = B * T;
    const double scale = 1.0 / N;
    printf("%s: d %d, %d layers, %d heads (hd %d), T %d, B %d\n", cfg->name, cfg->d_model,
           cfg->n_layers, cfg->n_heads, cfg->d_model / cfg->n_heads, T, B);
    /* parameters as test_model_grad makes them: larger than training's so
     * that every path carries gradient well above rounding */
    mal_model_part part = mal_model_part_full(cfg);
    mal_tensor_info *tens;
    int nt;
    size_t np;
    CHECK_OK(mal_model_layout(cfg, &part, &tens, &nt, &np));
    float *p0 = malloc(np * sizeof *p0), *gc = malloc(np * sizeof *gc), *gg = malloc(np * 4),
          *g2 = malloc(np * 4), *pp = malloc(np * 4);
    memset(p0, 0, np * sizeof *p0);
    for (int t = 0; t < nt; t++)
        for (size_t j = 0; j < tens[t].n; j++) {
            size_t i = tens[t].offset + j;
            p0[i] = tens[t].init_std == 0.0f ? (float)(1.0 + 0.3 * mal_rng_normal(3, 1, i))
                                             : (float)(0.15 * mal_rng_normal(3, 2, i));
        }
    int *in = malloc(sizeof(int) * N), *tg = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) {
        in[i] = (int)mal_rng_below(5, 0, (uint64_t)i, (uint64_t)cfg->vocab);
        tg[i] = (int)mal_rng_below(5, 1, (uint64_t)i, (uint64_t)cfg->vocab);
    }

    /* 1. fp32 GPU = CPU */
    run cpu = make("cpu", MAL_F32, cfg, B, p0, in, tg);
    run gpu = make(dev, MAL_F32, cfg, B, p0, in, tg);
    double lc = loss_grad(&cpu, scale, gc), lg = loss_grad(&gpu, scale, gg);
    float flg = (float)lg, flc = (float)lc;
    rel("fp32", "loss", &flg, &flc, 1, 1e-5);
    for (int t = 0; t < nt; t++)
        rel("fp32 grad", tens[t].name, gg + tens[t].offset, gc + tens[t].offset, tens[t].n, 1e-4);

    /* 2. finite differences on the GPU, fp32 */
    double worst = 0;
    for (int t = 0; t < nt; t++) {
        const mal_tensor_info *ti = &tens[t];
        double *d = malloc(ti->n * sizeof(double));
        for (int kind = 0; kind < 2; kind++) {
            double dn = 0, gd = 0;
            for (size_t j = 0; j < ti->n; j++) {
                d[j] = kind == 0 ? mal_rng_normal(11, (uint64_t)t, j) : gg[ti->offset + j];
                dn += d[j] * d[j];
            }
            dn = sqrt(dn);
            CHECK(dn > 0);
            for (size_t j = 0; j < ti->n; j++) {
                d[j] /= dn;
                gd += d[j] * gg[ti->offset + j];
            }
            /* steps e and e/2, Richardson-extrapolated as in
             * tests/test_model_grad.c (the e^2 truncation term cancels:
             * the large weights of the wider shapes leave 2-4e-2 at e
             * alone) */
            double fds[2];
            for (int r = 0; r < 2; r++) {
                const double eps = r ? 1e-2 : 2e-2;
                memcpy(pp, p0, np * 4);
                for (size_t j = 0; j < ti->n; j++)
                    pp[ti->offset + j] = (float)(p0[ti->offset + j] + eps * d[j]);
                set_params(gpu.m, pp);
                double lp = loss_only(&gpu, scale);
                for (size_t j = 0; j < ti->n; j++)
                    pp[ti->offset + j] = (float)(p0[ti->offset + j] - eps * d[j]);
                set_params(gpu.m, pp);
                double lm = loss_only(&gpu, scale);
                fds[r] = (lp - lm) / (2 * eps);
            }
            double fd = (4 * fds[1] - fds[0]) / 3, err = fabs(fd - gd) / fabs(gd);
            int ok = kind == 1 ? gd > 1e-4 && fabs(fd - gd) <= 1e-2 * fabs(gd)
                               : fabs(fd - gd) <= 1e-5 + 2e-2 * fabs(gd);
            printf("  fd %-8s %-22s g.d %+.6e  fd %+.6e  rel %.1e%s\n",
                   kind ? "grad" : "random", ti->name, gd, fd, err, ok ? "" : "  <-- FAIL");
            failures += !ok;
            if (kind == 1 && err > worst) worst = err;
        }
        free(d);
    }
    set_params(gpu.m, p0);
    printf("  fd: worst relative error along the gradient %.2e\n", worst);
    unmake(&gpu);

    /* 3. bf16: near the fp32 gradients, and deterministic */
    const mal_kern_backend *kb;
    CHECK_OK(mal_kern_lookup(dev, &kb));
    if (!(kb->dtypes & (1u << MAL_BF16))) {
        printf("  bf16: %s has no bf16\n", dev);
        unmake(&cpu);
        free(p0), free(gc), free(gg), free(g2), free(pp), free(in), free(tg), free(tens);
        return;
    }
    run b16 = make(dev, MAL_BF16, cfg, B, p0, in, tg);
    double lb = loss_grad(&b16, scale, gg);
    float flb = (float)lb;
    rel("bf16", "loss", &flb, &flc, 1, 1e-2);
    /* bf16 storage against fp32: measured on an H100 (2026-11-26) 2.8-6.7 %
     * per tensor at these shapes (head dim 8, 4 layers; the attention
     * projections of the last layers worst), so 5e-2 was too tight; a wrong
     * kernel gives errors of order 1.  The exactness checks are the fp32
     * ones above (CPU equality and finite differences). */
    for (int t = 0; t < nt; t++)
        rel("bf16 grad", tens[t].name, gg + tens[t].offset, gc + tens[t].offset, tens[t].n, 1e-1);
    double lb2 = loss_grad(&b16, scale, g2);
    int same = lb2 == lb && !memcmp(gg, g2, np * 4);
    printf("  bf16 second pass: %s\n", same ? "bit-identical" : "DIFFERS  <-- FAIL");
    failures += !same;
    unmake(&b16);
    unmake(&cpu);
    free(p0), free(gc), free(gg), free(g2), free(pp), free(in), free(tg), free(tens);
}

int main(void)
{
    mal_kern probe;
    if (getenv("MAL_TEST_DEVICE")) dev = getenv("MAL_TEST_DEVICE");
    int rc = mal_kern_create(dev, NULL, &probe);
    if (rc == MAL_EDEVICE || rc == MAL_ENOTSUP) {
        printf("test_cuda_model: skipped: %s\n", mal_errmsg());
        return MAL_TEST_SKIP;
    }
    CHECK_OK(rc);
    mal_kern_destroy(probe);
    mal_model_config cfg;
    CHECK_OK(mal_config_load(&cfg, "tiny"));
    check_shape(&cfg, 2);
    /* head size 64 (the tensor-core kernels), ragged sequence tile */
    mal_model_config hd64 = cfg;
    snprintf(hd64.name, sizeof hd64.name, "hd64");
    hd64.d_model = 128, hd64.n_heads = hd64.n_kv_heads = 2, hd64.n_layers = 2;
    hd64.ffn_hidden = 256;
    hd64.seq_len = 80;
    CHECK_OK(mal_config_validate(&hd64));
    check_shape(&hd64, 2);
    /* grouped-query attention, tied embeddings, llama3 rotary scaling */
    mal_model_config l3;
    CHECK_OK(mal_config_load(&l3, "tiny-llama3"));
    check_shape(&l3, 2);
    /* the same at head size 64: the tensor-core kernels with 2 query heads
     * on one key/value head */
    mal_model_config l3h = l3;
    snprintf(l3h.name, sizeof l3h.name, "gqa-hd64");
    l3h.d_model = 128, l3h.n_heads = 2, l3h.n_kv_heads = 1, l3h.n_layers = 2;
    l3h.ffn_hidden = 256, l3h.seq_len = 80;
    CHECK_OK(mal_config_validate(&l3h));
    check_shape(&l3h, 2);
    printf("test_cuda_model: %s (%d failure%s)\n", failures ? "FAIL" : "ok", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
