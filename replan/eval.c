/* Steps B/C of the planner for one grouping of the specials into blocks:
 * the best step time over every way of sharing the H healthy full groups
 * out (any number joins each block's pipeline; the rest form pipelines of
 * their own, of any lengths and number) and every split of the
 * micro-batches.
 *
 * For a trial step time T, a pipeline of period P and S stages can run
 * m = floor(T / P) - S + 1 micro-batches, and must run at least S (1F1B).
 * T is feasible when the pipelines together can run M.  Healthy-only
 * pipelines are interchangeable, so the most they run with R healthy groups
 * is an unbounded knapsack g(R) = max sum f(h_j), sum h_j = R, f(h) the
 * count of one pipeline of h; a dynamic programme over the blocks adds each
 * block's best use of its healthy groups.  Both are exact; feasibility is
 * monotone in T, and the optimum is one of the values (m + S - 1) P, so a
 * bisection to relative 1e-13 finds it.  The micro-batches are then filled
 * up to T and the excess trimmed from the slowest pipelines (never making
 * one slower).
 *
 * The dynamic programme keeps a table of blocks x healthy counts for the
 * reconstruction: quadratic in the cluster when there are thousands of
 * blocks and of healthy groups (100,000 ranks with 20 % stragglers).  Above
 * RP_DP_CELLS cells a price takes its place (feasible_price): linear in the
 * blocks, a restriction of the evaluation like the windows (README,
 * "Search"), which only evaluations that large ever see. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "search.h"

/* Most cells of the dynamic programme's table (blocks x healthy counts;
 * 16 MB): beyond, the price rule (feasible_price). */
#define RP_DP_CELLS 4e6

void rp_eval_fini(rp_eval *e)
{
    if (!e) return;
    free(e->h);
    free(e->hp);
    memset(e, 0, sizeof *e);
}

/* trim order: the pipeline that finishes last first, ties the lower index */
static int trim_before(const double *Tp, int a, int b)
{
    return Tp[a] > Tp[b] || (Tp[a] == Tp[b] && a < b);
}

static void trim_sift(const double *Tp, int *heap, int n, int q)
{
    for (;;) {
        int l = 2 * q + 1, r = l + 1, top = q;
        if (l < n && trim_before(Tp, heap[l], heap[top])) top = l;
        if (r < n && trim_before(Tp, heap[r], heap[top])) top = r;
        if (top == q) return;
        int t = heap[q];
        heap[q] = heap[top];
        heap[top] = t;
        q = top;
    }
}

double rp_trim(int D, const double *P, const int *S, int *m, int M, long *total)
{
    /* one at a time from the pipeline that finishes last: never slower.  A
     * heap keyed as that scan would choose (latest finish, then lowest
     * index) gives the same result in D log D instead of excess x D. */
    int *heap = malloc((size_t)MAL_MAX(1, D) * sizeof *heap);
    double *Tp = malloc((size_t)MAL_MAX(1, D) * sizeof *Tp);
    int n = 0;
    if (heap && Tp) {
        for (int i = 0; i < D; i++) {
            Tp[i] = (m[i] + S[i] - 1) * P[i];
            if (m[i] > S[i]) heap[n++] = i;
        }
        for (int q = n / 2 - 1; q >= 0; q--)
            trim_sift(Tp, heap, n, q);
        while (*total > M && n > 0) {
            int i = heap[0];
            m[i]--;
            (*total)--;
            Tp[i] = (m[i] + S[i] - 1) * P[i];
            if (m[i] <= S[i]) heap[0] = heap[--n];
            trim_sift(Tp, heap, n, 0);
        }
    } else {
        /* no memory for the heap: the scan itself */
        while (*total > M) {
            int arg = -1;
            double worst = -1;
            for (int i = 0; i < D; i++) {
                if (m[i] <= S[i]) continue;
                double Ti = (m[i] + S[i] - 1) * P[i];
                if (Ti > worst) {
                    worst = Ti;
                    arg = i;
                }
            }
            if (arg < 0) break;
            m[arg]--;
            (*total)--;
        }
    }
    free(heap);
    free(Tp);
    double T = 0;
    for (int i = 0; i < D; i++)
        T = MAL_MAX(T, (m[i] + S[i] - 1) * P[i]);
    return T;
}

int rp_out_of_time(ctx *c)
{
    if (!c->have_plan || !(c->deadline < INFINITY)) return 0;
    if (!c->timed_out && mal_now() >= c->deadline) c->timed_out = 1;
    return c->timed_out;
}

int rp_runs(double T, double P, int S, int M)
{
    if (!isfinite(P)) return -1;
    double f = floor(T / P * (1 + 1e-12) + 1e-9) - S + 1;
    if (f < S) return -1;
    return f >= M ? M : (int)f;
}

typedef struct blockinfo {
    int lo, hi;  /* healthy counts considered */
    double *P;   /* [hi - lo + 1] */
    int *S;
} blockinfo;

typedef struct evalctx {
    ctx *c;
    int k, H, M, hmax; /* hmax: longest healthy-only pipeline */
    blockinfo *b;
    int base, width; /* block DP states: sum of healthy counts in [base, base + width) */
    double wsum;     /* sum over blocks of their healthy-count ranges (work) */
    int exact;       /* the dynamic programme (else the price, feasible_price) */
    /* scratch */
    int *f, *g, *garg;  /* [hmax + 1], [H + 1], [H + 1] */
    int *dp, *nd, *arg; /* exact: [width], [width], [k * width] */
    int *hb;            /* price: [k] each block's healthy count */
    int *mt;            /* price: [wsum] each block's micro-batches by count */
    int hstar, rlim;    /* price: g(R) = g(R - hstar) + f(hstar) above rlim */
} evalctx;

/* Healthy-only pipelines within T: f(h) micro-batches for one of h groups,
 * g(R) the most for R = 0..upto groups (exact-R unbounded knapsack, argmax
 * garg). */
static void healthy_only(evalctx *e, int upto)
{
    const int NEG = -1;
    e->g[0] = 0;
    e->garg[0] = 0;
    for (int R = 1; R <= upto; R++) {
        int best = NEG, arg = 0;
        for (int h = 1; h <= e->hmax && h <= R; h++) {
            if (e->f[h] < 0 || e->g[R - h] < 0) continue;
            int v = e->g[R - h] + e->f[h];
            if (v > e->M) v = e->M;
            if (v > best) {
                best = v;
                arg = h;
            }
        }
        e->g[R] = best;
        e->garg[R] = arg;
    }
}

/* Can the pipelines run M micro-batches within T?  The argmax arrays are
 * left for the reconstruction. */
static int feasible_dp(evalctx *e, double T)
{
    ctx *c = e->c;
    c->work += (double)e->H * e->hmax + (double)e->width * e->wsum + 1000;
    const int NEG = -1;
    for (int h = 1; h <= e->hmax; h++)
        e->f[h] = rp_runs(T, c->hp_P[h], h, e->M);
    healthy_only(e, e->H);
    /* blocks: dp over the healthy groups they take */
    for (int s = 0; s < e->width; s++)
        e->dp[s] = NEG;
    e->dp[0] = 0; /* state s means base + s healthy taken; base = sum of lo */
    for (int i = 0; i < e->k; i++) {
        const blockinfo *bi = &e->b[i];
        for (int s = 0; s < e->width; s++)
            e->nd[s] = NEG;
        for (int s = 0; s < e->width; s++) {
            if (e->dp[s] < 0) continue;
            for (int h = bi->lo; h <= bi->hi; h++) {
                int s2 = s + h - bi->lo;
                if (s2 >= e->width || e->base + s2 > e->H) break;
                int m = rp_runs(T, bi->P[h - bi->lo], bi->S[h - bi->lo], e->M);
                if (m < 0) continue;
                int v = e->dp[s] + m;
                if (v > e->M) v = e->M;
                if (v > e->nd[s2]) {
                    e->nd[s2] = v;
                    e->arg[(size_t)i * e->width + s2] = h;
                }
            }
        }
        memcpy(e->dp, e->nd, (size_t)e->width * sizeof *e->dp);
    }
    for (int s = 0; s < e->width; s++) {
        int R = e->H - (e->base + s);
        if (e->dp[s] < 0 || R < 0 || e->g[R] < 0) continue;
        if (e->dp[s] + e->g[R] >= e->M) return 1;
    }
    return 0;
}

/* g(R) of the price rule: computed up to rlim, continued with h* beyond. */
static int g_at(const evalctx *e, long R)
{
    if (R <= e->rlim) return e->g[R];
    if (e->hstar <= 0) return -1;
    long q = (R - e->rlim + e->hstar - 1) / e->hstar;
    int base = e->g[R - q * e->hstar];
    if (base < 0) return -1;
    long v = base + q * (long)e->f[e->hstar];
    return v > e->M ? e->M : (int)v;
}

/* Every block takes the healthy count in its window that maximises
 * m(h) - lambda h (ties: the fewer), into e->hb; m from e->mt (the trial
 * step time's); *runs_out the blocks' micro-batches (capped at M).  The
 * healthy groups taken, or -1 when a block can run its S micro-batches with
 * none of its counts. */
static long price_pick(evalctx *e, double lambda, long *runs_out)
{
    long taken = 0, total = 0;
    const int *mt = e->mt;
    for (int i = 0; i < e->k; i++) {
        const blockinfo *bi = &e->b[i];
        int arg = -1, marg = 0;
        double best = -INFINITY;
        for (int h = bi->lo; h <= bi->hi; h++, mt++) {
            if (*mt < 0) continue;
            double v = *mt - lambda * h;
            if (v > best) {
                best = v;
                arg = h;
                marg = *mt;
            }
        }
        if (arg < 0) return -1;
        e->hb[i] = arg;
        taken += arg;
        total = MAL_MIN((long)e->M, total + marg);
    }
    *runs_out = total;
    return taken;
}

/* The price rule, for evaluations too large for the dynamic programme: a
 * healthy full group is worth lambda micro-batches, the most one runs in a
 * healthy-only pipeline (max f(h) / h); each block takes the count that
 * gains most at that price; when the blocks then want more groups than
 * there are, the price rises (bisection) until they fit; the rest form
 * healthy-only pipelines (g, exact).  Linear in the blocks; a feasible
 * allocation when it answers yes, so the plan it leads to is valid and its
 * time exact -- it may only miss a better split than the programme's. */
static int feasible_price(evalctx *e, double T)
{
    ctx *c = e->c;
    /* the best pipeline length h* by micro-batches per group; past
     * (h* - 1) hmax groups some best split has a pipeline of h* (of h* other
     * pipelines, some have lengths summing to a multiple of h*, and h*'s
     * replace them at no loss), so g is computed up to there only and
     * continued by g(R) = g(R - h*) + f(h*) (g_at) */
    double lambda = 0;
    e->hstar = 0;
    for (int h = 1; h <= e->hmax; h++) {
        e->f[h] = rp_runs(T, c->hp_P[h], h, e->M);
        if (e->f[h] >= 0 && (double)e->f[h] / h > lambda) {
            lambda = (double)e->f[h] / h;
            e->hstar = h;
        }
    }
    e->rlim = e->hstar ? (int)MAL_MIN((long)e->H, (long)(e->hstar - 1) * e->hmax + e->hstar) : 0;
    healthy_only(e, e->rlim);
    /* every block's micro-batches at every count, once for this T */
    int *mt = e->mt;
    for (int i = 0; i < e->k; i++)
        for (int j = 0; j <= e->b[i].hi - e->b[i].lo; j++)
            *mt++ = rp_runs(T, e->b[i].P[j], e->b[i].S[j], e->M);
    long runs_b, taken = price_pick(e, lambda, &runs_b);
    int picks = 1;
    if (taken > e->H) {
        /* at a price above M every block takes its least count (one more
         * group gains at most M micro-batches); the slopes that decide
         * differ by at least 1 / window^2, so 32 halvings separate them */
        double lo = lambda, hi = e->M + 1.0;
        picks++;
        if (price_pick(e, hi, &runs_b) > e->H) {
            c->work += (double)e->rlim * e->hmax + (picks + 1) * e->wsum + 1000;
            return 0;
        }
        for (int it = 0; it < 32 && hi - lo > 1e-9 * hi; it++, picks++) {
            double mid = 0.5 * (lo + hi);
            if (price_pick(e, mid, &runs_b) <= e->H)
                hi = mid;
            else
                lo = mid;
        }
        taken = price_pick(e, hi, &runs_b);
        picks++;
    }
    c->work += (double)e->rlim * e->hmax + (picks + 1) * e->wsum + 1000;
    if (taken < 0) return 0;
    int gR = g_at(e, e->H - taken);
    return gR >= 0 && runs_b + gR >= e->M;
}

static int feasible_at(evalctx *e, double T)
{
    return e->exact ? feasible_dp(e, T) : feasible_price(e, T);
}

/* the healthy-only periods h = 1..hmax, once per search */
static int healthy_periods(ctx *c, int hmax)
{
    if (!c->hp_P) {
        c->hp_P = malloc((size_t)(c->L + 1) * sizeof *c->hp_P);
        if (!c->hp_P) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        for (int h = 0; h <= c->L; h++)
            c->hp_P[h] = NAN;
    }
    for (int h = 1; h <= hmax; h++) {
        if (!isnan(c->hp_P[h])) continue;
        const centry *ce;
        int rc = rp_composition(c, h, NULL, 0, &ce);
        if (rc) return rc;
        c->hp_P[h] = ce->P;
    }
    return 0;
}

int rp_eval_blocks(ctx *c, int k, sgrp *const *sg, const int *ns, int window, double T_ub,
                   double *T_out, rp_eval *out)
{
    int rc = 0;
    evalctx e = {0};
    e.c = c;
    e.k = k;
    e.H = c->H;
    e.M = c->M;
    e.hmax = MAL_MIN(c->H, c->L);
    *T_out = INFINITY;
    if (out) memset(out, 0, sizeof *out);
    c->n_evals++;
    if ((rc = healthy_periods(c, e.hmax))) return rc;
    e.b = calloc((size_t)MAL_MAX(1, k), sizeof *e.b);
    if (!e.b) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");

    /* capacity (sum 1/y) and groups, for the bounds and the windows */
    double C = e.H / c->yh, Cb;
    long N = e.H;
    for (int i = 0; i < k; i++) {
        N += ns[i];
        for (int q = 0; q < ns[i]; q++)
            C += 1.0 / sg[i][q].y;
    }
    if (N > c->M) goto done; /* 1F1B: every stage needs a micro-batch */
    /* a healthy-only pipeline's length whose period sets the pace: the one
     * running the most micro-batches per healthy group at the bubble-free
     * bound (used only to centre the windows) */
    double T0 = c->L * (double)c->M / C;
    int href = 1;
    if (window >= 0) {
        double best = -1;
        for (int h = 1; h <= e.hmax; h++) {
            if (!isfinite(c->hp_P[h])) continue;
            double per = (T0 * 1.3 / c->hp_P[h] - h + 1) / h;
            if (per > best) {
                best = per;
                href = h;
            }
        }
    }
    /* many blocks: narrower windows keep the dynamic programme's states
     * (blocks x window) near the number of healthy groups */
    if (window > 0 && k > 64) window = MAL_MAX(1, window * 64 / k);
    long sum_lo = 0, sum_hi = 0;
    for (int i = 0; i < k; i++) {
        blockinfo *bi = &e.b[i];
        int top = MAL_MIN(e.H, c->L - ns[i]);
        if (top < 0) goto done; /* more stages than layers */
        if (window < 0) {
            bi->lo = 0;
            bi->hi = top;
        } else {
            /* restricted: near the count that gives this pipeline the
             * capacity of a reference healthy-only pipeline */
            Cb = 0;
            for (int q = 0; q < ns[i]; q++)
                Cb += 1.0 / sg[i][q].y;
            int mid = (int)lround(href - Cb);
            bi->lo = MAL_MAX(0, mid - window);
            bi->hi = MAL_MIN(top, mid + window);
            if (bi->hi < bi->lo) bi->lo = bi->hi = MAL_MAX(0, MAL_MIN(top, mid));
        }
        sum_lo += bi->lo;
        sum_hi += bi->hi;
    }
    /* The programme's table is blocks x width: above RP_DP_CELLS the price.
     * Its blocks may take fewer healthy groups than their windows, down to
     * none: where healthy groups are scarce (a straggler in most nodes) the
     * windows' lower ends alone can ask for more than there are, which
     * makes the grouping infeasible for the programme -- at the price's
     * scale (blocks x healthy groups above the same bound) the price
     * evaluates it with the wider windows instead. */
    e.width = (int)(MAL_MIN((long)e.H, sum_hi) - sum_lo + 1);
    e.exact = (double)MAL_MAX(1, k) * MAL_MAX(1, e.width) <= RP_DP_CELLS &&
              !(sum_lo > e.H && (double)MAL_MAX(1, k) * (e.H + 1) > RP_DP_CELLS);
    if (!e.exact) {
        for (int i = 0; i < k; i++)
            e.b[i].lo = 0;
        sum_lo = 0;
    }
    for (int i = 0; i < k; i++) {
        blockinfo *bi = &e.b[i];
        int n = bi->hi - bi->lo + 1, any = 0;
        bi->P = malloc((size_t)n * sizeof *bi->P);
        bi->S = malloc((size_t)n * sizeof *bi->S);
        if (!bi->P || !bi->S) {
            rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
            goto done;
        }
        for (int h = bi->lo; h <= bi->hi; h++) {
            const centry *ce;
            if ((rc = rp_composition(c, h, sg[i], ns[i], &ce))) goto done;
            bi->P[h - bi->lo] = ce->P;
            bi->S[h - bi->lo] = ce->S;
            any |= isfinite(ce->P);
        }
        e.wsum += n;
        /* no count fits this block's pipeline in memory: no T will do */
        if (!e.exact && !any) goto done;
    }
    if (sum_lo > e.H) goto done;
    e.base = (int)sum_lo;
    e.width = (int)(MAL_MIN((long)e.H, sum_hi) - sum_lo + 1);
    e.f = malloc((size_t)(e.hmax + 1) * sizeof *e.f);
    e.g = malloc((size_t)(e.H + 1) * sizeof *e.g);
    e.garg = malloc((size_t)(e.H + 1) * sizeof *e.garg);
    if (e.exact) {
        e.dp = malloc((size_t)e.width * sizeof *e.dp);
        e.nd = malloc((size_t)e.width * sizeof *e.nd);
        e.arg = malloc((size_t)MAL_MAX(1, k) * e.width * sizeof *e.arg);
    } else {
        e.hb = malloc((size_t)MAL_MAX(1, k) * sizeof *e.hb);
        e.mt = malloc((size_t)MAL_MAX(1.0, e.wsum) * sizeof *e.mt);
    }
    if (!e.f || !e.g || !e.garg || (e.exact ? !e.dp || !e.nd || !e.arg : !e.hb || !e.mt)) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }

    /* bisection: lo infeasible, hi feasible.  T >= L M / C (all work at full
     * capacity, no bubble) is a lower bound.  Out of time, the evaluation
     * gives up (INFINITY: not better). */
    double lo = T0 * (1 - 1e-9), hi;
    if (isfinite(T_ub)) {
        hi = T_ub * (1 - RP_TOL);
        if (hi <= lo || !feasible_at(&e, hi)) goto done; /* cannot beat T_ub */
    } else {
        hi = lo * 2;
        int found = 0;
        for (int it = 0; it < 200 && !found; it++) {
            if (rp_out_of_time(c)) goto done;
            if (feasible_at(&e, hi))
                found = 1;
            else {
                lo = hi;
                hi *= 2;
            }
        }
        if (!found) goto done;
    }
    for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; it++) {
        if (rp_out_of_time(c)) goto done;
        double mid = 0.5 * (lo + hi);
        if (feasible_at(&e, mid))
            hi = mid;
        else
            lo = mid;
    }
    feasible_at(&e, hi);
    /* reconstruct: each block's healthy count, the healthy-only pipelines */
    int *hb = malloc((size_t)MAL_MAX(1, k) * sizeof *hb);
    int R;
    if (!hb) {
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    if (e.exact) {
        /* the programme's best state, then back through the blocks */
        int best_s = -1;
        for (int s = 0; s < e.width; s++) {
            int Rs = e.H - (e.base + s);
            if (e.dp[s] < 0 || Rs < 0 || e.g[Rs] < 0) continue;
            if (e.dp[s] + e.g[Rs] >= e.M) {
                best_s = s;
                break;
            }
        }
        if (best_s < 0) {
            free(hb);
            rc = MAL_ERR(MAL_ELP, "replan: internal error: lost the feasible state");
            goto done;
        }
        R = e.H - (e.base + best_s);
        for (int i = k - 1, s = best_s; i >= 0; i--) {
            hb[i] = e.arg[(size_t)i * e.width + s];
            s -= hb[i] - e.b[i].lo;
        }
    } else {
        /* the price's counts at hi */
        long taken = 0;
        for (int i = 0; i < k; i++)
            taken += hb[i] = e.hb[i];
        R = (int)(e.H - taken);
    }
    int n_hp = 0;
    int *hp = malloc((size_t)MAL_MAX(1, R) * sizeof *hp);
    if (!hp) {
        free(hb);
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    int r = R;
    if (!e.exact) /* the price's g beyond rlim: pipelines of h* */
        for (; r > e.rlim; r -= e.hstar)
            hp[n_hp++] = e.hstar;
    for (; r > 0; r -= e.garg[r])
        hp[n_hp++] = e.garg[r];
    /* micro-batches: as many as fit in hi, then trim the excess from the
     * slowest pipelines */
    int D = k + n_hp;
    int *m = malloc((size_t)MAL_MAX(1, D) * sizeof *m), *Sv = malloc((size_t)MAL_MAX(1, D) * sizeof *Sv);
    double *Pv = malloc((size_t)MAL_MAX(1, D) * sizeof *Pv);
    if (!m || !Sv || !Pv) {
        free(hb);
        free(hp);
        free(m);
        free(Sv);
        free(Pv);
        rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
        goto done;
    }
    long total = 0;
    for (int i = 0; i < D; i++) {
        if (i < k) {
            Pv[i] = e.b[i].P[hb[i] - e.b[i].lo];
            Sv[i] = e.b[i].S[hb[i] - e.b[i].lo];
        } else {
            Sv[i] = hp[i - k];
            Pv[i] = c->hp_P[Sv[i]];
        }
        m[i] = rp_runs(hi, Pv[i], Sv[i], e.M);
        total += m[i];
    }
    double T = rp_trim(D, Pv, Sv, m, e.M, &total);
    free(m);
    free(Sv);
    free(Pv);
    if (total != e.M) {
        free(hb);
        free(hp);
        rc = MAL_ERR(MAL_ELP, "replan: internal error: %ld micro-batches instead of %d", total,
                     e.M);
        goto done;
    }
    *T_out = T;
    if (out) {
        out->T = T;
        out->k = k;
        out->h = hb;
        out->n_hp = n_hp;
        out->hp = hp;
    } else {
        free(hb);
        free(hp);
    }
done:
    if (e.b)
        for (int i = 0; i < k; i++) {
            free(e.b[i].P);
            free(e.b[i].S);
        }
    free(e.b);
    free(e.f);
    free(e.g);
    free(e.garg);
    free(e.dp);
    free(e.nd);
    free(e.arg);
    free(e.hb);
    free(e.mt);
    return rc;
}
