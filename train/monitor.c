/* The straggler monitor and straggler injection.
 *
 * Every step, right after the step-wide all-reduce (so all ranks start it at
 * the same moment and share the cores alike), every rank - suspended ones
 * too, so that their recovery is noticed - times a fixed probe workload (one
 * matrix product on the trainer's kernel instance) with device events.  Only kernels are timed, never a wait
 * on a peer: a synchronous all-reduce makes every rank's step equally long
 * and hides the slow one.  A rank's straggling rate is its probe time over
 * the median probe time of all ranks: the majority sets the healthy
 * baseline, so load that slows every rank alike (a shared machine, thermal
 * limits) does not look like a straggler.
 *
 * Rank 0 feeds the rates to the re-plan policy (replan/policy.h) and, on
 * check steps, broadcasts its advice.
 *
 * Injection, sleep mode (the default), stretches a rank's measured compute
 * by FACTOR with a sleep of (FACTOR - 1) x the time it just measured, which
 * the monitor and the compute-time accounting both see, and which costs no
 * CPU.  GPU mode (mal_inject_begin_step starts the kernel table's
 * slowdown where the factor changes) slows the device itself, at a duty
 * cycle; then a probe sample times a batch of matmuls long enough to span
 * several periods of it (below).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/mal.h"
#include "replan/policy.h"
#include "train_internal.h"

/* One probe sample: device seconds per matmul, over mon.probe_reps of them
 * between two events. */
static double probe_sample(struct mal_trainer *tr)
{
    mal_monitor *mon = &tr->mon;
    mal_kern k = tr->k;
    int n = mon->probe_n;
    mal_kern_event_record(k, mon->probe_ev[0]);
    for (int r = 0; r < mon->probe_reps; r++)
        mal_kern_matmul_fwd(k, mon->probe_out, mon->probe_a, mon->probe_w, n, n, n, 0);
    mal_kern_event_record(k, mon->probe_ev[1]);
    return mal_kern_event_elapsed(k, mon->probe_ev[0], mon->probe_ev[1]) / mon->probe_reps;
}

/* This rank's injection factor at step `step` (1: none). */
static double inject_factor(const struct mal_trainer *tr, int64_t step)
{
    double f = 1.0;
    for (int i = 0; i < tr->o.n_inject; i++) {
        const mal_inject *in = &tr->o.inject[i];
        if (in->rank == tr->world_rank && step >= in->from && (in->to < 0 || step < in->to))
            f *= in->factor;
    }
    return f;
}

/* --inject-link's factor of the link between this rank and `peer` at
 * step `step` (1: healthy). */
static double link_factor(const struct mal_trainer *tr, int peer, int64_t step)
{
    double f = 1.0;
    for (int i = 0; i < tr->o.n_inject_links; i++) {
        const mal_inject_link *l = &tr->o.inject_links[i];
        if (((l->a == tr->world_rank && l->b == peer) ||
             (l->b == tr->world_rank && l->a == peer)) &&
            step >= l->from && (l->to < 0 || step < l->to))
            f *= l->factor;
    }
    return f;
}

/* The injected links this rank's TP all-reduces and gradient sum cross:
 * a slow link inside the TP group paces every ring step of its
 * all-reduces (every member waits), one to a rank of another pipeline
 * that holds some of the same layers the gradient sum. */
static void link_factors(struct mal_trainer *tr, int64_t step)
{
    mal_monitor *mon = &tr->mon;
    mon->link_tp_now = mon->link_dp_now = 1.0;
    mon->link_step = step;
    const mal_plan_loc *me = &tr->part.loc;
    if (!tr->o.n_inject_links || me->pipeline < 0) return;
    const mal_plan_stage *st = &tr->plan.pipelines[me->pipeline].stages[me->stage];
    for (int i = 0; i < tr->o.n_inject_links; i++) {
        const mal_inject_link *l = &tr->o.inject_links[i];
        if (step < l->from || (l->to >= 0 && step >= l->to)) continue;
        int ina = 0, inb = 0;
        for (int k = 0; k < st->n_ranks; k++) {
            ina |= st->ranks[k] == l->a;
            inb |= st->ranks[k] == l->b;
        }
        if (ina && inb) mon->link_tp_now = MAL_MAX(mon->link_tp_now, l->factor);
        int other = l->a == tr->world_rank ? l->b : l->b == tr->world_rank ? l->a : -1;
        mal_plan_loc lo;
        if (other < 0 || mal_plan_locate(&tr->plan, other, &lo) || lo.pipeline < 0 ||
            lo.pipeline == me->pipeline)
            continue;
        const mal_plan_stage *so = &tr->plan.pipelines[lo.pipeline].stages[lo.stage];
        if (MAL_MIN(so->layer_end, st->layer_end) > MAL_MAX(so->layer_begin, st->layer_begin))
            mon->link_dp_now = MAL_MAX(mon->link_dp_now, l->factor);
    }
}

static double sleep_extra(double f, double dt)
{
    if (f <= 1.0 || dt <= 0) return dt;
    double extra = (f - 1.0) * dt;
    struct timespec ts = {(time_t)extra, (long)((extra - floor(extra)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    return f * dt;
}

double mal_inject_link_stretch(struct mal_trainer *tr, int peer, double dt)
{
    mal_monitor *mon = &tr->mon;
    int kind = peer == -1 ? 0 : peer == -2 ? 1 : 2;
    double f = kind == 0 ? mon->link_tp_now
               : kind == 1 ? mon->link_dp_now
                           : link_factor(tr, peer, mon->link_step);
    /* The message's own time is the least this rank has seen of its kind:
     * the measured one holds the wait for a late peer, and a peer that is
     * late because it slept for the same link would feed its sleep back
     * into this one's, step after step, without bound. */
    if (dt > 0 && (!(mon->link_min[kind] > 0) || dt < mon->link_min[kind]))
        mon->link_min[kind] = dt;
    if (f <= 1.0) return dt;
    return dt - mon->link_min[kind] + sleep_extra(f, mon->link_min[kind]);
}

double mal_inject_link_probe(struct mal_trainer *tr, int peer, double dt)
{
    /* the probe's own round trip, not a least one seen: the probe takes
     * the least of its repetitions itself, and its peer is never late
     * (the handshake) */
    return sleep_extra(link_factor(tr, peer, tr->mon.link_step), dt);
}

int mal_inject_begin_step(struct mal_trainer *tr, int64_t step)
{
    mal_monitor *mon = &tr->mon;
    int rc;
    link_factors(tr, step);
    mon->inject_now = inject_factor(tr, step);
    if (tr->o.inject_mode == MAL_INJECT_GPU) {
        /* The device itself is slowed from this step on (or back to full
         * speed): a co-running load, started, changed or stopped only
         * where the factor changes.  Nothing is stretched by sleeping. */
        if (mon->inject_now != mon->slow_rate) {
            if ((rc = mal_kern_slowdown(tr->k, mon->inject_now))) return rc;
            mon->slow_rate = mon->inject_now;
        }
        mon->inject_now = 1.0;
    }
    return 0;
}

double mal_inject_stretch(struct mal_trainer *tr, double dt)
{
    return sleep_extra(tr->mon.inject_now, dt);
}

int mal_monitor_init(struct mal_trainer *tr)
{
    mal_monitor *mon = &tr->mon;
    mal_kern k = tr->k;
    int n = tr->o.probe_n > 0 ? tr->o.probe_n : 192, rc;
    mon->slow_rate = 1.0; /* the device at full speed */
    mon->probe_n = n;
    /* fp32 host values, held in the compute dtype on the device: the
     * working-copy cast converts them where the two differ */
    size_t count = (size_t)n * n, bytes = count * mal_dtype_bytes(k->compute);
    mon->probe_a = mal_kern_alloc(k, bytes);
    mon->probe_w = mal_kern_alloc(k, bytes);
    mon->probe_out = mal_kern_alloc(k, bytes);
    mon->probe_ev[0] = mal_kern_event_create(k);
    mon->probe_ev[1] = mal_kern_event_create(k);
    float *h = malloc(count * sizeof(float)), *hd = mal_kern_alloc(k, count * sizeof(float));
    if (!mon->probe_a || !mon->probe_w || !mon->probe_out || !mon->probe_ev[0] || !mon->probe_ev[1] ||
        !h || !hd) {
        free(h);
        if (hd) mal_kern_free(k, hd);
        return MAL_ERR(MAL_ENOMEM, "monitor: out of memory for the probe");
    }
    for (size_t i = 0; i < count; i++) h[i] = (float)((i * 7919u) % 1000) * 1e-3f;
    mal_kern_from_host(k, hd, h, count * sizeof(float));
    mal_kern_cast_working(k, mon->probe_a, hd, count);
    mal_kern_cast_working(k, mon->probe_w, hd, count);
    rc = mal_kern_sync(k);
    mal_kern_free(k, hd);
    free(h);
    if (rc) return rc;
    mon->probe_reps = 1;
    if (tr->o.inject_mode == MAL_INJECT_GPU) {
        /* A duty-cycled slowdown is a mean over its period: one matmul (tens
         * of microseconds on a GPU) runs at full speed in an idle part or
         * waits out a busy one, and the fastest of five would miss it.  So
         * every sample times enough matmuls to span four periods, measured
         * now, before any injection starts (the first step's at the
         * earliest).  Per matmul, so ranks with other counts compare. */
        double t1 = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t = probe_sample(tr);
            if (t < t1) t1 = t;
        }
        double want = 4 * MAL_KERN_SLOWDOWN_PERIOD_S / (t1 > 1e-7 ? t1 : 1e-7);
        mon->probe_reps = want < 1 ? 1 : want > 16384 ? 16384 : (int)ceil(want);
    }

    /* Node names, for the metrics file (and the planner's node map). */
    char name[MAL_HOSTNAME_LEN];
    memset(name, 0, sizeof name);
    if (gethostname(name, sizeof name - 1) != 0) snprintf(name, sizeof name, "unknown");
    if (tr->world_rank == 0) {
        mon->hostnames = calloc((size_t)tr->world_size, MAL_HOSTNAME_LEN);
        mon->rates = calloc((size_t)tr->world_size, sizeof *mon->rates);
        if (!mon->hostnames || !mon->rates) return MAL_ERR(MAL_ENOMEM, "monitor: out of memory");
    }
    if (tr->world) {
        if ((rc = mal_comm_gather(tr->world, name, mon->hostnames, MAL_HOSTNAME_LEN, 0))) return rc;
    } else {
        memcpy(mon->hostnames, name, MAL_HOSTNAME_LEN);
    }
    mal_policy_params pp;
    mal_policy_defaults(&pp);
    mon->check_every_all = tr->o.check_every > 0 ? tr->o.check_every : pp.check_every;
    if (tr->world_rank != 0) return 0;

    if (tr->o.check_every > 0) pp.check_every = tr->o.check_every;
    if (tr->o.window > 0) pp.window = tr->o.window;
    if (tr->o.persist > 0) pp.persist = tr->o.persist;
    if (tr->o.gap > 0) pp.gap = tr->o.gap;
    if (tr->o.threshold > 0) pp.threshold = tr->o.threshold;
    if (tr->o.noise_floor > 0) pp.noise_floor = tr->o.noise_floor;
    if ((rc = mal_policy_create(&pp, tr->world_size, &mon->policy))) return rc;
    return mal_monitor_set_plan(tr, tr->o.plan_rates);
}

int mal_monitor_set_plan(struct mal_trainer *tr, const double *rates)
{
    if (tr->world_rank != 0) return 0;
    unsigned char *susp = calloc((size_t)tr->world_size, 1);
    double *r = malloc(sizeof *r * (size_t)tr->world_size);
    if (!susp || !r) {
        free(susp);
        free(r);
        return MAL_ERR(MAL_ENOMEM, "monitor: out of memory");
    }
    for (int i = 0; i < tr->plan.n_suspended; i++) susp[tr->plan.suspended[i]] = 1;
    for (int i = 0; i < tr->world_size; i++) r[i] = rates ? rates[i] : 1.0;
    int rc = mal_policy_set_plan(tr->mon.policy, r, susp);
    free(susp);
    free(r);
    return rc;
}

void mal_monitor_mean_rates(const struct mal_trainer *tr, double *rates)
{
    mal_policy_means(tr->mon.policy, rates);
}

void mal_monitor_fini(struct mal_trainer *tr)
{
    mal_monitor *mon = &tr->mon;
    mal_kern k = tr->k;
    if (mon->probe_a) mal_kern_free(k, mon->probe_a);
    if (mon->probe_w) mal_kern_free(k, mon->probe_w);
    if (mon->probe_out) mal_kern_free(k, mon->probe_out);
    mon->probe_a = mon->probe_w = mon->probe_out = NULL;
    for (int i = 0; i < 2; i++) {
        if (k) mal_kern_event_destroy(k, mon->probe_ev[i]);
        mon->probe_ev[i] = NULL;
    }
    mal_policy_destroy(mon->policy);
    mon->policy = NULL;
    free(mon->hostnames);
    free(mon->rates);
    mon->hostnames = NULL;
    mon->rates = NULL;
    /* the injected load stops before the kernel instance goes (its
     * destroy would stop it too) */
    if (k && mon->slow_rate > 1.0) mal_kern_slowdown(k, 1.0);
}

/* Time of the probe on the device, by the instance's events: device time,
 * never wall time around the calls.  For the CPU backends an event reads
 * the process's CPU time: with more ranks than cores (tests, workstations)
 * a rank descheduled by the OS for a few milliseconds is not a slow device,
 * and wall time would say it is.  A GPU backend's events time its kernels,
 * which the same argument favours. */
double mal_monitor_probe(struct mal_trainer *tr)
{
    /* The fastest of five samples: a context switch or a cold cache only
     * ever makes a sample slower, a slow device makes all five slower. */
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double dt = probe_sample(tr);
        if (dt < best) best = dt;
    }
    return mal_inject_stretch(tr, best);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int mal_monitor_observe(struct mal_trainer *tr, mal_step_stats *st)
{
    mal_monitor *mon = &tr->mon;
    int advise[2] = {0, -1}, rc;
    if (tr->world_rank == 0) {
        double *p = malloc(sizeof *p * (size_t)tr->world_size);
        if (!p) return MAL_ERR(MAL_ENOMEM, "monitor: out of memory");
        for (int r = 0; r < tr->world_size; r++) p[r] = tr->tally.rank_times[r].probe_s;
        qsort(p, (size_t)tr->world_size, sizeof *p, cmp_double);
        double med = tr->world_size % 2 ? p[tr->world_size / 2]
                                        : 0.5 * (p[tr->world_size / 2 - 1] + p[tr->world_size / 2]);
        free(p);
        for (int r = 0; r < tr->world_size; r++)
            mon->rates[r] = med > 0 ? tr->tally.rank_times[r].probe_s / med : 1.0;
        rc = mal_policy_observe(mon->policy, (long)tr->step, mon->rates);
        if (rc < 0) return rc;
        advise[0] = rc == 1 && tr->o.adapt != MAL_ADAPT_OFF;
        advise[1] = rc == 1 ? mal_policy_trigger_rank(mon->policy) : -1;
        /* a link that moved (linkprobe.c) advises at a check step: no
         * rank triggered it */
        if (!advise[0] && mon->link.pending && tr->o.adapt != MAL_ADAPT_OFF &&
            tr->step % mon->check_every_all == 0)
            advise[0] = 1;
        if (st) st->rates = mon->rates;
    }
    /* Only check steps can advise; every rank knows which they are. */
    if (tr->world && tr->step % mon->check_every_all == 0) {
        double a[2] = {advise[0], advise[1]};
        if ((rc = mal_comm_broadcast(tr->world, a, sizeof a, 0))) return rc;
        advise[0] = (int)a[0];
        advise[1] = (int)a[1];
    }
    if (st) {
        st->replan = advise[0];
        st->trigger_rank = advise[1];
    }
    return 0;
}
