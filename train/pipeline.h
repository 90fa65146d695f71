/* The 1F1B pipeline schedule of this rank's stage (pipeline.c): its place
 * in the pipeline, the activation slots of the micro-batches in flight and
 * the sends still pending on them.  Not installed. */
#ifndef MAL_TRAIN_PIPELINE_H
#define MAL_TRAIN_PIPELINE_H

#include <stdint.h>

#include "comm/comm.h"
#include "src/model.h"

struct mal_trainer;

/* Owned by pipeline.c (mal_pipeline_init / _fini); active ranks only. */
typedef struct {
    int n_stages, n_micro;              /* of this rank's pipeline */
    int first_sample;                   /* global batch position of the pipeline's first sample */
    const int *prev_ranks, *next_ranks; /* neighbouring stages' TP groups (NULL at the ends) */
    int n_prev, n_next;
    int warmup;                 /* 1F1B warm-up forwards of this stage */
    int n_slots;                /* micro-batches in flight on this stage */
    mal_acts **acts;            /* [n_slots] */
    void *grad_recv;            /* (N,C) gradient from the next stage (compute dtype) */
    void **grad_send;           /* [n_slots] (N,C) copies of input gradients in flight */
    mal_comm_req ***send_reqs;  /* [n_slots][max fan-out] pending activation sends */
    mal_comm_req ***gsend_reqs; /* [n_slots][max fan-out] pending gradient sends */
    int max_fanout;             /* room for requests in each slot: the most ranks one rank feeds */
    int *inputs, *targets;      /* host staging for one micro-batch */
} mal_pipeline;

/* Local.  The schedule's buffers for this rank's stage of tr->plan (the
 * model part must exist).  _fini frees them; after a failed _init too. */
int mal_pipeline_init(struct mal_trainer *tr);
void mal_pipeline_fini(struct mal_trainer *tr);

/* Run this rank's part of the 1F1B schedule for step `step`.  Collective
 * over the pipeline (and TP groups). */
int mal_pipeline_run(struct mal_trainer *tr, int64_t step, float dscale);

/* What a pass through the pipeline reads: load() fills pipe.inputs and
 * pipe.targets (B sequences of T tokens) for micro-batch mb of this rank's
 * pipeline (called on its first and last stages). */
typedef struct mal_pass {
    int (*load)(struct mal_trainer *tr, const struct mal_pass *pass, int mb, int B, int T);
    int64_t step;    /* for load: the training step */
    const void *ctx; /* for load */
} mal_pass;

/* Forward passes only (no gradients) of micro-batches 0 .. n_micro-1 of
 * `pass` through this rank's pipeline; the last stage adds each one's
 * per-token loss sum to tally.loss_local and leaves its logits in
 * pipe.acts[mb % pipe.n_slots].  Collective over the pipeline (and TP
 * groups). */
int mal_pipeline_forward_only(struct mal_trainer *tr, const mal_pass *pass, int n_micro);

#endif /* MAL_TRAIN_PIPELINE_H */
