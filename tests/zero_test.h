/* What tests/test_zero.c and tests/test_zero_master.c share: training a few
 * steps with an online plan change half way, and comparing a rank's shard
 * of a tensor with the whole tensor of a one-process reference. */
#ifndef MAL_ZERO_TEST_H
#define MAL_ZERO_TEST_H

#include <math.h>

#include "mal_test.h"
#include "src/model.h"
#include "src/plan.h"
#include "train/train.h"

/* Train `o` for `steps` steps, moving onto plan `change` (NULL: none)
 * online half way; loss[s] the loss of each. */
static inline mal_trainer *mal_test_train(const mal_train_options *o, const mal_plan *change,
                                          int steps, double *loss)
{
    mal_trainer *tr;
    CHECK_OK(mal_trainer_create(&tr, o));
    for (int s = 0; s < steps; s++) {
        mal_step_stats st;
        if (change && s == steps / 2) CHECK_OK(mal_trainer_change_plan(tr, change));
        CHECK_OK(mal_trainer_step(tr, &st));
        loss[s] = st.loss;
    }
    return tr;
}

/* Over tensor t's shard (local: the part's values, t at t->offset) against
 * the whole tensor `ref` (row-major): d[0] the largest |local - ref|, d[1]
 * the sum of (local - ref)^2, d[2] the sum of ref^2 over the shard's
 * elements. */
static inline void mal_test_shard_diff(const mal_tensor_info *t, const float *local,
                                       const float *ref, double d[3])
{
    int64_t rows = t->local_shape[0], cols = t->ndim == 2 ? t->local_shape[1] : 1;
    int64_t gcols = t->ndim == 2 ? t->shape[1] : 1;
    d[0] = d[1] = d[2] = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t gr = t->split_dim == 0 ? r + t->split_off : r;
            int64_t gc = t->split_dim == 1 ? c + t->split_off : c;
            double x = ref[gr * gcols + gc];
            double e = (double)local[t->offset + (size_t)(r * cols + c)] - x;
            d[0] = fmax(d[0], fabs(e));
            d[1] += e * e;
            d[2] += x * x;
        }
}

/* Largest |local - ref| over tensor t's shard (mal_test_shard_diff)
 * against the whole tensor `ref` (n values), relative to ref's largest
 * value. */
static inline double mal_test_shard_err(const mal_tensor_info *t, const float *local,
                                        const float *ref, size_t n)
{
    double scale = 0, d[3];
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)ref[i]));
    mal_test_shard_diff(t, local, ref, d);
    return d[0] / scale;
}

#endif /* MAL_ZERO_TEST_H */
