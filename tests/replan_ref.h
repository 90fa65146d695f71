/* Exact solvers of the planner's two integer programs, written for the
 * tests independently of replan/ (tests/test_replan.c checks lp_solve
 * against them, tests/test_replan_exact.c builds its reference on them). */
#ifndef MAL_TEST_REPLAN_REF_H
#define MAL_TEST_REPLAN_REF_H

#include <math.h>
#include <stdlib.h>

static int ref_cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* min over integer 1 <= l_j <= ub_j, sum l = L of max y_j l_j */
static inline double exact_layers(int S, const double *y, const int *ub, int L)
{
    if (S > L) return INFINITY;
    double cand[4096];
    int n = 0;
    for (int j = 0; j < S; j++)
        for (int l = 1; l <= ub[j] && l <= L && n < 4096; l++)
            cand[n++] = y[j] * l;
    qsort(cand, (size_t)n, sizeof *cand, ref_cmp_dbl);
    for (int i = 0; i < n; i++) {
        double P = cand[i];
        long sum = 0;
        int ok = 1;
        for (int j = 0; j < S; j++) {
            long c = (long)floor(P / y[j] + 1e-9);
            if (c > ub[j]) c = ub[j];
            if (c < 1) ok = 0;
            sum += c;
        }
        if (ok && sum >= L) return P;
    }
    return INFINITY;
}

/* min over integer m_i >= S_i, sum m = M of max (m_i + S_i - 1) P_i */
static inline double exact_mb(int n, const double *P, const int *S, int M)
{
    long need = 0;
    for (int i = 0; i < n; i++)
        need += S[i];
    if (need > M) return INFINITY;
    double best = INFINITY;
    for (int i = 0; i < n; i++)
        for (int m = S[i]; m <= M; m++) {
            double T = (m + S[i] - 1) * P[i];
            if (T >= best) break;
            long tot = 0;
            int ok = 1;
            for (int q = 0; q < n && ok; q++) {
                long c = (long)floor(T / P[q] + 1e-9) - S[q] + 1;
                if (c < S[q]) ok = 0;
                tot += c;
            }
            if (ok && tot >= M) best = T;
        }
    return best;
}

#endif /* MAL_TEST_REPLAN_REF_H */
