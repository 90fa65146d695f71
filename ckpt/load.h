/* Reading a model part's state from a snapshot, whatever plan wrote it:
 * the trainer's resume (train/ckpt.c) reads the parameters and both
 * Adam moments of its part; malleus-sample reads the parameters of a whole
 * model on one process. */
#ifndef MAL_LOAD_H
#define MAL_LOAD_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "snapshot.h"
#include "src/model.h"

/* Local.  Read m's local shard of every tensor of the state groups
 * 0 .. n_groups-1 (MAL_STATE_PARAM, then the Adam moments; n_groups at
 * most MAL_STATE_N_SAVED) from s into the model's fp32 state through the
 * kernel table (the working weights follow the parameters).  Every stored block it
 * touches is verified (MAL_ECORRUPT).  Memory: one local tensor on the
 * host and the reader's chunk. */
int mal_load_state(mal_snapshot *s, mal_model *m, int n_groups);

/* Local.  The same from any reader of blocks (snapshot.h: a snapshot, or a
 * Hugging Face checkpoint's parameters, ckpt/hf.h, with n_groups 1). */
int mal_load_state_from(mal_snap_read_fn read, void *ctx, mal_model *m, int n_groups);

/* Local.  Open the committed snapshot at `path` (a directory with `latest`
 * or a step directory) and build the whole model of its config on this
 * process (TP 1, micro-batches of up to max_B, kernel instance k, which
 * must outlive the model) holding its parameters (no Adam moments are
 * read).  *out is the caller's (mal_model_destroy); *step (may be NULL)
 * receives the snapshot's step.  Refuses like a resume: MAL_ENOENT,
 * MAL_ECORRUPT, MAL_EFORMAT (no valid model config), MAL_EMISMATCH (its
 * tensors are not those of the model). */
int mal_load_model(const char *path, mal_kern k, int max_B, mal_model **out, int64_t *step);

#endif /* MAL_LOAD_H */
