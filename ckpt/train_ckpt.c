/* Snapshots of the trainer's state: what is saved (parameters, Adam
 * moments, progress, the model config and training settings) and how a run
 * is restored from one. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "mal.h"
#include "snapshot.h"
#include "train_internal.h"

/* Training settings that define the loss curve; stored in snapshots. */
static char *train_json(const mal_train_options *o)
{
    json_t *j = json_pack("{s:I, s:i, s:i, s:f, s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "seed",
                          (json_int_t)o->seed, "global_batch", o->global_batch, "micro_batch",
                          o->micro_batch, "lr", (double)o->optim.lr, "min_lr_ratio",
                          (double)o->optim.min_lr_ratio, "warmup_steps", o->optim.warmup_steps,
                          "total_steps", o->optim.total_steps, "beta1", (double)o->optim.beta1,
                          "beta2", (double)o->optim.beta2, "eps", (double)o->optim.eps,
                          "weight_decay", (double)o->optim.weight_decay, "grad_clip",
                          (double)o->optim.grad_clip);
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(j);
    return s;
}

/* The snapshot tensors of the model: parameters and both Adam moments. */
static const char *const state_groups[] = {"param", "adam_m", "adam_v"};

static float *state_buffer(mal_model *m, int g)
{
    return g == 0 ? m->params : g == 1 ? m->adam_m : m->adam_v;
}

int mal_train_ckpt_restore(struct mal_trainer *tr)
{
    char path[4096];
    int rc = mal_snapshot_find_latest(tr->o.snapshot_dir, path, sizeof path);
    if (rc) return rc;
    mal_snapshot *s = NULL;
    if ((rc = mal_snapshot_open(&s, path))) return rc;
    const mal_snap_meta *meta = mal_snapshot_meta(s);
    mal_model *m = tr->model;
    float *host = NULL;
    json_t *tj = NULL;
    mal_model_config saved;
    if (!meta->config_json || (rc = mal_config_from_json(&saved, meta->config_json, path))) {
        if (!rc) rc = MAL_ERR(MAL_EFORMAT, "snapshot %s has no model config", path);
        goto out;
    }
    if (!mal_config_equal(&saved, &m->cfg)) {
        rc = MAL_ERR(MAL_EMISMATCH,
                     "snapshot %s was written for another model (%s: d_model %d, %d layers, vocab "
                     "%d) than the one requested (%s: d_model %d, %d layers, vocab %d)",
                     path, saved.name, saved.d_model, saved.n_layers, saved.vocab, m->cfg.name,
                     m->cfg.d_model, m->cfg.n_layers, m->cfg.vocab);
        goto out;
    }
    json_error_t jerr;
    tj = meta->train_json ? json_loads(meta->train_json, 0, &jerr) : NULL;
    if (!tj) {
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s: missing or malformed training settings", path);
        goto out;
    }
    json_int_t gb = json_integer_value(json_object_get(tj, "global_batch"));
    if (meta->seed != tr->o.seed || gb != tr->o.global_batch) {
        rc = MAL_ERR(MAL_EMISMATCH,
                     "snapshot %s was written with seed %llu and global batch %lld; this run asks "
                     "for seed %llu and global batch %d (they define the data order: pass the "
                     "snapshot's values)",
                     path, (unsigned long long)meta->seed, (long long)gb,
                     (unsigned long long)tr->o.seed, tr->o.global_batch);
        goto out;
    }
    host = malloc(m->n_params * sizeof(float));
    if (!host) {
        rc = MAL_ERR(MAL_ENOMEM, "resume: out of memory");
        goto out;
    }
    for (int g = 0; g < 3; g++) {
        memset(host, 0, m->n_params * sizeof(float));
        for (int i = 0; i < m->n_tensors; i++) {
            const mal_tensor_info *t = &m->tensors[i];
            char name[96];
            snprintf(name, sizeof name, "%s/%s", state_groups[g], t->name);
            if ((rc = mal_snapshot_read(s, name, t->ndim, t->shape, host + t->offset, t->n)))
                goto out;
        }
        m->k->from_host(state_buffer(m, g), host, m->n_params * sizeof(float));
    }
    if ((rc = mal_kern_sync(m->k))) goto out;
    tr->step = meta->step;
    tr->saved_step = meta->step;
    if (meta->consumed_samples != meta->step * (int64_t)tr->o.global_batch) {
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s: consumed samples %lld inconsistent with step %lld",
                     path, (long long)meta->consumed_samples, (long long)meta->step);
        goto out;
    }
    mal_log(MAL_LOG_INFO, "resumed from %s at step %lld (%lld samples consumed)", path,
            (long long)meta->step, (long long)meta->consumed_samples);
out:
    json_decref(tj);
    free(host);
    mal_snapshot_close(s);
    return rc;
}

int mal_train_ckpt_save(struct mal_trainer *tr)
{
    if (!tr->o.snapshot_dir) return MAL_ERR(MAL_EINVAL, "no --snapshot-dir to save into");
    mal_model *m = tr->model;
    int nt = 3 * m->n_tensors, rc = 0;
    mal_snap_tensor *ts = calloc((size_t)nt, sizeof *ts);
    char (*names)[96] = calloc((size_t)nt, sizeof *names);
    float *host = malloc(3 * m->n_params * sizeof(float));
    char *cfg = mal_config_to_json(&m->cfg), *trj = train_json(&tr->o);
    if (!ts || !names || !host || !cfg || !trj) {
        rc = MAL_ERR(MAL_ENOMEM, "snapshot: out of memory");
        goto out;
    }
    for (int g = 0; g < 3; g++) {
        float *h = host + (size_t)g * m->n_params;
        m->k->to_host(h, state_buffer(m, g), m->n_params * sizeof(float));
        for (int i = 0; i < m->n_tensors; i++) {
            const mal_tensor_info *t = &m->tensors[i];
            mal_snap_tensor *s = &ts[g * m->n_tensors + i];
            snprintf(names[g * m->n_tensors + i], sizeof names[0], "%s/%s", state_groups[g],
                     t->name);
            s->name = names[g * m->n_tensors + i];
            s->ndim = t->ndim;
            for (int d = 0; d < t->ndim; d++) {
                s->shape[d] = t->shape[d];
                s->offset[d] = (d == t->split_dim) ? t->split_off : 0;
                s->extent[d] = t->local_shape[d];
            }
            s->data = h + t->offset;
        }
    }
    if ((rc = mal_kern_sync(m->k))) goto out;
    mal_snap_meta meta = {tr->step, tr->step * (int64_t)tr->o.global_batch, tr->o.seed, 0, cfg,
                          trj, NULL};
    char path[4096];
    if ((rc = mal_snapshot_write(tr->o.snapshot_dir, &meta, ts, nt, tr->o.keep_snapshots, path,
                                 sizeof path)))
        goto out;
    tr->saved_step = tr->step;
    mal_log(MAL_LOG_INFO, "snapshot written: %s", path);
out:
    free(cfg);
    free(trj);
    free(host);
    free(names);
    free(ts);
    return rc;
}

