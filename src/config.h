/* Model configuration: the shape of a LLaMA-style decoder-only transformer,
 * from a named preset or a JSON file, and its JSON form (stored in snapshots
 * so that a resume can check it trains the same model). */
#ifndef MAL_CONFIG_H
#define MAL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char name[64];   /* preset name or file name, informational */
    int vocab;       /* vocabulary size V */
    int d_model;     /* hidden size C */
    int n_layers;    /* transformer layers L */
    int n_heads;     /* attention heads H (head dim = d_model / n_heads) */
    int ffn_hidden;  /* SwiGLU hidden size F */
    int seq_len;     /* sequence length T */
    float rope_theta;
    float norm_eps;
} mal_model_config;

/* Local.  Fill `cfg` from a preset name ("tiny", "small", "124m", "1b",
 * "32b", "70b", "110b") or, if `spec` names no preset, from a JSON file at that path.
 * Validates the result (mal_config_validate).  Errors: MAL_ENOENT (neither a
 * preset nor a readable file), MAL_EFORMAT (bad JSON, missing or mistyped
 * field, unknown field), MAL_EINVAL (inconsistent values). */
int mal_config_load(mal_model_config *cfg, const char *spec);

/* Local.  1 when mal_config_load reads `spec` as a preset name (not a file). */
int mal_config_is_preset(const char *spec);

/* Local.  Parse from JSON text; `what` names the source in messages. */
int mal_config_from_json(mal_model_config *cfg, const char *json, const char *what);
/* The same on `len` bytes that need no terminating NUL (a NUL inside is
 * MAL_EFORMAT): the parser every config goes through, and the fuzzing entry
 * (tests/fuzz/fuzz_config.c). */
int mal_config_parse_buffer(mal_model_config *cfg, const char *buf, size_t len, const char *what);

/* Largest model config file read (a config is a few hundred bytes). */
#define MAL_CONFIG_MAX_FILE_BYTES (1 << 20)

/* Upper bounds of the sizes.  Far above any model trained today (LLaMA 3
 * 405B: d_model 16384, ffn_hidden 53248, 126 layers), and small enough that
 * no size the model derives from them can overflow 64 bits: the largest
 * tensor (d_model x ffn_hidden) has 2^37 elements, a whole model under
 * 2^56 bytes.  Whether a model that passes them fits a machine is a separate
 * check (mal_model_bytes, and malleus-train's memory check). */
#define MAL_CONFIG_MAX_VOCAB 65536        /* tokens are uint16 */
#define MAL_CONFIG_MAX_D_MODEL 131072     /* 2^17 */
#define MAL_CONFIG_MAX_LAYERS 65536       /* 2^16 */
#define MAL_CONFIG_MAX_FFN 1048576        /* 2^20 */
#define MAL_CONFIG_MAX_SEQ_LEN 1048576    /* 2^20 */

/* Local.  Check the values make a model (sizes in [1, the bounds above],
 * d_model divisible by n_heads, even head dim, ...).  The message names the
 * field. */
int mal_config_validate(const mal_model_config *cfg);

/* Local.  JSON text of the config; caller frees with free().  NULL on OOM. */
char *mal_config_to_json(const mal_model_config *cfg);

/* Local.  1 if the two configs describe the same model (name ignored). */
int mal_config_equal(const mal_model_config *a, const mal_model_config *b);

/* Local.  Parameter count of the full model. */
int64_t mal_config_n_params(const mal_model_config *cfg);

/* Names of the presets, NULL-terminated (for --help). */
extern const char *const mal_config_presets[];

#endif /* MAL_CONFIG_H */
