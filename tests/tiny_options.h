/* The training options the multi-rank tests share: `tiny`, global batch 16
 * in micro-batches of 2, lr 3e-3, one BLAS thread, no log lines, fp32
 * compute (the tests' tolerances are fp32's: on a GPU the default would be
 * bf16), the kernel backend named by MALLEUS_TEST_DEVICE and the data plane
 * named by MALLEUS_TEST_COMM when they are set (the test scripts set the
 * device to cpu-opaque to run the suite where no code outside the backends
 * may touch device memory, and tests/test_cuda_multirank.sh to cuda, with
 * comm mpi or nccl; unset: the defaults). */
#ifndef MAL_TINY_OPTIONS_H
#define MAL_TINY_OPTIONS_H

#include <stdlib.h>

#include "mal_test.h"
#include "train/train.h"

/* The kernel backend the tests run on: MALLEUS_TEST_DEVICE, or NULL (the
 * default). */
static inline const char *mal_test_device(void)
{
    const char *d = getenv("MALLEUS_TEST_DEVICE");
    return d && *d ? d : NULL;
}

/* The data plane the tests run on: MALLEUS_TEST_COMM, or NULL (the
 * default for the device). */
static inline const char *mal_test_comm(void)
{
    const char *c = getenv("MALLEUS_TEST_COMM");
    return c && *c ? c : NULL;
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
    o.precision = MAL_PRECISION_FP32;
    o.comm = mal_test_comm();
    return o;
}

#endif /* MAL_TINY_OPTIONS_H */
