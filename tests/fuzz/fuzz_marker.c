/* libFuzzer harness: the snapshot COMPLETE marker parser (ckpt/,
 * mal_snapshot_parse_marker: format, version, counts in range) on
 * arbitrary bytes; what it accepts must be in the promised ranges. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "ckpt/snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mal_snap_marker m;
    if (mal_snapshot_parse_marker((const char *)data, size, "fuzz", &m)) return 0;
    if (m.step < 0 || m.n_tensors < 0 || m.n_blocks < 0 || m.n_shards < 0 ||
        m.n_tensors > INT_MAX || m.n_shards > INT_MAX || m.index_bytes < 0 ||
        (uint64_t)m.index_bytes > MAL_SNAP_MAX_INDEX_BYTES)
        abort();
    return 0;
}
