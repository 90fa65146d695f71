/* Step C of the planner, per pipeline: for a composition (h healthy full
 * groups plus some specials) the stage order and the layers per stage that
 * minimise the period P = max_j y_j l_j within memory, memoised.
 *
 * Memory makes the order matter: stage j of S may hold at most
 * ub(size, type, S, j) layers (1F1B keeps S - j micro-batches of activations in
 * flight at stage j, and the first and last stages hold the embedding and
 * the LM head), so a slow, small group holding few layers can sit in front
 * and leave the roomy late positions to fast groups.  For a trial period P,
 * group g can usefully hold c_g = floor(P / y_g) layers, so P is feasible
 * iff some assignment of groups to positions has every min(c_g, ub(g, j)) >= 1
 * and sum >= L: a maximum-weight perfect matching (Hungarian algorithm,
 * exact).  The least feasible P is one of the values y_g * l, found by
 * bisection over them (feasibility is monotone in P).  When memory binds at
 * no position (c_g <= ub(g, j) everywhere) the order is free and the test is
 * sum c_g >= L.  Among optimal orders the matching prefers the README's rule
 * (h - 1 healthy groups, the specials largest first, the last healthy group),
 * and the layers left over are taken from the slowest stages, so stage
 * times come out balanced. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "search.h"

/* Above this many layers the period is found by bisection on the real line
 * instead of over the list of candidate values y * l. */
#define RP_MAX_CAND 4096
/* Pipelines deeper than this are not considered (the matching is S x S). */
#define RP_MAX_STAGES 512

/* FNV-1a over bytes (the cache's hash) */
static uint64_t fnv_bytes(const unsigned char *b, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int layer_cap_max(const ctx *c, int size, int ty);

int rp_layer_cap_max(const ctx *c, int size, int ty)
{
    int l = 0;
    while ((1 << l) < size && l <= MAL_REPLAN_MAX_TP_LOG)
        l++;
    if ((1 << l) != size || l > MAL_REPLAN_MAX_TP_LOG) return layer_cap_max(c, size, ty);
    ctx *mc = (ctx *)c; /* a memo, not a change of the context's meaning */
    if (mc->capmax[ty][l] <= 0) mc->capmax[ty][l] = 1 + layer_cap_max(c, size, ty);
    return mc->capmax[ty][l] - 1;
}

void rp_set_modes(ctx *c)
{
    int r = c->recompute;
    c->n_modes = 0;
    for (int m = MAL_RECOMPUTE_NONE; m <= MAL_RECOMPUTE_FULL; m++)
        if (r == MAL_REPLAN_RECOMPUTE_AUTO || r == m) c->mode[c->n_modes++] = m;
    if (c->n_modes == 0) /* not a mode: none */
        c->mode[c->n_modes++] = MAL_RECOMPUTE_NONE;
    /* each device type's time factors from its own profile */
    for (int ty = 0; ty < MAL_MAX(1, c->n_ty); ty++)
        for (int m = 0; m < c->n_modes; m++)
            c->mode_rt[ty][m] = 1.0 + mal_cost_recompute_time(c->tprof[ty], c->mode[m]);
}

int rp_layer_cap(const ctx *c, int size, int ty, int S, int j, int m)
{
    return mal_cost_layer_cap_mode(c->tprof[ty], c->tmem[ty], size, S, j, c->replicas, c->mode[m]);
}

static int layer_cap_max(const ctx *c, int size, int ty)
{
    /* ub(size, ty, S, j) = floor((mem - fixed terms) / per-layer need) <=
     * (mem - X) / the least per-layer need of any depth and mode (the fixed
     * terms other than X are not negative); with the type's memory and
     * profile */
    const mal_profile *p = c->tprof[ty];
    double room = c->tmem[ty] - p->overhead_mb;
    if (room < 0) return 0;
    double kmin = INFINITY;
    for (int m = 0; m < c->n_modes; m++)
        for (int d = 0; d < c->L; d++) {
            mal_cost_memory t0, t1;
            mal_cost_stage_terms(p, size, d + 1, 0, 0, d, c->replicas, c->mode[m], &t0);
            mal_cost_stage_terms(p, size, d + 1, 0, 1, d, c->replicas, c->mode[m], &t1);
            kmin = MAL_MIN(kmin, t1.total - t0.total - t1.workspace);
        }
    if (!(kmin > 0)) return c->L;
    double l = floor(room / kmin * (1 + 1e-12) + 1e-9);
    return l >= c->L ? c->L : (int)l;
}

/* Preferred order (README rule) of h healthy groups and ns sorted specials:
 * kind[] per stage, -1 healthy. */
static void rule_order(int h, int ns, int *kind)
{
    int S = 0, before = h >= 2 ? h - 1 : h;
    for (int i = 0; i < before; i++)
        kind[S++] = -1;
    for (int i = 0; i < ns; i++)
        kind[S++] = i;
    if (h >= 2) kind[S++] = -1;
}

/* Minimum-cost assignment of n rows to distinct columns of m >= n
 * (Hungarian algorithm with potentials, O(n^2 m)); a[i * m + j] costs;
 * col_of[i] out.  Scratch: u[n+1], v, p, way, minv, used [m+1].  Returns
 * the total cost. */
static long long hungarian(int n, int m, const long long *a, int *col_of, long long *u,
                           long long *v, int *p, int *way, long long *minv, char *used)
{
    const long long INF = (long long)4e18;
    for (int i = 0; i <= n; i++)
        u[i] = 0;
    for (int j = 0; j <= m; j++) {
        v[j] = 0;
        p[j] = 0;
    }
    for (int i = 1; i <= n; i++) {
        p[0] = i;
        int j0 = 0;
        for (int j = 0; j <= m; j++) {
            minv[j] = INF;
            used[j] = 0;
        }
        do {
            used[j0] = 1;
            int i0 = p[j0], j1 = 0;
            long long delta = INF;
            for (int j = 1; j <= m; j++) {
                if (used[j]) continue;
                long long cur = a[(size_t)(i0 - 1) * m + (j - 1)] - u[i0] - v[j];
                if (cur < minv[j]) {
                    minv[j] = cur;
                    way[j] = j0;
                }
                if (minv[j] < delta) {
                    delta = minv[j];
                    j1 = j;
                }
            }
            for (int j = 0; j <= m; j++) {
                if (used[j]) {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
        } while (p[j0] != 0);
        do {
            int j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0);
    }
    long long cost = 0;
    for (int j = 1; j <= m; j++)
        if (p[j]) {
            col_of[p[j] - 1] = j - 1;
            cost += a[(size_t)(p[j] - 1) * m + (j - 1)];
        }
    return cost;
}

/* One composition being solved: h healthy full groups (all alike) and ns
 * specials; S = h + ns positions.  With recomputation each stage takes the
 * mode (of nm, by rising time) in which it holds the most layers within
 * the period: a group's worth at a position is max over the modes m of
 * min(floor(P / (y rt_m)), ub_m) -- still a weight per group and
 * position, so the assignment below stays exact. */
typedef struct solver {
    int S, L, h, ns, nm;
    const double *rth;     /* [nm] time factors of the healthy groups' type */
    const double (*rt)[3]; /* [type][nm] time factors of each device type */
    double yh;             /* rate of a healthy full group */
    const sgrp *sg;        /* [ns] */
    const int *ubh;        /* [nm * S] ub of a healthy full group at each position */
    const int *ubs;        /* [(nm * ns) * S] ub of each special at each position */
    const int *pref;       /* [ns] the rule's position of each special */
    int *pos;              /* [ns] out: position of each special */
    char *taken;           /* [S] */
    int caph[3], *caps;    /* layers each can hold at the trial period, by
                            * mode (caps: [nm * ns]) */
    long long *a, *u, *v, *minv;
    int *p, *way;
    char *used;
} solver;

#define FORBID ((long long)1e15)

/* The time factor of group i (< 0: healthy) in mode index m: its type's. */
static double rt_of(const solver *s, int i, int m)
{
    return i < 0 ? s->rth[m] : s->rt[s->sg[i].ty][m];
}

static int cap_at(double P, double y, int L)
{
    double f = floor(P / y * (1 + 1e-12) + 1e-9);
    return f >= L ? L : (int)f;
}

/* Layers special i holds at position j at the trial period (its best mode);
 * i < 0: a healthy full group. */
static int worth(const solver *s, int i, int j)
{
    int w = 0;
    for (int m = 0; m < s->nm; m++) {
        int v = i < 0 ? MAL_MIN(s->caph[m], s->ubh[m * s->S + j])
                      : MAL_MIN(s->caps[m * s->ns + i], s->ubs[(m * s->ns + i) * s->S + j]);
        w = MAL_MAX(w, v);
    }
    return w;
}

/* Layers held in total when specials sit at s->pos[] and healthy groups
 * fill the other positions; -1 when some stage would hold none. */
static long held(const solver *s)
{
    long total = 0;
    memset(s->taken, 0, (size_t)s->S);
    for (int i = 0; i < s->ns; i++) {
        int w = worth(s, i, s->pos[i]);
        if (w < 1) return -1;
        total += w;
        s->taken[s->pos[i]] = 1;
    }
    for (int j = 0; j < s->S; j++) {
        if (s->taken[j]) continue;
        int w = worth(s, -1, j);
        if (w < 1) return -1;
        total += w;
    }
    return total;
}

/* Is period P feasible?  When it is, s->pos[] holds an order that reaches
 * L layers (the rule's when memory binds nowhere). */
static int feasible(solver *s, double P)
{
    int S = s->S, ns = s->ns, loose = 1;
    /* the first mode is the fastest: when it fits everywhere, it is every
     * stage's best */
    for (int m = 0; m < s->nm; m++) {
        s->caph[m] = s->h > 0 ? cap_at(P, s->yh * rt_of(s, -1, m), s->L) : s->L;
        for (int i = 0; i < ns; i++)
            s->caps[m * ns + i] = cap_at(P, s->sg[i].y * rt_of(s, i, m), s->L);
    }
    if (s->h > 0 && s->caph[0] < 1) return 0;
    for (int i = 0; i < ns; i++) {
        if (s->caps[i] < 1) return 0;
        for (int j = 0; j < S && loose; j++)
            loose = s->ubs[i * S + j] >= s->caps[i];
    }
    for (int j = 0; j < S && loose && s->h > 0; j++)
        loose = s->ubh[j] >= s->caph[0];
    for (int i = 0; i < ns; i++)
        s->pos[i] = s->pref[i];
    if (loose || ns == 0) return held(s) >= s->L;
    /* Memory binds: place the specials by a maximum-weight assignment of
     * specials to positions.  Healthy groups are all alike, so a special at
     * j is worth w(i, j) - w_h(j) over the healthy group it displaces; a
     * position no healthy group can take must get a special (a bonus larger
     * than all weights together).  Ties go to the rule's positions
     * (sum |j - pref| stays below one layer's weight). */
    long long W = (long long)S * ns + 1, BONUS = (long long)(s->L + 1) * 2 * W * (S + 1);
    int must = 0;
    for (int j = 0; j < S && s->h > 0; j++)
        must += worth(s, -1, j) < 1;
    if (must > ns) return 0;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < S; j++) {
            int w = worth(s, i, j);
            long long d = j > s->pref[i] ? j - s->pref[i] : s->pref[i] - j, val;
            if (w < 1) {
                s->a[(size_t)i * S + j] = FORBID;
                continue;
            }
            if (s->h == 0) {
                val = w;
            } else {
                int wh = worth(s, -1, j);
                val = wh < 1 ? w + BONUS / W : w - wh;
            }
            s->a[(size_t)i * S + j] = -val * W + d;
        }
    long long cost = hungarian(ns, S, s->a, s->pos, s->u, s->v, s->p, s->way, s->minv, s->used);
    if (cost >= FORBID / 2) return 0;
    return held(s) >= s->L;
}

/* The first (fastest) mode index in which group i (< 0: healthy) holds l
 * layers at position j within memory and the trial period. */
static int stage_mode(const solver *s, int i, int j, int l)
{
    for (int m = 0; m < s->nm; m++) {
        int cap = i < 0 ? s->caph[m] : s->caps[m * s->ns + i];
        int ub = i < 0 ? s->ubh[m * s->S + j] : s->ubs[(m * s->ns + i) * s->S + j];
        if (l <= cap && l <= ub) return m;
    }
    return s->nm - 1; /* not reached: l is some mode's worth */
}

/* The next n bytes (8-aligned) of the solver's scratch: their offset. */
static size_t take(size_t *off, size_t n)
{
    size_t at = *off;
    *off += (n + 7) & ~(size_t)7;
    return at;
}

/* The candidate periods y * l >= lb of every distinct rate y (l = 1..L),
 * ascending and without repeats, into cand; their number.  Each rate's
 * list is ascending already: a merge of the lists, not a sort. */
static size_t candidates(const ctx *c, int h, const sgrp *sg, int ns, double lb, double *cand,
                         double *ys, int *next)
{
    int L = c->L, k = 0;
    for (int m = 0; m < c->n_modes; m++)
        for (int i = -1; i < ns; i++) {
            double y = i < 0 ? c->yh * c->mode_rt[c->hty][m] : sg[i].y * c->mode_rt[sg[i].ty][m];
            if ((i < 0 && h == 0) || (i > 0 && sg[i].y == sg[i - 1].y && sg[i].ty == sg[i - 1].ty))
                continue;
            int l = 1;
            while (l <= L && y * l < lb)
                l++;
            if (l > L) continue;
            ys[k] = y;
            next[k++] = l;
        }
    size_t n = 0;
    for (;;) {
        int arg = -1;
        double v = INFINITY;
        for (int q = 0; q < k; q++)
            if (next[q] <= L && ys[q] * next[q] < v) {
                v = ys[q] * next[q];
                arg = q;
            }
        if (arg < 0) break;
        next[arg]++;
        if (n == 0 || v != cand[n - 1]) cand[n++] = v;
    }
    return n;
}

/* Solve composition e: h healthy full groups and ns sorted specials. */
static int solve(ctx *c, int h, const sgrp *sg, int ns, centry *e)
{
    int S = h + ns, L = c->L, rc = 0;
    e->P = INFINITY;
    if (S < 1 || S > L || S > RP_MAX_STAGES) return 0;
    /* every array of this solve from one scratch buffer kept in the context
     * (a composition is solved for every option of every node situation:
     * hundreds of thousands at scale) */
    const size_t nm = (size_t)c->n_modes;
    size_t nsx = (size_t)MAL_MAX(1, ns), S1 = (size_t)S + 1, off = 0;
    size_t ncand = L <= RP_MAX_CAND ? nm * (nsx + 1) * L + 1 : 1;
    size_t o_kind = take(&off, S * sizeof(int)), o_ubh = take(&off, nm * S * sizeof(int));
    size_t o_ubs = take(&off, nm * nsx * S * sizeof(int)), o_pref = take(&off, nsx * sizeof(int));
    size_t o_cand = take(&off, ncand * sizeof(double)), o_yj = take(&off, S * sizeof(double));
    size_t o_ys = take(&off, nm * (nsx + 1) * sizeof(double));
    size_t o_next = take(&off, nm * (nsx + 1) * sizeof(int)), o_pos = take(&off, nsx * sizeof(int));
    size_t o_taken = take(&off, (size_t)S), o_caps = take(&off, nm * nsx * sizeof(int));
    size_t o_a = take(&off, nsx * S * sizeof(long long));
    size_t o_u = take(&off, (nsx + 1) * sizeof(long long));
    size_t o_v = take(&off, S1 * sizeof(long long)), o_minv = take(&off, S1 * sizeof(long long));
    size_t o_p = take(&off, S1 * sizeof(int)), o_way = take(&off, S1 * sizeof(int));
    size_t o_used = take(&off, S1);
    if (off > c->scratch_cap) {
        unsigned char *nb = realloc(c->scratch, off);
        if (!nb) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        c->scratch = nb;
        c->scratch_cap = off;
    }
    unsigned char *base = c->scratch;
    int *kind = (int *)(base + o_kind), *ubh = (int *)(base + o_ubh);
    int *ubs = (int *)(base + o_ubs), *pref = (int *)(base + o_pref);
    double *cand = (double *)(base + o_cand), *yj = (double *)(base + o_yj);
    double *ys = (double *)(base + o_ys);
    int *next = (int *)(base + o_next);
    solver s = {0};
    s.S = S;
    s.L = L;
    s.nm = c->n_modes;
    s.rth = c->mode_rt[c->hty];
    s.rt = (const double(*)[3])c->mode_rt;
    s.h = h;
    s.yh = c->yh;
    s.ns = ns;
    s.sg = sg;
    s.pos = (int *)(base + o_pos);
    s.taken = (char *)(base + o_taken);
    s.caps = (int *)(base + o_caps);
    s.a = (long long *)(base + o_a);
    s.u = (long long *)(base + o_u);
    s.v = (long long *)(base + o_v);
    s.minv = (long long *)(base + o_minv);
    s.p = (int *)(base + o_p);
    s.way = (int *)(base + o_way);
    s.used = (char *)(base + o_used);
    rule_order(h, ns, kind);
    for (int j = 0; j < S; j++)
        if (kind[j] >= 0) pref[kind[j]] = j;
    double ymax = h > 0 ? c->yh : 0, inv = h / c->yh;
    for (int m = 0; m < c->n_modes; m++)
        for (int j = 0; j < S; j++)
            ubh[m * S + j] = h > 0 ? rp_layer_cap(c, c->th, c->hty, S, j, m) : 0;
    for (int i = 0; i < ns; i++) {
        ymax = MAL_MAX(ymax, sg[i].y);
        inv += 1.0 / sg[i].y;
        int best = 0;
        for (int m = 0; m < c->n_modes; m++)
            for (int j = 0; j < S; j++) {
                /* ub depends on the size and the type only: copy the row
                 * of an equal one */
                int *u = &ubs[(m * ns + i) * S + j];
                if (i > 0 && sg[i].size == sg[i - 1].size && sg[i].ty == sg[i - 1].ty)
                    *u = u[-S];
                else if (sg[i].size == c->th && sg[i].ty == c->hty && h > 0)
                    *u = ubh[m * S + j];
                else
                    *u = rp_layer_cap(c, sg[i].size, sg[i].ty, S, j, m);
                best = MAL_MAX(best, *u);
            }
        if (best < 1) goto done; /* this group fits nowhere */
    }
    s.ubh = ubh;
    s.ubs = ubs;
    s.pref = pref;
    /* candidate periods y * l above the two lower bounds (every stage holds
     * a layer: P >= max y; all layers: P >= L / sum 1/y) */
    double lb = MAL_MAX(ymax, L / inv) * (1 - 1e-12), P;
    /* with every group at y * L the test is memory alone */
    /* the slowest group in the slowest mode holding every layer: the
     * largest period worth trying */
    double rtmax = 1.0;
    for (int ty = 0; ty < MAL_MAX(1, c->n_ty); ty++)
        rtmax = MAL_MAX(rtmax, c->mode_rt[ty][c->n_modes - 1]);
    const double Ptop = ymax * rtmax * L;
    if (!feasible(&s, Ptop)) goto done;
    if (L <= RP_MAX_CAND) {
        size_t nu = candidates(c, h, sg, ns, lb, cand, ys, next);
        size_t lo = 0, hi = nu; /* cand[hi] feasible; cand[nu] = Ptop */
        cand[nu] = Ptop;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (feasible(&s, cand[mid]))
                hi = mid;
            else
                lo = mid + 1;
        }
        P = cand[hi];
    } else {
        /* very deep models: bisection on the real line lands within
         * rounding of the least candidate; the split below recomputes P */
        double lo = lb, hi = Ptop;
        for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; it++) {
            double mid = 0.5 * (lo + hi);
            if (feasible(&s, mid))
                hi = mid;
            else
                lo = mid;
        }
        P = hi;
    }
    feasible(&s, P);
    /* the stages: specials where the assignment put them, healthy groups
     * elsewhere; then the layers beyond L come off the slowest stages */
    e->kind = malloc((size_t)S * sizeof *e->kind);
    e->l = malloc((size_t)S * sizeof *e->l);
    e->mode = malloc((size_t)S);
    if (!e->kind || !e->l || !e->mode) goto oom;
    long total = 0;
    for (int j = 0; j < S; j++)
        e->kind[j] = -1;
    for (int i = 0; i < ns; i++)
        e->kind[s.pos[i]] = i;
    for (int j = 0; j < S; j++) {
        int i = e->kind[j];
        yj[j] = i < 0 ? c->yh : sg[i].y;
        e->l[j] = worth(&s, i, j);
        e->mode[j] = (unsigned char)stage_mode(&s, i, j, e->l[j]);
        total += e->l[j];
    }
    while (total > L) {
        int arg = -1;
        for (int j = 0; j < S; j++)
            if (e->l[j] > 1 &&
                (arg < 0 || yj[j] * rt_of(&s, e->kind[j], e->mode[j]) * e->l[j] >=
                                yj[arg] * rt_of(&s, e->kind[arg], e->mode[arg]) * e->l[arg]))
                arg = j;
        e->l[arg]--;
        /* fewer layers may fit a faster mode (never a slower one) */
        e->mode[arg] = (unsigned char)stage_mode(&s, e->kind[arg], arg, e->l[arg]);
        total--;
    }
    P = 0;
    for (int j = 0; j < S; j++) {
        P = MAL_MAX(P, yj[j] * rt_of(&s, e->kind[j], e->mode[j]) * e->l[j]);
        e->mode[j] = (unsigned char)c->mode[e->mode[j]]; /* the mode itself, not its index */
    }
    e->P = P;
    goto done;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
done:
    c->n_layer_solves++;
    return rc;
}

static int cache_grow(ctx *c)
{
    size_t ncap = c->cache_cap ? 2 * c->cache_cap : 1024;
    centry *nc = calloc(ncap, sizeof *nc);
    if (!nc) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (size_t i = 0; i < c->cache_cap; i++) {
        if (!c->cache[i].key) continue;
        size_t klen;
        memcpy(&klen, c->cache[i].key, sizeof klen);
        size_t j =
            fnv_bytes((const unsigned char *)c->cache[i].key, klen + sizeof klen) & (ncap - 1);
        while (nc[j].key)
            j = (j + 1) & (ncap - 1);
        nc[j] = c->cache[i];
    }
    free(c->cache);
    c->cache = nc;
    c->cache_cap = ncap;
    return 0;
}

/* Keys are the bytes of (h, ns, the sorted specials), led by their length. */

int rp_composition(ctx *c, int h, const sgrp *sg, int ns, const centry **out)
{
    size_t len = 2 * sizeof(int) + (size_t)ns * sizeof *sg;
    unsigned char stack[512], *key = stack;
    if (len + sizeof(size_t) > sizeof stack) {
        key = malloc(len + sizeof(size_t));
        if (!key) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    }
    /* the bytes of sgrp include padding: build the key field by field */
    memcpy(key, &len, sizeof len);
    unsigned char *k = key + sizeof len;
    memcpy(k, &h, sizeof h);
    memcpy(k + sizeof h, &ns, sizeof ns);
    for (int i = 0; i < ns; i++) {
        unsigned char *q = k + 2 * sizeof(int) + (size_t)i * sizeof *sg;
        memset(q, 0, sizeof *sg);
        memcpy(q, &sg[i].size, sizeof sg[i].size);
        memcpy(q + offsetof(sgrp, y), &sg[i].y, sizeof sg[i].y);
        memcpy(q + offsetof(sgrp, ty), &sg[i].ty, sizeof sg[i].ty);
    }
    size_t klen = len + sizeof len;
    int rc = 0;
    if (2 * (c->cache_n + 1) > c->cache_cap && (rc = cache_grow(c))) goto done;
    uint64_t hv = fnv_bytes(key, klen);
    size_t j = hv & (c->cache_cap - 1);
    while (c->cache[j].key &&
           (memcmp(c->cache[j].key, key, sizeof len) || memcmp(c->cache[j].key, key, klen)))
        j = (j + 1) & (c->cache_cap - 1);
    if (!c->cache[j].key) {
        centry e = {0};
        e.S = h + ns;
        if ((rc = solve(c, h, sg, ns, &e))) {
            free(e.kind);
            free(e.l);
            free(e.mode);
            goto done;
        }
        e.key = malloc(klen);
        if (!e.key) {
            free(e.kind);
            free(e.l);
            free(e.mode);
            rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
            goto done;
        }
        memcpy(e.key, key, klen);
        c->cache[j] = e;
        c->cache_n++;
    }
    *out = &c->cache[j];
done:
    if (key != stack) free(key);
    return rc;
}

/* Entries of the composition cache beyond which it is emptied (about 250
 * bytes each: 128 MB). */
#define RP_CACHE_MAX ((size_t)1 << 19)

static void cache_clear(ctx *c)
{
    for (size_t i = 0; i < c->cache_cap; i++) {
        free(c->cache[i].key);
        free(c->cache[i].kind);
        free(c->cache[i].l);
        free(c->cache[i].mode);
    }
    free(c->cache);
    c->cache = NULL;
    c->cache_cap = c->cache_n = 0;
}

void rp_cache_trim(ctx *c)
{
    if (c->cache_n > RP_CACHE_MAX) cache_clear(c);
}

void rp_cache_free(ctx *c)
{
    cache_clear(c);
    free(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
}
