/* Export of a snapshot's parameters to the Hugging Face `LlamaForCausalLM`
 * format: OUT_DIR/config.json and OUT_DIR/model.safetensors, loadable by
 * transformers' LlamaForCausalLM.from_pretrained(OUT_DIR) with every key
 * matched.  malleus-export (cmd/export_main.c) is a thin shell over this.
 *
 * The snapshot is read through its index like malleus-reshard reads it (any
 * plan, any world size, blocks verified against their CRC-32C), so one
 * written by any run exports alike; only the parameters are exported, never
 * the Adam moments.
 *
 * Tensor names and conventions (Malleus -> Hugging Face; every matrix is
 * stored [out, in] in both):
 *   tok_embedding      -> model.embed_tokens.weight
 *   layers.N.attn_norm -> model.layers.N.input_layernorm.weight
 *   layers.N.wq, wk    -> model.layers.N.self_attn.{q,k}_proj.weight, rows
 *                         permuted (below)
 *   layers.N.wv, wo    -> model.layers.N.self_attn.{v,o}_proj.weight
 *   layers.N.mlp_norm  -> model.layers.N.post_attention_layernorm.weight
 *   layers.N.w1, w3, w2-> model.layers.N.mlp.{gate,up,down}_proj.weight
 *   final_norm         -> model.norm.weight
 *   lm_head            -> lm_head.weight (untied: tie_word_embeddings false)
 *
 * Rotary embedding: Malleus rotates interleaved pairs (2i, 2i+1) of each
 * head (the original LLaMA code); Hugging Face's LLaMA rotates (i, i+hd/2)
 * ("rotate_half").  Within every head of the q and k projections, output
 * row 2i + s (s = 0, 1) of Malleus becomes row s*hd/2 + i of the export, so
 * the Hugging Face model computes the same attention scores (q.k is
 * unchanged when both are permuted alike, and the rotation pairs line up).
 *
 * model.safetensors: 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__": {...}, name: {"dtype", "shape", "data_offsets"}, ...},
 * padded with spaces to a multiple of 8), then the raw little-endian tensor
 * bytes back to back in header order.  dtype F32, or BF16 rounded to
 * nearest, ties to even (NaN stays NaN).
 *
 * Memory: one buffer of mem_bytes (rows of one tensor at a time; grown to
 * one head's rows of a q/k projection or one row if those are larger),
 * one head's rows of scratch for the permutation, the snapshot reader's
 * chunk (MAL_SNAP_READ_CHUNK_BYTES) and its block table: never the model.
 */
#ifndef MAL_EXPORT_H
#define MAL_EXPORT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/fileio.h"

#define MAL_EXPORT_MEM_DEFAULT ((size_t)64 << 20)

enum { MAL_EXPORT_F32 = 0, MAL_EXPORT_BF16 = 1 };

typedef struct {
    const char *snapshot; /* a snapshot directory (its `latest` is used) or a step directory */
    const char *out_dir;  /* created if needed; config.json and model.safetensors go there */
    int dtype;            /* MAL_EXPORT_F32 or MAL_EXPORT_BF16 */
    size_t mem_bytes;     /* row buffer; 0: MAL_EXPORT_MEM_DEFAULT */
    const char *tokenizer; /* a tokenizer.json (or its directory) to copy next to the model;
                            * NULL: the one the training data named, if any (export_tok.h) */
    int no_tokenizer;      /* copy no tokenizer */
} mal_export_options;

typedef struct {
    int64_t step;           /* the snapshot's step */
    int n_tensors;          /* tensors written */
    uint64_t bytes_read;    /* tensor data read from the snapshot's shard files */
    uint64_t bytes_written; /* model.safetensors, header included */
    double seconds;
    char step_dir[4096];    /* the step directory that was read */
} mal_export_stats;

/* Local.  Write the Hugging Face checkpoint of the snapshot o->snapshot into
 * o->out_dir as described above.  Each output file is written under a
 * temporary name in out_dir, fsync'ed and renamed (model.safetensors first,
 * config.json last), so a failure leaves no partial file under either name;
 * an existing target that is not a regular file (a device, a FIFO) is
 * written directly instead.  Refuses, before writing anything: a missing
 * snapshot (MAL_ENOENT), one never committed or failing its index checks
 * (MAL_ECORRUPT), one without a valid model config (MAL_EFORMAT), one whose
 * parameter tensors are not those of its model (MAL_EMISMATCH), a bad dtype
 * (MAL_EINVAL).  A block failing its CRC-32C while streaming fails with
 * MAL_ECORRUPT (naming the file and tensor) and leaves nothing behind.
 * *st (may be NULL) is filled on success. */
int mal_export_hf(const mal_export_options *o, mal_export_stats *st);

/* Local, pure.  The Hugging Face name of Malleus tensor `name` into out
 * (`len` bytes), and whether its rows are permuted (q and k).  MAL_EINVAL
 * for a name the exporter does not know. */
int mal_export_hf_name(const char *name, char *out, size_t len, int *permute);

/* Local.  Begin a safetensors file on `f`: the 8-byte little-endian length
 * N, then N bytes of `header` as compact JSON in insertion order, padded
 * with spaces to a multiple of 8 (so the data that follows is aligned).
 * `header` stays the caller's.  *bytes (may be NULL) receives 8 + N.
 * MAL_ENOMEM, or mal_output_write's error. */
int mal_export_safetensors_header(mal_output *f, const json_t *header, size_t *bytes);

#endif /* MAL_EXPORT_H */
