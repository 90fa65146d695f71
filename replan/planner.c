/* The Malleus plan search (steps A-D of DESIGN.md; replan/README.md has the
 * full description and the reasons each bound below is valid):
 *   A. per node situation, every TP grouping of its non-full positions
 *      (options.c);
 *   B. which specials share a pipeline ("blocks"); the healthy full groups
 *      and the number of pipelines follow exactly for each grouping
 *      (eval.c);
 *   C. per pipeline the stage order and layers (layers.c), micro-batches
 *      across pipelines (eval.c; lp_solve re-solves both programs of the
 *      chosen plan as a check);
 *   D. migration-aware mapping of physical healthy groups onto stage slots.
 * Small instances are searched exhaustively (exact); larger ones by
 * constructions and a local search over options and blocks, every step
 * evaluated exactly.  Everything is deterministic. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "search.h"

/* Auto mode searches exhaustively when the enumeration has at most this
 * many (option vector, grouping) leaves left after the option bound. */
#define RP_EXHAUSTIVE_LEAVES 50000
/* Local-search budget (heuristic mode): evaluations, and evaluation work
 * (about one operation of the dynamic programmes each; ~0.5 s) */
#define RP_LS_EVALS 4000
#define RP_LS_WORK 4e8
/* lp_solve re-solves the chosen plan's micro-batch program when it has at
 * most this many classes of pipelines (equal period and stages; 18 at most
 * in bench/replan's cases up to 100,000 ranks), and the layer programs of
 * its first this many distinct compositions: checks of the search's exact
 * values that stay within a second at any scale. */
#define RP_LP_CLASSES 64
#define RP_LP_LAYERS 256
/* Healthy-count window of the restricted evaluation (eval.c), and the size
 * (blocks x healthy groups x healthy counts) up to which every count is
 * tried anyway. */
#define RP_WINDOW 3
#define RP_FULL_WORK 20000.0

/* ---- search state ------------------------------------------------------ */

/* A point of the search: an option per node and a block per special. */
typedef struct state {
    int *choice; /* [n_act] option of each active node (index into its class) */
    int *blk;    /* [n_act * gmax] block of each group of that option */
    double T;
} state;

typedef struct search {
    ctx *c;
    int n_act;           /* nodes with non-full positions */
    int *act;            /* [n_act] their node indices */
    int *prev_same;      /* [n_act] the previous active node of the same class (-1: none) */
    int gmax;            /* most groups of any option */
    int window;          /* eval window (-1: exact) */
    state best;          /* best so far (T = INFINITY: none) */
    state fallback;      /* with a time limit: the plan to fall back on */
    int fallback_window; /* the eval window fallback.T was found with */
    state cur;           /* local-search state */
    int best_window;     /* the eval window best.T was found with */
    long evals_left;
    double work_cap; /* stop the local search past this much evaluation work */
    long count;      /* >= 0: only count the exhaustive leaves (up to count_cap) */
    long count_cap;
    int n_cand, n_pruned;
    /* assembled blocks */
    int k;
    int *ns;
    sgrp **sg;
    int **src; /* [k][ns]: (active node * gmax + group) of each sorted special */
    sgrp *sg_store;
    int *src_store;
    int *map; /* [n_act * gmax] block id -> compact index */
} search;

static const nopt *opt_of(const search *s, const state *st, int a)
{
    const nclass *k = &s->c->classes[s->c->nodes[s->act[a]].cls];
    return &k->opts[st->choice[a]];
}

static int state_alloc(const search *s, state *st)
{
    st->choice = calloc((size_t)MAL_MAX(1, s->n_act), sizeof *st->choice);
    st->blk = calloc((size_t)MAL_MAX(1, s->n_act * s->gmax), sizeof *st->blk);
    st->T = INFINITY;
    return st->choice && st->blk ? 0 : MAL_ERR(MAL_ENOMEM, "replan: out of memory");
}

static void state_free(state *st)
{
    free(st->choice);
    free(st->blk);
    memset(st, 0, sizeof *st);
}

static void state_copy(const search *s, state *dst, const state *src)
{
    memcpy(dst->choice, src->choice, (size_t)s->n_act * sizeof *dst->choice);
    memcpy(dst->blk, src->blk, (size_t)s->n_act * s->gmax * sizeof *dst->blk);
    dst->T = src->T;
}

/* sort key of a special inside a block: the group, then where it came from */
typedef struct keyed {
    sgrp g;
    int src;
} keyed;
static int cmp_keyed(const void *a, const void *b)
{
    const keyed *u = a, *v = b;
    int c = rp_cmp_sgrp(&u->g, &v->g);
    return c ? c : (u->src > v->src) - (u->src < v->src);
}

/* Blocks of a state, numbered by first appearance, specials sorted. */
static int assemble(search *s, const state *st)
{
    int n = s->n_act * s->gmax, total = 0;
    for (int i = 0; i < n; i++)
        s->map[i] = -1;
    s->k = 0;
    for (int a = 0; a < s->n_act; a++) {
        const nopt *o = opt_of(s, st, a);
        for (int g = 0; g < o->n_groups; g++) {
            int b = st->blk[a * s->gmax + g];
            if (s->map[b] < 0) {
                s->map[b] = s->k;
                s->ns[s->k++] = 0;
            }
            s->ns[s->map[b]]++;
            total++;
        }
    }
    /* offsets, then fill and sort each block */
    int off = 0;
    for (int i = 0; i < s->k; i++) {
        s->sg[i] = s->sg_store + off;
        s->src[i] = s->src_store + off;
        off += s->ns[i];
        s->ns[i] = 0;
    }
    keyed *tmp = malloc((size_t)MAL_MAX(1, total) * sizeof *tmp);
    if (!tmp) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (int a = 0; a < s->n_act; a++) {
        const nopt *o = opt_of(s, st, a);
        for (int g = 0; g < o->n_groups; g++) {
            int i = s->map[st->blk[a * s->gmax + g]];
            s->sg[i][s->ns[i]] = o->g[g];
            s->src[i][s->ns[i]++] = a * s->gmax + g;
        }
    }
    for (int i = 0; i < s->k; i++) {
        for (int q = 0; q < s->ns[i]; q++)
            tmp[q] = (keyed){s->sg[i][q], s->src[i][q]};
        qsort(tmp, (size_t)s->ns[i], sizeof *tmp, cmp_keyed);
        for (int q = 0; q < s->ns[i]; q++) {
            s->sg[i][q] = tmp[q].g;
            s->src[i][q] = tmp[q].src;
        }
    }
    free(tmp);
    return 0;
}

/* Evaluate a state exactly (for its blocks); record it when it beats the
 * best.  *better = 1 then. */
static int try_state(search *s, state *st, int *better)
{
    int rc;
    double T;
    *better = 0;
    if (s->evals_left-- <= 0) return 0;
    if (s->c->work > s->work_cap) {
        s->evals_left = 0;
        return 0;
    }
    if (rp_out_of_time(s->c)) {
        s->evals_left = 0;
        return 0;
    }
    rp_cache_trim(s->c);
    if ((rc = assemble(s, st))) return rc;
    s->n_cand++;
    if ((rc = rp_eval_blocks(s->c, s->k, s->sg, s->ns, s->window, s->best.T, &T, NULL))) return rc;
    st->T = T;
    if (T < s->best.T * (1 - RP_TOL)) {
        state_copy(s, &s->best, st);
        s->best_window = s->window;
        s->c->have_plan = 1;
        *better = 1;
    }
    return 0;
}

/* ---- lower bound of an option vector ----------------------------------- */

/* T >= L (M + N - Dmax) / C: pipeline i has period P_i >= L / C_i (its L
 * layers at its capacity C_i = sum 1/y) and runs m_i <= T C_i / L - S_i + 1
 * micro-batches; summing, M <= T C / L - N + D, and D <= Dmax, the most
 * pipelines the groups' memory allows (each must hold L layers, a group at
 * most rp_layer_cap_max).  Also T >= y of every group (it holds a layer in
 * a pipeline running at least one micro-batch). */
static double option_bound(const search *s, const state *st)
{
    const ctx *c = s->c;
    double C = c->H / c->yh, lay = (double)c->H * rp_layer_cap_max(c, c->th, c->hty);
    double ymax = c->H ? c->yh : 0;
    long N = c->H;
    for (int a = 0; a < s->n_act; a++) {
        const nopt *o = opt_of(s, st, a);
        N += o->n_groups;
        C += o->cap;
        for (int g = 0; g < o->n_groups; g++) {
            lay += rp_layer_cap_max(c, o->g[g].size, o->g[g].ty);
            ymax = MAL_MAX(ymax, o->g[g].y);
        }
    }
    if (N == 0 || N > c->M) return INFINITY;
    double Dmax = MAL_MIN((double)N, floor(lay / c->L));
    if (Dmax < 1) return INFINITY;
    return MAL_MAX(c->L * (c->M + N - Dmax) / C, ymax);
}

/* Can some option vector reach step time T by option_bound's argument?
 * Pipeline i runs m_i <= T C_i / L - S_i + 1, so L M <= T C - L (N - D);
 * N - D >= sum over the groups of (1 - lmax / L) (a pipeline holds L
 * layers, a group at most lmax), and no group slower than T is usable.  So
 * T is reachable only if the sum over the groups of T / y - L + lmax,
 * maximised per class over its options with every y <= T (a sum: each class
 * apart), reaches L M. */
static int bound_reaches(const search *s, double T)
{
    const ctx *c = s->c;
    double sum = 0;
    if (c->H) {
        if (c->yh > T) return 0;
        sum += c->H * (T / c->yh - c->L + rp_layer_cap_max(c, c->th, c->hty));
    }
    for (int k = 0; k < c->n_classes; k++) {
        const nclass *cl = &c->classes[k];
        if (cl->R == 0) continue;
        double best = -INFINITY;
        for (int q = 0; q < cl->n_opts; q++) {
            const nopt *o = &cl->opts[q];
            if (o->ymax <= T) best = MAL_MAX(best, T * o->cap + o->room);
        }
        if (best == -INFINITY) return 0;
        sum += cl->n_nodes * best;
    }
    return sum >= (double)c->L * c->M;
}

/* A lower bound of every plan in the space searched: the least T that
 * bound_reaches (bisection; the lower end is returned, never above the
 * truth).  It is what the report measures the plan's gap against. */
static double space_bound(const search *s)
{
    double lo = 0, hi = s->best.T;
    if (!isfinite(hi)) {
        /* no plan found: search upwards for a reachable T */
        hi = 1;
        for (int it = 0; it < 200 && !bound_reaches(s, hi); it++) {
            lo = hi;
            hi *= 2;
        }
        if (!bound_reaches(s, hi)) return INFINITY;
    } else if (!bound_reaches(s, hi)) {
        return hi; /* cannot happen (the plan reaches it); stay valid */
    }
    for (int it = 0; it < 60 && hi - lo > 1e-7 * hi; it++) {
        double mid = 0.5 * (lo + hi);
        if (bound_reaches(s, mid))
            hi = mid;
        else
            lo = mid;
    }
    return lo;
}

/* ---- exhaustive search ------------------------------------------------- */

/* Every multiset partition of the specials into blocks: specials of one
 * (size, rate) are alike, blocks are count vectors listed in non-increasing
 * lexicographic order (each multiset of blocks once). */
typedef struct mpart {
    search *s;
    state *st;
    int nt;      /* types */
    sgrp *type;  /* [nt] */
    int *src;    /* [n specials] by type: the specials of type 0, then 1, ... */
    int *tstart; /* [nt + 1] */
    int *rem;    /* [nt] */
    int *blocks; /* [cap_blocks * nt] count vectors of the blocks listed */
    int nb, cap_blocks;
} mpart;

static int mpart_leaf(mpart *mp)
{
    search *s = mp->s;
    if (s->count >= 0) {
        if (++s->count > s->count_cap) s->evals_left = 0; /* stop counting */
        return 0;
    }
    /* specials of each type go to the blocks in order */
    int *next = malloc((size_t)mp->nt * sizeof *next);
    if (!next) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    memcpy(next, mp->tstart, (size_t)mp->nt * sizeof *next);
    for (int b = 0; b < mp->nb; b++)
        for (int t = 0; t < mp->nt; t++)
            for (int q = 0; q < mp->blocks[b * mp->nt + t]; q++)
                mp->st->blk[mp->src[next[t]++]] = b;
    free(next);
    int better;
    return try_state(s, mp->st, &better);
}

/* blocks listed so far: mp->nb, the last one's counts at level nb - 1.  The
 * levels grow as deep as the enumeration goes (a table for every special
 * at once would be specials x types: quadratic). */
static int mpart_rec(mpart *mp)
{
    int done = 1;
    for (int t = 0; t < mp->nt; t++)
        done &= mp->rem[t] == 0;
    if (done) return mpart_leaf(mp);
    if (mp->s->evals_left <= 0) return 0;
    if (mp->nb == mp->cap_blocks) {
        int ncap = mp->cap_blocks ? 2 * mp->cap_blocks : 16;
        int *nbk = realloc(mp->blocks, (size_t)ncap * mp->nt * sizeof *nbk);
        if (!nbk) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        mp->blocks = nbk;
        mp->cap_blocks = ncap;
    }
    int lvl = mp->nb;
    int *b = mp->blocks + (size_t)lvl * mp->nt;
    /* enumerate count vectors b <= rem, b != 0, b <=lex prev, in decreasing
     * lexicographic order (odometer from rem downwards) */
    for (int t = 0; t < mp->nt; t++)
        b[t] = mp->rem[t];
    for (;;) {
        const int *prev = lvl > 0 ? b - mp->nt : NULL;
        int nz = 0, le = 1;
        for (int t = 0; t < mp->nt; t++)
            nz |= b[t] != 0;
        if (prev) {
            for (int t = 0; t < mp->nt; t++)
                if (b[t] != prev[t]) {
                    le = b[t] < prev[t];
                    break;
                }
        }
        if (nz && le) {
            for (int t = 0; t < mp->nt; t++)
                mp->rem[t] -= b[t];
            mp->nb++;
            int rc = mpart_rec(mp);
            mp->nb--;
            b = mp->blocks + (size_t)lvl * mp->nt; /* the levels may have moved */
            for (int t = 0; t < mp->nt; t++)
                mp->rem[t] += b[t];
            if (rc) return rc;
        }
        /* next smaller vector */
        int t = mp->nt - 1;
        while (t >= 0 && b[t] == 0) {
            b[t] = mp->rem[t];
            t--;
        }
        if (t < 0) break;
        b[t]--;
        for (int u = t + 1; u < mp->nt; u++)
            b[u] = mp->rem[u];
    }
    return 0;
}

static int cmp_src_type(const void *a, const void *b)
{
    const keyed *u = a, *v = b;
    return cmp_keyed(u, v);
}

/* All partitions of the current option vector's specials. */
static int partitions(search *s, state *st)
{
    int n = 0, rc = 0;
    for (int a = 0; a < s->n_act; a++)
        n += opt_of(s, st, a)->n_groups;
    mpart mp = {0};
    keyed *all = malloc((size_t)MAL_MAX(1, n) * sizeof *all);
    mp.s = s;
    mp.st = st;
    mp.type = malloc((size_t)MAL_MAX(1, n) * sizeof *mp.type);
    mp.src = malloc((size_t)MAL_MAX(1, n) * sizeof *mp.src);
    mp.tstart = malloc((size_t)(n + 1) * sizeof *mp.tstart);
    mp.rem = malloc((size_t)MAL_MAX(1, n) * sizeof *mp.rem);
    if (!all || !mp.type || !mp.src || !mp.tstart || !mp.rem) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    n = 0;
    for (int a = 0; a < s->n_act; a++) {
        const nopt *o = opt_of(s, st, a);
        for (int g = 0; g < o->n_groups; g++)
            all[n++] = (keyed){o->g[g], a * s->gmax + g};
    }
    qsort(all, (size_t)n, sizeof *all, cmp_src_type);
    for (int i = 0; i < n; i++) {
        if (i == 0 || rp_cmp_sgrp(&all[i].g, &all[i - 1].g)) {
            mp.type[mp.nt] = all[i].g;
            mp.tstart[mp.nt] = i;
            mp.rem[mp.nt] = 0;
            mp.nt++;
        }
        mp.rem[mp.nt - 1]++;
        mp.src[i] = all[i].src;
    }
    mp.tstart[mp.nt] = n;
    rc = mpart_rec(&mp);
done:
    free(all);
    free(mp.type);
    free(mp.src);
    free(mp.tstart);
    free(mp.rem);
    free(mp.blocks);
    return rc;
}

/* Every option vector; nodes of one class take their options as a
 * multiset (non-decreasing along the class's nodes in node order). */
static int exhaustive(search *s, state *st, int a)
{
    if (s->evals_left <= 0) return 0;
    if (a == s->n_act) {
        if (s->count >= 0 && ++s->count > s->count_cap) {
            s->evals_left = 0; /* counting: too many option vectors already */
            return 0;
        }
        if (option_bound(s, st) >= s->best.T * (1 - RP_TOL)) {
            if (s->count < 0) s->n_pruned++;
            return 0;
        }
        return partitions(s, st);
    }
    const ctx *c = s->c;
    int cls = c->nodes[s->act[a]].cls;
    /* the previous active node of the same class bounds this one's option */
    int first = s->prev_same[a] >= 0 ? st->choice[s->prev_same[a]] : 0;
    for (int q = first; q < c->classes[cls].n_opts; q++) {
        st->choice[a] = q;
        int rc = exhaustive(s, st, a + 1);
        if (rc) return rc;
    }
    return 0;
}

/* ---- heuristic search -------------------------------------------------- */

/* Option of a class with the best marginal value at period P: each group
 * holds l = floor(P / y) layers (capped by memory) and is worth
 * rho * l - 1 micro-batches (a stage costs one slot of the bubble; a layer
 * is worth rho = (m + S) / L of a nominal pipeline); an option with a group
 * that cannot hold a layer at P is not taken. */
static int marginal_option(const ctx *c, const nclass *k, double P, double rho)
{
    int best = 0;
    double bv = -INFINITY;
    for (int q = 0; q < k->n_opts; q++) {
        const nopt *o = &k->opts[q];
        double v = 0;
        for (int g = 0; g < o->n_groups && v > -INFINITY; g++) {
            double l = floor(P / o->g[g].y * (1 + 1e-12) + 1e-9);
            l = MAL_MIN(l, rp_layer_cap_max(c, o->g[g].size, o->g[g].ty));
            v = l < 1 ? -INFINITY : v + rho * l - 1;
        }
        if (v > bv + RP_TOL) {
            bv = v;
            best = q;
        }
    }
    return best;
}

/* The option keeping every non-full position in nominal-size groups (the
 * uniform layout's grouping), else the one with the fewest groups and the
 * most capacity. */
static int whole_option(const ctx *c, const nclass *k)
{
    int best = 0;
    for (int q = 0; q < k->n_opts; q++) {
        const nopt *o = &k->opts[q], *b = &k->opts[best];
        int whole = o->n_active == k->R;
        for (int g = 0; g < o->n_groups && whole; g++)
            whole = o->g[g].size == c->t;
        if (whole) return q;
        if (o->n_groups < b->n_groups || (o->n_groups == b->n_groups && o->cap > b->cap + RP_TOL))
            best = q;
    }
    return best;
}

/* The first planner's choice: the option whose groups, in a nominal pipeline with the
 * node's remaining share of healthy groups, give the most throughput
 * m / ((m + S - 1) P). */
static int proxy_option(ctx *c, const nclass *k, int *out)
{
    int href = MAL_MAX(0, c->pp_nom - k->R / c->t);
    double mref = MAL_MAX(1.0, (double)c->M / c->dp_nom), best = -1;
    sgrp sg[256];
    *out = 0;
    for (int q = 0; q < k->n_opts; q++) {
        const nopt *o = &k->opts[q];
        if (o->n_groups > 256 || href + o->n_groups == 0) continue;
        /* the layer solver's period is at least max y and L / (sum 1/y):
         * an option whose throughput at that period cannot beat the best
         * so far needs no solve (the scan chooses exactly as before) */
        if (best > 0) {
            double ymax = href > 0 ? c->yh : 0;
            for (int g = 0; g < o->n_groups; g++)
                ymax = MAL_MAX(ymax, o->g[g].y);
            double Plb = MAL_MAX(ymax, c->L / (href / c->yh + o->cap)) * (1 - 1e-9);
            if (mref / ((mref + href + o->n_groups - 1) * Plb) <= best * (1 + RP_TOL)) continue;
        }
        memcpy(sg, o->g, (size_t)o->n_groups * sizeof *sg);
        qsort(sg, (size_t)o->n_groups, sizeof *sg, rp_cmp_sgrp);
        const centry *e;
        int rc = rp_composition(c, href, sg, o->n_groups, &e);
        if (rc) return rc;
        if (!isfinite(e->P)) continue;
        double thr = mref / ((mref + e->S - 1) * e->P);
        if (thr > best * (1 + RP_TOL)) {
            best = thr;
            *out = q;
        }
    }
    return 0;
}

/* a bundle by how far its capacity falls short of the slots it covers */
typedef struct deficit {
    double d;
    int a;
} deficit;
static int cmp_deficit(const void *x, const void *y)
{
    const deficit *u = x, *v = y;
    if (u->d != v->d) return u->d > v->d ? -1 : 1;
    return (u->a > v->a) - (u->a < v->a);
}

/* Blocks: each node's groups together ("bundle"); bundles dealt to nb
 * blocks in a snake, most deficient first (nb <= 0: one block each). */
static int deal_bundles(search *s, state *st, int nb)
{
    deficit *order = malloc((size_t)MAL_MAX(1, s->n_act) * sizeof *order);
    int n = 0;
    if (!order) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (int a = 0; a < s->n_act; a++) {
        const nopt *o = opt_of(s, st, a);
        if (o->n_groups == 0) continue;
        double d = s->c->classes[s->c->nodes[s->act[a]].cls].R / (double)s->c->t - o->cap;
        order[n++] = (deficit){d, a};
    }
    qsort(order, (size_t)n, sizeof *order, cmp_deficit);
    int k = nb <= 0 ? n : MAL_MIN(n, nb);
    for (int i = 0; i < n; i++) {
        int round = i / MAL_MAX(1, k), pos = i % MAL_MAX(1, k);
        int b = (round % 2 == 0) ? pos : k - 1 - pos;
        for (int g = 0; g < s->gmax; g++)
            st->blk[order[i].a * s->gmax + g] = b;
    }
    free(order);
    return 0;
}

/* Options by class into the state's nodes (the rules depend on the class
 * only: one computation per class). */
static void choose_by_class(const search *s, state *st, const int *by_class)
{
    for (int a = 0; a < s->n_act; a++)
        st->choice[a] = by_class[s->c->nodes[s->act[a]].cls];
}

/* nodes by the slowest group of their option (in deficit.d), then index */
static int cmp_slowest(const void *x, const void *y)
{
    const deficit *u = x, *v = y;
    if (u->d != v->d) return u->d < v->d ? -1 : 1;
    return (u->a > v->a) - (u->a < v->a);
}

/* With a time limit, a plan to fall back on before anything slow: the
 * nodes take the options `by_class` gives, ordered by their slowest group
 * and cut in that order into blocks whose groups could hold 1.5 L layers
 * (slow groups share pipelines; equal blocks share their layer solves, so
 * it is cheap at any scale).  Once it exists the time limit applies.  It is
 * kept apart from the search, whose pruning and ties it must not change,
 * and used only when the limit cut the search short and it is the better
 * plan. */
static int fallback_plan(search *s, const int *by_class)
{
    ctx *c = s->c;
    state st = {0};
    deficit *order = NULL;
    int rc, n = 0;
    double T;
    if ((rc = state_alloc(s, &st))) return rc;
    order = malloc((size_t)MAL_MAX(1, s->n_act) * sizeof *order);
    if (!order) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    choose_by_class(s, &st, by_class);
    for (int a = 0; a < s->n_act; a++) {
        const nopt *o = opt_of(s, &st, a);
        if (o->n_groups > 0) order[n++] = (deficit){o->ymax, a};
    }
    qsort(order, (size_t)n, sizeof *order, cmp_slowest);
    for (int i = 0, b = 0, in_b = 0; i < n; i++) {
        int a = order[i].a;
        for (int g = 0; g < s->gmax; g++)
            st.blk[a * s->gmax + g] = b;
        const nopt *o = opt_of(s, &st, a);
        for (int g = 0; g < o->n_groups; g++)
            in_b += rp_layer_cap_max(c, o->g[g].size, o->g[g].ty);
        if (in_b >= 1.5 * c->L) {
            b++;
            in_b = 0;
        }
    }
    if ((rc = assemble(s, &st)) ||
        (rc = rp_eval_blocks(c, s->k, s->sg, s->ns, s->window, INFINITY, &T, NULL)))
        goto done;
    mal_log(MAL_LOG_DEBUG, "replan: plan to fall back on: T %g after %d blocks", T, s->k);
    if (isfinite(T)) {
        state_copy(s, &s->fallback, &st);
        s->fallback.T = T;
        s->fallback_window = s->window;
        c->have_plan = 1;
    }
done:
    state_free(&st);
    free(order);
    return rc;
}

/* The constructions the local search starts from.  Out of time (with a
 * plan in hand) they stop where they are. */
static int constructions(search *s)
{
    ctx *c = s->c;
    state st = {0};
    int rc, better;
    int *by_class = malloc((size_t)MAL_MAX(1, c->n_classes) * sizeof *by_class);
    int *whole = malloc((size_t)MAL_MAX(1, c->n_classes) * sizeof *whole);
    if (!by_class || !whole) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    if ((rc = state_alloc(s, &st))) goto done;
    for (int k = 0; k < c->n_classes; k++)
        whole[k] = whole_option(c, &c->classes[k]);
    if (c->deadline < INFINITY && !c->have_plan && s->n_act > 0) {
        /* the marginal options of pipelines one stage deeper than nominal
         * (as the last family below): cheap to choose, and they suspend
         * what cannot hold a layer at that pace; else every node whole.
         * (Without stragglers the first construction is the only grouping.) */
        int S = MAL_MIN(c->L, c->pp_nom + 1), P = (c->L + S - 1) / S;
        double rho = S * ((double)c->M / MAL_MAX(1, c->world / c->th) + 1) / c->L;
        for (int k = 0; k < c->n_classes; k++)
            by_class[k] = marginal_option(c, &c->classes[k], P * c->yh, rho);
        if ((rc = fallback_plan(s, by_class))) goto done;
        if (!c->have_plan && (rc = fallback_plan(s, whole))) goto done;
    }
    /* the first planner's: proxy options, bundles snaked over D blocks, D near the
     * nominal pipeline count */
    for (int k = 0; k < c->n_classes; k++) {
        if (rp_out_of_time(c)) goto done;
        rp_cache_trim(c);
        by_class[k] = 0;
        if (c->classes[k].R > 0 && (rc = proxy_option(c, &c->classes[k], &by_class[k]))) goto done;
    }
    choose_by_class(s, &st, by_class);
    for (int D = MAL_MAX(1, c->dp_nom - 2); D <= c->dp_nom + 2; D++) {
        if ((rc = deal_bundles(s, &st, D)) || (rc = try_state(s, &st, &better))) goto done;
    }
    if ((rc = deal_bundles(s, &st, 0)) || (rc = try_state(s, &st, &better))) goto done;
    /* every node's ranks in nominal groups, as the uniform plan has them */
    choose_by_class(s, &st, whole);
    for (int D = MAL_MAX(1, c->dp_nom - 2); D <= c->dp_nom + 2; D++) {
        if ((rc = deal_bundles(s, &st, D)) || (rc = try_state(s, &st, &better))) goto done;
    }
    if ((rc = deal_bundles(s, &st, 0)) || (rc = try_state(s, &st, &better))) goto done;
    /* marginal options at the periods of healthy pipelines of S stages:
     * with N nominal groups in pipelines of S, each runs m = M S / N
     * micro-batches, and a layer is worth rho = (m + S) / L of one; blocks:
     * bundles alone, or snaked over the nominal pipeline count */
    int last_P = -1, N = MAL_MAX(1, c->world / c->th);
    for (int S = 1; S <= MAL_MAX(2 * c->pp_nom, c->pp_nom + 8) && S <= c->L; S++) {
        int P = (c->L + S - 1) / S; /* layers per healthy stage; period P * yh */
        double rho = S * ((double)c->M / N + 1) / c->L;
        if (P == last_P) continue;
        last_P = P;
        if (rp_out_of_time(c)) goto done;
        for (int k = 0; k < c->n_classes; k++)
            by_class[k] = marginal_option(c, &c->classes[k], P * c->yh, rho);
        choose_by_class(s, &st, by_class);
        if ((rc = deal_bundles(s, &st, 0)) || (rc = try_state(s, &st, &better))) goto done;
        if ((rc = deal_bundles(s, &st, c->dp_nom)) || (rc = try_state(s, &st, &better))) goto done;
        int DS = MAL_MAX(1, (N + S / 2) / S); /* pipelines of S nominal groups */
        if (DS != c->dp_nom &&
            ((rc = deal_bundles(s, &st, DS)) || (rc = try_state(s, &st, &better))))
            goto done;
    }
done:
    state_free(&st);
    free(by_class);
    free(whole);
    return rc;
}

/* A mixed cluster where no construction found a plan: the healthy type's
 * groups cannot form pipelines alone, and the plans may need nodes of one
 * situation treated apart (one in the pipeline, the others suspended),
 * which neither the constructions nor single first-improvement moves
 * from an infeasible state reach.  Grow one pipeline instead: every node
 * suspended, then node by node (most layers first) the option that gives
 * the best plan so far; while none fits, the node's groups join whole
 * (the pipeline gathers layers until it holds them all). */
static int grow_pipeline(search *s)
{
    ctx *c = s->c;
    if (!c->node_ty || isfinite(s->best.T) || s->n_act == 0) return 0;
    state st = {0};
    int rc = 0, better, found = 0;
    deficit *order = malloc((size_t)s->n_act * sizeof *order);
    int *empty = malloc((size_t)MAL_MAX(1, c->n_classes) * sizeof *empty);
    if (!order || !empty || (rc = state_alloc(s, &st))) {
        if (!rc) rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    for (int k = 0; k < c->n_classes; k++) {
        empty[k] = -1;
        for (int q = 0; q < c->classes[k].n_opts && empty[k] < 0; q++)
            if (c->classes[k].opts[q].n_groups == 0) empty[k] = q;
        if (empty[k] < 0) goto done; /* every node must take part: nothing to grow */
    }
    for (int a = 0; a < s->n_act; a++) {
        const nclass *k = &c->classes[c->nodes[s->act[a]].cls];
        const nopt *w = &k->opts[whole_option(c, k)];
        st.choice[a] = empty[c->nodes[s->act[a]].cls];
        for (int g = 0; g < s->gmax; g++)
            st.blk[a * s->gmax + g] = 0;
        /* most layers first (cmp_slowest sorts ascending) */
        order[a] = (deficit){-(w->room + (double)w->n_groups * c->L), a};
    }
    qsort(order, (size_t)s->n_act, sizeof *order, cmp_slowest);
    for (int i = 0; i < s->n_act && !rp_out_of_time(c); i++) {
        int a = order[i].a, cls = c->nodes[s->act[a]].cls, keep = -1;
        const nclass *k = &c->classes[cls];
        for (int q = 0; q < k->n_opts; q++) {
            if (q == empty[cls]) continue;
            st.choice[a] = q;
            if ((rc = try_state(s, &st, &better))) goto done;
            if (better) keep = q;
        }
        if (keep >= 0)
            found = 1;
        else if (!found)
            keep = whole_option(c, k);
        st.choice[a] = keep >= 0 ? keep : empty[cls];
    }
done:
    state_free(&st);
    free(order);
    free(empty);
    return rc;
}

/* Local search from the best state: change a node's option (its groups
 * stay together), move one special to another or a new block, merge two
 * blocks; first improvement, until none helps or the budget is spent. */
static int local_search(search *s)
{
    int rc = 0, better, improved = 1;
    int nid = s->n_act * s->gmax;
    char *inuse = malloc((size_t)MAL_MAX(1, nid));
    if (!inuse) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    state *cur = &s->cur;
    while (improved && s->evals_left > 0) {
        improved = 0;
        state_copy(s, cur, &s->best);
        /* block ids in use, and a free one */
        memset(inuse, 0, (size_t)nid);
        for (int a = 0; a < s->n_act; a++)
            for (int g = 0; g < opt_of(s, cur, a)->n_groups; g++)
                inuse[cur->blk[a * s->gmax + g]] = 1;
        int fresh = 0;
        while (fresh < nid && inuse[fresh])
            fresh++;
        /* options of a whole class at once (the nodes' groups stay where
         * they are, or join the class's first node's block) */
        for (int a = 0; a < s->n_act && !improved && s->evals_left > 0; a++) {
            int cls = s->c->nodes[s->act[a]].cls;
            const nclass *k = &s->c->classes[cls];
            if (s->prev_same[a] >= 0 || k->n_nodes < 2) continue; /* the class's first node */
            for (int q = 0; q < k->n_opts && !improved && s->evals_left > 0; q++) {
                int changed = 0;
                for (int b = a; b < s->n_act; b++) {
                    if (s->c->nodes[s->act[b]].cls != cls || cur->choice[b] == q) continue;
                    int home = opt_of(s, cur, b)->n_groups > 0 ? cur->blk[b * s->gmax] : fresh;
                    cur->choice[b] = q;
                    for (int g = 0; g < s->gmax; g++)
                        cur->blk[b * s->gmax + g] = home;
                    changed = 1;
                }
                if (!changed) continue;
                if ((rc = try_state(s, cur, &better))) goto done;
                if (better)
                    improved = 1;
                else
                    state_copy(s, cur, &s->best);
            }
        }
        if (improved) continue;
        /* options of one node */
        for (int a = 0; a < s->n_act && !improved && s->evals_left > 0; a++) {
            const nclass *k = &s->c->classes[s->c->nodes[s->act[a]].cls];
            int old = cur->choice[a], home = fresh;
            if (opt_of(s, cur, a)->n_groups > 0) home = cur->blk[a * s->gmax];
            for (int q = 0; q < k->n_opts && !improved && s->evals_left > 0; q++) {
                if (q == old) continue;
                cur->choice[a] = q;
                for (int g = 0; g < s->gmax; g++)
                    cur->blk[a * s->gmax + g] = home;
                if ((rc = try_state(s, cur, &better))) goto done;
                if (better) improved = 1;
            }
            if (!improved) state_copy(s, cur, &s->best);
        }
        if (improved || fresh >= nid) continue;
        /* moves of one special */
        for (int a = 0; a < s->n_act && !improved && s->evals_left > 0; a++) {
            int ng = opt_of(s, cur, a)->n_groups;
            for (int g = 0; g < ng && !improved && s->evals_left > 0; g++) {
                int old = cur->blk[a * s->gmax + g];
                for (int b = 0; b <= fresh && !improved && s->evals_left > 0; b++) {
                    if (b == old || (b < fresh && !inuse[b])) continue;
                    cur->blk[a * s->gmax + g] = b;
                    if ((rc = try_state(s, cur, &better))) goto done;
                    if (better) improved = 1;
                }
                if (!improved) cur->blk[a * s->gmax + g] = old;
            }
        }
        if (improved) continue;
        /* merges of two blocks */
        for (int b1 = 0; b1 < nid && !improved && s->evals_left > 0; b1++) {
            if (!inuse[b1]) continue;
            for (int b2 = b1 + 1; b2 < nid && !improved && s->evals_left > 0; b2++) {
                if (!inuse[b2]) continue;
                state_copy(s, cur, &s->best);
                for (int i = 0; i < nid; i++)
                    if (cur->blk[i] == b2) cur->blk[i] = b1;
                if ((rc = try_state(s, cur, &better))) goto done;
                if (better) improved = 1;
            }
        }
    }
done:
    free(inuse);
    return rc;
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

/* Where every rank sits in the current plan, in one pass. */
static int locate_all(const mal_plan *cur, int world, mal_plan_loc *loc)
{
    for (int r = 0; r < world; r++)
        loc[r] = (mal_plan_loc){-1, -1, -1, 0};
    for (int i = 0; i < cur->n_pipelines; i++)
        for (int j = 0; j < cur->pipelines[i].n_stages; j++) {
            const mal_plan_stage *st = &cur->pipelines[i].stages[j];
            for (int k = 0; k < st->n_ranks; k++)
                if (st->ranks[k] >= 0 && st->ranks[k] < world)
                    loc[st->ranks[k]] = (mal_plan_loc){i, j, k, st->n_ranks};
        }
    return 0;
}

/* Physical healthy groups onto healthy stage slots: greedily by the state
 * each would keep (largest first, deterministic ties); the rest in order.
 * assign[g] = 1 + slot on return. */
static int map_healthy(ctx *c, const slot *slots, int n_slots, const int *hg, int n_hg, int *assign)
{
    int t = c->th, rc = 0;
    char *sused = calloc((size_t)MAL_MAX(1, n_slots), 1);
    mal_plan_loc *loc = NULL;
    pair *pairs = NULL;
    if (!sused) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    const mal_plan *cur = c->in->current;
    /* the pairwise greedy is quadratic: beyond this the current plan only
     * orders the fill below */
    if (cur && n_hg > 0 && (double)n_hg * n_slots <= 4e6) {
        loc = malloc((size_t)c->world * sizeof *loc);
        if (!loc) goto oom;
        locate_all(cur, c->world, loc);
        size_t np = 0, capp = 1024;
        pairs = malloc(capp * sizeof *pairs);
        if (!pairs) goto oom;
        for (int g = 0; g < n_hg; g++)
            for (int s = 0; s < n_slots; s++) {
                double sc = 0;
                for (int q = 0; q < t; q++)
                    sc += keep_mb(c->p, &loc[hg[(size_t)g * t + q]], cur, q, t, &slots[s]);
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
    goto done;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
done:
    free(sused);
    free(loc);
    free(pairs);
    return rc;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The plan of the best state.  lp_solve re-solves the chosen pipelines'
 * layer programs (in the chosen order) and the micro-batch program: both
 * must agree with the search's exact values. */
static int build_plan(search *s, mal_plan *out)
{
    ctx *c = s->c;
    int rc, t = c->th;
    rp_eval ev = {0};
    double T;
    const centry **ent = NULL;
    int *mi = NULL, *hg = NULL, *susp = NULL, *assign = NULL, *cls = NULL, *count = NULL;
    int *Sc = NULL, *mc = NULL, *ub = NULL, *lv = NULL, *Si = NULL;
    double *Pc = NULL, *yv = NULL, *Pi = NULL;
    slot *slots = NULL;
    char *seen = NULL;
    if ((rc = assemble(s, &s->best))) return rc;
    /* the plan is built whatever the time: no deadline for its evaluation */
    double deadline = c->deadline;
    c->deadline = INFINITY;
    rc = rp_eval_blocks(c, s->k, s->sg, s->ns, s->best_window, INFINITY, &T, &ev);
    c->deadline = deadline;
    if (rc) return rc;
    if (!isfinite(T) || fabs(T - s->best.T) > 1e-9 * T) {
        rc = MAL_ERR(MAL_ELP, "replan: internal error: the best plan re-evaluates to %g, not %g", T,
                     s->best.T);
        goto cleanup;
    }
    int D = s->k + ev.n_hp;
    if ((rc = mal_plan_alloc_pipelines(out, D))) goto cleanup;
    out->micro_batch_size = c->in->micro_batch_size;
    ent = calloc((size_t)D, sizeof *ent);
    mi = malloc((size_t)D * sizeof *mi);
    cls = malloc((size_t)D * sizeof *cls);
    count = malloc((size_t)D * sizeof *count);
    Sc = malloc((size_t)D * sizeof *Sc);
    mc = malloc((size_t)D * sizeof *mc);
    Pc = malloc((size_t)D * sizeof *Pc);
    Pi = malloc((size_t)D * sizeof *Pi);
    Si = malloc((size_t)D * sizeof *Si);
    if (!ent || !mi || !cls || !count || !Sc || !mc || !Pc || !Pi || !Si) goto oom;
    int n_slots = 0, n_cls = 0, Smax = 1;
    /* every composition into the cache first: an insertion may move the
     * entries, so the pointers kept below are taken once all are in */
    for (int i = 0; i < D; i++) {
        int h = i < s->k ? ev.h[i] : ev.hp[i - s->k];
        const centry *e;
        if ((rc = rp_composition(c, h, i < s->k ? s->sg[i] : NULL, i < s->k ? s->ns[i] : 0, &e)))
            goto cleanup;
    }
    for (int i = 0; i < D; i++) {
        int h = i < s->k ? ev.h[i] : ev.hp[i - s->k];
        if ((rc = rp_composition(c, h, i < s->k ? s->sg[i] : NULL, i < s->k ? s->ns[i] : 0,
                                 &ent[i])))
            goto cleanup;
        n_slots += h;
        Smax = MAL_MAX(Smax, ent[i]->S);
        /* the classes for lp_solve, while there are few enough for it */
        int found = -1;
        if (n_cls > RP_LP_CLASSES) continue;
        for (int q = 0; q < n_cls && found < 0; q++)
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
    /* micro-batches: lp_solve's program over the classes of equal (P, S),
     * then the excess trimmed from the slowest pipelines.  A plan with more
     * classes than RP_LP_CLASSES (only at scale; lp_solve's branch and bound
     * would take minutes) takes the search's own count instead: what each
     * pipeline runs within the step time, trimmed the same way. */
    double Tlp = T;
    long total = 0;
    if (n_cls <= RP_LP_CLASSES) {
        if ((rc = mal_lp_microbatches(n_cls, Pc, Sc, count, c->M, mc, &Tlp))) goto cleanup;
        for (int i = 0; i < D; i++)
            mi[i] = mc[cls[i]];
    } else {
        for (int i = 0; i < D; i++)
            mi[i] = rp_runs(T, ent[i]->P, ent[i]->S, c->M);
    }
    for (int i = 0; i < D; i++) {
        total += mi[i];
        Pi[i] = ent[i]->P;
        Si[i] = ent[i]->S;
    }
    double Tmax = rp_trim(D, Pi, Si, mi, c->M, &total);
    if (!isfinite(Tlp) || total != c->M || fabs(Tmax - T) > 1e-9 * T) {
        rc = MAL_ERR(MAL_ELP,
                     "replan: internal error: the micro-batch program (%s) gives %g, the search "
                     "%g",
                     n_cls <= RP_LP_CLASSES ? "lp_solve" : "the search's count", Tmax, T);
        goto cleanup;
    }
    /* stages; lp_solve checks each distinct composition's layer program */
    slots = calloc((size_t)MAL_MAX(1, n_slots), sizeof *slots);
    ub = malloc((size_t)Smax * sizeof *ub);
    lv = malloc((size_t)Smax * sizeof *lv);
    yv = malloc((size_t)Smax * sizeof *yv);
    if (!slots || !ub || !lv || !yv) goto oom;
    /* each distinct composition once (entries of the cache, by index) */
    seen = calloc(MAL_MAX((size_t)1, c->cache_cap), 1);
    if (!seen) goto oom;
    int nsl = 0, n_lp = 0;
    for (int i = 0; i < D; i++) {
        const centry *e = ent[i];
        if (!seen[e - c->cache] && n_lp++ < RP_LP_LAYERS) {
            seen[e - c->cache] = 1;
            for (int j = 0; j < e->S; j++) {
                /* each stage in the recompute mode the search chose: its
                 * time factor and its memory cap */
                int size = e->kind[j] < 0 ? t : s->sg[i][e->kind[j]].size;
                int ty = e->kind[j] < 0 ? c->hty : s->sg[i][e->kind[j]].ty;
                const mal_profile *pt = c->tprof[ty]; /* its type's */
                yv[j] = (e->kind[j] < 0 ? c->yh : s->sg[i][e->kind[j]].y) *
                        (1.0 + mal_cost_recompute_time(pt, e->mode[j]));
                ub[j] = mal_cost_layer_cap_mode(pt, c->tmem[ty], size, e->S, j, c->replicas,
                                                e->mode[j]);
            }
            double Plp;
            if ((rc = mal_lp_layers(e->S, yv, ub, c->L, lv, &Plp))) goto cleanup;
            if (!(fabs(Plp - e->P) <= 1e-9 * e->P)) {
                rc = MAL_ERR(MAL_ELP,
                             "replan: internal error: lp_solve's layer program gives %g, the "
                             "search %g",
                             Plp, e->P);
                goto cleanup;
            }
        }
        out->pipelines[i].micro_batches = mi[i];
        out->pipelines[i].predicted_time = (mi[i] + e->S - 1) * e->P * c->p->layer_time;
        if ((rc = mal_plan_alloc_stages(out, i, e->S))) goto cleanup;
        int lb = 0;
        for (int j = 0; j < e->S; j++) {
            if (e->kind[j] < 0) {
                slots[nsl++] = (slot){i, j, lb, lb + e->l[j], j == 0, j == e->S - 1};
            } else {
                /* the special's ranks: its node's positions, TP order = rank order */
                int src = s->src[i][e->kind[j]], a = src / s->gmax, g = src % s->gmax;
                const nodeinfo *nd = &c->nodes[s->act[a]];
                const nopt *o = opt_of(s, &s->best, a);
                int p0 = 0, rk[1024];
                for (int q = 0; q < g; q++)
                    p0 += o->g[q].size;
                if (o->g[g].size > 1024) {
                    rc = MAL_ERR(MAL_EINVAL, "replan: TP groups of more than 1024 ranks");
                    goto cleanup;
                }
                memcpy(rk, nd->rest + p0, (size_t)o->g[g].size * sizeof *rk);
                qsort(rk, (size_t)o->g[g].size, sizeof *rk, cmp_int);
                if ((rc = mal_plan_set_stage(out, i, j, o->g[g].size, rk, lb, lb + e->l[j])))
                    goto cleanup;
            }
            lb += e->l[j];
        }
    }
    out->predicted_step_time = Tmax * c->p->layer_time + c->p->sync_time;
    for (int i = 0; i < D; i++)
        for (int j = 0; j < ent[i]->S; j++)
            out->pipelines[i].stages[j].recompute = ent[i]->mode[j];

    /* healthy groups (physical) and suspended ranks */
    int n_hg = c->H, n_susp = 0;
    if (n_hg != n_slots) {
        rc = MAL_ERR(MAL_ELP, "replan: internal error: %d healthy groups for %d slots", n_hg,
                     n_slots);
        goto cleanup;
    }
    for (int a = 0; a < s->n_act; a++)
        n_susp += c->nodes[s->act[a]].R - opt_of(s, &s->best, a)->n_active;
    hg = malloc((size_t)MAL_MAX(1, n_hg * t) * sizeof *hg);
    susp = malloc((size_t)MAL_MAX(1, n_susp) * sizeof *susp);
    assign = calloc((size_t)MAL_MAX(1, n_hg), sizeof *assign);
    if (!hg || !susp || !assign) goto oom;
    int g0 = 0, s0 = 0;
    for (int n = 0; n < c->n_nodes; n++) {
        const nodeinfo *nd = &c->nodes[n];
        memcpy(hg + (size_t)g0 * t, nd->healthy, (size_t)(nd->n_healthy_groups * t) * sizeof *hg);
        g0 += nd->n_healthy_groups;
    }
    for (int a = 0; a < s->n_act; a++) {
        const nodeinfo *nd = &c->nodes[s->act[a]];
        const nopt *o = opt_of(s, &s->best, a);
        memcpy(susp + s0, nd->rest + o->n_active, (size_t)(nd->R - o->n_active) * sizeof *susp);
        s0 += nd->R - o->n_active;
    }
    qsort(susp, (size_t)n_susp, sizeof *susp, cmp_int);
    if ((rc = mal_plan_set_suspended(out, n_susp, susp))) goto cleanup;
    if ((rc = map_healthy(c, slots, n_slots, hg, n_hg, assign))) goto cleanup;
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
    rp_eval_fini(&ev);
    free(ent);
    free(mi);
    free(cls);
    free(count);
    free(Sc);
    free(mc);
    free(Pc);
    free(Pi);
    free(Si);
    free(ub);
    free(lv);
    free(yv);
    free(slots);
    free(hg);
    free(susp);
    free(assign);
    free(seen);
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
            /* the uniform plan's stages mix the types: each must hold them */
            for (int q = 0; cl->type_of && q < cl->n_types && ok; q++)
                if (cl->types[q].profile &&
                    mal_cost_layer_cap(cl->types[q].profile, cl->types[q].memory_mb, t, pp, j) < l)
                    ok = 0;
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
    if (!(in->time_limit >= 0 && in->time_limit < INFINITY))
        return MAL_ERR(MAL_EINVAL, "replan: the time limit must be >= 0 seconds (0: none), got %g",
                       in->time_limit);
    if (mal_profile_alpha(p, p->tp) <= 0)
        return MAL_ERR(MAL_EINVAL, "model profile: no alpha for the nominal TP size %d", p->tp);
    if (p->n_layers < 1) return MAL_ERR(MAL_EINVAL, "model profile: n_layers must be >= 1");
    if ((p->n_heads > 0 && p->n_heads % p->tp) || (p->ffn_hidden > 0 && p->ffn_hidden % p->tp))
        return MAL_ERR(MAL_EINVAL,
                       "model profile: the nominal TP size %d must divide n_heads (%d) and "
                       "ffn_hidden (%d)",
                       p->tp, p->n_heads, p->ffn_hidden);
    if (in->current) {
        int gb = mal_plan_global_batch(in->current);
        int rc = mal_plan_validate(in->current, cl->world_size, p->n_layers,
                                   p->n_heads > 0 ? p->n_heads : 1 << 20,
                                   p->ffn_hidden > 0 ? p->ffn_hidden : 1 << 20, gb);
        if (rc) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", mal_errmsg());
            return MAL_ERR(MAL_EINVAL, "current plan does not fit this cluster/model: %s", msg);
        }
    }
    return 0;
}

/* Why no plan fits, in words. */
static int explain_infeasible(const ctx *c)
{
    int nominal_groups = c->world / c->t;
    int pmax = MAL_MIN(c->L, nominal_groups);
    /* the deepest pipeline of nominal groups, in the most frugal mode the
     * run allows: the first stage of an even split (the most micro-batches
     * in flight) and its terms */
    int m = c->mode[c->n_modes - 1], l = (c->L + pmax - 1) / pmax;
    mal_cost_memory t;
    mal_cost_stage_terms(c->p, c->t, pmax, 0, l, pmax - 1, c->replicas, m, &t);
    if (nominal_groups > c->M)
        return MAL_ERR(MAL_EINVAL,
                       "no plan fits: %d micro-batches per step cannot feed %d TP groups (1F1B "
                       "needs m_i >= S_i, so sum of stages <= micro-batches); raise the global "
                       "batch",
                       c->M, nominal_groups);
    if (c->node_ty) {
        /* each type in use: its memory against its own profile's need */
        char why[2048] = "";
        size_t at = 0;
        const mal_cluster *cl = c->in->cluster;
        for (int ty = 0; ty < c->n_ty; ty++) {
            int used = 0;
            for (int n = 0; n < cl->n_nodes; n++)
                used |= cl->type_of[n] == ty;
            if (!used || at >= sizeof why - 1) continue;
            double nt =
                mal_cost_stage_need(c->tprof[ty], c->t, pmax, 0, l, pmax - 1, c->replicas, m);
            at += (size_t)snprintf(why + at, sizeof why - at,
                                   "%stype %s: memory_mb = %g, need %.1f MB", at ? "; " : "",
                                   cl->types[ty].name, c->tmem[ty], nt);
        }
        return MAL_ERR(MAL_EINVAL,
                       "no plan fits in memory: even %d stages of TP %d (recompute %s) need more "
                       "than a rank holds on the first stage (every term from each type's "
                       "profile): %s; use more ranks, more memory, a smaller micro-batch%s",
                       pmax, c->t, mal_recompute_name(m), why,
                       m == MAL_RECOMPUTE_FULL ? "" : " or --recompute auto");
    }
    return MAL_ERR(MAL_EINVAL,
                   "no plan fits in memory: memory_mb = %g, but even %d stages of TP %d (recompute "
                   "%s) need %.1f MB on stage 0 of %d (%d layers at %.1f MB each with %d "
                   "micro-batches in flight, embedding %.1f, workspace %.1f, buffers %.1f, "
                   "overhead %.1f MB); use more ranks, more memory, a smaller micro-batch%s",
                   c->mem, pmax, c->t, mal_recompute_name(m), t.total, pmax, l,
                   l > 0 ? t.layers / l : 0.0, pmax, t.embed, t.workspace,
                   t.scratch + t.p2p + t.dp_grads - t.zero_saved, t.overhead,
                   m == MAL_RECOMPUTE_FULL ? "" : " or --recompute auto");
}

/* The type of the healthy full groups: of the fastest types in use, the
 * one with the most memory (ties: the first).  0 on a homogeneous
 * cluster. */
static int healthy_type(const mal_cluster *cl)
{
    if (!cl->type_of) return 0;
    int best = -1;
    for (int n = 0; n < cl->n_nodes; n++) {
        int t = cl->type_of[n];
        if (best < 0) {
            best = t;
            continue;
        }
        const mal_device_type *a = &cl->types[t], *b = &cl->types[best];
        if (a->speed > b->speed ||
            (a->speed == b->speed &&
             (a->memory_mb > b->memory_mb || (a->memory_mb == b->memory_mb && t < best))))
            best = t;
    }
    return best < 0 ? 0 : best;
}

/* Whether any profile the search prices a stage with (--profile, each
 * device type's) has state whose gradient sum and moments depend on the
 * number of pipelines. */
static int has_state(const mal_replan_input *in)
{
    const mal_cluster *cl = in->cluster;
    const mal_profile *p = in->profile;
    int any = p->layer_state_mb > 0 || p->embed_state_mb > 0;
    for (int t = 0; cl->type_of && t < cl->n_types; t++) {
        const mal_profile *q = cl->types[t].profile;
        if (q) any |= q->layer_state_mb > 0 || q->embed_state_mb > 0;
    }
    return any;
}

/* The context's device types (README "Mixed hardware"): each type's memory
 * and profile; one type, the cluster's memory and --profile, when the
 * cluster has none. */
static void set_types(ctx *c, const mal_replan_input *in)
{
    const mal_cluster *cl = in->cluster;
    c->n_ty = cl->type_of ? cl->n_types : 1;
    c->node_ty = cl->type_of;
    c->hty = healthy_type(cl);
    for (int t = 0; t < c->n_ty; t++) {
        c->tmem[t] = cl->type_of ? cl->types[t].memory_mb : cl->memory_mb;
        c->tprof[t] = cl->type_of && cl->types[t].profile ? cl->types[t].profile : in->profile;
    }
}

/* The whole search with healthy full groups of `th` ranks: the plan in
 * `out` (initialised here), or *found = 0 when nothing fits. */
static int plan_with(const mal_replan_input *in, int th, int replicas, int recompute, int share,
                     double t0, double deadline, int *have_plan, mal_plan *out,
                     mal_replan_stats *stats, int *found)
{
    int rc;
    mal_plan_init(out);
    *found = 0;
    ctx c = {0};
    search s = {0};
    c.deadline = deadline;
    c.have_plan = *have_plan;
    c.in = in;
    c.p = in->profile;
    c.t = in->profile->tp;
    c.th = th;
    c.L = in->profile->n_layers;
    c.M = in->n_micro_batches;
    c.world = in->cluster->world_size;
    set_types(&c, in);
    c.yh = mal_profile_alpha(c.tprof[c.hty], th);
    c.mem = c.tmem[c.hty];
    c.replicas = replicas;
    c.recompute = recompute;
    rp_set_modes(&c);
    c.x = malloc((size_t)c.world * sizeof *c.x);
    if (!c.x) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    for (int r = 0; r < c.world; r++)
        c.x[r] = mal_cost_floor(in->rates[r]);
    int nominal_groups = c.world / c.t;
    c.dp_nom = in->nominal_dp > 0 ? in->nominal_dp : mal_replan_default_dp(in->cluster, c.p, c.M);
    if (c.dp_nom < 1) c.dp_nom = 1;
    c.pp_nom = MAL_MAX(1, nominal_groups / c.dp_nom);
    if ((rc = rp_build_nodes(&c))) goto cleanup;
    if (mal_log_level >= MAL_LOG_DEBUG) {
        long n_opts = 0;
        for (int k = 0; k < c.n_classes; k++)
            n_opts += c.classes[k].n_opts;
        mal_log(MAL_LOG_DEBUG, "replan: TP %d: %d node situations, %ld options (%.3f s)", th,
                c.n_classes, n_opts, mal_now() - t0);
    }

    /* the search's view: nodes with non-full positions, the most groups of
     * any option */
    s.c = &c;
    s.act = malloc((size_t)MAL_MAX(1, c.n_nodes) * sizeof *s.act);
    if (!s.act) goto oom;
    for (int n = 0; n < c.n_nodes; n++) {
        if (c.nodes[n].n_ranks == 0 || c.nodes[n].R == 0) continue;
        s.act[s.n_act++] = n;
        const nclass *k = &c.classes[c.nodes[n].cls];
        for (int q = 0; q < k->n_opts; q++)
            s.gmax = MAL_MAX(s.gmax, k->opts[q].n_groups);
    }
    s.gmax = MAL_MAX(1, s.gmax);
    /* each active node's previous one of its class, in one pass (a scan
     * back per node would be quadratic where most situations are unique) */
    {
        int *last = malloc((size_t)MAL_MAX(1, c.n_classes) * sizeof *last);
        s.prev_same = malloc((size_t)MAL_MAX(1, s.n_act) * sizeof *s.prev_same);
        if (!last || !s.prev_same) {
            free(last);
            goto oom;
        }
        for (int k = 0; k < c.n_classes; k++)
            last[k] = -1;
        for (int a = 0; a < s.n_act; a++) {
            int cls = c.nodes[s.act[a]].cls;
            s.prev_same[a] = last[cls];
            last[cls] = a;
        }
        free(last);
    }
    int nid = s.n_act * s.gmax, n_spec = nid;
    s.ns = malloc((size_t)MAL_MAX(1, nid) * sizeof *s.ns);
    s.sg = malloc((size_t)MAL_MAX(1, nid) * sizeof *s.sg);
    s.src = malloc((size_t)MAL_MAX(1, nid) * sizeof *s.src);
    s.sg_store = malloc((size_t)MAL_MAX(1, n_spec) * sizeof *s.sg_store);
    s.src_store = malloc((size_t)MAL_MAX(1, n_spec) * sizeof *s.src_store);
    s.map = malloc((size_t)MAL_MAX(1, nid) * sizeof *s.map);
    if (!s.ns || !s.sg || !s.src || !s.sg_store || !s.src_store || !s.map) goto oom;
    if ((rc = state_alloc(&s, &s.best)) || (rc = state_alloc(&s, &s.cur)) ||
        (rc = state_alloc(&s, &s.fallback)))
        goto cleanup;
    /* every healthy count for every block while that stays cheap */
    s.window =
        (double)MAL_MAX(1, s.n_act) * c.H * MAL_MIN(c.H, c.L) <= RP_FULL_WORK ? -1 : RP_WINDOW;

    /* a good incumbent first: it lets the bounds prune the enumeration */
    s.count = -1;
    s.evals_left = RP_LS_EVALS / share;
    s.work_cap = INFINITY;
    s.best_window = s.window;
    if ((rc = constructions(&s)) || (rc = grow_pipeline(&s))) goto cleanup;
    s.work_cap = c.work + RP_LS_WORK / share;
    mal_log(MAL_LOG_DEBUG, "replan: constructions: T %g after %d evaluations (%.3f s)", s.best.T,
            s.n_cand, mal_now() - t0);
    if ((rc = local_search(&s))) goto cleanup;
    mal_log(MAL_LOG_DEBUG, "replan: local search: T %g after %d evaluations (%.3f s)", s.best.T,
            s.n_cand, mal_now() - t0);
    int stop = c.timed_out        ? MAL_REPLAN_STOP_TIME
               : s.evals_left > 0 ? MAL_REPLAN_STOP_CONVERGED
                                  : MAL_REPLAN_STOP_BUDGET;
    int exact = in->search == MAL_REPLAN_EXHAUSTIVE;
    /* option vectors: nodes of a class choose a multiset of its options */
    double n_vectors = 1;
    for (int k = 0; k < c.n_classes; k++)
        for (int i = 1; i <= c.classes[k].n_nodes && c.classes[k].R > 0; i++)
            n_vectors = n_vectors * (c.classes[k].n_opts + i - 1) / i;
    if (in->search == MAL_REPLAN_AUTO && n_vectors <= RP_EXHAUSTIVE_LEAVES && !c.timed_out) {
        /* exhaustive when its enumeration (after the option bound with
         * this incumbent) is small: count the leaves first */
        state st = {0};
        if ((rc = state_alloc(&s, &st))) goto cleanup;
        s.count = 0;
        s.count_cap = RP_EXHAUSTIVE_LEAVES;
        s.evals_left = 1;
        rc = exhaustive(&s, &st, 0);
        state_free(&st);
        if (rc) goto cleanup;
        exact = s.count <= RP_EXHAUSTIVE_LEAVES;
        s.count = -1;
    }
    if (exact && !rp_out_of_time(&c)) {
        state st = {0}, keep = {0};
        int keep_window = s.best_window;
        s.window = -1;
        s.evals_left = (long)1 << 62;
        s.work_cap = INFINITY;
        if ((rc = state_alloc(&s, &st)) || (rc = state_alloc(&s, &keep))) {
            state_free(&st);
            goto cleanup;
        }
        /* re-evaluate the incumbent exactly, then enumerate everything;
         * the incumbent is kept aside in case the time limit cuts both
         * short */
        state_copy(&s, &keep, &s.best);
        if (isfinite(s.best.T)) {
            state_copy(&s, &st, &s.best);
            s.best.T = INFINITY;
            int better;
            rc = try_state(&s, &st, &better);
        }
        if (!rc) rc = exhaustive(&s, &st, 0);
        if (!rc && c.timed_out && !isfinite(s.best.T)) {
            state_copy(&s, &s.best, &keep);
            s.best_window = keep_window;
        }
        state_free(&st);
        state_free(&keep);
        if (rc) goto cleanup;
    }
    if (c.timed_out) {
        exact = 0;
        stop = MAL_REPLAN_STOP_TIME;
        /* the time limit may have cut the search short of the plan it
         * fell back on (a search run to its end never is) */
        if (s.fallback.T < s.best.T * (1 - RP_TOL)) {
            state_copy(&s, &s.best, &s.fallback);
            s.best_window = s.fallback_window;
        }
    } else if (exact) {
        stop = MAL_REPLAN_STOP_OPTIMAL;
    }
    stats->stop = stop;
    /* no plan of this space is faster than its bound; once the whole space
     * was enumerated, than the best */
    stats->lower_bound = exact ? s.best.T : space_bound(&s);
    mal_log(MAL_LOG_DEBUG, "replan: search done: T %g, bound %g (%.3f s)", s.best.T,
            stats->lower_bound, mal_now() - t0);
    if (!isfinite(s.best.T)) goto cleanup;
    *found = 1;
    *have_plan = 1;
    if ((rc = build_plan(&s, out))) goto cleanup;
    mal_log(MAL_LOG_DEBUG, "replan: plan built (%.3f s)", mal_now() - t0);
    rc = mal_plan_validate(out, c.world, c.L, c.p->n_heads > 0 ? c.p->n_heads : 1 << 20,
                           c.p->ffn_hidden > 0 ? c.p->ffn_hidden : 1 << 20,
                           c.M * in->micro_batch_size);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mal_errmsg());
        rc = MAL_ERR(MAL_ELP, "replan: internal error: the plan fails validation: %s", msg);
        goto cleanup;
    }
    stats->objective = s.best.T;
    stats->n_layer_lps += c.n_layer_solves;
    stats->n_candidates += s.n_cand;
    stats->n_pruned += s.n_pruned;
    stats->exhaustive = exact;
    stats->seconds = mal_now() - t0;
    goto cleanup;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
cleanup:
    if (rc) mal_plan_fini(out);
    state_free(&s.best);
    state_free(&s.cur);
    state_free(&s.fallback);
    free(s.act);
    free(s.prev_same);
    free(s.ns);
    free(s.sg);
    free(s.src);
    free(s.sg_store);
    free(s.src_store);
    free(s.map);
    rp_free_nodes(&c);
    rp_cache_free(&c);
    free(c.hp_P);
    free(c.x);
    return rc;
}

/* A lower bound of every plan whatever its groups (for the sizes of healthy
 * full groups the time limit left unsearched): a group of size s and rate
 * y = alpha[s] max x runs 1/y <= sum over its ranks of 1 / (s alpha[s] x),
 * so the capacity is at most sum_r e / x_r with e the best per-rank
 * efficiency 1 / (s alpha[s]) of any size; T >= L M / C. */
static double best_efficiency(const mal_profile *p, int biggest)
{
    double e = 0;
    for (int s = 1; s <= biggest && s <= (1 << MAL_REPLAN_MAX_TP_LOG); s *= 2) {
        double a = mal_profile_alpha(p, s);
        if (a <= 0 || (p->n_heads > 0 && p->n_heads % s) ||
            (p->ffn_hidden > 0 && p->ffn_hidden % s))
            continue;
        e = MAL_MAX(e, 1 / (s * a));
    }
    return e;
}

static double any_plan_bound(const mal_replan_input *in, int biggest)
{
    const mal_profile *p = in->profile;
    const mal_cluster *cl = in->cluster;
    double e = best_efficiency(p, biggest), cap = 0;
    /* a mixed cluster: each rank at its type's profile's best efficiency */
    double e_ty[MAL_REPLAN_MAX_TYPES];
    for (int t = 0; cl->type_of && t < cl->n_types; t++)
        e_ty[t] = cl->types[t].profile ? best_efficiency(cl->types[t].profile, biggest) : e;
    for (int r = 0; r < cl->world_size; r++) {
        int t = mal_cluster_rank_type(cl, r);
        cap += (t >= 0 ? e_ty[t] : 1.0) / mal_cost_floor(in->rates[r]);
    }
    if (!cl->type_of) cap *= e;
    return cap > 0 ? (double)p->n_layers * in->n_micro_batches / cap : 0;
}

int mal_replan_describe_search(const mal_replan_stats *st, const mal_profile *p, char *buf,
                               size_t len)
{
    static const char *const why[] = {
        [MAL_REPLAN_STOP_OPTIMAL] = "the whole space searched: optimal",
        [MAL_REPLAN_STOP_CONVERGED] = "local search: no move improves",
        [MAL_REPLAN_STOP_BUDGET] = "local search: evaluation budget spent",
        [MAL_REPLAN_STOP_TIME] = "stopped by the time limit"};
    double lt = p->layer_time, sy = p->sync_time;
    double best = st->objective * lt + sy, bound = st->lower_bound * lt + sy;
    double gap = st->objective > 0 ? (st->objective - st->lower_bound) / st->objective : 0;
    int stop = st->stop >= 0 && st->stop <= MAL_REPLAN_STOP_TIME ? st->stop : 0;
    char lim[64] = "";
    if (stop == MAL_REPLAN_STOP_TIME) snprintf(lim, sizeof lim, " (%g s)", st->time_limit);
    return snprintf(buf, len, "best found %.4f s, bound %.4f s, gap %.1f %%, %s%s", best, bound,
                    100 * MAL_MAX(0.0, gap), why[stop], lim);
}

int mal_replan(const mal_replan_input *in, mal_plan *out, mal_replan_stats *stats)
{
    double t0 = mal_now();
    int rc, any = 0, exact = 1;
    mal_plan_init(out);
    if ((rc = check_input(in))) return rc;
    const mal_profile *p = in->profile;
    const mal_cluster *cl = in->cluster;
    int biggest = 0;
    {
        /* the largest node (healthy groups never span nodes) */
        int *cnt = calloc((size_t)MAL_MAX(1, cl->n_nodes), sizeof *cnt);
        if (!cnt) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        for (int r = 0; r < cl->world_size; r++)
            biggest = MAL_MAX(biggest, ++cnt[cl->node_of[r]]);
        free(cnt);
    }
    mal_replan_stats best = {0}, st;
    best.objective = INFINITY;
    double deadline = in->time_limit > 0 ? t0 + in->time_limit : INFINITY;
    double bound = INFINITY;
    int have_plan = 0, stop = MAL_REPLAN_STOP_OPTIMAL, skipped = 0;
    /* The memory of a stage depends on how many pipelines replicate its
     * layers (the gradient sum's copy, the moments --zero 1 shards), which
     * the search does not know beforehand: the first pass assumes the
     * dearest count (mal_cost_stage_terms), so every plan it finds fits;
     * later passes assume counts that pay -- one pipeline without --zero
     * (where nothing fits or the best plan has two);
     * with it, the best plan's count R (at least 3: below that the moments
     * shed only pay for the gradients' copy; at least 2 where the master
     * is shed too, whose 12 bytes of 2 replicas' halves pay for the 4 of
     * the copy), the next count of nominal pipelines of fewer stages, and
     * R - 1 -- and their
     * plans count only where the plan's own memory fits.  With --recompute
     * auto all of it runs first without recomputation, then with it: a plan
     * that recomputes is taken only where none fits or it is faster (ties
     * keep the plan without). */
    int want = p->recompute, r0 = 0;
    for (int pass = 0; pass < 8; pass++) {
        const int phase = pass / 4, k = pass % 4;
        int recompute =
            phase == 0 && want == MAL_REPLAN_RECOMPUTE_AUTO ? MAL_REPLAN_RECOMPUTE_NONE : want;
        if (phase == 1 && want != MAL_REPLAN_RECOMPUTE_AUTO) break;
        int replicas = 0;
        if (k > 0) {
            if (have_plan && mal_now() >= deadline) {
                /* the passes left are a space unsearched: the bound is any plan's */
                skipped = 1;
                stop = MAL_REPLAN_STOP_TIME;
                break;
            }
            if (!has_state(in))
                replicas = 0; /* no state to sum or shard: the count changes nothing */
            else if (!p->zero)
                /* one pipeline: worth a search where the best plan so
                 * far has few pipelines, or none fits */
                replicas = k == 1 && (!any || out->n_pipelines == 2) ? 1 : 0;
            else {
                /* the best plan's count R (at least 3), the next count of
                 * nominal pipelines of fewer stages (groups / S above R), and
                 * R - 1 */
                int groups = cl->world_size / p->tp;
                const int least = p->zero_master && p->state_bytes > 16.0 ? 2 : 3;
                if (k == 1) r0 = MAL_MAX(least, any ? out->n_pipelines : 0);
                if (k == 1) replicas = r0;
                for (int S = groups; k == 2 && S >= 1 && !replicas; S--)
                    if (groups / S > r0) replicas = groups / S;
                if (k == 3 && r0 > least) replicas = r0 - 1;
            }
            if (!replicas) continue;
        }
        /* Healthy full groups of the nominal size, and of every larger size the
         * profile allows: fewer, roomier stages can beat the nominal ones when
         * memory forces deep pipelines.  Each size is a whole search; the best
         * plan wins (ties: the smaller size, tried first).  Past the time
         * limit, with a plan in hand, the larger sizes are skipped. */
        for (int th = p->tp; th <= biggest && th <= (1 << MAL_REPLAN_MAX_TP_LOG); th *= 2) {
            if (th > p->tp &&
                (mal_profile_alpha(p, th) <= 0 || (p->n_heads > 0 && p->n_heads % th) ||
                 (p->ffn_hidden > 0 && p->ffn_hidden % th)))
                continue;
            /* the healthy groups are of one type: its profile must allow the size */
            if (cl->type_of && cl->types[healthy_type(cl)].profile &&
                mal_profile_alpha(cl->types[healthy_type(cl)].profile, th) <= 0)
                continue;
            if (have_plan && mal_now() >= deadline) {
                skipped = 1;
                stop = MAL_REPLAN_STOP_TIME;
                continue;
            }
            mal_plan plan;
            int found;
            memset(&st, 0, sizeof st);
            st.n_layer_lps = best.n_layer_lps;
            st.n_candidates = best.n_candidates;
            st.n_pruned = best.n_pruned;
            int had_plan = have_plan;
            /* the passes after the first are variations of its memory
             * model: a quarter of its local-search budget each */
            if ((rc = plan_with(in, th, replicas, recompute, pass ? 4 : 1, t0, deadline, &have_plan,
                                &plan, &st, &found))) {
                mal_plan_fini(out);
                return rc;
            }
            if (found && replicas) {
                /* the count assumed must be the plan's: else its own memory */
                mal_cost_eval ev;
                if ((rc = mal_cost_eval_plan(&plan, p, cl, in->rates, &ev))) {
                    mal_plan_fini(&plan);
                    mal_plan_fini(out);
                    return rc;
                }
                if (!ev.memory_ok) {
                    /* not a plan: the time limit still waits for one */
                    found = 0;
                    have_plan = had_plan;
                    mal_plan_fini(&plan);
                }
                mal_cost_eval_fini(&ev);
            }
            best.n_layer_lps = st.n_layer_lps;
            best.n_candidates = st.n_candidates;
            best.n_pruned = st.n_pruned;
            bound = MAL_MIN(bound, st.lower_bound);
            /* the most telling reason: time, then budget, then convergence */
            if (st.stop > stop) stop = st.stop;
            if (!found) continue;
            exact &= st.exhaustive;
            if (st.objective < best.objective * (1 - RP_TOL)) {
                mal_plan_fini(out);
                *out = plan;
                best.objective = st.objective;
                any = 1;
            } else {
                mal_plan_fini(&plan);
            }
        }
    }
    if (!any) {
        ctx c = {0};
        c.in = in;
        c.p = p;
        c.t = p->tp;
        c.L = p->n_layers;
        c.M = in->n_micro_batches;
        c.world = cl->world_size;
        set_types(&c, in);
        c.mem = cl->memory_mb;
        c.recompute = p->recompute;
        rp_set_modes(&c);
        return explain_infeasible(&c);
    }
    /* the bound: the least over the sizes searched, any plan's for the
     * sizes skipped, never above the plan found */
    if (skipped) bound = MAL_MIN(bound, any_plan_bound(in, biggest));
    best.lower_bound = MAL_MIN(best.objective, MAL_MAX(bound, any_plan_bound(in, biggest)));
    best.stop = stop;
    best.time_limit = in->time_limit;
    best.exhaustive = exact && !skipped;
    /* communication: the placement of alike ranks, warm-up depths and
     * micro-batches for the slow links (the bound above, of compute alone,
     * stays a bound: communication only adds) */
    if (rp_place_needed(in)) {
        double J;
        if ((rc = rp_place(in, out, &J))) {
            mal_plan_fini(out);
            return rc;
        }
        /* the placement is a local search over the exchanges of alike
         * ranks: the compute search's optimality does not carry over */
        if (mal_links_any(in->links) && J > best.objective * (1 + RP_TOL)) {
            best.exhaustive = 0;
            if (best.stop == MAL_REPLAN_STOP_OPTIMAL) best.stop = MAL_REPLAN_STOP_CONVERGED;
        }
        best.objective = J;
        best.lower_bound = MAL_MIN(best.lower_bound, J);
    }
    best.seconds = mal_now() - t0;
    if (stats) *stats = best;
    return 0;
}
