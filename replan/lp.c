/* The planner's two integer programs, formulated for lp_solve 5.5:
 *   layers per stage within one pipeline (min max stage time, memory bounds);
 *   micro-batches across pipelines (min max pipeline time with the bubble).
 * lp_solve reports objectives with rounding noise, so the results returned
 * here are recomputed exactly from the integer solution. */
#include <lpsolve/lp_lib.h>
#include <math.h>
#include <stdlib.h>

#include "base/mal.h"
#include "replan.h"

/* Common solver setup: silent, exact integer gaps. */
static lprec *new_lp(int ncols)
{
    lprec *lp = make_lp(0, ncols);
    if (!lp) return NULL;
    set_verbose(lp, NEUTRAL); /* lp_solve prints to stdout otherwise */
    set_outputfile(lp, "");
    set_minim(lp);
    set_add_rowmode(lp, TRUE);
    /* objective values are multiples of the rates: keep the gaps tiny so
     * that branch and bound proves optimality instead of stopping early */
    set_mip_gap(lp, TRUE, 1e-9);
    set_mip_gap(lp, FALSE, 1e-9);
    return lp;
}

int mal_lp_layers(int S, const double *y, const int *ub, int L, int *l_out, double *P_out)
{
    *P_out = INFINITY;
    if (S < 1 || S > L) return 0;
    long cap = 0;
    for (int j = 0; j < S; j++) {
        if (ub[j] < 1) return 0;
        cap += ub[j];
    }
    if (cap < L) return 0;

    int rc = 0;
    int n = S + 1; /* columns 1..S: l_j; column S+1: P */
    REAL *row = malloc((size_t)(n + 1) * sizeof *row);
    int *col = malloc((size_t)(n + 1) * sizeof *col);
    REAL *sol = malloc((size_t)(n + 1) * sizeof *sol);
    lprec *lp = new_lp(n);
    if (!row || !col || !sol || !lp) {
        rc = MAL_ERR(MAL_ENOMEM, "lp_solve: cannot create the layer program (%d stages)", S);
        goto cleanup;
    }
    /* objective: minimise P */
    col[0] = S + 1;
    row[0] = 1.0;
    if (!set_obj_fnex(lp, 1, row, col)) goto lp_fail;
    /* y_j l_j - P <= 0: no stage is slower than the period */
    for (int j = 0; j < S; j++) {
        col[0] = j + 1;
        row[0] = y[j];
        col[1] = S + 1;
        row[1] = -1.0;
        if (!add_constraintex(lp, 2, row, col, LE, 0.0)) goto lp_fail;
    }
    /* every layer is held exactly once */
    for (int j = 0; j < S; j++) {
        col[j] = j + 1;
        row[j] = 1.0;
    }
    if (!add_constraintex(lp, S, row, col, EQ, (REAL)L)) goto lp_fail;
    set_add_rowmode(lp, FALSE);
    for (int j = 0; j < S; j++) {
        set_int(lp, j + 1, TRUE);
        /* memory: at most ub_j layers fit on stage j */
        set_bounds(lp, j + 1, 1.0, (REAL)MAL_MIN(ub[j], L));
    }
    set_lowbo(lp, S + 1, 0.0);
    int ret = solve(lp);
    if (ret == INFEASIBLE) goto cleanup;
    if (ret != OPTIMAL && ret != PRESOLVED) {
        rc =
            MAL_ERR(MAL_ELP, "lp_solve: layer program (%d stages, %d layers) failed with status %d",
                    S, L, ret);
        goto cleanup;
    }
    if (!get_variables(lp, sol)) goto lp_fail;
    double P = 0;
    long sum = 0;
    for (int j = 0; j < S; j++) {
        l_out[j] = (int)lround(sol[j]);
        sum += l_out[j];
        P = MAL_MAX(P, y[j] * l_out[j]);
    }
    if (sum != L) {
        rc = MAL_ERR(MAL_ELP, "lp_solve: layer program returned %ld layers instead of %d", sum, L);
        goto cleanup;
    }
    *P_out = P;
    goto cleanup;
lp_fail:
    rc = MAL_ERR(MAL_ELP, "lp_solve: cannot build the layer program (%d stages)", S);
cleanup:
    if (lp) delete_lp(lp);
    free(row);
    free(col);
    free(sol);
    return rc;
}

int mal_lp_microbatches(int n, const double *P, const int *S, const int *count, int M, int *m_out,
                        double *T_out)
{
    *T_out = INFINITY;
    long need = 0;
    for (int c = 0; c < n; c++)
        need += (long)count[c] * S[c];
    if (n < 1 || need > M) return 0;

    int rc = 0;
    int ncol = n + 1; /* columns 1..n: m_c; column n+1: T */
    REAL *row = malloc((size_t)(ncol + 1) * sizeof *row);
    int *col = malloc((size_t)(ncol + 1) * sizeof *col);
    REAL *sol = malloc((size_t)(ncol + 1) * sizeof *sol);
    lprec *lp = new_lp(ncol);
    if (!row || !col || !sol || !lp) {
        rc = MAL_ERR(MAL_ENOMEM, "lp_solve: cannot create the micro-batch program (%d classes)", n);
        goto cleanup;
    }
    col[0] = n + 1;
    row[0] = 1.0;
    if (!set_obj_fnex(lp, 1, row, col)) goto lp_fail;
    /* (m_c + S_c - 1) P_c <= T: the fill/drain bubble counts */
    for (int c = 0; c < n; c++) {
        col[0] = c + 1;
        row[0] = P[c];
        col[1] = n + 1;
        row[1] = -1.0;
        if (!add_constraintex(lp, 2, row, col, LE, -P[c] * (S[c] - 1))) goto lp_fail;
    }
    /* enough micro-batches for the global batch (the caller trims any
     * excess; trimming never makes a pipeline slower) */
    for (int c = 0; c < n; c++) {
        col[c] = c + 1;
        row[c] = count[c];
    }
    if (!add_constraintex(lp, n, row, col, GE, (REAL)M)) goto lp_fail;
    set_add_rowmode(lp, FALSE);
    for (int c = 0; c < n; c++) {
        set_int(lp, c + 1, TRUE);
        /* m_c >= S_c: 1F1B needs a micro-batch per stage */
        set_bounds(lp, c + 1, (REAL)S[c], (REAL)M);
    }
    set_lowbo(lp, n + 1, 0.0);
    int ret = solve(lp);
    if (ret == INFEASIBLE) goto cleanup;
    if (ret != OPTIMAL && ret != PRESOLVED) {
        rc = MAL_ERR(
            MAL_ELP,
            "lp_solve: micro-batch program (%d classes, %d micro-batches) failed with status %d", n,
            M, ret);
        goto cleanup;
    }
    if (!get_variables(lp, sol)) goto lp_fail;
    double T = 0;
    for (int c = 0; c < n; c++) {
        m_out[c] = (int)lround(sol[c]);
        T = MAL_MAX(T, (m_out[c] + S[c] - 1) * P[c]);
    }
    *T_out = T;
    goto cleanup;
lp_fail:
    rc = MAL_ERR(MAL_ELP, "lp_solve: cannot build the micro-batch program (%d classes)", n);
cleanup:
    if (lp) delete_lp(lp);
    free(row);
    free(col);
    free(sol);
    return rc;
}
