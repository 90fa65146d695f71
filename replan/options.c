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
    if (u->ty != v->ty) return u->ty < v->ty ? -1 : 1;
    return 0;
}

double rp_alpha(const ctx *c, int s, int ty)
{
    if (c->p->n_heads > 0 && c->p->n_heads % s) return 0;
    if (c->p->ffn_hidden > 0 && c->p->ffn_hidden % s) return 0;
    return mal_profile_alpha(c->tprof[ty], s);
}

/* ---- sets of byte keys ------------------------------------------------- */

static uint64_t fnv(const unsigned char *b, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* A growable set of byte strings (open addressing) with a value each;
 * keyset_put returns the value of `key`, inserting it with `val` when new
 * (*is_new = 1); -1 when out of memory.  Keys are exact bytes (rates as
 * their doubles, not printed), kept one after another in one buffer. */
typedef struct keyset {
    size_t cap, n;
    size_t *at; /* [cap]: 1 + offset of the key in buf (0: empty slot) */
    uint64_t *hash;
    int *val;
    unsigned char *buf; /* each key: size_t length, then the bytes */
    size_t len, buf_cap;
} keyset;

static void keyset_free(keyset *s)
{
    free(s->at);
    free(s->hash);
    free(s->val);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* Empty the set, keeping its memory. */
static void keyset_clear(keyset *s)
{
    if (s->at) memset(s->at, 0, s->cap * sizeof *s->at);
    s->n = 0;
    s->len = 0;
}

static int keyset_put(keyset *s, const unsigned char *key, size_t len, int val, int *is_new)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 64;
        size_t *na = calloc(ncap, sizeof *na);
        uint64_t *nh = calloc(ncap, sizeof *nh);
        int *nv = calloc(ncap, sizeof *nv);
        if (!na || !nh || !nv) {
            free(na);
            free(nh);
            free(nv);
            return -1;
        }
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->at[i]) continue;
            size_t j = s->hash[i] & (ncap - 1);
            while (na[j])
                j = (j + 1) & (ncap - 1);
            na[j] = s->at[i];
            nh[j] = s->hash[i];
            nv[j] = s->val[i];
        }
        free(s->at);
        free(s->hash);
        free(s->val);
        s->at = na;
        s->hash = nh;
        s->val = nv;
        s->cap = ncap;
    }
    uint64_t h = fnv(key, len);
    size_t j = h & (s->cap - 1);
    for (; s->at[j]; j = (j + 1) & (s->cap - 1)) {
        const unsigned char *k = s->buf + s->at[j] - 1;
        size_t klen;
        memcpy(&klen, k, sizeof klen);
        if (s->hash[j] == h && klen == len && !memcmp(k + sizeof klen, key, len)) {
            *is_new = 0;
            return s->val[j];
        }
    }
    if (s->len + sizeof len + len > s->buf_cap) {
        size_t ncap = MAL_MAX(2 * s->buf_cap, s->len + sizeof len + len + 4096);
        unsigned char *nb = realloc(s->buf, ncap);
        if (!nb) return -1;
        s->buf = nb;
        s->buf_cap = ncap;
    }
    memcpy(s->buf + s->len, &len, sizeof len);
    memcpy(s->buf + s->len + sizeof len, key, len);
    s->at[j] = 1 + s->len;
    s->len += sizeof len + len;
    s->hash[j] = h;
    s->val[j] = val;
    s->n++;
    *is_new = 1;
    return val;
}

/* ---- option generation ------------------------------------------------- */

typedef struct optgen {
    const ctx *c;
    int ty;           /* the class's device type */
    const double *xr; /* [R] rates by position */
    int a;            /* active positions of this u */
    int *sizes;       /* current composition */
    int n;
    long visited;
    nopt *opts;
    int n_opts, cap_opts;
    keyset *seen;       /* the groups' multisets seen (shared, cleared per class) */
    sgrp *grp, *srt;    /* [R] scratch: the groups in position order, sorted */
    unsigned char *key; /* [R * 12 + 4] scratch */
    int oom;
} optgen;

/* Record the composition in g->sizes as an option unless an equal multiset
 * of groups is known. */
static void add_option(optgen *g, const int *sizes, int n, int a)
{
    sgrp *grp = g->grp, *srt = g->srt;
    int pos = 0;
    double cap = 0;
    for (int i = 0; i < n; i++) {
        /* positions are sorted by rate: the block's slowest is its last */
        grp[i] =
            (sgrp){sizes[i], g->xr[pos + sizes[i] - 1] * rp_alpha(g->c, sizes[i], g->ty), g->ty};
        cap += 1.0 / grp[i].y;
        pos += sizes[i];
    }
    /* the multiset: the groups sorted (insertion sort; a handful), as bytes */
    for (int i = 0; i < n; i++) {
        sgrp v = grp[i];
        int j = i;
        while (j > 0 && rp_cmp_sgrp(&srt[j - 1], &v) > 0) {
            srt[j] = srt[j - 1];
            j--;
        }
        srt[j] = v;
    }
    size_t len = 0;
    memcpy(g->key, &n, sizeof n);
    len += sizeof n;
    for (int i = 0; i < n; i++) {
        memcpy(g->key + len, &srt[i].size, sizeof srt[i].size);
        memcpy(g->key + len + sizeof srt[i].size, &srt[i].y, sizeof srt[i].y);
        len += sizeof srt[i].size + sizeof srt[i].y;
    }
    int is_new;
    if (keyset_put(g->seen, g->key, len, g->n_opts, &is_new) < 0) goto oom;
    if (!is_new) return;
    sgrp *keep = malloc((size_t)(n > 0 ? n : 1) * sizeof *keep);
    if (!keep) goto oom;
    memcpy(keep, grp, (size_t)n * sizeof *keep);
    if (mal_grow(&g->opts, &g->cap_opts, g->n_opts, sizeof *g->opts, 16)) {
        free(keep);
        goto oom;
    }
    double ymax = 0, room = 0;
    for (int i = 0; i < n; i++) {
        ymax = MAL_MAX(ymax, keep[i].y);
        room += rp_layer_cap_max(g->c, keep[i].size, g->ty) - g->c->L;
    }
    g->opts[g->n_opts++] = (nopt){n, a, keep, cap, ymax, room};
    return;
oom:
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
        if (rp_alpha(g->c, s, g->ty) <= 0) continue;
        g->sizes[g->n++] = s;
        compositions(g, p + s);
        g->n--;
    }
}

/* The restricted rule (the first planner): suspend u of the stragglers,
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
                ok &= rp_alpha(g->c, g->sizes[i], g->ty) > 0;
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
    /* what a matching implies, checked first: no fewer ranks, no slower
     * slowest group, no less capacity (up to rounding of the sums) */
    if (a->n_active < b->n_active || a->ymax > b->ymax || a->cap < b->cap * (1 - 1e-12)) return 0;
    for (int j = 0; j < a->n_groups; j++)
        owner[j] = -1;
    for (int i = 0; i < b->n_groups; i++) {
        memset(seen, 0, (size_t)a->n_groups);
        if (!match_dfs(a, b, i, owner, seen)) return 0;
    }
    return 1;
}

/* Options of a class whose R non-full positions have rates xr[];
 * multisets is scratch. */
static int class_options(ctx *c, nclass *k, const double *xr, int R, keyset *multisets)
{
    optgen g = {0};
    int rc = 0, n_strag = 0;
    keyset_clear(multisets);
    g.seen = multisets;
    g.c = c;
    g.ty = k->ty;
    g.xr = xr;
    g.sizes = malloc((size_t)(2 * R + 64) * sizeof *g.sizes);
    g.grp = malloc((size_t)(2 * R + 64) * sizeof *g.grp);
    g.srt = malloc((size_t)(2 * R + 64) * sizeof *g.srt);
    g.key = malloc((size_t)(2 * R + 64) * 12 + 4);
    if (!g.sizes || !g.grp || !g.srt || !g.key) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
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
        keyset_clear(g.seen);
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
    int n = 0, n_grp = 0;
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
    /* the kept options' groups in one array, the options in an array of
     * their size: a million node situations keep ~45 options each */
    for (int i = 0; i < n; i++)
        n_grp += g.opts[i].n_groups;
    k->pool = malloc((size_t)MAL_MAX(1, n_grp) * sizeof *k->pool);
    nopt *opts = malloc((size_t)MAL_MAX(1, n) * sizeof *opts);
    if (!k->pool || !opts) {
        free(opts);
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    n_grp = 0;
    for (int i = 0; i < n; i++) {
        opts[i] = g.opts[i];
        memcpy(k->pool + n_grp, g.opts[i].g, (size_t)g.opts[i].n_groups * sizeof *k->pool);
        free(g.opts[i].g);
        opts[i].g = k->pool + n_grp;
        n_grp += g.opts[i].n_groups;
    }
    free(g.opts);
    g.opts = NULL;
    k->opts = opts;
    k->n_opts = n;
done:
    if (g.opts)
        for (int i = 0; i < g.n_opts; i++)
            free(g.opts[i].g);
    free(g.opts);
    free(g.sizes);
    free(g.grp);
    free(g.srt);
    free(g.key);
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
    /* every node's ranks, node by node; the nodes point into it */
    int *members = c->node_ranks = malloc((size_t)MAL_MAX(1, c->world) * sizeof *members);
    curgroups cur = {0};
    int *pos = NULL, class_cap = 0;
    double *xr = malloc((size_t)MAL_MAX(1, c->world) * sizeof *xr);
    unsigned char *key = NULL;
    size_t key_cap = 0;
    keyset classes = {0}, seen = {0};
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
        /* healthy full groups are all alike: of the healthy type only
         * (another type's groups differ in memory, so they are specials) */
        int ty = c->node_ty ? c->node_ty[n] : 0, h = 0;
        while (ty == c->hty && h < G && c->x[m[h]] == 1.0)
            h++;
        order_healthy(c, &cur, pos, m, h);
        int F = h / t;
        nd->n_healthy_groups = F;
        c->H += F;
        nd->R = G - F * t;
        /* the node's ranks stay where they are in `members` (kept) */
        nd->healthy = m;
        nd->rest = m + F * t;
        /* the situation: the rates of the non-full positions and the type, as bytes */
        size_t need = sizeof nd->R + (size_t)nd->R * sizeof *xr + sizeof ty;
        if (need > key_cap) {
            unsigned char *nk = realloc(key, need);
            if (!nk) goto oom;
            key = nk;
            key_cap = need;
        }
        for (int i = 0; i < nd->R; i++)
            xr[i] = c->x[nd->rest[i]];
        memcpy(key, &nd->R, sizeof nd->R);
        memcpy(key + sizeof nd->R, xr, (size_t)nd->R * sizeof *xr);
        memcpy(key + sizeof nd->R + (size_t)nd->R * sizeof *xr, &ty, sizeof ty);
        int is_new;
        int id = keyset_put(&classes, key, need, c->n_classes, &is_new);
        if (id < 0) goto oom;
        nd->cls = id;
        if (is_new) {
            if (mal_grow(&c->classes, &class_cap, c->n_classes, sizeof *c->classes, 16)) goto oom;
            nclass *k = &c->classes[c->n_classes++];
            memset(k, 0, sizeof *k);
            k->rep = n;
            k->R = nd->R;
            k->ty = ty;
            if ((rc = class_options(c, k, xr, nd->R, &seen))) goto done;
        }
        c->classes[id].n_nodes++;
    }
    goto done;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
done:
    free(start);
    free(cur.lead);
    free(cur.cg);
    free(pos);
    free(xr);
    free(key);
    keyset_free(&classes);
    keyset_free(&seen);
    return rc;
}

void rp_free_nodes(ctx *c)
{
    free(c->node_ranks);
    c->node_ranks = NULL;
    free(c->nodes);
    c->nodes = NULL;
    if (c->classes)
        for (int k = 0; k < c->n_classes; k++) {
            free(c->classes[k].pool);
            free(c->classes[k].opts);
        }
    free(c->classes);
    c->classes = NULL;
}
