/* Plan files: parse, write, validate and generate parallel layouts (see plan.h
 * for the schema).  Parsing checks structure and types; mal_plan_validate()
 * checks the layout rules so that a plan built in memory (by the planner) and
 * one read from disk go through the same checks. */
#include "plan.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"

void mal_plan_init(mal_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->predicted_step_time = -1.0;
}

static void free_pipelines(mal_plan *plan)
{
    for (int p = 0; p < plan->n_pipelines; p++) {
        mal_plan_pipeline *pl = &plan->pipelines[p];
        for (int s = 0; s < pl->n_stages; s++)
            free(pl->stages[s].ranks);
        free(pl->stages);
    }
    free(plan->pipelines);
    plan->pipelines = NULL;
    plan->n_pipelines = 0;
}

void mal_plan_fini(mal_plan *plan)
{
    if (!plan) return;
    free_pipelines(plan);
    free(plan->suspended);
    free(plan->comment);
    mal_plan_init(plan);
}

int mal_plan_alloc_pipelines(mal_plan *plan, int n_pipelines)
{
    if (n_pipelines < 0)
        return MAL_ERR(MAL_EINVAL, "plan: negative pipeline count %d", n_pipelines);
    free_pipelines(plan);
    if (n_pipelines == 0) return 0;
    plan->pipelines = calloc((size_t)n_pipelines, sizeof *plan->pipelines);
    if (!plan->pipelines)
        return MAL_ERR(MAL_ENOMEM, "plan: out of memory for %d pipelines", n_pipelines);
    plan->n_pipelines = n_pipelines;
    for (int p = 0; p < n_pipelines; p++)
        plan->pipelines[p].predicted_time = -1.0;
    return 0;
}

int mal_plan_alloc_stages(mal_plan *plan, int p, int n_stages)
{
    if (p < 0 || p >= plan->n_pipelines || n_stages < 0)
        return MAL_ERR(MAL_EINVAL, "plan: bad pipeline %d or stage count %d", p, n_stages);
    mal_plan_pipeline *pl = &plan->pipelines[p];
    for (int s = 0; s < pl->n_stages; s++)
        free(pl->stages[s].ranks);
    free(pl->stages);
    pl->stages = NULL;
    pl->n_stages = 0;
    if (n_stages == 0) return 0;
    pl->stages = calloc((size_t)n_stages, sizeof *pl->stages);
    if (!pl->stages) return MAL_ERR(MAL_ENOMEM, "plan: out of memory for %d stages", n_stages);
    pl->n_stages = n_stages;
    return 0;
}

int mal_plan_set_stage(mal_plan *plan, int p, int s, int n_ranks, const int *ranks, int layer_begin,
                       int layer_end)
{
    if (p < 0 || p >= plan->n_pipelines || s < 0 || s >= plan->pipelines[p].n_stages || n_ranks < 0)
        return MAL_ERR(MAL_EINVAL, "plan: bad stage index pipelines[%d].stages[%d]", p, s);
    mal_plan_stage *st = &plan->pipelines[p].stages[s];
    int *r = NULL;
    if (n_ranks > 0) {
        r = malloc((size_t)n_ranks * sizeof *r);
        if (!r) return MAL_ERR(MAL_ENOMEM, "plan: out of memory");
        memcpy(r, ranks, (size_t)n_ranks * sizeof *r);
    }
    free(st->ranks);
    st->ranks = r;
    st->n_ranks = n_ranks;
    st->layer_begin = layer_begin;
    st->layer_end = layer_end;
    return 0;
}

int mal_plan_set_suspended(mal_plan *plan, int n, const int *ranks)
{
    int *r = NULL;
    if (n > 0) {
        r = malloc((size_t)n * sizeof *r);
        if (!r) return MAL_ERR(MAL_ENOMEM, "plan: out of memory");
        memcpy(r, ranks, (size_t)n * sizeof *r);
    }
    free(plan->suspended);
    plan->suspended = r;
    plan->n_suspended = n > 0 ? n : 0;
    return 0;
}

int mal_plan_copy(mal_plan *dst, const mal_plan *src)
{
    int rc;
    mal_plan_init(dst);
    dst->micro_batch_size = src->micro_batch_size;
    dst->predicted_step_time = src->predicted_step_time;
    if ((rc = mal_plan_alloc_pipelines(dst, src->n_pipelines))) goto fail;
    for (int p = 0; p < src->n_pipelines; p++) {
        const mal_plan_pipeline *sp = &src->pipelines[p];
        dst->pipelines[p].micro_batches = sp->micro_batches;
        dst->pipelines[p].predicted_time = sp->predicted_time;
        if ((rc = mal_plan_alloc_stages(dst, p, sp->n_stages))) goto fail;
        for (int s = 0; s < sp->n_stages; s++) {
            const mal_plan_stage *st = &sp->stages[s];
            if ((rc = mal_plan_set_stage(dst, p, s, st->n_ranks, st->ranks, st->layer_begin,
                                         st->layer_end)))
                goto fail;
            dst->pipelines[p].stages[s].warmup = st->warmup;
            dst->pipelines[p].stages[s].recompute = st->recompute;
        }
    }
    if ((rc = mal_plan_set_suspended(dst, src->n_suspended, src->suspended))) goto fail;
    if (src->comment) {
        dst->comment = strdup(src->comment);
        if (!dst->comment) {
            rc = MAL_ERR(MAL_ENOMEM, "plan: out of memory");
            goto fail;
        }
    }
    return 0;
fail:
    mal_plan_fini(dst);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Parsing                                                                  */

/* Read a JSON integer that must fit in an int. */
static int get_int(json_t *v, const char *what, const char *field, int *out)
{
    if (!json_is_integer(v)) return MAL_ERR(MAL_EFORMAT, "%s: %s must be an integer", what, field);
    json_int_t x = json_integer_value(v);
    if (x < INT_MIN || x > INT_MAX)
        return MAL_ERR(MAL_EFORMAT, "%s: %s = %lld does not fit in an int", what, field,
                       (long long)x);
    *out = (int)x;
    return 0;
}

static int get_int_array(json_t *arr, const char *what, const char *field, int **out, int *n)
{
    if (!json_is_array(arr))
        return MAL_ERR(MAL_EFORMAT, "%s: %s must be an array of integers", what, field);
    size_t len = json_array_size(arr);
    int *v = NULL;
    if (len > 0) {
        v = malloc(len * sizeof *v);
        if (!v) return MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
    }
    for (size_t i = 0; i < len; i++) {
        char f[96];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        int rc = get_int(json_array_get(arr, i), what, f, &v[i]);
        if (rc) {
            free(v);
            return rc;
        }
    }
    *out = v;
    *n = (int)len;
    return 0;
}

static int check_keys(json_t *obj, const char *const *allowed, const char *what, const char *where)
{
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        int ok = 0;
        for (int i = 0; allowed[i]; i++)
            if (!strcmp(key, allowed[i])) ok = 1;
        if (!ok)
            return MAL_ERR(MAL_EFORMAT, "%s: %s has unknown key \"%s\" (misspelt?)", what, where,
                           key);
    }
    return 0;
}

static int parse_json(mal_plan *plan, json_t *root, const char *what)
{
    static const char *const top_keys[] = {"format",    "micro_batch_size",    "pipelines",
                                           "suspended", "predicted_step_time", "comment",
                                           NULL};
    static const char *const pipe_keys[] = {"micro_batches", "stages", "predicted_time", NULL};
    static const char *const stage_keys[] = {"ranks", "layers", "warmup", "recompute", NULL};
    int rc;
    char field[128];

    if (!json_is_object(root))
        return MAL_ERR(MAL_EFORMAT, "%s: a plan must be a JSON object", what);
    if ((rc = check_keys(root, top_keys, what, "the plan"))) return rc;
    json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), MAL_PLAN_FORMAT))
        return MAL_ERR(MAL_EFORMAT, "%s: format must be \"%s\"", what, MAL_PLAN_FORMAT);
    json_t *mbs = json_object_get(root, "micro_batch_size");
    if (!mbs) return MAL_ERR(MAL_EFORMAT, "%s: micro_batch_size is missing", what);
    if ((rc = get_int(mbs, what, "micro_batch_size", &plan->micro_batch_size))) return rc;

    json_t *pst = json_object_get(root, "predicted_step_time");
    if (pst) {
        if (!json_is_number(pst))
            return MAL_ERR(MAL_EFORMAT, "%s: predicted_step_time must be a number", what);
        plan->predicted_step_time = json_number_value(pst);
    }
    json_t *cm = json_object_get(root, "comment");
    if (cm) {
        if (!json_is_string(cm)) return MAL_ERR(MAL_EFORMAT, "%s: comment must be a string", what);
        plan->comment = strdup(json_string_value(cm));
        if (!plan->comment) return MAL_ERR(MAL_ENOMEM, "%s: out of memory", what);
    }

    json_t *pipes = json_object_get(root, "pipelines");
    if (!json_is_array(pipes))
        return MAL_ERR(MAL_EFORMAT, "%s: pipelines must be an array of pipelines", what);
    if ((rc = mal_plan_alloc_pipelines(plan, (int)json_array_size(pipes)))) return rc;
    for (int p = 0; p < plan->n_pipelines; p++) {
        json_t *pj = json_array_get(pipes, (size_t)p);
        snprintf(field, sizeof field, "pipelines[%d]", p);
        if (!json_is_object(pj))
            return MAL_ERR(MAL_EFORMAT, "%s: %s must be an object", what, field);
        if ((rc = check_keys(pj, pipe_keys, what, field))) return rc;
        snprintf(field, sizeof field, "pipelines[%d].micro_batches", p);
        json_t *mb = json_object_get(pj, "micro_batches");
        if (!mb) return MAL_ERR(MAL_EFORMAT, "%s: %s is missing", what, field);
        if ((rc = get_int(mb, what, field, &plan->pipelines[p].micro_batches))) return rc;
        json_t *pt = json_object_get(pj, "predicted_time");
        if (pt) {
            if (!json_is_number(pt))
                return MAL_ERR(MAL_EFORMAT, "%s: pipelines[%d].predicted_time must be a number",
                               what, p);
            plan->pipelines[p].predicted_time = json_number_value(pt);
        }
        json_t *stages = json_object_get(pj, "stages");
        if (!json_is_array(stages))
            return MAL_ERR(MAL_EFORMAT, "%s: pipelines[%d].stages must be an array", what, p);
        if ((rc = mal_plan_alloc_stages(plan, p, (int)json_array_size(stages)))) return rc;
        for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
            json_t *sj = json_array_get(stages, (size_t)s);
            mal_plan_stage *st = &plan->pipelines[p].stages[s];
            snprintf(field, sizeof field, "pipelines[%d].stages[%d]", p, s);
            if (!json_is_object(sj))
                return MAL_ERR(MAL_EFORMAT, "%s: %s must be an object", what, field);
            if ((rc = check_keys(sj, stage_keys, what, field))) return rc;
            snprintf(field, sizeof field, "pipelines[%d].stages[%d].ranks", p, s);
            json_t *rj = json_object_get(sj, "ranks");
            if (!rj) return MAL_ERR(MAL_EFORMAT, "%s: %s is missing", what, field);
            if ((rc = get_int_array(rj, what, field, &st->ranks, &st->n_ranks))) return rc;
            snprintf(field, sizeof field, "pipelines[%d].stages[%d].layers", p, s);
            json_t *lj = json_object_get(sj, "layers");
            if (!json_is_array(lj) || json_array_size(lj) != 2)
                return MAL_ERR(MAL_EFORMAT, "%s: %s must be [start, end]", what, field);
            if ((rc = get_int(json_array_get(lj, 0), what, field, &st->layer_begin))) return rc;
            if ((rc = get_int(json_array_get(lj, 1), what, field, &st->layer_end))) return rc;
            json_t *wj = json_object_get(sj, "warmup");
            if (wj) {
                snprintf(field, sizeof field, "pipelines[%d].stages[%d].warmup", p, s);
                if ((rc = get_int(wj, what, field, &st->warmup))) return rc;
                if (st->warmup < 0) return MAL_ERR(MAL_EFORMAT, "%s: %s must be >= 0", what, field);
            }
            json_t *cj = json_object_get(sj, "recompute");
            if (cj) {
                snprintf(field, sizeof field, "pipelines[%d].stages[%d].recompute", p, s);
                if (!json_is_string(cj) ||
                    mal_recompute_parse(json_string_value(cj), &st->recompute))
                    return MAL_ERR(MAL_EFORMAT,
                                   "%s: %s must be \"none\", \"selective\" or \"full\"", what,
                                   field);
            }
        }
    }
    json_t *sus = json_object_get(root, "suspended");
    if (sus) {
        if ((rc = get_int_array(sus, what, "suspended", &plan->suspended, &plan->n_suspended)))
            return rc;
    }
    return 0;
}

int mal_plan_parse_buffer(mal_plan *plan, const char *buf, size_t len, const char *what)
{
    mal_plan_init(plan);
    if (!what) what = "plan";
    json_t *root;
    int rc = mal_json_parse(buf, len, what, &root);
    if (rc) return rc;
    rc = parse_json(plan, root, what);
    json_decref(root);
    return rc;
}

int mal_plan_parse_string(mal_plan *plan, const char *json, const char *what)
{
    return mal_plan_parse_buffer(plan, json, strlen(json), what);
}

/* The largest plan the planner writes (2^20 ranks, each a pipeline of its
 * own) is about 140 MB: the bound leaves room for it and stops a device
 * that never ends. */
#define PLAN_FILE_MAX_BYTES ((size_t)256 << 20)

int mal_plan_read(mal_plan *plan, const char *path)
{
    mal_plan_init(plan);
    json_t *root;
    int rc = mal_json_read(path, "plan", PLAN_FILE_MAX_BYTES, MAL_READ_REGULAR, &root);
    if (rc) return rc;
    rc = parse_json(plan, root, path);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */

typedef struct strbuf {
    char *s;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...)
{
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 1024;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static void sb_ints(strbuf *b, const int *v, int n)
{
    sb_printf(b, "[");
    for (int i = 0; i < n; i++)
        sb_printf(b, i ? ", %d" : "%d", v[i]);
    sb_printf(b, "]");
}

int mal_plan_to_string(const mal_plan *plan, char **out)
{
    strbuf b = {0};
    sb_printf(&b, "{\n  \"format\": \"%s\",\n  \"micro_batch_size\": %d,\n", MAL_PLAN_FORMAT,
              plan->micro_batch_size);
    if (plan->predicted_step_time >= 0)
        sb_printf(&b, "  \"predicted_step_time\": %.9g,\n", plan->predicted_step_time);
    if (plan->comment) {
        json_t *s = json_string(plan->comment);
        char *enc = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
        json_decref(s);
        if (!enc) {
            free(b.s);
            return MAL_ERR(MAL_EINVAL, "plan: comment is not valid UTF-8");
        }
        sb_printf(&b, "  \"comment\": %s,\n", enc);
        free(enc);
    }
    sb_printf(&b, "  \"pipelines\": [");
    for (int p = 0; p < plan->n_pipelines; p++) {
        const mal_plan_pipeline *pl = &plan->pipelines[p];
        sb_printf(&b, "%s\n    { \"micro_batches\": %d,", p ? "," : "", pl->micro_batches);
        if (pl->predicted_time >= 0)
            sb_printf(&b, " \"predicted_time\": %.9g,", pl->predicted_time);
        sb_printf(&b, "\n      \"stages\": [");
        for (int s = 0; s < pl->n_stages; s++) {
            const mal_plan_stage *st = &pl->stages[s];
            sb_printf(&b, "%s\n        { \"ranks\": ", s ? "," : "");
            sb_ints(&b, st->ranks, st->n_ranks);
            sb_printf(&b, ", \"layers\": [%d, %d]", st->layer_begin, st->layer_end);
            /* only a warm-up other than the default: plans without one keep
             * their bytes */
            if (st->warmup > 0 && st->warmup != pl->n_stages - s - 1)
                sb_printf(&b, ", \"warmup\": %d", st->warmup);
            if (st->recompute != MAL_RECOMPUTE_NONE)
                sb_printf(&b, ", \"recompute\": \"%s\"", mal_recompute_name(st->recompute));
            sb_printf(&b, " }");
        }
        sb_printf(&b, " ] }");
    }
    sb_printf(&b, " ],\n  \"suspended\": ");
    sb_ints(&b, plan->suspended, plan->n_suspended);
    sb_printf(&b, "\n}\n");
    if (b.failed) {
        free(b.s);
        return MAL_ERR(MAL_ENOMEM, "plan: out of memory while writing");
    }
    *out = b.s;
    return 0;
}

int mal_plan_write(const mal_plan *plan, const char *path)
{
    char *text = NULL;
    int rc = mal_plan_to_string(plan, &text);
    if (rc) return rc;
    /* Atomic for a regular file: readers see the old plan or the new one. */
    rc = mal_output_write_file(path, text, strlen(text));
    free(text);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                               */

static int is_pow2(int x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

int mal_plan_validate(const mal_plan *plan, int world_size, int n_layers, int n_heads,
                      int ffn_hidden, int global_batch)
{
    int rc = 0;
    /* where[r] encodes where rank r was first seen: 0 = not seen,
     * 1 + (p * 65536 + s) for a stage, -1 for suspended */
    long *where = NULL;
    if (world_size < 1) return MAL_ERR(MAL_EINVAL, "plan: world size %d must be >= 1", world_size);
    if (n_layers < 1) return MAL_ERR(MAL_EINVAL, "plan: model has %d layers", n_layers);
    if (plan->micro_batch_size < 1)
        return MAL_ERR(MAL_EINVAL, "micro_batch_size: must be >= 1 (got %d)",
                       plan->micro_batch_size);
    if (plan->n_pipelines < 1)
        return MAL_ERR(MAL_EINVAL, "pipelines: a plan needs at least one pipeline");
    where = calloc((size_t)world_size, sizeof *where);
    if (!where) return MAL_ERR(MAL_ENOMEM, "plan: out of memory");

    long total_mb = 0;
    for (int p = 0; p < plan->n_pipelines; p++) {
        const mal_plan_pipeline *pl = &plan->pipelines[p];
        if (pl->n_stages < 1) {
            rc =
                MAL_ERR(MAL_EINVAL, "pipelines[%d].stages: a pipeline needs at least one stage", p);
            goto cleanup;
        }
        int expect = 0;
        for (int s = 0; s < pl->n_stages; s++) {
            const mal_plan_stage *st = &pl->stages[s];
            int tp = st->n_ranks;
            if (tp < 1) {
                rc = MAL_ERR(MAL_EINVAL, "pipelines[%d].stages[%d].ranks: empty TP group", p, s);
                goto cleanup;
            }
            if (!is_pow2(tp)) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].ranks: TP size %d is not a power of two", p,
                             s, tp);
                goto cleanup;
            }
            if (n_heads % tp != 0) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].ranks: TP size %d does not divide n_heads "
                             "(%d)",
                             p, s, tp, n_heads);
                goto cleanup;
            }
            if (ffn_hidden % tp != 0) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].ranks: TP size %d does not divide "
                             "ffn_hidden (%d)",
                             p, s, tp, ffn_hidden);
                goto cleanup;
            }
            for (int k = 0; k < tp; k++) {
                int r = st->ranks[k];
                if (r < 0 || r >= world_size) {
                    rc = MAL_ERR(MAL_EINVAL,
                                 "pipelines[%d].stages[%d].ranks: rank %d is outside the world "
                                 "(ranks 0..%d)",
                                 p, s, r, world_size - 1);
                    goto cleanup;
                }
                if (where[r] > 0) {
                    long w = where[r] - 1;
                    rc = MAL_ERR(MAL_EINVAL,
                                 "pipelines[%d].stages[%d].ranks: rank %d appears more than once "
                                 "(also in pipelines[%ld].stages[%ld])",
                                 p, s, r, w / 65536, w % 65536);
                    goto cleanup;
                }
                where[r] = 1 + (long)p * 65536 + s;
            }
            if (st->layer_begin != expect) {
                if (s == 0)
                    rc = MAL_ERR(MAL_EINVAL,
                                 "pipelines[%d].stages[0].layers: the first stage must start at "
                                 "layer 0 (got %d)",
                                 p, st->layer_begin);
                else
                    rc = MAL_ERR(MAL_EINVAL,
                                 "pipelines[%d].stages[%d].layers: starts at layer %d but the "
                                 "previous stage ends at %d (layers must be contiguous)",
                                 p, s, st->layer_begin, expect);
                goto cleanup;
            }
            if (st->layer_end <= st->layer_begin) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].layers: empty layer range [%d, %d)", p, s,
                             st->layer_begin, st->layer_end);
                goto cleanup;
            }
            if (st->layer_end > n_layers) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].layers: end %d is beyond the model's %d "
                             "layers",
                             p, s, st->layer_end, n_layers);
                goto cleanup;
            }
            expect = st->layer_end;
        }
        if (expect != n_layers) {
            rc = MAL_ERR(MAL_EINVAL,
                         "pipelines[%d].stages[%d].layers: the last stage must end at layer %d "
                         "(got %d): every pipeline holds all layers",
                         p, pl->n_stages - 1, n_layers, expect);
            goto cleanup;
        }
        for (int s = 0; s < pl->n_stages; s++) {
            const mal_plan_stage *st = &pl->stages[s];
            if (st->warmup > 0 && st->warmup < pl->n_stages - s - 1) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].warmup: %d is below the 1F1B schedule's %d "
                             "for stage %d of %d",
                             p, s, st->warmup, pl->n_stages - s - 1, s, pl->n_stages);
                goto cleanup;
            }
            int w = st->warmup > 0 ? st->warmup : pl->n_stages - s - 1;
            int wn = s + 1 < pl->n_stages && pl->stages[s + 1].warmup > 0 ? pl->stages[s + 1].warmup
                                                                          : pl->n_stages - s - 2;
            if (s + 1 < pl->n_stages && w < wn) {
                rc = MAL_ERR(MAL_EINVAL,
                             "pipelines[%d].stages[%d].warmup: %d is below the next stage's %d "
                             "(a stage must warm up at least as deep as the one after it, or "
                             "the schedule deadlocks)",
                             p, s, w, wn);
                goto cleanup;
            }
        }
        if (pl->micro_batches < pl->n_stages) {
            rc = MAL_ERR(MAL_EINVAL,
                         "pipelines[%d].micro_batches: %d is fewer than the pipeline's %d stages "
                         "(1F1B needs at least one micro-batch per stage)",
                         p, pl->micro_batches, pl->n_stages);
            goto cleanup;
        }
        total_mb += pl->micro_batches;
        if (total_mb > INT_MAX) {
            rc = MAL_ERR(MAL_EINVAL,
                         "pipelines[%d].micro_batches: the micro-batches add up to more than "
                         "%d",
                         p, INT_MAX);
            goto cleanup;
        }
    }
    for (int i = 0; i < plan->n_suspended; i++) {
        int r = plan->suspended[i];
        if (r < 0 || r >= world_size) {
            rc = MAL_ERR(MAL_EINVAL, "suspended: rank %d is outside the world (ranks 0..%d)", r,
                         world_size - 1);
            goto cleanup;
        }
        if (where[r] != 0) {
            if (where[r] < 0)
                rc = MAL_ERR(MAL_EINVAL, "suspended: rank %d is listed twice", r);
            else
                rc = MAL_ERR(MAL_EINVAL,
                             "suspended: rank %d is also active in pipelines[%ld].stages[%ld]", r,
                             (where[r] - 1) / 65536, (where[r] - 1) % 65536);
            goto cleanup;
        }
        where[r] = -1;
    }
    for (int r = 0; r < world_size; r++) {
        if (where[r] == 0) {
            rc = MAL_ERR(MAL_EINVAL,
                         "pipelines: rank %d is in no stage and not suspended (every rank of the "
                         "world must appear exactly once)",
                         r);
            goto cleanup;
        }
    }
    if ((long)plan->micro_batch_size * total_mb > INT_MAX) {
        rc = MAL_ERR(MAL_EINVAL,
                     "micro_batch_size: %d x %ld micro-batches = %ld samples per step, more than "
                     "%d",
                     plan->micro_batch_size, total_mb, (long)plan->micro_batch_size * total_mb,
                     INT_MAX);
        goto cleanup;
    }
    if ((long)plan->micro_batch_size * total_mb != (long)global_batch) {
        rc = MAL_ERR(MAL_EINVAL,
                     "pipelines[].micro_batches: micro_batch_size %d x %ld micro-batches = %ld "
                     "samples, but the global batch is %d",
                     plan->micro_batch_size, total_mb, (long)plan->micro_batch_size * total_mb,
                     global_batch);
        goto cleanup;
    }
cleanup:
    free(where);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Uniform plans and lookups                                                */

int mal_plan_uniform(int dp, int tp, int pp, int n_layers, int micro_batch_size, int global_batch,
                     mal_plan *out)
{
    int rc;
    int *ranks = NULL;
    mal_plan_init(out);
    if (dp < 1 || tp < 1 || pp < 1)
        return MAL_ERR(MAL_EINVAL, "uniform plan: dp=%d tp=%d pp=%d must all be >= 1", dp, tp, pp);
    if (n_layers < pp)
        return MAL_ERR(MAL_EINVAL, "uniform plan: %d layers cannot fill %d stages", n_layers, pp);
    if (micro_batch_size < 1 || global_batch % micro_batch_size != 0)
        return MAL_ERR(MAL_EINVAL,
                       "uniform plan: global batch %d is not a multiple of micro_batch_size %d",
                       global_batch, micro_batch_size);
    int n_mb = global_batch / micro_batch_size;
    if (n_mb % dp != 0)
        return MAL_ERR(MAL_EINVAL,
                       "uniform plan: %d micro-batches cannot be split evenly over %d pipelines",
                       n_mb, dp);
    out->micro_batch_size = micro_batch_size;
    ranks = malloc((size_t)tp * sizeof *ranks);
    if (!ranks) return MAL_ERR(MAL_ENOMEM, "uniform plan: out of memory");
    if ((rc = mal_plan_alloc_pipelines(out, dp))) goto fail;
    for (int d = 0; d < dp; d++) {
        out->pipelines[d].micro_batches = n_mb / dp;
        if ((rc = mal_plan_alloc_stages(out, d, pp))) goto fail;
        int begin = 0;
        for (int s = 0; s < pp; s++) {
            int n = n_layers / pp + (s < n_layers % pp ? 1 : 0);
            for (int t = 0; t < tp; t++)
                ranks[t] = (d * pp + s) * tp + t;
            if ((rc = mal_plan_set_stage(out, d, s, tp, ranks, begin, begin + n))) goto fail;
            begin += n;
        }
    }
    free(ranks);
    return 0;
fail:
    free(ranks);
    mal_plan_fini(out);
    return rc;
}

int mal_plan_locate(const mal_plan *plan, int rank, mal_plan_loc *loc)
{
    for (int p = 0; p < plan->n_pipelines; p++)
        for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
            const mal_plan_stage *st = &plan->pipelines[p].stages[s];
            for (int k = 0; k < st->n_ranks; k++)
                if (st->ranks[k] == rank) {
                    loc->pipeline = p;
                    loc->stage = s;
                    loc->tp_rank = k;
                    loc->tp_size = st->n_ranks;
                    return 0;
                }
        }
    for (int i = 0; i < plan->n_suspended; i++)
        if (plan->suspended[i] == rank) {
            loc->pipeline = loc->stage = loc->tp_rank = -1;
            loc->tp_size = 0;
            return 0;
        }
    return MAL_ERR(MAL_ENOENT, "plan: rank %d is neither in a stage nor suspended", rank);
}

int mal_plan_n_active(const mal_plan *plan)
{
    int n = 0;
    for (int p = 0; p < plan->n_pipelines; p++)
        for (int s = 0; s < plan->pipelines[p].n_stages; s++)
            n += plan->pipelines[p].stages[s].n_ranks;
    return n;
}

int mal_plan_world_size(const mal_plan *plan)
{
    int mx = -1;
    for (int p = 0; p < plan->n_pipelines; p++)
        for (int s = 0; s < plan->pipelines[p].n_stages; s++) {
            const mal_plan_stage *st = &plan->pipelines[p].stages[s];
            for (int k = 0; k < st->n_ranks; k++)
                mx = MAL_MAX(mx, st->ranks[k]);
        }
    for (int i = 0; i < plan->n_suspended; i++)
        mx = MAL_MAX(mx, plan->suspended[i]);
    return mx + 1;
}

/* Counts of a plan read from outside may not fit an int: -1 then. */
int mal_plan_n_micro_batches(const mal_plan *plan)
{
    long long n = 0;
    for (int p = 0; p < plan->n_pipelines; p++) {
        n += plan->pipelines[p].micro_batches;
        if (n > INT_MAX || n < INT_MIN) return -1;
    }
    return (int)n;
}

int mal_plan_global_batch(const mal_plan *plan)
{
    int n = mal_plan_n_micro_batches(plan);
    long long g = (long long)plan->micro_batch_size * n;
    return n < 0 || g > INT_MAX || g < INT_MIN ? -1 : (int)g;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static const char *const recompute_names[MAL_RECOMPUTE_COUNT] = {"none", "selective", "full"};

const char *mal_recompute_name(int mode)
{
    return mode >= 0 && mode < MAL_RECOMPUTE_COUNT ? recompute_names[mode] : "?";
}

int mal_recompute_parse(const char *name, int *mode)
{
    for (int i = 0; i < MAL_RECOMPUTE_COUNT; i++)
        if (name && !strcmp(name, recompute_names[i])) {
            *mode = i;
            return 0;
        }
    return MAL_ERR(MAL_EINVAL, "recompute: \"%s\" is not a mode (none, selective, full)",
                   name ? name : "");
}

int mal_plan_stage_warmup(const mal_plan_pipeline *pl, int j)
{
    int w = pl->stages[j].warmup > 0 ? pl->stages[j].warmup : pl->n_stages - j - 1;
    return w < pl->micro_batches ? w : pl->micro_batches;
}

int mal_plan_same_layout(const mal_plan *a, const mal_plan *b)
{
    if (a->micro_batch_size != b->micro_batch_size || a->n_pipelines != b->n_pipelines ||
        a->n_suspended != b->n_suspended)
        return 0;
    for (int p = 0; p < a->n_pipelines; p++) {
        const mal_plan_pipeline *x = &a->pipelines[p], *y = &b->pipelines[p];
        if (x->micro_batches != y->micro_batches || x->n_stages != y->n_stages) return 0;
        for (int s = 0; s < x->n_stages; s++) {
            const mal_plan_stage *u = &x->stages[s], *v = &y->stages[s];
            if (u->n_ranks != v->n_ranks || u->layer_begin != v->layer_begin ||
                u->layer_end != v->layer_end ||
                mal_plan_stage_warmup(x, s) != mal_plan_stage_warmup(y, s) ||
                u->recompute != v->recompute)
                return 0;
            if (u->n_ranks && memcmp(u->ranks, v->ranks, (size_t)u->n_ranks * sizeof(int)))
                return 0;
        }
    }
    if (a->n_suspended == 0) return 1;
    int *sa = malloc((size_t)a->n_suspended * sizeof(int));
    int *sb = malloc((size_t)a->n_suspended * sizeof(int));
    int same = 0;
    if (sa && sb) {
        memcpy(sa, a->suspended, (size_t)a->n_suspended * sizeof(int));
        memcpy(sb, b->suspended, (size_t)a->n_suspended * sizeof(int));
        qsort(sa, (size_t)a->n_suspended, sizeof(int), cmp_int);
        qsort(sb, (size_t)a->n_suspended, sizeof(int), cmp_int);
        same = !memcmp(sa, sb, (size_t)a->n_suspended * sizeof(int));
    }
    free(sa);
    free(sb);
    return same;
}

/* FNV-1a over 32-bit words. */
static uint64_t id_mix(uint64_t h, uint32_t w)
{
    for (int i = 0; i < 4; i++) {
        h ^= (w >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}

void mal_plan_id(const mal_plan *plan, char out[MAL_PLAN_ID_LEN])
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = id_mix(h, (uint32_t)plan->micro_batch_size);
    h = id_mix(h, (uint32_t)plan->n_pipelines);
    for (int p = 0; p < plan->n_pipelines; p++) {
        const mal_plan_pipeline *pl = &plan->pipelines[p];
        h = id_mix(h, (uint32_t)pl->micro_batches);
        h = id_mix(h, (uint32_t)pl->n_stages);
        for (int s = 0; s < pl->n_stages; s++) {
            const mal_plan_stage *st = &pl->stages[s];
            h = id_mix(h, (uint32_t)st->layer_begin);
            h = id_mix(h, (uint32_t)st->layer_end);
            h = id_mix(h, (uint32_t)st->n_ranks);
            for (int r = 0; r < st->n_ranks; r++)
                h = id_mix(h, (uint32_t)st->ranks[r]);
            /* mixed in only where not the default: the ids of plans
             * without warm-up depths stay what they were */
            if (st->warmup > 0 && st->warmup != pl->n_stages - s - 1)
                h = id_mix(h, 0x80000000u | (uint32_t)st->warmup);
            if (st->recompute != MAL_RECOMPUTE_NONE)
                h = id_mix(h, 0x40000000u | (uint32_t)st->recompute);
        }
    }
    /* the suspended ranks are a set (mal_plan_same_layout): an order-free sum */
    uint64_t s = 0;
    for (int i = 0; i < plan->n_suspended; i++)
        s += id_mix(0xcbf29ce484222325ull, (uint32_t)plan->suspended[i]);
    h = id_mix(h, (uint32_t)plan->n_suspended);
    h = id_mix(id_mix(h, (uint32_t)s), (uint32_t)(s >> 32));
    snprintf(out, MAL_PLAN_ID_LEN, "%08x", (unsigned)(uint32_t)(h ^ (h >> 32)));
}
