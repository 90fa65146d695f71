/* Import of a Hugging Face LlamaForCausalLM checkpoint as a Malleus
 * snapshot (malleus-import, cmd/import_main.c, is a thin shell over this):
 * the checkpoint is read through hf.h (config.json, model.safetensors or a
 * sharded checkpoint, F32/F16/BF16, q/k rows permuted back to Malleus's
 * interleaved rotary pairs) and written through the snapshot writer
 * (snapshot.h), so the result is a snapshot like any other to
 * malleus-reshard, malleus-export, malleus-sample and malleus-train
 * --init-from.
 *
 * A *weights-only* snapshot.  A checkpoint holds parameters, not an
 * optimizer's state, and a fine-tuning run starts its own (fresh Adam
 * moments, step 0, its own schedule and batch): the snapshot stores the
 * "param/" tensors only, step 0, and training settings
 * {"weights_only": true, "imported_from": IDENTITY} (mal_hf_identity:
 * the checkpoint's path and each file's size and fingerprint).  Writing
 * zero moments instead would triple the snapshot for nothing and make it
 * look like a run that --resume could continue; a weights-only snapshot
 * is refused by --resume, naming --init-from, and read by everything that
 * reads parameters (mal_snapshot_has_group(s, "adam_m") tells them
 * apart).
 *
 * Layout: as one process writes it (whole tensors in shard_00000.h5), or
 * with a plan the shards a run under that plan writes
 * (mal_reshard_rank_blocks), so that a run on that plan reads only its own
 * blocks.
 *
 * Memory: one buffer of mem_bytes (a bounded block of rows of one tensor
 * at a time; one row's piece when a row is larger), the reader's raw chunk
 * (MAL_HF_READ_CHUNK_BYTES) and the parsed headers and block tables: never
 * the model. */
#ifndef MAL_IMPORT_H
#define MAL_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "hf.h"
#include "src/plan.h"

#define MAL_IMPORT_MEM_DEFAULT_MIB 64

typedef struct {
    const char *src;      /* the Hugging Face checkpoint directory */
    const char *dst_dir;  /* the snapshot directory (created if needed; must hold no snapshot) */
    const mal_plan *plan; /* the shards of this plan (NULL: one process) */
    mal_hf_options hf;    /* seq_len, rounding */
    size_t mem_bytes;     /* row buffer; 0: MAL_IMPORT_MEM_DEFAULT_MIB MiB */
} mal_import_options;

typedef struct {
    int n_tensors, n_shards;
    uint64_t bytes_read, bytes_written;
    double seconds;
    char dtype[8];        /* the checkpoint's dtype */
    char unknown[512];    /* config.json's ignored fields ("" none) */
    mal_model_config cfg; /* the model imported */
    char out_path[4096];  /* the step directory written */
} mal_import_stats;

/* Local.  Import o->src into o->dst_dir as described above.  Refuses
 * before writing anything: what mal_hf_open refuses, a plan that does
 * not fit the model (MAL_EINVAL), a destination that holds snapshots
 * already or is in use (MAL_EINVAL, mal_snap_dest_open).  A failure while
 * streaming leaves nothing committed and no directory it created. *st
 * (may be NULL) is filled on success. */
int mal_import_hf(const mal_import_options *o, mal_import_stats *st);

/* What malleus-import's command line asks for (cmd/import_main.c fills it
 * from its option table). */
typedef struct {
    const char *src, *dst_dir; /* HF_DIR, OUT_SNAPSHOT */
    const char *plan_path;     /* --plan (NULL: one process) */
    int round;                 /* --dtype: MAL_HF_AS_STORED (fp32) or MAL_HF_ROUND_BF16 */
    int seq_len;               /* --seq-len (0: max_position_embeddings) */
    size_t mem_bytes;          /* --mem */
    int quiet;                 /* --quiet: errors only */
} mal_import_cli;

/* Local.  Run malleus-import as `cli` says: read the plan, import, print a
 * warning naming config.json's ignored fields and a summary line (stdout),
 * errors on stderr ("malleus-import: <message>").  Returns the exit
 * status: 0 done, 1 failure while writing, 2 bad input (a checkpoint or
 * plan refused, a destination in use or holding snapshots). */
int mal_import_cli_run(const mal_import_cli *cli);

#endif /* MAL_IMPORT_H */
