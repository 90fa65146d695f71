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

/* Largest |local - ref| over tensor t's shard (local: the part's values,
 * t at t->offset) against the whole tensor `ref` (n values, row-major),
 * relative to ref's largest value. */
static inline double mal_test_shard_err(const mal_tensor_info *t, const float *local,
                                        const float *ref, size_t n)
{
    double scale = 0, err = 0;
    int64_t rows = t->local_shape[0], cols = t->ndim == 2 ? t->local_shape[1] : 1;
    int64_t gcols = t->ndim == 2 ? t->shape[1] : 1;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)ref[i]));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            int64_t gr = t->split_dim == 0 ? r + t->split_off : r;
            int64_t gc = t->split_dim == 1 ? c + t->split_off : c;
            err = fmax(err, fabs((double)local[t->offset + (size_t)(r * cols + c)] -
                                 (double)ref[gr * gcols + gc]));
        }
    return err / scale;
}

#endif /* MAL_ZERO_TEST_H */
