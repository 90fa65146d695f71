/* Whole-model gradient check on the `tiny` preset and on `tiny-llama3`
 * (grouped-query attention with 4 query heads per key/value head, tied
 * input and output embeddings, rope_theta 500000 with the llama3 scaling):
 * for every parameter tensor, the analytic directional derivative g . d
 * (backward pass) must match the central finite difference
 * (L(p + e d) - L(p - e d)) / 2e of the loss along a random direction d
 * supported on that tensor.  A missing term in any layer's backward (norm,
 * rope, attention, SwiGLU, residual, the tied embedding's two uses) shows
 * up as a mismatch in the tensors upstream of it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "mal_test.h"
#include "src/model.h"

static double loss_at(mal_model *m, mal_acts *a, double scale)
{
    CHECK_OK(mal_model_forward(m, a, NULL, 0.0f));
    return mal_acts_loss_sum(m, a) * scale;
}

static double check_model(const char *preset)
{
    mal_model_config cfg;
    CHECK_OK(mal_config_load(&cfg, preset));
    printf("%s: %d heads, %d key/value heads, %s embeddings, rope_theta %g%s\n", preset,
           cfg.n_heads, cfg.n_kv_heads, cfg.tie_embeddings ? "tied" : "untied",
           (double)cfg.rope.theta, cfg.rope.llama3 ? " (llama3 scaling)" : "");
    const int B = 2, T = cfg.seq_len, N = B * T;
    mal_model_part part = mal_model_part_full(&cfg);
    mal_model *m;
    mal_acts *a;
    /* the cpu backend: its buffers are host memory, which this test sets and
     * reads directly */
    mal_kern k;
    CHECK_OK(mal_kern_create("cpu", NULL, &k));
    CHECK(k->host_addressable);
    CHECK_OK(mal_model_create(&m, &cfg, &part, B, k, 7));
    CHECK_OK(mal_acts_create(&a, m, B));

    /* Larger initial weights than training uses, so every path through the
     * network carries gradient well above float rounding. */
    for (size_t i = 0; i < m->n_params; i++) {
        int is_norm = 0;
        for (int t = 0; t < m->n_tensors; t++)
            if (i >= m->tensors[t].offset && i < m->tensors[t].offset + m->tensors[t].n)
                is_norm = m->tensors[t].init_std == 0.0f;
        m->params[i] = is_norm ? (float)(1.0 + 0.3 * mal_rng_normal(3, 1, i))
                               : (float)(0.15 * mal_rng_normal(3, 2, i));
    }
    int *in = malloc(sizeof(int) * N), *tg = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) {
        in[i] = (int)mal_rng_below(5, 0, (uint64_t)i, (uint64_t)cfg.vocab);
        tg[i] = (int)mal_rng_below(5, 1, (uint64_t)i, (uint64_t)cfg.vocab);
    }
    mal_acts_set_batch(m, a, in, tg);

    const double scale = 1.0 / N; /* mean loss */
    mal_model_zero_grad(m);
    CHECK_OK(mal_model_forward(m, a, NULL, (float)scale));
    CHECK_OK(mal_model_backward(m, a, NULL, NULL));
    float *grad = malloc(m->n_params * sizeof(float));
    memcpy(grad, m->grads, m->n_params * sizeof(float));
    float *p0 = malloc(m->n_params * sizeof(float));
    memcpy(p0, m->params, m->n_params * sizeof(float));

    /* Two directions per tensor: a random one (checks every component
     * direction on average) and the gradient itself (largest signal, and
     * fd == |g| only if the true gradient equals g in direction and size). */
    double worst = 0;
    for (int t = 0; t < m->n_tensors; t++) {
        const mal_tensor_info *ti = &m->tensors[t];
        double *d = malloc(ti->n * sizeof(double));
        for (int kind = 0; kind < 2; kind++) {
            double dn = 0, gd = 0;
            for (size_t j = 0; j < ti->n; j++) {
                d[j] = kind == 0 ? mal_rng_normal(11, (uint64_t)t, j) : grad[ti->offset + j];
                dn += d[j] * d[j];
            }
            dn = sqrt(dn);
            CHECK(dn > 0);
            for (size_t j = 0; j < ti->n; j++) {
                d[j] /= dn;
                gd += d[j] * grad[ti->offset + j];
            }
            /* Central differences at steps e and e/2 along the unit
             * direction, extrapolated (Richardson: (4 fd(e/2) - fd(e)) / 3
             * cancels the e^2 term of the truncation error, which is what
             * the large weights of the first layers leave at e alone);
             * fp32 forward noise (~1e-7 of the loss) bounds the usable step
             * from below. */
            double fds[2];
            for (int r = 0; r < 2; r++) {
                const double eps = r ? 1e-2 : 2e-2;
                for (size_t j = 0; j < ti->n; j++)
                    m->params[ti->offset + j] = (float)(p0[ti->offset + j] + eps * d[j]);
                double lp = loss_at(m, a, scale);
                for (size_t j = 0; j < ti->n; j++)
                    m->params[ti->offset + j] = (float)(p0[ti->offset + j] - eps * d[j]);
                double lm = loss_at(m, a, scale);
                memcpy(m->params + ti->offset, p0 + ti->offset, ti->n * sizeof(float));
                fds[r] = (lp - lm) / (2 * eps);
            }
            double fd = (4 * fds[1] - fds[0]) / 3;
            double err = fabs(fd - gd) / fabs(gd);
            printf("%-20s %-8s g.d %+.6e  fd %+.6e  rel err %.2e\n", ti->name,
                   kind ? "grad dir" : "random", gd, fd, err);
            if (kind == 1) {
                /* the gradient direction must carry signal well above noise */
                CHECK(gd > 1e-4);
                CHECK_CLOSE(fd, gd, 1e-3, 0);
                if (err > worst) worst = err;
            } else {
                CHECK_CLOSE(fd, gd, 2e-2, 1e-5);
            }
        }
        free(d);
    }
    printf("%s: worst relative error %.2e over %d tensors\n", preset, worst, m->n_tensors);
    free(grad);
    free(p0);
    free(in);
    free(tg);
    mal_acts_destroy(m, a);
    mal_model_destroy(m);
    mal_kern_destroy(k);
    return worst;
}

int main(void)
{
    check_model("tiny");
    check_model("tiny-llama3");
    return 0;
}
