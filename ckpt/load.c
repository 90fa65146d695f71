/* Reading a model part's state from a snapshot (load.h). */
#include "load.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/mal.h"
#include "src/config.h"

int mal_load_state(mal_snapshot *s, mal_model *m, int n_groups)
{
    return mal_load_state_from(mal_snapshot_read_fn, s, m, n_groups);
}

int mal_load_state_from(mal_snap_read_fn read, void *ctx, mal_model *m, int n_groups)
{
    if (n_groups < 1 || n_groups > MAL_STATE_N_SAVED)
        return MAL_ERR(MAL_EINVAL, "load: %d state groups", n_groups);
    size_t max_t = 0;
    for (int i = 0; i < m->n_tensors; i++)
        max_t = MAL_MAX(max_t, m->tensors[i].n);
    float *host = malloc((max_t + 1) * sizeof(float));
    if (!host) return MAL_ERR(MAL_ENOMEM, "load: out of memory");
    int rc = 0;
    for (int g = 0; g < n_groups && !rc; g++)
        for (int i = 0; i < m->n_tensors && !rc; i++) {
            const mal_tensor_info *t = &m->tensors[i];
            char name[96];
            snprintf(name, sizeof name, "%s/%s", mal_model_state_name(g), t->name);
            /* this part's shard: the TP split along the tensor's split
             * dimension, the rest whole */
            mal_snap_tensor want = {.name = name, .ndim = t->ndim, .data = host};
            for (int d = 0; d < t->ndim; d++) {
                want.shape[d] = t->shape[d];
                want.offset[d] = d == t->split_dim ? t->split_off : 0;
                want.extent[d] = t->local_shape[d];
            }
            if (!(rc = read(ctx, &want)))
                rc = mal_model_state_from_host(m, g, t, host);
        }
    free(host);
    return rc;
}

int mal_load_model(const char *path, mal_kern k, int max_B, mal_model **out, int64_t *step)
{
    char dir[4096];
    mal_snapshot *s = NULL;
    mal_model *m = NULL;
    mal_model_config cfg;
    int rc = mal_snapshot_resolve(path, dir, sizeof dir);
    if (!rc) rc = mal_snapshot_open(&s, dir);
    if (rc) return rc;
    const mal_snap_meta *meta = mal_snapshot_meta(s);
    if (!meta->config_json || mal_config_from_json(&cfg, meta->config_json, dir)) {
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s has no valid model config", dir);
        goto out;
    }
    mal_model_part full = mal_model_part_full(&cfg);
    if ((rc = mal_model_create_ex(&m, &cfg, &full, max_B, k, 0, 0))) goto out;
    if ((rc = mal_load_state(s, m, 1))) {
        if (rc == MAL_ENOENT || rc == MAL_EMISMATCH)
            rc = MAL_ERR(MAL_EMISMATCH, "snapshot %s does not hold the tensors of its model: %s",
                         dir, mal_errmsg());
        goto out;
    }
    if (step) *step = meta->step;
    *out = m;
    m = NULL;
out:
    mal_model_destroy(m);
    mal_snapshot_close(s);
    return rc;
}
