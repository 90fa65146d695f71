/* AdamW, gradient clipping and the learning-rate schedule. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

mal_optim_config mal_optim_defaults(void)
{
    /* total_steps 0: the trainer substitutes the run length */
    mal_optim_config oc = {1e-3f, 0.1f, 10, 0, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    return oc;
}

float mal_optim_lr(const mal_optim_config *oc, int64_t step)
{
    if (step < oc->warmup_steps) return oc->lr * (float)(step + 1) / (float)oc->warmup_steps;
    double span = (double)(oc->total_steps - oc->warmup_steps);
    double p = span > 0 ? (double)(step - oc->warmup_steps) / span : 1.0;
    if (p > 1.0) p = 1.0;
    double min_lr = (double)oc->lr * oc->min_lr_ratio;
    return (float)(min_lr + 0.5 * ((double)oc->lr - min_lr) * (1.0 + cos(M_PI * p)));
}

float mal_optim_clip_scale(const mal_optim_config *oc, double grad_norm)
{
    if (oc->grad_clip <= 0 || !(grad_norm > oc->grad_clip)) return 1.0f;
    return (float)(oc->grad_clip / grad_norm);
}

void mal_optim_update(mal_model *m, const mal_optim_config *oc, int64_t step, float lr,
                      float grad_scale)
{
    /* One multi-tensor operation over every tensor (the parameters,
     * gradients and moments share the tensors' offsets): a launch or two
     * on a GPU instead of one per tensor, the same bits.  The working copy
     * is refreshed in the same pass (nothing to do when it is the master
     * itself).  Without memory for the table, one tensor at a time. */
    mal_kern_span one, *sp = malloc((size_t)(m->n_tensors > 0 ? m->n_tensors : 1) * sizeof *sp);
    const int per_call = sp ? m->n_tensors : 1;
    for (int i0 = 0; i0 < m->n_tensors; i0 += per_call) {
        mal_kern_span *tab = sp ? sp : &one;
        for (int i = 0; i < per_call; i++) {
            const mal_tensor_info *t = &m->tensors[i0 + i];
            tab[i] = (mal_kern_span){t->offset, t->n, t->decay ? oc->weight_decay : 0.0f};
        }
        mal_kern_adamw_multi(m->k, m->params, m->work, m->grads, m->adam_m, m->adam_v, tab,
                             per_call, lr, oc->beta1, oc->beta2, oc->eps, grad_scale,
                             (int)(step + 1));
    }
    free(sp);
}
