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
    for (int t = 0; c->types && t < c->n_types; t++) {
        free(c->types[t].profile_src);
        if (c->types[t].profile) mal_profile_fini(c->types[t].profile);
        free(c->types[t].profile);
    }
    free(c->types);
    free(c->type_of);
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

double mal_cluster_rank_memory(const mal_cluster *c, int r)
{
    if (!c->type_of || r < 0 || r >= c->world_size) return c->memory_mb;
    return c->types[c->type_of[c->node_of[r]]].memory_mb;
}

int mal_cluster_rank_type(const mal_cluster *c, int r)
{
    if (!c->type_of || r < 0 || r >= c->world_size) return -1;
    return c->type_of[c->node_of[r]];
}

const mal_profile *mal_cluster_rank_profile(const mal_cluster *c, int r, const mal_profile *p)
{
    int t = mal_cluster_rank_type(c, r);
    return t >= 0 && c->types[t].profile ? c->types[t].profile : p;
}

double mal_cluster_rank_speed(const mal_cluster *c, int r)
{
    if (!c->type_of || r < 0 || r >= c->world_size) return 1.0;
    double top = 0;
    for (int t = 0; t < c->n_types; t++)
        top = MAL_MAX(top, c->types[t].speed);
    return c->types[c->type_of[c->node_of[r]]].speed / top;
}

void mal_cluster_effective_rates(const mal_cluster *c, const double *rates, double *out)
{
    for (int r = 0; r < c->world_size; r++)
        out[r] = c->type_of ? MAL_MAX(rates[r], 1.0 / mal_cluster_rank_speed(c, r)) : rates[r];
}

/* "types": {NAME: {"memory_mb", "speed" | "profile"}} and "node_types": [NAME per
 * node] (README "Mixed hardware"); memory_mb becomes the least of the
 * types in use. */
static int types_from_json(mal_cluster *c, json_t *types, json_t *nt, const char *what)
{
    if (!types && !nt) return 0;
    if (!json_is_object(types) || json_object_size(types) == 0 || !json_is_array(nt))
        return MAL_ERR(MAL_EFORMAT,
                       "%s: a mixed cluster gives both \"types\" ({NAME: {\"memory_mb\", "
                       "\"speed\"}}) and \"node_types\" (a type name per node)",
                       what);
    if ((int)json_array_size(nt) != c->n_nodes)
        return MAL_ERR(MAL_EINVAL, "%s: node_types names %zu types for %d nodes", what,
                       json_array_size(nt), c->n_nodes);
    if (json_object_size(types) > MAL_REPLAN_MAX_TYPES)
        return MAL_ERR(MAL_EINVAL, "%s: types: %zu device types; at most %d", what,
                       json_object_size(types), MAL_REPLAN_MAX_TYPES);
    c->n_types = (int)json_object_size(types);
    c->types = calloc((size_t)c->n_types, sizeof *c->types);
    c->type_of = calloc((size_t)c->n_nodes, sizeof *c->type_of);
    if (!c->types || !c->type_of) return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
    const char *key;
    json_t *val;
    int t = 0;
    json_object_foreach(types, key, val)
    {
        mal_device_type *d = &c->types[t++];
        if (strlen(key) >= sizeof d->name)
            return MAL_ERR(MAL_EINVAL,
                           "%s: types: the name \"%.40s...\" is too long (at most %zu "
                           "characters)",
                           what, key, sizeof d->name - 1);
        snprintf(d->name, sizeof d->name, "%s", key);
        json_t *m = json_is_object(val) ? json_object_get(val, "memory_mb") : NULL;
        json_t *sp = json_is_object(val) ? json_object_get(val, "speed") : NULL;
        json_t *pr = json_is_object(val) ? json_object_get(val, "profile") : NULL;
        const char *k2;
        json_t *v2;
        if (json_is_object(val)) {
            json_object_foreach(val, k2, v2)
            {
                if (strcmp(k2, "memory_mb") && strcmp(k2, "speed") && strcmp(k2, "profile"))
                    return MAL_ERR(MAL_EFORMAT,
                                   "%s: types.%s: unknown key \"%s\" (memory_mb, speed, profile)",
                                   what, key, k2);
            }
        }
        if (!json_is_number(m) || !(json_number_value(m) > 0) || !isfinite(json_number_value(m)))
            return MAL_ERR(MAL_EINVAL,
                           "%s: types.%s.memory_mb (device memory per rank, MB) must be a "
                           "positive number",
                           what, key);
        d->memory_mb = json_number_value(m);
        d->speed = 1.0;
        if (sp && (!json_is_number(sp) || !(json_number_value(sp) > 0) ||
                   !isfinite(json_number_value(sp))))
            return MAL_ERR(MAL_EINVAL,
                           "%s: types.%s.speed (compute speed relative to the profile's "
                           "device) must be a positive number",
                           what, key);
        if (sp) d->speed = json_number_value(sp);
        if (pr) {
            /* a profile's layer_time is its speed: two figures could disagree */
            if (sp)
                return MAL_ERR(MAL_EINVAL,
                               "%s: types.%s: give \"speed\" or \"profile\", not both (the "
                               "profile's layer_time is the type's speed)",
                               what, key);
            if (!json_is_string(pr) || !json_string_length(pr) || json_string_length(pr) > 4095)
                return MAL_ERR(MAL_EINVAL,
                               "%s: types.%s.profile must be a profile file or a preset name "
                               "(a non-empty string)",
                               what, key);
            d->profile_src = strdup(json_string_value(pr));
            if (!d->profile_src) return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
        }
    }
    for (int n = 0; n < c->n_nodes; n++) {
        json_t *v = json_array_get(nt, (size_t)n);
        c->type_of[n] = -1;
        for (int q = 0; json_is_string(v) && q < c->n_types; q++)
            if (!strcmp(c->types[q].name, json_string_value(v))) c->type_of[n] = q;
        if (c->type_of[n] < 0)
            return MAL_ERR(MAL_EINVAL, "%s: node_types[%d] names no type of \"types\"", what, n);
    }
    /* the least memory of the types in use: what the uniform plan (which
     * mixes types in its stages) is sized for; the search sizes each
     * stage for its own type */
    double least = INFINITY;
    for (int n = 0; n < c->n_nodes; n++)
        least = MAL_MIN(least, c->types[c->type_of[n]].memory_mb);
    c->memory_mb = least;
    return 0;
}

int mal_cluster_load_profiles(mal_cluster *c, const char *dir, const mal_profile *p, int mbs)
{
    int rc = 0, any = 0;
    char path[8192];
    for (int t = 0; t < c->n_types; t++) {
        mal_device_type *d = &c->types[t];
        if (!d->profile_src) continue;
        const char *src = d->profile_src;
        if (!(d->profile = calloc(1, sizeof *d->profile)))
            return MAL_ERR(MAL_ENOMEM, "cluster: out of memory");
        /* a file when it looks like one (as malleus-train --profile reads
         * it), relative to the cluster file; else a preset */
        if (strchr(src, '/') || strchr(src, '.')) {
            if (src[0] != '/' && dir && *dir)
                snprintf(path, sizeof path, "%s/%s", dir, src);
            else
                snprintf(path, sizeof path, "%s", src);
            rc = mal_profile_read(d->profile, path, mbs);
        } else {
            rc = mal_profile_preset(d->profile, src, mbs);
        }
        if (rc) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", mal_errmsg());
            return MAL_ERR(rc, "cluster: types.%s.profile \"%s\": %s", d->name, src, msg);
        }
        const mal_profile *q = d->profile;
        const char *field = q->n_layers != p->n_layers       ? "n_layers"
                            : q->tp != p->tp                 ? "tp"
                            : q->n_heads != p->n_heads       ? "n_heads"
                            : q->ffn_hidden != p->ffn_hidden ? "ffn_hidden"
                                                             : NULL;
        if (field)
            return MAL_ERR(MAL_EINVAL,
                           "cluster: types.%s.profile \"%s\" describes another model than "
                           "--profile/--model (its %s differs): every type runs the same model "
                           "at the same nominal TP size",
                           d->name, src, field);
        if (!(q->layer_time > 0) || mal_profile_alpha(q, q->tp) <= 0)
            return MAL_ERR(MAL_EINVAL,
                           "cluster: types.%s.profile \"%s\" needs a positive layer_time and an "
                           "alpha for the nominal TP size %d",
                           d->name, src, q->tp);
        d->profile->zero = p->zero;
        d->profile->zero_master = p->zero_master;
        d->speed = p->layer_time / q->layer_time;
        any = 1;
    }
    if (!any) return 0;
    /* times are in the fastest type's layer units, priced at --profile's
     * layer_time: so --profile must be that type's */
    int top = 0;
    for (int t = 1; t < c->n_types; t++)
        if (c->types[t].speed > c->types[top].speed) top = t;
    if (fabs(c->types[top].speed - 1.0) > 1e-9)
        return MAL_ERR(MAL_EINVAL,
                       "cluster: the fastest type, types.%s, runs at %g x --profile's "
                       "speed (layer_time %g s against %g s): give the fastest type's profile as "
                       "--profile/--model (times are priced at its layer_time)",
                       c->types[top].name, c->types[top].speed, p->layer_time / c->types[top].speed,
                       p->layer_time);
    return rc;
}

static int cluster_from_json(mal_cluster *c, json_t *root, const char *what)
{
    int rc;
    static const char *const keys[] = {"world_size", "ranks_per_node", "nodes", "memory_mb",
                                       "types",      "node_types",     NULL};
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
    json_t *types = json_object_get(root, "types"), *nt = json_object_get(root, "node_types");
    if (mem && types)
        return MAL_ERR(MAL_EINVAL,
                       "%s: a mixed cluster gives memory_mb per type (types.NAME.memory_mb), not "
                       "for the whole cluster as well",
                       what);
    /* a mixed cluster's memory comes from its types (types_from_json) */
    double memory_mb = types ? 1.0 : json_is_number(mem) ? json_number_value(mem) : 0;
    if (!(memory_mb > 0) || !isfinite(memory_mb))
        return MAL_ERR(MAL_EINVAL,
                       "%s: memory_mb (device memory per rank, MB) must be a positive number",
                       what);
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
        return types_from_json(c, types, nt, what);
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
    if ((rc = mal_cluster_regular(c, (int)w, (int)g, memory_mb))) return rc;
    return types_from_json(c, types, nt, what);
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
