/* Reading a Hugging Face LlamaForCausalLM checkpoint directory as Malleus
 * tensors: config.json to a model config, and any block of any parameter
 * tensor read from model.safetensors or a sharded checkpoint
 * (model.safetensors.index.json and its files), converted to float32 with
 * the q/k rows permuted back to Malleus's rotary convention.  The inverse
 * of malleus-export (export.h: the tensor names and the permutation), and
 * what malleus-import (import.h) and malleus-train --init-from HF_DIR read
 * through.
 *
 * Everything is outside input (safetensors.h for the files).  Refused,
 * naming the field or tensor (MAL_EFORMAT for a malformed file,
 * MAL_EINVAL for a model Malleus cannot represent, MAL_EMISMATCH for
 * tensors that disagree with the config): an architecture other than
 * LlamaForCausalLM / model_type other than "llama"; hidden_act other
 * than "silu"; attention_bias or mlp_bias true, or any bias tensor; a
 * rope_scaling other than null or "llama3" (linear, dynamic, yarn, ...);
 * a head_dim other than hidden_size / num_attention_heads;
 * attention_dropout other than 0; a quantization_config; tied embeddings
 * with an lm_head.weight in the checkpoint, or untied without one; a
 * missing, extra or misshapen tensor; a dtype other than F32, F16, BF16.
 * Fields of config.json it does not know are named in a warning
 * (mal_hf_unknown_fields) and otherwise ignored: a checkpoint carries
 * many fields that do not change the model (token ids, generation
 * settings, versions).  Rotary inv_freq buffers some older checkpoints
 * carry are ignored.
 *
 * Memory: the parsed headers (at most the files' header bytes) and one
 * bounded buffer of MAL_HF_READ_CHUNK_BYTES for the raw bytes of a read,
 * besides the caller's float buffer; files are opened for each read and
 * read with pread, never mapped or read whole.  Every function is Local. */
#ifndef MAL_HF_H
#define MAL_HF_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot.h"
#include "src/config.h"

#define MAL_HF_READ_CHUNK_BYTES ((size_t)8 << 20)
/* The most bytes of config.json read. */
#define MAL_HF_MAX_CONFIG_BYTES ((size_t)1 << 20)

/* What the weights are rounded to as they are read. */
enum { MAL_HF_AS_STORED = 0, MAL_HF_ROUND_BF16 = 1 };

typedef struct {
    int seq_len; /* the model's seq_len (0: config.json's max_position_embeddings) */
    int round;   /* MAL_HF_AS_STORED (exact: F16 and BF16 are floats) or MAL_HF_ROUND_BF16
                  * (each weight rounded to bf16, nearest even) */
} mal_hf_options;

typedef struct mal_hf mal_hf;

/* Open the checkpoint directory `dir`: parse config.json into the model
 * config (name "hf:<basename>"), find model.safetensors (or else
 * model.safetensors.index.json and the files it names), parse every
 * header, and check that the tensors are exactly the model's (names,
 * shapes, dtypes).  Nothing of the tensor data is read.  *out is the
 * caller's until mal_hf_close.  MAL_ENOENT when dir holds no config.json
 * or no safetensors checkpoint (a pytorch_model.bin is named as not read);
 * the refusals above. */
int mal_hf_open(mal_hf **out, const char *dir, const mal_hf_options *o);
void mal_hf_close(mal_hf *h);

/* The model config; owned by h. */
const mal_model_config *mal_hf_config(const mal_hf *h);

/* Fields of config.json that were ignored because they are not known
 * (comma-separated; "" when none); owned by h. */
const char *mal_hf_unknown_fields(const mal_hf *h);

/* The dtype of the checkpoint's tensors ("BF16", "F32", "F16", or "mixed"). */
const char *mal_hf_dtype(const mal_hf *h);

/* Read the block `want` describes, with mal_snapshot_read_block's
 * contract: want->name "param/<Malleus tensor name>", ndim and the global
 * shape as the model has them, offset and extent any block inside it;
 * want->data gets prod(extent) floats.  MAL_ENOENT for a name the model
 * does not have or a state group other than "param" (a Hugging Face
 * checkpoint holds no optimizer state), MAL_EMISMATCH for another shape,
 * MAL_EINVAL for a block outside the tensor, MAL_EIO / MAL_ECORRUPT when
 * a file cannot be read or became shorter (naming it). */
int mal_hf_read_block(mal_hf *h, const mal_snap_tensor *want);

/* Bytes of tensor data read so far. */
uint64_t mal_hf_bytes_read(const mal_hf *h);

/* The checkpoint's identity as JSON text (caller frees): {"format":
 * "huggingface", "path": the directory (absolute), "dtype": ...,
 * "files": [{"path", "bytes", "fingerprint"}, ...]} for config.json, the
 * index when there is one and every safetensors file
 * (mal_file_fingerprint), so that a run started from it can say which
 * checkpoint it was.  MAL_EIO when a file cannot be read again. */
int mal_hf_identity(const mal_hf *h, char **json);

/* Parse the text of a config.json (`len` bytes) into a model config as
 * mal_hf_open does (with o->seq_len), every refusal above that concerns
 * the config.  `what` names it in messages; `unknown` (may be NULL,
 * `unknown_len` bytes) receives the ignored fields. */
int mal_hf_parse_config(const char *text, size_t len, const char *what, const mal_hf_options *o,
                        mal_model_config *cfg, char *unknown, size_t unknown_len);

#endif /* MAL_HF_H */
