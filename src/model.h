/* The LLaMA-style transformer: parameter layout, initialisation, forward and
 * backward of the part of the model that one rank holds.
 *
 * A rank holds a *part*: a contiguous range of transformer layers, plus the
 * token embedding if it is a pipeline's first stage and the final norm,
 * output projection and loss if it is the last, with every matrix split
 * Megatron-style over the ranks of its tensor-parallel group (wq, w1, w3 by
 * rows = heads / FFN columns; wo, w2 by columns; wk, wv by rows = the
 * key/value heads the rank's query heads read: split when the group size
 * divides n_kv_heads, else shared by several ranks, each holding a replica
 * whose gradient is partial until the replicas' are summed, Megatron-LM's
 * rule; the embedding and the output projection by vocabulary rows,
 * vocabulary-parallel, the cross-entropy computed across the group from
 * per-row statistics without gathering the logits).  With tied
 * embeddings the output projection is the token embedding: a pipeline's
 * last stage holds "tok_embedding" too (both stages' gradients are summed).
 * One process holding everything is the part {0, n_layers, embed, head,
 * tp 1}.
 *
 * Buffers and element types (kernels.h, DESIGN.md "Precision"):
 *  - the *state*: master parameters, gradients and both Adam moments, fp32
 *    whatever the backend computes in, each one contiguous device buffer
 *    with identical layout; every tensor is a view at the same offset in
 *    all four (mal_tensor_info).  Snapshots, gradient sync and migration
 *    move these (mal_model_state names them by group);
 *  - the *working weights* `work`: the parameters in the kernel instance's
 *    compute dtype, which the forward and backward passes read.  With fp32
 *    compute they are the master parameters themselves (work == params: no
 *    copy, no extra bytes); otherwise a separate buffer at the same element
 *    offsets, refreshed by the optimizer (fused) and by
 *    mal_model_refresh_working after the master changed in other ways;
 *  - activations and backward scratch in the compute dtype (their float
 *    statistics - RMSNorm rstd, per-token losses - stay fp32).
 * Activations live in a mal_acts per micro-batch in flight, so a pipeline
 * schedule can keep several.  Every buffer is a device buffer of the
 * model's kernel instance: only kernel operations touch their contents.
 *
 * Shapes in comments: B micro-batch, T sequence, N = B*T, C d_model,
 * Hl local heads, Kl local key/value heads, hd head dim, Fl local FFN
 * hidden, V vocab, Vl local vocabulary rows.
 */
#ifndef MAL_MODEL_H
#define MAL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kernels/kernels.h"
#include "plan.h"

typedef struct {
    int layer_begin, layer_end; /* [begin, end) transformer layers */
    int has_embed;              /* token embedding (first stage) */
    int has_head;               /* final norm + output projection + loss (last stage) */
    int tp_size, tp_rank;       /* tensor-parallel group size and position */
} mal_model_part;

/* The part that holds the whole model in one process. */
mal_model_part mal_model_part_full(const mal_model_config *cfg);

/* How the ranks of a TP group hold a tensor along its axis
 * (mal_model_tp_range). */
enum {
    MAL_TP_REPLICATE = 0, /* every rank all of it (norm weights) */
    MAL_TP_EVEN = 1,      /* equal blocks (query heads, FFN columns) */
    MAL_TP_KV = 2,        /* key/value heads: rank r the heads its query heads
                           * read; ranges overlap when the group size does not
                           * divide n_kv_heads (replicas, partial gradients) */
    MAL_TP_VOCAB = 3,     /* vocabulary rows, balanced when the group size does
                           * not divide the vocabulary: rank r of P holds
                           * [V r / P, V (r+1) / P) (no padding) */
};

/* One tensor of the part: its global identity and where its local shard
 * lives in the flat buffers. */
typedef struct {
    char name[48];       /* global name, e.g. "layers.3.wq", "tok_embedding" */
    int ndim;            /* 1 or 2 */
    int64_t shape[2];    /* global shape (rows, cols) */
    int split_dim;       /* this part: -1 whole, 0 split by rows, 1 split by columns */
    int axis;            /* the axis TP splits this tensor along when it does
                          * (0 rows, 1 columns; 0 for tensors never split):
                          * shards of different plans are compared along it */
    int tp_rule;         /* MAL_TP_*: how any TP group holds it */
    int tied;            /* 1: the tied embedding, held by a pipeline's first
                          * and last stage */
    int layer;           /* transformer layer, -1 for the embedding, n_layers
                          * for the final norm and output projection */
    int64_t split_off;   /* first global row/column held (along split_dim) */
    int64_t split_len;   /* rows/columns held (along split_dim) */
    int64_t local_shape[2];
    size_t offset;       /* float offset into params / grads / m / v */
    size_t n;            /* local element count */
    int decay;           /* AdamW weight decay applies (matrices, not norms) */
    float init_std;      /* normal(0, init_std); 0 means "ones" (norm weights) */
} mal_tensor_info;

/* Local, pure.  The range [*begin, *end) along t->axis that TP rank r of a
 * group of `size` ranks holds of tensor t of a model of config cfg (the
 * whole axis when size is 1 or t is replicated). */
void mal_model_tp_range(const mal_model_config *cfg, const mal_tensor_info *t, int size, int r,
                        int64_t *begin, int64_t *end);

/* Tensor-parallel all-reduce (sum, in place) of n elements of type dt (the
 * compute dtype for activations, fp32 for the cross-entropy's statistics)
 * over the part's TP group; the runtime supplies it when tp_size > 1. */
typedef int (*mal_tp_allreduce_fn)(void *ctx, void *x, size_t n, mal_dtype dt);

/* Gradient hook: the gradients of model layer `layer` (mal_tensor_info.layer:
 * -1 the embedding, n_layers the final norm and output projection) have
 * their kernels queued; 0, or an error that ends the backward pass. */
typedef int (*mal_grad_ready_fn)(void *ctx, int layer);

/* Views of one buffer per tensor (device pointers): into the working
 * weights (compute dtype) or into the gradients (fp32). */
typedef struct mal_layer_views {
    void *attn_norm; /* (C) */
    void *wq;        /* (Hl*hd, C) */
    void *wk, *wv;   /* (Kl*hd, C) each */
    void *wo;        /* (C, Hl*hd) */
    void *mlp_norm;  /* (C) */
    void *w1, *w3;   /* (Fl, C) gate, up */
    void *w2;        /* (C, Fl) down */
} mal_layer_views;

typedef struct mal_model_views {
    void *tok_embedding;  /* (Vl, C) or NULL */
    mal_layer_views *layer; /* [n_local_layers] */
    void *final_norm;     /* (C) or NULL */
    void *lm_head;        /* (Vl, C) or NULL; == tok_embedding when tied */
} mal_model_views;

/* The groups of the fp32 state, each one buffer of n_params floats with the
 * layout of the tensor table.  PARAM, ADAM_M and ADAM_V are what snapshots
 * store and migration moves (the first MAL_STATE_N_SAVED); GRAD is rebuilt
 * every step. */
enum {
    MAL_STATE_PARAM = 0,
    MAL_STATE_ADAM_M = 1,
    MAL_STATE_ADAM_V = 2,
    MAL_STATE_GRAD = 3,
    MAL_STATE_N_SAVED = 3,
};

/* The per-layer arrays of a mal_acts (h1 ... s below). */
enum { MAL_ACTS_LAYER_ARRAYS = 13 };

typedef struct mal_model {
    mal_model_config cfg;
    mal_model_part part;
    mal_kern k;
    int n_local_layers;
    int n_heads_local, head_dim, ffn_local;
    mal_attn_heads heads; /* this part's query and key/value heads (kernels.h) */
    int kv_first;         /* its first key/value head (global) */
    int vocab_first, vocab_local; /* its vocabulary rows [v0, v0 + Vl) */
    mal_rope rope;

    int n_tensors;
    mal_tensor_info *tensors;
    size_t n_params; /* local floats */

    /* fp32 state (device, n_params floats each); use mal_model_state() to
     * name one by group.  adam_m, adam_v and (with a separate working
     * copy) params are NULL where the sharded optimizer keeps this rank's
     * share instead (gradsync.h) */
    float *params, *grads, *adam_m, *adam_v;
    /* 1 while the whole master waits in `grads` (params NULL) for the
     * sharded optimizer to take this rank's share (mal_model_park_master) */
    int master_parked;
    void *work;           /* working weights, compute dtype (== params for fp32) */
    size_t esz;           /* bytes per element of the compute dtype */
    mal_model_views w, g; /* views into work and grads */

    /* backward scratch shared by all micro-batches (device, compute dtype) */
    void *d_res0, *d_res1, *d_h;          /* (N,C) */
    void *d_q, *d_ao;                     /* (N,Hl*hd) */
    void *d_k, *d_v;                      /* (N,Kl*hd) */
    void *d_att;                          /* attention backward scratch (kernels.h) */
    void *d_g, *d_u, *d_s;                /* (N,Fl) */
    float *xent_stats; /* (tp_size,3,N) fp32: the vocabulary-parallel
                        * cross-entropy's exchange (head parts with
                        * tp_size > 1; else NULL) */
    int max_B;

    /* Activation recomputation (mal_recompute, plan.h; set with
     * mal_model_set_recompute): the arrays of a layer that the mode does
     * not keep in a mal_acts live in one shared one-layer buffer (device,
     * sized for max_B; NULL under MAL_RECOMPUTE_NONE), written by the
     * forward as scratch and again, recomputed, by the backward of each
     * layer just before that layer's backward. */
    int recompute;
    void *rc_block;
    void *rc_arr[MAL_ACTS_LAYER_ARRAYS]; /* per array (model.c's order); NULL: kept */

    mal_tp_allreduce_fn tp_allreduce;
    void *tp_ctx;

    /* Optional (NULL: none): called by mal_model_backward after the
     * kernels of the head's, each layer's and the embedding's gradients
     * are queued, in that order.  The runtime sets it for the step's last
     * backward pass only (before it, gradients are still accumulating);
     * nothing changes a gradient after mal_model_backward returns, so what
     * the hook has seen is final. */
    mal_grad_ready_fn grad_ready;
    void *grad_ctx;
} mal_model;

/* Local.  Create the part of the model described by `part`, for micro-batches
 * of up to `max_B` sequences, on kernel instance `k` (not owned; it must
 * outlive the model).  Parameters are initialised from `seed` (see
 * mal_model_init_params); gradients and Adam moments are zero.  The model
 * owns all its buffers. */
int mal_model_create(mal_model **out, const mal_model_config *cfg, const mal_model_part *part,
                     int max_B, mal_kern k, uint64_t seed);

/* The flags of mal_model_create_ex. */
enum {
    MAL_MODEL_INIT = 1,       /* initialise the parameters from the seed */
    MAL_MODEL_NO_MOMENTS = 2, /* no Adam moments (adam_m, adam_v NULL): the
                               * sharded optimizer keeps its share of them
                               * (gradsync.h, mal_gradsync_zero) */
};

/* The same, leaving parameters zero without MAL_MODEL_INIT in `flags` (the
 * caller is about to overwrite them: a resume or an online plan change). */
int mal_model_create_ex(mal_model **out, const mal_model_config *cfg, const mal_model_part *part,
                        int max_B, mal_kern k, uint64_t seed, int flags);
void mal_model_destroy(mal_model *m);
/* Local.  Park the whole fp32 master in the gradient buffer and free it
 * (m->params NULL, m->master_parked 1), the working copy already made
 * from it: a part whose master the sharded optimizer will shard
 * (mal_gradsync_zero_master, which takes the share from there) so that the
 * whole master never sits beside the buffers made before that - the
 * pipeline's activations, the gradient sum's buckets, the moments' shares -
 * a start-up peak above the steady state's that neither the memory check
 * nor the planner counts.  The gradients must not be used until then.
 * Nothing when the working weights are the master (fp32 compute). */
int mal_model_park_master(mal_model *m);
/* Local.  Free the gradients and backward scratch, keeping parameters and
 * Adam state: a part that will only be read from again (the old part during
 * an online plan change, which then needs less memory at its peak).  Views
 * into the gradients (m->g) dangle afterwards. */
void mal_model_release_work(mal_model *m);
/* Local.  1 when part b begins with exactly part a: a's tensors are b's
 * first ones, at the same offsets with the same local shapes (a's state
 * buffers, grown to b's size, are b's with a's tensors in place). */
int mal_model_extends(const mal_model *a, const mal_model *b);
/* Local.  Point the working weights and their views (m->w) at the state
 * again after m->params was replaced (a state buffer handed over by an
 * online plan change), and refresh the working copy when it is separate. */
void mal_model_rebind_views(mal_model *m);

/* Local.  The fp32 state buffer of group g (MAL_STATE_*), owned by the
 * model: the one way code outside the model names parameters, Adam
 * moments or gradients by index.  NULL for a released gradient. */
float *mal_model_state(const mal_model *m, int g);
/* Local.  Where that buffer's pointer is kept, for handing buffers
 * between parts (ownership moves with the pointer). */
float **mal_model_state_ref(mal_model *m, int g);
/* Local.  "param", "adam_m", "adam_v", "grad": the groups' names in
 * snapshots and messages. */
const char *mal_model_state_name(int g);

/* Local.  Copy the local shard of tensor t (a table entry of m) of state
 * group g into host memory `host` (t->n floats) / from it, through the
 * kernel table; waits for the copy.  For tests and tools that inspect or
 * set the state; 0 or the kernel's deferred error. */
int mal_model_state_to_host(const mal_model *m, int g, const mal_tensor_info *t, float *host);
int mal_model_state_from_host(mal_model *m, int g, const mal_tensor_info *t, const float *host);

/* Local.  1 when a part on `k` keeps working weights apart from the
 * master parameters (a compute dtype other than fp32). */
int mal_model_separate_work(mal_kern k);

/* Local.  Bring the working weights up to date with the master parameters
 * (nothing when they are the same memory). */
void mal_model_refresh_working(mal_model *m);

/* Local.  (Re)initialise parameters: element i (global row-major index) of a
 * tensor is normal(0, std) drawn from (seed, hash of the tensor's global
 * name, i), so every rank of every plan initialises its shard to exactly the
 * values one process would. */
int mal_model_init_params(mal_model *m, uint64_t seed);

/* Local.  Bytes that mal_model_create of this part (fp32 parameters,
 * gradients and Adam moments, working weights, backward scratch) and
 * `n_acts` activation sets of micro-batch max_B (mal_acts_create) take on
 * backend k under recompute mode `recompute` (mal_recompute; the shared
 * one-layer buffer included, mal_model_set_recompute), computed without
 * allocating them: a caller can refuse a model that cannot fit before
 * trying.  Every size is checked: MAL_EINVAL with a message when one
 * overflows (the model cannot exist), or when the part does not fit the
 * config or the mode is not one. */
int mal_model_bytes(const mal_model_config *cfg, const mal_model_part *part, int max_B, mal_kern k,
                    int n_acts, int recompute, size_t *bytes);

/* Local.  Set how the part keeps activations for its backward pass
 * (mal_recompute: NONE keeps every array the backward reads; SELECTIVE
 * drops the two RMSNorms' outputs and their rstd and the SwiGLU product,
 * recomputed from the kept residual, mid-layer residual and gate/up
 * products before each layer's backward; FULL keeps only each layer's
 * input, the residual stream, and runs the layer's forward again, TP
 * all-reduces included, before its backward).  The losses and gradients
 * are bitwise those of NONE (the same kernels on the same inputs).
 * (Re)allocates the model's shared one-layer buffer (attributed to
 * MAL_MEM_ACTIVATIONS), so call it before mal_acts_create: activation sets
 * keep the mode they were made with and a pass refuses a set whose mode
 * differs from the model's.  MAL_EINVAL for an unknown mode, MAL_ENOMEM. */
int mal_model_set_recompute(mal_model *m, int mode);

/* Local.  Bytes of one transformer layer's activations for micro-batches
 * of B sequences on this part under recompute mode `mode`: the return
 * value is what a mal_acts keeps per layer until that layer's backward
 * (its residual input included), *shared (may be NULL) the model's shared
 * one-layer buffer for that mode (at max_B, once per model).  The
 * planner-facing breakdown: a stage of L layers keeping n micro-batches in
 * flight holds n * (L * kept + the head's) + shared.  SIZE_MAX when a
 * size overflows or the mode is not one. */
size_t mal_acts_layer_bytes(const mal_model *m, int B, int mode, size_t *shared);

/* Local.  The tensor table of a part without allocating anything else
 * (for planning, resharding, ownership); caller frees *tensors. */
int mal_model_layout(const mal_model_config *cfg, const mal_model_part *part,
                     mal_tensor_info **tensors, int *n_tensors, size_t *n_params);

/* Local.  Look up a tensor by global name; NULL if this part lacks it. */
const mal_tensor_info *mal_model_find(const mal_model *m, const char *name);

/* Activations of one micro-batch in flight (device buffers; void * ones
 * in the compute dtype, float * ones fp32). */
typedef struct mal_acts {
    int B, T;
    int recompute;         /* the model's mode when made: the arrays it drops
                            * are NULL per layer (mal_model_set_recompute) */
    int *tokens, *targets; /* (N) */
    void **res;            /* [n_local_layers+1] (N,C): residual stream entering each layer; last = output */
    /* per layer; an array the recompute mode drops is NULL (its values
     * live in the model's shared one-layer buffer while needed) */
    void **h1, **q, **k, **v, **ao, **mid, **h2, **g, **u, **s; /* k, v: (N,Kl*hd) */
    void **att;            /* what attention keeps for its backward (kernels.h) */
    float **rstd1, **rstd2; /* (N) */
    void *hf;              /* final norm (N,C) */
    float *rstdf;          /* (N) */
    void *logits;          /* (N,Vl); overwritten by dlogits when training */
    float *losses;         /* (N) */
    void *block;           /* the single allocation behind all of the above */
} mal_acts;

/* Local.  Activations for micro-batches of B sequences of the model's T. */
int mal_acts_create(mal_acts **out, const mal_model *m, int B);
void mal_acts_destroy(const mal_model *m, mal_acts *a);

/* Local.  Copy a batch's tokens and targets (host, B*T int32 each) in; the
 * host arrays may be reused when it returns. */
void mal_acts_set_batch(const mal_model *m, mal_acts *a, const int *inputs, const int *targets);

/* Local (collective over the TP group when tp_size > 1).  Forward pass of
 * the part on one micro-batch.  If the part has no embedding, `inp` (N,C)
 * is the activation received from the previous stage (copied in, unless it
 * already is a->res[0]).  If it has
 * the head, the per-token losses end in a->losses and, when dloss_scale != 0,
 * a->logits is overwritten by dL/dlogits for L = dloss_scale * sum(losses)
 * (fused, so that backward can follow).  The output activation of a part
 * without head is a->res[n_local_layers]. */
int mal_model_forward(mal_model *m, mal_acts *a, const void *inp, float dloss_scale);

/* Local (collective over the TP group when tp_size > 1).  Backward pass;
 * accumulates parameter gradients into m->grads.  For a part without head,
 * `dout` (N,C) is the gradient of its output.  For a part without
 * embedding, *dinp receives a model-owned (N,C) buffer holding the gradient
 * of its input, valid until the next backward. */
int mal_model_backward(mal_model *m, mal_acts *a, const void *dout, void **dinp);

/* Local.  Sum of a->losses (double, synchronises). */
double mal_acts_loss_sum(const mal_model *m, const mal_acts *a);

/* Local (collective over the TP group when tp_size > 1).  Row `row` of the
 * logits of the last forward pass of a head part, all V of them (gathered
 * from the group's vocabulary shards), as fp32 into host memory `host`
 * (V floats); synchronises. */
int mal_model_logits_row(mal_model *m, const mal_acts *a, int row, float *host);

/* Local.  Zero all gradients. */
void mal_model_zero_grad(mal_model *m);

/* Bytes of activations one micro-batch of B sequences needs on this part
 * under the model's recompute mode (compute dtype, fp32 statistics, int32
 * tokens; not the shared one-layer buffer); SIZE_MAX when the sizes
 * overflow. */
size_t mal_acts_bytes(const mal_model *m, int B);

#endif /* MAL_MODEL_H */
