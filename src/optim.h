/* AdamW with decoupled weight decay, global-norm gradient clipping, and the
 * learning-rate schedule (linear warmup, then cosine decay to a floor). */
#ifndef MAL_OPTIM_H
#define MAL_OPTIM_H

#include "model.h"

typedef struct {
    float lr;           /* peak learning rate */
    float min_lr_ratio; /* floor of the cosine decay, as a fraction of lr */
    int warmup_steps;   /* linear warmup length */
    int total_steps;    /* schedule length (decay reaches the floor here) */
    float beta1, beta2, eps;
    float weight_decay; /* applied to matrices only (tensor.decay) */
    float grad_clip;    /* max global gradient norm; <= 0 disables clipping */
} mal_optim_config;

/* Defaults: lr 1e-3, floor 0.1, warmup 10, total_steps 0 (= the run's
 * --steps, or on resume the snapshot's run's schedule, filled in by the
 * trainer), betas 0.9/0.95, eps 1e-8, weight decay 0.1, clip 1.0. */
mal_optim_config mal_optim_defaults(void);

/* Local.  Learning rate for step `step` (0-based): warmup lr*(step+1)/W for
 * step < W, then min + (lr-min)/2 (1 + cos(pi p)), p = (step-W)/(S-W)
 * clamped to [0, 1]. */
float mal_optim_lr(const mal_optim_config *oc, int64_t step);

/* Local.  Clip scale for a global gradient norm. */
float mal_optim_clip_scale(const mal_optim_config *oc, double grad_norm);

/* Local.  One AdamW update of every tensor of the part at step `step`
 * (0-based; bias correction uses step+1), gradients multiplied by
 * grad_scale first; the fp32 master parameters and moments are updated and
 * the working weights refreshed (queued on the model's kernel instance). */
void mal_optim_update(mal_model *m, const mal_optim_config *oc, int64_t step, float lr,
                      float grad_scale);

#endif /* MAL_OPTIM_H */
