/* Starting a run from pretrained weights (init_from.c): malleus-train
 * --init-from SNAPSHOT|HF_DIR, the fine-tuning path.  The run is a new
 * run -- step 0, fresh Adam moments (zero), its own schedule, batch,
 * data and plan -- whose parameters are read from the source instead of
 * drawn at random; --resume, which continues a run, is the other path,
 * and the two together are refused.
 *
 * The source is a snapshot (any plan, any step; a weights-only import,
 * ckpt/import.h, or a training run's, whose optimizer state is not read)
 * or a Hugging Face checkpoint directory, read on the fly through
 * ckpt/hf.h: every rank reads the blocks of its own part, a tensor at a
 * time (one local tensor on the host plus the reader's 8 MiB chunk), so no
 * temporary snapshot is written -- a 7B checkpoint would need 27 GB of
 * disk for one, and every rank would read all of it back -- and the same
 * code reads it as malleus-import does, so the two paths give the same
 * parameters bit for bit.
 *
 * The source is recorded in the run's settings (every snapshot's
 * train_json, "init_from": its path and identity: the files' sizes and
 * fingerprints, the snapshot's step and where that snapshot came from), and
 * a --resume of the fine-tuning run carries the record on (resume.c).
 * Not installed. */
#ifndef MAL_TRAIN_INIT_FROM_H
#define MAL_TRAIN_INIT_FROM_H

#include <stddef.h>

#include "src/config.h"

struct mal_trainer;

/* What --init-from names. */
typedef struct {
    int is_hf;              /* 1: a Hugging Face checkpoint directory (it holds
                             * config.json); 0: a snapshot */
    char path[4096];        /* the directory, or the snapshot's step directory */
    mal_model_config model; /* its model (for a checkpoint, seq_len as given) */
} mal_init_source;

/* Local.  Read the source `src` names: its kind, path and model config
 * (a Hugging Face config.json with `seq_len` as the sequence length, 0:
 * its max_position_embeddings; a snapshot's stored config).  Refuses
 * like malleus-import (a config Malleus cannot represent) and like a
 * resume (a snapshot missing, uncommitted or without a config). */
int mal_init_source_read(const char *src, int seq_len, mal_init_source *s);

/* Local.  The run's model against the source's: the fields that shape a
 * tensor (vocab, d_model, n_layers, n_heads, n_kv_heads, ffn_hidden,
 * tie_embeddings) must be equal -- MAL_EMISMATCH naming the first that is
 * not, with both values; the others (seq_len, rope_theta, rope_scaling,
 * norm_eps) are the run's to choose, and those that differ are listed in
 * `notes` (`len` bytes, "" when none). */
int mal_init_source_check_model(const mal_init_source *s, const mal_model_config *run, char *notes,
                                size_t len);

/* Collective over the world; every rank returns the same code.  Read this
 * rank's part of the parameters from tr->o.init_from (the Adam moments
 * stay zero, the step 0) and record the source in the run's settings. */
int mal_train_init_from(struct mal_trainer *tr);

#endif /* MAL_TRAIN_INIT_FROM_H */
