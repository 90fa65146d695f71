/* A resumed run is the run its snapshot was written by: the settings a
 * snapshot stores, the defaults they give a --resume, the check of the run
 * against them with --override, the metrics file of a resumed run and the
 * events file (resume.h). */
#include "resume.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mal.h"
#include "train_internal.h"

/* ---- the settings a snapshot stores ------------------------------------ */

enum { K_INT, K_I64, K_U64, K_FLOAT, K_DBL, K_STR, K_FMT, K_SAMP };

/* One setting of mal_train_options: its flag (also its --override key),
 * its key in the stored settings, and whether a difference changes the
 * run (the others are only defaults: where validation data lives does not
 * change what is trained; the data's identity is checked, not its path). */
typedef struct {
    const char *flag, *json;
    int kind;
    size_t off;
    int checked;
} setting;

#define OPT(f) offsetof(mal_train_options, f)
static const setting settings[] = {
    {"steps", "steps", K_I64, OPT(steps), 1},
    {"seed", "seed", K_U64, OPT(seed), 1},
    {"global-batch", "global_batch", K_INT, OPT(global_batch), 1},
    {"micro-batch", "micro_batch", K_INT, OPT(micro_batch), 0}, /* how, not what */
    {"lr", "lr", K_FLOAT, OPT(optim.lr), 1},
    {"min-lr-ratio", "min_lr_ratio", K_FLOAT, OPT(optim.min_lr_ratio), 1},
    {"warmup", "warmup_steps", K_INT, OPT(optim.warmup_steps), 1},
    {"decay-steps", "total_steps", K_INT, OPT(optim.total_steps), 1},
    {"weight-decay", "weight_decay", K_FLOAT, OPT(optim.weight_decay), 1},
    {"beta1", "beta1", K_FLOAT, OPT(optim.beta1), 1},
    {"beta2", "beta2", K_FLOAT, OPT(optim.beta2), 1},
    {"adam-eps", "eps", K_FLOAT, OPT(optim.eps), 1},
    {"clip", "grad_clip", K_FLOAT, OPT(optim.grad_clip), 1},
    {"data", "data", K_STR, OPT(data_path), 0},
    {"data-format", "data_format", K_FMT, OPT(data_format), 1},
    {"val-data", "val_data", K_STR, OPT(val_data_path), 0},
    {"val-data-format", "val_data_format", K_FMT, OPT(val_data_format), 0},
    /* how token files are sampled and what part is held out define the
     * data order (src/data.h) */
    {"data-sampling", "data_sampling", K_SAMP, OPT(data_sampling), 1},
    {"val-fraction", "val_fraction", K_DBL, OPT(val_fraction), 1},
};

/* The sampling mode a run with these options uses: the stored word. */
static const char *sampling_name(const mal_train_options *o)
{
    int m = o->data_sampling;
    if (m == MAL_DATA_SAMPLE_DEFAULT)
        m = o->data_path && strncmp(o->data_path, "synthetic:", 10) != 0 ? MAL_DATA_SAMPLE_EPOCHS
                                                                         : MAL_DATA_SAMPLE_RANDOM;
    return m == MAL_DATA_SAMPLE_EPOCHS ? "epochs" : "random";
}

/* Model fields --override may change (none of them shapes a tensor: a
 * longer context, another RoPE base), and those it may not. */
static const char *const model_free[] = {"seq_len", "rope_theta", "norm_eps", "rope_scaling"};
static const char *const model_fixed[] = {"vocab",      "d_model",    "n_layers",
                                          "n_heads",    "ffn_hidden", "n_kv_heads",
                                          "tie_embeddings"};

char *mal_train_settings_json(const struct mal_trainer *tr)
{
    const mal_train_options *o = &tr->o;
    json_t *j = json_pack(
        "{s:I, s:i, s:i, s:f, s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:I, s:s?, s:s, s:s?, s:s}",
        "seed", (json_int_t)o->seed, "global_batch", o->global_batch, "micro_batch", o->micro_batch,
        "lr", (double)o->optim.lr, "min_lr_ratio", (double)o->optim.min_lr_ratio, "warmup_steps",
        o->optim.warmup_steps, "total_steps", o->optim.total_steps, "beta1", (double)o->optim.beta1,
        "beta2", (double)o->optim.beta2, "eps", (double)o->optim.eps, "weight_decay",
        (double)o->optim.weight_decay, "grad_clip", (double)o->optim.grad_clip, "steps",
        (json_int_t)o->steps, "data", o->data_path, "data_format",
        mal_data_format_name(o->data_format), "val_data", o->val_data_path, "val_data_format",
        mal_data_format_name(o->val_data_format));
    json_t *files = json_array();
    int bad = !j || !files;
    if (!bad && o->data_path)
        bad = json_object_set_new(j, "data_sampling",
                                  json_string(mal_data_sampling(tr->data) == MAL_DATA_SAMPLE_EPOCHS
                                                  ? "epochs"
                                                  : "random")) ||
              json_object_set_new(j, "val_fraction", json_real(o->val_fraction));
    /* the tokenizer the data was made with, for malleus-export and
     * malleus-sample (src/tokenizer.h) */
    const char *tok = !bad && tr->data ? mal_data_tokenizer(tr->data) : NULL;
    if (tok) bad = json_object_set_new(j, "tokenizer", json_loads(tok, 0, NULL));
    /* where the run's parameters came from (init_from.h) */
    if (!bad && tr->resume.init_from_json)
        bad = json_object_set_new(j, "init_from", json_loads(tr->resume.init_from_json, 0, NULL));
    for (int i = 0; !bad && i < tr->resume.n_data_ids; i++) {
        const mal_data_file_id *id = &tr->resume.data_ids[i];
        char fp[17];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)id->fingerprint);
        bad = json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", id->path, "bytes",
                                                     (json_int_t)id->bytes, "fingerprint", fp));
    }
    char *s = NULL;
    if (!bad) {
        bad = json_object_set_new(j, "data_files", files); /* takes files, even when failing */
        files = NULL;
    }
    if (!bad) s = json_dumps(j, JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(files);
    json_decref(j);
    return s;
}

/* ---- defaults from the snapshot ---------------------------------------- */

/* A weights-only snapshot (ckpt/import.h) has no run to continue. */
static int weights_only(const char *path)
{
    return MAL_ERR(MAL_EINVAL,
                   "snapshot %s holds weights only (an import: no optimizer state, no run to "
                   "continue): start a run from it with --init-from %s, without --resume",
                   path, path);
}

int mal_resume_source_read(mal_resume_source *rs, const char *snapshot_dir, int64_t step,
                           mal_comm *world)
{
    memset(rs, 0, sizeof *rs);
    const int lead = !world || world->rank == 0;
    /* rank 0 reads (one reader of the shared file system, and no rank can
     * decide alone), then every rank gets its strings */
    char *config = NULL, *train = NULL;
    int64_t lens[3] = {0, 0, 0};
    int rc = 0;
    if (lead) {
        mal_snapshot *s = NULL;
        /* the one the trainer will restore (ckpt_start.c finds it alike) */
        rc = mal_snapshot_find(snapshot_dir, step, rs->path, sizeof rs->path, NULL);
        if (!rc) rc = mal_snapshot_open(&s, rs->path);
        if (!rc) {
            const mal_snap_meta *m = mal_snapshot_meta(s);
            rs->step = m->step;
            if (m->train_json && !mal_snapshot_has_group(s, "adam_m"))
                rc = weights_only(rs->path);
            else if (!m->config_json || !m->train_json)
                rc = MAL_ERR(MAL_EFORMAT,
                             "snapshot %s stores no model config or training settings: it "
                             "cannot be resumed",
                             rs->path);
            else if (!(config = strdup(m->config_json)) || !(train = strdup(m->train_json)))
                rc = MAL_ERR(MAL_ENOMEM, "out of memory");
        }
        mal_snapshot_close(s);
        if (!rc) {
            lens[0] = rs->step;
            lens[1] = (int64_t)strlen(config) + 1;
            lens[2] = (int64_t)strlen(train) + 1;
        }
    }
    if (world && world->size > 1) {
        rc = mal_snapshot_agree(world, rc);
        if (!rc) rc = mal_comm_broadcast(world, lens, sizeof lens, 0);
        if (!rc) rc = mal_comm_broadcast(world, rs->path, sizeof rs->path, 0);
        if (!rc) {
            /* every rank must hold its buffers before the broadcasts */
            int lrc = 0;
            if (!lead) {
                rs->step = lens[0];
                config = malloc((size_t)lens[1]);
                train = malloc((size_t)lens[2]);
                if (!config || !train) lrc = MAL_ERR(MAL_ENOMEM, "out of memory");
            }
            rc = mal_snapshot_agree(world, lrc);
        }
        if (!rc) rc = mal_comm_broadcast(world, config, (size_t)lens[1], 0);
        if (!rc) rc = mal_comm_broadcast(world, train, (size_t)lens[2], 0);
    }
    json_error_t jerr;
    if (!rc) rc = mal_config_from_json(&rs->model, config, rs->path);
    if (!rc && !(rs->settings = json_loads(train, 0, &jerr)))
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s: its training settings are not JSON (%s)", rs->path,
                     jerr.text);
    if (!rc && !json_is_object(rs->settings))
        rc = MAL_ERR(MAL_EFORMAT, "snapshot %s: its training settings are not a JSON object",
                     rs->path);
    free(config);
    free(train);
    if (rc) mal_resume_source_fini(rs);
    return rc;
}

void mal_resume_source_fini(mal_resume_source *rs)
{
    json_decref(rs->settings);
    rs->settings = NULL;
}

/* Store JSON value v into the option of s; 0, or MAL_EFORMAT. */
static int set_option(const setting *s, const json_t *v, mal_train_options *o, const char *path)
{
    char *p = (char *)o + s->off;
    int ok = 1;
    switch (s->kind) {
    case K_INT:
        if ((ok = json_is_integer(v))) *(int *)p = (int)json_integer_value(v);
        break;
    case K_I64:
        if ((ok = json_is_integer(v))) *(int64_t *)p = json_integer_value(v);
        break;
    case K_U64:
        if ((ok = json_is_integer(v))) *(uint64_t *)p = (uint64_t)json_integer_value(v);
        break;
    case K_FLOAT:
        if ((ok = json_is_number(v))) *(float *)p = (float)json_number_value(v);
        break;
    case K_DBL:
        if ((ok = json_is_number(v))) *(double *)p = json_number_value(v);
        break;
    case K_SAMP:
        ok = json_is_string(v) &&
             (!strcmp(json_string_value(v), "epochs") || !strcmp(json_string_value(v), "random"));
        if (ok)
            *(int *)p = !strcmp(json_string_value(v), "epochs") ? MAL_DATA_SAMPLE_EPOCHS
                                                               : MAL_DATA_SAMPLE_RANDOM;
        break;
    case K_STR:
        if ((ok = json_is_null(v) || json_is_string(v)))
            *(const char **)p = json_is_null(v) ? NULL : json_string_value(v);
        break;
    case K_FMT:
        ok = json_is_string(v) && !mal_data_parse_format(json_string_value(v), (int *)p);
        break;
    }
    return ok ? 0
              : MAL_ERR(MAL_EFORMAT, "snapshot %s: its training setting '%s' has a wrong type",
                        path, s->json);
}

static void append(char *buf, size_t len, const char *word)
{
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", n ? ", " : "", word);
}

int mal_resume_apply_defaults(const mal_resume_source *rs, mal_train_options *o,
                              int (*given)(void *ctx, const char *flag), void *ctx, char *taken,
                              size_t taken_len)
{
    taken[0] = '\0';
    if (!given(ctx, "model")) {
        o->model = rs->model;
        append(taken, taken_len, "model");
    }
    for (size_t i = 0; i < MAL_ARRAY_SIZE(settings); i++) {
        const setting *s = &settings[i];
        const json_t *v = json_object_get(rs->settings, s->json);
        if (!v || given(ctx, s->flag)) continue; /* older snapshots lack some */
        int rc = set_option(s, v, o, rs->path);
        if (rc) return rc;
        append(taken, taken_len, s->flag);
    }
    return 0;
}

/* ---- the check ---------------------------------------------------------- */

typedef struct {
    char key[24];
    char snap[256], run[256];
    const char *hint; /* what to do about it, when more than the rule */
    int fixed;        /* --override cannot accept it */
} diff;

typedef struct {
    diff d[32];
    int n;
} diffs;

static void add_text(diffs *ds, const char *key, int fixed, const char *hint, const char *snap,
                     const char *run)
{
    if (ds->n == (int)MAL_ARRAY_SIZE(ds->d)) return;
    diff *d = &ds->d[ds->n++];
    snprintf(d->key, sizeof d->key, "%s", key);
    snprintf(d->snap, sizeof d->snap, "%s", snap);
    snprintf(d->run, sizeof d->run, "%s", run);
    d->hint = hint;
    d->fixed = fixed;
}

/* The shortest text that reads back as the float x ("0.001", not
 * "0.00100000005"). */
static void float_text(char *out, size_t len, float x)
{
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(out, len, "%.*g", digits, (double)x);
        if ((float)strtod(out, NULL) == x) return;
    }
}

static void compare_model(const mal_model_config *a, const mal_model_config *b, diffs *ds)
{
    const int ia[] = {a->vocab,      a->d_model,    a->n_layers,      a->n_heads,
                      a->ffn_hidden, a->n_kv_heads, a->tie_embeddings},
              ib[] = {b->vocab,      b->d_model,    b->n_layers,      b->n_heads,
                      b->ffn_hidden, b->n_kv_heads, b->tie_embeddings};
    char x[96], y[96];
    for (int i = 0; i < (int)MAL_ARRAY_SIZE(ia); i++)
        if (ia[i] != ib[i]) {
            snprintf(x, sizeof x, "%d", ia[i]);
            snprintf(y, sizeof y, "%d", ib[i]);
            add_text(ds, model_fixed[i], 1, NULL, x, y);
        }
    if (a->seq_len != b->seq_len) {
        snprintf(x, sizeof x, "%d", a->seq_len);
        snprintf(y, sizeof y, "%d", b->seq_len);
        add_text(ds, "seq_len", 0, NULL, x, y);
    }
    const float fa[] = {a->rope.theta, a->norm_eps}, fb[] = {b->rope.theta, b->norm_eps};
    for (int i = 0; i < 2; i++)
        if (fa[i] != fb[i]) {
            float_text(x, sizeof x, fa[i]);
            float_text(y, sizeof y, fb[i]);
            add_text(ds, model_free[1 + i], 0, NULL, x, y);
        }
    /* the llama3 frequency scaling, as one setting: another context
     * extension, like another base, shapes no tensor */
    const mal_rope *ra = &a->rope, *rb = &b->rope;
    if (ra->llama3 != rb->llama3 ||
        (ra->llama3 && (ra->factor != rb->factor || ra->low_freq_factor != rb->low_freq_factor ||
                        ra->high_freq_factor != rb->high_freq_factor ||
                        ra->original_max_pos != rb->original_max_pos))) {
        const mal_rope *r[2] = {ra, rb};
        char *out[2] = {x, y};
        for (int i = 0; i < 2; i++)
            if (r[i]->llama3)
                snprintf(out[i], sizeof x, "llama3 (factor %g, low %g, high %g, original %d)",
                         (double)r[i]->factor, (double)r[i]->low_freq_factor,
                         (double)r[i]->high_freq_factor, r[i]->original_max_pos);
            else
                snprintf(out[i], sizeof x, "none");
        add_text(ds, "rope_scaling", 0, NULL, x, y);
    }
}

/* The stored value of s and this run's, as text; 1 when they are equal. */
static int compare_setting(const setting *s, const json_t *v, const mal_train_options *o,
                           char *snap, char *run, size_t len)
{
    const char *p = (const char *)o + s->off;
    switch (s->kind) {
    case K_INT:
    case K_I64:
    case K_U64: {
        long long mine = s->kind == K_INT   ? *(const int *)p
                         : s->kind == K_I64 ? (long long)*(const int64_t *)p
                                            : (long long)*(const uint64_t *)p;
        snprintf(snap, len, "%lld", (long long)json_integer_value(v));
        snprintf(run, len, "%lld", mine);
        return json_is_integer(v) && json_integer_value(v) == mine;
    }
    case K_FLOAT: {
        /* stored with 9 significant digits: a float comes back exactly */
        float theirs = (float)json_number_value(v), mine = *(const float *)p;
        float_text(snap, len, theirs);
        float_text(run, len, mine);
        return json_is_number(v) && theirs == mine;
    }
    case K_DBL: {
        double theirs = json_number_value(v), mine = *(const double *)p;
        snprintf(snap, len, "%g", theirs);
        snprintf(run, len, "%g", mine);
        return json_is_number(v) && fabs(theirs - mine) <= 1e-8;
    }
    case K_SAMP: {
        const char *mine = sampling_name(o);
        snprintf(snap, len, "%s", json_is_string(v) ? json_string_value(v) : "?");
        snprintf(run, len, "%s", mine);
        return json_is_string(v) && !strcmp(json_string_value(v), mine);
    }
    case K_FMT: {
        const char *mine = mal_data_format_name(*(const int *)p);
        snprintf(snap, len, "%s", json_is_string(v) ? json_string_value(v) : "?");
        snprintf(run, len, "%s", mine);
        return json_is_string(v) && !strcmp(json_string_value(v), mine);
    }
    default:
        return 1;
    }
}

/* "PATH (N bytes, fingerprint X)" of the first file, "and K more" */
static void describe_files(char *out, size_t len, const char *path, long long bytes, const char *fp,
                           int n)
{
    int k = snprintf(out, len, "%s (%lld bytes, fingerprint %s)", path, bytes, fp);
    if (n > 1 && k > 0 && (size_t)k < len)
        snprintf(out + k, len - (size_t)k, " and %d more file%s", n - 1, n > 2 ? "s" : "");
}

/* The data's identity against the stored one: a difference, or a note
 * when only the paths differ (a file moved or copied: the same data). */
static void compare_data(const struct mal_trainer *tr, const json_t *files, diffs *ds, char *note,
                         size_t note_len)
{
    const mal_train_resume *r = &tr->resume;
    int n = (int)json_array_size(files), same = json_is_array(files) && n == r->n_data_ids,
        moved = 0;
    for (int i = 0; same && i < n; i++) {
        const json_t *f = json_array_get(files, (size_t)i);
        const mal_data_file_id *id = &r->data_ids[i];
        char fp[17];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)id->fingerprint);
        const char *path = json_string_value(json_object_get(f, "path")),
                   *sfp = json_string_value(json_object_get(f, "fingerprint"));
        same = path && sfp &&
               json_integer_value(json_object_get(f, "bytes")) == (json_int_t)id->bytes &&
               !strcmp(sfp, fp);
        moved |= same && strcmp(path, id->path) != 0;
    }
    if (same) {
        if (moved)
            snprintf(note, note_len, "data: the same contents as the snapshot's (%s), read from %s",
                     json_string_value(json_object_get(json_array_get(files, 0), "path")),
                     r->data_ids[0].path);
        return;
    }
    char snap[256] = "?", run[256], fp[17];
    const json_t *f0 = json_array_get(files, 0);
    if (f0)
        describe_files(snap, sizeof snap, json_string_value(json_object_get(f0, "path")),
                       (long long)json_integer_value(json_object_get(f0, "bytes")),
                       json_string_value(json_object_get(f0, "fingerprint")), n);
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)r->data_ids[0].fingerprint);
    describe_files(run, sizeof run, r->data_ids[0].path, (long long)r->data_ids[0].bytes, fp,
                   r->n_data_ids);
    add_text(ds, "data", 0, NULL, snap, run);
}

/* Is `key` in the comma-separated list? */
static int listed(const char *list, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == k && !strncmp(p, key, k)) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

static int known_key(const char *key, size_t n)
{
    for (size_t i = 0; i < MAL_ARRAY_SIZE(settings); i++)
        if (settings[i].checked && strlen(settings[i].flag) == n &&
            !strncmp(settings[i].flag, key, n))
            return 1;
    for (size_t i = 0; i < MAL_ARRAY_SIZE(model_free); i++)
        if (strlen(model_free[i]) == n && !strncmp(model_free[i], key, n)) return 1;
    return n == 4 && !strncmp(key, "data", 4);
}

int mal_train_resume_check_options(const mal_train_options *o)
{
    if (!o->overrides) return 0;
    if (!o->resume)
        return MAL_ERR(MAL_EINVAL, "--override names settings a --resume may change: add --resume "
                                   "or drop it");
    for (const char *p = o->overrides; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!known_key(p, n)) {
            char all[512] = "";
            for (size_t i = 0; i < MAL_ARRAY_SIZE(settings); i++)
                if (settings[i].checked) append(all, sizeof all, settings[i].flag);
            append(all, sizeof all, "data");
            for (size_t i = 0; i < MAL_ARRAY_SIZE(model_free); i++)
                append(all, sizeof all, model_free[i]);
            return MAL_ERR(MAL_EINVAL, "--override: unknown setting '%.*s'; the settings are: %s",
                           (int)n, p, all);
        }
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int mal_train_resume_init(struct mal_trainer *tr)
{
    tr->resume.resumed_from = -1;
    return mal_data_identity(tr->data, &tr->resume.data_ids, &tr->resume.n_data_ids);
}

void mal_train_resume_fini(struct mal_trainer *tr)
{
    mal_data_identity_free(tr->resume.data_ids, tr->resume.n_data_ids);
    free(tr->resume.overrides_json);
    free(tr->resume.init_from_json);
    memset(&tr->resume, 0, sizeof tr->resume);
}

/* The refusal: every difference in the message (rank 0 prints it), and
 * what to do. */
static int refuse(const diffs *ds, const char *path)
{
    char msg[1000];
    int n = snprintf(msg, sizeof msg,
                     "resume refused: this run differs from the run of snapshot %s in %d "
                     "setting%s:",
                     path, ds->n, ds->n > 1 ? "s" : "");
    int fixed = 0;
    for (int i = 0; i < ds->n && n > 0 && (size_t)n < sizeof msg; i++) {
        const diff *d = &ds->d[i];
        n += snprintf(msg + n, sizeof msg - (size_t)n, "\n  %s: snapshot %s, this run %s%s%s%s",
                      d->key, d->snap, d->run, d->hint ? " (" : "", d->hint ? d->hint : "",
                      d->hint ? ")" : "");
        fixed |= d->fixed;
    }
    return MAL_ERR(MAL_EMISMATCH,
                   "%s\nLeave those flags out to continue the snapshot's run as it was, or name "
                   "the settings in --override KEY[,KEY] to change them on purpose%s",
                   msg,
                   fixed ? " (vocab, d_model, n_layers, n_heads and ffn_hidden cannot change: "
                           "the snapshot's tensors have their shapes)"
                         : "");
}

/* Accepted differences: logged, and kept for the first metrics row. */
static int record_overrides(struct mal_trainer *tr, const diffs *ds)
{
    json_t *j = json_object();
    if (!j) return MAL_ERR(MAL_ENOMEM, "out of memory");
    for (int i = 0; i < ds->n; i++) {
        const diff *d = &ds->d[i];
        mal_train_event(tr, MAL_LOG_WARN, "resume: --override %s: snapshot %s, this run %s", d->key,
                        d->snap, d->run);
        json_object_set_new(j, d->key, json_pack("[s, s]", d->snap, d->run));
    }
    free(tr->resume.overrides_json);
    tr->resume.overrides_json = ds->n ? json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(j);
    return 0;
}

int mal_train_resume_check(struct mal_trainer *tr, const mal_snap_meta *meta, const char *path)
{
    const mal_train_options *o = &tr->o;
    json_t *wo = NULL;
    if (meta->train_json && (wo = json_loads(meta->train_json, 0, NULL)) &&
        json_is_true(json_object_get(wo, "weights_only"))) {
        json_decref(wo);
        return weights_only(path);
    }
    json_decref(wo);
    mal_model_config saved;
    if (!meta->config_json || mal_config_from_json(&saved, meta->config_json, path))
        return MAL_ERR(MAL_EFORMAT, "snapshot %s has no valid model config", path);
    json_error_t jerr;
    json_t *tj = meta->train_json ? json_loads(meta->train_json, 0, &jerr) : NULL;
    if (!json_is_object(tj)) {
        json_decref(tj);
        return MAL_ERR(MAL_EFORMAT, "snapshot %s: missing or malformed training settings", path);
    }
    /* a schedule left unset (0) is the snapshot's run's */
    mal_optim_config *oc = &tr->o.optim;
    if (oc->total_steps <= 0) {
        const json_t *ts = json_object_get(tj, "total_steps");
        oc->total_steps = json_is_integer(ts) ? (int)json_integer_value(ts) : (int)o->steps;
    }
    diffs ds = {.n = 0};
    char notes[2][512] = {"", ""}, snap[256], run[256];
    compare_model(&saved, &o->model, &ds);
    /* --eval-only trains nothing: only the model must be the snapshot's */
    for (size_t i = 0; i < MAL_ARRAY_SIZE(settings) && !o->eval_only; i++) {
        const setting *s = &settings[i];
        const json_t *v = json_object_get(tj, s->json);
        if (!s->checked || !v || compare_setting(s, v, o, snap, run, sizeof snap)) continue;
        if (s->off == OPT(steps) && json_is_integer(v)) {
            /* fewer steps: the same curve, stopped earlier */
            if (o->steps < json_integer_value(v)) {
                snprintf(notes[1], sizeof notes[1],
                         "stopping at step %lld, before the %s of the "
                         "snapshot's run",
                         (long long)o->steps, snap);
                continue;
            }
            /* more: the schedule decides what they mean, and the user must
             * say which (an --override is recorded as one) */
            int listed_steps = listed(o->overrides, "steps");
            if (listed_steps || o->decay_steps_given)
                snprintf(notes[1], sizeof notes[1],
                         "extending the run from %s to %lld steps; the schedule decays over %d "
                         "steps%s",
                         snap, (long long)o->steps, o->optim.total_steps,
                         o->steps > o->optim.total_steps
                             ? ", then the learning rate stays at its floor (--min-lr-ratio)"
                             : "");
            if (!listed_steps && o->decay_steps_given) continue;
            add_text(&ds, s->flag, 0,
                     "more steps than the snapshot's run: --override steps keeps its schedule, "
                     "or give --decay-steps",
                     snap, run);
            continue;
        }
        add_text(&ds, s->flag, 0, NULL, snap, run);
    }
    const json_t *files = json_object_get(tj, "data_files");
    if (files && !o->eval_only)
        compare_data(tr, files, &ds, notes[0], sizeof notes[0]);
    else if (!o->eval_only)
        snprintf(notes[0], sizeof notes[0],
                 "snapshot %s stores no identity of its data (written by an older version): the "
                 "data is not checked",
                 path);
    /* the run goes on with the weights it started from (init_from.h) */
    json_t *from = json_object_get(tj, "init_from");
    free(tr->resume.init_from_json);
    tr->resume.init_from_json = from ? json_dumps(from, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    /* progress is consumed samples, at the snapshot's own global batch */
    json_int_t gb = json_integer_value(json_object_get(tj, "global_batch"));
    json_decref(tj);
    if (meta->consumed_samples != meta->step * (int64_t)gb)
        return MAL_ERR(MAL_EFORMAT,
                       "snapshot %s: consumed samples %lld inconsistent with step %lld", path,
                       (long long)meta->consumed_samples, (long long)meta->step);

    diffs refused = {.n = 0}, accepted = {.n = 0};
    for (int i = 0; i < ds.n; i++) {
        diffs *to = !ds.d[i].fixed && listed(o->overrides, ds.d[i].key) ? &accepted : &refused;
        to->d[to->n++] = ds.d[i];
    }
    if (refused.n) return refuse(&refused, path);
    for (int i = 0; i < 2; i++)
        if (notes[i][0]) mal_train_event(tr, MAL_LOG_INFO, "resume: %s", notes[i]);
    tr->resume.resumed_from = meta->step;
    return record_overrides(tr, &accepted);
}

/* ---- metrics and events ---------------------------------------------- */

/* The step of a metrics row ("step": N), or -1. */
static long long row_step(const char *line, size_t n)
{
    char buf[64];
    const char *p = memmem(line, n, "\"step\":", 7);
    if (!p) return -1;
    size_t k = MAL_MIN((size_t)(line + n - (p + 7)), sizeof buf - 1);
    memcpy(buf, p + 7, k);
    buf[k] = '\0';
    char *end;
    long long s = strtoll(buf, &end, 10);
    return end == buf ? -1 : s;
}

/* Move the rows after step `keep` at the end of the metrics file (rank 0,
 * a regular file) to PATH.superseded, marked.  *moved: how many. */
static int trim_metrics(const char *path, int64_t keep, int *moved)
{
    *moved = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : MAL_ERR(MAL_EIO, "metrics file %s: %s", path, strerror(errno));
    struct stat st;
    char *tail = NULL, side[4096];
    int rc = 0, sfd = -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) goto done;
    /* The rows are in step order up to the crash (superseded ones have
     * moved out at earlier resumes): read back from the end, a growing
     * window at a time, until a row at or before `keep` ends the tail. */
    off_t size = st.st_size, win = 1 << 20, cut = -1;
    for (;;) {
        off_t from = size > win ? size - win : 0;
        free(tail);
        if (!(tail = malloc((size_t)(size - from) + 1))) {
            rc = MAL_ERR(MAL_ENOMEM, "out of memory reading %s", path);
            goto done;
        }
        if (pread(fd, tail, (size_t)(size - from), from) != size - from) {
            rc = MAL_ERR(MAL_EIO, "reading metrics file %s: %s", path, strerror(errno));
            goto done;
        }
        /* lines from the last one back; a last line without its newline
         * (a crash mid-write) goes too */
        size_t end = (size_t)(size - from);
        while (end > 0) {
            size_t b = end - 1;
            while (b > 0 && tail[b - 1] != '\n')
                b--;
            if (b == 0 && from > 0) break; /* the line may begin before the window */
            long long s = row_step(tail + b, end - b);
            if (s >= 0 && s <= keep && tail[end - 1] == '\n') {
                cut = from + (off_t)end;
                break;
            }
            end = b;
        }
        if (cut >= 0 || from == 0) break;
        win *= 4;
    }
    if (cut < 0) cut = 0;
    if (cut == size) goto done;
    /* the superseded rows, read again from the cut */
    free(tail);
    if (!(tail = malloc((size_t)(size - cut) + 1)) ||
        pread(fd, tail, (size_t)(size - cut), cut) != size - cut) {
        rc = MAL_ERR(tail ? MAL_EIO : MAL_ENOMEM, "reading metrics file %s", path);
        goto done;
    }
    snprintf(side, sizeof side, "%s.superseded", path);
    if ((sfd = open(side, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        rc = MAL_ERR(MAL_EIO, "cannot open %s: %s", side, strerror(errno));
        goto done;
    }
    FILE *f = fdopen(sfd, "a");
    if (!f) {
        rc = MAL_ERR(MAL_EIO, "cannot open %s: %s", side, strerror(errno));
        goto done;
    }
    sfd = -1;
    for (size_t b = 0, n = (size_t)(size - cut); b < n;) {
        size_t e = b;
        while (e < n && tail[e] != '\n')
            e++;
        if (tail[b] == '{')
            fprintf(f, "{\"superseded\": true, \"resumed_from\": %lld, %.*s\n", (long long)keep,
                    (int)(e - b - 1), tail + b + 1);
        else
            fprintf(f, "%.*s\n", (int)(e - b), tail + b);
        ++*moved;
        b = e + 1;
    }
    /* the copy is durable before the rows leave the metrics file */
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad) {
        rc = MAL_ERR(MAL_EIO, "writing %s: %s", side, strerror(errno));
        goto done;
    }
    if (ftruncate(fd, cut) != 0 || fsync(fd) != 0)
        rc = MAL_ERR(MAL_EIO, "truncating metrics file %s: %s", path, strerror(errno));
done:
    if (sfd >= 0) close(sfd);
    free(tail);
    close(fd);
    return rc;
}

int mal_train_metrics_open(struct mal_trainer *tr, FILE **out)
{
    const char *path = tr->o.metrics_path;
    int rc, moved = 0;
    /* --eval-only trains nothing, so nothing is superseded */
    if (tr->o.resume && !tr->o.eval_only && (rc = trim_metrics(path, tr->step, &moved))) return rc;
    if (moved)
        mal_train_event(tr, MAL_LOG_INFO,
                        "metrics: %d row%s after step %lld, written before the run stopped, moved "
                        "to %s.superseded",
                        moved, moved > 1 ? "s" : "", (long long)tr->step, path);
    /* a resumed run appends, so the file holds the whole curve */
    *out = fopen(path, tr->o.resume ? "a" : "w");
    int e = errno;
    if (*out) return 0;
    /* a path the user can fix (missing directory, a directory, no
     * permission) is bad input; anything else a failure of the run */
    return MAL_ERR(e == ENOENT || e == ENOTDIR || e == EISDIR || e == EACCES ? MAL_EINVAL : MAL_EIO,
                   "cannot open metrics file %s: %s", path, strerror(e));
}

void mal_train_resume_metrics(struct mal_trainer *tr, FILE *f)
{
    mal_train_resume *r = &tr->resume;
    if (r->resumed_from < 0) return;
    fprintf(f, ", \"resumed_from\": %lld", (long long)r->resumed_from);
    if (r->overrides_json) fprintf(f, ", \"overrides\": %s", r->overrides_json);
    r->resumed_from = -1;
}

void mal_train_event(const struct mal_trainer *tr, int level, const char *fmt, ...)
{
    if (tr->world_rank != 0) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mal_log(level, "%s", msg);
    if (!tr->o.events_path) return;
    /* appended line by line: the job loop writes its own lines between */
    int fd = open(tr->o.events_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        mal_log(MAL_LOG_WARN, "cannot append to events file %s: %s", tr->o.events_path,
                strerror(errno));
        return;
    }
    dprintf(fd, "malleus-train: %s\n", msg);
    close(fd);
}
