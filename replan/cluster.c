/* Planner input: the cluster description -- a regular layout (world size,
 * ranks per node) or an explicit list of every node's ranks, and the device
 * memory of a rank (schema in replan/README.md, "Cluster"). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"
#include "replan.h"

void mal_cluster_fini(mal_cluster *c)
{
    if (!c) return;
    free(c->node_of);
    memset(c, 0, sizeof *c);
}

int mal_cluster_regular(mal_cluster *c, int world_size, int ranks_per_node, double memory_mb)
{
    memset(c, 0, sizeof *c);
    if (world_size < 1 || world_size > MAL_REPLAN_MAX_WORLD)
        return MAL_ERR(MAL_EINVAL, "cluster: world_size must be 1..%d (got %d)",
                       MAL_REPLAN_MAX_WORLD, world_size);
    if (ranks_per_node < 1)
        return MAL_ERR(MAL_EINVAL, "cluster: ranks_per_node must be >= 1 (got %d)", ranks_per_node);
    if (world_size % ranks_per_node)
        return MAL_ERR(MAL_EINVAL,
                       "cluster: world_size %d is not divisible into nodes of %d ranks "
                       "(ranks_per_node must divide world_size)",
                       world_size, ranks_per_node);
    if (!(memory_mb > 0) || !isfinite(memory_mb))
        return MAL_ERR(MAL_EINVAL, "cluster: memory_mb must be a positive number");
    c->node_of = malloc((size_t)world_size * sizeof *c->node_of);
    if (!c->node_of) return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
    for (int r = 0; r < world_size; r++)
        c->node_of[r] = r / ranks_per_node;
    c->world_size = world_size;
    c->n_nodes = world_size / ranks_per_node;
    c->memory_mb = memory_mb;
    return 0;
}

static int cluster_from_json(mal_cluster *c, json_t *root, const char *what)
{
    static const char *const keys[] = {"world_size", "ranks_per_node", "nodes", "memory_mb", NULL};
    const char *key;
    json_t *val;
    if (!json_is_object(root))
        return MAL_ERR(MAL_EFORMAT, "%s: the cluster must be a JSON object", what);
    json_object_foreach(root, key, val)
    {
        int ok = 0;
        for (int i = 0; keys[i]; i++)
            ok |= !strcmp(key, keys[i]);
        if (!ok) return MAL_ERR(MAL_EFORMAT, "%s: unknown key \"%s\" in the cluster", what, key);
    }
    json_t *mem = json_object_get(root, "memory_mb");
    if (!json_is_number(mem) || !(json_number_value(mem) > 0))
        return MAL_ERR(MAL_EINVAL,
                       "%s: memory_mb (device memory per rank, MB) must be a positive number",
                       what);
    double memory_mb = json_number_value(mem);
    json_t *ws = json_object_get(root, "world_size");
    json_t *rpn = json_object_get(root, "ranks_per_node");
    json_t *nodes = json_object_get(root, "nodes");
    if (nodes) {
        /* two descriptions of one cluster: whichever were used, the other
         * would be silently ignored or could disagree */
        if (ws || rpn)
            return MAL_ERR(MAL_EINVAL,
                           "%s: give either \"nodes\" or \"world_size\" with \"ranks_per_node\", "
                           "not both (\"nodes\" lists every rank, so the world size is implied)",
                           what);
        if (!json_is_array(nodes) || json_array_size(nodes) == 0)
            return MAL_ERR(MAL_EFORMAT, "%s: nodes must be a non-empty array of rank lists", what);
        size_t world_z = 0;
        for (size_t n = 0; n < json_array_size(nodes); n++) {
            json_t *nl = json_array_get(nodes, n);
            if (!json_is_array(nl) || json_array_size(nl) == 0)
                return MAL_ERR(MAL_EFORMAT, "%s: nodes[%zu] must be a non-empty array of ranks",
                               what, n);
            world_z += json_array_size(nl);
        }
        if (world_z > MAL_REPLAN_MAX_WORLD)
            return MAL_ERR(MAL_EINVAL, "%s: nodes list %zu ranks; the planner handles up to %d",
                           what, world_z, MAL_REPLAN_MAX_WORLD);
        int world = (int)world_z;
        c->node_of = malloc((size_t)world * sizeof *c->node_of);
        if (!c->node_of) return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
        for (int r = 0; r < world; r++)
            c->node_of[r] = -1;
        c->world_size = world;
        c->n_nodes = (int)json_array_size(nodes);
        c->memory_mb = memory_mb;
        for (size_t n = 0; n < json_array_size(nodes); n++) {
            json_t *nl = json_array_get(nodes, n);
            for (size_t i = 0; i < json_array_size(nl); i++) {
                json_t *rv = json_array_get(nl, i);
                if (!json_is_integer(rv))
                    return MAL_ERR(MAL_EFORMAT, "%s: nodes[%zu][%zu] must be a rank number", what,
                                   n, i);
                json_int_t r = json_integer_value(rv);
                if (r < 0 || r >= world)
                    return MAL_ERR(
                        MAL_EINVAL,
                        "%s: nodes[%zu]: rank %lld is unknown (the %d listed ranks must be "
                        "0..%d)",
                        what, n, (long long)r, world, world - 1);
                if (c->node_of[r] >= 0)
                    return MAL_ERR(MAL_EINVAL, "%s: nodes[%zu]: rank %lld is listed twice", what, n,
                                   (long long)r);
                c->node_of[r] = (int)n;
            }
        }
        return 0;
    }
    if (!json_is_integer(ws) || !json_is_integer(rpn))
        return MAL_ERR(MAL_EFORMAT, "%s: give world_size and ranks_per_node (integers), or nodes",
                       what);
    /* range-check before narrowing to int, so that 2^31 is not read as -2^31 */
    json_int_t w = json_integer_value(ws), g = json_integer_value(rpn);
    if (w < 1 || w > MAL_REPLAN_MAX_WORLD)
        return MAL_ERR(MAL_EINVAL, "%s: world_size must be 1..%d (got %lld)", what,
                       MAL_REPLAN_MAX_WORLD, (long long)w);
    if (g < 1 || g > w)
        return MAL_ERR(MAL_EINVAL, "%s: ranks_per_node must be 1..world_size (%lld) (got %lld)",
                       what, (long long)w, (long long)g);
    return mal_cluster_regular(c, (int)w, (int)g, memory_mb);
}

int mal_cluster_parse_buffer(mal_cluster *c, const char *buf, size_t len, const char *what)
{
    memset(c, 0, sizeof *c);
    json_t *root;
    int rc = mal_json_parse(buf, len, what, &root);
    if (rc) return rc;
    rc = cluster_from_json(c, root, what);
    json_decref(root);
    return rc;
}

int mal_cluster_parse_string(mal_cluster *c, const char *json, const char *what)
{
    return mal_cluster_parse_buffer(c, json, strlen(json), what);
}

int mal_cluster_read(mal_cluster *c, const char *path)
{
    memset(c, 0, sizeof *c);
    json_t *root;
    int rc = mal_json_read(path, "cluster", MAL_REPLAN_MAX_INPUT_BYTES, MAL_READ_REGULAR, &root);
    if (rc) return rc;
    rc = cluster_from_json(c, root, path);
    json_decref(root);
    return rc;
}
