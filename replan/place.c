/* Link-aware placement (README "Links"): after the search has chosen the
 * plan's groups, stages and pipelines by compute, ranks that are alike for
 * compute -- same node, same floored rate -- are exchanged so that slow
 * links carry the least traffic (a slow link between two pipelines' ranks
 * rather than inside a TP group or across a stage boundary), every stage
 * gets the warm-up depth that keeps a slow boundary from cascading, and
 * the micro-batches move away from pipelines a slow link still slows.
 * Runs only where communication is priced and some link is slow (or the
 * profile charges every message): otherwise the plan is the search's,
 * byte for byte. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mal.h"
#include "replan.h"
#include "search.h"

typedef struct place {
    const mal_replan_input *in;
    mal_plan *plan;
    int world;
    double *T;  /* [n_pipelines] */
    int **warm; /* [n_pipelines][S] */
    int *key;   /* [world] class of a rank (same node, same floored rate) */
    int *pipe;  /* [world] pipeline of a rank (-1 suspended or absent) */
    int **slot; /* [world] where the rank is written in the plan */
} place;

static int eval_pipe(place *pc, int i)
{
    const mal_replan_input *in = pc->in;
    return mal_cost_pipeline_links(&pc->plan->pipelines[i], in->profile, in->cluster, in->rates,
                                   in->links, 1, pc->warm[i], &pc->T[i], NULL);
}

static double objective(const place *pc)
{
    double J = 0;
    for (int i = 0; i < pc->plan->n_pipelines; i++)
        J = MAL_MAX(J, pc->T[i]);
    return J + mal_cost_dp_comm(pc->plan, pc->in->profile, pc->in->cluster, pc->in->links);
}

static void index_ranks(place *pc)
{
    mal_plan *pl = pc->plan;
    for (int r = 0; r < pc->world; r++) {
        pc->pipe[r] = -1;
        pc->slot[r] = NULL;
    }
    for (int i = 0; i < pl->n_pipelines; i++)
        for (int j = 0; j < pl->pipelines[i].n_stages; j++) {
            mal_plan_stage *st = &pl->pipelines[i].stages[j];
            for (int k = 0; k < st->n_ranks; k++)
                if (st->ranks[k] >= 0 && st->ranks[k] < pc->world) {
                    pc->pipe[st->ranks[k]] = i;
                    pc->slot[st->ranks[k]] = &st->ranks[k];
                }
        }
    for (int q = 0; q < pl->n_suspended; q++)
        if (pl->suspended[q] >= 0 && pl->suspended[q] < pc->world)
            pc->slot[pl->suspended[q]] = &pl->suspended[q];
}

static void swap_ranks(place *pc, int a, int b)
{
    int *sa = pc->slot[a], *sb = pc->slot[b];
    *sa = b;
    *sb = a;
    pc->slot[a] = sb;
    pc->slot[b] = sa;
    int t = pc->pipe[a];
    pc->pipe[a] = pc->pipe[b];
    pc->pipe[b] = t;
}

/* Re-evaluate the pipelines of a and b after a swap (or its undo). */
static int reeval(place *pc, int a, int b)
{
    int rc = 0;
    if (pc->pipe[a] >= 0) rc = eval_pipe(pc, pc->pipe[a]);
    if (!rc && pc->pipe[b] >= 0 && pc->pipe[b] != pc->pipe[a]) rc = eval_pipe(pc, pc->pipe[b]);
    return rc;
}

/* The ends of the slow links that sit in the plan (the ranks worth
 * moving), into ends[]; their count. */
static int link_ends(const place *pc, int *ends)
{
    const mal_links *ln = pc->in->links;
    int n = 0;
    for (int i = 0; ln && i < ln->n; i++) {
        if (mal_cost_floor(ln->l[i].rate) <= 1.0) continue;
        for (int e = 0; e < 2; e++) {
            int a = e ? ln->l[i].b : ln->l[i].a, seen = 0;
            for (int q = 0; q < n; q++)
                seen |= ends[q] == a;
            if (!seen && pc->slot[a]) ends[n++] = a;
        }
    }
    return n;
}

/* Whether exchanging a and b can change anything (alike, not both idle). */
static int movable(const place *pc, int a, int b)
{
    return b != a && pc->slot[b] && pc->key[b] == pc->key[a] &&
           (pc->pipe[a] >= 0 || pc->pipe[b] >= 0);
}

/* Exchanges of a slow link's ends with ranks of their classes, best first,
 * until none improves (each round tries every exchange; ties: the first
 * in rank order, so the result is deterministic).  Where no single
 * exchange improves, pairs of them, both moving a link's end: bringing
 * both ends of a link together into one group of a short pipeline takes
 * two (the budget keeps this to small clusters). */
#define RP_PLACE_PAIR_BUDGET 4096
static int exchanges(place *pc, double *J)
{
    int *ends = malloc((size_t)2 * (pc->in->links ? pc->in->links->n : 0) * sizeof *ends + 1);
    if (!ends) return MAL_ERR(MAL_ENOMEM, "replan: out of memory");
    int rc = 0;
    for (int round = 0; round < 4 * pc->world; round++) {
        int ne = link_ends(pc, ends);
        double best = *J * (1 - RP_TOL);
        int ba = -1, bb = -1, bc = -1, bd = -1;
        for (int i = 0; i < ne; i++) {
            int a = ends[i];
            for (int b = 0; b < pc->world; b++) {
                if (!movable(pc, a, b)) continue;
                swap_ranks(pc, a, b);
                rc = reeval(pc, a, b);
                double Jn = rc ? INFINITY : objective(pc);
                swap_ranks(pc, a, b);
                int rc2 = reeval(pc, a, b);
                if (rc || (rc = rc2)) goto done;
                if (Jn < best) {
                    best = Jn;
                    ba = a;
                    bb = b;
                }
            }
        }
        if (ba < 0 && (long)ne * ne * pc->world * pc->world <= RP_PLACE_PAIR_BUDGET)
            for (int i = 0; i < ne; i++)
                for (int b = 0; b < pc->world; b++) {
                    int a = ends[i];
                    if (!movable(pc, a, b)) continue;
                    swap_ranks(pc, a, b);
                    for (int k = i + 1; k < ne && !rc; k++)
                        for (int d = 0; d < pc->world && !rc; d++) {
                            int c = ends[k];
                            if (!movable(pc, c, d) || d == a || d == b || c == b) continue;
                            swap_ranks(pc, c, d);
                            double Jn = INFINITY;
                            if (!(rc = reeval(pc, a, b)) && !(rc = reeval(pc, c, d)))
                                Jn = objective(pc);
                            swap_ranks(pc, c, d);
                            if (!rc) rc = reeval(pc, c, d);
                            if (Jn < best) {
                                best = Jn;
                                ba = a, bb = b, bc = c, bd = d;
                            }
                        }
                    swap_ranks(pc, a, b);
                    if (rc || (rc = reeval(pc, a, b))) goto done;
                }
        if (ba < 0) break;
        swap_ranks(pc, ba, bb);
        if ((rc = reeval(pc, ba, bb))) goto done;
        if (bc >= 0) {
            swap_ranks(pc, bc, bd);
            if ((rc = reeval(pc, bc, bd))) goto done;
        }
        *J = objective(pc);
    }
done:
    free(ends);
    return rc;
}

/* Micro-batches from the pipeline that finishes last to the one that
 * finishes first after taking it, while the step gets shorter. */
static int resplit(place *pc, double *J)
{
    mal_plan *pl = pc->plan;
    int D = pl->n_pipelines, rc;
    double dp = mal_cost_dp_comm(pl, pc->in->profile, pc->in->cluster, pc->in->links);
    for (int it = 0; it < 4 * mal_plan_n_micro_batches(pl) + 4; it++) {
        int hi = 0;
        for (int i = 1; i < D; i++)
            if (pc->T[i] > pc->T[hi]) hi = i;
        mal_plan_pipeline *ph = &pl->pipelines[hi];
        if (ph->micro_batches <= ph->n_stages) break;
        double Th = pc->T[hi];
        ph->micro_batches--;
        if ((rc = eval_pipe(pc, hi))) return rc;
        int lo = -1;
        double Tlo = INFINITY, keep = pc->T[hi];
        for (int i = 0; i < D; i++) {
            if (i == hi) continue;
            double Ti = pc->T[i];
            pl->pipelines[i].micro_batches++;
            if ((rc = eval_pipe(pc, i))) return rc;
            if (pc->T[i] < Tlo * (1 - RP_TOL)) {
                Tlo = pc->T[i];
                lo = i;
            }
            pl->pipelines[i].micro_batches--;
            pc->T[i] = Ti;
        }
        double others = 0;
        for (int i = 0; i < D; i++)
            if (i != hi && i != lo) others = MAL_MAX(others, pc->T[i]);
        double Jn = MAL_MAX(others, MAL_MAX(keep, Tlo)) + dp;
        if (lo < 0 || !(Jn < *J * (1 - RP_TOL))) {
            ph->micro_batches++;
            pc->T[hi] = Th;
            if ((rc = eval_pipe(pc, hi))) return rc;
            break;
        }
        pl->pipelines[lo].micro_batches++;
        if ((rc = eval_pipe(pc, lo))) return rc;
        *J = objective(pc);
    }
    return 0;
}

typedef struct rk {
    int node;
    double x;
    int r;
} rk;

static int cmp_rk(const void *a, const void *b)
{
    const rk *u = a, *v = b;
    if (u->node != v->node) return u->node < v->node ? -1 : 1;
    if (u->x != v->x) return u->x < v->x ? -1 : 1;
    return (u->r > v->r) - (u->r < v->r);
}

int rp_place_needed(const mal_replan_input *in)
{
    const mal_profile *p = in->profile;
    return p->link_bandwidth > 0 && p->layer_time > 0 &&
           (mal_links_any(in->links) || !p->comm_in_alpha);
}

int rp_place(const mal_replan_input *in, mal_plan *plan, double *J_out)
{
    place pc = {0};
    int rc = 0, D = plan->n_pipelines;
    pc.in = in;
    pc.plan = plan;
    pc.world = in->cluster->world_size;
    pc.T = calloc((size_t)MAL_MAX(1, D), sizeof *pc.T);
    pc.warm = calloc((size_t)MAL_MAX(1, D), sizeof *pc.warm);
    pc.key = malloc((size_t)pc.world * sizeof *pc.key);
    pc.pipe = malloc((size_t)pc.world * sizeof *pc.pipe);
    pc.slot = malloc((size_t)pc.world * sizeof *pc.slot);
    rk *ks = malloc((size_t)pc.world * sizeof *ks);
    if (!pc.T || !pc.warm || !pc.key || !pc.pipe || !pc.slot || !ks) goto oom;
    for (int i = 0; i < D; i++)
        if (!(pc.warm[i] = calloc((size_t)plan->pipelines[i].n_stages, sizeof(int)))) goto oom;
    /* classes: ranks of one node whose floored rates are equal are alike
     * for compute and memory (a node is of one device type) */
    for (int r = 0; r < pc.world; r++)
        ks[r] = (rk){in->cluster->node_of[r], mal_cost_floor(in->rates[r]), r};
    qsort(ks, (size_t)pc.world, sizeof *ks, cmp_rk);
    for (int i = 0, k = -1; i < pc.world; i++) {
        if (i == 0 || ks[i].node != ks[i - 1].node || ks[i].x != ks[i - 1].x) k++;
        pc.key[ks[i].r] = k;
    }
    index_ranks(&pc);
    for (int i = 0; i < D && !rc; i++)
        rc = eval_pipe(&pc, i);
    if (rc) goto done;
    double J = objective(&pc);
    if ((rc = exchanges(&pc, &J)) || (rc = resplit(&pc, &J))) goto done;
    for (int i = 0; i < D; i++) {
        mal_plan_pipeline *pl = &plan->pipelines[i];
        for (int j = 0; j < pl->n_stages; j++)
            pl->stages[j].warmup = pc.warm[i][j] > MAL_MIN(pl->n_stages - j - 1, pl->micro_batches)
                                       ? pc.warm[i][j]
                                       : 0;
        pl->predicted_time = pc.T[i] * in->profile->layer_time + in->profile->sync_time;
    }
    plan->predicted_step_time = J * in->profile->layer_time + in->profile->sync_time;
    *J_out = J;
    goto done;
oom:
    rc = MAL_ERR(MAL_ENOMEM, "replan: out of memory");
done:
    for (int i = 0; pc.warm && i < D; i++)
        free(pc.warm[i]);
    free(pc.warm);
    free(pc.T);
    free(pc.key);
    free(pc.pipe);
    free(pc.slot);
    free(ks);
    return rc;
}
