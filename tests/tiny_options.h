/* The training options the multi-rank tests share: `tiny`, global batch 16
 * in micro-batches of 2, lr 3e-3, one BLAS thread, no log lines, and the
 * kernel backend named by MALLEUS_TEST_DEVICE when it is set (the test
 * scripts set it to cpu-opaque to run the suite where no code outside the
 * backends may touch device memory; unset: the default backend). */
#ifndef MAL_TINY_OPTIONS_H
#define MAL_TINY_OPTIONS_H

#include <stdlib.h>

#include "mal_test.h"
#include "train.h"

/* The kernel backend the tests run on: MALLEUS_TEST_DEVICE, or NULL (the
 * default). */
static inline const char *mal_test_device(void)
{
    const char *d = getenv("MALLEUS_TEST_DEVICE");
    return d && *d ? d : NULL;
}

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
    o.device = mal_test_device();
    return o;
}

#endif /* MAL_TINY_OPTIONS_H */
