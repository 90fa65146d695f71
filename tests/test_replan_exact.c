/* The planner against an exact reference of the whole problem:
 * on random clusters of 16-32 ranks (1-2 stragglers per node at rates
 * 1.2-15, memory tight or loose, random TP-size sets), the planner's
 * objective must equal the optimum that an independent exhaustive
 * enumeration finds here.
 *
 * The reference shares nothing with replan/ but the definition of a plan:
 *   - per node, suspend any number of its slowest non-full ranks and cut the
 *     rest (sorted by rate) into consecutive groups of any allowed sizes
 *     (healthy ranks fill nominal groups first); every combination over
 *     the nodes;
 *   - every set partition of those groups into pipelines, every share of
 *     the healthy full groups among them and in pipelines of their own;
 *   - per pipeline every stage order (a dynamic programme over subsets of
 *     its groups) with the exact min-max layer split under memory;
 *   - the exact min-max micro-batch split (m_i >= S_i).
 * It uses no bounds, no dominance, no matching and no knapsack, so it is
 * slow: instances whose enumeration would exceed a budget are skipped.
 * Against the same optimum: the lower bound the planner reports (with the
 * heuristic search alone, where it is not the optimum) never exceeds it,
 * and a time limit too short for any search still gives a valid plan.
 *
 * Activation recomputation (--recompute auto): 30 more instances, memory
 * always tight, where every stage may keep all activations, keep a share
 * f_s (selective) or f_f (full) of them at 1 + t_s or 1 + t_f times the
 * time, plus a one-layer workspace of what it drops; the reference tries
 * every mode on every stage of every order.
 *
 * Mixed hardware: 150 instances of two device types, each with its own
 * memory, speed and profile; the reference sizes each group by its type's.
 * And 20 mixed instances with --recompute auto, each type with its own
 * shares kept and time factors, memory tight on both: the reference sizes
 * each group by its type and tries every mode on every stage.
 *
 *   test_replan_exact              60 + 30 + 150 + 20 instances (CI: seconds)
 *   test_replan_exact --long N     N + N/2 + N + N/2 instances (e.g. 300)
 *   test_replan_exact --heuristic N  the restricted search alone on N
 *                                    instances: how often it is optimal
 *                                    (reported, not required) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mal_test.h"
#include "replan/replan.h"
#include "replan_ref.h"
#include "src/plan.h"

typedef struct grp {
    int size;
    double y;
    int ty; /* device type (mixed instances; else 0) */
} grp;

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static double unif(uint64_t *s)
{
    return (double)(lcg(s) % 1000000) / 1e6;
}

/* ---- instance ------------------------------------------------------------ */

typedef struct inst {
    int world, rpn, tp, L, M;
    double mem;
    double alpha[8]; /* by log2 size; 0 = not allowed */
    double k0, k1, E, X;
    double rates[64];
    /* mixed instances: type 1's nodes, memory, speed and profile (type 0
     * is the fields above at speed 1) */
    int mixed, node_type[16];
    double mem1, speed1, alpha1[8], k0_1, k1_1, E1, X1;
    int rec;                 /* recomputation allowed (modes 0 none, 1 selective, 2 full) */
    double kept[3], rt[3];   /* activations kept, time factor, by mode */
    double kept1[3], rt1[3]; /* type 1's (mixed instances) */
} inst;

static double alpha_of_ty(const inst *I, int ty, int s)
{
    int l = 0;
    while ((1 << l) < s)
        l++;
    return (1 << l) == s && l < 8 ? (ty ? I->alpha1[l] : I->alpha[l]) : 0;
}

static double alpha_of(const inst *I, int s)
{
    return alpha_of_ty(I, 0, s);
}

/* layers a group of `size` and type ty (its memory and profile) holds at
 * most on stage j of S in mode m: per layer the state k0 - a plus the kept
 * share of a = k1 - k0 per micro-batch in flight (S - j), and once the
 * workspace of the share dropped; all at the nominal size, scaled by
 * size / tp */
static int cap_ref(const inst *I, int size, int ty, int S, int j, int m)
{
    int ne = (j == 0) + (j == S - 1);
    double k0 = ty ? I->k0_1 : I->k0, k1 = ty ? I->k1_1 : I->k1;
    double E = ty ? I->E1 : I->E, X = ty ? I->X1 : I->X, mem = ty ? I->mem1 : I->mem;
    double a = k1 - k0, drop = m ? 1 - (ty ? I->kept1 : I->kept)[m] : 0;
    double k = k0 - a + a * (1 - drop) * (S - j);
    double room = (mem - X) * size / (double)I->tp - E * ne - a * drop;
    if (room < 0) return 0;
    double l = floor(room / k * (1 + 1e-12) + 1e-9);
    return l > I->L ? I->L : (int)l;
}

/* ---- per pipeline: best period over all orders --------------------------- */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Can the S groups hold L layers at period P in some order?  best[mask]:
 * most layers when the groups in `mask` take positions 0..|mask|-1. */
static int order_feasible(const inst *I, const grp *g, int S, double P, int *best)
{
    int full = (1 << S) - 1;
    for (int m = 0; m <= full; m++)
        best[m] = -1;
    best[0] = 0;
    for (int m = 0; m < full; m++) {
        if (best[m] < 0) continue;
        int pos = __builtin_popcount((unsigned)m);
        for (int q = 0; q < S; q++) {
            if (m & (1 << q)) continue;
            /* the stage's best mode at this period (its type's time
             * factors) */
            const double *rt = g[q].ty ? I->rt1 : I->rt;
            int w = 0;
            for (int md = 0; md <= (I->rec ? 2 : 0); md++) {
                int c = (int)floor(P / (g[q].y * rt[md]) * (1 + 1e-12) + 1e-9);
                int u = cap_ref(I, g[q].size, g[q].ty, S, pos, md);
                if ((c < u ? c : u) > w) w = c < u ? c : u;
            }
            if (w > I->L) w = I->L;
            if (w < 1) continue;
            if (best[m] + w > best[m | (1 << q)]) best[m | (1 << q)] = best[m] + w;
        }
    }
    return best[full] >= I->L;
}

static double best_period(const inst *I, const grp *g, int S)
{
    if (S < 1 || S > I->L || S > 14) return INFINITY;
    int *best = malloc(sizeof(int) << S);
    double *cand = malloc((size_t)S * I->L * 3 * sizeof *cand);
    CHECK(best && cand);
    int n = 0;
    for (int md = 0; md <= (I->rec ? 2 : 0); md++)
        for (int q = 0; q < S; q++)
            for (int l = 1; l <= I->L; l++)
                cand[n++] = g[q].y * (g[q].ty ? I->rt1 : I->rt)[md] * l;
    qsort(cand, (size_t)n, sizeof *cand, cmp_dbl);
    double P = INFINITY;
    int lo = 0, hi = n - 1;
    if (order_feasible(I, g, S, cand[hi], best)) {
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (order_feasible(I, g, S, cand[mid], best))
                hi = mid;
            else
                lo = mid + 1;
        }
        P = cand[hi];
    }
    free(best);
    free(cand);
    return P;
}

/* memo of pipeline periods by their sorted groups */
typedef struct memo {
    char **key;
    double *P;
    int n, cap;
} memo;

static int cmp_grp(const void *a, const void *b)
{
    const grp *u = a, *v = b;
    if (u->size != v->size) return u->size > v->size ? -1 : 1;
    if (u->y != v->y) return (u->y > v->y) - (u->y < v->y);
    return (u->ty > v->ty) - (u->ty < v->ty);
}

static double pipeline_period(const inst *I, memo *mm, const grp *g0, int S)
{
    grp g[32];
    char key[1024];
    memcpy(g, g0, (size_t)S * sizeof *g);
    qsort(g, (size_t)S, sizeof *g, cmp_grp);
    int len = 0;
    for (int q = 0; q < S; q++)
        len +=
            snprintf(key + len, sizeof key - (size_t)len, "%d:%a:%d|", g[q].size, g[q].y, g[q].ty);
    for (int i = 0; i < mm->n; i++)
        if (!strcmp(mm->key[i], key)) return mm->P[i];
    if (mm->n == mm->cap) {
        mm->cap = mm->cap ? 2 * mm->cap : 256;
        mm->key = realloc(mm->key, (size_t)mm->cap * sizeof *mm->key);
        mm->P = realloc(mm->P, (size_t)mm->cap * sizeof *mm->P);
        CHECK(mm->key && mm->P);
    }
    mm->key[mm->n] = strdup(key);
    mm->P[mm->n] = best_period(I, g, S);
    return mm->P[mm->n++];
}

/* ---- the enumeration ----------------------------------------------------- */

typedef struct ref {
    const inst *I;
    int n_nodes, H;
    grp healthy; /* the healthy full groups' size and rate */
    int n_opt[16];
    grp opt[16][256][16];
    int opt_n[16][256];
    grp sp[64];
    int ns;
    int rgs[64];
    double best;
    long work, budget;
    memo mm;
} ref;

/* the pipelines of one partition of the specials and one share of the
 * healthy full groups: blocks get hb[], the rest go to healthy-only
 * pipelines of the lengths in parts[] */
static void eval_split(ref *R, int k, const int *hb, const int *parts, int np)
{
    const inst *I = R->I;
    double P[64];
    int S[64], n = 0;
    R->work++;
    for (int b = 0; b < k; b++) {
        grp g[32];
        int s = 0;
        for (int q = 0; q < R->ns; q++)
            if (R->rgs[q] == b) {
                if (s == 32) return;
                g[s++] = R->sp[q];
            }
        for (int h = 0; h < hb[b] && s < 32; h++)
            g[s++] = R->healthy;
        P[n] = pipeline_period(I, &R->mm, g, s);
        S[n++] = s;
        if (!isfinite(P[n - 1])) return;
    }
    for (int i = 0; i < np; i++) {
        grp g[32];
        if (parts[i] > 32) return;
        for (int h = 0; h < parts[i]; h++)
            g[h] = R->healthy;
        P[n] = pipeline_period(I, &R->mm, g, parts[i]);
        S[n++] = parts[i];
        if (!isfinite(P[n - 1])) return;
    }
    if (n == 0) return;
    double T = exact_mb(n, P, S, I->M);
    if (T < R->best) R->best = T;
}

/* integer partitions of r into parts <= maxp (non-increasing) */
static void healthy_parts(ref *R, int k, const int *hb, int r, int maxp, int *parts, int np)
{
    if (r == 0) {
        eval_split(R, k, hb, parts, np);
        return;
    }
    for (int p = r < maxp ? r : maxp; p >= 1; p--) {
        parts[np] = p;
        healthy_parts(R, k, hb, r - p, p, parts, np + 1);
    }
}

static void healthy_shares(ref *R, int k, int *hb, int b, int left)
{
    if (R->work > R->budget) return;
    if (b == k) {
        int parts[64] = {0};
        healthy_parts(R, k, hb, left, left, parts, 0);
        return;
    }
    for (int h = 0; h <= left; h++) {
        hb[b] = h;
        healthy_shares(R, k, hb, b + 1, left - h);
    }
}

/* set partitions of the specials (restricted growth strings) */
static void partitions(ref *R, int i, int k)
{
    if (R->work > R->budget) return;
    if (i == R->ns) {
        int hb[64];
        healthy_shares(R, k, hb, 0, R->H);
        return;
    }
    for (int b = 0; b <= k; b++) {
        R->rgs[i] = b;
        partitions(R, i + 1, b == k ? k + 1 : k);
    }
}

static void node_options(ref *R, int n)
{
    if (R->work > R->budget) return;
    if (n == R->n_nodes) {
        if (R->H + R->ns <= R->I->M) partitions(R, 0, 0);
        return;
    }
    for (int o = 0; o < R->n_opt[n]; o++) {
        int m = R->opt_n[n][o];
        memcpy(R->sp + R->ns, R->opt[n][o], (size_t)m * sizeof *R->sp);
        R->ns += m;
        node_options(R, n + 1);
        R->ns -= m;
    }
}

static const double *g_x;
static int cmp_rank(const void *a, const void *b)
{
    int r = *(const int *)a, s = *(const int *)b;
    if (g_x[r] != g_x[s]) return g_x[r] < g_x[s] ? -1 : 1;
    return (r > s) - (r < s);
}

/* ordered compositions of positions [p, a) of rates xr[] into allowed sizes */
static void compose(ref *R, int n, int ty, const double *xr, int p, int a, grp *cur, int nc)
{
    if (p == a) {
        /* keep one copy of each multiset */
        grp srt[16];
        memcpy(srt, cur, (size_t)nc * sizeof *srt);
        qsort(srt, (size_t)nc, sizeof *srt, cmp_grp);
        for (int o = 0; o < R->n_opt[n]; o++)
            if (R->opt_n[n][o] == nc && !memcmp(R->opt[n][o], srt, (size_t)nc * sizeof *srt))
                return;
        CHECK(R->n_opt[n] < 256);
        memcpy(R->opt[n][R->n_opt[n]], srt, (size_t)nc * sizeof *srt);
        R->opt_n[n][R->n_opt[n]++] = nc;
        return;
    }
    for (int s = 1; p + s <= a; s *= 2) {
        double al = alpha_of_ty(R->I, ty, s);
        if (al <= 0) continue;
        cur[nc] = (grp){s, al * xr[p + s - 1], ty};
        compose(R, n, ty, xr, p + s, a, cur, nc + 1);
    }
}

/* the optimum with healthy full groups of th ranks, or INFINITY; -1 when
 * the enumeration is over budget */
static double reference_th(const inst *I, int th, long budget)
{
    ref *R = calloc(1, sizeof *R);
    CHECK(R != NULL);
    R->I = I;
    /* the healthy full groups are of one type: the fastest, then the one
     * with more memory (ties: type 0); the other type's nodes are all
     * specials, which include its nominal groups: no plan is lost */
    int hty = I->mixed && (I->speed1 > 1.0 || (I->speed1 == 1.0 && I->mem1 > I->mem)) ? 1 : 0;
    R->healthy = (grp){th, alpha_of_ty(I, hty, th), hty};
    if (!(R->healthy.y > 0)) {
        free(R);
        return INFINITY;
    }
    R->n_nodes = I->world / I->rpn;
    R->best = INFINITY;
    R->budget = budget;
    double x[64];
    for (int r = 0; r < I->world; r++) {
        /* a slower type's rank plans at 1 / speed at least */
        double v = I->rates[r];
        if (I->mixed && I->node_type[r / I->rpn] && 1.0 / I->speed1 > v) v = 1.0 / I->speed1;
        x[r] = v < 1.2 ? 1.0 : v;
    }
    g_x = x;
    for (int n = 0; n < R->n_nodes; n++) {
        int m[16], h = 0;
        for (int q = 0; q < I->rpn; q++)
            m[q] = n * I->rpn + q;
        qsort(m, (size_t)I->rpn, sizeof *m, cmp_rank);
        int ty = I->mixed ? I->node_type[n] : 0;
        while (ty == hty && h < I->rpn && x[m[h]] == 1.0)
            h++;
        int F = h / th, rest = I->rpn - F * th;
        R->H += F;
        double xr[16];
        for (int q = 0; q < rest; q++)
            xr[q] = x[m[F * th + q]];
        grp cur[16];
        for (int u = 0; u <= rest; u++)
            compose(R, n, ty, xr, 0, rest - u, cur, 0);
    }
    /* a rough size of the enumeration (option combinations times set
     * partitions of the most specials): skip hopeless ones at once */
    static const double bell[] = {1, 1, 2, 5, 15, 52, 203, 877, 4140, 21147, 115975, 678570};
    double est = 1;
    int most = 0;
    for (int n = 0; n < R->n_nodes; n++) {
        int mg = 0;
        for (int o = 0; o < R->n_opt[n]; o++)
            mg = R->opt_n[n][o] > mg ? R->opt_n[n][o] : mg;
        est *= R->n_opt[n];
        most += mg;
    }
    est *= most < 12 ? bell[most] : 1e12;
    if (est > 50.0 * budget)
        R->work = budget + 1;
    else
        node_options(R, 0);
    double best = R->work > R->budget ? -1 : R->best;
    for (int i = 0; i < R->mm.n; i++)
        free(R->mm.key[i]);
    free(R->mm.key);
    free(R->mm.P);
    free(R);
    return best;
}

/* the optimum over the healthy full groups' size: the nominal one or any
 * larger one allowed (-1: over budget) */
static double reference(const inst *I, long budget)
{
    double best = INFINITY;
    for (int th = I->tp; th <= I->rpn; th *= 2) {
        if (alpha_of(I, th) <= 0) continue;
        double v = reference_th(I, th, budget);
        if (v < 0) return -1;
        if (v < best) best = v;
    }
    return best;
}

/* ---- random instances ---------------------------------------------------- */

static void make_profile(const inst *I, mal_profile *p);

/* type 1's profile: its own alpha, k and E, X */
static void make_profile_1(const inst *I, mal_profile *p)
{
    make_profile(I, p);
    snprintf(p->name, sizeof p->name, "exact-1");
    memcpy(p->alpha, I->alpha1, sizeof I->alpha1);
    p->k[0] = I->k0_1;
    p->k[1] = I->k1_1;
    p->embed_mb = I->E1;
    p->overhead_mb = I->X1;
    for (int m = 0; m < 3; m++) {
        p->acts_kept[m] = I->kept1[m];
        p->recompute_time[m] = I->rt1[m] - 1;
    }
}

/* The cluster of an instance and the rates the planner gets (a mixed
 * cluster's: through its types' speeds); type 1 gets its own profile. */
static void make_cluster(const inst *I, mal_cluster *c, double *rates)
{
    memcpy(rates, I->rates, (size_t)I->world * sizeof *rates);
    if (!I->mixed) {
        CHECK_OK(mal_cluster_regular(c, I->world, I->rpn, I->mem));
        return;
    }
    char js[2048];
    int len = snprintf(js, sizeof js,
                       "{\"world_size\": %d, \"ranks_per_node\": %d, \"types\": {\"a\": "
                       "{\"memory_mb\": %.17g}, \"b\": {\"memory_mb\": %.17g, \"speed\": %.17g}}, "
                       "\"node_types\": [",
                       I->world, I->rpn, I->mem, I->mem1, I->speed1);
    for (int n = 0; n < I->world / I->rpn; n++)
        len += snprintf(js + len, sizeof js - (size_t)len, "%s\"%s\"", n ? ", " : "",
                        I->node_type[n] ? "b" : "a");
    snprintf(js + len, sizeof js - (size_t)len, "]}");
    CHECK_OK(mal_cluster_parse_string(c, js, "mixed"));
    for (int t = 0; t < c->n_types; t++)
        if (!strcmp(c->types[t].name, "b")) {
            c->types[t].profile = calloc(1, sizeof *c->types[t].profile);
            CHECK(c->types[t].profile != NULL);
            make_profile_1(I, c->types[t].profile);
        }
    mal_cluster_effective_rates(c, rates, rates);
}

static void make_profile(const inst *I, mal_profile *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "exact");
    p->n_layers = I->L;
    p->tp = I->tp;
    p->n_heads = 64;
    p->ffn_hidden = 256;
    memcpy(p->alpha, I->alpha, sizeof I->alpha);
    p->n_k = 2;
    p->k = malloc(2 * sizeof *p->k);
    CHECK(p->k != NULL);
    p->k[0] = I->k0;
    p->k[1] = I->k1;
    p->embed_mb = I->E;
    p->overhead_mb = I->X;
    p->layer_time = 0.01;
    for (int m = 0; m < 3; m++) {
        p->acts_kept[m] = I->kept[m];
        p->recompute_time[m] = I->rt[m] - 1;
    }
    p->recompute = I->rec ? MAL_REPLAN_RECOMPUTE_AUTO : MAL_REPLAN_RECOMPUTE_NONE;
}

static void random_instance(uint64_t *seed, inst *I, int rec)
{
    static const int worlds[] = {16, 24, 32};
    memset(I, 0, sizeof *I);
    I->rec = rec;
    I->kept[0] = 1;
    I->rt[0] = 1;
    I->world = worlds[lcg(seed) % 3];
    I->rpn = (lcg(seed) % 2) ? 8 : 4;
    if (I->rpn == 4)
        I->tp = (lcg(seed) % 2) ? 4 : 2;
    else
        I->tp = (lcg(seed) % 2) ? 8 : 4;
    /* sizes other than nominal each allowed with probability 0.6 (larger
     * ones up to the node size); sub-linear slowdowns (t/s)^e */
    int lt = 0, ln = 0;
    while ((1 << lt) < I->tp)
        lt++;
    while ((1 << ln) < I->rpn)
        ln++;
    double e = 0.85 + 0.15 * unif(seed);
    for (int l = 0; l <= ln; l++)
        if (l == lt || unif(seed) < (l < lt ? 0.6 : 0.3))
            I->alpha[l] = pow(2.0, (lt - l) * e) * (l == lt ? 1.0 : 1 + 0.05 * unif(seed));
    I->L = 4 + (int)(lcg(seed) % 9);
    I->k0 = 1.0;
    I->k1 = 1.0 + 0.5 * unif(seed);
    I->E = 0.5 * unif(seed);
    I->X = 1.0;
    if (rec) {
        /* recomputation: keep 30-90 % (selective), then 5-30 % (full), at
         * 1-10 % and 25-45 % more time; the activations most of a layer
         * (k1 - k0 of k1) */
        I->k1 = 1.5 + 0.45 * unif(seed);
        I->kept[1] = 0.3 + 0.6 * unif(seed);
        I->kept[2] = 0.05 + 0.25 * unif(seed);
        I->rt[1] = 1.01 + 0.09 * unif(seed);
        I->rt[2] = 1.25 + 0.2 * unif(seed);
    }
    /* memory: loose, or tight enough that nominal stages hold 2-5 layers
     * (with recomputation always tight) */
    if (rec)
        I->mem = I->X + I->k1 * (2 + (int)(lcg(seed) % 4)) + I->E + 0.01;
    else if (lcg(seed) % 2)
        I->mem = 1000;
    else
        I->mem = I->X + I->k1 * (2 + (int)(lcg(seed) % 4)) + I->E + 0.01;
    int groups = I->world / I->tp;
    I->M = groups + (int)(lcg(seed) % (unsigned)(2 * groups + 1));
    for (int r = 0; r < I->world; r++)
        I->rates[r] = 1.0 + 0.15 * unif(seed); /* noise below the floor */
    /* per node 0, 1 or 2 stragglers at 1.2-15; at least one somewhere */
    int any = 0;
    for (int n = 0; n < I->world / I->rpn; n++) {
        int ns = (int)(lcg(seed) % 3);
        if (lcg(seed) % 2) ns = 0; /* half the nodes healthy */
        for (int q = 0; q < ns; q++) {
            I->rates[n * I->rpn + (int)(lcg(seed) % (unsigned)I->rpn)] = 1.2 + 13.8 * unif(seed);
            any = 1;
        }
    }
    if (!any) I->rates[lcg(seed) % (unsigned)I->world] = 1.2 + 13.8 * unif(seed);
}

/* A mixed instance: 8-16 ranks on nodes of 4, each node of type 0 or 1
 * (both in use); type 1 at speed 1 or 0.5-0.9 with its own memory (tight:
 * 1-4 nominal layers) and profile (alpha of the same sizes, each up to
 * 10 % slower, or the same; its own k and E); at most one straggler per
 * node, at 1.5, 3 or 6.  With rec: recomputation allowed, each type with
 * its own shares kept and time factors, activations most of a layer, and
 * type 0's memory tight too (2-5 nominal layers). */
static void random_mixed(uint64_t *seed, inst *I, int rec)
{
    static const int worlds[] = {8, 12, 16};
    memset(I, 0, sizeof *I);
    I->mixed = 1;
    I->rec = rec;
    I->kept[0] = I->kept1[0] = 1;
    I->rt[0] = I->rt1[0] = 1;
    I->world = worlds[lcg(seed) % 3];
    I->rpn = 4;
    I->tp = (lcg(seed) % 2) ? 4 : 2;
    int lt = I->tp == 4 ? 2 : 1;
    double e = 0.85 + 0.15 * unif(seed);
    int same_alpha = lcg(seed) % 2; /* groups of both types alike but in memory */
    for (int l = 0; l <= 2; l++)
        if (l == lt || unif(seed) < 0.5) {
            I->alpha[l] = pow(2.0, (lt - l) * e);
            I->alpha1[l] = I->alpha[l] * (same_alpha ? 1.0 : 1 + 0.1 * unif(seed));
        }
    I->L = 4 + (int)(lcg(seed) % 7);
    I->k0 = 1.0;
    I->k1 = 1.0 + 0.5 * unif(seed);
    I->E = 0.5 * unif(seed);
    I->X = 1.0;
    I->mem = (lcg(seed) % 2) ? 1000 : I->X + I->k1 * (3 + (int)(lcg(seed) % 4)) + I->E + 0.01;
    I->k0_1 = 1.0 + unif(seed);
    I->k1_1 = I->k0_1 * (1.0 + 0.5 * unif(seed));
    I->E1 = 0.5 * unif(seed);
    I->X1 = 1.0;
    I->mem1 = I->X1 + I->k1_1 * (1 + (int)(lcg(seed) % 4)) + I->E1 + 0.01;
    I->speed1 = (lcg(seed) % 3) ? 0.5 + 0.4 * unif(seed) : 1.0;
    if (rec) {
        /* as random_instance's, per type: keep 30-90 % (selective), 5-30 %
         * (full), at 1-10 % and 25-45 % more time */
        I->k1 = 1.5 + 0.45 * unif(seed);
        I->k1_1 = I->k0_1 * (1.5 + 0.45 * unif(seed));
        I->mem = I->X + I->k1 * (2 + (int)(lcg(seed) % 4)) + I->E + 0.01;
        I->mem1 = I->X1 + I->k1_1 * (2 + (int)(lcg(seed) % 3)) + I->E1 + 0.01;
        for (int t = 0; t < 2; t++) {
            double *kept = t ? I->kept1 : I->kept, *rt = t ? I->rt1 : I->rt;
            kept[1] = 0.3 + 0.6 * unif(seed);
            kept[2] = 0.05 + 0.25 * unif(seed);
            rt[1] = 1.01 + 0.09 * unif(seed);
            rt[2] = 1.25 + 0.2 * unif(seed);
        }
    }
    int nn = I->world / I->rpn, n1 = 0;
    for (int n = 0; n < nn; n++)
        n1 += I->node_type[n] = (int)(lcg(seed) % 2);
    if (n1 == 0) I->node_type[lcg(seed) % (unsigned)nn] = 1;
    if (n1 == nn) I->node_type[lcg(seed) % (unsigned)nn] = 0;
    int groups = I->world / I->tp;
    I->M = groups + (int)(lcg(seed) % (unsigned)(2 * groups + 1));
    for (int r = 0; r < I->world; r++)
        I->rates[r] = 1.0 + 0.15 * unif(seed);
    /* stragglers at a few rates: nodes of both types in the same
     * situation but for their type */
    static const double strag[] = {1.5, 3.0, 6.0};
    for (int n = 0; n < nn; n++)
        if (lcg(seed) % 3 == 0) I->rates[n * I->rpn + (int)(lcg(seed) % 4)] = strag[lcg(seed) % 3];
}

/* The lower bound the planner reports never exceeds the optimum: the
 * heuristic search alone (its bound is the space's, not the optimum it
 * proved); and with a time limit too short for anything (1 ns) the planner
 * still returns a valid plan -- the first one is always finished -- whose
 * objective is what it writes and never below the optimum. */
static void check_bound_and_limit(const mal_replan_input *in0, double opt, const mal_profile *p,
                                  const mal_cluster *c)
{
    mal_replan_input in = *in0;
    mal_plan plan;
    mal_replan_stats st;
    in.search = MAL_REPLAN_HEURISTIC;
    CHECK_OK(mal_replan(&in, &plan, &st));
    if (!(st.lower_bound <= opt * (1 + 1e-9))) {
        fprintf(stderr, "the heuristic search's bound %.17g is above the optimum %.17g\n",
                st.lower_bound, opt);
        exit(1);
    }
    CHECK(st.objective >= opt * (1 - 1e-9));
    mal_plan_fini(&plan);
    in.search = MAL_REPLAN_AUTO;
    in.time_limit = 1e-9;
    int level = mal_log_level;
    mal_log_level = MAL_LOG_WARN; /* the limit's report, once per instance */
    CHECK_OK(mal_replan(&in, &plan, &st));
    mal_log_level = level;
    CHECK(st.lower_bound <= opt * (1 + 1e-9));
    CHECK(st.objective >= opt * (1 - 1e-9));
    CHECK(st.time_limit == 1e-9);
    mal_cost_eval ev;
    CHECK_OK(mal_plan_validate(&plan, c->world_size, p->n_layers, p->n_heads, p->ffn_hidden,
                               in.n_micro_batches));
    CHECK_OK(mal_cost_eval_plan(&plan, p, c, in.rates, &ev));
    CHECK(ev.memory_ok);
    CHECK_CLOSE(ev.step_time, st.objective, 1e-9, 0);
    mal_cost_eval_fini(&ev);
    mal_plan_fini(&plan);
}

int main(int argc, char **argv)
{
    int want = 60, want_rec = 30, want_mixed = 150, want_mixrec = 20, only = 0, heuristic = 0;
    int n_equal = 0, n_plans = 0, n_rec_plans = 0, n_rec_stages = 0, n_mixrec_plans = 0;
    if (argc == 3 && !strcmp(argv[1], "--long")) {
        want = want_mixed = atoi(argv[2]);
        want_rec = want_mixrec = want / 2;
    }
    if (argc == 3 && !strcmp(argv[1], "--heuristic")) {
        want = atoi(argv[2]);
        heuristic = 1;
    }
    if (argc == 3 && !strcmp(argv[1], "--only")) only = atoi(argv[2]); /* debugging */
    if (argc == 3 && !strcmp(argv[1], "--only-mixed")) { /* debugging: the N-th try of them */
        only = atoi(argv[2]);
        want = want_rec = 0;
    }
    /* the mixed instances, and the mixed ones with recomputation, have
     * seeds of their own: the others stay those of before */
    uint64_t seed = 14, seed_mixed = 2718, seed_mixrec = 1618;
    int done = 0, skipped = 0, infeasible = 0, tries = 0, by_world[33] = {0}, n_heur = 0;
    int done_mixed = 0, infeasible_mixed = 0;
    double t_ref = 0, t_plan = 0;
    if (heuristic) want_mixed = want_mixrec = 0;
    while (done < want + want_rec + want_mixed + want_mixrec) {
        inst I;
        if (done < want + want_rec)
            random_instance(&seed, &I, done >= want);
        else if (done < want + want_rec + want_mixed)
            random_mixed(&seed_mixed, &I, 0);
        else
            random_mixed(&seed_mixrec, &I, 1);
        tries++;
        if (only && tries != only) {
            if (tries > only) break;
            continue;
        }
        if (only) {
            fprintf(stderr, "world %d rpn %d tp %d L %d M %d mem %.17g k1 %.17g E %.17g alpha",
                    I.world, I.rpn, I.tp, I.L, I.M, I.mem, I.k1, I.E);
            for (int l = 0; l < 8; l++)
                fprintf(stderr, " %g", I.alpha[l]);
            if (I.mixed) {
                fprintf(stderr, "\nmixed: mem1 %.17g speed1 %g k0_1 %g k1_1 %g E1 %g alpha1",
                        I.mem1, I.speed1, I.k0_1, I.k1_1, I.E1);
                for (int l = 0; l < 8; l++)
                    fprintf(stderr, " %g", I.alpha1[l]);
                fprintf(stderr, "\nnode types");
                for (int n = 0; n < I.world / I.rpn; n++)
                    fprintf(stderr, " %d", I.node_type[n]);
            }
            fprintf(stderr, "\nrates");
            for (int r = 0; r < I.world; r++)
                fprintf(stderr, " %.3f", I.rates[r]);
            fprintf(stderr, "\n");
        }
        double t0 = mal_now();
        double opt = reference(&I, 30000);
        double t1 = mal_now();
        if (opt < 0) {
            skipped++;
            continue;
        }
        t_ref += t1 - t0;
        mal_cluster c;
        mal_profile p;
        double rates[64];
        make_cluster(&I, &c, rates);
        make_profile(&I, &p);
        mal_replan_input in = {&c,  &p,  rates, 1,
                               I.M, 0,   NULL,  heuristic ? MAL_REPLAN_HEURISTIC : MAL_REPLAN_AUTO,
                               0,   NULL};
        mal_plan plan;
        mal_replan_stats st;
        t0 = mal_now();
        int rc = mal_replan(&in, &plan, &st);
        t_plan += mal_now() - t0;
        if (heuristic) {
            infeasible += !isfinite(opt);
            if (isfinite(opt)) {
                n_plans++;
                n_equal += rc == 0 && fabs(st.objective - opt) <= 1e-9 * opt;
                if (rc == 0) CHECK(st.objective >= opt * (1 - 1e-9)); /* never below */
            }
            if (rc == 0) mal_plan_fini(&plan);
        } else if (!isfinite(opt)) {
            if (rc != MAL_EINVAL)
                fprintf(stderr, "instance %d: no plan exists, but the planner returned %d\n", tries,
                        rc);
            CHECK_EQ_INT(rc, MAL_EINVAL);
            infeasible++;
            infeasible_mixed += I.mixed;
        } else {
            if (rc || fabs(st.objective - opt) > 1e-9 * opt) {
                fprintf(stderr,
                        "instance %d%s: world %d, %d per node, tp %d, L %d, M %d, memory %g: "
                        "planner %g (rc %d, %s), optimum %g\n",
                        tries, I.mixed ? " (mixed)" : "", I.world, I.rpn, I.tp, I.L, I.M, I.mem,
                        rc ? NAN : st.objective, rc, st.exhaustive ? "exhaustive" : "heuristic",
                        opt);
                exit(1);
            }
            n_heur += !st.exhaustive;
            /* the written plan is that objective, fits memory, validates */
            mal_cost_eval ev;
            CHECK_OK(mal_plan_validate(&plan, I.world, I.L, p.n_heads, p.ffn_hidden, I.M));
            int n_rc = 0;
            for (int i = 0; i < plan.n_pipelines; i++)
                for (int j = 0; j < plan.pipelines[i].n_stages; j++)
                    n_rc += plan.pipelines[i].stages[j].recompute != MAL_RECOMPUTE_NONE;
            CHECK(I.rec || n_rc == 0);
            n_rec_plans += n_rc > 0 && !I.mixed;
            n_mixrec_plans += n_rc > 0 && I.mixed;
            n_rec_stages += n_rc;
            CHECK_OK(mal_cost_eval_plan(&plan, &p, &c, rates, &ev));
            CHECK(ev.memory_ok);
            CHECK_CLOSE(ev.step_time, opt, 1e-9, 0);
            /* a TP group within one type */
            for (int i = 0; i < plan.n_pipelines; i++)
                for (int j = 0; j < plan.pipelines[i].n_stages; j++) {
                    const mal_plan_stage *s = &plan.pipelines[i].stages[j];
                    for (int k = 1; k < s->n_ranks; k++)
                        CHECK_EQ_INT(mal_cluster_rank_type(&c, s->ranks[k]),
                                     mal_cluster_rank_type(&c, s->ranks[0]));
                }
            mal_cost_eval_fini(&ev);
            mal_plan_fini(&plan);
            /* the reported bound: the objective itself when the whole space
             * was searched */
            CHECK(st.stop == MAL_REPLAN_STOP_OPTIMAL || !st.exhaustive);
            if (st.exhaustive) CHECK_CLOSE(st.lower_bound, st.objective, 1e-12, 0);
            check_bound_and_limit(&in, opt, &p, &c);
        }
        mal_cluster_fini(&c);
        mal_profile_fini(&p);
        done++;
        done_mixed += I.mixed;
        by_world[I.world]++;
        if (only) break;
    }
    if (heuristic)
        printf("test_replan_exact: the heuristic search alone is optimal on %d of %d instances "
               "with a plan\n",
               n_equal, n_plans);
    printf("test_replan_exact: %d of the %d instances with --recompute auto recompute on %d "
           "stages\n",
           n_rec_plans, want_rec, n_rec_stages);
    printf("test_replan_exact: %d instances (%d of 16 ranks, %d of 24, %d of 32) equal the exact "
           "optimum (%d without any plan; %d found by the planner's heuristic search alone), %d "
           "skipped as too large for the reference; reference %.2f s, planner %.2f s\n",
           done, by_world[16], by_world[24], by_world[32], infeasible, n_heur, skipped, t_ref,
           t_plan);
    printf("test_replan_exact: of them %d mixed (two device types, each with its memory, speed "
           "and profile; %d without any plan), %d of them with --recompute auto (%d plans "
           "recompute)\n",
           done_mixed, infeasible_mixed, want_mixrec, n_mixrec_plans);
    return 0;
}
