/* The per-link monitor: an active probe of the links the plan in force
 * uses, separated from compute and from waiting on a slow peer.
 *
 * Timing the messages training sends does not measure a link: a receive
 * waits for the sender to finish its compute, so on a shared machine it
 * reads the peer's schedule (a stage boundary with nothing injected read
 * 1.26x on one link and 0.2-0.6x on its neighbour).  So every K steps, at
 * the step boundary after the step-wide all-reduce, the ranks run a
 * ping-pong of a fixed size with each peer they share traffic with: stage
 * neighbours (the pairs the 1F1B schedule sends between), the members of
 * a TP group, and the ranks of other pipelines holding some of the same
 * layers (the gradient sum).  A handshake first makes both sides ready
 * (the responder has posted its receives before it answers), so the timed
 * burst (MAL_LINK_PROBE_BURST messages and a 1-byte answer) is the
 * transfers, not the peer's compute; the least of MAL_LINK_PROBE_REPS
 * bursts, spread over the probe, is the pair's figure (a descheduled rank
 * only ever makes one slower).
 *
 * The pairs run in rounds, a rank in at most one pair per round (a greedy
 * edge colouring every rank computes alike from the plan); each rank walks
 * its pairs in round order, so a rank waits only on one in the same or an
 * earlier round, and the earliest waiting pair always proceeds: no cycle.
 *
 * Rank 0 gathers the times and rates each pair: its least time over the
 * last MAL_LINK_PROBE_KEEP probes against the median pair's of its class
 * (both ends on one node, or on two: different kinds of links), so load
 * that slows every link alike is no slow link.  The rates feed a re-plan
 * policy of their own over the pairs (replan/policy.h, one sample per
 * probe, on a log scale: below); a link that moved advises a re-plan at
 * the next check step (monitor.c), which plans for the links as measured
 * (change.c).  --inject-link stretches the probe's bursts between its two
 * ranks like every other message between them (monitor.c).
 *
 * The same ping-pong measures every pair's latency and bandwidth for
 * malleus-train --profile (mal_linkprobe_figures).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mal.h"
#include "comm/comm.h"
#include "replan/policy.h"
#include "replan/replan.h"
#include "train_internal.h"

/* Tags of the probe's messages: above any micro-batch's (pipeline.c) */
enum { TAG_HELLO = 30001, TAG_PING = 30002, TAG_PONG = 30003 };

static int cmp_pair(const void *x, const void *y)
{
    const int *a = x, *b = y;
    return a[0] != b[0] ? (a[0] > b[0]) - (a[0] < b[0]) : (a[1] > b[1]) - (a[1] < b[1]);
}

/* Add pair {x, y} to list[2 n] (duplicates are removed later). */
static int add_pair(int **list, int *n, int *cap, int x, int y)
{
    if (x == y) return 0;
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        int *p = realloc(*list, sizeof *p * 2 * (size_t)nc);
        if (!p) return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory");
        *list = p;
        *cap = nc;
    }
    (*list)[2 * *n] = x < y ? x : y;
    (*list)[2 * *n + 1] = x < y ? y : x;
    (*n)++;
    return 0;
}

/* The pairs of the plan: a TP group's members, the pairs across each stage
 * boundary (receiver r of the next stage gets activations from sender
 * r mod a, gradients go back from i mod b to i), and the ranks of two
 * pipelines that hold a layer in common. */
static int plan_pairs(const mal_plan *pl, int **out, int *n_out)
{
    int *list = NULL, n = 0, cap = 0, rc = 0;
    for (int p = 0; p < pl->n_pipelines && !rc; p++) {
        const mal_plan_pipeline *pp = &pl->pipelines[p];
        for (int s = 0; s < pp->n_stages && !rc; s++) {
            const mal_plan_stage *st = &pp->stages[s];
            for (int i = 0; i < st->n_ranks && !rc; i++)
                for (int j = i + 1; j < st->n_ranks && !rc; j++)
                    rc = add_pair(&list, &n, &cap, st->ranks[i], st->ranks[j]);
            if (s + 1 < pp->n_stages) {
                const mal_plan_stage *nx = &pp->stages[s + 1];
                for (int r = 0; r < nx->n_ranks && !rc; r++)
                    rc = add_pair(&list, &n, &cap, st->ranks[r % st->n_ranks], nx->ranks[r]);
                for (int i = 0; i < st->n_ranks && !rc; i++)
                    rc = add_pair(&list, &n, &cap, st->ranks[i], nx->ranks[i % nx->n_ranks]);
            }
            for (int q = p + 1; q < pl->n_pipelines && !rc; q++) {
                const mal_plan_pipeline *pq = &pl->pipelines[q];
                for (int t = 0; t < pq->n_stages && !rc; t++) {
                    const mal_plan_stage *so = &pq->stages[t];
                    if (MAL_MIN(so->layer_end, st->layer_end) <=
                        MAL_MAX(so->layer_begin, st->layer_begin))
                        continue;
                    for (int i = 0; i < st->n_ranks && !rc; i++)
                        for (int j = 0; j < so->n_ranks && !rc; j++)
                            rc = add_pair(&list, &n, &cap, st->ranks[i], so->ranks[j]);
                }
            }
        }
    }
    if (rc) {
        free(list);
        return rc;
    }
    if (n) qsort(list, (size_t)n, 2 * sizeof *list, cmp_pair);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || list[2 * i] != list[2 * (m - 1)] ||
            list[2 * i + 1] != list[2 * (m - 1) + 1]) {
            list[2 * m] = list[2 * i];
            list[2 * m + 1] = list[2 * i + 1];
            m++;
        }
    *out = list;
    *n_out = m;
    return 0;
}

/* round[n]: a round for each of pairs[2 n], a rank in at most one pair
 * per round (greedy, in the pairs' order: every rank computes the same). */
static int colour(const int *pairs, int n, int world, int *round)
{
    /* busy[r * (2n + 1) + k]: rank r has a pair in round k (at most 2n
     * rounds are ever needed) */
    size_t stride = (size_t)(2 * n + 1);
    unsigned char *busy = calloc((size_t)world * stride, 1);
    if (!busy) return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory");
    for (int i = 0; i < n; i++) {
        size_t a = (size_t)pairs[2 * i] * stride, b = (size_t)pairs[2 * i + 1] * stride;
        int k = 0;
        while (busy[a + (size_t)k] || busy[b + (size_t)k])
            k++;
        busy[a + (size_t)k] = busy[b + (size_t)k] = 1;
        round[i] = k;
    }
    free(busy);
    return 0;
}

/* A link rate on the policy's scale, and back (rates below 1 are healthy
 * links alike). */
static double to_log(double rate)
{
    return isnan(rate) ? rate : 1.0 + log2(MAL_MAX(rate, 1.0));
}

static double from_log(double v)
{
    return exp2(v - 1.0);
}

/* The pairs and their rounds for the plan in force; rank 0's policy over
 * them anew when they changed (a plan change). */
static int update_pairs(struct mal_trainer *tr)
{
    mal_linkprobe *lp = &tr->mon.link;
    int *pairs = NULL, n = 0, rc;
    if ((rc = plan_pairs(&tr->plan, &pairs, &n))) return rc;
    if (lp->pairs && n == lp->n_pairs && !memcmp(pairs, lp->pairs, sizeof *pairs * 2 * (size_t)n)) {
        free(pairs);
        return 0;
    }
    free(lp->pairs);
    free(lp->round);
    free(lp->rtt);
    free(lp->rates);
    free(lp->least);
    free(lp->hist);
    free(lp->scratch);
    lp->pairs = pairs;
    lp->n_pairs = n;
    lp->round = malloc(sizeof *lp->round * (size_t)(n ? n : 1));
    lp->rtt = malloc(sizeof *lp->rtt * (size_t)(n ? n : 1));
    lp->rates = malloc(sizeof *lp->rates * (size_t)(n ? n : 1));
    lp->least = malloc(sizeof *lp->least * (size_t)(n ? n : 1));
    lp->scratch = malloc(sizeof *lp->scratch * (size_t)(n ? n : 1));
    lp->hist = malloc(sizeof *lp->hist * (size_t)(n ? n : 1) * MAL_LINK_PROBE_KEEP);
    if (!lp->round || !lp->rtt || !lp->rates || !lp->least || !lp->scratch || !lp->hist)
        return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory");
    if ((rc = colour(pairs, n, tr->world_size, lp->round))) return rc;
    for (int i = 0; i < n; i++)
        lp->rtt[i] = lp->rates[i] = NAN;
    lp->advised = 0;
    lp->trigger_pair = -1;
    if (tr->world_rank != 0) return 0;
    mal_policy_destroy(lp->policy);
    lp->policy = NULL;
    lp->n_probes = 0;
    if (!n) return 0;
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    pp.check_every = 1; /* every probe is a check: probes are already K steps apart */
    if (tr->o.window > 0) pp.window = tr->o.window;
    if (tr->o.persist > 0) pp.persist = tr->o.persist;
    /* The policy sees each rate on a log scale, 1 + log2(rate): a link's
     * time scatters in proportion to it (a link at 8x reads 6.4-9 from one
     * probe to the next), so a move is a factor, --link-gap in doublings.
     * Its own noise floor: a shared machine's load moves a round trip far
     * more than a probe matmul's CPU time. */
    pp.gap = tr->o.link_gap > 0 ? tr->o.link_gap : MAL_LINK_GAP_DEFAULT;
    pp.noise_floor = to_log(lp->noise_floor);
    pp.threshold = pp.noise_floor;
    if ((rc = mal_policy_create(&pp, n, &lp->policy))) return rc;
    /* the new plan was made for the links as last measured: a pair already
     * known slow is no news */
    for (int i = 0; i < n; i++) {
        double k =
            lp->known[(size_t)pairs[2 * i] * (size_t)tr->world_size + (size_t)pairs[2 * i + 1]];
        lp->scratch[i] = to_log(k > 0 ? k : 1.0);
    }
    return mal_policy_set_plan(lp->policy, lp->scratch, NULL);
}

int mal_linkprobe_init(struct mal_trainer *tr)
{
    mal_linkprobe *lp = &tr->mon.link;
    lp->every = tr->o.link_probe_every;
    lp->bytes = tr->o.link_probe_bytes > 0 ? (size_t)tr->o.link_probe_bytes
                                           : (size_t)MAL_LINK_PROBE_BYTES_DEFAULT;
    lp->trigger_pair = -1;
    lp->reps = MAL_LINK_PROBE_REPS;
    lp->noise_floor =
        tr->o.link_noise_floor > 0 ? tr->o.link_noise_floor : MAL_LINK_NOISE_FLOOR_DEFAULT;
    lp->burst = MAL_LINK_PROBE_BURST;
    if (!tr->world || tr->world_size < 2 || lp->every <= 0) {
        lp->every = 0;
        return 0;
    }
    for (int i = 0; i < 2; i++)
        if (!(lp->buf[i] = mal_kern_alloc(tr->k, lp->bytes)))
            return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory for %zu-byte messages",
                           lp->bytes);
    lp->rtt_row = calloc((size_t)tr->world_size, sizeof *lp->rtt_row);
    if (!lp->rtt_row) return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory");
    if (tr->world_rank == 0) {
        lp->rtt_all = calloc((size_t)tr->world_size * (size_t)tr->world_size, sizeof *lp->rtt_all);
        lp->known = calloc((size_t)tr->world_size * (size_t)tr->world_size, sizeof *lp->known);
        if (!lp->rtt_all || !lp->known) return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory");
    }
    return update_pairs(tr);
}

void mal_linkprobe_fini(struct mal_trainer *tr)
{
    mal_linkprobe *lp = &tr->mon.link;
    for (int i = 0; i < 2; i++)
        if (lp->buf[i] && tr->k) mal_kern_free(tr->k, lp->buf[i]);
    free(lp->pairs);
    free(lp->round);
    free(lp->rtt_row);
    free(lp->rtt_all);
    free(lp->known);
    free(lp->rtt);
    free(lp->rates);
    free(lp->least);
    free(lp->hist);
    free(lp->scratch);
    mal_policy_destroy(lp->policy);
    memset(lp, 0, sizeof *lp);
}

int mal_linkprobe_due(const struct mal_trainer *tr, int64_t step)
{
    const mal_linkprobe *lp = &tr->mon.link;
    return lp->every > 0 && (step + 1) % lp->every == 0;
}

/* What one pass of ping-pongs needs: the data plane, two device buffers
 * of `bytes`, and the trainer whose --inject-link stretches the bursts
 * (NULL: none). */
typedef struct {
    mal_comm *w;
    mal_kern k;
    void *buf[2];
    size_t bytes;
    int burst;
    struct mal_trainer *tr;
} probe_ctx;

static int wait1(const probe_ctx *c, mal_comm_req *req)
{
    return mal_comm_dp_waitall(c->w, 1, &req);
}

/* The initiator's side of one pair: the handshake, then a timed burst,
 * stretched by an injected slow link, into *dt. */
static int ping(const probe_ctx *c, int peer, double *dt)
{
    mal_comm_req *rq[MAL_LINK_PROBE_BURST + 1];
    int rc;
    /* hello there and back: the peer has posted the burst's receives
     * before it answers */
    if ((rc = mal_comm_dp_isend(c->w, c->k, c->buf[0], 1, peer, TAG_HELLO, &rq[0])) ||
        (rc = mal_comm_dp_irecv(c->w, c->k, c->buf[1], 1, peer, TAG_HELLO, &rq[1])) ||
        (rc = mal_comm_dp_waitall(c->w, 2, rq)))
        return rc;
    double t0 = mal_now();
    if ((rc = mal_comm_dp_irecv(c->w, c->k, c->buf[1], 1, peer, TAG_PONG, &rq[c->burst])))
        return rc;
    for (int i = 0; i < c->burst; i++)
        if ((rc = mal_comm_dp_isend(c->w, c->k, c->buf[0], c->bytes, peer, TAG_PING, &rq[i])))
            return rc;
    if ((rc = mal_comm_dp_waitall(c->w, c->burst + 1, rq))) return rc;
    *dt = mal_now() - t0;
    /* every message crossed the link: an injected factor stretches the
     * burst (sleeping the difference, as for every message) */
    if (c->tr) *dt = mal_inject_link_probe(c->tr, peer, *dt);
    return 0;
}

/* The responder's side: the burst's receives are posted before the
 * handshake's answer, so the initiator never waits on this rank. */
static int pong(const probe_ctx *c, int peer)
{
    mal_comm_req *rq[MAL_LINK_PROBE_BURST + 1];
    int rc;
    /* the messages of a burst land in one buffer, in turn: only their
     * time matters */
    for (int i = 0; i < c->burst; i++)
        if ((rc = mal_comm_dp_irecv(c->w, c->k, c->buf[0], c->bytes, peer, TAG_PING, &rq[i])))
            return rc;
    if ((rc = mal_comm_dp_irecv(c->w, c->k, c->buf[1], 1, peer, TAG_HELLO, &rq[c->burst])) ||
        (rc = wait1(c, rq[c->burst])) ||
        (rc = mal_comm_dp_isend(c->w, c->k, c->buf[1], 1, peer, TAG_HELLO, &rq[c->burst])) ||
        (rc = wait1(c, rq[c->burst])) || (rc = mal_comm_dp_waitall(c->w, c->burst, rq)) ||
        (rc = mal_comm_dp_isend(c->w, c->k, c->buf[1], 1, peer, TAG_PONG, &rq[0])) ||
        (rc = wait1(c, rq[0])))
        return rc;
    return 0;
}

/* `reps` passes over pairs[2 n] in their rounds; row[peer] (this rank
 * initiates pairs with higher ranks): the least burst time.  Every pair
 * once per pass, the passes one after another: a pair's repetitions are
 * spread over the whole probe, so a burst of load that slows one moment
 * does not slow them all. */
static int probe_pairs(const probe_ctx *c, int me, const int *pairs, const int *round, int n,
                       int reps, double *row)
{
    int rc;
    for (int rep = 0; rep < reps; rep++) {
        int last = -1;
        for (;;) {
            /* this rank's next pair in round order */
            int next = -1, pi = -1;
            for (int i = 0; i < n; i++)
                if ((pairs[2 * i] == me || pairs[2 * i + 1] == me) && round[i] > last &&
                    (next < 0 || round[i] < next)) {
                    next = round[i];
                    pi = i;
                }
            if (pi < 0) break;
            last = next;
            int a = pairs[2 * pi], b = pairs[2 * pi + 1];
            double dt;
            if (a == me) {
                rc = ping(c, b, &dt);
                if (!rc && (rep == 0 || dt < row[b])) row[b] = dt;
            } else {
                rc = pong(c, a);
            }
            if (rc) return rc;
        }
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Rank 0: each pair's least round trip over its last MAL_LINK_PROBE_KEEP
 * probes, over the median pair's of its class (a slow link is slow at
 * every probe; load on a shared machine slows a pair now and then). */
static void rate_pairs(struct mal_trainer *tr)
{
    mal_linkprobe *lp = &tr->mon.link;
    const char *host = tr->mon.hostnames;
    const int keep = MAL_LINK_PROBE_KEEP, slot = (int)(lp->n_probes % keep);
    for (int i = 0; i < lp->n_pairs; i++) {
        int a = lp->pairs[2 * i], b = lp->pairs[2 * i + 1];
        lp->rtt[i] = lp->rtt_all[(size_t)a * (size_t)tr->world_size + (size_t)b];
        lp->hist[(size_t)i * keep + (size_t)slot] = lp->rtt[i];
        /* no rate before `keep` probes: one probe alone is too easily
         * caught by a burst of load */
        double m = INFINITY;
        for (int k = 0; k < keep; k++)
            m = MAL_MIN(m, lp->hist[(size_t)i * keep + (size_t)k]);
        lp->least[i] = lp->n_probes + 1 >= keep ? m : NAN;
    }
    for (int c = 0; c < 2; c++) {
        /* class 0: both ends on one node; 1: on two */
        int m = 0;
        for (int i = 0; i < lp->n_pairs; i++) {
            int a = lp->pairs[2 * i], b = lp->pairs[2 * i + 1];
            int cross = strcmp(host + (size_t)a * MAL_HOSTNAME_LEN,
                               host + (size_t)b * MAL_HOSTNAME_LEN) != 0;
            if (cross == c && lp->least[i] > 0) lp->scratch[m++] = lp->least[i];
        }
        if (!m) continue;
        qsort(lp->scratch, (size_t)m, sizeof *lp->scratch, cmp_double);
        double med =
            m % 2 ? lp->scratch[m / 2] : 0.5 * (lp->scratch[m / 2 - 1] + lp->scratch[m / 2]);
        for (int i = 0; i < lp->n_pairs; i++) {
            int a = lp->pairs[2 * i], b = lp->pairs[2 * i + 1];
            int cross = strcmp(host + (size_t)a * MAL_HOSTNAME_LEN,
                               host + (size_t)b * MAL_HOSTNAME_LEN) != 0;
            if (cross == c) lp->rates[i] = lp->least[i] > 0 && med > 0 ? lp->least[i] / med : NAN;
        }
    }
}

int mal_linkprobe_run(struct mal_trainer *tr, double *cost_s)
{
    mal_linkprobe *lp = &tr->mon.link;
    double t0 = mal_now();
    int rc, me = tr->world_rank;
    *cost_s = 0;
    if ((rc = update_pairs(tr))) return rc;
    for (int r = 0; r < tr->world_size; r++)
        lp->rtt_row[r] = 0;
    probe_ctx c = {tr->world, tr->k, {lp->buf[0], lp->buf[1]}, lp->bytes, lp->burst, tr};
    if ((rc = probe_pairs(&c, me, lp->pairs, lp->round, lp->n_pairs, lp->reps, lp->rtt_row)))
        return rc;
    lp->cost_s = *cost_s = mal_now() - t0;
    if ((rc = mal_comm_gather(tr->world, lp->rtt_row, lp->rtt_all,
                              sizeof *lp->rtt_row * (size_t)tr->world_size, 0)))
        return rc;
    if (me != 0 || !lp->n_pairs) return 0;
    rate_pairs(tr);
    for (int i = 0; i < lp->n_pairs; i++)
        lp->scratch[i] = to_log(lp->rates[i]);
    rc = mal_policy_observe(lp->policy, ++lp->n_probes, lp->scratch);
    if (rc < 0) return rc;
    lp->advised = rc == 1;
    lp->trigger_pair = rc == 1 ? mal_policy_trigger_rank(lp->policy) : -1;
    lp->pending |= lp->advised;
    if (lp->n_probes >= MAL_LINK_PROBE_KEEP) {
        mal_policy_means(lp->policy, lp->scratch);
        for (int i = 0; i < lp->n_pairs; i++)
            lp->known[(size_t)lp->pairs[2 * i] * (size_t)tr->world_size +
                      (size_t)lp->pairs[2 * i + 1]] = from_log(lp->scratch[i]);
    }
    return 0;
}

int mal_linkprobe_links(const struct mal_trainer *tr, mal_links *ln)
{
    const mal_linkprobe *lp = &tr->mon.link;
    const int w = tr->world_size;
    int rc = 0;
    memset(ln, 0, sizeof *ln);
    if (!lp->known) return 0;
    for (int a = 0; a < w && !rc; a++)
        for (int b = a + 1; b < w && !rc; b++)
            if (lp->known[(size_t)a * (size_t)w + (size_t)b] > 1.0)
                rc = mal_links_set(ln, a, b, lp->known[(size_t)a * (size_t)w + (size_t)b]);
    if (rc) mal_links_fini(ln);
    return rc;
}

int mal_linkprobe_rebase(struct mal_trainer *tr)
{
    mal_linkprobe *lp = &tr->mon.link;
    lp->pending = 0;
    if (tr->world_rank != 0 || !lp->policy || !lp->n_probes) return 0;
    double *m = malloc(sizeof *m * (size_t)lp->n_pairs);
    if (!m) return MAL_ERR(MAL_ENOMEM, "link monitor: out of memory");
    mal_policy_means(lp->policy, m);
    int rc = mal_policy_set_plan(lp->policy, m, NULL);
    free(m);
    return rc;
}

static double median_of(double *v, int m)
{
    qsort(v, (size_t)m, sizeof *v, cmp_double);
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

void mal_link_figures_fini(mal_link_figures *f)
{
    free(f->pair);
    memset(f, 0, sizeof *f);
}

int mal_linkprobe_figures(mal_comm *world, mal_kern k, mal_link_figures *out)
{
    memset(out, 0, sizeof *out);
    const int nr = world->size, me = world->rank, n = nr * (nr - 1) / 2;
    const size_t bytes = MAL_LINK_PROBE_BYTES_DEFAULT;
    if (nr < 2) return 0;
    int *pairs = malloc(sizeof *pairs * 2 * (size_t)n), *round = malloc(sizeof *round * (size_t)n);
    double *row = calloc(2 * (size_t)nr, sizeof *row), *all = NULL, *v = NULL;
    char name[MAL_HOSTNAME_LEN], *hosts = NULL;
    void *buf[2] = {mal_kern_alloc(k, bytes), mal_kern_alloc(k, bytes)};
    int rc = 0;
    if (me == 0) {
        all = calloc(2 * (size_t)nr * (size_t)nr, sizeof *all);
        hosts = calloc((size_t)nr, MAL_HOSTNAME_LEN);
        v = malloc(sizeof *v * (size_t)n);
        out->pair = malloc(sizeof *out->pair * 5 * (size_t)n);
    }
    if (!pairs || !round || !row || !buf[0] || !buf[1] ||
        (me == 0 && (!all || !hosts || !v || !out->pair))) {
        rc = MAL_ERR(MAL_ENOMEM, "link figures: out of memory");
        goto cleanup;
    }
    int i = 0;
    for (int a = 0; a < nr; a++)
        for (int b = a + 1; b < nr; b++, i++) {
            pairs[2 * i] = a;
            pairs[2 * i + 1] = b;
        }
    if ((rc = colour(pairs, n, nr, round))) goto cleanup;
    /* latency: a 1-byte message and its 1-byte answer; bandwidth: a burst
     * less that, both the least of 9 */
    probe_ctx small = {world, k, {buf[0], buf[1]}, 1, 1, NULL};
    probe_ctx big = {world, k, {buf[0], buf[1]}, bytes, MAL_LINK_PROBE_BURST, NULL};
    if ((rc = probe_pairs(&small, me, pairs, round, n, 9, row)) ||
        (rc = probe_pairs(&big, me, pairs, round, n, 9, row + nr)))
        goto cleanup;
    memset(name, 0, sizeof name);
    if (gethostname(name, sizeof name - 1) != 0) snprintf(name, sizeof name, "unknown");
    if ((rc = mal_comm_gather(world, row, all, sizeof *row * 2 * (size_t)nr, 0)) ||
        (rc = mal_comm_gather(world, name, hosts, MAL_HOSTNAME_LEN, 0)) || me != 0)
        goto cleanup;
    out->n = n;
    for (i = 0; i < n; i++) {
        int a = pairs[2 * i], b = pairs[2 * i + 1];
        double ts = all[(size_t)a * 2 * (size_t)nr + (size_t)b];
        double tb = all[(size_t)a * 2 * (size_t)nr + (size_t)nr + (size_t)b];
        double *f = out->pair + 5 * (size_t)i;
        f[0] = a;
        f[1] = b;
        f[4] =
            strcmp(hosts + (size_t)a * MAL_HOSTNAME_LEN, hosts + (size_t)b * MAL_HOSTNAME_LEN) != 0;
        f[2] = ts / 2;
        /* a burst no slower than the latency's round trip: timer noise;
         * its whole time then bounds the bandwidth from below */
        f[3] = (double)bytes * MAL_LINK_PROBE_BURST / (tb > ts ? tb - ts : tb);
    }
    for (int c = 0; c < 2; c++)
        for (int q = 2; q < 4; q++) {
            int m = 0;
            for (i = 0; i < n; i++)
                if (out->pair[5 * (size_t)i + 4] == c)
                    v[m++] = out->pair[5 * (size_t)i + (size_t)q];
            if (!m) continue;
            double med = median_of(v, m);
            if (c == 0 && q == 2) out->latency = med;
            if (c == 0 && q == 3) out->bandwidth = med;
            if (c == 1 && q == 2) out->node_latency = med;
            if (c == 1 && q == 3) out->node_bandwidth = med;
        }
cleanup:
    for (int b = 0; b < 2; b++)
        if (buf[b]) mal_kern_free(k, buf[b]);
    free(pairs);
    free(round);
    free(row);
    free(all);
    free(hosts);
    free(v);
    if (rc) mal_link_figures_fini(out);
    return rc;
}
