/* Step A of the planner: nodes, node situations (classes) and the candidate
 * TP groupings ("options") of each situation's non-full positions.
 *
 * A node's ranks are sorted by floored rate (ties by rank).  Its healthy
 * ranks fill floor(h / tp) nominal groups ("healthy full groups"; groups of
 * the current plan that are still whole and healthy first, in TP order).  The
 * other R positions -- leftover healthy ranks, then stragglers, slowest last
 * -- are grouped by an option: suspend the slowest u (0 <= u <= R), and cut
 * the rest, in order, into consecutive blocks of any sizes the profile
 * allows (every ordered composition).  Why consecutive blocks of the sorted
 * positions and the slowest suspended lose nothing: if a plan puts a faster
 * rank f in a group A slower than the group B holding a slower rank s
 * (max A >= max B > ... ), swapping f and s leaves max A unchanged and does
 * not raise max B; suspending s instead of a faster active f likewise slows
 * no group.  Memory depends on group sizes only.  So some optimal plan
 * groups every node this way.
 *
 * Options with the same multiset of (size, rate) groups are one option; an
 * option is dropped when another one has as many groups and a one-to-one
 * matching in which every group is at least as large (less memory per rank)
 * and at least as fast: any plan using the dropped one runs the other in the
 * same stages no slower, within memory. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "search.h"

/* A class beyond this many compositions falls back to the restricted rule
 * (whole or halving chunks, suspending stragglers only): only nominal TP
 * sizes far above 8 get there. */
#define RP_MAX_COMPOSITIONS 200000

int rp_cmp_sgrp(const void *a, const void *b)
{
    const sgrp *u = a, *v = b;
    if (u->size != v->size) return u->size > v->size ? -1 : 1;
    if (u->y != v->y) return u->y < v->y ? -1 : 1;
    return 0;
}

double rp_alpha(const ctx *c, int s)
{
    if (c->p->n_heads > 0 && c->p->n_heads % s) return 0;
    if (c->p->ffn_hidden > 0 && c->p->ffn_hidden % s) return 0;
    return mal_profile_alpha(c->p, s);
}

/* ---- hashing of keys --------------------------------------------------- */

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

/* A growable string set (open addressing); returns the index of `key`,
 * inserting it when new (*is_new = 1).  -1 when out of memory. */
typedef struct strset {
    size_t cap, n;
    char **keys;
    int *val;
} strset;

static void strset_free(strset *s)
{
    for (size_t i = 0; i < s->cap; i++)
        free(s->keys[i]);
    free(s->keys);
    free(s->val);
    memset(s, 0, sizeof *s);
}

static int strset_put(strset *s, const char *key, int val, int *is_new)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 64;
        char **nk = calloc(ncap, sizeof *nk);
        int *nv = calloc(ncap, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return -1;
        }
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->keys[i]) continue;
            size_t j = fnv(s->keys[i]) & (ncap - 1);
            while (nk[j])
                j = (j + 1) & (ncap - 1);
            nk[j] = s->keys[i];
            nv[j] = s->val[i];
        }
        free(s->keys);
        free(s->val);
        s->keys = nk;
        s->val = nv;
        s->cap = ncap;
    }
    size_t j = fnv(key) & (s->cap - 1);
    while (s->keys[j] && strcmp(s->keys[j], key))
        j = (j + 1) & (s->cap - 1);
    if (s->keys[j]) {
        *is_new = 0;
        return s->val[j];
    }
    s->keys[j] = strdup(key);
    if (!s->keys[j]) return -1;
    s->val[j] = val;
    s->n++;
    *is_new = 1;
    return val;
}

/* ---- option generation ------------------------------------------------- */

typedef struct optgen {
    const ctx *c;
    const double *xr; /* [R] rates by position */
    int a;            /* active positions of this u */
    int *sizes;       /* current composition */
    int n;
    long visited;
    nopt *opts;
    int n_opts, cap_opts;
    strset seen;
    char *key;
    size_t key_cap;
    int oom;
} optgen;

/* Record the composition in g->sizes as an option unless an equal multiset
 * of groups is known. */
static void add_option(optgen *g, const int *sizes, int n, int a)
{
    sgrp *grp = malloc((size_t)(n > 0 ? n : 1) * sizeof *grp);
    sgrp *srt = malloc((size_t)(n > 0 ? n : 1) * sizeof *srt);
    if (!grp || !srt) goto oom;
    int pos = 0;
    double cap = 0;
    for (int i = 0; i < n; i++) {
        /* positions are sorted by rate: the block's slowest is its last */
        grp[i] = (sgrp){sizes[i], g->xr[pos + sizes[i] - 1] * rp_alpha(g->c, sizes[i])};
        cap += 1.0 / grp[i].y;
        pos += sizes[i];
    }
    memcpy(srt, grp, (size_t)n * sizeof *srt);
    qsort(srt, (size_t)n, sizeof *srt, rp_cmp_sgrp);
    size_t need = 16 + (size_t)n * 40;
    if (need > g->key_cap) {
        char *nk = realloc(g->key, need);
        if (!nk) goto oom;
        g->key = nk;
        g->key_cap = need;
    }
    int len = snprintf(g->key, need, "%d", n);
    for (int i = 0; i < n; i++)
        len += snprintf(g->key + len, need - (size_t)len, "|%d:%a", srt[i].size, srt[i].y);
    int is_new;
    if (strset_put(&g->seen, g->key, g->n_opts, &is_new) < 0) goto oom;
    free(srt);
    if (!is_new) {
        free(grp);
        return;
    }
    if (mal_grow(&g->opts, &g->cap_opts, g->n_opts, sizeof *g->opts, 16)) {
        free(grp);
        g->oom = 1;
        return;
    }
    g->opts[g->n_opts++] = (nopt){n, grp, a, cap};
    return;
oom:
    free(grp);
    free(srt);
    g->oom = 1;
}

/* Every ordered composition of positions [p, a) into allowed sizes. */
static void compositions(optgen *g, int p)
{
    if (g->oom || g->visited > RP_MAX_COMPOSITIONS) return;
    if (p == g->a) {
        g->visited++;
        add_option(g, g->sizes, g->n, g->a);
        return;
    }
    for (int s = 1; p + s <= g->a; s *= 2) {
        if (rp_alpha(g->c, s) <= 0) continue;
        g->sizes[g->n++] = s;
        compositions(g, p + s);
        g->n--;
    }
}

/* The restricted rule (issue 4's planner): suspend u of the stragglers,
 * then chunks of tp, each whole or cut into halving groups, then the binary
 * decomposition of the remainder. */
static void restricted_options(optgen *g, int R, int n_strag)
{
    int t = g->c->t;
    for (int u = 0; u <= n_strag; u++) {
        int a = R - u;
        for (int split = 0; split <= 1; split++) {
            int n = 0, ok = 1;
            for (int k = 0; k < a / t; k++) {
                if (split && t > 1) {
                    for (int s = t / 2; s >= 1; s /= 2)
                        g->sizes[n++] = s;
                    g->sizes[n++] = 1;
                } else {
                    g->sizes[n++] = t;
                }
            }
            for (int s = t / 2; s >= 1; s /= 2)
                if ((a % t) & s) g->sizes[n++] = s;
            for (int i = 0; i < n; i++)
                ok &= rp_alpha(g->c, g->sizes[i]) > 0;
            if (ok) add_option(g, g->sizes, n, a);
        }
    }
}

/* Kuhn's matching: can every group of b be matched to a distinct group of a
 * that is at least as large and at least as fast? */
static int match_dfs(const nopt *a, const nopt *b, int i, int *owner, char *seen)
{
    for (int j = 0; j < a->n_groups; j++) {
        if (seen[j] || a->g[j].size < b->g[i].size || a->g[j].y > b->g[i].y) continue;
        seen[j] = 1;
        if (owner[j] < 0 || match_dfs(a, b, owner[j], owner, seen)) {
            owner[j] = i;
            return 1;
        }
    }
    return 0;
}

static int dominates(const nopt *a, const nopt *b, int *owner, char *seen)
{
    if (a->n_groups != b->n_groups) return 0;
    for (int j = 0; j < a->n_groups; j++)
        owner[j] = -1;
    for (int i = 0; i < b->n_groups; i++) {
        memset(seen, 0, (size_t)a->n_groups);
        if (!match_dfs(a, b, i, owner, seen)) return 0;
    }
    return 1;
}

/* Options of a class whose R non-full positions have rates xr[]. */
static int class_options(ctx *c, nclass *k, const double *xr, int R)
{
    optgen g = {0};
    int rc = 0, n_strag = 0;
    g.c = c;
    g.xr = xr;
    g.sizes = malloc((size_t)(2 * R + 64) * sizeof *g.sizes);
    if (!g.sizes) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (int i = 0; i < R; i++)
        n_strag += xr[i] > 1.0;
    for (int u = 0; u <= R && !g.oom; u++) {
        g.a = R - u;
        compositions(&g, 0);
    }
    if (g.visited > RP_MAX_COMPOSITIONS && !g.oom) {
        for (int i = 0; i < g.n_opts; i++)
            free(g.opts[i].g);
        g.n_opts = 0;
        strset_free(&g.seen);
        restricted_options(&g, R, n_strag);
    }
    if (g.oom) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    /* drop dominated options (keeps at least the maximal ones) */
    int maxg = 1;
    for (int i = 0; i < g.n_opts; i++)
        maxg = MAL_MAX(maxg, g.opts[i].n_groups);
    int *owner = malloc((size_t)maxg * sizeof *owner);
    char *seen = malloc((size_t)maxg);
    char *drop = calloc((size_t)MAL_MAX(1, g.n_opts), 1);
    if (!owner || !seen || !drop) {
        free(owner);
        free(seen);
        free(drop);
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    for (int i = 0; i < g.n_opts; i++)
        for (int j = 0; j < g.n_opts && !drop[i]; j++)
            if (j != i && !drop[j] && dominates(&g.opts[j], &g.opts[i], owner, seen)) drop[i] = 1;
    int n = 0;
    for (int i = 0; i < g.n_opts; i++) {
        if (drop[i])
            free(g.opts[i].g);
        else
            g.opts[n++] = g.opts[i];
    }
    g.n_opts = n;
    free(owner);
    free(seen);
    free(drop);
    k->opts = g.opts;
    k->n_opts = g.n_opts;
    g.opts = NULL;
done:
    if (g.opts)
        for (int i = 0; i < g.n_opts; i++)
            free(g.opts[i].g);
    free(g.opts);
    free(g.sizes);
    free(g.key);
    strset_free(&g.seen);
    return rc;
}

/* ---- nodes ------------------------------------------------------------- */

static const double *g_sort_x;
static int cmp_by_rate(const void *a, const void *b)
{
    int r = *(const int *)a, s = *(const int *)b;
    if (g_sort_x[r] != g_sort_x[s]) return g_sort_x[r] < g_sort_x[s] ? -1 : 1;
    return (r > s) - (r < s);
}
static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The current plan's nominal-size groups: lead[r] = index of the group
 * whose TP rank 0 is r (-1: none); their members in cg[g * tp + k]. */
typedef struct curgroups {
    int *lead;
    int *cg;
} curgroups;

/* Order a node's healthy ranks hr[nh] so that groups of the current plan
 * that are still whole, healthy and on this node come first, intact and in
 * their TP order: they become full groups again and keep their shards.
 * pos[r] is scratch (all -1 on entry and on return). */
static void order_healthy(const ctx *c, const curgroups *cur, int *pos, int *hr, int nh)
{
    qsort(hr, (size_t)nh, sizeof *hr, cmp_int);
    if (!cur->lead) return;
    int *out = malloc((size_t)nh * sizeof *out);
    if (!out) return; /* the order only saves state moves; go without */
    int n = 0, t = c->th;
    for (int q = 0; q < nh; q++)
        pos[hr[q]] = q;
    for (int q = 0; q < nh; q++) {
        int r = hr[q], g = cur->lead[r], ok = g >= 0;
        for (int k = 0; ok && k < t; k++)
            ok = pos[cur->cg[(size_t)g * t + k]] >= 0;
        if (!ok) continue;
        for (int k = 0; k < t; k++) {
            int m = cur->cg[(size_t)g * t + k];
            out[n++] = m;
            pos[m] = -2; /* taken */
        }
    }
    for (int q = 0; q < nh; q++)
        if (pos[hr[q]] >= 0) out[n++] = hr[q];
    for (int q = 0; q < nh; q++)
        pos[hr[q]] = -1;
    memcpy(hr, out, (size_t)nh * sizeof *hr);
    free(out);
}

int rp_build_nodes(ctx *c)
{
    const mal_cluster *cl = c->in->cluster;
    int t = c->th, rc = 0;
    int *start = calloc((size_t)cl->n_nodes + 1, sizeof *start);
    int *members = malloc((size_t)c->world * sizeof *members);
    curgroups cur = {0};
    int *pos = NULL, class_cap = 0;
    double *xr = malloc((size_t)MAL_MAX(1, c->world) * sizeof *xr);
    char *key = NULL;
    size_t key_cap = 0;
    strset classes = {0};
    c->n_nodes = cl->n_nodes;
    c->nodes = calloc((size_t)MAL_MAX(1, cl->n_nodes), sizeof *c->nodes);
    if (!start || !members || !xr || !c->nodes) goto oom;
    /* ranks by node in one pass (counting sort), rank order within a node */
    for (int r = 0; r < c->world; r++)
        start[cl->node_of[r] + 1]++;
    for (int n = 0; n < cl->n_nodes; n++)
        start[n + 1] += start[n];
    {
        int *fill = malloc((size_t)MAL_MAX(1, cl->n_nodes) * sizeof *fill);
        if (!fill) goto oom;
        memcpy(fill, start, (size_t)cl->n_nodes * sizeof *fill);
        for (int r = 0; r < c->world; r++)
            members[fill[cl->node_of[r]]++] = r;
        free(fill);
    }
    /* the current plan's nominal-size groups, by their TP rank 0 */
    pos = malloc((size_t)c->world * sizeof *pos);
    if (!pos) goto oom;
    for (int r = 0; r < c->world; r++)
        pos[r] = -1;
    if (c->in->current) {
        const mal_plan *cp = c->in->current;
        int ng = 0;
        cur.lead = malloc((size_t)c->world * sizeof *cur.lead);
        cur.cg = malloc((size_t)c->world * sizeof *cur.cg);
        if (!cur.lead || !cur.cg) goto oom;
        for (int r = 0; r < c->world; r++)
            cur.lead[r] = -1;
        for (int i = 0; i < cp->n_pipelines; i++)
            for (int j = 0; j < cp->pipelines[i].n_stages; j++) {
                const mal_plan_stage *st = &cp->pipelines[i].stages[j];
                if (st->n_ranks != t || (ng + 1) * t > c->world) continue;
                int ok = 1;
                for (int k = 0; k < t; k++)
                    ok &= st->ranks[k] >= 0 && st->ranks[k] < c->world;
                if (!ok || cur.lead[st->ranks[0]] >= 0) continue;
                cur.lead[st->ranks[0]] = ng;
                memcpy(cur.cg + (size_t)ng * t, st->ranks, (size_t)t * sizeof *cur.cg);
                ng++;
            }
    }
    g_sort_x = c->x;
    for (int n = 0; n < cl->n_nodes; n++) {
        nodeinfo *nd = &c->nodes[n];
        int G = start[n + 1] - start[n], *m = members + start[n];
        nd->n_ranks = G;
        nd->cls = -1;
        if (G == 0) continue;
        if (G % c->t) {
            rc = MAL_ERR(MAL_EINVAL,
                         "cluster: node %d has %d ranks, not a multiple of the nominal TP size %d "
                         "(TP groups never span nodes)",
                         n, G, c->t);
            goto done;
        }
        qsort(m, (size_t)G, sizeof *m, cmp_by_rate);
        int h = 0;
        while (h < G && c->x[m[h]] == 1.0)
            h++;
        order_healthy(c, &cur, pos, m, h);
        int F = h / t;
        nd->n_healthy_groups = F;
        c->H += F;
        nd->R = G - F * t;
        nd->healthy = malloc((size_t)MAL_MAX(1, F * t) * sizeof *nd->healthy);
        nd->rest = malloc((size_t)MAL_MAX(1, nd->R) * sizeof *nd->rest);
        if (!nd->healthy || !nd->rest) goto oom;
        memcpy(nd->healthy, m, (size_t)(F * t) * sizeof *m);
        memcpy(nd->rest, m + F * t, (size_t)nd->R * sizeof *m);
        /* the situation: the rates of the non-full positions */
        size_t need = 32 + (size_t)nd->R * 32;
        if (need > key_cap) {
            char *nk = realloc(key, need);
            if (!nk) goto oom;
            key = nk;
            key_cap = need;
        }
        int len = snprintf(key, need, "%d", nd->R);
        for (int i = 0; i < nd->R; i++) {
            xr[i] = c->x[nd->rest[i]];
            len += snprintf(key + len, need - (size_t)len, "|%a", xr[i]);
        }
        int is_new;
        int id = strset_put(&classes, key, c->n_classes, &is_new);
        if (id < 0) goto oom;
        nd->cls = id;
        if (is_new) {
            if (mal_grow(&c->classes, &class_cap, c->n_classes, sizeof *c->classes, 16)) goto oom;
            nclass *k = &c->classes[c->n_classes++];
            memset(k, 0, sizeof *k);
            k->rep = n;
            k->R = nd->R;
            if ((rc = class_options(c, k, xr, nd->R))) goto done;
        }
        c->classes[id].n_nodes++;
    }
    goto done;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
done:
    free(start);
    free(members);
    free(cur.lead);
    free(cur.cg);
    free(pos);
    free(xr);
    free(key);
    strset_free(&classes);
    return rc;
}

void rp_free_nodes(ctx *c)
{
    if (c->nodes)
        for (int n = 0; n < c->n_nodes; n++) {
            free(c->nodes[n].healthy);
            free(c->nodes[n].rest);
        }
    free(c->nodes);
    c->nodes = NULL;
    if (c->classes)
        for (int k = 0; k < c->n_classes; k++) {
            for (int q = 0; q < c->classes[k].n_opts; q++)
                free(c->classes[k].opts[q].g);
            free(c->classes[k].opts);
        }
    free(c->classes);
    c->classes = NULL;
}
