/* The Malleus plan search (steps A-D of DESIGN.md; replan/README.md has the
 * full description):
 *   A. per node, candidate TP groupings of its straggling positions (full
 *      groups, halving groups, suspension);
 *   B. the number of pipelines D and which pipeline receives each node's
 *      straggler groups ("bundle"), with the healthy full groups distributed
 *      by an exact dynamic programme over the step-time bound;
 *   C. layers per stage (lp_solve, memoised per pipeline composition) and
 *      micro-batches across pipelines (lp_solve);
 *   D. migration-aware mapping of physical healthy groups onto stage slots.
 * Small instances are searched exhaustively; large ones with the restricted
 * search described in the README.  Everything is deterministic. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mal.h"
#include "replan.h"

#define TOL 1e-9

/* ---- step A: node options ------------------------------------------------ */

typedef struct nopt {
    int n_groups;
    int *size;  /* [n_groups] */
    double *y;  /* [n_groups] */
    int *ranks; /* concatenated members, TP order = rank order */
    int n_susp;
    int *susp;
    double cap; /* sum 1/y */
} nopt;

typedef struct nodeinfo {
    int n_healthy_groups; /* full nominal groups of healthy ranks */
    int *healthy;         /* [n_healthy_groups * tp], chunked by tp */
    int n_opts;
    nopt *opts;
    int slots; /* nominal group slots covered by the options (R / tp) */
} nodeinfo;

typedef struct ctx {
    const mal_replan_input *in;
    const mal_profile *p;
    int t, L, M, world;
    double mem;
    double *x; /* floored rates */
    int n_nodes;
    nodeinfo *nodes;
    /* composition cache */
    size_t cache_cap, cache_n;
    struct centry *cache;
    int n_lps;
    int exhaustive;
    int pp_nom, dp_nom;
} ctx;

/* qsort_r is GNU; keep a file-level pointer instead for portability. */
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

static void nopt_free(nopt *o)
{
    free(o->size);
    free(o->y);
    free(o->ranks);
    free(o->susp);
}

/* Group sizes for `a` active positions: nfull chunks of t (each split into
 * t/2, t/4, ..., 1, 1 when `split`), then the binary decomposition of the
 * remainder, largest first. */
static int option_sizes(int t, int a, int split, int *sizes)
{
    int n = 0, nfull = a / t, r = a % t;
    for (int c = 0; c < nfull; c++) {
        if (split && t > 1) {
            for (int s = t / 2; s >= 1; s /= 2)
                sizes[n++] = s;
            sizes[n++] = 1;
        } else {
            sizes[n++] = t;
        }
    }
    for (int s = t / 2; s >= 1; s /= 2)
        if (r & s) sizes[n++] = s;
    return n;
}

static int size_allowed(const ctx *c, int s)
{
    if (mal_profile_alpha(c->p, s) <= 0) return 0;
    if (c->p->n_heads > 0 && c->p->n_heads % s) return 0;
    if (c->p->ffn_hidden > 0 && c->p->ffn_hidden % s) return 0;
    return 1;
}

/* Order a node's healthy ranks so that groups of the current plan that are
 * still whole and healthy come first, intact and in their TP order: they
 * become full groups again and keep their shards. */
static void order_healthy(const ctx *c, int *hr, int nh, int node)
{
    qsort(hr, (size_t)nh, sizeof *hr, cmp_int);
    const mal_plan *cur = c->in->current;
    if (!cur) return;
    int *out = malloc((size_t)nh * sizeof *out);
    char *used = calloc((size_t)nh, 1);
    if (!out || !used) {
        free(out);
        free(used);
        return;
    }
    int n = 0;
    for (int i = 0; i < cur->n_pipelines; i++)
        for (int j = 0; j < cur->pipelines[i].n_stages; j++) {
            const mal_plan_stage *st = &cur->pipelines[i].stages[j];
            if (st->n_ranks != c->t || n + c->t > nh) continue;
            int idx[64], ok = c->t <= 64;
            for (int k = 0; ok && k < st->n_ranks; k++) {
                int r = st->ranks[k];
                idx[k] = -1;
                if (r < 0 || r >= c->world || c->in->cluster->node_of[r] != node) {
                    ok = 0;
                    break;
                }
                for (int q = 0; q < nh; q++)
                    if (hr[q] == r && !used[q]) idx[k] = q;
                if (idx[k] < 0) ok = 0;
            }
            if (!ok) continue;
            for (int k = 0; k < st->n_ranks; k++) {
                used[idx[k]] = 1;
                out[n++] = hr[idx[k]];
            }
        }
    for (int q = 0; q < nh; q++)
        if (!used[q]) out[n++] = hr[q];
    memcpy(hr, out, (size_t)nh * sizeof *hr);
    free(out);
    free(used);
}

static int build_nodes(ctx *c)
{
    const mal_cluster *cl = c->in->cluster;
    int t = c->t;
    c->n_nodes = cl->n_nodes;
    c->nodes = calloc((size_t)cl->n_nodes, sizeof *c->nodes);
    int *members = malloc((size_t)c->world * sizeof *members);
    int *sizes = malloc((size_t)(2 * c->world + 64) * sizeof *sizes);
    if (!c->nodes || !members || !sizes) {
        free(members);
        free(sizes);
        return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    }
    int rc = 0;
    g_sort_x = c->x;
    for (int n = 0; n < cl->n_nodes; n++) {
        nodeinfo *nd = &c->nodes[n];
        int G = 0;
        for (int r = 0; r < c->world; r++)
            if (cl->node_of[r] == n) members[G++] = r;
        if (G == 0) continue;
        if (G % t) {
            rc = MAL_ERR(MAL_EINVAL,
                         "cluster: node %d has %d ranks, not a multiple of the nominal TP size %d "
                         "(TP groups never span nodes)",
                         n, G, t);
            goto cleanup;
        }
        qsort(members, (size_t)G, sizeof *members, cmp_by_rate);
        int h = 0;
        while (h < G && c->x[members[h]] == 1.0)
            h++;
        order_healthy(c, members, h, n);
        int F = h / t;
        nd->n_healthy_groups = F;
        nd->healthy = malloc((size_t)MAL_MAX(1, F * t) * sizeof *nd->healthy);
        if (!nd->healthy) {
            rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
            goto cleanup;
        }
        memcpy(nd->healthy, members, (size_t)(F * t) * sizeof *members);
        /* the rest: leftover healthy ranks, then stragglers slowest last */
        int *rest = members + F * t;
        int R = G - F * t, q = G - h;
        nd->slots = R / t;
        qsort(rest + (h - F * t), (size_t)q, sizeof *rest, cmp_by_rate);
        nd->opts = calloc((size_t)(2 * (q + 1)), sizeof *nd->opts);
        if (!nd->opts) {
            rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
            goto cleanup;
        }
        if (R == 0) continue;
        for (int u = 0; u <= q; u++) {
            int a = R - u;
            for (int split = 0; split <= 1; split++) {
                int ng = option_sizes(t, a, split, sizes);
                if (split) {
                    int ng0 = option_sizes(t, a, 0, sizes + ng);
                    if (ng0 == ng && !memcmp(sizes, sizes + ng, (size_t)ng * sizeof *sizes))
                        continue;
                }
                int ok = 1;
                for (int g = 0; g < ng; g++)
                    ok &= size_allowed(c, sizes[g]);
                if (!ok) continue;
                nopt *o = &nd->opts[nd->n_opts];
                o->n_groups = ng;
                o->size = malloc((size_t)MAL_MAX(1, ng) * sizeof *o->size);
                o->y = malloc((size_t)MAL_MAX(1, ng) * sizeof *o->y);
                o->ranks = malloc((size_t)MAL_MAX(1, a) * sizeof *o->ranks);
                o->susp = malloc((size_t)MAL_MAX(1, u) * sizeof *o->susp);
                if (!o->size || !o->y || !o->ranks || !o->susp) {
                    nopt_free(o);
                    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
                    goto cleanup;
                }
                nd->n_opts++;
                int pos = 0;
                for (int g = 0; g < ng; g++) {
                    double xm = 1.0;
                    for (int k = 0; k < sizes[g]; k++)
                        xm = MAL_MAX(xm, c->x[rest[pos + k]]);
                    o->size[g] = sizes[g];
                    o->y[g] = xm * mal_profile_alpha(c->p, sizes[g]);
                    o->cap += 1.0 / o->y[g];
                    memcpy(o->ranks + pos, rest + pos, (size_t)sizes[g] * sizeof *rest);
                    qsort(o->ranks + pos, (size_t)sizes[g], sizeof *rest, cmp_int);
                    pos += sizes[g];
                }
                o->n_susp = u;
                memcpy(o->susp, rest + a, (size_t)u * sizeof *rest);
            }
        }
    }
cleanup:
    free(members);
    free(sizes);
    return rc;
}

/* ---- compositions and the layer program ---------------------------------- */

/* A special group inside a pipeline composition. */
typedef struct sgrp {
    int size;
    double y;
} sgrp;

typedef struct centry {
    char *key;
    int S;
    double P; /* INFINITY when infeasible */
    int *l;   /* [S] layers per stage in stage order */
} centry;

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static int cmp_sgrp(const void *a, const void *b)
{
    const sgrp *u = a, *v = b;
    /* larger TP groups first: the smallest (t/size times the memory per layer)
     * sit nearest the end, where 1F1B keeps the fewest activations */
    if (u->size != v->size) return u->size > v->size ? -1 : 1;
    if (u->y != v->y) return u->y < v->y ? -1 : 1;
    return 0;
}

/* Stage order of a pipeline with h healthy full groups and the (sorted)
 * special groups: h-1 healthy, the specials, then one healthy last; with one
 * healthy group it comes first.  Fills size[]/y[]/kind[] (kind -1 healthy,
 * else index into sg).  Returns S. */
static int stage_order(int t, int h, const sgrp *sg, int ns, int *size, double *y, int *kind)
{
    int S = 0;
    int before = h >= 2 ? h - 1 : h;
    for (int i = 0; i < before; i++) {
        size[S] = t;
        y[S] = 1.0;
        kind[S++] = -1;
    }
    for (int i = 0; i < ns; i++) {
        size[S] = sg[i].size;
        y[S] = sg[i].y;
        kind[S++] = i;
    }
    if (h >= 2) {
        size[S] = t;
        y[S] = 1.0;
        kind[S++] = -1;
    }
    return S;
}

static int cache_grow(ctx *c)
{
    size_t ncap = c->cache_cap ? 2 * c->cache_cap : 1024;
    centry *nc = calloc(ncap, sizeof *nc);
    if (!nc) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (size_t i = 0; i < c->cache_cap; i++) {
        if (!c->cache[i].key) continue;
        size_t j = fnv(c->cache[i].key) & (ncap - 1);
        while (nc[j].key)
            j = (j + 1) & (ncap - 1);
        nc[j] = c->cache[i];
    }
    free(c->cache);
    c->cache = nc;
    c->cache_cap = ncap;
    return 0;
}

/* Period of the pipeline made of h healthy groups and the given specials
 * (sorted with cmp_sgrp), memoised.  *out points into the cache. */
static int composition(ctx *c, int h, const sgrp *sg, int ns, const centry **out)
{
    char stack[512], *key = stack;
    size_t need = 32 + (size_t)ns * 40;
    if (need > sizeof stack) {
        key = malloc(need);
        if (!key) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    }
    int len = snprintf(key, need, "%d", h);
    for (int i = 0; i < ns; i++)
        len += snprintf(key + len, need - (size_t)len, "|%d:%a", sg[i].size, sg[i].y);
    if (2 * (c->cache_n + 1) > c->cache_cap) {
        int rc = cache_grow(c);
        if (rc) {
            if (key != stack) free(key);
            return rc;
        }
    }
    size_t j = fnv(key) & (c->cache_cap - 1);
    while (c->cache[j].key && strcmp(c->cache[j].key, key))
        j = (j + 1) & (c->cache_cap - 1);
    if (c->cache[j].key) {
        if (key != stack) free(key);
        *out = &c->cache[j];
        return 0;
    }
    int S = h + ns;
    centry e = {0};
    e.key = strdup(key);
    if (key != stack) free(key);
    e.S = S;
    e.P = INFINITY;
    e.l = malloc((size_t)MAL_MAX(1, S) * sizeof *e.l);
    int *size = malloc((size_t)MAL_MAX(1, S) * sizeof *size);
    int *kind = malloc((size_t)MAL_MAX(1, S) * sizeof *kind);
    int *ub = malloc((size_t)MAL_MAX(1, S) * sizeof *ub);
    double *y = malloc((size_t)MAL_MAX(1, S) * sizeof *y);
    int rc = 0;
    if (!e.key || !e.l || !size || !kind || !ub || !y) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        free(e.key);
        free(e.l);
        goto done;
    }
    if (S >= 1 && S <= c->L) {
        stage_order(c->t, h, sg, ns, size, y, kind);
        int ok = 1;
        long sum = 0;
        for (int s = 0; s < S; s++) {
            ub[s] = mal_cost_layer_cap(c->p, c->mem, size[s], S, s);
            if (ub[s] < 1) ok = 0;
            sum += ub[s];
        }
        if (ok && sum >= c->L) {
            rc = mal_lp_layers(S, y, ub, c->L, e.l, &e.P);
            c->n_lps++;
            if (rc) {
                free(e.key);
                free(e.l);
                goto done;
            }
        }
    }
    c->cache[j] = e;
    c->cache_n++;
    *out = &c->cache[j];
done:
    free(size);
    free(kind);
    free(ub);
    free(y);
    return rc;
}

/* ---- step B/C search ------------------------------------------------------ */

/* A bundle: the special groups of one node's chosen option. */
typedef struct bundle {
    int node;
    int ns;
    sgrp *sg; /* unsorted, option order */
    double cap;
    double deficit; /* nominal slots covered minus capacity */
} bundle;

/* One pipeline of a candidate: its bundles and its range of healthy groups. */
typedef struct cpipe {
    int nb;
    int *bund; /* bundle indices */
    int ns;
    sgrp *sg;   /* merged, sorted specials */
    int lo, hi; /* healthy-count range */
    double *P;  /* [hi-lo+1] */
    int *S;
} cpipe;

typedef struct candidate {
    double T;
    int D;
    int *choice;   /* [n_nodes] option chosen per node */
    int *block_of; /* [n_bundles] pipeline of each bundle */
    int *h;        /* [D] healthy groups per pipeline */
    int nb;
    int *bnode; /* [n_bundles] node of each bundle */
} candidate;

static void cand_free(candidate *k)
{
    free(k->choice);
    free(k->block_of);
    free(k->h);
    free(k->bnode);
    memset(k, 0, sizeof *k);
}

/* Max total micro-batch capacity at step time T with sum h = H: DP over
 * pipelines.  Returns 1 when >= M; fills hsel when asked. */
static int feasible_at(int D, const cpipe *pp, int H, int M, double T, long *dp, long *nd, int *arg,
                       int *hsel)
{
    const long NEG = -1;
    for (int s = 0; s <= H; s++)
        dp[s] = NEG;
    dp[0] = 0;
    for (int i = 0; i < D; i++) {
        for (int s = 0; s <= H; s++)
            nd[s] = NEG;
        const cpipe *q = &pp[i];
        for (int h = q->lo; h <= q->hi; h++) {
            double P = q->P[h - q->lo];
            if (!isfinite(P)) continue;
            int S = q->S[h - q->lo];
            double f = floor(T / P * (1 + 1e-12) + 1e-9);
            long cap = (long)MAL_MIN(f, (double)M + S) - S + 1;
            if (cap < S) continue;
            if (cap > M) cap = M;
            for (int s = 0; s + h <= H; s++) {
                if (dp[s] < 0) continue;
                long v = dp[s] + cap;
                if (v > nd[s + h]) {
                    nd[s + h] = v;
                    if (arg) arg[(size_t)i * (H + 1) + s + h] = h;
                }
            }
        }
        memcpy(dp, nd, (size_t)(H + 1) * sizeof *dp);
    }
    if (dp[H] < M) return 0;
    if (hsel && arg) {
        int s = H;
        for (int i = D - 1; i >= 0; i--) {
            hsel[i] = arg[(size_t)i * (H + 1) + s];
            s -= hsel[i];
        }
    }
    return 1;
}

/* Best step time for D pipelines whose specials are fixed; healthy counts
 * from each pipeline's range.  Returns T (INFINITY if infeasible) and the
 * chosen h in hsel. */
static int allocate(ctx *c, int D, cpipe *pp, int H, double lb, double *T_out, int *hsel)
{
    int rc = 0;
    *T_out = INFINITY;
    for (int i = 0; i < D; i++) {
        cpipe *q = &pp[i];
        int n = q->hi - q->lo + 1;
        free(q->P);
        free(q->S);
        q->P = malloc((size_t)MAL_MAX(1, n) * sizeof *q->P);
        q->S = malloc((size_t)MAL_MAX(1, n) * sizeof *q->S);
        if (!q->P || !q->S) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        for (int h = q->lo; h <= q->hi; h++) {
            const centry *e;
            if (h + q->ns == 0) {
                q->P[h - q->lo] = INFINITY;
                q->S[h - q->lo] = 0;
                continue;
            }
            /* identical pipelines share their composition entry */
            if (i > 0 && pp[i - 1].ns == q->ns && pp[i - 1].lo <= h && h <= pp[i - 1].hi &&
                pp[i - 1].P &&
                (q->ns == 0 || !memcmp(pp[i - 1].sg, q->sg, (size_t)q->ns * sizeof *q->sg))) {
                q->P[h - q->lo] = pp[i - 1].P[h - pp[i - 1].lo];
                q->S[h - q->lo] = pp[i - 1].S[h - pp[i - 1].lo];
                continue;
            }
            if ((rc = composition(c, h, q->sg, q->ns, &e))) return rc;
            q->P[h - q->lo] = e->P;
            q->S[h - q->lo] = h + q->ns;
        }
    }
    double T = INFINITY;
    long *dp = malloc((size_t)(H + 1) * sizeof *dp);
    long *nd = malloc((size_t)(MAL_MAX(H + 1, D)) * sizeof *nd);
    int *arg = malloc((size_t)D * (size_t)(H + 1) * sizeof *arg);
    if (!dp || !nd || !arg) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto cleanup;
    }
    /* an upper bound: double from the lower bound until feasible */
    double lo = lb > 0 ? lb * (1 - 1e-9) : 1e-9, hi = MAL_MAX(lo, 1e-9) * 2;
    int found = 0;
    for (int it = 0; it < 80; it++) {
        if (feasible_at(D, pp, H, c->M, hi, dp, nd, NULL, NULL)) {
            found = 1;
            break;
        }
        lo = hi;
        hi *= 2;
    }
    if (!found) goto cleanup;
    /* bisection: the optimum is one of the values (m + S - 1) * P, so
     * relative 1e-13 is enough to land on it */
    for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; it++) {
        double mid = 0.5 * (lo + hi);
        if (feasible_at(D, pp, H, c->M, mid, dp, nd, NULL, NULL))
            hi = mid;
        else
            lo = mid;
    }
    feasible_at(D, pp, H, c->M, hi, dp, nd, arg, hsel);
    /* the exact optimum for the chosen healthy counts: fill every pipeline
     * up to `hi`, then trim the excess from the slowest ones */
    {
        long excess = -c->M;
        for (int i = 0; i < D; i++) {
            double P = pp[i].P[hsel[i] - pp[i].lo];
            int S = pp[i].S[hsel[i] - pp[i].lo];
            long m = (long)floor(hi / P * (1 + 1e-12) + 1e-9) - S + 1;
            nd[i] = MAL_MIN(m, (long)c->M);
            excess += nd[i];
        }
        while (excess > 0) {
            int arg_i = -1;
            double worst = -1;
            for (int i = 0; i < D; i++) {
                double P = pp[i].P[hsel[i] - pp[i].lo];
                int S = pp[i].S[hsel[i] - pp[i].lo];
                if (nd[i] <= S) continue;
                double Ti = (nd[i] + S - 1) * P;
                if (Ti > worst) {
                    worst = Ti;
                    arg_i = i;
                }
            }
            if (arg_i < 0) break;
            nd[arg_i]--;
            excess--;
        }
        T = 0;
        for (int i = 0; i < D; i++) {
            double P = pp[i].P[hsel[i] - pp[i].lo];
            int S = pp[i].S[hsel[i] - pp[i].lo];
            T = MAL_MAX(T, (nd[i] + S - 1) * P);
        }
    }
    *T_out = T;
cleanup:
    free(dp);
    free(nd);
    free(arg);
    return rc;
}

static void cpipe_free(cpipe *q)
{
    free(q->bund);
    free(q->sg);
    free(q->P);
    free(q->S);
    memset(q, 0, sizeof *q);
}

/* Fill pipeline i's specials from the bundles assigned to it. */
static int cpipe_set(cpipe *q, const bundle *b, const int *list, int nb)
{
    int ns = 0;
    for (int k = 0; k < nb; k++)
        ns += b[list[k]].ns;
    free(q->sg);
    free(q->bund);
    q->sg = malloc((size_t)MAL_MAX(1, ns) * sizeof *q->sg);
    q->bund = malloc((size_t)MAL_MAX(1, nb) * sizeof *q->bund);
    if (!q->sg || !q->bund) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    q->ns = 0;
    for (int k = 0; k < nb; k++) {
        q->bund[k] = list[k];
        for (int g = 0; g < b[list[k]].ns; g++)
            q->sg[q->ns++] = b[list[k]].sg[g];
    }
    q->nb = nb;
    qsort(q->sg, (size_t)q->ns, sizeof *q->sg, cmp_sgrp);
    return 0;
}

typedef struct search {
    ctx *c;
    int *choice;
    int nb;
    bundle *b;
    int H;
    double Ctot;
    int Ntot;
    candidate best;
    int n_cand, n_pruned;
} search;

static int record(search *s, int D, const int *block_of, const int *h, double T)
{
    if (!(T < s->best.T * (1 - TOL))) return 0;
    candidate *k = &s->best;
    cand_free(k);
    k->T = T;
    k->D = D;
    k->nb = s->nb;
    k->choice = malloc((size_t)s->c->n_nodes * sizeof *k->choice);
    k->block_of = malloc((size_t)MAL_MAX(1, s->nb) * sizeof *k->block_of);
    k->bnode = malloc((size_t)MAL_MAX(1, s->nb) * sizeof *k->bnode);
    k->h = malloc((size_t)D * sizeof *k->h);
    if (!k->choice || !k->block_of || !k->h || !k->bnode) {
        k->T = INFINITY;
        return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    }
    memcpy(k->choice, s->choice, (size_t)s->c->n_nodes * sizeof *k->choice);
    for (int i = 0; i < s->nb; i++) {
        k->block_of[i] = block_of[i];
        k->bnode[i] = s->b[i].node;
    }
    memcpy(k->h, h, (size_t)D * sizeof *h);
    return 0;
}

/* Evaluate one assignment of bundles to pipelines (block_of[i] in 0..k-1,
 * k blocks; pipelines k..D-1 hold healthy groups only). */
static int eval_assignment(search *s, int D, const int *block_of, int k)
{
    ctx *c = s->c;
    int rc = 0;
    if (s->H < D - k) return 0; /* a pipeline without stages */
    cpipe *pp = calloc((size_t)D, sizeof *pp);
    int *list = malloc((size_t)MAL_MAX(1, s->nb) * sizeof *list);
    int *hsel = malloc((size_t)D * sizeof *hsel);
    if (!pp || !list || !hsel) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto cleanup;
    }
    double capsum = s->H;
    for (int i = 0; i < s->nb; i++)
        capsum += s->b[i].cap;
    double cbar = capsum / D;
    for (int i = 0; i < D; i++) {
        int nl = 0;
        for (int j = 0; j < s->nb; j++)
            if (block_of[j] == i) list[nl++] = j;
        if ((rc = cpipe_set(&pp[i], s->b, list, nl))) goto cleanup;
        int minh = pp[i].ns == 0 ? 1 : 0;
        if (c->exhaustive) {
            pp[i].lo = minh;
            pp[i].hi = s->H;
        } else {
            /* restricted: healthy counts near the ones that equalise the
             * pipelines' capacity (sum of 1/y) */
            double cb = 0;
            for (int g = 0; g < pp[i].ns; g++)
                cb += 1.0 / pp[i].sg[g].y;
            double tgt = cbar - cb;
            pp[i].lo = MAL_MAX(minh, (int)floor(tgt) - 2);
            pp[i].hi = MAL_MIN(s->H, (int)ceil(tgt) + 2);
            if (pp[i].hi < pp[i].lo) pp[i].hi = pp[i].lo;
        }
    }
    if (!c->exhaustive) {
        /* widen the ranges until they can add up to H */
        for (int it = 0; it < 4 * s->H + 4; it++) {
            long slo = 0, shi = 0;
            for (int i = 0; i < D; i++) {
                slo += pp[i].lo;
                shi += pp[i].hi;
            }
            if (slo <= s->H && shi >= s->H) break;
            for (int i = 0; i < D; i++) {
                if (slo > s->H) pp[i].lo = MAL_MAX(pp[i].ns == 0 ? 1 : 0, pp[i].lo - 1);
                if (shi < s->H) pp[i].hi = MAL_MIN(s->H, pp[i].hi + 1);
            }
        }
    }
    /* lower bound for this assignment: every pipeline's period is at least
     * L / (its capacity) and the total bubble is sum(S_i) - D */
    double lb = c->L * (double)(c->M + s->Ntot - D) / s->Ctot;
    if (lb >= s->best.T * (1 - TOL)) {
        s->n_pruned++;
        goto cleanup;
    }
    double T;
    s->n_cand++;
    if ((rc = allocate(c, D, pp, s->H, lb, &T, hsel))) goto cleanup;
    if (isfinite(T)) rc = record(s, D, block_of, hsel, T);
cleanup:
    if (pp)
        for (int i = 0; i < D; i++)
            cpipe_free(&pp[i]);
    free(pp);
    free(list);
    free(hsel);
    return rc;
}

/* Exhaustive: all set partitions of the bundles into at most D blocks
 * (restricted growth strings: pipelines are interchangeable). */
static int partitions(search *s, int D, int *rgs, int i, int k)
{
    if (i == s->nb) return eval_assignment(s, D, rgs, k);
    for (int b = 0; b <= k && b < D; b++) {
        rgs[i] = b;
        int rc = partitions(s, D, rgs, i + 1, b == k ? k + 1 : k);
        if (rc) return rc;
    }
    return 0;
}

static const bundle *g_sort_b;
static int cmp_bundle_idx(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    const bundle *u = &g_sort_b[i], *v = &g_sort_b[j];
    if (u->deficit != v->deficit) return u->deficit > v->deficit ? -1 : 1;
    return (i > j) - (i < j);
}

/* Search over D and assignments for the current node choices. */
static int search_choice(search *s)
{
    ctx *c = s->c;
    int rc = 0;
    /* bundles of this choice */
    s->nb = 0;
    s->H = 0;
    s->Ctot = 0;
    s->Ntot = 0;
    for (int n = 0; n < c->n_nodes; n++) {
        nodeinfo *nd = &c->nodes[n];
        s->H += nd->n_healthy_groups;
        if (nd->n_opts == 0) continue;
        nopt *o = &nd->opts[s->choice[n]];
        if (o->n_groups == 0) continue;
        bundle *b = &s->b[s->nb++];
        b->node = n;
        b->ns = o->n_groups;
        for (int g = 0; g < o->n_groups; g++)
            b->sg[g] = (sgrp){o->size[g], o->y[g]};
        b->cap = o->cap;
        b->deficit = nd->slots - o->cap;
        s->Ctot += o->cap;
        s->Ntot += o->n_groups;
    }
    s->Ctot += s->H;
    s->Ntot += s->H;
    if (s->Ntot == 0 || s->Ntot > c->M) return 0;
    int Dmax = MAL_MIN(s->Ntot, c->M);
    int dlo = 1, dhi = Dmax;
    if (!c->exhaustive) {
        dlo = MAL_MAX(1, c->dp_nom - 2);
        dhi = MAL_MIN(Dmax, c->dp_nom + 2);
        if (dlo > dhi) dlo = dhi;
    }
    int *rgs = malloc((size_t)MAL_MAX(1, s->nb) * sizeof *rgs);
    int *order = malloc((size_t)MAL_MAX(1, s->nb) * sizeof *order);
    if (!rgs || !order) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto cleanup;
    }
    /* nominal D first, then outwards: ties keep the familiar shape */
    for (int off = 0; off <= Dmax; off++) {
        for (int sign = 0; sign <= 1; sign++) {
            if (off == 0 && sign) continue;
            int D = sign ? c->dp_nom - off : c->dp_nom + off;
            if (D < dlo || D > dhi) continue;
            double lb = c->L * (double)(c->M + s->Ntot - D) / s->Ctot;
            if (lb >= s->best.T * (1 - TOL)) {
                s->n_pruned++;
                continue;
            }
            if (c->exhaustive) {
                rc = partitions(s, D, rgs, 0, 0);
            } else {
                /* restricted: spread the bundles, most severe first, in a
                 * snake over min(nb, D) pipelines */
                for (int i = 0; i < s->nb; i++)
                    order[i] = i;
                g_sort_b = s->b;
                qsort(order, (size_t)s->nb, sizeof *order, cmp_bundle_idx);
                int k = MAL_MIN(s->nb, D);
                for (int i = 0; i < s->nb; i++) {
                    int round = i / MAL_MAX(1, k), pos = i % MAL_MAX(1, k);
                    rgs[order[i]] = (round % 2 == 0) ? pos : k - 1 - pos;
                }
                rc = eval_assignment(s, D, rgs, k);
            }
            if (rc) goto cleanup;
        }
    }
cleanup:
    free(rgs);
    free(order);
    return rc;
}

/* Heuristic node choice: the option whose bundle, placed in a nominal
 * pipeline with the node's remaining healthy share, gives the highest
 * pipeline throughput m / ((m + S - 1) P). */
static int proxy_choice(ctx *c, int n, int *out)
{
    nodeinfo *nd = &c->nodes[n];
    int href = MAL_MAX(0, c->pp_nom - nd->slots);
    double mref = MAL_MAX(1.0, (double)c->M / c->dp_nom);
    double best = -1;
    *out = 0;
    sgrp sg[256];
    for (int k = 0; k < nd->n_opts; k++) {
        nopt *o = &nd->opts[k];
        if (o->n_groups > 256) continue;
        for (int g = 0; g < o->n_groups; g++)
            sg[g] = (sgrp){o->size[g], o->y[g]};
        qsort(sg, (size_t)o->n_groups, sizeof *sg, cmp_sgrp);
        double thr = 0;
        if (href + o->n_groups > 0) {
            const centry *e;
            int rc = composition(c, href, sg, o->n_groups, &e);
            if (rc) return rc;
            if (isfinite(e->P))
                thr = mref / ((mref + e->S - 1) * e->P);
            else
                continue;
        }
        if (thr > best * (1 + TOL)) {
            best = thr;
            *out = k;
        }
    }
    return 0;
}

static int enumerate_choices(search *s, int n)
{
    ctx *c = s->c;
    if (n == c->n_nodes) return search_choice(s);
    nodeinfo *nd = &c->nodes[n];
    if (nd->n_opts <= 1) {
        s->choice[n] = 0;
        return enumerate_choices(s, n + 1);
    }
    for (int k = 0; k < nd->n_opts; k++) {
        s->choice[n] = k;
        int rc = enumerate_choices(s, n + 1);
        if (rc) return rc;
    }
    return 0;
}

/* ---- step D: build the plan ---------------------------------------------- */

typedef struct slot {
    int pipe, stage, lb, le, first, last;
} slot;

/* Bytes (MB) of the state a rank would keep if it moved from its current
 * holding to (slot, TP index k of size t). */
static double keep_mb(const mal_profile *p, const mal_plan_loc *old, const mal_plan *cur, int k,
                      int t, const slot *sl)
{
    if (old->pipeline < 0) return 0;
    const mal_plan_pipeline *pl = &cur->pipelines[old->pipeline];
    const mal_plan_stage *st = &pl->stages[old->stage];
    double a = MAL_MAX((double)old->tp_rank / old->tp_size, (double)k / t);
    double b = MAL_MIN((double)(old->tp_rank + 1) / old->tp_size, (double)(k + 1) / t);
    if (b <= a) return 0;
    double ov = b - a, kept = 0;
    int l = MAL_MIN(st->layer_end, sl->le) - MAL_MAX(st->layer_begin, sl->lb);
    if (l > 0) kept += l * p->layer_state_mb * ov;
    if (old->stage == 0 && sl->first) kept += p->embed_state_mb * ov;
    if (old->stage == pl->n_stages - 1 && sl->last) kept += p->embed_state_mb * ov;
    /* a tiny bonus for the same TP position keeps ties stable and shards in place */
    return kept + (old->tp_rank == k && old->tp_size == t ? 1e-9 : 0);
}

typedef struct pair {
    double score;
    int g, s;
} pair;

static int cmp_pair(const void *a, const void *b)
{
    const pair *u = a, *v = b;
    if (u->score != v->score) return u->score > v->score ? -1 : 1;
    if (u->g != v->g) return u->g < v->g ? -1 : 1;
    return (u->s > v->s) - (u->s < v->s);
}

static int build_plan(ctx *c, const candidate *k, mal_plan *out)
{
    int rc = 0, D = k->D, t = c->t;
    cpipe *pp = calloc((size_t)D, sizeof *pp);
    int *list = malloc((size_t)MAL_MAX(1, k->nb) * sizeof *list);
    int *cls = malloc((size_t)D * sizeof *cls), *count = malloc((size_t)D * sizeof *count);
    int *Sc = malloc((size_t)D * sizeof *Sc), *mc = malloc((size_t)D * sizeof *mc);
    int *mi = malloc((size_t)D * sizeof *mi);
    double *Pc = malloc((size_t)D * sizeof *Pc);
    const centry **ent = calloc((size_t)D, sizeof *ent);
    bundle *b = calloc((size_t)MAL_MAX(1, k->nb), sizeof *b);
    int *hg = NULL, *susp = NULL, *sused = NULL, *gused = NULL;
    slot *slots = NULL;
    pair *pairs = NULL;
    mal_plan_loc *loc = NULL;
    if (!pp || !list || !cls || !count || !Sc || !mc || !mi || !Pc || !ent || !b) goto oom;

    /* bundles again, from the recorded choice */
    for (int i = 0; i < k->nb; i++) {
        nodeinfo *nd = &c->nodes[k->bnode[i]];
        nopt *o = &nd->opts[k->choice[k->bnode[i]]];
        b[i].node = k->bnode[i];
        b[i].ns = o->n_groups;
        b[i].sg = malloc((size_t)o->n_groups * sizeof *b[i].sg);
        if (!b[i].sg) goto oom;
        for (int g = 0; g < o->n_groups; g++)
            b[i].sg[g] = (sgrp){o->size[g], o->y[g]};
    }
    /* per pipeline: composition, layers, period */
    int n_cls = 0;
    for (int i = 0; i < D; i++) {
        int nl = 0;
        for (int j = 0; j < k->nb; j++)
            if (k->block_of[j] == i) list[nl++] = j;
        if ((rc = cpipe_set(&pp[i], b, list, nl))) goto cleanup;
        if ((rc = composition(c, k->h[i], pp[i].sg, pp[i].ns, &ent[i]))) goto cleanup;
        if (!isfinite(ent[i]->P)) {
            rc = MAL_ERR(MAL_ELP, "replan: internal error: chosen pipeline %d is infeasible", i);
            goto cleanup;
        }
        int found = -1;
        for (int q = 0; q < n_cls; q++)
            if (Pc[q] == ent[i]->P && Sc[q] == ent[i]->S) found = q;
        if (found < 0) {
            found = n_cls++;
            Pc[found] = ent[i]->P;
            Sc[found] = ent[i]->S;
            count[found] = 0;
        }
        cls[i] = found;
        count[found]++;
    }
    double T;
    if ((rc = mal_lp_microbatches(n_cls, Pc, Sc, count, c->M, mc, &T))) goto cleanup;
    if (!isfinite(T)) {
        rc = MAL_ERR(MAL_ELP, "replan: internal error: micro-batch program infeasible");
        goto cleanup;
    }
    long total = 0;
    for (int i = 0; i < D; i++) {
        mi[i] = mc[cls[i]];
        total += mi[i];
    }
    /* trim the excess from the slowest pipelines (never slower afterwards) */
    while (total > c->M) {
        int arg = -1;
        double worst = -1;
        for (int i = 0; i < D; i++) {
            if (mi[i] <= ent[i]->S) continue;
            double Ti = (mi[i] + ent[i]->S - 1) * ent[i]->P;
            if (Ti > worst) {
                worst = Ti;
                arg = i;
            }
        }
        if (arg < 0) break;
        mi[arg]--;
        total--;
    }

    /* the plan skeleton */
    if ((rc = mal_plan_alloc_pipelines(out, D))) goto cleanup;
    out->micro_batch_size = c->in->micro_batch_size;
    int n_slots = 0;
    for (int i = 0; i < D; i++)
        n_slots += k->h[i];
    slots = calloc((size_t)MAL_MAX(1, n_slots), sizeof *slots);
    if (!slots) goto oom;
    int ns = 0;
    double Tmax = 0;
    for (int i = 0; i < D; i++) {
        const centry *e = ent[i];
        out->pipelines[i].micro_batches = mi[i];
        double Ti = (mi[i] + e->S - 1) * e->P;
        Tmax = MAL_MAX(Tmax, Ti);
        out->pipelines[i].predicted_time = Ti * c->p->layer_time;
        if ((rc = mal_plan_alloc_stages(out, i, e->S))) goto cleanup;
        int sz[1024], kind[1024];
        double yy[1024];
        if (e->S > 1024) {
            rc = MAL_ERR(MAL_EINVAL, "replan: pipeline with %d stages is too long", e->S);
            goto cleanup;
        }
        stage_order(t, k->h[i], pp[i].sg, pp[i].ns, sz, yy, kind);
        int lb = 0;
        for (int j = 0; j < e->S; j++) {
            mal_plan_stage *st = &out->pipelines[i].stages[j];
            st->layer_begin = lb;
            st->layer_end = lb + e->l[j];
            st->n_ranks = 0;
            if (kind[j] < 0) {
                slots[ns++] = (slot){i, j, lb, lb + e->l[j], j == 0, j == e->S - 1};
            } else {
                /* special group: find an unused group of this (size, y) among
                 * the pipeline's bundles' options, in bundle order */
                const sgrp *want = &pp[i].sg[kind[j]];
                int done = 0;
                for (int q = 0; q < pp[i].nb && !done; q++) {
                    int bi = pp[i].bund[q];
                    nopt *o = &c->nodes[k->bnode[bi]].opts[k->choice[k->bnode[bi]]];
                    int pos = 0;
                    for (int g = 0; g < o->n_groups && !done; g++) {
                        if (o->size[g] == want->size && o->y[g] == want->y && o->ranks[pos] >= 0) {
                            if ((rc = mal_plan_set_stage(out, i, j, o->size[g], o->ranks + pos, lb,
                                                         lb + e->l[j])))
                                goto cleanup;
                            o->ranks[pos] = -1 - o->ranks[pos]; /* mark used */
                            done = 1;
                        }
                        pos += o->size[g];
                    }
                }
                if (!done) {
                    rc = MAL_ERR(MAL_ELP, "replan: internal error: special group not found");
                    goto cleanup;
                }
            }
            lb += e->l[j];
        }
    }
    /* restore the used marks */
    for (int n = 0; n < c->n_nodes; n++)
        for (int q = 0; q < c->nodes[n].n_opts; q++) {
            nopt *o = &c->nodes[n].opts[q];
            int na = 0;
            for (int g = 0; g < o->n_groups; g++)
                na += o->size[g];
            for (int r = 0; r < na; r++)
                if (o->ranks[r] < 0) o->ranks[r] = -1 - o->ranks[r];
        }
    out->predicted_step_time = Tmax * c->p->layer_time + c->p->sync_time;

    /* healthy groups (physical) and suspended ranks */
    int n_hg = 0, n_susp = 0;
    for (int n = 0; n < c->n_nodes; n++) {
        n_hg += c->nodes[n].n_healthy_groups;
        if (c->nodes[n].n_opts) n_susp += c->nodes[n].opts[k->choice[n]].n_susp;
    }
    if (n_hg != n_slots) {
        rc = MAL_ERR(MAL_ELP, "replan: internal error: %d healthy groups for %d slots", n_hg,
                     n_slots);
        goto cleanup;
    }
    hg = malloc((size_t)MAL_MAX(1, n_hg * t) * sizeof *hg);
    susp = malloc((size_t)MAL_MAX(1, n_susp) * sizeof *susp);
    sused = calloc((size_t)MAL_MAX(1, n_slots), sizeof *sused);
    gused = calloc((size_t)MAL_MAX(1, n_hg), sizeof *gused);
    if (!hg || !susp || !sused || !gused) goto oom;
    int g0 = 0, s0 = 0;
    for (int n = 0; n < c->n_nodes; n++) {
        nodeinfo *nd = &c->nodes[n];
        memcpy(hg + (size_t)g0 * t, nd->healthy, (size_t)(nd->n_healthy_groups * t) * sizeof *hg);
        g0 += nd->n_healthy_groups;
        if (nd->n_opts) {
            nopt *o = &nd->opts[k->choice[n]];
            memcpy(susp + s0, o->susp, (size_t)o->n_susp * sizeof *susp);
            s0 += o->n_susp;
        }
    }
    qsort(susp, (size_t)n_susp, sizeof *susp, cmp_int);
    if ((rc = mal_plan_set_suspended(out, n_susp, susp))) goto cleanup;

    /* step D: healthy groups to healthy slots, keeping as much state as
     * possible (greedy on the kept bytes of every (group, slot) pair) */
    int *assign = gused; /* gused[g] = 1 + slot index once placed */
    if (c->in->current && n_hg > 0) {
        const mal_plan *cur = c->in->current;
        loc = malloc((size_t)n_hg * t * sizeof *loc);
        if (!loc) goto oom;
        for (int i = 0; i < n_hg * t; i++)
            if (mal_plan_locate(cur, hg[i], &loc[i])) loc[i] = (mal_plan_loc){-1, -1, -1, 0};
        mal_clearerr();
        size_t np = 0, capp = 1024;
        pairs = malloc(capp * sizeof *pairs);
        if (!pairs) goto oom;
        for (int g = 0; g < n_hg; g++)
            for (int s = 0; s < n_slots; s++) {
                double sc = 0;
                for (int q = 0; q < t; q++)
                    sc += keep_mb(c->p, &loc[g * t + q], cur, q, t, &slots[s]);
                if (sc <= 0) continue;
                if (np == capp) {
                    pair *npairs = realloc(pairs, 2 * capp * sizeof *pairs);
                    if (!npairs) goto oom;
                    pairs = npairs;
                    capp *= 2;
                }
                pairs[np++] = (pair){sc, g, s};
            }
        qsort(pairs, np, sizeof *pairs, cmp_pair);
        for (size_t q = 0; q < np; q++) {
            if (assign[pairs[q].g] || sused[pairs[q].s]) continue;
            assign[pairs[q].g] = 1 + pairs[q].s;
            sused[pairs[q].s] = 1;
        }
    }
    int nextg = 0;
    for (int s = 0; s < n_slots; s++) {
        if (sused[s]) continue;
        while (nextg < n_hg && assign[nextg])
            nextg++;
        assign[nextg] = 1 + s;
        sused[s] = 1;
    }
    for (int g = 0; g < n_hg; g++) {
        const slot *sl = &slots[assign[g] - 1];
        if ((rc = mal_plan_set_stage(out, sl->pipe, sl->stage, t, hg + (size_t)g * t, sl->lb,
                                     sl->le)))
            goto cleanup;
    }
    goto cleanup;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
cleanup:
    if (pp)
        for (int i = 0; i < D; i++)
            cpipe_free(&pp[i]);
    if (b)
        for (int i = 0; i < k->nb; i++)
            free(b[i].sg);
    free(pp);
    free(list);
    free(cls);
    free(count);
    free(Sc);
    free(mc);
    free(mi);
    free(Pc);
    free(ent);
    free(b);
    free(hg);
    free(susp);
    free(sused);
    free(gused);
    free(slots);
    free(pairs);
    free(loc);
    return rc;
}

/* ---- driver --------------------------------------------------------------- */

int mal_replan_default_dp(const mal_cluster *cl, const mal_profile *p, int M)
{
    int t = p->tp;
    if (cl->world_size % t) return 0;
    int groups = cl->world_size / t;
    for (int dp = groups; dp >= 1; dp--) {
        if (groups % dp) continue;
        int pp = groups / dp;
        if (pp > p->n_layers || M < dp * pp) continue;
        int ok = 1;
        for (int j = 0; j < pp && ok; j++) {
            int l = p->n_layers / pp + (j < p->n_layers % pp ? 1 : 0);
            if (mal_cost_layer_cap(p, cl->memory_mb, t, pp, j) < l) ok = 0;
        }
        if (ok) return dp;
    }
    return 0;
}

int mal_replan_uniform(const mal_replan_input *in, mal_plan *out)
{
    const mal_profile *p = in->profile;
    int t = p->tp, world = in->cluster->world_size;
    mal_plan_init(out);
    int dp = in->nominal_dp > 0 ? in->nominal_dp
                                : mal_replan_default_dp(in->cluster, p, in->n_micro_batches);
    if (dp < 1 || world % (t * dp))
        return MAL_ERR(MAL_EINVAL, "uniform plan: %d ranks do not split into %d pipelines of TP %d",
                       world, dp, t);
    int pp = world / (t * dp);
    int rc = mal_plan_uniform(dp, t, pp, p->n_layers, in->micro_batch_size,
                              dp * in->micro_batch_size, out);
    if (rc) return rc;
    for (int d = 0; d < dp; d++)
        out->pipelines[d].micro_batches =
            in->n_micro_batches / dp + (d < in->n_micro_batches % dp ? 1 : 0);
    return 0;
}

static int check_input(const mal_replan_input *in)
{
    const mal_cluster *cl = in->cluster;
    const mal_profile *p = in->profile;
    if (!cl || !p || !in->rates)
        return MAL_ERR(MAL_EINVAL, "replan: cluster, profile and rates are required");
    if (in->micro_batch_size < 1)
        return MAL_ERR(MAL_EINVAL, "replan: micro_batch_size must be >= 1 (got %d)",
                       in->micro_batch_size);
    if (in->n_micro_batches < 1)
        return MAL_ERR(MAL_EINVAL,
                       "replan: the number of micro-batches per step must be >= 1 (got %d)",
                       in->n_micro_batches);
    for (int r = 0; r < cl->world_size; r++) {
        double x = in->rates[r];
        if (isnan(x) || isinf(x) || x <= 0)
            return MAL_ERR(MAL_EINVAL, "rates: rank %d has rate %g; rates must be finite and > 0",
                           r, x);
    }
    if (mal_profile_alpha(p, p->tp) <= 0)
        return MAL_ERR(MAL_EINVAL, "model profile: no alpha for the nominal TP size %d", p->tp);
    if (p->n_layers < 1) return MAL_ERR(MAL_EINVAL, "model profile: n_layers must be >= 1");
    if (in->current) {
        int rc = mal_plan_validate(
            in->current, cl->world_size, p->n_layers, p->n_heads > 0 ? p->n_heads : 1 << 20,
            p->ffn_hidden > 0 ? p->ffn_hidden : 1 << 20, mal_plan_global_batch(in->current));
        if (rc) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", mal_errmsg());
            return MAL_ERR(MAL_EINVAL, "current plan does not fit this cluster/model: %s", msg);
        }
    }
    return 0;
}

int mal_replan(const mal_replan_input *in, mal_plan *out, mal_replan_stats *stats)
{
    double t0 = mal_now();
    int rc;
    mal_plan_init(out);
    if ((rc = check_input(in))) return rc;
    ctx c = {0};
    search s = {0};
    c.in = in;
    c.p = in->profile;
    c.t = in->profile->tp;
    c.L = in->profile->n_layers;
    c.M = in->n_micro_batches;
    c.world = in->cluster->world_size;
    c.mem = in->cluster->memory_mb;
    c.x = malloc((size_t)c.world * sizeof *c.x);
    if (!c.x) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (int r = 0; r < c.world; r++)
        c.x[r] = mal_cost_floor(in->rates[r]);
    int nominal_groups = c.world / c.t;
    c.dp_nom = in->nominal_dp > 0 ? in->nominal_dp : mal_replan_default_dp(in->cluster, c.p, c.M);
    if (c.dp_nom < 1) c.dp_nom = 1;
    c.pp_nom = MAL_MAX(1, nominal_groups / c.dp_nom);
    if ((rc = build_nodes(&c))) goto cleanup;

    /* exhaustive when the space is small */
    double combos = 1;
    int max_groups = 0, max_bundles = 0;
    for (int n = 0; n < c.n_nodes; n++) {
        nodeinfo *nd = &c.nodes[n];
        combos *= MAL_MAX(1, nd->n_opts);
        int mg = 0;
        for (int q = 0; q < nd->n_opts; q++)
            mg = MAL_MAX(mg, nd->opts[q].n_groups);
        max_groups += nd->n_healthy_groups + mg;
        max_bundles += mg > 0;
    }
    if (in->search == MAL_REPLAN_EXHAUSTIVE)
        c.exhaustive = 1;
    else if (in->search == MAL_REPLAN_HEURISTIC)
        c.exhaustive = 0;
    else {
        /* Bell numbers: set partitions of the bundles */
        static const double bell[] = {1, 1, 2, 5, 15, 52, 203, 877};
        double work = combos * (max_bundles < 8 ? bell[max_bundles] : 1e30) * max_groups;
        c.exhaustive = max_groups <= 16 && work <= 20000;
    }

    s.c = &c;
    s.best.T = INFINITY;
    s.choice = calloc((size_t)MAL_MAX(1, c.n_nodes), sizeof *s.choice);
    s.b = calloc((size_t)MAL_MAX(1, c.n_nodes), sizeof *s.b);
    if (!s.choice || !s.b) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto cleanup;
    }
    for (int n = 0; n < c.n_nodes; n++) {
        s.b[n].sg = malloc((size_t)MAL_MAX(1, c.world) * sizeof *s.b[n].sg);
        if (!s.b[n].sg) {
            rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
            goto cleanup;
        }
    }
    if (c.exhaustive) {
        rc = enumerate_choices(&s, 0);
    } else {
        for (int n = 0; n < c.n_nodes && !rc; n++)
            if (c.nodes[n].n_opts > 1) rc = proxy_choice(&c, n, &s.choice[n]);
        if (!rc) rc = search_choice(&s);
    }
    if (rc) goto cleanup;
    if (!isfinite(s.best.T)) {
        /* explain why: the memory of the most spread-out healthy layout */
        int pmax = MAL_MIN(c.L, nominal_groups);
        double need = mal_cost_stage_memory(c.p, c.t, pmax, 0, (c.L + pmax - 1) / pmax);
        if (nominal_groups > c.M)
            rc = MAL_ERR(
                MAL_EINVAL,
                "no plan fits: %d micro-batches per step cannot feed %d TP groups (1F1B needs "
                "m_i >= S_i, so sum of stages <= micro-batches); raise the global batch",
                c.M, nominal_groups);
        else
            rc = MAL_ERR(
                MAL_EINVAL,
                "no plan fits in memory: memory_mb = %g, but even %d stages of TP %d need "
                "%.1f MB on the first stage (k, E, X from the profile); use more ranks, more "
                "memory or a smaller micro-batch",
                c.mem, pmax, c.t, need);
        goto cleanup;
    }
    if ((rc = build_plan(&c, &s.best, out))) goto cleanup;
    rc = mal_plan_validate(out, c.world, c.L, c.p->n_heads > 0 ? c.p->n_heads : 1 << 20,
                           c.p->ffn_hidden > 0 ? c.p->ffn_hidden : 1 << 20,
                           c.M * in->micro_batch_size);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mal_errmsg());
        rc = MAL_ERR(MAL_ELP, "replan: internal error: the plan fails validation: %s", msg);
        goto cleanup;
    }
    if (stats) {
        stats->objective = s.best.T;
        stats->n_layer_lps = c.n_lps;
        stats->n_candidates = s.n_cand;
        stats->n_pruned = s.n_pruned;
        stats->exhaustive = c.exhaustive;
        stats->seconds = mal_now() - t0;
    }
cleanup:
    if (rc) mal_plan_fini(out);
    cand_free(&s.best);
    if (s.b)
        for (int n = 0; n < c.n_nodes; n++)
            free(s.b[n].sg);
    free(s.b);
    free(s.choice);
    if (c.nodes)
        for (int n = 0; n < c.n_nodes; n++) {
            for (int q = 0; q < c.nodes[n].n_opts; q++)
                nopt_free(&c.nodes[n].opts[q]);
            free(c.nodes[n].opts);
            free(c.nodes[n].healthy);
        }
    free(c.nodes);
    for (size_t i = 0; i < c.cache_cap; i++) {
        free(c.cache[i].key);
        free(c.cache[i].l);
    }
    free(c.cache);
    free(c.x);
    return rc;
}
