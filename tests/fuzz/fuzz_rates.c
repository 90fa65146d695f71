/* libFuzzer harness: the straggling-rate parser (replan/,
 * mal_rates_parse_buffer: a {"rank": rate} map or malleus-train metrics
 * lines).  The first byte picks the world size (1..64), the second the
 * window (1..4), the rest is the file.  Accepted rates are finite and
 * positive. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "replan/replan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int world = 1 + data[0] % 64, window = 1 + data[1] % 4;
    double rates[64];
    if (mal_rates_parse_buffer((const char *)data + 2, size - 2, "fuzz", world, window, rates))
        return 0;
    for (int r = 0; r < world; r++)
        if (!(rates[r] > 0) || !isfinite(rates[r])) abort();
    return 0;
}
