/* Slow links (README "Links"): the list of rank pairs whose messages are
 * slow, read from a file or from malleus-train's metrics, and the
 * communication terms of the cost model -- the TP all-reduce of a group per
 * layer, the activation sent across a stage boundary per micro-batch, the
 * gradient sum of the layers two pipelines share per step -- and the
 * pipeline time with them, under a per-stage warm-up depth of the 1F1B
 * schedule. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "base/mal.h"
#include "replan.h"

/* ---- the list ------------------------------------------------------------ */

void mal_links_fini(mal_links *ln)
{
    if (!ln) return;
    free(ln->l);
    memset(ln, 0, sizeof *ln);
}

static int find(const mal_links *ln, int a, int b)
{
    int lo = 0, hi = ln->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const mal_link *x = &ln->l[mid];
        if (x->a == a && x->b == b) return mid;
        if (x->a < a || (x->a == a && x->b < b))
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -(lo + 1);
}

int mal_links_set(mal_links *ln, int a, int b, double rate)
{
    if (a > b) {
        int t = a;
        a = b;
        b = t;
    }
    int i = find(ln, a, b);
    if (i >= 0) {
        ln->l[i].rate = rate;
        return 0;
    }
    i = -i - 1;
    mal_link *n = realloc(ln->l, (size_t)(ln->n + 1) * sizeof *n);
    if (!n) return MAL_ERR(MAL_ENOMEM, "links: out of memory");
    ln->l = n;
    memmove(n + i + 1, n + i, (size_t)(ln->n - i) * sizeof *n);
    n[i] = (mal_link){a, b, rate};
    ln->n++;
    return 0;
}

double mal_links_rate(const mal_links *ln, int a, int b)
{
    if (!ln || ln->n == 0 || a == b) return 1.0;
    int i = find(ln, a < b ? a : b, a < b ? b : a);
    return i >= 0 ? mal_cost_floor(ln->l[i].rate) : 1.0;
}

int mal_links_any(const mal_links *ln)
{
    if (!ln) return 0;
    for (int i = 0; i < ln->n; i++)
        if (mal_cost_floor(ln->l[i].rate) > 1.0) return 1;
    return 0;
}

/* One sample of pair (a, b) from JSON `v` at `where`. */
static int pair_of(json_t *a, json_t *b, json_t *r, const char *what, const char *where, int world,
                   int *ia, int *ib, double *rate)
{
    if (!json_is_integer(a) || !json_is_integer(b))
        return MAL_ERR(MAL_EFORMAT, "%s: %s: a link names two ranks (integers)", what, where);
    json_int_t x = json_integer_value(a), y = json_integer_value(b);
    if (x < 0 || y < 0 || x >= world || y >= world)
        return MAL_ERR(MAL_EINVAL, "%s: %s: link %lld-%lld names a rank outside the world (0..%d)",
                       what, where, (long long)x, (long long)y, world - 1);
    if (x == y)
        return MAL_ERR(MAL_EINVAL, "%s: %s: link %lld-%lld joins a rank to itself", what, where,
                       (long long)x, (long long)y);
    if (!json_is_number(r) || !isfinite(json_number_value(r)) || !(json_number_value(r) > 0))
        return MAL_ERR(MAL_EINVAL, "%s: %s: link %lld-%lld: the rate must be a positive number",
                       what, where, (long long)x, (long long)y);
    *ia = (int)MAL_MIN(x, y);
    *ib = (int)MAL_MAX(x, y);
    *rate = json_number_value(r);
    return 0;
}

/* Samples of the metrics lines: per pair the last `window`, in order. */
typedef struct sample_set {
    int n, cap;
    struct {
        int a, b, k;
        double v[16];
    } * s;
} sample_set;

static int add_sample(sample_set *ss, int a, int b, double v, int window)
{
    for (int i = 0; i < ss->n; i++)
        if (ss->s[i].a == a && ss->s[i].b == b) {
            if (ss->s[i].k == window) {
                memmove(ss->s[i].v, ss->s[i].v + 1, (size_t)(window - 1) * sizeof(double));
                ss->s[i].k--;
            }
            ss->s[i].v[ss->s[i].k++] = v;
            return 0;
        }
    if (ss->n == ss->cap) {
        int cap = ss->cap ? 2 * ss->cap : 16;
        void *n = realloc(ss->s, (size_t)cap * sizeof *ss->s);
        if (!n) return MAL_ERR(MAL_ENOMEM, "links: out of memory");
        ss->s = n;
        ss->cap = cap;
    }
    ss->s[ss->n].a = a;
    ss->s[ss->n].b = b;
    ss->s[ss->n].k = 1;
    ss->s[ss->n].v[0] = v;
    ss->n++;
    return 0;
}

int mal_links_parse_buffer(const char *buf, size_t len, const char *what, int world, int window,
                           mal_links *ln)
{
    memset(ln, 0, sizeof *ln);
    int rc = 0;
    if (window < 1) window = 1;
    if (window > 16) window = 16;
    json_t *root = NULL;
    /* one object with "links" */
    if (mal_json_parse(buf, len, what, &root) == 0 && json_is_object(root) &&
        json_object_get(root, "links")) {
        mal_clearerr();
        json_t *arr = json_object_get(root, "links");
        if (!json_is_array(arr)) {
            rc = MAL_ERR(MAL_EFORMAT, "%s: links must be a list of {\"a\", \"b\", \"rate\"}", what);
            goto done;
        }
        for (size_t i = 0; i < json_array_size(arr); i++) {
            json_t *o = json_array_get(arr, i);
            char where[32];
            snprintf(where, sizeof where, "links[%zu]", i);
            int a, b;
            double r;
            if (!json_is_object(o)) {
                rc = MAL_ERR(MAL_EFORMAT, "%s: %s must be an object {\"a\", \"b\", \"rate\"}", what,
                             where);
                goto done;
            }
            if ((rc = pair_of(json_object_get(o, "a"), json_object_get(o, "b"),
                              json_object_get(o, "rate"), what, where, world, &a, &b, &r)))
                goto done;
            if (mal_cost_floor(r) > 1.0 && (rc = mal_links_set(ln, a, b, r))) goto done;
        }
        goto done;
    }
    mal_clearerr();
    if (root) json_decref(root);
    root = NULL;
    /* JSON lines: the rows of a metrics file that carry link_rates */
    sample_set ss = {0};
    size_t pos = 0;
    int line = 0;
    while (pos < len && !rc) {
        size_t e = pos;
        while (e < len && buf[e] != '\n')
            e++;
        line++;
        size_t a0 = pos;
        while (a0 < e && (buf[a0] == ' ' || buf[a0] == '\t' || buf[a0] == '\r'))
            a0++;
        if (a0 < e && memchr(buf + a0, 'l', e - a0) && e - a0 > 10) {
            json_t *row;
            json_error_t jerr;
            row = json_loadb(buf + a0, e - a0, 0, &jerr);
            json_t *lr = row && json_is_object(row) ? json_object_get(row, "link_rates") : NULL;
            if (lr) {
                char where[48];
                snprintf(where, sizeof where, "line %d: link_rates", line);
                if (!json_is_array(lr))
                    rc = MAL_ERR(MAL_EFORMAT, "%s: %s must be a list of [a, b, rate]", what, where);
                for (size_t i = 0; !rc && i < json_array_size(lr); i++) {
                    json_t *t = json_array_get(lr, i);
                    int a, b;
                    double r;
                    if (!json_is_array(t) || json_array_size(t) != 3) {
                        rc = MAL_ERR(MAL_EFORMAT, "%s: %s[%zu] must be [a, b, rate]", what, where,
                                     i);
                        break;
                    }
                    rc = pair_of(json_array_get(t, 0), json_array_get(t, 1), json_array_get(t, 2),
                                 what, where, world, &a, &b, &r);
                    if (!rc) rc = add_sample(&ss, a, b, r, window);
                }
            }
            if (row) json_decref(row);
        }
        pos = e + 1;
    }
    for (int i = 0; !rc && i < ss.n; i++) {
        double m = 0;
        for (int k = 0; k < ss.s[i].k; k++)
            m += ss.s[i].v[k];
        m /= ss.s[i].k;
        if (mal_cost_floor(m) > 1.0) rc = mal_links_set(ln, ss.s[i].a, ss.s[i].b, m);
    }
    free(ss.s);
done:
    if (root) json_decref(root);
    if (rc) mal_links_fini(ln);
    return rc;
}

int mal_links_read(const char *path, int world, int window, mal_links *ln)
{
    memset(ln, 0, sizeof *ln);
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc =
        mal_file_read(path, "links file", MAL_REPLAN_MAX_RATES_BYTES, MAL_READ_REGULAR, &buf, &len);
    if (rc) return rc;
    rc = mal_links_parse_buffer((const char *)buf, len, path, world, window, ln);
    free(buf);
    return rc;
}

/* ---- communication terms (layer units) ----------------------------------- */

static int same_node(const mal_cluster *c, int a, int b)
{
    return a >= 0 && b >= 0 && a < c->world_size && b < c->world_size &&
           c->node_of[a] == c->node_of[b];
}

/* Seconds of `n` bytes over a healthy link, within a node or between. */
static double msg_seconds(const mal_profile *p, int intra, double n)
{
    double lat = p->link_latency, bw = p->link_bandwidth;
    if (!intra && p->node_link_bandwidth > 0) {
        lat = p->node_link_latency;
        bw = p->node_link_bandwidth;
    }
    return bw > 0 ? lat + n / bw : 0.0;
}

/* What a message of base time `base` costs over a link of rate f: all of
 * it, or only the slowness beyond a healthy link's where alpha includes
 * that (comm_in_alpha). */
static double charge(const mal_profile *p, double f, double base)
{
    return (p->comm_in_alpha ? f - 1.0 : f) * base;
}

static double units(const mal_profile *p, double seconds)
{
    return p->layer_time > 0 ? seconds / p->layer_time : 0.0;
}

double mal_cost_tp_comm(const mal_profile *p, const mal_cluster *c, const mal_links *ln,
                        const int *ranks, int n)
{
    if (n < 2 || !(p->link_bandwidth > 0)) return 0.0;
    /* a ring all-reduce: 2 (g - 1) steps, each of 1/g of the data, over
     * every link of the ring; the slowest link paces every step */
    double worst = 0;
    for (int k = 0; k < n; k++) {
        int a = ranks[k], b = ranks[(k + 1) % n];
        int intra = same_node(c, a, b);
        double per = 2.0 * (n - 1) * (msg_seconds(p, intra, p->activation_bytes / n));
        worst = MAL_MAX(worst, charge(p, mal_links_rate(ln, a, b), per));
    }
    return units(p, p->tp_allreduces * worst);
}

double mal_cost_p2p(const mal_profile *p, const mal_cluster *c, const mal_links *ln,
                    const mal_plan_stage *from, const mal_plan_stage *to)
{
    if (!(p->link_bandwidth > 0)) return 0.0;
    /* receiver r of `to` gets the activation from sender r mod |from|
     * (train/pipeline.c); the slowest pair delays the micro-batch */
    double worst = 0;
    for (int r = 0; r < to->n_ranks; r++) {
        int a = from->ranks[r % from->n_ranks], b = to->ranks[r];
        double base = msg_seconds(p, same_node(c, a, b), p->activation_bytes);
        worst = MAL_MAX(worst, charge(p, mal_links_rate(ln, a, b), base));
    }
    return units(p, worst);
}

double mal_cost_stage_links_time(const mal_profile *p, const mal_cluster *c, const mal_links *ln,
                                 const mal_plan_stage *st, double y)
{
    /* recomputation adds its share of the compute; full recomputation
     * runs the forward pass again, with its all-reduces (half of them) */
    double tp = mal_cost_tp_comm(p, c, ln, st->ranks, st->n_ranks);
    double again = st->recompute == MAL_RECOMPUTE_FULL ? 0.5 : 0.0;
    return (st->layer_end - st->layer_begin) *
           (y * mal_cost_stage_factor(mal_cost_stage_profile(p, c, st), st) + tp * (1.0 + again));
}

int mal_cost_pipeline_links(const mal_plan_pipeline *pl, const mal_profile *p, const mal_cluster *c,
                            const double *rates, const mal_links *ln, int choose, int *warm,
                            double *T_out, double *Peff_out)
{
    int S = pl->n_stages, m = pl->micro_batches;
    double *cj = malloc((size_t)S * 2 * sizeof *cj);
    if (!cj) return MAL_ERR(MAL_ENOMEM, "cost model: out of memory");
    double *dj = cj + S; /* dj[j]: boundary j -> j + 1, one way */
    double P = 0, sum_d = 0;
    for (int j = 0; j < S; j++) {
        const mal_plan_stage *st = &pl->stages[j];
        double a = mal_profile_alpha(mal_cost_stage_profile(p, c, st), st->n_ranks), x = 1.0;
        if (a <= 0) {
            free(cj);
            return MAL_ERR(MAL_EINVAL, "cost model: TP size %d has no alpha", st->n_ranks);
        }
        for (int k = 0; k < st->n_ranks; k++) {
            int r = st->ranks[k];
            if (r >= 0 && r < c->world_size) x = MAL_MAX(x, mal_cost_floor(rates[r]));
        }
        cj[j] = mal_cost_stage_links_time(p, c, ln, st, x * a);
        dj[j] = j + 1 < S ? mal_cost_p2p(p, c, ln, st, &pl->stages[j + 1]) : 0.0;
        P = MAL_MAX(P, cj[j]);
        sum_d += dj[j];
    }
    /* The steady state (README "Links"): between stage k's backward of
     * micro-batch i and that of i + w_k + 1 lies a whole round trip R_k
     * from stage k to the last stage and back (its forward, every later
     * stage's forward and backward, every boundary twice), so the period
     * is at least R_k / (w_k + 1) besides every stage's own time. */
    double Peff = P, R = 0;
    for (int k = S - 1; k >= 0; k--) {
        R += cj[k] + (k + 1 < S ? 2 * dj[k] : 0);
        if (choose) {
            /* the least depth whose window covers the round trip, within
             * memory and the micro-batches; never below the 1F1B default */
            double need = P > 0 ? ceil(R / P * (1 - 1e-12)) - 1 : 0;
            int w = (int)MAL_MIN(need, (double)(m - 1));
            w = MAL_MAX(w, MAL_MIN(S - k - 1, m));
            const mal_plan_stage *st = &pl->stages[k];
            int l = st->layer_end - st->layer_begin;
            /* its own type's memory and profile */
            double mem = mal_cost_stage_capacity(c, st);
            const mal_profile *ps = mal_cost_stage_profile(p, c, st);
            while (w > S - k - 1 && mal_cost_stage_need(ps, st->n_ranks, S, k, l, w, 0,
                                                        st->recompute) > mem * (1 + 1e-12))
                w--;
            warm[k] = w;
        }
    }
    if (choose) /* no stage may warm up less than the one after it */
        for (int k = 1; k < S; k++)
            warm[k] = MAL_MIN(warm[k], warm[k - 1]);
    R = 0;
    for (int k = S - 1; k >= 0; k--) {
        R += cj[k] + (k + 1 < S ? 2 * dj[k] : 0);
        int w = warm ? warm[k] : MAL_MIN(S - k - 1, m);
        Peff = MAL_MAX(Peff, R / (MAL_MIN(w, m - 1) + 1));
    }
    free(cj);
    /* fill and drain cross every boundary once each way */
    *T_out = (m + S - 1) * Peff + 2 * sum_d;
    if (Peff_out) *Peff_out = Peff;
    return 0;
}

double mal_cost_dp_comm(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                        const mal_links *ln)
{
    if (!ln || ln->n == 0 || !(p->link_bandwidth > 0)) return 0.0;
    double worst = 0;
    for (int i = 0; i < ln->n; i++) {
        double f = mal_cost_floor(ln->l[i].rate);
        if (f <= 1.0) continue;
        mal_plan_loc la, lb;
        if (mal_plan_locate(plan, ln->l[i].a, &la) || mal_plan_locate(plan, ln->l[i].b, &lb) ||
            la.pipeline < 0 || lb.pipeline < 0 || la.pipeline == lb.pipeline)
            continue;
        const mal_plan_stage *sa = &plan->pipelines[la.pipeline].stages[la.stage];
        const mal_plan_stage *sb = &plan->pipelines[lb.pipeline].stages[lb.stage];
        int ov = MAL_MIN(sa->layer_end, sb->layer_end) - MAL_MAX(sa->layer_begin, sb->layer_begin);
        if (ov <= 0) continue;
        /* the two hold shards of the same layers: their gradient sum (a
         * ring, each byte of the larger shard twice) runs over the link */
        double n = p->grad_bytes * ov / MAL_MIN(sa->n_ranks, sb->n_ranks);
        double base = 2 * msg_seconds(p, same_node(c, ln->l[i].a, ln->l[i].b), n);
        worst = MAL_MAX(worst, (f - 1.0) * base);
    }
    return units(p, worst);
}

int mal_cost_plan_links(const mal_plan *plan, const mal_profile *p, const mal_cluster *c,
                        const double *rates, const mal_links *ln, double *time, double *J_out)
{
    double J = 0;
    for (int i = 0; i < plan->n_pipelines; i++) {
        const mal_plan_pipeline *pl = &plan->pipelines[i];
        int *warm = malloc((size_t)pl->n_stages * sizeof *warm);
        if (!warm) return MAL_ERR(MAL_ENOMEM, "cost model: out of memory");
        for (int j = 0; j < pl->n_stages; j++)
            warm[j] = mal_plan_stage_warmup(pl, j);
        double T;
        int rc = mal_cost_pipeline_links(pl, p, c, rates, ln, 0, warm, &T, NULL);
        free(warm);
        if (rc) return rc;
        if (time) time[i] = T;
        J = MAL_MAX(J, T);
    }
    *J_out = J + mal_cost_dp_comm(plan, p, c, ln);
    return 0;
}
