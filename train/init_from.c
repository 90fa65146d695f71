/* A run's parameters read from a snapshot or a Hugging Face checkpoint
 * instead of drawn at random, and the record of where they came from
 * (init_from.h). */
#include "init_from.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/mal.h"
#include "ckpt/hf.h"
#include "ckpt/load.h"
#include "ckpt/snapshot.h"
#include "train_internal.h"

int mal_init_source_read(const char *src, int seq_len, mal_init_source *s)
{
    char probe[4096 + 16];
    struct stat st;
    memset(s, 0, sizeof *s);
    snprintf(probe, sizeof probe, "%s/config.json", src);
    if (stat(probe, &st) == 0) {
        /* a Hugging Face checkpoint: its config.json is all a model needs
         * here; the tensors are checked when they are read */
        unsigned char *text = NULL;
        size_t len;
        mal_hf_options ho = {.seq_len = seq_len};
        s->is_hf = 1;
        if (!realpath(src, s->path))
            return MAL_ERR(MAL_ENOENT, "--init-from %s: cannot resolve it", src);
        int rc = mal_file_read(probe, "config.json", MAL_HF_MAX_CONFIG_BYTES, MAL_READ_REGULAR,
                               &text, &len);
        if (!rc)
            rc = mal_hf_parse_config((const char *)text, len, s->path, &ho, &s->model, NULL, 0);
        free(text);
        return rc;
    }
    mal_snapshot *snap = NULL;
    int rc = mal_snapshot_resolve(src, s->path, sizeof s->path);
    if (rc == MAL_ENOENT)
        rc = MAL_ERR(MAL_ENOENT,
                     "--init-from %s is neither a Hugging Face checkpoint directory (no "
                     "config.json) nor a committed snapshot: %s",
                     src, mal_errmsg());
    if (!rc) rc = mal_snapshot_open(&snap, s->path);
    if (!rc) {
        const mal_snap_meta *m = mal_snapshot_meta(snap);
        if (!m->config_json || mal_config_from_json(&s->model, m->config_json, s->path))
            rc = MAL_ERR(MAL_EFORMAT, "snapshot %s has no valid model config", s->path);
    }
    mal_snapshot_close(snap);
    return rc;
}

int mal_init_source_check_model(const mal_init_source *s, const mal_model_config *run, char *notes,
                                size_t len)
{
    const mal_model_config *a = &s->model;
    static const char *const shape[] = {"vocab",      "d_model",    "n_layers",      "n_heads",
                                        "n_kv_heads", "ffn_hidden", "tie_embeddings"};
    const int x[] = {a->vocab,      a->d_model,    a->n_layers,      a->n_heads,
                     a->n_kv_heads, a->ffn_hidden, a->tie_embeddings},
              y[] = {run->vocab,      run->d_model,    run->n_layers,      run->n_heads,
                     run->n_kv_heads, run->ffn_hidden, run->tie_embeddings};
    for (size_t i = 0; i < MAL_ARRAY_SIZE(shape); i++)
        if (x[i] != y[i])
            return MAL_ERR(MAL_EMISMATCH,
                           "--init-from %s: its model has %s %d, --model %d (the tensors' shapes "
                           "must be the source's; leave --model out to take its model)",
                           s->path, shape[i], x[i], y[i]);
    notes[0] = '\0';
    size_t k = 0;
    if (a->seq_len != run->seq_len)
        k += (size_t)snprintf(notes + k, len - k, "seq_len %d (source %d)", run->seq_len,
                              a->seq_len);
    if (k < len && !mal_rope_same(&a->rope, &run->rope))
        k += (size_t)snprintf(notes + k, len - k,
                              "%srotary frequencies (rope_theta %g%s; source "
                              "%g%s)",
                              k ? ", " : "", (double)run->rope.theta,
                              run->rope.llama3 ? ", llama3" : "", (double)a->rope.theta,
                              a->rope.llama3 ? ", llama3" : "");
    if (k < len && a->norm_eps != run->norm_eps)
        snprintf(notes + k, len - k, "%snorm_eps %g (source %g)", k ? ", " : "",
                 (double)run->norm_eps, (double)a->norm_eps);
    return 0;
}

/* The identity of a snapshot source: its step directory and step, the
 * fingerprint of its index (which holds every block's CRC-32C), and where
 * that snapshot's own weights came from, when it says. */
static int snapshot_identity(mal_snapshot *s, const char *step_dir, json_t **out)
{
    char index[4096 + 16];
    uint64_t bytes, fp;
    char hex[17];
    snprintf(index, sizeof index, "%s/index.h5", step_dir);
    int rc = mal_file_fingerprint(index, "snapshot index", &bytes, &fp);
    if (rc) return rc;
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fp);
    const mal_snap_meta *m = mal_snapshot_meta(s);
    json_t *j = json_pack("{s:s, s:s, s:I, s:[{s:s, s:I, s:s}]}", "format", "malleus-snapshot",
                          "path", step_dir, "step", (json_int_t)m->step, "files", "path", index,
                          "bytes", (json_int_t)bytes, "fingerprint", hex);
    json_t *tj = m->train_json ? json_loads(m->train_json, 0, NULL) : NULL;
    static const char *const chain[] = {"imported_from", "init_from"};
    for (size_t i = 0; j && i < MAL_ARRAY_SIZE(chain); i++) {
        json_t *v = json_object_get(tj, chain[i]);
        if (v) json_object_set(j, chain[i], v);
    }
    json_decref(tj);
    if (!j) return MAL_ERR(MAL_ENOMEM, "out of memory");
    *out = j;
    return 0;
}

static int hf_read(void *ctx, const mal_snap_tensor *want)
{
    return mal_hf_read_block(ctx, want);
}

/* This rank's part from the source, and its identity (rank 0 keeps it). */
static int load(mal_trainer *tr, const mal_init_source *src, char **record)
{
    mal_model *m = tr->part.model;
    json_t *id = NULL;
    int rc;
    /* a sharded master: loaded whole into the gradient buffer, then
     * sharded (gradsync.h) */
    if (m) mal_gradsync_zero_master_stage(tr->part.gsync);
    if (src->is_hf) {
        mal_hf *h = NULL;
        mal_hf_options ho = {.seq_len = tr->o.model.seq_len};
        char *text = NULL;
        rc = mal_hf_open(&h, src->path, &ho);
        if (!rc && m) rc = mal_load_state_from(hf_read, h, m, 1);
        if (m) {
            int rc2 = mal_gradsync_zero_master_unstage(tr->part.gsync);
            if (!rc) rc = rc2;
        }
        if (!rc && tr->world_rank == 0) {
            rc = mal_hf_identity(h, &text);
            if (!rc && !(id = json_loads(text, 0, NULL))) rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        }
        free(text);
        mal_hf_close(h);
    } else {
        mal_snapshot *s = NULL;
        rc = mal_snapshot_open(&s, src->path);
        if (!rc && m) rc = mal_load_state(s, m, 1);
        if (m) {
            int rc2 = mal_gradsync_zero_master_unstage(tr->part.gsync);
            if (!rc) rc = rc2;
        }
        if (!rc && tr->world_rank == 0) rc = snapshot_identity(s, src->path, &id);
        mal_snapshot_close(s);
    }
    if (!rc && id && !(*record = json_dumps(id, JSON_SORT_KEYS | JSON_COMPACT)))
        rc = MAL_ERR(MAL_ENOMEM, "out of memory");
    json_decref(id);
    return rc;
}

int mal_train_init_from(struct mal_trainer *tr)
{
    mal_init_source src;
    char notes[512], *record = NULL;
    int rc = mal_init_source_read(tr->o.init_from, tr->o.model.seq_len, &src);
    if (!rc) rc = mal_init_source_check_model(&src, &tr->o.model, notes, sizeof notes);
    /* every rank reads its own part; a rank that fails (a file only it
     * cannot read) stops all, so nothing trains on a partly loaded model */
    if (!rc) rc = load(tr, &src, &record);
    rc = mal_snapshot_agree(tr->world, rc);
    if (rc) {
        free(record);
        return rc;
    }
    /* every rank's settings carry the record (rank 0 writes them, but any
     * rank may be asked): broadcast its length and text */
    if (tr->world && tr->world_size > 1) {
        int64_t n = record ? (int64_t)strlen(record) + 1 : 0;
        if ((rc = mal_comm_broadcast(tr->world, &n, sizeof n, 0))) return rc;
        if (tr->world_rank != 0 && !(record = malloc((size_t)n)))
            rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        rc = mal_snapshot_agree(tr->world, rc);
        if (!rc) rc = mal_comm_broadcast(tr->world, record, (size_t)n, 0);
        if (rc) {
            free(record);
            return rc;
        }
    }
    free(tr->resume.init_from_json);
    tr->resume.init_from_json = record;
    if (tr->world_rank == 0) {
        mal_log(MAL_LOG_INFO, "initialised from %s %s (fresh optimizer state, step 0)",
                src.is_hf ? "the Hugging Face checkpoint" : "snapshot", src.path);
        if (notes[0]) mal_log(MAL_LOG_INFO, "--init-from: the run's model differs in %s", notes);
    }
    return 0;
}
