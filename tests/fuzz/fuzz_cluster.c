/* libFuzzer harness: the cluster file parser (replan/,
 * mal_cluster_parse_buffer: world_size, ranks_per_node or nodes,
 * memory_mb) on arbitrary bytes; what it accepts must describe every rank
 * on a node. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "replan/replan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mal_cluster c;
    if (!mal_cluster_parse_buffer(&c, (const char *)data, size, "fuzz")) {
        if (c.world_size < 1 || c.n_nodes < 1 || !c.node_of || !(c.memory_mb > 0)) abort();
        for (int r = 0; r < c.world_size; r++)
            if (c.node_of[r] < 0 || c.node_of[r] >= c.n_nodes) abort();
    }
    mal_cluster_fini(&c);
    return 0;
}
