/* The trainer's snapshot glue (trainer layer; the snapshot files are
 * ckpt/'s): what is saved (parameters, both Adam moments, progress, the
 * model config, the training settings and the plan) and how a run is
 * restored from one, for any plan and world size.  State bytes leave and
 * enter the device only through the kernel table: each block is packed
 * straight from the state buffer into a pinned host buffer (a tensor
 * piece, piece.h), each restored shard is copied in from the host.
 *
 * Saving is collective over the world: every rank writes its blocks of
 * the state into its own shard file.  Each element has exactly one writer
 * (the pieces a rank owns, layout.h, shared out among the data-parallel
 * replicas that hold them: mal_reshard_rank_blocks), so the snapshot holds
 * the state once, not once per replica, and replicas share the writing;
 * suspended ranks write nothing but take part in the commit.
 *
 * Restoring reads, on every active rank, exactly the local shard of every
 * tensor it holds, from whatever blocks the snapshot stores: the snapshot
 * may come from any plan and any world size (a resharded one reads
 * locally; any other one still loads, with more of it read per rank). */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "load.h"
#include "mal.h"
#include "piece.h"
#include "reshard.h"
#include "snapshot.h"
#include "train_internal.h"

/* Training settings that define the loss curve; stored in snapshots. */
static char *train_json(const mal_train_options *o)
{
    json_t *j = json_pack(
        "{s:I, s:i, s:i, s:f, s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "seed", (json_int_t)o->seed,
        "global_batch", o->global_batch, "micro_batch", o->micro_batch, "lr", (double)o->optim.lr,
        "min_lr_ratio", (double)o->optim.min_lr_ratio, "warmup_steps", o->optim.warmup_steps,
        "total_steps", o->optim.total_steps, "beta1", (double)o->optim.beta1, "beta2",
        (double)o->optim.beta2, "eps", (double)o->optim.eps, "weight_decay",
        (double)o->optim.weight_decay, "grad_clip", (double)o->optim.grad_clip);
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(j);
    return s;
}

/* The snapshot tensor groups of the model: parameters and both Adam
 * moments (mal_model_state_name gives their names). */
enum { N_GROUPS = MAL_STATE_N_SAVED };

/* The block of tensor t covering [begin, end) along its axis. */
static void axis_block(const mal_tensor_info *t, int64_t begin, int64_t end, mal_snap_tensor *b)
{
    b->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        b->shape[d] = t->shape[d];
        b->offset[d] = d == t->axis ? begin : 0;
        b->extent[d] = d == t->axis ? end - begin : t->shape[d];
    }
}

/* The blocks this rank writes (reshard.h: owned pieces, shared out among
 * replicas), against the model's own tensor table. */
static int owned_blocks(const struct mal_trainer *tr, mal_owned_block **out, int *n_out)
{
    const mal_model *m = tr->model;
    mal_tensor_info *lt = NULL;
    int nlt = 0;
    int rc = mal_reshard_rank_blocks(&tr->plan, &m->cfg, tr->world_rank, &lt, &nlt, out, n_out);
    if (rc) return rc;
    if (nlt != m->n_tensors) {
        rc = MAL_ERR(MAL_EMISMATCH, "snapshot: the layout lists %d tensors, the model part %d", nlt,
                     m->n_tensors);
    } else {
        for (int i = 0; i < nlt && !rc; i++)
            if (strcmp(lt[i].name, m->tensors[i].name) != 0)
                rc = MAL_ERR(MAL_EMISMATCH, "snapshot: layout tensor %d is '%s', the model's '%s'",
                             i, lt[i].name, m->tensors[i].name);
    }
    free(lt);
    if (rc) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return rc;
}

/* Declare this rank's shard and write its blocks of all three groups.
 * Memory: one block, in pinned host memory. */
static int save_local(struct mal_trainer *tr, mal_snap_writer *w)
{
    mal_model *m = tr->model;
    mal_owned_block *ob = NULL;
    mal_snap_tensor *blocks = NULL;
    char(*names)[80] = NULL;
    float *pack = NULL;
    int nob = 0, rc;
    if ((rc = owned_blocks(tr, &ob, &nob))) return rc;
    if (nob == 0) goto out;
    blocks = calloc((size_t)N_GROUPS * (size_t)nob, sizeof *blocks);
    names = calloc((size_t)N_GROUPS * (size_t)nob, sizeof *names);
    size_t max_b = 0;
    for (int i = 0; i < nob; i++)
        max_b = MAL_MAX(max_b,
                        mal_piece_floats(&m->tensors[ob[i].tensor], ob[i].begin, ob[i].end));
    pack = mal_kern_host_alloc(m->k, max_b * sizeof(float));
    if (!blocks || !names || !pack) {
        rc = MAL_ERR(MAL_ENOMEM, "snapshot: out of memory");
        goto out;
    }
    for (int g = 0; g < N_GROUPS; g++)
        for (int i = 0; i < nob; i++) {
            int k = g * nob + i;
            const mal_tensor_info *t = &m->tensors[ob[i].tensor];
            snprintf(names[k], sizeof names[k], "%s/%s", mal_model_state_name(g), t->name);
            blocks[k].name = names[k];
            axis_block(t, ob[i].begin, ob[i].end, &blocks[k]);
        }
    int h = mal_snap_writer_add_shard(w, tr->world_rank, blocks, N_GROUPS * nob);
    if (h < 0) {
        rc = h;
        goto out;
    }
    for (int g = 0; g < N_GROUPS; g++)
        for (int i = 0; i < nob; i++) {
            const mal_tensor_info *t = &m->tensors[ob[i].tensor];
            mal_piece_pack(m->k, t, mal_model_state(m, g), ob[i].begin, ob[i].end, pack,
                           MAL_COPY_D2H);
            if ((rc = mal_kern_sync(m->k))) goto out;
            size_t n = mal_piece_floats(t, ob[i].begin, ob[i].end);
            if ((rc = mal_snap_writer_put(w, h, g * nob + i, pack, n))) goto out;
        }
out:
    free(ob);
    free(blocks);
    free(names);
    if (pack) mal_kern_host_free(m->k, pack);
    return rc;
}

int mal_train_ckpt_save(struct mal_trainer *tr)
{
    if (!tr->o.snapshot_dir) return MAL_ERR(MAL_EINVAL, "no --snapshot-dir to save into");
    double t0 = mal_now();
    mal_model *m = tr->model;
    char *cfg = mal_config_to_json(&tr->o.model), *trj = train_json(&tr->o), *plj = NULL;
    int rc = mal_plan_to_string(&tr->plan, &plj), lrc = 0;
    if (rc || !cfg || !trj) lrc = rc ? rc : MAL_ERR(MAL_ENOMEM, "snapshot: out of memory");
    mal_snap_meta meta = {tr->step, tr->step * (int64_t)tr->o.global_batch, tr->o.seed, 0, cfg, trj,
                          plj};
    mal_snap_writer *w = NULL;
    char path[4096];
    if ((rc = mal_snap_writer_begin(&w, tr->world, tr->o.snapshot_dir, &meta))) goto out;
    if (!lrc && m) lrc = save_local(tr, w);
    if ((rc = mal_snap_writer_finish(w, lrc, tr->o.keep_snapshots, path, sizeof path))) goto out;
    tr->saved_step = tr->step;
    /* finish is collective and commits after every rank is done: rank 0's
     * time is the snapshot's */
    if (tr->world_rank == 0)
        mal_log(MAL_LOG_INFO, "snapshot written: %s (%.3f s)", path, mal_now() - t0);
out:
    free(cfg);
    free(trj);
    free(plj);
    return rc;
}

/* Checks every rank can make alike: model, seed, batch, progress. */
static int check_meta(const struct mal_trainer *tr, const mal_snap_meta *meta, const char *path)
{
    mal_model_config saved;
    json_t *tj = NULL;
    int rc;
    if (!meta->config_json || (rc = mal_config_from_json(&saved, meta->config_json, path)))
        return MAL_ERR(MAL_EFORMAT, "snapshot %s has no valid model config", path);
    const mal_model_config *c = &tr->o.model;
    if (!mal_config_equal(&saved, c))
        return MAL_ERR(MAL_EMISMATCH,
                       "snapshot %s was written for another model (%s: d_model %d, %d layers, "
                       "vocab %d) than the one requested (%s: d_model %d, %d layers, vocab %d)",
                       path, saved.name, saved.d_model, saved.n_layers, saved.vocab, c->name,
                       c->d_model, c->n_layers, c->vocab);
    json_error_t jerr;
    tj = meta->train_json ? json_loads(meta->train_json, 0, &jerr) : NULL;
    if (!tj)
        return MAL_ERR(MAL_EFORMAT, "snapshot %s: missing or malformed training settings", path);
    json_int_t gb = json_integer_value(json_object_get(tj, "global_batch"));
    json_decref(tj);
    if (meta->seed != tr->o.seed || gb != tr->o.global_batch)
        return MAL_ERR(MAL_EMISMATCH,
                       "snapshot %s was written with seed %llu and global batch %lld; this run "
                       "asks for seed %llu and global batch %d (they define the data order: pass "
                       "the snapshot's values)",
                       path, (unsigned long long)meta->seed, (long long)gb,
                       (unsigned long long)tr->o.seed, tr->o.global_batch);
    if (meta->consumed_samples != meta->step * (int64_t)tr->o.global_batch)
        return MAL_ERR(MAL_EFORMAT,
                       "snapshot %s: consumed samples %lld inconsistent with step %lld", path,
                       (long long)meta->consumed_samples, (long long)meta->step);
    return 0;
}

int mal_train_ckpt_restore(struct mal_trainer *tr)
{
    char path[4096];
    mal_snapshot *s = NULL;
    int rc = mal_snapshot_find_latest(tr->o.snapshot_dir, path, sizeof path);
    if (!rc) rc = mal_snapshot_open(&s, path);
    if (!rc) rc = check_meta(tr, mal_snapshot_meta(s), path);
    if (!rc && tr->model) rc = mal_load_state(s, tr->model, N_GROUPS);
    /* A rank that failed (a corrupt block only it reads) must stop all:
     * every rank returns the first failure, so nothing trains on a
     * partly loaded state. */
    rc = mal_snapshot_agree(tr->world, rc);
    if (!rc) {
        const mal_snap_meta *meta = mal_snapshot_meta(s);
        tr->step = meta->step;
        tr->saved_step = meta->step;
        if (tr->world_rank == 0) {
            mal_plan was;
            mal_plan_init(&was);
            int same = meta->plan_json && !mal_plan_parse_string(&was, meta->plan_json, path) &&
                       mal_plan_same_layout(&was, &tr->plan);
            mal_plan_fini(&was);
            mal_log(MAL_LOG_INFO, "resumed from %s at step %lld (%lld samples consumed)%s", path,
                    (long long)meta->step, (long long)meta->consumed_samples,
                    same ? "" : " written under another plan");
        }
    }
    mal_snapshot_close(s);
    return rc;
}
