/* libFuzzer harness: the model config parser (src/config.c,
 * mal_config_parse_buffer: JSON, known fields, bounds) on arbitrary bytes;
 * for a config it accepts, the model's size arithmetic (mal_model_bytes,
 * which must answer or refuse, never wrap) and the JSON round trip. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/mal.h"
#include "kernels/kernels.h"
#include "src/config.h"
#include "src/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static mal_kern k;
    if (!k) {
        mal_kern_config kc = mal_kern_config_default();
        if (mal_kern_create("cpu", &kc, &k)) abort();
    }
    mal_model_config cfg, back;
    if (mal_config_parse_buffer(&cfg, (const char *)data, size, "fuzz")) return 0;
    (void)mal_config_n_params(&cfg);
    size_t bytes;
    mal_model_part one = {0, 1, 1, 1, 1, 0};
    (void)mal_model_bytes(&cfg, &one, 1, k, 1, MAL_RECOMPUTE_NONE, &bytes);
    if (cfg.n_layers <= 64) {
        mal_model_part full = mal_model_part_full(&cfg);
        (void)mal_model_bytes(&cfg, &full, 4, k, 2, MAL_RECOMPUTE_FULL, &bytes);
    }
    /* What was accepted is written and read back as the same model. */
    char *json = mal_config_to_json(&cfg);
    if (!json) abort();
    if (mal_config_from_json(&back, json, "round trip") || !mal_config_equal(&cfg, &back)) abort();
    free(json);
    return 0;
}
