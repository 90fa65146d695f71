/* Validation loss and text samples of the running model (eval.c): the
 * validation data and the best loss so far.  Not installed. */
#ifndef MAL_TRAIN_EVAL_H
#define MAL_TRAIN_EVAL_H

#include <stdint.h>

#include "src/data.h"
#include "src/tokenizer.h"
#include "train.h"

struct mal_trainer;

/* Owned by eval.c (mal_eval_init / _fini). */
typedef struct {
    mal_data *val;         /* validation data (NULL: no evaluation) */
    double best_val;       /* best validation loss of this run so far */
    int64_t best_val_step; /* its step (-1: none yet) */
    mal_tokenizer *tok;    /* rank 0: the data's tokenizer, samples decoded (NULL: ids) */
    int tok_tried;         /* rank 0: the tokenizer was looked for */
} mal_eval;

/* Local.  Open the validation data when the options ask for evaluation;
 * _fini releases it. */
int mal_eval_init(struct mal_trainer *tr);
void mal_eval_fini(struct mal_trainer *tr);

/* For mal_trainer_run (collective): the validation loss into *st when
 * --eval-every makes it due (or at the last step); a sample printed by
 * rank 0 when --sample-every makes it due; --eval-only's whole run; the
 * end-of-run line on the best validation loss (rank 0, local). */
int mal_eval_after_step(struct mal_trainer *tr, mal_step_stats *st);
int mal_sample_after_step(struct mal_trainer *tr, const mal_step_stats *st);
int mal_eval_only(struct mal_trainer *tr);
void mal_eval_summary(const struct mal_trainer *tr);

#endif /* MAL_TRAIN_EVAL_H */
