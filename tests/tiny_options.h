/* The training options the multi-rank tests share: `tiny`, global batch 16
 * in micro-batches of 2, lr 3e-3, one BLAS thread, no log lines. */
#ifndef MAL_TINY_OPTIONS_H
#define MAL_TINY_OPTIONS_H

#include "mal_test.h"
#include "train.h"

static inline mal_train_options mal_test_tiny_options(int64_t steps, int warmup)
{
    mal_train_options o = mal_train_defaults();
    CHECK_OK(mal_config_load(&o.model, "tiny"));
    o.steps = steps;
    o.global_batch = 16;
    o.micro_batch = 2;
    o.optim.lr = 3e-3f;
    o.optim.warmup_steps = warmup;
    o.log_every = 0;
    o.threads = 1;
    return o;
}

#endif /* MAL_TINY_OPTIONS_H */
