/* libFuzzer harness: the planner's model profile parser (replan/,
 * mal_profile_parse_buffer: a preset with overrides or a measured profile)
 * on arbitrary bytes; for a profile it accepts, the cost model's lookups. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "replan/replan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mal_profile p;
    if (!mal_profile_parse_buffer(&p, (const char *)data, size, "fuzz", 1)) {
        for (int d = 0; d < 2 * p.n_layers + 2 && d < 256; d++)
            if (isnan(mal_profile_k(&p, d))) abort();
        for (int t = 1; t <= 1 << MAL_REPLAN_MAX_TP_LOG; t *= 2)
            if (isnan(mal_profile_alpha(&p, t))) abort();
    }
    mal_profile_fini(&p);
    return 0;
}
