/* What one training step asks of the kernel table, counted by the table's
 * call-site wrappers (kernels.h, mal_kern_counts_get): the model of a
 * preset's structure (its layers, heads and tensors; small widths, which
 * change no count) trained one step on the CPU backend, one rank, one
 * micro-batch, as the benchmark runs it.  Prints, per step and per layer,
 * the operations by kind, and the kernel launches, memsets and full
 * drains they make on the CUDA backend (each operation's launches read
 * from the CUDA launchers, the table below).  Checks that the optimizer
 * and the gradient norm are one multi-tensor operation each, not one per
 * tensor; and that a layer's memsets, the step's full drains and its
 * event waits are no more than today's (2, 6 and 5: bench/gpu/NOTES.md
 * lists them and which the host needs).
 * Usage: test_kern_counts [preset ...] (default: 124m 1b). */
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "mal_test.h"
#include "src/model.h"
#include "train/train.h"

/* CUDA kernel launches (cuBLASLt calls counted as one) per compute
 * operation of the bf16 tensor-core path, read from the launchers:
 * matmul_bwd is two products (input and weight gradients), rmsnorm_bwd a
 * row pass and a column sum, attention_bwd a row dot, dK/dV and dQ,
 * embedding_bwd four kernels (histogram, scan, placement, accumulation)
 * after a memset, sumsq a block pass and an in-order sum; the
 * multi-tensor operations are counted by their own rule (cuda_kernels). */
static int kernels_of(int op)
{
    switch (op) {
    case MAL_KOP_MATMUL_BWD:
    case MAL_KOP_RMSNORM_BWD:
    case MAL_KOP_SUMSQ:
        return 2;
    case MAL_KOP_ATTENTION_BWD:
        return 3;
    case MAL_KOP_EMBEDDING_BWD:
        return 4;
    case MAL_KOP_ZERO: /* a memset, or one kernel for several buffers */
    case MAL_KOP_COPY:
    case MAL_KOP_SYNC:
    case MAL_KOP_QUEUE_WAIT:
    case MAL_KOP_EVENT_WAIT:
    case MAL_KOP_SUMSQ_MULTI:
    case MAL_KOP_ADAMW_MULTI:
        return 0;
    default:
        return 1;
    }
}

typedef struct {
    unsigned long long c[MAL_KOP_N];
    int n_tensors, n_layers;
} step_counts;

/* One step of `preset`'s structure with n_layers layers, after a first
 * one (the steady state: no first-use allocation). */
static void count_step(const char *preset, int n_layers, step_counts *out)
{
    mal_train_options o = mal_train_defaults();
    CHECK_OK(mal_config_load(&o.model, preset));
    o.model.n_layers = n_layers;
    o.model.vocab = 256; /* the built-in corpus is bytes */
    o.model.seq_len = 16;
    o.model.d_model = 8 * o.model.n_heads;
    o.model.ffn_hidden = 24 * o.model.n_heads;
    o.global_batch = o.micro_batch = 2;
    o.log_every = 0;
    o.threads = 1;
    o.device = "cpu";
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, &o));
    mal_step_stats st;
    CHECK_OK(mal_trainer_step(tr, &st));
    mal_kern k = mal_trainer_kernels(tr);
    mal_kern_counts_reset(k);
    CHECK_OK(mal_trainer_step(tr, &st));
    mal_kern_counts_get(k, out->c);
    out->n_tensors = mal_trainer_model(tr)->n_tensors;
    out->n_layers = n_layers;
    mal_trainer_destroy(tr);
}

/* CUDA kernel launches of a step: with the multi-tensor operations (ceil
 * over the launchers' tables: 128 AdamW spans after merging, 192
 * sum-of-squares runs, two launches each), or `per_tensor`: as before
 * them, one AdamW and two sum-of-squares launches per tensor. */
static unsigned long long cuda_kernels(const step_counts *s, int per_tensor)
{
    unsigned long long n = 0;
    for (int i = 0; i < MAL_KOP_N; i++)
        n += s->c[i] * (unsigned long long)kernels_of(i);
    const unsigned long long t = (unsigned long long)s->n_tensors;
    if (per_tensor)
        n += s->c[MAL_KOP_ADAMW_MULTI] * t + s->c[MAL_KOP_SUMSQ_MULTI] * 2 * t;
    else
        n += s->c[MAL_KOP_ADAMW_MULTI] * ((t + 127) / 128) +
             s->c[MAL_KOP_SUMSQ_MULTI] * 2 * ((t + 191) / 192);
    return n;
}

static void report(const char *preset)
{
    mal_model_config cfg;
    CHECK_OK(mal_config_load(&cfg, preset));
    const int L = cfg.n_layers;
    step_counts s, s1;
    count_step(preset, L, &s);
    count_step(preset, L - 1, &s1);
    const unsigned long long *c = s.c, *d = s1.c;
    printf("== %s: %d layers, %d tensors; one step (one rank, one micro-batch)\n", preset, L,
           s.n_tensors);
    printf("%-16s %10s %10s\n", "operation", "per step", "per layer");
    for (int i = 0; i < MAL_KOP_N; i++)
        if (c[i])
            printf("%-16s %10llu %10lld\n", mal_kern_op_name(i), c[i],
                   (long long)c[i] - (long long)d[i]);
    const unsigned long long drains = c[MAL_KOP_SYNC] + c[MAL_KOP_QUEUE_WAIT];
    const unsigned long long memsets = c[MAL_KOP_ZERO] + c[MAL_KOP_EMBEDDING_BWD];
    printf("CUDA, per step: %llu kernel launches (%llu with per-tensor AdamW and sum of squares; "
           "%llu per layer), %llu memsets (%lld per layer), %llu copies, %llu full drains "
           "(sync, queue_wait) and %llu event waits\n",
           cuda_kernels(&s, 0), cuda_kernels(&s, 1), cuda_kernels(&s, 0) - cuda_kernels(&s1, 0),
           memsets, (long long)c[MAL_KOP_ZERO] - (long long)d[MAL_KOP_ZERO], c[MAL_KOP_COPY],
           drains, c[MAL_KOP_EVENT_WAIT]);

    /* the optimizer and the norm: one operation each, whatever the layers */
    CHECK(c[MAL_KOP_ADAMW_MULTI] == 1 && c[MAL_KOP_ADAMW] == 0);
    CHECK(c[MAL_KOP_SUMSQ_MULTI] == 1 && c[MAL_KOP_SUMSQ] == 0);
    CHECK(d[MAL_KOP_ADAMW_MULTI] == 1 && d[MAL_KOP_SUMSQ_MULTI] == 1);
    /* No more than today (a change that removes one lowers the bound
     * here).  A layer's backward zeroes the activation gradients it
     * accumulates into in one operation per block: d_s, d_g, d_u, d_h
     * (MLP), then d_ao, d_q, d_k, d_v, d_h (attention). */
    CHECK(c[MAL_KOP_ZERO] - d[MAL_KOP_ZERO] <= 2);
    /* Drains: the batch upload and the loss read (the host's arrays), the
     * forward's and the backward's ends, the norm's read, the optimizer's
     * end; the monitor's probe waits for each of its five samples. */
    CHECK(drains <= 6);
    CHECK(c[MAL_KOP_EVENT_WAIT] <= 5);
}

int main(int argc, char **argv)
{
    setenv("MALLEUS_DEVICE", "cpu", 1);
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            report(argv[i]);
    } else {
        report("124m");
        report("1b");
    }
    printf("test_kern_counts: ok\n");
    return 0;
}
